/* Unit tests for k3_base: error table, flags/env parsing, int lists, bf16/f16 rounding. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/util.h"

START_TEST(test_strerror) {
  ck_assert_str_eq(k3_strerror(K3_EINVAL), "invalid argument");
  ck_assert_str_eq(k3_errname(K3_ESTALE), "K3_ESTALE");
  ck_assert_str_eq(k3_strerror(0), "success");
  ck_assert_str_eq(k3_strerror(-9999), "unknown error");
  ck_assert_int_lt(K3_EDIGEST, 0);
}
END_TEST

START_TEST(test_flags_basic) {
  const char *model = NULL;
  int n = 5;
  int64_t bytes = 0;
  double t = 1.0;
  bool v = false;
  k3_flag_t flags[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "model dir", true},
      {"max-new-tokens", K3_FLAG_INT, &n, "N", "n", false},
      {"shard-size", K3_FLAG_I64, &bytes, "BYTES", "b", false},
      {"temperature", K3_FLAG_DOUBLE, &t, "T", "t", false},
      {"verbose", K3_FLAG_BOOL, &v, NULL, "v", false},
  };
  k3_flags_info_t info = {"prog", NULL, "ARGS"};
  char *argv[] = {"prog", "--model", "/m", "--max-new-tokens=7", "--shard-size", "2M", "--verbose",
                  "--temperature", "0.5", "pos1", "pos2"};
  char err[256];
  int first = 0;
  unsetenv("K3PD_MAX_NEW_TOKENS");
  ck_assert_int_eq(k3_flags_parse(&info, flags, 5, 11, argv, &first, err, sizeof err), 0);
  ck_assert_str_eq(model, "/m");
  ck_assert_int_eq(n, 7);
  ck_assert_int_eq(bytes, 2 << 20);
  ck_assert(v);
  ck_assert(fabs(t - 0.5) < 1e-12);
  ck_assert_int_eq(first, 9);
}
END_TEST

START_TEST(test_flags_env_and_errors) {
  const char *model = NULL;
  int n = 5;
  k3_flag_t flags[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "model dir", true},
      {"max-new-tokens", K3_FLAG_INT, &n, "N", "n", false},
  };
  k3_flags_info_t info = {"prog", NULL, NULL};
  char err[256];
  setenv("K3PD_MAX_NEW_TOKENS", "11", 1);
  char *a1[] = {"prog", "--model", "x"};
  ck_assert_int_eq(k3_flags_parse(&info, flags, 2, 3, a1, NULL, err, sizeof err), 0);
  ck_assert_int_eq(n, 11);
  char *a2[] = {"prog", "--model", "x", "--max-new-tokens", "abc"};
  ck_assert_int_eq(k3_flags_parse(&info, flags, 2, 5, a2, NULL, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "--max-new-tokens"));
  char *a3[] = {"prog"};
  unsetenv("K3PD_MODEL");
  ck_assert_int_eq(k3_flags_parse(&info, flags, 2, 1, a3, NULL, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "--model"));
  char *a4[] = {"prog", "--bogus"};
  ck_assert_int_eq(k3_flags_parse(&info, flags, 2, 2, a4, NULL, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "--bogus"));
  char *a5[] = {"prog", "--model", "x", "stray"};
  ck_assert_int_eq(k3_flags_parse(&info, flags, 2, 4, a5, NULL, err, sizeof err), K3_EINVAL);
  setenv("K3PD_MAX_NEW_TOKENS", "zz", 1);
  ck_assert_int_eq(k3_flags_parse(&info, flags, 2, 3, a1, NULL, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "K3PD_MAX_NEW_TOKENS"));
  unsetenv("K3PD_MAX_NEW_TOKENS");
}
END_TEST

START_TEST(test_int_list) {
  int32_t *v = NULL;
  size_t n = 0;
  char err[128];
  ck_assert_int_eq(k3_parse_int_list("1, 2,3 ,-4", &v, &n, err, sizeof err), 0);
  ck_assert_int_eq(n, 4);
  ck_assert_int_eq(v[3], -4);
  free(v);
  ck_assert_int_eq(k3_parse_int_list("1,,2", &v, &n, err, sizeof err), K3_EINVAL);
  ck_assert_int_eq(k3_parse_int_list("1,x", &v, &n, err, sizeof err), K3_EINVAL);
  ck_assert_int_eq(k3_parse_int_list("1,", &v, &n, err, sizeof err), K3_EINVAL);
}
END_TEST

START_TEST(test_bf16_f16) {
  /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1+2^-7: ties to even → 1.0 */
  ck_assert(k3_round_bf16(1.0f + 0x1p-8f) == 1.0f);
  ck_assert(k3_round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  ck_assert(k3_round_bf16(-2.5f) == -2.5f);
  ck_assert(isnan(k3_round_bf16(NAN)));
  ck_assert(k3_f16_to_f32(0x3c00) == 1.0f);
  ck_assert(k3_f16_to_f32(0xc000) == -2.0f);
  ck_assert(k3_f16_to_f32(0x0001) == 0x1p-24f);
  ck_assert_int_eq(k3_f32_to_f16(1.0f), 0x3c00);
  ck_assert_int_eq(k3_f32_to_f16(65504.0f), 0x7bff);
  ck_assert_int_eq(k3_f32_to_f16(1e6f), 0x7c00);
  ck_assert_int_eq(k3_f32_to_f16(0x1p-24f), 0x0001);
  for (uint32_t h = 0; h < 0x7c00; h += 7) ck_assert_int_eq(k3_f32_to_f16(k3_f16_to_f32((uint16_t)h)), h);
}
END_TEST

START_TEST(test_hash) {
  ck_assert(k3_hash64("abc", 3, 0) == k3_hash64("abc", 3, 0));
  ck_assert(k3_hash64("abc", 3, 0) != k3_hash64("abd", 3, 0));
  ck_assert(k3_hash64("abc", 3, 0) != k3_hash64("abc", 3, 1));
}
END_TEST

int main(void) {
  Suite *s = suite_create("base");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_strerror);
  tcase_add_test(tc, test_flags_basic);
  tcase_add_test(tc, test_flags_env_and_errors);
  tcase_add_test(tc, test_int_list);
  tcase_add_test(tc, test_bf16_f16);
  tcase_add_test(tc, test_hash);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
