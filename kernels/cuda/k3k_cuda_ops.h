/* Internal interface of the CUDA backend (kernels/cuda/): the device context and one entry
 * point per op family, plus the raw fused kernels the op API has no slot for.
 *
 * What it is for: cuda_backend.cu owns the context and dispatches validated ops here; the GPU
 * tests (tests/gpu/) include this header to reach the stream, the fused decode step and the
 * perf helpers.
 * What it is not: public API. Model code uses k3k.h only.
 * Invariants: every entry returns 0, K3_ENOMEM (scratch growth) or K3_EDEVICE (logged). Work is
 * queued on ctx->stream and not synchronised unless the function says so. Entries assume the
 * tensors passed k3k_op_validate() and cuda_supports(). */
#ifndef K3K_CUDA_OPS_H
#define K3K_CUDA_OPS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3k_cuda_pool k3k_cuda_pool; /* size-bucketed cache of cudaMalloc blocks */

typedef struct {
  int device;
  int num_sms;
  cudaStream_t stream;
  void *lt;            /* cublasLtHandle_t */
  void *lt_ws;         /* cuBLASLt workspace (device), lt_ws_bytes */
  size_t lt_ws_bytes;
  void *scratch;       /* per-op device scratch (split-KV partials, casts), grown on demand */
  size_t scratch_bytes;
  void *host_buf;      /* pinned host staging (sampling), grown on demand */
  size_t host_bytes;
  k3k_cuda_pool *pool;
  void *algo_cache;    /* cuBLASLt algorithm cache (gemm.cu), k3k_cuda_algo_cache_bytes() */
  /* > 0: the caller built every id/length tensor itself and validated it on the host, so the
   * check.cu functions return 0 without launching or synchronising (k3k_cuda_set_trusted_ids).
   * 0 (the default) for every other caller: ops validate as k3k.h says. */
  int trusted_ids;
  /* Bumped whenever memory the ops use implicitly (scratch, pinned host staging) is
   * reallocated: a CUDA graph captured under an older value holds dangling pointers. */
  uint64_t mem_gen;
  /* The side stream (side_stream.cu): `other` holds whichever lane is not current (its stream,
   * cuBLASLt workspace and scratch), swapped with the fields above by k3k_cuda_side_begin/end;
   * lt_ws_bytes is the same for both. on_side: ops now go to the side stream. */
  struct {
    cudaStream_t stream;
    void *lt_ws, *scratch;
    size_t scratch_bytes;
  } other;
  cudaEvent_t side_ev[3]; /* [0]: fork point on main; [1], [2]: marks on the side stream */
  int side_ready, on_side;
  /* The dequant-once MoE path's own stream and events (moe_dq.cu), created at its first use,
   * freed by k3k_cu_moe_dq_release from the backend's destroy. Kept last in the struct. */
  void *moe_dq;
} k3k_cuda_ctx;
size_t k3k_cuda_algo_cache_bytes(void);

/* The context of a "cuda" backend (NULL for any other backend). */
k3k_cuda_ctx *k3k_cuda_ctx_of(k3k_backend_t *be);
/* Grows ctx->scratch to at least `bytes` (synchronises the stream before freeing the old one). */
int k3k_cuda_scratch(k3k_cuda_ctx *cx, size_t bytes, void **out);
int k3k_cuda_host_scratch(k3k_cuda_ctx *cx, size_t bytes, void **out);

/* Entry points, one per op of k3k_ops.def (k3k_cuda_<name>, same slot order as k3k.h): the
 * backend's dispatch table is generated from the same list (cuda_backend.cu). The entries of
 * KDA_STEP, KDA_CHUNK, MLA_PREFILL and MLA_DECODE pick the fast kernel (k3k_cuda_<name>_fast)
 * where its *_ok predicate takes the operands, else the generic one (generic.h). */
typedef int (*k3k_cuda_fn)(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t);
#define K3K_CUDA_DECL(name) \
  int k3k_cuda_##name(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t)
#define K3K_OP_X(ENUM, name, n_tensors) K3K_CUDA_DECL(name);
#include "k3k_ops.def"
#undef K3K_OP_X
/* The fast kernels alone (real K3 / 48B shapes; see their *_ok predicates below). */
K3K_CUDA_DECL(kda_step_fast);
K3K_CUDA_DECL(kda_chunk_fast);
K3K_CUDA_DECL(mla_prefill_fast);
K3K_CUDA_DECL(mla_decode_fast);

/* Shape/dtype checks beyond k3k_op_validate() for ops with restricted fast paths. */
bool k3k_cuda_gemm_ok(const k3k_tensor_t *const *t);
bool k3k_cuda_kda_step_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_kda_chunk_ok(const void *params, const k3k_tensor_t *const *t);

/* Trusted ids (check.cu): while on, the three checks below return 0 at once (no launch, no
 * synchronisation), which makes the ops that call them capture-safe. Only for a caller that
 * builds the metadata itself and validated it on the host (the model runner: slots allocated and
 * distinct, cu_seqlens monotone by construction, page ids from its pool, seq_lens within the
 * page table); it turns the flag off again when its pass ends. Returns the previous value. */
int k3k_cuda_set_trusted_ids(k3k_cuda_ctx *cx, int on);

/* A second stream for work that does not depend on what the main stream does next (the MoE
 * block's shared expert and latent down-projection run beside the router and routed experts
 * in a decode step: each alone leaves most of the copy bandwidth idle at batch 1). Inside a
 * graph capture the fork and the marks become graph edges, so a captured step keeps the same
 * concurrency. Results are unchanged: the same kernels on the same inputs; the side lane has
 * its own cuBLASLt workspace and scratch so concurrent ops never share memory.
 *   k3k_cuda_side_init: creates the side stream, events and workspace once (not while a
 *     capture is running); 0, K3_ENOMEM or K3_EDEVICE. Freed by the backend's destroy.
 *   k3k_cuda_side_begin: ops queued after it go to the side stream, ordered after everything
 *     queued on the main stream so far. K3_EINVAL when not initialised or already on the side.
 *   k3k_cuda_side_mark(cx, i), i in 1..2: on the side, marks the side work queued so far.
 *   k3k_cuda_side_end: back to the main stream (which does not wait for anything).
 *   k3k_cuda_side_wait(cx, i): on main, later main work waits for side mark i. */
/* The decode step's residual glue in one launch (resnorm.cu): P += a (a may be NULL), then
 * h = ATTN_RES_MIX(snaps, P; wn, wp, eps_mix) (snaps may be NULL: h is P, h unused), then
 * xn = RMSNORM(h; lnw, eps, bf16_inner); P, h, xn bit-identical to the ADD, ATTN_RES_MIX and
 * RMSNORM ops queued one after the other. k3k_cuda_add_mix_norm_fits: BF16 rows with 16-byte
 * aligned unit-stride rows, 1 <= T <= SM count, d % 8 == 0, d <= 8192, at most 15 snapshots, no
 * output aliasing an input; k3k_cuda_add_mix_norm returns K3_EINVAL (nothing queued) when it
 * does not fit, else 0 or K3_EDEVICE. */
bool k3k_cuda_add_mix_norm_fits(const k3k_cuda_ctx *cx, const k3k_tensor_t *a,
                                const k3k_tensor_t *P, const k3k_tensor_t *snaps,
                                const k3k_tensor_t *wn, const k3k_tensor_t *wp,
                                const k3k_tensor_t *h, const k3k_tensor_t *lnw,
                                const k3k_tensor_t *xn);
int k3k_cuda_add_mix_norm(k3k_cuda_ctx *cx, const k3k_tensor_t *a, const k3k_tensor_t *P,
                          const k3k_tensor_t *snaps, const k3k_tensor_t *wn,
                          const k3k_tensor_t *wp, float eps_mix, const k3k_tensor_t *h,
                          const k3k_tensor_t *lnw, float eps, int bf16_inner,
                          const k3k_tensor_t *xn);

int k3k_cuda_side_init(k3k_cuda_ctx *cx);
int k3k_cuda_side_begin(k3k_cuda_ctx *cx);
int k3k_cuda_side_mark(k3k_cuda_ctx *cx, int i);
int k3k_cuda_side_end(k3k_cuda_ctx *cx);
int k3k_cuda_side_wait(k3k_cuda_ctx *cx, int i);
void k3k_cuda_side_destroy(k3k_cuda_ctx *cx);

/* Device-side validation of metadata before an op writes (check.cu); one synchronisation each.
 * ids [n] I32: each in [0,limit) (negative allowed when allow_neg), pairwise distinct when
 * unique -> 0, K3_ERANGE (range) or K3_EINVAL (duplicate). cu [n+1]: non-decreasing from >= 0,
 * last <= total -> 0 or K3_ERANGE. Pages: every seq_len in [0, max_pages*page_size] and every
 * page id a sequence uses in [0, n_pages) -> 0 or K3_ERANGE. */
int k3k_cuda_check_ids(k3k_cuda_ctx *cx, const k3k_tensor_t *ids, int64_t n, int64_t limit,
                       int unique, int allow_neg);
int k3k_cuda_check_seqs(k3k_cuda_ctx *cx, const k3k_tensor_t *cu, int64_t n, int64_t total);
int k3k_cuda_check_pages(k3k_cuda_ctx *cx, const k3k_tensor_t *page_table,
                         const k3k_tensor_t *seq_lens, int64_t n, int64_t page_size,
                         int64_t n_pages);
bool k3k_cuda_mla_decode_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_mla_prefill_ok(const void *params, const k3k_tensor_t *const *t);
/* MLA_PREFILL's sequence bounds brought to the host (one synchronisation) and checked as the
 * reference does: cu_q and cu_k [n+1] non-decreasing from >= 0 and within q / kv / k_rope rows
 * (K3_ERANGE), then every key run at least as long as its query run (K3_EINVAL). *max_lq gets
 * the longest query run. Used by the Hopper kernel and the generic one. */
int k3k_cuda_mla_prefill_bounds(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t, int64_t n,
                                int64_t *max_lq);

/* Strided-batched GEMM through cuBLASLt, column-major convention:
 * C[m x n] = op(A) op(B), A/B/C of the given cudaDataType (values of cudaDataType_t), fp32
 * accumulate, ld and batch strides in elements. Used by GEMM and the MLA absorption. */
int k3k_cuda_lt_gemm(k3k_cuda_ctx *cx, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, const void *a, int type_a, int64_t lda, int64_t stride_a,
                     const void *b, int type_b, int64_t ldb, int64_t stride_b, void *c,
                     int type_c, int64_t ldc, int64_t stride_c, int batch);

/* Fused KDA decode step (spec §3.9 minus the projections): conv update + L2 norms + gate + beta
 * + delta-rule update + output + gated RMSNorm, one token per sequence, one pass over the fp32
 * state. Equals CONV_STEP(q,k,v) → L2NORM(q,k) → KDA_GATE → SIGMOID(b) → KDA_STEP →
 * GATED_RMSNORM with bf16 conv outputs, fp32 q/k/g/beta, bf16 o. DK = DV = 128. */
typedef struct {
  int batch, heads;                   /* B sequences, NH heads of 128 */
  const uint16_t *q, *k, *v;          /* [B][NH*128] bf16 projections, before the conv */
  size_t ld_qkv;
  const uint16_t *g_raw;              /* [B][NH*128] bf16 f_b_proj output */
  size_t ld_g;
  const void *b_raw;                  /* [B][NH] fp32, or bf16 when b_raw_bf16 */
  size_t ld_b;
  int b_raw_bf16;
  const uint16_t *z;                  /* [B][NH*128] bf16 output-gate projection */
  size_t ld_z;
  uint16_t *conv_q, *conv_k, *conv_v; /* [slots][NH*128][3] bf16, updated in place */
  const float *wq, *wk, *wv;          /* [NH*128][4] fp32 conv weights */
  const float *a_log;                 /* [>= NH] fp32 */
  const float *dt_bias;               /* [NH*128] fp32 */
  const float *o_norm_w;              /* [128] fp32 */
  float *state;                       /* [slots][NH][128 v][128 k] fp32, updated in place */
  const int32_t *slots;               /* [B] device, slot of each sequence */
  uint16_t *out;                      /* [B][NH*128] bf16 gated-normed output */
  size_t ld_out;
  float lower_bound, q_scale, l2_eps, rms_eps;
  int n_slots;                        /* > 0: slots outside [0,n_slots) are skipped (guard) */
} k3k_cu_kda_decode_args;
int k3k_cu_kda_decode(cudaStream_t st, const k3k_cu_kda_decode_args *a);

/* Benchmarks: with ev != NULL (5 created events), every later MLA_DECODE records ev[0..4]
 * around its phases (q prep | absorption GEMM | attention | output GEMM + cast); NULL stops. */
void k3k_cuda_mla_phase_events(cudaEvent_t *ev);
/* Benchmarks only: MLA decode attention variants that leave a stage out (mla.cu); 0 = normal. */
void k3k_cuda_mla_probe(int mode);

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

/* Benchmarks/tests: fills n F32/BF16 elements with hash-based uniform values in [lo, hi). */
int k3k_cu_fill_random(cudaStream_t st, void *p, int64_t n, k3k_dtype_t dt, uint64_t seed,
                       float lo, float hi);

#ifdef __cplusplus
}
#endif
#endif
