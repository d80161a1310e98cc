/* The prefill engine thread: batches queued prompts into one runner call (up to --max-batch
 * sequences and --max-batch-tokens prompt tokens), streams per-layer completion to the loop,
 * samples each sequence's first token (step 0 of its seed) and keeps the local state until the
 * loop says the transfer is over (FREE). Only this thread touches the runner. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "pf.h"

typedef struct held {
  struct held *next;
  pf_job_t *job;
  k3_seq_t seq;
} held_t;

typedef struct {
  pf_worker_t *w;
  pf_job_t **jobs;
  int n;
} layer_ctx_t;

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

static int on_layer(int layer, void *ctx) {
  layer_ctx_t *lc = ctx;
  if (test_layer_sleep_ms()) usleep((useconds_t)test_layer_sleep_ms() * 1000u);
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

static void release_held(pf_worker_t *w, held_t **held, pf_job_t *job) {
  for (held_t **pp = held; *pp; pp = &(*pp)->next) {
    if ((*pp)->job == job) {
      held_t *h = *pp;
      *pp = h->next;
      k3_runner_seq_release(w->runner, &h->seq);
      free(h->seq.pages);
      free(h);
      return;
    }
  }
}

/* Runs one batch of jobs. Jobs that find no free local pages/slot (others still transferring)
 * are returned through deferred[] to run after the next FREE. */
static void run_batch(pf_worker_t *w, pf_job_t **jobs, int n, held_t **held, float *logits, pf_job_t **deferred,
                      int *n_deferred) {
  held_t *hs[64];
  k3_prefill_item_t items[64];
  pf_job_t *ok_jobs[64];
  int m = 0;
  char err[256];
  int64_t V = w->vocab;
  for (int i = 0; i < n; i++) {
    pf_job_t *job = jobs[i];
    held_t *h = calloc(1, sizeof *h);
    int np = k3_runner_pages_for(w->runner, job->n_tokens);
    int32_t *pages = calloc((size_t)(np > 0 ? np : 1), sizeof *pages);
    if (!h || !pages) {
      free(h);
      free(pages);
      fail_job(w, job, K3_ENOMEM, "prefill worker out of memory");
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
      if (rc == K3_ECAPACITY && *held) {
        deferred[(*n_deferred)++] = job; /* wait for a transfer to finish */
      } else {
        fail_job(w, job, rc, rc == K3_ECAPACITY ? "prompt does not fit the prefill worker's local page pool"
                                                : "reserving local state");
      }
      continue;
    }
    h->next = *held;
    *held = h;
    pf_msg_t *o = new_out(job, PF_MSG_STARTED);
    if (o) o->seq = &h->seq;
    post_out(w, o);
    hs[m] = h;
    ok_jobs[m] = job;
    items[m] = (k3_prefill_item_t){.seq = &h->seq,
                                   .tokens = job->tokens,
                                   .n_tokens = job->n_tokens,
                                   .logits = logits + (size_t)m * (size_t)V,
                                   .all_logits = false};
    m++;
  }
  if (m == 0) return;
  layer_ctx_t lc = {w, ok_jobs, m};
  uint64_t t0 = k3_now_ns();
  int rc = k3_runner_prefill(w->runner, items, m, on_layer, &lc, err, sizeof err);
  k3_histogram_observe(k3_metric_default(w->m.forward_seconds), (double)(k3_now_ns() - t0) / 1e9);
  if (!rc) {
    int64_t toks = 0;
    for (int i = 0; i < m; i++) toks += items[i].n_tokens;
    k3_counter_add(k3_metric_default(w->m.tokens_total), (double)toks);
  }
  for (int i = 0; i < m; i++) {
    pf_job_t *job = ok_jobs[i];
    if (rc) {
      fail_job(w, job, rc, err);
      continue;
    }
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
    }
    post_out(w, o);
  }
  (void)hs;
}

static void *engine_main(void *arg) {
  pf_worker_t *w = arg;
  held_t *held = NULL;
  int maxb = w->max_batch > 64 ? 64 : w->max_batch;
  float *logits = malloc((size_t)maxb * (size_t)w->vocab * sizeof(float));
  pf_job_t **batch = calloc((size_t)maxb, sizeof *batch);
  pf_job_t **pending = NULL;
  size_t n_pending = 0, cap_pending = 0;
  bool stop = false, blocked = false;
  pf_job_t *deferred[64];
  int n_deferred = 0;
  if (!logits || !batch) {
    K3_ERROR("prefill engine: out of memory for batch buffers");
    stop = true;
  }
  while (!stop) {
    k3_msg_t *m = k3_msgq_take_all(&w->engine.q);
    while (m) {
      k3_msg_t *next = m->next;
      pf_msg_t *pm = (pf_msg_t *)m;
      if (m->type == PF_MSG_RUN) {
        if (n_pending == cap_pending) {
          size_t nc = cap_pending ? cap_pending * 2 : 16;
          pf_job_t **np = realloc(pending, nc * sizeof *np);
          if (np) {
            pending = np;
            cap_pending = nc;
          }
        }
        if (n_pending < cap_pending)
          pending[n_pending++] = pm->job;
        else
          fail_job(w, pm->job, K3_ENOMEM, "prefill queue out of memory");
      } else if (m->type == PF_MSG_FREE) {
        release_held(w, &held, pm->job);
        blocked = false;
        /* a FREE for a job still pending (cancelled before it ran) drops it from the queue */
        for (size_t i = 0; i < n_pending; i++) {
          if (pending[i] == pm->job) {
            memmove(pending + i, pending + i + 1, (n_pending - i - 1) * sizeof *pending);
            n_pending--;
            break;
          }
        }
        pf_msg_t *o = new_out(pm->job, PF_MSG_FREE);
        post_out(w, o); /* tells the loop the job's local state is gone */
      } else {
        stop = true;
      }
      free(pm);
      m = next;
    }
    if (stop) break;
    if (n_pending == 0 || blocked) {
      k3_msgq_wait(&w->engine.q, 100);
      continue;
    }
    /* FIFO batch within the sequence and token budgets (a prompt larger than the token budget
     * runs alone; the runner chunks it internally). */
    int n = 0;
    int64_t toks = 0;
    size_t used = 0;
    while (used < n_pending && n < maxb) {
      pf_job_t *j = pending[used];
      if (n > 0 && toks + j->n_tokens > w->max_batch_tokens) break;
      batch[n++] = j;
      toks += j->n_tokens;
      used++;
    }
    memmove(pending, pending + used, (n_pending - used) * sizeof *pending);
    n_pending -= used;
    n_deferred = 0;
    run_batch(w, batch, n, &held, logits, deferred, &n_deferred);
    if (n_deferred > 0) {
      /* put them back at the front, in order, and wait for a FREE */
      if (n_pending + (size_t)n_deferred > cap_pending) {
        size_t nc = n_pending + (size_t)n_deferred + 16;
        pf_job_t **np = realloc(pending, nc * sizeof *np);
        if (!np) {
          for (int i = 0; i < n_deferred; i++) fail_job(w, deferred[i], K3_ENOMEM, "prefill queue out of memory");
          continue;
        }
        pending = np;
        cap_pending = nc;
      }
      memmove(pending + n_deferred, pending, n_pending * sizeof *pending);
      memcpy(pending, deferred, (size_t)n_deferred * sizeof *pending);
      n_pending += (size_t)n_deferred;
      blocked = true;
    }
  }
  while (held) {
    held_t *h = held;
    held = h->next;
    k3_runner_seq_release(w->runner, &h->seq);
    free(h->seq.pages);
    free(h);
  }
  for (size_t i = 0; i < n_pending; i++) fail_job(w, pending[i], K3_ESHUTDOWN, "prefill worker shutting down");
  free(pending);
  free(logits);
  free(batch);
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
