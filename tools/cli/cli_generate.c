/* k3pd-cli generate: streams one generation from a router (k3pd.v1.Generation/Generate).
 * Text deltas go to stdout as they arrive; the final stdout line is "ids: <generated ids>";
 * a timing summary goes to stderr. Exit status: 0 on success, 1 on an RPC error (the gRPC
 * status and message are printed), 2 on bad flags. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "cli.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/rpc_client.h"
#include "k3pd/util.h"
#include "k3pd/v1/generation.pb-c.h"

typedef struct {
  uint32_t *ids;
  size_t n, cap;
  uint64_t t0, t_first;
  int finish;
  K3pd__V1__Usage usage;
  K3pd__V1__Timings timings;
  bool have_final;
  int code;
  char details[512];
  k3_rpc_client_t *cli;
} gen_state_t;

static const char *finish_name(int f) {
  static const char *n[] = {"unspecified", "stop", "length", "cancelled", "deadline", "error", "context_length"};
  return f >= 0 && f <= 6 ? n[f] : "unknown";
}

static void on_msg(void *arg, const ProtobufCMessage *msg) {
  gen_state_t *s = arg;
  const K3pd__V1__GenerateResponse *r = (const K3pd__V1__GenerateResponse *)msg;
  if (r->n_token_ids && !s->t_first) s->t_first = k3_now_ns();
  for (size_t i = 0; i < r->n_token_ids; i++) {
    if (s->n == s->cap) {
      size_t nc = s->cap ? s->cap * 2 : 64;
      uint32_t *ni = realloc(s->ids, nc * sizeof *ni);
      if (!ni) continue;
      s->ids = ni;
      s->cap = nc;
    }
    s->ids[s->n++] = r->token_ids[i];
  }
  if (r->text && *r->text) {
    fputs(r->text, stdout);
    fflush(stdout);
  }
  if (r->finish_reason) {
    s->finish = r->finish_reason;
    s->have_final = true;
    if (r->usage) s->usage = *r->usage;
    if (r->timings) s->timings = *r->timings;
  }
}

static void on_closed(void *arg) { (void)arg; }

static void on_done(void *arg, const k3_rpc_status_t *st) {
  gen_state_t *s = arg;
  s->code = (int)st->code;
  snprintf(s->details, sizeof s->details, "%s", st->details);
  k3_rpc_client_close(s->cli, on_closed, NULL);
}

/* --chat FILE: a JSON array of {"role": ..., "content": ...} (or {"messages": [...]}). */
static int load_chat(const char *path, K3pd__V1__ChatInput *chat, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    snprintf(err, errlen, "--chat %s: %s (line %d)", path, je.text, je.line);
    return K3_EINVAL;
  }
  json_t *arr = json_is_object(root) ? json_object_get(root, "messages") : root;
  if (!json_is_array(arr) || json_array_size(arr) == 0) {
    snprintf(err, errlen, "--chat %s: expected a non-empty array of messages", path);
    json_decref(root);
    return K3_EINVAL;
  }
  size_t n = json_array_size(arr);
  chat->messages = calloc(n, sizeof *chat->messages);
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(arr, i);
    K3pd__V1__ChatMessage *cm = calloc(1, sizeof *cm);
    k3pd__v1__chat_message__init(cm);
    const char *role = json_string_value(json_object_get(m, "role"));
    const char *content = json_string_value(json_object_get(m, "content"));
    static const char *roles[] = {"", "system", "user", "assistant", "tool"};
    for (int k = 1; k <= 4; k++)
      if (role && !strcmp(role, roles[k])) cm->role = (K3pd__V1__ChatRole)k;
    if (!cm->role || !content) {
      snprintf(err, errlen, "--chat %s: message %zu needs a role (system|user|assistant|tool) and a content string",
               path, i);
      json_decref(root);
      return K3_EINVAL;
    }
    cm->content = strdup(content);
    chat->messages[chat->n_messages++] = cm;
  }
  json_decref(root);
  chat->add_generation_prompt = true;
  return 0;
}

static int run_generate(int argc, char **argv) {
  const char *router = "127.0.0.1:50051", *prompt = NULL, *prompt_ids = NULL, *chat_file = NULL, *user = NULL;
  const char *stop = NULL, *request_id = NULL;
  int max_new = 32, top_k = 0;
  double temperature = -1, top_p = 1.0;
  int64_t seed = -1, timeout_ms = 120000;
  bool ignore_eos = false, quiet = false;
  k3_flag_t flags[] = {
      {"router", K3_FLAG_STR, &router, "HOST:PORT", "router address", false},
      {"prompt", K3_FLAG_STR, &prompt, "TEXT", "raw prompt text (no chat template)", false},
      {"prompt-ids", K3_FLAG_STR, &prompt_ids, "IDS", "prompt as comma-separated token ids", false},
      {"user", K3_FLAG_STR, &user, "TEXT", "one user message, rendered with the model's chat template", false},
      {"chat", K3_FLAG_STR, &chat_file, "FILE", "a JSON conversation [{\"role\":..,\"content\":..}, ...]", false},
      {"max-new-tokens", K3_FLAG_INT, &max_new, "N", "most tokens to generate", false},
      {"temperature", K3_FLAG_DOUBLE, &temperature, "T", "sampling temperature (unset or 0 = greedy)", false},
      {"top-p", K3_FLAG_DOUBLE, &top_p, "P", "nucleus sampling mass", false},
      {"top-k", K3_FLAG_INT, &top_k, "K", "keep the K most likely tokens (0 = off)", false},
      {"seed", K3_FLAG_I64, &seed, "S", "sampling seed (default: the router picks one)", false},
      {"stop", K3_FLAG_STR, &stop, "STR", "stop string", false},
      {"ignore-eos", K3_FLAG_BOOL, &ignore_eos, NULL, "do not stop on the model's end-of-sequence ids", false},
      {"request-id", K3_FLAG_STR, &request_id, "ID", "request id for logs", false},
      {"timeout-ms", K3_FLAG_I64, &timeout_ms, "MS", "deadline of the whole request", false},
      {"quiet", K3_FLAG_BOOL, &quiet, NULL, "no timing summary on stderr", false},
  };
  k3_flags_info_t info = {"k3pd-cli generate",
                          "Streams a generation from a k3pd router. Give exactly one of --prompt, --prompt-ids, "
                          "--user or --chat. The final stdout line is 'ids: <generated ids>'.",
                          NULL};
  char err[512];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-cli generate: %s\n", err);
    return 2;
  }
  int inputs = !!prompt + !!prompt_ids + !!chat_file + !!user;
  if (inputs != 1) {
    fprintf(stderr, "k3pd-cli generate: give exactly one of --prompt, --prompt-ids, --user or --chat\n");
    return 2;
  }
  if (max_new < 1 || timeout_ms < 1) {
    fprintf(stderr, "k3pd-cli generate: --max-new-tokens and --timeout-ms must be >= 1\n");
    return 2;
  }
  K3pd__V1__GenerateRequest req = K3PD__V1__GENERATE_REQUEST__INIT;
  K3pd__V1__TokenIds tids = K3PD__V1__TOKEN_IDS__INIT;
  K3pd__V1__ChatInput chat = K3PD__V1__CHAT_INPUT__INIT;
  K3pd__V1__ChatMessage um = K3PD__V1__CHAT_MESSAGE__INIT;
  K3pd__V1__ChatMessage *ump = &um;
  K3pd__V1__SamplingParams sp = K3PD__V1__SAMPLING_PARAMS__INIT;
  K3pd__V1__StopConditions sc = K3PD__V1__STOP_CONDITIONS__INIT;
  int32_t *ids32 = NULL;
  if (prompt) {
    req.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TEXT;
    req.text = (char *)prompt;
  } else if (prompt_ids) {
    size_t n = 0;
    if (k3_parse_int_list(prompt_ids, &ids32, &n, err, sizeof err) || n == 0) {
      fprintf(stderr, "k3pd-cli generate: --prompt-ids: %s\n", n ? err : "empty");
      return 2;
    }
    tids.ids = calloc(n, sizeof *tids.ids);
    for (size_t i = 0; i < n; i++) tids.ids[i] = (uint32_t)ids32[i];
    tids.n_ids = n;
    req.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
    req.token_ids = &tids;
  } else if (user) {
    um.role = K3PD__V1__CHAT_ROLE__CHAT_ROLE_USER;
    um.content = (char *)user;
    chat.messages = &ump;
    chat.n_messages = 1;
    chat.add_generation_prompt = true;
    req.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_CHAT;
    req.chat = &chat;
  } else {
    if (load_chat(chat_file, &chat, err, sizeof err)) {
      fprintf(stderr, "k3pd-cli generate: %s\n", err);
      return 2;
    }
    req.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_CHAT;
    req.chat = &chat;
  }
  if (temperature >= 0) {
    sp.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
    sp.temperature = (float)temperature;
  } else {
    sp.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
    sp.temperature = 0.0f; /* greedy, as k3pd-generate */
  }
  sp.top_p_opt_case = K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P;
  sp.top_p = (float)top_p;
  sp.top_k = top_k;
  if (seed >= 0) {
    sp.seed_opt_case = K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
    sp.seed = (uint64_t)seed;
  }
  req.sampling = &sp;
  sc.max_new_tokens = (uint32_t)max_new;
  sc.ignore_eos = ignore_eos;
  char *stops[1] = {(char *)stop};
  if (stop) {
    sc.stop_strings = stops;
    sc.n_stop_strings = 1;
  }
  req.stop = &sc;
  req.request_id = (char *)(request_id ? request_id : "");
  uv_loop_t loop;
  uv_loop_init(&loop);
  gen_state_t s = {0};
  s.t0 = k3_now_ns();
  s.code = -1;
  rc = k3_rpc_client_init(&loop, NULL, &s.cli);
  k3_rpc_call_opts_t o = {.timeout_ms = (uint32_t)timeout_ms, .request_id = request_id};
  if (!rc)
    rc = k3_rpc_stream(s.cli, router, "/k3pd.v1.Generation/Generate", &req.base,
                       &k3pd__v1__generate_response__descriptor, &o, on_msg, on_done, &s, NULL);
  if (rc) {
    fprintf(stderr, "k3pd-cli generate: cannot start the call: %s\n", k3_strerror(rc));
    return 1;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  uint64_t t_end = k3_now_ns();
  printf("\nids:");
  for (size_t i = 0; i < s.n; i++) printf(" %u", s.ids[i]);
  printf("\n");
  fflush(stdout);
  int status = 0;
  if (s.code != 0) {
    fprintf(stderr, "k3pd-cli generate: %s: %s\n", k3_rpc_code_name(s.code), s.details);
    status = 1;
  } else if (!quiet) {
    double ttft = s.t_first ? (double)(s.t_first - s.t0) / 1e6 : 0, total = (double)(t_end - s.t0) / 1e6;
    double itl = s.n > 1 && s.t_first ? (double)(t_end - s.t_first) / 1e6 / (double)(s.n - 1) : 0;
    fprintf(stderr,
            "k3pd-cli: %u prompt + %u generated tokens, finish %s; time to first token %.1f ms, "
            "%.1f ms/token after it, total %.1f ms (cluster: prefill %.1f ms, state handoff %.2f ms)\n",
            s.usage.prompt_tokens, s.usage.completion_tokens, finish_name(s.finish), ttft, itl, total,
            (double)s.timings.prefill_us / 1e3, (double)s.timings.handoff_us / 1e3);
  }
  free(s.ids);
  free(tids.ids);
  free(ids32);
  return status;
}

const k3_cli_cmd_t cli_generate_cmds[] = {
    {"generate", "stream a generation from a router (prompt text, ids or chat)", run_generate},
};
const size_t cli_generate_ncmds = sizeof cli_generate_cmds / sizeof cli_generate_cmds[0];
