/* The MoE block's device pieces behind the MOE_ROUTED op (k3k.h): router + plan in one launch,
 * the grouped W4A16 / bf16 expert GEMMs, the unchecked combine and the dequant-once batched
 * path. Private to kernels/cuda/ (moe_routed.cu composes them) and the GPU tests (tests/gpu/
 * reaches this folder through its include path); the model runner reaches them only through
 * the op (until issue 19's item 4 they were in the public k3k_cuda.h).
 * Invariants: every function queues work on the stream it is given (or the context's) and says
 * when it synchronises; return codes are 0 or negative K3_E* (k3pd/err.h). */
#ifndef K3K_MOE_BLOCK_H
#define K3K_MOE_BLOCK_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"
#include "k3k_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size of the device MoE plan's scratch (moe_ops.h, k3k_cu_moe_plan) for T tokens, E experts. */
size_t k3k_cu_moe_plan_scratch(int32_t T, int32_t E);

/* Router + plan for one MoE layer: the ROUTER op (p; logits [T,E] F32/BF16, bias [E], idx I32
 * [T,k] and w F32 [T,k] written, unit column stride) followed by k3k_cu_moe_plan on its idx
 * (expert_off [E+1], gather_tok [T*k], row_idx [T*k], active [1+E]; scratch
 * k3k_cu_moe_plan_scratch(T, E) bytes). Results are identical to k3k_router (device op) +
 * k3k_cu_moe_plan; ids are always in range, so there is no bad flag. One launch (one block)
 * when n_groups == 1, T <= 32, T*k <= 4096, E <= 1024, k <= 32, logits F32 with unit column stride and
 * bias F32/BF16 with unit stride; otherwise the ROUTER kernel and the 3-launch plan. The
 * MOE_ROUTED op's CUDA path calls this instead of k3k_router + k3k_cu_moe_plan. */
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


/* MOE_COMBINE without the range check/synchronisation (row_idx from k3k_cu_moe_plan is valid by
 * construction): y[t] = Σ_i w[t][i]·rows[row_idx[t][i]] (−1 skips), fp32, one rounding. */
int k3k_cu_moe_combine_raw(cudaStream_t st, const k3k_tensor_t *rows, const k3k_tensor_t *row_idx,
                           const k3k_tensor_t *w, const k3k_tensor_t *y, int *bad);

/* k3k_cu_moe_gemm when it takes the arguments, else k3k_cu_moe_gemm_generic (the tensor-core
 * kernels refuse with K3_EINVAL before queuing anything). The choice depends only on the shapes
 * and pointers, so eager steps and graph replays run the same kernel. */
int k3k_cu_moe_gemm_any(cudaStream_t st, const k3k_cu_moe_gemm_args *a);

/* The 48B's expert block in two launches of k3k_cu_moe_bf16_gemm: h = SiLU(g)·u with g, u the
 * gate (w1) and up (w3) products of the plan's gathered rows of x, rounded to bf16 first (the
 * reference stores them bf16), then y = h·W2^T. tab: device array of 3*E pointers (w1[E], w3[E],
 * w2[E]), contiguous bf16 experts: w1/w3 [F][D], w2 [D][F]. h [rows][F] and y [rows][D] bf16,
 * rows in the plan's grouped order. Returns what k3k_cu_moe_bf16_gemm returns. */
int k3k_cu_moe_bf16_experts(cudaStream_t st, const uint16_t *const *tab, int32_t E, int32_t F,
                            int32_t D, const uint16_t *x, int64_t ldx, const int32_t *x_gather,
                            const int32_t *expert_off, const int32_t *active, int32_t max_active,
                            uint16_t *h, uint16_t *y);

/* Whether the grouped kernel is the right tool for T*k pairs over E experts: at most 16 rows
 * per active expert on average (decode, short prompts); above that the weight reuse of a real
 * GEMM wins. Deterministic in (T, k, E): the same pass always takes the same path. */
bool k3k_cu_moe_bf16_wanted(int64_t T, int32_t k, int32_t E);

/* Experts per group: dequantised by one launch and multiplied by one batched GEMM; the scratch
 * holds two such groups (one being dequantised on the path's own stream while the other one's
 * GEMM runs on cx->stream). */
#define K3K_CU_MOE_DQ_GROUP 4

typedef struct {
  k3k_cu_mx_set w1, w3, w2; /* gate [F,D], up [F,D], down [D,F] per expert */
  int act;                  /* K3K_CU_ACT_SITU or K3K_CU_ACT_SILU_MUL */
  float beta, beta_lin;     /* SiTU */
  int32_t F, D, E;          /* expert width, latent width, experts; F, D multiples of 8 */
  int32_t T, k;             /* tokens and choices: T*k plan rows */
  const uint16_t *x;        /* [T][D] bf16, row stride ldx (elements, % 8 == 0) */
  int64_t ldx;
  const int32_t *gather_tok, *expert_off; /* the device plan (k3k_cu_moe_route_plan) */
  uint16_t *h;              /* [T*k][F] bf16, plan order: the activation rows, written only
                             * when parts == 1 and read only when parts == 2 (the timing
                             * split; the full call keeps them in its scratch) */
  uint16_t *y;              /* [T*k][D] bf16: expert output rows in plan order (written) */
  void *scratch;            /* k3k_cu_moe_dq_scratch_bytes(T*k, F, D), 16-byte aligned */
  unsigned parts;           /* 0 or 3: both; 1: gate/up + activation only; 2: down only
                             * (timing: h must hold the activation rows already) */
  /* bf16 experts (Kimi-Linear-48B): host arrays of E device pointers to each expert's bf16
   * gate [F][D], up [F][D] and down [D][F] (contiguous rows, 16-byte aligned). When w1_bf16 is
   * set, w1/w3/w2 are not used: nothing is dequantised and each group's experts are multiplied
   * in place through cuBLASLt's pointer-array batches (same layout and schedule). */
  const void *const *w1_bf16, *const *w3_bf16, *const *w2_bf16;
} k3k_cu_moe_dq_args;

/* Scratch bytes for tk = T*k plan rows over E experts: the gathered x rows (later the expert
 * outputs), the gate/up GEMM outputs and the activation rows in the padded layout (at most
 * tk + tk/7 + 32·min(E, tk) rows of D, 2F and F), the padded bases, and 2 ×
 * K3K_CU_MOE_DQ_GROUP dequantised experts of 2·F·D bf16 each (4.3 GB at the medium preset's
 * 8K-token prefill). */
size_t k3k_cu_moe_dq_scratch_bytes(int64_t tk, int32_t E, int32_t F, int32_t D);

/* The path rule. ON by default for batches with at least K3K_CU_MOE_DQ_ROWS_DEFAULT plan rows
 * per active expert on average, i.e. T*k / min(E, T*k) >= rows (the measured crossover against
 * the grouped W4A16 kernel, 384 since its 4-warpgroup form of session 14, 256 before:
 * perf-gpu-moe.md "Dequant-once prefill"): the medium preset's 8K prefill (512 rows per expert)
 * takes it, a K3 prefill of up to ~20K tokens (E = 896: ~162 rows per active expert at 8K, ~310 at 16K) and every
 * decode step do not. K3PD_MOE_DQ=0 turns it off, K3PD_MOE_DQ=2 takes it for every batch (tests),
 * K3PD_MOE_DQ_ROWS sets the threshold. Deterministic in (T, k, E) and the environment read at
 * the first call. */
#define K3K_CU_MOE_DQ_ROWS_DEFAULT 384
bool k3k_cu_moe_dq_wanted(int64_t T, int32_t k, int32_t E);

/* Runs the routed experts of one MoE layer (see the file comment). */
int k3k_cu_moe_dq_experts(k3k_cuda_ctx *cx, const k3k_cu_moe_dq_args *a);

#ifdef __cplusplus
}
#endif
#endif
