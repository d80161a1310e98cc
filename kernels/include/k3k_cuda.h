/* What the model runner may use of the CUDA backend beyond the k3k.h ops: the device context
 * and its stream, trusted ids, the weight-constness promise, the raw decode copies, synthetic
 * weights and the MoE pieces that are not an op yet (issue 19: one public header; everything
 * else in kernels/cuda/ is private). The fusions that became ops (RES_MIX_NORM, GEMM_MULTI,
 * KDA_DECODE) and the side lane (k3k_backend_side) left this header for the backend's private
 * cuda_fused.h: the runner reaches them through k3k.h.
 *
 * What it is for: kernels/runner/ (ffn_device.c, graph.c, kda_device.c, synth_dev.c) includes
 * this header and no header of kernels/cuda/. The declarations here are the ones those files
 * use, moved as they were from the backend's internal headers, which include this one.
 * What it is not: model code's API (that is k3k.h) or the tests' view (tests/gpu/ reaches the
 * internal headers through its own include path).
 * Invariants: every function queues work on the stream it is given (or the context's) and says
 * when it synchronises; return codes are 0 or negative K3_E* (k3pd/err.h). */
#ifndef K3K_CUDA_H
#define K3K_CUDA_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's context, opaque here (kernels/cuda/k3k_cuda_ops.h defines it). */
typedef struct k3k_cuda_ctx k3k_cuda_ctx;
/* Its main stream (what every op of the backend queues on) and its memory generation: bumped
 * whenever memory the ops use implicitly (scratch, pinned staging) was reallocated, so a CUDA
 * graph captured under an older value holds dangling pointers. */
cudaStream_t k3k_cuda_stream(const k3k_cuda_ctx *cx);
uint64_t k3k_cuda_mem_gen(const k3k_cuda_ctx *cx);

/* Size of the device MoE plan's scratch (moe_ops.h, k3k_cu_moe_plan) for T tokens, E experts. */
size_t k3k_cu_moe_plan_scratch(int32_t T, int32_t E);

/* ---- context ---- */
/* The context of a "cuda" backend (NULL for any other backend). */
k3k_cuda_ctx *k3k_cuda_ctx_of(k3k_backend_t *be);

/* ---- trusted ids ---- */
/* Trusted ids (check.cu): while on, the three checks below return 0 at once (no launch, no
 * synchronisation), which makes the ops that call them capture-safe. Only for a caller that
 * builds the metadata itself and validated it on the host (the model runner: slots allocated and
 * distinct, cu_seqlens monotone by construction, page ids from its pool, seq_lens within the
 * page table); it turns the flag off again when its pass ends. Returns the previous value. */
int k3k_cuda_set_trusted_ids(k3k_cuda_ctx *cx, int on);

/* ---- row gather, cache write ---- */
/* Unchecked decode helpers for the model runner (runner_raw.cu), capture-safe (no
 * synchronisation, no allocation): the ids come from the runner's host-validated metadata.
 * Row gather: y[t][0..d) = table[ids[t]][0..d) for t < n, 2-byte elements (bf16 rows), row
 * strides in elements. Cache write: cache row slot_mapping[t] (page * page_size + offset of a
 * [pages, page_size, c + dr] bf16 cache with row stride c + dr) gets [c_n[t] | k_rot[t]]; a
 * negative slot skips the token. Same bytes as GET_ROWS / MLA_CACHE_WRITE on bf16 tensors. */
int k3k_cu_gather_rows_u16(cudaStream_t st, const uint16_t *table, int64_t ld_table,
                           const int32_t *ids, int64_t n, int64_t d, uint16_t *y, int64_t ld_y);
int k3k_cu_cache_write_u16(cudaStream_t st, const uint16_t *c_n, int64_t ld_cn, const uint16_t *k_rot,
                           int64_t ld_kr, const int32_t *slot_mapping, int64_t n, int64_t c,
                           int64_t dr, uint16_t *cache);

/* ---- synthetic weights ---- */
/* Synthetic weights on the device (synth_gpu.cu), the values of common/ckpt/synth.c: the caller
 * maps a tmap entry's role to a plain kind (K3K_SYN_NORMAL: v = [b +] a*N(0,1);
 * K3K_SYN_AFFINE_UNIFORM: v = b + a*U; K3K_SYN_LOG_UNIFORM: log(1 + 15U) for the first n_valid
 * elements, 0 after) or generates an MXFP4 entry (packed codes or scales of the logical [N, K]
 * master keyed mkey). Element/group indices whose value could round differently from the
 * host's libm are appended to flags (device, cap entries; *n_flags counts all of them, device
 * unsigned, caller-zeroed): recompute those with k3_synth_fill on the host and overwrite (one
 * element of a plain entry, one 32-group = 16 packed bytes or 1 scale byte of an MXFP4 entry).
 * With that the bytes equal k3_synth_fill's. Queued on st, not synchronised. */
enum { K3K_SYN_NORMAL = 0, K3K_SYN_AFFINE_UNIFORM = 1, K3K_SYN_LOG_UNIFORM = 2 };
typedef struct {
  int kind, has_b, f32; /* f32: F32 output, else BF16 (RNE) */
  uint64_t key;         /* k3_synth_key(full name, seed) */
  double a, b;
  int64_t n_valid;
} k3k_cu_synth_plain;
int k3k_cu_synth_plain_fill(cudaStream_t st, const k3k_cu_synth_plain *p, void *dst, int64_t n,
                            uint64_t *flags, unsigned *n_flags, unsigned cap);
int k3k_cu_synth_mx_fill(cudaStream_t st, uint64_t mkey, int64_t N, int64_t K, int want_scale,
                         uint8_t *dst, uint64_t *flags, unsigned *n_flags, unsigned cap);

/* ---- gemv ---- */
/* Promise (per calling thread) that no kernel launched until the next call with false writes
 * any W given to the kernel: its first weight loads may then precede the wait for the previous
 * kernel (PDL, pdl.cuh). The runner turns it on around its passes (weights are uploaded at
 * init); default off, so W made by the previous kernel (tests) is always read after the wait. */
void k3k_cuda_gemv_const_weights(bool on);

/* ---- MoE ---- */
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

/* Sets *bad (device int) to 1 when any of n scale bytes is 0xFF. Queued, not synchronised. */
int k3k_cu_mx_check(cudaStream_t st, const uint8_t *scale, int64_t rows, int64_t cols,
                    int64_t ld, int *bad);

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
 * the grouped W4A16 kernel: perf-gpu-moe.md "Dequant-once prefill"): the medium preset's 8K
 * prefill (512 rows per expert) takes it, a K3 8K prefill (E = 896: ~146) and every decode step
 * do not. K3PD_MOE_DQ=0 turns it off, K3PD_MOE_DQ=2 takes it for every batch (tests),
 * K3PD_MOE_DQ_ROWS sets the threshold. Deterministic in (T, k, E) and the environment read at
 * the first call. */
#define K3K_CU_MOE_DQ_ROWS_DEFAULT 256
bool k3k_cu_moe_dq_wanted(int64_t T, int32_t k, int32_t E);

/* Runs the routed experts of one MoE layer (see the file comment). */
int k3k_cu_moe_dq_experts(k3k_cuda_ctx *cx, const k3k_cu_moe_dq_args *a);

#ifdef __cplusplus
}
#endif
#endif
