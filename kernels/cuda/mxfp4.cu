/* MXFP4 ops on CUDA: MXFP4_GEMM, MXFP4_DEQUANT, the scale check, and the CUDA-core fallback.
 *
 * What it is for: the op entries of K3K_OP_MXFP4_GEMM / K3K_OP_MXFP4_DEQUANT with W kept in the
 * checkpoint's packed layout (spec §6). MXFP4_GEMM with bf16 x and K % 128 == 0, N % 16 == 0
 * goes to the tensor-core grouped kernels (mxfp4_tc.cu, one expert); F32 x (fp32 model mode)
 * or other shapes take a simple CUDA-core kernel with the same results up to summation order.
 * What it is not: the grouped W4A16 kernels themselves (mxfp4_tc.cu).
 * Invariants: E8M0 0xFF is rejected by the ops (scales checked first, one synchronisation), and
 * a rejected call writes nothing. */
#include <string.h>

#include "cuda_common.cuh"
#include "moe_ops.h"

/* ---- scale check, generic kernels, ops ---- */
__global__ void mx_check_kernel(const uint8_t *s, int64_t rows, int64_t cols, int64_t ld,
                                int *bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
       i += (int64_t)gridDim.x * blockDim.x)
    if (s[(i / cols) * ld + i % cols] == 0xFF) *bad = 1;
}
int k3k_cu_mx_check(cudaStream_t st, const uint8_t *scale, int64_t rows, int64_t cols, int64_t ld,
                    int *bad) {
  if (rows * cols == 0) return 0;
  unsigned gx = k3k_ceil_div((size_t)(rows * cols), 256);
  mx_check_kernel<<<gx > 1024 ? 1024 : gx, 256, 0, st>>>(scale, rows, cols, ld, bad);
  K3K_LAUNCHED("mxfp4_check");
  return 0;
}

__device__ __forceinline__ float mx_val(const uint8_t *P, int64_t ps1, const uint8_t *S,
                                        int64_t ss1, int64_t k) {
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint8_t b = P[(k >> 1) * ps1];
  uint8_t code = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
  float v = e2m1[code & 7];
  if (code & 8) v = -v;
  uint8_t s = S[(k >> 5) * ss1];
  return s == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(v, (int)s - 127);
}

/* One warp per (token m, row n): fp32 x and any strides. */
__global__ void mx_gemm_generic(dv x, const uint8_t *P, int64_t ps0, int64_t ps1, const uint8_t *S,
                                int64_t ss0, int64_t ss1, dv y, int64_t N, int64_t K) {
  int64_t n = blockIdx.x * 8 + (threadIdx.x >> 5), m = blockIdx.y;
  int lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc = 0.0f;
  for (int64_t k = lane; k < K; k += 32)
    acc += dv_ld(x, m * x.s[0] + k * x.s[1]) * mx_val(P + n * ps0, ps1, S + n * ss0, ss1, k);
  acc = warp_sum(acc);
  if (lane == 0) dv_st(y, m * y.s[0] + n * y.s[1], acc);
}

__global__ void mx_dequant_kernel(const uint8_t *P, int64_t ps0, int64_t ps1, const uint8_t *S,
                                  int64_t ss0, int64_t ss1, dv w, int64_t N, int64_t K) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * K;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n = i / K, k = i % K;
    dv_st(w, n * w.s[0] + k * w.s[1], mx_val(P + n * ps0, ps1, S + n * ss0, ss1, k));
  }
}

static int check_then(k3k_cuda_ctx *cx, const k3k_tensor_t *S, int **flag) {
  int rc = k3k_cuda_scratch(cx, sizeof(int), (void **)flag);
  if (rc) return rc;
  K3K_CU(cudaMemsetAsync(*flag, 0, sizeof(int), cx->stream));
  if (S->stride[1] != 1) { /* the check kernel reads rows of contiguous bytes */
    for (int64_t c = 0; c < S->shape[1]; c++) {
      rc = k3k_cu_mx_check(cx->stream, (const uint8_t *)S->data + c * S->stride[1], S->shape[0], 1,
                           S->stride[0], *flag);
      if (rc) return rc;
    }
    return 0;
  }
  return k3k_cu_mx_check(cx->stream, (const uint8_t *)S->data, S->shape[0], S->shape[1],
                         S->stride[0], *flag);
}
static int finish_flag(k3k_cuda_ctx *cx, int *flag) {
  int bad = 0;
  K3K_CU(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  return bad ? K3_EINVAL : 0;
}

/* Scales are checked first (one synchronisation) so a bad scale writes nothing. */
int k3k_cuda_mxfp4_gemm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *P = t[1], *S = t[2], *y = t[3];
  int64_t M = x->shape[0], K = x->shape[1], N = P->shape[0];
  int *flag;
  int rc = check_then(cx, S, &flag);
  if (!rc) rc = finish_flag(cx, flag);
  if (rc || M == 0 || N == 0) return rc;
  bool fast = x->dtype == K3K_BF16 && x->stride[1] == 1 && x->stride[0] % 8 == 0 &&
              !((uintptr_t)x->data & 15) && P->stride[1] == 1 && P->stride[0] % 16 == 0 &&
              !((uintptr_t)P->data & 15) && S->stride[1] == 1 && y->stride[1] == 1 &&
              K % 128 == 0 && N % 16 == 0 && M <= INT32_MAX;
  if (fast) {
    k3k_cu_moe_gemm_args a;
    memset(&a, 0, sizeof a);
    a.w.packed_base = (const uint8_t *)P->data;
    a.w.scale_base = (const uint8_t *)S->data;
    a.w.ld_packed = P->stride[0];
    a.w.ld_scale = S->stride[0];
    a.N = (int32_t)N;
    a.K = (int32_t)K;
    a.x = (const uint16_t *)x->data;
    a.ldx = x->stride[0];
    a.y = y->data;
    a.ldy = y->stride[0];
    a.y_f32 = y->dtype == K3K_F32;
    a.max_active = 1;
    a.single_rows = (int32_t)M;
    a.rows_hint = (int32_t)(M > INT32_MAX ? INT32_MAX : M);
    return k3k_cu_moe_gemm(cx->stream, &a);
  }
  for (int64_t m0 = 0; m0 < M; m0 += 65535) {
    int64_t mm = M - m0 < 65535 ? M - m0 : 65535;
    dv xv = mkdv(x), yv = mkdv(y);
    xv.p += m0 * x->stride[0] * (int64_t)k3k_dtype_size(x->dtype);
    yv.p += m0 * y->stride[0] * (int64_t)k3k_dtype_size(y->dtype);
    dim3 grid(k3k_ceil_div((size_t)N, 8), (unsigned)mm);
    mx_gemm_generic<<<grid, 256, 0, cx->stream>>>(xv, (const uint8_t *)P->data, P->stride[0],
                                                  P->stride[1], (const uint8_t *)S->data,
                                                  S->stride[0], S->stride[1], yv, N, K);
    K3K_LAUNCHED("mxfp4_gemm_generic");
  }
  return 0;
}

int k3k_cuda_mxfp4_dequant(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *P = t[0], *S = t[1], *W = t[2];
  int64_t N = W->shape[0], K = W->shape[1];
  int *flag;
  int rc = check_then(cx, S, &flag);
  if (!rc) rc = finish_flag(cx, flag);
  if (rc || N * K == 0) return rc;
  unsigned gx = k3k_ceil_div((size_t)(N * K), 256);
  mx_dequant_kernel<<<gx > 8192 ? 8192 : gx, 256, 0, cx->stream>>>(
      (const uint8_t *)P->data, P->stride[0], P->stride[1], (const uint8_t *)S->data, S->stride[0],
      S->stride[1], mkdv(W), N, K);
  K3K_LAUNCHED("mxfp4_dequant");
  return 0;
}
