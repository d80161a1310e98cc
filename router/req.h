/* k3pd-router: one generation request (rt_req_t), the same object whichever front received it
 * (gRPC Generate in generate.c, the OpenAI-compatible HTTP API in http_*.c / oai_*.c), and the
 * functions of the one request path behind both fronts:
 *   intake.c - front-neutral intake: request id, sampling and stop parameters, tokenisation or
 *              chat rendering, then placement and the Reserve that starts the flow;
 *   flow.c   - the worker calls: Reserve → Prefill (with re-issue) ‖ Attach;
 *   req.c    - lifetime and output: relaying tokens (incremental detokenisation, stop strings)
 *              to the front's sink, finishing or failing the request, accounting (metrics + one
 *              log line), freeing.
 * A front turns its wire request into calls of intake.c and receives the output through an
 * rt_sink_t; nothing below the sink knows which front it serves, so both APIs give the same
 * tokens for the same request.
 * Everything runs on the router's loop thread. A request is freed only when no call of ours is
 * in flight, the sink was detached (the request ended) and no function up the stack still uses
 * it (`busy`). */
#ifndef K3PD_ROUTER_REQ_H
#define K3PD_ROUTER_REQ_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "k3pd/chat.h"
#include "k3pd/detok.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/v1/common.pb-c.h"
#include "rt.h"

#define RT_MAX_EXCLUDE 16
#define RT_WID_MAX 129 /* worker-side request ids: <= 128 bytes, as every worker accepts */

typedef enum { RQ_RESERVING = 0, RQ_RUNNING, RQ_DONE } rq_phase_t;

/* Stages of the per-request trace (K3PD_ROUTER_TRACE=FILE, router/trace.c): k3_now_ns() when the
 * request (first attempt) reached each stage; 0 = not reached. Diagnostics only: read by
 * scripts/bench/router_trace.py, never by the request path. */
typedef enum {
  RT_TR_ARRIVE = 0,  /* the Generate call reached the loop (t_arrive) */
  RT_TR_LAUNCH,      /* intake done, placement starts */
  RT_TR_RESERVE_OUT, /* Reserve handed to gRPC */
  RT_TR_RESERVE_IN,  /* its reply reached the loop */
  RT_TR_PREFILL_OUT, /* Prefill handed to gRPC */
  RT_TR_ATTACH_OUT,  /* Attach handed to gRPC */
  RT_TR_PREFILL_IN,  /* the Prefill reply reached the loop */
  RT_TR_FIRST_OUT,   /* the first token's chunk handed to the client's stream */
  RT_TR_ATTACH_IN,   /* the first Attach message reached the loop */
  RT_TR_LAST_IN,     /* the Attach message with the finish reason reached the loop */
  RT_TR_END,         /* the request ended (final chunk handed to the client's stream) */
  RT_TR_ATTACH_DONE, /* the Attach stream's status reached the loop */
  RT_TR_N
} rt_tr_stage_t;

struct rt_req;

/* Where a request's output goes: implemented by each front. Every callback runs on the loop
 * thread, from inside the request path (the front must not free the request in them).
 *  - tokens: newly generated ids (and their log probabilities when asked for; lps may be NULL)
 *    with the text they completed (complete UTF-8, stop strings removed; may be empty);
 *  - finish: the request ended normally; `tail` is the text the detokeniser held back until
 *    the end (may be empty); q->finish_reason, q->completion_tokens, q->n_prompt and the
 *    timings are final;
 *  - fail: the request ended with `code` and a message naming the field or resource.
 * After finish or fail the sink is detached and never called again; the request may be freed
 * as soon as the callback returns, so the front drops its pointer to it there. */
typedef struct rt_sink {
  void (*tokens)(struct rt_req *q, void *ctx, const uint32_t *ids, size_t n, const char *text, size_t len,
                 const K3pd__V1__TokenLogprob *const *lps, size_t n_lps);
  void (*finish)(struct rt_req *q, void *ctx, const char *tail, size_t len);
  void (*fail)(struct rt_req *q, void *ctx, k3_rpc_code_t code, const char *msg);
} rt_sink_t;

typedef struct rt_req {
  struct rt_req *next;
  rt_router_t *rt;
  const rt_sink_t *sink;  /* the front's output; NULL before launch and once ended */
  void *sink_ctx;
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
  /* placement: the current attempt (flow.c). A worker failure moves the request to other
   * workers: a new attempt (attempt + 1) with the failed worker excluded; the calls of earlier
   * attempts are cancelled and only counted (stale_calls) until their callbacks ran. */
  uint32_t attempt;       /* current attempt, 1.. */
  char wid[RT_WID_MAX];   /* the request id the workers see in this attempt: <instance>/id, then
                             <instance>/id#2, #3... (an earlier attempt's reservation may still be
                             being torn down on the same worker, and other routers' requests share
                             the workers: distinct ids never collide there) */
  int restarts;           /* attempts after the first for worker failures (bounded by --worker-retries) */
  int capacity_moves;     /* attempts after a decode worker refused the Reserve for capacity (another
                             router's request took the room): each moves to the next candidate
                             without using up --worker-retries; bounded by RT_MAX_EXCLUDE */
  k3_rpc_code_t restart_code; /* why the last attempt was given up */
  char decode_id[RT_ID_MAX], decode_addr[RT_ADDR_MAX];
  char prefill_id[RT_ID_MAX], prefill_addr[RT_ADDR_MAX];
  char excluded[RT_MAX_EXCLUDE][RT_ID_MAX]; /* workers (either role) this request avoids */
  int n_excluded;
  int retries;            /* prefill re-issues in this attempt (bounded by --prefill-retries) */
  int64_t pending_pages;  /* counted in the decode worker's in-flight total until the request ends */
  uint32_t decode_gen;    /* registration the in-flight count was added to */
  uint64_t epoch;         /* the current reservation's (0 = none yet in this attempt) */
  uint8_t *desc;
  size_t desc_len;
  /* calls in flight of the current attempt, and of earlier ones */
  k3_rpc_ccall_t *reserve_call, *prefill_call, *attach_call;
  int stale_calls;
  bool prefill_ok, attach_done, released;
  /* prefix cache (the current attempt's Reservation): split = the decode worker computes the
   * prompt after prefill_tokens (0 = no prefill call) and the first token; cached_tokens came
   * from its cache */
  bool split;
  uint32_t prefill_tokens, cached_tokens;
  /* long-suffix resume (flow.c): the reservation covers the state from resume_tokens on; the
   * prefill worker receives the cached state first (PrepareResume + Export: resumed) or, when
   * that fails, computes from token 0 */
  uint32_t resume_tokens;
  bool resumed;
  bool prefill_chosen;    /* prefill_id/addr already chosen (for PrepareResume) */
  int64_t expect_cached;  /* tokens the router expected cached on the chosen decode worker */
  /* output */
  k3_detok_t *detok;
  uint32_t completion_tokens;
  uint32_t *sent;         /* ids relayed so far (completion_tokens of them): a resumed attempt's
                             replay of them is checked against these */
  uint32_t cap_sent;
  bool replay_mismatch;   /* a resumed attempt produced other tokens than those already sent */
  int finish_reason;
  bool stopped_by_string;
  /* timings (k3_now_ns) */
  uint64_t t_arrive, t_reserved, t_prefill_start, t_prefill_done, t_first, t_end;
  uint64_t handoff_us;
  int64_t deadline_left_ms;
  int busy; /* > 0 while a function up the stack still uses the request: frees are deferred */
  bool intake_pending;          /* its prompt is being built on the tokenisation pool */
  k3_rpc_code_t intake_cancel;  /* the client cancelled (or its deadline passed) meanwhile */
  uint64_t t_last_tok;   /* for inter-token latency */
  uint64_t router_ns;    /* time spent in this request's router handlers (added latency) */
  bool counted;          /* counted as an active stream */
  uint64_t tr[RT_TR_N];  /* trace stamps (only with rt->trace; see rt_tr_stage_t) */
} rt_req_t;

/* Stamps a trace stage once (first attempt's path; cheap when tracing is off). */
#define RT_TRACE(q, stage)                                          \
  do {                                                              \
    if ((q)->rt->trace && !(q)->tr[stage]) (q)->tr[stage] = k3_now_ns(); \
  } while (0)
/* trace.c (rt_trace_open/close in rt.h). Writes the request's line (called once, when it is freed). */
void rt_trace_write(rt_req_t *q);

/* Time the router itself spends on a request, summed over its handlers. */
#define RT_TIMED_BEGIN uint64_t rt_t0_ = k3_now_ns()
#define RT_TIMED_END(q) ((q)->router_ns += k3_now_ns() - rt_t0_)

/* intake.c: the front-neutral intake. A front calls, in this order (each failure is reported in
 * err as "<field path>: <problem>" with the status it maps to; the front may rename the path):
 *   rt_req_new → rt_req_set_params → rt_prompt_* + rt_req_set_prompt → rt_req_launch,
 * and rt_req_reject on an error before launch. */

/* Creates a request and counts it as started. rid: the client's id (NULL/"" = assign one);
 * rid_field names it in errors ("request_id", "x-request-id (metadata, ...)"); deadline_left_ms
 * INT64_MAX = none. Fails (nothing created) with INVALID_ARGUMENT for a bad id or
 * ALREADY_EXISTS when a request with that id is in flight. */
int rt_req_new(rt_router_t *rt, const char *rid, const char *rid_field, int64_t deadline_left_ms, rt_req_t **out,
               k3_rpc_code_t *code, char *err, size_t errlen);
/* Sampling (unset seed: the router picks one), stop conditions (the model's EOS ids are added
 * unless ignore_eos) and logprobs. K3_EINVAL naming "sampling.*" / "stop.*", or K3_ENOMEM. */
int rt_req_set_params(rt_req_t *q, const K3pd__V1__SamplingParams *s, const K3pd__V1__StopConditions *st,
                      bool logprobs, char *err, size_t errlen);
/* Prompt builders shared by the fronts; each APPENDS to out (k3_tok_ids_t) and fails with
 * K3_EINVAL and a message naming the field ("text: ...", "messages[1].content: ...",
 * "token_ids.ids[3]: ..."), leaving out as it was on entry. */
int rt_prompt_text(rt_router_t *rt, const char *text, size_t len, k3_tok_ids_t *out, char *err, size_t errlen);
int rt_prompt_chat(rt_router_t *rt, const json_t *messages, const k3_chat_opts_t *opts, k3_tok_ids_t *out, char *err,
                   size_t errlen);
int rt_prompt_ids(rt_router_t *rt, const uint32_t *ids, size_t n, const char *field, k3_tok_ids_t *out, char *err,
                  size_t errlen);
/* The same for text and chat, off the loop (router/tokpool.c), with the request's limits:
 * a text (or chat content) longer than what the context leaves for the prompt times the
 * vocabulary's longest token cannot fit and is refused before any work (K3_EINVAL, "prompt:
 * ..." / "messages: ..."), and tokenisation stops once the prompt has more tokens than fit.
 * max_new: the request's stop.max_new_tokens (0 = not known yet). Returns K3_EINPROGRESS and
 * later runs done(q, arg, ids, rc, err) on the loop (ids owned by done; rc 0, K3_EINVAL with err
 * naming the field, K3_ENOMEM or K3_ESHUTDOWN); any other return is a synchronous failure (done
 * never runs). While pending, q->intake_pending is set and the inputs must stay valid. */
typedef void (*rt_prompt_done_fn)(rt_req_t *q, void *arg, k3_tok_ids_t *ids, int rc, const char *err);
int rt_prompt_text_async(rt_req_t *q, const char *text, size_t len, uint32_t max_new, rt_prompt_done_fn done,
                         void *arg, char *err, size_t errlen);
int rt_prompt_chat_async(rt_req_t *q, const json_t *messages, const k3_chat_opts_t *opts, uint32_t max_new,
                         rt_prompt_done_fn done, void *arg, char *err, size_t errlen);
/* Takes ownership of the prompt (ids->ids; ids is zeroed). K3_EINVAL for an empty prompt. */
int rt_req_set_prompt(rt_req_t *q, k3_tok_ids_t *ids, char *err, size_t errlen);
/* Largest prompt + max_new_tokens a decode worker takes now (0 = no decode worker reports one). */
int64_t rt_context_limit(rt_router_t *rt);
/* Ends a request that was never launched: accounting with `code`, one log line, free. */
void rt_req_reject(rt_req_t *q, k3_rpc_code_t code, const char *msg);
/* Attaches the sink and starts the flow: detokeniser, context check, placement, Reserve. Any
 * failure from here on is reported through sink->fail, possibly before this returns. */
void rt_req_launch(rt_req_t *q, const rt_sink_t *sink, void *ctx);
/* Ends a running request on the front's behalf (client cancel, disconnect, deadline). */
#define rt_req_cancel rt_req_fail

/* req.c */
/* ms left of the client's deadline for a worker call; RT_NO_DEADLINE_MS when the client set none
 * (every worker call has a deadline). */
#define RT_NO_DEADLINE_MS 3600000u
uint32_t rt_req_timeout(rt_req_t *q);
void rt_req_free(rt_req_t *q);
void rt_req_maybe_free(rt_req_t *q);
void rt_req_release_decode(rt_req_t *q);
/* Takes the request's pages and slot out of its decode worker's in-flight count (once). */
void rt_req_drop_inflight(rt_req_t *q);
/* Release with epoch 0 (any epoch of this request_id): for a Reserve whose outcome is unknown
 * (cancelled, timed out or cut off after it was sent), when D may hold a reservation whose
 * epoch the router never learnt. Without it that reservation would stay until its lease. */
void rt_req_release_decode_any(rt_req_t *q);
void rt_req_abort_prefill(rt_req_t *q);
void rt_req_fail(rt_req_t *q, k3_rpc_code_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void rt_req_finish_ok(rt_req_t *q);
/* Ends a request that already streamed tokens and cannot go on: the sink's finish runs with
 * finish_reason ERROR and the tokens so far (common.proto's contract); counted as unavailable. */
void rt_req_finish_error(rt_req_t *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rt_req_account_end(rt_req_t *q, k3_rpc_code_t code);
/* Relays tokens [first_index, first_index + n) of the completion; indices already sent are
 * skipped (the first token is forwarded from the Prefill reply). lps may be NULL. */
void rt_req_relay(rt_req_t *q, uint32_t first_index, const uint32_t *ids, size_t n,
                  K3pd__V1__TokenLogprob *const *lps, size_t n_lps);

/* flow.c: placement and the worker calls. Starts the first attempt (choose D and P, Reserve);
 * failures go through the sink. */
void rt_flow_start(rt_req_t *q);

#endif
