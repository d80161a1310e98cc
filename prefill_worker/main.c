/* k3pd-prefill entry point: flags and wiring only (ARCHITECTURE.md §1). The logic lives in
 * service.c (Prefill/Abort, transfer sends) and engine.c (batched prompt forward passes).
 *
 * SIGTERM/SIGINT: drain — NOT_SERVING, heartbeat "draining" so the router stops sending work,
 * refuse new prompts, let queued and running ones finish for --drain-grace-ms, then cancel the
 * rest (the router retries them on another prefill worker), deregister, exit 0. A second signal
 * exits at once with status 1. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/apptls.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/lifecycle.h"
#include "k3pd/log.h"
#include "k3pd/netaddr.h"
#include "k3pd/util.h"
#include "k3_load.h"
#include "pf.h"

typedef struct {
  pf_worker_t w;
  k3_weights_t *weights;
  k3_lifecycle_t *lc;
  uv_timer_t metrics_timer, gc_timer;
  int64_t drain_grace_ms;
  k3_rpc_tls_t *tls; /* cluster credentials (NULL with --insecure-cluster) */
} app_t;

void pf_metrics_refresh(pf_worker_t *w) {
  K3pd__V1__WorkerLoad load = K3PD__V1__WORKER_LOAD__INIT;
  pf_fill_load(w, &load);
  k3_gauge_set(k3_metric_default(w->m.queued_prompt_tokens), (double)load.queued_prompt_tokens);
  k3_gauge_set(k3_metric_default(w->m.queued_requests), (double)load.queued_requests);
  k3_gauge_set(k3_metric_default(w->m.running_requests), (double)load.running_seqs);
  k3_app_set_ready(w->srv, "k3pd.v1.Prefill", w->mhttp, &w->health, !w->draining && k3_registrar_registered(w->reg));
}

static void on_metrics_tick(uv_timer_t *t) {
  pf_metrics_refresh(t->data);
  pf_resume_expire(t->data);
}

/* Peer pools whose decode worker went away are unmapped (their arenas would stay allocated on
 * the GPU as long as this process maps them). */
static void on_gc_tick(uv_timer_t *t) { k3_xhooks_gc(t->data); }

static uint32_t live_jobs(void *ud) {
  app_t *a = ud;
  uint32_t n = 0;
  for (pf_job_t *j = a->w.jobs; j; j = j->next) n++;
  return n;
}

static void on_drain(void *ud) {
  app_t *a = ud;
  a->w.draining = true;
  k3_app_set_ready(a->w.srv, "k3pd.v1.Prefill", a->w.mhttp, &a->w.health, false);
  k3_registrar_set_draining(a->w.reg, true);
}

static void on_registrar_done(void *arg) {
  app_t *a = arg;
  k3_rpc_client_close(a->w.cli, NULL, NULL);
  a->w.cli = NULL;
}

static void on_server_done(void *arg) {
  app_t *a = arg;
  pf_worker_t *w = &a->w;
  pf_engine_stop(w);
  k3_inbox_close(&w->outbox, NULL);
  k3_xfer_recv_free(w->recv); /* cancels prepared resumes' receive reservations */
  w->recv = NULL;
  /* The runner's state arena may be UCX memory (host backends): free it while UCX lives (as the
   * decode worker does). */
  k3_runner_free(w->runner);
  w->runner = NULL;
  if (w->sp_planned) k3_spools_free(&w->sp);
  w->sp_planned = false;
  k3_xfer_ctx_close(w->xfer); /* fails sends still running; their callbacks free the jobs */
  k3_registrar_stop(w->reg, true, on_registrar_done, a);
  uv_close((uv_handle_t *)&a->metrics_timer, NULL);
  if (w->hooks) uv_close((uv_handle_t *)&a->gc_timer, NULL);
}

static void begin_shutdown(void *ud) {
  app_t *a = ud;
  k3_rpc_server_shutdown(a->w.srv, on_server_done, a);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  static app_t app;
  app_t *a = &app;
  pf_worker_t *w = &a->w;
  k3_load_opts_t mo;
  k3_load_opts_default(&mo);
  mo.num_slots = 8;
  const char *listen = "127.0.0.1:0", *router = NULL, *advertise = NULL, *worker_id = NULL, *ucx_tls = NULL;
  const char *log_level = NULL, *metrics_host = NULL, *xfer_path = "auto", *ipc_dir = NULL;
  char ipc_default[64];
  snprintf(ipc_default, sizeof ipc_default, "/tmp/k3pd-ipc-%u", (unsigned)getuid());
  ipc_dir = ipc_default;
  int metrics_port = -1, resolve_ms = 5000;
  int64_t max_batch_tokens = 4096, send_deadline_ms = 120000;
  a->drain_grace_ms = 30000;
  k3_app_tls_t to;
  k3_app_tls_init(&to);
  k3_flag_t flags[K3_LOAD_NFLAGS + K3_APP_TLS_NFLAGS + 16];
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
       "carries (default: from the certificate; development CA: prefill-<host>-<pid>; --insecure-cluster: "
       "prefill-<advertised address>)", false},
      {"max-batch-tokens", K3_FLAG_I64, &max_batch_tokens, "N", "prompt tokens batched into one forward pass", false},
      {"send-deadline-ms", K3_FLAG_I64, &send_deadline_ms, "MS", "longest a prompt's forward pass + state transfer "
       "may take (the transfer starts with the pass: layers stream as they finish); also clamped to the lease", false},
      {"drain-grace-ms", K3_FLAG_I64, &a->drain_grace_ms, "MS", "on SIGTERM, how long queued prompts may finish",
       false},
      {"ucx-tls", K3_FLAG_STR, &ucx_tls, "LIST", "UCX transports (UCX_TLS), e.g. shm,tcp", false},
      {"xfer-path", K3_FLAG_STR, &xfer_path, "PATH", "how state moves to decode workers: auto (per send: cuda-ipc "
       "to a same-host GPU decode worker, else ucx-cuda, else staged; host on CPU backends), or force one of host, "
       "staged, cuda-ipc, ucx-cuda (a send that cannot take it fails)", false},
      {"ipc-dir", K3_FLAG_STR, &ipc_dir, "DIR", "cuda: directory of this worker's socket that hands its state "
       "pools to a same-host decode worker sending a cached prefix (long-suffix resume; created 0700; \"none\" = "
       "off) (default /tmp/k3pd-ipc-<uid>)", false},
      {"log-level", K3_FLAG_STR, &log_level, "LEVEL", "error|warn|info|debug", false},
      {"metrics-port", K3_FLAG_INT, &metrics_port, "N", "HTTP /metrics /healthz /readyz port (0 = ephemeral, -1 = off)",
       false},
      {"metrics-host", K3_FLAG_STR, &metrics_host, "IP", "address the metrics server binds (default all)", false},
  };
  memcpy(flags + nflags, own, sizeof own);
  nflags += sizeof own / sizeof own[0];
  k3_flags_info_t info = {"k3pd-prefill",
                          "Prefill worker: runs prompts through the model in batches and pushes every layer's "
                          "final state (MLA latent pages, KDA recurrent + conv state) into the decode worker's "
                          "reserved memory over UCX as soon as the layer finishes, then sends DONE with the first "
                          "sampled token.",
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
    fprintf(stderr, "k3pd-prefill: %s\n", err);
    return 2;
  }
  if (k3_app_log_setup("k3pd-prefill", log_level)) return 2;
  /* cluster credentials and the worker id first (before the model loads: a bad
   * certificate fails at once); the development CA issues the certificate for the worker id */
  char adv[300], wid[400];
  if (k3_app_tls_worker(&to, "prefill", worker_id, &a->tls, wid, sizeof wid, err, sizeof err)) {
    fprintf(stderr, "k3pd-prefill: %s\n", err);
    return 2;
  }
  if (max_batch_tokens < 1 || send_deadline_ms < 1 || mo.max_batch < 1) {
    fprintf(stderr, "k3pd-prefill: --max-batch, --max-batch-tokens and --send-deadline-ms must be >= 1\n");
    return 2;
  }
  uv_loop_t *loop = uv_default_loop();
  w->loop = loop;
  k3_xfer_ctx_opts_t xo = {.tls = ucx_tls};
  rc = k3_xfer_ctx_init(loop, &xo, &w->xfer);
  if (rc) {
    fprintf(stderr, "k3pd-prefill: UCX initialisation failed: %s\n", k3_strerror(rc));
    return 1;
  }
  /* The runner's state arena as a transfer pool, so that a decode worker can send a cached
   * prefix straight into it (long-suffix resume); without it PrepareResume is refused. */
  rc = k3_spools_plan(&w->sp, w->xfer, &mo, ipc_dir, w->recv_why, sizeof w->recv_why);
  w->sp_planned = rc == 0;
  rc = k3_load_model(&mo, &a->weights, &w->runner, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-prefill: %s\n", err);
    return 1;
  }
  w->manifest = k3_runner_manifest(w->runner);
  w->fingerprint = k3_runner_fingerprint(w->runner);
  w->vocab = k3_runner_vocab(w->runner);
  w->max_batch = mo.max_batch;
  w->max_batch_tokens = max_batch_tokens;
  w->send_deadline_ms = (uint32_t)send_deadline_ms;
  int pth = k3_xfer_path_parse(xfer_path);
  if (pth < 0) {
    fprintf(stderr, "k3pd-prefill: --xfer-path: expected auto, host, staged, cuda-ipc or ucx-cuda, got \"%s\"\n",
            xfer_path);
    return 2;
  }
  w->path = (k3_xfer_path_t)pth;
  if (k3_metrics_init(&w->mreg) || k3_prefill_metrics_register(w->mreg, K3PD_VERSION, &w->m)) {
    fprintf(stderr, "k3pd-prefill: cannot set up metrics\n");
    return 1;
  }
  if (k3_app_metrics_http(w->mreg, "k3pd-prefill", metrics_host, metrics_port, to.metrics_tls ? a->tls : NULL,
                          &w->mhttp))
    return 1;
  if (!k3_runner_backend(w->runner)->host_memory) { /* device pools: device jobs move them */
    rc = k3_xhooks_open(k3_runner_backend(w->runner), &w->hooks);
    if (rc) {
      fprintf(stderr, "k3pd-prefill: device transfer services on the GPU: %s\n", k3_strerror(rc));
      return 1;
    }
    uv_timer_init(loop, &a->gc_timer);
    a->gc_timer.data = w->hooks;
    uv_timer_start(&a->gc_timer, on_gc_tick, 5000, 5000);
  }
  if (w->sp_planned && (rc = k3_spools_setup(&w->sp, w->runner, "prefill", w->recv_why, sizeof w->recv_why))) {
    fprintf(stderr, "k3pd-prefill: %s\n", w->recv_why);
    return 1;
  }
  if (w->sp_planned) {
    k3_xfer_recv_opts_t ro = {.on_ready = pf_on_xfer_ready, .on_release = pf_on_xfer_release, .ud = w,
                              .dev = w->hooks ? k3_xhooks_dev(w->hooks) : NULL};
    if (getenv("K3PD_TEST_CORRUPT_RESUME")) ro.test_before_verify = pf_test_corrupt;
    rc = k3_xfer_recv_init(w->xfer, &ro, &w->recv);
    if (rc) {
      fprintf(stderr, "k3pd-prefill: transfer receiver: %s\n", k3_strerror(rc));
      return 1;
    }
  } else {
    K3_INFO("long-suffix resumes off on this worker: %s", w->recv_why);
  }
  rc = k3_inbox_init(loop, &w->outbox, pf_on_engine_msg, w);
  if (!rc) rc = k3_rpc_server_init(loop, NULL, &w->srv);
  if (!rc) rc = pf_service_register(w);
  int port = 0;
  if (rc) {
    fprintf(stderr, "k3pd-prefill: starting the gRPC server on %s: %s\n", listen, k3_strerror(rc));
    return 1;
  }
  if (k3_app_tls_serve(w->srv, &to, a->tls, listen, &port, err, sizeof err)) {
    fprintf(stderr, "k3pd-prefill: starting the gRPC server: %s\n", err);
    return 1;
  }
  if (k3_addr_advertise(listen, port, advertise, adv, sizeof adv)) {
    fprintf(stderr, "k3pd-prefill: --listen/--advertise: bad address\n");
    return 2;
  }
  if (!wid[0]) snprintf(wid, sizeof wid, "prefill-%s", adv); /* --insecure-cluster without --worker-id */
  rc = pf_engine_start(w);
  k3_rpc_client_opts_t co = {.tls = a->tls, .peer_name = to.router_identity};
  if (!rc) rc = k3_rpc_client_init(loop, &co, &w->cli);
  if (rc) {
    fprintf(stderr, "k3pd-prefill: start-up failed: %s\n", k3_strerror(rc));
    return 1;
  }
  k3_registrar_opts_t rg = {.router = router,
                            .resolve_ms = (uint32_t)resolve_ms,
                            .role = K3PD__V1__ROLE__ROLE_PREFILL,
                            .worker_id = wid,
                            .grpc_address = adv,
                            .fingerprint = w->fingerprint,
                            .model_name = k3_load_model_name(&mo),
                            .get_load = pf_fill_load,
                            .ud = w};
  k3pd__v1__worker_capacity__init(&rg.capacity);
  rg.capacity.kv_pages = (uint32_t)mo.num_pages;
  rg.capacity.page_tokens = (uint32_t)mo.page_tokens;
  rg.capacity.kda_slots = (uint32_t)mo.num_slots;
  rg.capacity.max_batch = (uint32_t)mo.max_batch;
  rg.capacity.max_context_tokens = (uint32_t)(mo.num_pages * mo.page_tokens);
  rc = k3_registrar_start(loop, w->cli, &rg, &w->reg);
  if (rc) {
    fprintf(stderr, "k3pd-prefill: registrar: %s\n", k3_strerror(rc));
    return 1;
  }
  k3_lifecycle_opts_t lo = {.prog = "k3pd-prefill",
                            .grace_ms = a->drain_grace_ms,
                            .on_drain = on_drain,
                            .live_work = live_jobs,
                            .on_shutdown = begin_shutdown,
                            .ud = a};
  if (k3_lifecycle_start(loop, &lo, &a->lc)) {
    fprintf(stderr, "k3pd-prefill: out of memory\n");
    return 1;
  }
  uv_timer_init(loop, &a->metrics_timer);
  a->metrics_timer.data = w;
  w->health = -1;
  uv_timer_start(&a->metrics_timer, on_metrics_tick, 0, 250);
  /* "" / k3pd.v1.Prefill turn SERVING once registered (pf_metrics_refresh); liveness now. */
  k3_rpc_server_set_health(w->srv, "", K3_RPC_HEALTH_NOT_SERVING);
  k3_rpc_server_set_health(w->srv, "liveness", K3_RPC_HEALTH_SERVING);
  k3_prefill_metrics_set_path(&w->m, K3PD_PATH_HOST);
  K3_INFO("serving on %s (advertised %s) as %s: batch %d seqs / %lld tokens", listen, adv, wid, w->max_batch,
          (long long)w->max_batch_tokens);
  uv_run(loop, UV_RUN_DEFAULT);
  while (w->jobs) {
    pf_job_t *j = w->jobs;
    w->jobs = j->next;
    free(j->tokens);
    k3_xfer_desc_free(j->desc);
    free(j->srcs);
    free(j->src_idx);
    free(j);
  }
  k3_xhooks_close(w->hooks);
  k3_runner_free(w->runner);
  k3_weights_free(a->weights);
  k3_metrics_http_stop(w->mhttp);
  k3_metrics_free(w->mreg);
  k3_rpc_tls_free(a->tls);
  uv_loop_close(loop);
  K3_INFO("stopped");
  return 0;
}
