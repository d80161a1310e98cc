/* The CUDA backend's fused kernels that are ops now (k3k.h "Fusions": RES_MIX_NORM → the
 * residual glue, GEMM_MULTI → the grouped gemv, KDA_DECODE → the fused decode step) and its
 * side lane (k3k.h k3k_backend_side), with their raw entry points: private to kernels/cuda/
 * (fused_ops.cu, cuda_backend.cu) and its GPU tests (tests/gpu/), which call them directly.
 *
 * What it is not: the runner's interface. Model code reaches all of this through k3k.h (issue 19
 * moved these declarations here from k3k_cuda.h, unchanged).
 * Invariants: as k3k_cuda_ops.h. */
#ifndef K3K_CUDA_FUSED_H
#define K3K_CUDA_FUSED_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"
#include "k3k_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- side stream, residual glue ---- */
/* A second stream for work that does not depend on what the main stream does next (the MoE
 * block's shared expert and latent down-projection run beside the router and routed experts
 * in a decode step: each alone leaves most of the copy bandwidth idle at batch 1). Inside a
 * graph capture the fork and the marks become graph edges, so a captured step keeps the same
 * concurrency. Results are unchanged: the same kernels on the same inputs; the side lane has
 * its own cuBLASLt workspace and scratch so concurrent ops never share memory.
 *   k3k_cuda_side_init: creates the side stream, events and workspace once (not while a
 *     capture is running); 0, K3_ENOMEM or K3_EDEVICE. Freed by the backend's destroy.
 *   k3k_cuda_side_begin: ops queued after it go to the side stream, ordered after everything
 *     queued on the main stream so far. K3_EINVAL when not initialised or already on the side.
 *   k3k_cuda_side_mark(cx, i), i in 1..2: on the side, marks the side work queued so far.
 *   k3k_cuda_side_end: back to the main stream (which does not wait for anything).
 *   k3k_cuda_side_wait(cx, i): on main, later main work waits for side mark i. */
/* The decode step's residual glue in one launch (resnorm.cu): P += a (a may be NULL), then
 * h = ATTN_RES_MIX(snaps, P; wn, wp, eps_mix) (snaps may be NULL: h is P, h unused), then
 * xn = RMSNORM(h; lnw, eps, bf16_inner); P, h, xn bit-identical to the ADD, ATTN_RES_MIX and
 * RMSNORM ops queued one after the other. k3k_cuda_add_mix_norm_fits: BF16 rows with 16-byte
 * aligned unit-stride rows, 1 <= T <= SM count, d % 8 == 0, d <= 8192, at most 15 snapshots, no
 * output aliasing an input; k3k_cuda_add_mix_norm returns K3_EINVAL (nothing queued) when it
 * does not fit, else 0 or K3_EDEVICE. */
bool k3k_cuda_add_mix_norm_fits(const k3k_cuda_ctx *cx, const k3k_tensor_t *a,
                                const k3k_tensor_t *P, const k3k_tensor_t *snaps,
                                const k3k_tensor_t *wn, const k3k_tensor_t *wp,
                                const k3k_tensor_t *h, const k3k_tensor_t *lnw,
                                const k3k_tensor_t *xn);
int k3k_cuda_add_mix_norm(k3k_cuda_ctx *cx, const k3k_tensor_t *a, const k3k_tensor_t *P,
                          const k3k_tensor_t *snaps, const k3k_tensor_t *wn,
                          const k3k_tensor_t *wp, float eps_mix, const k3k_tensor_t *h,
                          const k3k_tensor_t *lnw, float eps, int bf16_inner,
                          const k3k_tensor_t *xn);

int k3k_cuda_side_init(k3k_cuda_ctx *cx);
int k3k_cuda_side_begin(k3k_cuda_ctx *cx);
int k3k_cuda_side_mark(k3k_cuda_ctx *cx, int i);
int k3k_cuda_side_end(k3k_cuda_ctx *cx);
int k3k_cuda_side_wait(k3k_cuda_ctx *cx, int i);

/* ---- fused KDA decode step ---- */
/* Fused KDA decode step (spec §3.9 minus the projections): conv update + L2 norms + gate + beta
 * + delta-rule update + output + gated RMSNorm, one token per sequence, one pass over the fp32
 * state. Equals CONV_STEP(q,k,v) → L2NORM(q,k) → KDA_GATE → SIGMOID(b) → KDA_STEP →
 * GATED_RMSNORM with bf16 conv outputs, fp32 q/k/g/beta, bf16 o. DK = DV = 128. */
typedef struct {
  int batch, heads;                   /* B sequences, NH heads of 128 */
  const uint16_t *q, *k, *v;          /* [B][NH*128] bf16 projections, before the conv */
  size_t ld_qkv;
  const uint16_t *g_raw;              /* [B][NH*128] bf16 f_b_proj output */
  size_t ld_g;
  const void *b_raw;                  /* [B][NH] fp32, or bf16 when b_raw_bf16 */
  size_t ld_b;
  int b_raw_bf16;
  const uint16_t *z;                  /* [B][NH*128] bf16 output-gate projection */
  size_t ld_z;
  uint16_t *conv_q, *conv_k, *conv_v; /* [slots][NH*128][3] bf16, updated in place */
  const float *wq, *wk, *wv;          /* [NH*128][4] fp32 conv weights */
  const float *a_log;                 /* [>= NH] fp32 */
  const float *dt_bias;               /* [NH*128] fp32 */
  const float *o_norm_w;              /* [128] fp32 */
  float *state;                       /* [slots][NH][128 v][128 k] fp32, updated in place */
  const int32_t *slots;               /* [B] device, slot of each sequence */
  uint16_t *out;                      /* [B][NH*128] bf16 gated-normed output */
  size_t ld_out;
  float lower_bound, q_scale, l2_eps, rms_eps;
  int n_slots;                        /* > 0: slots outside [0,n_slots) are skipped (guard) */
} k3k_cu_kda_decode_args;
int k3k_cu_kda_decode(cudaStream_t st, const k3k_cu_kda_decode_args *a);

/* ---- gemv ---- */
/* Whether the GEMM op should take this path: fits, the shape is one where it measured faster
 * than cuBLASLt (docs/perf-gpu.md "skinny GEMM"; a rule on M, N, K only), and the environment
 * variable K3PD_CUDA_GEMV is not "0" (read once; "0" keeps every GEMM on cuBLASLt). */
bool k3k_cuda_gemv_wanted(const k3k_tensor_t *const *t);

/* ---- Multi-output form (the runner's grouped decode projections, rn_dev_gemms, without the
 * norm; the norm-folded form measured slower: docs/perf-gpu-model.md "Session 5") ----
 * k3k_cuda_gemv_multi: y_j = x'·W_jᵀ for j < n (n <= K3K_GEMV_MULTI_MAX) in ONE launch, x' = x,
 * or with nm != NULL x' = RMSNORM(x; nm->w, nm->eps, nm->bf16_inner) computed inside the kernel
 * (every CTA recomputes the rows' 1/rms; x is then RMSNORM's input, not its output). Each y_j is
 * bit-identical to k3k_cuda_gemv(x', W_j, y_j) with the shape rule's configuration (variant 1),
 * and x' to the RMSNORM op's register kernel (K <= 8192, BF16): the fused path changes launch
 * counts, not results. nm->xn (optional) receives x' (written once, by one CTA) for consumers
 * that are not gemvs. Conditions (k3k_cuda_gemv_multi_fits): 1 <= M <= K3K_GEMV_NORM_MAX_M,
 * every (x, W_j, y_j) fits the gemv, the same K and the same shape-rule split for every j, no
 * output aliasing another output, a weight, the norm weight or x; norm weight BF16 [K] unit
 * stride 16-byte aligned, K <= 8192; xn BF16 [M, K] unit inner stride, 16-byte aligned rows.
 * Returns 0, K3_EINVAL (does not fit: nothing launched) or K3_EDEVICE. PDL and
 * k3k_cuda_gemv_const_weights as k3k_cuda_gemv. */
#define K3K_GEMV_MULTI_MAX 4
#define K3K_GEMV_NORM_MAX_M 4
typedef struct {
  const k3k_tensor_t *w; /* [K] BF16 */
  float eps;
  int bf16_inner;
  const k3k_tensor_t *xn; /* NULL or [M, K] BF16: receives RMSNORM(x) */
} k3k_gemv_norm_t;
bool k3k_cuda_gemv_multi_fits(const k3k_tensor_t *x, int n, const k3k_tensor_t *const *w,
                              const k3k_tensor_t *const *y, const k3k_gemv_norm_t *nm);
int k3k_cuda_gemv_multi(k3k_cuda_ctx *cx, const k3k_tensor_t *x, int n,
                        const k3k_tensor_t *const *w, const k3k_tensor_t *const *y,
                        const k3k_gemv_norm_t *nm);

#ifdef __cplusplus
}
#endif
#endif
