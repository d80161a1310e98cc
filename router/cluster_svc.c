/* The router's k3pd.v1.Cluster service: workers register, heartbeat their load and deregister;
 * a timer drops workers that stop heartbeating. The policy lives in registry.c. */
#include <stdio.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "k3pd/v1/cluster.pb-c.h"
#include "rt.h"

static const char *role_name(rt_role_t r) { return r == RT_ROLE_DECODE ? "decode" : "prefill"; }

void rt_metrics_workers(rt_router_t *rt) {
  const char *pre = K3PD_ROLE_PREFILL, *dec = K3PD_ROLE_DECODE;
  k3_metric_set(rt->m.registered_workers, &pre, (double)rt_registry_count(&rt->reg, RT_ROLE_PREFILL, false));
  k3_metric_set(rt->m.registered_workers, &dec, (double)rt_registry_count(&rt->reg, RT_ROLE_DECODE, false));
}

static void fill_load(rt_worker_info_t *in, const K3pd__V1__WorkerLoad *l) {
  if (!l) return;
  in->kv_pages_used = l->used_kv_pages;
  in->kda_slots_used = (int32_t)l->used_kda_slots;
  in->running = (int32_t)l->running_seqs;
  in->queued_prompt_tokens = (int64_t)l->queued_prompt_tokens;
}

static void on_register(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__RegisterRequest *rq = (const K3pd__V1__RegisterRequest *)msg;
  rt_worker_info_t in;
  memset(&in, 0, sizeof in);
  if (rq->role != K3PD__V1__ROLE__ROLE_PREFILL && rq->role != K3PD__V1__ROLE__ROLE_DECODE) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "role: must be ROLE_PREFILL or ROLE_DECODE");
    return;
  }
  if (rq->protocol_version != 1) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION, "protocol_version: %u not supported (router speaks 1)",
                        rq->protocol_version);
    return;
  }
  if (rq->role == K3PD__V1__ROLE__ROLE_DECODE && rq->ucx_worker_address.len == 0) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "ucx_worker_address: required for decode workers");
    return;
  }
  if (strlen(rq->worker_id ? rq->worker_id : "") >= RT_ID_MAX || strlen(rq->grpc_address ? rq->grpc_address : "") >= RT_ADDR_MAX) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "worker_id/grpc_address: too long");
    return;
  }
  snprintf(in.id, sizeof in.id, "%s", rq->worker_id ? rq->worker_id : "");
  snprintf(in.address, sizeof in.address, "%s", rq->grpc_address ? rq->grpc_address : "");
  in.role = rq->role == K3PD__V1__ROLE__ROLE_DECODE ? RT_ROLE_DECODE : RT_ROLE_PREFILL;
  in.fingerprint = rq->model_fingerprint;
  if (rq->capacity) {
    in.kv_pages_total = rq->capacity->kv_pages;
    in.page_tokens = (int32_t)rq->capacity->page_tokens;
    in.kda_slots_total = (int32_t)rq->capacity->kda_slots;
    in.max_batch = (int32_t)rq->capacity->max_batch;
    in.max_context = rq->capacity->max_context_tokens;
  }
  fill_load(&in, rq->load);
  char err[256];
  bool is_new = false;
  int rc = rt_registry_upsert(&rt->reg, &in, k3_wall_ms(), &is_new, err, sizeof err);
  if (rc) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "%s", err);
    return;
  }
  rt_worker_t *w = rt_registry_find(&rt->reg, in.id);
  K3pd__V1__RegisterResponse r = K3PD__V1__REGISTER_RESPONSE__INIT;
  r.registration_epoch = ++rt->next_reg_epoch;
  w->generation = (uint32_t)r.registration_epoch;
  r.heartbeat_interval_ms = rt->heartbeat_ms;
  r.heartbeat_timeout_ms = rt->heartbeat_timeout_ms;
  r.router_id = "k3pd-router";
  K3_INFO("worker %s registered: %s at %s, fingerprint %016llx%s", in.id, role_name(in.role), in.address,
          (unsigned long long)in.fingerprint, is_new ? "" : " (re-registration)");
  k3_rpc_call_reply(call, &r.base);
  rt_metrics_workers(rt);
  rt_watch_worker(rt, in.id); /* notices its death at once (watch.c) */
}

static void on_heartbeat(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__HeartbeatRequest *rq = (const K3pd__V1__HeartbeatRequest *)msg;
  K3pd__V1__HeartbeatResponse r = K3PD__V1__HEARTBEAT_RESPONSE__INIT;
  r.heartbeat_interval_ms = rt->heartbeat_ms;
  rt_worker_t *w = rq->worker_id ? rt_registry_find(&rt->reg, rq->worker_id) : NULL;
  if (!w || (rq->registration_epoch && rq->registration_epoch != w->generation)) {
    r.reregister = true;
    k3_rpc_call_reply(call, &r.base);
    return;
  }
  rt_worker_info_t in = w->info;
  fill_load(&in, rq->load);
  if (rq->draining && !in.draining) K3_INFO("worker %s is draining: no new requests go there", in.id);
  in.draining = rq->draining;
  char err[256];
  bool is_new;
  uint32_t gen = w->generation;
  if (rt_registry_upsert(&rt->reg, &in, k3_wall_ms(), &is_new, err, sizeof err)) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "load: %s", err);
    return;
  }
  rt_registry_find(&rt->reg, in.id)->generation = gen;
  k3_rpc_call_reply(call, &r.base);
}

static void on_deregister(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  rt_router_t *rt = user;
  const K3pd__V1__DeregisterRequest *rq = (const K3pd__V1__DeregisterRequest *)msg;
  K3pd__V1__DeregisterResponse r = K3PD__V1__DEREGISTER_RESPONSE__INIT;
  rt_worker_t *w = rq->worker_id ? rt_registry_find(&rt->reg, rq->worker_id) : NULL;
  if (w) {
    K3_INFO("worker %s deregistered (%s)", rq->worker_id, rq->reason && *rq->reason ? rq->reason : "no reason");
    k3_rpc_client_forget(rt->cli, w->info.address);
    rt_registry_remove(&rt->reg, rq->worker_id);
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
      k3_rpc_client_forget(rt->cli, w->info.address);
      rt_registry_remove(&rt->reg, w->info.id);
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

int rt_cluster_register(rt_router_t *rt) {
  int rc = k3_rpc_server_add_method(rt->srv, "/k3pd.v1.Cluster/RegisterWorker", K3_RPC_UNARY,
                                    &k3pd__v1__register_request__descriptor, on_register, rt);
  if (!rc)
    rc = k3_rpc_server_add_method(rt->srv, "/k3pd.v1.Cluster/Heartbeat", K3_RPC_UNARY,
                                  &k3pd__v1__heartbeat_request__descriptor, on_heartbeat, rt);
  if (!rc)
    rc = k3_rpc_server_add_method(rt->srv, "/k3pd.v1.Cluster/DeregisterWorker", K3_RPC_UNARY,
                                  &k3pd__v1__deregister_request__descriptor, on_deregister, rt);
  return rc;
}
