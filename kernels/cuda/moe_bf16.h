/* Grouped bf16 expert GEMM (W16A16) over a device MoE plan: the routed experts of Kimi-Linear-48B
 * (bf16 weights, SiLU-gated) in one launch for gate+up and one for down, with no host round trip,
 * so a 48B decode step can be captured in a CUDA graph like K3's MXFP4 path (moe_ops.h).
 *
 * What it is for: the model runner's device MoE path (kernels/runner/ffn_device.c) at decode-
 * sized groups (a few rows per active expert): a weight stream, each weight row read once per
 * group of up to 8 rows of its expert. What it is not: a prefill GEMM (CUDA-core FMA: at many
 * rows per expert the runner keeps the per-expert cuBLASLt path, see k3k_cu_moe_bf16_wanted).
 * Invariants: fixed summation order (lane-strided fp32 partial sums, then a fixed butterfly),
 * independent of the GPU and of timing: bit-identical between runs and processes. Queues work on
 * the stream, never synchronises, allocates nothing (capture-safe). */
#ifndef K3K_CUDA_MOE_BF16_H
#define K3K_CUDA_MOE_BF16_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "moe_block.h" /* k3k_cu_moe_bf16_experts, k3k_cu_moe_bf16_wanted */

#ifdef __cplusplus
extern "C" {
#endif

/* For every active expert e (active[1..active[0]], at most max_active) and its grouped rows r in
 * [expert_off[e], expert_off[e+1]) (k3k_cu_moe_plan's outputs):
 *   act K3K_CU_ACT_NONE:     y[r][n] = Σ_k x[r][k]·W_e[n][k]
 *   act K3K_CU_ACT_SILU_MUL: g = Σ x·W_e[n], u = Σ x·U_e[n], both rounded to bf16 first when
 *                            round_inner, y = g·sigmoid(g)·u
 * W_e = w_tab[e] (device array of E device pointers to [N][K] bf16 with row stride ldw), U_e =
 * u_tab[e] likewise. x bf16 rows (row r reads x row x_gather[r] when x_gather is set), y bf16
 * (rounded once) or fp32. Requires K % 8 == 0, ldw % 8 == 0, ldx % 8 == 0, 16-byte aligned rows,
 * K <= 24576. Returns 0, K3_EINVAL (nothing queued) or K3_EDEVICE. */
typedef struct {
  const uint16_t *const *w_tab, *const *u_tab;
  int64_t ldw;
  int act, round_inner;
  int32_t N, K;
  const uint16_t *x;
  int64_t ldx;
  const int32_t *x_gather;
  void *y;
  int64_t ldy;
  int y_f32;
  const int32_t *expert_off, *active;
  int32_t max_active;
} k3k_cu_moe_bf16_args;
int k3k_cu_moe_bf16_gemm(cudaStream_t st, const k3k_cu_moe_bf16_args *a);



#ifdef __cplusplus
}
#endif
#endif
