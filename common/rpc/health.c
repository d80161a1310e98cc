/* Built-in grpc.health.v1.Health service (Check + Watch) for every k3_rpc server.
 * Status per service name ("" = whole server); the binaries flip it through startup
 * (NOT_SERVING until ready), drain and shutdown (k3_rpc_server_shutdown sets everything to
 * NOT_SERVING and ends the Watch streams with UNAVAILABLE so they do not hold up the drain).
 * Not here: liveness policy (what "ready" means is the binary's decision). */
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "rpc_server_internal.h"

typedef struct {
  char *name;  /* owned */
  int status;  /* GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__* */
} health_entry_t;

typedef struct watcher {
  k3_rpc_call_t *call;
  char *service;  /* owned */
  int last_sent;  /* last status written, -1 = none */
  struct watcher *prev, *next;
} watcher_t;

struct rpc_health {
  health_entry_t *e;
  size_t n, cap;
  watcher_t *watchers;
  int shut;
};

#define ST(x) GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__##x

static health_entry_t *find(rpc_health_t *h, const char *name) {
  for (size_t i = 0; i < h->n; i++)
    if (strcmp(h->e[i].name, name) == 0) return &h->e[i];
  return NULL;
}

static int current(rpc_health_t *h, const char *service) {
  health_entry_t *e = find(h, service);
  return e ? e->status : ST(SERVICE_UNKNOWN);
}

static void watcher_unlink(rpc_health_t *h, watcher_t *w) {
  if (w->prev) w->prev->next = w->next; else h->watchers = w->next;
  if (w->next) w->next->prev = w->prev;
  free(w->service);
  free(w);
}

/* Writes the watcher's current status if it changed. On a failed write the stream is dead:
 * the cancel callback (already fired or about to) unlinks it. */
static void watcher_push(rpc_health_t *h, watcher_t *w) {
  int st = current(h, w->service);
  if (st == w->last_sent) return;
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = st;
  if (k3_rpc_call_write(w->call, &r.base) == 0) w->last_sent = st;
}

static void check_handler(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  rpc_health_t *h = user;
  const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
  health_entry_t *e = find(h, r->service);
  if (!e) {
    k3_rpc_call_finishf(call, K3_RPC_NOT_FOUND, "service: unknown service \"%.128s\"", r->service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = e->status;
  k3_rpc_call_reply(call, &resp.base);
}

static void watch_cancelled(k3_rpc_call_t *call, void *arg) {
  watcher_t *w = arg;
  rpc_health_t *h = w->call->srv->health;
  watcher_unlink(h, w);
  k3_rpc_call_finish(call, K3_RPC_CANCELLED, NULL);
}

static void watch_handler(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  rpc_health_t *h = user;
  const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
  if (h->shut) {
    k3_rpc_call_finish(call, K3_RPC_UNAVAILABLE, "server shutting down");
    return;
  }
  watcher_t *w = calloc(1, sizeof *w);
  char *svc = strdup(r->service);
  if (!w || !svc) {
    free(w);
    free(svc);
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "server: out of memory");
    return;
  }
  w->call = call;
  w->service = svc;
  w->last_sent = -1;
  w->next = h->watchers;
  if (h->watchers) h->watchers->prev = w;
  h->watchers = w;
  k3_rpc_call_set_cancel_cb(call, watch_cancelled, w);
  watcher_push(h, w);
}

int rpc_health_register(k3_rpc_server_t *srv) {
  rpc_health_t *h = calloc(1, sizeof *h);
  if (!h) return K3_ENOMEM;
  srv->health = h;
  int rc = k3_rpc_server_add_method(srv, "/grpc.health.v1.Health/Check", K3_RPC_UNARY,
                                    &grpc__health__v1__health_check_request__descriptor,
                                    check_handler, h);
  if (!rc)
    rc = k3_rpc_server_add_method(srv, "/grpc.health.v1.Health/Watch", K3_RPC_SERVER_STREAM,
                                  &grpc__health__v1__health_check_request__descriptor,
                                  watch_handler, h);
  if (!rc) rc = k3_rpc_server_set_health(srv, "", K3_RPC_HEALTH_NOT_SERVING);
  return rc;
}

int k3_rpc_server_set_health(k3_rpc_server_t *srv, const char *service, k3_rpc_health_t st) {
  rpc_health_t *h = srv->health;
  if (!service || (st != K3_RPC_HEALTH_SERVING && st != K3_RPC_HEALTH_NOT_SERVING)) return K3_EINVAL;
  if (h->shut) return K3_ESHUTDOWN;
  health_entry_t *e = find(h, service);
  if (!e) {
    if (h->n == h->cap) {
      size_t cap = h->cap ? h->cap * 2 : 8;
      health_entry_t *ne = realloc(h->e, cap * sizeof *ne);
      if (!ne) return K3_ENOMEM;
      h->e = ne;
      h->cap = cap;
    }
    char *name = strdup(service);
    if (!name) return K3_ENOMEM;
    e = &h->e[h->n++];
    e->name = name;
  }
  e->status = (int)st;
  for (watcher_t *w = h->watchers; w; w = w->next) watcher_push(h, w);
  return 0;
}

void rpc_health_shutdown(k3_rpc_server_t *srv) {
  rpc_health_t *h = srv->health;
  if (!h) return;
  for (size_t i = 0; i < h->n; i++) h->e[i].status = ST(NOT_SERVING);
  h->shut = 1;
  while (h->watchers) {
    watcher_t *w = h->watchers;
    watcher_push(h, w);
    k3_rpc_call_t *call = w->call;
    k3_rpc_call_set_cancel_cb(call, NULL, NULL);
    watcher_unlink(h, w);
    k3_rpc_call_finish(call, K3_RPC_UNAVAILABLE, "server shutting down");
  }
}

void rpc_health_free(k3_rpc_server_t *srv) {
  rpc_health_t *h = srv->health;
  if (!h) return;
  for (size_t i = 0; i < h->n; i++) free(h->e[i].name);
  free(h->e);
  free(h);
  srv->health = NULL;
}
