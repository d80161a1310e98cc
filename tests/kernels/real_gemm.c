/* Real-shape cases of the GEMMs (test_kernels --real, real.c): GEMM at K3's projection shapes
 * (7168 -> 12288 q/k/v, 7168 -> 576 kv_a with an F32 output, the 96-wide F32 router-sized
 * product, lm_head rows), on weight views cuBLASLt cannot take as they are (a sliced W and a
 * transposed W, F32 and BF16 x: the device's scratch fallback) and on a sliced W it can;
 * MXFP4_GEMM at K3's expert shapes (latent 3584 -> 3072 gate/up, 3072 -> 3584 down; BF16 and
 * F32 outputs, scales above 128 and down to bf16 subnormals, F32 x, odd shapes, prefill
 * tiling) and MXFP4_DEQUANT of whole experts. Ported from k3k-gpu-check (gpu_parity.c) and
 * k3k-gpu-moe's op cases (gpu_moe.c) with their shapes and value ranges.
 * Tolerances: the model's (tolerance.c); MXFP4_DEQUANT is exact (every E2M1 x 2^e value of a
 * normal scale is representable in the output dtype). */
#include <stdlib.h>
#include <string.h>

#include "real.h"

static void gemm_case(int64_t M, int64_t N, int64_t K, k3k_dtype_t din, k3k_dtype_t dout) {
  tt_t s[3] = {tt_2d(din, M, K, 0), tt_2d(din, N, K, 0), tt_2d(dout, M, N, 0)};
  tt_rand(&s[0], -1, 1), tt_rand(&s[1], -0.05, 0.05), real_out(&s[2], 0);
  char name[128];
  snprintf(name, sizeof name, "gemm M=%lld N=%lld K=%lld %s->%s", (long long)M, (long long)N,
           (long long)K, k3k_dtype_name(din), k3k_dtype_name(dout));
  fused_check(name, K3K_OP_GEMM, NULL, s, 3, NULL, NULL);
  tt_free_all(s, 3);
}

/* W = big[7:7+N, 3:3+K] (row stride K + 9) and W[n][k] = bigt[k][n] (strides (1, N + 5)),
 * with F32 x -> F32/BF16 y and BF16 x -> F32 y. */
static void gemm_views_case(int64_t M) {
  const int64_t N = 1000, K = 512;
  tt_t x = tt_2d(K3K_F32, M, K, 0), xb = tt_2d(K3K_BF16, M, K, 0);
  tt_t big = tt_2d(K3K_BF16, N + 20, K + 9, 0), bigt = tt_2d(K3K_BF16, K, N + 5, 0);
  tt_rand(&x, -1, 1), tt_rand(&xb, -1, 1), tt_rand(&big, -0.05, 0.05), tt_rand(&bigt, -0.05, 0.05);
  tt_t ws = big, wt = bigt;
  ws.t = k3k_tensor_slice(&big.t, 0, 7, N), ws.t = k3k_tensor_slice(&ws.t, 1, 3, K);
  wt.t.shape[0] = N, wt.t.shape[1] = K, wt.t.stride[0] = 1, wt.t.stride[1] = N + 5;
  for (int c = 0; c < 5; c++) {
    tt_t *w = c == 2 || c == 3 ? &wt : &ws, *xx = c >= 3 ? &xb : &x;
    tt_t s[3] = {*xx, *w, tt_2d(c == 1 ? K3K_BF16 : K3K_F32, M, N, 0)};
    real_out(&s[2], 0);
    char name[160];
    snprintf(name, sizeof name, "gemm views M=%lld N=%lld K=%lld %s x %s W %s -> %s", (long long)M,
             (long long)N, (long long)K, k3k_dtype_name(xx->t.dtype),
             w == &wt ? "transposed" : "sliced", k3k_dtype_name(w->t.dtype),
             k3k_dtype_name(s[2].t.dtype));
    fused_check(name, K3K_OP_GEMM, NULL, s, 3, NULL, NULL);
    tt_free(&s[2]);
  }
  tt_free(&x), tt_free(&xb), tt_free(&big), tt_free(&bigt);
}

/* Random code bytes, scale bytes uniform in [slo, shi]. */
static void mx_rand(tt_t *pk, tt_t *sc, int slo, int shi) {
  uint8_t *p = pk->buf, *q = sc->buf;
  for (int64_t i = 0; i < tt_numel(pk); i++) p[i] = (uint8_t)(rng_u32() >> 8);
  for (int64_t i = 0; i < tt_numel(sc); i++) q[i] = (uint8_t)(slo + (int)(rng_u32() % (uint32_t)(shi - slo + 1)));
}

static void mx_gemm_case(int64_t M, int64_t N, int64_t K, k3k_dtype_t xdt, k3k_dtype_t ydt,
                         int slo, int shi) {
  tt_t s[4] = {tt_2d(xdt, M, K, 0), tt_2d(K3K_U8, N, K / 2, 0), tt_2d(K3K_U8, N, K / 32, 0),
               tt_2d(ydt, M, N, 0)};
  tt_rand(&s[0], -1, 1), mx_rand(&s[1], &s[2], slo, shi), real_out(&s[3], 0);
  char name[160];
  snprintf(name, sizeof name, "mxfp4_gemm M=%lld N=%lld K=%lld x=%s y=%s scales %d..%d",
           (long long)M, (long long)N, (long long)K, k3k_dtype_name(xdt), k3k_dtype_name(ydt),
           slo, shi);
  fused_check(name, K3K_OP_MXFP4_GEMM, NULL, s, 4, NULL, NULL);
  tt_free_all(s, 4);
}

static void mx_dequant_case(int64_t N, int64_t K, k3k_dtype_t wdt) {
  tt_t s[3] = {tt_2d(K3K_U8, N, K / 2, 0), tt_2d(K3K_U8, N, K / 32, 0), tt_2d(wdt, N, K, 0)};
  mx_rand(&s[0], &s[1], 100, 150), real_out(&s[2], TOL_EXACT);
  char name[120];
  snprintf(name, sizeof name, "mxfp4_dequant N=%lld K=%lld W=%s", (long long)N, (long long)K,
           k3k_dtype_name(wdt));
  fused_check(name, K3K_OP_MXFP4_DEQUANT, NULL, s, 3, NULL, NULL);
  /* a NaN scale (0xFF) is refused by GEMM and DEQUANT alike, nothing written */
  ((uint8_t *)s[1].buf)[77 % tt_numel(&s[1])] = 0xFF;
  strncat(name, " scale 0xFF", sizeof name - strlen(name) - 1);
  op_check_err(name, K3K_OP_MXFP4_DEQUANT, NULL, s, 3, K3_EINVAL);
  tt_free_all(s, 3);
}

static void mx_bad_scale_case(void) {
  tt_t s[4] = {tt_2d(K3K_BF16, 4, 256, 0), tt_2d(K3K_U8, 32, 128, 0), tt_2d(K3K_U8, 32, 8, 0),
               tt_2d(K3K_BF16, 4, 32, 0)};
  tt_rand(&s[0], -1, 1), mx_rand(&s[1], &s[2], 120, 130), real_out(&s[3], 0);
  ((uint8_t *)s[2].buf)[77] = 0xFF;
  op_check_err("mxfp4_gemm scale 0xFF", K3K_OP_MXFP4_GEMM, NULL, s, 4, K3_EINVAL);
  tt_free_all(s, 4);
}

void real_gemm(void) {
  rng_seed(3002);
  gemm_views_case(1);
  gemm_views_case(65);
  for (int i = 0; i < g_real_nT; i++) {
    const int64_t T = g_real_T[i];
    gemm_case(T, T <= 65 ? 12288 : 1024, 7168, K3K_BF16, K3K_BF16);
    gemm_case(T, 576, 7168, K3K_BF16, K3K_F32);
    gemm_case(T, 96, 256, K3K_F32, K3K_F32);
    /* K3's latent experts: w1/w3 [3072, 3584], w2 [3584, 3072] */
    mx_gemm_case(T, 3072, 3584, K3K_BF16, K3K_BF16, 118, 123);
    mx_gemm_case(T, 3584, 3072, K3K_BF16, T == 1 ? K3K_BF16 : K3K_F32, 118, 123);
  }
  gemm_case(4, 4096, 7168, K3K_BF16, K3K_F32); /* lm_head rows (vocab cut to 4096) */
  if (!g_quick) {
    mx_gemm_case(16, 3072, 3584, K3K_BF16, K3K_BF16, 118, 123);
    mx_gemm_case(100, 3072, 3584, K3K_BF16, K3K_BF16, 118, 123); /* prefill tiling */
    mx_gemm_case(300, 3584, 3072, K3K_BF16, K3K_F32, 118, 123);  /* 3 token tiles of 100 */
  }
  mx_gemm_case(5, 256, 512, K3K_BF16, K3K_F32, 100, 160);    /* scales > 128 (two multiplies) */
  mx_gemm_case(3, 512, 1024, K3K_BF16, K3K_F32, 0, 20);      /* tiny scales: bf16 subnormals */
  mx_gemm_case(3, 300, 640, K3K_F32, K3K_F32, 110, 140);     /* fp32 x: generic kernel */
  mx_gemm_case(4, 24, 64, K3K_BF16, K3K_BF16, 118, 123);     /* odd shape: generic kernel */
  mx_gemm_case(80, 208, 256, K3K_BF16, K3K_BF16, 118, 123);  /* prefill: partial weight tile */
  mx_gemm_case(40, 256, 512, K3K_BF16, K3K_F32, 100, 160);   /* prefill: scales > 128 */
  mx_gemm_case(33, 512, 1024, K3K_BF16, K3K_F32, 0, 20);     /* prefill: bf16 subnormals */
  mx_bad_scale_case();
  mx_dequant_case(3072, 3584, K3K_BF16); /* one expert's w1 */
  mx_dequant_case(3584, 3072, K3K_F32);  /* one expert's w2 */
  mx_dequant_case(96, 3584, K3K_BF16);
}
