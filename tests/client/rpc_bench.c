/* Two-process k3_rpc figures: a k3_rpc client (its own process and uv loop) against
 * rpc_test_server. Prints unary latency p50/p90/p99 and back-to-back stream throughput, the
 * numbers C-STACK.md §3 quotes for pattern A + hybrid (93 us unary p50, 141k msgs/s).
 * Run by interop.py so the figure shows in the test log; exits non-zero on any RPC error.
 * Usage: rpc_bench TARGET [unary_calls] [stream_msgs] */
#include <stdio.h>
#include <stdlib.h>

#include "k3pd/rpc_client.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"

typedef struct {
  int done, code, n;
} rec_t;

static uv_loop_t *L;

static void unary_cb(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rec_t *r = arg;
  r->code = st->code;
  r->done = 1;
}
static void msg_cb(void *arg, const ProtobufCMessage *m) { ((rec_t *)arg)->n++; }
static void done_cb(void *arg, const k3_rpc_status_t *st) {
  rec_t *r = arg;
  r->code = st->code;
  r->done = 1;
}
static void noop(uv_timer_t *t) { (void)t; }

static int run_until(volatile int *flag, int ms) {
  uint64_t end = k3_now_ns() + (uint64_t)ms * 1000000ull;
  while (!*flag && k3_now_ns() < end) uv_run(L, UV_RUN_ONCE);
  return *flag;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: rpc_bench TARGET [unary_calls] [stream_msgs]\n");
    return 2;
  }
  const char *target = argv[1];
  int n_unary = argc > 2 ? atoi(argv[2]) : 2000;
  int n_stream = argc > 3 ? atoi(argv[3]) : 10000;
  if (n_unary < 1 || n_stream < 1) return 2;
  L = uv_default_loop();
  uv_timer_t tick;
  uv_timer_init(L, &tick);
  uv_timer_start(&tick, noop, 5, 5);
  k3_rpc_client_t *cli;
  if (k3_rpc_client_init(L, NULL, &cli)) return 1;
  K3pd__V1__ReserveRequest rq = K3PD__V1__RESERVE_REQUEST__INIT;
  rq.request_id = "bench";
  rq.n_prompt_tokens = 8;
  rq.max_new_tokens = rq.lease_ms = 1;
  uint64_t *lat = calloc((size_t)n_unary, sizeof *lat);
  if (!lat) return 1;
  k3_rpc_call_opts_t o = {.timeout_ms = 5000};
  int rc = 0;
  for (int i = 0; i < n_unary && !rc; i++) {
    rec_t r = {0};
    uint64_t t0 = k3_now_ns();
    if (k3_rpc_unary(cli, target, "/k3pd.v1.Decode/Reserve", &rq.base,
                     &k3pd__v1__reservation__descriptor, &o, unary_cb, &r, NULL) ||
        !run_until(&r.done, 6000) || r.code != K3_RPC_OK)
      rc = 1;
    lat[i] = k3_now_ns() - t0;
  }
  if (!rc) {
    qsort(lat, (size_t)n_unary, sizeof *lat, cmp_u64);
    printf("rpc_bench: unary p50 %.1f us, p90 %.1f us, p99 %.1f us over %d calls\n",
           lat[n_unary / 2] / 1e3, lat[n_unary * 9 / 10] / 1e3, lat[n_unary * 99 / 100] / 1e3, n_unary);
  }
  free(lat);
  if (!rc) {
    K3pd__V1__AttachRequest aq = K3PD__V1__ATTACH_REQUEST__INIT;
    K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
    stop.max_new_tokens = (uint32_t)n_stream;
    aq.request_id = "bench";
    aq.stop = &stop;
    k3_rpc_call_opts_t so = {.timeout_ms = 20000};
    rec_t r = {0};
    uint64_t t0 = k3_now_ns();
    if (k3_rpc_stream(cli, target, "/k3pd.v1.Decode/Attach", &aq.base,
                      &k3pd__v1__attach_response__descriptor, &so, msg_cb, done_cb, &r, NULL) ||
        !run_until(&r.done, 21000) || r.code != K3_RPC_OK || r.n != n_stream) {
      rc = 1;
    } else {
      double s = (k3_now_ns() - t0) / 1e9;
      printf("rpc_bench: stream %d msgs in %.3f s = %.0f msgs/s\n", n_stream, s, n_stream / s);
    }
  }
  k3_rpc_client_close(cli, NULL, NULL);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(L, UV_RUN_DEFAULT); /* returns once the client's bridge and the tick are closed */
  if (uv_loop_close(L) != 0) rc = 1;
  if (rc) fprintf(stderr, "rpc_bench: an RPC failed\n");
  return rc;
}
