/* Unit tests for the MXFP4 codec against hand-computed values: E2M1 table, nibble order,
 * negative codes, extreme and rejected scales, quantizer scale choice, ties, clamping, zero
 * groups, and a quantize -> dequantize error bound. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/mxfp4.h"

START_TEST(test_table_and_scale) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int i = 0; i < 16; i++) ck_assert(k3_e2m1_table[i] == want[i]);
  ck_assert(signbit(k3_e2m1_table[8]));
  ck_assert(k3_e8m0_to_f32(127) == 1.0f);
  ck_assert(k3_e8m0_to_f32(128) == 2.0f);
  ck_assert(k3_e8m0_to_f32(120) == 1.0f / 128.0f);
  ck_assert(k3_e8m0_to_f32(254) == ldexpf(1.0f, 127));
  ck_assert(k3_e8m0_to_f32(1) == ldexpf(1.0f, -126));
  ck_assert(k3_e8m0_to_f32(0) == ldexpf(1.0f, -127)); /* subnormal, still exact */
  ck_assert(isnan(k3_e8m0_to_f32(255)));
}
END_TEST

START_TEST(test_dequant_hand) {
  uint8_t packed[16], scales[1];
  float out[32];
  memset(packed, 0, sizeof packed);
  packed[0] = 0x21; /* k=0: code 1 (+0.5), k=1: code 2 (+1.0): low nibble first */
  packed[1] = 0xF9; /* k=2: code 9 (-0.5), k=3: code 15 (-6) */
  packed[2] = 0x7C; /* k=4: code 12 (-2), k=5: code 7 (+6) */
  packed[15] = 0x8B; /* k=30: code 11 (-1.5), k=31: code 8 (-0) */
  scales[0] = 127 + 3; /* x8 */
  ck_assert_int_eq(k3_mxfp4_dequant_row(packed, scales, 32, out, NULL), 0);
  ck_assert(out[0] == 4.0f && out[1] == 8.0f && out[2] == -4.0f && out[3] == -48.0f);
  ck_assert(out[4] == -16.0f && out[5] == 48.0f && out[6] == 0.0f);
  ck_assert(out[30] == -12.0f && out[31] == 0.0f && signbit(out[31]));
  /* extreme scales */
  scales[0] = 1;
  ck_assert_int_eq(k3_mxfp4_dequant_row(packed, scales, 32, out, NULL), 0);
  ck_assert(out[0] == ldexpf(1.0f, -127)); /* 0.5 * 2^-126 */
  ck_assert(out[3] == -6.0f * ldexpf(1.0f, -126));
  scales[0] = 254;
  ck_assert_int_eq(k3_mxfp4_dequant_row(packed, scales, 32, out, NULL), 0);
  ck_assert(out[0] == ldexpf(1.0f, 126));
  ck_assert(out[30] == -1.5f * ldexpf(1.0f, 127));
  ck_assert(isinf(out[3]) && out[3] < 0); /* -6 * 2^127 exceeds FLT_MAX */
  /* rejected scale bytes, with the group index */
  uint8_t p2[32] = {0}, s2[2] = {127, 0x00};
  float o2[64];
  int64_t bad = -1;
  ck_assert_int_eq(k3_mxfp4_dequant_row(p2, s2, 64, o2, &bad), K3_EFORMAT);
  ck_assert_int_eq(bad, 1);
  s2[0] = 0xFF;
  ck_assert_int_eq(k3_mxfp4_dequant_row(p2, s2, 64, o2, &bad), K3_EFORMAT);
  ck_assert_int_eq(bad, 0);
  ck_assert_int_eq(k3_mxfp4_dequant_row(p2, s2, 48, o2, NULL), K3_EINVAL);
  size_t bi = 0;
  uint8_t s3[4] = {1, 127, 254, 255};
  ck_assert_int_eq(k3_mxfp4_check_scales(s3, 3, &bi), 0);
  ck_assert_int_eq(k3_mxfp4_check_scales(s3, 4, &bi), K3_EFORMAT);
  ck_assert_uint_eq(bi, 3);
}
END_TEST

START_TEST(test_encode_ties_and_clamp) {
  ck_assert_int_eq(k3_e2m1_encode(0.25f), 0);  /* tie 0 / 0.5 -> even code 0 */
  ck_assert_int_eq(k3_e2m1_encode(0.26f), 1);
  ck_assert_int_eq(k3_e2m1_encode(0.75f), 2);  /* tie 0.5 / 1 -> code 2 */
  ck_assert_int_eq(k3_e2m1_encode(1.25f), 2);  /* tie 1 / 1.5 -> code 2 */
  ck_assert_int_eq(k3_e2m1_encode(1.75f), 4);  /* tie 1.5 / 2 -> code 4 */
  ck_assert_int_eq(k3_e2m1_encode(2.5f), 4);
  ck_assert_int_eq(k3_e2m1_encode(3.5f), 6);
  ck_assert_int_eq(k3_e2m1_encode(5.0f), 6);
  ck_assert_int_eq(k3_e2m1_encode(5.01f), 7);
  ck_assert_int_eq(k3_e2m1_encode(100.0f), 7);
  ck_assert_int_eq(k3_e2m1_encode(-100.0f), 15);
  ck_assert_int_eq(k3_e2m1_encode(-1.6f), 11);
  ck_assert_int_eq(k3_e2m1_encode(-0.1f), 0); /* rounds to zero: stored as +0 */
}
END_TEST

START_TEST(test_quantize_hand) {
  float w[32] = {0};
  uint8_t p[16];
  w[0] = 0.3f;  /* amax 0.3: floor(log2) = -2 -> e = 123, scale 1/16; 4.8 -> 4 (code 6) */
  w[1] = -0.1f; /* -1.6 -> -1.5 (code 11) */
  w[31] = 0.05f; /* 0.8 -> 1 (code 2) */
  ck_assert_int_eq(k3_mxfp4_quantize_group(w, p), 123);
  ck_assert_uint_eq(p[0], 0xB6);
  ck_assert_uint_eq(p[15], 0x20);
  /* amax 6.9: e = 127 + 2 - 2 = 127, 6.9 clamps to 6 (code 7) */
  memset(w, 0, sizeof w);
  w[2] = -6.9f;
  ck_assert_int_eq(k3_mxfp4_quantize_group(w, p), 127);
  ck_assert_uint_eq(p[1], 0x0F);
  /* zero group */
  memset(w, 0, sizeof w);
  ck_assert_int_eq(k3_mxfp4_quantize_group(w, p), 127);
  for (int i = 0; i < 16; i++) ck_assert_uint_eq(p[i], 0);
  /* a subnormal amax clamps the exponent to 1; the largest float gives 127 + 127 - 2 = 252 */
  w[0] = 1e-39f;
  ck_assert_int_eq(k3_mxfp4_quantize_group(w, p), 1);
  w[0] = 3e38f;
  ck_assert_int_eq(k3_mxfp4_quantize_group(w, p), 252);
  ck_assert_uint_eq(p[0] & 0x0F, 7); /* 3e38 / 2^125 = 7.05 clamps to 6 (code 7) */
  w[0] = INFINITY;
  ck_assert_int_eq(k3_mxfp4_quantize_group(w, p), 0);
  uint8_t sc[1];
  ck_assert_int_eq(k3_mxfp4_quantize_row(w, 32, p, sc), K3_ERANGE);
  ck_assert_int_eq(k3_mxfp4_quantize_row(w, 31, p, sc), K3_EINVAL);
}
END_TEST

START_TEST(test_roundtrip_bound) {
  enum { K = 256 };
  float w[K], d[K];
  uint8_t p[K / 2], s[K / 32];
  uint32_t x = 12345;
  for (int i = 0; i < K; i++) {
    x = x * 1664525u + 1013904223u;
    w[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (i < 128 ? 0.04f : 40.0f);
  }
  ck_assert_int_eq(k3_mxfp4_quantize_row(w, K, p, s), 0);
  ck_assert_int_eq(k3_mxfp4_dequant_row(p, s, K, d, NULL), 0);
  for (int i = 0; i < K; i++) {
    float scale = k3_e8m0_to_f32(s[i / 32]);
    /* largest gap in the E2M1 grid is 2 (4..6), plus the clamp region (6..8): error <= 2*scale */
    ck_assert_msg(fabsf(d[i] - w[i]) <= 2.0f * scale, "i=%d w=%g d=%g", i, w[i], d[i]);
    ck_assert(fabsf(d[i]) <= 6.0f * scale);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt_mxfp4");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_table_and_scale);
  tcase_add_test(tc, test_dequant_hand);
  tcase_add_test(tc, test_encode_ties_and_clamp);
  tcase_add_test(tc, test_quantize_hand);
  tcase_add_test(tc, test_roundtrip_bound);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
