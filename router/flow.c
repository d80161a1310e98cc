/* k3pd-router, the worker calls of one request (ARCHITECTURE.md §2): D.Reserve, then P.Prefill
 * and D.Attach in parallel; the Attach stream is relayed (req.c). A prefill that fails with a
 * transport-class status is re-issued to another prefill worker against the same reservation
 * (D.Reserve again → new epoch); one whose transfer ran out of lease may go to the same worker. */
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

static rt_worker_t *worker(rt_req_t *q, const char *id) { return rt_registry_find(&q->rt->reg, id); }

static void start_prefill(rt_req_t *q);
static void on_attach_msg_body(rt_req_t *q, const K3pd__V1__AttachResponse *a);

static void on_attach_msg(void *arg, const ProtobufCMessage *msg) {
  rt_req_t *q = arg;
  RT_TIMED_BEGIN;
  q->busy++;
  on_attach_msg_body(q, (const K3pd__V1__AttachResponse *)msg);
  RT_TIMED_END(q);
  q->busy--;
  rt_req_maybe_free(q);
}

static void on_attach_msg_body(rt_req_t *q, const K3pd__V1__AttachResponse *a) {
  if (q->phase == RQ_DONE) return;
  if (a->finish_reason) q->finish_reason = a->finish_reason;
  rt_req_relay(q, a->first_index, a->token_ids, a->n_token_ids, a->logprobs, a->n_logprobs);
}

static void on_attach_done(void *arg, const k3_rpc_status_t *st) {
  rt_req_t *q = arg;
  q->attach_call = NULL;
  q->attach_done = true;
  q->busy++;
  if (q->phase != RQ_DONE) {
    if (st->code == K3_RPC_OK && q->finish_reason) {
      rt_req_finish_ok(q);
    } else if (st->code == K3_RPC_OK) {
      rt_req_fail(q, K3_RPC_INTERNAL, "decode stream ended without a finish reason");
    } else {
      rt_req_fail(q, st->code == K3_RPC_CANCELLED ? K3_RPC_UNAVAILABLE : st->code, "decode worker %s: %s",
               q->decode_id, st->details);
    }
  }
  q->busy--;
  rt_req_maybe_free(q);
}

/* Returns 0, or K3_EINTERNAL after failing the request (which may then be freed). */
static int start_attach(rt_req_t *q) {
  K3pd__V1__AttachRequest ar = K3PD__V1__ATTACH_REQUEST__INIT;
  K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
  ar.request_id = q->id;
  ar.epoch = q->epoch;
  ar.sampling = &q->sampling;
  stop.max_new_tokens = q->max_new;
  stop.stop_token_ids = q->stop_ids;
  stop.n_stop_token_ids = q->n_stop_ids;
  ar.stop = &stop;
  ar.return_logprobs = q->want_logprobs;
  k3_rpc_call_opts_t o = {.timeout_ms = rt_req_timeout(q), .request_id = q->id};
  int rc = k3_rpc_stream(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Attach", &ar.base,
                         &k3pd__v1__attach_response__descriptor, &o, on_attach_msg, on_attach_done, q, &q->attach_call);
  if (rc) {
    rt_req_fail(q, K3_RPC_INTERNAL, "starting the decode stream: %s", k3_strerror(rc));
    return K3_EINTERNAL;
  }
  return 0;
}

/* ---- prefill (with retries) ---- */

/* Prefill failures worth another prefill worker: transport-class errors, and a deadline that
 * was the transfer's (clamped to the reservation lease) rather than the client's own. */
static bool retryable(rt_req_t *q, k3_rpc_code_t c) {
  if (c == K3_RPC_DEADLINE_EXCEEDED) return q->deadline_left_ms == INT64_MAX || rt_req_timeout(q) > 1000;
  return c == K3_RPC_UNAVAILABLE || c == K3_RPC_INTERNAL || c == K3_RPC_ABORTED || c == K3_RPC_UNKNOWN ||
         c == K3_RPC_CANCELLED;
}

void rt_req_on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp);

static void on_prefill_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rt_req_t *q = arg;
  q->prefill_call = NULL;
  rt_worker_t *pw = worker(q, q->prefill_id);
  if (pw) rt_worker_sub_pending(pw, (int64_t)q->n_prompt);
  if (q->phase == RQ_DONE) {
    rt_req_maybe_free(q);
    return;
  }
  if (st->code == K3_RPC_OK) {
    const K3pd__V1__PrefillResponse *pr = (const K3pd__V1__PrefillResponse *)resp;
    q->prefill_ok = true;
    q->t_prefill_done = k3_now_ns();
    if (pr->timings) q->handoff_us = pr->timings->handoff_us;
    /* The first token is known now (decode verified the state before the RPC completed):
     * forward it instead of waiting for the decode worker's next step. The Attach stream's
     * index 0 is then skipped. */
    if (q->completion_tokens == 0 && q->phase == RQ_RUNNING) {
      uint32_t tok = pr->first_token;
      K3pd__V1__TokenLogprob lp = K3PD__V1__TOKEN_LOGPROB__INIT, *lpp = &lp;
      lp.token_id = tok;
      lp.logprob = pr->first_logprob;
      q->busy++;
      rt_req_relay(q, 0, &tok, 1, q->want_logprobs ? &lpp : NULL, q->want_logprobs ? 1 : 0);
      q->busy--;
      rt_req_maybe_free(q);
    }
    return;
  }
  /* Retry on another prefill worker into the same reservation (new epoch). */
  if (retryable(q, st->code) && q->n_excluded < RT_MAX_EXCLUDE && q->retries < (int)q->rt->prefill_retries) {
    K3_WARN("request %s: prefill on %s failed (%s: %s); re-issuing", q->id, q->prefill_id, k3_rpc_code_name(st->code),
            st->details);
    q->retries++;
    /* A worker that failed at the transport level is not asked again; one whose transfer ran out
     * of lease (it was merely slow or queued) may be. */
    if (st->code != K3_RPC_DEADLINE_EXCEEDED) snprintf(q->excluded[q->n_excluded++], RT_ID_MAX, "%s", q->prefill_id);
    k3_counter_inc(k3_metric_default(q->rt->m.prefill_retries_total));
    K3pd__V1__ReserveRequest rr = K3PD__V1__RESERVE_REQUEST__INIT;
    rr.request_id = q->id;
    rr.n_prompt_tokens = (uint32_t)q->n_prompt;
    rr.max_new_tokens = q->max_new;
    rr.lease_ms = q->rt->lease_ms;
    k3_rpc_call_opts_t o = {.timeout_ms = rt_req_timeout(q), .request_id = q->id};
    int rc = k3_rpc_unary(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Reserve", &rr.base,
                          &k3pd__v1__reservation__descriptor, &o, rt_req_on_reserve_done, q, &q->reserve_call);
    if (rc) rt_req_fail(q, K3_RPC_INTERNAL, "re-reserving: %s", k3_strerror(rc));
    return;
  }
  rt_req_fail(q, st->code, "prefill worker %s: %s", q->prefill_id, st->details);
}

static void start_prefill(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  const char *ex[RT_MAX_EXCLUDE];
  for (int i = 0; i < q->n_excluded; i++) ex[i] = q->excluded[i];
  size_t pi;
  rt_worker_t *dw = worker(q, q->decode_id);
  int rc = rt_choose_prefill(&rt->reg, dw ? dw->info.fingerprint : 0, ex, (size_t)q->n_excluded, &pi);
  if (rc) {
    rt_req_fail(q, K3_RPC_UNAVAILABLE, "no prefill worker is available%s",
             q->n_excluded ? " (the others failed this request)" : "");
    return;
  }
  rt_worker_t *pw = &rt->reg.workers[pi];
  snprintf(q->prefill_id, sizeof q->prefill_id, "%s", pw->info.id);
  snprintf(q->prefill_addr, sizeof q->prefill_addr, "%s", pw->info.address);
  rt_worker_add_pending(pw, (int64_t)q->n_prompt);
  K3pd__V1__PrefillRequest pr = K3PD__V1__PREFILL_REQUEST__INIT;
  uint32_t *ids = malloc(q->n_prompt * sizeof *ids);
  if (!ids) {
    rt_req_fail(q, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
    return;
  }
  for (size_t i = 0; i < q->n_prompt; i++) ids[i] = (uint32_t)q->prompt[i];
  pr.request_id = q->id;
  pr.epoch = q->epoch;
  pr.token_ids = ids;
  pr.n_token_ids = q->n_prompt;
  pr.sampling = &q->sampling;
  pr.reservation.data = q->desc;
  pr.reservation.len = q->desc_len;
  pr.return_logprobs = q->want_logprobs;
  pr.decode_worker_id = q->decode_id;
  k3_rpc_call_opts_t o = {.timeout_ms = rt_req_timeout(q), .request_id = q->id};
  q->t_prefill_start = k3_now_ns();
  if (q->retries == 0)
    k3_histogram_observe(k3_metric_default(rt->m.queue_seconds), (double)(q->t_prefill_start - q->t_arrive) / 1e9);
  rc = k3_rpc_unary(rt->cli, q->prefill_addr, "/k3pd.v1.Prefill/Prefill", &pr.base,
                    &k3pd__v1__prefill_response__descriptor, &o, on_prefill_done, q, &q->prefill_call);
  free(ids);
  if (rc) rt_req_fail(q, K3_RPC_INTERNAL, "starting the prefill call: %s", k3_strerror(rc));
}

/* Reserve statuses after which D may or may not hold a reservation: the call was cancelled by us
 * (client cancel/deadline while reserving), hit its deadline, or the connection broke after the
 * request was sent. Definite refusals (RESOURCE_EXHAUSTED, INVALID_ARGUMENT, ALREADY_EXISTS,
 * FAILED_PRECONDITION) reserved nothing. */
static bool reserve_outcome_unknown(k3_rpc_code_t c) {
  return c == K3_RPC_CANCELLED || c == K3_RPC_DEADLINE_EXCEEDED || c == K3_RPC_UNAVAILABLE ||
         c == K3_RPC_INTERNAL || c == K3_RPC_UNKNOWN || c == K3_RPC_ABORTED;
}

void rt_req_on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rt_req_t *q = arg;
  q->reserve_call = NULL;
  if (st->code != K3_RPC_OK && reserve_outcome_unknown(st->code)) {
    /* The epoch of such a reservation is unknown (a re-issue changed it, or it was the first):
     * release whatever D holds for this request; it is failing either way. */
    q->busy++;
    rt_req_release_decode_any(q);
    if (q->phase != RQ_DONE) rt_req_fail(q, st->code, "decode worker %s: %s", q->decode_id, st->details);
    q->busy--;
    rt_req_maybe_free(q);
    return;
  }
  if (q->phase == RQ_DONE) {
    if (st->code == K3_RPC_OK) { /* cancelled while reserving: give it back */
      const K3pd__V1__Reservation *r = (const K3pd__V1__Reservation *)resp;
      q->epoch = r->epoch;
      q->released = false;
      rt_req_release_decode(q);
    }
    rt_req_maybe_free(q);
    return;
  }
  if (st->code == K3_RPC_ALREADY_EXISTS && q->epoch != 0) {
    /* A re-issue found the request already admitted: the failed prefill attempt's DONE was
     * accepted just before its deadline fired. The state is on the decode worker and the
     * Attach stream delivers the tokens; nothing to redo. */
    K3_INFO("request %s: re-issue not needed, decode worker %s already admitted it", q->id, q->decode_id);
    return;
  }
  if (st->code != K3_RPC_OK) {
    rt_req_fail(q, st->code, "decode worker %s: %s", q->decode_id, st->details);
    return;
  }
  const K3pd__V1__Reservation *r = (const K3pd__V1__Reservation *)resp;
  bool first = q->epoch == 0;
  q->epoch = r->epoch;
  free(q->desc);
  q->desc = malloc(r->descriptor.len ? r->descriptor.len : 1);
  if (!q->desc) {
    rt_req_fail(q, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
    return;
  }
  memcpy(q->desc, r->descriptor.data, r->descriptor.len);
  q->desc_len = r->descriptor.len;
  if (first) {
    q->t_reserved = k3_now_ns();
    q->phase = RQ_RUNNING;
    if (start_attach(q)) return;
  }
  start_prefill(q);
}
