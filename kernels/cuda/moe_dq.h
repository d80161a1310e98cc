/* Dequant-once prefill of the routed MXFP4 experts (moe_dq.cu): for a prefill batch (many rows
 * per active expert), each active expert's gate, up and down matrices are dequantised ONCE into
 * a bf16 scratch and multiplied by its whole token group with cuBLASLt bf16 GEMMs (one batched
 * GEMM per group of similar experts over a padded row layout), instead of the grouped W4A16
 * kernel, which dequantises every weight tile in registers once per token tile it meets
 * (mxfp4_wg.cu) and is bound by that copy + dequant chain (perf-gpu-moe.md). Its bf16 mode
 * (k3k_cu_moe_dq_args.w1_bf16) runs bf16 experts (Kimi-Linear-48B) the same way without the
 * dequantisation, through pointer-array batches over the experts' own weights.
 *
 * What it is for: the runner's device MoE path (kernels/runner/ffn_device.c) and k3k-gpu-moe
 * call it after k3k_cu_moe_route_plan when k3k_cu_moe_dq_wanted() (MXFP4) or the bf16 rule
 * says the batch is a prefill batch. Same meaning as the grouped path: rows in plan order (by expert, token, choice), gate/up
 * outputs rounded to bf16 before the activation (the reference chain stores them bf16), bf16
 * activation rows h, bf16 expert outputs y; only the GEMMs' fp32 summation order differs.
 * What it is not: capture-safe or synchronisation-free. It copies the plan's expert offsets to
 * the host (one stream synchronisation per call) to size the GEMMs, so it refuses a
 * stream that is being captured (K3_ENOTSUP, nothing queued) and the caller keeps the grouped
 * kernel; decode steps never take it (they are below the row threshold).
 * Invariants: weights are read, never written; scratch is the caller's
 * (k3k_cu_moe_dq_scratch_bytes). The dequantisation runs on a stream of the path's own, ordered
 * after everything queued on cx->stream before the call and joined back into it (each group's
 * GEMMs wait for its dequantisation, each dequantisation waits for the GEMMs that last used
 * its buffer); when the call returns, later work on cx->stream is ordered after all of it.
 * Measurement knobs (read once): K3PD_MOE_DQ_OVERLAP=0 keeps everything on cx->stream (serial),
 * K3PD_MOE_DQ_GROUP=1 dequantises one expert per launch (default K3K_CU_MOE_DQ_GROUP).
 * Returns 0, K3_EINVAL (bad arguments, nothing queued), K3_ENOTSUP (capturing), K3_EDEVICE.
 * The runner-facing part (k3k_cu_moe_dq_args, _scratch_bytes, _wanted, _experts) is declared in
 * kernels/include/k3k_cuda.h; this header keeps what only the backend and its tests use. */
#ifndef K3K_CUDA_MOE_DQ_H
#define K3K_CUDA_MOE_DQ_H

#include <stdbool.h>
#include <stdint.h>

#include "k3k_cuda_ops.h"
#include "moe_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Frees the path's stream and events of cx (backend destroy; no work may be in flight). */
void k3k_cu_moe_dq_release(k3k_cuda_ctx *cx);

/* The dequantisation alone (tests) and the path's own step: for i < n, experts ids[i] of s0
 * (rows [0,N)) and, when s1 is not NULL, of s1 (rows [N,2N)) into dst + i·ld_slot bf16,
 * row-major [rows][K] (rows = N or 2N), K % 32 == 0; ld_slot (elements, % 8 == 0, >= rows·K; 0
 * means rows·K) is the distance between two slots, the same distance the GEMMs that read them
 * use. Exact (the E2M1 value times 2^(s-127) fits bf16). n <= K3K_CU_MOE_DQ_GROUP. */
int k3k_cu_mx_dequant_experts(cudaStream_t st, const k3k_cu_mx_set *s0, const k3k_cu_mx_set *s1,
                              const int32_t *ids, int n, int32_t N, int32_t K, uint16_t *dst,
                              int64_t ld_slot);

#ifdef __cplusplus
}
#endif
#endif
