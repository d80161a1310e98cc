/* k3pd-router, one request's lifetime and output: relaying tokens to the front's sink with
 * incremental detokenisation and stop strings, finishing (the sink writes the final chunk with
 * finish reason, usage and timings) or failing it (propagating cancel to both workers), metrics
 * and the one log line per request, and freeing it. Front-neutral: see req.h. */
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
void rt_req_account_end(rt_req_t *q, k3_rpc_code_t code) {
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

uint32_t rt_live_requests(const rt_router_t *rt) {
  uint32_t n = 0;
  for (const rt_req_t *q = rt->reqs; q; q = q->next) n++;
  return n;
}

/* Takes the request's pages and slot out of its decode worker's in-flight total (once). Done as
 * soon as the request ends, not when its memory goes: a worker call may still be completing then
 * (e.g. the Prefill reply after the last token), and a client that sends its next request as
 * soon as the previous one ended must not be refused for capacity the router still counted. */
void rt_req_drop_inflight(rt_req_t *q) {
  if (q->pending_pages <= 0) return;
  rt_worker_t *dw = q->decode_id[0] ? rt_registry_find(&q->rt->reg, q->decode_id) : NULL;
  if (dw && dw->incarnation == q->decode_gen) rt_worker_sub_inflight(dw, q->pending_pages, 1);
  q->pending_pages = 0;
}

void rt_req_free(rt_req_t *q) {
  rt_router_t *rt = q->rt;
  if (rt->trace) rt_trace_write(q);
  rt_req_drop_inflight(q);
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
  free(q->sent);
  k3_detok_free(q->detok);
  free(q);
}

/* The request's memory goes once no call of ours is in flight and the sink was detached. */
void rt_req_maybe_free(rt_req_t *q) {
  if (q->busy || q->sink || q->reserve_call || q->prefill_call || q->attach_call || q->stale_calls) return;
  rt_req_free(q);
}

uint32_t rt_req_timeout(rt_req_t *q) {
  if (q->deadline_left_ms == INT64_MAX) return RT_NO_DEADLINE_MS;
  int64_t elapsed = (int64_t)((k3_now_ns() - q->t_arrive) / 1000000);
  int64_t left = q->deadline_left_ms - elapsed;
  return left < 1 ? 1 : (uint32_t)left;
}


static void on_release_done(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  (void)arg;
  (void)st;
  (void)resp;
}

static void send_release(rt_req_t *q, uint64_t epoch) {
  q->released = true;
  K3pd__V1__ReleaseRequest rr = K3PD__V1__RELEASE_REQUEST__INIT;
  rr.request_id = q->wid;
  rr.epoch = epoch;
  k3_rpc_call_opts_t o = {.timeout_ms = 2000, .request_id = q->id};
  k3_rpc_unary(q->rt->cli, q->decode_addr, "/k3pd.v1.Decode/Release", &rr.base,
               &k3pd__v1__release_response__descriptor, &o, on_release_done, NULL, NULL);
}

/* Tells D to drop the reservation (idempotent; fire and forget, bounded by a deadline). */
void rt_req_release_decode(rt_req_t *q) {
  if (q->released || !q->decode_addr[0] || !q->epoch) return;
  send_release(q, q->epoch);
}

void rt_req_release_decode_any(rt_req_t *q) {
  if (!q->decode_addr[0]) return;
  send_release(q, 0);
}

void rt_req_abort_prefill(rt_req_t *q) {
  if (!q->prefill_call) return;
  K3pd__V1__AbortRequest ar = K3PD__V1__ABORT_REQUEST__INIT;
  ar.request_id = q->wid;
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
          q->t_prefill_done > q->t_prefill_start ? (double)(q->t_prefill_done - q->t_prefill_start) * ms : 0.0,
          (double)q->handoff_us / 1e3, q->t_first ? (double)(q->t_first - q->t_arrive) * ms : 0.0,
          (double)(end - q->t_arrive) * ms);
}

void rt_req_fail(rt_req_t *q, k3_rpc_code_t code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  code = rt_status_public(code, msg, sizeof msg); /* only documented codes reach clients (status.c) */
  if (q->phase == RQ_DONE) return;
  q->phase = RQ_DONE;
  q->busy++;
  q->t_end = k3_now_ns();
  if (q->rt->trace) q->tr[RT_TR_END] = q->t_end;
  rt_req_drop_inflight(q);
  rt_req_abort_prefill(q);
  if (q->attach_call) k3_rpc_ccall_cancel(q->attach_call);
  if (q->reserve_call) k3_rpc_ccall_cancel(q->reserve_call);
  rt_req_release_decode(q);
  if (code == K3_RPC_CANCELLED || code == K3_RPC_DEADLINE_EXCEEDED)
    q->rt->n_cancelled++;
  else
    q->rt->n_failed++;
  rt_req_account_end(q, code);
  log_done(q, k3_rpc_code_name(code));
  if (q->sink) {
    const rt_sink_t *sk = q->sink;
    q->sink = NULL;
    sk->fail(q, q->sink_ctx, code, msg);
  }
  q->busy--;
  rt_req_maybe_free(q);
}

/* ---- output ---- */

void rt_req_finish_ok(rt_req_t *q) {
  if (q->phase == RQ_DONE) return;
  q->phase = RQ_DONE;
  q->busy++;
  q->t_end = k3_now_ns();
  if (q->rt->trace) q->tr[RT_TR_END] = q->t_end;
  rt_req_drop_inflight(q);
  k3_tok_str_t tail = {0};
  if (!q->stopped_by_string && q->detok) k3_detok_finish(q->detok, &tail);
  q->rt->n_ok++;
  rt_req_account_end(q, K3_RPC_OK);
  log_done(q, "ok");
  if (q->sink) {
    const rt_sink_t *sk = q->sink;
    q->sink = NULL;
    sk->finish(q, q->sink_ctx, tail.data ? tail.data : "", tail.len);
  }
  free(tail.data);
  if (q->attach_call) k3_rpc_ccall_cancel(q->attach_call); /* stop string: decode frees */
  q->busy--;
  rt_req_maybe_free(q);
}

void rt_req_finish_error(rt_req_t *q, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (q->phase == RQ_DONE) return;
  q->phase = RQ_DONE;
  q->busy++;
  q->t_end = k3_now_ns();
  if (q->rt->trace) q->tr[RT_TR_END] = q->t_end;
  q->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR;
  rt_req_drop_inflight(q);
  rt_req_abort_prefill(q);
  if (q->attach_call) k3_rpc_ccall_cancel(q->attach_call);
  if (q->reserve_call) k3_rpc_ccall_cancel(q->reserve_call);
  rt_req_release_decode(q);
  k3_tok_str_t tail = {0};
  if (!q->stopped_by_string && q->detok) k3_detok_finish(q->detok, &tail);
  q->rt->n_failed++;
  rt_req_account_end(q, K3_RPC_UNAVAILABLE);
  K3_WARN("request %s: ends with FINISH_REASON_ERROR after %u tokens: %s", q->id, q->completion_tokens, msg);
  log_done(q, "error");
  if (q->sink) {
    const rt_sink_t *sk = q->sink;
    q->sink = NULL;
    sk->finish(q, q->sink_ctx, tail.data ? tail.data : "", tail.len);
  }
  free(tail.data);
  q->busy--;
  rt_req_maybe_free(q);
}

/* Records a relayed id (for the replay check of a resumed attempt). */
static int remember_sent(rt_req_t *q, uint32_t idx, uint32_t id) {
  if (idx >= q->cap_sent) {
    uint32_t nc = q->cap_sent ? q->cap_sent * 2 : 16;
    if (nc <= idx) nc = idx + 16;
    uint32_t *ns = realloc(q->sent, nc * sizeof *ns);
    if (!ns) return K3_ENOMEM;
    q->sent = ns;
    q->cap_sent = nc;
  }
  q->sent[idx] = id;
  return 0;
}

/* Relays tokens [first_index, first_index + n) of the completion; indices already sent (the
 * first token is forwarded from the Prefill reply as soon as it arrives; a resumed attempt
 * replays everything streamed before) are skipped after checking they equal what was sent. */
void rt_req_relay(rt_req_t *q, uint32_t first_index, const uint32_t *ids, size_t n,
                         K3pd__V1__TokenLogprob *const *lps, size_t n_lps) {
  size_t skip = first_index < q->completion_tokens ? q->completion_tokens - first_index : 0;
  if (skip > n) skip = n;
  for (size_t i = 0; i < skip; i++) {
    if (ids[i] != q->sent[first_index + i]) {
      rt_req_finish_error(q, "decode worker %s replayed token %u at index %zu where %u was streamed", q->decode_id,
                          ids[i], first_index + i, q->sent[first_index + i]);
      return;
    }
  }
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
    /* no tokenizer (token-only router): ids only, no text, no stop strings */
    int st = q->detok ? k3_detok_feed(q->detok, (int32_t)ids[i], &text)
                      : (int64_t)ids[i] < q->rt->cfg.vocab_size ? 0 : -1;
    if (st >= 0 && remember_sent(q, q->completion_tokens + (uint32_t)n_send, ids[i])) st = K3_ENOMEM;
    n_send++;
    if (st == K3_DETOK_STOP_STR) stop_str = true;
    if (st < 0) {
      free(text.data);
      rt_req_fail(q, K3_RPC_INTERNAL, "decode worker returned token %u outside the vocabulary", ids[i]);
      return;
    }
  }
  if (n_send) {
    uint64_t now = k3_now_ns();
    if (!q->t_first) {
      q->t_first = now;
      if (q->rt->trace) q->tr[RT_TR_FIRST_OUT] = now;
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
  if (n_send && q->sink)
    q->sink->tokens(q, q->sink_ctx, ids, n_send, text.data ? text.data : "", text.len, out_lps, out_n_lps);
  free(text.data);
  if (stop_str) {
    q->stopped_by_string = true;
    q->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_STOP;
    rt_req_finish_ok(q);
  }
}
