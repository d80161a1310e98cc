/* CUDA: GEMM (y = x · Wᵀ, nn.Linear) through cuBLASLt, and the strided-batched helper the MLA
 * absorption uses.
 *
 * What it is for: every dense bf16 projection of the model (spec §3.1, §4.1, lm_head), with
 * fp32 accumulation (CUBLAS_COMPUTE_32F). BF16·BF16 → BF16 or F32, and F32·F32 → F32 (exact
 * fp32 SGEMM path, for the fp32 reference mode).
 * What it is not: the MXFP4 expert GEMM (issue 9).
 * Invariants: inner strides are 1 (cuda_supports checks); cuBLASLt is told the real alignment
 * of every pointer (its default assumes 256 bytes, and sliced views are less aligned); the
 * chosen algorithm is cached per problem key so steady-state calls skip the heuristic query.
 * Row-major y[M,N] = x[M,K]·W[N,K]ᵀ is the column-major product yᵀ = op_T(W) · xᵀ. */
#include <cublasLt.h>
#include <string.h>

#include "cuda_common.cuh"

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

int k3k_cuda_lt_gemm(k3k_cuda_ctx *cx, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, const void *a, int type_a, int64_t lda, int64_t stride_a,
                     const void *b, int type_b, int64_t ldb, int64_t stride_b, void *c,
                     int type_c, int64_t ldc, int64_t stride_c, int batch) {
  int rc = 0;
  cublasLtHandle_t lt = (cublasLtHandle_t)cx->lt;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  float alpha = 1.0f, beta = 0.0f;
  uint32_t al_a = align_of(a), al_b = align_of(b), al_c = align_of(c);
  cublasLtMatmulAlgo_t algo;
  unsigned slot;
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
  if (batch > 1) {
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
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
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
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found));
    if (found < 1) {
      K3_ERROR("cublasLt: no algorithm for m=%lld n=%lld k=%lld types %d/%d/%d", (long long)m,
               (long long)n, (long long)k, type_a, type_b, type_c);
      rc = K3_EDEVICE;
      goto out;
    }
    algo = res.algo;
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

static int cuda_type(k3k_dtype_t dt) { return dt == K3K_F32 ? CUDA_R_32F : CUDA_R_16BF; }

/* BF16·BF16 → BF16/F32, or F32·F32 → F32; inner strides 1; row strides usable as ld. */
bool k3k_cuda_gemm_ok(const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  if (x->stride[1] != 1 || w->stride[1] != 1 || y->stride[1] != 1) return false;
  if (x->dtype != w->dtype) return false;
  if (x->dtype == K3K_F32 && y->dtype != K3K_F32) return false;
  /* cuBLASLt wants ld >= rows of the stored column-major matrix. */
  return x->stride[0] >= x->shape[1] && w->stride[0] >= w->shape[1] &&
         y->stride[0] >= y->shape[1];
}

int k3k_cuda_gemm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  int64_t M = x->shape[0], K = x->shape[1], N = w->shape[0];
  if (M == 0 || N == 0) return 0;
  if (K == 0) {
    /* Empty reduction: y = 0 (cuBLASLt rejects k = 0). Rows may be strided. */
    K3K_CU(cudaMemset2DAsync(y->data, y->stride[0] * k3k_dtype_size(y->dtype), 0,
                             N * k3k_dtype_size(y->dtype), M, cx->stream));
    return 0;
  }
  return k3k_cuda_lt_gemm(cx, 1, 0, N, M, K, w->data, cuda_type(w->dtype), w->stride[0], 0,
                          x->data, cuda_type(x->dtype), x->stride[0], 0, y->data,
                          cuda_type(y->dtype), y->stride[0], 0, 1);
}
