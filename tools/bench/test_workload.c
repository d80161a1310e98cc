/* Unit tests of k3pd-bench's workload generator and percentile math (no cluster needed):
 * distribution parsing and its errors, draws staying in range and covering it, per-index
 * determinism of request specs, text prompt files, and interpolated percentiles. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "k3pd/err.h"

static char err[512];

START_TEST(dist_parse_forms) {
  bn_dist_t d;
  ck_assert_int_eq(bn_dist_parse("16", "prompt-len", &d, err, sizeof err), 0);
  ck_assert_int_eq(d.kind, BN_DIST_FIXED);
  ck_assert_uint_eq(d.lo, 16);
  ck_assert_uint_eq(bn_dist_max(&d), 16);
  ck_assert_int_eq(bn_dist_parse("3..9", "prompt-len", &d, err, sizeof err), 0);
  ck_assert_int_eq(d.kind, BN_DIST_UNIFORM);
  ck_assert_uint_eq(d.lo, 3);
  ck_assert_uint_eq(d.hi, 9);
  uint64_t rng = 5;
  int seen[10] = {0};
  for (int i = 0; i < 2000; i++) {
    uint32_t v = bn_dist_draw(&d, &rng);
    ck_assert(v >= 3 && v <= 9);
    seen[v]++;
  }
  for (int v = 3; v <= 9; v++) ck_assert_int_gt(seen[v], 150); /* ~286 expected each */
  ck_assert_int_eq(bn_dist_parse("7..7", "x", &d, err, sizeof err), 0);
  ck_assert_int_eq(d.kind, BN_DIST_FIXED);
}
END_TEST

START_TEST(dist_parse_errors) {
  bn_dist_t d = {.lo = 42};
  const char *bad[] = {"", "0", "-3", "9..3", "1..", "..4", "abc", "5x", "99999999999", "@/nonexistent/file"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    ck_assert_int_lt(bn_dist_parse(bad[i], "output-len", &d, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "--output-len") != NULL, "error for \"%s\" does not name the flag: %s", bad[i], err);
    ck_assert_uint_eq(d.lo, 42); /* untouched */
  }
}
END_TEST

START_TEST(dist_file) {
  char path[] = "/tmp/k3pd-bench-test-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *txt = "5\n 17 \n\n3\n";
  ck_assert_int_eq(write(fd, txt, strlen(txt)), (int)strlen(txt));
  close(fd);
  char spec[64];
  snprintf(spec, sizeof spec, "@%s", path);
  bn_dist_t d;
  ck_assert_int_eq(bn_dist_parse(spec, "prompt-len", &d, err, sizeof err), 0);
  ck_assert_int_eq(d.kind, BN_DIST_FILE);
  ck_assert_uint_eq(d.n_values, 3);
  ck_assert_uint_eq(bn_dist_max(&d), 17);
  uint64_t rng = 1;
  int n5 = 0, n17 = 0, n3 = 0;
  for (int i = 0; i < 300; i++) {
    uint32_t v = bn_dist_draw(&d, &rng);
    n5 += v == 5;
    n17 += v == 17;
    n3 += v == 3;
  }
  ck_assert_int_eq(n5 + n17 + n3, 300);
  ck_assert(n5 > 50 && n17 > 50 && n3 > 50);
  bn_dist_free(&d);
  /* a bad token names the file */
  FILE *fp = fopen(path, "w");
  fputs("4 x7\n", fp);
  fclose(fp);
  ck_assert_int_eq(bn_dist_parse(spec, "prompt-len", &d, err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, path) && strstr(err, "x7"));
  unlink(path);
}
END_TEST

static void workload(bn_workload_t *w, const char *pl, const char *ol) {
  memset(w, 0, sizeof *w);
  ck_assert_int_eq(bn_dist_parse(pl, "prompt-len", &w->prompt_len, err, sizeof err), 0);
  ck_assert_int_eq(bn_dist_parse(ol, "output-len", &w->output_len, err, sizeof err), 0);
  w->seed = 11;
  w->id_max = 100;
  w->sample_seed = 1000;
}

START_TEST(spec_deterministic) {
  bn_workload_t w;
  workload(&w, "1..50", "2..9");
  bn_req_spec_t a, b, c;
  bool any_diff = false;
  for (uint64_t i = 0; i < 64; i++) {
    ck_assert_int_eq(bn_spec_make(&w, i, &a), 0);
    ck_assert_int_eq(bn_spec_make(&w, i, &b), 0);
    ck_assert_int_eq(bn_spec_make(&w, i + 1, &c), 0);
    ck_assert_uint_eq(a.n_ids, b.n_ids);
    ck_assert(a.n_ids >= 1 && a.n_ids <= 50);
    ck_assert(a.max_new >= 2 && a.max_new <= 9);
    ck_assert_uint_eq(a.max_new, b.max_new);
    ck_assert_uint_eq(a.seed, 1000 + i);
    ck_assert_mem_eq(a.ids, b.ids, a.n_ids * sizeof *a.ids);
    for (size_t k = 0; k < a.n_ids; k++) ck_assert_uint_lt(a.ids[k], 100);
    if (a.n_ids != c.n_ids || memcmp(a.ids, c.ids, (a.n_ids < c.n_ids ? a.n_ids : c.n_ids) * 4)) any_diff = true;
    bn_spec_free(&a);
    bn_spec_free(&b);
    bn_spec_free(&c);
  }
  ck_assert(any_diff);
  /* another workload seed gives other prompts */
  bn_workload_t w2;
  workload(&w2, "1..50", "2..9");
  w2.seed = 12;
  ck_assert_int_eq(bn_spec_make(&w, 3, &a), 0);
  ck_assert_int_eq(bn_spec_make(&w2, 3, &b), 0);
  ck_assert(a.n_ids != b.n_ids || memcmp(a.ids, b.ids, a.n_ids * 4) != 0);
  bn_spec_free(&a);
  bn_spec_free(&b);
  bn_workload_free(&w);
  bn_workload_free(&w2);
}
END_TEST

START_TEST(text_prompts) {
  char path[] = "/tmp/k3pd-bench-text-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *txt = "hello world\r\n\nsecond prompt\nthird";
  ck_assert_int_eq(write(fd, txt, strlen(txt)), (int)strlen(txt));
  close(fd);
  bn_workload_t w;
  workload(&w, "4", "4");
  ck_assert_int_eq(bn_workload_load_texts(&w, path, err, sizeof err), 0);
  ck_assert_uint_eq(w.n_texts, 3);
  bn_req_spec_t s;
  ck_assert_int_eq(bn_spec_make(&w, 4, &s), 0);
  ck_assert_str_eq(s.text, "second prompt");
  ck_assert_ptr_null(s.ids);
  bn_spec_free(&s);
  ck_assert_int_eq(bn_spec_make(&w, 0, &s), 0);
  ck_assert_str_eq(s.text, "hello world");
  bn_workload_free(&w);
  unlink(path);
  ck_assert_int_lt(bn_workload_load_texts(&w, path, err, sizeof err), 0);
  ck_assert(strstr(err, "--prompt-file") != NULL);
}
END_TEST

START_TEST(percentiles) {
  double v[] = {5, 1, 4, 2, 3};
  ck_assert_double_eq_tol(bn_percentile(v, 5, 50), 3.0, 1e-12);
  ck_assert_double_eq_tol(bn_percentile(v, 5, 0), 1.0, 1e-12);
  ck_assert_double_eq_tol(bn_percentile(v, 5, 100), 5.0, 1e-12);
  ck_assert_double_eq_tol(bn_percentile(v, 5, 90), 4.6, 1e-12);
  double one[] = {7};
  ck_assert_double_eq_tol(bn_percentile(one, 1, 99), 7.0, 1e-12);
  ck_assert(isnan(bn_percentile(NULL, 0, 50)));
}
END_TEST

/* The profile's fit: exact data recovers its coefficients; a negative slope is dropped. */
START_TEST(fit_lsq) {
  double X[4 * 3], y[4];
  for (int i = 0; i < 4; i++) {
    X[i * 3] = 1;
    X[i * 3 + 1] = i + 1;
    X[i * 3 + 2] = (i + 1) * (i + 1);
    y[i] = 2 + 3 * (i + 1) + 0.5 * (i + 1) * (i + 1);
  }
  bool nn[3] = {true, true, true};
  double b[3];
  ck_assert_int_eq(bn_fit_lsq(X, y, 4, 3, nn, b), 0);
  ck_assert_double_eq_tol(b[0], 2, 1e-9);
  ck_assert_double_eq_tol(b[1], 3, 1e-9);
  ck_assert_double_eq_tol(b[2], 0.5, 1e-9);
  /* y falls with x: the slope would be -1; non-negative drops it and fits the mean */
  double X2[] = {1, 1, 1, 2, 1, 3}, y2[] = {3, 2, 1};
  ck_assert_int_eq(bn_fit_lsq(X2, y2, 3, 2, nn, b), 0);
  ck_assert_double_eq_tol(b[0], 2, 1e-9);
  ck_assert_double_eq_tol(b[1], 0, 1e-12);
}
END_TEST

/* Metric sums over a scraped text: every series of the exact name, labels or not. */
START_TEST(metric_sum) {
  const char *t = "# HELP x y\nk3pd_a_total{region=\"m\"} 3\nk3pd_a_total{region=\"k\"} 4.5\n"
                  "k3pd_a_total_more 100\nk3pd_b_sum 2.25\nk3pd_b_count 9\n";
  ck_assert_double_eq_tol(bn_metric_sum(t, "k3pd_a_total"), 7.5, 1e-12);
  ck_assert_double_eq_tol(bn_metric_sum(t, "k3pd_b_sum"), 2.25, 1e-12);
  ck_assert_double_eq_tol(bn_metric_sum(t, "k3pd_b"), 0, 1e-12);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bench_workload");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, dist_parse_forms);
  tcase_add_test(tc, dist_parse_errors);
  tcase_add_test(tc, dist_file);
  tcase_add_test(tc, spec_deterministic);
  tcase_add_test(tc, text_prompts);
  tcase_add_test(tc, percentiles);
  tcase_add_test(tc, fit_lsq);
  tcase_add_test(tc, metric_sum);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
