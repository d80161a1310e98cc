/* k3pd-decode internals shared by its files (not a public API).
 *
 * Threads: the loop thread owns everything in dc_worker_t except `runner`, which belongs to the
 * engine thread once it started (engine.c). They talk only through messages: dc_engine_post()
 * (loop → engine) and the worker's `outbox` (engine → loop, k3_inbox_t).
 *
 * Request lifecycle on this worker (ARCHITECTURE.md §2):
 *   Reserve   → DC_RESERVED: pages + one KDA slot taken from the free lists, xfer reservation
 *               with a lease; the reply carries the transfer descriptor.
 *   DONE ok   → DC_READY: the state is in our pools and verified (digests, epoch, fingerprint).
 *   Attach    → (with READY) DC_RUNNING: the engine admits the sequence; tokens flow back to the
 *               Attach stream; the first token (sampled by prefill) is emitted first.
 *   finish / cancel / lease expiry / client gone → resources back to the free lists once the
 *               transfer layer says the memory can no longer be written (on_release).
 * Pages and slots are bookkept here, not by the runner's pool API, because Reserve runs on the
 * loop thread while the engine thread runs decode steps on the same runner. */
#ifndef K3PD_DECODE_DC_H
#define K3PD_DECODE_DC_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "k3_load.h"
#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/fdshare.h"
#include "k3pd/metrics.h"
#include "k3pd/metrics_k3pd.h"
#include "k3pd/msgq.h"
#include "k3pd/registrar.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/xdev_hooks.h"
#include "k3pd/xfer.h"

typedef enum { DC_RESERVED = 0, DC_READY, DC_RUNNING, DC_FINISHED } dc_state_t;

typedef struct dc_req {
  struct dc_req *next;   /* worker's request list */
  char id[129];          /* router's request id */
  uint64_t handle;       /* transfer-layer request id (unique per reservation on this worker) */
  uint64_t epoch;
  dc_state_t state;
  uint32_t n_prompt, max_new;
  int32_t *pages;        /* page ids (owned) */
  int n_pages;
  int slot;
  bool xfer_live;        /* the transfer layer still holds the reservation (on_release pending) */
  bool engine_has;       /* admitted and not yet finished by the engine */
  uint32_t first_token;
  float first_logprob;
  /* Attach */
  k3_rpc_call_t *attach; /* NULL until Attach arrives, again NULL once finished */
  k3k_sample_cfg_t sample;
  uint32_t *stop_ids;
  int n_stop_ids;
  bool want_logprobs;
  uint32_t emitted;      /* tokens written to the stream */
  int finish_reason;     /* K3pd__V1__FinishReason once known */
  uint64_t t_reserved_ns, t_ready_ns, t_first_ns;
} dc_req_t;

typedef struct dc_worker dc_worker_t;

/* ---- engine (engine.c) ---- */
typedef enum { DC_MSG_ADMIT = 1, DC_MSG_CANCEL, DC_MSG_STOP, DC_MSG_TOKENS, DC_MSG_DONE } dc_msg_type_t;

typedef struct {
  k3_msg_t link;
  uint64_t handle;
  /* ADMIT */
  k3_seq_t seq;           /* pages point into msg-owned storage */
  int32_t *page_store;
  uint32_t first_token, max_new;
  k3k_sample_cfg_t sample;
  uint32_t *stop_ids;     /* owned copy */
  int n_stop_ids;
  bool want_logprobs;
  /* TOKENS / DONE (engine → loop) */
  uint32_t n_tokens;
  uint32_t tokens[8];
  float logprobs[8];
  int finish_reason;      /* 0 = still running */
  char err[320];
} dc_msg_t;

int dc_engine_start(dc_worker_t *w);
void dc_engine_post(dc_worker_t *w, dc_msg_t *m);
/* Asks the engine to stop and joins it (loop thread; blocks until the current step ends). */
void dc_engine_stop(dc_worker_t *w);

/* ---- worker ---- */
struct dc_worker {
  uv_loop_t *loop;
  k3_rpc_server_t *srv;
  k3_rpc_client_t *cli;
  k3_registrar_t *reg;
  k3_xfer_ctx_t *xfer;
  k3_xfer_recv_t *recv;
  k3_runner_t *runner;      /* engine thread's after dc_engine_start */
  const k3_manifest_t *manifest;
  uint64_t fingerprint;
  int page_tokens, num_pages, num_slots, max_batch;
  uint32_t max_context;
  int64_t vocab;            /* the model's, for the shared request validators */
  /* free lists (loop thread) */
  int32_t *free_pages;
  int n_free_pages;
  int32_t *free_slots;
  int n_free_slots;
  dc_req_t *reqs;
  uint64_t next_handle;
  uint32_t lease_ms;
  bool draining;
  /* engine thread */
  k3_engine_t engine;         /* engine thread + its inbound queue */
  k3_inbox_t outbox;
  /* where states land (pools.c): manifest region i of page/slot id lives at
   * pools[rpool[i]] base + roff[i] + id * rstride[i] */
  int recv_mode;              /* DC_RECV_* */
  k3_xfer_pool_t *pools[2];   /* arena: [0]; staged: [0] pages, [1] slots */
  uint32_t n_pools;
  uint8_t *rpool;             /* owned, manifest->n entries */
  uint64_t *roff, *rstride;   /* owned, manifest->n entries */
  uint64_t kv_stride, kda_stride; /* staged receive area */
  char ipc_dir[256];          /* device arena: where its fdshare socket lives ("" = none) */
  k3_fdshare_t *fds;          /* serves the device arena's file descriptor */
  k3_xhooks_t *hooks;         /* device digest jobs (cuda arena), NULL otherwise */
  /* counters */
  uint64_t n_admitted, n_finished, n_leases_expired, n_reserve_rejected;
  uint32_t n_running;
  /* metrics (updated from the loop and, lock-free, from the engine thread) */
  k3_metrics_t *mreg;
  k3_decode_metrics_t m;
  k3_metrics_http_t *mhttp;
  k3_xfer_stats_t last_xs;   /* transfer-layer counters already exported */
  int health;                /* last readiness reported: -1 unknown, 0 not serving, 1 serving */
};

/* pools.c: where states land. */
enum { DC_RECV_ARENA_HOST = 1, DC_RECV_ARENA_DEVICE, DC_RECV_STAGED };
const char *dc_receive_name(int mode);
/* Before the model loads: chooses the layout from --xfer-receive / --ipc-dir and the backend,
 * and sets mo->state (the runner's arena from UCX on host backends; VMM on cuda with an ipc
 * dir). The xfer ctx must exist. */
int dc_pools_plan(dc_worker_t *w, k3_load_opts_t *mo, const char *receive, const char *ipc_dir, char *err,
                  size_t errlen);
/* After the model loaded: the pools, the region placement, the free lists; on cuda the device
 * hooks (w->hooks) and the exported arena. */
int dc_pools_setup(dc_worker_t *w, char *err, size_t errlen);
/* The reservation's layout (slot_idx: one u32 of storage that must live as long as lay). */
int dc_pools_layout(dc_worker_t *w, const dc_req_t *q, uint32_t *slot_idx, k3_xfer_layout_t *lay,
                    k3_xfer_region_t *regs);
/* Staged layout: copy the verified state into the runner (engine thread). */
int dc_pools_import(dc_worker_t *w, k3_seq_t *seq, uint8_t **buf, size_t *cap);
/* Unregisters the pools and stops the fdshare server (after the receiver is freed). */
void dc_pools_free(dc_worker_t *w);
/* Closes the device hooks (after k3_xfer_ctx_close). */
void dc_pools_close_hooks(dc_worker_t *w);

/* main.c: refresh pool gauges and transfer-derived counters (loop thread). */
void dc_metrics_refresh(dc_worker_t *w);

/* service.c */
int dc_service_register(dc_worker_t *w);
void dc_on_engine_msg(k3_msg_t *m, void *ud); /* outbox handler */
void dc_on_xfer_ready(void *ud, const k3_xfer_ready_t *r);
void dc_on_xfer_release(void *ud, uint64_t request_id, void *owner);
void dc_fill_load(void *ud, K3pd__V1__WorkerLoad *load);

#endif
