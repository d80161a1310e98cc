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
size_t k3k_cu_moe_plan_scratch(int32_t T, int32_t E);
int k3k_cu_moe_plan(cudaStream_t st, const int32_t *idx, int32_t T, int32_t k, int32_t E,
                    int32_t *expert_off, int32_t *gather_tok, int32_t *row_idx, int32_t *active,
                    int *bad, void *scratch);

/* ROUTER op's kernel on a stream (t = logits, bias, idx, w as for K3K_OP_ROUTER; already
 * validated by the caller). */
int k3k_cu_router_launch(cudaStream_t st, const k3k_router_params_t *p,
                         const k3k_tensor_t *const *t);

/* Router + plan for one MoE layer: the ROUTER op (p; logits [T,E] F32/BF16, bias [E], idx I32
 * [T,k] and w F32 [T,k] written, unit column stride) followed by k3k_cu_moe_plan on its idx
 * (expert_off [E+1], gather_tok [T*k], row_idx [T*k], active [1+E]; scratch
 * k3k_cu_moe_plan_scratch(T, E) bytes). Results are identical to k3k_router (device op) +
 * k3k_cu_moe_plan; ids are always in range, so there is no bad flag. One launch (one block)
 * when n_groups == 1, T*k <= 4096, E <= 1024, k <= 32, logits F32 with unit column stride and
 * bias F32/BF16 with unit stride; otherwise the ROUTER kernel and the 3-launch plan. The
 * runner's device MoE path calls this instead of k3k_router + k3k_cu_moe_plan. */
int k3k_cu_moe_route_plan(cudaStream_t st, const k3k_router_params_t *p, const k3k_tensor_t *lg,
                          const k3k_tensor_t *bias, const k3k_tensor_t *idx, const k3k_tensor_t *wt,
                          int32_t *expert_off, int32_t *gather_tok, int32_t *row_idx,
                          int32_t *active, void *scratch);

/* One set of MXFP4 expert matrices [N,K] on the device: expert e's packed rows are at
 * packed_tab[e] (a device array of E device pointers), or at packed_base + e*estride_packed when
 * packed_tab is NULL (experts stacked in one allocation); the same for the scales. */
typedef struct {
  const uint8_t *const *packed_tab, *const *scale_tab;
  const uint8_t *packed_base, *scale_base;
  int64_t estride_packed, estride_scale; /* bytes between experts (stacked form) */
  int64_t ld_packed, ld_scale;           /* bytes between rows; ld_packed % 16 == 0 */
} k3k_cu_mx_set;

enum { K3K_CU_ACT_NONE = 0, K3K_CU_ACT_SITU = 1, K3K_CU_ACT_SILU_MUL = 2 };

/* Grouped W4A16 expert GEMM: for every active expert e (active[1..active[0]]) and its grouped
 * rows r in [expert_off[e], expert_off[e+1]):
 *   act NONE:  y[r][n] = Σ_k x[r][k]·W_e[n][k]
 *   act SITU / SILU_MUL: g = Σ x·W_e[n], u = Σ x·U_e[n] (w = gate set, up = up set), rounded to
 *   bf16 first when round_inner (bf16 mode: the GEMM outputs are stored bf16 in the reference
 *   chain), y = SiTU(g,u) (beta, beta_lin) or silu(g)·u.
 * x bf16 [rows][K] (ldx % 8 == 0, 16-byte aligned), fp32 accumulation on tensor cores, y bf16 or
 * fp32 (y_f32) [rows][N]. K % 128 == 0, N % 16 == 0. max_active bounds the grid (min(E, T*k));
 * rows_hint (average rows per active expert, host guess) picks the decode or prefill tiling.
 * When expert_off is NULL there is one expert (index 0) with rows [0, single_rows). Scales of
 * 0xFF give NaN outputs here (weights are checked once at load: k3k_cu_mx_check). */
typedef struct {
  k3k_cu_mx_set w, up;
  int act, round_inner;
  float beta, beta_lin;
  int32_t N, K;
  const uint16_t *x;
  int64_t ldx;
  const int32_t *x_gather; /* NULL: grouped row r reads x row r; else x row x_gather[r] (the
                            * plan's gather_tok: the token gather is fused into the loads) */
  void *y;
  int64_t ldy;
  int y_f32;
  const int32_t *expert_off, *active;
  int32_t max_active, single_rows, rows_hint;
} k3k_cu_moe_gemm_args;
int k3k_cu_moe_gemm(cudaStream_t st, const k3k_cu_moe_gemm_args *a);

/* The decode kernel behind k3k_cu_moe_gemm (rows_hint <= 16; mxfp4_dec.cu): same arguments and
 * results. Returns 1 (nothing queued) when the process-wide choice is the older cp.async
 * kernel of mxfp4_tc.cu, which k3k_cu_moe_gemm then runs; else 0 or K3_EINVAL / K3_EDEVICE. */
int k3k_cu_moe_gemm_dec(cudaStream_t st, const k3k_cu_moe_gemm_args *a);
/* Process-wide decode-kernel choice, for tests and benchmarks (not thread-safe; set it before
 * launching): -1 the cp.async kernel, 0 the default, 1.. the measured variants of mxfp4_dec.cu
 * (out of range: unchanged). The first call reads K3PD_MXDEC from the environment. Returns the
 * previous choice. */
int k3k_cu_moe_dec_variant(int v);

/* Sets *bad (device int) to 1 when any of n scale bytes is 0xFF. Queued, not synchronised. */
int k3k_cu_mx_check(cudaStream_t st, const uint8_t *scale, int64_t rows, int64_t cols,
                    int64_t ld, int *bad);

/* MOE_COMBINE without the range check/synchronisation (row_idx from k3k_cu_moe_plan is valid by
 * construction): y[t] = Σ_i w[t][i]·rows[row_idx[t][i]] (−1 skips), fp32, one rounding. */
int k3k_cu_moe_combine_raw(cudaStream_t st, const k3k_tensor_t *rows, const k3k_tensor_t *row_idx,
                           const k3k_tensor_t *w, const k3k_tensor_t *y, int *bad);

#ifdef __cplusplus
}
#endif
#endif
