/* Reference elementwise ops: COPY, ADD, SIGMOID, SIGMOID_MUL (MLA output gate), SITU, SILU_MUL.
 * All math in fp32; the output tensor's dtype is the (only) rounding point except where
 * SIGMOID_MUL's bf16_inner asks for the two inner roundings of spec §8. */
#include <string.h>

#include "core/k3k_internal.h"

/* COPY, any rank up to 4, any strides. F32/BF16 convert through fp32; I32/U8 copy bits. */
int k3k_cpu_copy(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *y = t[1];
  int64_t sh[4] = {1, 1, 1, 1}, sx[4] = {0}, sy[4] = {0};
  int off = 4 - x->ndim;
  for (int d = 0; d < x->ndim; d++) {
    sh[off + d] = x->shape[d];
    sx[off + d] = x->stride[d];
    sy[off + d] = y->stride[d];
  }
  size_t es = k3k_dtype_size(x->dtype);
  bool bits = x->dtype == y->dtype && (x->dtype == K3K_I32 || x->dtype == K3K_U8);
  for (int64_t a = 0; a < sh[0]; a++)
    for (int64_t b = 0; b < sh[1]; b++)
      for (int64_t c = 0; c < sh[2]; c++)
        for (int64_t d = 0; d < sh[3]; d++) {
          int64_t ox = a * sx[0] + b * sx[1] + c * sx[2] + d * sx[3];
          int64_t oy = a * sy[0] + b * sy[1] + c * sy[2] + d * sy[3];
          if (bits)
            memcpy((char *)y->data + oy * es, (const char *)x->data + ox * es, es);
          else
            k3k_st(y, oy, k3k_ld(x, ox));
        }
  return 0;
}

/* Applies f(a, b) over [R,C] views; y may alias a or b (each element is read before written). */
#define EW2(NAME, EXPR)                                                              \
  int k3k_cpu_##NAME(const void *params, const k3k_tensor_t *const *t) {             \
    const k3k_tensor_t *A = t[0], *B = t[1], *Y = t[2];                              \
    for (int64_t r = 0; r < A->shape[0]; r++)                                        \
      for (int64_t c = 0; c < A->shape[1]; c++) {                                    \
        float a = k3k_ld(A, k3k_off2(A, r, c)), b = k3k_ld(B, k3k_off2(B, r, c));    \
        k3k_st(Y, k3k_off2(Y, r, c), (EXPR));                                        \
      }                                                                              \
    return 0;                                                                        \
  }

/* ADD: y = a + b (the residual add P = bf16(P + a) when y is BF16). */
EW2(add, a + b)
/* SILU_MUL (48B FFN): y = silu(gate)·up = gate·sigmoid(gate)·up, fp32, one rounding. */
EW2(silu_mul, a * k3k_sigmoidf(a) * b)

/* SITU (§5.1): y = β·tanh(g/β)·sigmoid(g) · βl·tanh(u/βl). tanh saturates to ±1 for large
 * arguments and sigmoid uses expf(−g), which is inf (→ 0) for very negative g: no NaN. */
int k3k_cpu_situ(const void *params, const k3k_tensor_t *const *t) {
  const k3k_situ_params_t *p = params;
  const k3k_tensor_t *G = t[0], *U = t[1], *Y = t[2];
  for (int64_t r = 0; r < G->shape[0]; r++)
    for (int64_t c = 0; c < G->shape[1]; c++) {
      float g = k3k_ld(G, k3k_off2(G, r, c)), u = k3k_ld(U, k3k_off2(U, r, c));
      float a = p->beta * tanhf(g / p->beta) * k3k_sigmoidf(g);
      float b = p->beta_lin * tanhf(u / p->beta_lin);
      k3k_st(Y, k3k_off2(Y, r, c), a * b);
    }
  return 0;
}

/* SIGMOID: y = 1/(1+exp(−x)) (KDA beta, §3.5). */
int k3k_cpu_sigmoid(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *X = t[0], *Y = t[1];
  for (int64_t r = 0; r < X->shape[0]; r++)
    for (int64_t c = 0; c < X->shape[1]; c++)
      k3k_st(Y, k3k_off2(Y, r, c), k3k_sigmoidf(k3k_ld(X, k3k_off2(X, r, c))));
  return 0;
}

/* SIGMOID_MUL (MLA output gate, §4.1/§8): fp32 x·sigmoid(g), or in bf16 mode the reference's
 * model-dtype arithmetic: s = bf16(sigmoid(g)), y = bf16(bf16(x)·s). */
int k3k_cpu_sigmoid_mul(const void *params, const k3k_tensor_t *const *t) {
  const k3k_sigmoid_mul_params_t *p = params;
  const k3k_tensor_t *X = t[0], *G = t[1], *Y = t[2];
  for (int64_t r = 0; r < X->shape[0]; r++)
    for (int64_t c = 0; c < X->shape[1]; c++) {
      float x = k3k_ld(X, k3k_off2(X, r, c)), g = k3k_ld(G, k3k_off2(G, r, c));
      float y;
      if (p->bf16_inner)
        y = k3_round_bf16(k3_round_bf16(x) * k3_round_bf16(k3k_sigmoidf(g)));
      else
        y = x * k3k_sigmoidf(g);
      k3k_st(Y, k3k_off2(Y, r, c), y);
    }
  return 0;
}
