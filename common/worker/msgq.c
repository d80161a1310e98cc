/* Thread-safe FIFO and libuv inbox; see k3pd/msgq.h. */
#include "k3pd/msgq.h"

#include <errno.h>
#include <time.h>

#include "k3pd/err.h"

int k3_msgq_init(k3_msgq_t *q) {
  q->head = q->tail = NULL;
  q->len = 0;
  q->closed = false;
  if (pthread_mutex_init(&q->mu, NULL)) return K3_ENOMEM;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&q->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc) {
    pthread_mutex_destroy(&q->mu);
    return K3_ENOMEM;
  }
  return 0;
}

void k3_msgq_destroy(k3_msgq_t *q) {
  pthread_cond_destroy(&q->cv);
  pthread_mutex_destroy(&q->mu);
}

void k3_msgq_push(k3_msgq_t *q, k3_msg_t *m) {
  m->next = NULL;
  pthread_mutex_lock(&q->mu);
  if (q->tail)
    q->tail->next = m;
  else
    q->head = m;
  q->tail = m;
  q->len++;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

k3_msg_t *k3_msgq_take_all(k3_msgq_t *q) {
  pthread_mutex_lock(&q->mu);
  k3_msg_t *h = q->head;
  q->head = q->tail = NULL;
  q->len = 0;
  pthread_mutex_unlock(&q->mu);
  return h;
}

bool k3_msgq_wait(k3_msgq_t *q, int64_t timeout_ms) {
  struct timespec dl;
  if (timeout_ms >= 0) {
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&q->mu);
  while (!q->head && !q->closed) {
    int rc = timeout_ms >= 0 ? pthread_cond_timedwait(&q->cv, &q->mu, &dl) : pthread_cond_wait(&q->cv, &q->mu);
    if (rc == ETIMEDOUT) break;
  }
  bool have = q->head != NULL;
  pthread_mutex_unlock(&q->mu);
  return have;
}

void k3_msgq_close(k3_msgq_t *q) {
  pthread_mutex_lock(&q->mu);
  q->closed = true;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

size_t k3_msgq_len(k3_msgq_t *q) {
  pthread_mutex_lock(&q->mu);
  size_t n = q->len;
  pthread_mutex_unlock(&q->mu);
  return n;
}

static void inbox_drain(k3_inbox_t *in) {
  k3_msg_t *m = k3_msgq_take_all(&in->q);
  while (m) {
    k3_msg_t *next = m->next;
    in->fn(m, in->ud);
    m = next;
  }
}

static void inbox_async_cb(uv_async_t *a) { inbox_drain((k3_inbox_t *)a->data); }

int k3_inbox_init(uv_loop_t *loop, k3_inbox_t *in, k3_inbox_fn fn, void *ud) {
  int rc = k3_msgq_init(&in->q);
  if (rc) return rc;
  in->fn = fn;
  in->ud = ud;
  in->closed_cb = NULL;
  if (uv_async_init(loop, &in->async, inbox_async_cb)) {
    k3_msgq_destroy(&in->q);
    return K3_EINTERNAL;
  }
  in->async.data = in;
  return 0;
}

void k3_inbox_post(k3_inbox_t *in, k3_msg_t *m) {
  k3_msgq_push(&in->q, m);
  uv_async_send(&in->async);
}

static void inbox_closed(uv_handle_t *h) {
  k3_inbox_t *in = h->data;
  inbox_drain(in); /* posts that raced with close */
  k3_msgq_destroy(&in->q);
  if (in->closed_cb) in->closed_cb(in->ud);
}

void k3_inbox_close(k3_inbox_t *in, void (*closed_cb)(void *ud)) {
  inbox_drain(in);
  in->closed_cb = closed_cb;
  uv_close((uv_handle_t *)&in->async, inbox_closed);
}

int k3_engine_start(k3_engine_t *e, void *(*fn)(void *), void *arg) {
  int rc = k3_msgq_init(&e->q);
  if (rc) return rc;
  if (pthread_create(&e->th, NULL, fn, arg)) {
    k3_msgq_destroy(&e->q);
    return K3_EINTERNAL;
  }
  e->running = true;
  return 0;
}

void k3_engine_post(k3_engine_t *e, k3_msg_t *m) { k3_msgq_push(&e->q, m); }

void k3_engine_stop(k3_engine_t *e, k3_msg_t *stop, void (*free_msg)(k3_msg_t *m)) {
  if (!e->running) return;
  if (stop)
    k3_msgq_push(&e->q, stop);
  else
    k3_msgq_close(&e->q);
  pthread_join(e->th, NULL);
  e->running = false;
  /* anything posted after the stop message was never looked at */
  k3_msg_t *rest = k3_msgq_take_all(&e->q);
  while (rest) {
    k3_msg_t *next = rest->next;
    free_msg(rest);
    rest = next;
  }
  k3_msgq_destroy(&e->q);
}
