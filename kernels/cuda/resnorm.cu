/* The decode step's residual glue in one launch: P += a (ADD), h = ATTN_RES_MIX(snaps, P), and
 * xn = RMSNORM(h) — the three ops that sit between every pair of sub-layers of K3's block
 * attention residual (spec §2.3; kernels/runner/forward.c). At batch 1 each of them is one block
 * doing a few µs of dependent loads and reductions (~13 µs serial per sub-layer, 31 per medium
 * step); one kernel keeps the token's row on chip between them.
 *
 * What it is for: decode passes (T <= SM count: one block per token) on BF16 tensors where each
 * op on its own would take its vector kernel (elementwise.cu ew2_vec EW_ADD, norm.cu
 * attn_res_vec <512, 2, 8, 8> and rmsnorm_reg): the fused kernel runs exactly their arithmetic
 * (the shared bodies of norm_body.cuh, the same fp32 add and bf16 rounding), so its P, h and xn
 * are bit-identical to the three launches. k3k_cuda_add_mix_norm_fits says whether that holds.
 * What it is not: a prefill kernel (more tokens than SMs keep the op path) or an op of the k3k
 * API (the runner calls it; the CPU backends run the three ops).
 * Invariants: every output is written only after pdl_wait (launched with PDL); h and xn are
 * whole rows; P is updated in place, each element by the thread that then reads it. */
#include <string.h>

#include "k3k_cuda_ops.h"
#include "norm_body.cuh"
#include "pdl.cuh"

namespace {

constexpr int RN_THREADS = 512; /* attn_res_vec's decode form: 2 vectors x 8 values per thread */

struct rn_args {
  uint16_t *P;
  int64_t ld_p;
  const uint16_t *a; /* NULL: no add */
  int64_t ld_a;
  const uint16_t *snaps; /* NULL: no mix (h = P) */
  int64_t s_b, s_t;
  int nb;
  const uint16_t *wn, *wp;
  float eps_mix;
  uint16_t *h;
  int64_t ld_h;
  const uint16_t *lnw;
  float eps;
  int bf16_inner;
  uint16_t *xn;
  int64_t ld_xn;
  int d;
};

template <int NVPT>
__global__ void __launch_bounds__(RN_THREADS, 1) add_mix_norm_kernel(rn_args g) {
  __shared__ float red[RN_THREADS / 32][2 * ARM_MAXV];
  __shared__ float alpha[ARM_MAXV];
  __shared__ float nred[32];
  const int64_t tk = blockIdx.x;
  const int d8 = g.d / 8;
  uint16_t *pr = g.P + tk * g.ld_p;
  pdl_wait(); /* P, a and the snapshots are the previous kernels' outputs */
  pdl_trigger();
  if (g.a) { /* ew2_vec EW_ADD: one fp32 add, one bf16 rounding */
    const bf16x8 *ar = (const bf16x8 *)(g.a + tk * g.ld_a);
    bf16x8 *pv = (bf16x8 *)pr;
    for (int i = threadIdx.x; i < d8; i += RN_THREADS) {
      float fa[8], fb[8], o[8];
      unpack8(pv[i], fa);
      unpack8(ar[i], fb);
#pragma unroll
      for (int j = 0; j < 8; j++) o[j] = fa[j] + fb[j];
      pv[i] = pack8(o);
    }
    __syncthreads();
  }
  const uint16_t *hr = pr;
  if (g.snaps) {
    uint16_t *hw = g.h + tk * g.ld_h;
    arm_token<RN_THREADS, 2, 8, 8>(g.snaps + tk * g.s_t, g.s_b, pr, g.wn, g.wp, hw, g.nb, g.d,
                                   g.eps_mix, red, alpha); /* ends with a barrier */
    hr = hw;
  }
  rms_row<NVPT>(hr, g.lnw, g.xn + tk * g.ld_xn, g.d, g.eps, g.bf16_inner, nred, threadIdx.x < 128);
}

bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* A BF16 [T, d] operand read or written 8 elements at a time. */
bool row_ok(const k3k_tensor_t *t, int64_t T, int64_t d) {
  return t && t->dtype == K3K_BF16 && t->ndim == 2 && t->shape[0] == T && t->shape[1] == d &&
         t->stride[1] == 1 && t->stride[0] % 8 == 0 && al16(t->data);
}

bool vec_ok(const k3k_tensor_t *t, int64_t d) {
  return t && t->dtype == K3K_BF16 && t->ndim == 1 && t->shape[0] == d && t->stride[0] == 1 &&
         al16(t->data);
}

} // namespace

bool k3k_cuda_add_mix_norm_fits(const k3k_cuda_ctx *cx, const k3k_tensor_t *a,
                                const k3k_tensor_t *P, const k3k_tensor_t *snaps,
                                const k3k_tensor_t *wn, const k3k_tensor_t *wp,
                                const k3k_tensor_t *h, const k3k_tensor_t *lnw,
                                const k3k_tensor_t *xn) {
  if (!P || P->ndim != 2) return false;
  const int64_t T = P->shape[0], d = P->shape[1];
  if (T < 1 || T > cx->num_sms || d % 8 || d / 8 > 1024 || !row_ok(P, T, d) ||
      !row_ok(xn, T, d) || !vec_ok(lnw, d) || xn->data == P->data)
    return false;
  if (a && (!row_ok(a, T, d) || a->data == xn->data)) return false;
  if (!snaps) return true;
  const int64_t nb = snaps->shape[0];
  return snaps->dtype == K3K_BF16 && snaps->ndim == 3 && snaps->shape[1] == T &&
         snaps->shape[2] == d && nb + 1 <= ARM_MAXV && snaps->stride[2] == 1 &&
         (nb <= 1 || snaps->stride[0] % 8 == 0) && snaps->stride[1] % 8 == 0 &&
         (nb == 0 || al16(snaps->data)) && vec_ok(wn, d) && vec_ok(wp, d) && row_ok(h, T, d) &&
         h->data != P->data && h->data != xn->data;
}

int k3k_cuda_add_mix_norm(k3k_cuda_ctx *cx, const k3k_tensor_t *a, const k3k_tensor_t *P,
                          const k3k_tensor_t *snaps, const k3k_tensor_t *wn,
                          const k3k_tensor_t *wp, float eps_mix, const k3k_tensor_t *h,
                          const k3k_tensor_t *lnw, float eps, int bf16_inner,
                          const k3k_tensor_t *xn) {
  if (!k3k_cuda_add_mix_norm_fits(cx, a, P, snaps, wn, wp, h, lnw, xn)) return K3_EINVAL;
  rn_args g;
  memset(&g, 0, sizeof g);
  g.P = (uint16_t *)P->data;
  g.ld_p = P->stride[0];
  g.a = a ? (const uint16_t *)a->data : NULL;
  g.ld_a = a ? a->stride[0] : 0;
  if (snaps) {
    g.snaps = (const uint16_t *)snaps->data;
    g.s_b = snaps->stride[0];
    g.s_t = snaps->stride[1];
    g.nb = (int)snaps->shape[0];
    g.wn = (const uint16_t *)wn->data;
    g.wp = (const uint16_t *)wp->data;
    g.eps_mix = eps_mix;
    g.h = (uint16_t *)h->data;
    g.ld_h = h->stride[0];
    if (g.nb == 0) g.snaps = g.P; /* any non-NULL pointer: no snapshot is read */
  }
  g.lnw = (const uint16_t *)lnw->data;
  g.eps = eps;
  g.bf16_inner = bf16_inner;
  g.xn = (uint16_t *)xn->data;
  g.ld_xn = xn->stride[0];
  g.d = (int)P->shape[1];
  const int d8 = g.d / 8;
  const dim3 grid((unsigned)P->shape[0]), block(RN_THREADS);
  cudaError_t e;
  if (d8 <= 128)
    e = pdl_launch(add_mix_norm_kernel<1>, grid, block, 0, cx->stream, g);
  else if (d8 <= 256)
    e = pdl_launch(add_mix_norm_kernel<2>, grid, block, 0, cx->stream, g);
  else if (d8 <= 512)
    e = pdl_launch(add_mix_norm_kernel<4>, grid, block, 0, cx->stream, g);
  else
    e = pdl_launch(add_mix_norm_kernel<8>, grid, block, 0, cx->stream, g);
  K3K_CU(e);
  K3K_LAUNCHED("add_mix_norm");
  return 0;
}
