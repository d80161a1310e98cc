/* The "cpu-fast" GEMM: y[m][n] = Σ_k x[m][k]·W[n][k] with x converted once to fp32, W packed
 * per task into fp32 panels of NR=8 output columns ([K][8], k-major), and a 6×8 register block
 * whose inner loop runs over the 8 columns (the compiler vectorises it). Each output is still
 * one fp32 accumulator summed in increasing k with separate multiply and add (no FMA: ISO C17
 * means -ffp-contract=off), so results are BIT-IDENTICAL to the reference. Tasks are groups of
 * panels spread over the pool. MXFP4 weights are dequantised exactly (E2M1 value × 2^(e−127) in
 * fp32, the reference's own product), so the MXFP4 GEMM is bit-identical too.
 * Decode-shaped calls (M < MR) skip the pack: bf16/f32 rows are converted and transposed in
 * registers (direct_panel); MXFP4 rows with unit inner strides are decoded a byte at a time
 * through a 256-entry byte → (low, high) value table straight into column vectors
 * (mx_direct). Prefill-shaped MXFP4 calls pack with the same decoder (mx_pack). Non-contiguous
 * MXFP4 views and the last partial panel take the element-wise pack_panel.
 * Not here: M-blocking for huge prefill batches or AVX dispatch (the build targets baseline
 * x86-64 / SSE2). */
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
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
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
/* Panels per task (16 output columns): a 1-row 3072×3584 expert GEMM makes 192 tasks, twelve
 * per thread on 16 threads, so the last task to finish idles the others for at most ~1/12 of
 * the call. Panels are packed per panel, so task size does not change the packing work. */
#define PANELS_PER_TASK 2

typedef struct {
  const k3k_tensor_t *X, *W, *S, *Y;
  bool mx;
  bool mx_rows;     /* MXFP4 with unit inner strides on codes and scales: the byte decoder */
  bool direct;      /* small M, contiguous W rows: convert W on the fly, no packing */
  int64_t M, K, N;
  const uint8_t *pk, *sc; /* mx_rows: packed codes and scales, rows pk_rs / sc_rs bytes apart */
  int64_t pk_rs, sc_rs;
  const float *xf;  /* [M][K] fp32 */
  float *packs;     /* per worker: K*NR floats */
} gemm_ctx_t;

/* ---- MXFP4 byte decoder ---- */

/* E2M1 value of a code as a constant expression: magnitudes {0,.5,1,1.5,2,3,4,6}, bit 3 the
 * sign (code 8 is −0.0f, as in k3k_e2m1_table, although a zero's sign cannot reach y: every
 * sum starts at +0). test_kernels' MXFP4 cases use every byte value and compare with "cpu". */
#define E2M1_MAG(c) ((c) < 4 ? (float)(c) * 0.5f : (c) == 7 ? 6.0f : (float)((c) - 2))
#define E2M1_VAL(c) (((c) & 8) ? -E2M1_MAG((c) & 7) : E2M1_MAG((c) & 7))
#define MXP1(b) {E2M1_VAL((b) & 15), E2M1_VAL((b) >> 4)}
#define MXP4(b) MXP1(b), MXP1((b) + 1), MXP1((b) + 2), MXP1((b) + 3)
#define MXP16(b) MXP4(b), MXP4((b) + 4), MXP4((b) + 8), MXP4((b) + 12)
#define MXP64(b) MXP16(b), MXP16((b) + 16), MXP16((b) + 32), MXP16((b) + 48)
/* packed byte → (W[2i], W[2i+1]) before the scale: low nibble first (spec §6). 2 KiB, stays in
 * L1. */
static const float mx_pair[256][2] __attribute__((aligned(64))) = {MXP64(0), MXP64(64),
                                                                    MXP64(128), MXP64(192)};

typedef double v2d __attribute__((vector_size(16)));
typedef double pair_t __attribute__((may_alias)); /* two floats moved as one unit, never added */
/* Byte i of four rows (p, p+rs, p+2rs, p+3rs) → the columns k = 2i and 2i+1 of those rows, each
 * multiplied by the rows' block scales sv: lane-wise the reference's table[code]·2^(e−127). */
VINL void mx_cols(const uint8_t *p, int64_t rs, int i, v4f sv, v4f *ce, v4f *co) {
  /* Each pair is loaded as one 8-byte unit (movsd/movhpd), not two floats. */
  const pair_t *t = (const pair_t *)mx_pair;
  v4f a = (v4f)(v2d){t[p[i]], t[p[rs + i]]}, b = (v4f)(v2d){t[p[2 * rs + i]], t[p[3 * rs + i]]};
  *ce = __builtin_shuffle(a, b, (v4i){0, 2, 4, 6}) * sv;
  *co = __builtin_shuffle(a, b, (v4i){1, 3, 5, 7}) * sv;
}
/* The four block scales 2^(e−127) of rows s, s+rs, s+2rs, s+3rs at block g. */
VINL v4f mx_scales(const uint8_t *s, int64_t rs, int64_t g) {
  return (v4f){k3k_e8m0(s[g]), k3k_e8m0(s[rs + g]), k3k_e8m0(s[2 * rs + g]),
               k3k_e8m0(s[3 * rs + g])};
}

/* Decode-shaped MXFP4 GEMM on the 8 full rows n0.. (two groups of 4): out[m][j] = Σ_k
 * x[m][k]·W[n0+j][k], one accumulator lane per output, k in increasing order (k = 2i before
 * 2i+1 within a byte). M is a constant at every call site, so the loops unroll and acc lives in
 * registers: 2·M independent add chains. (16-row blocks at M = 1, four chains instead of two,
 * measured 1.6× slower, and so did unrolling the byte loop: the extra row pointers and
 * temporaries spill on x86-64's 16 general and 16 xmm registers.) */
VINL void mx_direct_m(const gemm_ctx_t *c, int64_t n0, const int M, float out[MR][NR]) {
  const int64_t K = c->K, prs = c->pk_rs, srs = c->sc_rs;
  const uint8_t *pk = c->pk + n0 * prs, *sc = c->sc + n0 * srs;
  v4f acc[MR][2];
  for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = splat(0.0f);
  for (int64_t blk = 0; blk < K / 32; blk++) {
    v4f sv[2] = {mx_scales(sc, srs, blk), mx_scales(sc + 4 * srs, srs, blk)};
    const uint8_t *pb = pk + blk * 16;
    const float *xb = c->xf + blk * 32;
    for (int i = 0; i < 16; i++) {
      for (int g = 0; g < 2; g++) {
        v4f ce, co;
        mx_cols(pb + 4 * g * prs, prs, i, sv[g], &ce, &co);
        for (int m = 0; m < M; m++) {
          acc[m][g] += splat(xb[m * K + 2 * i]) * ce;
          acc[m][g] += splat(xb[m * K + 2 * i + 1]) * co;
        }
      }
    }
  }
  for (int m = 0; m < M; m++)
    for (int j = 0; j < NR; j++) out[m][j] = acc[m][j >> 2][j & 3];
}

/* Runs mx_direct_m for the call's M (1..MR−1) on the 8 rows n0.. and stores y. */
static void mx_direct(const gemm_ctx_t *c, int64_t n0) {
  float out[MR][NR];
  switch (c->M) {
    case 1: mx_direct_m(c, n0, 1, out); break;
    case 2: mx_direct_m(c, n0, 2, out); break;
    case 3: mx_direct_m(c, n0, 3, out); break;
    case 4: mx_direct_m(c, n0, 4, out); break;
    default: mx_direct_m(c, n0, 5, out); break;
  }
  for (int64_t m = 0; m < c->M; m++)
    for (int j = 0; j < NR; j++) k3k_st(c->Y, k3k_off2(c->Y, m, n0 + j), out[m][j]);
}

/* Packs 8 full MXFP4 rows n0.. into the k-major panel wp[K][8] with the byte decoder: two
 * column vectors per byte and 4-row group, stored whole. */
static void mx_pack(const gemm_ctx_t *c, int64_t n0, float *wp) {
  const int64_t K = c->K, prs = c->pk_rs, srs = c->sc_rs;
  const uint8_t *pk = c->pk + n0 * prs, *sc = c->sc + n0 * srs;
  for (int64_t blk = 0; blk < K / 32; blk++) {
    v4f sv0 = mx_scales(sc, srs, blk), sv1 = mx_scales(sc + 4 * srs, srs, blk);
    const uint8_t *pb = pk + blk * 16;
    float *w = wp + blk * 32 * NR;
    for (int i = 0; i < 16; i++) {
      v4f ce, co;
      mx_cols(pb, prs, i, sv0, &ce, &co);
      *(v4f_u *)(w + 2 * i * NR) = ce;
      *(v4f_u *)(w + (2 * i + 1) * NR) = co;
      mx_cols(pb + 4 * prs, prs, i, sv1, &ce, &co);
      *(v4f_u *)(w + 2 * i * NR + 4) = ce;
      *(v4f_u *)(w + (2 * i + 1) * NR + 4) = co;
    }
  }
}

/* K3_EINVAL when any scale byte is 0xFF (E8M0 NaN), checked before anything is written. memchr
 * (vectorised in libc) over the whole tensor when it is one block, else per unit-stride row:
 * for one 3072×112 expert matrix 3 µs against 12 µs row by row, on the caller before the
 * parallel part (~110 µs on 16 threads). */
static int mx_check_scales(const k3k_tensor_t *S) {
  const uint8_t *b = S->data;
  const int64_t N = S->shape[0], G = S->shape[1];
  if (N > 0 && G > 0 && (S->stride[1] == 1 || G == 1) && (S->stride[0] == G || N == 1))
    return memchr(b, 0xFF, (size_t)(N * G)) ? K3_EINVAL : 0;
  for (int64_t n = 0; n < N; n++) {
    if (S->stride[1] == 1 || G <= 1) {
      if (G > 0 && memchr(b + n * S->stride[0], 0xFF, (size_t)G)) return K3_EINVAL;
      continue;
    }
    for (int64_t g = 0; g < G; g++)
      if (b[n * S->stride[0] + g * S->stride[1]] == 0xFF) return K3_EINVAL;
  }
  return 0;
}

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

/* Four bf16 rows (p, p+rs, p+2rs, p+3rs; rs in elements) at k..k+3 → the four fp32 columns
 * c[i] = W[0..3][k+i]. The transpose runs on the 16-bit values (2 + 2 interleaves) and the
 * conversion is the final interleave with zeros (bf16 bits in the high half of each fp32 lane,
 * exact on little-endian targets): 8 shuffles per 16 weights instead of 4 conversions and a 4×4
 * fp32 transpose. Measured with the M-specialised direct_panel_m: 7168×7168 at M = 1 0.26 →
 * 0.15 ns/weight, M = 2 0.32 → 0.21 (one thread). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16_cols assumes little-endian lanes");
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint64_t v2u64 __attribute__((vector_size(16)));
typedef uint64_t u64_u __attribute__((aligned(2), may_alias));
VINL void bf16_cols(const uint16_t *p, size_t rs, int64_t k, v4f c[4]) {
  v8h r0 = (v8h)(v2u64){*(const u64_u *)(p + k), 0};
  v8h r1 = (v8h)(v2u64){*(const u64_u *)(p + rs + k), 0};
  v8h r2 = (v8h)(v2u64){*(const u64_u *)(p + 2 * rs + k), 0};
  v8h r3 = (v8h)(v2u64){*(const u64_u *)(p + 3 * rs + k), 0};
  const v8h lo16 = {0, 8, 1, 9, 2, 10, 3, 11}, hi16 = {4, 12, 5, 13, 6, 14, 7, 15};
  v4u a01 = (v4u)__builtin_shuffle(r0, r1, lo16), a23 = (v4u)__builtin_shuffle(r2, r3, lo16);
  v8h c01 = (v8h)__builtin_shuffle(a01, a23, (v4u){0, 4, 1, 5});
  v8h c23 = (v8h)__builtin_shuffle(a01, a23, (v4u){2, 6, 3, 7});
  const v8h z = {0};
  c[0] = (v4f)__builtin_shuffle(z, c01, lo16);
  c[1] = (v4f)__builtin_shuffle(z, c01, hi16);
  c[2] = (v4f)__builtin_shuffle(z, c23, lo16);
  c[3] = (v4f)__builtin_shuffle(z, c23, hi16);
}

/* Decode-shaped GEMM (M < MR) on 8 full W rows: per 4 k, load 4 values from each row, convert,
 * transpose in registers, and accumulate k, k+1, k+2, k+3 in that order (so still the reference
 * order); a K % 4 tail continues sequentially. Packing would write and re-read every weight
 * once per call, which dominates when M is 1. M and bf are constants at each call site
 * (direct_panel), so acc stays in registers. */
VINL void direct_panel_m(const gemm_ctx_t *c, int64_t n0, const int M, const bool bf) {
  const int64_t K = c->K, K4 = K & ~(int64_t)3;
  const char *wb = (const char *)c->W->data;
  const size_t rs = (size_t)c->W->stride[0] * (bf ? 2 : 4);
  v4f acc[MR][2];
  for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = splat(0.0f);
  for (int64_t k = 0; k < K4; k += 4) {
    v4f lo[4], hi[4];
    if (bf) {
      const uint16_t *p = (const uint16_t *)(wb + (size_t)n0 * rs);
      const size_t re = rs / 2; /* row stride in elements */
      bf16_cols(p, re, k, lo);
      bf16_cols(p + 4 * re, re, k, hi);
    } else {
      v4f r[8];
      for (int j = 0; j < 8; j++) r[j] = ld4((const float *)(wb + (size_t)(n0 + j) * rs) + k);
      tr4(r, lo);
      tr4(r + 4, hi);
    }
    for (int m = 0; m < M; m++) {
      const float *x = c->xf + m * K + k;
      for (int i = 0; i < 4; i++) {
        v4f b = splat(x[i]);
        acc[m][0] += b * lo[i];
        acc[m][1] += b * hi[i];
      }
    }
  }
  for (int m = 0; m < M; m++) {
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

static void direct_panel(const gemm_ctx_t *c, int64_t n0) {
  const bool bf = c->W->dtype == K3K_BF16;
  switch (c->M * 2 + bf) {
    case 2: direct_panel_m(c, n0, 1, false); break;
    case 3: direct_panel_m(c, n0, 1, true); break;
    case 4: direct_panel_m(c, n0, 2, false); break;
    case 5: direct_panel_m(c, n0, 2, true); break;
    case 6: direct_panel_m(c, n0, 3, false); break;
    case 7: direct_panel_m(c, n0, 3, true); break;
    case 8: direct_panel_m(c, n0, 4, false); break;
    case 9: direct_panel_m(c, n0, 4, true); break;
    case 10: direct_panel_m(c, n0, 5, false); break;
    default: direct_panel_m(c, n0, 5, true); break;
  }
}

static void gemm_task(void *ctx, int64_t task, int worker) {
  const gemm_ctx_t *c = ctx;
  const int64_t K = c->K, M = c->M;
  float *wp = c->packs + (size_t)worker * (size_t)K * NR;
  const int64_t end = (task + 1) * PANELS_PER_TASK;
  for (int64_t pnl = task * PANELS_PER_TASK; pnl < end; pnl++) {
    int64_t n0 = pnl * NR;
    if (n0 >= c->N) return;
    int64_t nn = c->N - n0 < NR ? c->N - n0 : NR;
    if (c->direct && nn == NR && c->mx) {
      mx_direct(c, n0);
      continue;
    }
    if (c->direct && nn == NR) {
      direct_panel(c, n0);
      continue;
    }
    if (c->mx_rows && nn == NR)
      mx_pack(c, n0, wp);
    else
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
    int rc = mx_check_scales(c.S);
    if (rc) return rc;
    /* K % 32 == 0 (validated); unit inner strides, or a single byte/block per row. */
    c.mx_rows = (c.W->stride[1] == 1 || c.K <= 2) && (c.S->stride[1] == 1 || c.K <= 32);
    c.pk = c.W->data;
    c.sc = c.S->data;
    c.pk_rs = c.W->stride[0];
    c.sc_rs = c.S->stride[0];
    c.direct = c.M < MR && c.mx_rows;
  } else {
    c.direct = c.M < MR && (c.W->stride[1] == 1 || c.K <= 1);
  }
  if (c.M == 0 || c.N == 0) return 0;
  int nw = k3k_pool_threads(pool);
  /* x as fp32 rows, then one K×NR panel per worker, from the pool's scratch (kept between
   * calls: a decode step makes thousands of small expert GEMMs). */
  size_t xbytes = ((size_t)(c.M * c.K) * sizeof(float) + 63) & ~(size_t)63;
  char *scr = k3k_pool_scratch(pool, xbytes + (size_t)nw * (size_t)(c.K * NR) * sizeof(float));
  if (!scr) return K3_ENOMEM;
  float *xf = (float *)scr;
  for (int64_t m = 0; m < c.M; m++)
    for (int64_t k = 0; k < c.K; k++) xf[m * c.K + k] = k3k_ld(c.X, k3k_off2(c.X, m, k));
  c.xf = xf;
  c.packs = (float *)(scr + xbytes);
  int64_t panels = (c.N + NR - 1) / NR;
  /* work: the multiply-adds, plus the decode/packing (once per weight, MXFP4 or M >= MR) */
  int64_t work = c.M * c.N * c.K + (c.direct && !mx ? 0 : c.N * c.K);
  k3k_pool_run_work(pool, (panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK, work, gemm_task, &c);
  return 0;
}
