/* The HTTP front's JSON writer (router/jsonw.c): escapes, ill-formed UTF-8 replaced so the
 * output is always valid JSON, numbers (shortest round trip, integers stay floats, -inf and NaN
 * mapped), and every output read back by jansson to the same value. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jsonw.h"

static char *str_of(const char *s, size_t n) {
  rt_jw_t w = {{0}, 0};
  rt_jw_str(&w, s, n);
  ck_assert_int_eq(w.err, 0);
  rt_jw_raw(&w, "");
  k3_tok_str_append(&w.s, "", 0);
  return w.s.data;
}

START_TEST(test_escapes) {
  char *o = str_of("a\"b\\c\n\r\t\b\f\x01\x1f\x7f \xe2\x9c\x93", 17);
  ck_assert_str_eq(o, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\x7f \xe2\x9c\x93\"");
  json_t *j = json_loads(o, JSON_DECODE_ANY, NULL);
  ck_assert_ptr_nonnull(j);
  ck_assert_int_eq(json_string_length(j), 17);
  ck_assert_int_eq(memcmp(json_string_value(j), "a\"b\\c\n\r\t\b\f\x01\x1f\x7f \xe2\x9c\x93", 18), 0);
  json_decref(j);
  free(o);
  /* NUL inside is escaped, not a terminator */
  o = str_of("a\0b", 3);
  ck_assert_str_eq(o, "\"a\\u0000b\"");
  free(o);
}
END_TEST

START_TEST(test_invalid_utf8) {
  const char *bad[] = {"\xff", "\xc3", "a\xe2\x9c", "\xed\xa0\x80", "\xc0\xaf", "ok\x80ok"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *o = str_of(bad[i], strlen(bad[i]));
    json_error_t je;
    json_t *j = json_loads(o, JSON_DECODE_ANY, &je);
    ck_assert_msg(j != NULL, "case %zu not valid JSON: %s (%s)", i, o, je.text);
    ck_assert_ptr_nonnull(strstr(json_string_value(j), "\xef\xbf\xbd")); /* U+FFFD */
    json_decref(j);
    free(o);
  }
}
END_TEST

START_TEST(test_numbers) {
  const double vals[] = {0.0, -1.5, 1e-7, -0.1234567890123, 3.0, -9999.0, 1e300};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    rt_jw_t w = {{0}, 0};
    rt_jw_f64(&w, vals[i]);
    k3_tok_str_append(&w.s, "", 0);
    json_t *j = json_loads(w.s.data, JSON_DECODE_ANY, NULL);
    ck_assert_msg(j && json_is_real(j) && json_real_value(j) == vals[i], "%g -> %s", vals[i], w.s.data);
    json_decref(j);
    free(w.s.data);
  }
  rt_jw_t w = {{0}, 0};
  rt_jw_f64(&w, -INFINITY);
  rt_jw_raw(&w, ",");
  rt_jw_f64(&w, NAN);
  rt_jw_raw(&w, ",");
  rt_jw_i64(&w, INT64_MIN);
  rt_jw_raw(&w, ",");
  rt_jw_strz(&w, NULL);
  k3_tok_str_append(&w.s, "", 0);
  ck_assert_str_eq(w.s.data, "-9999.0,null,-9223372036854775808,null");
  free(w.s.data);
}
END_TEST

int main(void) {
  Suite *s = suite_create("jsonw");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_escapes);
  tcase_add_test(tc, test_invalid_utf8);
  tcase_add_test(tc, test_numbers);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
