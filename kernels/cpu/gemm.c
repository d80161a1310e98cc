/* Reference GEMMs: GEMM (y = x·Wᵀ, nn.Linear convention) and the MXFP4 dequantising GEMM of
 * spec §6, plus MXFP4_DEQUANT. fp32 accumulation in increasing k order: this order is part of
 * the contract ("cpu-fast" keeps it and is bit-identical). Any strides on x, W and y.
 * When x and W rows are contiguous (the runner's case) the same sums run four outputs at a time
 * (rows4_*): each output keeps its own accumulator, added to in increasing k with separate
 * multiply and add, so the result is bit-identical to the one-output loop; interleaving only
 * lets four dependent add chains overlap instead of waiting on one. */
#include <stdlib.h>

#include "core/k3k_internal.h"

/* E2M1: bits s e1 e0 m; codes 0..7 positive, 8..15 the same magnitudes negated. */
const float k3k_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Four sums Σ_k x[k]·w_j[k] (j = 0..3), each in increasing k; w rows fp32 or bf16. */
static void rows4_f32(const float *x, const float *const w[4], int64_t K, float a[4]) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  for (int64_t k = 0; k < K; k++) {
    float xv = x[k];
    a0 += xv * w[0][k];
    a1 += xv * w[1][k];
    a2 += xv * w[2][k];
    a3 += xv * w[3][k];
  }
  a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
}
static void rows4_bf16(const float *x, const uint16_t *const w[4], int64_t K, float a[4]) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  for (int64_t k = 0; k < K; k++) {
    float xv = x[k];
    a0 += xv * k3k_bf16f(w[0][k]);
    a1 += xv * k3k_bf16f(w[1][k]);
    a2 += xv * k3k_bf16f(w[2][k]);
    a3 += xv * k3k_bf16f(w[3][k]);
  }
  a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
}

/* x [M,K] as fp32 rows: X's own memory when F32 with contiguous rows, else a converted copy
 * in *own (caller frees). NULL on allocation failure. */
static const float *x_f32(const k3k_tensor_t *X, float **own) {
  int64_t M = X->shape[0], K = X->shape[1];
  *own = NULL;
  if (X->dtype == K3K_F32 && (X->stride[1] == 1 || K <= 1) && (X->stride[0] == K || M <= 1))
    return X->data;
  float *xf = malloc((size_t)(M * K > 0 ? M * K : 1) * sizeof *xf);
  if (!xf) return NULL;
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) xf[m * K + k] = k3k_ld(X, k3k_off2(X, m, k));
  *own = xf;
  return xf;
}

/* GEMM with contiguous W rows: output columns in blocks of four (rows4_*), the N % 4 tail one
 * at a time; m inner so the block's W rows stay in cache. */
static int gemm_contig(const k3k_tensor_t *X, const k3k_tensor_t *W, const k3k_tensor_t *Y) {
  int64_t M = X->shape[0], K = X->shape[1], N = W->shape[0];
  float *own;
  const float *xf = x_f32(X, &own);
  if (!xf) return K3_ENOMEM;
  const bool bf = W->dtype == K3K_BF16;
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) {
    const void *wr[4];
    for (int j = 0; j < 4; j++)
      wr[j] = (const char *)W->data + (size_t)((n + j) * W->stride[0]) * (bf ? 2 : 4);
    for (int64_t m = 0; m < M; m++) {
      float a[4];
      if (bf)
        rows4_bf16(xf + m * K, (const uint16_t *const *)wr, K, a);
      else
        rows4_f32(xf + m * K, (const float *const *)wr, K, a);
      for (int j = 0; j < 4; j++) k3k_st(Y, k3k_off2(Y, m, n + j), a[j]);
    }
  }
  for (; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++) acc += xf[m * K + k] * k3k_ld(W, n * W->stride[0] + k);
      k3k_st(Y, k3k_off2(Y, m, n), acc);
    }
  free(own);
  return 0;
}

/* GEMM: x [M,K], W [N,K] → y [M,N];  y[m][n] = Σ_k x[m][k]·W[n][k]. */
int k3k_cpu_gemm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *X = t[0], *W = t[1], *Y = t[2];
  int64_t M = X->shape[0], K = X->shape[1], N = W->shape[0];
  if (W->stride[1] == 1 || K <= 1) return gemm_contig(X, W, Y);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++)
        acc += k3k_ld(X, k3k_off2(X, m, k)) * k3k_ld(W, k3k_off2(W, n, k));
      k3k_st(Y, k3k_off2(Y, m, n), acc);
    }
  return 0;
}

static int check_scales(const k3k_tensor_t *S) {
  for (int64_t n = 0; n < S->shape[0]; n++)
    for (int64_t g = 0; g < S->shape[1]; g++)
      if (((const uint8_t *)S->data)[n * S->stride[0] + g * S->stride[1]] == 0xFF)
        return K3_EINVAL; /* E8M0 NaN */
  return 0;
}

/* W[n][k] of a packed MXFP4 matrix: nibble (k even: low, odd: high) of packed[n][k/2] through
 * the E2M1 table, times 2^(scale[n][k/32] − 127). Exact in fp32. */
static inline float mx_w(const k3k_tensor_t *Pk, const k3k_tensor_t *S, int64_t n, int64_t k) {
  uint8_t b = ((const uint8_t *)Pk->data)[n * Pk->stride[0] + (k >> 1) * Pk->stride[1]];
  uint8_t code = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0x0F);
  uint8_t e = ((const uint8_t *)S->data)[n * S->stride[0] + (k >> 5) * S->stride[1]];
  return k3k_e2m1_table[code] * k3k_e8m0(e);
}

/* MXFP4_GEMM: x [M,K], packed [N,K/2], scale [N,K/32] → y [M,N]; y = x·dequant(W)ᵀ.
 * Four rows of W at a time are dequantised (exactly) into wr[4][K] and reused for every m; each
 * output is the same increasing-k fp32 sum as GEMM's. */
int k3k_cpu_mxfp4_gemm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *X = t[0], *Pk = t[1], *S = t[2], *Y = t[3];
  int rc = check_scales(S);
  if (rc) return rc;
  int64_t M = X->shape[0], K = X->shape[1], N = Pk->shape[0];
  float *own, *wr = malloc((size_t)(4 * K > 0 ? 4 * K : 1) * sizeof *wr);
  const float *xf = x_f32(X, &own);
  if (!wr || !xf) {
    free(wr);
    free(own);
    return K3_ENOMEM;
  }
  for (int64_t n0 = 0; n0 < N; n0 += 4) {
    int64_t nn = N - n0 < 4 ? N - n0 : 4;
    for (int64_t j = 0; j < 4; j++)
      for (int64_t k = 0; k < K; k++) wr[j * K + k] = j < nn ? mx_w(Pk, S, n0 + j, k) : 0.0f;
    const float *w4[4] = {wr, wr + K, wr + 2 * K, wr + 3 * K};
    for (int64_t m = 0; m < M; m++) {
      float a[4];
      rows4_f32(xf + m * K, w4, K, a);
      for (int64_t j = 0; j < nn; j++) k3k_st(Y, k3k_off2(Y, m, n0 + j), a[j]);
    }
  }
  free(wr);
  free(own);
  return 0;
}

/* MXFP4_DEQUANT: packed [N,K/2], scale [N,K/32] → W [N,K]. */
int k3k_cpu_mxfp4_dequant(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *Pk = t[0], *S = t[1], *W = t[2];
  int rc = check_scales(S);
  if (rc) return rc;
  for (int64_t n = 0; n < W->shape[0]; n++)
    for (int64_t k = 0; k < W->shape[1]; k++) k3k_st(W, k3k_off2(W, n, k), mx_w(Pk, S, n, k));
  return 0;
}
