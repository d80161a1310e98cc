/* k3pd-router: noticing a dead worker at once (see rt.h, rt_watch_worker).
 *
 * Why a health Watch stream: a worker killed with SIGKILL stops heartbeating, but its heartbeat
 * timeout (3 s by default) is an eternity for placement: in the run five requests went
 * to a dead decode worker in the first second. Its TCP connection, however, resets the moment
 * the process dies, and a server stream open on that connection ends with UNAVAILABLE right
 * then, even when no request is running there. grpc.health.v1.Health/Watch of the "liveness"
 * service is served by every k3pd binary (common/rpc/health.c), costs nothing while idle, and
 * ends with UNAVAILABLE too when the worker's server shuts down. The streams of requests in
 * flight (Attach, Prefill) break at the same moment; flow.c moves those requests, this file
 * only fixes the registry so that no new request goes there.
 *
 * Rejected: polling (Check) every few hundred ms (a delay, and load, for no gain); watching the
 * gRPC channel's connectivity state (the C core's watch API sits below k3_rpc, and an idle
 * channel does not notice a dead peer until it is used).
 *
 * A watch names the worker's id and address: it only ever drops that registration (a worker
 * that re-registered under the same id at another address has a new watch). Watches end when
 * the router's client closes (CANCELLED: nothing to do). Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "rt.h"

/* A stream's deadline; it is re-opened when it passes (every wait has a deadline). */
#define WATCH_DEADLINE_MS 60000u

typedef struct rt_watch {
  struct rt_watch *next;
  rt_router_t *rt;
  char id[RT_ID_MAX];
  char addr[RT_ADDR_MAX];
  k3_rpc_ccall_t *call;
  bool replaced; /* a newer watch took over this worker: end quietly */
} rt_watch_t;

static int watch_start(rt_watch_t *w);

static void unlink_watch(rt_router_t *rt, rt_watch_t *w) {
  for (rt_watch_t **pp = &rt->watches; *pp; pp = &(*pp)->next) {
    if (*pp == w) {
      *pp = w->next;
      return;
    }
  }
}

void rt_worker_lost(rt_router_t *rt, const char *worker_id, const char *why) {
  rt_worker_t *wk = rt_registry_find(&rt->reg, worker_id);
  if (!wk) return;
  const char *role = wk->info.role == RT_ROLE_DECODE ? K3PD_ROLE_DECODE : K3PD_ROLE_PREFILL;
  if (wk->state == RT_WORKER_DRAINING) { /* it announced its exit: not a loss */
    K3_INFO("worker %s (%s at %s) left: %s", worker_id, role, wk->info.address, why);
  } else {
    K3_WARN("worker %s (%s at %s) lost: %s; dropped now (no new requests go there)", worker_id, role,
            wk->info.address, why);
    k3_metric_inc(rt->m.workers_lost_total, &role);
  }
  k3_rpc_client_forget(rt->cli, wk->info.address);
  rt_registry_remove(&rt->reg, worker_id);
  rt_metrics_workers(rt);
}

static void on_watch_msg(void *arg, const ProtobufCMessage *msg) {
  (void)arg;
  (void)msg; /* the status itself is the heartbeat's business; only the stream's end matters */
}

static void on_watch_done(void *arg, const k3_rpc_status_t *st) {
  rt_watch_t *w = arg;
  rt_router_t *rt = w->rt;
  w->call = NULL;
  rt_worker_t *wk = w->replaced ? NULL : rt_registry_find(&rt->reg, w->id);
  bool same = wk && strcmp(wk->info.address, w->addr) == 0;
  if (same && st->code == K3_RPC_DEADLINE_EXCEEDED && watch_start(w) == 0) return; /* re-open */
  unlink_watch(rt, w);
  if (same && st->code != K3_RPC_CANCELLED && st->code != K3_RPC_DEADLINE_EXCEEDED) {
    if (st->code == K3_RPC_UNIMPLEMENTED || st->code == K3_RPC_NOT_FOUND) {
      K3_WARN("worker %s does not serve grpc.health.v1.Health/Watch \"liveness\" (%s): only its heartbeat "
              "timeout will notice its death", w->id, k3_rpc_code_name(st->code));
    } else {
      char why[300];
      snprintf(why, sizeof why, "its health watch ended (%s: %s)", k3_rpc_code_name(st->code), st->details);
      rt_worker_lost(rt, w->id, why);
    }
  }
  free(w);
}

static int watch_start(rt_watch_t *w) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = "liveness";
  k3_rpc_call_opts_t o = {.timeout_ms = WATCH_DEADLINE_MS};
  return k3_rpc_stream(w->rt->cli, w->addr, "/grpc.health.v1.Health/Watch", &req.base,
                       &grpc__health__v1__health_check_response__descriptor, &o, on_watch_msg, on_watch_done, w,
                       &w->call);
}

void rt_watch_worker(rt_router_t *rt, const char *worker_id) {
  rt_worker_t *wk = rt_registry_find(&rt->reg, worker_id);
  if (!wk || rt->draining) return;
  for (rt_watch_t *w = rt->watches; w; w = w->next) {
    if (w->replaced || strcmp(w->id, worker_id) != 0) continue;
    if (strcmp(w->addr, wk->info.address) == 0) return; /* already watched */
    w->replaced = true; /* an old process's address */
    if (w->call) k3_rpc_ccall_cancel(w->call);
  }
  rt_watch_t *w = calloc(1, sizeof *w);
  if (!w) return; /* the heartbeat timeout still applies */
  w->rt = rt;
  snprintf(w->id, sizeof w->id, "%s", worker_id);
  snprintf(w->addr, sizeof w->addr, "%s", wk->info.address);
  if (watch_start(w)) {
    free(w);
    return;
  }
  w->next = rt->watches;
  rt->watches = w;
}
