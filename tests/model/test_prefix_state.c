/* What the decode worker's prefix cache relies on (docs/design.md, "Prefix cache"), on both
 * tiny presets, fp32 and bf16, backends cpu and cpu-fast:
 *   - prefill(A) then prefill(B) == prefill(A|B) bit for bit when |A| is a multiple of 64 (the
 *     KDA chunk), for every such split of a 200-token prompt (fp32 with 64-token prefill chunks,
 *     bf16 with 256) and of a 130-token one on the reference backend (bf16);
 *   - a KDA checkpoint taken with k3_runner_slot_copy at such a split, continued in another slot
 *     over the SAME (shared, read-only) prefix pages plus fresh pages, gives the logits and the
 *     following decode steps of the never-checkpointed sequence, bit for bit;
 *   - splits that are not multiples of 64 are reported (the test prints whether they happen to
 *     be exact; the cache never uses them).
 * All sequences run with every id claimed (k3_runner_claim_all), as the decode worker does. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/weights.h"

static const char *PRESETS[2] = {"tiny", "tiny-48b"};
static k3_weights_t *g_w[2];
#define TMAX 200
#define PT 16

static int load_weights(void) {
  for (int p = 0; p < 2; p++) {
    const char *json = k3_model_config_preset(PRESETS[p]);
    k3_model_config_t cfg;
    char err[512] = "";
    int rc = json ? k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err) : K3_ENOENT;
    if (!rc) rc = k3_weights_synth(&cfg, 1, &g_w[p], err, sizeof err);
    if (rc) {
      fprintf(stderr, "test_prefix_state: %s weights: %s (%s)\n", PRESETS[p], err, k3_strerror(rc));
      return rc;
    }
  }
  return 0;
}

static k3_runner_t *mk(int p, k3_runner_precision_t prec, const char *be, int chunk) {
  k3_runner_opts_t o;
  k3_runner_opts_default(&o);
  o.precision = prec;
  o.backend = be;
  o.threads = 2;
  o.page_tokens = PT;
  o.num_pages = 128;
  o.num_slots = 8;
  o.max_batch_seqs = 4;
  o.prefill_chunk_tokens = chunk;
  k3_runner_t *r = NULL;
  char err[512];
  int rc = k3_runner_init(g_w[p], &o, &r, err, sizeof err);
  ck_assert_msg(rc == 0, "runner init: %s", err);
  ck_assert_int_eq(k3_runner_claim_all(r), 0);
  return r;
}

static int32_t tok(int64_t t) { return (int32_t)((t * 131 + 7) % 4000); }

typedef struct {
  k3_seq_t seq;
  int32_t pages[64];
} tseq_t;

/* A sequence over pages [first, first + n) of the pool and slot `slot`. */
static void seq_at(tseq_t *s, int slot, int first, int n) {
  memset(s, 0, sizeof *s);
  s->seq.slot = slot;
  s->seq.pages = s->pages;
  s->seq.cap_pages = 64;
  s->seq.n_pages = n;
  for (int i = 0; i < n; i++) s->pages[i] = first + i;
}

static void prefill(k3_runner_t *r, tseq_t *s, int64_t from, int64_t n, float *lg) {
  int32_t ids[TMAX];
  for (int64_t i = 0; i < n; i++) ids[i] = tok(from + i);
  k3_prefill_item_t it = {&s->seq, ids, n, lg, false};
  char err[512];
  int rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err);
  ck_assert_msg(rc == 0, "prefill [%lld, %lld): %s", (long long)from, (long long)(from + n), err);
}

static void decode(k3_runner_t *r, tseq_t *s, int32_t id, float *lg) {
  k3_decode_item_t d = {.seq = &s->seq, .token = id, .logits = lg};
  char err[512];
  ck_assert_msg(k3_runner_decode_step(r, &d, 1, err, sizeof err) == 0, "decode: %s", err);
}

/* T-token prompt; every 64-multiple split checked. */
static void run_case(int p, k3_runner_precision_t prec, const char *be, int chunk, int64_t T) {
  const char *pn = prec == K3_RUNNER_FP32 ? "fp32" : "bf16";
  k3_runner_t *r = mk(p, prec, be, chunk);
  int64_t V = k3_runner_vocab(r);
  size_t vb = (size_t)V * 4;
  float *ref = malloc(vb * 3), *got = malloc(vb * 3);
  /* reference: one call, then two decode steps */
  tseq_t a;
  seq_at(&a, 0, 0, 40);
  prefill(r, &a, 0, T, ref);
  decode(r, &a, 11, ref + V);
  decode(r, &a, 12, ref + 2 * V);
  for (int64_t split = 64; split < T; split += 64) {
    /* the prompt's prefix [0, split) in slot 1 / pages 40.., checkpoint into slot 2 */
    tseq_t b, c;
    seq_at(&b, 1, 40, 40);
    prefill(r, &b, 0, split, NULL);
    ck_assert_int_eq(k3_runner_slot_copy(r, 2, 1), 0);
    /* continue the original in slot 1 */
    prefill(r, &b, split, T - split, got);
    ck_assert_msg(memcmp(ref, got, vb) == 0, "%s %s %s chunk %d: split at %lld differs", PRESETS[p], pn, be,
                  chunk, (long long)split);
    /* continue the checkpoint in slot 3 over the shared prefix pages + fresh pages 80.. */
    ck_assert_int_eq(k3_runner_slot_copy(r, 3, 2), 0);
    seq_at(&c, 3, 80, 40);
    int shared = (int)(split / PT);
    for (int i = 0; i < shared; i++) c.pages[i] = 40 + i;
    c.seq.len = split;
    prefill(r, &c, split, T - split, got);
    decode(r, &c, 11, got + V);
    decode(r, &c, 12, got + 2 * V);
    ck_assert_msg(memcmp(ref, got, vb * 3) == 0, "%s %s %s chunk %d: checkpoint at %lld continued differs",
                  PRESETS[p], pn, be, chunk, (long long)split);
  }
  /* unaligned splits: informative only */
  int exact = 0, tried = 0;
  for (int64_t split = 37; split < T; split += 100) {
    tseq_t b;
    seq_at(&b, 1, 40, 40);
    prefill(r, &b, 0, split, NULL);
    prefill(r, &b, split, T - split, got);
    tried++;
    exact += memcmp(ref, got, vb) == 0;
  }
  printf("%s %s %s chunk %d: aligned splits exact; unaligned splits exact %d of %d\n", PRESETS[p], pn, be, chunk,
         exact, tried);
  free(ref);
  free(got);
  k3_runner_free(r);
}

START_TEST(test_split_fast) {
  /* both precisions, both prefill chunk sizes (a split inside and at a chunk's end) */
  run_case(_i, K3_RUNNER_FP32, "cpu-fast", 64, TMAX);
  run_case(_i, K3_RUNNER_BF16, "cpu-fast", 256, TMAX);
}
END_TEST

/* the reference backend (slow, above all under ASan): a shorter prompt, splits at 64 and 128 */
START_TEST(test_split_ref) { run_case(_i, K3_RUNNER_BF16, "cpu", 256, 130); }
END_TEST

START_TEST(test_slot_copy_errors) {
  k3_runner_t *r = mk(_i, K3_RUNNER_FP32, "cpu-fast", 256);
  ck_assert_int_eq(k3_runner_slot_copy(r, 1, 1), K3_EINVAL);
  ck_assert_int_eq(k3_runner_slot_copy(r, -1, 1), K3_EINVAL);
  ck_assert_int_eq(k3_runner_slot_copy(r, 1, 8), K3_EINVAL);
  k3_runner_free(r);
}
END_TEST

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (load_weights()) return 1;
  Suite *su = suite_create("prefix_state");
  struct {
    const char *name;
    const TTest *fn;
  } tests[] = {{"split_fast", test_split_fast}, {"split_ref", test_split_ref}, {"slot_copy_errors", test_slot_copy_errors}};
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    TCase *tc = tcase_create(tests[i].name);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, tests[i].fn, 0, 2);
    suite_add_tcase(su, tc);
  }
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int p = 0; p < 2; p++) k3_weights_free(g_w[p]);
  k3k_backends_shutdown();
  return failed ? 1 : 0;
}
