/* Grouped MXFP4 W4A16 expert GEMM for prefill on Hopper warpgroup MMA (k3k_cu_moe_gemm_wg): the
 * wgmma counterpart of mxfp4_tc.cu's mma.sync prefill kernel, same arguments, same results.
 *
 * What it is for: y = x · dequant(W_e)ᵀ for every active expert e over its grouped rows (many
 * rows per expert: prefill), gate/up with the activation fused (SiTU or SiLU·mul), down plain;
 * k3k_cu_moe_gemm sends its prefill calls here. What it is not: the decode kernel (few rows per
 * expert, mxfp4_tc.cu), the fp32-x / odd-shape path (mxfp4.cu), the scale check (E8M0 0xFF
 * gives NaN here; weights are checked at load). Invariants: results differ from the reference
 * chain only by fp32 summation order; nothing allocated, nothing synchronised (graph-safe).
 *
 * Shape: the weights are the M side and the tokens the N side ("swapped" GEMM), so the MXFP4
 * tile never goes through shared memory as bf16: each thread dequantises its own A fragments
 * (wgmma m64k16, register operand) straight from the packed bytes, and the gathered token rows
 * are the B operand (K-major, 128-byte swizzle) in shared memory. A block is NWG math
 * warpgroups over one (expert, 64·NWG weight rows, up to 32·NBMAX tokens) tile (wg_shape: 4 ×
 * 128 by default, 2 × 224 for comparison): warpgroup w takes rows 64w..64w+63 (fused: 32
 * features, gate rows at fragment rows g and up rows at g + 8, so gate and up of a feature land
 * in the same thread's accumulators and SiTU needs no exchange). The wgmma N is the tile's token
 * count rounded up to 32 (one instruction per N, picked per tile), so a ragged expert wastes
 * < 32 columns; an expert with more rows than a tile holds is cut into near-equal tiles. Each
 * weight element is dequantised once per token tile: twice per expert at K3's ~162 rows per
 * expert in the default shape (two tiles of ~81), once in the 2 × 224 one.
 *
 * Pipeline (K in chunks of 64): token rows (gathered through the plan) and packed weight rows
 * arrive by cp.async in a WG_STG-stage ring (every thread copies its share), scales by plain
 * loads two chunks ahead. 4-warpgroup shape: a thread waits for the stage's full mbarrier
 * (cp.async arrives when its copies land), dequantises, issues the chunk's 4 wgmma, waits for
 * them, arrives on the stage's empty mbarrier and issues its copies of chunk c+WG_MB_D (after
 * the stage's previous use was released by everyone), so warps drift apart by up to two chunks
 * and one warpgroup's dequant overlaps the others' wgmma. 2-warpgroup shape: a warpgroup
 * dequantises chunk c into one of two A register sets while the wgmma of chunk c−1 still runs,
 * issues the 4 wgmma of chunk c, waits for chunk c−1's (wait_group 1), and one block barrier
 * frees chunk c−1's stage for the copies of chunk c+WG_STG−1.
 *
 * Dequantisation (per thread, per chunk, per row): fragment a0/a2 of k step s need packed bytes
 * 8s+t and 8s+4+t (t = lane % 4; one byte = the (even, odd) k pair); three byte permutes gather
 * bytes t, t+4, t+8, t+12 of a 16-byte scale group into one word, and the table-free E2M1 →
 * bf16 trick of mxfp4_tc.cu (nibbles i, i+4 → bf16x2 × 2^-126, then × 2^(s−1) for the E8M0
 * scale; exact) plus two permutes put the pairs back in k order. The scale: 2-warpgroup shape,
 * two multiplies always (the second by 1 unless s > 128), one basic block (a branch around the
 * second multiply made ptxas serialise the wgmma there: 41.6 vs 39.1 ms in session 4);
 * 4-warpgroup shape, one multiply on a warp-uniform branch per chunk unless a scale of the
 * warp's chunk is > 128 (−7 % of the expert GEMMs, session 14). */
#include "cuda_common.cuh"
#include "mla_prefill_sm90.cuh"
#include "mxfp4_args.cuh"
#include "mxfp4_e2m1.cuh"
#include "mxfp4_wg.h"

#include <stdlib.h>
#include <string.h>

namespace {

/* ---- wgmma m64nNk16, A (weights) in registers, B (tokens) K-major in shared memory. The
 * accumulator layout is the m64nN one of mla_prefill_sm90.cuh: d[4j+0..1] = (row g, tokens
 * 8j+2t..+1), d[4j+2..3] = (row g+8, same tokens) of warp w's rows 16w.. */
#define K3K_WG_D8(b)                                                                          \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define K3K_WG_D16 K3K_WG_D8(0), K3K_WG_D8(8)
#define K3K_WG_D32 K3K_WG_D16, K3K_WG_D8(16), K3K_WG_D8(24)
#define K3K_WG_D48 K3K_WG_D32, K3K_WG_D8(32), K3K_WG_D8(40)
#define K3K_WG_D64 K3K_WG_D48, K3K_WG_D8(48), K3K_WG_D8(56)
#define K3K_WG_D80 K3K_WG_D64, K3K_WG_D8(64), K3K_WG_D8(72)
#define K3K_WG_D96 K3K_WG_D80, K3K_WG_D8(80), K3K_WG_D8(88)
#define K3K_WG_D112 K3K_WG_D96, K3K_WG_D8(96), K3K_WG_D8(104)

__device__ __forceinline__ void wg_rs_n32(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 "
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : K3K_WG_D16
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_rs_n64(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : K3K_WG_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_rs_n96(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47 "
      "}, {%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
      : K3K_WG_D48
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_rs_n128(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 "
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : K3K_WG_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_rs_n160(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79 "
      "}, {%80, %81, %82, %83}, %84, p, 1, 1, 0;\n}\n"
      : K3K_WG_D80
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_rs_n192(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
      "%87, %88, %89, %90, %91, %92, %93, %94, %95 "
      "}, {%96, %97, %98, %99}, %100, p, 1, 1, 0;\n}\n"
      : K3K_WG_D96
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_rs_n224(float *d, const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %117, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
      "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "
      "%103, %104, %105, %106, %107, %108, %109, %110, %111 "
      "}, {%112, %113, %114, %115}, %116, p, 1, 1, 0;\n}\n"
      : K3K_WG_D112
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* One wgmma k16 step over the first 32·NB tokens (NB 1..7). NB is a template argument, so the
 * main loop holds one straight-line wgmma form: a run-time switch on N inside the loop measured
 * 52.1 ms against 41.6 ms for the 8K expert GEMMs. N = 256 is left out: at N <= 224 the kernel
 * already takes 244-255 registers (ptxas serialised the wgmma when it ran short). */
template <int NB>
__device__ __forceinline__ void wg_rs(float *d, const uint32_t *a, uint64_t db) {
  static_assert(NB >= 1 && NB <= 7, "wgmma N = 32..224");
  if (NB == 1) wg_rs_n32(d, a, db);
  else if (NB == 2) wg_rs_n64(d, a, db);
  else if (NB == 3) wg_rs_n96(d, a, db);
  else if (NB == 4) wg_rs_n128(d, a, db);
  else if (NB == 5) wg_rs_n160(d, a, db);
  else if (NB == 6) wg_rs_n192(d, a, db);
  else wg_rs_n224(d, a, db);
}


constexpr int WG_STG = 4; /* ring stages (chunks of 64 k) */
constexpr int WG_MB_D = 2; /* 4-warpgroup shape: chunks of copies a thread has in flight */

/* The two block shapes (NWG math warpgroups of 64 weight rows over token tiles of up to 32·NBMAX
 * tokens, the largest wgmma N):
 *   NWG 4 (the default since session 14): 512 threads, 256 weight rows × up to 128 tokens, at
 *     most 128 registers a thread: one A register set (a warpgroup's dequant does not overlap
 *     its own wgmma, the other three warpgroups' do), stages handed over by mbarriers instead of
 *     a block barrier per chunk, the scale as one multiply unless the warp's chunk has a scale
 *     > 128, the multiply form of the E2M1 unpacking (mx_e2m1_mul4). Each token row copied from L2
 *     feeds twice the weight rows of NWG 2, so the L2 → SM traffic per FLOP halves.
 *   NWG 2 (session 4's kernel; K3PD_MX_WG=2): 256 threads, 128 weight rows × up to 224 tokens,
 *     244-255 registers (the fp32 accumulators of N = 224), two A register sets, a block
 *     barrier per chunk, two multiplies always.
 * Measured (docs/perf-gpu-moe.md, 2026-12-03): K3's 8K prefill expert GEMMs 42.3 → 30.4 ms; a
 * 3 × 192-row shape with 160-token tiles (168 registers, each weight dequantised once at K3's
 * ~162 rows) took 32.9 ms. */
template <int NWG> struct wg_shape {
  static constexpr int THREADS = 128 * NWG;
  static_assert(NWG == 2 || NWG == 4, "the two measured shapes");
  static constexpr int NBMAX = NWG == 4 ? 4 : 7;
  static constexpr bool MB = NWG == 4;               /* mbarrier hand-over */
  static constexpr int NA = NWG == 4 ? 1 : 2;        /* A register sets */
  static constexpr int SC = NWG == 4 ? 6 : 0;        /* dequant_chunk's mode */
  static constexpr int ROWS = 64 * NWG;              /* weight rows of a block tile */
  static constexpr int TOK = 32 * NBMAX;             /* most tokens per tile */
  static constexpr int XS = TOK * 128;               /* a stage's token rows: TOK × 64 k bf16 */
  static constexpr int WS = ROWS * 32;               /* a stage's packed weight rows × 64 k */
  static constexpr int SMEM = WG_STG * (XS + WS) + 1024 + 16 * WG_STG; /* + slack, mbarriers */
  static constexpr int XPASS = THREADS / 8;          /* token rows copied per pass of the block */
};

/* Weight row and set (0 gate/plain, 1 up) of block tile row br (0..127). Fused: warpgroup
 * br/64 owns features nbase + 32·(br/64) ..+31; in its warp (br/16)%4, fragment rows 0..7 are
 * gate rows and 8..15 the up rows of the same 8 features. */
template <bool FUSED>
__device__ __forceinline__ int tile_row(int nbase, int br, int &set) {
  if (!FUSED) {
    set = 0;
    return nbase + br;
  }
  set = (br >> 3) & 1;
  return nbase + 32 * (br >> 6) + 8 * ((br >> 4) & 3) + (br & 7);
}

/* E8M0 byte s → the bf16x2 factors turning the 2^-126-biased codes into values: f1 = 2^(s−1)
 * when s <= 128, else 2^127 with f2 = 2^(s−128) (f2 = 1 when s <= 128); 255 gives NaN. Selects, no branches (the dequant must stay one basic
 * block so the compiler can interleave its loads and chains). */
__device__ __forceinline__ uint32_t scale_f1(uint32_t s) {
  const uint32_t f = s <= 128 ? (s + 126) << 7 : (s == 255 ? 0x7FC0u : 254u << 7);
  return f | (f << 16);
}
__device__ __forceinline__ uint32_t scale_f2(uint32_t s) {
  const uint32_t f = (s > 128 && s != 255) ? (s - 1) << 7 : 0x3F80u;
  return f | (f << 16);
}
/* Nibbles i and i+4 of w as bf16x2 codes × 2^-126 (low half nibble i), unscaled. IM: the
 * multiply form (mxfp4_e2m1.cuh: 2 ALU + 1 IMAD per register; the 4-warpgroup shape), else the
 * shift form (3 ALU; the 2-warpgroup shape, as measured in session 4). */
template <bool IM>
__device__ __forceinline__ uint32_t dq(uint32_t w, uint32_t w2, int i) {
  if (IM) return mx_e2m1_mul(w, w2, i);
  const uint32_t M1 = 0x01C001C0u, M2 = 0x80008000u;
  if (i == 0) return ((w << 6) & M1) | ((w << 12) & M2);
  if (i == 1) return ((w << 2) & M1) | ((w << 8) & M2);
  if (i == 2) return ((w >> 2) & M1) | ((w << 4) & M2);
  return ((w >> 6) & M1) | (w & M2);
}

/* Chunk stage `wr` (packed rows br0 at +0 and br0+8 at +256, 32 bytes each) → the A fragments
 * of the chunk's 4 k16 steps. SC & 2, the scale: 0 two multiplies always (f2 = 1 unless s > 128;
 * in the 2-warpgroup shape a warp-uniform branch to a one-multiply path made ptxas serialise the
 * wgmma: register pressure); 2 one multiply by 2^(s-1) unless some lane of the warp has a scale
 * > 128 in this chunk (then the two-multiply form, on a warp-uniform branch; real checkpoints
 * never have one). SC & 4: the multiply form of dq. Both forms are exact: same bits. */
template <int SC>
__device__ __forceinline__ void dequant_chunk(const unsigned char *wr, uint32_t psel,
                                              const uint32_t (&S)[2][2], uint32_t (&A)[4][4]) {
  constexpr bool IM = (SC & 4) != 0;
  uint4 v[2][2];
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int q = 0; q < 2; q++) v[h][q] = *reinterpret_cast<const uint4 *>(wr + h * 256 + q * 16);
  bool one = false;
  if (SC & 2) {
    const uint32_t m = max(max(S[0][0], S[0][1]), max(S[1][0], S[1][1]));
    one = !__any_sync(0xffffffffu, m > 128u);
  }
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int q = 0; q < 2; q++) {
      const uint32_t w = __byte_perm(__byte_perm(v[h][q].x, v[h][q].y, psel),
                                     __byte_perm(v[h][q].z, v[h][q].w, psel),
                                     0x5410); /* bytes t, t+4, t+8, t+12 */
      const uint32_t w2 = w >> 8;
      uint32_t r[4];
      if (one) { /* every scale of the warp's chunk <= 128: one multiply by 2^(s-1) */
        const uint32_t f = mx_scale_one(S[h][q]);
#pragma unroll
        for (int i = 0; i < 4; i++) r[i] = mx_bmul2(dq<IM>(w, w2, i), f);
      } else {
        const uint32_t f1 = scale_f1(S[h][q]), f2 = scale_f2(S[h][q]);
#pragma unroll
        for (int i = 0; i < 4; i++) r[i] = mx_bmul2(mx_bmul2(dq<IM>(w, w2, i), f1), f2);
      }
      A[2 * q][h] = __byte_perm(r[0], r[1], 0x5410);         /* byte t: k 2t, 2t+1 */
      A[2 * q][2 + h] = __byte_perm(r[2], r[3], 0x5410);     /* byte t+4: k 8+2t.. */
      A[2 * q + 1][h] = __byte_perm(r[0], r[1], 0x7632);     /* byte t+8 */
      A[2 * q + 1][2 + h] = __byte_perm(r[2], r[3], 0x7632); /* byte t+12 */
    }
}

/* Byte offset of 16-byte segment seg of row r in a 128-byte-swizzled tile (1024-byte atoms). */
__device__ __forceinline__ int swz(int r, int seg) { return r * 128 + ((seg ^ (r & 7)) << 4); }

/* What one thread of the block keeps for its expert (same for every token tile). */
struct wthr {
  unsigned char *Xs, *Ws; /* ring: WG_STG token stages (1024-aligned), then WG_STG packed ones */
  uint32_t xb;            /* shared address of Xs */
  const uint8_t *wsrc;    /* copy role: this thread's 16-byte half of a packed row (chunk 0) */
  bool wvalid;
  const uint8_t *sp[2]; /* dequant role: scale rows of fragment rows g, g+8 */
  bool sv[2];
  uint32_t psel; /* byte permute selecting byte t of two words */
  uint32_t full, empty; /* MB: shared addresses of the stages' full[WG_STG], empty[WG_STG] */
  int t, wg, warp, g, tig, br0, nbase, nk;
  int cbase; /* MB: chunks this block consumed before the current token tile */
};

/* One token tile [tb, tb+tsz) (tsz <= 32·NB) of the block's 64·NWG weight rows: the main loop over
 * K and the epilogue. Leaves the ring idle (all copies and wgmma done, a barrier passed). */
template <bool FUSED, int NWG, int NB>
__device__ __forceinline__ void wg_tile(const mx_kargs &a, const wthr &c, int tb, int tsz) {
  using SH = wg_shape<NWG>;
  constexpr int SC = SH::SC;
  static_assert(SH::MB || SH::NA == 2, "the block-barrier loop double-buffers A");
  constexpr bool MB = SH::MB;
  constexpr int NX = (32 * NB + SH::XPASS - 1) / SH::XPASS; /* token rows a thread copies */
  const int t = c.t, nk = c.nk;
  /* x rows this thread copies: tile rows (t >> 3) + XPASS·i (i < NX), segment t & 7; −1: zero */
  int32_t xrow[NX];
#pragma unroll
  for (int i = 0; i < NX; i++) {
    const int r = (t >> 3) + SH::XPASS * i;
    xrow[i] = r < tsz ? (a.x_gather ? __ldg(a.x_gather + tb + r) : tb + r) : -1;
  }
  /* this thread's copies of chunk kc (token rows, its packed row half) into stage st */
  auto copy = [&](int kc, int st) {
#pragma unroll
    for (int i = 0; i < NX; i++) {
      const int r = (t >> 3) + SH::XPASS * i;
      if (r >= 32 * NB) break; /* past the wgmma N: never read */
      const bool v = xrow[i] >= 0;
      const uint16_t *src = v ? a.x + (int64_t)xrow[i] * a.ldx + kc * 64 + (t & 7) * 8 : a.x;
      cp_async16(c.Xs + st * SH::XS + swz(r, t & 7), src, v);
    }
    cp_async16(c.Ws + st * SH::WS + t * 16, c.wsrc + (int64_t)kc * 32, c.wvalid);
  };
  auto issue = [&](int kc) {
    if (kc < nk) copy(kc, kc % WG_STG);
    cp_async_commit(); /* always one group per chunk (empty past the end) */
  };
  auto scales = [&](int kc, uint32_t(&S)[2][2]) {
    if (kc < nk) {
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int q = 0; q < 2; q++) S[h][q] = c.sv[h] ? (uint32_t)__ldg(c.sp[h] + 2 * kc + q) : 127u;
    }
  };
  /* chunk kc's packed rows br0, br0+8 → A fragments of its 4 k16 steps */
  auto dequant = [&](int kc, const uint32_t(&S)[2][2], uint32_t(&A)[4][4]) {
    dequant_chunk<SC>(c.Ws + (kc % WG_STG) * SH::WS + c.br0 * 32, c.psel, S, A);
  };
  float acc[16 * NB];
#pragma unroll
  for (int i = 0; i < 16 * NB; i++) acc[i] = 0.0f;
  uint32_t A0[4][4], A1[4][4], S0[2][2], S1[2][2];
  if (MB) {
    /* Stage use n = cbase + kc (running over the block's token tiles): stage n % WG_STG, its
     * (n / WG_STG)-th use. full[st]: every thread's copies of the use landed (cp.async arrives
     * when they complete); empty[st]: every thread's wgmma of the use completed. A thread issues
     * the copies of chunk kc + WG_MB_D after its own chunk kc, waiting only for the stage's
     * previous use to be released: the warps drift apart by up to WG_MB_D chunks instead of
     * meeting at a block barrier every chunk. */
    auto issue_mb = [&](int kc) {
      if (kc >= nk) return;
      const int n = c.cbase + kc, st = n % WG_STG;
      if (n >= WG_STG) mbar_wait(c.empty + 8 * st, ((n / WG_STG) - 1) & 1);
      copy(kc, st);
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(c.full + 8 * st)
                   : "memory");
    };
    for (int s = 0; s < WG_MB_D; s++) issue_mb(s);
    scales(0, S0);
    scales(1, S1);
    auto chunk_mb = [&](int kc, uint32_t(&A)[4][4], uint32_t(&S)[2][2]) {
      const int n = c.cbase + kc, st = n % WG_STG;
      mbar_wait(c.full + 8 * st, (n / WG_STG) & 1);
      fence_proxy_async(); /* the stage's token rows are read next by wgmma (async proxy) */
      dequant(kc, S, A);
      scales(kc + 2, S);
      wgmma_fence();
      const uint32_t xs = c.xb + st * SH::XS;
#pragma unroll
      for (int s = 0; s < 4; s++) wg_rs<NB>(acc, A[s], gmma_desc(xs + 32 * s, 16, 1024));
      wgmma_commit();
      wgmma_wait<0>();
      mbar_arrive(c.empty + 8 * st);
      issue_mb(kc + WG_MB_D);
    };
    for (int kc = 0; kc < nk; kc += 2) {
      chunk_mb(kc, A0, S0);
      chunk_mb(kc + 1, A0, S1);
    }
  } else {
    for (int s = 0; s < WG_STG - 1; s++) issue(s);
    scales(0, S0);
    scales(1, S1);
    cp_async_wait<WG_STG - 2>(); /* chunk 0 landed (this thread's copies) */
    fence_proxy_async();         /* read next by wgmma (async proxy) */
    __syncthreads();
    auto chunk = [&](int kc, uint32_t(&A)[4][4], uint32_t(&S)[2][2]) {
      dequant(kc, S, A); /* overlaps the wgmma of chunk kc-1 */
      scales(kc + 2, S);
      wgmma_fence();
      const uint32_t xs = c.xb + (kc % WG_STG) * SH::XS;
#pragma unroll
      for (int s = 0; s < 4; s++) wg_rs<NB>(acc, A[s], gmma_desc(xs + 32 * s, 16, 1024));
      wgmma_commit();
      wgmma_wait<1>(); /* chunk kc-1's wgmma done: its stage and A set are free */
      cp_async_wait<WG_STG - 3>(); /* chunk kc+1 landed (this thread's copies) */
      fence_proxy_async();
      __syncthreads(); /* ... everyone's; nobody reads chunk kc-1's stage any more */
      issue(kc + WG_STG - 1);
    };
    for (int kc = 0; kc < nk; kc += 2) { /* nk is even (K % 128 == 0) */
      chunk(kc, A0, S0);
      chunk(kc + 1, A1, S1);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 16 * NB; i++) asm volatile("" : "+f"(acc[i])::"memory");
  cp_async_wait<0>(); /* only empty groups are left */
  /* epilogue: acc[4j + 2h + jj] = (fragment row g + 8h, token 8j + 2·tig + jj) */
#pragma unroll
  for (int j = 0; j < 4 * NB; j++) {
#pragma unroll
    for (int jj = 0; jj < 2; jj++) {
      const int col = 8 * j + 2 * c.tig + jj;
      if (col >= tsz) continue;
      if (FUSED) {
        const int n = c.nbase + 32 * c.wg + 8 * c.warp + c.g;
        if (n < a.N) mx_store_y(a, tb + col, n, mx_act(a, acc[4 * j + jj], acc[4 * j + 2 + jj]));
      } else {
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int n = c.nbase + c.br0 + 8 * h;
          if (n < a.N) mx_store_y(a, tb + col, n, acc[4 * j + 2 * h + jj]);
        }
      }
    }
  }
  __syncthreads(); /* the next token tile refills the ring */
}

template <bool FUSED, int NWG>
__global__ void __launch_bounds__(128 * NWG, 1) mx_wg_kernel(mx_kargs a) {
  using SH = wg_shape<NWG>;
  constexpr int NBMAX = SH::NBMAX;
  extern __shared__ unsigned char wsm[];
  int e, rb, re;
  if (!mx_expert_rows(a, blockIdx.y, e, rb, re)) return;
  wthr c;
  c.nbase = blockIdx.x * (FUSED ? SH::ROWS / 2 : SH::ROWS);
  if (c.nbase >= a.N) return;
  const uint32_t s0 = smem_u32(wsm);
  c.Xs = wsm + (((s0 + 1023u) & ~1023u) - s0);
  c.Ws = c.Xs + WG_STG * SH::XS;
  c.xb = smem_u32(c.Xs);
  c.t = threadIdx.x;
  c.wg = c.t >> 7;
  c.warp = (c.t >> 5) & 3;
  c.g = (c.t & 31) >> 2;
  c.tig = c.t & 3;
  c.nk = a.K >> 6;
  {
    int set;
    const int row = tile_row<FUSED>(c.nbase, c.t >> 1, set);
    const mx_dset &m = set ? a.up : a.w;
    c.wvalid = row < a.N;
    c.wsrc = mx_packed(m, e) + (int64_t)(c.wvalid ? row : 0) * m.ldp + (c.t & 1) * 16;
  }
  c.br0 = 64 * c.wg + 16 * c.warp + c.g;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int set;
    const int row = tile_row<FUSED>(c.nbase, c.br0 + 8 * h, set);
    const mx_dset &m = set ? a.up : a.w;
    c.sv[h] = row < a.N;
    c.sp[h] = mx_scale(m, e) + (int64_t)(c.sv[h] ? row : 0) * m.lds;
  }
  c.psel = (uint32_t)c.tig | ((uint32_t)(c.tig + 4) << 4);
  c.full = smem_u32(c.Ws + WG_STG * SH::WS);
  c.empty = c.full + 8 * WG_STG;
  c.cbase = 0;
  if (SH::MB) {
    if (c.t == 0)
      for (int i = 0; i < WG_STG; i++) {
        mbar_init(c.full + 8 * i, SH::THREADS);
        mbar_init(c.empty + 8 * i, SH::THREADS);
      }
    __syncthreads();
  }
  const int rows = re - rb, ntt = (rows + SH::TOK - 1) / SH::TOK;
  for (int tt = 0; tt < ntt; tt++, c.cbase += c.nk) {
    const int tb = rb + (int)((int64_t)tt * rows / ntt);
    const int tsz = rb + (int)((int64_t)(tt + 1) * rows / ntt) - tb;
    switch ((tsz + 31) >> 5) { /* wgmma N = 32·nb, block-uniform */
    case 1: wg_tile<FUSED, NWG, 1>(a, c, tb, tsz); break;
    case 2: wg_tile<FUSED, NWG, (NBMAX < 2 ? NBMAX : 2)>(a, c, tb, tsz); break;
    case 3: wg_tile<FUSED, NWG, (NBMAX < 3 ? NBMAX : 3)>(a, c, tb, tsz); break;
    case 4: wg_tile<FUSED, NWG, (NBMAX < 4 ? NBMAX : 4)>(a, c, tb, tsz); break;
    case 5: wg_tile<FUSED, NWG, (NBMAX < 5 ? NBMAX : 5)>(a, c, tb, tsz); break;
    case 6: wg_tile<FUSED, NWG, (NBMAX < 6 ? NBMAX : 6)>(a, c, tb, tsz); break;
    default: wg_tile<FUSED, NWG, NBMAX>(a, c, tb, tsz); break;
    }
  }
}

} // namespace

bool k3k_cu_moe_wg_wanted(void) {
  static int v = -1;
  if (v < 0) {
    const char *s = getenv("K3PD_MX_PREFILL");
    v = !(s && strcmp(s, "mma") == 0);
  }
  return v != 0;
}

/* The block shape (wg_shape): K3PD_MX_WG=2 takes the 2-warpgroup one (comparison runs), else 4;
 * read once. */
static int wg_groups(void) {
  static int v = 0;
  if (!v) {
    const char *s = getenv("K3PD_MX_WG");
    v = s && atoi(s) == 2 ? 2 : 4;
  }
  return v;
}

template <bool FUSED, int NWG>
static int wg_launch(cudaStream_t st, const mx_kargs &g, int max_active) {
  using SH = wg_shape<NWG>;
  static bool lim;
  if (!lim) {
    K3K_CU(cudaFuncSetAttribute(mx_wg_kernel<FUSED, NWG>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, SH::SMEM));
    lim = true;
  }
  const int rpb = FUSED ? SH::ROWS / 2 : SH::ROWS;
  dim3 grid((unsigned)((g.N + rpb - 1) / rpb), (unsigned)max_active);
  mx_wg_kernel<FUSED, NWG><<<grid, SH::THREADS, SH::SMEM, st>>>(g);
  return 0;
}

int k3k_cu_moe_gemm_wg(cudaStream_t st, const k3k_cu_moe_gemm_args *a) {
  if (a->K % 128 || a->N % 16 || a->ldx % 8 || ((uintptr_t)a->x & 15) || a->w.ld_packed % 16 ||
      a->max_active <= 0 || a->max_active > 65535)
    return K3_EINVAL;
  const bool fused = a->act != K3K_CU_ACT_NONE;
  if (fused && a->up.ld_packed % 16) return K3_EINVAL;
  mx_kargs g;
  mx_fill_args(&g, a);
  int rc;
  if (wg_groups() == 2)
    rc = fused ? wg_launch<true, 2>(st, g, a->max_active)
               : wg_launch<false, 2>(st, g, a->max_active);
  else
    rc = fused ? wg_launch<true, 4>(st, g, a->max_active)
               : wg_launch<false, 4>(st, g, a->max_active);
  if (rc) return rc;
  K3K_LAUNCHED("mxfp4_grouped_gemm_prefill_wgmma");
  return 0;
}
