/* Reference GEMMs: GEMM (y = x·Wᵀ, nn.Linear convention) and the MXFP4 dequantising GEMM of
 * spec §6, plus MXFP4_DEQUANT. fp32 accumulation in increasing k order: this order is part of
 * the contract ("cpu-fast" keeps it and is bit-identical). Any strides on x, W and y. */
#include "core/k3k_internal.h"

/* E2M1: bits s e1 e0 m; codes 0..7 positive, 8..15 the same magnitudes negated. */
const float k3k_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* GEMM: x [M,K], W [N,K] → y [M,N];  y[m][n] = Σ_k x[m][k]·W[n][k]. */
int k3k_cpu_gemm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *X = t[0], *W = t[1], *Y = t[2];
  int64_t M = X->shape[0], K = X->shape[1], N = W->shape[0];
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

/* MXFP4_GEMM: x [M,K], packed [N,K/2], scale [N,K/32] → y [M,N]; y = x·dequant(W)ᵀ. */
int k3k_cpu_mxfp4_gemm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *X = t[0], *Pk = t[1], *S = t[2], *Y = t[3];
  int rc = check_scales(S);
  if (rc) return rc;
  int64_t M = X->shape[0], K = X->shape[1], N = Pk->shape[0];
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++) acc += k3k_ld(X, k3k_off2(X, m, k)) * mx_w(Pk, S, n, k);
      k3k_st(Y, k3k_off2(Y, m, n), acc);
    }
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
