/* CUDA: GEMM (y = x · Wᵀ, nn.Linear) through cuBLASLt, and the strided-batched helper the MLA
 * absorption uses.
 *
 * What it is for: every dense bf16 projection of the model (spec §3.1, §4.1, lm_head), with
 * fp32 accumulation (CUBLAS_COMPUTE_32F). BF16·BF16 → BF16 or F32, and F32·F32 → F32 (exact
 * fp32 SGEMM path, for the fp32 reference mode).
 * What it is not: the MXFP4 expert GEMM (issue 9), nor the small-M shapes where the skinny
 * kernel of gemv.cu measured faster (k3k_cuda_gemv_wanted; the op dispatches those there).
 * Layouts: cuBLASLt takes an operand as it is when its inner stride is 1, its row stride can be
 * the leading dimension (>= its row length) and its dtype is the compute dtype (BF16 when x and
 * W are both BF16, else F32); a sliced weight view (rows/columns of a bigger matrix) is such a
 * case. Any other operand (mixed F32/BF16 inputs, inner stride != 1, overlapping rows) is first
 * copied into contiguous scratch in the compute dtype (BF16 -> F32 is exact), and an output
 * cuBLASLt cannot write (inner stride != 1, or BF16 from an F32 product) goes through an F32
 * scratch and one rounding copy, so every path keeps the reference's single output rounding.
 * cuBLASLt is told the real alignment of every pointer (its default assumes 256 bytes).
 * Algorithm choice (once per problem key, then cached, so steady-state calls skip it): the
 * heuristic's top 8 candidates plus split-K variants of its first two are timed on the real
 * operands (CUDA events, 1 warm-up + mean of 3 runs) when the product is large (>= 2^24 MACs),
 * the stream is not being captured into a graph and the output does not overlap an input;
 * the heuristic's first pick is kept unless another is >= 3 % faster. The timing is opt-in
 * (K3PD_CUDA_GEMM_TUNE=1): a choice made by timing can differ between processes, and with it the
 * fp32 summation order, so two workers (prefill and decode, or a worker and k3pd-generate) would
 * no longer produce bit-identical results; the default keeps the deterministic heuristic pick. Different algorithms differ only in fp32
 * summation order (split-K), within the documented GEMM tolerances.
 * k3k_cuda_lt_gemm returns K3_ENOTSUP (a logged warning) when cuBLASLt offers no algorithm for
 * the layouts/alignments; the GEMM op then retries on contiguous copies.
 * Row-major y[M,N] = x[M,K]·W[N,K]ᵀ is the column-major product yᵀ = op_T(W) · xᵀ. */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "gemv.h"

#define LT_CHECK(call)                                                              \
  do {                                                                              \
    cublasStatus_t k3k_s_ = (call);                                                 \
    if (k3k_s_ != CUBLAS_STATUS_SUCCESS) {                                          \
      K3_ERROR("cublasLt: %s failed: status %d", #call, (int)k3k_s_);               \
      rc = K3_EDEVICE;                                                              \
      goto out;                                                                     \
    }                                                                               \
  } while (0)

static uint32_t align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && (a % al)) al >>= 1;
  return al;
}

/* Algorithm cache, one per backend context (a backend is used by one thread at a time). */
typedef struct {
  int64_t key[16];
  cublasLtMatmulAlgo_t algo;
  bool used;
} algo_slot;
#define ALGO_SLOTS 128
size_t k3k_cuda_algo_cache_bytes(void) { return ALGO_SLOTS * sizeof(algo_slot); }

static bool find_algo(algo_slot *g_algos, const int64_t *key, cublasLtMatmulAlgo_t *algo, unsigned *slot_out) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 16; i++) h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
  unsigned s = (unsigned)(h % ALGO_SLOTS);
  *slot_out = s;
  if (g_algos[s].used && !memcmp(g_algos[s].key, key, sizeof g_algos[s].key)) {
    *algo = g_algos[s].algo;
    return true;
  }
  return false;
}

/* Byte range [lo, hi) an operand of `rows` x `cols` (column-major, ld) x batch may touch. */
static void extent(const void *p, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                   int batch, int type, uintptr_t *lo, uintptr_t *hi) {
  size_t es = type == CUDA_R_32F ? 4 : 2;
  *lo = (uintptr_t)p;
  *hi = *lo + ((size_t)(ld * (cols - 1) + rows) + (size_t)(batch - 1) * (size_t)stride) * es;
}

/* Whether to time candidates: large products only, only under K3PD_CUDA_GEMM_TUNE=1, never while
 * the stream is captured (event synchronisation is illegal there). */
static bool tune_wanted(k3k_cuda_ctx *cx, int64_t m, int64_t n, int64_t k, int batch) {
  static int env = -1;
  if (env < 0) {
    const char *e = getenv("K3PD_CUDA_GEMM_TUNE");
    env = e && !strcmp(e, "1");
  }
  if (!env || (double)m * (double)n * (double)k * batch < (double)(1 << 24)) return false;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cx->stream, &cs) != cudaSuccess) return false;
  return cs == cudaStreamCaptureStatusNone;
}

#define TUNE_MAX 16

/* Times each candidate (1 warm-up + 3 runs, mean) and returns the index of the fastest; the
 * heuristic's first pick (index 0) wins unless another is >= 3 % faster. A candidate that
 * fails to run is skipped. Returns -1 when no candidate ran. */
static int time_candidates(k3k_cuda_ctx *cx, cublasLtMatmulDesc_t op, const void *a,
                           cublasLtMatrixLayout_t la, const void *b, cublasLtMatrixLayout_t lb,
                           void *c, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *cand,
                           int nc, float *best_us, float *first_us) {
  cublasLtHandle_t lt = (cublasLtHandle_t)cx->lt;
  float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int best = -1;
  float tbest = 0.0f;
  *first_us = -1.0f;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto done;
  for (int i = 0; i < nc; i++) {
    bool ok = cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &cand[i],
                             cx->lt_ws, cx->lt_ws_bytes, cx->stream) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(e0, cx->stream) == cudaSuccess;
    for (int r = 0; ok && r < 3; r++)
      ok = cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &cand[i], cx->lt_ws,
                          cx->lt_ws_bytes, cx->stream) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(e1, cx->stream) == cudaSuccess &&
         cudaEventSynchronize(e1) == cudaSuccess;
    float ms = 0.0f;
    if (!ok || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      (void)cudaGetLastError(); /* a rejected candidate leaves no sticky error */
      continue;
    }
    float us = ms * 1e3f / 3.0f;
    if (i == 0) *first_us = us;
    if (best < 0 || us < tbest) {
      best = i;
      tbest = us;
    }
  }
  if (best > 0 && *first_us > 0 && tbest > 0.97f * *first_us) {
    best = 0;
    tbest = *first_us;
  }
done:
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  *best_us = tbest;
  return best;
}

/* ptrs: a, b and c are device arrays of `batch` matrix pointers (CUBLASLT_BATCH_MODE_POINTER_ARRAY;
 * strides unused, every matrix 16-byte aligned); else strided batches. */
static int lt_gemm(k3k_cuda_ctx *cx, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   const void *a, int type_a, int64_t lda, int64_t stride_a, const void *b,
                   int type_b, int64_t ldb, int64_t stride_b, void *c, int type_c, int64_t ldc,
                   int64_t stride_c, int batch, bool ptrs) {
  int rc = 0;
  cublasLtHandle_t lt = (cublasLtHandle_t)cx->lt;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  float alpha = 1.0f, beta = 0.0f;
  uint32_t al_a = ptrs ? 16 : align_of(a), al_b = ptrs ? 16 : align_of(b), al_c = ptrs ? 16 : align_of(c);
  cublasLtMatmulAlgo_t algo;
  unsigned slot;
  if (ptrs) stride_a = stride_b = stride_c = -1; /* distinct cache keys for the pointer mode */
  int64_t key[16] = {trans_a, trans_b, m, n, k, type_a, type_b, type_c, lda, ldb, ldc,
                     stride_a, stride_b, stride_c, batch, (int64_t)(al_a | al_b << 9 | (int64_t)al_c << 18)};
  algo_slot *g_algos = (algo_slot *)cx->algo_cache;
  bool have = find_algo(g_algos, key, &algo, &slot);

  LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  LT_CHECK(cublasLtMatrixLayoutCreate(&la, (cudaDataType_t)type_a, trans_a ? k : m,
                                      trans_a ? m : k, lda));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lb, (cudaDataType_t)type_b, trans_b ? n : k,
                                      trans_b ? k : n, ldb));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lc, (cudaDataType_t)type_c, m, n, ldc));
  if (ptrs) {
    int32_t bc = batch;
    uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    cublasLtMatrixLayout_t lay[3] = {la, lb, lc};
    for (int i = 0; i < 3; i++) {
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
    }
  } else if (batch > 1) {
    int32_t bc = batch;
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride_a, sizeof stride_a));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride_b, sizeof stride_b));
    LT_CHECK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride_c, sizeof stride_c));
  }
  if (!have) {
    cublasLtMatmulHeuristicResult_t res[8];
    cublasLtMatmulAlgo_t cand[TUNE_MAX];
    int found = 0, nc = 0;
    bool tune = !ptrs && tune_wanted(cx, m, n, k, batch);
    if (tune) { /* repeated runs must not feed the output back into an input */
      uintptr_t alo, ahi, blo, bhi, clo, chi;
      extent(a, trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch, type_a, &alo, &ahi);
      extent(b, trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch, type_b, &blo, &bhi);
      extent(c, m, n, ldc, stride_c, batch, type_c, &clo, &chi);
      if ((clo < ahi && alo < chi) || (clo < bhi && blo < chi)) tune = false;
    }
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &cx->lt_ws_bytes, sizeof cx->lt_ws_bytes));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &al_a, sizeof al_a));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &al_b, sizeof al_b));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &al_c, sizeof al_c));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &al_c, sizeof al_c));
    cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, tune ? 8 : 1, res, &found);
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) {
      K3_ERROR("cublasLt: cublasLtMatmulAlgoGetHeuristic failed: status %d", (int)hs);
      rc = K3_EDEVICE;
      goto out;
    }
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED || found < 1) { /* e.g. operands too poorly aligned: the GEMM op then copies them */
      K3_WARN("cublasLt: no algorithm for m=%lld n=%lld k=%lld types %d/%d/%d alignments "
              "%u/%u/%u", (long long)m, (long long)n, (long long)k, type_a, type_b, type_c,
              al_a, al_b, al_c);
      rc = K3_ENOTSUP;
      goto out;
    }
    for (int i = 0; i < found; i++) cand[nc++] = res[i].algo;
    /* Split-K variants (2, 4, 8, 16; fp32 reduction in the workspace) of the first two picks:
     * what decode-shaped products (small m or n, long k) lack most. Kept only when cuBLASLt
     * accepts the config. */
    static const int32_t splits[] = {2, 4, 8, 16};
    for (int s = 0; tune && s < 8 && s / 4 < found && nc < TUNE_MAX; s++) {
      cublasLtMatmulAlgo_t v = res[s / 4].algo;
      int32_t sk = splits[s % 4];
      uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      cublasLtMatmulHeuristicResult_t chk;
      if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                               sizeof sk) != CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                               sizeof red) != CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoCheck(lt, op, la, lb, lc, lc, &v, &chk) != CUBLAS_STATUS_SUCCESS ||
          chk.workspaceSize > cx->lt_ws_bytes)
        continue;
      cand[nc++] = v;
    }
    int pick = 0;
    if (tune && nc > 1) {
      float best_us = 0, first_us = 0;
      pick = time_candidates(cx, op, a, la, b, lb, c, lc, cand, nc, &best_us, &first_us);
      if (pick < 0) pick = 0;
      K3_DEBUG("gemm tune m=%lld n=%lld k=%lld batch=%d: %d candidates (%d heuristic), pick %d "
               "%.1f us, heuristic first %.1f us", (long long)m, (long long)n, (long long)k,
               batch, nc, found, pick, best_us, first_us);
    }
    algo = cand[pick];
    memcpy(g_algos[slot].key, key, sizeof key);
    g_algos[slot].algo = algo;
    g_algos[slot].used = true;
  }
  LT_CHECK(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &algo, cx->lt_ws,
                          cx->lt_ws_bytes, cx->stream));
out:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return rc;
}

int k3k_cuda_lt_gemm(k3k_cuda_ctx *cx, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, const void *a, int type_a, int64_t lda, int64_t stride_a,
                     const void *b, int type_b, int64_t ldb, int64_t stride_b, void *c,
                     int type_c, int64_t ldc, int64_t stride_c, int batch) {
  return lt_gemm(cx, trans_a, trans_b, m, n, k, a, type_a, lda, stride_a, b, type_b, ldb, stride_b,
                 c, type_c, ldc, stride_c, batch, false);
}

int k3k_cuda_lt_gemm_ptrs(k3k_cuda_ctx *cx, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, const void *const *a, int type_a, int64_t lda,
                          const void *const *b, int type_b, int64_t ldb, void *const *c,
                          int type_c, int64_t ldc, int batch) {
  if (batch < 1) return K3_EINVAL;
  return lt_gemm(cx, trans_a, trans_b, m, n, k, a, type_a, lda, 0, b, type_b, ldb, 0, (void *)c,
                 type_c, ldc, 0, batch, true);
}

static int cuda_type(k3k_dtype_t dt) { return dt == K3K_F32 ? CUDA_R_32F : CUDA_R_16BF; }

/* Every F32/BF16 combination and any strides (k3k_op_validate checks the rest). */
bool k3k_cuda_gemm_ok(const k3k_tensor_t *const *t) {
  for (int i = 0; i < 3; i++)
    if (t[i]->dtype != K3K_F32 && t[i]->dtype != K3K_BF16) return false;
  return true;
}

/* Can cuBLASLt read/write this [rows, cols] operand in place as dtype `dt`? */
static bool direct(const k3k_tensor_t *v, k3k_dtype_t dt) {
  return v->dtype == dt && (v->stride[1] == 1 || v->shape[1] == 1) &&
         v->stride[0] >= v->shape[1] && v->stride[0] >= 1;
}

/* dst[r][c] = src[r][c] converted (F32/BF16, one rounding when dst is BF16), any strides. */
__global__ void gemm_cvt_kernel(dv src, dv dst, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * blockDim.x)
      dv_st(dst, r * dst.s[0] + c * dst.s[1], dv_ld(src, r * src.s[0] + c * src.s[1]));
}

static int cvt(k3k_cuda_ctx *cx, dv src, dv dst, int64_t rows, int64_t cols) {
  int64_t gx = (cols + 255) / 256;
  dim3 grid((unsigned)(gx > 1024 ? 1024 : gx), (unsigned)(rows > 65535 ? 65535 : rows));
  gemm_cvt_kernel<<<grid, 256, 0, cx->stream>>>(src, dst, rows, cols);
  K3K_LAUNCHED("gemm_cvt");
  return 0;
}

/* A contiguous [rows, cols] view of scratch memory, for dv. */
static dv scratch_dv(void *p, int64_t cols, k3k_dtype_t dt) {
  dv v;
  v.p = (char *)p;
  v.s[0] = cols;
  v.s[1] = 1;
  v.s[2] = v.s[3] = 0;
  v.dt = dt == K3K_F32 ? 0 : 1;
  return v;
}

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

int k3k_cuda_gemm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  int64_t M = x->shape[0], K = x->shape[1], N = w->shape[0];
  if (M == 0 || N == 0) return 0;
  if (K == 0) {
    /* Empty reduction: y = 0 (cuBLASLt rejects k = 0). Rows may be strided; so may columns. */
    if (y->stride[1] == 1) {
      K3K_CU(cudaMemset2DAsync(y->data, y->stride[0] * k3k_dtype_size(y->dtype), 0,
                               N * k3k_dtype_size(y->dtype), M, cx->stream));
      return 0;
    }
    void *z;
    int rc = k3k_cuda_scratch(cx, (size_t)N * 4, &z);
    if (rc) return rc;
    K3K_CU(cudaMemsetAsync(z, 0, (size_t)N * 4, cx->stream));
    dv zs = scratch_dv(z, N, K3K_F32);
    zs.s[0] = 0; /* every row reads the same zeros */
    return cvt(cx, zs, mkdv(y), M, N);
  }
  /* Decode shapes (M <= 16, bf16 weights): the weight-streaming kernel of gemv.cu. */
  if (k3k_cuda_gemv_wanted(t)) return k3k_cuda_gemv(cx, t, 0, 0, 0);
  /* Compute dtype: BF16 tensor cores when both inputs are BF16, else exact fp32. */
  k3k_dtype_t ct = (x->dtype == K3K_BF16 && w->dtype == K3K_BF16) ? K3K_BF16 : K3K_F32;
  bool dx = direct(x, ct), dw = direct(w, ct);
  bool dy = (y->dtype == K3K_F32 || ct == K3K_BF16) && direct(y, y->dtype);
  if (dx && dw && dy) {
    int rc = k3k_cuda_lt_gemm(cx, 1, 0, N, M, K, w->data, cuda_type(w->dtype), w->stride[0], 0,
                              x->data, cuda_type(x->dtype), x->stride[0], 0, y->data,
                              cuda_type(y->dtype), y->stride[0], 0, 1);
    if (rc != K3_ENOTSUP) return rc;
    dx = dw = dy = false; /* no algorithm for these alignments: copy everything */
  }
  /* Fallback: operands cuBLASLt cannot take as they are go through contiguous scratch. */
  size_t es = k3k_dtype_size(ct);
  size_t bx = dx ? 0 : up256((size_t)(M * K) * es), bw = dw ? 0 : up256((size_t)(N * K) * es);
  size_t by = dy ? 0 : up256((size_t)(M * N) * 4);
  char *s;
  int rc = k3k_cuda_scratch(cx, bx + bw + by, (void **)&s);
  if (rc) return rc;
  const void *px = x->data, *pw = w->data;
  int64_t ldx = x->stride[0], ldw = w->stride[0];
  if (!dx) {
    if ((rc = cvt(cx, mkdv(x), scratch_dv(s, K, ct), M, K))) return rc;
    px = s, ldx = K;
  }
  if (!dw) {
    if ((rc = cvt(cx, mkdv(w), scratch_dv(s + bx, K, ct), N, K))) return rc;
    pw = s + bx, ldw = K;
  }
  void *py = dy ? y->data : (void *)(s + bx + bw);
  int ty = dy ? cuda_type(y->dtype) : CUDA_R_32F;
  int64_t ldy = dy ? y->stride[0] : N;
  rc = k3k_cuda_lt_gemm(cx, 1, 0, N, M, K, pw, cuda_type(ct), ldw, 0, px, cuda_type(ct), ldx, 0,
                        py, ty, ldy, 0, 1);
  if (rc || dy) return rc;
  return cvt(cx, scratch_dv(py, N, K3K_F32), mkdv(y), M, N);
}
