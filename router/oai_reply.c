/* The OpenAI front's sink: the generation's output as OpenAI objects (the request side is
 * oai_request.c). Shapes follow the OpenAI API reference:
 *   chat, whole:      chat.completion {id, object, created, model, system_fingerprint,
 *                     choices[{index, message{role, content, reasoning_content, tool_calls?,
 *                     refusal}, logprobs, finish_reason}], usage}
 *   chat, stream:     chat.completion.chunk per event: first {"role":"assistant","content":""},
 *                     then deltas of reasoning_content / content / tool_calls (the first delta
 *                     of a call carries index, id, type and name, later ones arguments pieces),
 *                     finish_reason null until the last chunk (delta {}); with
 *                     stream_options.include_usage every chunk has "usage": null and a last
 *                     chunk with empty choices carries the usage; then "data: [DONE]".
 *   completions:      text_completion, whole or one chunk per relay, the same framing.
 * The text goes through the XTML parser (xtml_out.h) for chat; a streamed and a whole response
 * of the same request are built from the same events, so they agree. An error before the
 * stream starts is an HTTP status with an OpenAI error object; after it, a data: event
 * {"error": {...}} followed by [DONE].
 * Stream events are coalesced per relay (one chunk per kind of delta per batch of tokens), so
 * the per-token cost is one parser pass and one small JSON object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "oai.h"

void rt_oai_free(void *p) {
  rt_oai_t *o = p;
  if (!o) return;
  rt_xtml_free(&o->xo);
  free(o->pend.data);
  free(o->content.data);
  free(o->reasoning.data);
  for (size_t i = 0; i < o->n_calls; i++) {
    free(o->calls[i].name.data);
    free(o->calls[i].args.data);
  }
  free(o->calls);
  free(o->lp.s.data);
  free(o->lp_vals.s.data);
  free(o->lp_offs.s.data);
  free(o->ids.s.data);
  free(o);
}

/* ---- errors ---- */

unsigned rt_http_status_of(k3_rpc_code_t code, const char **type, const char **ecode) {
  switch (code) {
    case K3_RPC_INVALID_ARGUMENT: *type = "invalid_request_error"; *ecode = "invalid_value"; return 400;
    case K3_RPC_NOT_FOUND: *type = "invalid_request_error"; *ecode = "not_found"; return 404;
    case K3_RPC_ALREADY_EXISTS: *type = "invalid_request_error"; *ecode = "request_id_in_use"; return 409;
    case K3_RPC_RESOURCE_EXHAUSTED: *type = "rate_limit_error"; *ecode = "capacity_exhausted"; return 429;
    case K3_RPC_CANCELLED: *type = "invalid_request_error"; *ecode = "cancelled"; return 499;
    case K3_RPC_UNAVAILABLE: *type = "service_unavailable_error"; *ecode = "unavailable"; return 503;
    case K3_RPC_DEADLINE_EXCEEDED: *type = "timeout_error"; *ecode = "deadline_exceeded"; return 504;
    default: *type = "server_error"; *ecode = "internal_error"; return 500;
  }
}

/* k3pd.v1 field paths in the request path's messages, and what this front calls them. */
static const char *oai_param(const rt_oai_t *o, const char *path, size_t n, char *buf, size_t cap) {
  static const struct {
    const char *from, *to;
  } map[] = {{"sampling.temperature", "temperature"}, {"sampling.top_p", "top_p"}, {"sampling.top_k", "top_k"},
             {"stop.stop_strings", "stop"},           {"stop.stop_token_ids", "stop_token_ids"},
             {"token_ids.ids", "prompt"},             {"text", "prompt"},
             {"chat.thinking_effort", "reasoning_effort"}, {"thinking_effort", "reasoning_effort"},
             {"request_id", "X-Request-Id"}};
  if (n == 19 && strncmp(path, "stop.max_new_tokens", 19) == 0) return o->max_field;
  if (n == 6 && strncmp(path, "prompt", 6) == 0) return o->chat ? "messages" : "prompt";
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    size_t fl = strlen(map[i].from);
    if (n >= fl && strncmp(path, map[i].from, fl) == 0 && (n == fl || path[fl] == '[' || path[fl] == '.')) {
      snprintf(buf, cap, "%s%.*s", map[i].to, (int)(n - fl), path + fl);
      return buf;
    }
  }
  snprintf(buf, cap, "%.*s", (int)n, path);
  return buf;
}

void rt_oai_fail(rt_oai_t *o, k3_rpc_code_t code, const char *msg) {
  const char *type, *ecode;
  unsigned status = rt_http_status_of(code, &type, &ecode);
  /* "<path>: <problem>" → param and the message in this front's names */
  const char *colon = strstr(msg, ": ");
  const char *param = NULL;
  char pbuf[160];
  size_t plen = colon ? (size_t)(colon - msg) : 0;
  bool is_path = plen > 0 && plen < 120 && !memchr(msg, ' ', plen);
  if (is_path) param = oai_param(o, msg, plen, pbuf, sizeof pbuf);
  if (code == K3_RPC_INVALID_ARGUMENT && strstr(msg, "context limit")) ecode = "context_length_exceeded";
  if (status != 400 && status != 409) param = NULL;
  if (is_path && param) {
    /* the rest of the message may name the length field too */
    const char *rest = colon + 2;
    const char *mn = strstr(rest, "stop.max_new_tokens");
    if (mn)
      rt_hreq_error(o->hr, status, type, param, ecode, "%s: %.*s%s%s", param, (int)(mn - rest), rest, o->max_field,
                    mn + 19);
    else
      rt_hreq_error(o->hr, status, type, param, ecode, "%s: %s", param, rest);
  } else {
    rt_hreq_error(o->hr, status, type, param, ecode, "%s", msg);
  }
}

/* ---- chunks ---- */

static void head(rt_oai_t *o, rt_jw_t *w, const char *object) {
  rt_jw_raw(w, "{\"id\":");
  rt_jw_strz(w, o->id);
  rt_jw_raw(w, ",\"object\":\"");
  rt_jw_raw(w, object);
  rt_jw_raw(w, "\",\"created\":");
  rt_jw_i64(w, o->created);
  rt_jw_raw(w, ",\"model\":");
  rt_jw_strz(w, o->model);
  rt_jw_raw(w, ",\"system_fingerprint\":");
  rt_jw_strz(w, rt_http_fingerprint(o->hr));
}

static void usage(rt_jw_t *w, const rt_req_t *q) {
  rt_jw_raw(w, "{\"prompt_tokens\":");
  rt_jw_i64(w, (int64_t)q->n_prompt);
  rt_jw_raw(w, ",\"completion_tokens\":");
  rt_jw_i64(w, q->completion_tokens);
  rt_jw_raw(w, ",\"total_tokens\":");
  rt_jw_i64(w, (int64_t)q->n_prompt + q->completion_tokens);
  rt_jw_raw(w, ",\"prompt_tokens_details\":{\"cached_tokens\":"); /* OpenAI's field for prefix-cache hits */
  rt_jw_i64(w, q->cached_tokens);
  rt_jw_raw(w, "}}");
}

/* The pending logprob entries as the "logprobs" value (or null), then reset. */
static void logprobs(rt_oai_t *o, rt_jw_t *w) {
  if (!o->want_logprobs || !o->n_lp) {
    rt_jw_raw(w, o->want_logprobs && !o->stream ? (o->chat ? "{\"content\":[],\"refusal\":null}"
                                                            : "{\"tokens\":[],\"token_logprobs\":[],"
                                                              "\"top_logprobs\":null,\"text_offset\":[]}")
                                                : "null");
    return;
  }
  if (o->chat) {
    rt_jw_raw(w, "{\"content\":[");
    rt_jw_rawn(w, o->lp.s.data, o->lp.s.len);
    rt_jw_raw(w, "],\"refusal\":null}");
  } else {
    rt_jw_raw(w, "{\"tokens\":[");
    rt_jw_rawn(w, o->lp.s.data, o->lp.s.len);
    rt_jw_raw(w, "],\"token_logprobs\":[");
    rt_jw_rawn(w, o->lp_vals.s.data, o->lp_vals.s.len);
    rt_jw_raw(w, "],\"top_logprobs\":null,\"text_offset\":[");
    rt_jw_rawn(w, o->lp_offs.s.data, o->lp_offs.s.len);
    rt_jw_raw(w, "]}");
  }
  o->lp.s.len = o->lp_vals.s.len = o->lp_offs.s.len = 0;
  o->n_lp = 0;
}

/* The pending token ids as ,"token_ids":[...] (return_token_ids), then reset. */
static void token_ids(rt_oai_t *o, rt_jw_t *w) {
  if (!o->want_ids) return;
  rt_jw_raw(w, ",\"token_ids\":[");
  rt_jw_rawn(w, o->ids.s.data, o->ids.s.len);
  rt_jw_raw(w, "]");
  o->ids.s.len = 0;
  o->n_ids = 0;
}

/* One SSE event: data: <json>\n\n. delta: the chat delta object or the completion text (raw
 * JSON pieces), finish: NULL or the finish reason. */
static void chunk(rt_oai_t *o, const char *delta, size_t dlen, const char *finish) {
  rt_jw_t w = {{0}, 0};
  rt_jw_raw(&w, "data: ");
  head(o, &w, o->chat ? "chat.completion.chunk" : "text_completion");
  if (o->chat) {
    rt_jw_raw(&w, ",\"choices\":[{\"index\":0,\"delta\":");
    rt_jw_rawn(&w, delta, dlen);
  } else {
    rt_jw_raw(&w, ",\"choices\":[{\"text\":");
    rt_jw_rawn(&w, delta, dlen);
    rt_jw_raw(&w, ",\"index\":0");
  }
  rt_jw_raw(&w, ",\"logprobs\":");
  logprobs(o, &w);
  rt_jw_raw(&w, ",\"finish_reason\":");
  rt_jw_strz(&w, finish);
  token_ids(o, &w);
  rt_jw_raw(&w, o->include_usage ? "}],\"usage\":null}\n\n" : "}]}\n\n");
  if (!w.err) rt_hreq_stream_write(o->hr, w.s.data, w.s.len);
  free(w.s.data);
}

static void begin_stream(rt_oai_t *o) {
  o->started = true;
  rt_hreq_stream_begin(o->hr);
  if (o->chat) {
    static const char role[] = "{\"role\":\"assistant\",\"content\":\"\"}";
    bool lp = o->want_logprobs, ids = o->want_ids;
    o->want_logprobs = o->want_ids = false; /* entries go with the first delta that has text */
    chunk(o, role, sizeof role - 1, NULL);
    o->want_logprobs = lp;
    o->want_ids = ids;
  }
}

/* Streaming chat: the coalesced delta text as one chunk. */
static void flush_delta(rt_oai_t *o) {
  if (!o->pend.len) return;
  rt_jw_t d = {{0}, 0};
  if (o->pend_kind == RT_XO_CALL_ARGS) {
    rt_jw_raw(&d, "{\"tool_calls\":[{\"index\":");
    rt_jw_i64(&d, (int64_t)o->n_calls - 1);
    rt_jw_raw(&d, ",\"function\":{\"arguments\":");
    rt_jw_str(&d, o->pend.data, o->pend.len);
    rt_jw_raw(&d, "}}]}");
  } else {
    rt_jw_raw(&d, o->pend_kind == RT_XO_REASONING ? "{\"reasoning_content\":" : "{\"content\":");
    rt_jw_str(&d, o->pend.data, o->pend.len);
    rt_jw_raw(&d, "}");
  }
  if (!d.err) chunk(o, d.s.data, d.s.len, NULL);
  free(d.s.data);
  o->pend.len = 0;
  o->pend_kind = -1;
}

static rt_oai_call_t *new_call(rt_oai_t *o) {
  if (o->n_calls == o->cap_calls) {
    size_t cap = o->cap_calls ? 2 * o->cap_calls : 4;
    rt_oai_call_t *c = realloc(o->calls, cap * sizeof *c);
    if (!c) return NULL;
    o->calls = c;
    o->cap_calls = cap;
  }
  rt_oai_call_t *c = &o->calls[o->n_calls++];
  memset(c, 0, sizeof *c);
  uint64_t h = k3_hash64(o->id, strlen(o->id), 0x7c41 + o->n_calls);
  snprintf(c->id, sizeof c->id, "call_%016llx%08x", (unsigned long long)h, (unsigned)(h >> 13) ^ (unsigned)o->n_calls);
  return c;
}

/* XTML events (rt_xo_emit_fn). */
static void on_xo(void *ctx, rt_xo_kind_t k, const char *s, size_t n) {
  rt_oai_t *o = ctx;
  if (k == RT_XO_CALL_BEGIN) {
    if (o->stream) flush_delta(o);
    rt_oai_call_t *c = new_call(o);
    if (!c) return;
    if (!o->stream) {
      k3_tok_str_append(&c->name, s, n);
      return;
    }
    rt_jw_t d = {{0}, 0};
    rt_jw_raw(&d, "{\"tool_calls\":[{\"index\":");
    rt_jw_i64(&d, (int64_t)o->n_calls - 1);
    rt_jw_raw(&d, ",\"id\":");
    rt_jw_strz(&d, c->id);
    rt_jw_raw(&d, ",\"type\":\"function\",\"function\":{\"name\":");
    rt_jw_str(&d, s, n);
    rt_jw_raw(&d, ",\"arguments\":\"\"}}]}");
    if (!d.err) chunk(o, d.s.data, d.s.len, NULL);
    free(d.s.data);
    return;
  }
  if (k == RT_XO_CALL_END) return;
  if (!o->stream) {
    k3_tok_str_t *dst = k == RT_XO_REASONING ? &o->reasoning : k == RT_XO_CONTENT ? &o->content : NULL;
    if (k == RT_XO_CALL_ARGS && o->n_calls) dst = &o->calls[o->n_calls - 1].args;
    if (dst) k3_tok_str_append(dst, s, n);
    return;
  }
  if (o->pend_kind != (int)k) flush_delta(o);
  o->pend_kind = (int)k;
  k3_tok_str_append(&o->pend, s, n);
}

/* ---- the sink ---- */

static void add_logprobs(rt_oai_t *o, const uint32_t *ids, size_t n, const K3pd__V1__TokenLogprob *const *lps,
                         size_t n_lps) {
  const k3_tok_t *tok = o->rt->tok;
  for (size_t i = 0; i < n; i++) {
    const uint8_t *b = NULL;
    size_t bl = 0;
    if (!tok || k3_tok_id_bytes(tok, (int32_t)ids[i], &b, &bl)) bl = 0;
    double lpv = i < n_lps && lps[i] ? (double)lps[i]->logprob : 0.0 / 0.0;
    if (o->n_lp) {
      rt_jw_raw(&o->lp, ",");
      if (!o->chat) {
        rt_jw_raw(&o->lp_vals, ",");
        rt_jw_raw(&o->lp_offs, ",");
      }
    }
    if (o->chat) {
      rt_jw_raw(&o->lp, "{\"token\":");
      rt_jw_str(&o->lp, (const char *)b, bl);
      rt_jw_raw(&o->lp, ",\"logprob\":");
      rt_jw_f64(&o->lp, lpv);
      rt_jw_raw(&o->lp, ",\"bytes\":[");
      for (size_t k = 0; k < bl; k++) {
        if (k) rt_jw_raw(&o->lp, ",");
        rt_jw_i64(&o->lp, b[k]);
      }
      rt_jw_raw(&o->lp, "],\"top_logprobs\":[]}");
    } else {
      rt_jw_str(&o->lp, (const char *)b, bl);
      rt_jw_f64(&o->lp_vals, lpv);
      rt_jw_i64(&o->lp_offs, (int64_t)o->text_chars);
      for (size_t k = 0; k < bl; k++) o->text_chars += (b[k] & 0xC0) != 0x80; /* code points */
    }
    o->n_lp++;
  }
}

static void completion_text(rt_oai_t *o, const char *text, size_t len, const char *finish) {
  if (!o->stream) {
    k3_tok_str_append(&o->content, text, len);
    return;
  }
  if (!len && !finish && !(o->want_logprobs && o->n_lp) && !o->n_ids) return;
  rt_jw_t t = {{0}, 0};
  rt_jw_str(&t, text, len);
  if (!t.err) chunk(o, t.s.data, t.s.len, finish);
  free(t.s.data);
}

static void on_tokens(rt_req_t *q, void *ctx, const uint32_t *ids, size_t n, const char *text, size_t len,
                      const K3pd__V1__TokenLogprob *const *lps, size_t n_lps) {
  (void)q;
  rt_oai_t *o = ctx;
  if (o->stream && !o->started) begin_stream(o);
  if (o->want_logprobs) add_logprobs(o, ids, n, lps, n_lps);
  for (size_t i = 0; o->want_ids && i < n; i++) {
    if (o->n_ids++) rt_jw_raw(&o->ids, ",");
    rt_jw_i64(&o->ids, ids[i]);
  }
  if (o->chat) {
    rt_xtml_feed(&o->xo, text, len);
    if (o->stream) flush_delta(o);
  } else {
    completion_text(o, text, len, NULL);
  }
}

static const char *finish_reason(const rt_oai_t *o, const rt_req_t *q) {
  switch (q->finish_reason) {
    case K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH:
    case K3PD__V1__FINISH_REASON__FINISH_REASON_CONTEXT_LENGTH: return "length";
    default: return o->chat && o->n_calls && !q->stopped_by_string ? "tool_calls" : "stop";
  }
}

static void whole_chat(rt_oai_t *o, const rt_req_t *q, rt_jw_t *w, const char *fr) {
  head(o, w, "chat.completion");
  rt_jw_raw(w, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
  if (o->content.len || !o->n_calls) rt_jw_str(w, o->content.data ? o->content.data : "", o->content.len);
  else rt_jw_raw(w, "null");
  rt_jw_raw(w, ",\"reasoning_content\":");
  if (o->reasoning.len) rt_jw_str(w, o->reasoning.data, o->reasoning.len);
  else rt_jw_raw(w, "null");
  if (o->n_calls) {
    rt_jw_raw(w, ",\"tool_calls\":[");
    for (size_t i = 0; i < o->n_calls; i++) {
      const rt_oai_call_t *c = &o->calls[i];
      rt_jw_raw(w, i ? ",{\"id\":" : "{\"id\":");
      rt_jw_strz(w, c->id);
      rt_jw_raw(w, ",\"type\":\"function\",\"function\":{\"name\":");
      rt_jw_str(w, c->name.data ? c->name.data : "", c->name.len);
      rt_jw_raw(w, ",\"arguments\":");
      rt_jw_str(w, c->args.data ? c->args.data : "", c->args.len);
      rt_jw_raw(w, "}}");
    }
    rt_jw_raw(w, "]");
  }
  rt_jw_raw(w, ",\"refusal\":null},\"logprobs\":");
  logprobs(o, w);
  rt_jw_raw(w, ",\"finish_reason\":");
  rt_jw_strz(w, fr);
  token_ids(o, w);
  rt_jw_raw(w, "}],\"usage\":");
  usage(w, q);
  rt_jw_raw(w, "}\n");
}

static void whole_completion(rt_oai_t *o, const rt_req_t *q, rt_jw_t *w, const char *fr) {
  head(o, w, "text_completion");
  rt_jw_raw(w, ",\"choices\":[{\"text\":");
  rt_jw_str(w, o->content.data ? o->content.data : "", o->content.len);
  rt_jw_raw(w, ",\"index\":0,\"logprobs\":");
  logprobs(o, w);
  rt_jw_raw(w, ",\"finish_reason\":");
  rt_jw_strz(w, fr);
  token_ids(o, w);
  rt_jw_raw(w, "}],\"usage\":");
  usage(w, q);
  rt_jw_raw(w, "}\n");
}

static void on_fail(rt_req_t *q, void *ctx, k3_rpc_code_t code, const char *msg);

static void on_finish(rt_req_t *q, void *ctx, const char *tail, size_t len) {
  rt_oai_t *o = ctx;
  if (q->finish_reason == K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR) {
    /* The gRPC API's final chunk with FINISH_REASON_ERROR has no OpenAI equivalent: a stream
     * that started gets the error event, a whole response 503 (retryable). */
    on_fail(q, ctx, K3_RPC_UNAVAILABLE, "the cluster lost the workers of this request and could not resume it: retry");
    return;
  }
  rt_hreq_set_gen(o->hr, NULL);
  if (o->stream && !o->started) begin_stream(o);
  const char *fr;
  if (o->chat) {
    rt_xtml_feed(&o->xo, tail, len);
    rt_xtml_finish(&o->xo);
    fr = finish_reason(o, q);
    if (o->stream) {
      flush_delta(o);
      chunk(o, "{}", 2, fr);
    }
  } else {
    fr = finish_reason(o, q);
    completion_text(o, tail, len, o->stream ? fr : NULL);
  }
  if (!o->stream) {
    rt_jw_t w = {{0}, 0};
    if (o->chat) whole_chat(o, q, &w, fr);
    else whole_completion(o, q, &w, fr);
    if (w.err) {
      free(w.s.data);
      rt_hreq_error(o->hr, 500, "server_error", NULL, "internal_error", "out of memory building the response");
      return;
    }
    rt_hreq_reply(o->hr, 200, "application/json", w.s.data, w.s.len);
    return;
  }
  rt_jw_t w = {{0}, 0};
  if (o->include_usage) {
    rt_jw_raw(&w, "data: ");
    head(o, &w, o->chat ? "chat.completion.chunk" : "text_completion");
    rt_jw_raw(&w, ",\"choices\":[],\"usage\":");
    usage(&w, q);
    rt_jw_raw(&w, "}\n\n");
  }
  rt_jw_raw(&w, "data: [DONE]\n\n");
  if (!w.err) rt_hreq_stream_write(o->hr, w.s.data, w.s.len);
  free(w.s.data);
  rt_hreq_stream_end(o->hr);
}

static void on_fail(rt_req_t *q, void *ctx, k3_rpc_code_t code, const char *msg) {
  (void)q;
  rt_oai_t *o = ctx;
  rt_hreq_set_gen(o->hr, NULL);
  if (!o->started) {
    rt_oai_fail(o, code, msg);
    return;
  }
  const char *type, *ecode;
  rt_http_status_of(code, &type, &ecode);
  rt_jw_t w = {{0}, 0};
  rt_jw_raw(&w, "data: {\"error\":{\"message\":");
  rt_jw_strz(&w, msg);
  rt_jw_raw(&w, ",\"type\":");
  rt_jw_strz(&w, type);
  rt_jw_raw(&w, ",\"param\":null,\"code\":");
  rt_jw_strz(&w, ecode);
  rt_jw_raw(&w, "}}\n\ndata: [DONE]\n\n");
  if (!w.err) rt_hreq_stream_write(o->hr, w.s.data, w.s.len);
  free(w.s.data);
  rt_hreq_stream_end(o->hr);
}

const rt_sink_t rt_oai_sink = {on_tokens, on_finish, on_fail};

void rt_oai_init_parser(rt_oai_t *o) {
  o->pend_kind = -1;
  rt_xtml_init(&o->xo, o->thinking, on_xo, o);
}
