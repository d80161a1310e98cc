/* Process lifecycle shared by the three binaries: log level from a flag, the metrics HTTP
 * server from flags, and the signal → drain → shutdown sequence.
 *
 * Drain (STYLE.md: shutdown → drain → destroy): the first SIGTERM/SIGINT calls on_drain once
 * (the binary stops accepting work and reports NOT_SERVING), then live_work() is polled every
 * 50 ms; when it returns 0 or grace_ms has passed, on_shutdown is called once and the
 * lifecycle's own handles are closed. A second signal exits the process at once with status 1
 * (an operator's "stop now"). Everything runs on the loop thread. */
#ifndef K3PD_LIFECYCLE_H
#define K3PD_LIFECYCLE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "k3pd/metrics.h"
#include "k3pd/rpc.h"

typedef struct {
  const char *prog;                  /* for log lines */
  int64_t grace_ms;                  /* how long work may finish after the first signal */
  void (*on_drain)(void *ud);        /* first signal: stop taking work */
  uint32_t (*live_work)(void *ud);   /* requests/prompts still in flight */
  void (*on_shutdown)(void *ud);     /* drained or grace over: begin the teardown */
  void *ud;
} k3_lifecycle_opts_t;

typedef struct k3_lifecycle k3_lifecycle_t;

/* Installs the signal handlers on loop. The struct is freed after its handles closed (after
 * on_shutdown, or by k3_lifecycle_close). Returns 0 or K3_ENOMEM. */
int k3_lifecycle_start(uv_loop_t *loop, const k3_lifecycle_opts_t *opts, k3_lifecycle_t **out);
/* Starts draining as if a signal arrived (tests, admin paths). */
void k3_lifecycle_drain(k3_lifecycle_t *lc);
/* True once draining started. */
bool k3_lifecycle_draining(const k3_lifecycle_t *lc);
/* Closes the handles without calling on_shutdown (teardown after an early error). */
void k3_lifecycle_close(k3_lifecycle_t *lc);

/* --log-level: sets the component name and the level; returns 0 or K3_EINVAL (message on
 * stderr naming the flag). level NULL keeps K3PD_LOG_LEVEL / the default. */
int k3_app_log_setup(const char *prog, const char *level);

struct k3_rpc_tls;
/* --metrics-port/--metrics-host: port < 0 serves nothing (*out = NULL). Logs the bound port.
 * With tls (--metrics-tls): HTTPS with its certificate, /metrics requiring a client certificate
 * of its CA. Returns 0 or the k3_metrics_http_start error (message on stderr naming the flag). */
int k3_app_metrics_http(k3_metrics_t *reg, const char *prog, const char *host, int port,
                        const struct k3_rpc_tls *tls, k3_metrics_http_t **out);

/* Readiness of a worker: gRPC health "" and `service` (e.g. "k3pd.v1.Decode") plus /readyz (h
 * may be NULL). Only a change is published; *last holds the state last published (-1 = none). */
void k3_app_set_ready(k3_rpc_server_t *srv, const char *service, k3_metrics_http_t *h, int *last, bool ready);

#endif
