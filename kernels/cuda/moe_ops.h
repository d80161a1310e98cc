/* Internal interface of the CUDA MoE kernels (router.cu, moe.cu, mxfp4.cu): the op entries the
 * backend dispatches, and the grouped (all experts in one launch) pieces the op API has no slot
 * for: device-side MoE planning and the grouped MXFP4 expert GEMM with the activation fused.
 *
 * What it is for: cuda_backend.cu registers the op entries; the model runner (on a "cuda"
 * backend) and tests/gpu/ call the grouped pieces to run a whole MoE block without a host round
 * trip. What it is not: public API (model code that wants portability uses k3k.h ops).
 * Invariants: every function queues work on the given stream and returns 0, K3_EINVAL (bad
 * arguments, nothing queued), K3_ENOMEM or K3_EDEVICE (logged). Nothing synchronises unless the
 * function says so. Weights stay in the checkpoint's MXFP4 layout (no repack): packed [N][K/2]
 * (low nibble = even k) and E8M0 scales [N][K/32], rows 16-byte aligned. */
#ifndef K3K_CUDA_MOE_OPS_H
#define K3K_CUDA_MOE_OPS_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "k3k_cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Op entries (k3k.h slot order). MXFP4_GEMM / MXFP4_DEQUANT check the scales for 0xFF (E8M0
 * NaN) on the device and synchronise once to return K3_EINVAL; MOE_COMBINE checks row_idx the
 * same way (K3_ERANGE). */
K3K_CUDA_DECL(router);
K3K_CUDA_DECL(mxfp4_gemm);
K3K_CUDA_DECL(mxfp4_dequant);
K3K_CUDA_DECL(moe_combine);
/* Shape/stride limits of the CUDA MoE ops beyond k3k_op_validate() (true for other ops). */
bool k3k_cuda_moe_ok(k3k_op_t op, const void *params, const k3k_tensor_t *const *t);

/* Device MoE plan: the k3k_moe_plan() grouping computed on the device from the router's idx
 * (device I32 [T*k], row-major [T,k]), same order (by expert, then token, then choice).
 * Outputs (device, caller-allocated): expert_off [E+1], gather_tok [T*k], row_idx [T*k], and
 * active [1+E]: active[0] = number of experts with rows, active[1..] their ids ascending.
 * bad (device int, may be NULL) is set to 1 when an id is outside [0,E) (its pair gets
 * row_idx −1 and no row). Scratch: k3k_cu_moe_plan_scratch(T, E) bytes of device memory.
 * Requires E <= 8192. */
int k3k_cu_moe_plan(cudaStream_t st, const int32_t *idx, int32_t T, int32_t k, int32_t E,
                    int32_t *expert_off, int32_t *gather_tok, int32_t *row_idx, int32_t *active,
                    int *bad, void *scratch);

/* ROUTER op's kernel on a stream (t = logits, bias, idx, w as for K3K_OP_ROUTER; already
 * validated by the caller). */
int k3k_cu_router_launch(cudaStream_t st, const k3k_router_params_t *p,
                         const k3k_tensor_t *const *t);

int k3k_cu_moe_gemm(cudaStream_t st, const k3k_cu_moe_gemm_args *a);

/* The decode kernel behind k3k_cu_moe_gemm (rows_hint <= 16; mxfp4_dec.cu): same arguments and
 * results. Returns 1 (nothing queued) when the process-wide choice is the older cp.async
 * kernel of mxfp4_tc.cu, which k3k_cu_moe_gemm then runs; else 0 or K3_EINVAL / K3_EDEVICE. */
int k3k_cu_moe_gemm_dec(cudaStream_t st, const k3k_cu_moe_gemm_args *a);
/* Process-wide decode-kernel choice, for tests and benchmarks (not thread-safe; set it before
 * launching): -1 the cp.async kernel, 0 .. 12 the measured variants of mxfp4_dec.cu, 99 the
 * default (variant 9, mx_dec4_kernel, since session 16 at every batch size); out of range:
 * unchanged. The
 * first call reads K3PD_MXDEC from the environment. Returns the previous choice. */
int k3k_cu_moe_dec_variant(int v);



#ifdef __cplusplus
}
#endif
#endif
