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

#include "k3k_cuda.h"
#include "k3k_cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3K_GEMV_MAX_M 16

/* Whether the layouts/dtypes/alignments fit the kernel (t = {x, W, y} of GEMM, validated). */
bool k3k_cuda_gemv_fits(const k3k_tensor_t *const *t);

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


#ifdef __cplusplus
}
#endif

#endif
