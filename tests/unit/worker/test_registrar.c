/* k3_registrar with several routers: the --router list rules, and a worker registered with two
 * fake routers (k3pd.v1.Cluster on two plaintext k3_rpc servers on one loop; the second found
 * through a dns:localhost entry) that keeps heartbeating the first after the second went away,
 * and deregisters from the live one when it stops. Verdicts are counts, never durations. */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "k3pd/err.h"
#include "k3pd/registrar.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/util.h"
#include "k3pd/v1/cluster.pb-c.h"

START_TEST(test_check_lists) {
  char err[512];
  const char *good[] = {"127.0.0.1:50052", "a:1,b:2", "dns:k3pd-router-cluster:50052", "[::1]:7",
                        "dns:localhost:9, 10.0.0.1:5", "h:1,"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_msg(k3_registrar_check(good[i], "--router", err, sizeof err) == 0, "%s: %s", good[i], err);
  struct {
    const char *list, *want;
  } bad[] = {{"", "--router: no router given"},
             {",", "--router: no router given"},
             {"host", "--router: entry \"host\": expected HOST:PORT or dns:NAME:PORT"},
             {"a:1,b:0", "entry \"b:0\""},
             {"dns::5", "entry \"dns::5\""},
             {"a:1,dns:b", "entry \"dns:b\""},
             {"a:70000", "entry \"a:70000\""}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    ck_assert_int_eq(k3_registrar_check(bad[i].list, "--router", err, sizeof err), K3_EINVAL);
    ck_assert_msg(strstr(err, bad[i].want), "\"%s\" gave \"%s\"", bad[i].list, err);
  }
  char many[64 * 16 + 16] = "";
  for (int i = 0; i < K3_REGISTRAR_MAX_ROUTERS + 1; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%sh%d:1", i ? "," : "", i);
  ck_assert_int_eq(k3_registrar_check(many, "--router", err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, "more than 64 entries"));
}
END_TEST

/* ---- two fake routers ---- */

typedef struct {
  k3_rpc_server_t *srv;
  int port;
  int registers, heartbeats, deregisters, stale;
  uint64_t epoch;
  int down; /* server shut down */
} fake_router_t;

static uv_loop_t loop;
static uv_timer_t tick;
static fake_router_t R[2];

static void on_register(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  fake_router_t *r = user;
  const K3pd__V1__RegisterRequest *rq = (const K3pd__V1__RegisterRequest *)msg;
  ck_assert_str_eq(rq->worker_id, "decode-7");
  ck_assert_int_eq(rq->role, K3PD__V1__ROLE__ROLE_DECODE);
  r->registers++;
  K3pd__V1__RegisterResponse resp = K3PD__V1__REGISTER_RESPONSE__INIT;
  resp.registration_epoch = r->epoch;
  resp.heartbeat_interval_ms = 30;
  k3_rpc_call_reply(call, &resp.base);
}

static void on_heartbeat(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  fake_router_t *r = user;
  const K3pd__V1__HeartbeatRequest *rq = (const K3pd__V1__HeartbeatRequest *)msg;
  /* each router sees only the epoch it handed out */
  if (rq->registration_epoch != r->epoch) r->stale++;
  r->heartbeats++;
  K3pd__V1__HeartbeatResponse resp = K3PD__V1__HEARTBEAT_RESPONSE__INIT;
  resp.heartbeat_interval_ms = 30;
  k3_rpc_call_reply(call, &resp.base);
}

static void on_deregister(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  fake_router_t *r = user;
  const K3pd__V1__DeregisterRequest *rq = (const K3pd__V1__DeregisterRequest *)msg;
  if (rq->registration_epoch != r->epoch) r->stale++;
  r->deregisters++;
  K3pd__V1__DeregisterResponse resp = K3PD__V1__DEREGISTER_RESPONSE__INIT;
  resp.found = true;
  k3_rpc_call_reply(call, &resp.base);
}

static void start_router(fake_router_t *r, uint64_t epoch) {
  memset(r, 0, sizeof *r);
  r->epoch = epoch;
  ck_assert_int_eq(k3_rpc_server_init(&loop, &(k3_rpc_server_opts_t){.grace_ms = 200}, &r->srv), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(r->srv, "/k3pd.v1.Cluster/RegisterWorker", K3_RPC_UNARY,
                                            &k3pd__v1__register_request__descriptor, on_register, r), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(r->srv, "/k3pd.v1.Cluster/Heartbeat", K3_RPC_UNARY,
                                            &k3pd__v1__heartbeat_request__descriptor, on_heartbeat, r), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(r->srv, "/k3pd.v1.Cluster/DeregisterWorker", K3_RPC_UNARY,
                                            &k3pd__v1__deregister_request__descriptor, on_deregister, r), 0);
  ck_assert_int_eq(k3_rpc_server_start(r->srv, "127.0.0.1:0", &r->port), 0);
}

static void set_flag(void *arg) { *(int *)arg = 1; }
static void noop_tick(uv_timer_t *t) { (void)t; }

static int run_until(volatile int *flag, int timeout_ms) {
  uint64_t end = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (!*flag && k3_now_ns() < end) uv_run(&loop, UV_RUN_ONCE);
  return *flag;
}

static int run_until_ge(volatile int *a, int want, int timeout_ms) {
  uint64_t end = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (*a < want && k3_now_ns() < end) uv_run(&loop, UV_RUN_ONCE);
  return *a >= want;
}

static k3_registrar_t *reg;
static int n_routers, n_registered;

static int count_is(int routers, int registered, int timeout_ms) {
  uint64_t end = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  for (;;) {
    k3_registrar_count(reg, &n_routers, &n_registered);
    if ((n_routers == routers && n_registered == registered) || k3_now_ns() >= end) break;
    uv_run(&loop, UV_RUN_ONCE);
  }
  return n_routers == routers && n_registered == registered;
}

static void load(void *ud, K3pd__V1__WorkerLoad *l) {
  (void)ud;
  l->running_seqs = 1;
}

START_TEST(test_two_routers) {
  ck_assert_int_eq(uv_loop_init(&loop), 0);
  uv_timer_init(&loop, &tick);
  uv_timer_start(&tick, noop_tick, 5, 5); /* UV_RUN_ONCE never blocks past a deadline */
  start_router(&R[0], 111);
  start_router(&R[1], 222);
  k3_rpc_client_t *cli;
  ck_assert_int_eq(k3_rpc_client_init(&loop, NULL, &cli), 0);
  char list[128];
  snprintf(list, sizeof list, "127.0.0.1:%d,dns:localhost:%d", R[0].port, R[1].port);
  k3_registrar_opts_t o = {.router = list,
                           .role = K3PD__V1__ROLE__ROLE_DECODE,
                           .worker_id = "decode-7",
                           .grpc_address = "127.0.0.1:9",
                           .ucx_address = (const uint8_t *)"ucx",
                           .ucx_address_len = 3,
                           .fingerprint = 5,
                           .get_load = load,
                           .retry_ms = 20,
                           .call_timeout_ms = 1000,
                           .resolve_ms = 100};
  k3pd__v1__worker_capacity__init(&o.capacity);
  o.capacity.kv_pages = 8;
  ck_assert_int_eq(k3_registrar_start(&loop, cli, &o, &reg), 0);
  /* registered with both, each heartbeating with its own router's epoch */
  ck_assert(count_is(2, 2, 10000));
  ck_assert(k3_registrar_registered(reg));
  ck_assert(run_until_ge(&R[0].heartbeats, 3, 10000));
  ck_assert(run_until_ge(&R[1].heartbeats, 3, 10000));
  ck_assert_int_eq(R[0].registers, 1);
  ck_assert_int_eq(R[1].registers, 1);
  /* router 1 goes away: its link lapses, router 0 keeps getting heartbeats */
  k3_rpc_server_shutdown(R[1].srv, set_flag, &R[1].down);
  ck_assert(run_until(&R[1].down, 10000));
  ck_assert(count_is(2, 1, 10000)); /* still resolved (localhost), no longer registered */
  ck_assert(k3_registrar_registered(reg));
  int hb = R[0].heartbeats;
  ck_assert(run_until_ge(&R[0].heartbeats, hb + 3, 10000));
  ck_assert_int_eq(R[0].registers, 1); /* never disturbed */
  /* stop: deregistered from the live router, with its epoch */
  int stopped = 0;
  k3_registrar_stop(reg, true, set_flag, &stopped);
  ck_assert(run_until(&stopped, 10000));
  ck_assert_int_eq(R[0].deregisters, 1);
  ck_assert_int_eq(R[0].stale + R[1].stale, 0);
  int cli_done = 0;
  k3_rpc_client_close(cli, set_flag, &cli_done);
  ck_assert(run_until(&cli_done, 5000));
  k3_rpc_server_shutdown(R[0].srv, set_flag, &R[0].down);
  ck_assert(run_until(&R[0].down, 10000));
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  ck_assert_int_eq(uv_loop_close(&loop), 0); /* every handle of the registrar was closed */
}
END_TEST

int main(void) {
  Suite *s = suite_create("registrar");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_check_lists);
  tcase_add_test(tc, test_two_routers);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
