/* Shared pieces of k3k-gpu-moe (gpu_moe.c: parity and main; gpu_moe_perf.c: --perf): the GPU
 * MoE block as the runner would issue it, with no host round trip.
 * What it is not: a public API (the runner wires the same calls itself). */
#ifndef K3K_GPU_MOE_H
#define K3K_GPU_MOE_H

#include "gpu_util.h"
#include "moe_dq.h"
#include "moe_ops.h"

#define H1 3072 /* moe_intermediate_size */
#define DL 3584 /* routed_expert_hidden_size (latent) */

/* One MoE block: router op (K3 form: no groups, renormalise, scaling 2.827) on logits [T,E],
 * device plan, fused gate/up W4A16 GEMM + SiTU (token gather fused into the loads), down GEMM,
 * combine into y [T,DL] (bf16). dev: moe_dev_bytes(T, E, k) bytes of device scratch. */
typedef struct {
  int32_t T, E, k;
  const k3k_tensor_t *lg, *bias, *z;
  k3k_cu_mx_set w1, w3, w2;
  const k3k_tensor_t *y;
  void *dev;
  int dq; /* 1: the expert GEMMs through the dequant-once path (moe_dq.h) instead of the
           * grouped W4A16 kernel; stage bits 1 and 2 select its gate/up and down parts */
} moe_run;
size_t moe_dev_bytes(int32_t T, int32_t E, int32_t k);
/* Queues the block; stage_mask bit 0 router+plan (k3k_cu_moe_route_plan), bit 1 gate/up, bit 2
 * down, bit 3 combine; bit 4 router op + k3k_cu_moe_plan instead of bit 0 (timing only). */
int moe_gpu_stages(gctx *g, const moe_run *m, unsigned stage_mask);
int moe_gpu(gctx *g, const moe_run *m);
/* Number of active experts of the last plan held in m->dev (synchronises). */
int moe_n_active(gctx *g, const moe_run *m);

int gpu_moe_parity(gctx *g);
/* gpu_moe.c's case helpers, used by gpu_moe_pipe.c. */
cudaStream_t stream_of(gctx *g);
int mx_rand(gctx *g, gpair *pk, gpair *sc, int slo, int shi);
void mx_gemm_case(gctx *g, int64_t M, int64_t N, int64_t K, k3k_dtype_t xdt, k3k_dtype_t ydt,
                  int slo, int shi);
/* gpu_moe_pipe.c: the grouped pipeline against the reference chain (T tokens, E experts, top-k);
 * the decode-kernel variant cases (K3PD_MXDEC_TEST). */
void pipeline_case(gctx *g, int32_t T, int32_t E, int32_t k);
/* The same with the expert GEMMs through the dequant-once path when dq (gpu_moe_pipe.c). */
void pipeline_case_path(gctx *g, int32_t T, int32_t E, int32_t k, int dq);
/* gpu_moe_dq.c: the dequant-once prefill path: exact dequantisation of expert groups against
 * the MXFP4_DEQUANT reference, and whole blocks against the reference chain. */
void gpu_moe_dq_parity(gctx *g);
void dec_variant_cases(gctx *g);
/* bf16 experts (48B) through the grouped W16A16 kernels (gpu_moe_bf16.c). */
int gpu_moe_bf16_parity(gctx *g);
/* Ts: the token counts to time (NULL: 1, 16 and 8192). */
int gpu_moe_perf(gctx *g, const int32_t *Ts, size_t nT, int32_t E);

#endif
