/* k3pd-router, the worker calls of one request (ARCHITECTURE.md §2): D.Reserve, then P.Prefill
 * and D.Attach in parallel (Prefill started first: its reply carries the first token); the
 * Attach stream is relayed (req.c).
 *
 * Failures, by where they happen (docs/design.md, "Worker failures"):
 *  - a prefill that fails with a transport-class status is re-issued to another prefill worker
 *    against the same reservation (D.Reserve again → new epoch), up to --prefill-retries times;
 *    one whose transfer ran out of lease may go to the same worker;
 *  - anything else a worker does wrong — Reserve refused or unanswered, prefill re-issues used
 *    up, the Attach stream broken (the decode worker died, drained past its grace, lost the
 *    state) — starts a new ATTEMPT: the request runs again from its prompt on other workers
 *    (the failed one excluded), up to --worker-retries times. Tokens are a pure function of
 *    (prompt, sampling, seed, step), so the new attempt reproduces the tokens already streamed:
 *    they are checked against what was sent and skipped, and the stream continues where it
 *    was (resumption). When no attempt is left, a request that streamed nothing fails with a
 *    documented status; one that streamed tokens ends with a final chunk FINISH_REASON_ERROR.
 * Every call carries a small context naming its attempt; a callback of an earlier attempt only
 * cleans up (releases a reservation it may have made) and never touches the request's state. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"
#include "k3pd/v1/generation.pb-c.h"
#include "k3pd/v1/prefill.pb-c.h"
#include "req.h"

/* A Reserve that takes longer than this is given up (its outcome released) and the request
 * moves on: Reserve is loop-only work on the decode worker, a few ms even under load. */
#define RT_RESERVE_TIMEOUT_MS 10000u

/* One worker call: which request, which attempt, which worker. Freed by the call's final
 * callback. */
typedef struct {
  rt_req_t *q;
  uint32_t attempt;
  char id[RT_ID_MAX];     /* the worker's */
  char addr[RT_ADDR_MAX];
  char wid[RT_WID_MAX];   /* the request id it was sent */
  size_t n_tokens;        /* Prefill: prompt tokens sent */
} cctx_t;

static rt_worker_t *worker(rt_req_t *q, const char *id) { return rt_registry_find(&q->rt->reg, id); }

static void start_attempt(rt_req_t *q);
static void set_wid(rt_req_t *q);
static void start_prefill(rt_req_t *q);
static void on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp);

static cctx_t *cctx_new(rt_req_t *q, const char *id, const char *addr) {
  cctx_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->q = q;
  c->attempt = q->attempt;
  snprintf(c->id, sizeof c->id, "%s", id);
  snprintf(c->addr, sizeof c->addr, "%s", addr);
  snprintf(c->wid, sizeof c->wid, "%s", q->wid);
  return c;
}

/* Called first by every final callback: true when the call belongs to the current attempt
 * (its slot is cleared), false for a call of an earlier attempt (uncounted). */
static bool cctx_current(cctx_t *c, k3_rpc_ccall_t **slot) {
  rt_req_t *q = c->q;
  if (c->attempt == q->attempt) {
    *slot = NULL;
    return true;
  }
  q->stale_calls--;
  return false;
}

static uint32_t call_timeout(rt_req_t *q, uint32_t cap) {
  uint32_t t = rt_req_timeout(q);
  return cap && t > cap ? cap : t;
}

static void on_release_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  (void)arg;
  (void)st;
  (void)resp;
}

/* Release on a decode worker by address (epoch 0 = whatever this request holds there). */
static void release_at(rt_router_t *rt, const char *rid, const char *addr, uint64_t epoch) {
  K3pd__V1__ReleaseRequest rr = K3PD__V1__RELEASE_REQUEST__INIT;
  rr.request_id = (char *)rid;
  rr.epoch = epoch;
  k3_rpc_call_opts_t o = {.timeout_ms = 2000, .request_id = rid};
  k3_rpc_unary(rt->cli, addr, "/k3pd.v1.Decode/Release", &rr.base, &k3pd__v1__release_response__descriptor, &o,
               on_release_done, NULL, NULL);
}

/* ---- ending or moving on ---- */

/* What a client may see for a worker-side failure (docs/protocol.md's table): capacity and bad
 * input keep their codes, the client's own deadline too; everything else a worker reports is
 * UNAVAILABLE (retryable: the request itself was fine). */
static k3_rpc_code_t client_code(rt_req_t *q, k3_rpc_code_t c) {
  switch (c) {
    case K3_RPC_RESOURCE_EXHAUSTED:
    case K3_RPC_INVALID_ARGUMENT: return c;
    case K3_RPC_DEADLINE_EXCEEDED: return K3_RPC_DEADLINE_EXCEEDED;
    default: return K3_RPC_UNAVAILABLE;
  }
  (void)q;
}

/* Ends the request for good: a failure status when nothing was streamed, else the final
 * FINISH_REASON_ERROR chunk with the tokens so far. */
static void end_request(rt_req_t *q, k3_rpc_code_t code, const char *msg) {
  if (q->completion_tokens > 0)
    rt_req_finish_error(q, "%s", msg);
  else
    rt_req_fail(q, client_code(q, code), "%s", msg);
}

static void exclude(rt_req_t *q, const char *id) {
  if (!id[0] || q->n_excluded == RT_MAX_EXCLUDE) return;
  for (int i = 0; i < q->n_excluded; i++)
    if (strcmp(q->excluded[i], id) == 0) return;
  snprintf(q->excluded[q->n_excluded++], RT_ID_MAX, "%s", id);
}

/* Cancels the current attempt's calls (their callbacks become stale) and gives its decode
 * reservation back. */
static void drop_attempt(rt_req_t *q) {
  k3_rpc_ccall_t **calls[3] = {&q->reserve_call, &q->prefill_call, &q->attach_call};
  for (int i = 0; i < 3; i++) {
    if (!*calls[i]) continue;
    k3_rpc_ccall_cancel(*calls[i]);
    *calls[i] = NULL;
    q->stale_calls++;
  }
  /* A Reserve still out releases what it made from its (now stale) callback. */
  if (q->decode_addr[0] && q->epoch && !q->released) release_at(q->rt, q->wid, q->decode_addr, q->epoch);
  rt_req_drop_inflight(q);
  q->released = true;
}

/* A worker failed this attempt: run the request again on other workers (`bad`, the failed
 * worker's id, is excluded), or end it when no attempt is left. */
static void restart(rt_req_t *q, const char *bad, k3_rpc_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void restart(rt_req_t *q, const char *bad, k3_rpc_code_t code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (q->phase == RQ_DONE) return;
  q->busy++;
  drop_attempt(q);
  /* A Reserve refused for capacity is the decode worker's admission answering a race (several
   * routers, or a stale load report): the next candidate is tried without using up the retries
   * meant for failures; each refusing worker is excluded, so this ends when none is left. */
  bool capacity = code == K3_RPC_RESOURCE_EXHAUSTED;
  bool used_up = capacity ? q->capacity_moves >= RT_MAX_EXCLUDE - 1 : q->restarts >= (int)q->rt->worker_retries;
  if (used_up || (q->deadline_left_ms != INT64_MAX && rt_req_timeout(q) <= 1)) {
    end_request(q, code, msg);
  } else {
    exclude(q, bad);
    q->restart_code = code;
    if (capacity)
      q->capacity_moves++;
    else
      q->restarts++;
    q->attempt++;
    set_wid(q);
    q->t_prefill_start = q->t_prefill_done = 0; /* the timings report the last attempt's prefill */
    q->handoff_us = 0;
    q->epoch = 0;
    q->retries = 0;
    q->prefill_ok = false;
    q->attach_done = false;
    q->released = false;
    q->phase = RQ_RESERVING;
    free(q->desc);
    q->desc = NULL;
    q->desc_len = 0;
    k3_counter_inc(k3_metric_default(q->rt->m.request_restarts_total));
    if (capacity)
      K3_INFO("request %s: %s; attempt %u on the next decode worker", q->id, msg, q->attempt);
    else
      K3_WARN("request %s: %s; attempt %u on other workers (%u tokens already streamed: %s)", q->id, msg, q->attempt,
              q->completion_tokens, q->completion_tokens ? "replayed, checked and skipped" : "none");
    start_attempt(q);
  }
  q->busy--;
  rt_req_maybe_free(q);
}

/* ---- Attach ---- */

static void on_attach_msg(void *arg, const ProtobufCMessage *msg) {
  cctx_t *c = arg;
  rt_req_t *q = c->q;
  const K3pd__V1__AttachResponse *a = (const K3pd__V1__AttachResponse *)msg;
  if (c->attempt != q->attempt || q->phase == RQ_DONE) return;
  RT_TIMED_BEGIN;
  RT_TRACE(q, RT_TR_ATTACH_IN);
  if (a->finish_reason) RT_TRACE(q, RT_TR_LAST_IN);
  q->busy++;
  /* An ERROR chunk is followed by the stream's failure status, which decides what happens. */
  if (a->finish_reason && a->finish_reason != K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR)
    q->finish_reason = a->finish_reason;
  rt_req_relay(q, a->first_index, a->token_ids, a->n_token_ids, a->logprobs, a->n_logprobs);
  RT_TIMED_END(q);
  q->busy--;
  rt_req_maybe_free(q);
}

static void on_attach_done(void *arg, const k3_rpc_status_t *st) {
  cctx_t *c = arg;
  rt_req_t *q = c->q;
  q->busy++;
  RT_TRACE(q, RT_TR_ATTACH_DONE);
  if (cctx_current(c, &q->attach_call) && q->phase != RQ_DONE) {
    q->attach_done = true;
    if (st->code == K3_RPC_OK && q->finish_reason) {
      rt_req_finish_ok(q);
    } else if (st->code == K3_RPC_DEADLINE_EXCEEDED && q->deadline_left_ms != INT64_MAX && rt_req_timeout(q) <= 1000) {
      rt_req_fail(q, K3_RPC_DEADLINE_EXCEEDED, "deadline exceeded");
    } else {
      /* The decode worker died, drained past its grace, lost the state or failed a step. */
      restart(q, c->id, st->code, "decode worker %s: stream ended (%s: %s)", c->id, k3_rpc_code_name(st->code),
              st->code == K3_RPC_OK ? "no finish reason" : st->details);
    }
  }
  free(c);
  q->busy--;
  rt_req_maybe_free(q);
}

/* Returns 0, or K3_EINTERNAL after ending the request (which may then be freed). */
static int start_attach(rt_req_t *q) {
  K3pd__V1__AttachRequest ar = K3PD__V1__ATTACH_REQUEST__INIT;
  K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
  ar.request_id = q->wid;
  ar.epoch = q->epoch;
  ar.sampling = &q->sampling;
  stop.max_new_tokens = q->max_new;
  stop.stop_token_ids = q->stop_ids;
  stop.n_stop_token_ids = q->n_stop_ids;
  ar.stop = &stop;
  ar.return_logprobs = q->want_logprobs;
  cctx_t *c = cctx_new(q, q->decode_id, q->decode_addr);
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q, 0), .request_id = q->id};
  int rc = c ? k3_rpc_stream(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Attach", &ar.base,
                             &k3pd__v1__attach_response__descriptor, &o, on_attach_msg, on_attach_done, c,
                             &q->attach_call)
             : K3_ENOMEM;
  if (rc) {
    free(c);
    end_request(q, K3_RPC_INTERNAL, "starting the decode stream failed");
    return K3_EINTERNAL;
  }
  RT_TRACE(q, RT_TR_ATTACH_OUT);
  return 0;
}

/* ---- Prefill (with re-issues into the same reservation) ---- */

/* Prefill failures worth another prefill worker on the same reservation: transport-class
 * errors, and a deadline that was the transfer's (clamped to the reservation lease) rather
 * than the client's own. */
static bool reissuable(rt_req_t *q, k3_rpc_code_t c) {
  if (c == K3_RPC_DEADLINE_EXCEEDED) return q->deadline_left_ms == INT64_MAX || rt_req_timeout(q) > 1000;
  return c == K3_RPC_UNAVAILABLE || c == K3_RPC_INTERNAL || c == K3_RPC_ABORTED || c == K3_RPC_UNKNOWN ||
         c == K3_RPC_CANCELLED;
}

static void reserve(rt_req_t *q) {
  K3pd__V1__ReserveRequest rr = K3PD__V1__RESERVE_REQUEST__INIT;
  rr.request_id = q->wid;
  rr.n_prompt_tokens = (uint32_t)q->n_prompt;
  rr.max_new_tokens = q->max_new;
  rr.lease_ms = q->rt->lease_ms;
  if (q->rt->prefix_cache) { /* the decode worker looks the prompt up in its cache */
    rr.prefix_cache = true;
    rr.resume_ok = true;     /* long-suffix hits: this router runs PrepareResume + Export */
    rr.prompt_token_ids = (uint32_t *)q->prompt; /* ids are >= 0: same bits */
    rr.n_prompt_token_ids = q->n_prompt;
  }
  cctx_t *c = cctx_new(q, q->decode_id, q->decode_addr);
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q, RT_RESERVE_TIMEOUT_MS), .request_id = q->id};
  int rc = c ? k3_rpc_unary(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Reserve", &rr.base,
                            &k3pd__v1__reservation__descriptor, &o, on_reserve_done, c, &q->reserve_call)
             : K3_ENOMEM;
  if (rc) {
    free(c);
    end_request(q, K3_RPC_INTERNAL, "starting the reservation failed");
    return;
  }
  RT_TRACE(q, RT_TR_RESERVE_OUT);
}

static void on_prefill_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  cctx_t *c = arg;
  rt_req_t *q = c->q;
  rt_worker_t *pw = worker(q, c->id);
  if (pw) rt_worker_sub_pending(pw, (int64_t)c->n_tokens);
  RT_TRACE(q, RT_TR_PREFILL_IN);
  q->busy++;
  if (!cctx_current(c, &q->prefill_call) || q->phase == RQ_DONE) goto out;
  if (st->code == K3_RPC_OK) {
    const K3pd__V1__PrefillResponse *pr = (const K3pd__V1__PrefillResponse *)resp;
    q->prefill_ok = true;
    q->t_prefill_done = k3_now_ns();
    if (pr->timings) q->handoff_us = pr->timings->handoff_us;
    /* The first token is known now (decode verified the state before the RPC completed):
     * forward it instead of waiting for the decode worker's next step. The Attach stream's
     * index 0 is then skipped (and checked against it). Not for a split prompt: the decode
     * worker computes the rest of the prompt and samples the first token itself. */
    if (q->phase == RQ_RUNNING && !q->split) {
      uint32_t tok = pr->first_token;
      K3pd__V1__TokenLogprob lp = K3PD__V1__TOKEN_LOGPROB__INIT, *lpp = &lp;
      lp.token_id = tok;
      lp.logprob = pr->first_logprob;
      rt_req_relay(q, 0, &tok, 1, q->want_logprobs ? &lpp : NULL, q->want_logprobs ? 1 : 0);
    }
    goto out;
  }
  /* Another prefill worker into the same reservation (new epoch). */
  if (reissuable(q, st->code) && q->retries < (int)q->rt->prefill_retries) {
    K3_WARN("request %s: prefill on %s failed (%s: %s); re-issuing", q->id, c->id, k3_rpc_code_name(st->code),
            st->details);
    q->retries++;
    /* A worker that failed at the transport level is not asked again; one whose transfer ran out
     * of lease (it was merely slow or queued) may be. */
    if (st->code != K3_RPC_DEADLINE_EXCEEDED) exclude(q, c->id);
    k3_counter_inc(k3_metric_default(q->rt->m.prefill_retries_total));
    reserve(q);
    goto out;
  }
  if (st->code == K3_RPC_DEADLINE_EXCEEDED && !reissuable(q, st->code)) {
    rt_req_fail(q, K3_RPC_DEADLINE_EXCEEDED, "deadline exceeded");
  } else if (st->code == K3_RPC_INVALID_ARGUMENT) {
    end_request(q, st->code, st->details);
  } else {
    restart(q, c->id, st->code, "prefill worker %s: %s: %s", c->id, k3_rpc_code_name(st->code), st->details);
  }
out:
  free(c);
  q->busy--;
  rt_req_maybe_free(q);
}

/* Chooses the request's prefill worker (the excluded ones only when nothing else is there: a
 * preference) and records it in q; NULL (request ended) when there is none. */
static rt_worker_t *choose_prefill(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  const char *ex[RT_MAX_EXCLUDE];
  for (int i = 0; i < q->n_excluded; i++) ex[i] = q->excluded[i];
  size_t pi;
  rt_worker_t *dw = worker(q, q->decode_id);
  uint64_t fp = dw ? dw->info.fingerprint : 0;
  int rc = rt_choose_prefill(&rt->reg, fp, ex, (size_t)q->n_excluded, &pi);
  if (rc && q->n_excluded) rc = rt_choose_prefill(&rt->reg, fp, NULL, 0, &pi);
  if (rc) {
    end_request(q, K3_RPC_UNAVAILABLE,
                q->n_excluded ? "no prefill worker is available (the others failed this request)"
                              : "no prefill worker is available");
    return NULL;
  }
  rt_worker_t *pw = &rt->reg.workers[pi];
  snprintf(q->prefill_id, sizeof q->prefill_id, "%s", pw->info.id);
  snprintf(q->prefill_addr, sizeof q->prefill_addr, "%s", pw->info.address);
  return pw;
}

static void start_prefill(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  rt_worker_t *pw = q->prefill_chosen ? worker(q, q->prefill_id) : NULL;
  q->prefill_chosen = false;
  if (!pw && !(pw = choose_prefill(q))) return;
  K3pd__V1__PrefillRequest pr = K3PD__V1__PREFILL_REQUEST__INIT;
  size_t n_send = q->split ? q->prefill_tokens : q->n_prompt; /* split: the decode worker computes the rest */
  uint32_t *ids = malloc((n_send ? n_send : 1) * sizeof *ids);
  cctx_t *c = cctx_new(q, q->prefill_id, q->prefill_addr);
  if (!ids || !c) {
    free(ids);
    free(c);
    end_request(q, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
    return;
  }
  c->n_tokens = n_send;
  rt_worker_add_pending(pw, (int64_t)n_send);
  for (size_t i = 0; i < n_send; i++) ids[i] = (uint32_t)q->prompt[i];
  pr.request_id = q->wid;
  pr.epoch = q->epoch;
  pr.token_ids = ids;
  pr.n_token_ids = n_send;
  pr.sampling = &q->sampling;
  pr.reservation.data = q->desc;
  pr.reservation.len = q->desc_len;
  pr.return_logprobs = q->want_logprobs;
  pr.decode_worker_id = q->decode_id;
  pr.resume_tokens = q->resume_tokens;
  pr.resumed = q->resumed;
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q, 0), .request_id = q->id};
  q->t_prefill_start = k3_now_ns();
  if (q->retries == 0 && q->attempt == 1)
    k3_histogram_observe(k3_metric_default(rt->m.queue_seconds), (double)(q->t_prefill_start - q->t_arrive) / 1e9);
  int rc = k3_rpc_unary(rt->cli, q->prefill_addr, "/k3pd.v1.Prefill/Prefill", &pr.base,
                    &k3pd__v1__prefill_response__descriptor, &o, on_prefill_done, c, &q->prefill_call);
  free(ids);
  if (rc) {
    rt_worker_sub_pending(pw, (int64_t)n_send);
    free(c);
    end_request(q, K3_RPC_INTERNAL, "starting the prefill call failed");
    return;
  }
  RT_TRACE(q, RT_TR_PREFILL_OUT);
}

/* ---- long-suffix resume (docs/protocol.md "Long-suffix hits") ----
 * The decode worker answered resume_tokens = p: P.PrepareResume (local state + a receive
 * reservation on the chosen prefill worker), then D.Export (D sends its cached state there), then
 * P.Prefill with `resumed`. Any failure before Prefill is one fallback: the same Prefill without
 * `resumed` (the prefill worker computes from token 0 and pushes the same pages). The calls use
 * the request's prefill call slot, so cancellation and attempts treat them as the prefill. */

static void on_export_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  cctx_t *c = arg;
  rt_req_t *q = c->q;
  (void)resp;
  q->busy++;
  if (!cctx_current(c, &q->prefill_call) || q->phase == RQ_DONE) goto out;
  q->resumed = st->code == K3_RPC_OK;
  if (!q->resumed)
    K3_WARN("request %s: decode worker %s could not send its cached state (%s: %s); the prefill worker computes "
            "the prompt from token 0", q->id, c->id, k3_rpc_code_name(st->code), st->details);
  q->prefill_chosen = true;
  start_prefill(q);
out:
  free(c);
  q->busy--;
  rt_req_maybe_free(q);
}

static void on_prepare_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  cctx_t *c = arg;
  rt_req_t *q = c->q;
  q->busy++;
  if (!cctx_current(c, &q->prefill_call) || q->phase == RQ_DONE) goto out; /* its lease frees it there */
  if (st->code != K3_RPC_OK) {
    K3_WARN("request %s: prefill worker %s cannot take the cached state (%s: %s); it computes the prompt from token "
            "0", q->id, c->id, k3_rpc_code_name(st->code), st->details);
    q->prefill_chosen = true;
    start_prefill(q);
    goto out;
  }
  const K3pd__V1__PrepareResumeResponse *pr = (const K3pd__V1__PrepareResumeResponse *)resp;
  K3pd__V1__ExportRequest er = K3PD__V1__EXPORT_REQUEST__INIT;
  er.request_id = q->wid;
  er.epoch = q->epoch;
  er.descriptor = pr->descriptor;
  cctx_t *e = cctx_new(q, q->decode_id, q->decode_addr);
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q, q->rt->lease_ms), .request_id = q->id};
  int rc = e ? k3_rpc_unary(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Export", &er.base,
                            &k3pd__v1__export_response__descriptor, &o, on_export_done, e, &q->prefill_call)
             : K3_ENOMEM;
  if (rc) {
    free(e);
    q->prefill_chosen = true;
    start_prefill(q);
  }
out:
  free(c);
  q->busy--;
  rt_req_maybe_free(q);
}

/* Chooses the prefill worker and asks it to prepare (falls back to a plain Prefill when that
 * cannot start). */
static void start_resume(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  q->resumed = false;
  if (!choose_prefill(q)) return;
  rt_worker_t *dw = worker(q, q->decode_id);
  uint64_t fp = dw ? dw->info.fingerprint : 0;
  q->prefill_chosen = true;
  K3pd__V1__PrepareResumeRequest pr = K3PD__V1__PREPARE_RESUME_REQUEST__INIT;
  pr.request_id = q->wid;
  pr.epoch = q->epoch;
  pr.n_tokens = q->prefill_tokens;
  pr.resume_tokens = q->resume_tokens;
  pr.lease_ms = rt->lease_ms;
  pr.fingerprint = fp;
  cctx_t *c = cctx_new(q, q->prefill_id, q->prefill_addr);
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q, RT_RESERVE_TIMEOUT_MS), .request_id = q->id};
  int rc = c ? k3_rpc_unary(rt->cli, q->prefill_addr, "/k3pd.v1.Prefill/PrepareResume", &pr.base,
                            &k3pd__v1__prepare_resume_response__descriptor, &o, on_prepare_done, c, &q->prefill_call)
             : K3_ENOMEM;
  if (rc) {
    free(c);
    start_prefill(q);
  }
}

/* ---- Reserve ---- */

/* Reserve statuses after which D may or may not hold a reservation: the call was cancelled by us
 * (client cancel/deadline while reserving), hit its deadline, or the connection broke after the
 * request was sent. Definite refusals (RESOURCE_EXHAUSTED, INVALID_ARGUMENT, ALREADY_EXISTS,
 * FAILED_PRECONDITION) reserved nothing. */
static bool reserve_outcome_unknown(k3_rpc_code_t c) {
  return c == K3_RPC_CANCELLED || c == K3_RPC_DEADLINE_EXCEEDED || c == K3_RPC_UNAVAILABLE ||
         c == K3_RPC_INTERNAL || c == K3_RPC_UNKNOWN || c == K3_RPC_ABORTED;
}

static void on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  cctx_t *c = arg;
  rt_req_t *q = c->q;
  const K3pd__V1__Reservation *r = st->code == K3_RPC_OK ? (const K3pd__V1__Reservation *)resp : NULL;
  RT_TRACE(q, RT_TR_RESERVE_IN);
  q->busy++;
  bool cur = cctx_current(c, &q->reserve_call);
  if (!cur || q->phase == RQ_DONE) {
    /* The request moved on or ended while this Reserve was out: give back what it may hold. */
    if (r) release_at(q->rt, c->wid, c->addr, r->epoch);
    else if (reserve_outcome_unknown(st->code)) release_at(q->rt, c->wid, c->addr, 0);
    goto out;
  }
  if (st->code == K3_RPC_ALREADY_EXISTS && q->epoch != 0) {
    /* A re-issue found the request already admitted: the failed prefill attempt's DONE was
     * accepted just before its deadline fired. The state is on the decode worker and the
     * Attach stream delivers the tokens; nothing to redo. */
    K3_INFO("request %s: re-issue not needed, decode worker %s already admitted it", q->id, c->id);
    goto out;
  }
  if (!r) {
    if (reserve_outcome_unknown(st->code)) {
      /* The epoch of such a reservation is unknown (a re-issue changed it, or it was the first):
       * release whatever D holds for this request. */
      release_at(q->rt, c->wid, c->addr, 0);
      q->released = true;
    }
    if (st->code == K3_RPC_DEADLINE_EXCEEDED && q->deadline_left_ms != INT64_MAX && rt_req_timeout(q) <= 1000)
      rt_req_fail(q, K3_RPC_DEADLINE_EXCEEDED, "deadline exceeded");
    else if (st->code == K3_RPC_INVALID_ARGUMENT)
      end_request(q, st->code, st->details);
    else /* unreachable, refused (capacity: another one may have room), or confused */
      restart(q, c->id, st->code, "decode worker %s: Reserve failed (%s: %s)", c->id, k3_rpc_code_name(st->code),
              st->details);
    goto out;
  }
  bool first = q->epoch == 0;
  q->epoch = r->epoch;
  free(q->desc);
  q->desc = malloc(r->descriptor.len ? r->descriptor.len : 1);
  if (!q->desc) {
    end_request(q, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
    goto out;
  }
  if (r->descriptor.len) memcpy(q->desc, r->descriptor.data, r->descriptor.len); /* empty: no handoff */
  q->desc_len = r->descriptor.len;
  q->split = r->split;
  q->prefill_tokens = r->split ? r->prefill_tokens : 0;
  q->cached_tokens = r->split ? r->cached_tokens : 0;
  q->resume_tokens = r->split ? r->resume_tokens : 0;
  if (r->split && r->prefill_tokens >= q->n_prompt) {
    end_request(q, K3_RPC_INTERNAL, "decode worker's reservation: prefill_tokens must be < the prompt's length");
    goto out;
  }
  if (q->resume_tokens && q->resume_tokens >= q->prefill_tokens) {
    end_request(q, K3_RPC_INTERNAL, "decode worker's reservation: resume_tokens must be < prefill_tokens");
    goto out;
  }
  if (first) {
    if (q->attempt == 1) q->t_reserved = k3_now_ns();
    q->phase = RQ_RUNNING;
    if (q->rt->prefix_cache)
      K3_DEBUG("request %s: decode worker %s caches %u of %zu prompt tokens (router expected %lld); prefill "
               "worker gets %u", q->id, c->id, q->cached_tokens, q->n_prompt, (long long)q->expect_cached,
               q->split ? q->prefill_tokens : (uint32_t)q->n_prompt);
  }
  /* Prefill first: it is on the path to the first token (its reply carries it), Attach is not
   * (the decode worker buffers what it produces until the stream arrives, docs/protocol.md), and
   * starting a call costs the loop tens of µs (call setup, TLS record, write). A long-suffix
   * resume starts with PrepareResume on the prefill worker (its Prefill follows Export). */
  if (q->split && q->prefill_tokens == 0)
    q->prefill_ok = true; /* conditional disaggregation: the decode worker computes the uncached suffix */
  else if (q->resume_tokens)
    start_resume(q);
  else
    start_prefill(q);
  if (first && q->phase == RQ_RUNNING) start_attach(q);
out:
  free(c);
  q->busy--;
  rt_req_maybe_free(q);
}

/* ---- placement ---- */

static int choose_decode(rt_req_t *q, const char *const *ex, size_t n_ex, size_t *di) {
  rt_router_t *rt = q->rt;
  const uint32_t *ids = rt->prefix_cache ? (const uint32_t *)q->prompt : NULL;
  int rc = rt_choose_decode_cached(&rt->reg, ids, (int64_t)q->n_prompt, q->max_new, 0, true, ex, n_ex,
                                   rt->cache_load_tokens, di, &q->expect_cached);
  if (rc == K3_ECAPACITY)
    rc = rt_choose_decode_cached(&rt->reg, ids, (int64_t)q->n_prompt, q->max_new, 0, false, ex, n_ex,
                                 rt->cache_load_tokens, di, &q->expect_cached);
  return rc;
}

static void start_attempt(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  const char *ex[RT_MAX_EXCLUDE];
  for (int i = 0; i < q->n_excluded; i++) ex[i] = q->excluded[i];
  size_t n_ex = (size_t)q->n_excluded, di, pi;
  int rc = choose_decode(q, ex, n_ex, &di);
  /* Exclusion is a preference: a worker still registered after failing this request (a dead
   * one is gone from the registry at once, router/watch.c) is better than none, unless it
   * refused for capacity. */
  if (rc && n_ex && q->restart_code != K3_RPC_RESOURCE_EXHAUSTED) rc = choose_decode(q, NULL, 0, &di);
  /* A request whose only candidates refused it for capacity ends the way its first attempt
   * would have: RESOURCE_EXHAUSTED (retry later). */
  if (rc == K3_ECAPACITY || (rc == K3_EUNAVAIL && n_ex && q->restart_code == K3_RPC_RESOURCE_EXHAUSTED)) {
    char msg[200];
    snprintf(msg, sizeof msg, "no decode worker has capacity for %zu prompt + %u new tokens right now (retry later)",
             q->n_prompt, q->max_new);
    end_request(q, K3_RPC_RESOURCE_EXHAUSTED, msg);
    return;
  }
  if (rc) {
    end_request(q, K3_RPC_UNAVAILABLE,
                q->attempt > 1 ? "no other decode worker is available (the others failed this request)"
                               : "no decode worker is registered");
    return;
  }
  rt_worker_t *dw = &rt->reg.workers[di];
  if (rt_choose_prefill(&rt->reg, dw->info.fingerprint, ex, n_ex, &pi) &&
      (!n_ex || rt_choose_prefill(&rt->reg, dw->info.fingerprint, NULL, 0, &pi))) {
    end_request(q, K3_RPC_UNAVAILABLE,
                q->attempt > 1 ? "no other prefill worker is available (the others failed this request)"
                               : "no prefill worker is registered for this model");
    return;
  }
  snprintf(q->decode_id, sizeof q->decode_id, "%s", dw->info.id);
  snprintf(q->decode_addr, sizeof q->decode_addr, "%s", dw->info.address);
  q->pending_pages = rt_pages_needed((int64_t)q->n_prompt, q->max_new, dw->info.page_tokens);
  rt_worker_add_inflight(dw, q->pending_pages, 1);
  q->decode_gen = dw->incarnation;
  reserve(q);
}

/* "<instance>/id" for attempt 1, "<instance>/id#n" for attempt n > 1 (ids too long for that keep
 * a prefix and a hash of the whole id: still unique). The instance tag keeps the requests of
 * several routers apart on the workers they share. */
static void set_wid(rt_req_t *q) {
  const char *inst = q->rt->instance;
  size_t n = strlen(q->id), pre = strlen(inst) + 1;
  int w = -1; /* the branches below fit by construction; the check keeps the compiler's proof */
  if (q->attempt <= 1 && pre + n < RT_WID_MAX)
    w = snprintf(q->wid, sizeof q->wid, "%s/%s", inst, q->id);
  else if (pre + n + 12 < RT_WID_MAX)
    w = snprintf(q->wid, sizeof q->wid, "%s/%s#%u", inst, q->id, q->attempt);
  if (w < 0 || w >= (int)sizeof q->wid)
    snprintf(q->wid, sizeof q->wid, "%.23s/%.80s#%016llx#%u", inst, q->id, (unsigned long long)k3_hash64(q->id, n, 0),
             q->attempt);
}

void rt_flow_start(rt_req_t *q) {
  q->attempt = 1;
  set_wid(q);
  start_attempt(q);
}
