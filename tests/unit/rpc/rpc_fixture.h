/* Shared fixture for the k3_rpc tests: one uv loop running an in-process server (test methods
 * below + health) on 127.0.0.1:0 and a client, both on the test thread. Each Check test runs
 * in a forked child, so grpc_init happens there (P18).
 *
 * Test methods (behaviour chosen by request_id):
 *   /k3test.T/Unary  ReserveRequest -> Reservation: validates, echoes request_id (or the
 *                    x-request-id metadata), epoch = 2 * n_prompt_tokens; "slow" never answers
 *                    until cancelled; "big" returns a 5 MiB descriptor.
 *   /k3test.T/Stream AttachRequest -> stream AttachResponse {first_index = i, token_ids = [i]}:
 *                    "burst" queues stop.max_new_tokens messages at once; "paced" writes one per
 *                    ms; "endless" writes one per ms until cancelled. */
#ifndef K3PD_TEST_RPC_FIXTURE_H
#define K3PD_TEST_RPC_FIXTURE_H

#include <check.h>
#include <string.h>

#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/v1/decode.pb-c.h"

typedef struct {
  uv_loop_t loop;
  uv_timer_t tick;
  k3_rpc_server_t *srv;
  k3_rpc_client_t *cli;
  int port;
  char target[64];
  int server_cancels;    /* cancel callbacks seen by test handlers */
  int srv_done, cli_done;
  int64_t slow_deadline_left_ms; /* k3_rpc_call_deadline_left_ms seen by the "slow" handler */
} fx_t;

extern fx_t F;

void fx_setup(void);
void fx_setup_opts(const k3_rpc_server_opts_t *so);
void fx_teardown(void);
/* Runs the loop until *flag is non-zero or timeout_ms passes; returns *flag. */
int fx_run_until(volatile int *flag, int timeout_ms);
/* Runs the loop until a >= want. */
int fx_run_until_ge(volatile int *a, int want, int timeout_ms);

/* A recorded client call. */
typedef struct {
  int done;
  int code;
  char details[256];
  int n_msgs;
  int in_order;         /* stream: every first_index == arrival index */
  int cancel_after;     /* stream: cancel the call after this many messages (0 = never) */
  k3_rpc_ccall_t *handle;
  /* unary result */
  char resp_id[64];
  uint64_t epoch;
  size_t descriptor_len;
  int descriptor_ok;
  int health_status[16];  /* health Watch: statuses received */
} rec_t;

void rec_unary_cb(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp);
void rec_stream_msg(void *arg, const ProtobufCMessage *msg);
void rec_done(void *arg, const k3_rpc_status_t *st);

int fx_unary(const char *request_id, uint32_t n_prompt, uint32_t timeout_ms, const char *md_rid,
             rec_t *r);
int fx_stream(const char *mode, uint32_t count, uint32_t timeout_ms, rec_t *r);

#endif
