/* Decode kernel of the grouped MXFP4 W4A16 expert GEMM (k3k_cu_moe_gemm with rows_hint <= 16):
 * a register-streaming kernel in the style of gemv.cu, without shared-memory staging.
 *
 * What it is for: y = x · dequant(W_e)ᵀ for every active expert e over its grouped rows when
 * each expert has few rows (decode: ~1-2), i.e. a pure weight stream. Same contract as
 * k3k_cu_moe_gemm (moe_ops.h): gate/up with the activation fused, down plain, fp32
 * accumulation, W in the checkpoint's packed layout. What it is not: the prefill tiling or the
 * older cp.async decode kernel (mxfp4_tc.cu, still selectable: variant -1).
 *
 * Work split. A block of 4 warps owns one row tile of one expert: 16 gate rows and the same 16
 * up rows (fused) or 32 rows (plain). Its warps split K interleaved: warp w takes the 128-k
 * steps w, w+4, w+8, ..., so at any moment the block reads adjacent 64-byte pieces of the same
 * rows; the 4 partial tiles meet in shared memory (one barrier) and warp 0 runs the epilogue.
 * A "unit" is one 16-row half of the tile × 128 k: lane (g, t4) loads row g and row g+8's 16
 * packed bytes at k 32·t4.. (one scale group each; one 16-byte load each, not allocated in L1,
 * with an L2::256B prefetch hint: L2 fetches the whole 256-byte block, whose other pieces the
 * block reads next) and their two scale bytes. Units are software-pipelined through registers:
 * the load of unit u+NB-1 is issued before unit u is computed (NB = 2: the next unit is in
 * flight while one computes). 80 registers, 6 blocks (24 warps) per SM.
 *
 * Why this shape (docs/perf-gpu-moe.md, session 4): with the same arithmetic, more resident
 * warps beat deeper per-warp pipelines (NB 4-6 at 16 warps/SM were slower than NB 2 at 20-24),
 * K interleaved across a block's warps beat contiguous K ranges and whole-K warps (short-lived
 * 4-warp blocks keep the tail short at T = 1), 8-warp blocks were slower, and the L2 prefetch
 * hint gained 4-5 %. Timing-only variants without the math stream at 1.2-1.4x the floor; the
 * math adds ~30 % on top (what bounds it: latency per warp, see the doc).
 *
 * Arithmetic per unit: dequantise to bf16x2 in registers and feed mma.sync m16n8k16 (W as A:
 * 16 rows, x as B: 8 tokens; at one token 7/8 of the mma is wasted, but the tensor pipe has
 * room to spare and it keeps fp32 accumulation with one instruction per 8 weights). The k order
 * inside a step is free (mma sums), so x is fed in the weights' (k, k+4) pairing by byte
 * permutes, once per 128 k for both halves.
 *
 * Dequantisation (mx_e2m1_mul4, mxfp4_e2m1.cuh): for a 32-bit word w of 8 codes, bf16x2 register i holds codes i and i+4
 * as the E2M1 value × 2^-126: ((w_i & 0x000F000F) · (2^6 + 2^12)) & 0x81C081C0, where w_i has
 * codes i, i+4 in its nibbles 0 and 4 (w, w>>4 via the mask 0x00F000F0 and multiplier
 * 2^2 + 2^8, and the same on w>>8 for i = 2, 3). The multiply makes two disjoint copies of
 * each nibble (no carries): the low copy puts e1 e0 m on the bf16 exponent/mantissa boundary,
 * the high copy puts the sign on bit 15; the mask keeps those. 13 integer operations per 8
 * codes (4 of them IMAD, which issue on the FMA pipe). Then one bf16x2 multiply by 2^(s-1)
 * applies the E8M0 scale (exact); units where some lane has a scale > 128 (never in real
 * checkpoints; NaN 0xFF included) take a second multiply on a warp-uniform branch.
 *
 * Variants 3-8 (mx_dec3_kernel, session 5; K3PD_MXDEC / k3k_cu_moe_dec_variant; 5 was the
 * default until session 15, now taken for calls with < 64 expert slots): the same blocks, units
 * and math with the weights brought in by a per-warp cp.async ring in shared memory instead of
 * registers, and optionally launched with PDL; bit-identical outputs to variant 0 (k3k-gpu-moe
 * compares them byte for byte).
 *
 * Invariants: results differ from the reference chain only by fp32 summation order (fixed:
 * one accumulator chain per half tile in k order, then the 4 warps' partials in warp order:
 * bit-identical from run to run). No atomics, no allocation, no synchronisation: capture-safe. */
#include "cuda_common.cuh"
#include "mma_sm80.cuh"
#include "moe_ops.h"
#include "mxfp4_args.cuh"
#include "mxfp4_e2m1.cuh"
#include "pdl.cuh"

namespace {

constexpr int DW = 4; /* warps per block = K parts of a row tile */

struct dargs {
  mx_dset w, up;
  int act, round_inner;
  float beta, beta_lin;
  int N, K, nomath, pf;
  const uint16_t *x;
  int64_t ldx;
  const int32_t *x_gather;
  void *y;
  int64_t ldy;
  int y_f32;
  const int32_t *expert_off, *active;
  int single_rows;
};

/* 16 weight bytes, read once: not kept in L1; PF asks L2 to fetch the whole 128/256-byte block
 * from DRAM (the rest of the row piece is read by this block's next k steps). */
template <int PF>
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
  uint4 r;
  if (PF == 256)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  else if (PF == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 ld_w(const void *p, int pf) {
  return pf == 2 ? ld_stream16<256>(p) : pf == 1 ? ld_stream16<128>(p) : ld_stream16<0>(p);
}

/* E8M0 byte s → bf16x2 factors: fast path mx_scale_one (2^(s−1), s <= 128); slow path f1·f2
 * with f2 = 1 for s <= 128, 2^127 · 2^(s−128) for 129..254, NaN for 255. */
__device__ __forceinline__ void sfac_slow(uint32_t s, uint32_t &f1, uint32_t &f2) {
  if (s <= 128) {
    f1 = (s + 126u) << 7;
    f2 = 0x3F80u;
  } else if (s == 255) {
    f1 = 0x7FC0u;
    f2 = 0x3F80u;
  } else {
    f1 = 254u << 7;
    f2 = (s - 1u) << 7;
  }
  f1 |= f1 << 16;
  f2 |= f2 << 16;
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

/* One unit: rows g (w0, scale s0) and g+8 (w1, s1) × the lane's 32 k, against the B fragments
 * xb[q][p][2] of this 128-k step, into the half tile's accumulators c. */
template <bool SLOW>
__device__ __forceinline__ void unit_mma(const uint4 &w0, const uint4 &w1, uint32_t s0, uint32_t s1,
                                         const uint32_t (&xb)[4][2][2], float (&c)[4]) {
  uint32_t f10, f11, f20 = 0, f21 = 0;
  if (SLOW) {
    sfac_slow(s0, f10, f20);
    sfac_slow(s1, f11, f21);
  } else {
    f10 = mx_scale_one(s0);
    f11 = mx_scale_one(s1);
  }
#pragma unroll
  for (int q = 0; q < 4; q++) {
    uint32_t ra[4], rb[4];
    mx_e2m1_mul4(word_of(w0, q), ra);
    mx_e2m1_mul4(word_of(w1, q), rb);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      ra[i] = mx_bmul2(ra[i], f10);
      rb[i] = mx_bmul2(rb[i], f11);
      if (SLOW) {
        ra[i] = mx_bmul2(ra[i], f20);
        rb[i] = mx_bmul2(rb[i], f21);
      }
    }
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const uint32_t af[4] = {ra[2 * p], rb[2 * p], ra[2 * p + 1], rb[2 * p + 1]};
      mma_bf16(c, af, xb[q][p][0], xb[q][p][1]);
    }
  }
}

/* FUSED: half 0 = gate rows row0..+15, half 1 = the same up rows; else halves are rows
 * row0..+15 and row0+16..+31 of one matrix. NB (even): units in the register pipeline. */
/* x loads: plain (coherent) when the kernel runs under PDL (the previous kernel may have written
 * x; a non-coherent load could be hoisted above the wait), else through the read-only path. */
template <bool COH> __device__ __forceinline__ uint4 ldx16(const uint4 *p) {
  if (COH) return *p;
  return __ldg(p);
}

/* This lane's x for a new 128-k step (token g, k 32·t4..; zero when !tv) as mma B fragments:
 * xb[q][p] = (x[8q+p], x[8q+p+4]), (x[8q+p+1], x[8q+p+5]) for p = 0 (i0 = 0), 1 (2). */
template <bool COH>
__device__ __forceinline__ void x_frags(const uint4 *xp, bool tv, uint32_t (&xb)[4][2][2]) {
  uint4 xr[4];
#pragma unroll
  for (int v = 0; v < 4; v++) xr[v] = tv ? ldx16<COH>(xp + v) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int q = 0; q < 4; q++)
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const uint32_t lo = p ? xr[q].y : xr[q].x, hi = p ? xr[q].w : xr[q].z;
      xb[q][p][0] = __byte_perm(lo, hi, 0x5410);
      xb[q][p][1] = __byte_perm(lo, hi, 0x7632);
    }
}

template <bool FUSED, int NB, int MINB>
__global__ void __launch_bounds__(DW * 32, MINB) mx_dec2_kernel(dargs a) {
  static_assert(NB >= 2 && NB % 2 == 0, "a slot's parity must be its half");
  __shared__ float4 red[DW][32][2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  int e, rb, re;
  if (!mx_expert_rows(a, blockIdx.y, e, rb, re)) return;
  const int part = warp;
  const int row0 = blockIdx.x * (FUSED ? 16 : 32);
  const uint8_t *P[2], *S[2];
  bool valid[2];
#pragma unroll
  for (int m = 0; m < 2; m++) {
    const mx_dset &set = (FUSED && m == 1) ? a.up : a.w;
    int r = FUSED ? row0 : row0 + 16 * m;
    valid[m] = r < a.N;
    if (!valid[m]) r = 0;
    const uint8_t *pb = mx_packed(set, e), *sb = mx_scale(set, e);
    P[m] = pb + (int64_t)(r + g) * set.ldp + t4 * 16;
    S[m] = sb + (int64_t)(r + g) * set.lds + t4;
  }
  const int ldp8[2] = {(int)(8 * a.w.ldp), (int)(8 * (FUSED ? a.up.ldp : a.w.ldp))};
  const int lds8[2] = {(int)(8 * a.w.lds), (int)(8 * (FUSED ? a.up.lds : a.w.lds))};
  /* this warp's k steps: kb + kst·i, i < nks (every DW-th step from its own) */
  const int nk = a.K >> 7, kb = part, kst = DW;
  const int nks = nk > part ? (nk - part + DW - 1) / DW : 0, nu = 2 * nks;

  for (int tb = rb; tb < re; tb += 8) {
    const int tok = tb + g;
    const bool tv = tok < re;
    const uint16_t *xr = a.x;
    if (tv) xr = a.x + (int64_t)(a.x_gather ? __ldg(a.x_gather + tok) : tok) * a.ldx + t4 * 32;
    float c[2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int j = 0; j < 4; j++) c[m][j] = 0.0f;

    uint4 wb[NB][2];
    uint32_t sb[NB][2];
    uint32_t xb[4][2][2];
    /* unit u (k step kb + kst·(u/2), half u%2 = slot%2) into its slot */
#define DEC2_LOAD(slot, u)                                                               \
  do {                                                                                   \
    const int m_ = (slot) & 1, kk_ = kb + kst * ((u) >> 1);                              \
    if (valid[m_]) {                                                                     \
      wb[slot][0] = ld_w(P[m_] + kk_ * 64, a.pf);                                        \
      wb[slot][1] = ld_w(P[m_] + ldp8[m_] + kk_ * 64, a.pf);                             \
      sb[slot][0] = __ldg(S[m_] + kk_ * 4);                                              \
      sb[slot][1] = __ldg(S[m_] + lds8[m_] + kk_ * 4);                                   \
    }                                                                                    \
  } while (0)
#pragma unroll
    for (int j = 0; j < NB - 1; j++)
      if (j < nu) DEC2_LOAD(j, j);
    for (int ub = 0; ub < nu; ub += NB) {
#pragma unroll
      for (int j = 0; j < NB; j++) {
        const int u = ub + j;
        if (u + NB - 1 < nu) DEC2_LOAD((j + NB - 1) % NB, u + NB - 1);
        if (u < nu) {
          const int m = j & 1;
          if (m == 0) { /* new 128-k step: this lane's x (token g, k 32·t4..) as B fragments */
            x_frags<false>(reinterpret_cast<const uint4 *>(xr + (kb + kst * (u >> 1)) * 128), tv, xb);
          }
          if (valid[m] && !a.nomath) {
            const bool slow = __any_sync(0xffffffffu, (sb[j][0] > 128u) | (sb[j][1] > 128u));
            if (slow)
              unit_mma<true>(wb[j][0], wb[j][1], sb[j][0], sb[j][1], xb, c[m]);
            else
              unit_mma<false>(wb[j][0], wb[j][1], sb[j][0], sb[j][1], xb, c[m]);
          }
        }
      }
    }
#undef DEC2_LOAD
    /* c[m][2h + j] = (row g + 8h of half m, token tb + 2·t4 + j) */
    float(&r)[2][4] = c;
    {
      red[warp][lane][0] = make_float4(r[0][0], r[0][1], r[0][2], r[0][3]);
      red[warp][lane][1] = make_float4(r[1][0], r[1][1], r[1][2], r[1][3]);
      __syncthreads();
      if (part == 0) {
#pragma unroll
        for (int q = 1; q < DW; q++) {
          const float4 o0 = red[warp + q][lane][0], o1 = red[warp + q][lane][1];
          r[0][0] += o0.x;
          r[0][1] += o0.y;
          r[0][2] += o0.z;
          r[0][3] += o0.w;
          r[1][0] += o1.x;
          r[1][1] += o1.y;
          r[1][2] += o1.z;
          r[1][3] += o1.w;
        }
      }
    }
    if (part == 0) {
      mx_store_frags<FUSED>(a, r, tb + 2 * t4, re, row0, g, valid);
    }
    __syncthreads(); /* red is rewritten by the next token chunk */
  }
}

/* ---- Variants 3+: the same warps, work split and math; the weights come through a ring ----
 *
 * Why (docs/perf-gpu-moe.md, session 4): the kernel above keeps one 1 KB unit per warp in flight
 * while the warp computes (each unit in flight costs 10 registers, and registers are warps).
 * Here each warp owns S slots of shared memory and keeps S-1 units in flight by cp.async while
 * it computes one, so the bytes in flight cost no registers (24 warps × 3 KB = 72 KB per SM at
 * S = 4, against ~24 KB above during the math).
 * Slots: unit u lives in slot u % S of its warp. A lane copies, and later reads, only its own
 * bytes (its 16 bytes of row g and of row g+8, and the two 4-byte words holding their scale
 * bytes), so the lane's own cp.async.wait_group is all the synchronisation a slot needs: no
 * barrier, no mbarrier; a slot is refilled one unit after the same lane read it (program order).
 * Slot layout (SLOT bytes): [0, 512) row g pieces by lane, [512, 1024) row g+8, [1024, 1152)
 * and [1152, 1280) the scale words by lane; 8 consecutive lanes touch 128 contiguous bytes.
 * Groups: every thread commits exactly one group per unit index, empty or not (S-1 in the
 * prologue, one per unit after), so after the commit of unit u+S-1, wait_group(S-1) means
 * unit u has landed; after the last unit every real copy has landed.
 * Scale bytes: cp.async has no 1-byte form, so a lane copies the aligned 4-byte word holding
 * its byte and shifts by the address's low bits (no alignment of scale rows assumed; the word
 * never leaves the 4-byte block of a valid byte).
 * Numerics: the same units in the same order through the same unit_mma, the same reduction
 * (partials via the warps' own slot 0) and epilogue: outputs are bit-identical to variant 0,
 * which the parity test asserts.
 * PM (PDL, pdl.cuh): 0 plain launch; 1 PDL: waits before any memory access, then triggers
 * (the next kernel's blocks may take SM slots as this grid drains); 2 PDL, and the plan
 * (expert_off, active, x_gather) and the first S-1 units are read before the wait. 2 is only
 * used for the down GEMM of the grouped pair (act NONE with a plan): its predecessor is the
 * gate/up GEMM of the same variant (PM 1), which triggers only after its own wait returned, so
 * the plan's writer (the route/plan kernel) had completed before any block of this grid
 * started; the weights are constant during a pass. x and y only after the wait, x (and
 * x_gather) with coherent loads: an .nc load could be hoisted above the wait. */
constexpr int SLOT = 1280;

__device__ __forceinline__ void cpa16(uint32_t s, const void *g) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void cpa4(uint32_t s, const void *g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void cpa_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cpa_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* the aligned word holding byte p, and p's bit offset in it */
__device__ __forceinline__ const void *word_of_byte(const uint8_t *p) {
  return reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)3);
}
__device__ __forceinline__ uint32_t bitoff(const uint8_t *p) {
  return 8u * (uint32_t)(reinterpret_cast<uintptr_t>(p) & 3);
}

/* The 4 warps' partial tiles summed into warp 0's c, in warp order, through each warp's own
 * ring (wr; warp q's ring at ring + q·ring_bytes). One block barrier; warp 0 then holds the sum. */
__device__ __forceinline__ void ring_reduce(float (&c)[2][4], uint8_t *wr, const uint8_t *ring,
                                            int ring_bytes, int lane, int warp) {
  float4 *const red = reinterpret_cast<float4 *>(wr);
  red[2 * lane] = make_float4(c[0][0], c[0][1], c[0][2], c[0][3]);
  red[2 * lane + 1] = make_float4(c[1][0], c[1][1], c[1][2], c[1][3]);
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int q = 1; q < DW; q++) {
      const float4 *o = reinterpret_cast<const float4 *>(ring + q * ring_bytes);
      const float4 o0 = o[2 * lane], o1 = o[2 * lane + 1];
      c[0][0] += o0.x;
      c[0][1] += o0.y;
      c[0][2] += o0.z;
      c[0][3] += o0.w;
      c[1][0] += o1.x;
      c[1][1] += o1.y;
      c[1][2] += o1.z;
      c[1][3] += o1.w;
    }
  }
}

template <bool FUSED, int S, int MINB, int PM>
__global__ void __launch_bounds__(DW * 32, MINB) mx_dec3_kernel(dargs a) {
  static_assert(S >= 2 && S <= 8, "ring slots per warp");
  static_assert(PM != 2 || !FUSED, "only the down GEMM reads before the wait");
  extern __shared__ uint4 ring4[];
  uint8_t *const ring = reinterpret_cast<uint8_t *>(ring4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  if (PM == 1) {
    pdl_wait();
    pdl_trigger();
  }
  int e, rb, re;
  if (!mx_expert_rows(a, blockIdx.y, e, rb, re)) return;
  const int row0 = blockIdx.x * (FUSED ? 16 : 32);
  const uint8_t *P[2], *Sc[2];
  bool valid[2];
#pragma unroll
  for (int m = 0; m < 2; m++) {
    const mx_dset &set = (FUSED && m == 1) ? a.up : a.w;
    int r = FUSED ? row0 : row0 + 16 * m;
    valid[m] = r < a.N;
    if (!valid[m]) r = 0;
    P[m] = mx_packed(set, e) + (int64_t)(r + g) * set.ldp + t4 * 16;
    Sc[m] = mx_scale(set, e) + (int64_t)(r + g) * set.lds + t4;
  }
  const int ldp8[2] = {(int)(8 * a.w.ldp), (int)(8 * (FUSED ? a.up.ldp : a.w.ldp))};
  const int lds8[2] = {(int)(8 * a.w.lds), (int)(8 * (FUSED ? a.up.lds : a.w.lds))};
  /* bit offsets of the scale bytes in their words: k steps move by 4 bytes, so fixed per row */
  const uint32_t sh[2][2] = {{bitoff(Sc[0]), bitoff(Sc[0] + lds8[0])},
                             {bitoff(Sc[1]), bitoff(Sc[1] + lds8[1])}};
  /* this warp's k steps: kb + kst·i, i < nks; unit u = 2i + m is step i, half m */
  const int nk = a.K >> 7, kb = warp, kst = DW;
  const int nks = nk > warp ? (nk - warp + DW - 1) / DW : 0, nu = 2 * nks;
  uint8_t *const wr = ring + warp * (S * SLOT); /* this warp's S slots */
  const uint32_t wsm = (uint32_t)__cvta_generic_to_shared(wr);
  const uint32_t dw = wsm + lane * 16, ds = wsm + 1024 + lane * 4; /* slot 0 destinations */
  const uint8_t *const rw = wr + lane * 16, *const rs = wr + 1024 + lane * 4;

  for (int tb = rb; tb < re; tb += 8) {
    float c[2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int j = 0; j < 4; j++) c[m][j] = 0.0f;
    /* unit (step i, half m) into slot js, then commit (always: one group per unit index) */
#define DEC3_ISSUE(js, i, m)                                                             \
  do {                                                                                   \
    if (valid[m]) {                                                                      \
      const int kk_ = kb + kst * (i);                                                    \
      const uint32_t o_ = (uint32_t)(js) * SLOT;                                         \
      cpa16(dw + o_, P[m] + kk_ * 64);                                                   \
      cpa16(dw + o_ + 512, P[m] + ldp8[m] + kk_ * 64);                                   \
      cpa4(ds + o_, word_of_byte(Sc[m] + kk_ * 4));                                      \
      cpa4(ds + o_ + 128, word_of_byte(Sc[m] + lds8[m] + kk_ * 4));                      \
    }                                                                                    \
    cpa_commit();                                                                        \
  } while (0)
#pragma unroll
    for (int j = 0; j < S - 1; j++) {
      if (j < nu)
        DEC3_ISSUE(j, j >> 1, j & 1);
      else
        cpa_commit();
    }
    if (PM == 2 && tb == rb) { /* the first units are in flight; x and y are the pass's */
      pdl_wait();
      pdl_trigger();
    }
    const int tok = tb + g;
    const bool tv = tok < re;
    const uint16_t *xr = a.x;
    if (tv) {
      const int xrow = a.x_gather ? (PM ? a.x_gather[tok] : __ldg(a.x_gather + tok)) : tok;
      xr = a.x + (int64_t)xrow * a.ldx + t4 * 32;
    }
    uint32_t xb[4][2][2];
    int js = 0; /* slot of the current unit */
    for (int i = 0; i < nks; i++) {
#pragma unroll
      for (int m = 0; m < 2; m++) {
        const int un = 2 * i + m + S - 1; /* the unit issued now, into the slot read last */
        if (un < nu)
          DEC3_ISSUE(js == 0 ? S - 1 : js - 1, un >> 1, (m + S - 1) & 1);
        else
          cpa_commit();
        cpa_wait<S - 1>(); /* unit 2i + m has landed */
        if (m == 0) { /* new 128-k step: this lane's x (token g, k 32·t4..) as B fragments */
          x_frags<PM != 0>(reinterpret_cast<const uint4 *>(xr + (kb + kst * i) * 128), tv, xb);
        }
        if (valid[m] && !a.nomath) {
          const uint32_t o = (uint32_t)js * SLOT;
          const uint4 w0 = *reinterpret_cast<const uint4 *>(rw + o);
          const uint4 w1 = *reinterpret_cast<const uint4 *>(rw + o + 512);
          const uint32_t *sw = reinterpret_cast<const uint32_t *>(rs + o);
          const uint32_t s0 = (sw[0] >> sh[m][0]) & 0xFFu, s1 = (sw[32] >> sh[m][1]) & 0xFFu;
          const bool slow = __any_sync(0xffffffffu, (s0 > 128u) | (s1 > 128u));
          if (slow)
            unit_mma<true>(w0, w1, s0, s1, xb, c[m]);
          else
            unit_mma<false>(w0, w1, s0, s1, xb, c[m]);
        }
        js = js == S - 1 ? 0 : js + 1;
      }
    }
#undef DEC3_ISSUE
    /* partials through each warp's own slot 0 (all of its copies have landed: see Groups) */
    ring_reduce(c, wr, ring, S * SLOT, lane, warp);
    if (warp == 0) { /* c[m][2h + j] = (row g + 8h of half m, token tb + 2·t4 + j) */
      mx_store_frags<FUSED>(a, c, tb + 2 * t4, re, row0, g, valid);
    }
    __syncthreads(); /* slot 0 is refilled by the next token chunk */
  }
}

/* ---- Variants 9+: the ring kernel with its per-unit bookkeeping taken out (session 15) ----
 *
 * Why: ncu at T = 64 (E = 256) showed the ring kernel integer-issue bound: ~17 ALU instructions
 * per 8-code word, of which the E2M1 unpacking is 9 and the rest is per-unit bookkeeping (global
 * and shared addresses recomputed from the step index, the slot index select, two 4-byte scale
 * copies per unit and their shifts, a warp vote per unit). Here the same warps, units, ring and
 * math run with:
 *   - the warp's k steps fully unrolled (at most NKS per warp: K <= 512·NKS), so every unit's
 *     slot and every address offset is a compile-time immediate on four per-block pointers;
 *   - the scale bytes of all the warp's units loaded once per block into registers (one word per
 *     k step: rows g and g+8 of both halves), and one warp vote per block instead of per unit
 *     (a block whose units hold any scale > 128 runs every unit on the two-multiply form, which
 *     is exact and gives the same bits for scales <= 128);
 *   - slots of 1 KB (weights only).
 * Numerics: the same units in the same order through unit_mma, the same reduction and epilogue:
 * outputs bit-identical to variants 0 and 5 (k3k-gpu-moe compares them byte for byte). */
constexpr int SLOT4 = 1024;
constexpr int DEC4_NKS = 7; /* k steps per warp unrolled: K <= 512 · 7 = 3584 (K3: 3584, 3072) */

/* The 4 scale bytes of k step i < nks for this lane as one word sw[i]: byte 2m + h = half m,
 * row g + 8h. Returns whether any of them is above 128 (the two-multiply form). */
template <int NKS>
__device__ __forceinline__ bool dec4_scales(const uint8_t *const (&sc)[2][2], int nks,
                                            uint32_t (&sw)[NKS]) {
  bool big = false;
#pragma unroll
  for (int i = 0; i < NKS; i++) {
    sw[i] = 0;
    if (i < nks) {
      const uint32_t a = __ldg(sc[0][0] + 16 * i), b = __ldg(sc[0][1] + 16 * i),
                     c = __ldg(sc[1][0] + 16 * i), d = __ldg(sc[1][1] + 16 * i);
      sw[i] = __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
      big |= (a > 128u) | (b > 128u) | (c > 128u) | (d > 128u);
    }
  }
  return big;
}

/* Unit u (k step i = u / 2, half m = u % 2) of a token chunk: issue unit u + S - 1 into the slot
 * read last (every call commits one group, empty or not), wait until unit u has landed, build
 * this k step's x fragments when m == 0, then unit u's math with the k step's scale word swi. */
template <int S, int PM, int NKS, bool SLOW>
__device__ __forceinline__ void dec4_unit(int u, int i, int m, int nu, uint32_t swi,
                                          const uint8_t *const (&pk)[2][2], bool tv,
                                          const uint16_t *xk, uint32_t dw, const uint8_t *rw,
                                          const bool (&valid)[2], uint32_t (&xb)[4][2][2],
                                          float (&c)[2][4]) {
  const int un = u + S - 1, mi = un & 1;
  if ((SLOW || un < 2 * NKS) && un < nu && valid[mi]) { /* (the unrolled form drops the tail) */
    const uint32_t o = (uint32_t)((un % S) * SLOT4);
    cpa16(dw + o, pk[mi][0] + 256 * (un >> 1));
    cpa16(dw + o + 512, pk[mi][1] + 256 * (un >> 1));
  }
  cpa_commit();
  cpa_wait<S - 1>(); /* unit u has landed */
  if (m == 0) x_frags<PM != 0>(reinterpret_cast<const uint4 *>(xk + 512 * i), tv, xb);
  if (valid[m]) {
    const uint32_t o = (uint32_t)((u % S) * SLOT4);
    const uint4 w0 = *reinterpret_cast<const uint4 *>(rw + o);
    const uint4 w1 = *reinterpret_cast<const uint4 *>(rw + o + 512);
    const uint32_t s0 = __byte_perm(swi, 0, 0x4440 + 2 * m), s1 = __byte_perm(swi, 0, 0x4441 + 2 * m);
    unit_mma<SLOW>(w0, w1, s0, s1, xb, c[m]);
  }
}

/* The units of one token chunk, fully unrolled (slots and offsets are immediates), on the
 * one-multiply scale form (every scale of the block <= 128). */
template <int S, int PM, int NKS>
__device__ __forceinline__ void dec4_units(const uint8_t *const (&pk)[2][2],
                                           const uint32_t (&sw)[NKS], int nks, bool tv,
                                           const uint16_t *xk, uint32_t dw, const uint8_t *rw,
                                           const bool (&valid)[2], float (&c)[2][4]) {
  const int nu = 2 * nks;
  uint32_t xb[4][2][2];
#pragma unroll
  for (int u = 0; u < 2 * NKS; u++) {
    if (u >= nu) break;
    dec4_unit<S, PM, NKS, false>(u, u >> 1, u & 1, nu, sw[u >> 1], pk, tv, xk, dw, rw, valid, xb, c);
  }
}

/* dec4_units for blocks with a scale above 128 (the two-multiply form; never in real
 * checkpoints): the same units in the same order, as a rolled loop over the k steps, so that the
 * kernel carries one unrolled body, not two. Why (session 16): with both unrolled the kernel was
 * 105-115 KB of code (58-67 KB now; mx_dec3_kernel 23-33 KB), and at one token, where the
 * gate/up and down kernels run side by side under PDL, the pair ran ~10 us slower than the two
 * kernels alone (the instruction cache is the likely reason: not measured); rolled, the pair runs
 * faster than variant 5's (docs/perf-gpu-moe.md). */
template <int S, int PM, int NKS>
__device__ __forceinline__ void dec4_units_slow(const uint8_t *const (&pk)[2][2],
                                                const uint32_t (&sw)[NKS], int nks, bool tv,
                                                const uint16_t *xk, uint32_t dw,
                                                const uint8_t *rw, const bool (&valid)[2],
                                                float (&c)[2][4]) {
  const int nu = 2 * nks;
  uint32_t xb[4][2][2];
#pragma unroll 1
  for (int i = 0; i < nks; i++) {
    uint32_t swi = sw[0]; /* sw[i] without a dynamic index (sw stays in registers) */
#pragma unroll
    for (int j = 1; j < NKS; j++)
      if (j == i) swi = sw[j];
#pragma unroll
    for (int m = 0; m < 2; m++)
      dec4_unit<S, PM, NKS, true>(2 * i + m, i, m, nu, swi, pk, tv, xk, dw, rw, valid, xb, c);
  }
}

template <bool FUSED, int S, int MINB, int PM, int NKS>
__global__ void __launch_bounds__(DW * 32, MINB) mx_dec4_kernel(dargs a) {
  static_assert(S >= 2 && S <= 8, "ring slots per warp");
  static_assert(PM != 2 || !FUSED, "only the down GEMM reads before the wait");
  extern __shared__ uint4 ring4[];
  uint8_t *const ring = reinterpret_cast<uint8_t *>(ring4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  if (PM == 1) {
    pdl_wait();
    pdl_trigger();
  }
  int rb, re;
  const uint8_t *pb[2], *sb[2]; /* expert e's packed and scale bases, per half */
  {
    int e;
    if (!mx_expert_rows(a, blockIdx.y, e, rb, re)) return;
    pb[0] = mx_packed(a.w, e);
    sb[0] = mx_scale(a.w, e);
    pb[1] = FUSED ? mx_packed(a.up, e) : pb[0];
    sb[1] = FUSED ? mx_scale(a.up, e) : sb[0];
  }
  const int row0 = blockIdx.x * (FUSED ? 16 : 32);
  const int nk = a.K >> 7, kb = warp;
  const int nks = nk > warp ? (nk - warp + DW - 1) / DW : 0;
  /* pk[m][h]: row g + 8h of half m at this warp's first k step */
  const uint8_t *pk[2][2];
  bool valid[2];
#pragma unroll
  for (int m = 0; m < 2; m++) {
    const mx_dset &set = (FUSED && m == 1) ? a.up : a.w;
    int r = FUSED ? row0 : row0 + 16 * m;
    valid[m] = r < a.N;
    if (!valid[m]) r = 0;
    pk[m][0] = pb[m] + (int64_t)(r + g) * set.ldp + t4 * 16 + kb * 64;
    pk[m][1] = pk[m][0] + 8 * set.ldp;
  }
  uint32_t sw[NKS];
  bool slow = false;
  uint8_t *const wr = ring + warp * (S * SLOT4); /* this warp's S slots */
  const uint32_t dw = (uint32_t)__cvta_generic_to_shared(wr) + lane * 16;
  const uint8_t *const rw = wr + lane * 16;

  for (int tb = rb; tb < re; tb += 8) {
    float c[2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int j = 0; j < 4; j++) c[m][j] = 0.0f;
#pragma unroll
    for (int j = 0; j < S - 1; j++) { /* units 0 .. S-2 (one group each, empty or not) */
      if (j < 2 * nks && valid[j & 1]) {
        cpa16(dw + j * SLOT4, pk[j & 1][0] + 256 * (j >> 1));
        cpa16(dw + j * SLOT4 + 512, pk[j & 1][1] + 256 * (j >> 1));
      }
      cpa_commit();
    }
    if (tb == rb) { /* the scales, once per block, under the first units' copies */
      const uint8_t *sc[2][2]; /* sc[m][h]: the scale byte of row g + 8h of half m */
#pragma unroll
      for (int m = 0; m < 2; m++) {
        const mx_dset &set = (FUSED && m == 1) ? a.up : a.w;
        const int r = valid[m] ? (FUSED ? row0 : row0 + 16 * m) : 0;
        sc[m][0] = sb[m] + (int64_t)(r + g) * set.lds + t4 + kb * 4;
        sc[m][1] = sc[m][0] + 8 * set.lds;
      }
      slow = __any_sync(0xffffffffu, dec4_scales<NKS>(sc, nks, sw));
      if (PM == 2) { /* the first units are in flight; x and y are the pass's */
        pdl_wait();
        pdl_trigger();
      }
    }
    const int tok = tb + g;
    const bool tv = tok < re;
    const uint16_t *xk = a.x;
    if (tv) {
      const int xrow = a.x_gather ? (PM ? a.x_gather[tok] : __ldg(a.x_gather + tok)) : tok;
      xk = a.x + (int64_t)xrow * a.ldx + t4 * 32 + kb * 128;
    }
    if (slow)
      dec4_units_slow<S, PM, NKS>(pk, sw, nks, tv, xk, dw, rw, valid, c);
    else
      dec4_units<S, PM, NKS>(pk, sw, nks, tv, xk, dw, rw, valid, c);
    cpa_wait<0>(); /* nothing in flight into slot 0 (the last units may be empty groups) */
    ring_reduce(c, wr, ring, S * SLOT4, lane, warp); /* partials through slot 0 */
    if (warp == 0) mx_store_frags<FUSED>(a, c, tb + 2 * t4, re, row0, g, valid);
    __syncthreads(); /* slot 0 is refilled by the next token chunk */
  }
}

/* Variants (k3k_cu_moe_dec_variant; figures in docs/perf-gpu-moe.md): pipeline depth NB,
 * blocks per SM the registers are capped for (MINB), the L2 prefetch hint pf (2: 256 bytes,
 * 1: 128, 0: none); ring > 0: mx_dec3_kernel with that many slots per warp (L2::256B always),
 * pdl 0: plain launches, 1: PDL with the down GEMM's first units before the wait (PM 2),
 * 2: PDL, every kernel waits first (PM 1). v + 100: the same without the math (timing only:
 * outputs are wrong). 5 was the default from session 5 (measured against 0 on the medium preset:
 * decode batch 1 -0.4 %, batch 64 -2.2 %, T = 16 MoE block -2.3 %; docs/perf-gpu-moe.md); in
 * session 15 9 for calls with >= 64 expert slots and 5 below; since session 16 9 (below). */
struct variant {
  int nb, minb, pf, ring, pdl, gen; /* gen: 3 = mx_dec2/3_kernel (by ring), 4 = mx_dec4_kernel */
};
constexpr variant VARIANTS[] = {
    {2, 6, 2, 0, 0, 3}, /* 0: register streaming (the default until session 5) */
    {2, 6, 0, 0, 0, 3}, /* 1: no prefetch hint */
    {2, 5, 0, 0, 0, 3}, /* 2: 20 warps per SM */
    {2, 6, 2, 4, 0, 3}, /* 3: ring of 4 units per warp, 24 warps per SM */
    {2, 6, 2, 4, 1, 3}, /* 4: 3 + PDL, down's first units before the wait */
    {2, 6, 2, 6, 1, 3}, /* 5: 4 with a ring of 6 (the default of sessions 5-14) */
    {2, 8, 2, 4, 1, 3}, /* 6: 4 at 32 warps per SM (64 registers) */
    {2, 6, 2, 4, 2, 3}, /* 7: 3 + PDL, no loads before the wait */
    {2, 8, 2, 5, 1, 3}, /* 8: 6 with a ring of 5 (8 × 26.6 KB of shared memory per SM) */
    {2, 6, 2, 6, 1, 4}, /* 9: mx_dec4_kernel, 6 slots of 1 KB, 24 warps/SM, PDL as 5: default */
    {2, 6, 2, 8, 1, 4}, /* 10: 9 with 8 slots */
    {2, 5, 2, 6, 1, 4}, /* 11: 9 at 20 warps per SM (more registers) */
    {2, 7, 2, 6, 1, 4}, /* 12: 9 capped at 72 registers (7 blocks' worth) */
};
constexpr int NVAR = (int)(sizeof VARIANTS / sizeof VARIANTS[0]);

/* The default (K3PD_MXDEC unset, or 99, session 15's name of the default): variant 9
 * (mx_dec4_kernel). Measured on the H200 (2026-12-03, docs/perf-gpu-moe.md): 9 beats 5 by 5-8 %
 * at T = 16 (E = 896 and 256) and T = 64 (E = 256); at T = 1 its gate/up -> down pair ran ~10 us
 * slower than 5's until session 16 rolled its slow path (dec4_units_slow: half the code), after
 * which the K3 MoE block at T = 1 runs 140.2 us on 9 against 148.0 us on 5. */
constexpr int VAR_AUTO = 99, VAR_DEFAULT = 9;

int g_variant = -2; /* -2: not read from the environment yet */

int current_variant() {
  if (g_variant == -2) {
    const char *s = getenv("K3PD_MXDEC");
    int v = s ? atoi(s) : VAR_AUTO;
    g_variant = (v >= -1 && v < NVAR) || v == VAR_AUTO ? v : VAR_AUTO;
  }
  return g_variant;
}

template <bool FUSED, int NB, int MINB>
int launch(cudaStream_t st, const dargs &d, int max_active) {
  const int RT = FUSED ? 16 : 32;
  dim3 grid((unsigned)((d.N + RT - 1) / RT), (unsigned)max_active);
  mx_dec2_kernel<FUSED, NB, MINB><<<grid, DW * 32, 0, st>>>(d);
  K3K_LAUNCHED("mxfp4_grouped_gemm_decode2");
  return 0;
}

template <bool FUSED>
int launch_var(cudaStream_t st, const dargs &d, int max_active, const variant &v) {
  if (v.minb == 5) return launch<FUSED, 2, 5>(st, d, max_active);
  return launch<FUSED, 2, 6>(st, d, max_active);
}

/* The ring kernel's shared memory (DW·S slots) for MINB blocks per SM: the carveout is asked
 * for explicitly (once per instantiation) so the driver's default cannot cap the occupancy. */
template <bool FUSED, int S, int MINB, int PM>
int launch3(cudaStream_t st, const dargs &d, int max_active) {
  void (*k)(dargs) = mx_dec3_kernel<FUSED, S, MINB, PM>;
  const int RT = FUSED ? 16 : 32;
  const dim3 grid((unsigned)((d.N + RT - 1) / RT), (unsigned)max_active), block(DW * 32);
  const int smem = DW * S * SLOT;
  static bool carved = false;
  if (!carved) {
    int dev = 0, per_sm = 0;
    K3K_CU(cudaGetDevice(&dev));
    K3K_CU(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    const int64_t need = (int64_t)MINB * (smem + 1024); /* + the 1 KB each block reserves */
    int pct = per_sm > 0 ? (int)((100 * need + per_sm - 1) / per_sm) : 100;
    K3K_CU(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                pct > 100 ? 100 : pct));
    int nb = 0;
    K3K_CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k, DW * 32, (size_t)smem));
    if (nb < MINB)
      K3_WARN("mxfp4 decode ring kernel (%d slots, PM %d): %d blocks per SM, sized for %d", S, PM,
              nb, MINB);
    else
      K3_DEBUG("mxfp4 decode ring kernel (%d slots, PM %d): %d blocks per SM, carveout %d%%", S,
               PM, nb, pct);
    carved = true;
  }
  if (PM == 0) {
    k<<<grid, block, smem, st>>>(d);
    K3K_LAUNCHED("mxfp4_grouped_gemm_decode3");
  } else {
    K3K_CU(pdl_launch(k, grid, block, (size_t)smem, st, d));
    K3K_LAUNCHED("mxfp4_grouped_gemm_decode3");
  }
  return 0;
}

/* PM from the variant and the call: 2 only for the down GEMM of a grouped pair (kernel note).
 * Plain launches are instantiated for the 4-slot, 6-block ring only (variant 3). */
template <bool FUSED, int S, int MINB>
int launch3_pm(cudaStream_t st, const dargs &d, int max_active, const variant &v) {
  if constexpr (S == 4 && MINB == 6) {
    if (!v.pdl) return launch3<FUSED, S, MINB, 0>(st, d, max_active);
  }
  if (!FUSED && v.pdl == 1 && d.expert_off) return launch3<false, S, MINB, 2>(st, d, max_active);
  return launch3<FUSED, S, MINB, 1>(st, d, max_active);
}

template <bool FUSED>
int launch_ring(cudaStream_t st, const dargs &d, int max_active, const variant &v) {
  if (v.ring == 6) return launch3_pm<FUSED, 6, 6>(st, d, max_active, v);
  if (v.ring == 5) return launch3_pm<FUSED, 5, 8>(st, d, max_active, v);
  if (v.minb == 8) return launch3_pm<FUSED, 4, 8>(st, d, max_active, v);
  return launch3_pm<FUSED, 4, 6>(st, d, max_active, v);
}

/* mx_dec4_kernel: shared memory carved out as for launch3; PM as launch3_pm. */
template <bool FUSED, int S, int MINB, int PM>
int launch4(cudaStream_t st, const dargs &d, int max_active) {
  void (*k)(dargs) = mx_dec4_kernel<FUSED, S, MINB, PM, DEC4_NKS>;
  const int RT = FUSED ? 16 : 32;
  const dim3 grid((unsigned)((d.N + RT - 1) / RT), (unsigned)max_active), block(DW * 32);
  const int smem = DW * S * SLOT4;
  static bool carved = false;
  if (!carved) {
    int dev = 0, per_sm = 0;
    K3K_CU(cudaGetDevice(&dev));
    K3K_CU(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    const int64_t need = (int64_t)MINB * (smem + 1024);
    int pct = per_sm > 0 ? (int)((100 * need + per_sm - 1) / per_sm) : 100;
    K3K_CU(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                pct > 100 ? 100 : pct));
    carved = true;
  }
  K3K_CU(pdl_launch(k, grid, block, (size_t)smem, st, d));
  K3K_LAUNCHED("mxfp4_grouped_gemm_decode4");
  return 0;
}

template <bool FUSED, int S, int MINB>
int launch4_pm(cudaStream_t st, const dargs &d, int max_active) {
  if (!FUSED && d.expert_off) return launch4<false, S, MINB, 2>(st, d, max_active);
  return launch4<FUSED, S, MINB, 1>(st, d, max_active);
}

template <bool FUSED>
int launch_gen4(cudaStream_t st, const dargs &d, int max_active, const variant &v) {
  if (v.ring == 8) return launch4_pm<FUSED, 8, 6>(st, d, max_active);
  if (v.minb == 5) return launch4_pm<FUSED, 6, 5>(st, d, max_active);
  if (v.minb == 7) return launch4_pm<FUSED, 6, 7>(st, d, max_active);
  return launch4_pm<FUSED, 6, 6>(st, d, max_active);
}

} // namespace

int k3k_cu_moe_dec_variant(int v) {
  const int prev = current_variant();
  if ((v >= -1 && v < NVAR) || v == VAR_AUTO || (v >= 100 && v < 100 + NVAR)) g_variant = v;
  return prev;
}

int k3k_cu_moe_gemm_dec(cudaStream_t st, const k3k_cu_moe_gemm_args *a) {
  int vi = current_variant();
  if (vi == VAR_AUTO) vi = VAR_DEFAULT;
  if (vi < 0) return 1;
  const variant &v = VARIANTS[vi % 100];
  if (a->K % 128 || a->N % 16 || a->ldx % 8 || ((uintptr_t)a->x & 15) || a->w.ld_packed % 16 ||
      a->max_active <= 0 || a->max_active > 65535)
    return K3_EINVAL;
  const bool fused = a->act != K3K_CU_ACT_NONE;
  if (fused && a->up.ld_packed % 16) return K3_EINVAL;
  const k3k_cu_mx_set *sets[2] = {&a->w, fused ? &a->up : &a->w};
  for (int i = 0; i < 2; i++) /* 8-row offsets are int in the kernel */
    if (sets[i]->ld_packed > INT32_MAX / 8 || sets[i]->ld_scale > INT32_MAX / 8) return K3_EINVAL;
  dargs d;
  mx_fill_args(&d, a);
  d.pf = v.pf;
  d.nomath = vi >= 100; /* timing only: loads without the math */
  if (v.gen == 4 && !d.nomath && a->K <= 512 * DEC4_NKS)
    return fused ? launch_gen4<true>(st, d, a->max_active, v)
                 : launch_gen4<false>(st, d, a->max_active, v);
  if (v.gen == 4) /* K past the unrolled steps, or timing only: variant 5's kernel */
    return fused ? launch_ring<true>(st, d, a->max_active, VARIANTS[5])
                 : launch_ring<false>(st, d, a->max_active, VARIANTS[5]);
  if (v.ring)
    return fused ? launch_ring<true>(st, d, a->max_active, v)
                 : launch_ring<false>(st, d, a->max_active, v);
  return fused ? launch_var<true>(st, d, a->max_active, v)
               : launch_var<false>(st, d, a->max_active, v);
}
