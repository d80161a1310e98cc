/* Private interface of the "cpu-fast" backend: the GEMM kernels (fast_gemm.c) and the parallel
 * drivers that run the reference op code on slices or (sequence, head) tasks (fast_ops.c). */
#ifndef K3K_FAST_H
#define K3K_FAST_H

#include "core/k3k_internal.h"
#include "fast/threadpool.h"

/* GEMM and MXFP4_GEMM, bit-identical with the reference (same per-output k order). */
int k3k_fast_gemm(k3k_pool_t *pool, const k3k_tensor_t *const *t, bool mxfp4);
/* Every other op the fast path parallelises; returns K3_ENOTSUP when it has no fast version
 * (the backend then runs the reference). */
int k3k_fast_op(k3k_pool_t *pool, k3k_op_t op, const void *params, const k3k_tensor_t *const *t,
                int nt);

#endif
