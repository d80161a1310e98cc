/* CUDA (sm_90a): MLA absorbed decode attention with TMA bulk tensor copies and wgmma.
 *
 * What it is for: the hot decode path of MLA_DECODE (spec §4.3) at page sizes that are
 * multiples of 8. One block per (48-head group, KV split, sequence) streams the sequence's
 * latent cache in 64-token tiles (64 x 576 bf16 = 72 KB) through two shared-memory stages
 * filled by TMA (cp.async.bulk.tensor, 128-byte swizzle, mbarrier completion) and feeds both
 * products to the tensor cores with wgmma straight from shared memory:
 *   S^T [64 tok x 48 heads] = K_tile [64 x 576] . Q^T         (36 x m64n48k16, K-major A and B)
 *   O^T [512 x 48]         += V_tile^T [512 x 64] . P^T       (V = K_tile[:, :512], M-major A)
 * Heads are the wgmma N dimension, so 48 heads need no padding (M would have to be 64).
 * Warp roles (256 threads): warpgroup 0 computes S, the online softmax (per-head column max
 * across its 4 warps through shared memory, fp32 exp2) and P (bf16, swizzled K-major), hands P
 * and the rescale factors over with a named barrier and goes on to the next tile; warpgroup 1
 * keeps all of O^T (192 fp32 per thread) and does P.V, so the tensor cores run P.V of tile i
 * while warpgroup 0 is in the softmax of tile i+1. Warpgroup 1's first thread issues the TMA
 * copies (no separate producer warp: ptxas sizes registers for whole warpgroups, and a third
 * one would cap a thread at 168). Stage release: all 256 threads arrive on the stage's `empty`
 * mbarrier once their wgmma reads of it completed; the producer waits for that to refill it.
 * What it is not: the op (mla.cu builds q_lat, picks this kernel or the mma.sync one, merges
 * splits); page sizes that are not multiples of 8 (mla.cu's kernel takes those).
 * Invariants: shared tiles are 1024-byte aligned (128-byte swizzle atoms); token rows past the
 * split end are zeroed in shared memory before P.V (pool rows there may hold anything, and
 * 0 * NaN would poison O); every mbarrier wait is bounded (a trap, not a hang, if a phase never
 * completes). */
#include <cuda.h> /* CUtensorMap and its enums only; the encoder comes from the runtime */
#include <string.h>

#include "mla_decode.cuh"

#define WG_D 576
#define WG_DV 512
#define WG_TILE 64
#define WG_HB 48
#define WG_THREADS 256
#define WG_TILE_BYTES (WG_TILE * WG_D * 2)  /* 73728: 9 blocks of 64 rows x 128 B */
#define WG_KBLK (WG_TILE * 128)              /* 8192: one 64-column block of a tile */
#define WG_QBLK (WG_HB * 128)                /* 6144: one 64-column block of Q */
#define WG_Q_BYTES (WG_HB * WG_D * 2)        /* 55296 */
#define WG_P_BYTES (WG_HB * 128)             /* 6144: P^T [48 heads][64 tok] bf16 */
/* Shared layout (offsets from a 1024-aligned base). */
#define WG_OFF_Q (2 * WG_TILE_BYTES)
#define WG_OFF_P (WG_OFF_Q + WG_Q_BYTES)
#define WG_OFF_RED (WG_OFF_P + 2 * WG_P_BYTES)   /* [2][4][48] fp32 column maxima */
#define WG_OFF_AL (WG_OFF_RED + 2 * 4 * WG_HB * 4) /* [2][48] fp32 alpha */
#define WG_OFF_FIN (WG_OFF_AL + 2 * WG_HB * 4)    /* [4][48] l partials + [48] m */
#define WG_OFF_BAR (WG_OFF_FIN + 5 * WG_HB * 4)   /* full[2], empty[2], q: 5 x 8 B */
#define WG_SMEM (WG_OFF_BAR + 5 * 8 + 1024)       /* + alignment slack */

/* ---- PTX wrappers ---- */
__device__ __forceinline__ unsigned smem_u32(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase of parity `par` completed. Bounded: ~2^31 polls (seconds) then trap,
 * so a lost arrival surfaces as a launch failure instead of a hung stream. */
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned par) {
  for (unsigned n = 0;; n++) {
    unsigned ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(par)
        : "memory");
    if (ok) return;
    if (n > (1u << 31)) __trap();
  }
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap *map, int x, int y,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"((uint64_t)map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* Pins accumulator registers at this point of the program, so the compiler moves no access of
 * them across a wgmma issue or wait (the asm statements do not name the in-flight registers). */
template <int N>
__device__ __forceinline__ void fence_regs(float *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle. K-major operands: rows of 128 B, 8-row
 * groups 1024 B apart (SBO); LBO unused. The M-major V operand: 64 dims (128 B) x 8 tokens per
 * atom, token groups 1024 B apart; with a 64-wide M tile the other offset is unused, so both
 * are set to 1024 and either reading of the two fields gives the same matrix. */
__device__ __forceinline__ uint64_t sdesc(unsigned addr, unsigned lbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

/* d[24] (+)= A . B, m64n48k16, bf16 in, fp32 accumulate; tA = 1: A is M-major. */
template <int TA>
__device__ __forceinline__ void wgmma48(float *d, uint64_t da, uint64_t db, int accum) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
      "%24, %25, p, 1, 1, %27, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(da), "l"(db), "r"(accum), "n"(TA));
}

/* S^T [64 tok x 48 heads] (+)= K Q^T over k steps K0..K1-1 (16 dims each). */
template <int K0, int K1>
__device__ __forceinline__ void s_mma(float *sc, unsigned kv, unsigned q) {
  fence_regs<24>(sc);
  wg_fence();
#pragma unroll
  for (int k = K0; k < K1; k++)
    wgmma48<0>(sc, sdesc(kv + (k >> 2) * WG_KBLK + (k & 3) * 32, 16),
               sdesc(q + (k >> 2) * WG_QBLK + (k & 3) * 32, 16), k > K0);
  wg_commit();
  wg_wait0();
  fence_regs<24>(sc);
}

/* O^T[dims 64*mblk0..+64*NT][48] (+)= V^T P^T over the 64 tokens of the stage: NT M tiles x 4
 * k steps. V block m of the tile is exactly the M-major operand of M tile m. */
template <int NT>
__device__ __forceinline__ void pv_mma(float (*o)[24], unsigned kv, unsigned p, int mblk0) {
#pragma unroll
  for (int mt = 0; mt < NT; mt++) fence_regs<24>(o[mt]);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int mt = 0; mt < NT; mt++)
      wgmma48<1>(o[mt], sdesc(kv + (mblk0 + mt) * WG_KBLK + kk * 2048, 1024),
                 sdesc(p + kk * 32, 16), 1);
  wg_commit();
  wg_wait0();
#pragma unroll
  for (int mt = 0; mt < NT; mt++) fence_regs<24>(o[mt]);
}

/* Output of one warpgroup's O^T (dims mbase..+64*NT) for its 12 head columns. */
template <int NT>
__device__ __forceinline__ void wg_store(const k3k_cu_mla_decode_args &a, float (*o)[24],
                                         const float *il, int mbase, int split, int b, int hbase,
                                         int wq, int g, int t4) {
  size_t nrow = (size_t)a.batch * a.heads;
#pragma unroll
  for (int mt = 0; mt < NT; mt++)
#pragma unroll
    for (int j = 0; j < 6; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int dim = mbase + 64 * mt + 16 * wq + g + 8 * (e >> 1);
        int head = 8 * j + 2 * t4 + (e & 1);
        size_t orow = (size_t)b * a.heads + hbase + head;
        float v = o[mt][4 * j + e] * il[2 * j + (e & 1)];
        if (gridDim.y == 1)
          a.out[orow * WG_DV + dim] = f2bf(v);
        else
          a.work[((size_t)split * nrow + orow) * WG_DV + dim] = v;
      }
}

/* 1/l of this thread's 12 head columns from the 4 warps' partial sums (0 for an empty split). */
__device__ __forceinline__ void wg_inv_l(const float *fin, float *il, int t4, bool empty) {
#pragma unroll
  for (int c = 0; c < 12; c++) {
    int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
    float l = fin[head] + fin[WG_HB + head] + fin[2 * WG_HB + head] + fin[3 * WG_HB + head];
    il[c] = empty ? 0.f : 1.0f / l;
  }
}

/* ALL1: warpgroup 1 owns all of O^T (8 M tiles, 192 fp32 per thread) and warpgroup 0 only
 * computes S and the softmax, so P.V of tile i runs on the tensor cores while warpgroup 0 is in
 * the softmax of tile i+1 (the softmax is the longest stage: ~2.2 K cycles per tile against
 * ~1.3 K for S and ~1 K for P.V, clock64 per stage on the H200). !ALL1: each warpgroup owns
 * half of O^T and both wait for P (measured slower; kept as a benchmark variant). */
template <bool ALL1>
__global__ void __launch_bounds__(WG_THREADS, 1)
    mla_wg_kernel(const __grid_constant__ CUtensorMap tkv, const __grid_constant__ CUtensorMap tq,
                  k3k_cu_mla_decode_args a, int chunk, int box_rows) {
  constexpr int NT = ALL1 ? 8 : 4; /* M tiles of O^T per warpgroup that owns any */
  extern __shared__ unsigned char smem_raw[];
  unsigned char *sm = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  const unsigned s0 = smem_u32(sm);
  float *red = (float *)(sm + WG_OFF_RED), *alpha_s = (float *)(sm + WG_OFF_AL);
  float *fin = (float *)(sm + WG_OFF_FIN);
  const unsigned bar0 = s0 + WG_OFF_BAR; /* full[s] = bar0 + 8s, empty[s] = bar0 + 16 + 8s */
  const unsigned qbar = bar0 + 32;
  const int split = blockIdx.y, b = blockIdx.z, hbase = blockIdx.x * WG_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int len = a.seq_lens[(size_t)b * a.sl_stride];
  const int tok0 = split * chunk, tok1 = min(len, tok0 + chunk);
  const int ntiles = tok1 > tok0 ? (tok1 - tok0 + WG_TILE - 1) / WG_TILE : 0;
  if ((a.probe & 8) && blockIdx.x > 0) return;

  if (tid == 0) {
    for (int s = 0; s < 2; s++) {
      mbar_init(bar0 + 8 * s, 1);
      mbar_init(bar0 + 16 + 8 * s, 256);
    }
    mbar_init(qbar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  /* Producer: thread 128 (warpgroup 1) issues Q and the first two tiles here, and each later
   * tile right after both warpgroups released its stage. A tile is 64/box_rows runs of
   * box_rows rows, each inside one page. */
  const int32_t *bt = a.block_table + (size_t)b * a.pt_stride;
  auto issue = [&](int i) {
    if ((a.probe & 32) && i >= 2) { /* timing probe: reuse the resident tiles, no loads */
      mbar_arrive(bar0 + 8 * (i & 1));
      return;
    }
    int s = i & 1, ts = tok0 + i * WG_TILE, nv = min(WG_TILE, tok1 - ts);
    int nseg = (nv + box_rows - 1) / box_rows;
    mbar_expect_tx(bar0 + 8 * s, (unsigned)(nseg * box_rows * WG_D * 2));
    unsigned dst = s0 + s * WG_TILE_BYTES;
    for (int sg = 0; sg < nseg; sg++) {
      int t = ts + sg * box_rows;
      int row = bt[t / a.page_size] * a.page_size + t % a.page_size;
#pragma unroll
      for (int j = 0; j < 9; j++)
        tma_load_2d(dst + j * WG_KBLK + sg * box_rows * 128, &tkv, 64 * j, row, bar0 + 8 * s);
    }
  };
  if (tid == 128 && ntiles > 0) {
    mbar_expect_tx(qbar, WG_Q_BYTES);
    for (int j = 0; j < 9; j++)
      tma_load_2d(s0 + WG_OFF_Q + j * WG_QBLK, &tq, 64 * j, b * a.heads + hbase, qbar);
    issue(0);
    if (ntiles > 1) issue(1);
  }

  const int wg = w >> 2, wq = w & 3, g = lane >> 2, t4 = lane & 3;
  const bool math = !(a.probe & 2);
  /* The two warpgroups run separate loops, so each keeps only its own state live (warpgroup
   * 1's 192 accumulators never share registers with warpgroup 0's softmax state). */
  if (wg == 0) {
    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */
    constexpr int NT0 = ALL1 ? 1 : 4;
    float o[NT0][24];
#pragma unroll
    for (int mt = 0; mt < NT0; mt++)
#pragma unroll
      for (int i = 0; i < 24; i++) o[mt][i] = 0.f;
    /* Column c = 2j + k of this thread is head 8j + 2t4 + k. */
    float m_c[12], l_c[12];
#pragma unroll
    for (int c = 0; c < 12; c++) m_c[c] = -INFINITY, l_c[c] = 0.f;
    if (ntiles > 0) mbar_wait(qbar, 0);
    for (int i = 0; i < ntiles; i++) {
      const int s = i & 1;
      const unsigned par = (i >> 1) & 1, kv = s0 + s * WG_TILE_BYTES;
      const int ts = tok0 + i * WG_TILE, nv = min(WG_TILE, tok1 - ts);
      mbar_wait(bar0 + 8 * s, par);
      float sc[24], al[12];
#pragma unroll
      for (int k = 0; k < 24; k++) sc[k] = 0.f;
      if (math) s_mma<0, 36>(sc, kv, s0 + WG_OFF_Q);
      /* Mask rows past the split end and scale; per-column max over this thread's 2 rows,
       * then the 8 row-lanes (g), then the 4 warps. */
#pragma unroll
      for (int j = 0; j < 6; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int row = 16 * wq + g + 8 * (e >> 1);
          sc[4 * j + e] = row < nv ? sc[4 * j + e] * sl2 : -INFINITY;
        }
      float *rd = red + s * 4 * WG_HB;
#pragma unroll
      for (int c = 0; c < 12; c++) {
        int j = c >> 1, k = c & 1;
        float v = fmaxf(sc[4 * j + k], sc[4 * j + 2 + k]);
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
        if (g == 0) rd[wq * WG_HB + 8 * j + 2 * t4 + k] = v;
      }
      /* Token rows past the end: zero them (all 576 columns) for P.V. Swizzling permutes
       * 16-byte chunks within a 128-byte row, so whole rows are zeroed without it. */
      if (nv < WG_TILE) {
        int n16 = (WG_TILE - nv) * 9 * 8;
        for (int x = tid; x < n16; x += 128) {
          int r = nv + x / 72, rem = x % 72;
          *(uint4 *)(sm + s * WG_TILE_BYTES + (rem >> 3) * WG_KBLK + r * 128 + (rem & 7) * 16) =
              make_uint4(0, 0, 0, 0);
        }
      }
      bar_sync(1, 128);
      unsigned char *pp = sm + WG_OFF_P + s * WG_P_BYTES;
#pragma unroll
      for (int c = 0; c < 12; c++) {
        int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
        float mx = fmaxf(fmaxf(rd[head], rd[WG_HB + head]),
                         fmaxf(rd[2 * WG_HB + head], rd[3 * WG_HB + head]));
        float mn = fmaxf(m_c[c], mx); /* finite: every tile holds a valid token */
        al[c] = exp2f(m_c[c] - mn);
        m_c[c] = mn;
        float p0 = exp2f(sc[4 * (c >> 1) + (c & 1)] - mn);
        float p1 = exp2f(sc[4 * (c >> 1) + 2 + (c & 1)] - mn);
        l_c[c] = l_c[c] * al[c] + p0 + p1;
        /* P^T[head][tok], 128-byte rows, 16-byte chunk index XOR (head & 7). */
        int tk0 = 16 * wq + g, tk1 = tk0 + 8;
        *(uint16_t *)(pp + head * 128 + (((tk0 >> 3) ^ (head & 7)) << 4) + (tk0 & 7) * 2) =
            f2bf(p0);
        *(uint16_t *)(pp + head * 128 + (((tk1 >> 3) ^ (head & 7)) << 4) + (tk1 & 7) * 2) =
            f2bf(p1);
        if (wq == 0 && g == 0) alpha_s[s * WG_HB + head] = al[c];
      }
      fence_async_smem(); /* P and zeroed rows: generic stores read next by wgmma */
      if constexpr (ALL1) {
        bar_arrive(2 + s, 256); /* P ready; this warpgroup goes on to the next tile's S */
      } else {
        bar_sync(2 + s, 256);
#pragma unroll
        for (int mt = 0; mt < NT0; mt++)
#pragma unroll
          for (int k = 0; k < 24; k++) o[mt][k] *= al[2 * (k >> 2) + (k & 1)];
        if (math) pv_mma<NT0>(o, kv, s0 + WG_OFF_P + s * WG_P_BYTES, 0);
      }
      mbar_arrive(bar0 + 16 + 8 * s);
    }
    /* Row statistics: l summed over the 8 row-lanes and the 4 warps. */
#pragma unroll
    for (int c = 0; c < 12; c++) {
      float v = l_c[c];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
      if (g == 0) fin[wq * WG_HB + head] = v;
    }
    bar_sync(4, 256);
    float il[12];
    wg_inv_l(fin, il, t4, ntiles == 0);
    if constexpr (!ALL1) wg_store<NT0>(a, o, il, 0, split, b, hbase, wq, g, t4);
    if (gridDim.y > 1 && wq == 0 && g == 0) {
      size_t nrow = (size_t)a.batch * a.heads;
#pragma unroll
      for (int c = 0; c < 12; c++) {
        int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
        size_t orow = (size_t)b * a.heads + hbase + head;
        a.work[(size_t)gridDim.y * nrow * WG_DV + (size_t)split * nrow + orow] =
            ntiles == 0 ? -INFINITY : m_c[c] + log2f(1.0f / il[c]);
      }
    }
  } else {
    float o[NT][24];
#pragma unroll
    for (int mt = 0; mt < NT; mt++)
#pragma unroll
      for (int i = 0; i < 24; i++) o[mt][i] = 0.f;
    for (int i = 0; i < ntiles; i++) {
      const int s = i & 1;
      const unsigned par = (i >> 1) & 1, kv = s0 + s * WG_TILE_BYTES;
      mbar_wait(bar0 + 8 * s, par);
      bar_sync(2 + s, 256); /* P and alpha of this tile are in shared memory */
      float al[12];
#pragma unroll
      for (int c = 0; c < 12; c++) al[c] = alpha_s[s * WG_HB + 8 * (c >> 1) + 2 * t4 + (c & 1)];
#pragma unroll
      for (int mt = 0; mt < NT; mt++)
#pragma unroll
        for (int k = 0; k < 24; k++) o[mt][k] *= al[2 * (k >> 2) + (k & 1)];
      if (math) pv_mma<NT>(o, kv, s0 + WG_OFF_P + s * WG_P_BYTES, ALL1 ? 0 : 4);
      mbar_arrive(bar0 + 16 + 8 * s);
      if (tid == 128 && i + 2 < ntiles) {
        mbar_wait(bar0 + 16 + 8 * s, par); /* warpgroup 0 is done with the stage too */
        issue(i + 2);
      }
    }
    bar_sync(4, 256);
    float il[12];
    wg_inv_l(fin, il, t4, ntiles == 0);
    wg_store<NT>(a, o, il, ALL1 ? 0 : 256, split, b, hbase, wq, g, t4);
  }
}

/* ---- host side ---- */

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, looked up once through the runtime (no libcuda link). */
static encode_tiled_fn encoder(void) {
  static encode_tiled_fn fn;
  if (!fn) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (encode_tiled_fn)p;
  }
  return fn;
}

/* 2-D bf16 map over rows of 576 elements, box 64 columns x box_rows rows, 128-byte swizzle. */
static int make_map(CUtensorMap *m, const void *base, int64_t rows, int box_rows,
                    CUtensorMapL2promotion l2) {
  encode_tiled_fn fn = encoder();
  if (!fn) {
    K3_ERROR("mla_decode: cuTensorMapEncodeTiled not available from the driver");
    return K3_EDEVICE;
  }
  cuuint64_t dims[2] = {WG_D, (cuuint64_t)rows}, strides[1] = {WG_D * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, es[2] = {1, 1};
  CUresult r = fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    K3_ERROR("mla_decode: cuTensorMapEncodeTiled failed (%d), rows %lld box %d", (int)r,
             (long long)rows, box_rows);
    return K3_EDEVICE;
  }
  return 0;
}

bool mla_wg_ok(const k3k_cu_mla_decode_args *a) {
  return a->page_size > 0 && a->page_size % 8 == 0 && a->heads % WG_HB == 0 &&
         a->pages * a->page_size < (1ll << 31) && encoder() != NULL;
}

int mla_wg_launch(cudaStream_t st, const k3k_cu_mla_decode_args *a, int splits, int chunk) {
  int box_rows = 64;
  while (a->page_size % box_rows) box_rows >>= 1; /* >= 8: mla_wg_ok */
  CUtensorMap tkv, tq;
  const CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  int rc = make_map(&tkv, a->kv, a->pages * a->page_size, box_rows, l2);
  if (!rc) rc = make_map(&tq, a->q, (int64_t)a->batch * a->heads, WG_HB, l2);
  if (rc) return rc;
  if (a->probe & 512) { /* benchmark variant: O^T split over both warpgroups */
    K3K_CU(cudaFuncSetAttribute(mla_wg_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                WG_SMEM));
    mla_wg_kernel<false><<<dim3(a->heads / WG_HB, splits, a->batch), WG_THREADS, WG_SMEM, st>>>(
        tkv, tq, *a, chunk, box_rows);
  } else {
    K3K_CU(cudaFuncSetAttribute(mla_wg_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                WG_SMEM));
    mla_wg_kernel<true><<<dim3(a->heads / WG_HB, splits, a->batch), WG_THREADS, WG_SMEM, st>>>(
        tkv, tq, *a, chunk, box_rows);
  }
  K3K_LAUNCHED("mla_decode_wg");
  return 0;
}
