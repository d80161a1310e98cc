/* Signal → drain → shutdown for the binaries, and their shared flag set-up; see
 * k3pd/lifecycle.h. */
#include "k3pd/lifecycle.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_tls.h"
#include "k3pd/util.h"

struct k3_lifecycle {
  k3_lifecycle_opts_t o;
  uv_signal_t sigterm, sigint;
  uv_timer_t tick;
  int signals, closing;
  bool draining, shut;
  uint64_t drain_started_ns;
};

static void on_closed(uv_handle_t *h) {
  k3_lifecycle_t *lc = h->data;
  if (++lc->closing == 3) free(lc);
}

void k3_lifecycle_close(k3_lifecycle_t *lc) {
  if (!lc || uv_is_closing((uv_handle_t *)&lc->tick)) return;
  uv_close((uv_handle_t *)&lc->sigterm, on_closed);
  uv_close((uv_handle_t *)&lc->sigint, on_closed);
  uv_close((uv_handle_t *)&lc->tick, on_closed);
}

static void on_tick(uv_timer_t *t) {
  k3_lifecycle_t *lc = t->data;
  if (lc->shut) return;
  uint64_t waited_ms = (k3_now_ns() - lc->drain_started_ns) / 1000000;
  uint32_t live = lc->o.live_work ? lc->o.live_work(lc->o.ud) : 0;
  if (live && (int64_t)waited_ms < lc->o.grace_ms) return;
  if (live)
    K3_WARN("drain grace (%lld ms) over with %u requests in flight: cancelling them", (long long)lc->o.grace_ms, live);
  else
    K3_INFO("drain complete after %llu ms", (unsigned long long)waited_ms);
  lc->shut = true;
  uv_timer_stop(&lc->tick);
  void (*fn)(void *) = lc->o.on_shutdown;
  void *ud = lc->o.ud;
  k3_lifecycle_close(lc);
  if (fn) fn(ud);
}

void k3_lifecycle_drain(k3_lifecycle_t *lc) {
  if (lc->draining) return;
  lc->draining = true;
  lc->drain_started_ns = k3_now_ns();
  if (lc->o.on_drain) lc->o.on_drain(lc->o.ud);
  uv_timer_start(&lc->tick, on_tick, 0, 50);
}

bool k3_lifecycle_draining(const k3_lifecycle_t *lc) { return lc->draining; }

static void on_signal(uv_signal_t *s, int signum) {
  k3_lifecycle_t *lc = s->data;
  if (++lc->signals > 1) {
    K3_WARN("second signal (%d): exiting now", signum);
    _exit(1);
  }
  K3_INFO("signal %d: draining (grace %lld ms)", signum, (long long)lc->o.grace_ms);
  k3_lifecycle_drain(lc);
}

int k3_lifecycle_start(uv_loop_t *loop, const k3_lifecycle_opts_t *opts, k3_lifecycle_t **out) {
  k3_lifecycle_t *lc = calloc(1, sizeof *lc);
  if (!lc) return K3_ENOMEM;
  lc->o = *opts;
  uv_signal_init(loop, &lc->sigterm);
  uv_signal_init(loop, &lc->sigint);
  uv_timer_init(loop, &lc->tick);
  lc->sigterm.data = lc->sigint.data = lc->tick.data = lc;
  uv_signal_start(&lc->sigterm, on_signal, SIGTERM);
  uv_signal_start(&lc->sigint, on_signal, SIGINT);
  *out = lc;
  return 0;
}

int k3_app_log_setup(const char *prog, const char *level) {
  k3_log_set_component(prog);
  if (!level) return 0;
  k3_log_level_t lv;
  if (k3_log_parse_level(level, &lv)) {
    fprintf(stderr, "%s: --log-level: expected error|warn|info|debug, got \"%s\"\n", prog, level);
    return K3_EINVAL;
  }
  k3_log_set_level(lv);
  return 0;
}

int k3_app_metrics_http(k3_metrics_t *reg, const char *prog, const char *host, int port, const k3_rpc_tls_t *tls,
                        k3_metrics_http_t **out) {
  *out = NULL;
  if (port < 0) return 0;
  int rc = tls ? k3_metrics_http_start_tls(reg, host, port, k3_rpc_tls_cert_pem(tls), k3_rpc_tls_key_pem(tls),
                                           k3_rpc_tls_ca_pem(tls), out)
               : k3_metrics_http_start(reg, host, port, out);
  if (rc) {
    fprintf(stderr, "%s: --metrics-port %d: %s\n", prog, port, k3_strerror(rc));
    return rc;
  }
  K3_INFO("metrics on port %d (/metrics, /healthz, /readyz%s)", k3_metrics_http_port(*out),
          tls ? "; HTTPS, /metrics with a client certificate of the cluster CA" : "");
  return 0;
}

void k3_app_set_ready(k3_rpc_server_t *srv, const char *service, k3_metrics_http_t *h, int *last, bool ready) {
  if ((int)ready != *last) {
    *last = ready;
    k3_rpc_health_t st = ready ? K3_RPC_HEALTH_SERVING : K3_RPC_HEALTH_NOT_SERVING;
    k3_rpc_server_set_health(srv, "", st);
    k3_rpc_server_set_health(srv, service, st);
  }
  if (h) k3_metrics_http_set_ready(h, ready);
}
