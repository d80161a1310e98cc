/* k3_rpc server: registered methods, unary and server-streaming calls, cancellation
 * detection, graceful shutdown (API and contracts in k3pd/rpc.h). Not here: the health
 * service (health.c), ports, TLS and the peer rule (peer.c), and the CQ bridge (bridge.c).
 *
 * Per-call reference counting (all on the loop thread):
 *   +1 handler   from dispatch until reply/finish
 *   +1 close     the RECV_CLOSE_ON_SERVER batch, started at dispatch, completes when the call
 *                ends (cancelled=1 on cancel/deadline/peer loss): the cancellation signal (P6)
 *   +1 send      the single outstanding send batch (message, or message+status, or status)
 * The call is destroyed when the count reaches 0; grpc_call_unref happens only then.
 * Before dispatch, a call context belongs to its armed grpc_server_request_registered_call. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "rpc_server_internal.h"

static void call_pump(k3_rpc_call_t *c);
static int arm_request(k3_rpc_server_t *srv, rpc_method_t *m);
static int arm_unregistered(k3_rpc_server_t *srv);
static void maybe_finish_shutdown(k3_rpc_server_t *srv);

/* ---- call lifetime ---- */

static void call_destroy(k3_rpc_call_t *c) {
  k3_rpc_server_t *srv = c->srv;
  if (c->call) grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md);
  if (c->unregistered) grpc_call_details_destroy(&c->details_in);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->req) protobuf_c_message_free_unpacked(c->req, NULL);
  for (size_t i = 0; i < c->q_len; i++) grpc_byte_buffer_destroy(c->q[c->q_head + i]);
  free(c->q);
  if (c->inflight_bb) grpc_byte_buffer_destroy(c->inflight_bb);
  if (c->has_details) grpc_slice_unref(c->details);
  if (c->out_md_n) {
    grpc_slice_unref(c->out_md[0].key);
    grpc_slice_unref(c->out_md[0].value);
  }
  for (size_t i = 0; i < c->md_copies_n; i++) free(c->md_copies[i]);
  free(c->md_copies);
  for (size_t i = 0; i < c->n_peer; i++) free(c->peer[i]);
  free(c->peer);
  if (c->dispatched) {
    /* unlink from the live list */
    if (c->prev) c->prev->next = c->next; else srv->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    srv->live_calls--;
  }
  free(c);
  if (srv->shutting_down) maybe_finish_shutdown(srv);
}

static void call_unref(k3_rpc_call_t *c) {
  K3_ASSERT(c->refs > 0);
  if (--c->refs == 0) call_destroy(c);
}

static void drop_queue(k3_rpc_call_t *c) {
  for (size_t i = 0; i < c->q_len; i++) grpc_byte_buffer_destroy(c->q[c->q_head + i]);
  c->q_head = c->q_len = 0;
}

static void on_close(rpc_tag_t *t, int ok) {
  k3_rpc_call_t *c = (k3_rpc_call_t *)((char *)t - offsetof(k3_rpc_call_t, t_close));
  c->closed = 1;
  if (c->close_cancelled || !ok) {
    c->cancelled = 1;
    drop_queue(c);
    if (!c->finished && c->cancel_fn) {
      k3_rpc_cancel_fn fn = c->cancel_fn;
      c->cancel_fn = NULL;
      fn(c, c->cancel_arg);
    }
  }
  call_unref(c);
}

static void on_send(rpc_tag_t *t, int ok) {
  k3_rpc_call_t *c = (k3_rpc_call_t *)((char *)t - offsetof(k3_rpc_call_t, t_send));
  c->send_in_flight = 0;
  if (c->inflight_bb) {
    grpc_byte_buffer_destroy(c->inflight_bb);
    c->inflight_bb = NULL;
  }
  if (!ok) {
    /* The peer is gone (or the call was cancelled): stop writing. The close batch will
     * report the cancellation. */
    c->send_failed = 1;
    drop_queue(c);
  } else {
    call_pump(c);
  }
  call_unref(c);
}

/* Starts the next send batch if none is outstanding. Combines the last queued message with a
 * pending status so a unary reply is one batch. */
static void call_pump(k3_rpc_call_t *c) {
  if (c->send_in_flight || c->cancelled || c->send_failed || c->status_sent) return;
  if (c->q_len == 0 && !c->status_queued) return;
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->initial_md_sent) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = c->out_md_n;
    ops[n].data.send_initial_metadata.metadata = c->out_md_n ? c->out_md : NULL;
    n++;
    c->initial_md_sent = 1;
  }
  if (c->q_len > 0) {
    c->inflight_bb = c->q[c->q_head];
    c->q_head++;
    c->q_len--;
    if (c->q_len == 0) c->q_head = 0;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->inflight_bb;
    n++;
  }
  if (c->status_queued && c->q_len == 0) {
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->status_code;
    ops[n].data.send_status_from_server.status_details = c->has_details ? &c->details : NULL;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    n++;
    c->status_sent = 1;
  }
  c->refs++;
  c->send_in_flight = 1;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
  if (e != GRPC_CALL_OK) {
    /* Only programmer errors produce this (two sends at once, bad op order). */
    K3_ERROR("rpc: start_batch(send) on %s failed: %d", c->method->path, (int)e);
    c->send_in_flight = 0;
    c->send_failed = 1;
    c->refs--;
    drop_queue(c);
  }
}

/* ---- public per-call API ---- */

int k3_rpc_call_write(k3_rpc_call_t *c, const ProtobufCMessage *msg) {
  if (c->finished || c->method->kind != K3_RPC_SERVER_STREAM) return K3_EINVAL;
  if (c->cancelled || c->send_failed) return K3_ECANCELED;
  grpc_byte_buffer *bb = rpc_pack(msg);
  if (!bb) return K3_ENOMEM;
  if (c->q_head + c->q_len == c->q_cap) {
    if (c->q_head > 0) {
      memmove(c->q, c->q + c->q_head, c->q_len * sizeof *c->q);
      c->q_head = 0;
    } else {
      size_t cap = c->q_cap ? c->q_cap * 2 : 8;
      grpc_byte_buffer **nq = realloc(c->q, cap * sizeof *nq);
      if (!nq) {
        grpc_byte_buffer_destroy(bb);
        return K3_ENOMEM;
      }
      c->q = nq;
      c->q_cap = cap;
    }
  }
  c->q[c->q_head + c->q_len++] = bb;
  call_pump(c);
  return 0;
}

static void set_status(k3_rpc_call_t *c, k3_rpc_code_t code, const char *details) {
  c->status_code = code;
  if (details && *details) {
    c->details = grpc_slice_from_copied_string(details);
    c->has_details = 1;
  }
  c->status_queued = 1;
}

int k3_rpc_call_reply(k3_rpc_call_t *c, const ProtobufCMessage *resp) {
  K3_ASSERT(!c->finished);
  int rc = 0;
  c->finished = 1;
  if (c->cancelled || c->send_failed) {
    rc = K3_ECANCELED;
  } else {
    grpc_byte_buffer *bb = rpc_pack(resp);
    if (!bb) {
      set_status(c, K3_RPC_INTERNAL, "server: out of memory packing the reply");
      rc = K3_ENOMEM;
    } else {
      /* Unary calls never queued anything, so the array of one is enough. */
      grpc_byte_buffer **nq = realloc(c->q, sizeof *nq);
      if (!nq) {
        grpc_byte_buffer_destroy(bb);
        set_status(c, K3_RPC_INTERNAL, "server: out of memory queueing the reply");
        rc = K3_ENOMEM;
      } else {
        c->q = nq;
        c->q_cap = 1;
        c->q_head = 0;
        c->q[0] = bb;
        c->q_len = 1;
        set_status(c, K3_RPC_OK, NULL);
      }
    }
    call_pump(c);
  }
  call_unref(c);
  return rc;
}

void k3_rpc_call_finish(k3_rpc_call_t *c, k3_rpc_code_t code, const char *details) {
  K3_ASSERT(!c->finished);
  c->finished = 1;
  if (!c->cancelled && !c->send_failed) {
    set_status(c, code, details);
    call_pump(c);
  }
  call_unref(c);
}

void k3_rpc_call_finishf(k3_rpc_call_t *c, k3_rpc_code_t code, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  k3_rpc_call_finish(c, code, buf);
}

void k3_rpc_call_set_cancel_cb(k3_rpc_call_t *c, k3_rpc_cancel_fn fn, void *arg) {
  c->cancel_fn = fn;
  c->cancel_arg = arg;
}

int k3_rpc_call_is_cancelled(const k3_rpc_call_t *c) { return c->cancelled || c->send_failed; }

int64_t k3_rpc_call_deadline_left_ms(const k3_rpc_call_t *c) {
  if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0) return INT64_MAX;
  gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
  return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}

const char *k3_rpc_call_metadata(const k3_rpc_call_t *cc, const char *key) {
  k3_rpc_call_t *c = (k3_rpc_call_t *)cc; /* caches copies; logically const */
  size_t klen = strlen(key);
  for (size_t i = 0; i < c->md.count; i++) {
    grpc_slice k = c->md.metadata[i].key;
    if (GRPC_SLICE_LENGTH(k) != klen || memcmp(GRPC_SLICE_START_PTR(k), key, klen) != 0) continue;
    char *v = grpc_slice_to_c_string(c->md.metadata[i].value);
    if (!v) return NULL;
    char *copy = strdup(v);
    gpr_free(v);
    if (!copy) return NULL;
    char **nc = realloc(c->md_copies, (c->md_copies_n + 1) * sizeof *nc);
    if (!nc) {
      free(copy);
      return NULL;
    }
    c->md_copies = nc;
    c->md_copies[c->md_copies_n++] = copy;
    return copy;
  }
  return NULL;
}

const char *k3_rpc_call_method(const k3_rpc_call_t *c) { return c->method->path; }
size_t k3_rpc_call_queued(const k3_rpc_call_t *c) { return c->q_len; }
void k3_rpc_call_set_user(k3_rpc_call_t *c, void *p) { c->user = p; }
void *k3_rpc_call_get_user(const k3_rpc_call_t *c) { return c->user; }

/* ---- arrival and dispatch ---- */

static void on_request(rpc_tag_t *t, int ok) {
  k3_rpc_call_t *c = (k3_rpc_call_t *)((char *)t - offsetof(k3_rpc_call_t, t_request));
  k3_rpc_server_t *srv = c->srv;
  rpc_method_t *m = c->method;
  srv->armed--;
  if (!ok) {
    /* Server shutting down: the armed request is returned unused. */
    call_destroy(c);
    return;
  }
  if (!srv->shutting_down) {
    if (c->unregistered) arm_unregistered(srv);
    else arm_request(srv, m);
  }
  c->dispatched = 1;
  c->next = srv->calls;
  if (srv->calls) srv->calls->prev = c;
  srv->calls = c;
  srv->live_calls++;
  c->refs = 2; /* handler + close */

  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
    K3_ERROR("rpc: start_batch(recv_close) on %s failed", m->path);
    c->refs--;
    c->cancelled = 1;
  }
  /* Echo x-request-id so clients can correlate logs. */
  const char *rid = k3_rpc_call_metadata(c, "x-request-id");
  if (rid) {
    c->out_md[0].key = grpc_slice_from_static_string("x-request-id");
    c->out_md[0].value = grpc_slice_from_copied_string(rid);
    c->out_md_n = 1;
  }
  if (c->unregistered) {
    /* gRPC core holds calls to unknown paths until someone requests them; answer at once. */
    char *path = grpc_slice_to_c_string(c->details_in.method);
    k3_rpc_call_finishf(c, K3_RPC_UNIMPLEMENTED, "method %.200s is not served here", path ? path : "?");
    gpr_free(path);
    return;
  }
  if (rpc_check_peer(c)) return;
  char nul_path[256];
  c->req = rpc_unpack_strict(m->desc, c->payload, nul_path, sizeof nul_path);
  if (!c->req) {
    if (nul_path[0])
      k3_rpc_call_finishf(c, K3_RPC_INVALID_ARGUMENT, "%s: contains U+0000 (NUL), which is not accepted in strings",
                          nul_path);
    else
      k3_rpc_call_finishf(c, K3_RPC_INVALID_ARGUMENT, "request: not a valid %s message", m->desc->name);
    return;
  }
  m->fn(c, c->req, m->user);
}

static int arm_request(k3_rpc_server_t *srv, rpc_method_t *m) {
  k3_rpc_call_t *c = calloc(1, sizeof *c);
  if (!c) return K3_ENOMEM;
  c->srv = srv;
  c->method = m;
  c->t_request.cb = on_request;
  c->t_close.cb = on_close;
  c->t_send.cb = on_send;
  grpc_metadata_array_init(&c->md);
  grpc_call_error e = grpc_server_request_registered_call(
      srv->server, m->handle, &c->call, &c->deadline, &c->md, &c->payload, rpc_owner_cq(&srv->own),
      rpc_owner_cq(&srv->own), &c->t_request);
  if (e != GRPC_CALL_OK) {
    grpc_metadata_array_destroy(&c->md);
    free(c);
    K3_ERROR("rpc: request_registered_call(%s) failed: %d", m->path, (int)e);
    return K3_EINTERNAL;
  }
  srv->armed++;
  return 0;
}

/* One generic request outstanding catches every call to a path nobody registered. */
static int arm_unregistered(k3_rpc_server_t *srv) {
  k3_rpc_call_t *c = calloc(1, sizeof *c);
  if (!c) return K3_ENOMEM;
  c->srv = srv;
  c->method = &srv->unknown;
  c->unregistered = 1;
  c->t_request.cb = on_request;
  c->t_close.cb = on_close;
  c->t_send.cb = on_send;
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details_in);
  grpc_call_error e = grpc_server_request_call(srv->server, &c->call, &c->details_in, &c->md,
                                               rpc_owner_cq(&srv->own), rpc_owner_cq(&srv->own), &c->t_request);
  if (e != GRPC_CALL_OK) {
    grpc_metadata_array_destroy(&c->md);
    grpc_call_details_destroy(&c->details_in);
    free(c);
    K3_ERROR("rpc: request_call(unregistered) failed: %d", (int)e);
    return K3_EINTERNAL;
  }
  c->deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
  srv->armed++;
  return 0;
}

/* ---- server lifecycle ---- */

static void timer_closed(uv_handle_t *h) {
  k3_rpc_server_t *srv = h->data;
  if (--srv->handles_open == 0) srv_free(srv);
}

static void on_detached(rpc_owner_t *o) {
  k3_rpc_server_t *srv = (k3_rpc_server_t *)o;
  uv_close((uv_handle_t *)&srv->grace_timer, timer_closed);
}

void srv_free(k3_rpc_server_t *srv) {
  k3_rpc_server_done_fn done = srv->done;
  void *arg = srv->done_arg;
  for (size_t i = 0; i < srv->n_methods; i++) free(srv->methods[i].path);
  free(srv->methods);
  for (size_t i = 0; i < srv->n_peer_allowed; i++) free(srv->peer_allowed[i]);
  free(srv->peer_allowed);
  rpc_health_free(srv);
  free(srv);
  grpc_shutdown();
  if (done) done(arg);
}

int k3_rpc_server_init(uv_loop_t *loop, const k3_rpc_server_opts_t *opts, k3_rpc_server_t **out) {
  k3_rpc_server_t *srv = calloc(1, sizeof *srv);
  if (!srv) return K3_ENOMEM;
  if (opts) srv->opts = *opts;
  if (!srv->opts.max_msg_bytes) srv->opts.max_msg_bytes = K3_RPC_DEFAULT_MAX_MSG_BYTES;
  if (!srv->opts.grace_ms) srv->opts.grace_ms = 5000;
  if (!srv->opts.calls_per_method) srv->opts.calls_per_method = 8;
  srv->loop = loop;
  srv->unknown = (rpc_method_t){.path = "(unregistered)", .kind = K3_RPC_UNARY};
  grpc_init();
  grpc_arg a[2];
  grpc_channel_args args;
  rpc_size_args(a, &args, (int)srv->opts.max_msg_bytes);
  srv->server = grpc_server_create(&args, NULL);
  if (!srv->server) goto err;
  int rc = rpc_bridge_attach(loop, &srv->own, on_detached);
  if (rc) goto err_server;
  grpc_server_register_completion_queue(srv->server, rpc_owner_cq(&srv->own), NULL);
  uv_timer_init(loop, &srv->grace_timer);
  srv->grace_timer.data = srv;
  srv->handles_open = 1;
  rc = rpc_health_register(srv);
  if (rc) {
    /* Unwind through the normal shutdown path; the caller sees the error and must not use
     * srv. (Only OOM gets here.) */
    k3_rpc_server_shutdown(srv, NULL, NULL);
    return rc;
  }
  *out = srv;
  return 0;
err_server:
  grpc_server_destroy(srv->server);
err:
  free(srv);
  grpc_shutdown();
  return K3_ENOMEM;
}

int k3_rpc_server_add_method(k3_rpc_server_t *srv, const char *path, k3_rpc_kind_t kind,
                             const ProtobufCMessageDescriptor *req_desc, k3_rpc_handler_fn fn,
                             void *user) {
  if (srv->started || srv->shutting_down || !path || path[0] != '/' || !req_desc || !fn ||
      (kind != K3_RPC_UNARY && kind != K3_RPC_SERVER_STREAM))
    return K3_EINVAL;
  for (size_t i = 0; i < srv->n_methods; i++)
    if (strcmp(srv->methods[i].path, path) == 0) return K3_EEXIST;
  if (srv->n_methods == K3_RPC_MAX_METHODS) return K3_ECAPACITY;
  if (!srv->methods) {
    /* Fixed array: method pointers are held by call contexts, so it never moves. */
    srv->methods = calloc(K3_RPC_MAX_METHODS, sizeof *srv->methods);
    if (!srv->methods) return K3_ENOMEM;
  }
  char *p = strdup(path);
  if (!p) return K3_ENOMEM;
  /* Registration with gRPC core happens here (before start, as it requires). The payload
   * is read with the call so the handler gets the request at once. */
  void *h = grpc_server_register_method(srv->server, p, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  if (!h) {
    free(p);
    return K3_EEXIST;
  }
  rpc_method_t *m = &srv->methods[srv->n_methods++];
  *m = (rpc_method_t){.path = p, .kind = kind, .desc = req_desc, .fn = fn, .user = user, .handle = h,
                      .open = strncmp(path, "/grpc.health.v1.Health/", 23) == 0};
  return 0;
}

int k3_rpc_server_start(k3_rpc_server_t *srv, const char *addr, int *port_out) {
  if (srv->started || srv->shutting_down || (!addr && srv->n_ports == 0)) return K3_EINVAL;
  int port = 0;
  if (addr) {
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    port = grpc_server_add_http2_port(srv->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (port <= 0) {
      K3_ERROR("rpc: cannot bind %s", addr);
      return K3_EIO;
    }
    srv->n_ports++;
  }
  grpc_server_start(srv->server);
  srv->started = 1;
  for (size_t i = 0; i < srv->n_methods; i++)
    for (uint32_t k = 0; k < srv->opts.calls_per_method; k++) {
      int rc = arm_request(srv, &srv->methods[i]);
      if (rc) return rc; /* serving continues with the requests already armed */
    }
  int rc = arm_unregistered(srv);
  if (rc) return rc;
  if (port_out) *port_out = port;
  if (addr)
    K3_INFO("rpc: serving %zu methods on %s (port %d)", srv->n_methods, addr, port);
  else
    K3_INFO("rpc: serving %zu methods on %d port(s)", srv->n_methods, srv->n_ports);
  return 0;
}

static void on_shutdown_notified(rpc_tag_t *t, int ok) {
  k3_rpc_server_t *srv = (k3_rpc_server_t *)((char *)t - offsetof(k3_rpc_server_t, t_shutdown));
  srv->shutdown_notified = 1;
  uv_timer_stop(&srv->grace_timer);
  maybe_finish_shutdown(srv);
}

static void on_grace_expired(uv_timer_t *t) {
  k3_rpc_server_t *srv = t->data;
  K3_WARN("rpc: shutdown grace of %u ms over with %zu calls live: cancelling them",
          srv->opts.grace_ms, srv->live_calls);
  grpc_server_cancel_all_calls(srv->server);
}

static void maybe_finish_shutdown(k3_rpc_server_t *srv) {
  if (!srv->shutdown_notified || srv->live_calls > 0 || srv->armed > 0 || srv->own.detached)
    return;
  /* Nothing of this server is outstanding on the shared CQ: the shutdown tag came back, every
   * armed request returned and every call was destroyed. gRPC allows the destroy now. */
  grpc_server_destroy(srv->server);
  srv->server = NULL;
  rpc_bridge_detach(&srv->own);
}

void k3_rpc_server_shutdown(k3_rpc_server_t *srv, k3_rpc_server_done_fn done, void *arg) {
  K3_ASSERT(!srv->shutting_down);
  srv->shutting_down = 1;
  srv->done = done;
  srv->done_arg = arg;
  rpc_health_shutdown(srv);
  srv->t_shutdown.cb = on_shutdown_notified;
  if (!srv->started) {
    /* Never started: gRPC has no listeners or calls; go straight to drain + destroy. */
    srv->shutdown_notified = 1;
    maybe_finish_shutdown(srv);
    return;
  }
  grpc_server_shutdown_and_notify(srv->server, rpc_owner_cq(&srv->own), &srv->t_shutdown);
  uv_timer_start(&srv->grace_timer, on_grace_expired, srv->opts.grace_ms, 0);
}

size_t k3_rpc_server_live_calls(const k3_rpc_server_t *srv) { return srv->live_calls; }
