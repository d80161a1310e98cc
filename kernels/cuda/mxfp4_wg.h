/* Internal interface of the wgmma MXFP4 prefill kernel (mxfp4_wg.cu) for k3k_cu_moe_gemm's
 * dispatch (mxfp4_tc.cu). Not public: kernels/cuda/ only.
 *
 * k3k_cu_moe_gemm_wg: the grouped W4A16 expert GEMM of k3k_cu_moe_gemm (moe_ops.h: same
 * arguments, same results up to fp32 summation order) on Hopper wgmma, for the prefill tiling
 * (many rows per expert). Queues one launch; K3_EINVAL on the same argument limits.
 * k3k_cu_moe_wg_wanted: false when the environment sets K3PD_MX_PREFILL=mma (the mma.sync
 * prefill kernel, kept for comparison runs); read once. */
#ifndef K3K_CUDA_MXFP4_WG_H
#define K3K_CUDA_MXFP4_WG_H

#include "moe_ops.h"

int k3k_cu_moe_gemm_wg(cudaStream_t st, const k3k_cu_moe_gemm_args *a);
bool k3k_cu_moe_wg_wanted(void);

#endif
