/* The router's k3pd.v1.Cluster service: workers register, heartbeat their load and deregister;
 * a timer drops workers that stop heartbeating. The placement policy lives in registry.c.
 *
 * Served only on the cluster port (rt->csrv, mutual TLS: main.c), never on the public one. The
 * rules that make a registration belong to one worker (docs/protocol.md "Cluster", threat model
 * in docs/operations.md "Security"):
 *  - identity: the client certificate must cover the worker_id (RegisterWorker, Heartbeat and
 *    DeregisterWorker alike; PERMISSION_DENIED otherwise), and with TLS a worker_id is a valid
 *    certificate name, because the router dials the worker expecting exactly that name;
 *  - epochs: RegisterWorker hands out a random 64-bit epoch; Heartbeat and DeregisterWorker
 *    must carry it (a Heartbeat with another one is told to re-register, a Deregister gets
 *    FAILED_PRECONDITION); an id that is registered and alive is only replaced by a caller
 *    carrying that epoch (replaces_epoch), anyone else gets ALREADY_EXISTS until the holder
 *    deregisters or misses heartbeats;
 *  - model: fingerprint 0 is refused (validation), and every worker must have the cluster's
 *    fingerprint: --model-fingerprint, or else the first worker's (kept while any worker is
 *    registered), FAILED_PRECONDITION otherwise;
 *  - capacity: claimed pools are bounded (k3_rpc_validate_register_request) and the context a
 *    decode worker claims must fit its pool; one grpc_address belongs to one worker id.
 * With --insecure-cluster (no TLS) the identity rule cannot be checked; the epoch rules stay. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_tls.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/cluster.pb-c.h"
#include "rt.h"

static const char *role_name(rt_role_t r) { return r == RT_ROLE_DECODE ? "decode" : "prefill"; }

void rt_metrics_workers(rt_router_t *rt) {
  const char *pre = K3PD_ROLE_PREFILL, *dec = K3PD_ROLE_DECODE;
  k3_metric_set(rt->m.registered_workers, &pre, (double)rt_registry_count(&rt->reg, RT_ROLE_PREFILL, false));
  k3_metric_set(rt->m.registered_workers, &dec, (double)rt_registry_count(&rt->reg, RT_ROLE_DECODE, false));
}

/* Counts a refused Cluster call (k3pd_router_cluster_refusals_total{reason}) and answers it. */
static void refuse(rt_router_t *rt, k3_rpc_call_t *call, const char *reason, k3_rpc_code_t code, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));
static void refuse(rt_router_t *rt, k3_rpc_call_t *call, const char *reason, k3_rpc_code_t code, const char *fmt,
                   ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (rt->m.cluster_refusals_total) k3_metric_inc(rt->m.cluster_refusals_total, &reason);
  K3_WARN("cluster: %s refused (%s): %s", k3_rpc_call_method(call), reason, msg);
  k3_rpc_call_finish(call, code, msg);
}

/* The identity rule: with TLS, the caller's certificate must cover worker_id. Returns 0, or 1
 * after answering PERMISSION_DENIED. */
static int check_identity(rt_router_t *rt, k3_rpc_call_t *call, const char *worker_id) {
  if (!rt->tls) return 0; /* --insecure-cluster */
  if (k3_rpc_call_peer_covers(call, worker_id)) return 0;
  const char *const *names;
  size_t n = k3_rpc_call_peer_names(call, &names);
  refuse(rt, call, K3PD_REFUSAL_IDENTITY, K3_RPC_PERMISSION_DENIED,
         "worker_id: \"%.128s\" is not covered by the caller's certificate (%.128s%s)", worker_id,
         n ? names[0] : "no certificate", n > 1 ? ", ..." : "");
  return 1;
}

static uint64_t new_epoch(uint64_t old) {
  uint64_t e = 0;
  while (e == 0 || e == old) {
    if (getrandom(&e, sizeof e, 0) != (ssize_t)sizeof e) e = k3_hash64(&e, sizeof e, k3_now_ns()); /* never 0 twice */
  }
  return e;
}

static void fill_load(rt_worker_info_t *in, const K3pd__V1__WorkerLoad *l) {
  if (!l) return;
  in->kv_pages_used = l->used_kv_pages;
  in->kda_slots_used = (int32_t)l->used_kda_slots;
  in->running = (int32_t)l->running_seqs;
  in->queued_prompt_tokens = (int64_t)l->queued_prompt_tokens;
}

/* The decode prefix cache summary of a load report (empty when absent: no cache there). */
static void set_cache(rt_worker_t *w, const K3pd__V1__WorkerLoad *l) {
  if (!l || !l->cache_block_tokens) {
    rt_worker_set_cache(w, NULL, 0, 0);
    return;
  }
  rt_worker_set_cache(w, l->cached_prefix_hashes, l->n_cached_prefix_hashes, l->cache_block_tokens);
}

static void on_register(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__RegisterRequest *rq = (const K3pd__V1__RegisterRequest *)msg;
  char err[512];
  if (k3_rpc_validate_register_request(rq, err, sizeof err)) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_INVALID_ARGUMENT, "%s", err);
    return;
  }
  if (strlen(rq->worker_id) >= RT_ID_MAX || strlen(rq->grpc_address) >= RT_ADDR_MAX) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_INVALID_ARGUMENT, "%s: too long",
           strlen(rq->worker_id) >= RT_ID_MAX ? "worker_id" : "grpc_address");
    return;
  }
  if (rt->tls && !k3_rpc_tls_id_valid(rq->worker_id)) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_INVALID_ARGUMENT,
           "worker_id: \"%.128s\" is not a certificate name (letters, digits, '.', '-', '_'; the router dials the "
           "worker expecting its certificate to carry this name)", rq->worker_id);
    return;
  }
  if (check_identity(rt, call, rq->worker_id)) return;
  if (rt->fingerprint && rq->model_fingerprint != rt->fingerprint) {
    refuse(rt, call, K3PD_REFUSAL_MODEL, K3_RPC_FAILED_PRECONDITION,
           "model_fingerprint: %016" PRIx64 " differs from this cluster's %016" PRIx64 " (%s%s%s): every worker of "
           "a cluster must load the same model with the same --precision and --page-tokens",
           rq->model_fingerprint, rt->fingerprint, rt->fingerprint_fixed ? "--model-fingerprint" : "set by worker ",
           rt->fingerprint_fixed ? "" : rt->fingerprint_by, rt->fingerprint_fixed ? "" : " while any worker is registered");
    return;
  }
  rt_worker_t *w = rt_registry_find(&rt->reg, rq->worker_id);
  int64_t now = k3_wall_ms();
  if (w && !(rq->replaces_epoch && rq->replaces_epoch == w->reg_epoch)) {
    /* A live registration belongs to its holder: only the holder (same identity, checked
     * above, and its epoch) may replace it. A restarted worker waits for the old entry to expire. */
    refuse(rt, call, K3PD_REFUSAL_EPOCH, K3_RPC_ALREADY_EXISTS,
           "worker_id: \"%.128s\" is registered and alive (last heartbeat %" PRId64 " ms ago); a replacement must "
           "carry its registration epoch in replaces_epoch, or wait until it deregisters or misses heartbeats for "
           "%u ms", rq->worker_id, now - w->last_seen_ms, rt->heartbeat_timeout_ms);
    return;
  }
  for (size_t i = 0; i < rt->reg.n; i++) {
    const rt_worker_t *o = &rt->reg.workers[i];
    if (strcmp(o->info.address, rq->grpc_address) == 0 && strcmp(o->info.id, rq->worker_id) != 0) {
      refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_ALREADY_EXISTS,
             "grpc_address: %.200s is the address of registered worker \"%.128s\"", rq->grpc_address, o->info.id);
      return;
    }
  }
  rt_worker_info_t in;
  memset(&in, 0, sizeof in);
  snprintf(in.id, sizeof in.id, "%s", rq->worker_id);
  snprintf(in.address, sizeof in.address, "%s", rq->grpc_address);
  in.role = rq->role == K3PD__V1__ROLE__ROLE_DECODE ? RT_ROLE_DECODE : RT_ROLE_PREFILL;
  in.fingerprint = rq->model_fingerprint;
  in.kv_pages_total = rq->capacity->kv_pages;
  in.page_tokens = (int32_t)rq->capacity->page_tokens;
  in.kda_slots_total = (int32_t)rq->capacity->kda_slots;
  in.max_batch = (int32_t)rq->capacity->max_batch;
  in.max_context = rq->capacity->max_context_tokens;
  fill_load(&in, rq->load);
  bool is_new = false;
  char old_addr[RT_ADDR_MAX] = "";
  uint64_t old_epoch = w ? w->reg_epoch : 0;
  if (w) snprintf(old_addr, sizeof old_addr, "%s", w->info.address);
  int rc = rt_registry_upsert(&rt->reg, &in, now, &is_new, err, sizeof err);
  if (rc) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, rc == K3_ENOMEM ? K3_RPC_RESOURCE_EXHAUSTED : K3_RPC_INVALID_ARGUMENT,
           "%s", err);
    return;
  }
  w = rt_registry_find(&rt->reg, in.id);
  w->reg_epoch = new_epoch(old_epoch);
  set_cache(w, rq->load);
  const char *const *names;
  size_t nn = k3_rpc_call_peer_names(call, &names);
  snprintf(w->identity, sizeof w->identity, "%s", nn ? names[0] : "");
  if (!rt->fingerprint) {
    rt->fingerprint = in.fingerprint;
    snprintf(rt->fingerprint_by, sizeof rt->fingerprint_by, "%s", in.id);
    K3_INFO("cluster model fingerprint %016" PRIx64 " (from worker %s; kept while any worker is registered)",
            rt->fingerprint, in.id);
  }
  /* The channel to this address expects the name of whoever had it before: start afresh. */
  k3_rpc_client_forget(rt->cli, in.address);
  if (old_addr[0] && strcmp(old_addr, in.address) != 0) k3_rpc_client_forget(rt->cli, old_addr);
  K3pd__V1__RegisterResponse r = K3PD__V1__REGISTER_RESPONSE__INIT;
  r.registration_epoch = w->reg_epoch;
  r.heartbeat_interval_ms = rt->heartbeat_ms;
  r.heartbeat_timeout_ms = rt->heartbeat_timeout_ms;
  r.router_id = rt->instance;
  K3_INFO("worker %s registered: %s at %s, fingerprint %016llx, identity %s%s", in.id, role_name(in.role), in.address,
          (unsigned long long)in.fingerprint, w->identity[0] ? w->identity : "(no TLS)",
          old_epoch ? " (replaced its own registration)" : "");
  k3_rpc_call_reply(call, &r.base);
  rt_metrics_workers(rt);
  rt_watch_worker(rt, in.id); /* notices its death at once (watch.c) */
}

static void on_heartbeat(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__HeartbeatRequest *rq = (const K3pd__V1__HeartbeatRequest *)msg;
  char err[256];
  if (k3_rpc_validate_heartbeat_request(rq, err, sizeof err)) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_INVALID_ARGUMENT, "%s", err);
    return;
  }
  if (check_identity(rt, call, rq->worker_id)) return;
  K3pd__V1__HeartbeatResponse r = K3PD__V1__HEARTBEAT_RESPONSE__INIT;
  r.heartbeat_interval_ms = rt->heartbeat_ms;
  rt_worker_t *w = rt_registry_find(&rt->reg, rq->worker_id);
  if (!w || rq->registration_epoch != w->reg_epoch) {
    /* Unknown here (the router restarted or dropped it), or a registration that is not the
     * live one (a stale process): register again. Nothing about the live entry changes. */
    r.reregister = true;
    k3_rpc_call_reply(call, &r.base);
    return;
  }
  rt_worker_info_t in = w->info;
  fill_load(&in, rq->load);
  if (rq->draining && !in.draining) K3_INFO("worker %s is draining: no new requests go there", in.id);
  in.draining = rq->draining;
  bool is_new;
  if (rt_registry_upsert(&rt->reg, &in, k3_wall_ms(), &is_new, err, sizeof err)) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_INVALID_ARGUMENT, "%s", err);
    return;
  }
  w = rt_registry_find(&rt->reg, in.id);
  if (w) set_cache(w, rq->load);
  k3_rpc_call_reply(call, &r.base);
}

/* A worker left: its channel goes, and the model pin with the last worker (unless fixed). */
static void drop_worker(rt_router_t *rt, const char *id, const char *address) {
  k3_rpc_client_forget(rt->cli, address);
  rt_registry_remove(&rt->reg, id);
  if (rt->reg.n == 0 && !rt->fingerprint_fixed && rt->fingerprint) {
    K3_INFO("no worker registered: the cluster model fingerprint %016" PRIx64 " is released", rt->fingerprint);
    rt->fingerprint = 0;
    rt->fingerprint_by[0] = 0;
  }
}

static void on_deregister(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__DeregisterRequest *rq = (const K3pd__V1__DeregisterRequest *)msg;
  char err[256];
  if (k3_rpc_validate_deregister_request(rq, err, sizeof err)) {
    refuse(rt, call, K3PD_REFUSAL_INVALID, K3_RPC_INVALID_ARGUMENT, "%s", err);
    return;
  }
  if (check_identity(rt, call, rq->worker_id)) return;
  K3pd__V1__DeregisterResponse r = K3PD__V1__DEREGISTER_RESPONSE__INIT;
  rt_worker_t *w = rt_registry_find(&rt->reg, rq->worker_id);
  if (w && rq->registration_epoch != w->reg_epoch) {
    refuse(rt, call, K3PD_REFUSAL_EPOCH, K3_RPC_FAILED_PRECONDITION,
           "registration_epoch: %" PRIu64 " is not the live registration of \"%.128s\"", rq->registration_epoch,
           rq->worker_id);
    return;
  }
  if (w) {
    char addr[RT_ADDR_MAX];
    snprintf(addr, sizeof addr, "%s", w->info.address);
    K3_INFO("worker %s deregistered (%.200s)", rq->worker_id, rq->reason[0] ? rq->reason : "no reason");
    drop_worker(rt, rq->worker_id, addr);
    r.found = true;
    rt_metrics_workers(rt);
  }
  k3_rpc_call_reply(call, &r.base);
}

static void on_expiry(uv_timer_t *t) {
  rt_router_t *rt = t->data;
  int64_t now = k3_wall_ms();
  for (size_t i = 0; i < rt->reg.n;) {
    rt_worker_t *w = &rt->reg.workers[i];
    if (now - w->last_seen_ms > (int64_t)rt->heartbeat_timeout_ms) {
      K3_WARN("worker %s (%s) missed heartbeats for %lld ms: dropped", w->info.id, role_name(w->info.role),
              (long long)(now - w->last_seen_ms));
      char id[RT_ID_MAX], addr[RT_ADDR_MAX];
      snprintf(id, sizeof id, "%s", w->info.id);
      snprintf(addr, sizeof addr, "%s", w->info.address);
      drop_worker(rt, id, addr);
    } else {
      i++;
    }
  }
  rt_metrics_workers(rt);
}

void rt_expiry_start(rt_router_t *rt) {
  uv_timer_init(rt->loop, &rt->expiry_timer);
  rt->expiry_timer.data = rt;
  uv_timer_start(&rt->expiry_timer, on_expiry, rt->heartbeat_ms, rt->heartbeat_ms);
}

const char *rt_worker_name_for(void *ud, const char *address) {
  rt_router_t *rt = ud;
  for (size_t i = 0; i < rt->reg.n; i++)
    if (strcmp(rt->reg.workers[i].info.address, address) == 0) return rt->reg.workers[i].info.id;
  return NULL;
}

int rt_cluster_register(rt_router_t *rt) {
  int rc = k3_rpc_server_add_method(rt->csrv, "/k3pd.v1.Cluster/RegisterWorker", K3_RPC_UNARY,
                                    &k3pd__v1__register_request__descriptor, on_register, rt);
  if (!rc)
    rc = k3_rpc_server_add_method(rt->csrv, "/k3pd.v1.Cluster/Heartbeat", K3_RPC_UNARY,
                                  &k3pd__v1__heartbeat_request__descriptor, on_heartbeat, rt);
  if (!rc)
    rc = k3_rpc_server_add_method(rt->csrv, "/k3pd.v1.Cluster/DeregisterWorker", K3_RPC_UNARY,
                                  &k3pd__v1__deregister_request__descriptor, on_deregister, rt);
  return rc;
}
