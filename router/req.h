/* k3pd-router: one Generate request (rt_req_t) and the functions its three files share:
 *   generate.c - intake: validation, tokenisation / chat rendering, placement, Reserve;
 *   flow.c     - the worker calls: Reserve → Prefill (with re-issue) ‖ Attach;
 *   req.c      - lifetime and output: relaying tokens to the client, finishing or failing the
 *                request, accounting (metrics + one log line), freeing.
 * Everything runs on the router's loop thread. A request is freed only when no call of ours is
 * in flight, the client call ended and no function up the stack still uses it (`busy`). */
#ifndef K3PD_ROUTER_REQ_H
#define K3PD_ROUTER_REQ_H

#include <stdbool.h>
#include <stdint.h>

#include "k3pd/detok.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/v1/common.pb-c.h"
#include "rt.h"

#define RT_MAX_EXCLUDE 8

typedef enum { RQ_RESERVING = 0, RQ_RUNNING, RQ_DONE } rq_phase_t;

typedef struct rt_req {
  struct rt_req *next;
  rt_router_t *rt;
  k3_rpc_call_t *call;    /* client's Generate; NULL once finished */
  char id[129];
  rq_phase_t phase;
  int32_t *prompt;
  size_t n_prompt;
  uint32_t max_new;
  K3pd__V1__SamplingParams sampling; /* seed always set */
  uint32_t *stop_ids;
  size_t n_stop_ids;
  char **stop_strs;
  size_t n_stop_strs;
  bool want_logprobs;
  /* placement */
  char decode_id[RT_ID_MAX], decode_addr[RT_ADDR_MAX];
  char prefill_id[RT_ID_MAX], prefill_addr[RT_ADDR_MAX];
  char excluded[RT_MAX_EXCLUDE][RT_ID_MAX];
  int n_excluded;
  int retries;            /* prefill re-issues so far (bounded by --prefill-retries) */
  int64_t pending_pages;  /* counted in the decode worker's in-flight total until the request ends */
  uint32_t decode_gen;    /* registration the in-flight count was added to */
  uint64_t epoch;
  uint8_t *desc;
  size_t desc_len;
  /* calls in flight */
  k3_rpc_ccall_t *reserve_call, *prefill_call, *attach_call;
  bool prefill_ok, attach_done, released;
  /* output */
  k3_detok_t *detok;
  uint32_t completion_tokens;
  int finish_reason;
  bool stopped_by_string;
  /* timings (k3_now_ns) */
  uint64_t t_arrive, t_reserved, t_prefill_start, t_prefill_done, t_first, t_end;
  uint64_t handoff_us;
  int64_t deadline_left_ms;
  int busy; /* > 0 while a function up the stack still uses the request: frees are deferred */
  uint64_t t_last_tok;   /* for inter-token latency */
  uint64_t router_ns;    /* time spent in this request's router handlers (added latency) */
  bool counted;          /* counted as an active stream */
} rt_req_t;

/* Time the router itself spends on a request, summed over its handlers. */
#define RT_TIMED_BEGIN uint64_t rt_t0_ = k3_now_ns()
#define RT_TIMED_END(q) ((q)->router_ns += k3_now_ns() - rt_t0_)

/* req.c */
uint32_t rt_req_timeout(rt_req_t *q); /* ms left of the client's deadline for a worker call (0 = none) */
void rt_req_free(rt_req_t *q);
void rt_req_maybe_free(rt_req_t *q);
void rt_req_release_decode(rt_req_t *q);
/* Release with epoch 0 (any epoch of this request_id): for a Reserve whose outcome is unknown
 * (cancelled, timed out or cut off after it was sent), when D may hold a reservation whose
 * epoch the router never learnt. Without it that reservation would stay until its lease. */
void rt_req_release_decode_any(rt_req_t *q);
void rt_req_abort_prefill(rt_req_t *q);
void rt_req_fail(rt_req_t *q, k3_rpc_code_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void rt_req_finish_ok(rt_req_t *q);
void rt_req_account_end(rt_req_t *q, k3_rpc_code_t code);
/* Relays tokens [first_index, first_index + n) of the completion; indices already sent are
 * skipped (the first token is forwarded from the Prefill reply). lps may be NULL. */
void rt_req_relay(rt_req_t *q, uint32_t first_index, const uint32_t *ids, size_t n,
                  K3pd__V1__TokenLogprob *const *lps, size_t n_lps);

/* flow.c */
void rt_req_on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp);

#endif
