/* Fixture implementation for the k3_rpc tests (see rpc_fixture.h). */
#include "rpc_fixture.h"

#include <stdlib.h>

#include "k3pd/err.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"

fx_t F;

#define BIG_BYTES (5u << 20)

static void noop_tick(uv_timer_t *t) { (void)t; }

int fx_run_until(volatile int *flag, int timeout_ms) {
  uint64_t end = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (!*flag && k3_now_ns() < end) uv_run(&F.loop, UV_RUN_ONCE);
  return *flag;
}

int fx_run_until_ge(volatile int *a, int want, int timeout_ms) {
  uint64_t end = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (*a < want && k3_now_ns() < end) uv_run(&F.loop, UV_RUN_ONCE);
  return *a >= want;
}

/* ---- server side ---- */

static void slow_cancelled(k3_rpc_call_t *call, void *arg) {
  F.server_cancels++;
  k3_rpc_call_finish(call, K3_RPC_CANCELLED, NULL);
}

static void unary_handler(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  const K3pd__V1__ReserveRequest *r = (const void *)req;
  if (strcmp(r->request_id, "slow") == 0) {
    k3_rpc_call_set_cancel_cb(call, slow_cancelled, NULL);
    F.slow_deadline_left_ms = k3_rpc_call_deadline_left_ms(call);
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
  uint8_t *big = NULL;
  if (strcmp(r->request_id, "big") == 0) {
    big = malloc(BIG_BYTES);
    ck_assert_ptr_nonnull(big);
    for (uint32_t i = 0; i < BIG_BYTES; i++) big[i] = (uint8_t)(i * 31u);
    resp.descriptor.data = big;
    resp.descriptor.len = BIG_BYTES;
  }
  ck_assert_int_eq(k3_rpc_call_reply(call, &resp.base), 0);
  free(big); /* reply packed it already */
}

typedef struct {
  uv_timer_t timer;
  k3_rpc_call_t *call;
  uint32_t i, count;
  int endless, finished;
} pacer_t;

static void pacer_closed(uv_handle_t *h) { free(h->data); }

static void pacer_end(pacer_t *p) {
  p->finished = 1;
  uv_timer_stop(&p->timer);
  uv_close((uv_handle_t *)&p->timer, pacer_closed);
}

static int write_index(k3_rpc_call_t *call, uint32_t i) {
  K3pd__V1__AttachResponse m = K3PD__V1__ATTACH_RESPONSE__INIT;
  uint32_t id = i;
  m.first_index = i;
  m.token_ids = &id;
  m.n_token_ids = 1;
  return k3_rpc_call_write(call, &m.base);
}

static void pacer_cancelled(k3_rpc_call_t *call, void *arg) {
  pacer_t *p = arg;
  F.server_cancels++;
  k3_rpc_call_finish(call, K3_RPC_CANCELLED, NULL);
  pacer_end(p);
}

static void pacer_tick(uv_timer_t *t) {
  pacer_t *p = t->data;
  if (p->finished) return;
  if (write_index(p->call, p->i) != 0) return; /* cancelled: the cancel callback ends it */
  p->i++;
  if (!p->endless && p->i == p->count) {
    k3_rpc_call_finish(p->call, K3_RPC_OK, NULL);
    pacer_end(p);
  }
}

static void stream_handler(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  const K3pd__V1__AttachRequest *r = (const void *)req;
  uint32_t count = r->stop ? r->stop->max_new_tokens : 0;
  if (strcmp(r->request_id, "burst") == 0) {
    for (uint32_t i = 0; i < count; i++) ck_assert_int_eq(write_index(call, i), 0);
    k3_rpc_call_finish(call, K3_RPC_OK, NULL);
    return;
  }
  pacer_t *p = calloc(1, sizeof *p);
  ck_assert_ptr_nonnull(p);
  p->call = call;
  p->count = count;
  p->endless = strcmp(r->request_id, "endless") == 0;
  uv_timer_init(&F.loop, &p->timer);
  p->timer.data = p;
  k3_rpc_call_set_cancel_cb(call, pacer_cancelled, p);
  uv_timer_start(&p->timer, pacer_tick, 1, 1);
}

void fx_setup_opts(const k3_rpc_server_opts_t *so) {
  memset(&F, 0, sizeof F);
  ck_assert_int_eq(uv_loop_init(&F.loop), 0);
  /* A repeating tick keeps UV_RUN_ONCE from blocking past a test's deadline. */
  uv_timer_init(&F.loop, &F.tick);
  uv_timer_start(&F.tick, noop_tick, 5, 5);
  ck_assert_int_eq(k3_rpc_server_init(&F.loop, so, &F.srv), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(F.srv, "/k3test.T/Unary", K3_RPC_UNARY,
                                            &k3pd__v1__reserve_request__descriptor, unary_handler, NULL), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(F.srv, "/k3test.T/Stream", K3_RPC_SERVER_STREAM,
                                            &k3pd__v1__attach_request__descriptor, stream_handler, NULL), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(F.srv, "/k3test.T/Unary", K3_RPC_UNARY,
                                            &k3pd__v1__reserve_request__descriptor, unary_handler, NULL),
                   K3_EEXIST);
  ck_assert_int_eq(k3_rpc_server_start(F.srv, "127.0.0.1:0", &F.port), 0);
  ck_assert_int_gt(F.port, 0);
  snprintf(F.target, sizeof F.target, "127.0.0.1:%d", F.port);
  ck_assert_int_eq(k3_rpc_client_init(&F.loop, NULL, &F.cli), 0);
}

void fx_setup(void) {
  /* A short grace so the shutdown test sees cancel-all well inside its time budget. */
  k3_rpc_server_opts_t so = {.grace_ms = 300};
  fx_setup_opts(&so);
}

static void set_flag(void *arg) { *(int *)arg = 1; }

void fx_teardown(void) {
  if (F.cli) k3_rpc_client_close(F.cli, set_flag, &F.cli_done);
  if (F.srv) k3_rpc_server_shutdown(F.srv, set_flag, &F.srv_done);
  if (!F.cli) F.cli_done = 1;
  if (!F.srv) F.srv_done = 1;
  ck_assert(fx_run_until(&F.cli_done, 5000));
  ck_assert(fx_run_until(&F.srv_done, 10000));
  uv_close((uv_handle_t *)&F.tick, NULL);
  uv_run(&F.loop, UV_RUN_DEFAULT);
  /* Every handle (async, timers) was closed: a leak here fails the test. */
  ck_assert_int_eq(uv_loop_close(&F.loop), 0);
}

/* ---- client side ---- */

void rec_unary_cb(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rec_t *r = arg;
  r->code = st->code;
  snprintf(r->details, sizeof r->details, "%s", st->details);
  if (resp) {
    const K3pd__V1__Reservation *m = (const void *)resp;
    snprintf(r->resp_id, sizeof r->resp_id, "%s", m->request_id);
    r->epoch = m->epoch;
    r->descriptor_len = m->descriptor.len;
    r->descriptor_ok = 1;
    for (size_t i = 0; i < m->descriptor.len; i++)
      if (m->descriptor.data[i] != (uint8_t)(i * 31u)) r->descriptor_ok = 0;
  }
  r->done = 1;
}

void rec_stream_msg(void *arg, const ProtobufCMessage *msg) {
  rec_t *r = arg;
  const K3pd__V1__AttachResponse *m = (const void *)msg;
  if (m->first_index != (uint32_t)r->n_msgs || m->n_token_ids != 1 || m->token_ids[0] != m->first_index)
    r->in_order = 0;
  r->n_msgs++;
  if (r->cancel_after && r->n_msgs == r->cancel_after) k3_rpc_ccall_cancel(r->handle);
}

void rec_done(void *arg, const k3_rpc_status_t *st) {
  rec_t *r = arg;
  r->code = st->code;
  snprintf(r->details, sizeof r->details, "%s", st->details);
  r->done = 1;
}

int fx_unary(const char *request_id, uint32_t n_prompt, uint32_t timeout_ms, const char *md_rid,
             rec_t *r) {
  K3pd__V1__ReserveRequest req = K3PD__V1__RESERVE_REQUEST__INIT;
  req.request_id = (char *)request_id;
  req.n_prompt_tokens = n_prompt;
  req.max_new_tokens = 4;
  req.lease_ms = 1000;
  k3_rpc_call_opts_t o = {.timeout_ms = timeout_ms, .request_id = md_rid};
  return k3_rpc_unary(F.cli, F.target, "/k3test.T/Unary", &req.base, &k3pd__v1__reservation__descriptor,
                      &o, rec_unary_cb, r, &r->handle);
}

int fx_stream(const char *mode, uint32_t count, uint32_t timeout_ms, rec_t *r) {
  K3pd__V1__AttachRequest req = K3PD__V1__ATTACH_REQUEST__INIT;
  K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
  stop.max_new_tokens = count;
  req.request_id = (char *)mode;
  req.stop = &stop;
  r->in_order = 1;
  k3_rpc_call_opts_t o = {.timeout_ms = timeout_ms};
  return k3_rpc_stream(F.cli, F.target, "/k3test.T/Stream", &req.base,
                       &k3pd__v1__attach_response__descriptor, &o, rec_stream_msg, rec_done, r,
                       &r->handle);
}
