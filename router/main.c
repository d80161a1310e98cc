/* k3pd-router entry point: flags and wiring only (ARCHITECTURE.md §1). The logic lives in
 * generate.c (the public Generate flow), cluster_svc.c (worker registry service),
 * registry.c (placement policy) and auth.c (API keys).
 *
 * Two gRPC servers (docs/operations.md "Security"): the public port (--listen: Generation +
 * health; optional TLS with --public-tls-cert, optional API keys) and the cluster port
 * (--cluster-listen: the Cluster service + health, mutual TLS; never exposed publicly). The
 * client to the workers uses the same cluster credentials and expects each worker's
 * certificate to carry its registered worker id.
 *
 * SIGTERM/SIGINT: NOT_SERVING, refuse new requests, let in-flight ones finish for
 * --drain-grace-ms, then cancel the rest and exit 0. A second signal exits at once (status 1). */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "auth.h"
#include "k3pd/apptls.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/netaddr.h"
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
  k3_rpc_tls_t *tls, *public_tls;
} app_t;

static void on_client_closed(void *arg) { (void)arg; }

static void on_http_done(void *arg) { ((app_t *)arg)->rt.http = NULL; }

static void on_cluster_done(void *arg) {
  app_t *a = arg;
  rt_tokpool_close(a->rt.tokpool); /* answers what is left with K3_ESHUTDOWN */
  a->rt.tokpool = NULL;
  k3_rpc_client_close(a->rt.cli, on_client_closed, NULL);
  uv_close((uv_handle_t *)&a->rt.expiry_timer, NULL);
  rt_lag_stop(&a->rt);
}

/* The public port first (its requests still use the workers), then the cluster port. */
static void on_server_done(void *arg) {
  app_t *a = arg;
  k3_rpc_server_shutdown(a->rt.csrv, on_cluster_done, a);
}

static void begin_shutdown(void *ud) {
  app_t *a = ud;
  if (a->rt.http) rt_http_shutdown(a->rt.http, on_http_done, a); /* cancels what still runs */
  k3_rpc_server_shutdown(a->rt.srv, on_server_done, a);
}

static void set_health(rt_router_t *rt, k3_rpc_health_t st, bool liveness) {
  k3_rpc_server_set_health(rt->srv, "", st);
  k3_rpc_server_set_health(rt->srv, "k3pd.v1.Generation", st);
  k3_rpc_server_set_health(rt->csrv, "", st);
  k3_rpc_server_set_health(rt->csrv, "k3pd.v1.Cluster", st);
  if (liveness) {
    k3_rpc_server_set_health(rt->srv, "liveness", K3_RPC_HEALTH_SERVING);
    k3_rpc_server_set_health(rt->csrv, "liveness", K3_RPC_HEALTH_SERVING);
  }
}

static void write_port(const char *file, const char *flag, int port) {
  if (!file) return;
  char buf[32];
  int n = snprintf(buf, sizeof buf, "%d\n", port);
  if (k3_write_file(file, buf, (size_t)n)) K3_WARN("cannot write %s %s", flag, file);
}

/* --cluster-listen default: the public host with the next port (an ephemeral public port gets
 * an ephemeral cluster port). */
static int default_cluster_listen(const char *listen, char *out, size_t cap) {
  char host[256], err[128];
  int port;
  if (k3_addr_split(listen, "--listen", host, sizeof host, &port, err, sizeof err) || port == 65535) return K3_EINVAL;
  snprintf(out, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port ? port + 1 : 0);
  return 0;
}

static uint32_t live_requests(void *ud) { return rt_live_requests(&((app_t *)ud)->rt); }

static void on_drain(void *ud) {
  app_t *a = ud;
  a->rt.draining = true;
  if (a->rt.mhttp) k3_metrics_http_set_ready(a->rt.mhttp, false);
  set_health(&a->rt, K3_RPC_HEALTH_NOT_SERVING, false);
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
  const char *prefix_cache = "on";
  double cache_load_tokens = 4096;
  const char *cluster_listen = NULL, *cluster_port_file = NULL, *public_cert = NULL, *public_key = NULL;
  const char *api_keys = NULL, *model_fp = NULL;
  double key_rate = 0, key_burst = 0;
  int key_conc = 0;
  k3_app_tls_t to;
  k3_app_tls_init(&to);
  a->drain_grace_ms = 30000;
  k3_flag_t flags[64] = {
      {"listen", K3_FLAG_STR, &listen, "HOST:PORT", "public gRPC address: Generation + health (port 0 = ephemeral)",
       false},
      {"cluster-listen", K3_FLAG_STR, &cluster_listen, "HOST:PORT", "cluster gRPC address: the Cluster service "
       "workers register with, mutual TLS (default: the --listen host, port + 1; ephemeral when --listen's is 0). "
       "Never expose it publicly", false},
      {"cluster-port-file", K3_FLAG_STR, &cluster_port_file, "FILE", "write the bound cluster port here once serving",
       false},
      {"public-tls-cert", K3_FLAG_STR, &public_cert, "FILE", "serve the public gRPC and HTTP ports over TLS with this "
       "certificate (PEM; with --public-tls-key)", false},
      {"public-tls-key", K3_FLAG_STR, &public_key, "FILE", "the public certificate's private key (PEM)", false},
      {"api-keys", K3_FLAG_STR, &api_keys, "FILE", "require an API key (authorization: Bearer KEY) on the public gRPC "
       "and HTTP APIs; lines \"NAME KEY [rate=R] [burst=B] [concurrency=C]\" (docs/operations.md)", false},
      {"api-key-rate", K3_FLAG_DOUBLE, &key_rate, "R", "requests per second per API key (0 = no limit); "
       "RESOURCE_EXHAUSTED / 429 above it", false},
      {"api-key-burst", K3_FLAG_DOUBLE, &key_burst, "B", "burst of the per-key rate limit (0 = max(1, rate))", false},
      {"api-key-concurrency", K3_FLAG_INT, &key_conc, "N", "requests in flight per API key (0 = no limit)", false},
      {"model-fingerprint", K3_FLAG_STR, &model_fp, "HEX", "the model fingerprint every worker must have (default: "
       "the first worker's, kept while any worker is registered)", false},
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
      {"prefix-cache", K3_FLAG_STR, &prefix_cache, "on|off", "send prompts to decode workers' prefix caches and "
       "place requests where their prefix is cached (default on; decode workers have their own --prefix-cache)",
       false},
      {"cache-route-load-tokens", K3_FLAG_DOUBLE, &cache_load_tokens, "N", "placement cost of a full decode worker "
       "in recomputed prompt tokens: a worker wins when (uncached prompt tokens) + N x (utilisation) is lowest "
       "(default 4096)", false},
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
  size_t nflags = 0;
  while (flags[nflags].name) nflags++;
  nflags += k3_app_tls_flags(&to, flags + nflags);
  k3_flags_info_t info = {"k3pd-router",
                          "The cluster's public endpoint (k3pd.v1.Generation). Tokenizes requests, picks a decode "
                          "worker (free KV pages + KDA slots) and a prefill worker (queued tokens), relays the token "
                          "stream and owns request lifetime. Workers register themselves (k3pd.v1.Cluster).",
                          NULL};
  char err[1024];
  int rc = k3_flags_parse(&info, flags, nflags, argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (!rc) rc = k3_app_tls_check(&to, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-router: %s\n", err);
    return 2;
  }
  if ((public_cert != NULL) != (public_key != NULL) || key_rate < 0 || key_burst < 0 || key_conc < 0) {
    fprintf(stderr, "k3pd-router: need both --public-tls-cert and --public-tls-key (or neither) and "
                    "--api-key-rate/--api-key-burst/--api-key-concurrency >= 0\n");
    return 2;
  }
  char cl_default[300];
  if (!cluster_listen) {
    if (default_cluster_listen(listen, cl_default, sizeof cl_default)) {
      fprintf(stderr, "k3pd-router: --listen %s: expected HOST:PORT below 65535 (or give --cluster-listen)\n", listen);
      return 2;
    }
    cluster_listen = cl_default;
  }
  if (model_fp) {
    char *end;
    rt->fingerprint = strtoull(model_fp, &end, 16);
    if (!*model_fp || *end || rt->fingerprint == 0) {
      fprintf(stderr, "k3pd-router: --model-fingerprint: expected a non-zero hex number, got \"%s\"\n", model_fp);
      return 2;
    }
    rt->fingerprint_fixed = true;
  }
  if (k3_app_log_setup("k3pd-router", log_level)) return 2;
  if (k3_app_tls_make(&to, to.router_identity, &a->tls, err, sizeof err) ||
      (public_cert && k3_rpc_tls_load(public_cert, public_key, NULL, &a->public_tls, err, sizeof err))) {
    fprintf(stderr, "k3pd-router: %s\n", err);
    return 2;
  }
  rt->tls = a->tls;
  if (api_keys) {
    rt_auth_limits_t lim = {.rate = key_rate, .burst = key_burst, .concurrency = (uint32_t)key_conc};
    if (rt_auth_load(api_keys, &lim, &rt->auth, err, sizeof err)) {
      fprintf(stderr, "k3pd-router: %s\n", err);
      return 2;
    }
    K3_INFO("public API: %zu API keys from %s", rt_auth_count(rt->auth), api_keys);
  } else {
    K3_INFO("public API: open (no --api-keys)");
  }
  if (http_max_body == 0 || http_max_body < -1 || max_request_bytes == 0 || max_request_bytes < -1 ||
      max_request_bytes > ((int64_t)1 << 31) - 1 || tokenize_threads < 1 || tokenize_threads > 64) {
    fprintf(stderr, "k3pd-router: need --http-max-body-bytes and --max-request-bytes >= 1 (at most 2G for gRPC), "
                    "--tokenize-threads in 1..64\n");
    return 2;
  }
  if ((strcmp(prefix_cache, "on") && strcmp(prefix_cache, "off")) || !(cache_load_tokens >= 0)) {
    fprintf(stderr, "k3pd-router: --prefix-cache: on or off; --cache-route-load-tokens: >= 0\n");
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
  rt->prefix_cache = !strcmp(prefix_cache, "on");
  rt->cache_load_tokens = cache_load_tokens;
  uint32_t tag = 0;
  if (getrandom(&tag, sizeof tag, 0) != (ssize_t)sizeof tag) tag = (uint32_t)k3_hash64(&tag, sizeof tag, k3_now_ns());
  snprintf(rt->instance, sizeof rt->instance, "%08x", tag);
  rt_registry_init(&rt->reg);
  if (k3_metrics_init(&rt->mreg) || k3_router_metrics_register(rt->mreg, K3PD_VERSION, &rt->m)) {
    fprintf(stderr, "k3pd-router: cannot set up metrics\n");
    return 1;
  }
  if (k3_app_metrics_http(rt->mreg, "k3pd-router", metrics_host, metrics_port, to.metrics_tls ? a->tls : NULL,
                          &rt->mhttp))
    return 1;
  uv_loop_t *loop = uv_default_loop();
  rt->loop = loop;
  if (rt->tok) {
    rt->max_token_bytes = k3_tok_max_token_bytes(rt->tok);
    if (rt_tokpool_init(loop, rt->tok, tokenize_threads, &rt->tokpool)) {
      fprintf(stderr, "k3pd-router: cannot start the tokenisation pool\n");
      return 1;
    }
  }
  int port = 0, cport = 0, hport = 0;
  k3_rpc_server_opts_t so = {.max_msg_bytes = (uint32_t)max_request_bytes};
  rc = k3_rpc_server_init(loop, &so, &rt->srv);
  if (!rc) rc = rt_generate_register(rt);
  if (!rc) rc = k3_rpc_server_add_port(rt->srv, listen, a->public_tls, 0, &port);
  if (!rc) rc = k3_rpc_server_start(rt->srv, NULL, NULL);
  if (rc) {
    fprintf(stderr, "k3pd-router: starting the public gRPC server on %s: %s\n", listen, k3_strerror(rc));
    return 1;
  }
  rc = k3_rpc_server_init(loop, NULL, &rt->csrv);
  if (!rc) rc = rt_cluster_register(rt);
  /* every Cluster call needs a cluster certificate; cluster_svc.c matches it to the worker id */
  if (!rc && a->tls) rc = k3_rpc_server_require_peer(rt->csrv, NULL, 0);
  if (!rc) rc = k3_rpc_server_add_port(rt->csrv, cluster_listen, a->tls, a->tls != NULL, &cport);
  if (!rc && to.health_listen) rc = k3_rpc_server_add_port(rt->csrv, to.health_listen, NULL, 0, &hport);
  if (!rc) rc = k3_rpc_server_start(rt->csrv, NULL, NULL);
  if (rc) {
    fprintf(stderr, "k3pd-router: starting the cluster gRPC server on %s%s%s: %s\n", cluster_listen,
            to.health_listen ? " / --health-listen " : "", to.health_listen ? to.health_listen : "", k3_strerror(rc));
    return 1;
  }
  k3_rpc_client_opts_t co = {.tls = a->tls, .peer_name_fn = rt_worker_name_for, .peer_name_ud = rt};
  rc = k3_rpc_client_init(loop, &co, &rt->cli);
  if (rc) {
    fprintf(stderr, "k3pd-router: gRPC client: %s\n", k3_strerror(rc));
    return 1;
  }
  rt_trace_open(rt);
  rt_expiry_start(rt);
  rt_lag_start(rt);
  if (http_port >= 0) {
    rt_http_opts_t ho = {.host = http_host,
                         .port = http_port,
                         .max_body_bytes = (uint64_t)http_max_body,
                         .max_connections = (unsigned)http_max_conns,
                         .idle_timeout_s = (unsigned)http_idle_s,
                         .request_timeout_ms = (uint32_t)http_timeout_ms,
                         .tls = a->public_tls};
    if (rt_http_start(rt, &ho, &rt->http)) return 1;
    K3_INFO("HTTP API (OpenAI-compatible) on port %d", rt_http_port(rt->http));
    write_port(http_port_file, "--http-port-file", rt_http_port(rt->http));
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
  set_health(rt, K3_RPC_HEALTH_SERVING, true);
  rt_metrics_workers(rt);
  if (rt->mhttp) k3_metrics_http_set_ready(rt->mhttp, true);
  /* the cluster port file first: whoever waits for the public one may start workers at once */
  write_port(cluster_port_file, "--cluster-port-file", cport);
  write_port(port_file, "--port-file", port);
  K3_INFO("router instance %s: the workers see its request ids as %s/<id>", rt->instance, rt->instance);
  K3_INFO("serving model \"%s\" (%s) on port %d (public%s%s), cluster port %d (%s)%s; eos ids %d; requests up to "
          "%lld bytes, tokenised on %d threads (longest token %zu bytes)", rt->model_name,
          k3_model_type_name(rt->cfg.type), port, a->public_tls ? ", TLS" : "", rt->auth ? ", API keys" : "", cport,
          a->tls ? "mutual TLS" : "INSECURE", hport ? ", health-only port" : "", rt->n_eos_ids,
          (long long)max_request_bytes, rt->tokpool ? tokenize_threads : 0, rt->max_token_bytes);
  if (hport) K3_INFO("health-only port %d (plaintext, grpc.health.v1)", hport);
  uv_run(loop, UV_RUN_DEFAULT);
  rt_trace_close(rt);
  rt_registry_free(&rt->reg);
  rt_auth_free(rt->auth);
  k3_rpc_tls_free(a->tls);
  k3_rpc_tls_free(a->public_tls);
  k3_tok_free(rt->tok);
  k3_metrics_http_stop(rt->mhttp);
  k3_metrics_free(rt->mreg);
  uv_loop_close(loop);
  K3_INFO("stopped");
  return 0;
}
