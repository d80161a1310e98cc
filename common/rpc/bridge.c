/* The completion-queue -> libuv bridge (see rpc_internal.h for the design), protobuf packing
 * helpers and the status-code tables. Not here: any call logic (server.c, client.c).
 * Invariant: the only state shared between the drain thread and the loop is behind b->mu;
 * tag callbacks always run on the loop thread, never under the lock. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc.h"
#include "rpc_internal.h"

/* Completions the loop thread polls itself per wakeup before yielding to other handles. */
#define HYBRID_BUDGET 512

/* The per-loop registry: bridges that still accept owners (one per loop). Owners are created
 * on their loop's thread, but several loops may live in one process (tools, tests). */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static rpc_bridge_t *reg_head; /* guarded by reg_mu */

static void *drain_main(void *p) {
  rpc_bridge_t *b = p;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(b->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    pthread_mutex_lock(&b->mu);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) {
      b->cq_drained = 1;
      int ok = b->async_ok;
      pthread_mutex_unlock(&b->mu);
      if (ok) uv_async_send(&b->async);
      return NULL;
    }
    int wake = 0;
    if (ev.type == GRPC_OP_COMPLETE) {
      if (b->q_len == b->q_cap) {
        size_t cap = b->q_cap ? b->q_cap * 2 : 64;
        rpc_ev_t *nq = realloc(b->q, cap * sizeof *nq);
        /* Losing a completion would leak its owner forever; there is no way to recover. */
        K3_ASSERT(nq != NULL);
        b->q = nq;
        b->q_cap = cap;
      }
      /* Only the first completion of a batch wakes the loop, and none while the loop is in
       * async_cb: it checks the vector once more (under this lock) before it returns. A
       * non-empty vector outside async_cb means a wakeup is already on its way. */
      wake = b->q_len == 0 && !b->in_cb;
      b->q[b->q_len++] = (rpc_ev_t){ev.tag, ev.success};
    }
    pthread_mutex_unlock(&b->mu);
    if (wake) uv_async_send(&b->async);
  }
}

/* Tells the detached owners; stops when the bridge starts shutting down (a callback may detach
 * the last owner): the rest are told once the bridge is closed. */
static void tell_gone(rpc_bridge_t *b) {
  while (b->gone && !b->cq_shutdown) {
    rpc_owner_t *o = b->gone;
    b->gone = o->next;
    if (!b->gone) b->gone_tail = &b->gone;
    o->next = NULL;
    o->on_detached(o);
  }
}

static void async_closed(uv_handle_t *h) {
  rpc_bridge_t *b = h->data;
  rpc_owner_t *gone = b->gone;
  pthread_mutex_destroy(&b->mu);
  free(b->q);
  free(b);
  grpc_shutdown(); /* the bridge's own reference, taken in bridge_create */
  while (gone) {
    rpc_owner_t *o = gone;
    gone = o->next;
    o->next = NULL;
    o->on_detached(o);
  }
}

static void async_cb(uv_async_t *h) {
  rpc_bridge_t *b = h->data;
  if (b->finished) return;
  /* Take the queue under the lock, dispatch outside it. A callback may detach owners or attach
   * new ones; the bridge itself stays valid until async_closed. */
  rpc_ev_t local[128];
  pthread_mutex_lock(&b->mu);
  b->in_cb = 1;
  pthread_mutex_unlock(&b->mu);
  for (;;) {
    pthread_mutex_lock(&b->mu);
    size_t n = b->q_len < 128 ? b->q_len : 128;
    if (n > 0) { /* (q is NULL until the first completion: a detach wakes the loop too) */
      memcpy(local, b->q, n * sizeof *local);
      memmove(b->q, b->q + n, (b->q_len - n) * sizeof *local);
      b->q_len -= n;
    }
    pthread_mutex_unlock(&b->mu);
    if (n == 0) break;
    for (size_t i = 0; i < n; i++) local[i].tag->cb(local[i].tag, local[i].ok);
  }
  /* Hybrid: poll the CQ on this thread without blocking (P7). A CQ that is shut down and
   * empty answers GRPC_QUEUE_SHUTDOWN, which ends the poll like a timeout does. */
  int budget = HYBRID_BUDGET;
  while (budget > 0) {
    grpc_event ev = grpc_completion_queue_next(b->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE) break;
    ((rpc_tag_t *)ev.tag)->cb(ev.tag, ev.success);
    budget--;
  }
  /* What the drain thread queued meanwhile did not wake the loop (in_cb): come back for it
   * after the other handles ran, as when the budget is used up (more may be ready). */
  pthread_mutex_lock(&b->mu);
  int again = budget == 0 || b->q_len > 0;
  b->in_cb = 0;
  pthread_mutex_unlock(&b->mu);
  if (again) {
    uv_async_send(&b->async);
    return;
  }
  tell_gone(b);
  if (!b->cq_shutdown) return;
  pthread_mutex_lock(&b->mu);
  int drained = b->cq_drained && b->q_len == 0;
  pthread_mutex_unlock(&b->mu);
  if (drained) {
    /* Every owner detached with nothing outstanding, so the drain found no completion. */
    pthread_join(b->thread, NULL);
    b->finished = 1;
    grpc_completion_queue_destroy(b->cq);
    b->cq = NULL;
    uv_close((uv_handle_t *)&b->async, async_closed);
  }
}

/* A new bridge on loop: the CQ, the async handle and the drain thread. NULL on error, with
 * nothing left behind. */
static rpc_bridge_t *bridge_create(uv_loop_t *loop) {
  rpc_bridge_t *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->loop = loop;
  b->gone_tail = &b->gone;
  if (pthread_mutex_init(&b->mu, NULL) != 0) goto err_free;
  grpc_init(); /* the CQ outlives the owners' references: it is destroyed after they left */
  b->cq = grpc_completion_queue_create_for_next(NULL);
  if (!b->cq) goto err_mu;
  /* The thread starts before the async handle exists: nothing can complete on the fresh CQ
   * until an owner starts batches, and async_ok (under mu) gates its uv_async_send so a
   * failed uv_async_init can still be unwound without a libuv close round-trip. */
  if (pthread_create(&b->thread, NULL, drain_main, b) != 0) goto err_cq;
  if (uv_async_init(loop, &b->async, async_cb) != 0) goto err_thread;
  b->async.data = b;
  pthread_mutex_lock(&b->mu);
  b->async_ok = 1;
  pthread_mutex_unlock(&b->mu);
  return b;
err_thread:
  grpc_completion_queue_shutdown(b->cq);
  pthread_join(b->thread, NULL);
err_cq:
  if (!b->cq_drained) grpc_completion_queue_shutdown(b->cq);
  while (grpc_completion_queue_next(b->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(b->cq);
err_mu:
  grpc_shutdown();
  pthread_mutex_destroy(&b->mu);
err_free:
  free(b);
  return NULL;
}

int rpc_bridge_attach(uv_loop_t *loop, rpc_owner_t *o, void (*on_detached)(rpc_owner_t *)) {
  memset(o, 0, sizeof *o);
  o->on_detached = on_detached;
  pthread_mutex_lock(&reg_mu);
  rpc_bridge_t *b = reg_head;
  while (b && b->loop != loop) b = b->next;
  if (!b) {
    b = bridge_create(loop);
    if (!b) {
      pthread_mutex_unlock(&reg_mu);
      return K3_ENOMEM;
    }
    b->next = reg_head;
    reg_head = b;
  }
  b->owners++;
  pthread_mutex_unlock(&reg_mu);
  o->br = b;
  return 0;
}

void rpc_bridge_detach(rpc_owner_t *o) {
  K3_ASSERT(!o->detached);
  o->detached = 1;
  rpc_bridge_t *b = o->br;
  *b->gone_tail = o;
  b->gone_tail = &o->next;
  pthread_mutex_lock(&reg_mu);
  int last = --b->owners == 0;
  if (last) {
    /* Out of the registry now: an owner created from here on starts a fresh bridge. */
    for (rpc_bridge_t **pp = &reg_head; *pp; pp = &(*pp)->next) {
      if (*pp == b) {
        *pp = b->next;
        break;
      }
    }
  }
  pthread_mutex_unlock(&reg_mu);
  if (last) {
    /* The drain thread sees GRPC_QUEUE_SHUTDOWN and wakes the loop to finish (async_cb). */
    b->cq_shutdown = 1;
    grpc_completion_queue_shutdown(b->cq);
  } else {
    uv_async_send(&b->async); /* on_detached runs on the loop's next turn */
  }
}

grpc_byte_buffer *rpc_pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1); /* takes its own ref */
  grpc_slice_unref(s);
  return bb;
}

ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb) {
  if (!bb) return NULL;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  grpc_slice_unref(s);
  return m;
}

ProtobufCMessage *rpc_unpack_strict(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb, char *nul_path,
                                    size_t pathlen) {
  if (pathlen) nul_path[0] = '\0';
  if (!bb) return NULL;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m = NULL;
  if (!rpc_wire_find_nul(d, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), nul_path, pathlen)) {
    if (pathlen) nul_path[0] = '\0';
    m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  }
  grpc_slice_unref(s);
  return m;
}

void rpc_size_args(grpc_arg *a, grpc_channel_args *args, int max_bytes) {
  a[0] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = max_bytes};
  a[1] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = max_bytes};
  args->num_args = 2;
  args->args = a;
}

static const char *const code_names[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"};

const char *k3_rpc_code_name(int code) {
  if (code < 0 || code > 16) return "UNKNOWN_CODE";
  return code_names[code];
}

k3_rpc_code_t k3_rpc_code_from_err(int err) {
  switch (err) {
    case 0: return K3_RPC_OK;
    case K3_EINVAL: case K3_ERANGE: case K3_EUTF8: return K3_RPC_INVALID_ARGUMENT;
    case K3_ENOENT: return K3_RPC_NOT_FOUND;
    case K3_EEXIST: return K3_RPC_ALREADY_EXISTS;
    case K3_ECAPACITY: case K3_ENOMEM: return K3_RPC_RESOURCE_EXHAUSTED;
    case K3_ECANCELED: return K3_RPC_CANCELLED;
    case K3_ETIMEDOUT: return K3_RPC_DEADLINE_EXCEEDED;
    case K3_ENOTSUP: return K3_RPC_UNIMPLEMENTED;
    case K3_EUNAVAIL: case K3_ESHUTDOWN: case K3_ETRANSPORT: return K3_RPC_UNAVAILABLE;
    case K3_ESTALE: case K3_EFINGERPRINT: return K3_RPC_FAILED_PRECONDITION;
    case K3_EDIGEST: return K3_RPC_DATA_LOSS;
    default: return K3_RPC_INTERNAL;
  }
}

int k3_rpc_err_from_code(int code) {
  switch (code) {
    case K3_RPC_OK: return 0;
    case K3_RPC_CANCELLED: return K3_ECANCELED;
    case K3_RPC_INVALID_ARGUMENT: case K3_RPC_OUT_OF_RANGE: return K3_EINVAL;
    case K3_RPC_DEADLINE_EXCEEDED: return K3_ETIMEDOUT;
    case K3_RPC_NOT_FOUND: return K3_ENOENT;
    case K3_RPC_ALREADY_EXISTS: return K3_EEXIST;
    case K3_RPC_RESOURCE_EXHAUSTED: return K3_ECAPACITY;
    case K3_RPC_FAILED_PRECONDITION: case K3_RPC_ABORTED: return K3_ESTALE;
    case K3_RPC_UNIMPLEMENTED: return K3_ENOTSUP;
    case K3_RPC_UNAVAILABLE: return K3_EUNAVAIL;
    case K3_RPC_DATA_LOSS: return K3_EDIGEST;
    default: return K3_EINTERNAL;
  }
}
