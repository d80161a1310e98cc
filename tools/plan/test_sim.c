/* Keeps k3pd-plan's simulation core honest on cases small enough to trace by hand, plus one
 * queueing-theory check. Every expectation below is derived in the comment next to it from
 * the policies in sim.c (which mirror prefill_worker/engine.c and decode_worker/engine.c); a
 * change of policy must change these traces knowingly. Deterministic: fixed requests or a
 * fixed seed, no clocks. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"

typedef struct {
  pl_trace_t t[16];
  int n;
} traces_t;

static void on_trace(void *ctx, const pl_trace_t *t) {
  traces_t *tr = ctx;
  if (t->index < 16) tr->t[t->index] = *t;
  tr->n++;
}

/* Costs chosen so every time is a small integer: prefill pass = 1 ms per token, decode step =
 * 10 ms whatever the batch, no handoff time, no overhead. */
static pl_profile_t simple(void) {
  pl_profile_t p;
  pl_profile_default(&p);
  p.pf_per_token_ms = 1;
  p.dc_fixed_ms = 10;
  p.pf.chunk_tokens = 64;
  return p;
}

static pl_result_t run_fixed_cores(const pl_profile_t *p, int P, int D, int cores, const double *at,
                                   const int64_t *pr, const int64_t *out, size_t n, traces_t *tr) {
  pl_cluster_t c = {P, D, cores};
  pl_workload_t w = {0};
  pl_fixed_reqs_t fx = {at, pr, out, n};
  pl_result_t r;
  char err[256];
  ck_assert_int_eq(pl_sim_run(p, &c, &w, &fx, on_trace, tr, &r, err, sizeof err), 0);
  return r;
}

static pl_result_t run_fixed(const pl_profile_t *p, int P, int D, const double *at, const int64_t *pr,
                             const int64_t *out, size_t n, traces_t *tr) {
  return run_fixed_cores(p, P, D, 0, at, pr, out, n, tr);
}

/* One request of 100 prompt tokens and 4 output tokens through chunk 64:
 *   pass 1 takes 64 tokens: 10 ms fixed + 64 = 74 ms; pass 2 takes 36: 10 + 36 = 46 → 120 ms
 *   handoff 5 ms → decode admits at 125 (idle engine): first token, TTFT 125 + 2 overhead
 *   steps of 20 + 5 (batch 1) = 25 ms: tokens 2..4 at 150, 175, 200 → ITL 25, e2e 202. */
START_TEST(test_single_request_chunked) {
  pl_profile_t p = simple();
  p.pf_fixed_ms = 10;
  p.dc_fixed_ms = 20;
  p.dc_per_seq_ms = 5;
  p.ho_latency_ms = 5;
  p.ttft_overhead_ms = 2;
  double at[] = {0};
  int64_t pr[] = {100}, out[] = {4};
  traces_t tr = {0};
  pl_result_t r = run_fixed(&p, 1, 1, at, pr, out, 1, &tr);
  ck_assert_int_eq((int)r.completed, 1);
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 125, 1e-9);
  ck_assert_double_eq_tol(tr.t[0].t_end_ms, 200, 1e-9);
  ck_assert_double_eq_tol(r.ttft_ms.p50, 127, 1e-9);
  ck_assert_double_eq_tol(r.e2e_ms.p50, 202, 1e-9);
  ck_assert_int_eq((int)r.itl_ms.n, 3);
  ck_assert_double_eq_tol(r.itl_ms.p99, 25, 1e-9);
  ck_assert_double_eq_tol(r.itl_ms.mean, 25, 1e-9);
  ck_assert_double_eq_tol(r.dc_batch_avg, 1, 1e-12);
}
END_TEST

/* Three requests, decode --max-batch 2, output 4 each (A: prompt 10 at t 0; B: 2 and C: 3 at t 1):
 *   t 0   A arrives, the idle prefill engine runs pass [A] (10 ms) → 10
 *   t 1   B, C queue
 *   t 10  A done, handed off at once; the engine admits B, C and runs pass [B, C] (5) → 15;
 *         decode admits A (first token 10) and steps [A] → 20
 *   t 15  B, C handed off: their Prefill calls return with the first token (15); the decode
 *         engine is mid-step, they wait in its queue
 *   t 20  A token 2; loop top: B then C go to the head: run [C, B, A]; step [C, B] → 30
 *   t 30  C, B token 2; full batch: rotate 2 → [A, C, B]; step [A, C] → 40
 *   t 40  A, C token 3; rotate → [B, A, C]; step [B, A] → 50
 *   t 50  B token 3, A token 4 (done at 50): run [B, C], rotate 1 → [C, B]; step → 60
 *   t 60  C and B token 4, both done.
 * TTFT: A 10, B 14, C 14. ITL: A 10 20 10, B 15 20 10, C 15 10 20 (B's and C's first gaps hold
 * the wait for the step boundary). */
START_TEST(test_decode_round_robin) {
  pl_profile_t p = simple();
  p.dc.max_batch = 2;
  double at[] = {0, 1, 1};
  int64_t pr[] = {10, 2, 3}, out[] = {4, 4, 4};
  traces_t tr = {0};
  pl_result_t r = run_fixed(&p, 1, 1, at, pr, out, 3, &tr);
  ck_assert_int_eq((int)r.completed, 3);
  double first[] = {10, 15, 15}, end[] = {50, 60, 60};
  for (int i = 0; i < 3; i++) {
    ck_assert_double_eq_tol(tr.t[i].t_first_ms, first[i], 1e-9);
    ck_assert_double_eq_tol(tr.t[i].t_end_ms, end[i], 1e-9);
  }
  ck_assert_int_eq((int)r.itl_ms.n, 9);
  /* nine gaps: 10 10 10 10 15 15 20 20 20 → mean 130/9, p50 15, max 20 */
  ck_assert_double_eq_tol(r.itl_ms.mean, 130.0 / 9.0, 1e-9);
  ck_assert_double_eq_tol(r.itl_ms.p50, 15, 1e-9);
  ck_assert_double_eq_tol(r.itl_ms.max, 20, 1e-9);
  ck_assert_double_eq_tol(r.ttft_ms.mean, 38.0 / 3.0, 1e-9);
}
END_TEST

/* Where TTFT ends (router/flow.c on_prefill_done relays the first token from the Prefill reply).
 * simple(): 1 ms per prefill token, 10 ms per decode step. A (prompt 10, output 3) at 0: pass
 * 0 → 10, first token 10, steps [A] 10 → 20 → 30. B (prompt 5, output 2) at 11: pass 11 → 16,
 * handed off at 16: the Prefill reply carries its first token: TTFT 5, although the decode
 * engine is mid-step until 20; B joins at 20, step [B, A] → 30: B's token 2 at 30 (gap 14).
 * With a prefix hit of 4 tokens on every request (a split request: the decode worker samples
 * the first token itself) A (prompt 14: 10 computed) is the same, B (prompt 9: 5 computed, pass
 * 11 → 16) gets its first token at the admission, 20: TTFT 9, gap 10. */
START_TEST(test_first_token_with_prefill_reply) {
  pl_profile_t p = simple();
  double at[] = {0, 11};
  int64_t pr[] = {10, 5}, out[] = {3, 2};
  traces_t tr = {0};
  pl_result_t r = run_fixed(&p, 1, 1, at, pr, out, 2, &tr);
  ck_assert_int_eq((int)r.completed, 2);
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 10, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_first_ms, 16, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_end_ms, 30, 1e-9);
  ck_assert_double_eq_tol(r.ttft_ms.max, 10, 1e-9); /* A 10, B 5 */
  ck_assert_double_eq_tol(r.ttft_ms.mean, 7.5, 1e-9);
  ck_assert_double_eq_tol(r.itl_ms.max, 14, 1e-9); /* A 10 10, B 14 */

  pl_cluster_t c = {1, 1, 0};
  pl_workload_t w = {.prefix_hit = 1, .prefix_tokens = 4, .seed = 1};
  int64_t pr_hit[] = {14, 9};
  pl_fixed_reqs_t fx = {at, pr_hit, out, 2};
  traces_t th = {0};
  char err[256];
  ck_assert_int_eq(pl_sim_run(&p, &c, &w, &fx, on_trace, &th, &r, err, sizeof err), 0);
  ck_assert_double_eq_tol(th.t[0].t_first_ms, 10, 1e-9);
  ck_assert_double_eq_tol(th.t[1].t_first_ms, 20, 1e-9);
  ck_assert_double_eq_tol(th.t[1].t_end_ms, 30, 1e-9);
  ck_assert_double_eq_tol(r.ttft_ms.mean, 9.5, 1e-9); /* A 10, B 9 */
  ck_assert_double_eq_tol(r.itl_ms.max, 10, 1e-9);
}
END_TEST

/* Fair chunked prefill: a long prompt L (300 tokens, chunk 64) in service when a short one S
 * (20 tokens) arrives. Passes: [L 64] 0→64; S arrives at 10; pass 2 picks S first (score 20 <
 * 236), both fit the budget: [S 20, L 64] → 148; S done at 148; then L alone: 64 → 212,
 * 64 → 276, 44 → 320. Output 1: the first token (decode idle) ends each request. */
START_TEST(test_prefill_fair_chunks) {
  pl_profile_t p = simple();
  double at[] = {0, 10};
  int64_t pr[] = {300, 20}, out[] = {1, 1};
  traces_t tr = {0};
  run_fixed(&p, 1, 1, at, pr, out, 2, &tr);
  ck_assert_double_eq_tol(tr.t[1].t_first_ms, 148, 1e-9);
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 320, 1e-9);
}
END_TEST

/* Page and slot limits: decode has 3 pages of 64 tokens and 1 slot. Request 0 needs
 * ceil((100 + 100) / 64) = 4 pages > 3: refused. Request 1 (10 + 10 tokens: 1 page) takes the
 * only slot; request 2 arrives while it runs: refused. Request 3 arrives after 1 ended: served. */
START_TEST(test_pages_slots_reject) {
  pl_profile_t p = simple();
  p.dc.num_pages = 3;
  p.dc.num_slots = 1;
  double at[] = {0, 1, 2, 1000};
  int64_t pr[] = {100, 10, 10, 10}, out[] = {100, 10, 10, 10};
  traces_t tr = {0};
  pl_result_t r = run_fixed(&p, 2, 1, at, pr, out, 4, &tr);
  ck_assert_int_eq((int)r.rejected, 2);
  ck_assert_int_eq((int)r.completed, 2);
  ck_assert_int_eq(tr.t[0].decode, -1);
  ck_assert_int_eq(tr.t[2].decode, -1);
  /* request 1: pass 10 ms (arrives at 1) → first token 11, then 9 steps of 10 → ends 101 */
  ck_assert_double_eq_tol(tr.t[1].t_end_ms, 101, 1e-9);
  ck_assert_double_eq_tol(tr.t[3].t_first_ms, 1010, 1e-9);
}
END_TEST

/* Two prefill workers: the router sends each arrival to the one with the fewest unfinished
 * prompt tokens (ties: lower index), so two simultaneous prompts run in parallel. */
START_TEST(test_prefill_least_queued) {
  pl_profile_t p = simple();
  double at[] = {0, 0, 0};
  int64_t pr[] = {40, 40, 10}, out[] = {1, 1, 1};
  traces_t tr = {0};
  run_fixed(&p, 2, 1, at, pr, out, 3, &tr);
  ck_assert_int_eq(tr.t[0].prefill, 0);
  ck_assert_int_eq(tr.t[1].prefill, 1);
  ck_assert_int_eq(tr.t[2].prefill, 0); /* both hold 40: tie → 0; it waits for pass [0] */
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 40, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_first_ms, 40, 1e-9);
  ck_assert_double_eq_tol(tr.t[2].t_first_ms, 50, 1e-9);
}
END_TEST

/* One shared core (--host-cores 1): the second prefill worker starts its pass while the first
 * is busy, so its 40 ms of work takes 2 x 40 = 80 ms; the first, alone when it started, 40. */
START_TEST(test_host_cores_share) {
  pl_profile_t p = simple();
  double at[] = {0, 0};
  int64_t pr[] = {40, 40}, out[] = {1, 1};
  traces_t tr = {0};
  run_fixed_cores(&p, 2, 1, 1, at, pr, out, 2, &tr);
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 40, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_first_ms, 80, 1e-9);
}
END_TEST

/* M/D/1: one prefill worker serving one prompt per pass (--max-batch 1) of fixed cost S = 10 ms
 * (10 tokens, 1 ms each), Poisson arrivals at 50/s (rho = 0.5), output 1 token (decode never
 * queues). Equal sizes make the order irrelevant to the mean, so the mean time to first token
 * is S + rho S / (2 (1 - rho)) = 10 + 5 = 15 ms (Pollaczek-Khinchine). 200000 requests with
 * seed 7: the estimate is deterministic; 2 % covers its sampling error (about 0.5 %). */
START_TEST(test_md1_mean_wait) {
  pl_profile_t p = simple();
  p.pf.max_batch = 1;
  p.dc.num_slots = 64;
  bn_dist_t len = {.kind = BN_DIST_FIXED, .lo = 10, .hi = 10}, one = {.kind = BN_DIST_FIXED, .lo = 1, .hi = 1};
  pl_workload_t w = {.prompt_len = len, .output_len = one, .rate = 50, .seed = 7, .requests = 200000};
  pl_cluster_t c = {1, 1, 0};
  pl_result_t r;
  char err[256];
  ck_assert_int_eq(pl_sim_run(&p, &c, &w, NULL, NULL, NULL, &r, err, sizeof err), 0);
  ck_assert_int_eq((int)r.completed, 200000);
  ck_assert_msg(fabs(r.ttft_ms.mean - 15.0) < 0.3, "mean TTFT %.4f, M/D/1 says 15", r.ttft_ms.mean);
  ck_assert_msg(fabs(r.pf_busy - 0.5) < 0.01, "busy %.4f, rho 0.5", r.pf_busy);
}
END_TEST

/* The summary's p90/p99 (interpolated on the sorted samples) equal k3pd-bench's percentiles. */
START_TEST(test_percentiles_match_bench) {
  pl_samples_t s;
  ck_assert_int_eq(pl_samples_init(&s, 100, 1), 0);
  double copy[37];
  for (int i = 0; i < 37; i++) pl_samples_add(&s, copy[i] = (double)((i * 7919) % 101) / 3.0);
  pl_summ_t m = pl_samples_summary(&s);
  ck_assert_double_eq(m.p50, bn_percentile(copy, 37, 50));
  ck_assert_double_eq(m.p90, bn_percentile(copy, 37, 90));
  ck_assert_double_eq(m.p99, bn_percentile(copy, 37, 99));
  pl_samples_free(&s);
}
END_TEST

/* The measured step spread (decode.step_spread). One request of 1 prompt token and 20001 output
 * tokens alone: 20000 gaps, each a 10 ms step x R(U). (1) A flat table [[0, 2], [1, 2]]: every
 * gap is 20 ms. (2) [[0, 0.5], [1, 1.5]]: R(U) = 0.5 + U, uniform on [0.5, 1.5]: gaps uniform on
 * [5, 15] ms: mean 10, p50 10, p99 14.9 (within 1 % at 20000 draws). (3) The fit: gaps 1..100
 * (mean 50.5) make R(0) = 1/50.5, R(1) = 100/50.5, R(0.5) = 50.5/50.5 = 1. */
START_TEST(test_decode_step_spread) {
  pl_profile_t p = simple();
  p.dc_q_n = 2;
  p.dc_q_p[0] = 0, p.dc_q_p[1] = 1;
  p.dc_q_r[0] = p.dc_q_r[1] = 2;
  double at[] = {0};
  int64_t pr[] = {1}, out[] = {20001};
  traces_t tr = {0};
  pl_result_t r = run_fixed(&p, 1, 1, at, pr, out, 1, &tr);
  ck_assert_double_eq_tol(r.itl_ms.p50, 20, 1e-9);
  ck_assert_double_eq_tol(r.itl_ms.max, 20, 1e-9);
  p.dc_q_r[0] = 0.5, p.dc_q_r[1] = 1.5;
  r = run_fixed(&p, 1, 1, at, pr, out, 1, &tr);
  ck_assert_msg(fabs(r.itl_ms.mean - 10) < 0.1, "mean gap %.3f, want 10", r.itl_ms.mean);
  ck_assert_msg(fabs(r.itl_ms.p50 - 10) < 0.1, "p50 gap %.3f, want 10", r.itl_ms.p50);
  ck_assert_msg(fabs(r.itl_ms.p99 - 14.9) < 0.149, "p99 gap %.3f, want 14.9", r.itl_ms.p99);
  ck_assert(r.itl_ms.max <= 15 && r.itl_ms.max > 14.9);
  double g[100];
  for (int i = 0; i < 100; i++) g[99 - i] = i + 1; /* descending: the fit sorts */
  pl_profile_fit_spread(&p, g, 100);
  ck_assert_int_ge(p.dc_q_n, 2);
  ck_assert_double_eq_tol(pl_decode_spread(&p, 0), 1 / 50.5, 1e-9);
  ck_assert_double_eq_tol(pl_decode_spread(&p, 1), 100 / 50.5, 1e-9);
  ck_assert_double_eq_tol(pl_decode_spread(&p, 0.5), 50.5 / 50.5, 1e-9);
  pl_profile_fit_spread(&p, g, 19); /* too few gaps: no table */
  ck_assert_int_eq(p.dc_q_n, 0);
}
END_TEST

/* Workers' own speeds (prefill.worker_speed / decode.worker_speed). Two prompts of 10 tokens at
 * 0 on 2 prefill workers (the router: fewest queued tokens, ties to the lower index: the first
 * to worker 0, the second to worker 1), speeds [1, 2]: passes end at 10 and 20 (TTFT 10, 20).
 * Output 2 on 2 decode workers with speeds [1, 3] (decode: lowest utilisation, the first to 0,
 * the second to 1): the second tokens at 10 + 10 and 20 + 30. A cluster of another size (3
 * prefill workers) ignores the factors: both prompts take 10. */
START_TEST(test_worker_speed) {
  pl_profile_t p = simple();
  p.pf_speed_n = 2, p.pf_speed[0] = 1, p.pf_speed[1] = 2;
  p.dc_speed_n = 2, p.dc_speed[0] = 1, p.dc_speed[1] = 3;
  double at[] = {0, 0};
  int64_t pr[] = {10, 10}, out[] = {2, 2};
  traces_t tr = {0};
  run_fixed(&p, 2, 2, at, pr, out, 2, &tr);
  ck_assert_int_eq(tr.t[0].prefill, 0);
  ck_assert_int_eq(tr.t[1].prefill, 1);
  ck_assert_int_eq(tr.t[1].decode, 1);
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 10, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_first_ms, 20, 1e-9);
  ck_assert_double_eq_tol(tr.t[0].t_end_ms, 20, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_end_ms, 50, 1e-9);
  traces_t t3 = {0};
  run_fixed(&p, 3, 2, at, pr, out, 2, &t3);
  ck_assert_double_eq_tol(t3.t[1].t_first_ms, 10, 1e-9);
}
END_TEST

/* M/G/1 with the profile's variability: pass cost 10 ms x exp(sigma Z), cv 0.5, so
 * E[S] = 10 sqrt(1.25) = 11.180 ms and E[S^2] = 100 (1.25)^2 = 156.25 ms^2; at 40 req/s
 * (rho = 0.4472) Pollaczek-Khinchine gives W = lambda E[S^2] / (2 (1 - rho)) = 5.652 ms, so the
 * mean TTFT is 16.832 ms. Seed 7, 200000 requests, 3 % (the heavier tail adds sampling error). */
START_TEST(test_mg1_variability) {
  pl_profile_t p = simple();
  p.pf.max_batch = 1;
  p.dc.num_slots = 64;
  p.pf_cv = 0.5;
  bn_dist_t len = {.kind = BN_DIST_FIXED, .lo = 10, .hi = 10}, one = {.kind = BN_DIST_FIXED, .lo = 1, .hi = 1};
  pl_workload_t w = {.prompt_len = len, .output_len = one, .rate = 40, .seed = 7, .requests = 200000};
  pl_cluster_t c = {1, 1, 0};
  pl_result_t r;
  char err[256];
  ck_assert_int_eq(pl_sim_run(&p, &c, &w, NULL, NULL, NULL, &r, err, sizeof err), 0);
  ck_assert_msg(fabs(r.ttft_ms.mean - 16.832) < 0.03 * 16.832, "mean TTFT %.4f, M/G/1 says 16.832", r.ttft_ms.mean);
  ck_assert_msg(fabs(r.pf_busy - 0.4472) < 0.01, "busy %.4f, rho 0.4472", r.pf_busy);
}
END_TEST

/* Prefix hits: with every request a hit on 64 cached tokens, a 100-token prompt computes 36
 * (a 36 ms pass) and the arrivals follow k3pd-bench's process: one request at t = 0. */
START_TEST(test_prefix_hit) {
  pl_profile_t p = simple();
  bn_dist_t len = {.kind = BN_DIST_FIXED, .lo = 100, .hi = 100}, one = {.kind = BN_DIST_FIXED, .lo = 1, .hi = 1};
  pl_workload_t w = {.prompt_len = len, .output_len = one, .rate = 1, .seed = 3, .requests = 1, .prefix_hit = 1,
                     .prefix_tokens = 64};
  pl_cluster_t c = {1, 1, 0};
  pl_result_t r;
  char err[256];
  ck_assert_int_eq(pl_sim_run(&p, &c, &w, NULL, NULL, NULL, &r, err, sizeof err), 0);
  ck_assert_double_eq_tol(r.ttft_ms.p50, 36, 1e-9);
  w.prefix_hit = 0;
  ck_assert_int_eq(pl_sim_run(&p, &c, &w, NULL, NULL, NULL, &r, err, sizeof err), 0);
  ck_assert_double_eq_tol(r.ttft_ms.p50, 100, 1e-9);
}
END_TEST

/* The prefill table. Points (16 tokens, 50 ms), (64, 200), (256, 520); shared 20 ms:
 *   lone(40) = 50 + (200 - 50) * 24 / 48 = 125; lone(8) = 20 + (50 - 20) * 8 / 16 = 35;
 *   lone(512) = 520 * 512 / 256 = 1040 (the last point's cost per token)
 *   a pass of takes 16 + 40: 20 + (50 - 20) + (125 - 20) = 155 ms. */
static pl_profile_t tabled(void) {
  pl_profile_t p = simple();
  p.pf_tab_n = 3;
  double x[] = {16, 64, 256}, y[] = {50, 200, 520};
  memcpy(p.pf_tab_tok, x, sizeof x);
  memcpy(p.pf_tab_ms, y, sizeof y);
  p.pf_shared_ms = 20;
  return p;
}

START_TEST(test_prefill_table_cost) {
  pl_profile_t p = tabled();
  ck_assert(pl_prefill_uses_table(&p));
  ck_assert_double_eq_tol(pl_prefill_lone_ms(&p, 40), 125, 1e-9);
  ck_assert_double_eq_tol(pl_prefill_lone_ms(&p, 8), 35, 1e-9);
  ck_assert_double_eq_tol(pl_prefill_lone_ms(&p, 512), 1040, 1e-9);
  int64_t takes[] = {16, 40};
  ck_assert_double_eq_tol(pl_prefill_pass_takes_ms(&p, 2, takes, 56, 0), 155, 1e-9);
  p.pf_tab_off = true; /* --prefill-cost line: 1 ms per token */
  ck_assert_double_eq_tol(pl_prefill_pass_takes_ms(&p, 2, takes, 56, 0), 56, 1e-9);
  /* Through the simulation: A (40 tokens) at t 0 runs alone, 125 ms; B (16) and C (40) arrive
   * during it and share the next pass, 155 ms: first tokens at 125 and 280 (no handoff cost,
   * decode idle: admitted at once). Output 1: no decode step. */
  p.pf_tab_off = false;
  double at[] = {0, 1, 2};
  int64_t pr[] = {40, 16, 40}, out[] = {1, 1, 1};
  traces_t tr = {0};
  run_fixed(&p, 1, 1, at, pr, out, 3, &tr);
  ck_assert_double_eq_tol(tr.t[0].t_first_ms, 125, 1e-9);
  ck_assert_double_eq_tol(tr.t[1].t_first_ms, 280, 1e-9);
  ck_assert_double_eq_tol(tr.t[2].t_first_ms, 280, 1e-9);
}
END_TEST

/* The table fitted from profile rows (passes, prompts, tokens, Σ take*ctx/1000, ms):
 *   lone 64 and 16 (unsorted) give the points; the batched phase, 10 passes of 2 prompts of 16
 *   at 80 ms each (800 ms): shared = (2 * 50 - 80) / (2 - 1) = 20;
 *   a lone 320-token prompt over chunk 256: 2 passes, ctx = 64 * 256 / 1000 = 16.384 ktok, took
 *   lone(256) + lone(64) + 16.384 * 2 = 520 + 200 + 32.768 ms (the 256 point from another row)
 *   → context term 2 ms per ktok. */
START_TEST(test_prefill_table_fit) {
  pl_profile_t p;
  pl_profile_default(&p);
  const double rows[][5] = {{1, 1, 64, 0, 200},  {1, 1, 16, 0, 50},           {10, 20, 320, 0, 800},
                            {1, 1, 256, 0, 520}, {2, 2, 320, 16.384, 752.768}};
  pl_profile_fit_table(&p, rows, 5);
  ck_assert_int_eq(p.pf_tab_n, 3);
  ck_assert_double_eq_tol(p.pf_tab_tok[0], 16, 1e-12);
  ck_assert_double_eq_tol(p.pf_tab_ms[1], 200, 1e-12);
  ck_assert_double_eq_tol(p.pf_tab_tok[2], 256, 1e-12);
  ck_assert_double_eq_tol(p.pf_shared_ms, 20, 1e-9);
  ck_assert_double_eq_tol(p.pf_tab_kctx_ms, 2, 1e-9);
  /* one point only: no table (the line prices passes) */
  pl_profile_default(&p);
  pl_profile_fit_table(&p, rows, 1);
  ck_assert_int_eq(p.pf_tab_n, 0);
  ck_assert(!pl_prefill_uses_table(&p));
}
END_TEST

/* The router's stale view of prefill queues (heartbeat 90 ms, two prefill workers: w0 beats at
 * 30, w1 at 60, then every 90). 1 ms per token, chunk 64, output 1, no handoff time.
 *   A (100 tokens) at 0 → w0 (tie), passes 0..64..100; w0's beat at 30 reports 100 queued.
 *   B (10) at 40 → w1 (w0 seen at 100), 40..50; w1's beat at 60 reports 0.
 *   C (10) at 105: exact view: both idle, tie → w0. Stale: w0 still seen at 100 (its beat at 30;
 *   A's Prefill returned at 100 and took back only what was sent since) → w1, 105..115.
 *   D (50) at 106: exact → w1 (w0 holds C), 106..156. Stale: w1 seen at 0 + 10 sent, w0 at
 *   100 → w1, behind C: 115..165. */
/* A profile written before the table existed (only fit.points) gets the table the same rows
 * give; saving writes the table's fields and reading them back gives the same table. */
START_TEST(test_profile_table_compat) {
  char path[] = "/tmp/k3pd-plan-test-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  fputs("{\"schema\": \"k3pd-profile/1\", \"prefill\": {\"pass_per_token_ms\": 3},\n"
        " \"fit\": {\"points\": [\n"
        "  {\"kind\": \"prefill_pass_sum\", \"x\": [1, 1, 64, 0], \"y_ms\": 200},\n"
        "  {\"kind\": \"decode_step\", \"x\": [1, 1, 0.1], \"y_ms\": 7},\n"
        "  {\"kind\": \"prefill_pass_sum\", \"x\": [1, 1, 16, 0], \"y_ms\": 50},\n"
        "  {\"kind\": \"prefill_pass_sum\", \"x\": [10, 20, 320, 0], \"y_ms\": 800}]}}\n",
        f);
  fclose(f);
  pl_profile_t p;
  pl_profile_default(&p);
  char err[256];
  ck_assert_int_eq(pl_profile_load(path, &p, err, sizeof err), 0);
  ck_assert_int_eq(p.pf_tab_n, 2);
  ck_assert_double_eq_tol(p.pf_tab_ms[0], 50, 1e-12);
  ck_assert_double_eq_tol(p.pf_shared_ms, 20, 1e-9); /* (2 * 50 - 80) / 1 */
  ck_assert_double_eq_tol(p.pf_per_token_ms, 3, 1e-12);
  /* the optional step spread and worker speeds travel too */
  p.dc_q_n = 3, p.dc_q_p[0] = 0, p.dc_q_p[1] = 0.5, p.dc_q_p[2] = 1;
  p.dc_q_r[0] = 0.25, p.dc_q_r[1] = 1, p.dc_q_r[2] = 2.5;
  p.pf_speed_n = 2, p.pf_speed[0] = 1, p.pf_speed[1] = 1.25;
  p.dc_speed_n = 3, p.dc_speed[0] = 0.9, p.dc_speed[1] = 1, p.dc_speed[2] = 1.1;
  ck_assert_int_eq(pl_profile_save(path, &p, NULL, err, sizeof err), 0);
  pl_profile_t q;
  pl_profile_default(&q);
  ck_assert_int_eq(pl_profile_load(path, &q, err, sizeof err), 0);
  unlink(path);
  ck_assert_int_eq(q.dc_q_n, 3);
  ck_assert_double_eq_tol(pl_decode_spread(&q, 0.75), 1.75, 1e-9);
  ck_assert_int_eq(q.pf_speed_n, 2);
  ck_assert_double_eq_tol(q.pf_speed[1], 1.25, 1e-9);
  ck_assert_int_eq(q.dc_speed_n, 3);
  ck_assert_double_eq_tol(q.dc_speed[2], 1.1, 1e-9);
  ck_assert_int_eq(q.pf_tab_n, 2);
  ck_assert_double_eq_tol(q.pf_tab_tok[1], 64, 1e-12);
  ck_assert_double_eq_tol(q.pf_tab_ms[1], 200, 1e-9);
  ck_assert_double_eq_tol(q.pf_shared_ms, 20, 1e-9);
  ck_assert_double_eq_tol(pl_prefill_lone_ms(&q, 40), 125, 1e-9);
}
END_TEST

START_TEST(test_router_stale_view) {
  pl_profile_t p = simple();
  double at[] = {0, 40, 105, 106};
  int64_t pr[] = {100, 10, 10, 50}, out[] = {1, 1, 1, 1};
  traces_t tr = {0};
  run_fixed(&p, 2, 1, at, pr, out, 4, &tr);
  ck_assert_int_eq(tr.t[1].prefill, 1);
  ck_assert_int_eq(tr.t[2].prefill, 0);
  ck_assert_int_eq(tr.t[3].prefill, 1);
  ck_assert_double_eq_tol(tr.t[3].t_first_ms, 156, 1e-9);
  p.router_heartbeat_ms = 90;
  memset(&tr, 0, sizeof tr);
  pl_result_t r = run_fixed(&p, 2, 1, at, pr, out, 4, &tr);
  ck_assert_int_eq(tr.t[1].prefill, 1);
  ck_assert_int_eq(tr.t[2].prefill, 1);
  ck_assert_int_eq(tr.t[3].prefill, 1);
  ck_assert_double_eq_tol(tr.t[2].t_first_ms, 115, 1e-9);
  ck_assert_double_eq_tol(tr.t[3].t_first_ms, 165, 1e-9);
  ck_assert_double_eq_tol(r.sim_end_ms, 165, 1e-9); /* heartbeats do not outlive the work */
}
END_TEST

START_TEST(test_bad_cluster) {
  pl_profile_t p = simple();
  pl_cluster_t c = {0, 1, 0};
  pl_workload_t w = {.rate = 1, .requests = 1};
  pl_result_t r;
  char err[256];
  ck_assert_int_ne(pl_sim_run(&p, &c, &w, NULL, NULL, NULL, &r, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "prefill"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("plan_sim");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_single_request_chunked);
  tcase_add_test(tc, test_decode_round_robin);
  tcase_add_test(tc, test_first_token_with_prefill_reply);
  tcase_add_test(tc, test_prefill_fair_chunks);
  tcase_add_test(tc, test_pages_slots_reject);
  tcase_add_test(tc, test_prefill_least_queued);
  tcase_add_test(tc, test_md1_mean_wait);
  tcase_add_test(tc, test_host_cores_share);
  tcase_add_test(tc, test_mg1_variability);
  tcase_add_test(tc, test_decode_step_spread);
  tcase_add_test(tc, test_worker_speed);
  tcase_add_test(tc, test_prefix_hit);
  tcase_add_test(tc, test_bad_cluster);
  tcase_add_test(tc, test_prefill_table_cost);
  tcase_add_test(tc, test_prefill_table_fit);
  tcase_add_test(tc, test_router_stale_view);
  tcase_add_test(tc, test_profile_table_compat);
  tcase_add_test(tc, test_percentiles_match_bench);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
