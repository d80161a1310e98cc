/* The "cpu-fast" GEMM: y[m][n] = Σ_k x[m][k]·W[n][k] with x converted once to fp32, W packed
 * per task into fp32 panels of NR=8 output columns ([K][8], k-major), and a 6×8 register block
 * whose inner loop runs over the 8 columns (the compiler vectorises it). Each output is still
 * one fp32 accumulator summed in increasing k with separate multiply and add (no FMA: ISO C17
 * means -ffp-contract=off), so results are BIT-IDENTICAL to the reference. Tasks are groups of
 * panels spread over the pool. MXFP4 weights are dequantised into the panel (exact), so the
 * MXFP4 GEMM is bit-identical too. Not here: M-blocking for huge prefill batches or AVX
 * dispatch (the build targets baseline x86-64 / SSE2). */
#include <stdlib.h>
#include <string.h>

#include "fast/fast.h"

#define NR 8
#define MR 6

/* GCC vector extension: lane-wise fp32 arithmetic, the same IEEE operations as scalar code. */
typedef float v4f __attribute__((vector_size(16)));
static inline v4f ld4(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline v4f splat(float x) { return (v4f){x, x, x, x}; }
#define PANELS_PER_TASK 4

typedef struct {
  const k3k_tensor_t *X, *W, *S, *Y;
  bool mx;
  int64_t M, K, N;
  const float *xf;  /* [M][K] fp32 */
  float *packs;     /* per worker: K*NR floats */
} gemm_ctx_t;

static void pack_panel(const gemm_ctx_t *c, int64_t n0, int64_t nn, float *wp) {
  const int64_t K = c->K;
  for (int64_t j = 0; j < NR; j++) {
    if (j >= nn) {
      for (int64_t k = 0; k < K; k++) wp[k * NR + j] = 0.0f;
      continue;
    }
    int64_t n = n0 + j;
    if (c->mx) {
      const uint8_t *pk = (const uint8_t *)c->W->data + n * c->W->stride[0];
      const uint8_t *sc = (const uint8_t *)c->S->data + n * c->S->stride[0];
      for (int64_t k = 0; k < K; k++) {
        uint8_t b = pk[(k >> 1) * c->W->stride[1]];
        uint8_t code = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0x0F);
        wp[k * NR + j] = k3k_e2m1_table[code] * k3k_e8m0(sc[(k >> 5) * c->S->stride[1]]);
      }
    } else if (c->W->dtype == K3K_BF16) {
      const uint16_t *w = (const uint16_t *)c->W->data + n * c->W->stride[0];
      for (int64_t k = 0; k < K; k++) wp[k * NR + j] = k3_bf16_to_f32(w[k * c->W->stride[1]]);
    } else {
      const float *w = (const float *)c->W->data + n * c->W->stride[0];
      for (int64_t k = 0; k < K; k++) wp[k * NR + j] = w[k * c->W->stride[1]];
    }
  }
}

static void gemm_task(void *ctx, int64_t task, int worker) {
  const gemm_ctx_t *c = ctx;
  const int64_t K = c->K, M = c->M;
  float *wp = c->packs + (size_t)worker * (size_t)K * NR;
  for (int64_t pnl = task * PANELS_PER_TASK; pnl < (task + 1) * PANELS_PER_TASK; pnl++) {
    int64_t n0 = pnl * NR;
    if (n0 >= c->N) return;
    int64_t nn = c->N - n0 < NR ? c->N - n0 : NR;
    pack_panel(c, n0, nn, wp);
    int64_t m = 0;
    /* 6×8 register block: 12 accumulators + 2 weight vectors + 1 broadcast = 15 xmm. */
    for (; m + MR <= M; m += MR) {
      v4f acc[MR][2];
      for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = splat(0.0f);
      const float *x0 = c->xf + m * K;
      for (int64_t k = 0; k < K; k++) {
        v4f w0 = ld4(wp + k * NR), w1 = ld4(wp + k * NR + 4);
        for (int r = 0; r < MR; r++) {
          v4f b = splat(x0[r * K + k]);
          acc[r][0] += b * w0;
          acc[r][1] += b * w1;
        }
      }
      for (int r = 0; r < MR; r++)
        for (int64_t j = 0; j < nn; j++) k3k_st(c->Y, k3k_off2(c->Y, m + r, n0 + j), acc[r][j >> 2][j & 3]);
    }
    for (; m < M; m++) {
      v4f a0 = splat(0.0f), a1 = splat(0.0f);
      const float *x0 = c->xf + m * K;
      for (int64_t k = 0; k < K; k++) {
        v4f b = splat(x0[k]);
        a0 += b * ld4(wp + k * NR);
        a1 += b * ld4(wp + k * NR + 4);
      }
      for (int64_t j = 0; j < nn; j++) k3k_st(c->Y, k3k_off2(c->Y, m, n0 + j), j < 4 ? a0[j] : a1[j - 4]);
    }
  }
}

int k3k_fast_gemm(k3k_pool_t *pool, const k3k_tensor_t *const *t, bool mx) {
  gemm_ctx_t c = {.X = t[0], .W = t[1], .mx = mx};
  c.S = mx ? t[2] : NULL;
  c.Y = mx ? t[3] : t[2];
  c.M = c.X->shape[0];
  c.K = c.X->shape[1];
  c.N = c.W->shape[0];
  if (mx) {
    for (int64_t n = 0; n < c.N; n++)
      for (int64_t g = 0; g < c.S->shape[1]; g++)
        if (((const uint8_t *)c.S->data)[n * c.S->stride[0] + g * c.S->stride[1]] == 0xFF)
          return K3_EINVAL;
  }
  if (c.M == 0 || c.N == 0) return 0;
  int nw = k3k_pool_threads(pool);
  float *xf = malloc((size_t)(c.M * c.K + 1) * sizeof *xf);
  float *packs = malloc((size_t)nw * (size_t)(c.K * NR + 1) * sizeof *packs);
  if (!xf || !packs) {
    free(xf);
    free(packs);
    return K3_ENOMEM;
  }
  for (int64_t m = 0; m < c.M; m++)
    for (int64_t k = 0; k < c.K; k++) xf[m * c.K + k] = k3k_ld(c.X, k3k_off2(c.X, m, k));
  c.xf = xf;
  c.packs = packs;
  int64_t panels = (c.N + NR - 1) / NR;
  k3k_pool_run(pool, (panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK, gemm_task, &c);
  free(xf);
  free(packs);
  return 0;
}
