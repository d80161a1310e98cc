/* Skinny GEMM (decode GEMV) of the CUDA backend: y[M,N] = x[M,K] · W[N,K]ᵀ for M <= 16,
 * streaming bf16 weights (gemv.cu).
 *
 * What it is for: the GEMM op's small-M path (gemm.cu dispatches here when
 * k3k_cuda_gemv_wanted() says so) and the GPU tests (tests/gpu/gpu_gemv.c), which also call it
 * directly with a forced split to time and check every configuration.
 * What it is not: a general GEMM. Only BF16 x and W with unit inner stride, 16-byte aligned rows
 * (pointer and row stride), K % 8 == 0, F32 or BF16 y with any strides. Everything else stays on
 * cuBLASLt.
 * Invariants: the fp32 summation order is a function of (M, N, K, split) only, and the split a
 * function of the shape only (never of the SM count or of timing), so two processes on the same
 * GPU model produce bit-identical outputs. No scratch memory, no synchronisation: safe inside a
 * captured CUDA graph. Launched with programmatic dependent launch (pdl.cuh; K3PD_CUDA_PDL=0
 * turns it off). */
#ifndef K3K_CUDA_GEMV_H
#define K3K_CUDA_GEMV_H

#include <stdbool.h>

#include "k3k_cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3K_GEMV_MAX_M 16

/* Whether the layouts/dtypes/alignments fit the kernel (t = {x, W, y} of GEMM, validated). */
bool k3k_cuda_gemv_fits(const k3k_tensor_t *const *t);
/* Whether the GEMM op should take this path: fits, the shape is one where it measured faster
 * than cuBLASLt (docs/perf-gpu.md "skinny GEMM"; a rule on M, N, K only), and the environment
 * variable K3PD_CUDA_GEMV is not "0" (read once; "0" keeps every GEMM on cuBLASLt). */
bool k3k_cuda_gemv_wanted(const k3k_tensor_t *const *t);
/* The shape rule: K-split (CTAs per cluster, 1/2/4/8) and row tiles per warp (1/2/4). */
void k3k_cuda_gemv_plan(int64_t M, int64_t N, int64_t K, int *split, int *nt);
/* Kernel variants (load shape): 1 = one 16-byte chunk per lane and row per step, 8 loads in
 * flight per lane; 2 = two adjacent chunks (a whole 128-byte line per row and 4 lanes), 8 in
 * flight; 3 and 4 = the same with 16 in flight. */
#define K3K_GEMV_DEFAULT_VARIANT 1
/* Runs it (t must fit: K3_EINVAL otherwise). split/nt/var <= 0 take the shape rule's values and
 * the default variant; otherwise split in {1,2,4,8}, nt in {1,2,4} and var in 1..4 force a
 * configuration (tests). Returns 0 or K3_EDEVICE (launch failure, logged). */
int k3k_cuda_gemv(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t, int split, int nt, int var);
/* Promise (per calling thread) that no kernel launched until the next call with false writes
 * any W given to the kernel: its first weight loads may then precede the wait for the previous
 * kernel (PDL, pdl.cuh). The runner turns it on around its passes (weights are uploaded at
 * init); default off, so W made by the previous kernel (tests) is always read after the wait. */
void k3k_cuda_gemv_const_weights(bool on);

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
