/* k3pd-null-worker: a BENCHMARK-ONLY worker that serves k3pd.v1.Prefill or k3pd.v1.Decode with
 * no model and no state transfer, so that a router can be loaded far beyond what real workers
 * on the same machine could compute (docs/perf-cluster.md "Router capacity").
 *
 * What it is: the router's view of a worker at zero cost. It registers and heartbeats with the
 * routers exactly like k3pd-prefill/k3pd-decode (common/worker registrar, mutual TLS, health
 * Watch), answers Reserve with a dummy descriptor (its pool never fills), Prefill at once with
 * the first token, and Attach with max_new_tokens tokens, one message per token, optionally
 * paced (--token-interval-ms, like a decode step). What it is NOT: a model. Its token ids are
 * a fixed function of the completion index (FAKE_TOKEN), identical for every request, so the
 * router's replay check still holds, but they mean nothing; it never runs any kernel, never
 * moves state over UCX, ignores sampling and stop ids, and finishes every stream with
 * FINISH_REASON_LENGTH. Never register it with a router that serves real clients.
 *
 * One process is one role (--role prefill|decode), like the real workers: a benchmark runs one
 * of each. Loop thread only; streams are freed when their call ends (finish or cancel).
 *
 * K3PD_NULL_TRACE=FILE: one line per Reserve, Prefill and Attach call, "<method letter R|P|A>
 * <request id> <ns when the handler ran> <ns when the reply (Attach: the last message) was
 * handed to gRPC>" (CLOCK_MONOTONIC, k3_now_ns), to be joined with the router's trace
 * (K3PD_ROUTER_TRACE) into one-way hops: scripts/bench/router_trace.py. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "k3pd/apptls.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/lifecycle.h"
#include "k3pd/log.h"
#include "k3pd/netaddr.h"
#include "k3pd/registrar.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"
#include "k3pd/v1/prefill.pb-c.h"

/* The token of completion index i: below 3000 (inside every preset's vocabulary, no special id). */
#define FAKE_TOKEN(i) ((uint32_t)(((uint64_t)(i) * 7919u + 13u) % 3000u) + 16u)
#define NULL_FINGERPRINT 0x6e756c6c776b7231ull /* "nullwkr1": pairs only with other null workers */

typedef struct stream {
  struct stream *next;
  struct nw *w;
  k3_rpc_call_t *call;
  uv_timer_t timer;
  uint32_t next_index, max_new;
  bool timer_open, ended;
  uint64_t t_in;  /* trace: when the Attach handler ran */
  char *trace_id; /* trace: the request id (owned; NULL when tracing is off) */
} stream_t;

typedef struct nw {
  uv_loop_t *loop;
  k3_rpc_server_t *srv;
  k3_rpc_client_t *cli;
  k3_registrar_t *reg;
  k3_rpc_tls_t *tls;
  bool decode;
  uint64_t token_interval_ms;
  uint64_t next_epoch;
  uint32_t reservations, streams; /* live: the load reported to the routers */
  uint64_t served;
  uv_signal_t sigint, sigterm;
  uv_timer_t ready_timer;
  int health;
  bool stopping;
  FILE *trace; /* K3PD_NULL_TRACE (NULL = off) */
} nw_t;

static void trace_call(nw_t *w, char method, const char *id, uint64_t t_in) {
  if (w->trace) fprintf(w->trace, "%c %s %llu %llu\n", method, id ? id : "-", (unsigned long long)t_in,
                        (unsigned long long)k3_now_ns());
}

/* ---- Decode ---- */

static void on_reserve(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  nw_t *w = user;
  uint64_t t_in = w->trace ? k3_now_ns() : 0;
  const K3pd__V1__ReserveRequest *rq = (const K3pd__V1__ReserveRequest *)msg;
  if (!rq->request_id || !*rq->request_id) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "request_id: must be 1..128 bytes");
    return;
  }
  static uint8_t desc[] = "null-worker: no state is transferred";
  K3pd__V1__Reservation r = K3PD__V1__RESERVATION__INIT;
  r.request_id = rq->request_id;
  r.epoch = ++w->next_epoch;
  r.descriptor.data = desc;
  r.descriptor.len = sizeof desc;
  r.n_pages = 1;
  k3_rpc_call_reply(call, &r.base);
  trace_call(w, 'R', rq->request_id, t_in);
}

static void on_release(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  (void)msg;
  (void)user;
  K3pd__V1__ReleaseResponse r = K3PD__V1__RELEASE_RESPONSE__INIT;
  k3_rpc_call_reply(call, &r.base);
}

static void stream_closed(uv_handle_t *h) {
  stream_t *s = h->data;
  free(s->trace_id);
  free(s);
}

/* Ends a stream once: the call (unless cancelled, then finish only drops our reference) and its
 * timer; the stream is freed in the timer's close callback. */
static void stream_end(stream_t *s, k3_rpc_code_t code, const char *msg) {
  if (s->ended) return;
  s->ended = true;
  s->w->streams--;
  k3_rpc_call_finish(s->call, code, msg);
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->timer, stream_closed);
}

static void on_tick(uv_timer_t *t);

/* Sends the next token (or all remaining ones when unpaced); the last message carries the finish. */
static void stream_send(stream_t *s) {
  do {
    uint32_t tok = FAKE_TOKEN(s->next_index);
    K3pd__V1__AttachResponse a = K3PD__V1__ATTACH_RESPONSE__INIT;
    a.token_ids = &tok;
    a.n_token_ids = 1;
    a.first_index = s->next_index;
    bool last = ++s->next_index == s->max_new;
    if (last) {
      a.finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH;
      a.completion_tokens = s->max_new;
    }
    if (k3_rpc_call_write(s->call, &a.base)) {
      stream_end(s, K3_RPC_CANCELLED, "cancelled");
      return;
    }
    if (last) {
      s->w->served++;
      if (s->trace_id) trace_call(s->w, 'A', s->trace_id, s->t_in);
      stream_end(s, K3_RPC_OK, NULL);
      return;
    }
  } while (!s->w->token_interval_ms);
  uv_timer_start(&s->timer, on_tick, s->w->token_interval_ms, 0);
}

static void on_tick(uv_timer_t *t) { stream_send(t->data); }

static void on_attach_cancel(k3_rpc_call_t *call, void *arg) {
  (void)call;
  stream_end(arg, K3_RPC_CANCELLED, "cancelled");
}

static void on_attach(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  nw_t *w = user;
  uint64_t t_in = w->trace ? k3_now_ns() : 0;
  const K3pd__V1__AttachRequest *rq = (const K3pd__V1__AttachRequest *)msg;
  uint32_t max_new = rq->stop ? rq->stop->max_new_tokens : 0;
  if (max_new < 1) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "stop.max_new_tokens: must be >= 1");
    return;
  }
  stream_t *s = calloc(1, sizeof *s);
  if (!s) {
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "null worker out of memory");
    return;
  }
  s->w = w;
  s->call = call;
  s->max_new = max_new;
  s->t_in = t_in;
  if (w->trace && rq->request_id) s->trace_id = strdup(rq->request_id);
  uv_timer_init(w->loop, &s->timer);
  s->timer.data = s;
  w->streams++;
  k3_rpc_call_set_cancel_cb(call, on_attach_cancel, s);
  stream_send(s);
}

static void on_stats(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  nw_t *w = user;
  (void)msg;
  K3pd__V1__StatsResponse r = K3PD__V1__STATS_RESPONSE__INIT;
  r.total_kv_pages = 1u << 20;
  r.total_kda_slots = 1u << 16;
  r.running_seqs = w->streams;
  r.finished = w->served;
  k3_rpc_call_reply(call, &r.base);
}

/* ---- Prefill ---- */

static void on_prefill(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  nw_t *w = user;
  uint64_t t_in = w->trace ? k3_now_ns() : 0;
  const K3pd__V1__PrefillRequest *rq = (const K3pd__V1__PrefillRequest *)msg;
  if (!rq->request_id || !*rq->request_id || rq->n_token_ids < 1) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "request_id, token_ids: required");
    return;
  }
  K3pd__V1__PrefillResponse r = K3PD__V1__PREFILL_RESPONSE__INIT;
  r.first_token = FAKE_TOKEN(0);
  r.seed = rq->sampling ? rq->sampling->seed : 0;
  k3_rpc_call_reply(call, &r.base);
  trace_call(w, 'P', rq->request_id, t_in);
}

static void on_abort(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  (void)msg;
  (void)user;
  K3pd__V1__AbortResponse r = K3PD__V1__ABORT_RESPONSE__INIT;
  k3_rpc_call_reply(call, &r.base);
}

/* ---- registration, readiness, shutdown ---- */

static void fill_load(void *ud, K3pd__V1__WorkerLoad *load) {
  nw_t *w = ud;
  load->running_seqs = w->streams;
}

static void on_ready_tick(uv_timer_t *t) {
  nw_t *w = t->data;
  k3_app_set_ready(w->srv, w->decode ? "k3pd.v1.Decode" : "k3pd.v1.Prefill", NULL, &w->health,
                   !w->stopping && k3_registrar_registered(w->reg));
}

static void on_client_closed(void *arg) { (void)arg; }

static void on_server_done(void *arg) {
  nw_t *w = arg;
  k3_rpc_client_close(w->cli, on_client_closed, NULL);
}

static void on_registrar_done(void *arg) {
  nw_t *w = arg;
  k3_rpc_server_shutdown(w->srv, on_server_done, w);
}

static void on_signal(uv_signal_t *h, int signum) {
  nw_t *w = h->data;
  if (w->stopping) return;
  K3_INFO("signal %d: deregistering and stopping (%llu streams served)", signum, (unsigned long long)w->served);
  w->stopping = true;
  uv_close((uv_handle_t *)&w->sigint, NULL);
  uv_close((uv_handle_t *)&w->sigterm, NULL);
  uv_close((uv_handle_t *)&w->ready_timer, NULL);
  k3_registrar_stop(w->reg, true, on_registrar_done, w);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  static nw_t nw;
  nw_t *w = &nw;
  const char *role = NULL, *router = NULL, *listen = "127.0.0.1:0", *advertise = NULL, *worker_id = NULL;
  const char *log_level = NULL;
  int64_t interval_ms = 0;
  k3_app_tls_t to;
  k3_app_tls_init(&to);
  k3_flag_t flags[K3_APP_TLS_NFLAGS + 8] = {
      {"role", K3_FLAG_STR, &role, "prefill|decode", "which worker to imitate", true},
      {"router", K3_FLAG_STR, &router, "LIST", "routers' cluster ports, as k3pd-prefill/-decode --router", true},
      {"listen", K3_FLAG_STR, &listen, "HOST:PORT", "gRPC listen address (port 0 = ephemeral)", false},
      {"advertise", K3_FLAG_STR, &advertise, "HOST:PORT", "address the routers dial (default: listen host + port)",
       false},
      {"worker-id", K3_FLAG_STR, &worker_id, "ID", "worker id (development CA default: <role>-<host>-<pid>)", false},
      {"token-interval-ms", K3_FLAG_I64, &interval_ms, "MS", "decode: pause between two tokens of a stream, like a "
       "decode step (0 = send every token at once)", false},
      {"log-level", K3_FLAG_STR, &log_level, "LEVEL", "error|warn|info|debug", false},
  };
  size_t nflags = 7;
  nflags += k3_app_tls_flags(&to, flags + nflags);
  k3_flags_info_t info = {"k3pd-null-worker",
                          "BENCHMARK ONLY: a prefill or decode worker with no model and no state transfer "
                          "(zero compute). It registers with the routers like a real worker and answers every "
                          "call at once with fixed, meaningless token ids, so a benchmark measures the router "
                          "alone (docs/perf-cluster.md \"Router capacity\"). Never give it real clients' routers.",
                          NULL};
  char err[1024];
  int rc = k3_flags_parse(&info, flags, nflags, argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (!rc) rc = k3_app_tls_check(&to, err, sizeof err);
  if (!rc) rc = k3_registrar_check(router, "--router", err, sizeof err);
  if (!rc && (!role || (strcmp(role, "prefill") != 0 && strcmp(role, "decode") != 0))) {
    snprintf(err, sizeof err, "--role: expected prefill or decode, got \"%s\"", role ? role : "");
    rc = K3_EINVAL;
  }
  if (!rc && interval_ms < 0) {
    snprintf(err, sizeof err, "--token-interval-ms: must be >= 0");
    rc = K3_EINVAL;
  }
  if (rc) {
    fprintf(stderr, "k3pd-null-worker: %s\n", err);
    return 2;
  }
  if (k3_app_log_setup("k3pd-null-worker", log_level)) return 2;
  w->decode = strcmp(role, "decode") == 0;
  w->token_interval_ms = (uint64_t)interval_ms;
  w->health = -1;
  char wid[400], adv[300];
  if (k3_app_tls_worker(&to, role, worker_id, &w->tls, wid, sizeof wid, err, sizeof err)) {
    fprintf(stderr, "k3pd-null-worker: %s\n", err);
    return 2;
  }
  uv_loop_t *loop = uv_default_loop();
  w->loop = loop;
  rc = k3_rpc_server_init(loop, NULL, &w->srv);
  if (!rc && w->decode) {
    rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Reserve", K3_RPC_UNARY,
                                  &k3pd__v1__reserve_request__descriptor, on_reserve, w);
    if (!rc)
      rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Release", K3_RPC_UNARY,
                                    &k3pd__v1__release_request__descriptor, on_release, w);
    if (!rc)
      rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Attach", K3_RPC_SERVER_STREAM,
                                    &k3pd__v1__attach_request__descriptor, on_attach, w);
    if (!rc)
      rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Stats", K3_RPC_UNARY,
                                    &k3pd__v1__stats_request__descriptor, on_stats, w);
  } else if (!rc) {
    rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Prefill/Prefill", K3_RPC_UNARY,
                                  &k3pd__v1__prefill_request__descriptor, on_prefill, w);
    if (!rc)
      rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Prefill/Abort", K3_RPC_UNARY,
                                    &k3pd__v1__abort_request__descriptor, on_abort, w);
  }
  int port = 0;
  if (rc || k3_app_tls_serve(w->srv, &to, w->tls, listen, &port, err, sizeof err)) {
    fprintf(stderr, "k3pd-null-worker: starting the gRPC server on %s: %s\n", listen, rc ? k3_strerror(rc) : err);
    return 1;
  }
  if (k3_addr_advertise(listen, port, advertise, adv, sizeof adv)) {
    fprintf(stderr, "k3pd-null-worker: --listen/--advertise: bad address\n");
    return 2;
  }
  if (!wid[0]) snprintf(wid, sizeof wid, "%s-%s", role, adv); /* --insecure-cluster without --worker-id */
  k3_rpc_client_opts_t co = {.tls = w->tls, .peer_name = to.router_identity};
  if (k3_rpc_client_init(loop, &co, &w->cli)) {
    fprintf(stderr, "k3pd-null-worker: gRPC client: out of memory\n");
    return 1;
  }
  k3_registrar_opts_t rg = {.router = router,
                            .role = w->decode ? K3PD__V1__ROLE__ROLE_DECODE : K3PD__V1__ROLE__ROLE_PREFILL,
                            .worker_id = wid,
                            .grpc_address = adv,
                            .fingerprint = NULL_FINGERPRINT,
                            /* never dialled: nothing sends state to a null decode worker */
                            .ucx_address = (const uint8_t *)"null-worker",
                            .ucx_address_len = 11,
                            .model_name = "null",
                            .get_load = fill_load,
                            .ud = w};
  k3pd__v1__worker_capacity__init(&rg.capacity);
  /* A pool that never fills (within the router's bounds on what a worker may claim). */
  rg.capacity.kv_pages = 1u << 20;
  rg.capacity.page_tokens = 64;
  rg.capacity.kda_slots = 1u << 16;
  rg.capacity.max_batch = 1024;
  rg.capacity.max_context_tokens = 1u << 20;
  if ((rc = k3_registrar_start(loop, w->cli, &rg, &w->reg))) {
    fprintf(stderr, "k3pd-null-worker: registrar: %s\n", k3_strerror(rc));
    return 1;
  }
  k3_rpc_server_set_health(w->srv, "", K3_RPC_HEALTH_NOT_SERVING);
  k3_rpc_server_set_health(w->srv, "liveness", K3_RPC_HEALTH_SERVING);
  uv_timer_init(loop, &w->ready_timer);
  w->ready_timer.data = w;
  uv_timer_start(&w->ready_timer, on_ready_tick, 0, 250);
  uv_signal_init(loop, &w->sigint);
  uv_signal_init(loop, &w->sigterm);
  w->sigint.data = w->sigterm.data = w;
  uv_signal_start(&w->sigint, on_signal, SIGINT);
  uv_signal_start(&w->sigterm, on_signal, SIGTERM);
  K3_WARN("BENCHMARK MODE: %s worker %s with no model (zero compute, fixed token ids) serving on %s (advertised %s)",
          role, wid, listen, adv);
  const char *tp = getenv("K3PD_NULL_TRACE");
  if (tp && *tp) {
    w->trace = fopen(tp, "w");
    if (w->trace) setvbuf(w->trace, NULL, _IOFBF, 1 << 16);
    else K3_WARN("K3PD_NULL_TRACE=%s: cannot open it; tracing is off", tp);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  if (w->trace) fclose(w->trace);
  k3_rpc_tls_free(w->tls);
  uv_loop_close(loop);
  K3_INFO("stopped");
  return 0;
}
