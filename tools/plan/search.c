/* k3pd-plan searches: the smallest prefill and decode counts that meet latency targets.
 *
 * Not here: the simulation itself (sim.c). The search assumes that adding a worker of either
 * role never makes the tail worse (true of the model: the router spreads load by least
 * queued / least utilised), so it gallops up from a work-conservation lower bound and then
 * bisects. Decode is sized first (inter-token latency and page/slot room depend on decode
 * alone), with a generous prefill count, then prefill against the found decode count; when no
 * prefill count in range meets the targets the decode count grows and prefill is searched again
 * (decode refusals for pages or slots count against --max-reject, and a prefix hit's first token
 * waits for the decode engine). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "k3pd/err.h"
#include "plan.h"

bool pl_meets(const pl_result_t *r, const pl_targets_t *t) {
  if (r->measured == 0) return false;
  double rej = (double)r->rejected / (double)r->measured;
  if (rej > t->max_reject + 1e-12) return false;
  if (t->ttft_p99_ms > 0 && !(r->ttft_ms.p99 <= t->ttft_p99_ms)) return false;
  if (t->itl_p99_ms > 0 && !(r->itl_ms.p99 <= t->itl_p99_ms)) return false;
  return true;
}

/* Mean per-request costs over the workload's first 4096 requests: lower bounds of the work a
 * request puts on each role when batching is perfect (fixed per-pass/per-step costs shared). */
static void work_bounds(const pl_profile_t *p, const pl_workload_t *w, double *pf_ms, double *dc_ms) {
  double a = 0, b = 0;
  const int n = 4096;
  bn_workload_t bw = {.prompt_len = w->prompt_len, .output_len = w->output_len, .seed = w->seed};
  for (int i = 0; i < n; i++) {
    uint32_t L = 0, N = 0;
    bn_spec_lengths(&bw, w->first_index + (uint64_t)i, &L, &N);
    double ctx2 = (double)L * (double)L / 2.0; /* Σ over tokens of the context before them */
    if (pl_prefill_uses_table(p)) { /* each chunk's own cost; the shared part spread over a full pass */
      const double C = (double)p->pf.chunk_tokens;
      for (double done = 0; done < L; done += C) {
        double take = L - done < C ? L - done : C;
        a += pl_prefill_lone_ms(p, take) - p->pf_shared_ms * (1.0 - 1.0 / p->pf.max_batch);
      }
      a += p->pf_tab_kctx_ms * ctx2 / 1000.0;
    } else {
      a += p->pf_per_seq_ms * ceil((double)L / (double)p->pf.chunk_tokens) + p->pf_per_token_ms * L +
           p->pf_per_kctx_ms * ctx2 / 1000.0;
    }
    double steps = N > 1 ? N - 1 : 0;
    double mean_ctx = L + N / 2.0;
    b += steps * (p->dc_per_seq_ms + p->dc_fixed_ms / p->dc.max_batch + p->dc_per_kctx_ms * mean_ctx / 1000.0);
  }
  *pf_ms = a / n;
  *dc_ms = b / n;
}

typedef struct {
  const pl_profile_t *p;
  const pl_workload_t *w;
  const pl_targets_t *t;
  pl_targets_t decode_only; /* the ITL and rejection parts of the targets */
  int sims;
  char *err;
  size_t errlen;
} ctx_t;

static int run(ctx_t *c, int P, int D, const pl_targets_t *t, bool *ok, pl_result_t *res) {
  pl_cluster_t cl = {P, D, 0};
  pl_result_t r;
  int rc = pl_sim_run(c->p, &cl, c->w, NULL, NULL, NULL, &r, c->err, c->errlen);
  c->sims++;
  if (rc) return rc;
  *ok = pl_meets(&r, t);
  if (res) *res = r;
  return 0;
}

/* Smallest x in [lo, max] with ok(x), varying one role; the other is fixed. */
static int smallest(ctx_t *c, bool vary_prefill, int fixed, int lo, int max, const pl_targets_t *t, int *found) {
  int bad = lo - 1, good = -1, x = lo;
  bool ok = false;
  while (x <= max) {
    int rc = vary_prefill ? run(c, x, fixed, t, &ok, NULL) : run(c, fixed, x, t, &ok, NULL);
    if (rc) return rc;
    if (ok) {
      good = x;
      break;
    }
    bad = x;
    if (x == max) break;
    int nx = x + x / 4 + 1;
    x = nx > max ? max : nx;
  }
  if (good < 0) return K3_ECAPACITY;
  while (good - bad > 1) {
    int mid = bad + (good - bad) / 2;
    int rc = vary_prefill ? run(c, mid, fixed, t, &ok, NULL) : run(c, fixed, mid, t, &ok, NULL);
    if (rc) return rc;
    if (ok) good = mid;
    else bad = mid;
  }
  *found = good;
  return 0;
}

int pl_search(const pl_profile_t *p, const pl_workload_t *w_full, const pl_targets_t *t, int max_workers,
              pl_cluster_t *best, pl_result_t *best_res, int *sims, char *err, size_t errlen) {
  /* The search runs on at most 40k arrivals (enough for a stable p99) and the answer is then
   * checked on the whole workload, growing a role while that check fails. */
  pl_workload_t wf = *w_full;
  const pl_workload_t *w = &wf;
  if (wf.requests > 40000) wf.requests = 40000;
  if (wf.requests == 0 && wf.duration_s * wf.rate > 40000) {
    double k = 40000 / (wf.duration_s * wf.rate);
    wf.duration_s *= k;
    wf.warmup_s *= k;
  }
  /* an overloaded candidate stops as soon as its p99 TTFT is certain to miss (sim.c) */
  wf.stop_ttft_ms = t->ttft_p99_ms;
  ctx_t c = {.p = p, .w = w, .t = t, .err = err, .errlen = errlen};
  c.decode_only = *t;
  c.decode_only.ttft_p99_ms = 0;
  double pf_ms = 0, dc_ms = 0;
  work_bounds(p, w, &pf_ms, &dc_ms);
  int p_lo = (int)ceil(w->rate * pf_ms / 1000.0), d_lo = (int)ceil(w->rate * dc_ms / 1000.0);
  if (p_lo < 1) p_lo = 1;
  if (d_lo < 1) d_lo = 1;
  if (p_lo > max_workers || d_lo > max_workers) {
    snprintf(err, errlen, "the offered work alone needs %d prefill and %d decode workers, over --max-workers %d", p_lo,
             d_lo, max_workers);
    *sims = 0;
    return K3_ECAPACITY;
  }
  /* decode with prefill generous: twice its bound plus one (prefill count barely moves ITL) */
  int p_big = 2 * p_lo + 1 > max_workers ? max_workers : 2 * p_lo + 1;
  int D = 0, P = 0, rc = smallest(&c, false, p_big, d_lo, max_workers, &c.decode_only, &D);
  if (rc == K3_ECAPACITY) snprintf(err, errlen, "no decode count up to %d meets the inter-token target", max_workers);
  for (int tries = 0; !rc && tries < 8; tries++) {
    rc = smallest(&c, true, D, p_lo, max_workers, t, &P);
    if (rc != K3_ECAPACITY || D == max_workers) break;
    int nd = D + D / 4 + 1; /* refusals, prefix hits' admission wait: more decode */
    D = nd > max_workers ? max_workers : nd;
    rc = 0;
  }
  if (rc == K3_ECAPACITY && !err[0])
    snprintf(err, errlen, "no prefill count up to %d meets the TTFT target (decode %d)", max_workers, D);
  if (!rc) {
    /* decode may now be over-sized for this prefill count: shrink it while the targets hold */
    bool ok = true;
    pl_result_t r;
    rc = run(&c, P, D, t, &ok, &r);
    while (!rc && D > 1) {
      bool ok2 = false;
      pl_result_t r2;
      rc = run(&c, P, D - 1, t, &ok2, &r2);
      if (rc || !ok2) break;
      D--;
      r = r2;
    }
    /* the whole workload */
    c.w = w_full;
    for (int i = 0; !rc && i < 8; i++) {
      rc = run(&c, P, D, t, &ok, &r);
      if (rc || ok) break;
      double rej = r.measured ? (double)r.rejected / (double)r.measured : 1;
      bool decode_short = (t->itl_p99_ms > 0 && !(r.itl_ms.p99 <= t->itl_p99_ms)) || rej > t->max_reject;
      if (decode_short) D = D + 1 > max_workers ? max_workers : D + 1;
      else P = P + 1 > max_workers ? max_workers : P + 1;
    }
    if (!rc && !ok) {
      snprintf(err, errlen, "the answer of the short search (%d:%d) fails on the whole workload", P, D);
      rc = K3_ECAPACITY;
    }
    best->n_prefill = P;
    best->n_decode = D;
    if (best_res) *best_res = r;
  }
  *sims = c.sims;
  return rc;
}
