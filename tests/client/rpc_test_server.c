/* A small k3_rpc server for the off-the-shelf client test (interop.py, python3-grpcio).
 * It serves three real k3pd.v1.Decode paths with test behaviour, plus grpc.health.v1:
 *   Reserve  validates (INVALID_ARGUMENT naming the field), echoes request_id or the
 *            x-request-id metadata, epoch = 2 * n_prompt_tokens; request_id "slow" never
 *            answers until cancelled (deadline test).
 *   Attach   streams stop.max_new_tokens chunks {first_index = i, token_ids = [i]} then OK;
 *            request_id "endless" streams one per ms until cancelled.
 *   Stats    admitted = calls handled, finished = streams completed OK,
 *            leases_expired = cancellations the handlers observed (test mapping, not the real
 *            decode semantics).
 * Prints "PORT <n>" on stdout once serving; SIGTERM/SIGINT run the graceful shutdown; exits
 * by itself after --max-seconds (default 60) so a lost parent never leaves it running.
 * Not a decode worker: no model, no pools. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/log.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/v1/decode.pb-c.h"

typedef struct {
  uv_loop_t *loop;
  k3_rpc_server_t *srv;
  uv_signal_t sigterm, sigint;
  uv_timer_t life;
  uint64_t handled, finished, cancels;
  int stopping;
} app_t;

static app_t A;

static void reserve_cancelled(k3_rpc_call_t *call, void *arg) {
  A.cancels++;
  k3_rpc_call_finish(call, K3_RPC_CANCELLED, NULL);
}

static void reserve(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  const K3pd__V1__ReserveRequest *r = (const void *)req;
  A.handled++;
  if (strcmp(r->request_id, "slow") == 0) {
    k3_rpc_call_set_cancel_cb(call, reserve_cancelled, NULL);
    return;
  }
  char msg[256];
  if (k3_rpc_validate_reserve_request(r, msg, sizeof msg)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, msg);
    return;
  }
  K3pd__V1__Reservation resp = K3PD__V1__RESERVATION__INIT;
  const char *rid = k3_rpc_call_metadata(call, "x-request-id");
  resp.request_id = (char *)(rid ? rid : r->request_id);
  resp.epoch = 2ull * r->n_prompt_tokens;
  resp.n_pages = r->n_prompt_tokens + r->max_new_tokens;
  k3_rpc_call_reply(call, &resp.base);
}

typedef struct {
  uv_timer_t timer;
  k3_rpc_call_t *call;
  uint32_t i;
} pacer_t;

static void pacer_closed(uv_handle_t *h) { free(h->data); }

static void pacer_cancelled(k3_rpc_call_t *call, void *arg) {
  pacer_t *p = arg;
  A.cancels++;
  k3_rpc_call_finish(call, K3_RPC_CANCELLED, NULL);
  uv_timer_stop(&p->timer);
  uv_close((uv_handle_t *)&p->timer, pacer_closed);
}

static int write_index(k3_rpc_call_t *call, uint32_t i) {
  K3pd__V1__AttachResponse m = K3PD__V1__ATTACH_RESPONSE__INIT;
  m.first_index = i;
  m.token_ids = &i;
  m.n_token_ids = 1;
  return k3_rpc_call_write(call, &m.base);
}

static void pacer_tick(uv_timer_t *t) {
  pacer_t *p = t->data;
  if (write_index(p->call, p->i) == 0) p->i++;
}

static void attach(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  const K3pd__V1__AttachRequest *r = (const void *)req;
  A.handled++;
  if (strcmp(r->request_id, "endless") == 0) {
    pacer_t *p = calloc(1, sizeof *p);
    if (!p) {
      k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "server: out of memory");
      return;
    }
    p->call = call;
    uv_timer_init(A.loop, &p->timer);
    p->timer.data = p;
    k3_rpc_call_set_cancel_cb(call, pacer_cancelled, p);
    uv_timer_start(&p->timer, pacer_tick, 1, 1);
    return;
  }
  char msg[256];
  if (k3_rpc_validate_attach_request(r, NULL, msg, sizeof msg)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, msg);
    return;
  }
  for (uint32_t i = 0; i < r->stop->max_new_tokens; i++)
    if (write_index(call, i) != 0) break;
  A.finished++;
  k3_rpc_call_finish(call, K3_RPC_OK, NULL);
}

static void stats(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  K3pd__V1__StatsResponse s = K3PD__V1__STATS_RESPONSE__INIT;
  s.admitted = A.handled;
  s.finished = A.finished;
  s.leases_expired = A.cancels;
  k3_rpc_call_reply(call, &s.base);
}

static void server_done(void *arg) {
  uv_close((uv_handle_t *)&A.sigterm, NULL);
  uv_close((uv_handle_t *)&A.sigint, NULL);
  uv_close((uv_handle_t *)&A.life, NULL);
}

static void stop(void) {
  if (A.stopping) return;
  A.stopping = 1;
  K3_INFO("test server: draining");
  k3_rpc_server_shutdown(A.srv, server_done, NULL);
}

static void on_signal(uv_signal_t *s, int signum) { stop(); }
static void on_life(uv_timer_t *t) {
  K3_WARN("test server: --max-seconds reached, stopping");
  stop();
}

int main(int argc, char **argv) {
  int max_s = 60;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--max-seconds") == 0) max_s = atoi(argv[i + 1]);
  k3_log_set_component("rpc-test-server");
  A.loop = uv_default_loop();
  k3_rpc_server_opts_t so = {.grace_ms = 1000};
  if (k3_rpc_server_init(A.loop, &so, &A.srv)) return 1;
  if (k3_rpc_server_add_method(A.srv, "/k3pd.v1.Decode/Reserve", K3_RPC_UNARY,
                               &k3pd__v1__reserve_request__descriptor, reserve, NULL) ||
      k3_rpc_server_add_method(A.srv, "/k3pd.v1.Decode/Attach", K3_RPC_SERVER_STREAM,
                               &k3pd__v1__attach_request__descriptor, attach, NULL) ||
      k3_rpc_server_add_method(A.srv, "/k3pd.v1.Decode/Stats", K3_RPC_UNARY,
                               &k3pd__v1__stats_request__descriptor, stats, NULL))
    return 1;
  int port = 0;
  if (k3_rpc_server_start(A.srv, "127.0.0.1:0", &port)) return 1;
  k3_rpc_server_set_health(A.srv, "", K3_RPC_HEALTH_SERVING);
  k3_rpc_server_set_health(A.srv, "k3pd.v1.Decode", K3_RPC_HEALTH_SERVING);
  uv_signal_init(A.loop, &A.sigterm);
  uv_signal_start(&A.sigterm, on_signal, SIGTERM);
  uv_signal_init(A.loop, &A.sigint);
  uv_signal_start(&A.sigint, on_signal, SIGINT);
  uv_timer_init(A.loop, &A.life);
  uv_timer_start(&A.life, on_life, (uint64_t)max_s * 1000, 0);
  printf("PORT %d\n", port);
  fflush(stdout);
  uv_run(A.loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(A.loop);
  K3_INFO("test server: stopped (loop close %d)", rc);
  return rc == 0 ? 0 : 2;
}
