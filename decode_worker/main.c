/* k3pd-decode entry point: flags and wiring only (ARCHITECTURE.md §1). The logic lives in
 * service.c (control plane) and engine.c (the decode loop).
 *
 * Start-up: load the model, register the receive pools with UCX, serve k3pd.v1.Decode +
 * grpc.health.v1, register with the router, report SERVING.
 * SIGTERM/SIGINT: drain — NOT_SERVING, tell the router (heartbeat draining), refuse new
 * reservations, let running sequences finish for --drain-grace-ms, then cancel what is left,
 * deregister, shut down, exit 0. A second signal exits at once with status 1. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dc.h"
#include "k3pd/apptls.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/lifecycle.h"
#include "k3pd/log.h"
#include "k3pd/netaddr.h"
#include "k3pd/util.h"
#include "k3_load.h"

typedef struct {
  dc_worker_t w;
  k3_weights_t *weights;
  k3_lifecycle_t *lc;
  uv_timer_t metrics_timer;
  int64_t drain_grace_ms;
  k3_rpc_tls_t *tls; /* cluster credentials (NULL with --insecure-cluster) */
} app_t;

void dc_metrics_refresh(dc_worker_t *w) {
  dc_expire_local(w);
  /* Pages by holder: a page shared by several requests counts once (as reserved when none of
   * them runs yet); a page also held by the cache counts with the requests. */
  long pr = 0, sr = 0, su = 0;
  long held = (long)w->num_pages - w->n_free_pages - (long)w->cache.pages_cache_only;
  for (dc_req_t *q = w->reqs; q; q = q->next) {
    if (q->state == DC_RESERVED || q->state == DC_READY) {
      pr += q->n_pages - (q->hit ? q->hit->n_pages : 0);
      sr += q->slot >= 0;
    } else {
      su += q->slot >= 0;
    }
  }
  if (pr > held) pr = held;
  k3_decode_metrics_set_pools_cached(&w->m, pr, held - pr, w->n_free_pages, w->cache.pages_cache_only, sr, su,
                                     w->n_free_slots, w->cache.slots);
  k3_gauge_set(k3_metric_default(w->m.cache_entries), (double)w->cache.n_entries);
  k3_gauge_set(k3_metric_default(w->m.running_sequences), (double)w->n_running);
  k3_xfer_stats_t xs;
  k3_xfer_ctx_stats(w->xfer, &xs);
  k3_counter_add(k3_metric_default(w->m.lease_expiries_total), (double)(xs.leases_expired - w->last_xs.leases_expired));
  const char *r;
  r = K3PD_REJECT_STALE_EPOCH;
  k3_metric_add(w->m.rejected_dones_total, &r, (double)(xs.done_rejected_stale - w->last_xs.done_rejected_stale));
  r = K3PD_REJECT_DIGEST_MISMATCH;
  k3_metric_add(w->m.rejected_dones_total, &r, (double)(xs.done_rejected_digest - w->last_xs.done_rejected_digest));
  r = K3PD_REJECT_FINGERPRINT_MISMATCH;
  k3_metric_add(w->m.rejected_dones_total, &r,
                (double)(xs.done_rejected_fingerprint - w->last_xs.done_rejected_fingerprint));
  r = K3PD_REJECT_UNKNOWN_REQUEST;
  k3_metric_add(w->m.rejected_dones_total, &r, (double)(xs.done_rejected_unknown - w->last_xs.done_rejected_unknown));
  w->last_xs = xs;
  /* Readiness (gRPC health "" and /readyz): weights loaded, registered, not draining. */
  k3_app_set_ready(w->srv, "k3pd.v1.Decode", w->mhttp, &w->health, !w->draining && k3_registrar_registered(w->reg));
}

static void on_metrics_tick(uv_timer_t *t) { dc_metrics_refresh(t->data); }

static uint32_t live_requests(void *ud) {
  app_t *a = ud;
  uint32_t n = 0;
  for (dc_req_t *q = a->w.reqs; q; q = q->next) n++;
  return n;
}

static void on_drain(void *ud) {
  app_t *a = ud;
  a->w.draining = true;
  k3_app_set_ready(a->w.srv, "k3pd.v1.Decode", a->w.mhttp, &a->w.health, false);
  k3_registrar_set_draining(a->w.reg, true);
}

static void on_client_closed(void *arg) { (void)arg; }

static void on_registrar_done(void *arg) {
  app_t *a = arg;
  k3_rpc_client_close(a->w.cli, on_client_closed, a);
  a->w.cli = NULL;
}

static void on_server_done(void *arg) {
  app_t *a = arg;
  dc_worker_t *w = &a->w;
  dc_engine_stop(w);
  /* Messages the engine posted before stopping are delivered now, then the inbox closes. */
  k3_inbox_close(&w->outbox, NULL);
  k3_xfer_recv_free(w->recv);
  w->recv = NULL;
  /* The runner's state arena may be UCX memory (host backends): free it while UCX lives. */
  k3_runner_free(w->runner);
  w->runner = NULL;
  dc_pools_free(w);
  k3_xfer_ctx_close(w->xfer);
  k3_registrar_stop(w->reg, true, on_registrar_done, a);
  uv_close((uv_handle_t *)&a->metrics_timer, NULL);
}

/* --local-prefill-max-tokens when not given: from the profile's costs or a start-up probe
 * (localcost.h; docs/design.md "The local-prefill threshold"). Logged with its inputs. */
static int derive_local_max(dc_worker_t *w, dc_costs_t *costs, bool from_profile, double stall_steps,
                            int *local_max, char *err, size_t errlen) {
  int rc = from_profile ? 0
                        : dc_costs_measure(w->runner, w->num_pages, w->page_tokens, w->max_batch, costs, err, errlen);
  if (rc) {
    /* a probe that cannot run (pools too small for it, a device error) does not stop the worker:
     * it serves with the fixed fallback, and says so */
    K3_WARN("local-prefill threshold %d tokens (fallback): the cost probe failed: %s (%s); pass "
            "--cost-profile or --local-prefill-max-tokens", DC_LOCAL_MAX_FALLBACK, err, k3_strerror(rc));
    *local_max = DC_LOCAL_MAX_FALLBACK;
    return 0;
  }
  char why[256];
  int64_t l = dc_local_max_derive(costs, stall_steps, w->max_context, why, sizeof why);
  if (l < 0) {
    snprintf(err, errlen, "%s: %s", from_profile ? "--cost-profile" : "cost probe", why);
    return K3_EINVAL;
  }
  *local_max = (int)l;
  K3_INFO("local-prefill threshold %lld tokens: estimated prefill %.1f ms <= %g decode steps of %d sequences x "
          "%.2f ms (%s; pass %.3f ms + %.4f ms/token + %.4f ms per 1000 token-context, chunk %lld)",
          (long long)l, dc_costs_prefill_ms(costs, l), stall_steps, costs->step_batch, dc_costs_ref_step_ms(costs),
          costs->source,
          costs->pass_fixed_ms + costs->pass_per_seq_ms, costs->pass_per_token_ms, costs->pass_per_kctx_ms,
          (long long)costs->chunk_tokens);
  return 0;
}

static void begin_shutdown(void *ud) {
  app_t *a = ud;
  k3_rpc_server_shutdown(a->w.srv, on_server_done, a);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  static app_t app;
  app_t *a = &app;
  dc_worker_t *w = &a->w;
  k3_load_opts_t mo;
  k3_load_opts_default(&mo);
  const char *listen = "127.0.0.1:0", *router = NULL, *advertise = NULL, *worker_id = NULL, *ucx_tls = NULL;
  const char *log_level = NULL, *metrics_host = NULL, *receive = "auto", *ipc_dir = NULL;
  int max_context = 0, metrics_port = -1, resolve_ms = 5000, local_max = -1;
  const char *cost_profile = NULL;
  double stall_steps = 16;
  const char *prefix_cache = "on", *prefix_resume = "on";
  int64_t cache_bytes = -1;
  int pin_max = 0;
  a->drain_grace_ms = 30000;
  char ipc_default[64];
  snprintf(ipc_default, sizeof ipc_default, "/tmp/k3pd-ipc-%u", (unsigned)getuid());
  ipc_dir = ipc_default;
  k3_app_tls_t to;
  k3_app_tls_init(&to);
  k3_flag_t flags[K3_LOAD_NFLAGS + K3_APP_TLS_NFLAGS + 24];
  size_t nflags = k3_load_flags(&mo, flags);
  nflags += k3_app_tls_flags(&to, flags + nflags);
  k3_flag_t own[] = {
      {"listen", K3_FLAG_STR, &listen, "HOST:PORT", "gRPC listen address (port 0 = ephemeral)", false},
      {"router", K3_FLAG_STR, &router, "LIST", "the routers' cluster ports to register with, comma-separated: "
       "HOST:PORT (one router) or dns:NAME:PORT (every address NAME resolves to, re-resolved every "
       "--router-resolve-ms: a Kubernetes headless Service); the worker serves every router it reaches", true},
      {"router-resolve-ms", K3_FLAG_INT, &resolve_ms, "MS", "how often dns: entries of --router are resolved again",
       false},
      {"advertise", K3_FLAG_STR, &advertise, "HOST:PORT", "address the router dials (default: listen host + port)",
       false},
      {"worker-id", K3_FLAG_STR, &worker_id, "ID", "unique worker id; with TLS a name its certificate "
       "carries (default: from the certificate; development CA: decode-<host>-<pid>; --insecure-cluster: "
       "decode-<advertised address>)", false},
      {"max-context", K3_FLAG_INT, &max_context, "N", "longest prompt + completion (default: the page pool)", false},
      {"drain-grace-ms", K3_FLAG_I64, &a->drain_grace_ms, "MS", "on SIGTERM, how long running sequences may finish",
       false},
      {"ucx-tls", K3_FLAG_STR, &ucx_tls, "LIST", "UCX transports (UCX_TLS), e.g. shm,tcp", false},
      {"xfer-receive", K3_FLAG_STR, &receive, "auto|arena|staged", "where handed-off state lands: arena = straight in "
       "the model's pools (zero copy; on cuda reachable by same-host senders through --ipc-dir and over a UCX with "
       "CUDA), staged = a host area copied to the GPU at admission (cuda only); auto = arena when reachable",
       false},
      {"ipc-dir", K3_FLAG_STR, &ipc_dir, "DIR", "cuda: directory of this worker's socket that hands its state pools "
       "to prefill workers on the same host and GPU (created 0700; share it with them, e.g. an emptyDir; \"none\" "
       "= off) (default /tmp/k3pd-ipc-<uid>)", false},
      {"prefix-cache", K3_FLAG_STR, &prefix_cache, "on|off", "keep finished prompts' state as exact reusable "
       "prefixes (KDA checkpoints at block boundaries + shared MLA pages) and compute cache hits' suffixes here "
       "(default on)", false},
      {"prefix-resume", K3_FLAG_STR, &prefix_resume, "on|off", "a cache hit whose uncached suffix is longer than "
       "--local-prefill-max-tokens sends the cached state to the prefill worker (Export), which then computes only "
       "the suffix; off: such a prompt is computed from token 0 there (default on; needs --prefix-cache on)", false},
      {"prefix-cache-bytes", K3_FLAG_I64, &cache_bytes, "BYTES", "most state memory (pages + slots) held only by "
       "the prefix cache; LRU beyond it (default: half of the page and slot pools)", false},
      {"prefix-cache-pinned-slots", K3_FLAG_INT, &pin_max, "N", "extra KDA slots (on top of --num-slots, which "
       "stays the live-sequence capacity) for checkpoints being taken and hits being copied, which cannot be "
       "evicted meanwhile (default max(4, --num-slots / 4); cached checkpoints also use free sequence slots)", false},
      {"local-prefill-max-tokens", K3_FLAG_INT, &local_max, "N", "longest uncached prompt suffix this worker "
       "computes itself instead of a prefill worker (conditional disaggregation; docs/design.md) (default: derived "
       "from the cost model, --local-prefill-stall-steps; logged at start-up)", false},
      {"local-prefill-stall-steps", K3_FLAG_DOUBLE, &stall_steps, "S", "the derived --local-prefill-max-tokens "
       "is the longest suffix whose estimated prefill time is at most S decode steps of a full batch (--max-batch "
       "sequences): the running streams' next token waits at most that long (default 16)", false},
      {"cost-profile", K3_FLAG_STR, &cost_profile, "FILE", "k3pd-bench --profile JSON (k3pd-profile/1) with this "
       "worker's prefill pass and decode step costs, for the derived --local-prefill-max-tokens (default: a "
       "probe of a few prefills and decode steps at start-up)", false},
      {"log-level", K3_FLAG_STR, &log_level, "LEVEL", "error|warn|info|debug", false},
      {"metrics-port", K3_FLAG_INT, &metrics_port, "N", "HTTP /metrics /healthz /readyz port (0 = ephemeral, -1 = off)",
       false},
      {"metrics-host", K3_FLAG_STR, &metrics_host, "IP", "address the metrics server binds (default all)", false},
  };
  _Static_assert(sizeof own / sizeof own[0] <= 24, "flags[] has room for 24 own flags");
  memcpy(flags + nflags, own, sizeof own);
  nflags += sizeof own / sizeof own[0];
  k3_flags_info_t info = {"k3pd-decode",
                          "Decode worker: reserves KV pages and KDA slots for requests, receives their state from "
                          "prefill workers over UCX, and runs continuous-batching decode steps, streaming tokens "
                          "to the router.",
                          NULL};
  char err[1024];
  int rc = k3_flags_parse(&info, flags, nflags, argc, argv, NULL, err, sizeof err);
  if (!rc && (rc = k3_load_check(&mo, err, sizeof err))) rc = K3_EINVAL;
  if (!rc) rc = k3_app_tls_check(&to, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (!rc) rc = k3_registrar_check(router, "--router", err, sizeof err);
  if (!rc && resolve_ms < 100) {
    snprintf(err, sizeof err, "--router-resolve-ms: must be >= 100, got %d", resolve_ms);
    rc = K3_EINVAL;
  }
  if (rc) {
    fprintf(stderr, "k3pd-decode: %s\n", err);
    return 2;
  }
  if (!(stall_steps >= 0) || stall_steps > 1e6) {
    fprintf(stderr, "k3pd-decode: --local-prefill-stall-steps: must be in [0, 1e6], got %g\n", stall_steps);
    return 2;
  }
  /* a bad profile fails before anything starts */
  dc_costs_t costs = {.chunk_tokens = (mo.prefill_chunk + 63) / 64 * 64, /* the runner rounds it so */
                      .step_batch = mo.max_batch};
  if (cost_profile && dc_costs_load(cost_profile, &costs, err, sizeof err)) {
    fprintf(stderr, "k3pd-decode: --cost-profile: %s\n", err);
    return 2;
  }
  if (k3_app_log_setup("k3pd-decode", log_level)) return 2;
  /* cluster credentials and the worker id first (before the model loads: a bad
   * certificate fails at once); the development CA issues the certificate for the worker id */
  char adv[300], wid[400];
  if (k3_app_tls_worker(&to, "decode", worker_id, &a->tls, wid, sizeof wid, err, sizeof err)) {
    fprintf(stderr, "k3pd-decode: %s\n", err);
    return 2;
  }
  if (strcmp(prefix_cache, "on") && strcmp(prefix_cache, "off")) {
    fprintf(stderr, "k3pd-decode: --prefix-cache: expected on or off, got \"%s\"\n", prefix_cache);
    return 2;
  }
  if (strcmp(prefix_resume, "on") && strcmp(prefix_resume, "off")) {
    fprintf(stderr, "k3pd-decode: --prefix-resume: expected on or off, got \"%s\"\n", prefix_resume);
    return 2;
  }
  if (local_max < -1) {
    fprintf(stderr, "k3pd-decode: --local-prefill-max-tokens: must be >= 0, got %d\n", local_max);
    return 2;
  }
  if (pin_max < 0) {
    fprintf(stderr, "k3pd-decode: --prefix-cache-pinned-slots: must be >= 0\n");
    return 2;
  }
  if (mo.page_tokens < 1 || mo.num_pages < 1 || mo.num_slots < 1 || mo.max_batch < 1) {
    fprintf(stderr, "k3pd-decode: --page-tokens, --num-pages, --num-slots and --max-batch must be >= 1\n");
    return 2;
  }
  uv_loop_t *loop = uv_default_loop();
  w->loop = loop;
  if (k3_metrics_init(&w->mreg) || k3_decode_metrics_register(w->mreg, K3PD_VERSION, &w->m)) {
    fprintf(stderr, "k3pd-decode: cannot set up metrics\n");
    return 1;
  }
  if (k3_app_metrics_http(w->mreg, "k3pd-decode", metrics_host, metrics_port, to.metrics_tls ? a->tls : NULL,
                          &w->mhttp))
    return 1;
  /* UCX first: on host backends the runner's state arena is memory UCX allocates */
  k3_xfer_ctx_opts_t xo = {.tls = ucx_tls};
  rc = k3_xfer_ctx_init(loop, &xo, &w->xfer);
  if (rc) {
    fprintf(stderr, "k3pd-decode: UCX initialisation failed: %s\n", k3_strerror(rc));
    return 1;
  }
  /* The cache's pinned slots come on top of --num-slots (which stays the live-sequence capacity). */
  bool cache_on = !strcmp(prefix_cache, "on");
  if (cache_on) {
    if (!pin_max) pin_max = mo.num_slots / 4 > 4 ? mo.num_slots / 4 : 4;
    mo.num_slots += pin_max;
  }
  if ((rc = dc_pools_plan(w, &mo, receive, ipc_dir, err, sizeof err))) {
    fprintf(stderr, "k3pd-decode: %s\n", err);
    return 2;
  }
  rc = k3_load_model(&mo, &a->weights, &w->runner, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-decode: %s\n", err);
    return 1;
  }
  w->manifest = k3_runner_manifest(w->runner);
  w->fingerprint = k3_runner_fingerprint(w->runner);
  w->page_tokens = mo.page_tokens;
  w->num_pages = mo.num_pages;
  w->num_slots = mo.num_slots;
  w->max_batch = mo.max_batch;
  w->vocab = k3_runner_vocab(w->runner);
  w->max_context = max_context > 0 ? (uint32_t)max_context : (uint32_t)(mo.num_pages * mo.page_tokens);
  rc = dc_pools_setup(w, err, sizeof err);
  if (!rc && cache_on && local_max < 0)
    rc = derive_local_max(w, &costs, cost_profile != NULL, stall_steps, &local_max, err, sizeof err);
  if (!rc) {
    uint64_t pool_bytes = (uint64_t)w->num_pages * w->manifest->mla_bytes_per_page +
                          (uint64_t)w->num_slots * w->manifest->kda_bytes_per_slot;
    rc = dc_cache_init(w, cache_on, cache_bytes >= 0 ? (uint64_t)cache_bytes : pool_bytes / 2,
                       (uint32_t)(local_max < 0 ? 0 : local_max),
                       pin_max, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "k3pd-decode: %s\n", err);
    return 1;
  }
  /* Exports read the runner's pools: host memory, or device memory through the device hooks
   * (arena layouts; a staged receiver has none). */
  w->cache.resume = cache_on && !strcmp(prefix_resume, "on") &&
                    (k3_runner_backend(w->runner)->host_memory || w->hooks);
  if (cache_on && !strcmp(prefix_resume, "on") && !w->cache.resume)
    K3_WARN("--prefix-resume: off on this worker (staged receive: no device services to send cached state)");
  k3_xfer_recv_opts_t ro = {.on_ready = dc_on_xfer_ready, .on_release = dc_on_xfer_release, .ud = w,
                            .dev = w->hooks ? k3_xhooks_dev(w->hooks) : NULL};
  rc = k3_xfer_recv_init(w->xfer, &ro, &w->recv);
  if (!rc) rc = k3_inbox_init(loop, &w->outbox, dc_on_engine_msg, w);
  if (!rc) rc = k3_rpc_server_init(loop, NULL, &w->srv);
  if (!rc) rc = dc_service_register(w);
  int port = 0;
  if (rc) {
    fprintf(stderr, "k3pd-decode: starting the gRPC server on %s: %s\n", listen, k3_strerror(rc));
    return 1;
  }
  if (k3_app_tls_serve(w->srv, &to, a->tls, listen, &port, err, sizeof err)) {
    fprintf(stderr, "k3pd-decode: starting the gRPC server: %s\n", err);
    return 1;
  }
  if (k3_addr_advertise(listen, port, advertise, adv, sizeof adv)) {
    fprintf(stderr, "k3pd-decode: --listen/--advertise: bad address\n");
    return 2;
  }
  if (!wid[0]) snprintf(wid, sizeof wid, "decode-%s", adv); /* --insecure-cluster without --worker-id */
  rc = dc_engine_start(w);
  k3_rpc_client_opts_t co = {.tls = a->tls, .peer_name = to.router_identity};
  if (!rc) rc = k3_rpc_client_init(loop, &co, &w->cli);
  if (rc) {
    fprintf(stderr, "k3pd-decode: start-up failed: %s\n", k3_strerror(rc));
    return 1;
  }
  const uint8_t *ua;
  size_t ual;
  k3_xfer_ctx_address(w->xfer, &ua, &ual);
  k3_registrar_opts_t rg = {.router = router,
                            .resolve_ms = (uint32_t)resolve_ms,
                            .role = K3PD__V1__ROLE__ROLE_DECODE,
                            .worker_id = wid,
                            .grpc_address = adv,
                            .ucx_address = ua,
                            .ucx_address_len = ual,
                            .fingerprint = w->fingerprint,
                            .model_name = k3_load_model_name(&mo),
                            .get_load = dc_fill_load,
                            .ud = w};
  k3pd__v1__worker_capacity__init(&rg.capacity);
  rg.capacity.kv_pages = (uint32_t)w->num_pages;
  rg.capacity.page_tokens = (uint32_t)w->page_tokens;
  rg.capacity.kda_slots = w->cache.req_slots_max; /* the slots the cache may pin are not offered */
  rg.capacity.max_batch = (uint32_t)w->max_batch;
  rg.capacity.max_context_tokens = w->max_context;
  rc = k3_registrar_start(loop, w->cli, &rg, &w->reg);
  if (rc) {
    fprintf(stderr, "k3pd-decode: registrar: %s\n", k3_strerror(rc));
    return 1;
  }
  k3_lifecycle_opts_t lo = {.prog = "k3pd-decode",
                            .grace_ms = a->drain_grace_ms,
                            .on_drain = on_drain,
                            .live_work = live_requests,
                            .on_shutdown = begin_shutdown,
                            .ud = a};
  if (k3_lifecycle_start(loop, &lo, &a->lc)) {
    fprintf(stderr, "k3pd-decode: out of memory\n");
    return 1;
  }
  uv_timer_init(loop, &a->metrics_timer);
  a->metrics_timer.data = w;
  uv_timer_start(&a->metrics_timer, on_metrics_tick, 0, 250);
  /* "" / k3pd.v1.Decode turn SERVING once registered (dc_metrics_refresh); liveness now. */
  w->health = -1;
  k3_rpc_server_set_health(w->srv, "", K3_RPC_HEALTH_NOT_SERVING);
  k3_rpc_server_set_health(w->srv, "liveness", K3_RPC_HEALTH_SERVING);
  K3_INFO("serving on %s (advertised %s) as %s: %d pages x %d tokens, %d slots, batch %d, receive %s", listen, adv,
          wid, w->num_pages, w->page_tokens, w->num_slots, w->max_batch, dc_receive_name(w->recv_mode));
  if (w->cache.on)
    K3_INFO("prefix cache on: %u-token blocks, %.1f MiB budget, suffixes up to %u tokens computed here",
            w->cache.block, (double)w->cache.max_bytes / 1048576.0, w->cache.local_max);
  uv_run(loop, UV_RUN_DEFAULT);
  /* Everything is closed: free what the loop no longer references. */
  while (w->reqs) {
    dc_req_t *q = w->reqs;
    w->reqs = q->next;
    free(q->pages);
    free(q->stop_ids);
    free(q->prompt);
    free(q->hashes);
    free(q);
  }
  dc_cache_free(w);
  dc_pools_close_hooks(w);
  free(w->rpool);
  free(w->roff);
  free(w->rstride);
  free(w->free_pages);
  free(w->free_slots);
  k3_runner_free(w->runner);
  k3_weights_free(a->weights);
  k3_metrics_http_stop(w->mhttp);
  k3_metrics_free(w->mreg);
  k3_rpc_tls_free(a->tls);
  uv_loop_close(loop);
  K3_INFO("stopped");
  return 0;
}
