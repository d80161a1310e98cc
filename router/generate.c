/* k3pd.v1.Generation.Generate on the router: the request flow of ARCHITECTURE.md §2.
 *
 *   validate + tokenize → choose decode D, prefill P → D.Reserve → (P.Prefill ‖ D.Attach)
 *   → relay Attach chunks to the client (incremental detokenisation, stop strings) → final
 *   chunk with finish reason, usage and timings.
 * A prefill that fails with a transport-class status is re-issued to another prefill worker
 * against the same reservation (D.Reserve again → new epoch), up to --prefill-retries times.
 * Client cancel / deadline: Abort on P, cancel the Attach stream and Release on D.
 * One log line per request with its timings. */
#include <jansson.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/chat.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"
#include "k3pd/v1/generation.pb-c.h"
#include "k3pd/v1/prefill.pb-c.h"
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
  int64_t pending_pages;  /* counted in the decode worker's in-flight total until freed */
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

static const char *status_label(k3_rpc_code_t c) {
  switch (c) {
    case K3_RPC_OK: return K3PD_STATUS_OK;
    case K3_RPC_CANCELLED: return K3PD_STATUS_CANCELLED;
    case K3_RPC_INVALID_ARGUMENT: return K3PD_STATUS_INVALID_ARGUMENT;
    case K3_RPC_DEADLINE_EXCEEDED: return K3PD_STATUS_DEADLINE_EXCEEDED;
    case K3_RPC_RESOURCE_EXHAUSTED: return K3PD_STATUS_RESOURCE_EXHAUSTED;
    case K3_RPC_UNAVAILABLE: return K3PD_STATUS_UNAVAILABLE;
    default: return K3PD_STATUS_INTERNAL;
  }
}

/* Final accounting of a request that reached the stream phase (called once). */
static void account_end(rt_req_t *q, k3_rpc_code_t code) {
  rt_router_t *rt = q->rt;
  const char *st = status_label(code);
  k3_metric_inc(rt->m.requests_total, &st);
  double now = (double)k3_now_ns();
  k3_histogram_observe(k3_metric_default(rt->m.e2e_seconds), (now - (double)q->t_arrive) / 1e9);
  k3_counter_add(k3_metric_default(rt->m.prompt_tokens_total), (double)q->n_prompt);
  k3_counter_add(k3_metric_default(rt->m.generation_tokens_total), (double)q->completion_tokens);
  k3_histogram_observe(k3_metric_default(rt->m.added_latency_seconds), (double)q->router_ns / 1e9);
  if (q->counted) {
    k3_gauge_add(k3_metric_default(rt->m.active_streams), -1);
    q->counted = false;
  }
}

static void req_fail(rt_req_t *q, k3_rpc_code_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void start_prefill(rt_req_t *q);


uint32_t rt_live_requests(const rt_router_t *rt) {
  uint32_t n = 0;
  for (const rt_req_t *q = rt->reqs; q; q = q->next) n++;
  return n;
}

static void req_free(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  rt_worker_t *dw = q->decode_id[0] ? rt_registry_find(&rt->reg, q->decode_id) : NULL;
  if (dw && dw->incarnation == q->decode_gen) rt_worker_sub_inflight(dw, q->pending_pages, 1);
  for (rt_req_t **pp = &rt->reqs; *pp; pp = &(*pp)->next) {
    if (*pp == q) {
      *pp = q->next;
      break;
    }
  }
  free(q->prompt);
  free(q->stop_ids);
  for (size_t i = 0; i < q->n_stop_strs; i++) free(q->stop_strs[i]);
  free(q->stop_strs);
  free(q->desc);
  k3_detok_free(q->detok);
  free(q);
}

/* The request's memory goes once no call of ours is in flight and the client call ended. */
static void maybe_free(rt_req_t *q) {
  if (q->busy || q->call || q->reserve_call || q->prefill_call || q->attach_call) return;
  req_free(q);
}

static uint32_t call_timeout(rt_req_t *q) {
  if (q->deadline_left_ms == INT64_MAX) return 0; /* client default */
  int64_t elapsed = (int64_t)((k3_now_ns() - q->t_arrive) / 1000000);
  int64_t left = q->deadline_left_ms - elapsed;
  return left < 1 ? 1 : (uint32_t)left;
}

static rt_worker_t *worker(rt_req_t *q, const char *id) { return rt_registry_find(&q->rt->reg, id); }

static void on_release_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  (void)arg;
  (void)st;
  (void)resp;
}

/* Tells D to drop the reservation (idempotent; fire and forget, bounded by a deadline). */
static void release_decode(rt_req_t *q) {
  if (q->released || !q->decode_addr[0] || !q->epoch) return;
  q->released = true;
  K3pd__V1__ReleaseRequest rr = K3PD__V1__RELEASE_REQUEST__INIT;
  rr.request_id = q->id;
  rr.epoch = q->epoch;
  k3_rpc_call_opts_t o = {.timeout_ms = 2000, .request_id = q->id};
  k3_rpc_unary(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Release", &rr.base,
               &k3pd__v1__release_response__descriptor, &o, on_release_done, NULL, NULL);
}

static void abort_prefill(rt_req_t *q) {
  if (!q->prefill_call) return;
  K3pd__V1__AbortRequest ar = K3PD__V1__ABORT_REQUEST__INIT;
  ar.request_id = q->id;
  k3_rpc_call_opts_t o = {.timeout_ms = 2000, .request_id = q->id};
  k3_rpc_unary(q->rt->cli, q->prefill_addr, "/k3pd.v1.Prefill/Abort", &ar.base, &k3pd__v1__abort_response__descriptor,
               &o, on_release_done, NULL, NULL);
  k3_rpc_ccall_cancel(q->prefill_call);
}

static void log_done(rt_req_t *q, const char *outcome) {
  double ms = 1e-6;
  uint64_t end = q->t_end ? q->t_end : k3_now_ns();
  K3_INFO("request %s %s: prompt %zu tok, completion %u tok, decode %s, prefill %s; queue %.2f ms, prefill %.2f ms, "
          "handoff %.2f ms, first token %.2f ms, total %.2f ms",
          q->id, outcome, q->n_prompt, q->completion_tokens, q->decode_id[0] ? q->decode_id : "-",
          q->prefill_id[0] ? q->prefill_id : "-", q->t_reserved ? (double)(q->t_reserved - q->t_arrive) * ms : 0.0,
          q->t_prefill_done ? (double)(q->t_prefill_done - q->t_prefill_start) * ms : 0.0,
          (double)q->handoff_us / 1e3, q->t_first ? (double)(q->t_first - q->t_arrive) * ms : 0.0,
          (double)(end - q->t_arrive) * ms);
}

static void req_fail(rt_req_t *q, k3_rpc_code_t code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (q->phase == RQ_DONE) return;
  q->phase = RQ_DONE;
  q->busy++;
  q->t_end = k3_now_ns();
  abort_prefill(q);
  if (q->attach_call) k3_rpc_ccall_cancel(q->attach_call);
  if (q->reserve_call) k3_rpc_ccall_cancel(q->reserve_call);
  release_decode(q);
  if (code == K3_RPC_CANCELLED || code == K3_RPC_DEADLINE_EXCEEDED)
    q->rt->n_cancelled++;
  else
    q->rt->n_failed++;
  account_end(q, code);
  log_done(q, k3_rpc_code_name(code));
  if (q->call) {
    k3_rpc_call_t *c = q->call;
    q->call = NULL;
    k3_rpc_call_finish(c, code, msg);
  }
  q->busy--;
  maybe_free(q);
}

/* ---- output ---- */

static void send_chunk(rt_req_t *q, const uint32_t *ids, size_t n, const char *text, size_t text_len,
                       const K3pd__V1__TokenLogprob *const *lps, size_t n_lps, bool final) {
  if (!q->call) return;
  K3pd__V1__GenerateResponse r = K3PD__V1__GENERATE_RESPONSE__INIT;
  K3pd__V1__Usage usage = K3PD__V1__USAGE__INIT;
  K3pd__V1__Timings tm = K3PD__V1__TIMINGS__INIT;
  char *txt = malloc(text_len + 1);
  if (!txt) return;
  memcpy(txt, text, text_len);
  txt[text_len] = 0;
  r.token_ids = (uint32_t *)ids;
  r.n_token_ids = n;
  r.text = txt;
  r.logprobs = (K3pd__V1__TokenLogprob **)lps;
  r.n_logprobs = n_lps;
  if (q->completion_tokens == n && n > 0) r.request_id = q->id; /* first chunk */
  if (final) {
    r.request_id = q->id;
    r.finish_reason = q->finish_reason;
    usage.prompt_tokens = (uint32_t)q->n_prompt;
    usage.completion_tokens = q->completion_tokens;
    r.usage = &usage;
    uint64_t now = k3_now_ns();
    tm.queue_us = q->t_reserved ? (q->t_reserved - q->t_arrive) / 1000 : 0;
    tm.prefill_us = q->t_prefill_done ? (q->t_prefill_done - q->t_prefill_start) / 1000 : 0;
    tm.handoff_us = q->handoff_us;
    tm.first_token_us = q->t_first ? (q->t_first - q->t_arrive) / 1000 : 0;
    tm.decode_us = q->t_first ? (now - q->t_first) / 1000 : 0;
    tm.total_us = (now - q->t_arrive) / 1000;
    r.timings = &tm;
    r.seed = q->sampling.seed;
  }
  k3_rpc_call_write(q->call, &r.base);
  free(txt);
}

static void finish_ok(rt_req_t *q) {
  if (q->phase == RQ_DONE) return;
  q->phase = RQ_DONE;
  q->busy++;
  q->t_end = k3_now_ns();
  k3_tok_str_t tail = {0};
  if (!q->stopped_by_string) k3_detok_finish(q->detok, &tail);
  send_chunk(q, NULL, 0, tail.data ? tail.data : "", tail.len, NULL, 0, true);
  free(tail.data);
  q->rt->n_ok++;
  account_end(q, K3_RPC_OK);
  log_done(q, "ok");
  if (q->call) {
    k3_rpc_call_t *c = q->call;
    q->call = NULL;
    k3_rpc_call_finish(c, K3_RPC_OK, NULL);
  }
  if (q->attach_call) k3_rpc_ccall_cancel(q->attach_call); /* stop string: decode frees */
  q->busy--;
  maybe_free(q);
}

static void on_attach_msg_body(rt_req_t *q, const K3pd__V1__AttachResponse *a);

static void on_attach_msg(void *arg, const ProtobufCMessage *msg) {
  rt_req_t *q = arg;
  RT_TIMED_BEGIN;
  q->busy++;
  on_attach_msg_body(q, (const K3pd__V1__AttachResponse *)msg);
  RT_TIMED_END(q);
  q->busy--;
  maybe_free(q);
}

/* Relays tokens [first_index, first_index + n) of the completion; indices already sent (the
 * first token is forwarded from the Prefill reply as soon as it arrives) are skipped. */
static void relay_tokens(rt_req_t *q, uint32_t first_index, const uint32_t *ids, size_t n,
                         K3pd__V1__TokenLogprob *const *lps, size_t n_lps) {
  size_t skip = first_index < q->completion_tokens ? q->completion_tokens - first_index : 0;
  if (skip >= n) return;
  ids += skip;
  n -= skip;
  if (lps) {
    lps = n_lps > skip ? lps + skip : NULL;
    n_lps = n_lps > skip ? n_lps - skip : 0;
  }
  k3_tok_str_t text = {0};
  size_t n_send = 0;
  bool stop_str = false;
  for (size_t i = 0; i < n && !stop_str; i++) {
    int st = k3_detok_feed(q->detok, (int32_t)ids[i], &text);
    n_send++;
    if (st == K3_DETOK_STOP_STR) stop_str = true;
    if (st < 0) {
      free(text.data);
      req_fail(q, K3_RPC_INTERNAL, "decode worker returned token %u outside the vocabulary", ids[i]);
      return;
    }
  }
  if (n_send) {
    uint64_t now = k3_now_ns();
    if (!q->t_first) {
      q->t_first = now;
      k3_histogram_observe(k3_metric_default(q->rt->m.ttft_seconds), (double)(now - q->t_arrive) / 1e9);
    } else if (q->t_last_tok) {
      /* a chunk of n tokens arriving together counts as n gaps of equal share */
      double gap = (double)(now - q->t_last_tok) / 1e9 / (double)n_send;
      for (size_t i = 0; i < n_send; i++) k3_histogram_observe(k3_metric_default(q->rt->m.itl_seconds), gap);
    }
    q->t_last_tok = now;
  }
  q->completion_tokens += (uint32_t)n_send;
  const K3pd__V1__TokenLogprob *const *out_lps = NULL;
  size_t out_n_lps = 0;
  if (q->want_logprobs && lps && n_lps) {
    out_lps = (const K3pd__V1__TokenLogprob *const *)lps;
    out_n_lps = n_lps < n_send ? n_lps : n_send;
  }
  if (n_send) send_chunk(q, ids, n_send, text.data ? text.data : "", text.len, out_lps, out_n_lps, false);
  free(text.data);
  if (stop_str) {
    q->stopped_by_string = true;
    q->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_STOP;
    finish_ok(q);
  }
}

static void on_attach_msg_body(rt_req_t *q, const K3pd__V1__AttachResponse *a) {
  if (q->phase == RQ_DONE) return;
  if (a->finish_reason) q->finish_reason = a->finish_reason;
  relay_tokens(q, a->first_index, a->token_ids, a->n_token_ids, a->logprobs, a->n_logprobs);
}

static void on_attach_done(void *arg, const k3_rpc_status_t *st) {
  rt_req_t *q = arg;
  q->attach_call = NULL;
  q->attach_done = true;
  q->busy++;
  if (q->phase != RQ_DONE) {
    if (st->code == K3_RPC_OK && q->finish_reason) {
      finish_ok(q);
    } else if (st->code == K3_RPC_OK) {
      req_fail(q, K3_RPC_INTERNAL, "decode stream ended without a finish reason");
    } else {
      req_fail(q, st->code == K3_RPC_CANCELLED ? K3_RPC_UNAVAILABLE : st->code, "decode worker %s: %s",
               q->decode_id, st->details);
    }
  }
  q->busy--;
  maybe_free(q);
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
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q), .request_id = q->id};
  int rc = k3_rpc_stream(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Attach", &ar.base,
                         &k3pd__v1__attach_response__descriptor, &o, on_attach_msg, on_attach_done, q, &q->attach_call);
  if (rc) {
    req_fail(q, K3_RPC_INTERNAL, "starting the decode stream: %s", k3_strerror(rc));
    return K3_EINTERNAL;
  }
  return 0;
}

/* ---- prefill (with retries) ---- */

/* Prefill failures worth another prefill worker: transport-class errors, and a deadline that
 * was the transfer's (clamped to the reservation lease) rather than the client's own. */
static bool retryable(rt_req_t *q, k3_rpc_code_t c) {
  if (c == K3_RPC_DEADLINE_EXCEEDED) return q->deadline_left_ms == INT64_MAX || call_timeout(q) > 1000;
  return c == K3_RPC_UNAVAILABLE || c == K3_RPC_INTERNAL || c == K3_RPC_ABORTED || c == K3_RPC_UNKNOWN ||
         c == K3_RPC_CANCELLED;
}

static void on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp);

static void on_prefill_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rt_req_t *q = arg;
  q->prefill_call = NULL;
  rt_worker_t *pw = worker(q, q->prefill_id);
  if (pw) rt_worker_sub_pending(pw, (int64_t)q->n_prompt);
  if (q->phase == RQ_DONE) {
    maybe_free(q);
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
      relay_tokens(q, 0, &tok, 1, q->want_logprobs ? &lpp : NULL, q->want_logprobs ? 1 : 0);
      q->busy--;
      maybe_free(q);
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
    k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q), .request_id = q->id};
    int rc = k3_rpc_unary(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Reserve", &rr.base,
                          &k3pd__v1__reservation__descriptor, &o, on_reserve_done, q, &q->reserve_call);
    if (rc) req_fail(q, K3_RPC_INTERNAL, "re-reserving: %s", k3_strerror(rc));
    return;
  }
  req_fail(q, st->code, "prefill worker %s: %s", q->prefill_id, st->details);
}

static void start_prefill(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  const char *ex[RT_MAX_EXCLUDE];
  for (int i = 0; i < q->n_excluded; i++) ex[i] = q->excluded[i];
  size_t pi;
  rt_worker_t *dw = worker(q, q->decode_id);
  int rc = rt_choose_prefill(&rt->reg, dw ? dw->info.fingerprint : 0, ex, (size_t)q->n_excluded, &pi);
  if (rc) {
    req_fail(q, K3_RPC_UNAVAILABLE, "no prefill worker is available%s",
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
    req_fail(q, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
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
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q), .request_id = q->id};
  q->t_prefill_start = k3_now_ns();
  if (q->retries == 0)
    k3_histogram_observe(k3_metric_default(rt->m.queue_seconds), (double)(q->t_prefill_start - q->t_arrive) / 1e9);
  rc = k3_rpc_unary(rt->cli, q->prefill_addr, "/k3pd.v1.Prefill/Prefill", &pr.base,
                    &k3pd__v1__prefill_response__descriptor, &o, on_prefill_done, q, &q->prefill_call);
  free(ids);
  if (rc) req_fail(q, K3_RPC_INTERNAL, "starting the prefill call: %s", k3_strerror(rc));
}

static void on_reserve_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  rt_req_t *q = arg;
  q->reserve_call = NULL;
  if (q->phase == RQ_DONE) {
    if (st->code == K3_RPC_OK) { /* cancelled while reserving: give it back */
      const K3pd__V1__Reservation *r = (const K3pd__V1__Reservation *)resp;
      q->epoch = r->epoch;
      q->released = false;
      release_decode(q);
    }
    maybe_free(q);
    return;
  }
  if (st->code != K3_RPC_OK) {
    req_fail(q, st->code, "decode worker %s: %s", q->decode_id, st->details);
    return;
  }
  const K3pd__V1__Reservation *r = (const K3pd__V1__Reservation *)resp;
  bool first = q->epoch == 0;
  q->epoch = r->epoch;
  free(q->desc);
  q->desc = malloc(r->descriptor.len ? r->descriptor.len : 1);
  if (!q->desc) {
    req_fail(q, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
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

/* ---- request intake ---- */

/* Prepends `prefix` to the message in err (truncating its end if needed). */
static void prefix_err(char *err, size_t errlen, const char *prefix) {
  size_t pl = strlen(prefix), ml = strlen(err);
  if (pl >= errlen) return;
  if (pl + ml >= errlen) ml = errlen - pl - 1;
  memmove(err + pl, err, ml);
  memcpy(err, prefix, pl);
  err[pl + ml] = 0;
}

static int build_prompt(rt_router_t *rt, const K3pd__V1__GenerateRequest *g, rt_req_t *q, char *err, size_t errlen) {
  k3_tok_ids_t ids = {0};
  int rc = 0;
  switch (g->input_case) {
    case K3PD__V1__GENERATE_REQUEST__INPUT_TEXT:
      if (!g->text || !*g->text) {
        snprintf(err, errlen, "text: must not be empty");
        return K3_EINVAL;
      }
      rc = k3_tok_encode(rt->tok, g->text, strlen(g->text), 0, &ids, err, errlen);
      if (rc) {
        if (strncmp(err, "text", 4) != 0) prefix_err(err, errlen, "text: ");
        free(ids.ids);
        return K3_EINVAL;
      }
      break;
    case K3PD__V1__GENERATE_REQUEST__INPUT_CHAT: {
      const K3pd__V1__ChatInput *c = g->chat;
      if (!c || c->n_messages == 0) {
        snprintf(err, errlen, "chat.messages: at least one message is required");
        return K3_EINVAL;
      }
      json_t *arr = json_array();
      static const char *roles[] = {NULL, "system", "user", "assistant", "tool"};
      for (size_t i = 0; i < c->n_messages; i++) {
        const K3pd__V1__ChatMessage *m = c->messages[i];
        if (m->role < 1 || m->role > 4) {
          snprintf(err, errlen, "chat.messages[%zu].role: must be SYSTEM, USER, ASSISTANT or TOOL", i);
          json_decref(arr);
          return K3_EINVAL;
        }
        json_t *o = json_object();
        json_object_set_new(o, "role", json_string(roles[m->role]));
        json_t *content = json_stringn(m->content ? m->content : "", strlen(m->content ? m->content : ""));
        if (!content) {
          snprintf(err, errlen, "chat.messages[%zu].content: invalid UTF-8", i);
          json_decref(o);
          json_decref(arr);
          return K3_EINVAL;
        }
        json_object_set_new(o, "content", content);
        if (m->name && *m->name) json_object_set_new(o, "name", json_string(m->name));
        if (m->tool_call_id && *m->tool_call_id) json_object_set_new(o, "tool_call_id", json_string(m->tool_call_id));
        if (m->n_tool_calls) {
          json_t *tcs = json_array();
          for (size_t k = 0; k < m->n_tool_calls; k++) {
            json_t *tc = json_object(), *fn = json_object();
            json_object_set_new(fn, "name", json_string(m->tool_calls[k]->name ? m->tool_calls[k]->name : ""));
            json_object_set_new(fn, "arguments",
                                json_string(m->tool_calls[k]->arguments_json ? m->tool_calls[k]->arguments_json : "{}"));
            json_object_set_new(tc, "id", json_string(m->tool_calls[k]->id ? m->tool_calls[k]->id : ""));
            json_object_set_new(tc, "type", json_string("function"));
            json_object_set_new(tc, "function", fn);
            json_array_append_new(tcs, tc);
          }
          json_object_set_new(o, "tool_calls", tcs);
        }
        json_array_append_new(arr, o);
      }
      k3_chat_opts_t co;
      k3_chat_opts_default(&co);
      co.add_generation_prompt = c->add_generation_prompt;
      rc = k3_chat_render(rt->tok, arr, &co, &ids, err, errlen);
      json_decref(arr);
      if (rc) {
        prefix_err(err, errlen, "chat: ");
        free(ids.ids);
        return K3_EINVAL;
      }
      break;
    }
    case K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS:
      if (!g->token_ids || g->token_ids->n_ids == 0) {
        snprintf(err, errlen, "token_ids.ids: at least one token is required");
        return K3_EINVAL;
      }
      for (size_t i = 0; i < g->token_ids->n_ids; i++) {
        if ((int64_t)g->token_ids->ids[i] >= rt->cfg.vocab_size) {
          snprintf(err, errlen, "token_ids.ids[%zu]: %u is outside the vocabulary (%lld)", i, g->token_ids->ids[i],
                   (long long)rt->cfg.vocab_size);
          free(ids.ids);
          return K3_EINVAL;
        }
        if (k3_tok_ids_push(&ids, (int32_t)g->token_ids->ids[i])) {
          free(ids.ids);
          return K3_ENOMEM;
        }
      }
      break;
    default:
      snprintf(err, errlen, "input: one of text, chat or token_ids is required");
      return K3_EINVAL;
  }
  if (ids.n == 0) {
    snprintf(err, errlen, "prompt: encodes to zero tokens");
    free(ids.ids);
    return K3_EINVAL;
  }
  q->prompt = ids.ids;
  q->n_prompt = ids.n;
  return 0;
}

static int parse_sampling(rt_router_t *rt, const K3pd__V1__GenerateRequest *g, rt_req_t *q, char *err, size_t errlen) {
  k3pd__v1__sampling_params__init(&q->sampling);
  const K3pd__V1__SamplingParams *s = g->sampling;
  if (s) {
    if (s->temperature_opt_case == K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE) {
      if (!isfinite(s->temperature) || s->temperature < 0 || s->temperature > 100) {
        snprintf(err, errlen, "sampling.temperature: must be in [0, 100]");
        return K3_EINVAL;
      }
      q->sampling.temperature_opt_case = s->temperature_opt_case;
      q->sampling.temperature = s->temperature;
    }
    if (s->top_p_opt_case == K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P) {
      if (!(s->top_p > 0 && s->top_p <= 1)) {
        snprintf(err, errlen, "sampling.top_p: must be in (0, 1]");
        return K3_EINVAL;
      }
      q->sampling.top_p_opt_case = s->top_p_opt_case;
      q->sampling.top_p = s->top_p;
    }
    if (s->top_k < 0) {
      snprintf(err, errlen, "sampling.top_k: must be >= 0");
      return K3_EINVAL;
    }
    q->sampling.top_k = s->top_k;
  }
  q->sampling.seed_opt_case = K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
  if (s && s->seed_opt_case == K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED)
    q->sampling.seed = s->seed;
  else
    q->sampling.seed = k3_hash64(q->id, strlen(q->id), k3_now_ns() ^ (uint64_t)k3_wall_ms());
  const K3pd__V1__StopConditions *st = g->stop;
  if (!st || st->max_new_tokens < 1) {
    snprintf(err, errlen, "stop.max_new_tokens: must be >= 1");
    return K3_EINVAL;
  }
  if (st->max_new_tokens > rt->max_new_tokens_limit) {
    snprintf(err, errlen, "stop.max_new_tokens: %u exceeds the limit %u", st->max_new_tokens,
             rt->max_new_tokens_limit);
    return K3_EINVAL;
  }
  q->max_new = st->max_new_tokens;
  if (st->n_stop_strings > 16) {
    snprintf(err, errlen, "stop.stop_strings: at most 16");
    return K3_EINVAL;
  }
  q->stop_strs = calloc(st->n_stop_strings + 1, sizeof *q->stop_strs);
  q->stop_ids = calloc(st->n_stop_token_ids + (size_t)rt->n_eos_ids + 1, sizeof *q->stop_ids);
  if (!q->stop_strs || !q->stop_ids) return K3_ENOMEM;
  for (size_t i = 0; i < st->n_stop_strings; i++) {
    const char *x = st->stop_strings[i];
    if (!x || !*x || k3_tok_utf8_valid_prefix(x, strlen(x)) != strlen(x)) {
      snprintf(err, errlen, "stop.stop_strings[%zu]: must be non-empty valid UTF-8", i);
      return K3_EINVAL;
    }
    q->stop_strs[q->n_stop_strs++] = strdup(x);
  }
  for (size_t i = 0; i < st->n_stop_token_ids; i++) {
    if ((int64_t)st->stop_token_ids[i] >= rt->cfg.vocab_size) {
      snprintf(err, errlen, "stop.stop_token_ids[%zu]: %u is outside the vocabulary", i, st->stop_token_ids[i]);
      return K3_EINVAL;
    }
    q->stop_ids[q->n_stop_ids++] = st->stop_token_ids[i];
  }
  if (!st->ignore_eos)
    for (int i = 0; i < rt->n_eos_ids; i++) q->stop_ids[q->n_stop_ids++] = (uint32_t)rt->eos_ids[i];
  q->want_logprobs = g->return_logprobs;
  return 0;
}

static void on_client_cancel(k3_rpc_call_t *call, void *arg) {
  rt_req_t *q = arg;
  if (q->call != call) return;
  int64_t left = k3_rpc_call_deadline_left_ms(call);
  req_fail(q, left <= 0 ? K3_RPC_DEADLINE_EXCEEDED : K3_RPC_CANCELLED,
           left <= 0 ? "deadline exceeded" : "cancelled by the client");
}

static void on_generate(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__GenerateRequest *g = (const K3pd__V1__GenerateRequest *)msg;
  char err[512];
  RT_TIMED_BEGIN;
  if (rt->draining) {
    k3_rpc_call_finish(call, K3_RPC_UNAVAILABLE, "router is draining");
    return;
  }
  if (g->model && *g->model && strcmp(g->model, rt->model_name) != 0) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "model: unknown model \"%s\" (this cluster serves \"%s\")",
                        g->model, rt->model_name);
    return;
  }
  rt_req_t *q = calloc(1, sizeof *q);
  if (!q) {
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "router out of memory");
    return;
  }
  q->rt = rt;
  q->t_arrive = k3_now_ns();
  q->deadline_left_ms = k3_rpc_call_deadline_left_ms(call);
  const char *rid = g->request_id && *g->request_id ? g->request_id : k3_rpc_call_metadata(call, "x-request-id");
  if (rid && *rid) {
    size_t n = strlen(rid);
    bool ok = n <= 128;
    for (size_t i = 0; ok && i < n; i++) ok = rid[i] > 32 && rid[i] < 127;
    if (!ok) {
      free(q);
      k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "request_id: at most 128 printable ASCII characters");
      return;
    }
    snprintf(q->id, sizeof q->id, "%s", rid);
  } else {
    snprintf(q->id, sizeof q->id, "r%llx-%llu", (unsigned long long)(k3_wall_ms() & 0xffffffffff),
             (unsigned long long)++rt->next_req);
  }
  for (rt_req_t *o = rt->reqs; o; o = o->next) {
    if (strcmp(o->id, q->id) == 0) {
      free(q);
      k3_rpc_call_finish(call, K3_RPC_ALREADY_EXISTS, "request_id: a request with this id is in flight");
      return;
    }
  }
  q->next = rt->reqs;
  rt->reqs = q;
  rt->n_started++;
  k3_counter_inc(k3_metric_default(rt->m.requests_started_total));
  int rc = parse_sampling(rt, g, q, err, sizeof err);
  if (!rc) rc = build_prompt(rt, g, q, err, sizeof err);
  if (rc) {
    rt->n_failed++;
    k3_rpc_code_t code = rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : K3_RPC_INVALID_ARGUMENT;
    account_end(q, code);
    K3_INFO("request %s %s: %s", q->id, k3_rpc_code_name(code), err);
    k3_rpc_call_finish(call, code, err);
    req_free(q);
    return;
  }
  k3_detok_opts_t dopt = {.stop_ids = (const int32_t *)q->stop_ids,
                          .n_stop_ids = q->n_stop_ids,
                          .stop_strs = (const char *const *)q->stop_strs,
                          .n_stop_strs = q->n_stop_strs,
                          .skip_special = false};
  if (k3_detok_init(rt->tok, &dopt, &q->detok)) {
    rt->n_failed++;
    account_end(q, K3_RPC_INVALID_ARGUMENT);
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "stop.stop_strings: invalid");
    req_free(q);
    return;
  }
  q->call = call;
  q->counted = true;
  k3_gauge_add(k3_metric_default(rt->m.active_streams), 1);
  k3_rpc_call_set_cancel_cb(call, on_client_cancel, q);
  size_t di;
  int64_t max_ctx = rt_max_context(&rt->reg, 0);
  if (max_ctx > 0 && (int64_t)q->n_prompt + q->max_new > max_ctx) {
    req_fail(q, K3_RPC_INVALID_ARGUMENT,
             "prompt: %zu tokens + stop.max_new_tokens %u exceed the context limit of %lld tokens", q->n_prompt,
             q->max_new, (long long)max_ctx);
    return;
  }
  rc = rt_choose_decode(&rt->reg, (int64_t)q->n_prompt, q->max_new, 0, &di);
  if (rc == K3_ECAPACITY) rc = rt_choose_decode_optimistic(&rt->reg, (int64_t)q->n_prompt, q->max_new, 0, &di);
  if (rc == K3_EUNAVAIL) {
    req_fail(q, K3_RPC_UNAVAILABLE, "no decode worker is registered");
    return;
  }
  if (rc == K3_ECAPACITY) {
    req_fail(q, K3_RPC_RESOURCE_EXHAUSTED,
             "no decode worker has capacity for %zu prompt + %u new tokens right now (retry later)", q->n_prompt,
             q->max_new);
    return;
  }
  rt_worker_t *dw = &rt->reg.workers[di];
  size_t pi;
  if (rt_choose_prefill(&rt->reg, dw->info.fingerprint, NULL, 0, &pi)) {
    req_fail(q, K3_RPC_UNAVAILABLE, "no prefill worker is registered for this model");
    return;
  }
  snprintf(q->decode_id, sizeof q->decode_id, "%s", dw->info.id);
  snprintf(q->decode_addr, sizeof q->decode_addr, "%s", dw->info.address);
  q->pending_pages = rt_pages_needed((int64_t)q->n_prompt, q->max_new, dw->info.page_tokens);
  rt_worker_add_inflight(dw, q->pending_pages, 1);
  q->decode_gen = dw->incarnation;
  K3pd__V1__ReserveRequest rr = K3PD__V1__RESERVE_REQUEST__INIT;
  rr.request_id = q->id;
  rr.n_prompt_tokens = (uint32_t)q->n_prompt;
  rr.max_new_tokens = q->max_new;
  rr.lease_ms = rt->lease_ms;
  k3_rpc_call_opts_t o = {.timeout_ms = call_timeout(q), .request_id = q->id};
  RT_TIMED_END(q); /* validation, tokenisation and placement */
  rc = k3_rpc_unary(rt->cli, q->decode_addr, "/k3pd.v1.Decode/Reserve", &rr.base, &k3pd__v1__reservation__descriptor,
                    &o, on_reserve_done, q, &q->reserve_call);
  if (rc) req_fail(q, K3_RPC_INTERNAL, "starting the reservation: %s", k3_strerror(rc));
}

int rt_generate_register(rt_router_t *rt) {
  return k3_rpc_server_add_method(rt->srv, "/k3pd.v1.Generation/Generate", K3_RPC_SERVER_STREAM,
                                  &k3pd__v1__generate_request__descriptor, on_generate, rt);
}
