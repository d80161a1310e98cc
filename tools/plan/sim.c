/* k3pd-plan's discrete-event simulation of one cluster: Poisson arrivals, the router's pairing,
 * each prefill worker's engine (admission into local pages/slots and fair chunked passes, with
 * the real policy functions of prefill_worker/sched.c linked in), the handoff after a prompt's
 * last pass, and each decode worker's continuous-batching engine (decode_worker/engine.c).
 *
 * Not here: costs (profile.c) or searching (search.c). Not modelled: worker failures, retries,
 * several routers, the heartbeats' network delay. CPU
 * contention between workers on one host is approximated only when host_cores is set (share()).
 *
 * What each part mirrors (keep in step with the code it names):
 *  - router (router/registry.c choose_decode, rt_choose_prefill): decode first, among workers
 *    with room for ceil((prompt + max_new) / page_tokens) pages and one slot, the lowest
 *    utilisation after admission, ties by fewer running then index; no room anywhere =
 *    RESOURCE_EXHAUSTED (rejected). Then the prefill worker with the fewest unfinished prompt
 *    tokens as the router sees them (router_heartbeat_ms > 0: the count of the last heartbeat
 *    plus the tokens sent since, less those whose Prefill returned at its handoff's end), ties
 *    by index. Pages and the slot stay reserved until the request ends.
 *  - prefill engine (prefill_worker/engine.c): each iteration admits queued prompts in score
 *    order while pages, a slot and the headroom rule allow (pf_sched_headroom_ok), then picks a
 *    pass (pf_sched_pick: chunk, --max-batch capped at 64, --max-batch-tokens) and runs it;
 *    queued prompts age by one per pass. A prompt's local state is freed when its handoff is
 *    over (last pass end + handoff time), which may admit more.
 *  - first token (router/flow.c on_prefill_done): the Prefill reply carries it and the router
 *    relays it at once, so TTFT ends when the handoff is over (the Prefill call returns), not at
 *    the decode engine's next step boundary; that wait falls into the second token's gap. A
 *    prefix hit (a split request) gets its first token from the decode engine at admission.
 *  - decode engine (decode_worker/engine.c): between steps it drains admissions, new sequences
 *    go to the head of the run list; a step serves
 *    the first max_batch sequences, each gets one token; finished ones leave; when the batch was
 *    full the served prefix rotates to the tail (round-robin).
 *
 * Events at equal times run in the order they were scheduled (a sequence number breaks ties),
 * so a run is deterministic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../prefill_worker/sched.h"
#include "k3pd/err.h"
#include "plan.h"

enum { EV_ARRIVE = 1, EV_PF_PASS_END, EV_HANDOFF, EV_DC_STEP_END, EV_HEARTBEAT };

typedef struct {
  double t;
  uint64_t seq;
  int type;
  int who;     /* worker index (pass/step end) */
  int64_t req; /* request index (arrive, handoff) */
} ev_t;

typedef struct {
  double t_arrive, t_first, t_last;
  int64_t prompt;  /* prompt tokens */
  int64_t cached;  /* leading tokens already cached (prefix hit): not computed */
  int64_t output;  /* max_new: tokens generated (ignore_eos) */
  int64_t dc_pages;
  int32_t generated;
  int pf, dc;
  bool measured;
} req_t;

typedef struct {
  int64_t req;
  int64_t done; /* tokens computed so far (excl. cached) */
  uint32_t waited;
  bool finished;
} held_t;

typedef struct {
  int64_t req;
  uint32_t waited;
} pend_t;

typedef struct {
  pend_t *pend;
  size_t n_pend, cap_pend;
  held_t *held; /* admission order = the engine's arrival order for ties */
  size_t n_held, cap_held;
  int64_t free_pages;
  int free_slots;
  int64_t queued_tokens; /* prompts not finished: the k3pd_prefill_queued_prompt_tokens gauge */
  int64_t hb_queued;     /* the router's view: queued_tokens at the last heartbeat */
  int64_t sent;          /* ... plus the prompt tokens it sent since, less those whose Prefill returned */
  bool busy;
  /* the pass in flight */
  int64_t *pass_req, *pass_take;
  int n_pass;
} pfw_t;

typedef struct {
  int64_t *run; /* run list, head first */
  size_t n_run, cap_run;
  int64_t *inbox;
  size_t n_inbox, cap_inbox;
  int64_t pages_used; /* reserved + used */
  int slots_used;
  bool busy;
  int n_batch; /* the step in flight serves run[0..n_batch) */
  double util;
} dcw_t;

typedef struct {
  const pl_profile_t *p;
  const pl_workload_t *w;
  const pl_fixed_reqs_t *fixed;
  pl_trace_fn trace;
  void *trace_ctx;
  ev_t *heap;
  size_t n_heap, cap_heap;
  uint64_t seq;
  double now;
  req_t *req;
  size_t n_req, cap_req;
  uint64_t rng_arrival;
  double next_arrival;
  bool arrivals_done;
  pfw_t *pf;
  dcw_t *dc;
  int P, D;
  int64_t chunk;
  int pf_maxb;
  /* scratch for pf_sched_pick */
  pf_cand_t *cand;
  int *order;
  int64_t *score;
  size_t cap_scratch;
  /* statistics */
  pl_samples_t ttft, itl, e2e;
  pl_result_t *out;
  double win_lo, win_hi, t_stat;
  double sum_q, sum_util, sum_running, sum_pages, sum_slots, sum_busy; /* current totals over workers */
  double int_q, int_util, int_running, int_pages, int_slots, int_busy; /* integrals over the window */
  double steps, step_seqs;
  bool overloaded;
  int err;
  int host_cores; /* > 0: all workers share this many cores (pl_cluster_t) */
  uint64_t rng_jitter;
  double n_over, max_over; /* TTFTs above w->stop_ttft_ms, and how many prove p99 is above it */
  double pf_sigma, dc_sigma;
  int dc_busy;    /* decode workers in a step */
  size_t n_hb;    /* heartbeat events in the heap */
} sim_t;

/* ---- event heap (min by time, then sequence) ---- */

static bool ev_less(const ev_t *a, const ev_t *b) { return a->t < b->t || (a->t == b->t && a->seq < b->seq); }

static int push_ev(sim_t *s, double t, int type, int who, int64_t req) {
  if (s->n_heap == s->cap_heap) {
    size_t nc = s->cap_heap ? s->cap_heap * 2 : 1024;
    ev_t *nh = realloc(s->heap, nc * sizeof *nh);
    if (!nh) return s->err = K3_ENOMEM;
    s->heap = nh;
    s->cap_heap = nc;
  }
  ev_t e = {t, s->seq++, type, who, req};
  size_t i = s->n_heap++;
  while (i > 0) {
    size_t par = (i - 1) / 2;
    if (!ev_less(&e, &s->heap[par])) break;
    s->heap[i] = s->heap[par];
    i = par;
  }
  s->heap[i] = e;
  return 0;
}

static ev_t pop_ev(sim_t *s) {
  ev_t top = s->heap[0];
  ev_t last = s->heap[--s->n_heap];
  size_t i = 0, n = s->n_heap;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const ev_t *best = &last;
    if (l < n && ev_less(&s->heap[l], best)) m = l, best = &s->heap[l];
    if (r < n && ev_less(&s->heap[r], best)) m = r;
    if (m == i) break;
    s->heap[i] = s->heap[m];
    i = m;
  }
  if (n) s->heap[i] = last;
  return top;
}

/* ---- growable arrays ---- */

static int grow(void **v, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 16;
  while (nc < need) nc *= 2;
  void *nv = realloc(*v, nc * elem);
  if (!nv) return K3_ENOMEM;
  *v = nv;
  *cap = nc;
  return 0;
}

/* ---- statistics ---- */

/* Integrates the worker totals up to now, inside the measured window only. */
static void stat_advance(sim_t *s) {
  double lo = s->t_stat > s->win_lo ? s->t_stat : s->win_lo;
  double hi = s->now < s->win_hi ? s->now : s->win_hi;
  if (hi > lo) {
    double dt = hi - lo;
    s->int_q += s->sum_q * dt;
    s->int_util += s->sum_util * dt;
    s->int_running += s->sum_running * dt;
    s->int_pages += s->sum_pages * dt;
    s->int_slots += s->sum_slots * dt;
    s->int_busy += s->sum_busy * dt;
  }
  s->t_stat = s->now;
}

static void dc_set_util(sim_t *s, dcw_t *d) {
  double up = (double)d->pages_used / (double)s->p->dc.num_pages;
  double us = (double)d->slots_used / (double)s->p->dc.num_slots;
  double u = up > us ? up : us;
  s->sum_util += u - d->util;
  d->util = u;
}

int pl_samples_init(pl_samples_t *s, size_t cap, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->cap = cap;
  s->rng = seed;
  s->v = malloc((cap ? cap : 1) * sizeof *s->v);
  return s->v ? 0 : K3_ENOMEM;
}

void pl_samples_add(pl_samples_t *s, double x) {
  s->seen++;
  if (s->n < s->cap) {
    s->v[s->n++] = x;
    return;
  }
  /* reservoir: keep each of the `seen` samples with probability cap/seen */
  uint64_t j = bn_rng_next(&s->rng) % s->seen;
  if (j < s->cap) s->v[j] = x;
}

void pl_samples_free(pl_samples_t *s) {
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* bn_percentile's interpolation on data it already sorted (sorting millions of samples again
 * for each percentile was half of a large run's time); test_plan_sim checks they agree. */
static double pct_sorted(const double *v, size_t n, double p) {
  double pos = p / 100.0 * (double)(n - 1);
  size_t i = (size_t)pos;
  if (i + 1 >= n) return v[n - 1];
  double f = pos - (double)i;
  return v[i] + (v[i + 1] - v[i]) * f;
}

pl_summ_t pl_samples_summary(pl_samples_t *s) {
  pl_summ_t r = {NAN, NAN, NAN, NAN, NAN, s->n};
  if (!s->n) return r;
  double sum = 0;
  for (size_t i = 0; i < s->n; i++) sum += s->v[i];
  r.mean = sum / (double)s->n;
  r.p50 = bn_percentile(s->v, s->n, 50); /* sorts: k3pd-bench's percentiles */
  r.p90 = pct_sorted(s->v, s->n, 90);
  r.p99 = pct_sorted(s->v, s->n, 99);
  r.max = s->v[s->n - 1];
  return r;
}

/* Slow-down of work that starts now when every worker shares host_cores cores (a CPU cluster on
 * one host): busy workers / cores, at least 1, fixed for the work's duration (an
 * approximation of processor sharing). 1 when workers own their hardware. */
static double share(const sim_t *s) {
  if (s->host_cores <= 0) return 1;
  double f = (s->sum_busy + (double)s->dc_busy) / (double)s->host_cores;
  return f > 1 ? f : 1;
}

/* The variability factor exp(sigma Z) of one pass or step (plan.h); 1 when cv is 0. Z by
 * Box-Muller from the simulation's own RNG stream, so runs stay deterministic. */
static double jitter(sim_t *s, double sigma) {
  if (sigma <= 0) return 1;
  double u1 = bn_rng_uniform(&s->rng_jitter), u2 = bn_rng_uniform(&s->rng_jitter);
  double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
  return exp(sigma * z);
}

/* ---- requests ---- */

static int64_t pages_for(int64_t tokens, int64_t page_tokens) {
  return tokens <= 0 ? 0 : (tokens + page_tokens - 1) / page_tokens;
}

/* Creates request k (arrival time t) and schedules its arrival. */
static int make_req(sim_t *s, double t, int64_t prompt, int64_t output, uint64_t index) {
  if (grow((void **)&s->req, &s->cap_req, s->n_req + 1, sizeof *s->req)) return s->err = K3_ENOMEM;
  req_t *r = &s->req[s->n_req];
  memset(r, 0, sizeof *r);
  r->t_arrive = t;
  r->prompt = prompt;
  r->output = output;
  r->pf = r->dc = -1;
  r->measured = t >= s->win_lo;
  if (s->w->prefix_hit > 0 && s->w->prefix_tokens > 0) {
    /* a per-index draw, independent of the lengths' RNG */
    uint64_t h = s->w->seed ^ (index * 0x9e3779b97f4a7c15ull + 0x7f4a7c159e3779b9ull);
    if (bn_rng_uniform(&h) < s->w->prefix_hit)
      r->cached = s->w->prefix_tokens < prompt ? s->w->prefix_tokens : prompt - 1;
  }
  return push_ev(s, t, EV_ARRIVE, -1, (int64_t)s->n_req++);
}

/* Schedules the next generated arrival (workload mode): the same arrival process and lengths as
 * k3pd-bench's open loop with the same --seed and --rate. */
static int next_arrival(sim_t *s) {
  const pl_workload_t *w = s->w;
  uint64_t k = s->n_req;
  if (s->fixed) {
    if (k >= s->fixed->n) {
      s->arrivals_done = true;
      return 0;
    }
    return make_req(s, s->fixed->arrive_ms[k], s->fixed->prompt[k], s->fixed->output[k], k);
  }
  double t = s->next_arrival;
  if ((w->requests > 0 && k >= w->requests) || (w->requests == 0 && t >= w->duration_s * 1000.0)) {
    s->arrivals_done = true;
    return 0;
  }
  uint32_t plen = 0, olen = 0;
  bn_spec_lengths(&(bn_workload_t){.prompt_len = w->prompt_len, .output_len = w->output_len, .seed = w->seed},
                  w->first_index + k, &plen, &olen);
  s->next_arrival += bn_arrival_gap_s(&s->rng_arrival, w->rate) * 1000.0;
  return make_req(s, t, plen, olen, w->first_index + k);
}

static void finish_req(sim_t *s, int64_t ri, bool rejected) {
  req_t *r = &s->req[ri];
  if (r->measured) {
    if (rejected) s->out->rejected++;
    else {
      s->out->completed++;
      pl_samples_add(&s->e2e, s->now - r->t_arrive + s->p->ttft_overhead_ms);
    }
  }
  if (s->trace) {
    pl_trace_t t = {.index = (uint64_t)ri, .t_arrive_ms = r->t_arrive, .t_first_ms = -1, .t_end_ms = -1,
                    .prefill = rejected ? -1 : r->pf, .decode = rejected ? -1 : r->dc};
    if (!rejected) {
      t.t_end_ms = s->now;
      t.t_first_ms = r->t_first;
    }
    s->trace(s->trace_ctx, &t);
  }
}

/* ---- decode worker ---- */

static void dc_release(sim_t *s, int di, int64_t ri) {
  dcw_t *d = &s->dc[di];
  d->pages_used -= s->req[ri].dc_pages;
  d->slots_used -= 1;
  s->sum_pages -= (double)s->req[ri].dc_pages;
  s->sum_slots -= 1;
  dc_set_util(s, d);
}

/* The engine's loop top: drain admissions, then start a step if anything runs. */
/* The request's first token reaches the client now: TTFT. */
static void first_token(sim_t *s, req_t *r) {
  r->generated = 1;
  r->t_first = r->t_last = s->now;
  if (r->measured) {
    double ttft = s->now - r->t_arrive + s->p->ttft_overhead_ms;
    pl_samples_add(&s->ttft, ttft);
    if (s->w->stop_ttft_ms > 0 && ttft > s->w->stop_ttft_ms && ++s->n_over > s->max_over) s->overloaded = true;
  }
}

/* The first token of a prompt computed whole by a prefill worker travels with its Prefill reply
 * (router/flow.c on_prefill_done relays it): it does not wait for the decode engine. A prefix
 * hit is a split request whose first token the decode worker samples itself, at admission. */
static bool first_from_prefill(const req_t *r) { return r->cached == 0; }

static void dc_loop(sim_t *s, int di) {
  dcw_t *d = &s->dc[di];
  for (size_t i = 0; i < d->n_inbox; i++) {
    int64_t ri = d->inbox[i];
    req_t *r = &s->req[ri];
    if (!first_from_prefill(r)) first_token(s, r);
    if (r->output <= 1) {
      dc_release(s, di, ri);
      finish_req(s, ri, false);
      continue;
    }
    if (grow((void **)&d->run, &d->cap_run, d->n_run + 1, sizeof *d->run)) {
      s->err = K3_ENOMEM;
      return;
    }
    memmove(d->run + 1, d->run, d->n_run * sizeof *d->run); /* s->next = run; run = s */
    d->run[0] = ri;
    d->n_run++;
    s->sum_running += 1;
  }
  d->n_inbox = 0;
  if (d->n_run == 0) {
    if (d->busy) s->dc_busy--;
    d->busy = false;
    return;
  }
  int b = (int)d->n_run < s->p->dc.max_batch ? (int)d->n_run : s->p->dc.max_batch;
  double ctx = 0;
  for (int i = 0; i < b; i++) {
    const req_t *r = &s->req[d->run[i]];
    ctx += (double)(r->prompt + r->generated);
  }
  if (!d->busy) s->dc_busy++;
  d->busy = true;
  d->n_batch = b;
  s->steps += 1;
  s->step_seqs += b;
  double spread = s->p->dc_q_n >= 2 ? pl_decode_spread(s->p, bn_rng_uniform(&s->rng_jitter)) : jitter(s, s->dc_sigma);
  double speed = s->p->dc_speed_n == s->D ? s->p->dc_speed[di] : 1;
  push_ev(s, s->now + pl_decode_step_ms(s->p, b, ctx) * speed * share(s) * spread, EV_DC_STEP_END, di, -1);
}

static void dc_step_end(sim_t *s, int di) {
  dcw_t *d = &s->dc[di];
  int n = d->n_batch;
  size_t m = 0;
  for (size_t i = 0; i < d->n_run; i++) {
    int64_t ri = d->run[i];
    if ((int)i < n) {
      req_t *r = &s->req[ri];
      if (r->measured) pl_samples_add(&s->itl, s->now - r->t_last + s->p->itl_overhead_ms);
      r->t_last = s->now;
      r->generated++;
      if (r->generated >= r->output) {
        s->sum_running -= 1;
        dc_release(s, di, ri);
        finish_req(s, ri, false);
        continue;
      }
    }
    d->run[m++] = ri;
  }
  d->n_run = m;
  /* rotate: the engine moves up to n entries from the head to the tail, leaving at least one */
  if (n == s->p->dc.max_batch && d->n_run > 1) {
    size_t k = (size_t)n < d->n_run - 1 ? (size_t)n : d->n_run - 1;
    int64_t tmp[64];
    int64_t *buf = k <= 64 ? tmp : malloc(k * sizeof *buf);
    if (!buf) {
      s->err = K3_ENOMEM;
      return;
    }
    memcpy(buf, d->run, k * sizeof *buf);
    memmove(d->run, d->run + k, (d->n_run - k) * sizeof *d->run);
    memcpy(d->run + d->n_run - k, buf, k * sizeof *buf);
    if (buf != tmp) free(buf);
  }
  dc_loop(s, di);
}

static void dc_admit(sim_t *s, int di, int64_t ri) {
  dcw_t *d = &s->dc[di];
  if (grow((void **)&d->inbox, &d->cap_inbox, d->n_inbox + 1, sizeof *d->inbox)) {
    s->err = K3_ENOMEM;
    return;
  }
  d->inbox[d->n_inbox++] = ri;
  if (!d->busy) dc_loop(s, di); /* an idle engine wakes at once */
}

/* ---- prefill worker ---- */

static int64_t pf_tokens(const req_t *r) { return r->prompt - r->cached; }

static void pf_admit(sim_t *s, pfw_t *f) {
  const pl_prefill_cfg_t *c = &s->p->pf;
  if (f->n_pend == 0) return;
  int *idx = malloc(f->n_pend * sizeof *idx);
  int64_t *score = malloc(f->n_pend * sizeof *score);
  bool *gone = calloc(f->n_pend, sizeof *gone);
  if (!idx || !score || !gone) {
    free(idx);
    free(score);
    free(gone);
    s->err = K3_ENOMEM;
    return;
  }
  for (size_t i = 0; i < f->n_pend; i++) {
    idx[i] = (int)i;
    score[i] = pf_sched_score(pf_tokens(&s->req[f->pend[i].req]), f->pend[i].waited, s->chunk);
  }
  pf_sched_sort(idx, (int)f->n_pend, score);
  int64_t one_chunk_pages = pages_for(s->chunk, c->page_tokens);
  for (size_t k = 0; k < f->n_pend; k++) {
    size_t i = (size_t)idx[k];
    int64_t ri = f->pend[i].req;
    int64_t n = pf_tokens(&s->req[ri]);
    int others = (int)f->n_held;
    int64_t np = pages_for(s->req[ri].prompt, c->page_tokens);
    if (!pf_sched_headroom_ok(n, s->chunk, others, f->free_slots, f->free_pages, np, one_chunk_pages)) continue;
    if (np > f->free_pages || f->free_slots < 1) {
      if (others == 0) { /* can never fit: the worker fails it */
        gone[i] = true;
        f->queued_tokens -= n;
        s->sum_q -= (double)n;
        dc_release(s, s->req[ri].dc, ri);
        finish_req(s, ri, true);
      }
      continue;
    }
    if (grow((void **)&f->held, &f->cap_held, f->n_held + 1, sizeof *f->held)) {
      s->err = K3_ENOMEM;
      break;
    }
    f->free_pages -= np;
    f->free_slots -= 1;
    f->held[f->n_held++] = (held_t){.req = ri, .done = 0, .waited = f->pend[i].waited, .finished = false};
    gone[i] = true;
  }
  size_t m = 0;
  for (size_t i = 0; i < f->n_pend; i++)
    if (!gone[i]) f->pend[m++] = f->pend[i];
  f->n_pend = m;
  free(idx);
  free(score);
  free(gone);
}

/* Picks and starts a pass; false when nothing is runnable. */
static bool pf_pass(sim_t *s, int pi) {
  pfw_t *f = &s->pf[pi];
  size_t n = 0;
  for (size_t i = 0; i < f->n_held; i++) n += !f->held[i].finished;
  if (n == 0) return false;
  if (n > s->cap_scratch) { /* cand, order and score grow together */
    size_t nc = n + 64;
    pf_cand_t *cand = realloc(s->cand, nc * sizeof *cand);
    if (cand) s->cand = cand;
    int *order = realloc(s->order, nc * sizeof *order);
    if (order) s->order = order;
    int64_t *score = realloc(s->score, nc * sizeof *score);
    if (score) s->score = score;
    if (!cand || !order || !score) {
      s->err = K3_ENOMEM;
      return false;
    }
    s->cap_scratch = nc;
  }
  size_t *map = malloc(n * sizeof *map);
  if (!map) {
    s->err = K3_ENOMEM;
    return false;
  }
  size_t k = 0;
  for (size_t i = 0; i < f->n_held; i++) {
    held_t *h = &f->held[i];
    if (h->finished) continue;
    map[k] = i;
    s->cand[k++] = (pf_cand_t){.remaining = pf_tokens(&s->req[h->req]) - h->done, .waited = h->waited};
  }
  pf_sched_pick(s->cand, (int)n, s->chunk, s->p->pf.max_batch_tokens, s->pf_maxb, s->order, s->score);
  f->n_pass = 0;
  int64_t toks = 0;
  double tok_ctx = 0;
  for (size_t i = 0; i < n; i++) {
    held_t *h = &f->held[map[i]];
    h->waited = s->cand[i].waited;
    if (s->cand[i].take <= 0 || f->n_pass == s->pf_maxb) continue;
    const req_t *r = &s->req[h->req];
    f->pass_req[f->n_pass] = h->req;
    f->pass_take[f->n_pass++] = s->cand[i].take;
    toks += s->cand[i].take;
    /* attention over what the sequence already holds, for the chunk's tokens */
    tok_ctx += (double)s->cand[i].take * (double)(r->cached + h->done);
  }
  free(map);
  for (size_t i = 0; i < f->n_pend; i++) f->pend[i].waited++;
  double ms = pl_prefill_pass_takes_ms(s->p, f->n_pass, f->pass_take, toks, tok_ctx);
  if (!f->busy) s->sum_busy += 1;
  f->busy = true;
  if (s->p->pf_speed_n == s->P) ms *= s->p->pf_speed[pi]; /* the profiled cluster's own workers */
  push_ev(s, s->now + ms * share(s) * jitter(s, s->pf_sigma), EV_PF_PASS_END, pi, -1);
  return true;
}

/* The engine's loop: admit, then run a pass or go idle. */
static void pf_loop(sim_t *s, int pi) {
  pf_admit(s, &s->pf[pi]);
  if (s->err) return;
  if (!pf_pass(s, pi) && s->pf[pi].busy) {
    s->pf[pi].busy = false;
    s->sum_busy -= 1;
  }
}

static held_t *pf_find(pfw_t *f, int64_t ri) {
  for (size_t i = 0; i < f->n_held; i++)
    if (f->held[i].req == ri) return &f->held[i];
  return NULL;
}

static void pf_pass_end(sim_t *s, int pi) {
  pfw_t *f = &s->pf[pi];
  for (int i = 0; i < f->n_pass; i++) {
    int64_t ri = f->pass_req[i];
    held_t *h = pf_find(f, ri);
    if (!h) continue;
    h->done += f->pass_take[i];
    req_t *r = &s->req[ri];
    if (h->done < pf_tokens(r)) continue;
    h->finished = true;
    f->queued_tokens -= pf_tokens(r);
    s->sum_q -= (double)pf_tokens(r);
    push_ev(s, s->now + pl_handoff_ms(s->p, r->prompt), EV_HANDOFF, pi, ri);
  }
  f->n_pass = 0;
  pf_loop(s, pi);
}

static void pf_handoff_done(sim_t *s, int pi, int64_t ri) {
  pfw_t *f = &s->pf[pi];
  for (size_t i = 0; i < f->n_held; i++) {
    if (f->held[i].req != ri) continue;
    memmove(f->held + i, f->held + i + 1, (f->n_held - i - 1) * sizeof *f->held);
    f->n_held--;
    f->free_pages += pages_for(s->req[ri].prompt, s->p->pf.page_tokens);
    f->free_slots += 1;
    break;
  }
  if (!f->busy && f->n_pend) pf_loop(s, pi); /* the FREE wakes an idle engine */
  int64_t n = pf_tokens(&s->req[ri]); /* the Prefill call returns: the router's pending count drops */
  f->sent = f->sent > n ? f->sent - n : 0;
  if (first_from_prefill(&s->req[ri])) first_token(s, &s->req[ri]); /* and relays the first token */
  dc_admit(s, s->req[ri].dc, ri);
}

/* ---- router ---- */

static void route(sim_t *s, int64_t ri) {
  req_t *r = &s->req[ri];
  const pl_decode_cfg_t *dcfg = &s->p->dc;
  int64_t need = pages_for(r->prompt + r->output, dcfg->page_tokens);
  int best = -1;
  double best_util = 2.0;
  size_t best_running = 0;
  if (r->prompt + r->output <= dcfg->num_pages * dcfg->page_tokens) {
    for (int i = 0; i < s->D; i++) {
      const dcw_t *d = &s->dc[i];
      if (d->pages_used + need > dcfg->num_pages || d->slots_used + 1 > dcfg->num_slots) continue;
      double up = (double)(d->pages_used + need) / (double)dcfg->num_pages;
      double us = (double)(d->slots_used + 1) / (double)dcfg->num_slots;
      double util = up > us ? up : us;
      if (best < 0 || util < best_util - 1e-12 || (util <= best_util + 1e-12 && d->n_run < best_running)) {
        best = i;
        best_util = util;
        best_running = d->n_run;
      }
    }
  }
  if (best < 0) {
    finish_req(s, ri, true);
    return;
  }
  dcw_t *d = &s->dc[best];
  r->dc = best;
  r->dc_pages = need;
  d->pages_used += need;
  d->slots_used += 1;
  s->sum_pages += (double)need;
  s->sum_slots += 1;
  dc_set_util(s, d);
  int pi = 0;
  bool stale = s->p->router_heartbeat_ms > 0;
  for (int i = 1; i < s->P; i++) {
    int64_t qi = stale ? s->pf[i].hb_queued + s->pf[i].sent : s->pf[i].queued_tokens;
    int64_t qb = stale ? s->pf[pi].hb_queued + s->pf[pi].sent : s->pf[pi].queued_tokens;
    if (qi < qb) pi = i;
  }
  pfw_t *f = &s->pf[pi];
  f->sent += pf_tokens(r);
  r->pf = pi;
  /* Far past any latency target: stop instead of crawling through an ever longer queue. */
  double limit_ms = (s->w->overload_wait_s > 0 ? s->w->overload_wait_s : 30) * 1000.0;
  if (f->n_pend >= 4096 || (f->n_pend >= 64 && s->now - s->req[f->pend[0].req].t_arrive > limit_ms)) {
    s->overloaded = true;
    return;
  }
  if (grow((void **)&f->pend, &f->cap_pend, f->n_pend + 1, sizeof *f->pend)) {
    s->err = K3_ENOMEM;
    return;
  }
  f->pend[f->n_pend++] = (pend_t){ri, 0};
  f->queued_tokens += pf_tokens(r);
  s->sum_q += (double)pf_tokens(r);
  if (!f->busy) pf_loop(s, pi);
}

/* ---- driver ---- */

static int check(const pl_profile_t *p, const pl_cluster_t *c, const pl_workload_t *w, const pl_fixed_reqs_t *fx,
                 char *err, size_t errlen) {
  if (c->n_prefill < 1 || c->n_decode < 1) {
    snprintf(err, errlen, "cluster: prefill (%d) and decode (%d) counts must be >= 1", c->n_prefill, c->n_decode);
    return K3_EINVAL;
  }
  if (p->pf.chunk_tokens < 1 || p->pf.max_batch < 1 || p->pf.max_batch_tokens < 1 || p->pf.page_tokens < 1 ||
      p->pf.num_pages < 1 || p->pf.num_slots < 1) {
    snprintf(err, errlen, "profile: prefill settings must all be >= 1");
    return K3_EINVAL;
  }
  if (p->dc.max_batch < 1 || p->dc.page_tokens < 1 || p->dc.num_pages < 1 || p->dc.num_slots < 1) {
    snprintf(err, errlen, "profile: decode settings must all be >= 1");
    return K3_EINVAL;
  }
  if (!fx && !(w->rate > 0)) {
    snprintf(err, errlen, "workload: rate must be > 0 (got %g)", w->rate);
    return K3_EINVAL;
  }
  if (!fx && w->requests == 0 && !(w->duration_s > 0)) {
    snprintf(err, errlen, "workload: requests or duration must be > 0");
    return K3_EINVAL;
  }
  return 0;
}

int pl_sim_run(const pl_profile_t *p, const pl_cluster_t *c, const pl_workload_t *w, const pl_fixed_reqs_t *fixed,
               pl_trace_fn trace, void *trace_ctx, pl_result_t *out, char *err, size_t errlen) {
  int rc = check(p, c, w, fixed, err, errlen);
  if (rc) return rc;
  sim_t s = {.p = p, .w = w, .fixed = fixed, .trace = trace, .trace_ctx = trace_ctx, .out = out, .P = c->n_prefill,
             .D = c->n_decode, .host_cores = c->host_cores};
  memset(out, 0, sizeof *out);
  s.chunk = (p->pf.chunk_tokens + 63) / 64 * 64; /* the runner rounds the chunk up to the KDA chunk */
  s.pf_maxb = p->pf.max_batch > 64 ? 64 : p->pf.max_batch;
  s.rng_arrival = bn_arrival_rng(w->seed); /* k3pd-bench's open loop */
  s.rng_jitter = w->seed ^ 0x2545f4914f6cdd1dull;
  s.pf_sigma = sqrt(log(1.0 + p->pf_cv * p->pf_cv));
  {
    double expect = fixed ? (double)fixed->n
                          : (w->requests ? (double)w->requests : w->rate * (w->duration_s - w->warmup_s));
    s.max_over = 0.01 * expect + 1;
  }
  s.dc_sigma = sqrt(log(1.0 + p->dc_cv * p->dc_cv));
  s.win_lo = w->warmup_s * 1000.0;
  s.win_hi = INFINITY;
  rc = K3_ENOMEM;
  s.pf = calloc((size_t)s.P, sizeof *s.pf);
  s.dc = calloc((size_t)s.D, sizeof *s.dc);
  if (!s.pf || !s.dc) goto out;
  for (int i = 0; i < s.P; i++) {
    s.pf[i].free_pages = p->pf.num_pages;
    s.pf[i].free_slots = p->pf.num_slots;
    s.pf[i].pass_req = malloc((size_t)s.pf_maxb * sizeof(int64_t));
    s.pf[i].pass_take = malloc((size_t)s.pf_maxb * sizeof(int64_t));
    if (!s.pf[i].pass_req || !s.pf[i].pass_take) goto out;
  }
  if (pl_samples_init(&s.ttft, 1u << 20, 1) || pl_samples_init(&s.itl, 1u << 20, 2) ||
      pl_samples_init(&s.e2e, 1u << 20, 3))
    goto out;
  if (next_arrival(&s)) goto out;
  /* heartbeats, spread over the interval: worker i at (i + 1) / (P + 1) of it, then every interval */
  for (int i = 0; p->router_heartbeat_ms > 0 && s.P > 1 && i < s.P; i++, s.n_hb++)
    if (push_ev(&s, p->router_heartbeat_ms * (i + 1) / (s.P + 1), EV_HEARTBEAT, i, -1)) goto out;
  while (s.n_heap && !s.err && !s.overloaded) {
    ev_t e = pop_ev(&s);
    if (e.type == EV_HEARTBEAT && --s.n_hb == s.n_heap) continue; /* nothing else left: the end */
    s.now = e.t;
    stat_advance(&s);
    out->events++;
    switch (e.type) {
      case EV_ARRIVE:
        out->arrived++;
        if (s.req[e.req].measured) out->measured++;
        route(&s, e.req);
        if (!s.err && !s.overloaded) next_arrival(&s);
        if (s.arrivals_done && s.win_hi == INFINITY) s.win_hi = s.now;
        break;
      case EV_PF_PASS_END: pf_pass_end(&s, e.who); break;
      case EV_HANDOFF: pf_handoff_done(&s, e.who, e.req); break;
      case EV_DC_STEP_END: dc_step_end(&s, e.who); break;
      case EV_HEARTBEAT:
        s.pf[e.who].hb_queued = s.pf[e.who].queued_tokens;
        s.pf[e.who].sent = 0;
        if (!push_ev(&s, s.now + p->router_heartbeat_ms, EV_HEARTBEAT, e.who, -1)) s.n_hb++;
        break;
    }
  }
  rc = s.err;
  if (rc) {
    snprintf(err, errlen, "simulation out of memory");
    goto out;
  }
  out->sim_end_ms = s.now;
  out->ttft_ms = pl_samples_summary(&s.ttft);
  out->itl_ms = pl_samples_summary(&s.itl);
  out->e2e_ms = pl_samples_summary(&s.e2e);
  if (s.overloaded) {
    out->ttft_ms.p50 = out->ttft_ms.p90 = out->ttft_ms.p99 = out->ttft_ms.max = INFINITY;
    out->rejected += out->measured - out->completed - out->rejected;
  }
  double win = (s.win_hi < s.now ? s.win_hi : s.now) - s.win_lo;
  if (win > 0) {
    out->pf_queued_tokens_avg = s.int_q / win / s.P;
    out->pf_busy = s.int_busy / win / s.P;
    out->dc_util_avg = s.int_util / win / s.D;
    out->dc_running_avg = s.int_running / win / s.D;
    out->dc_pages_used_avg = s.int_pages / win / s.D;
    out->dc_slots_used_avg = s.int_slots / win / s.D;
  }
  out->dc_batch_avg = s.steps > 0 ? s.step_seqs / s.steps : 0;
  rc = 0;
out:
  if (s.pf)
    for (int i = 0; i < s.P; i++) {
      free(s.pf[i].pend);
      free(s.pf[i].held);
      free(s.pf[i].pass_req);
      free(s.pf[i].pass_take);
    }
  if (s.dc)
    for (int i = 0; i < s.D; i++) {
      free(s.dc[i].run);
      free(s.dc[i].inbox);
    }
  free(s.pf);
  free(s.dc);
  free(s.heap);
  free(s.req);
  free(s.cand);
  free(s.order);
  free(s.score);
  pl_samples_free(&s.ttft);
  pl_samples_free(&s.itl);
  pl_samples_free(&s.e2e);
  return rc;
}
