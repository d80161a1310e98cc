/* k3pd-generate's prompt inputs, run as a program (label `model`):
 *   - --prompt TEXT gives exactly what --prompt-ids <k3_tok_encode(TEXT)> gives (ids line and
 *     the float32 logits file, byte for byte), for the K3 and the 48B tokenizer tables;
 *   - --chat FILE gives exactly what --prompt-ids <k3_chat_render_json(FILE)> gives (default
 *     options: the router's), both model types;
 *   - --device NAME is the documented name of the backend flag: --device cpu gives exactly what
 *     --backend cpu gives (ids and logits, byte for byte), --help lists both, disagreeing values
 *     and unknown devices are refused with a clear error;
 *   - --perf prints the prefill and batch-B figures with their ceilings and leaves the
 *     generated ids unchanged; --perf-batch without --perf is refused;
 *   - clear errors: text without a tokenizer, two prompt sources, a bad chat file (the message
 *     names the field), a missing chat file, a tokenizer larger than the model's vocabulary.
 * The tokenizer is the deterministic tiny vocabulary of k3_tok_write_model_files (4096 ids, the
 * size of the tiny presets); weights are the seed-1 synthetic presets. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3pd/chat.h"
#include "k3pd/err.h"
#include "k3pd/tokenizer.h"
#include "k3pd/util.h"

static char g_tmp[256];
static char g_bin[1024];

typedef struct {
  int status;   /* exit status */
  char *out;    /* stdout + stderr */
} res_t;

/* Runs k3pd-generate with args (already shell-quoted), capturing both streams. */
static res_t gen(const char *args) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", g_bin, args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 2) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  int st = pclose(p);
  return (res_t){WIFEXITED(st) ? WEXITSTATUS(st) : -1, buf};
}

/* The "ids: ..." line of an output (copied), or NULL. */
static char *ids_line(const char *out) {
  const char *p = strstr(out, "\nids:");
  if (!p && !strncmp(out, "ids:", 4)) p = out - 1;
  if (!p) return NULL;
  p++;
  size_t n = strcspn(p, "\n");
  char *s = malloc(n + 1);
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

static char *ids_csv(const k3_tok_ids_t *v) {
  char *s = malloc(v->n * 12 + 1);
  size_t o = 0;
  for (size_t i = 0; i < v->n; i++) o += (size_t)sprintf(s + o, "%s%d", i ? "," : "", v->ids[i]);
  s[o] = 0;
  return s;
}

static void mkvocab(const char *type, char *dir, size_t dlen) {
  snprintf(dir, dlen, "%s/%s", g_tmp, type);
  mkdir(dir, 0700);
  char err[512];
  ck_assert_msg(k3_tok_write_model_files(dir, type, 4096, err, sizeof err) == 0, "%s", err);
}

/* Same ids line and byte-identical logits file for two argument sets. */
static void same_run(const char *a, const char *b) {
  char fa[512], fb[512], args[8192];
  snprintf(fa, sizeof fa, "%s/a.bin", g_tmp);
  snprintf(fb, sizeof fb, "%s/b.bin", g_tmp);
  snprintf(args, sizeof args, "%s --max-new-tokens 2 --ignore-eos --logits-out %s --all-logits", a, fa);
  res_t ra = gen(args);
  snprintf(args, sizeof args, "%s --max-new-tokens 2 --ignore-eos --logits-out %s --all-logits", b, fb);
  res_t rb = gen(args);
  ck_assert_msg(ra.status == 0, "run A failed: %s", ra.out);
  ck_assert_msg(rb.status == 0, "run B failed: %s", rb.out);
  char *ia = ids_line(ra.out), *ib = ids_line(rb.out);
  ck_assert_ptr_nonnull(ia);
  ck_assert_ptr_nonnull(ib);
  ck_assert_str_eq(ia, ib);
  char *da, *db;
  size_t la, lb;
  ck_assert_int_eq(k3_read_file(fa, &da, &la), 0);
  ck_assert_int_eq(k3_read_file(fb, &db, &lb), 0);
  ck_assert_uint_eq(la, lb);
  ck_assert_uint_gt(la, 32);
  ck_assert_msg(memcmp(da, db, la) == 0, "logits differ between '%s' and '%s'", a, b);
  free(da), free(db), free(ia), free(ib), free(ra.out), free(rb.out);
}

static const char *PRESET[2] = {"tiny", "tiny-48b"};
static const char *TYPE[2] = {"kimi_k3", "kimi_linear"};

START_TEST(test_prompt_text) {
  char dir[512], err[512], a[4096], b[4096];
  mkvocab(TYPE[_i], dir, sizeof dir);
  k3_tok_t *tok = NULL;
  ck_assert_msg(k3_tok_load(dir, NULL, &tok, err, sizeof err) == 0, "%s", err);
  /* a control token typed as text must stay plain BPE (specials disallowed) */
  const char *text = "Hello world <|end_of_msg|> 42";
  k3_tok_ids_t v = {0};
  ck_assert_int_eq(k3_tok_encode(tok, text, strlen(text), 0, &v, err, sizeof err), 0);
  ck_assert_uint_gt(v.n, 3);
  for (size_t i = 0; i < v.n; i++) ck_assert(!k3_tok_is_special(tok, v.ids[i]));
  char *csv = ids_csv(&v);
  snprintf(a, sizeof a, "--synthetic %s --tokenizer %s --prompt '%s'", PRESET[_i], dir, text);
  snprintf(b, sizeof b, "--synthetic %s --prompt-ids %s", PRESET[_i], csv);
  same_run(a, b);
  free(csv);
  free(v.ids);
  k3_tok_free(tok);
}
END_TEST

START_TEST(test_chat) {
  char dir[512], err[512], a[4096], b[4096], path[512];
  mkvocab(TYPE[_i], dir, sizeof dir);
  snprintf(path, sizeof path, "%s/chat_%d.json", g_tmp, _i);
  const char *chat = "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":\"What is 2+2?\"}]";
  ck_assert_int_eq(k3_write_file(path, chat, strlen(chat)), 0);
  k3_tok_t *tok = NULL;
  ck_assert_msg(k3_tok_load(dir, NULL, &tok, err, sizeof err) == 0, "%s", err);
  k3_chat_opts_t o;
  k3_chat_opts_default(&o);
  k3_tok_ids_t v = {0};
  ck_assert_msg(k3_chat_render_json(tok, chat, strlen(chat), &o, &v, err, sizeof err) == 0, "%s", err);
  int specials = 0;
  for (size_t i = 0; i < v.n; i++) specials += k3_tok_is_special(tok, v.ids[i]);
  ck_assert_int_ge(specials, 4); /* role markers are ids, not text */
  char *csv = ids_csv(&v);
  snprintf(a, sizeof a, "--synthetic %s --tokenizer %s --chat %s", PRESET[_i], dir, path);
  snprintf(b, sizeof b, "--synthetic %s --prompt-ids %s", PRESET[_i], csv);
  same_run(a, b);
  free(csv);
  free(v.ids);
  k3_tok_free(tok);
}
END_TEST

static void expect_fail(const char *args, const char *needle) {
  res_t r = gen(args);
  ck_assert_msg(r.status == 2, "'%s' exited %d: %s", args, r.status, r.out);
  ck_assert_msg(strstr(r.out, needle) != NULL, "'%s': no '%s' in: %s", args, needle, r.out);
  ck_assert_msg(strstr(r.out, "ids:") == NULL, "'%s' produced ids: %s", args, r.out);
  free(r.out);
}

START_TEST(test_errors) {
  char dir[512], args[4096], path[512], big[512];
  mkvocab("kimi_k3", dir, sizeof dir);
  expect_fail("--synthetic tiny --prompt 'hi'", "--tokenizer");
  expect_fail("--synthetic tiny --prompt-ids 1,2 --prompt 'hi'", "exactly one");
  snprintf(args, sizeof args, "--synthetic tiny --tokenizer %s --chat %s/nope.json", dir, g_tmp);
  expect_fail(args, "nope.json");
  snprintf(path, sizeof path, "%s/bad.json", g_tmp);
  const char *bad = "[{\"role\":\"developer\",\"content\":\"x\"}]";
  ck_assert_int_eq(k3_write_file(path, bad, strlen(bad)), 0);
  snprintf(args, sizeof args, "--synthetic tiny --tokenizer %s --chat %s", dir, path);
  expect_fail(args, "messages[0].role");
  /* a 4160-id tokenizer against the 4096-id model: refused, never truncated */
  snprintf(big, sizeof big, "%s/big", g_tmp);
  mkdir(big, 0700);
  char err[512];
  ck_assert_msg(k3_tok_write_model_files(big, "kimi_k3", 4160, err, sizeof err) == 0, "%s", err);
  snprintf(args, sizeof args, "--synthetic tiny --tokenizer %s --prompt 'hi'", big);
  expect_fail(args, "vocabulary");
}
END_TEST

START_TEST(test_device) {
  same_run("--synthetic tiny --prompt-ids 5,6,7,8 --backend cpu",
           "--synthetic tiny --prompt-ids 5,6,7,8 --device cpu");
  same_run("--synthetic tiny-48b --prompt-ids 9,10 --backend cpu-fast --threads 2",
           "--synthetic tiny-48b --prompt-ids 9,10 --device cpu-fast --backend cpu-fast --threads 2");
  res_t h = gen("--help");
  ck_assert_int_eq(h.status, 0);
  ck_assert_msg(strstr(h.out, "--device NAME") && strstr(h.out, "alias of --device"), "%s", h.out);
  free(h.out);
  expect_fail("--synthetic tiny --prompt-ids 1 --device cpu --backend cpu-fast", "disagree");
  expect_fail("--synthetic tiny --prompt-ids 1 --device tpu", "unknown --device 'tpu'");
}
END_TEST

/* --perf: the figures are printed (a second prefill against its FLOP floor, batch-B decode
 * against its weight-read floor) and the generation itself is unchanged by them. */
START_TEST(test_perf) {
  const char *base = "--synthetic tiny --device cpu-fast --prompt-ids 5,6,7,8,9,10,11,12,13,14,15,16 "
                     "--max-new-tokens 3 --ignore-eos";
  char args[1024];
  res_t plain = gen(base);
  snprintf(args, sizeof args, "%s --perf --perf-batch 3", base);
  res_t perf = gen(args);
  ck_assert_msg(plain.status == 0 && perf.status == 0, "%s\n%s", plain.out, perf.out);
  char *a = ids_line(plain.out), *b = ids_line(perf.out);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_str_eq(a, b);
  const char *p = strstr(perf.out, "perf: prefill 12 tokens (second pass) ");
  ck_assert_msg(p && strstr(p, "vs FLOP floor") && strstr(p, "bf16 GEMM 512^3"), "%s", perf.out);
  p = strstr(perf.out, "perf: decode batch 3 (prompts of 12 tokens) ");
  ck_assert_msg(p && strstr(p, "tokens/s ceiling"), "%s", perf.out);
  double ms = 0, tps = 0;
  ck_assert_int_eq(sscanf(p, "perf: decode batch 3 (prompts of 12 tokens) %lf ms/step = %lf", &ms, &tps), 2);
  ck_assert(ms > 0 && tps > 0);
  ck_assert_double_eq_tol(tps, 3 / (ms / 1e3), tps * 0.01 + 1);
  ck_assert_msg(strstr(perf.out, "perf: decode batch 1 "), "%s", perf.out);
  free(a), free(b), free(plain.out), free(perf.out);
  snprintf(args, sizeof args, "%s --perf-batch 3", base);
  expect_fail(args, "--perf-batch must be 0..4096 and needs --perf");
  expect_fail("--synthetic tiny --prompt-ids 1 --prefill-chunk 0", "--prefill-chunk 1..1048576");
}
END_TEST

/* --requests: one process, several requests; a free request equals its own run; a request
 * teacher-forced on its own ids has no divergence; one forced on other ids reports every step
 * (tiny's logits are far from ties: NOT-near-tie) and the first token as different. */
START_TEST(test_requests) {
  res_t a = gen("--synthetic tiny --prompt-ids 5,6,7 --max-new-tokens 4 --ignore-eos");
  res_t b = gen("--synthetic tiny --prompt-ids 9,10 --max-new-tokens 3 --ignore-eos --temperature 0.8 --seed 11");
  ck_assert_msg(a.status == 0 && b.status == 0, "%s\n%s", a.out, b.out);
  char *ia = ids_line(a.out), *ib = ids_line(b.out);
  char teach[256], path[512], args[1024];
  snprintf(teach, sizeof teach, "%s", ia + 5);
  for (char *c = teach; *c; c++)
    if (*c == ' ') *c = ',';
  snprintf(path, sizeof path, "%s/reqs.txt", g_tmp);
  char file[1024];
  int n = snprintf(file, sizeof file, "# comment\n5,6,7\n9,10\t\t3\t11\n5,6,7\t%s\n5,6,7\t1,2,3,4\n", teach);
  ck_assert_int_eq(k3_write_file(path, file, (size_t)n), 0);
  snprintf(args, sizeof args, "--synthetic tiny --requests %s --max-new-tokens 4 --ignore-eos --temperature 0.8", path);
  res_t r = gen(args);
  ck_assert_msg(r.status == 0, "%s", r.out);
  /* request 0 at temperature 0.8 seed 0 differs from the greedy run; run it greedy separately */
  char want[512];
  snprintf(want, sizeof want, "req 1 %s\n", ib);
  ck_assert_msg(strstr(r.out, want), "want '%s' in: %s", want, r.out);
  ck_assert_msg(strstr(r.out, "req 3 diverge step 0 mono"), "%s", r.out);
  ck_assert_msg(strstr(r.out, "req 3 teacher: steps 4 divergences 4 near_ties 0 first_token DIFFERENT"), "%s", r.out);
  ck_assert_msg(strstr(r.out, "requests: 4 teacher_forced 2 "), "%s", r.out);
  free(r.out);
  snprintf(args, sizeof args, "--synthetic tiny --requests %s --max-new-tokens 4 --ignore-eos", path);
  r = gen(args); /* greedy: the self-taught request agrees at every step */
  ck_assert_msg(strstr(r.out, "req 2 teacher: steps 4 divergences 0 near_ties 0 first_token same"), "%s", r.out);
  snprintf(want, sizeof want, "req 0 %s\n", ia);
  ck_assert_msg(strstr(r.out, want), "want '%s' in: %s", want, r.out);
  free(r.out);
  n = snprintf(file, sizeof file, "5,6,7\t1,2,x\n");
  ck_assert_int_eq(k3_write_file(path, file, (size_t)n), 0);
  snprintf(args, sizeof args, "--synthetic tiny --requests %s", path);
  expect_fail(args, "--requests line 1: teacher tokens");
  expect_fail("--synthetic tiny --requests /nonexistent/r.txt", "cannot read");
  free(ia), free(ib), free(a.out), free(b.out);
}
END_TEST

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *bd = getenv("K3PD_BUILD_DIR");
  snprintf(g_bin, sizeof g_bin, "%s/tools/generate/k3pd-generate", bd ? bd : ".");
  if (access(g_bin, X_OK)) {
    fprintf(stderr, "test_generate: %s is not built\n", g_bin);
    return 1;
  }
  snprintf(g_tmp, sizeof g_tmp, "/tmp/k3pd_test_generate_XXXXXX");
  if (!mkdtemp(g_tmp)) return 1;
  Suite *su = suite_create("generate");
  TCase *tc = tcase_create("generate");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_prompt_text, 0, 2);
  tcase_add_loop_test(tc, test_chat, 0, 2);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_device);
  tcase_add_test(tc, test_perf);
  tcase_add_test(tc, test_requests);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd)) fprintf(stderr, "test_generate: could not remove %s\n", g_tmp);
  return failed ? 1 : 0;
}
