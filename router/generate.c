/* k3pd.v1.Generation.Generate on the router: the gRPC front of the one request path (req.h).
 * It decodes a GenerateRequest into the front-neutral intake (intake.c: request id, sampling,
 * stop, prompt; INVALID_ARGUMENT names the k3pd.v1 field) and is the sink that turns the
 * request's output into GenerateResponse chunks. The whole request flow of ARCHITECTURE.md §2:
 *
 *   validate + tokenize → choose decode D, prefill P → D.Reserve → (P.Prefill ‖ D.Attach)
 *   → relay Attach chunks to the client (incremental detokenisation, stop strings) → final
 *   chunk with finish reason, usage and timings.
 * A prefill that fails with a transport-class status is re-issued to another prefill worker
 * against the same reservation (D.Reserve again → new epoch), up to --prefill-retries times.
 * Client cancel / deadline: Abort on P, cancel the Attach stream and Release on D.
 * One log line per request with its timings. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/chat.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/generation.pb-c.h"
#include "auth.h"
#include "req.h"

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

/* Replaces the first `from` in err by `to` (if the result fits). */
static void replace_in_err(char *err, size_t errlen, const char *from, const char *to) {
  char *at = strstr(err, from);
  size_t fl = strlen(from), tl = strlen(to), n = strlen(err);
  if (!at || n - fl + tl >= errlen) return;
  memmove(at + tl, at + fl, n - (size_t)(at - err) - fl + 1);
  memcpy(at, to, tl);
}

/* The chat renderer names fields of the OpenAI-style JSON it is given ("messages[1].function.
 * arguments: ..."); clients sent k3pd.v1.ChatInput, so name the proto field instead
 * ("chat.messages[1].tool_calls[0].arguments_json: ..."). */
static void chat_err_path(char *err, size_t errlen) {
  if (strncmp(err, "messages", 8) != 0) {
    prefix_err(err, errlen, "chat: ");
    return;
  }
  replace_in_err(err, errlen, ".function.arguments", ".arguments_json");
  replace_in_err(err, errlen, ".function.name", ".name");
  prefix_err(err, errlen, "chat.");
}

/* ChatInput → the OpenAI-style messages array the chat renderer takes. */
static int chat_to_json(const K3pd__V1__ChatInput *c, json_t **out, char *err, size_t errlen) {
  json_t *arr = json_array();
  static const char *roles[] = {NULL, "system", "user", "assistant", "tool"};
  for (size_t i = 0; arr && i < c->n_messages; i++) {
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
  if (!arr) return K3_ENOMEM;
  *out = arr;
  return 0;
}

/* A prompt being built on the tokenisation pool: the call (whose request message holds the text
 * until the call is finished) and the chat messages given to the renderer. */
typedef struct {
  k3_rpc_call_t *call;
  json_t *messages;
  bool chat;
} gpend_t;

static const rt_sink_t grpc_sink;
static void on_client_cancel(k3_rpc_call_t *call, void *arg);

static void on_prompt(rt_req_t *q, void *arg, k3_tok_ids_t *ids, int rc, const char *err_in) {
  gpend_t *gp = arg;
  k3_rpc_call_t *call = gp->call;
  char err[600];
  snprintf(err, sizeof err, "%s", err_in);
  if (gp->chat && rc == K3_EINVAL) chat_err_path(err, sizeof err);
  json_decref(gp->messages);
  free(gp);
  k3_rpc_code_t code = K3_RPC_OK;
  if (q->intake_cancel) {
    code = q->intake_cancel;
    snprintf(err, sizeof err, "%s", code == K3_RPC_DEADLINE_EXCEEDED ? "deadline exceeded" : "cancelled by the client");
  } else if (rc) {
    code = rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : rc == K3_ESHUTDOWN ? K3_RPC_UNAVAILABLE
                                                                             : K3_RPC_INVALID_ARGUMENT;
  } else if (rt_req_set_prompt(q, ids, err, sizeof err)) {
    code = K3_RPC_INVALID_ARGUMENT;
  }
  if (code) {
    rt_req_reject(q, code, err);
    k3_rpc_call_finish(call, code, err);
    return;
  }
  rt_req_launch(q, &grpc_sink, call);
}

/* Returns 0 (prompt set), K3_EINPROGRESS (being built off the loop: on_prompt continues) or an
 * error with err naming the field. */
static int build_prompt(rt_router_t *rt, const K3pd__V1__GenerateRequest *g, rt_req_t *q, k3_rpc_call_t *call,
                        char *err, size_t errlen) {
  k3_tok_ids_t ids = {0};
  int rc = 0;
  switch (g->input_case) {
    case K3PD__V1__GENERATE_REQUEST__INPUT_TEXT: {
      gpend_t *gp = calloc(1, sizeof *gp);
      if (!gp) return K3_ENOMEM;
      gp->call = call;
      rc = rt_prompt_text_async(q, g->text ? g->text : "", g->text ? strlen(g->text) : 0, q->max_new, on_prompt, gp,
                                err, errlen);
      if (rc != K3_EINPROGRESS) free(gp);
      return rc;
    }
    case K3PD__V1__GENERATE_REQUEST__INPUT_CHAT: {
      const K3pd__V1__ChatInput *c = g->chat;
      if (!c || c->n_messages == 0) {
        snprintf(err, errlen, "chat.messages: at least one message is required");
        return K3_EINVAL;
      }
      json_t *arr = NULL;
      if ((rc = chat_to_json(c, &arr, err, errlen))) return rc;
      k3_chat_opts_t co;
      k3_chat_opts_default(&co);
      co.add_generation_prompt = c->add_generation_prompt;
      co.thinking = !c->thinking_off;
      const char *eff = c->thinking_effort ? c->thinking_effort : "";
      if (!strcmp(eff, "none")) co.thinking_effort = NULL;
      else if (*eff && strcmp(eff, "low") && strcmp(eff, "high") && strcmp(eff, "max")) {
        json_decref(arr);
        snprintf(err, errlen, "chat.thinking_effort: must be \"\" (max), low, high, max or none");
        return K3_EINVAL;
      } else if (*eff) co.thinking_effort = eff;
      gpend_t *gp = calloc(1, sizeof *gp);
      if (!gp) {
        json_decref(arr);
        return K3_ENOMEM;
      }
      gp->call = call;
      gp->messages = arr;
      gp->chat = true;
      rc = rt_prompt_chat_async(q, arr, &co, q->max_new, on_prompt, gp, err, errlen);
      if (rc != K3_EINPROGRESS) {
        json_decref(arr);
        free(gp);
        if (rc == K3_EINVAL) chat_err_path(err, errlen);
      }
      return rc;
    }
    case K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS:
      if (!g->token_ids || g->token_ids->n_ids == 0) {
        snprintf(err, errlen, "token_ids.ids: at least one token is required");
        return K3_EINVAL;
      }
      rc = rt_prompt_ids(rt, g->token_ids->ids, g->token_ids->n_ids, "token_ids.ids", &ids, err, errlen);
      break;
    default:
      snprintf(err, errlen, "input: one of text, chat or token_ids is required");
      return K3_EINVAL;
  }
  if (!rc) rc = rt_req_set_prompt(q, &ids, err, errlen);
  free(ids.ids);
  return rc;
}

/* ---- the gRPC sink: the request's output as GenerateResponse chunks ---- */

static void send_chunk(rt_req_t *q, k3_rpc_call_t *call, const uint32_t *ids, size_t n, const char *text,
                       size_t text_len, const K3pd__V1__TokenLogprob *const *lps, size_t n_lps, bool final) {
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
    usage.cached_prompt_tokens = q->cached_tokens;
    r.usage = &usage;
    uint64_t now = k3_now_ns();
    tm.queue_us = q->t_reserved ? (q->t_reserved - q->t_arrive) / 1000 : 0;
    tm.prefill_us = q->t_prefill_done > q->t_prefill_start ? (q->t_prefill_done - q->t_prefill_start) / 1000 : 0;
    tm.handoff_us = q->handoff_us;
    tm.first_token_us = q->t_first ? (q->t_first - q->t_arrive) / 1000 : 0;
    tm.decode_us = q->t_first ? (now - q->t_first) / 1000 : 0;
    tm.total_us = (now - q->t_arrive) / 1000;
    r.timings = &tm;
    r.seed = q->sampling.seed;
  }
  k3_rpc_call_write(call, &r.base);
  free(txt);
}

static void grpc_tokens(rt_req_t *q, void *ctx, const uint32_t *ids, size_t n, const char *text, size_t len,
                        const K3pd__V1__TokenLogprob *const *lps, size_t n_lps) {
  send_chunk(q, ctx, ids, n, text, len, lps, n_lps, false);
}

/* The API key's ticket (auth.h) lives in the call's user pointer until the request ends. */
static void release_key(k3_rpc_call_t *call) {
  rt_auth_release(k3_rpc_call_get_user(call));
  k3_rpc_call_set_user(call, NULL);
}

static void grpc_finish(rt_req_t *q, void *ctx, const char *tail, size_t len) {
  k3_rpc_call_t *call = ctx;
  send_chunk(q, call, NULL, 0, tail, len, NULL, 0, true);
  release_key(call);
  k3_rpc_call_finish(call, K3_RPC_OK, NULL);
}

static void grpc_fail(rt_req_t *q, void *ctx, k3_rpc_code_t code, const char *msg) {
  (void)q;
  release_key(ctx);
  /* rt_req_fail already mapped the code; this keeps the gRPC front's promise on its own */
  k3_rpc_call_finish(ctx, rt_status_public(code, NULL, 0), msg);
}

/* Ends a call that never became a launched request. */
static void refuse(k3_rpc_call_t *call, k3_rpc_code_t code, const char *msg) {
  release_key(call);
  k3_rpc_call_finish(call, code, msg);
}

static const rt_sink_t grpc_sink = {grpc_tokens, grpc_finish, grpc_fail};

static void on_client_cancel(k3_rpc_call_t *call, void *arg) {
  rt_req_t *q = arg;
  int64_t left = k3_rpc_call_deadline_left_ms(call);
  if (q->intake_pending) { /* the prompt is on the tokenisation pool: on_prompt ends it */
    q->intake_cancel = left <= 0 ? K3_RPC_DEADLINE_EXCEEDED : K3_RPC_CANCELLED;
    return;
  }
  if (q->sink_ctx != call || !q->sink) return;
  rt_req_cancel(q, left <= 0 ? K3_RPC_DEADLINE_EXCEEDED : K3_RPC_CANCELLED,
                left <= 0 ? "deadline exceeded" : "cancelled by the client");
}

static void on_generate(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__GenerateRequest *g = (const K3pd__V1__GenerateRequest *)msg;
  char err[512];
  if (rt->auth) { /* before anything else: an unknown caller learns nothing about the cluster */
    rt_key_t *key;
    const char *reason;
    k3_rpc_code_t c = rt_auth_admit(rt->auth, k3_rpc_call_metadata(call, "authorization"), k3_now_ns(), &key,
                                    &reason, err, sizeof err);
    if (c != K3_RPC_OK) {
      if (rt->m.auth_failures_total) k3_metric_inc(rt->m.auth_failures_total, &reason);
      k3_rpc_call_finish(call, c, err);
      return;
    }
    k3_rpc_call_set_user(call, key);
  }
  if (rt->draining) {
    refuse(call, K3_RPC_UNAVAILABLE, "router is draining");
    return;
  }
  if (g->model && *g->model && strcmp(g->model, rt->model_name) != 0) {
    snprintf(err, sizeof err, "model: unknown model \"%.200s\" (this cluster serves \"%.200s\")", g->model,
             rt->model_name);
    refuse(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  bool from_field = g->request_id && *g->request_id;
  const char *rid = from_field ? g->request_id : k3_rpc_call_metadata(call, "x-request-id");
  rt_req_t *q;
  k3_rpc_code_t code;
  if (rt_req_new(rt, rid, from_field ? "request_id" : "x-request-id (metadata, used as request_id)",
                 k3_rpc_call_deadline_left_ms(call), &q, &code, err, sizeof err)) {
    refuse(call, code, err);
    return;
  }
  /* The documented structural rules (docs/protocol.md: counts, lengths, enum values, chat roles,
   * UTF-8) live in k3_rpc_validate_*; the intake adds the model-dependent ones. */
  k3_rpc_limits_t lim = {.vocab_size = rt->cfg.vocab_size > 0 && rt->cfg.vocab_size <= UINT32_MAX
                                           ? (uint32_t)rt->cfg.vocab_size : 0,
                         .max_new_tokens = rt->max_new_tokens_limit,
                         .model_name = rt->model_name};
  int rc = k3_rpc_validate_generate_request(g, &lim, err, sizeof err);
  if (!rc) rc = rt_req_set_params(q, g->sampling, g->stop, g->return_logprobs, err, sizeof err);
  if (!rc) rc = build_prompt(rt, g, q, call, err, sizeof err);
  if (rc == K3_EINPROGRESS) {
    k3_rpc_call_set_cancel_cb(call, on_client_cancel, q);
    return;
  }
  if (rc) {
    k3_rpc_code_t c = rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : K3_RPC_INVALID_ARGUMENT;
    rt_req_reject(q, c, err);
    refuse(call, c, err);
    return;
  }
  k3_rpc_call_set_cancel_cb(call, on_client_cancel, q);
  rt_req_launch(q, &grpc_sink, call);
}

int rt_generate_register(rt_router_t *rt) {
  return k3_rpc_server_add_method(rt->srv, "/k3pd.v1.Generation/Generate", K3_RPC_SERVER_STREAM,
                                  &k3pd__v1__generate_request__descriptor, on_generate, rt);
}
