/* k3pd-router, the front-neutral intake of a generation request: the part of the one request
 * path that both fronts (gRPC Generate in generate.c, the OpenAI HTTP API in oai_request.c)
 * call after decoding their wire format. It owns the rules that must not differ between the
 * fronts: request ids, sampling and stop parameters (the EOS ids, the router-chosen seed),
 * tokenisation and chat rendering, the context check, placement and the Reserve that starts
 * the worker flow (flow.c). Errors are "<field path>: <problem>" in k3pd.v1 names; a front may
 * rename the path for its own clients (the HTTP front says "max_tokens" where this file says
 * "stop.max_new_tokens").
 *
 * Not here: wire decoding or encoding (the fronts), the worker calls (flow.c), output (req.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"
#include "req.h"
#include "tokpool.h"

int rt_req_new(rt_router_t *rt, const char *rid, const char *rid_field, int64_t deadline_left_ms, rt_req_t **out,
               k3_rpc_code_t *code, char *err, size_t errlen) {
  rt_req_t *q = calloc(1, sizeof *q);
  if (!q) {
    *code = K3_RPC_RESOURCE_EXHAUSTED;
    snprintf(err, errlen, "router out of memory");
    return K3_ENOMEM;
  }
  q->rt = rt;
  q->t_arrive = k3_now_ns();
  if (rt->trace) q->tr[RT_TR_ARRIVE] = q->t_arrive;
  q->deadline_left_ms = deadline_left_ms;
  if (rid && *rid) {
    size_t n = strlen(rid);
    bool ok = n <= 128;
    for (size_t i = 0; ok && i < n; i++) ok = rid[i] > 32 && rid[i] < 127;
    if (!ok) {
      free(q);
      *code = K3_RPC_INVALID_ARGUMENT;
      snprintf(err, errlen, "%s: at most 128 printable ASCII characters", rid_field);
      return K3_EINVAL;
    }
    snprintf(q->id, sizeof q->id, "%s", rid);
  } else {
    snprintf(q->id, sizeof q->id, "r%s-%llu", rt->instance, (unsigned long long)++rt->next_req);
  }
  for (rt_req_t *o = rt->reqs; o; o = o->next) {
    if (strcmp(o->id, q->id) == 0) {
      free(q);
      *code = K3_RPC_ALREADY_EXISTS;
      snprintf(err, errlen, "request_id: a request with this id is in flight");
      return K3_EEXIST;
    }
  }
  q->next = rt->reqs;
  rt->reqs = q;
  rt->n_started++;
  k3_counter_inc(k3_metric_default(rt->m.requests_started_total));
  *out = q;
  return 0;
}

int rt_req_set_params(rt_req_t *q, const K3pd__V1__SamplingParams *s, const K3pd__V1__StopConditions *st,
                      bool logprobs, char *err, size_t errlen) {
  rt_router_t *rt = q->rt;
  k3pd__v1__sampling_params__init(&q->sampling);
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
    if (!(q->stop_strs[q->n_stop_strs] = strdup(x))) return K3_ENOMEM;
    q->n_stop_strs++;
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
  q->want_logprobs = logprobs;
  return 0;
}

/* Prepends `prefix` to the message in err (truncating its end if needed). */
static void prefix_err(char *err, size_t errlen, const char *prefix) {
  size_t pl = strlen(prefix), ml = strlen(err);
  if (pl >= errlen) return;
  if (pl + ml >= errlen) ml = errlen - pl - 1;
  memmove(err + pl, err, ml);
  memcpy(err, prefix, pl);
  err[pl + ml] = 0;
}

int rt_prompt_text(rt_router_t *rt, const char *text, size_t len, k3_tok_ids_t *out, char *err, size_t errlen) {
  if (len == 0) {
    snprintf(err, errlen, "text: must not be empty");
    return K3_EINVAL;
  }
  if (!rt->tok) {
    snprintf(err, errlen, "text: this router has no tokenizer (started with --synthetic): send token ids");
    return K3_EINVAL;
  }
  size_t n0 = out->n;
  int rc = k3_tok_encode(rt->tok, text, len, 0, out, err, errlen);
  if (rc) {
    out->n = n0;
    if (strncmp(err, "text", 4) != 0) prefix_err(err, errlen, "text: ");
    return rc == K3_ENOMEM ? K3_ENOMEM : K3_EINVAL;
  }
  return 0;
}

int rt_prompt_chat(rt_router_t *rt, const json_t *messages, const k3_chat_opts_t *opts, k3_tok_ids_t *out, char *err,
                   size_t errlen) {
  if (!rt->tok) {
    snprintf(err, errlen, "messages: this router has no tokenizer (started with --synthetic): send token ids");
    return K3_EINVAL;
  }
  int rc = k3_chat_render(rt->tok, messages, opts, out, err, errlen);
  return rc == 0 ? 0 : rc == K3_ENOMEM ? K3_ENOMEM : K3_EINVAL;
}

int rt_prompt_ids(rt_router_t *rt, const uint32_t *ids, size_t n, const char *field, k3_tok_ids_t *out, char *err,
                  size_t errlen) {
  if (n == 0) {
    snprintf(err, errlen, "%s: at least one token is required", field);
    return K3_EINVAL;
  }
  size_t n0 = out->n;
  for (size_t i = 0; i < n; i++) {
    if ((int64_t)ids[i] >= rt->cfg.vocab_size) {
      snprintf(err, errlen, "%s[%zu]: %u is outside the vocabulary (%lld)", field, i, ids[i],
               (long long)rt->cfg.vocab_size);
      out->n = n0;
      return K3_EINVAL;
    }
    if (k3_tok_ids_push(out, (int32_t)ids[i])) {
      out->n = n0;
      return K3_ENOMEM;
    }
  }
  return 0;
}

/* ---- prompts built off the loop ---- */

typedef struct {
  rt_tokjob_t job;
  rt_req_t *q;
  rt_prompt_done_fn done;
  void *arg;
  int64_t ctx;      /* the context limit the cap came from (0: none registered) */
  uint32_t max_new;
} pjob_t;

/* Most prompt tokens a request may have: what the largest decode context leaves after
 * max_new (0 when nothing can fit). With no decode worker registered (the request fails later
 * anyway), the model's position limit bounds the work. */
static int64_t prompt_cap(rt_router_t *rt, uint32_t max_new, int64_t *ctx) {
  *ctx = rt_max_context(&rt->reg, 0);
  if (*ctx <= 0) return rt->cfg.max_position_embeddings > 0 ? rt->cfg.max_position_embeddings : (int64_t)1 << 20;
  return *ctx > (int64_t)max_new ? *ctx - (int64_t)max_new : 0;
}

static void on_pjob(rt_tokjob_t *job) {
  pjob_t *pj = job->arg;
  rt_req_t *q = pj->q;
  rt_router_t *rt = q->rt;
  char err[600];
  q->intake_pending = false;
  k3_histogram_observe(k3_metric_default(rt->m.tokenize_seconds), (double)(job->wait_ns + job->work_ns) / 1e9);
  int rc = job->rc;
  snprintf(err, sizeof err, "%s", job->err);
  if (rc == K3_ERANGE) {
    rc = K3_EINVAL;
    snprintf(err, sizeof err, "prompt: more than %zu tokens + stop.max_new_tokens %u exceed the context limit of %lld "
             "tokens", job->max_ids, pj->max_new, (long long)(pj->ctx > 0 ? pj->ctx : (int64_t)job->max_ids));
  } else if (rc && rc != K3_ENOMEM && rc != K3_ESHUTDOWN) {
    if (job->kind == RT_TOK_TEXT && strncmp(err, "text", 4) != 0) prefix_err(err, sizeof err, "text: ");
    rc = K3_EINVAL;
  }
  if (job->work_ns > 100000000ull)
    K3_INFO("request %s: prompt of %zu tokens built in %.1f ms on the tokenisation pool (queued %.1f ms)", q->id,
            job->ids.n, (double)job->work_ns / 1e6, (double)job->wait_ns / 1e6);
  k3_tok_ids_t ids = job->ids;
  rt_prompt_done_fn done = pj->done;
  void *arg = pj->arg;
  free(pj);
  done(q, arg, &ids, rc, err);
  free(ids.ids); /* unless done took it */
}

static int submit(rt_req_t *q, pjob_t *pj, rt_prompt_done_fn done, void *arg) {
  pj->q = q;
  pj->done = done;
  pj->arg = arg;
  pj->job.done = on_pjob;
  pj->job.arg = pj;
  q->intake_pending = true;
  q->intake_cancel = K3_RPC_OK;
  rt_tokpool_submit(q->rt->tokpool, &pj->job);
  return K3_EINPROGRESS;
}

/* A context that leaves no room for any prompt: refused now (the launch would refuse it). */
static int no_room(uint32_t max_new, int64_t ctx, char *err, size_t errlen) {
  snprintf(err, errlen, "prompt: at least 1 token + stop.max_new_tokens %u exceed the context limit of %lld tokens",
           max_new, (long long)ctx);
  return K3_EINVAL;
}

int rt_prompt_text_async(rt_req_t *q, const char *text, size_t len, uint32_t max_new, rt_prompt_done_fn done,
                         void *arg, char *err, size_t errlen) {
  rt_router_t *rt = q->rt;
  if (len == 0) {
    snprintf(err, errlen, "text: must not be empty");
    return K3_EINVAL;
  }
  if (!rt->tok || !rt->tokpool) {
    snprintf(err, errlen, "text: this router has no tokenizer (started with --synthetic): send token ids");
    return K3_EINVAL;
  }
  int64_t ctx, cap = prompt_cap(rt, max_new, &ctx);
  if (cap == 0) return no_room(max_new, ctx, err, errlen);
  /* Each id covers at most max_token_bytes of text: a longer text has more ids than fit. */
  if (ctx > 0 && rt->max_token_bytes && (uint64_t)len > (uint64_t)cap * rt->max_token_bytes) {
    snprintf(err, errlen, "prompt: a text of %zu bytes is more than %lld tokens (no token covers more than %zu bytes), "
             "and %lld + stop.max_new_tokens %u exceed the context limit of %lld tokens", len, (long long)cap,
             rt->max_token_bytes, (long long)cap + 1, max_new, (long long)ctx);
    return K3_EINVAL;
  }
  pjob_t *pj = calloc(1, sizeof *pj);
  if (!pj) return K3_ENOMEM;
  pj->job.kind = RT_TOK_TEXT;
  pj->job.text = text;
  pj->job.len = len;
  pj->job.max_ids = (size_t)cap;
  pj->ctx = ctx;
  pj->max_new = max_new;
  return submit(q, pj, done, arg);
}

/* Bytes of caller text in a messages array (string contents and text parts): a lower bound of
 * what the rendering encodes. */
static uint64_t chat_text_bytes(const json_t *messages) {
  uint64_t n = 0;
  size_t i;
  const json_t *m;
  json_array_foreach(messages, i, m) {
    const json_t *c = json_object_get(m, "content");
    if (json_is_string(c)) {
      n += json_string_length(c);
    } else if (json_is_array(c)) {
      size_t k;
      const json_t *part;
      json_array_foreach(c, k, part) {
        const json_t *t = json_object_get(part, "text");
        if (json_is_string(t)) n += json_string_length(t);
      }
    }
  }
  return n;
}

int rt_prompt_chat_async(rt_req_t *q, const json_t *messages, const k3_chat_opts_t *opts, uint32_t max_new,
                         rt_prompt_done_fn done, void *arg, char *err, size_t errlen) {
  rt_router_t *rt = q->rt;
  if (!rt->tok || !rt->tokpool) {
    snprintf(err, errlen, "messages: this router has no tokenizer (started with --synthetic): send token ids");
    return K3_EINVAL;
  }
  if (!json_is_array(messages)) {
    snprintf(err, errlen, "messages: expected an array");
    return K3_EINVAL;
  }
  int64_t ctx, cap = prompt_cap(rt, max_new, &ctx);
  if (cap == 0) return no_room(max_new, ctx, err, errlen);
  uint64_t bytes = chat_text_bytes(messages);
  if (ctx > 0 && rt->max_token_bytes && bytes > (uint64_t)cap * rt->max_token_bytes) {
    snprintf(err, errlen, "messages: %llu bytes of content are more than %lld tokens (no token covers more than %zu "
             "bytes), and %lld + stop.max_new_tokens %u exceed the context limit of %lld tokens",
             (unsigned long long)bytes, (long long)cap, rt->max_token_bytes, (long long)cap + 1, max_new,
             (long long)ctx);
    return K3_EINVAL;
  }
  pjob_t *pj = calloc(1, sizeof *pj);
  if (!pj) return K3_ENOMEM;
  pj->job.kind = RT_TOK_CHAT;
  pj->job.messages = messages;
  pj->job.chat = *opts;
  pj->job.max_ids = (size_t)cap;
  pj->ctx = ctx;
  pj->max_new = max_new;
  return submit(q, pj, done, arg);
}

int rt_req_set_prompt(rt_req_t *q, k3_tok_ids_t *ids, char *err, size_t errlen) {
  if (ids->n == 0) {
    snprintf(err, errlen, "prompt: encodes to zero tokens");
    return K3_EINVAL;
  }
  free(q->prompt);
  q->prompt = ids->ids;
  q->n_prompt = ids->n;
  memset(ids, 0, sizeof *ids);
  return 0;
}

int64_t rt_context_limit(rt_router_t *rt) { return rt_max_context(&rt->reg, 0); }

void rt_req_reject(rt_req_t *q, k3_rpc_code_t code, const char *msg) {
  q->rt->n_failed++;
  rt_req_account_end(q, code);
  K3_INFO("request %s %s: %s", q->id, k3_rpc_code_name(code), msg);
  rt_req_free(q);
}

void rt_req_launch(rt_req_t *q, const rt_sink_t *sink, void *ctx) {
  rt_router_t *rt = q->rt;
  q->sink = sink;
  q->sink_ctx = ctx;
  q->counted = true;
  k3_gauge_add(k3_metric_default(rt->m.active_streams), 1);
  q->busy++; /* a synchronous failure below must not free q under our feet */
  k3_detok_opts_t dopt = {.stop_ids = (const int32_t *)q->stop_ids,
                          .n_stop_ids = q->n_stop_ids,
                          .stop_strs = (const char *const *)q->stop_strs,
                          .n_stop_strs = q->n_stop_strs,
                          .skip_special = false};
  int64_t max_ctx = rt_max_context(&rt->reg, 0);
  if (!rt->tok && q->n_stop_strs) {
    rt_req_fail(q, K3_RPC_INVALID_ARGUMENT,
                "stop.stop_strings: this router has no tokenizer (started with --synthetic): use stop token ids");
    goto out;
  }
  if (rt->tok && k3_detok_init(rt->tok, &dopt, &q->detok)) {
    rt_req_fail(q, K3_RPC_INVALID_ARGUMENT, "stop.stop_strings: invalid");
    goto out;
  }
  if (max_ctx > 0 && (int64_t)q->n_prompt + q->max_new > max_ctx) {
    rt_req_fail(q, K3_RPC_INVALID_ARGUMENT,
                "prompt: %zu tokens + stop.max_new_tokens %u exceed the context limit of %lld tokens", q->n_prompt,
                q->max_new, (long long)max_ctx);
    goto out;
  }
  q->router_ns += k3_now_ns() - q->t_arrive; /* intake: validation, tokenisation and placement */
  RT_TRACE(q, RT_TR_LAUNCH);
  rt_flow_start(q);
out:
  q->busy--;
  rt_req_maybe_free(q);
}
