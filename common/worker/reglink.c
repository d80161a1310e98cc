/* One worker's registration with ONE router (a "link"); registrar.c keeps one link per router
 * the worker was given (k3pd/registrar.h). State machine:
 *   UNREGISTERED --Register ok--> REGISTERED --heartbeat says reregister / fails N times--> UNREGISTERED
 * A single timer drives both retries and heartbeats; at most one RPC is in flight. Each link has
 * its own registration epoch: routers never share epochs, and a link that cannot reach its
 * router retries on its own without touching the others. */
#include "reglink.h"

#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"

#define HB_FAILS_BEFORE_REREGISTER 3

struct reg_link {
  uv_loop_t *loop;
  k3_rpc_client_t *cli;
  uv_timer_t timer;
  char *router, *worker_id, *grpc_address, *model_name;
  uint8_t *ucx_address;
  size_t ucx_address_len;
  K3pd__V1__Role role;
  K3pd__V1__WorkerCapacity capacity;
  uint64_t fingerprint;
  void (*get_load)(void *ud, K3pd__V1__WorkerLoad *load);
  void *ud;
  uint32_t retry_first_ms, retry_ms, call_timeout_ms, hb_interval_ms;
  uint64_t reg_epoch;
  bool registered, draining, stopping, in_flight, deregistering, kick_pending;
  bool deregister_on_stop; /* stop() asked for DeregisterWorker: sent once no other call is in flight */
  int hb_fails;
  int last_logged_code;
  k3_rpc_ccall_t *call;
  void (*done)(void *arg);
  void *done_arg;
};

static void schedule(reg_link_t *r, uint32_t ms);
static void send_register(reg_link_t *r);
static void send_heartbeat(reg_link_t *r);
static void stopping_call_done(reg_link_t *r);

static char *dupstr(const char *s) { return s ? strdup(s) : strdup(""); }

static void finish_free(uv_handle_t *h) {
  reg_link_t *r = h->data;
  if (r->done) r->done(r->done_arg);
  free(r->router);
  free(r->worker_id);
  free(r->grpc_address);
  free(r->model_name);
  free(r->ucx_address);
  free(r);
}

static void maybe_finish(reg_link_t *r) {
  if (r->stopping && !r->in_flight && !uv_is_closing((uv_handle_t *)&r->timer))
    uv_close((uv_handle_t *)&r->timer, finish_free);
}

static void fill_load(reg_link_t *r, K3pd__V1__WorkerLoad *load) {
  k3pd__v1__worker_load__init(load);
  if (r->get_load) r->get_load(r->ud, load);
}

static void on_register(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  reg_link_t *r = arg;
  r->in_flight = false;
  r->call = NULL;
  if (r->stopping) {
    stopping_call_done(r);
    return;
  }
  if (st->code != K3_RPC_OK) {
    if ((int)st->code != r->last_logged_code) {
      /* A worker pointed at the router's public port (the old single-port layout) fails the
       * TLS handshake or finds no Cluster service there: say where to look (only before the
       * first registration: later it is this router being down, which the others do not mind). */
      bool hint = !r->reg_epoch && (st->code == K3_RPC_UNAVAILABLE || st->code == K3_RPC_UNIMPLEMENTED);
      K3_WARN("register with router %s failed: %s %s (retrying)%s", r->router, k3_rpc_code_name(st->code),
              st->details, hint ? "; --router must be the router's cluster port (its --cluster-listen), and both "
                                  "must use the same cluster CA" : "");
      r->last_logged_code = (int)st->code;
    }
    schedule(r, r->retry_ms);
    r->retry_ms = r->retry_ms * 2 > 5000 ? 5000 : r->retry_ms * 2;
    return;
  }
  const K3pd__V1__RegisterResponse *rr = (const K3pd__V1__RegisterResponse *)resp;
  r->registered = true;
  r->reg_epoch = rr->registration_epoch;
  r->hb_interval_ms = rr->heartbeat_interval_ms ? rr->heartbeat_interval_ms : 1000;
  r->retry_ms = r->retry_first_ms;
  r->hb_fails = 0;
  r->last_logged_code = -1;
  K3_INFO("registered with router %s as %s (epoch %llu, heartbeat %u ms)", r->router, r->worker_id,
          (unsigned long long)r->reg_epoch, r->hb_interval_ms);
  schedule(r, r->hb_interval_ms);
}

static void send_register(reg_link_t *r) {
  K3pd__V1__RegisterRequest req = K3PD__V1__REGISTER_REQUEST__INIT;
  K3pd__V1__WorkerLoad load;
  K3pd__V1__WorkerCapacity cap = r->capacity;
  fill_load(r, &load);
  req.role = r->role;
  req.worker_id = r->worker_id;
  req.grpc_address = r->grpc_address;
  req.ucx_worker_address.data = r->ucx_address;
  req.ucx_worker_address.len = r->ucx_address_len;
  req.capacity = &cap;
  req.load = &load;
  req.model_fingerprint = r->fingerprint;
  req.model_name = r->model_name;
  req.protocol_version = 1;
  /* Re-registering (heartbeats failed, or the router asked): the epoch we held proves the live
   * registration, if the router still has one, is ours (proto: RegisterRequest.replaces_epoch). */
  req.replaces_epoch = r->reg_epoch;
  k3_rpc_call_opts_t o = {.timeout_ms = r->call_timeout_ms};
  r->in_flight = true;
  int rc = k3_rpc_unary(r->cli, r->router, "/k3pd.v1.Cluster/RegisterWorker", &req.base,
                        &k3pd__v1__register_response__descriptor, &o, on_register, r, &r->call);
  if (rc) {
    r->in_flight = false;
    K3_WARN("register: cannot start call: %s", k3_strerror(rc));
    schedule(r, r->retry_ms);
  }
}

static void on_heartbeat(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  reg_link_t *r = arg;
  r->in_flight = false;
  r->call = NULL;
  if (r->stopping) {
    stopping_call_done(r);
    return;
  }
  if (st->code != K3_RPC_OK) {
    if (++r->hb_fails >= HB_FAILS_BEFORE_REREGISTER) {
      K3_WARN("heartbeat to router %s failed %d times (%s): re-registering", r->router, r->hb_fails,
              k3_rpc_code_name(st->code));
      r->registered = false;
      schedule(r, r->retry_ms);
      return;
    }
    schedule(r, r->hb_interval_ms);
    return;
  }
  r->hb_fails = 0;
  if (r->kick_pending) { /* the load changed while this heartbeat was on the wire */
    r->kick_pending = false;
    const K3pd__V1__HeartbeatResponse *hr0 = (const K3pd__V1__HeartbeatResponse *)resp;
    if (!hr0->reregister) {
      schedule(r, 0);
      return;
    }
  }
  const K3pd__V1__HeartbeatResponse *hr = (const K3pd__V1__HeartbeatResponse *)resp;
  if (hr->heartbeat_interval_ms) r->hb_interval_ms = hr->heartbeat_interval_ms;
  if (hr->reregister) {
    K3_INFO("router %s asked %s to re-register", r->router, r->worker_id);
    r->registered = false;
    schedule(r, 0);
    return;
  }
  schedule(r, r->hb_interval_ms);
}

static void send_heartbeat(reg_link_t *r) {
  K3pd__V1__HeartbeatRequest req = K3PD__V1__HEARTBEAT_REQUEST__INIT;
  K3pd__V1__WorkerLoad load;
  fill_load(r, &load);
  req.worker_id = r->worker_id;
  req.registration_epoch = r->reg_epoch;
  req.load = &load;
  req.draining = r->draining;
  k3_rpc_call_opts_t o = {.timeout_ms = r->call_timeout_ms};
  r->in_flight = true;
  int rc = k3_rpc_unary(r->cli, r->router, "/k3pd.v1.Cluster/Heartbeat", &req.base,
                        &k3pd__v1__heartbeat_response__descriptor, &o, on_heartbeat, r, &r->call);
  if (rc) {
    r->in_flight = false;
    schedule(r, r->hb_interval_ms);
  }
}

static void on_timer(uv_timer_t *t) {
  reg_link_t *r = t->data;
  if (r->stopping || r->in_flight) return;
  if (r->registered)
    send_heartbeat(r);
  else
    send_register(r);
}

static void schedule(reg_link_t *r, uint32_t ms) {
  if (!r->stopping) uv_timer_start(&r->timer, on_timer, ms, 0);
}

int reg_link_start(uv_loop_t *loop, k3_rpc_client_t *cli, const k3_registrar_opts_t *o, const char *router,
                   reg_link_t **out) {
  if (!router || !*router || !o->worker_id || !*o->worker_id || !o->grpc_address || !*o->grpc_address)
    return K3_EINVAL;
  reg_link_t *r = calloc(1, sizeof *r);
  if (!r) return K3_ENOMEM;
  r->loop = loop;
  r->cli = cli;
  r->router = dupstr(router);
  r->worker_id = dupstr(o->worker_id);
  r->grpc_address = dupstr(o->grpc_address);
  r->model_name = dupstr(o->model_name);
  if (o->ucx_address_len) {
    r->ucx_address = malloc(o->ucx_address_len);
    if (r->ucx_address) memcpy(r->ucx_address, o->ucx_address, o->ucx_address_len);
    r->ucx_address_len = o->ucx_address_len;
  }
  if (!r->router || !r->worker_id || !r->grpc_address || !r->model_name || (o->ucx_address_len && !r->ucx_address)) {
    free(r->router);
    free(r->worker_id);
    free(r->grpc_address);
    free(r->model_name);
    free(r->ucx_address);
    free(r);
    return K3_ENOMEM;
  }
  r->role = o->role;
  r->capacity = o->capacity;
  r->fingerprint = o->fingerprint;
  r->get_load = o->get_load;
  r->ud = o->ud;
  r->retry_first_ms = r->retry_ms = o->retry_ms ? o->retry_ms : 200;
  r->call_timeout_ms = o->call_timeout_ms ? o->call_timeout_ms : 2000;
  r->hb_interval_ms = 1000;
  r->last_logged_code = -1;
  uv_timer_init(loop, &r->timer);
  r->timer.data = r;
  schedule(r, 0);
  *out = r;
  return 0;
}

bool reg_link_registered(const reg_link_t *r) { return r->registered; }

void reg_link_kick(reg_link_t *r) {
  if (!r->registered || r->stopping) return;
  if (r->in_flight)
    r->kick_pending = true; /* sent as soon as the current call completes */
  else
    schedule(r, 0);
}

void reg_link_set_draining(reg_link_t *r, bool draining) {
  r->draining = draining;
  reg_link_kick(r);
}

static void on_deregister(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  reg_link_t *r = arg;
  (void)resp;
  r->in_flight = false;
  r->call = NULL;
  if (st->code != K3_RPC_OK) K3_WARN("deregister from %s: %s", r->router, k3_rpc_code_name(st->code));
  maybe_finish(r);
}

static void send_deregister(reg_link_t *r) {
  K3pd__V1__DeregisterRequest req = K3PD__V1__DEREGISTER_REQUEST__INIT;
  req.worker_id = r->worker_id;
  req.registration_epoch = r->reg_epoch;
  req.reason = "shutdown";
  k3_rpc_call_opts_t o = {.timeout_ms = r->call_timeout_ms};
  r->deregistering = true;
  r->in_flight = true;
  if (k3_rpc_unary(r->cli, r->router, "/k3pd.v1.Cluster/DeregisterWorker", &req.base,
                   &k3pd__v1__deregister_response__descriptor, &o, on_deregister, r, &r->call))
    r->in_flight = false;
}

/* The call that was in flight when stop() ran has ended (it was cancelled): deregister now if
 * asked to (a heartbeat on the wire at shutdown must not cost the router its early notice). */
static void stopping_call_done(reg_link_t *r) {
  if (r->deregister_on_stop && r->registered && !r->deregistering) send_deregister(r);
  maybe_finish(r);
}

void reg_link_stop(reg_link_t *r, bool deregister, void (*done)(void *arg), void *arg) {
  r->stopping = true;
  r->deregister_on_stop = deregister;
  r->done = done;
  r->done_arg = arg;
  uv_timer_stop(&r->timer);
  if (r->in_flight && r->call) k3_rpc_ccall_cancel(r->call); /* its callback deregisters */
  else if (deregister && r->registered) send_deregister(r);
  maybe_finish(r);
}
