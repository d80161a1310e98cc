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
    if (ev.type == GRPC_OP_COMPLETE) {
      if (b->q_len == b->q_cap) {
        size_t cap = b->q_cap ? b->q_cap * 2 : 64;
        rpc_ev_t *nq = realloc(b->q, cap * sizeof *nq);
        /* Losing a completion would leak its owner forever; there is no way to recover. */
        K3_ASSERT(nq != NULL);
        b->q = nq;
        b->q_cap = cap;
      }
      b->q[b->q_len++] = (rpc_ev_t){ev.tag, ev.success};
    }
    pthread_mutex_unlock(&b->mu);
    uv_async_send(&b->async);
  }
}

static void async_closed(uv_handle_t *h) {
  rpc_bridge_t *b = h->data;
  pthread_mutex_destroy(&b->mu);
  free(b->q);
  b->q = NULL;
  if (b->on_closed) b->on_closed(b);
}

static void async_cb(uv_async_t *h) {
  rpc_bridge_t *b = h->data;
  if (b->finished) return;
  /* Swap the queue out under the lock, dispatch outside it. */
  rpc_ev_t local[128];
  for (;;) {
    pthread_mutex_lock(&b->mu);
    size_t n = b->q_len < 128 ? b->q_len : 128;
    memcpy(local, b->q, n * sizeof *local);
    memmove(b->q, b->q + n, (b->q_len - n) * sizeof *local);
    b->q_len -= n;
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
  if (budget == 0) {
    uv_async_send(&b->async); /* more may be ready: come back after other handles ran */
    return;
  }
  pthread_mutex_lock(&b->mu);
  int drained = b->cq_drained && b->q_len == 0;
  pthread_mutex_unlock(&b->mu);
  if (drained) {
    pthread_join(b->thread, NULL);
    b->finished = 1;
    if (b->on_drained) b->on_drained(b);
    grpc_completion_queue_destroy(b->cq);
    b->cq = NULL;
    uv_close((uv_handle_t *)&b->async, async_closed);
  }
}

int rpc_bridge_init(rpc_bridge_t *b, uv_loop_t *loop, void *owner,
                    void (*on_drained)(rpc_bridge_t *), void (*on_closed)(rpc_bridge_t *)) {
  memset(b, 0, sizeof *b);
  b->loop = loop;
  b->owner = owner;
  b->on_drained = on_drained;
  b->on_closed = on_closed;
  if (pthread_mutex_init(&b->mu, NULL) != 0) return K3_ENOMEM;
  b->cq = grpc_completion_queue_create_for_next(NULL);
  if (!b->cq) goto err_mu;
  /* The thread starts before the async handle exists: nothing can complete on the fresh CQ
   * until the owner starts batches, and async_ok (under mu) gates its uv_async_send so a
   * failed uv_async_init can still be unwound without a libuv close round-trip. */
  if (pthread_create(&b->thread, NULL, drain_main, b) != 0) goto err_cq;
  if (uv_async_init(loop, &b->async, async_cb) != 0) goto err_thread;
  b->async.data = b;
  pthread_mutex_lock(&b->mu);
  b->async_ok = 1;
  pthread_mutex_unlock(&b->mu);
  return 0;
err_thread:
  grpc_completion_queue_shutdown(b->cq);
  pthread_join(b->thread, NULL);
err_cq:
  if (!b->cq_drained) grpc_completion_queue_shutdown(b->cq);
  while (grpc_completion_queue_next(b->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(b->cq);
  b->cq = NULL;
err_mu:
  pthread_mutex_destroy(&b->mu);
  return K3_ENOMEM;
}

void rpc_bridge_shutdown(rpc_bridge_t *b) {
  if (b->cq_shutdown) return;
  b->cq_shutdown = 1;
  grpc_completion_queue_shutdown(b->cq);
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
