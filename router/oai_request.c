/* The OpenAI front, request side: POST /v1/chat/completions and /v1/completions bodies decoded
 * into the one request path (intake.c), and GET /v1/models. The reply side is oai_reply.c.
 *
 * Every field is checked before any work, the first problem answered with 400 and an OpenAI
 * error object whose message starts with the field ("max_tokens: must be an integer >= 1, got
 * 0") and whose param names it. Then the same rules as the gRPC front apply through intake.c
 * and the shared validators (k3_rpc_validate_sampling / _stop): tokens, limits and defaults do
 * not depend on the front. Unknown fields are ignored (as the gRPC API ignores unknown
 * fields); fields this cluster cannot honour (n > 1, penalties, top_logprobs > 0, echo, ...)
 * are refused with "unsupported_value" rather than silently dropped. The accepted fields and
 * their k3pd meaning are tabled in docs/operations.md ("OpenAI-compatible HTTP API").
 *
 * Not here: HTTP (http_server.c), response shapes (oai_reply.c). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "oai.h"

#define MAX_STOP_STRINGS 16
#define MAX_STOP_IDS 64

typedef struct {
  K3pd__V1__SamplingParams s;
  K3pd__V1__StopConditions st;
  char *stops[MAX_STOP_STRINGS];
  uint32_t stop_ids[MAX_STOP_IDS];
  int64_t max_new; /* 0 = the default of the endpoint */
  bool logprobs;
} params_t;

__attribute__((format(printf, 4, 5))) static int bad(rt_hreq_t *r, const char *param, const char *code,
                                                     const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rt_hreq_error(r, 400, "invalid_request_error", param, code, "%s: %s", param, msg);
  return -1;
}

static const char *jtype(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
  }
}

/* Field readers: 0 = absent or null (out unchanged), 1 = set, -1 = answered 400. */
static int get_bool(rt_hreq_t *r, const json_t *o, const char *key, bool *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return bad(r, key, "invalid_type", "must be a boolean, got %s", jtype(v));
  *out = json_is_true(v);
  return 1;
}

static int get_int(rt_hreq_t *r, const json_t *o, const char *key, int64_t min, int64_t max, int64_t *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  int64_t x;
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e18) {
    x = (int64_t)json_real_value(v);
  } else {
    return bad(r, key, "invalid_type", "must be an integer, got %s", jtype(v));
  }
  if (x < min || x > max)
    return bad(r, key, "invalid_value", "must be in [%lld, %lld], got %lld", (long long)min, (long long)max,
               (long long)x);
  *out = x;
  return 1;
}

static int get_num(rt_hreq_t *r, const json_t *o, const char *key, double *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return bad(r, key, "invalid_type", "must be a number, got %s", jtype(v));
  *out = json_number_value(v);
  return 1;
}

static int get_str(rt_hreq_t *r, const json_t *o, const char *key, const char **out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v)) return bad(r, key, "invalid_type", "must be a string, got %s", jtype(v));
  *out = json_string_value(v);
  return 1;
}

/* A knob this cluster does not have: accepted only at its neutral value. */
static int neutral_num(rt_hreq_t *r, const json_t *o, const char *key, double neutral, const char *why) {
  double v = neutral;
  int rc = get_num(r, o, key, &v);
  if (rc < 0) return -1;
  if (rc && v != neutral) return bad(r, key, "unsupported_value", "only %g is supported (%s)", neutral, why);
  return 0;
}

/* ---- the fields both endpoints share ---- */

static int parse_common(rt_oai_t *o, const json_t *root, params_t *p) {
  rt_hreq_t *r = o->hr;
  rt_router_t *rt = o->rt;
  int64_t n = 1, i64;
  double d = 0;
  bool b;
  if (get_int(r, root, "n", INT64_MIN, INT64_MAX, &n) < 0) return -1;
  if (n != 1) return bad(r, "n", "unsupported_value", "only 1 is supported (one choice per request), got %lld", (long long)n);
  if (get_bool(r, root, "stream", &o->stream) < 0) return -1;
  json_t *so = json_object_get(root, "stream_options");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) return bad(r, "stream_options", "invalid_type", "must be an object, got %s", jtype(so));
    if (!o->stream) return bad(r, "stream_options", "invalid_value", "only allowed when stream is true");
    json_t *iu = json_object_get(so, "include_usage");
    if (iu && !json_is_null(iu) && !json_is_boolean(iu))
      return bad(r, "stream_options.include_usage", "invalid_type", "must be a boolean, got %s", jtype(iu));
    o->include_usage = json_is_true(iu);
  }
  /* length: max_completion_tokens (chat) wins over the older max_tokens */
  int64_t lim = rt->max_new_tokens_limit;
  int rc = o->chat ? get_int(r, root, "max_completion_tokens", 1, lim, &p->max_new) : 0;
  if (rc < 0) return -1;
  if (rc) {
    o->max_field = "max_completion_tokens";
  } else {
    o->max_field = "max_tokens";
    if (get_int(r, root, "max_tokens", 1, lim, &p->max_new) < 0) return -1;
  }
  k3pd__v1__sampling_params__init(&p->s);
  k3pd__v1__stop_conditions__init(&p->st);
  if ((rc = get_num(r, root, "temperature", &d)) < 0) return -1;
  if (rc) {
    if (!isfinite(d) || d < 0 || d > 100) return bad(r, "temperature", "invalid_value", "must be in [0, 100], got %g", d);
    p->s.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
    p->s.temperature = (float)d;
  }
  if ((rc = get_num(r, root, "top_p", &d)) < 0) return -1;
  if (rc) {
    if (!(d > 0 && d <= 1)) return bad(r, "top_p", "invalid_value", "must be in (0, 1], got %g", d);
    p->s.top_p_opt_case = K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P;
    p->s.top_p = (float)d;
  }
  i64 = 0;
  if (get_int(r, root, "top_k", -1, INT32_MAX, &i64) < 0) return -1;
  p->s.top_k = i64 < 0 ? 0 : (int32_t)i64; /* -1 = off, as vLLM */
  json_t *seed = json_object_get(root, "seed");
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed)) return bad(r, "seed", "invalid_type", "must be an integer, got %s", jtype(seed));
    p->s.seed_opt_case = K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
    p->s.seed = (uint64_t)json_integer_value(seed); /* a negative seed is its 64-bit two's complement */
  }
  json_t *stop = json_object_get(root, "stop");
  if (json_is_string(stop)) {
    p->stops[p->st.n_stop_strings++] = (char *)json_string_value(stop);
  } else if (json_is_array(stop)) {
    if (json_array_size(stop) > MAX_STOP_STRINGS)
      return bad(r, "stop", "invalid_value", "at most %d strings, got %zu", MAX_STOP_STRINGS, json_array_size(stop));
    for (size_t i = 0; i < json_array_size(stop); i++) {
      json_t *x = json_array_get(stop, i);
      char f[32];
      snprintf(f, sizeof f, "stop[%zu]", i);
      if (!json_is_string(x)) return bad(r, f, "invalid_type", "must be a string, got %s", jtype(x));
      p->stops[p->st.n_stop_strings++] = (char *)json_string_value(x);
    }
  } else if (stop && !json_is_null(stop)) {
    return bad(r, "stop", "invalid_type", "must be a string or an array of strings, got %s", jtype(stop));
  }
  for (size_t i = 0; i < p->st.n_stop_strings; i++) {
    size_t l = strlen(p->stops[i]);
    char f[32];
    snprintf(f, sizeof f, json_is_array(stop) ? "stop[%zu]" : "stop", i);
    if (l == 0 || l > 256) return bad(r, f, "invalid_value", "a stop string must be 1..256 bytes, got %zu", l);
  }
  p->st.stop_strings = p->stops;
  json_t *sti = json_object_get(root, "stop_token_ids");
  if (sti && !json_is_null(sti)) {
    if (!json_is_array(sti) || json_array_size(sti) > MAX_STOP_IDS)
      return bad(r, "stop_token_ids", "invalid_value", "must be an array of at most %d token ids", MAX_STOP_IDS);
    for (size_t i = 0; i < json_array_size(sti); i++) {
      json_t *x = json_array_get(sti, i);
      if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= rt->cfg.vocab_size)
        return bad(r, "stop_token_ids", "invalid_value", "entry %zu is not a token id in [0, %lld)", i,
                   (long long)rt->cfg.vocab_size);
      p->stop_ids[p->st.n_stop_token_ids++] = (uint32_t)json_integer_value(x);
    }
  }
  p->st.stop_token_ids = p->stop_ids;
  if (get_bool(r, root, "return_token_ids", &o->want_ids) < 0) return -1;
  b = false;
  if (get_bool(r, root, "ignore_eos", &b) < 0) return -1;
  p->st.ignore_eos = b;
  /* knobs the sampler does not have */
  if (neutral_num(r, root, "presence_penalty", 0, "no penalties in the sampler") ||
      neutral_num(r, root, "frequency_penalty", 0, "no penalties in the sampler") ||
      neutral_num(r, root, "repetition_penalty", 1, "no penalties in the sampler") ||
      neutral_num(r, root, "min_p", 0, "the sampler has temperature, top_p and top_k") ||
      neutral_num(r, root, "min_tokens", 0, "generation stops at the first stop condition") ||
      neutral_num(r, root, "best_of", 1, "one sequence per request"))
    return -1;
  json_t *lb = json_object_get(root, "logit_bias");
  if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
    return bad(r, "logit_bias", "unsupported_value", "logit biases are not supported");
  b = false;
  if (get_bool(r, root, "use_beam_search", &b) < 0) return -1;
  if (b) return bad(r, "use_beam_search", "unsupported_value", "beam search is not supported");
  return 0;
}

/* ---- chat ---- */

static int parse_tools(rt_oai_t *o, json_t *root, k3_chat_opts_t *co, json_t **filtered) {
  rt_hreq_t *r = o->hr;
  json_t *tools = json_object_get(root, "tools");
  if (json_object_get(root, "functions") && !json_is_null(json_object_get(root, "functions")))
    return bad(r, "functions", "unsupported_value", "the deprecated functions field is not supported; use tools");
  if (json_object_get(root, "function_call") && !json_is_null(json_object_get(root, "function_call")))
    return bad(r, "function_call", "unsupported_value", "the deprecated function_call field is not supported; use "
                                                        "tool_choice");
  size_t nt = 0;
  if (tools && !json_is_null(tools)) {
    if (!json_is_array(tools)) return bad(r, "tools", "invalid_type", "must be an array, got %s", jtype(tools));
    nt = json_array_size(tools);
    for (size_t i = 0; i < nt; i++) {
      json_t *t = json_array_get(tools, i), *ty = json_object_get(t, "type"), *fn = json_object_get(t, "function");
      char f[64];
      snprintf(f, sizeof f, "tools[%zu]", i);
      if (!json_is_object(t)) return bad(r, f, "invalid_type", "must be an object, got %s", jtype(t));
      if (ty && !(json_is_string(ty) && strcmp(json_string_value(ty), "function") == 0)) {
        snprintf(f, sizeof f, "tools[%zu].type", i);
        return bad(r, f, "unsupported_value", "only \"function\" tools are supported");
      }
      const char *nm = json_string_value(json_object_get(fn, "name"));
      if (!json_is_object(fn) || !nm || !*nm) {
        snprintf(f, sizeof f, "tools[%zu].function.name", i);
        return bad(r, f, "invalid_value", "required (a non-empty string)");
      }
    }
    if (nt) co->tools = tools;
  }
  json_t *tc = json_object_get(root, "tool_choice");
  if (!tc || json_is_null(tc)) return 0;
  if (json_is_string(tc)) {
    const char *s = json_string_value(tc);
    if (strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "required"))
      return bad(r, "tool_choice", "invalid_value", "must be \"none\", \"auto\", \"required\" or a named function, got "
                                                    "\"%.64s\"", s);
    if (!strcmp(s, "required") && !nt) return bad(r, "tool_choice", "invalid_value", "\"required\" needs tools");
    co->tool_choice = s;
    return 0;
  }
  const char *ty = json_string_value(json_object_get(tc, "type"));
  const char *nm = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
  if (!json_is_object(tc) || !ty || strcmp(ty, "function") != 0 || !nm)
    return bad(r, "tool_choice", "invalid_value", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                                  "\"function\": {\"name\": ...}}");
  /* A named function: the template's "required" with only that tool declared. */
  for (size_t i = 0; i < nt; i++) {
    json_t *t = json_array_get(tools, i);
    if (strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), nm) == 0) {
      *filtered = json_array();
      json_array_append(*filtered, t);
      co->tools = *filtered;
      co->tool_choice = "required";
      return 0;
    }
  }
  return bad(r, "tool_choice.function.name", "invalid_value", "no tool named \"%.64s\" in tools", nm);
}

static bool effort_ok(const char *e) { return !strcmp(e, "low") || !strcmp(e, "high") || !strcmp(e, "max"); }

/* Thinking on/off and effort: chat_template_kwargs {"thinking" | "enable_thinking": bool,
 * "thinking_effort": "low"|"high"|"max"|"none"|null} and reasoning_effort ("none" = thinking
 * off, "low" | "high" | "max"). Default: thinking on, effort "max" (as the gRPC API). */
static int parse_thinking(rt_oai_t *o, json_t *root, k3_chat_opts_t *co) {
  rt_hreq_t *r = o->hr;
  json_t *k = json_object_get(root, "chat_template_kwargs");
  const char *effort = "max";
  bool effort_given = false, thinking_given = false;
  co->thinking = true;
  if (k && !json_is_null(k)) {
    if (!json_is_object(k)) return bad(r, "chat_template_kwargs", "invalid_type", "must be an object, got %s", jtype(k));
    for (int i = 0; i < 2; i++) {
      const char *key = i ? "enable_thinking" : "thinking";
      json_t *v = json_object_get(k, key);
      if (!v || json_is_null(v)) continue;
      char f[64];
      snprintf(f, sizeof f, "chat_template_kwargs.%s", key);
      if (!json_is_boolean(v)) return bad(r, f, "invalid_type", "must be a boolean, got %s", jtype(v));
      co->thinking = json_is_true(v);
      thinking_given = true;
    }
    json_t *e = json_object_get(k, "thinking_effort");
    if (e) {
      effort_given = true;
      if (json_is_null(e) || (json_is_string(e) && !strcmp(json_string_value(e), "none"))) effort = NULL;
      else if (json_is_string(e) && effort_ok(json_string_value(e))) effort = json_string_value(e);
      else
        return bad(r, "chat_template_kwargs.thinking_effort", "invalid_value",
                   "must be \"low\", \"high\", \"max\", \"none\" or null");
    }
  }
  const char *re = NULL;
  if (get_str(r, root, "reasoning_effort", &re) < 0) return -1;
  if (re) {
    if (!strcmp(re, "none")) {
      if (thinking_given && co->thinking)
        return bad(r, "reasoning_effort", "invalid_value", "\"none\" contradicts chat_template_kwargs.thinking true");
      co->thinking = false;
    } else if (effort_ok(re)) {
      if (effort_given && (!effort || strcmp(effort, re) != 0))
        return bad(r, "reasoning_effort", "invalid_value", "\"%s\" contradicts chat_template_kwargs.thinking_effort", re);
      effort = re;
    } else {
      return bad(r, "reasoning_effort", "unsupported_value",
                 "K3 supports \"none\" (thinking off), \"low\", \"high\" and \"max\", got \"%.32s\"", re);
    }
  }
  co->thinking_effort = effort;
  return 0;
}

static int parse_messages(rt_oai_t *o, json_t *root, json_t **messages) {
  rt_hreq_t *r = o->hr;
  json_t *m = json_object_get(root, "messages");
  if (!m || json_is_null(m)) return bad(r, "messages", "missing_required_parameter", "required");
  if (!json_is_array(m)) return bad(r, "messages", "invalid_type", "must be an array, got %s", jtype(m));
  if (json_array_size(m) == 0) return bad(r, "messages", "invalid_value", "must not be empty");
  for (size_t i = 0; i < json_array_size(m); i++) {
    json_t *x = json_array_get(m, i);
    char f[48];
    snprintf(f, sizeof f, "messages[%zu]", i);
    if (!json_is_object(x)) return bad(r, f, "invalid_type", "must be an object, got %s", jtype(x));
    const char *role = json_string_value(json_object_get(x, "role"));
    snprintf(f, sizeof f, "messages[%zu].role", i);
    if (!role) return bad(r, f, "invalid_value", "required (system, developer, user, assistant or tool)");
    if (!strcmp(role, "developer")) json_object_set_new(x, "role", json_string("system"));
    else if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
      return bad(r, f, "invalid_value", "unknown role \"%.32s\" (system, developer, user, assistant or tool)", role);
  }
  *messages = m;
  return 0;
}

/* ---- both endpoints ---- */

static void json_error(rt_hreq_t *r, const json_error_t *je, size_t len) {
  if (len == 0) {
    rt_hreq_error(r, 400, "invalid_request_error", NULL, "invalid_json", "the request body is empty (expected a JSON "
                                                                         "object)");
    return;
  }
  const char *why = strstr(je->text, "\\u0000") ? "strings must not contain U+0000 (NUL)" : je->text;
  rt_hreq_error(r, 400, "invalid_request_error", NULL, "invalid_json",
                "the request body is not valid JSON: %s (line %d, column %d)", why, je->line, je->column);
}

static int prompt_completions(rt_oai_t *o, json_t *root, k3_tok_ids_t *ids, char *err, size_t errlen) {
  rt_router_t *rt = o->rt;
  json_t *p = json_object_get(root, "prompt");
  if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
    p = json_array_get(p, 0); /* ["text"] or [[ids]] */
  if (json_is_string(p)) {
    if (json_string_length(p) == 0) {
      snprintf(err, errlen, "prompt: must not be empty");
      return K3_EINVAL;
    }
    return rt_prompt_text(rt, json_string_value(p), json_string_length(p), ids, err, errlen);
  }
  size_t n = json_array_size(p);
  uint32_t *v = n ? malloc(n * sizeof *v) : NULL;
  if (n && !v) return K3_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    json_t *x = json_array_get(p, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > UINT32_MAX) {
      free(v);
      snprintf(err, errlen, "prompt[%zu]: expected a token id (an integer >= 0)", i);
      return K3_EINVAL;
    }
    v[i] = (uint32_t)json_integer_value(x);
  }
  int rc = rt_prompt_ids(rt, v, n, "prompt", ids, err, errlen);
  free(v);
  return rc;
}

static int check_completions_fields(rt_oai_t *o, json_t *root) {
  rt_hreq_t *r = o->hr;
  json_t *p = json_object_get(root, "prompt");
  if (!p || json_is_null(p)) return bad(r, "prompt", "missing_required_parameter", "required");
  if (json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0)))
    return bad(r, "prompt", "unsupported_value", "batched prompts are not supported: send one prompt per request");
  if (json_is_array(p) && json_array_size(p) == 0) return bad(r, "prompt", "invalid_value", "must not be empty");
  if (!json_is_string(p) && !json_is_array(p))
    return bad(r, "prompt", "invalid_type", "must be a string or an array of token ids, got %s", jtype(p));
  bool b = false;
  if (get_bool(r, root, "echo", &b) < 0) return -1;
  if (b) return bad(r, "echo", "unsupported_value", "echoing the prompt is not supported");
  const char *suffix = NULL;
  if (get_str(r, root, "suffix", &suffix) < 0) return -1;
  if (suffix && *suffix) return bad(r, "suffix", "unsupported_value", "suffixes (insertion) are not supported");
  int64_t lp = -1;
  if (get_int(r, root, "logprobs", 0, 20, &lp) < 0) return -1;
  if (lp > 0)
    return bad(r, "logprobs", "unsupported_value",
               "only 0 is supported: the cluster returns the sampled token's log probability, no alternatives");
  o->want_logprobs = lp == 0;
  return 0;
}

static int check_chat_logprobs(rt_oai_t *o, json_t *root) {
  rt_hreq_t *r = o->hr;
  bool lp = false;
  int64_t top = 0;
  if (get_bool(r, root, "logprobs", &lp) < 0) return -1;
  int rc = get_int(r, root, "top_logprobs", 0, 20, &top);
  if (rc < 0) return -1;
  if (rc && !lp) return bad(r, "top_logprobs", "invalid_value", "requires logprobs: true");
  if (top > 0)
    return bad(r, "top_logprobs", "unsupported_value",
               "only 0 is supported: the cluster returns the sampled token's log probability, no alternatives");
  o->want_logprobs = lp;
  return 0;
}

/* One request between its checks and its launch. Its prompt may be built off the loop
 * (tokpool.h): then this holds the HTTP request (a reference) and the JSON the prompt and the
 * parameters point into, until after_prompt ran. */
typedef struct {
  rt_hreq_t *r;
  rt_oai_t *o;
  rt_req_t *q;
  params_t p;
  k3_chat_opts_t co;
  json_t *root, *filtered;
  bool chat, held;
} hpend_t;

static void hpend_free(hpend_t *hp) {
  json_decref(hp->filtered);
  json_decref(hp->root);
  if (hp->held) rt_hreq_release(hp->r); /* may free the request and the front's state */
  free(hp);
}

/* The rest of the intake once the prompt is known (or failed): the default length, the
 * parameters, the launch. Frees hp. */
static void after_prompt(rt_req_t *q, void *arg, k3_tok_ids_t *ids, int rc, const char *err_in) {
  hpend_t *hp = arg;
  rt_oai_t *o = hp->o;
  rt_router_t *rt = o->rt;
  params_t *p = &hp->p;
  char err[768];
  snprintf(err, sizeof err, "%s", err_in ? err_in : "");
  k3_rpc_code_t code = K3_RPC_OK;
  if (hp->held && rt_hreq_gone(hp->r)) { /* the client left while the prompt was being built */
    rt_req_reject(q, K3_RPC_CANCELLED, "client disconnected");
    hpend_free(hp);
    return;
  }
  if (hp->held && q->deadline_left_ms != INT64_MAX && rt_req_timeout(q) <= 1) {
    code = K3_RPC_DEADLINE_EXCEEDED;
    snprintf(err, sizeof err, "deadline exceeded");
  } else if (rc) {
    code = rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : rc == K3_ESHUTDOWN ? K3_RPC_UNAVAILABLE
                                                                             : K3_RPC_INVALID_ARGUMENT;
  } else {
    /* The default length: chat as much as fits (the limit, or what the context leaves);
     * completions 16 tokens, as OpenAI's. */
    int64_t max_new = p->max_new ? p->max_new : hp->chat ? (int64_t)rt->max_new_tokens_limit : 16;
    int64_t ctx = rt_context_limit(rt);
    if (!p->max_new && ctx > 0 && ctx - (int64_t)ids->n < max_new) max_new = ctx - (int64_t)ids->n;
    p->st.max_new_tokens = max_new < 1 ? (uint32_t)(p->max_new ? p->max_new : 1) : (uint32_t)max_new;
    k3_rpc_limits_t lim = {.vocab_size = (uint32_t)rt->cfg.vocab_size, .max_new_tokens = rt->max_new_tokens_limit};
    rc = k3_rpc_validate_sampling(&p->s, "sampling", err, sizeof err);
    if (!rc) rc = k3_rpc_validate_stop(&p->st, &lim, "stop", err, sizeof err);
    if (!rc) rc = rt_req_set_params(q, &p->s, &p->st, o->want_logprobs, err, sizeof err);
    if (!rc) rc = rt_req_set_prompt(q, ids, err, sizeof err);
    if (rc) code = rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : K3_RPC_INVALID_ARGUMENT;
  }
  if (code) {
    rt_req_reject(q, code, err);
    rt_oai_fail(o, code, err);
    hpend_free(hp);
    return;
  }
  if (hp->chat) rt_oai_init_parser(o);
  rt_hreq_set_gen(hp->r, q);
  rt_hreq_wait(hp->r);
  rt_req_launch(q, &rt_oai_sink, o); /* a failure here answers through the sink */
  hpend_free(hp);
}

/* The text of a completions prompt ("text" or ["text"]), or NULL for token ids. */
static json_t *completions_text(json_t *root) {
  json_t *p = json_object_get(root, "prompt");
  if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
    p = json_array_get(p, 0);
  return json_is_string(p) ? p : NULL;
}

static void handle(rt_hreq_t *r, const char *body, size_t len, bool chat) {
  rt_router_t *rt = rt_hreq_router(r);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) {
    json_error(r, &je, len);
    return;
  }
  rt_oai_t *o = calloc(1, sizeof *o);
  hpend_t *hp = calloc(1, sizeof *hp);
  if (!o || !hp) {
    free(o);
    free(hp);
    json_decref(root);
    rt_hreq_error(r, 500, "server_error", NULL, "internal_error", "router out of memory");
    return;
  }
  rt_hreq_set_front(r, o, rt_oai_free);
  o->hr = r;
  o->rt = rt;
  o->chat = chat;
  o->created = k3_wall_ms() / 1000;
  o->max_field = "max_tokens";
  snprintf(o->model, sizeof o->model, "%s", rt->model_name);
  hp->r = r;
  hp->o = o;
  hp->root = root;
  hp->chat = chat;
  params_t *p = &hp->p;
  k3_chat_opts_t *co = &hp->co;
  k3_chat_opts_default(co);
  json_t *messages = NULL;
  k3_tok_ids_t ids = {0};
  char err[768];
  const char *model = NULL;
  if (!json_is_object(root)) {
    bad(r, "body", "invalid_type", "must be a JSON object, got %s", jtype(root));
    goto out;
  }
  if (get_str(r, root, "model", &model) < 0) goto out;
  if (model && *model && strcmp(model, rt->model_name) != 0) {
    rt_hreq_error(r, 404, "invalid_request_error", "model", "model_not_found",
                  "model: the model \"%.200s\" does not exist (this cluster serves \"%s\")", model, rt->model_name);
    goto out;
  }
  if (chat ? parse_messages(o, root, &messages) : check_completions_fields(o, root)) goto out;
  if (parse_common(o, root, p)) goto out;
  if (chat && (check_chat_logprobs(o, root) || parse_tools(o, root, co, &hp->filtered) || parse_thinking(o, root, co)))
    goto out;
  json_t *rf = chat ? json_object_get(root, "response_format") : NULL;
  if (rf && !json_is_null(rf)) {
    const char *t = json_string_value(json_object_get(rf, "type"));
    if (!t || (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema"))) {
      bad(r, "response_format", "invalid_value", "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
      goto out;
    }
    if (!strcmp(t, "json_schema") && !json_is_object(json_object_get(rf, "json_schema"))) {
      bad(r, "response_format.json_schema", "invalid_value", "required (an object with a schema) for type json_schema");
      goto out;
    }
    co->response_format = rf;
  }
  o->thinking = co->thinking;
  /* The request enters the one request path here. */
  rt_req_t *q;
  k3_rpc_code_t code;
  uint64_t waited_ms = (k3_now_ns() - rt_hreq_arrival_ns(r)) / 1000000;
  uint32_t tmo = rt_hreq_timeout_ms(r);
  if (rt_req_new(rt, rt_hreq_header(r, "X-Request-Id"), "request_id", tmo > waited_ms ? tmo - waited_ms : 1, &q,
                 &code, err, sizeof err)) {
    rt_oai_fail(o, code, err);
    goto out;
  }
  q->t_arrive = rt_hreq_arrival_ns(r);
  hp->q = q;
  snprintf(o->id, sizeof o->id, "%s%s", chat ? "chatcmpl-" : "cmpl-", q->id);
  /* Text and chat prompts are built off the loop; token ids are only copied. */
  json_t *text = chat ? NULL : completions_text(root);
  int rc;
  if (chat) rc = rt_prompt_chat_async(q, messages, co, (uint32_t)p->max_new, after_prompt, hp, err, sizeof err);
  else if (text && json_string_length(text) == 0) {
    snprintf(err, sizeof err, "prompt: must not be empty");
    rc = K3_EINVAL;
  } else if (text)
    rc = rt_prompt_text_async(q, json_string_value(text), json_string_length(text), (uint32_t)p->max_new, after_prompt,
                              hp, err, sizeof err);
  else
    rc = prompt_completions(o, root, &ids, err, sizeof err);
  if (rc == K3_EINPROGRESS) {
    hp->held = true;
    rt_hreq_hold(r);
    rt_hreq_wait(r); /* the connection waits; a client that leaves is noticed in after_prompt */
    return;
  }
  after_prompt(q, hp, &ids, rc, err);
  free(ids.ids);
  return;
out:
  free(ids.ids);
  hpend_free(hp);
}

void rt_oai_chat(rt_hreq_t *r, const char *body, size_t len) { handle(r, body, len, true); }

void rt_oai_completions(rt_hreq_t *r, const char *body, size_t len) { handle(r, body, len, false); }

/* ---- GET /v1/models ---- */

static void model_object(rt_hreq_t *r, rt_jw_t *w) {
  rt_router_t *rt = rt_hreq_router(r);
  int64_t ctx = rt_context_limit(rt);
  rt_jw_raw(w, "{\"id\":");
  rt_jw_strz(w, rt->model_name);
  rt_jw_raw(w, ",\"object\":\"model\",\"created\":");
  rt_jw_i64(w, rt_http_started_unix(r));
  rt_jw_raw(w, ",\"owned_by\":\"k3pd\",\"max_model_len\":");
  if (ctx > 0) rt_jw_i64(w, ctx);
  else rt_jw_raw(w, "null");
  rt_jw_raw(w, "}");
}

void rt_oai_models(rt_hreq_t *r, const char *id) {
  rt_router_t *rt = rt_hreq_router(r);
  if (id && strcmp(id, rt->model_name) != 0) {
    rt_hreq_error(r, 404, "invalid_request_error", "model", "model_not_found",
                  "model: the model \"%.200s\" does not exist (this cluster serves \"%s\")", id, rt->model_name);
    return;
  }
  rt_jw_t w = {{0}, 0};
  if (!id) rt_jw_raw(&w, "{\"object\":\"list\",\"data\":[");
  model_object(r, &w);
  rt_jw_raw(&w, id ? "\n" : "]}\n");
  if (w.err) {
    free(w.s.data);
    rt_hreq_error(r, 500, "server_error", NULL, "internal_error", "router out of memory");
    return;
  }
  rt_hreq_reply(r, 200, "application/json", w.s.data, w.s.len);
}
