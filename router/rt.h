/* k3pd-router internals shared by its files (not a public API). Everything runs on the loop
 * thread: the router never blocks and never runs the model. */
#ifndef K3PD_ROUTER_RT_H
#define K3PD_ROUTER_RT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "k3pd/detok.h"
#include "k3pd/metrics.h"
#include "k3pd/metrics_k3pd.h"
#include "k3pd/model_config.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/tokenizer.h"
#include "registry.h"

struct rt_auth;
struct k3_rpc_tls;

typedef struct rt_router {
  uv_loop_t *loop;
  k3_rpc_server_t *srv;     /* public port: k3pd.v1.Generation + health (optional TLS, API keys) */
  k3_rpc_server_t *csrv;    /* cluster port: k3pd.v1.Cluster + health (mutual TLS) */
  k3_rpc_client_t *cli;     /* to the workers (mutual TLS, expecting each worker's id) */
  const struct k3_rpc_tls *tls; /* cluster credentials; NULL with --insecure-cluster */
  struct rt_auth *auth;     /* API keys of the public API; NULL = open */
  uint64_t fingerprint;     /* the cluster's model fingerprint (0 = none yet: the next worker sets it) */
  bool fingerprint_fixed;   /* set by --model-fingerprint (never released) */
  char fingerprint_by[RT_ID_MAX]; /* the worker whose registration set it */
  rt_registry_t reg;
  uv_timer_t expiry_timer;
  k3_tok_t *tok;
  k3_model_config_t cfg;
  char model_name[256];
  int32_t eos_ids[4];       /* the model's end-of-sequence ids (unless ignore_eos) */
  int n_eos_ids;
  uint32_t heartbeat_ms, heartbeat_timeout_ms;
  uint32_t lease_ms;        /* decode reservation lease */
  uint32_t max_new_tokens_limit;
  uint32_t prefill_retries; /* re-issues of a failed prefill to another worker */
  uint32_t worker_retries;  /* attempts of a request on other workers after a worker failed it */
  bool prefix_cache;        /* --prefix-cache: prompts go to Reserve, placement scores cached prefixes */
  double cache_load_tokens; /* --cache-route-load-tokens: a full decode worker costs this many
                               recomputed prompt tokens in placement (registry.h) */
  struct rt_watch *watches; /* liveness watches of registered workers (watch.c) */
  struct rt_tokpool *tokpool; /* tokenisation off the loop (tokpool.h); NULL without a tokenizer */
  size_t max_token_bytes;   /* the vocabulary's longest BPE token (early rejection of long texts) */
  uv_timer_t lag_timer;     /* lag.c */
  uint64_t lag_last_ns;
  /* This process's instance tag (random hex, logged at start and returned in RegisterResponse
   * .router_id): every request id the workers see starts with "<instance>/", so the requests of
   * several routers sharing the workers never collide, even when clients reuse ids or a
   * restarted router counts from 1 again (docs/design.md "Several routers"). */
  char instance[24];
  uint64_t next_reg_epoch;
  uint64_t next_req;
  struct rt_req *reqs;      /* live requests */
  bool draining;
  /* counters (also exported as metrics) */
  uint64_t n_started, n_ok, n_failed, n_cancelled;
  k3_metrics_t *mreg;
  k3_router_metrics_t m;
  k3_metrics_http_t *mhttp;
  struct rt_http *http;     /* the OpenAI-compatible HTTP API (NULL when --http-port is off) */
  FILE *trace;              /* per-request stage trace (K3PD_ROUTER_TRACE; NULL = off): req.h */
} rt_router_t;

/* cluster_svc.c: registered_workers{role} from the registry. */
void rt_metrics_workers(rt_router_t *rt);

/* cluster_svc.c */
int rt_cluster_register(rt_router_t *rt);
void rt_expiry_start(rt_router_t *rt);
/* k3_rpc_client peer_name_fn: the id of the worker registered at `address` (the name its
 * certificate must carry), or NULL. */
const char *rt_worker_name_for(void *rt, const char *address);

/* status.c: the status a public client gets for a request that failed with `code` (one of the
 * codes docs/protocol.md lists for Generate); when it differs, the original code's name is
 * appended to msg (cap bytes; may be NULL). */
k3_rpc_code_t rt_status_public(k3_rpc_code_t code, char *msg, size_t cap);

/* watch.c: the router notices a dead worker at once. Every registered worker gets a
 * grpc.health.v1.Health/Watch stream; when it breaks (the process died, its connection reset,
 * its server shut down) the worker is dropped from the registry on the spot instead of at its
 * heartbeat timeout, so nothing new is placed there. A worker that is in fact alive heartbeats
 * again, is told to re-register, and comes back. Call after every registration. */
void rt_watch_worker(rt_router_t *rt, const char *worker_id);
/* Drops a worker found dead (also forgets its channel); `why` goes to the log. */
void rt_worker_lost(rt_router_t *rt, const char *worker_id, const char *why);

/* lag.c: k3pd_router_loop_lag_seconds, how late the loop runs (start once, stop at shutdown). */
void rt_lag_start(rt_router_t *rt);
void rt_lag_stop(rt_router_t *rt);

/* trace.c: opens K3PD_ROUTER_TRACE's file when it is set (an error is logged and tracing stays
 * off); close flushes it. The stages are in req.h (rt_tr_stage_t). */
void rt_trace_open(rt_router_t *rt);
void rt_trace_close(rt_router_t *rt);

/* generate.c */
int rt_generate_register(rt_router_t *rt);
/* Number of requests in flight. */
uint32_t rt_live_requests(const rt_router_t *rt);

#endif
