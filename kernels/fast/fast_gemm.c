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

/* GCC vector extension: lane-wise fp32 arithmetic, the same IEEE operations as scalar code.
 * The helpers are always_inline and load through under-aligned vector types (not memcpy) so
 * that Debug/ASan builds (-O0, where memcpy is an intercepted call) stay usable; at -O2 the
 * generated code is the same. */
#define VINL static inline __attribute__((always_inline))
typedef float v4f __attribute__((vector_size(16)));
typedef float v4f_u __attribute__((vector_size(16), aligned(4), may_alias));
VINL v4f ld4(const float *p) { return *(const v4f_u *)p; }
VINL v4f splat(float x) { return (v4f){x, x, x, x}; }
typedef uint16_t v4h __attribute__((vector_size(8)));
typedef uint16_t v4h_u __attribute__((vector_size(8), aligned(2), may_alias));
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
/* 4 consecutive bf16 → fp32 (exact: the bits move to the high half). */
VINL v4f ld4_bf16(const uint16_t *p) {
  v4u u = __builtin_convertvector(*(const v4h_u *)p, v4u) << 16;
  return (v4f)u;
}
/* In-register 4×4 transpose: rows r[j] = W[j][k..k+3] → c[i] = W[0..3][k+i]. */
VINL void tr4(const v4f r[4], v4f c[4]) {
  v4f t0 = __builtin_shuffle(r[0], r[1], (v4i){0, 4, 1, 5});
  v4f t1 = __builtin_shuffle(r[0], r[1], (v4i){2, 6, 3, 7});
  v4f t2 = __builtin_shuffle(r[2], r[3], (v4i){0, 4, 1, 5});
  v4f t3 = __builtin_shuffle(r[2], r[3], (v4i){2, 6, 3, 7});
  c[0] = __builtin_shuffle(t0, t2, (v4i){0, 1, 4, 5});
  c[1] = __builtin_shuffle(t0, t2, (v4i){2, 3, 6, 7});
  c[2] = __builtin_shuffle(t1, t3, (v4i){0, 1, 4, 5});
  c[3] = __builtin_shuffle(t1, t3, (v4i){2, 3, 6, 7});
}
#define PANELS_PER_TASK 4

typedef struct {
  const k3k_tensor_t *X, *W, *S, *Y;
  bool mx;
  bool direct;      /* small M, contiguous W rows: convert W on the fly, no packing */
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
      float s = 0.0f;
      for (int64_t k = 0; k < K; k++) {
        if ((k & 31) == 0) s = k3k_e8m0(sc[(k >> 5) * c->S->stride[1]]);
        uint8_t b = pk[(k >> 1) * c->W->stride[1]];
        uint8_t code = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0x0F);
        wp[k * NR + j] = k3k_e2m1_table[code] * s;
      }
    } else if (c->W->dtype == K3K_BF16) {
      const uint16_t *w = (const uint16_t *)c->W->data + n * c->W->stride[0];
      for (int64_t k = 0; k < K; k++) wp[k * NR + j] = k3k_bf16f(w[k * c->W->stride[1]]);
    } else {
      const float *w = (const float *)c->W->data + n * c->W->stride[0];
      for (int64_t k = 0; k < K; k++) wp[k * NR + j] = w[k * c->W->stride[1]];
    }
  }
}

/* Decode-shaped GEMM (M < MR) on 8 full W rows: per 4 k, load 4 values from each row, convert,
 * transpose in registers, and accumulate k, k+1, k+2, k+3 in that order (so still the reference
 * order); a K % 4 tail continues sequentially. Packing would write and re-read every weight
 * once per call, which dominates when M is 1. */
static void direct_panel(const gemm_ctx_t *c, int64_t n0) {
  const int64_t K = c->K, M = c->M, K4 = K & ~(int64_t)3;
  const bool bf = c->W->dtype == K3K_BF16;
  const char *wb = (const char *)c->W->data;
  const size_t rs = (size_t)c->W->stride[0] * (bf ? 2 : 4);
  v4f acc[MR][2];
  for (int64_t m = 0; m < M; m++) acc[m][0] = acc[m][1] = splat(0.0f);
  for (int64_t k = 0; k < K4; k += 4) {
    v4f r[8], lo[4], hi[4];
    for (int j = 0; j < 8; j++)
      r[j] = bf ? ld4_bf16((const uint16_t *)(wb + (size_t)(n0 + j) * rs) + k)
                : ld4((const float *)(wb + (size_t)(n0 + j) * rs) + k);
    tr4(r, lo);
    tr4(r + 4, hi);
    for (int64_t m = 0; m < M; m++) {
      const float *x = c->xf + m * K + k;
      for (int i = 0; i < 4; i++) {
        v4f b = splat(x[i]);
        acc[m][0] += b * lo[i];
        acc[m][1] += b * hi[i];
      }
    }
  }
  for (int64_t m = 0; m < M; m++) {
    float a[NR];
    for (int j = 0; j < NR; j++) a[j] = acc[m][j >> 2][j & 3];
    for (int64_t k = K4; k < K; k++)
      for (int j = 0; j < NR; j++) {
        const char *row = wb + (size_t)(n0 + j) * rs;
        float w = bf ? k3k_bf16f(((const uint16_t *)row)[k]) : ((const float *)row)[k];
        a[j] += c->xf[m * K + k] * w;
      }
    for (int j = 0; j < NR; j++) k3k_st(c->Y, k3k_off2(c->Y, m, n0 + j), a[j]);
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
    if (c->direct && nn == NR) {
      direct_panel(c, n0);
      continue;
    }
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
  c.direct = !mx && c.M < MR && (c.W->stride[1] == 1 || c.K <= 1);
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
  /* work: the multiply-adds, plus the panel packing (once per weight, MXFP4 or M >= MR) */
  int64_t work = c.M * c.N * c.K + (c.direct ? 0 : c.N * c.K);
  k3k_pool_run_work(pool, (panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK, work, gemm_task, &c);
  free(xf);
  free(packs);
  return 0;
}
