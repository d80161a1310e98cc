/* k3pd-router entry point: flags and wiring only (ARCHITECTURE.md §1). The logic lives in
 * generate.c (the public Generate flow), cluster_svc.c (worker registry service) and
 * registry.c (placement policy).
 *
 * SIGTERM/SIGINT: NOT_SERVING, refuse new requests, let in-flight ones finish for
 * --drain-grace-ms, then cancel the rest and exit 0. A second signal exits at once (status 1). */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/lifecycle.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "http.h"
#include "rt.h"
#include "tokpool.h"

typedef struct {
  rt_router_t rt;
  k3_lifecycle_t *lc;
  int64_t drain_grace_ms;
} app_t;

static void on_client_closed(void *arg) { (void)arg; }

static void on_http_done(void *arg) { ((app_t *)arg)->rt.http = NULL; }

static void on_server_done(void *arg) {
  app_t *a = arg;
  rt_tokpool_close(a->rt.tokpool); /* answers what is left with K3_ESHUTDOWN */
  a->rt.tokpool = NULL;
  k3_rpc_client_close(a->rt.cli, on_client_closed, NULL);
  uv_close((uv_handle_t *)&a->rt.expiry_timer, NULL);
  rt_lag_stop(&a->rt);
}

static void begin_shutdown(void *ud) {
  app_t *a = ud;
  if (a->rt.http) rt_http_shutdown(a->rt.http, on_http_done, a); /* cancels what still runs */
  k3_rpc_server_shutdown(a->rt.srv, on_server_done, a);
}

static uint32_t live_requests(void *ud) { return rt_live_requests(&((app_t *)ud)->rt); }

static void on_drain(void *ud) {
  app_t *a = ud;
  a->rt.draining = true;
  if (a->rt.mhttp) k3_metrics_http_set_ready(a->rt.mhttp, false);
  k3_rpc_server_set_health(a->rt.srv, "", K3_RPC_HEALTH_NOT_SERVING);
  k3_rpc_server_set_health(a->rt.srv, "k3pd.v1.Generation", K3_RPC_HEALTH_NOT_SERVING);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  static app_t app;
  app_t *a = &app;
  rt_router_t *rt = &a->rt;
  const char *listen = "127.0.0.1:50051", *model = NULL, *model_name = NULL, *port_file = NULL, *log_level = NULL;
  const char *synthetic = NULL, *synthetic_config = NULL;
  const char *metrics_host = NULL, *http_host = NULL, *http_port_file = NULL;
  int metrics_port = -1, http_port = -1, http_max_conns = 1024, http_idle_s = 60, http_timeout_ms = 600000;
  int64_t http_max_body = -1, max_request_bytes = -1;
  int tokenize_threads = 2;
  int heartbeat_ms = 500, heartbeat_timeout_ms = 3000, lease_ms = 120000, max_new_limit = 4096, retries = 2;
  int worker_retries = 3;
  a->drain_grace_ms = 30000;
  k3_flag_t flags[] = {
      {"listen", K3_FLAG_STR, &listen, "HOST:PORT", "public gRPC address (port 0 = ephemeral)", false},
      {"model", K3_FLAG_STR, &model, "DIR", "model directory (config.json, tiktoken.model, tokenizer_config.json)",
       false},
      {"synthetic", K3_FLAG_STR, &synthetic, "PRESET", "instead of --model: the config of a preset (tiny, tiny-48b, "
       "medium) with NO tokenizer: token-id requests only (the workers' --synthetic weights; benchmarks)", false},
      {"synthetic-config", K3_FLAG_STR, &synthetic_config, "FILE", "instead of --model: this config.json with NO "
       "tokenizer: token-id requests only", false},
      {"model-name", K3_FLAG_STR, &model_name, "NAME", "name clients may put in GenerateRequest.model (default: "
       "the directory's name)", false},
      {"port-file", K3_FLAG_STR, &port_file, "FILE", "write the bound port here once serving", false},
      {"heartbeat-ms", K3_FLAG_INT, &heartbeat_ms, "MS", "heartbeat interval told to workers", false},
      {"heartbeat-timeout-ms", K3_FLAG_INT, &heartbeat_timeout_ms, "MS", "drop workers silent for this long", false},
      {"lease-ms", K3_FLAG_INT, &lease_ms, "MS", "decode reservation lease: the prompt's queueing, prefill and state "
       "transfer must fit in it (a prefill whose transfer misses it is re-issued with a fresh lease)", false},
      {"max-new-tokens-limit", K3_FLAG_INT, &max_new_limit, "N", "largest max_new_tokens accepted", false},
      {"prefill-retries", K3_FLAG_INT, &retries, "N", "re-issue a failed prefill to another worker up to N times",
       false},
      {"worker-retries", K3_FLAG_INT, &worker_retries, "N", "run a request again on other workers up to N times "
       "after a worker failed it (a stream that sent tokens resumes where it was)", false},
      {"drain-grace-ms", K3_FLAG_I64, &a->drain_grace_ms, "MS", "on SIGTERM, how long requests may finish", false},
      {"log-level", K3_FLAG_STR, &log_level, "LEVEL", "error|warn|info|debug", false},
      {"metrics-port", K3_FLAG_INT, &metrics_port, "N", "HTTP /metrics /healthz /readyz port (0 = ephemeral, -1 = off)",
       false},
      {"metrics-host", K3_FLAG_STR, &metrics_host, "IP", "address the metrics server binds (default all)", false},
      {"http-port", K3_FLAG_INT, &http_port, "N", "OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
       "/v1/models, /healthz /readyz /health /metrics) on this port (0 = ephemeral, -1 = off, the default: the "
       "manifests and `k3pd-cli up --http-port` turn it on)", false},
      {"http-host", K3_FLAG_STR, &http_host, "IP", "address the HTTP API binds (default all)", false},
      {"http-port-file", K3_FLAG_STR, &http_port_file, "FILE", "write the bound HTTP port here once serving", false},
      {"http-max-body-bytes", K3_FLAG_I64, &http_max_body, "N", "largest HTTP request body (413 above; default: "
       "--max-request-bytes)", false},
      {"max-request-bytes", K3_FLAG_I64, &max_request_bytes, "N", "largest gRPC request (RESOURCE_EXHAUSTED above, "
       "refused by the transport before the router sees it); default 8 bytes per token of the model's context, "
       "clamped to [1M, 64M] (8M for K3's 1M positions)", false},
      {"tokenize-threads", K3_FLAG_INT, &tokenize_threads, "N", "threads that tokenise text and render chat prompts "
       "off the event loop (1..64)", false},
      {"http-max-connections", K3_FLAG_INT, &http_max_conns, "N", "concurrent HTTP connections (default 1024)", false},
      {"http-idle-timeout-s", K3_FLAG_INT, &http_idle_s, "S", "close an HTTP connection silent this long while "
       "sending its request or between keep-alive requests (default 60)", false},
      {"http-timeout-ms", K3_FLAG_INT, &http_timeout_ms, "MS", "deadline of an HTTP generation request (504 when it "
       "passes; default 600000)", false},
  };
  k3_flags_info_t info = {"k3pd-router",
                          "The cluster's public endpoint (k3pd.v1.Generation). Tokenizes requests, picks a decode "
                          "worker (free KV pages + KDA slots) and a prefill worker (queued tokens), relays the token "
                          "stream and owns request lifetime. Workers register themselves (k3pd.v1.Cluster).",
                          NULL};
  char err[1024];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-router: %s\n", err);
    return 2;
  }
  if (k3_app_log_setup("k3pd-router", log_level)) return 2;
  if (http_max_body == 0 || http_max_body < -1 || max_request_bytes == 0 || max_request_bytes < -1 ||
      max_request_bytes > ((int64_t)1 << 31) - 1 || tokenize_threads < 1 || tokenize_threads > 64) {
    fprintf(stderr, "k3pd-router: need --http-max-body-bytes and --max-request-bytes >= 1 (at most 2G for gRPC), "
                    "--tokenize-threads in 1..64\n");
    return 2;
  }
  if (http_max_conns < 1 || http_idle_s < 1 || http_timeout_ms < 1) {
    fprintf(stderr, "k3pd-router: need --http-max-body-bytes, --http-max-connections, --http-idle-timeout-s and "
                    "--http-timeout-ms >= 1\n");
    return 2;
  }
  if (heartbeat_ms < 10 || heartbeat_timeout_ms <= heartbeat_ms || lease_ms < 1 || max_new_limit < 1 ||
      retries < 0 || worker_retries < 0) {
    fprintf(stderr, "k3pd-router: need --heartbeat-ms >= 10 < --heartbeat-timeout-ms, --lease-ms >= 1, "
                    "--max-new-tokens-limit >= 1, --prefill-retries >= 0, --worker-retries >= 0\n");
    return 2;
  }
  if ((model != NULL) + (synthetic != NULL) + (synthetic_config != NULL) != 1) {
    fprintf(stderr, "k3pd-router: give exactly one of --model DIR, --synthetic PRESET or --synthetic-config FILE\n");
    return 2;
  }
  if (model) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model);
    rc = k3_model_config_load(path, &rt->cfg, err, sizeof err);
  } else if (synthetic_config) {
    rc = k3_model_config_load(synthetic_config, &rt->cfg, err, sizeof err);
  } else {
    const char *json = k3_model_config_preset(synthetic);
    if (!json) {
      fprintf(stderr, "k3pd-router: --synthetic: unknown preset \"%s\" (known: %s)\n", synthetic,
              k3_model_config_preset_names());
      return 2;
    }
    rc = k3_model_config_parse(json, strlen(json), &rt->cfg, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "k3pd-router: %s\n", err);
    return 1;
  }
  /* The request size limit follows the context: 8 bytes per position of the model (prompts
   * average ~4 bytes per token of text; token ids take 1-5 bytes each on the wire), clamped. */
  if (max_request_bytes < 0) {
    int64_t ctx = rt->cfg.max_position_embeddings > 0 ? rt->cfg.max_position_embeddings : (int64_t)1 << 20;
    max_request_bytes = ctx * 8;
    if (max_request_bytes < ((int64_t)1 << 20)) max_request_bytes = (int64_t)1 << 20;
    if (max_request_bytes > ((int64_t)64 << 20)) max_request_bytes = (int64_t)64 << 20;
  }
  if (http_max_body < 0) http_max_body = max_request_bytes;
  /* The default stop ids follow the one rule k3pd-generate uses too (k3_model_config_stop_ids). */
  rt->n_eos_ids = k3_model_config_stop_ids(&rt->cfg, rt->eos_ids);
  if (model) {
    rc = k3_tok_load(model, NULL, &rt->tok, err, sizeof err);
    if (rc) {
      fprintf(stderr, "k3pd-router: tokenizer: %s\n", err);
      return 1;
    }
    /* the tokenizer's own stop pair is the same two specials, which the check below asserts */
    int32_t stops[2];
    int ns = k3_tok_stop_ids(rt->tok, stops);
    for (int i = 0; i < ns; i++) {
      bool have = false;
      for (int j = 0; j < rt->n_eos_ids; j++) have |= rt->eos_ids[j] == stops[i];
      if (!have) {
        fprintf(stderr, "k3pd-router: tokenizer stop id %d is not a model stop id: tokenizer and config disagree\n",
                stops[i]);
        return 1;
      }
    }
  } else {
    K3_WARN("no tokenizer (--%s): serving token-id requests only; text, chat and stop strings are refused",
            synthetic ? "synthetic" : "synthetic-config");
  }
  char mcopy[4096];
  snprintf(mcopy, sizeof mcopy, "%s", model ? model : synthetic ? synthetic : synthetic_config);
  snprintf(rt->model_name, sizeof rt->model_name, "%s", model_name ? model_name : basename(mcopy));
  rt->heartbeat_ms = (uint32_t)heartbeat_ms;
  rt->heartbeat_timeout_ms = (uint32_t)heartbeat_timeout_ms;
  rt->lease_ms = (uint32_t)lease_ms;
  rt->max_new_tokens_limit = (uint32_t)max_new_limit;
  rt->prefill_retries = (uint32_t)retries;
  rt->worker_retries = (uint32_t)worker_retries;
  rt_registry_init(&rt->reg);
  if (k3_metrics_init(&rt->mreg) || k3_router_metrics_register(rt->mreg, K3PD_VERSION, &rt->m)) {
    fprintf(stderr, "k3pd-router: cannot set up metrics\n");
    return 1;
  }
  if (k3_app_metrics_http(rt->mreg, "k3pd-router", metrics_host, metrics_port, &rt->mhttp)) return 1;
  uv_loop_t *loop = uv_default_loop();
  rt->loop = loop;
  if (rt->tok) {
    rt->max_token_bytes = k3_tok_max_token_bytes(rt->tok);
    if (rt_tokpool_init(loop, rt->tok, tokenize_threads, &rt->tokpool)) {
      fprintf(stderr, "k3pd-router: cannot start the tokenisation pool\n");
      return 1;
    }
  }
  k3_rpc_server_opts_t so = {.max_msg_bytes = (uint32_t)max_request_bytes};
  rc = k3_rpc_server_init(loop, &so, &rt->srv);
  if (!rc) rc = rt_cluster_register(rt);
  if (!rc) rc = rt_generate_register(rt);
  int port = 0;
  if (!rc) rc = k3_rpc_server_start(rt->srv, listen, &port);
  if (!rc) rc = k3_rpc_client_init(loop, NULL, &rt->cli);
  if (rc) {
    fprintf(stderr, "k3pd-router: starting the gRPC server on %s: %s\n", listen, k3_strerror(rc));
    return 1;
  }
  rt_expiry_start(rt);
  rt_lag_start(rt);
  if (http_port >= 0) {
    rt_http_opts_t ho = {.host = http_host,
                         .port = http_port,
                         .max_body_bytes = (uint64_t)http_max_body,
                         .max_connections = (unsigned)http_max_conns,
                         .idle_timeout_s = (unsigned)http_idle_s,
                         .request_timeout_ms = (uint32_t)http_timeout_ms};
    if (rt_http_start(rt, &ho, &rt->http)) return 1;
    K3_INFO("HTTP API (OpenAI-compatible) on port %d", rt_http_port(rt->http));
    if (http_port_file) {
      char buf[32];
      int n = snprintf(buf, sizeof buf, "%d\n", rt_http_port(rt->http));
      if (k3_write_file(http_port_file, buf, (size_t)n)) K3_WARN("cannot write --http-port-file %s", http_port_file);
    }
  }
  k3_lifecycle_opts_t lo = {.prog = "k3pd-router",
                            .grace_ms = a->drain_grace_ms,
                            .on_drain = on_drain,
                            .live_work = live_requests,
                            .on_shutdown = begin_shutdown,
                            .ud = a};
  if (k3_lifecycle_start(loop, &lo, &a->lc)) {
    fprintf(stderr, "k3pd-router: out of memory\n");
    return 1;
  }
  k3_rpc_server_set_health(rt->srv, "", K3_RPC_HEALTH_SERVING);
  k3_rpc_server_set_health(rt->srv, "k3pd.v1.Generation", K3_RPC_HEALTH_SERVING);
  k3_rpc_server_set_health(rt->srv, "liveness", K3_RPC_HEALTH_SERVING);
  rt_metrics_workers(rt);
  if (rt->mhttp) k3_metrics_http_set_ready(rt->mhttp, true);
  if (port_file) {
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%d\n", port);
    if (k3_write_file(port_file, buf, (size_t)n)) K3_WARN("cannot write --port-file %s", port_file);
  }
  K3_INFO("serving model \"%s\" (%s) on port %d; eos ids %d; requests up to %lld bytes, tokenised on %d threads "
          "(longest token %zu bytes)", rt->model_name, k3_model_type_name(rt->cfg.type), port, rt->n_eos_ids,
          (long long)max_request_bytes, rt->tokpool ? tokenize_threads : 0, rt->max_token_bytes);
  uv_run(loop, UV_RUN_DEFAULT);
  rt_registry_free(&rt->reg);
  k3_tok_free(rt->tok);
  k3_metrics_http_stop(rt->mhttp);
  k3_metrics_free(rt->mreg);
  uv_loop_close(loop);
  K3_INFO("stopped");
  return 0;
}
