/* Worker side of the router's Cluster service: register, heartbeat with load, re-register
 * when the router forgot us (it restarted or dropped us), deregister on drain/shutdown.
 *
 * The router holds no static worker list (ARCHITECTURE.md §3): a worker that cannot reach the
 * router keeps retrying with capped backoff and logs once per state change, never exits.
 * Everything runs on the owning uv loop; get_load is called on that loop before every
 * heartbeat, so it may read loop-owned counters directly. */
#ifndef K3PD_REGISTRAR_H
#define K3PD_REGISTRAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "k3pd/rpc_client.h"
#include "k3pd/v1/cluster.pb-c.h"

typedef struct k3_registrar k3_registrar_t;

typedef struct {
  const char *router;          /* HOST:PORT of the router (copied) */
  K3pd__V1__Role role;
  const char *worker_id;       /* copied */
  const char *grpc_address;    /* where the router reaches this worker (copied) */
  const uint8_t *ucx_address;  /* UCX worker address (copied; may be NULL for prefill) */
  size_t ucx_address_len;
  K3pd__V1__WorkerCapacity capacity; /* copied by value */
  uint64_t fingerprint;
  const char *model_name;      /* copied */
  /* Fills *load with the current load (loop thread). */
  void (*get_load)(void *ud, K3pd__V1__WorkerLoad *load);
  void *ud;
  uint32_t retry_ms;           /* first retry delay; 0 = 200, doubles up to 5000 */
  uint32_t call_timeout_ms;    /* per RPC; 0 = 2000 */
} k3_registrar_opts_t;

/* Starts registering at once. The client must outlive the registrar. Returns 0 or K3_ENOMEM /
 * K3_EINVAL (missing router/worker_id/address). */
int k3_registrar_start(uv_loop_t *loop, k3_rpc_client_t *cli, const k3_registrar_opts_t *opts,
                       k3_registrar_t **out);
/* True once a Register succeeded and no later heartbeat asked us to re-register. */
bool k3_registrar_registered(const k3_registrar_t *r);
/* Draining: the next heartbeat (sent now) tells the router to stop routing new work here. */
void k3_registrar_set_draining(k3_registrar_t *r, bool draining);
/* Sends a heartbeat now (e.g. after load changed a lot). No-op when not registered. */
void k3_registrar_kick(k3_registrar_t *r);
/* Stops timers; when `deregister` and registered, sends DeregisterWorker (bounded by the call
 * timeout) first. `done` (may be NULL) runs on the loop when everything is finished; the
 * registrar is freed after it returns. */
void k3_registrar_stop(k3_registrar_t *r, bool deregister, void (*done)(void *arg), void *arg);

#endif
