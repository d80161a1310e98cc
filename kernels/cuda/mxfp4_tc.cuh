/* Device pieces shared by the grouped MXFP4 W4A16 kernels (mxfp4_tc.cu: cp.async decode and
 * prefill kernels; mxfp4_dec.cu: the TMA-ring decode kernel): the kernel-side argument block,
 * table-free dequantisation (dq: see mxfp4_tc.cu's header comment) and the fused epilogue.
 * What it is not: a public header (kernels/cuda only). Invariants: as mxfp4_tc.cu. */
#ifndef K3K_CUDA_MXFP4_TC_CUH
#define K3K_CUDA_MXFP4_TC_CUH

#include "cuda_common.cuh"
#include "mma_sm80.cuh"
#include "moe_ops.h"

namespace mxtc {

struct mxk { /* one weight set as the kernels see it */
  const uint8_t *const *ptab, *const *stab;
  const uint8_t *pbase, *sbase;
  int64_t pes, ses, ldp, lds;
};
__device__ __forceinline__ const uint8_t *mx_packed(const mxk &m, int e) {
  return m.ptab ? m.ptab[e] : m.pbase + (int64_t)e * m.pes;
}
__device__ __forceinline__ const uint8_t *mx_scale(const mxk &m, int e) {
  return m.stab ? m.stab[e] : m.sbase + (int64_t)e * m.ses;
}

struct gargs {
  mxk w, up;
  int act, round_inner;
  float beta, beta_lin;
  int N, K;
  const uint16_t *x;
  int64_t ldx;
  const int32_t *x_gather;
  void *y;
  int64_t ldy;
  int y_f32;
  const int32_t *expert_off, *active;
  int single_rows;
};

/* The expert of grid row `slot` and its grouped rows [rb, re); false when nothing to do. */
__device__ __forceinline__ bool expert_rows(const gargs &a, int slot, int &e, int &rb, int &re) {
  if (a.expert_off) {
    if (slot >= a.active[0]) return false;
    e = a.active[1 + slot];
    rb = a.expert_off[e];
    re = a.expert_off[e + 1];
  } else {
    e = 0;
    rb = 0;
    re = a.single_rows;
  }
  return rb < re;
}

__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a),
                             *reinterpret_cast<__nv_bfloat162 *>(&b));
  return *reinterpret_cast<uint32_t *>(&r);
}
/* E8M0 byte s → the bf16x2 factor(s) that turn the 2^-126-biased codes into values: 2^(s−1),
 * split in two multiplies when s > 128 (f2 = 0: none). */
__device__ __forceinline__ void scale_factors(uint32_t s, uint32_t &f1, uint32_t &f2) {
  f2 = 0;
  if (s <= 128) {
    f1 = (s + 126) << 7;
  } else if (s == 255) {
    f1 = 0x7FC0; /* E8M0 NaN */
  } else {
    f1 = 254u << 7; /* 2^127, then 2^(s-128) */
    f2 = (s - 1) << 7;
  }
  f1 |= f1 << 16;
  f2 |= f2 << 16;
}
/* Register i (0..3) of word w: nibbles i and i+4 as scaled bf16x2. */
__device__ __forceinline__ uint32_t dq(uint32_t w, int i, uint32_t f1, uint32_t f2) {
  const uint32_t M1 = 0x01C001C0u, M2 = 0x80008000u;
  uint32_t r;
  if (i == 0) r = ((w << 6) & M1) | ((w << 12) & M2);
  else if (i == 1) r = ((w << 2) & M1) | ((w << 8) & M2);
  else if (i == 2) r = ((w >> 2) & M1) | ((w << 4) & M2);
  else r = ((w >> 6) & M1) | (w & M2);
  r = bmul2(r, f1);
  return f2 ? bmul2(r, f2) : r;
}
/* Branch-free variants for the ALU-bound decode kernel (mxfp4_dec.cu), bit-identical results:
 * scale_factors1 always yields two factors (f2 = 1.0 when one suffices), and dq_pre takes the
 * word w and v = w >> 8 so that every register needs only left shifts (which the compiler may
 * issue on the FMA pipe as IMAD.SHL) and two logic ops: i = 0, 1 from w, i = 2, 3 from v. */
__device__ __forceinline__ void scale_factors1(uint32_t s, uint32_t &f1, uint32_t &f2) {
  f2 = 127u << 7; /* 1.0 */
  if (s <= 128) {
    f1 = (s + 126) << 7;
  } else if (s == 255) {
    f1 = 0x7FC0; /* E8M0 NaN */
  } else {
    f1 = 254u << 7;
    f2 = (s - 1) << 7;
  }
  f1 |= f1 << 16;
  f2 |= f2 << 16;
}
__device__ __forceinline__ uint32_t dq_pre(uint32_t w, uint32_t v, int i, uint32_t f1, uint32_t f2) {
  const uint32_t M1 = 0x01C001C0u, M2 = 0x80008000u;
  const uint32_t src = i < 2 ? w : v;
  const uint32_t r = (i & 1) ? (((src << 2) & M1) | ((src << 8) & M2))
                             : (((src << 6) & M1) | ((src << 12) & M2));
  return bmul2(bmul2(r, f1), f2);
}
__device__ __forceinline__ uint32_t word_of(const uint4 &v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

__device__ __forceinline__ float act_fn(const gargs &a, float g, float u) {
  if (a.round_inner) {
    g = round_bf(g);
    u = round_bf(u);
  }
  if (a.act == K3K_CU_ACT_SITU)
    return a.beta * tanhf(g / a.beta) * (1.0f / (1.0f + expf(-g))) * (a.beta_lin * tanhf(u / a.beta_lin));
  return g * (1.0f / (1.0f + expf(-g))) * u;
}
__device__ __forceinline__ void store_y(const gargs &a, int64_t row, int n, float v) {
  int64_t off = row * a.ldy + n;
  if (a.y_f32)
    ((float *)a.y)[off] = v;
  else
    ((uint16_t *)a.y)[off] = f2bf(v);
}

mxk to_mxk(const k3k_cu_mx_set *s);

/* The TMA-ring decode kernel (mxfp4_dec.cu) for one grouped GEMM; returns 1 (nothing queued)
 * when the shape does not fit its shared-memory ring, so the caller takes the cp.async kernel. */
int mx_dec_tma(cudaStream_t st, const gargs &g, int max_active, bool fused);

} // namespace mxtc

#endif
