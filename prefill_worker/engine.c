/* The prefill engine thread: fair chunked prefill over the runner (policy in sched.h).
 *
 * Each iteration: take every queued message; admit queued prompts into local pages and a KDA
 * slot (score order, keeping headroom for single-pass prompts); choose the next pass (at most
 * one runner chunk per prompt, --max-batch prompts, --max-batch-tokens tokens); run it. A
 * prompt's chunks go through separate runner calls, each continuing from the state the last
 * one left (exact: the runner's split invariant), and only the pass that holds a prompt's last
 * chunk streams its layers to the loop and samples its first token (step 0 of its seed). The
 * local state stays until the loop says the transfer is over (FREE); a FREE for a prompt still
 * computing drops it at once (cancelled or aborted: no compute is spent on it any more).
 *
 * Per job the engine posts STARTED (at admission: local ids known, the send can start), LAYER l
 * (only in the job's final pass), then FINISHED or FAILED, or nothing more when a FREE came
 * first. Only this thread touches the runner. Pass counters (w->passes_started/_done) are
 * atomics the loop reads to stamp arrivals, so a prompt's wait can be told in passes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "pf.h"
#include "sched.h"

/* A prompt with local state: computing (done < n_tokens) or waiting for its transfer. */
typedef struct held {
  struct held *next;
  pf_job_t *job;
  k3_seq_t seq;
  int64_t done;     /* prompt tokens prefilled into seq */
  uint32_t waited;  /* passes runnable but not chosen (sched.h) */
  bool finished;    /* FINISHED or FAILED posted: nothing more to compute */
  bool waiting;     /* a prepared resume: its state is being received (not runnable) */
} held_t;

/* A prompt waiting for local state. */
typedef struct {
  pf_job_t *job;
  uint32_t waited;
} pend_t;

typedef struct eng eng_t;

typedef struct {
  pf_worker_t *w;
  pf_job_t **jobs; /* the jobs whose LAST chunk is in this pass */
  int n;
  eng_t *e;
} layer_ctx_t;

struct eng {
  pf_worker_t *w;
  k3_msg_t *stash, *stash_tail; /* messages taken mid-pass, handled after it (FIFO) */
  held_t *held;
  pend_t *pend;
  size_t n_pend, cap_pend;
  int maxb;
  int64_t chunk;   /* the runner's prefill chunk: one runner round per pass */
  float *logits;   /* maxb rows */
  /* scratch, grown with the number of computing prompts */
  held_t **run;
  pf_cand_t *cand;
  int *order;
  int64_t *score;
  int cap_run;
};

static pf_msg_t *new_out(pf_job_t *job, int type) {
  pf_msg_t *o = calloc(1, sizeof *o);
  if (o) {
    o->link.type = type;
    o->job = job;
  }
  return o;
}

static void post_out(pf_worker_t *w, pf_msg_t *o) {
  if (o) k3_inbox_post(&w->outbox, &o->link);
}

/* K3PD_TEST_LAYER_SLEEP_MS (fault tests only, never in production): sleep this long after every
 * layer's state is final, so a test can kill the worker while a transfer is surely running
 * whatever the device's speed (scripts/gpu/cluster.sh "faults"). */
static int test_layer_sleep_ms(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("K3PD_TEST_LAYER_SLEEP_MS");
    v = e ? atoi(e) : 0;
    if (v < 0 || v > 60000) v = 0;
  }
  return v;
}

static void reserve_prepared(eng_t *e, pf_job_t *job);

/* Between two layers of a pass: PrepareResume's reservations are served at once (a resume
 * would otherwise wait for the pass to end, the router with it); every other message waits for
 * the pass's end, in order. Only this thread touches the runner, and the pass's own sequences
 * hold their pages already. */
static void serve_reserves(eng_t *e) {
  if (!e || k3_msgq_len(&e->w->engine.q) == 0) return;
  for (k3_msg_t *m = k3_msgq_take_all(&e->w->engine.q), *next; m; m = next) {
    next = m->next;
    m->next = NULL;
    if (m->type == PF_MSG_RESERVE) {
      reserve_prepared(e, ((pf_msg_t *)m)->job);
      free(m);
      continue;
    }
    if (e->stash_tail) e->stash_tail->next = m;
    else e->stash = m;
    e->stash_tail = m;
  }
}

static int on_layer(int layer, void *ctx) {
  layer_ctx_t *lc = ctx;
  serve_reserves(lc->e);
  if (lc->n && test_layer_sleep_ms()) usleep((useconds_t)test_layer_sleep_ms() * 1000u);
  for (int i = 0; i < lc->n; i++) {
    pf_msg_t *o = new_out(lc->jobs[i], PF_MSG_LAYER);
    if (!o) return K3_ENOMEM;
    o->layer = layer;
    post_out(lc->w, o);
  }
  return 0;
}

static void fail_job(pf_worker_t *w, pf_job_t *job, int status, const char *msg) {
  pf_msg_t *o = new_out(job, PF_MSG_FAILED);
  if (o) {
    o->status = status;
    snprintf(o->err, sizeof o->err, "%s", msg);
  }
  post_out(w, o);
}

static void free_held(pf_worker_t *w, held_t *h) {
  k3_runner_seq_release(w->runner, &h->seq);
  free(h->seq.pages);
  free(h);
}

/* Drops a job's local state or its queue entry; returns true when it had either. */
static bool drop_job(eng_t *e, pf_job_t *job) {
  for (held_t **pp = &e->held; *pp; pp = &(*pp)->next) {
    if ((*pp)->job == job) {
      held_t *h = *pp;
      *pp = h->next;
      free_held(e->w, h);
      return true;
    }
  }
  for (size_t i = 0; i < e->n_pend; i++) {
    if (e->pend[i].job == job) {
      memmove(e->pend + i, e->pend + i + 1, (e->n_pend - i - 1) * sizeof *e->pend);
      e->n_pend--;
      return true;
    }
  }
  return false;
}

static void enqueue(eng_t *e, pf_job_t *job) {
  if (e->n_pend == e->cap_pend) {
    size_t nc = e->cap_pend ? e->cap_pend * 2 : 16;
    pend_t *np = realloc(e->pend, nc * sizeof *np);
    if (!np) {
      fail_job(e->w, job, K3_ENOMEM, "prefill queue out of memory");
      return;
    }
    e->pend = np;
    e->cap_pend = nc;
  }
  e->pend[e->n_pend++] = (pend_t){job, 0};
}

static int n_held(const eng_t *e) {
  int n = 0;
  for (const held_t *h = e->held; h; h = h->next) n++;
  return n;
}

/* Gives queued prompts local pages and a slot, best score first (sched.h). Prompts that do not
 * fit now stay queued until a FREE; one that could never fit (nothing else holds state) fails. */
static void admit(eng_t *e) {
  pf_worker_t *w = e->w;
  if (e->n_pend == 0) return;
  int *idx = malloc(e->n_pend * sizeof *idx);
  int64_t *score = malloc(e->n_pend * sizeof *score);
  bool *gone = calloc(e->n_pend, sizeof *gone);
  if (!idx || !score || !gone) {
    free(idx);
    free(score);
    free(gone);
    return; /* retried on the next iteration */
  }
  for (size_t i = 0; i < e->n_pend; i++) {
    idx[i] = (int)i;
    score[i] = pf_sched_score(e->pend[i].job->n_tokens, e->pend[i].waited, e->chunk);
  }
  pf_sched_sort(idx, (int)e->n_pend, score);
  int64_t one_chunk_pages = k3_runner_pages_for(w->runner, e->chunk);
  for (size_t k = 0; k < e->n_pend; k++) {
    size_t i = (size_t)idx[k];
    pf_job_t *job = e->pend[i].job;
    int others = n_held(e);
    int np = k3_runner_pages_for(w->runner, job->n_tokens);
    if (!pf_sched_headroom_ok(job->n_tokens, e->chunk, others, k3_runner_free_slots(w->runner),
                              k3_runner_free_pages(w->runner), np, one_chunk_pages))
      continue;
    held_t *h = calloc(1, sizeof *h);
    int32_t *pages = calloc((size_t)(np > 0 ? np : 1), sizeof *pages);
    if (!h || !pages) {
      free(h);
      free(pages);
      continue;
    }
    h->job = job;
    h->seq.slot = -1;
    h->seq.pages = pages;
    h->seq.cap_pages = np;
    int rc = k3_runner_seq_reserve(w->runner, &h->seq, job->n_tokens);
    if (rc) {
      free(pages);
      free(h);
      if (rc != K3_ECAPACITY || others == 0) {
        fail_job(w, job, rc, rc == K3_ECAPACITY ? "prompt does not fit the prefill worker's local page pool"
                                                : "reserving local state");
        gone[i] = true;
      }
      continue;
    }
    h->waited = e->pend[i].waited;
    h->next = e->held;
    e->held = h;
    gone[i] = true;
    pf_msg_t *o = new_out(job, PF_MSG_STARTED);
    if (o) o->seq = &h->seq;
    post_out(w, o);
  }
  size_t m = 0;
  for (size_t i = 0; i < e->n_pend; i++)
    if (!gone[i]) e->pend[m++] = e->pend[i];
  e->n_pend = m;
  free(idx);
  free(score);
  free(gone);
}

/* A prepared resume (PrepareResume): local state for the whole prompt now, outside the fair
 * queue (the decode worker's state is about to land in it); it runs once RESUME says so. */
static void reserve_prepared(eng_t *e, pf_job_t *job) {
  pf_worker_t *w = e->w;
  int np = k3_runner_pages_for(w->runner, job->n_tokens);
  held_t *h = calloc(1, sizeof *h);
  int32_t *pages = calloc((size_t)(np > 0 ? np : 1), sizeof *pages);
  int rc = h && pages ? 0 : K3_ENOMEM;
  if (!rc) {
    h->job = job;
    h->seq.slot = -1;
    h->seq.pages = pages;
    h->seq.cap_pages = np;
    rc = k3_runner_seq_reserve(w->runner, &h->seq, job->n_tokens);
  }
  if (rc) {
    free(h);
    free(pages);
    fail_job(w, job, rc, rc == K3_ECAPACITY ? "no local pages or KDA slot free for a resume now" : "reserving local state");
    return;
  }
  /* The pages and slot come back zeroed by the backend, asynchronously on a device: that must
   * be over before the decode worker's export writes them (found on the H200: a zeroing that
   * ran after the export landed made the digests fail). */
  k3k_backend_t *be = k3_runner_backend(w->runner);
  if (be->synchronize && (rc = be->synchronize(be)) != 0) {
    k3_runner_seq_release(w->runner, &h->seq);
    free(h->seq.pages);
    free(h);
    fail_job(w, job, rc, "reserving local state: device synchronisation failed");
    return;
  }
  h->waiting = true;
  h->next = e->held;
  e->held = h;
  pf_msg_t *o = new_out(job, PF_MSG_RESERVED);
  if (o) o->seq = &h->seq;
  post_out(w, o);
}

/* The state at job->resume arrived: continue the prompt from there. */
static void resume_prepared(eng_t *e, pf_job_t *job) {
  for (held_t *h = e->held; h; h = h->next) {
    if (h->job != job || !h->waiting) continue;
    h->waiting = false;
    h->done = job->resume;
    h->seq.len = job->resume;
    pf_msg_t *o = new_out(job, PF_MSG_STARTED);
    if (o) o->seq = &h->seq;
    post_out(e->w, o);
    return;
  }
  fail_job(e->w, job, K3_EINTERNAL, "resume: no prepared local state for this job");
}

static int grow_scratch(eng_t *e, int n) {
  if (n <= e->cap_run) return 0;
  int nc = n + 16;
  held_t **run = realloc(e->run, (size_t)nc * sizeof *run);
  if (run) e->run = run;
  pf_cand_t *cand = realloc(e->cand, (size_t)nc * sizeof *cand);
  if (cand) e->cand = cand;
  int *order = realloc(e->order, (size_t)nc * sizeof *order);
  if (order) e->order = order;
  int64_t *score = realloc(e->score, (size_t)nc * sizeof *score);
  if (score) e->score = score;
  if (!run || !cand || !order || !score) return K3_ENOMEM;
  e->cap_run = nc;
  return 0;
}

/* Runs one pass; returns false when nothing was runnable. */
static bool run_pass(eng_t *e) {
  pf_worker_t *w = e->w;
  int n = 0;
  for (held_t *h = e->held; h; h = h->next) n += !h->finished && !h->waiting;
  if (n == 0) return false;
  if (grow_scratch(e, n)) return false; /* out of memory: retried after the next wait */
  /* arrival order (the held list is newest first) for the tie rule */
  int k = n;
  for (held_t *h = e->held; h; h = h->next)
    if (!h->finished && !h->waiting) e->run[--k] = h;
  for (int i = 0; i < n; i++)
    e->cand[i] = (pf_cand_t){.remaining = e->run[i]->job->n_tokens - e->run[i]->done, .waited = e->run[i]->waited};
  int chosen = pf_sched_pick(e->cand, n, e->chunk, w->max_batch_tokens, e->maxb, e->order, e->score);
  k3_prefill_item_t items[64];
  held_t *in_pass[64];
  pf_job_t *last[64];
  int m = 0, n_last = 0;
  int64_t V = w->vocab, toks = 0;
  for (int i = 0; i < n; i++) {
    e->run[i]->waited = e->cand[i].waited;
    if (e->cand[i].take <= 0 || m == e->maxb) continue;
    held_t *h = e->run[i];
    bool is_last = h->done + e->cand[i].take == h->job->n_tokens;
    items[m] = (k3_prefill_item_t){.seq = &h->seq,
                                   .tokens = h->job->tokens + h->done,
                                   .n_tokens = e->cand[i].take,
                                   .logits = is_last ? e->logits + (size_t)m * (size_t)V : NULL,
                                   .all_logits = false};
    toks += e->cand[i].take;
    in_pass[m++] = h;
    if (is_last) last[n_last++] = h->job;
  }
  /* prompts still queued age with every pass they miss */
  for (size_t i = 0; i < e->n_pend; i++) e->pend[i].waited++;
  (void)chosen;
  char err[256];
  layer_ctx_t lc = {w, last, n_last, e};
  uint64_t idx = atomic_fetch_add(&w->passes_started, 1);
  uint64_t t0 = k3_now_ns();
  int rc = k3_runner_prefill(w->runner, items, m, on_layer, &lc, err, sizeof err);
  k3_histogram_observe(k3_metric_default(w->m.forward_seconds), (double)(k3_now_ns() - t0) / 1e9);
  atomic_fetch_add(&w->passes_done, 1);
  k3_counter_inc(k3_metric_default(w->m.passes_total));
  if (!rc) k3_counter_add(k3_metric_default(w->m.tokens_total), (double)toks);
  for (int i = 0; i < m; i++) {
    held_t *h = in_pass[i];
    pf_job_t *job = h->job;
    if (rc) { /* the states of every prompt in the pass are unspecified now */
      h->finished = true;
      fail_job(w, job, rc, err);
      continue;
    }
    h->done += items[i].n_tokens;
    if (h->done < job->n_tokens) continue;
    h->finished = true;
    k3k_sample_cfg_t cfg = job->sample;
    cfg.step = 0;
    int32_t tok = 0;
    int src = k3k_sample_row(items[i].logits, V, &cfg, &tok);
    if (src) {
      fail_job(w, job, src, "sampling the first token failed");
      continue;
    }
    pf_msg_t *o = new_out(job, PF_MSG_FINISHED);
    if (o) {
      o->token = (uint32_t)tok;
      o->logprob = (float)k3k_logprob_row(items[i].logits, V, tok);
      o->pass = idx;
    }
    post_out(w, o);
  }
  return true;
}

static void *engine_main(void *arg) {
  pf_worker_t *w = arg;
  eng_t e = {.w = w};
  e.maxb = w->max_batch > 64 ? 64 : w->max_batch;
  e.chunk = k3_runner_opts(w->runner)->prefill_chunk_tokens;
  if (e.chunk < 1) e.chunk = 256;
  e.logits = malloc((size_t)e.maxb * (size_t)w->vocab * sizeof(float));
  bool stop = false;
  if (!e.logits) {
    K3_ERROR("prefill engine: out of memory for batch buffers");
    stop = true;
  }
  while (!stop) {
    k3_msg_t *m = k3_msgq_take_all(&w->engine.q);
    if (e.stash) { /* taken during the last pass: older than what is queued now */
      e.stash_tail->next = m;
      m = e.stash;
      e.stash = e.stash_tail = NULL;
    }
    while (m) {
      k3_msg_t *next = m->next;
      pf_msg_t *pm = (pf_msg_t *)m;
      if (m->type == PF_MSG_RUN) {
        enqueue(&e, pm->job);
      } else if (m->type == PF_MSG_RESERVE) {
        reserve_prepared(&e, pm->job);
      } else if (m->type == PF_MSG_RESUME) {
        resume_prepared(&e, pm->job);
      } else if (m->type == PF_MSG_FREE) {
        drop_job(&e, pm->job);
        post_out(w, new_out(pm->job, PF_MSG_FREE)); /* tells the loop the job's local state is gone */
      } else {
        stop = true;
      }
      free(pm);
      m = next;
    }
    if (stop) break;
    admit(&e);
    if (!run_pass(&e)) k3_msgq_wait(&w->engine.q, 100);
  }
  while (e.held) {
    held_t *h = e.held;
    e.held = h->next;
    if (!h->finished) fail_job(w, h->job, K3_ESHUTDOWN, "prefill worker shutting down");
    free_held(w, h);
  }
  for (size_t i = 0; i < e.n_pend; i++) fail_job(w, e.pend[i].job, K3_ESHUTDOWN, "prefill worker shutting down");
  free(e.pend);
  free(e.logits);
  free(e.run);
  free(e.cand);
  free(e.order);
  free(e.score);
  return NULL;
}

static void free_msg(k3_msg_t *m) { free(m); }

int pf_engine_start(pf_worker_t *w) { return k3_engine_start(&w->engine, engine_main, w); }

void pf_engine_post(pf_worker_t *w, pf_msg_t *m) { k3_engine_post(&w->engine, &m->link); }

void pf_engine_stop(pf_worker_t *w) {
  pf_msg_t *m = calloc(1, sizeof *m);
  if (m) m->link.type = PF_MSG_STOP;
  k3_engine_stop(&w->engine, m ? &m->link : NULL, free_msg);
}
