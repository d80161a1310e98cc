/* Worker side of the routers' Cluster service: register, heartbeat with load, re-register
 * when a router forgot us (it restarted or dropped us), deregister on drain/shutdown.
 *
 * Several routers (docs/design.md "Several routers"): a worker registers and heartbeats with
 * EVERY router it is given, each independently (its own epoch, retries and backoff), so a router
 * that is down or unreachable never stops the worker from serving the others. The router list
 * is `opts.router`: comma-separated entries, each either HOST:PORT (one router, dialed as given)
 * or dns:NAME:PORT (every address NAME resolves to is a router: a Kubernetes headless Service),
 * re-resolved every resolve_ms off the loop (uv_getaddrinfo). A router address that leaves the
 * DNS answer is dropped once its registration lapses (its router died or forgot us); while it is
 * still registered (a router draining after leaving the Service) it keeps its heartbeats. A
 * failed resolution changes nothing.
 *
 * The router holds no static worker list (ARCHITECTURE.md §3): a worker that cannot reach a
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
  const char *router;          /* the routers: "HOST:PORT,dns:NAME:PORT,..." (copied; k3_registrar_check) */
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
  uint32_t resolve_ms;         /* re-resolution period of dns: entries; 0 = 5000 */
} k3_registrar_opts_t;

#define K3_REGISTRAR_MAX_ROUTERS 64

/* Checks a router list (the --router flag) without resolving anything: 0, or K3_EINVAL with a
 * message naming `what` (e.g. "--router") and the bad entry. */
int k3_registrar_check(const char *routers, const char *what, char *err, size_t errlen);

/* Starts registering at once (dns: entries once their first resolution answers). The client
 * must outlive the registrar. Returns 0 or K3_ENOMEM / K3_EINVAL (missing or bad router list,
 * worker_id or address). */
int k3_registrar_start(uv_loop_t *loop, k3_rpc_client_t *cli, const k3_registrar_opts_t *opts,
                       k3_registrar_t **out);
/* True while at least one router holds our registration (a Register succeeded and no later
 * heartbeat asked us to re-register). */
bool k3_registrar_registered(const k3_registrar_t *r);
/* How many routers we know (given or resolved), and with how many we are registered. */
void k3_registrar_count(const k3_registrar_t *r, int *n_routers, int *n_registered);
/* Draining: the next heartbeat (sent now) tells every router to stop routing new work here. */
void k3_registrar_set_draining(k3_registrar_t *r, bool draining);
/* Sends a heartbeat now (e.g. after load changed a lot). No-op when not registered. */
void k3_registrar_kick(k3_registrar_t *r);
/* Stops timers and resolutions; when `deregister`, sends DeregisterWorker (bounded by the call
 * timeout) to every router we are registered with first. `done` (may be NULL) runs on the loop when everything is finished; the
 * registrar is freed after it returns. */
void k3_registrar_stop(k3_registrar_t *r, bool deregister, void (*done)(void *arg), void *arg);

#endif
