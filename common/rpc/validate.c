/* Structural validation of k3pd.v1 requests (contracts in k3pd/rpc_validate.h).
 * Every failure writes "<field path>: <problem>" and returns K3_EINVAL; the first problem found
 * wins. Not here: model-dependent policy beyond k3_rpc_limits_t (the binaries own that). */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/xfer_desc.h"

#define MAX_ID_BYTES 128
#define MAX_STOP_STRINGS 16
#define MAX_STOP_STRING_BYTES 256
#define MAX_STOP_IDS 64
#define MAX_ADDR_BYTES 255
#define MAX_MODEL_NAME_BYTES 4096

__attribute__((format(printf, 3, 4))) static int fail(char *msg, size_t cap, const char *fmt, ...) {
  if (msg && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
  }
  return K3_EINVAL;
}

int k3_rpc_utf8_valid(const char *str, size_t len) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    unsigned cp, min;
    if ((c & 0xE0) == 0xC0) n = 1, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 2, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 3, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n > len - i - 1) return 0; /* truncated sequence */
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += n + 1;
  }
  return 1;
}

/* A request id: non-empty (when required), <= 128 bytes, printable ASCII (it goes into logs
 * and metadata). */
static int check_id(const char *id, int required, const char *path, char *msg, size_t cap) {
  size_t n = id ? strlen(id) : 0;
  if (n == 0) return required ? fail(msg, cap, "%s: required", path) : 0;
  if (n > MAX_ID_BYTES) return fail(msg, cap, "%s: longer than %d bytes", path, MAX_ID_BYTES);
  for (size_t i = 0; i < n; i++)
    if (id[i] < 0x21 || id[i] > 0x7E)
      return fail(msg, cap, "%s: byte %zu is not printable ASCII", path, i);
  return 0;
}

static int check_text(const char *s, const char *path, char *msg, size_t cap) {
  if (!k3_rpc_utf8_valid(s, strlen(s))) return fail(msg, cap, "%s: invalid UTF-8", path);
  return 0;
}

static int check_ids(const uint32_t *ids, size_t n, const k3_rpc_limits_t *lim, const char *path,
                     char *msg, size_t cap) {
  if (n == 0) return fail(msg, cap, "%s: must not be empty", path);
  if (lim && lim->max_prompt_tokens && n > lim->max_prompt_tokens)
    return fail(msg, cap, "%s: %zu tokens exceed the limit of %u", path, n, lim->max_prompt_tokens);
  if (lim && lim->vocab_size)
    for (size_t i = 0; i < n; i++)
      if (ids[i] >= lim->vocab_size)
        return fail(msg, cap, "%s[%zu]: token id %u >= vocabulary size %u", path, i, ids[i], lim->vocab_size);
  return 0;
}

int k3_rpc_validate_sampling(const K3pd__V1__SamplingParams *s, const char *path, char *msg, size_t cap) {
  if (!s) return 0; /* all defaults */
  if (s->temperature_opt_case == K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE &&
      (!isfinite(s->temperature) || s->temperature < 0.0f || s->temperature > 100.0f))
    return fail(msg, cap, "%s.temperature: must be in [0, 100], got %g", path, (double)s->temperature);
  if (s->top_p_opt_case == K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P &&
      (!isfinite(s->top_p) || s->top_p <= 0.0f || s->top_p > 1.0f))
    return fail(msg, cap, "%s.top_p: must be in (0, 1], got %g", path, (double)s->top_p);
  if (s->top_k < 0) return fail(msg, cap, "%s.top_k: must be >= 0, got %d", path, s->top_k);
  return 0;
}

int k3_rpc_validate_stop(const K3pd__V1__StopConditions *s, const k3_rpc_limits_t *lim,
                         const char *path, char *msg, size_t cap) {
  if (!s) return fail(msg, cap, "%s: required (max_new_tokens must be >= 1)", path);
  if (s->max_new_tokens < 1) return fail(msg, cap, "%s.max_new_tokens: must be >= 1", path);
  if (lim && lim->max_new_tokens && s->max_new_tokens > lim->max_new_tokens)
    return fail(msg, cap, "%s.max_new_tokens: %u exceeds the limit of %u", path, s->max_new_tokens,
                lim->max_new_tokens);
  if (s->n_stop_strings > MAX_STOP_STRINGS)
    return fail(msg, cap, "%s.stop_strings: more than %d entries", path, MAX_STOP_STRINGS);
  for (size_t i = 0; i < s->n_stop_strings; i++) {
    size_t n = strlen(s->stop_strings[i]);
    if (n == 0) return fail(msg, cap, "%s.stop_strings[%zu]: must not be empty", path, i);
    if (n > MAX_STOP_STRING_BYTES)
      return fail(msg, cap, "%s.stop_strings[%zu]: longer than %d bytes", path, i, MAX_STOP_STRING_BYTES);
    if (!k3_rpc_utf8_valid(s->stop_strings[i], n))
      return fail(msg, cap, "%s.stop_strings[%zu]: invalid UTF-8", path, i);
  }
  if (s->n_stop_token_ids > MAX_STOP_IDS)
    return fail(msg, cap, "%s.stop_token_ids: more than %d entries", path, MAX_STOP_IDS);
  if (lim && lim->vocab_size)
    for (size_t i = 0; i < s->n_stop_token_ids; i++)
      if (s->stop_token_ids[i] >= lim->vocab_size)
        return fail(msg, cap, "%s.stop_token_ids[%zu]: token id %u >= vocabulary size %u", path, i,
                    s->stop_token_ids[i], lim->vocab_size);
  return 0;
}

static int check_chat(const K3pd__V1__ChatInput *chat, const k3_rpc_limits_t *lim, char *msg, size_t cap) {
  if (chat->n_messages == 0) return fail(msg, cap, "chat.messages: must not be empty");
  size_t total = 0;
  for (size_t i = 0; i < chat->n_messages; i++) {
    const K3pd__V1__ChatMessage *m = chat->messages[i];
    char path[64];
    snprintf(path, sizeof path, "chat.messages[%zu]", i);
    if (!protobuf_c_enum_descriptor_get_value(&k3pd__v1__chat_role__descriptor, m->role))
      return fail(msg, cap, "%s.role: unknown enum value %d", path, (int)m->role);
    if (m->role == K3PD__V1__CHAT_ROLE__CHAT_ROLE_UNSPECIFIED)
      return fail(msg, cap, "%s.role: required", path);
    char sub[160];
    snprintf(sub, sizeof sub, "%s.content", path);
    if (check_text(m->content, sub, msg, cap)) return K3_EINVAL;
    if (m->content[0] == 0 && !(m->role == K3PD__V1__CHAT_ROLE__CHAT_ROLE_ASSISTANT && m->n_tool_calls > 0))
      return fail(msg, cap, "%s.content: must not be empty", path);
    snprintf(sub, sizeof sub, "%s.name", path);
    if (check_text(m->name, sub, msg, cap)) return K3_EINVAL;
    if (m->role == K3PD__V1__CHAT_ROLE__CHAT_ROLE_TOOL && m->tool_call_id[0] == 0)
      return fail(msg, cap, "%s.tool_call_id: required for role TOOL", path);
    if (m->n_tool_calls > 0 && m->role != K3PD__V1__CHAT_ROLE__CHAT_ROLE_ASSISTANT)
      return fail(msg, cap, "%s.tool_calls: only allowed for role ASSISTANT", path);
    for (size_t k = 0; k < m->n_tool_calls; k++) {
      const K3pd__V1__ToolCall *tc = m->tool_calls[k];
      if (tc->name[0] == 0) return fail(msg, cap, "%s.tool_calls[%zu].name: required", path, k);
      snprintf(sub, sizeof sub, "%s.tool_calls[%zu].arguments_json", path, k);
      if (check_text(tc->arguments_json, sub, msg, cap)) return K3_EINVAL;
    }
    total += strlen(m->content);
  }
  if (lim && lim->max_prompt_bytes && total > lim->max_prompt_bytes)
    return fail(msg, cap, "chat.messages: %zu content bytes exceed the limit of %u", total, lim->max_prompt_bytes);
  return 0;
}

int k3_rpc_validate_generate_request(const K3pd__V1__GenerateRequest *r, const k3_rpc_limits_t *lim,
                                     char *msg, size_t cap) {
  switch (r->input_case) {
    case K3PD__V1__GENERATE_REQUEST__INPUT_TEXT: {
      size_t n = strlen(r->text);
      if (n == 0) return fail(msg, cap, "text: must not be empty");
      if (!k3_rpc_utf8_valid(r->text, n)) return fail(msg, cap, "text: invalid UTF-8");
      if (lim && lim->max_prompt_bytes && n > lim->max_prompt_bytes)
        return fail(msg, cap, "text: %zu bytes exceed the limit of %u", n, lim->max_prompt_bytes);
      break;
    }
    case K3PD__V1__GENERATE_REQUEST__INPUT_CHAT:
      if (check_chat(r->chat, lim, msg, cap)) return K3_EINVAL;
      break;
    case K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS:
      if (check_ids(r->token_ids->ids, r->token_ids->n_ids, lim, "token_ids.ids", msg, cap)) return K3_EINVAL;
      break;
    default:
      return fail(msg, cap, "input: one of text, chat or token_ids is required");
  }
  if (k3_rpc_validate_sampling(r->sampling, "sampling", msg, cap)) return K3_EINVAL;
  if (k3_rpc_validate_stop(r->stop, lim, "stop", msg, cap)) return K3_EINVAL;
  if (check_id(r->request_id, 0, "request_id", msg, cap)) return K3_EINVAL;
  if (r->model[0] && lim && lim->model_name && strcmp(r->model, lim->model_name) != 0)
    return fail(msg, cap, "model: unknown model \"%.64s\" (this cluster serves \"%.64s\")", r->model,
                lim->model_name);
  return 0;
}

static int check_capacity_load(const K3pd__V1__RegisterRequest *r, char *msg, size_t cap) {
  const K3pd__V1__WorkerCapacity *c = r->capacity;
  if (!c) return fail(msg, cap, "capacity: required");
  if (c->max_batch < 1) return fail(msg, cap, "capacity.max_batch: must be >= 1");
  /* Claimed capacities are bounded: the router plans with them (a bogus pool of 10^9 pages would
   * attract every request), so they must be numbers a real worker can have. */
  static const struct {
    const char *name;
    size_t off;
    uint32_t max;
  } lim[] = {{"kv_pages", offsetof(K3pd__V1__WorkerCapacity, kv_pages), K3_RPC_MAX_KV_PAGES},
             {"page_tokens", offsetof(K3pd__V1__WorkerCapacity, page_tokens), K3_RPC_MAX_PAGE_TOKENS},
             {"kda_slots", offsetof(K3pd__V1__WorkerCapacity, kda_slots), K3_RPC_MAX_KDA_SLOTS},
             {"max_batch", offsetof(K3pd__V1__WorkerCapacity, max_batch), K3_RPC_MAX_BATCH},
             {"max_context_tokens", offsetof(K3pd__V1__WorkerCapacity, max_context_tokens), K3_RPC_MAX_CONTEXT}};
  for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
    uint32_t v;
    memcpy(&v, (const char *)c + lim[i].off, sizeof v);
    if (v > lim[i].max) return fail(msg, cap, "capacity.%s: %u exceeds the limit of %u", lim[i].name, v, lim[i].max);
  }
  if (r->role == K3PD__V1__ROLE__ROLE_DECODE) {
    if (c->kv_pages < 1) return fail(msg, cap, "capacity.kv_pages: must be >= 1 for a decode worker");
    if (c->page_tokens < 1) return fail(msg, cap, "capacity.page_tokens: must be >= 1 for a decode worker");
    if (c->kda_slots < 1) return fail(msg, cap, "capacity.kda_slots: must be >= 1 for a decode worker");
    if (c->max_context_tokens < 1)
      return fail(msg, cap, "capacity.max_context_tokens: must be >= 1 for a decode worker");
    if ((uint64_t)c->max_context_tokens > (uint64_t)c->kv_pages * c->page_tokens)
      return fail(msg, cap, "capacity.max_context_tokens: %u exceeds the pool (kv_pages %u x page_tokens %u)",
                  c->max_context_tokens, c->kv_pages, c->page_tokens);
    if (r->ucx_worker_address.len == 0)
      return fail(msg, cap, "ucx_worker_address: required for a decode worker");
  }
  if (r->ucx_worker_address.len > K3_XFER_MAX_ADDR_BYTES)
    return fail(msg, cap, "ucx_worker_address: %zu bytes exceed the limit of %d", r->ucx_worker_address.len,
                K3_XFER_MAX_ADDR_BYTES);
  const K3pd__V1__WorkerLoad *l = r->load;
  if (l && l->used_kv_pages > c->kv_pages)
    return fail(msg, cap, "load.used_kv_pages: %u exceeds capacity.kv_pages %u", l->used_kv_pages, c->kv_pages);
  if (l && l->used_kda_slots > c->kda_slots)
    return fail(msg, cap, "load.used_kda_slots: %u exceeds capacity.kda_slots %u", l->used_kda_slots, c->kda_slots);
  return 0;
}

int k3_rpc_validate_register_request(const K3pd__V1__RegisterRequest *r, char *msg, size_t cap) {
  if (!protobuf_c_enum_descriptor_get_value(&k3pd__v1__role__descriptor, r->role))
    return fail(msg, cap, "role: unknown enum value %d", (int)r->role);
  if (r->role == K3PD__V1__ROLE__ROLE_UNSPECIFIED) return fail(msg, cap, "role: required (PREFILL or DECODE)");
  if (check_id(r->worker_id, 1, "worker_id", msg, cap)) return K3_EINVAL;
  if (r->grpc_address[0] == 0) return fail(msg, cap, "grpc_address: required");
  if (!strchr(r->grpc_address, ':')) return fail(msg, cap, "grpc_address: expected host:port");
  if (strlen(r->grpc_address) > MAX_ADDR_BYTES)
    return fail(msg, cap, "grpc_address: longer than %d bytes", MAX_ADDR_BYTES);
  for (const char *p = r->grpc_address; *p; p++)
    if (*p < 0x21 || *p > 0x7E) return fail(msg, cap, "grpc_address: byte %zu is not printable ASCII",
                                            (size_t)(p - r->grpc_address));
  if (r->model_fingerprint == 0) return fail(msg, cap, "model_fingerprint: required (non-zero)");
  if (r->protocol_version != 1)
    return fail(msg, cap, "protocol_version: %u not supported (this router speaks 1)", r->protocol_version);
  if (check_text(r->model_name, "model_name", msg, cap)) return K3_EINVAL;
  if (strlen(r->model_name) > MAX_MODEL_NAME_BYTES)
    return fail(msg, cap, "model_name: longer than %d bytes", MAX_MODEL_NAME_BYTES);
  return check_capacity_load(r, msg, cap);
}

int k3_rpc_validate_heartbeat_request(const K3pd__V1__HeartbeatRequest *r, char *msg, size_t cap) {
  if (check_id(r->worker_id, 1, "worker_id", msg, cap)) return K3_EINVAL;
  if (!r->load) return fail(msg, cap, "load: required");
  return 0;
}

int k3_rpc_validate_deregister_request(const K3pd__V1__DeregisterRequest *r, char *msg, size_t cap) {
  if (check_id(r->worker_id, 1, "worker_id", msg, cap)) return K3_EINVAL;
  return check_text(r->reason, "reason", msg, cap);
}

int k3_rpc_validate_reserve_request(const K3pd__V1__ReserveRequest *r, char *msg, size_t cap) {
  if (check_id(r->request_id, 1, "request_id", msg, cap)) return K3_EINVAL;
  if (r->n_prompt_tokens < 1) return fail(msg, cap, "n_prompt_tokens: must be >= 1");
  if (r->max_new_tokens < 1) return fail(msg, cap, "max_new_tokens: must be >= 1");
  if (r->lease_ms < 1) return fail(msg, cap, "lease_ms: must be >= 1");
  return 0;
}

int k3_rpc_validate_release_request(const K3pd__V1__ReleaseRequest *r, char *msg, size_t cap) {
  return check_id(r->request_id, 1, "request_id", msg, cap);
}

int k3_rpc_validate_attach_request(const K3pd__V1__AttachRequest *r, const k3_rpc_limits_t *lim,
                                   char *msg, size_t cap) {
  if (check_id(r->request_id, 1, "request_id", msg, cap)) return K3_EINVAL;
  if (k3_rpc_validate_sampling(r->sampling, "sampling", msg, cap)) return K3_EINVAL;
  return k3_rpc_validate_stop(r->stop, lim, "stop", msg, cap);
}

int k3_rpc_validate_prefill_request(const K3pd__V1__PrefillRequest *r, const k3_rpc_limits_t *lim,
                                    char *msg, size_t cap) {
  if (check_id(r->request_id, 1, "request_id", msg, cap)) return K3_EINVAL;
  if (check_ids(r->token_ids, r->n_token_ids, lim, "token_ids", msg, cap)) return K3_EINVAL;
  if (k3_rpc_validate_sampling(r->sampling, "sampling", msg, cap)) return K3_EINVAL;
  if (r->reservation.len == 0) return fail(msg, cap, "reservation: required");
  if (r->decode_ucx_address.len > K3_XFER_MAX_ADDR_BYTES)
    return fail(msg, cap, "decode_ucx_address: longer than %d bytes", K3_XFER_MAX_ADDR_BYTES);
  if (r->resume_tokens >= r->n_token_ids && r->n_token_ids)
    return fail(msg, cap, "resume_tokens: must be < the number of token_ids (%zu), got %u", r->n_token_ids,
                r->resume_tokens);
  if (r->resumed && r->resume_tokens == 0) return fail(msg, cap, "resumed: set without resume_tokens");
  return 0; /* optional: the reservation carries the address (the worker compares them when both exist) */
}

int k3_rpc_validate_prepare_resume_request(const K3pd__V1__PrepareResumeRequest *r, char *msg, size_t cap) {
  if (check_id(r->request_id, 1, "request_id", msg, cap)) return K3_EINVAL;
  if (r->n_tokens < 1) return fail(msg, cap, "n_tokens: must be >= 1");
  if (r->n_tokens > K3_RPC_MAX_CONTEXT) return fail(msg, cap, "n_tokens: must be <= %u", K3_RPC_MAX_CONTEXT);
  if (r->resume_tokens < 1 || r->resume_tokens >= r->n_tokens)
    return fail(msg, cap, "resume_tokens: must be >= 1 and < n_tokens (%u), got %u", r->n_tokens, r->resume_tokens);
  if (r->lease_ms < 1) return fail(msg, cap, "lease_ms: must be >= 1");
  if (r->fingerprint == 0) return fail(msg, cap, "fingerprint: required (non-zero)");
  return 0;
}

int k3_rpc_validate_export_request(const K3pd__V1__ExportRequest *r, char *msg, size_t cap) {
  if (check_id(r->request_id, 1, "request_id", msg, cap)) return K3_EINVAL;
  if (r->epoch == 0) return fail(msg, cap, "epoch: required (non-zero)");
  if (r->descriptor.len == 0) return fail(msg, cap, "descriptor: required");
  return 0;
}

int k3_rpc_validate_abort_request(const K3pd__V1__AbortRequest *r, char *msg, size_t cap) {
  return check_id(r->request_id, 1, "request_id", msg, cap);
}
