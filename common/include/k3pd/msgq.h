/* Message passing between a worker's engine thread and its libuv loop thread.
 *
 * k3_msgq_t: a mutex-protected FIFO of messages (intrusive: each message embeds a
 * k3_msg_t link, so pushing never allocates and never fails). Any thread may push; one consumer
 * takes everything at once (k3_msgq_take_all) — sends coalesce, so a consumer always drains
 * the whole queue. The engine side can block for work with a deadline (k3_msgq_wait).
 *
 * k3_inbox_t: a k3_msgq_t whose consumer is a libuv loop: k3_inbox_post() from any thread pushes
 * and uv_async_send()s; the loop's callback receives every queued message in FIFO order. This is
 * the only way engine threads touch loop-owned state (STYLE.md §Ownership and threads).
 *
 * Ownership: a message belongs to the queue from push until it is handed to the consumer; the
 * consumer then owns it (typically frees it). */
#ifndef K3PD_MSGQ_H
#define K3PD_MSGQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct k3_msg {
  struct k3_msg *next;
  int type; /* free for the user */
} k3_msg_t;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  k3_msg_t *head, *tail;
  size_t len;
  bool closed;
} k3_msgq_t;

int k3_msgq_init(k3_msgq_t *q);
/* The queue must be empty or its messages abandoned by the caller. */
void k3_msgq_destroy(k3_msgq_t *q);
/* Appends m and wakes one waiter. Never fails. */
void k3_msgq_push(k3_msgq_t *q, k3_msg_t *m);
/* Detaches and returns the whole list (FIFO order, linked through ->next), or NULL. */
k3_msg_t *k3_msgq_take_all(k3_msgq_t *q);
/* Blocks until the queue is non-empty, closed, or timeout_ms passed (< 0: no timeout — only
 * for threads that are always woken by close). Returns true when messages are queued. */
bool k3_msgq_wait(k3_msgq_t *q, int64_t timeout_ms);
/* Marks the queue closed and wakes every waiter (pushes still succeed). */
void k3_msgq_close(k3_msgq_t *q);
size_t k3_msgq_len(k3_msgq_t *q);

typedef void (*k3_inbox_fn)(k3_msg_t *m, void *ud);

typedef struct {
  uv_async_t async;
  k3_msgq_t q;
  k3_inbox_fn fn;
  void *ud;
  void (*closed_cb)(void *ud);
} k3_inbox_t;

/* Initialises the inbox on `loop` (call on the loop thread). fn runs on the loop thread once
 * per message, in order. */
int k3_inbox_init(uv_loop_t *loop, k3_inbox_t *in, k3_inbox_fn fn, void *ud);
/* Any thread. */
void k3_inbox_post(k3_inbox_t *in, k3_msg_t *m);
/* Loop thread: delivers messages still queued, then closes the async handle. Every thread that
 * posts must have stopped (joined) before this is called: uv_async_send on a closing handle is
 * undefined behaviour in libuv; closed_cb (may be
 * NULL) runs from the close callback, after which the inbox memory may be freed. */
void k3_inbox_close(k3_inbox_t *in, void (*closed_cb)(void *ud));

/* An engine thread fed by a k3_msgq_t (loop → engine direction). The engine's function takes
 * messages with k3_msgq_take_all(&e->q) and waits with k3_msgq_wait(&e->q, ms). */
typedef struct {
  pthread_t th;
  k3_msgq_t q;
  bool running;
} k3_engine_t;

/* Initialises the queue and starts fn(arg) on a new thread. Returns 0, K3_ENOMEM, K3_EINTERNAL. */
int k3_engine_start(k3_engine_t *e, void *(*fn)(void *), void *arg);
void k3_engine_post(k3_engine_t *e, k3_msg_t *m);
/* Posts `stop` (a message the engine recognises as "stop"; NULL closes the queue instead, for
 * out-of-memory paths), joins the thread, then hands every message posted after it to
 * free_msg and destroys the queue. No-op when not running. */
void k3_engine_stop(k3_engine_t *e, k3_msg_t *stop, void (*free_msg)(k3_msg_t *m));

#endif
