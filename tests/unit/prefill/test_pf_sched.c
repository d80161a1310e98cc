/* The prefill worker's fair chunked scheduling policy (prefill_worker/sched.h), simulated pass
 * by pass: no runner, no clock. Every figure is a count of passes, so the verdicts do not
 * depend on the machine.
 *   - the case: a short prompt arriving behind eight 2,000-token prompts runs in the
 *     next pass (its wait spans at most 2 passes: the one running and its own);
 *   - chunks never exceed the runner chunk, passes respect the token budget and the batch;
 *   - a long prompt under a steady stream of short ones is not starved (aging bound);
 *   - ties keep arrival order; the admission headroom rule. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "sched.h"

#define C 256
#define BUDGET 4096

typedef struct {
  int64_t n, done;
  uint32_t waited;
  int first_pass, last_pass; /* -1 = not yet */
  int arrived;               /* pass index in progress (or next) when it arrived */
} sim_t;

/* One pass over the unfinished prompts of s[0..n); returns how many ran. */
static int sim_pass(sim_t *s, int n, int pass, int max_seqs, int64_t budget) {
  pf_cand_t c[64];
  int idx[64], order[64];
  int64_t score[64];
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (s[i].done >= s[i].n) continue;
    c[m] = (pf_cand_t){.remaining = s[i].n - s[i].done, .waited = s[i].waited};
    idx[m++] = i;
  }
  int chosen = pf_sched_pick(c, m, C, budget, max_seqs, order, score);
  int64_t toks = 0;
  int seqs = 0;
  for (int k = 0; k < m; k++) {
    sim_t *x = &s[idx[k]];
    x->waited = c[k].waited;
    if (!c[k].take) continue;
    ck_assert_int_le(c[k].take, C);
    ck_assert_int_le(c[k].take, x->n - x->done);
    toks += c[k].take;
    seqs++;
    if (x->first_pass < 0) x->first_pass = pass;
    x->done += c[k].take;
    if (x->done == x->n) x->last_pass = pass;
  }
  ck_assert_int_eq(seqs, chosen);
  ck_assert_int_le(seqs, max_seqs);
  if (seqs > 1) ck_assert_int_le(toks, budget);
  return chosen;
}

START_TEST(test_short_behind_eight_long) {
  sim_t s[9];
  memset(s, 0, sizeof s);
  for (int i = 0; i < 9; i++) s[i] = (sim_t){.n = i < 8 ? 2000 : 8, .first_pass = -1, .last_pass = -1};
  int pass = 0;
  /* the eight long prompts run for three passes, then the short one arrives (during pass 3) */
  for (; pass < 3; pass++) ck_assert_int_eq(sim_pass(s, 8, pass, 16, BUDGET), 8);
  s[8].arrived = pass;     /* pass 3 is in progress when it arrives: it can join pass 4 */
  sim_pass(s, 8, pass++, 16, BUDGET);
  while (s[8].last_pass < 0) sim_pass(s, 9, pass++, 16, BUDGET);
  int spanned = s[8].last_pass - s[8].arrived + 1;
  ck_assert_msg(spanned <= 2, "the 8-token prompt waited %d passes", spanned);
  /* and the long ones keep progressing in the same passes (nobody was pushed out: budget) */
  while (1) {
    bool left = false;
    for (int i = 0; i < 8; i++) left |= s[i].done < s[i].n;
    if (!left) break;
    sim_pass(s, 9, pass++, 16, BUDGET);
  }
  for (int i = 0; i < 8; i++) ck_assert_int_eq(s[i].last_pass, 7); /* ceil(2000/256) = 8 passes */
}
END_TEST

/* With a saturated budget (eight chunks fill it), the short prompt still goes first. */
START_TEST(test_short_first_when_budget_full) {
  sim_t s[9];
  for (int i = 0; i < 9; i++) s[i] = (sim_t){.n = i < 8 ? 2000 : 8, .first_pass = -1, .last_pass = -1};
  int pass = 0;
  for (; pass < 2; pass++) sim_pass(s, 8, pass, 16, 8 * C);
  s[8].arrived = pass;
  while (s[8].last_pass < 0) sim_pass(s, 9, pass++, 16, 8 * C);
  ck_assert_int_eq(s[8].last_pass, s[8].arrived);
}
END_TEST

/* A long prompt facing a new short prompt every pass that fills the batch: aging bounds its
 * wait to about remaining / C passes between its chunks. */
START_TEST(test_long_not_starved) {
  enum { N = 200 };
  sim_t *s = calloc(N, sizeof *s);
  s[0] = (sim_t){.n = 1024, .first_pass = -1, .last_pass = -1};
  int n = 1;
  int pass = 0, last_run = -1, max_gap = 0;
  while (s[0].last_pass < 0 && pass < N - 1) {
    s[n++] = (sim_t){.n = 100, .first_pass = -1, .last_pass = -1}; /* one newcomer per pass */
    int64_t before = s[0].done;
    sim_pass(s, n, pass, 1, BUDGET); /* one prompt per pass: the hardest case */
    if (s[0].done != before) {
      if (pass - last_run > max_gap) max_gap = pass - last_run;
      last_run = pass;
    }
    pass++;
  }
  ck_assert_msg(s[0].last_pass >= 0, "the long prompt never finished in %d passes", pass);
  ck_assert_msg(max_gap <= 1024 / C + 1, "the long prompt waited %d passes between chunks", max_gap);
  free(s);
}
END_TEST

START_TEST(test_ties_and_budget) {
  /* equal prompts run in arrival order when only two fit */
  pf_cand_t c[3] = {{.remaining = 300}, {.remaining = 300}, {.remaining = 300}};
  int order[3];
  int64_t score[3];
  ck_assert_int_eq(pf_sched_pick(c, 3, C, 2 * C, 16, order, score), 2);
  ck_assert_int_eq(c[0].take, C);
  ck_assert_int_eq(c[1].take, C);
  ck_assert_int_eq(c[2].take, 0);
  ck_assert_int_eq(c[2].waited, 1);
  /* next pass: the waiting one's score (300 - 256) ties the two 44-token remainders: arrival
   * order, and its 256-token chunk no longer fits the budget */
  c[0].remaining = c[1].remaining = 300 - C;
  ck_assert_int_eq(pf_sched_pick(c, 3, C, C, 16, order, score), 2);
  ck_assert_int_eq(c[2].waited, 2);
  /* then it goes first */
  c[0].remaining = c[1].remaining = 0;
  ck_assert_int_eq(pf_sched_pick(c, 3, C, C, 16, order, score), 1);
  ck_assert_int_eq(c[2].take, C);
  /* a chunk alone over the budget still runs (the first chosen always does) */
  pf_cand_t big = {.remaining = 5000};
  ck_assert_int_eq(pf_sched_pick(&big, 1, C, 10, 16, order, score), 1);
  ck_assert_int_eq(big.take, C);
  /* a smaller one further down fills what the budget leaves */
  pf_cand_t d[3] = {{.remaining = 200}, {.remaining = 250}, {.remaining = 10}};
  ck_assert_int_eq(pf_sched_pick(d, 3, C, 215, 16, order, score), 2);
  ck_assert_int_eq(d[2].take, 10);
  ck_assert_int_eq(d[0].take, 200);
  ck_assert_int_eq(d[1].take, 0);
  ck_assert_int_eq(pf_sched_pick(d, 0, C, 215, 16, order, score), 0);
}
END_TEST

START_TEST(test_headroom) {
  /* single-pass prompts always pass; multi-pass ones need a spare slot and a chunk's pages */
  ck_assert(pf_sched_headroom_ok(C, C, 5, 1, 4, 4, 4));
  ck_assert(!pf_sched_headroom_ok(C + 1, C, 5, 1, 100, 5, 4));
  ck_assert(pf_sched_headroom_ok(C + 1, C, 5, 2, 100, 5, 4));
  ck_assert(!pf_sched_headroom_ok(C + 1, C, 5, 2, 8, 5, 4));
  /* nothing else holds state: admit (nobody could free room for it later) */
  ck_assert(pf_sched_headroom_ok(4000, C, 0, 1, 63, 63, 4));
}
END_TEST

int main(void) {
  Suite *s = suite_create("pf_sched");
  TCase *t = tcase_create("core");
  tcase_add_test(t, test_short_behind_eight_long);
  tcase_add_test(t, test_short_first_when_budget_full);
  tcase_add_test(t, test_long_not_starved);
  tcase_add_test(t, test_ties_and_budget);
  tcase_add_test(t, test_headroom);
  suite_add_tcase(s, t);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int f = srunner_ntests_failed(r);
  srunner_free(r);
  return f ? 1 : 0;
}
