/* The shared completion-queue bridge (common/rpc/rpc_internal.h): every server and client of a
 * uv loop is an owner of ONE bridge (one CQ, one drain thread). Owners leave in any order: a
 * second server shuts down while the first keeps serving; a second client comes and goes; the
 * first server shuts down while the client lives on; the last owner's leave closes the bridge
 * (the fixture's teardown checks that uv_loop_close finds no handle left), and an owner created
 * while the old bridge is still shutting down gets a fresh one. Under ASan nothing leaks. */
#include <stdio.h>
#include <stdlib.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "rpc_fixture.h"
#include "rpc_internal.h"

static void set_flag(void *arg) { *(int *)arg = 1; }

/* Servers and clients embed their rpc_owner_t first (server.c, client.c). */
static rpc_bridge_t *bridge_of(void *owner) { return ((rpc_owner_t *)owner)->br; }

/* The second server's Unary: epoch 7, so an answer shows which server gave it. */
static void unary7(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  (void)req;
  (void)user;
  K3pd__V1__Reservation resp = K3PD__V1__RESERVATION__INIT;
  resp.request_id = "s2";
  resp.epoch = 7;
  ck_assert_int_eq(k3_rpc_call_reply(call, &resp.base), 0);
}

static int unary_to(k3_rpc_client_t *cli, const char *target, const char *rid, uint32_t timeout_ms, rec_t *r) {
  K3pd__V1__ReserveRequest req = K3PD__V1__RESERVE_REQUEST__INIT;
  req.request_id = (char *)rid;
  req.n_prompt_tokens = 3;
  req.max_new_tokens = 4;
  req.lease_ms = 1000;
  k3_rpc_call_opts_t o = {.timeout_ms = timeout_ms};
  return k3_rpc_unary(cli, target, "/k3test.T/Unary", &req.base, &k3pd__v1__reservation__descriptor, &o,
                      rec_unary_cb, r, &r->handle);
}

/* Serves one unary call on F.srv through F.cli and checks the answer. */
static void check_first_serves(const char *rid) {
  rec_t r = {0};
  ck_assert_int_eq(unary_to(F.cli, F.target, rid, 5000, &r), 0);
  ck_assert(fx_run_until(&r.done, 5000));
  ck_assert_int_eq(r.code, K3_RPC_OK);
  ck_assert_str_eq(r.resp_id, rid);
  ck_assert_uint_eq(r.epoch, 6);
}

START_TEST(test_owners_leave_in_any_order) {
  rpc_bridge_t *b = bridge_of(F.srv);
  ck_assert_ptr_eq(bridge_of(F.cli), b);
  ck_assert_int_eq(b->owners, 2);

  /* A second server on the same loop joins the same bridge and serves. */
  k3_rpc_server_t *s2 = NULL;
  k3_rpc_server_opts_t so = {.grace_ms = 300};
  ck_assert_int_eq(k3_rpc_server_init(&F.loop, &so, &s2), 0);
  ck_assert_ptr_eq(bridge_of(s2), b);
  ck_assert_int_eq(k3_rpc_server_add_method(s2, "/k3test.T/Unary", K3_RPC_UNARY,
                                            &k3pd__v1__reserve_request__descriptor, unary7, NULL), 0);
  int port2 = 0;
  ck_assert_int_eq(k3_rpc_server_start(s2, "127.0.0.1:0", &port2), 0);
  char target2[64];
  snprintf(target2, sizeof target2, "127.0.0.1:%d", port2);
  ck_assert_int_eq(b->owners, 3);
  rec_t r2 = {0};
  ck_assert_int_eq(unary_to(F.cli, target2, "x", 5000, &r2), 0);
  ck_assert(fx_run_until(&r2.done, 5000));
  ck_assert_int_eq(r2.code, K3_RPC_OK);
  ck_assert_uint_eq(r2.epoch, 7);
  check_first_serves("a");

  /* The second server shuts down while the first is streaming: the stream is untouched. */
  rec_t st = {0};
  ck_assert_int_eq(fx_stream("paced", 200, 10000, &st), 0);
  ck_assert(fx_run_until_ge(&st.n_msgs, 3, 5000));
  int s2_done = 0;
  k3_rpc_server_shutdown(s2, set_flag, &s2_done);
  ck_assert(fx_run_until(&s2_done, 5000));
  ck_assert_int_eq(b->owners, 2);
  ck_assert(!st.done);
  check_first_serves("b");
  rec_t gone = {0};
  ck_assert_int_eq(unary_to(F.cli, target2, "y", 2000, &gone), 0);
  ck_assert(fx_run_until(&gone.done, 5000));
  ck_assert_int_eq(gone.code, K3_RPC_UNAVAILABLE);

  /* A second client comes and goes, with a call still running when it closes. */
  k3_rpc_client_t *c2 = NULL;
  ck_assert_int_eq(k3_rpc_client_init(&F.loop, NULL, &c2), 0);
  ck_assert_ptr_eq(bridge_of(c2), b);
  ck_assert_int_eq(b->owners, 3);
  rec_t r3 = {0}, slow = {0};
  ck_assert_int_eq(unary_to(c2, F.target, "c", 5000, &r3), 0);
  ck_assert(fx_run_until(&r3.done, 5000));
  ck_assert_int_eq(r3.code, K3_RPC_OK);
  ck_assert_int_eq(unary_to(c2, F.target, "slow", 10000, &slow), 0);
  int c2_done = 0;
  k3_rpc_client_close(c2, set_flag, &c2_done);
  ck_assert(!c2_done); /* close's done never runs inside close */
  ck_assert(fx_run_until(&c2_done, 5000));
  ck_assert(slow.done);
  ck_assert_int_eq(slow.code, K3_RPC_CANCELLED);
  ck_assert_int_eq(b->owners, 2);

  ck_assert(fx_run_until(&st.done, 10000));
  ck_assert_int_eq(st.code, K3_RPC_OK);
  ck_assert_int_eq(st.n_msgs, 200);
  ck_assert(st.in_order);

  /* The first server leaves before the client; the client keeps working (its calls fail). */
  k3_rpc_server_t *s1 = F.srv;
  F.srv = NULL;
  k3_rpc_server_shutdown(s1, set_flag, &F.srv_done);
  ck_assert(fx_run_until(&F.srv_done, 5000));
  ck_assert_int_eq(b->owners, 1);
  rec_t after = {0};
  ck_assert_int_eq(unary_to(F.cli, F.target, "d", 2000, &after), 0);
  ck_assert(fx_run_until(&after.done, 5000));
  ck_assert_int_eq(after.code, K3_RPC_UNAVAILABLE);

  /* The last owner leaves; a client created before the old bridge finished closing gets a new
   * bridge, works (a refused connection answers UNAVAILABLE) and closes too. The fixture's
   * teardown then checks that no handle is left on the loop. */
  k3_rpc_client_t *c1 = F.cli;
  F.cli = NULL;
  k3_rpc_client_close(c1, set_flag, &F.cli_done);
  k3_rpc_client_t *c3 = NULL;
  ck_assert_int_eq(k3_rpc_client_init(&F.loop, NULL, &c3), 0);
  ck_assert_int_eq(bridge_of(c3)->owners, 1);
  rec_t r4 = {0};
  ck_assert_int_eq(unary_to(c3, F.target, "e", 2000, &r4), 0);
  ck_assert(fx_run_until(&F.cli_done, 5000));
  ck_assert(fx_run_until(&r4.done, 5000));
  ck_assert_int_eq(r4.code, K3_RPC_UNAVAILABLE);
  int c3_done = 0;
  k3_rpc_client_close(c3, set_flag, &c3_done);
  ck_assert(fx_run_until(&c3_done, 5000));
}
END_TEST

START_TEST(test_server_never_started) {
  /* A server that never starts leaves at once on shutdown; the others are not disturbed. */
  k3_rpc_server_t *s2 = NULL;
  ck_assert_int_eq(k3_rpc_server_init(&F.loop, NULL, &s2), 0);
  ck_assert_int_eq(bridge_of(F.cli)->owners, 3);
  int s2_done = 0;
  k3_rpc_server_shutdown(s2, set_flag, &s2_done);
  ck_assert(!s2_done);
  ck_assert(fx_run_until(&s2_done, 5000));
  ck_assert_int_eq(bridge_of(F.cli)->owners, 2);
  check_first_serves("f");
}
END_TEST

Suite *bridge_suite(void);
Suite *bridge_suite(void) {
  Suite *s = suite_create("rpc_bridge");
  TCase *tc = tcase_create("bridge");
  tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_owners_leave_in_any_order);
  tcase_add_test(tc, test_server_never_started);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(bridge_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
