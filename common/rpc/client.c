/* k3_rpc client: channel cache, unary and server-streaming calls with deadlines, cancellation
 * and close (API and ownership rules in k3pd/rpc_client.h). Not here: the CQ bridge.
 *
 * A call holds one reference per batch in flight (start, recv, status); the final callback
 * runs when the status arrives, and the call is freed once no batch remains. Streams follow
 * C-STACK §2: sends + RECV_INITIAL_METADATA in one batch, one RECV_MESSAGE at a time (P6)
 * until a NULL message (end of stream or failure), then RECV_STATUS_ON_CLIENT. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_client.h"
#include "k3pd/rpc_tls.h"
#include "rpc_internal.h"

/* A cached channel. Calls hold a count on it: grpc_channel_destroy() fails the calls still
 * waiting on a channel with UNKNOWN "Channel Destroyed" (seen when a worker deregistered while
 * requests were in flight to it), so a forgotten channel is only destroyed once its last call
 * ended. */
typedef struct chan {
  char *target;  /* owned */
  grpc_channel *ch;
  int calls;     /* calls started on it and not yet destroyed */
  struct chan *next;
} chan_t;

struct k3_rpc_client {
  rpc_owner_t own;  /* first: on_detached casts back */
  k3_rpc_client_opts_t opts;
  chan_t *chans;
  chan_t *retired;  /* forgotten while calls were still running on them */
  k3_rpc_ccall_t *calls;  /* live list */
  size_t live;
  int closing;
  void (*done)(void *);
  void *done_arg;
};

struct k3_rpc_ccall {
  k3_rpc_client_t *cli;
  chan_t *chan;  /* the channel the call runs on (its count holds it) */
  grpc_call *call;
  int streaming;
  const ProtobufCMessageDescriptor *resp_desc;
  k3_rpc_unary_cb unary_cb;
  k3_rpc_msg_cb on_msg;
  k3_rpc_done_cb on_done;
  void *arg;
  rpc_tag_t t_start, t_recv, t_status;
  int refs;
  int user_cancelled, done_called, bad_message;
  grpc_metadata send_md[1];
  size_t send_md_n;
  grpc_byte_buffer *send_bb;
  grpc_byte_buffer *recv_bb;
  grpc_metadata_array init_md, trailing_md;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;  /* gpr_malloc'd by core */
  k3_rpc_ccall_t *prev, *next;
};

static void maybe_finish_close(k3_rpc_client_t *cli);

static void chan_free(chan_t *ch) {
  grpc_channel_destroy(ch->ch);
  free(ch->target);
  free(ch);
}

/* A call on ch ended: a retired channel goes with its last call. */
static void chan_release(k3_rpc_client_t *cli, chan_t *ch) {
  if (--ch->calls > 0) return;
  for (chan_t **pp = &cli->retired; *pp; pp = &(*pp)->next) {
    if (*pp == ch) {
      *pp = ch->next;
      chan_free(ch);
      return;
    }
  }
}

static void ccall_destroy(k3_rpc_ccall_t *c) {
  k3_rpc_client_t *cli = c->cli;
  if (c->call) grpc_call_unref(c->call);
  if (c->chan) chan_release(cli, c->chan);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
  grpc_metadata_array_destroy(&c->init_md);
  grpc_metadata_array_destroy(&c->trailing_md);
  grpc_slice_unref(c->details);
  if (c->error_string) gpr_free((void *)c->error_string);
  if (c->send_md_n) grpc_slice_unref(c->send_md[0].value);
  if (c->prev) c->prev->next = c->next; else cli->calls = c->next;
  if (c->next) c->next->prev = c->prev;
  cli->live--;
  free(c);
  if (cli->closing) maybe_finish_close(cli);
}

static void ccall_unref(k3_rpc_ccall_t *c) {
  if (--c->refs == 0) ccall_destroy(c);
}

/* Builds the status the user sees; details copied into buf (valid for the callback). */
static void make_status(k3_rpc_ccall_t *c, k3_rpc_status_t *st, char *buf, size_t cap) {
  size_t n = GRPC_SLICE_LENGTH(c->details);
  if (n >= cap) n = cap - 1;
  memcpy(buf, GRPC_SLICE_START_PTR(c->details), n);
  buf[n] = 0;
  st->code = (k3_rpc_code_t)c->status;
  st->details = buf;
  if (c->bad_message && c->status == GRPC_STATUS_OK) st->code = K3_RPC_INTERNAL;
}

static void on_unary_done(rpc_tag_t *t, int ok) {
  k3_rpc_ccall_t *c = (k3_rpc_ccall_t *)((char *)t - offsetof(k3_rpc_ccall_t, t_start));
  char buf[1024];
  k3_rpc_status_t st;
  make_status(c, &st, buf, sizeof buf);
  ProtobufCMessage *resp = NULL;
  if (!ok && st.code == K3_RPC_OK) {
    st.code = K3_RPC_UNAVAILABLE;
    st.details = "client: call failed before a status arrived";
  }
  if (st.code == K3_RPC_OK) {
    resp = rpc_unpack(c->resp_desc, c->recv_bb);
    if (!resp) {
      st.code = K3_RPC_INTERNAL;
      st.details = c->recv_bb ? "client: response does not parse" : "client: no response message";
    }
  }
  c->done_called = 1;
  c->unary_cb(c->arg, &st, resp);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  ccall_unref(c);
}

static void on_status(rpc_tag_t *t, int ok) {
  k3_rpc_ccall_t *c = (k3_rpc_ccall_t *)((char *)t - offsetof(k3_rpc_ccall_t, t_status));
  char buf[1024];
  k3_rpc_status_t st;
  make_status(c, &st, buf, sizeof buf);
  if (c->bad_message) st.details = "client: a streamed message does not parse";
  c->done_called = 1;
  c->on_done(c->arg, &st);
  ccall_unref(c);
}

static void start_status(k3_rpc_ccall_t *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &c->trailing_md;
  op.data.recv_status_on_client.status = &c->status;
  op.data.recv_status_on_client.status_details = &c->details;
  op.data.recv_status_on_client.error_string = &c->error_string;
  c->refs++;
  grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->t_status, NULL);
  K3_ASSERT(e == GRPC_CALL_OK); /* only programmer errors fail here */
}

static void start_recv(k3_rpc_ccall_t *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_bb;
  c->refs++;
  grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->t_recv, NULL);
  K3_ASSERT(e == GRPC_CALL_OK);
}

static void on_recv(rpc_tag_t *t, int ok) {
  k3_rpc_ccall_t *c = (k3_rpc_ccall_t *)((char *)t - offsetof(k3_rpc_ccall_t, t_recv));
  if (ok && c->recv_bb) {
    ProtobufCMessage *m = rpc_unpack(c->resp_desc, c->recv_bb);
    grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    if (!m) {
      c->bad_message = 1;
      grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL, "client: message does not parse", NULL);
    } else {
      if (!c->user_cancelled) c->on_msg(c->arg, m);
      protobuf_c_message_free_unpacked(m, NULL);
    }
    start_recv(c);
  } else {
    start_status(c);
  }
  ccall_unref(c);
}

static void on_start(rpc_tag_t *t, int ok) {
  k3_rpc_ccall_t *c = (k3_rpc_ccall_t *)((char *)t - offsetof(k3_rpc_ccall_t, t_start));
  /* Failures show up in the recv/status path; nothing to do here but release. */
  ccall_unref(c);
}

/* The credentials of a new channel: plaintext, or mutual TLS with the client's certificate,
 * checking that the server's certificate covers the expected peer name (grpc's own check of
 * the name against the certificate's DNS SANs, wildcards included). */
static grpc_channel_credentials *chan_creds(k3_rpc_client_t *cli) {
  const k3_rpc_tls_t *t = cli->opts.tls;
  if (!t) return grpc_insecure_credentials_create();
  grpc_ssl_pem_key_cert_pair pair = {.private_key = k3_rpc_tls_key_pem(t), .cert_chain = k3_rpc_tls_cert_pem(t)};
  return grpc_ssl_credentials_create(k3_rpc_tls_ca_pem(t), &pair, NULL, NULL);
}

static chan_t *get_channel(k3_rpc_client_t *cli, const char *target) {
  for (chan_t *ch = cli->chans; ch; ch = ch->next)
    if (strcmp(ch->target, target) == 0) return ch;
  chan_t *ch = calloc(1, sizeof *ch);
  if (!ch) return NULL;
  ch->target = strdup(target);
  if (!ch->target) {
    free(ch);
    return NULL;
  }
  grpc_arg a[3];
  grpc_channel_args args;
  rpc_size_args(a, &args, (int)cli->opts.max_msg_bytes);
  const char *peer = NULL;
  if (cli->opts.tls) {
    peer = cli->opts.peer_name_fn ? cli->opts.peer_name_fn(cli->opts.peer_name_ud, target) : NULL;
    if (!peer) peer = cli->opts.peer_name;
  }
  if (peer) {
    a[args.num_args].type = GRPC_ARG_STRING;
    a[args.num_args].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    a[args.num_args].value.string = (char *)peer;
    args.num_args++;
  }
  grpc_channel_credentials *creds = chan_creds(cli);
  ch->ch = creds ? grpc_channel_create(target, creds, &args) : NULL;
  if (creds) grpc_channel_credentials_release(creds);
  if (!ch->ch) {
    free(ch->target);
    free(ch);
    return NULL;
  }
  ch->next = cli->chans;
  cli->chans = ch;
  return ch;
}

static int start_call(k3_rpc_client_t *cli, const char *target, const char *method,
                      const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                      const k3_rpc_call_opts_t *opts, int streaming, k3_rpc_unary_cb ucb,
                      k3_rpc_msg_cb on_msg, k3_rpc_done_cb on_done, void *arg,
                      k3_rpc_ccall_t **out) {
  if (cli->closing) return K3_ESHUTDOWN;
  if (!target || !*target || !method || method[0] != '/' || !req || !resp_desc) return K3_EINVAL;
  chan_t *chan = get_channel(cli, target);
  if (!chan) return K3_ENOMEM;
  grpc_channel *ch = chan->ch;
  k3_rpc_ccall_t *c = calloc(1, sizeof *c);
  if (!c) return K3_ENOMEM;
  c->cli = cli;
  c->streaming = streaming;
  c->resp_desc = resp_desc;
  c->unary_cb = ucb;
  c->on_msg = on_msg;
  c->on_done = on_done;
  c->arg = arg;
  c->t_start.cb = streaming ? on_start : on_unary_done;
  c->t_recv.cb = on_recv;
  c->t_status.cb = on_status;
  c->details = grpc_empty_slice();
  grpc_metadata_array_init(&c->init_md);
  grpc_metadata_array_init(&c->trailing_md);
  c->send_bb = rpc_pack(req);
  uint32_t ms = opts && opts->timeout_ms ? opts->timeout_ms : cli->opts.default_timeout_ms;
  gpr_timespec deadline =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
  grpc_slice mslice = grpc_slice_from_copied_string(method);
  c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, rpc_owner_cq(&cli->own), mslice, NULL,
                                     deadline, NULL);
  grpc_slice_unref(mslice);
  if (!c->send_bb || !c->call) goto err;
  if (opts && opts->request_id) {
    c->send_md[0].key = grpc_slice_from_static_string("x-request-id");
    c->send_md[0].value = grpc_slice_from_copied_string(opts->request_id);
    c->send_md_n = 1;
  }
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].data.send_initial_metadata.count = c->send_md_n;
  ops[n].data.send_initial_metadata.metadata = c->send_md_n ? c->send_md : NULL;
  n++;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n].data.send_message.send_message = c->send_bb;
  n++;
  ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n].data.recv_initial_metadata.recv_initial_metadata = &c->init_md;
  n++;
  if (!streaming) {
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &c->recv_bb;
    n++;
    ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[n].data.recv_status_on_client.trailing_metadata = &c->trailing_md;
    ops[n].data.recv_status_on_client.status = &c->status;
    ops[n].data.recv_status_on_client.status_details = &c->details;
    ops[n].data.recv_status_on_client.error_string = &c->error_string;
    n++;
  }
  if (grpc_call_start_batch(c->call, ops, n, &c->t_start, NULL) != GRPC_CALL_OK) goto err;
  c->refs = 1;
  c->chan = chan;
  chan->calls++;
  c->next = cli->calls;
  if (cli->calls) cli->calls->prev = c;
  cli->calls = c;
  cli->live++;
  if (streaming) start_recv(c);
  if (out) *out = c;
  return 0;
err:
  if (c->call) grpc_call_unref(c->call);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->send_md_n) grpc_slice_unref(c->send_md[0].value);
  grpc_metadata_array_destroy(&c->init_md);
  grpc_metadata_array_destroy(&c->trailing_md);
  free(c);
  return K3_ENOMEM;
}

int k3_rpc_unary(k3_rpc_client_t *cli, const char *target, const char *method,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 const k3_rpc_call_opts_t *opts, k3_rpc_unary_cb cb, void *arg,
                 k3_rpc_ccall_t **out) {
  if (!cb) return K3_EINVAL;
  return start_call(cli, target, method, req, resp_desc, opts, 0, cb, NULL, NULL, arg, out);
}

int k3_rpc_stream(k3_rpc_client_t *cli, const char *target, const char *method,
                  const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                  const k3_rpc_call_opts_t *opts, k3_rpc_msg_cb on_msg, k3_rpc_done_cb on_done,
                  void *arg, k3_rpc_ccall_t **out) {
  if (!on_msg || !on_done) return K3_EINVAL;
  return start_call(cli, target, method, req, resp_desc, opts, 1, NULL, on_msg, on_done, arg, out);
}

void k3_rpc_ccall_cancel(k3_rpc_ccall_t *c) {
  if (c->user_cancelled || c->done_called) return;
  c->user_cancelled = 1;
  grpc_call_cancel(c->call, NULL);
}

int k3_rpc_client_forget(k3_rpc_client_t *cli, const char *target) {
  for (chan_t **pp = &cli->chans; *pp; pp = &(*pp)->next) {
    chan_t *ch = *pp;
    if (strcmp(ch->target, target) != 0) continue;
    *pp = ch->next;
    if (ch->calls == 0) {
      chan_free(ch);
    } else { /* destroyed when its last call ends (chan_release) */
      ch->next = cli->retired;
      cli->retired = ch;
    }
    return 0;
  }
  return K3_ENOENT;
}

size_t k3_rpc_client_live_calls(const k3_rpc_client_t *cli) { return cli->live; }

static void on_detached(rpc_owner_t *o) {
  k3_rpc_client_t *cli = (k3_rpc_client_t *)o;
  void (*done)(void *) = cli->done;
  void *arg = cli->done_arg;
  free(cli);
  grpc_shutdown();
  if (done) done(arg);
}

static void maybe_finish_close(k3_rpc_client_t *cli) {
  if (cli->live > 0 || cli->own.detached) return;
  while (cli->chans) {
    chan_t *ch = cli->chans;
    cli->chans = ch->next;
    chan_free(ch);
  }
  while (cli->retired) { /* none: every call is gone, and the last one freed its channel */
    chan_t *ch = cli->retired;
    cli->retired = ch->next;
    chan_free(ch);
  }
  /* No call is left, so no tag of this client is outstanding on the shared CQ. */
  rpc_bridge_detach(&cli->own);
}

int k3_rpc_client_init(uv_loop_t *loop, const k3_rpc_client_opts_t *opts, k3_rpc_client_t **out) {
  k3_rpc_client_t *cli = calloc(1, sizeof *cli);
  if (!cli) return K3_ENOMEM;
  if (opts) cli->opts = *opts;
  if (!cli->opts.max_msg_bytes) cli->opts.max_msg_bytes = K3_RPC_DEFAULT_MAX_MSG_BYTES;
  if (!cli->opts.default_timeout_ms) cli->opts.default_timeout_ms = 30000;
  grpc_init();
  int rc = rpc_bridge_attach(loop, &cli->own, on_detached);
  if (rc) {
    free(cli);
    grpc_shutdown();
    return rc;
  }
  *out = cli;
  return 0;
}

void k3_rpc_client_close(k3_rpc_client_t *cli, void (*done)(void *arg), void *arg) {
  K3_ASSERT(!cli->closing);
  cli->closing = 1;
  cli->done = done;
  cli->done_arg = arg;
  for (k3_rpc_ccall_t *c = cli->calls; c; c = c->next) k3_rpc_ccall_cancel(c);
  maybe_finish_close(cli);
}
