/* k3pd.v1.Generation.Generate on the router, intake: validation (INVALID_ARGUMENT names the
 * field), tokenisation or chat rendering, placement, and the Reserve that starts the request's
 * flow (flow.c; output in req.c). The whole request flow of ARCHITECTURE.md §2:
 *
 *   validate + tokenize → choose decode D, prefill P → D.Reserve → (P.Prefill ‖ D.Attach)
 *   → relay Attach chunks to the client (incremental detokenisation, stop strings) → final
 *   chunk with finish reason, usage and timings.
 * A prefill that fails with a transport-class status is re-issued to another prefill worker
 * against the same reservation (D.Reserve again → new epoch), up to --prefill-retries times.
 * Client cancel / deadline: Abort on P, cancel the Attach stream and Release on D.
 * One log line per request with its timings. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/chat.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"
#include "k3pd/v1/generation.pb-c.h"
#include "k3pd/v1/prefill.pb-c.h"
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
      co.thinking = !c->thinking_off;
      const char *eff = c->thinking_effort ? c->thinking_effort : "";
      if (!strcmp(eff, "none")) co.thinking_effort = NULL;
      else if (*eff && strcmp(eff, "low") && strcmp(eff, "high") && strcmp(eff, "max")) {
        json_decref(arr);
        snprintf(err, errlen, "chat.thinking_effort: must be \"\" (max), low, high, max or none");
        return K3_EINVAL;
      } else if (*eff) co.thinking_effort = eff;
      rc = k3_chat_render(rt->tok, arr, &co, &ids, err, errlen);
      json_decref(arr);
      if (rc) {
        chat_err_path(err, errlen);
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
  rt_req_fail(q, left <= 0 ? K3_RPC_DEADLINE_EXCEEDED : K3_RPC_CANCELLED,
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
      k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT,
                         rid == g->request_id ? "request_id: at most 128 printable ASCII characters"
                                              : "x-request-id (metadata, used as request_id): at most 128 printable "
                                                "ASCII characters");
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
  /* The documented structural rules (docs/protocol.md: counts, lengths, enum values, chat roles,
   * UTF-8) live in k3_rpc_validate_*; the router adds the model-dependent ones below. */
  k3_rpc_limits_t lim = {.vocab_size = rt->cfg.vocab_size > 0 && rt->cfg.vocab_size <= UINT32_MAX
                                           ? (uint32_t)rt->cfg.vocab_size : 0,
                         .max_new_tokens = rt->max_new_tokens_limit,
                         .model_name = rt->model_name};
  int rc = k3_rpc_validate_generate_request(g, &lim, err, sizeof err);
  if (!rc) rc = parse_sampling(rt, g, q, err, sizeof err);
  if (!rc) rc = build_prompt(rt, g, q, err, sizeof err);
  if (rc) {
    rt->n_failed++;
    k3_rpc_code_t code = rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : K3_RPC_INVALID_ARGUMENT;
    rt_req_account_end(q, code);
    K3_INFO("request %s %s: %s", q->id, k3_rpc_code_name(code), err);
    k3_rpc_call_finish(call, code, err);
    rt_req_free(q);
    return;
  }
  k3_detok_opts_t dopt = {.stop_ids = (const int32_t *)q->stop_ids,
                          .n_stop_ids = q->n_stop_ids,
                          .stop_strs = (const char *const *)q->stop_strs,
                          .n_stop_strs = q->n_stop_strs,
                          .skip_special = false};
  if (k3_detok_init(rt->tok, &dopt, &q->detok)) {
    rt->n_failed++;
    rt_req_account_end(q, K3_RPC_INVALID_ARGUMENT);
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "stop.stop_strings: invalid");
    rt_req_free(q);
    return;
  }
  q->call = call;
  q->counted = true;
  k3_gauge_add(k3_metric_default(rt->m.active_streams), 1);
  k3_rpc_call_set_cancel_cb(call, on_client_cancel, q);
  size_t di;
  int64_t max_ctx = rt_max_context(&rt->reg, 0);
  if (max_ctx > 0 && (int64_t)q->n_prompt + q->max_new > max_ctx) {
    rt_req_fail(q, K3_RPC_INVALID_ARGUMENT,
             "prompt: %zu tokens + stop.max_new_tokens %u exceed the context limit of %lld tokens", q->n_prompt,
             q->max_new, (long long)max_ctx);
    return;
  }
  rc = rt_choose_decode(&rt->reg, (int64_t)q->n_prompt, q->max_new, 0, &di);
  if (rc == K3_ECAPACITY) rc = rt_choose_decode_optimistic(&rt->reg, (int64_t)q->n_prompt, q->max_new, 0, &di);
  if (rc == K3_EUNAVAIL) {
    rt_req_fail(q, K3_RPC_UNAVAILABLE, "no decode worker is registered");
    return;
  }
  if (rc == K3_ECAPACITY) {
    rt_req_fail(q, K3_RPC_RESOURCE_EXHAUSTED,
             "no decode worker has capacity for %zu prompt + %u new tokens right now (retry later)", q->n_prompt,
             q->max_new);
    return;
  }
  rt_worker_t *dw = &rt->reg.workers[di];
  size_t pi;
  if (rt_choose_prefill(&rt->reg, dw->info.fingerprint, NULL, 0, &pi)) {
    rt_req_fail(q, K3_RPC_UNAVAILABLE, "no prefill worker is registered for this model");
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
  k3_rpc_call_opts_t o = {.timeout_ms = rt_req_timeout(q), .request_id = q->id};
  RT_TIMED_END(q); /* validation, tokenisation and placement */
  rc = k3_rpc_unary(rt->cli, q->decode_addr, "/k3pd.v1.Decode/Reserve", &rr.base, &k3pd__v1__reservation__descriptor,
                    &o, rt_req_on_reserve_done, q, &q->reserve_call);
  if (rc) rt_req_fail(q, K3_RPC_INTERNAL, "starting the reservation: %s", k3_strerror(rc));
}

int rt_generate_register(rt_router_t *rt) {
  return k3_rpc_server_add_method(rt->srv, "/k3pd.v1.Generation/Generate", K3_RPC_SERVER_STREAM,
                                  &k3pd__v1__generate_request__descriptor, on_generate, rt);
}
