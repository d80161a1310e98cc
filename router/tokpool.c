/* k3pd-router's tokenisation pool; the contract is in tokpool.h.
 *
 * One mutex-protected FIFO feeds every thread (each takes one job at a time, so a long text on
 * one thread never holds up short ones on the others); finished jobs go to the loop through an
 * inbox. Lock order: only `mu` is ever taken here (the inbox has its own, never nested). */
#include "tokpool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"

struct rt_tokpool {
  const k3_tok_t *tok;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rt_tokjob_t *head, *tail; /* queued jobs (linked through link.next) */
  bool stop;                /* under mu */
  size_t pending;           /* queued + running + not yet delivered: loop thread */
  int n_threads;
  pthread_t th[64];
  k3_inbox_t out;
  bool closing;             /* loop thread: answers go out as K3_ESHUTDOWN */
};

static void run_job(const k3_tok_t *tok, rt_tokjob_t *j) {
  uint64_t t0 = k3_now_ns();
  j->wait_ns = t0 - j->t_submit;
  if (j->kind == RT_TOK_TEXT) {
    j->rc = k3_tok_encode_max(tok, j->text, j->len, 0, j->max_ids, &j->ids, j->err, sizeof j->err);
  } else {
    j->chat.max_ids = j->max_ids;
    j->rc = k3_chat_render(tok, j->messages, &j->chat, &j->ids, j->err, sizeof j->err);
  }
  j->work_ns = k3_now_ns() - t0;
}

static void *pool_main(void *arg) {
  rt_tokpool_t *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    rt_tokjob_t *j = p->head;
    if (!j) {
      /* a deadline on every wait; close() also signals */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&p->cv, &p->mu, &ts);
      continue;
    }
    p->head = (rt_tokjob_t *)j->link.next;
    if (!p->head) p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    run_job(p->tok, j);
    k3_inbox_post(&p->out, &j->link);
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void deliver(rt_tokpool_t *p, rt_tokjob_t *j) {
  p->pending--;
  if (p->closing && j->rc == 0) {
    free(j->ids.ids);
    memset(&j->ids, 0, sizeof j->ids);
    j->rc = K3_ESHUTDOWN;
    snprintf(j->err, sizeof j->err, "router shutting down");
  }
  j->done(j);
}

static void on_out(k3_msg_t *m, void *ud) { deliver(ud, (rt_tokjob_t *)m); }

int rt_tokpool_init(uv_loop_t *loop, const k3_tok_t *tok, int threads, rt_tokpool_t **out) {
  if (!tok || threads < 1 || threads > 64) return K3_EINVAL;
  rt_tokpool_t *p = calloc(1, sizeof *p);
  if (!p) return K3_ENOMEM;
  p->tok = tok;
  /* jansson seeds its hash function on first use; do it here, not racily on a pool thread */
  json_object_seed(0);
  if (pthread_mutex_init(&p->mu, NULL)) {
    free(p);
    return K3_EINTERNAL;
  }
  pthread_cond_init(&p->cv, NULL);
  int rc = k3_inbox_init(loop, &p->out, on_out, p);
  if (rc) {
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return rc;
  }
  for (int i = 0; i < threads; i++) {
    if (pthread_create(&p->th[i], NULL, pool_main, p)) {
      K3_ERROR("tokenisation pool: cannot start thread %d of %d", i + 1, threads);
      rt_tokpool_close(p);
      return K3_EINTERNAL;
    }
    p->n_threads++;
  }
  *out = p;
  return 0;
}

void rt_tokpool_submit(rt_tokpool_t *p, rt_tokjob_t *j) {
  memset(&j->ids, 0, sizeof j->ids);
  j->rc = 0;
  j->err[0] = 0;
  j->link.next = NULL;
  j->t_submit = k3_now_ns();
  p->pending++;
  if (p->closing) {
    j->rc = K3_ESHUTDOWN;
    snprintf(j->err, sizeof j->err, "router shutting down");
    deliver(p, j);
    return;
  }
  pthread_mutex_lock(&p->mu);
  if (p->tail) p->tail->link.next = &j->link;
  else p->head = j;
  p->tail = j;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

size_t rt_tokpool_pending(const rt_tokpool_t *p) { return p ? p->pending : 0; }

static void on_closed(void *ud) {
  rt_tokpool_t *p = ud;
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void rt_tokpool_close(rt_tokpool_t *p) {
  if (!p) return;
  p->closing = true;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  rt_tokjob_t *left = p->head;
  p->head = p->tail = NULL;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->th[i], NULL);
  while (left) { /* never started */
    rt_tokjob_t *j = left;
    left = (rt_tokjob_t *)j->link.next;
    j->rc = K3_ESHUTDOWN;
    snprintf(j->err, sizeof j->err, "router shutting down");
    deliver(p, j);
  }
  k3_inbox_close(&p->out, on_closed); /* delivers what the threads finished, as K3_ESHUTDOWN */
}
