/* The local-prefill threshold (decode_worker/localcost.c, docs/design.md "The local-prefill
 * threshold"): hand-derived expectations for the prefill-time estimate and the derived
 * threshold, and a k3pd-profile/1 file read with errors naming the field. No clock: the costs
 * are given, so the verdicts do not depend on the machine. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "localcost.h"

static dc_costs_t base_costs(void) {
  /* a pass: 2 ms + 0.5 ms/token (+ 0 context); a step: 4 ms + 1 ms per sequence */
  return (dc_costs_t){.pass_fixed_ms = 2, .pass_per_token_ms = 0.5, .chunk_tokens = 256, .step_fixed_ms = 4,
                      .step_per_seq_ms = 1};
}

START_TEST(prefill_estimate) {
  dc_costs_t c = base_costs();
  ck_assert(dc_costs_prefill_ms(&c, 0) == 0);
  ck_assert(dc_costs_prefill_ms(&c, 1) == 2.5);
  ck_assert(dc_costs_prefill_ms(&c, 256) == 2 + 128);
  ck_assert(dc_costs_prefill_ms(&c, 257) == 2 + 128 + 2 + 0.5); /* a second pass */
  c.pass_per_kctx_ms = 2; /* per 1000 x tokens x context before them */
  /* 300 tokens: pass 1 = 256 tokens at context 0, pass 2 = 44 tokens after 256 */
  double want = (2 + 128) + (2 + 22 + 2 * 44.0 * 256 / 1000);
  ck_assert(dc_costs_prefill_ms(&c, 300) == want);
  ck_assert(dc_costs_step_ms(&c, 3, 2000) == 4 + 3);
  c.step_per_kctx_ms = 0.5;
  ck_assert(dc_costs_step_ms(&c, 3, 2000) == 4 + 3 + 1);
}
END_TEST

START_TEST(derive) {
  dc_costs_t c = base_costs();
  char err[256];
  /* budget = 16 steps x (4 + 1) ms = 80 ms; 2 + 0.5 L <= 80 -> L = 156 */
  ck_assert_int_eq(dc_local_max_derive(&c, 16, 100000, err, sizeof err), 156);
  ck_assert(dc_costs_prefill_ms(&c, 156) <= 80 && dc_costs_prefill_ms(&c, 157) > 80);
  /* budget 80 steps x 5 ms = 400 ms spans passes: three full ones (256 tokens, 130 ms each) =
   * 390 ms, then 2 + 0.5 x <= 10 -> x = 16: L = 784 */
  ck_assert_int_eq(dc_local_max_derive(&c, 80, 100000, err, sizeof err), 256 * 3 + 16);
  ck_assert(dc_costs_prefill_ms(&c, 784) <= 400 && dc_costs_prefill_ms(&c, 785) > 400);
  /* clamped to the cap; 0 when even one token is over */
  ck_assert_int_eq(dc_local_max_derive(&c, 1e6, 4096, err, sizeof err), 4096);
  ck_assert_int_eq(dc_local_max_derive(&c, 0.4, 4096, err, sizeof err), 0);
  /* a costlier prefill (context term) lowers it; a costlier step raises it */
  dc_costs_t k = c;
  k.pass_per_kctx_ms = 1;
  ck_assert_int_lt(dc_local_max_derive(&k, 80, 100000, err, sizeof err), 784);
  k = c;
  k.step_fixed_ms = 9;
  ck_assert_int_gt(dc_local_max_derive(&k, 16, 100000, err, sizeof err), 156);
  /* the reference step is a full batch: 4 sequences -> 4 + 4 x 1 = 8 ms (+ 0.5 ms per 1000
   * tokens of context: 4 x 256 -> 0.512 ms); budget 16 x 8.512 = 136.192 ms: one full pass
   * (130 ms) + 2 + 0.5 x <= 136.192 -> x = 8: L = 264 */
  k = c;
  k.step_batch = 4;
  ck_assert(dc_costs_ref_step_ms(&k) == 8);
  ck_assert_int_eq(dc_local_max_derive(&k, 16, 100000, err, sizeof err), 252);
  k.step_per_kctx_ms = 0.5;
  ck_assert(dc_costs_ref_step_ms(&k) == 8 + 0.5 * 1024 / 1000.0);
  ck_assert_int_eq(dc_local_max_derive(&k, 16, 100000, err, sizeof err), 264);
  /* no step cost or no prefill cost: no bound; the error names the fields */
  k = c;
  k.step_fixed_ms = k.step_per_seq_ms = 0;
  ck_assert_int_eq(dc_local_max_derive(&k, 16, 4096, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "decode.step_fixed_ms"));
  k = c;
  k.pass_fixed_ms = k.pass_per_token_ms = 0;
  ck_assert_int_eq(dc_local_max_derive(&k, 16, 4096, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "prefill.pass_per_token_ms"));
}
END_TEST

static const char *write_file(const char *name, const char *text) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", TESTDATA_DIR, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  return path;
}

START_TEST(profile_file) {
  char err[512];
  dc_costs_t c = {.chunk_tokens = 128, .step_per_kctx_ms = 7};
  const char *p = write_file("lc_ok.json",
                             "{\"schema\": \"k3pd-profile/1\", \"source\": \"h200 run\", \"prefill\": {"
                             "\"pass_fixed_ms\": 3, \"pass_per_seq_ms\": 1, \"pass_per_token_ms\": 0.25, "
                             "\"chunk_tokens\": 512}, \"decode\": {\"step_fixed_ms\": 10, \"step_per_seq_ms\": 0.5}}");
  ck_assert_int_eq(dc_costs_load(p, &c, err, sizeof err), 0);
  ck_assert(c.pass_fixed_ms == 3 && c.pass_per_seq_ms == 1 && c.pass_per_token_ms == 0.25);
  ck_assert(c.step_fixed_ms == 10 && c.step_per_seq_ms == 0.5);
  ck_assert_int_eq(c.chunk_tokens, 128);   /* this worker's chunk, not the profile's */
  ck_assert(c.step_per_kctx_ms == 7);     /* absent: kept */
  ck_assert_ptr_nonnull(strstr(c.source, "h200 run"));
  c.step_per_kctx_ms = 0;
  /* 16 x (10 + 0.5) = 168 ms; passes of 128 tokens cost 4 + 32 = 36 ms: 4 passes = 144, then
   * 4 + 0.25 x <= 24 -> x = 80: L = 592 */
  ck_assert_int_eq(dc_local_max_derive(&c, 16, 1 << 20, err, sizeof err), 4 * 128 + 80);

  dc_costs_t before = c;
  p = write_file("lc_neg.json", "{\"schema\": \"k3pd-profile/1\", \"prefill\": {\"pass_per_token_ms\": -0.1}}");
  ck_assert_int_eq(dc_costs_load(p, &c, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "prefill.pass_per_token_ms"));
  ck_assert(memcmp(&c, &before, sizeof c) == 0); /* on error nothing changed */
  p = write_file("lc_str.json", "{\"schema\": \"k3pd-profile/1\", \"decode\": {\"step_fixed_ms\": \"5\"}}");
  ck_assert_int_eq(dc_costs_load(p, &c, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "decode.step_fixed_ms: want a number"));
  p = write_file("lc_schema.json", "{\"schema\": \"k3pd-profile/2\"}");
  ck_assert_int_eq(dc_costs_load(p, &c, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "schema"));
  p = write_file("lc_obj.json", "{\"schema\": \"k3pd-profile/1\", \"decode\": 3}");
  ck_assert_int_eq(dc_costs_load(p, &c, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "decode: want an object"));
  p = write_file("lc_bad.json", "{\"schema\": ");
  ck_assert_int_eq(dc_costs_load(p, &c, err, sizeof err), K3_EINVAL);
  ck_assert(memcmp(&c, &before, sizeof c) == 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("dc_localcost");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, prefill_estimate);
  tcase_add_test(tc, derive);
  tcase_add_test(tc, profile_file);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
