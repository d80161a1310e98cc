/* k3_rpc server + client on one uv loop, port 0, in the forked Check child (P18): unary,
 * metadata, 10k-message stream (throughput printed), deadline, client cancel, invalid argument,
 * unknown method, garbage payload, message size limits, 64 concurrent streams, graceful
 * shutdown with streams in flight, health Check/Watch transitions. */
#include <stdio.h>
#include <stdlib.h>

#include "grpc/health/v1/health.pb-c.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/v1/common.pb-c.h"
#include "rpc_fixture.h"

static void set_flag(void *arg) { *(int *)arg = 1; }

START_TEST(test_unary_roundtrip) {
  rec_t r = {0}, r2 = {0};
  ck_assert_int_eq(fx_unary("req-1", 21, 5000, NULL, &r), 0);
  ck_assert_int_eq(fx_unary("req-2", 5, 5000, "trace-77", &r2), 0);
  ck_assert(fx_run_until(&r.done, 5000));
  ck_assert(fx_run_until(&r2.done, 5000));
  ck_assert_int_eq(r.code, K3_RPC_OK);
  ck_assert_str_eq(r.resp_id, "req-1");
  ck_assert_uint_eq(r.epoch, 42);
  ck_assert_int_eq(r2.code, K3_RPC_OK);
  ck_assert_str_eq(r2.resp_id, "trace-77"); /* x-request-id metadata reached the handler */
  ck_assert_uint_eq(r2.epoch, 10);
  ck_assert_uint_eq(k3_rpc_client_live_calls(F.cli), 0);
  /* Sequential latency over the cached channel. */
  int n = 2000;
  uint64_t t0 = k3_now_ns();
  for (int i = 0; i < n; i++) {
    rec_t x = {0};
    ck_assert_int_eq(fx_unary("lat", 1, 5000, NULL, &x), 0);
    ck_assert(fx_run_until(&x.done, 5000));
    ck_assert_int_eq(x.code, K3_RPC_OK);
  }
  double us = (double)(k3_now_ns() - t0) / 1e3 / n;
  printf("rpc: unary round trip (client+server on one loop): %.1f us/call mean over %d\n", us, n);
}
END_TEST

START_TEST(test_stream_10k) {
  rec_t r = {0};
  uint64_t t0 = k3_now_ns();
  ck_assert_int_eq(fx_stream("burst", 10000, 20000, &r), 0);
  ck_assert(fx_run_until(&r.done, 20000));
  double s = (double)(k3_now_ns() - t0) / 1e9;
  ck_assert_int_eq(r.code, K3_RPC_OK);
  ck_assert_int_eq(r.n_msgs, 10000);
  ck_assert(r.in_order);
  printf("rpc: stream of 10000 messages in %.3f s = %.0f msgs/s (C-STACK hybrid figure: 141k, "
         "client and server in separate processes)\n", s, 10000 / s);
}
END_TEST

START_TEST(test_deadline_exceeded) {
  rec_t r = {0};
  uint64_t t0 = k3_now_ns();
  ck_assert_int_eq(fx_unary("slow", 1, 150, NULL, &r), 0);
  ck_assert(fx_run_until(&r.done, 5000));
  double ms = (double)(k3_now_ns() - t0) / 1e6;
  ck_assert_int_eq(r.code, K3_RPC_DEADLINE_EXCEEDED);
  /* lower bound: the deadline is not early; upper bound generous (loaded CI machines, ASan) */
  ck_assert(ms >= 140 && ms < 10000);
  /* The server side saw the deadline as a cancellation. */
  ck_assert(fx_run_until_ge(&F.server_cancels, 1, 5000));
  /* The handler saw the client's deadline (150 ms minus transit). */
  ck_assert(F.slow_deadline_left_ms > 50 && F.slow_deadline_left_ms <= 150);
}
END_TEST

START_TEST(test_client_cancel) {
  rec_t r = {0};
  r.cancel_after = 20;
  ck_assert_int_eq(fx_stream("endless", 0, 10000, &r), 0);
  ck_assert(fx_run_until(&r.done, 5000));
  ck_assert_int_eq(r.code, K3_RPC_CANCELLED);
  ck_assert_int_eq(r.n_msgs, 20); /* nothing delivered after cancel */
  ck_assert(fx_run_until_ge(&F.server_cancels, 1, 5000));
  /* The server released the call. */
  for (int i = 0; i < 200 && k3_rpc_server_live_calls(F.srv) > 0; i++) uv_run(&F.loop, UV_RUN_ONCE);
  ck_assert_uint_eq(k3_rpc_server_live_calls(F.srv), 0);
}
END_TEST

START_TEST(test_invalid_argument) {
  rec_t r = {0};
  ck_assert_int_eq(fx_unary("bad", 0, 5000, NULL, &r), 0);
  ck_assert(fx_run_until(&r.done, 5000));
  ck_assert_int_eq(r.code, K3_RPC_INVALID_ARGUMENT);
  ck_assert_str_eq(r.details, "n_prompt_tokens: must be >= 1");
}
END_TEST

static void raw_unary(const char *method, const ProtobufCMessage *req, rec_t *r) {
  k3_rpc_call_opts_t o = {.timeout_ms = 5000};
  ck_assert_int_eq(k3_rpc_unary(F.cli, F.target, method, req, &k3pd__v1__reservation__descriptor, &o,
                                rec_unary_cb, r, NULL), 0);
  ck_assert(fx_run_until(&r->done, 5000));
}

START_TEST(test_unknown_method_and_garbage) {
  K3pd__V1__ReserveRequest req = K3PD__V1__RESERVE_REQUEST__INIT;
  rec_t r = {0};
  raw_unary("/k3test.T/Nope", &req.base, &r);
  ck_assert_int_eq(r.code, K3_RPC_UNIMPLEMENTED);
  /* Usage has field 1 as a varint; ReserveRequest field 1 is a string: the bytes do not parse. */
  K3pd__V1__Usage u = K3PD__V1__USAGE__INIT;
  u.prompt_tokens = 5;
  rec_t g = {0};
  raw_unary("/k3test.T/Unary", &u.base, &g);
  ck_assert_int_eq(g.code, K3_RPC_INVALID_ARGUMENT);
  ck_assert_str_eq(g.details, "request: not a valid k3pd.v1.ReserveRequest message");
  /* Start-time argument errors never call back. */
  ck_assert_int_eq(k3_rpc_unary(F.cli, F.target, "no-slash", &req.base, &k3pd__v1__reservation__descriptor,
                                NULL, rec_unary_cb, &r, NULL), K3_EINVAL);
}
END_TEST

START_TEST(test_large_message) {
  rec_t r = {0};
  ck_assert_int_eq(fx_unary("big", 1, 10000, NULL, &r), 0);
  ck_assert(fx_run_until(&r.done, 10000));
  ck_assert_int_eq(r.code, K3_RPC_OK);
  ck_assert_uint_eq(r.descriptor_len, 5u << 20);
  ck_assert(r.descriptor_ok);
  /* A client with gRPC's usual 4 MiB receive limit rejects it (P5). */
  k3_rpc_client_t *small;
  k3_rpc_client_opts_t o = {.max_msg_bytes = 4u << 20};
  ck_assert_int_eq(k3_rpc_client_init(&F.loop, &o, &small), 0);
  K3pd__V1__ReserveRequest req = K3PD__V1__RESERVE_REQUEST__INIT;
  req.request_id = "big";
  req.n_prompt_tokens = req.max_new_tokens = req.lease_ms = 1;
  rec_t s = {0};
  ck_assert_int_eq(k3_rpc_unary(small, F.target, "/k3test.T/Unary", &req.base,
                                &k3pd__v1__reservation__descriptor, NULL, rec_unary_cb, &s, NULL), 0);
  ck_assert(fx_run_until(&s.done, 10000));
  ck_assert_int_eq(s.code, K3_RPC_RESOURCE_EXHAUSTED);
  k3_rpc_client_close(small, NULL, NULL); /* freed on the loop during teardown */
}
END_TEST

START_TEST(test_many_concurrent) {
  enum { N = 64, MSGS = 200 };
  rec_t *r = calloc(2 * N, sizeof *r);
  ck_assert_ptr_nonnull(r);
  for (int i = 0; i < N; i++) {
    ck_assert_int_eq(fx_stream(i % 2 ? "burst" : "paced", MSGS, 20000, &r[i]), 0);
    ck_assert_int_eq(fx_unary("conc", (uint32_t)i + 1, 20000, NULL, &r[N + i]), 0);
  }
  ck_assert_uint_eq(k3_rpc_client_live_calls(F.cli), 2 * N);
  for (int i = 0; i < 2 * N; i++) ck_assert(fx_run_until(&r[i].done, 20000));
  for (int i = 0; i < N; i++) {
    ck_assert_int_eq(r[i].code, K3_RPC_OK);
    ck_assert_int_eq(r[i].n_msgs, MSGS);
    ck_assert(r[i].in_order);
    ck_assert_int_eq(r[N + i].code, K3_RPC_OK);
    ck_assert_uint_eq(r[N + i].epoch, 2u * (i + 1));
  }
  ck_assert_uint_eq(k3_rpc_client_live_calls(F.cli), 0);
  free(r);
}
END_TEST

START_TEST(test_graceful_shutdown) {
  /* "paced" 40 messages (~40-80 ms) finishes inside the 300 ms grace; "endless" does not and
   * is cancelled by cancel-all: the client sees UNAVAILABLE (C-STACK §2). Calls started after
   * shutdown began are never served (UNAVAILABLE or CANCELLED, see below). */
  rec_t fin = {0}, endless = {0}, late = {0};
  ck_assert_int_eq(fx_stream("paced", 40, 10000, &fin), 0);
  ck_assert_int_eq(fx_stream("endless", 0, 10000, &endless), 0);
  ck_assert(fx_run_until_ge(&endless.n_msgs, 3, 5000));
  k3_rpc_server_t *srv = F.srv;
  F.srv = NULL;
  uint64_t t0 = k3_now_ns();
  k3_rpc_server_shutdown(srv, set_flag, &F.srv_done);
  ck_assert_int_eq(fx_unary("late", 1, 2000, NULL, &late), 0);
  ck_assert(fx_run_until(&fin.done, 5000));
  ck_assert_int_eq(fin.code, K3_RPC_OK);
  ck_assert_int_eq(fin.n_msgs, 40);
  ck_assert(fx_run_until(&endless.done, 5000));
  double ms = (double)(k3_now_ns() - t0) / 1e6;
  ck_assert_int_eq(endless.code, K3_RPC_UNAVAILABLE);
  ck_assert(ms >= 250); /* not before the grace period ran out */
  ck_assert(fx_run_until(&late.done, 5000));
  /* A call racing the GOAWAY either is refused (UNAVAILABLE) or lands on the old connection
   * after the server stopped requesting calls and is cancelled by cancel-all (CANCELLED).
   * Both are fine for a client; it must never be served. */
  ck_assert_msg(late.code == K3_RPC_UNAVAILABLE || late.code == K3_RPC_CANCELLED, "late call got %d",
                late.code);
  ck_assert(fx_run_until(&F.srv_done, 5000));
  ck_assert_int_eq(F.server_cancels, 1);
}
END_TEST

START_TEST(test_client_close_in_flight) {
  /* Closing a client cancels its calls: each final callback runs once with CANCELLED, the
   * server sees both cancellations, and close's done runs after them. */
  rec_t st = {0}, un = {0};
  ck_assert_int_eq(fx_stream("endless", 0, 10000, &st), 0);
  ck_assert_int_eq(fx_unary("slow", 1, 10000, NULL, &un), 0);
  ck_assert(fx_run_until_ge(&st.n_msgs, 3, 5000));
  k3_rpc_client_t *cli = F.cli;
  F.cli = NULL;
  k3_rpc_client_close(cli, set_flag, &F.cli_done);
  ck_assert(fx_run_until(&F.cli_done, 5000));
  ck_assert(st.done && un.done);
  ck_assert_int_eq(st.code, K3_RPC_CANCELLED);
  ck_assert_int_eq(un.code, K3_RPC_CANCELLED);
  ck_assert(fx_run_until_ge(&F.server_cancels, 2, 5000));
}
END_TEST

START_TEST(test_forget_channel) {
  rec_t a = {0}, b = {0};
  ck_assert_int_eq(fx_unary("one", 1, 5000, NULL, &a), 0);
  ck_assert(fx_run_until(&a.done, 5000));
  ck_assert_int_eq(k3_rpc_client_forget(F.cli, F.target), 0);
  ck_assert_int_eq(k3_rpc_client_forget(F.cli, F.target), K3_ENOENT);
  ck_assert_int_eq(fx_unary("two", 2, 5000, NULL, &b), 0); /* a fresh channel is made */
  ck_assert(fx_run_until(&b.done, 5000));
  ck_assert_int_eq(b.code, K3_RPC_OK);
  ck_assert_uint_eq(b.epoch, 4);
  /* An unreachable target fails fast with UNAVAILABLE. */
  K3pd__V1__ReserveRequest req = K3PD__V1__RESERVE_REQUEST__INIT;
  rec_t u = {0};
  ck_assert_int_eq(k3_rpc_unary(F.cli, "127.0.0.1:1", "/k3test.T/Unary", &req.base,
                                &k3pd__v1__reservation__descriptor, NULL, rec_unary_cb, &u, NULL), 0);
  ck_assert(fx_run_until(&u.done, 5000));
  ck_assert_int_eq(u.code, K3_RPC_UNAVAILABLE);
}
END_TEST

/* ---- health ---- */

static void health_cb(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rec_t *r = arg;
  r->code = st->code;
  if (resp) r->epoch = ((const Grpc__Health__V1__HealthCheckResponse *)(const void *)resp)->status;
  r->done = 1;
}

static int check_status(const char *svc, int *code) {
  rec_t r = {0};
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)svc;
  ck_assert_int_eq(k3_rpc_unary(F.cli, F.target, "/grpc.health.v1.Health/Check", &req.base,
                                &grpc__health__v1__health_check_response__descriptor, NULL,
                                health_cb, &r, NULL), 0);
  ck_assert(fx_run_until(&r.done, 5000));
  *code = r.code;
  return (int)r.epoch;
}

static void watch_msg(void *arg, const ProtobufCMessage *msg) {
  rec_t *r = arg;
  if (r->n_msgs < 16) r->health_status[r->n_msgs] = ((const Grpc__Health__V1__HealthCheckResponse *)(const void *)msg)->status;
  r->n_msgs++;
}

static void watch(const char *svc, rec_t *r) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)svc;
  k3_rpc_call_opts_t o = {.timeout_ms = 20000};
  ck_assert_int_eq(k3_rpc_stream(F.cli, F.target, "/grpc.health.v1.Health/Watch", &req.base,
                                 &grpc__health__v1__health_check_response__descriptor, &o, watch_msg,
                                 rec_done, r, NULL), 0);
}

#define HS(x) GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__##x

START_TEST(test_health) {
  int code;
  ck_assert_int_eq(check_status("", &code), HS(NOT_SERVING)); /* startup: not ready yet */
  ck_assert_int_eq(code, K3_RPC_OK);
  check_status("k3pd.v1.Decode", &code);
  ck_assert_int_eq(code, K3_RPC_NOT_FOUND);
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  ck_assert_int_eq(k3_rpc_unary(F.cli, F.target, "/grpc.health.v1.Health/Check", &hreq.base,
                                &grpc__health__v1__health_check_response__descriptor, NULL, NULL,
                                NULL, NULL), K3_EINVAL); /* a NULL callback is refused */
  rec_t w = {0}, wu = {0};
  watch("", &w);
  watch("k3pd.v1.Decode", &wu);
  ck_assert(fx_run_until_ge(&w.n_msgs, 1, 5000));
  ck_assert(fx_run_until_ge(&wu.n_msgs, 1, 5000));
  ck_assert_int_eq(w.health_status[0], HS(NOT_SERVING));
  ck_assert_int_eq(wu.health_status[0], HS(SERVICE_UNKNOWN));
  ck_assert_int_eq(k3_rpc_server_set_health(F.srv, "", K3_RPC_HEALTH_SERVING), 0);
  ck_assert_int_eq(k3_rpc_server_set_health(F.srv, "k3pd.v1.Decode", K3_RPC_HEALTH_SERVING), 0);
  ck_assert_int_eq(check_status("", &code), HS(SERVING));
  ck_assert_int_eq(check_status("k3pd.v1.Decode", &code), HS(SERVING));
  ck_assert(fx_run_until_ge(&w.n_msgs, 2, 5000));
  ck_assert(fx_run_until_ge(&wu.n_msgs, 2, 5000));
  ck_assert_int_eq(w.health_status[1], HS(SERVING));
  ck_assert_int_eq(wu.health_status[1], HS(SERVING));
  /* Setting the same status again sends nothing; drain flips it. */
  ck_assert_int_eq(k3_rpc_server_set_health(F.srv, "", K3_RPC_HEALTH_SERVING), 0);
  ck_assert_int_eq(k3_rpc_server_set_health(F.srv, "", K3_RPC_HEALTH_NOT_SERVING), 0);
  ck_assert(fx_run_until_ge(&w.n_msgs, 3, 5000));
  ck_assert_int_eq(w.n_msgs, 3);
  ck_assert_int_eq(w.health_status[2], HS(NOT_SERVING));
  ck_assert_int_eq(k3_rpc_server_set_health(F.srv, "", 7), K3_EINVAL);
  /* Shutdown: watchers get NOT_SERVING and then UNAVAILABLE. */
  k3_rpc_server_t *srv = F.srv;
  F.srv = NULL;
  k3_rpc_server_shutdown(srv, set_flag, &F.srv_done);
  ck_assert(fx_run_until(&wu.done, 5000));
  ck_assert(fx_run_until(&w.done, 5000));
  ck_assert_int_eq(wu.health_status[wu.n_msgs - 1], HS(NOT_SERVING));
  ck_assert_int_eq(wu.code, K3_RPC_UNAVAILABLE);
  ck_assert_int_eq(w.code, K3_RPC_UNAVAILABLE);
  ck_assert(fx_run_until(&F.srv_done, 5000));
}
END_TEST

START_TEST(test_codes) {
  ck_assert_int_eq(k3_rpc_code_from_err(0), K3_RPC_OK);
  ck_assert_int_eq(k3_rpc_code_from_err(K3_EINVAL), K3_RPC_INVALID_ARGUMENT);
  ck_assert_int_eq(k3_rpc_code_from_err(K3_ECAPACITY), K3_RPC_RESOURCE_EXHAUSTED);
  ck_assert_int_eq(k3_rpc_code_from_err(K3_EUNAVAIL), K3_RPC_UNAVAILABLE);
  ck_assert_int_eq(k3_rpc_code_from_err(K3_ETIMEDOUT), K3_RPC_DEADLINE_EXCEEDED);
  ck_assert_int_eq(k3_rpc_code_from_err(K3_ESTALE), K3_RPC_FAILED_PRECONDITION);
  ck_assert_int_eq(k3_rpc_code_from_err(K3_EIO), K3_RPC_INTERNAL);
  ck_assert_int_eq(k3_rpc_err_from_code(K3_RPC_RESOURCE_EXHAUSTED), K3_ECAPACITY);
  ck_assert_int_eq(k3_rpc_err_from_code(K3_RPC_OK), 0);
  ck_assert_str_eq(k3_rpc_code_name(K3_RPC_UNAVAILABLE), "UNAVAILABLE");
  ck_assert_str_eq(k3_rpc_code_name(99), "UNKNOWN_CODE");
}
END_TEST

Suite *rpc_suite(void);
Suite *rpc_suite(void) {
  Suite *s = suite_create("rpc");
  TCase *tc = tcase_create("rpc");
  tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_unary_roundtrip);
  tcase_add_test(tc, test_stream_10k);
  tcase_add_test(tc, test_deadline_exceeded);
  tcase_add_test(tc, test_client_cancel);
  tcase_add_test(tc, test_invalid_argument);
  tcase_add_test(tc, test_unknown_method_and_garbage);
  tcase_add_test(tc, test_large_message);
  tcase_add_test(tc, test_many_concurrent);
  tcase_add_test(tc, test_graceful_shutdown);
  tcase_add_test(tc, test_client_close_in_flight);
  tcase_add_test(tc, test_forget_channel);
  tcase_add_test(tc, test_health);
  suite_add_tcase(s, tc);
  TCase *tp = tcase_create("pure");
  tcase_add_test(tp, test_codes);
  suite_add_tcase(s, tp);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(rpc_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
