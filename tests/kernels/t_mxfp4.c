/* MXFP4_GEMM cases aimed at cpu-fast's MXFP4 paths (kernels/fast/fast_gemm.c): the direct
 * decoder at M = 1..5, the vector pack at M >= 6, the element-wise pack of the last partial
 * panel (N not a multiple of 8), row-strided codes/scales, strided and bf16 x/y, every byte
 * value of the packed codes (the 256-entry pair table; the sign of a zero weight cannot show,
 * since every sum starts at +0) and scales from 0
 * (subnormal 2^-127) upward, and the 0xFF scale rejection anywhere in the matrix with the
 * output untouched. Every case runs on every backend through run_case, which demands byte
 * equality of cpu-fast with the cpu reference and checks a float64 expectation computed here
 * with its own decoder. The 2- and 5-thread passes of main.c run these again. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mxfp4_bf16.h"
#include "harness.h"

static double e2m1d(int code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

typedef struct {
  int64_t M, N, K;
  k3k_dtype_t xdt, ydt;
  int64_t xpad, ypad, pkpad, scpad; /* extra elements per row: strided views */
  int scale_lo, scale_n;            /* scale bytes drawn from [scale_lo, scale_lo + scale_n) */
} mxcase_t;

/* Builds x, packed, scale, y for c. Code byte at flat position j is (167·j + r) mod 256 with a
 * random r: 167 is odd, so any 256 consecutive positions hold every byte value once, and all
 * 256 values appear whenever N·K/2 >= 256. */
static void build(const mxcase_t *c, tt_t s[4]) {
  s[0] = tt_2d(c->xdt, c->M, c->K, c->xpad);
  s[1] = tt_2d(K3K_U8, c->N, c->K / 2, c->pkpad);
  s[2] = tt_2d(K3K_U8, c->N, c->K / 32, c->scpad);
  s[3] = tt_2d(c->ydt, c->M, c->N, c->ypad);
  tt_rand(&s[0], -1, 1);
  int64_t r = rng_u32() & 0xFF;
  for (int64_t j = 0; j < c->N * (c->K / 2); j++) tt_set(&s[1], j, (double)((167 * j + r) & 0xFF));
  for (int64_t i = 0; i < c->N * (c->K / 32); i++)
    tt_set(&s[2], i, c->scale_lo + (int)(rng_u32() % (uint32_t)c->scale_n));
}

/* y's float64 expectation with a tolerance scaled to the largest Σ|x·w| (fp32 sums of K terms
 * may cancel, so a relative bound per element would be meaningless). */
static void expect(const mxcase_t *c, tt_t s[4]) {
  double *w = tt_expect(&s[3], 0, 0), big = 0;
  for (int64_t m = 0; m < c->M; m++)
    for (int64_t n = 0; n < c->N; n++) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < c->K; k++) {
        int byte = tt_geti(&s[1], n * (c->K / 2) + k / 2);
        int code = (k & 1) ? byte >> 4 : byte & 15;
        double wv = e2m1d(code) * ldexp(1.0, tt_geti(&s[2], n * (c->K / 32) + k / 32) - 127);
        double xv = tt_get(&s[0], m * c->K + k);
        acc += xv * wv;
        mag += fabs(xv * wv);
      }
      w[m * c->N + n] = c->ydt == K3K_BF16 ? rbf(acc) : acc;
      big = mag > big ? mag : big;
    }
  s[3].atol = 1e-6 * big + 1e-30;
  s[3].rtol = c->ydt == K3K_BF16 ? tol_rel(K3K_BF16) : 1e-5;
}

static void run_mx(const char *name, const mxcase_t *c) {
  tt_t s[4];
  build(c, s);
  expect(c, s);
  char nm[160];
  snprintf(nm, sizeof nm, "%s M=%lld N=%lld K=%lld", name, (long long)c->M, (long long)c->N,
           (long long)c->K);
  check(run_case(nm, K3K_OP_MXFP4_GEMM, NULL, s, 4, 0) >= 2, "%s: ran on cpu and cpu-fast", nm);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

/* A 0xFF scale at flat scale index `at` (−1: the last one): K3_EINVAL on every backend and y
 * still poisoned (run_case checks that). */
static void run_bad(int64_t M, int64_t N, int64_t K, int64_t at) {
  mxcase_t c = {M, N, K, K3K_BF16, K3K_F32, 0, 0, 0, 0, 120, 8};
  tt_t s[4];
  build(&c, s);
  int64_t ns = N * (K / 32);
  tt_set(&s[2], at < 0 ? ns - 1 : at, 255);
  s[3].out = true;
  char nm[128];
  snprintf(nm, sizeof nm, "mxfp4 0xFF scale at %lld of %lld (M=%lld)",
           (long long)(at < 0 ? ns - 1 : at), (long long)ns, (long long)M);
  run_case(nm, K3K_OP_MXFP4_GEMM, NULL, s, 4, K3_EINVAL);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

void t_mxfp4_fast(void) {
  rng_seed(77);
  /* M = 1..5: direct decoder (N = 37: four full panels + a 5-row tail through pack_panel). */
  static const int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 13};
  for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
    mxcase_t c = {Ms[i], 37, 96, K3K_BF16, K3K_F32, 0, 0, 0, 0, 118, 14};
    run_mx("mxfp4 fast", &c);
  }
  /* Exactly full panels (no tail), and fewer rows than one panel (tail only). */
  mxcase_t full = {1, 64, 128, K3K_F32, K3K_F32, 0, 0, 0, 0, 120, 10};
  run_mx("mxfp4 full panels", &full);
  mxcase_t tiny = {2, 5, 32, K3K_BF16, K3K_BF16, 0, 0, 0, 0, 120, 10};
  run_mx("mxfp4 N<8", &tiny);
  /* Row-strided codes and scales, strided x and y, bf16 output: the fast paths read rows
   * pk_rs / sc_rs apart. */
  mxcase_t str = {2, 29, 160, K3K_F32, K3K_BF16, 3, 5, 7, 3, 121, 9};
  run_mx("mxfp4 strided", &str);
  mxcase_t str6 = {6, 29, 160, K3K_BF16, K3K_F32, 1, 2, 9, 1, 121, 9};
  run_mx("mxfp4 strided pack", &str6);
  /* K = 32: one scale per row (its inner stride is then free), one block. */
  mxcase_t k32 = {3, 19, 32, K3K_BF16, K3K_F32, 0, 0, 0, 4, 123, 6};
  run_mx("mxfp4 K=32", &k32);
  /* Tiny and subnormal scales: 2^-127 (byte 0) and 2^-126.. products stay exact. */
  mxcase_t sub = {1, 24, 64, K3K_F32, K3K_F32, 0, 0, 0, 0, 0, 4};
  run_mx("mxfp4 subnormal scales", &sub);
  mxcase_t sub6 = {7, 24, 64, K3K_F32, K3K_F32, 0, 0, 0, 0, 0, 4};
  run_mx("mxfp4 subnormal scales pack", &sub6);
  /* A decode-like shape with a longer K (several blocks per row). */
  mxcase_t dec = {2, 43, 1024, K3K_BF16, K3K_BF16, 0, 0, 0, 0, 118, 12};
  run_mx("mxfp4 decode-like", &dec);
  /* 0xFF anywhere: first, middle, last scale; direct and pack shapes. */
  run_bad(1, 37, 96, 0);
  run_bad(2, 37, 96, 50);
  run_bad(1, 37, 96, -1);
  run_bad(7, 37, 96, -1);
  /* K not a multiple of 32 is refused by validation on every backend, nothing written. */
  tt_t s[4] = {tt_2d(K3K_BF16, 1, 48, 0), tt_2d(K3K_U8, 9, 24, 0), tt_2d(K3K_U8, 9, 1, 0),
               tt_2d(K3K_F32, 1, 9, 0)};
  tt_rand(&s[0], -1, 1);
  for (int64_t i = 0; i < 9; i++) tt_set(&s[2], i, 127);
  s[3].out = true;
  run_case("mxfp4 K=48 refused", K3K_OP_MXFP4_GEMM, NULL, s, 4, K3_EINVAL);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

/* kernels/core/mxfp4_bf16.h (the dequant-once MoE path's decoder, compiled for the device from
 * the same lines): every code and every scale byte but 0xFF against a float64 decode. Where the
 * value fits fp32 it must be exact with zero low 16 bits, so the bf16 bits are its top half
 * (sign of zero included: code 8 is -0); where it does not (codes of magnitude >= 2 at scales
 * >= 253) the reference's fp32 product is ±inf, and so must the bits be. */
void t_mx_bf16_bits(void) {
  int bad = 0;
  for (uint32_t s = 0; s < 255; s++)
    for (uint32_t c = 0; c < 16; c++) {
      const double want = e2m1d((int)c) * ldexp(1.0, (int)s - 127);
      union {
        float f;
        uint32_t u;
      } w = {.f = (float)want};
      const bool fits = fabs(want) <= FLT_MAX;
      const bool exact = !fits ? isinf(w.f) : (double)w.f == want && (w.u & 0xFFFFu) == 0;
      const uint32_t got = k3k_mx_bf16_bits(c, s);
      if (!exact || got != (w.u >> 16)) {
        if (bad++ < 4)
          printf("  mx_bf16_bits code %u scale %u: got 0x%04x want 0x%04x%s\n", c, s, got,
                 w.u >> 16, exact ? "" : " (not exact in bf16)");
      }
    }
  check(bad == 0, "mxfp4 -> bf16 bits (core/mxfp4_bf16.h): 16 codes x 255 scales (%d bad)", bad);
}
