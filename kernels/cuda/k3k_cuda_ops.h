/* Internal interface of the CUDA backend (kernels/cuda/): the device context and one entry
 * point per op family, plus the raw fused kernels the op API has no slot for.
 *
 * What it is for: cuda_backend.cu owns the context and dispatches validated ops here; the GPU
 * tests (tests/gpu/) include this header to reach the stream, the fused decode step and the
 * perf helpers.
 * What it is not: public API. Model code uses k3k.h only; the model runner k3k_cuda.h (the part
 * of this backend it may use, which this header includes).
 * Invariants: every entry returns 0, K3_ENOMEM (scratch growth) or K3_EDEVICE (logged). Work is
 * queued on ctx->stream and not synchronised unless the function says so. Entries assume the
 * tensors passed k3k_op_validate() and cuda_supports(). */
#ifndef K3K_CUDA_OPS_H
#define K3K_CUDA_OPS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"
#include "k3k_cuda.h" /* the runner-facing part, moved there (issue 19) */
#include "cuda_fused.h" /* the fused kernels behind RES_MIX_NORM, GEMM_MULTI, KDA_DECODE */
#include "moe_block.h"  /* the MoE pieces behind MOE_ROUTED */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3k_cuda_pool k3k_cuda_pool; /* size-bucketed cache of cudaMalloc blocks */

struct k3k_cuda_ctx { /* typedef in k3k_cuda.h */
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
  /* Split page check (k3k_cuda_check_pages_begin/_end): the pinned word the flag is copied to
   * and the event after that copy, created at first use, freed by the backend's destroy. */
  unsigned *check_host;
  cudaEvent_t check_ev;
  /* The dequant-once MoE path's own stream and events (moe_dq.cu), created at its first use,
   * freed by k3k_cu_moe_dq_release from the backend's destroy. Kept last in the struct. */
  void *moe_dq;
};
size_t k3k_cuda_algo_cache_bytes(void);

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

/* Whether the fused kernel of RES_MIX_NORM, GEMM_MULTI or KDA_DECODE takes these operands
 * (fused_ops.cu); cuda_supports answers with it. */
bool k3k_cuda_fused_ok(const k3k_cuda_ctx *cx, k3k_op_t op, const void *params,
                       const k3k_tensor_t *const *t);
/* MOE_ROUTED (moe_routed.cu): whether the device path takes the operands, and the bytes it
 * needs in the op's ws slot. */
bool k3k_cuda_moe_routed_ok(const void *params, const k3k_tensor_t *const *t);
size_t k3k_cuda_moe_routed_ws(const void *params, const k3k_tensor_t *const *t);

/* Shape/dtype checks beyond k3k_op_validate() for ops with restricted fast paths. */
bool k3k_cuda_gemm_ok(const k3k_tensor_t *const *t);
bool k3k_cuda_kda_step_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_kda_chunk_ok(const void *params, const k3k_tensor_t *const *t);

void k3k_cuda_side_destroy(k3k_cuda_ctx *cx);

/* Device-side validation of metadata before an op writes (check.cu); one synchronisation each.
 * ids [n] I32: each in [0,limit) (negative allowed when allow_neg), pairwise distinct when
 * unique -> 0, K3_ERANGE (range) or K3_EINVAL (duplicate). cu [n+1]: non-decreasing from >= 0,
 * last <= total -> 0 or K3_ERANGE. Pages: every seq_len in [0, max_pages*page_size] and every
 * page id a sequence uses in [0, n_pages) -> 0 or K3_ERANGE. */
int k3k_cuda_check_ids(k3k_cuda_ctx *cx, const k3k_tensor_t *ids, int64_t n, int64_t limit,
                       int unique, int allow_neg);
int k3k_cuda_check_seqs(k3k_cuda_ctx *cx, const k3k_tensor_t *cu, int64_t n, int64_t total);
/* The cu_seqlens and slot checks of a sequence op (the two checks above, same codes) without
 * the synchronisation: one memset and one kernel are queued and *flag gets a device word that
 * is nonzero when a check failed (NULL when ctx->trusted_ids: nothing queued). The op passes
 * the flag to its kernels, which write nothing when it is set, then calls
 * k3k_cuda_check_end, which reads it back (the op's one synchronisation) and returns 0,
 * K3_ERANGE or K3_EINVAL. The flag lives in ctx scratch: nothing in between may grow it. */
int k3k_cuda_check_seqs_slots_begin(k3k_cuda_ctx *cx, const k3k_tensor_t *cu,
                                    const k3k_tensor_t *slots, int64_t n, int64_t total,
                                    int64_t n_slots, unsigned **flag);
int k3k_cuda_check_end(k3k_cuda_ctx *cx, unsigned *flag);
int k3k_cuda_check_pages(k3k_cuda_ctx *cx, const k3k_tensor_t *page_table,
                         const k3k_tensor_t *seq_lens, int64_t n, int64_t page_size,
                         int64_t n_pages);
/* The page check of k3k_cuda_check_pages split so that the host waits for the check alone
 * while work queued behind it runs: _begin queues the check into the device word `res` (the
 * caller's scratch; 4 bytes) and its copy to a pinned host word, then records an event; the
 * caller may queue work that writes nothing the op's caller can see (its scratch) before
 * _end, which waits for that event only and returns 0 or K3_ERANGE. *queued = false (and
 * nothing queued) under trusted ids; _end then returns 0. */
int k3k_cuda_check_pages_begin(k3k_cuda_ctx *cx, const k3k_tensor_t *page_table,
                               const k3k_tensor_t *seq_lens, int64_t n, int64_t page_size,
                               int64_t n_pages, unsigned *res, bool *queued);
int k3k_cuda_check_pages_end(k3k_cuda_ctx *cx, bool queued);
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

/* The same product for `batch` matrices given by device arrays of pointers (cuBLASLt's pointer-
 * array batch mode): C_i = op(A_i) · op(B_i) with one m, n, k and leading dimensions; every
 * matrix 16-byte aligned. K3_ENOTSUP when cuBLASLt offers no algorithm (the caller falls back to
 * one k3k_cuda_lt_gemm per matrix). */
int k3k_cuda_lt_gemm_ptrs(k3k_cuda_ctx *cx, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, const void *const *a, int type_a, int64_t lda,
                          const void *const *b, int type_b, int64_t ldb, void *const *c,
                          int type_c, int64_t ldc, int batch);

/* Benchmarks: with ev != NULL (5 created events), every later MLA_DECODE records ev[0..4]
 * around its phases (q prep | absorption GEMM | attention | output GEMM + cast); NULL stops. */
void k3k_cuda_mla_phase_events(cudaEvent_t *ev);
/* Benchmarks and parity only: MLA decode variants (mla.cu: some leave a stage out, 4096 / 8192
 * select the fallback kernel placement / op path); 0 = normal. */
void k3k_cuda_mla_probe(int mode);



/* Benchmarks/tests: fills n F32/BF16 elements with hash-based uniform values in [lo, hi). */
int k3k_cu_fill_random(cudaStream_t st, void *p, int64_t n, k3k_dtype_t dt, uint64_t seed,
                       float lo, float hi);

#ifdef __cplusplus
}
#endif
#endif
