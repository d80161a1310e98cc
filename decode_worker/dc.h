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
#include "k3pd/spools.h"
#include "k3pd/xdev_hooks.h"
#include "k3pd/xfer.h"
#include "localcost.h"

typedef enum { DC_RESERVED = 0, DC_READY, DC_RUNNING, DC_FINISHED } dc_state_t;

/* ---- prefix cache (cache.c; docs/design.md "Prefix cache") ----
 * An entry is an exact checkpoint of a prompt prefix [0, len): references to the MLA pages that
 * hold its latents (len is a multiple of the block, itself a multiple of the page size, so the
 * pages are full and never written again) and one KDA slot holding a copy of the recurrent + conv
 * state at len. Keyed by the chained hash of the prefix's blocks (k3pd/prefix_hash.h). */
#define DC_MAX_CKPT 4
typedef struct dc_centry {
  struct dc_centry *next;
  uint64_t key;        /* chain[len / block - 1] */
  uint32_t len;        /* tokens, a multiple of the block */
  uint64_t *chain;     /* len / block hashes (owned) */
  int32_t *pages;      /* len / page_tokens page ids (one cache reference each; owned array) */
  int n_pages;
  int slot;            /* the KDA checkpoint (owned by the entry) */
  bool ready;          /* the engine took the checkpoint: usable for hits */
  uint32_t pins;       /* requests using it as their hit or creating it: not evictable */
  uint64_t last_use;   /* LRU tick */
} dc_centry_t;

typedef struct {
  bool on;               /* --prefix-cache */
  bool resume;           /* --prefix-resume and this worker can send from its pools */
  uint32_t block;        /* tokens per hashed block: lcm(64 (KDA chunk), page_tokens) */
  uint32_t local_max;    /* --local-prefill-max-tokens: longest suffix computed here */
  uint64_t max_bytes;    /* --prefix-cache-bytes: pages + slots held only by the cache */
  uint64_t page_bytes, slot_bytes;
  dc_centry_t *entries;
  uint32_t n_entries;
  uint32_t *req_ref;     /* per page: references held by requests */
  uint32_t *cache_ref;   /* per page: references held by entries */
  uint32_t pages_cache_only, slots;
  /* Pinned entries (pending checkpoints, hits not yet copied) cannot be evicted, so they are
   * bounded by pin_max slots, which the worker keeps out of the capacity it registers
   * (req_slots_max = num_slots - pin_max): a Reserve within the registered capacity always
   * finds a free or evictable slot. */
  uint32_t n_pinned, pin_max, req_slots_max;
  uint64_t tick;
  uint64_t hits, misses, hit_tokens, evictions, local_tokens;
  uint64_t *report;      /* heartbeat summary buffer (DC_CACHE_REPORT_MAX) */
} dc_cache_t;
#define DC_CACHE_REPORT_MAX 512

typedef struct dc_req {
  struct dc_req *next;   /* worker's request list */
  char id[129];          /* router's request id */
  uint64_t handle;       /* transfer-layer request id (unique per reservation on this worker) */
  uint64_t epoch;
  dc_state_t state;
  uint32_t n_prompt, max_new;
  int32_t *pages;        /* page ids (owned array; one request reference on each page) */
  int n_pages;
  int slot;
  /* prefix cache: split = this worker computes prompt[start, n_prompt) and the first token */
  bool split;
  uint32_t *prompt;       /* the prompt's ids (owned; split requests only) */
  uint32_t start;         /* tokens whose state exists at admission: cached (hit) or xfer_tokens */
  uint32_t xfer_tokens;   /* tokens the prefill worker computes and hands off (0 = none) */
  uint32_t cached;        /* tokens taken from the cache (0 = miss) */
  dc_centry_t *hit;       /* pinned hit entry (its slot is copied at admission) */
  uint32_t resume;        /* long-suffix hit: the prefill worker resumes from the cached state at
                             this position (Export) and pushes only the state from it on */
  dc_centry_t *exp;       /* that entry, pinned until the request ends */
  uint32_t n_exports;     /* Export sends running for this reservation */
  dc_centry_t *ck[DC_MAX_CKPT]; /* pinned entries this request creates (from admission) */
  int n_ck;
  uint32_t cand[DC_MAX_CKPT];   /* checkpoint positions planned at Reserve */
  uint32_t n_cand;
  uint64_t *hashes;       /* the prompt's block hashes until admission (owned) */
  uint32_t lease_ms;      /* requests without a handoff: how long Attach may take */
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
typedef enum { DC_MSG_ADMIT = 1, DC_MSG_CANCEL, DC_MSG_STOP, DC_MSG_TOKENS, DC_MSG_DONE, DC_MSG_CKPT } dc_msg_type_t;

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
  /* ADMIT of a split request: compute prompt[start, n_prompt) first (copy_slot >= 0: start from
   * that checkpoint's KDA state), taking checkpoints at ck_pos into ck_slot */
  bool split;
  int32_t *prompt;        /* owned copy */
  uint32_t n_prompt, start;
  int copy_slot;
  uint32_t ck_pos[DC_MAX_CKPT];
  int ck_slot[DC_MAX_CKPT];
  int n_ck;
  /* engine-side progress of a split admission (engine.c run_splits) */
  bool imported;          /* import_state ran (import_rc its result) */
  int import_rc;
  int split_rc;           /* 0, or why the suffix failed (err says) */
  uint32_t split_pos, split_end;
  int split_k;            /* next checkpoint index */
  float split_lp;         /* the first token's logprob */
  /* CKPT (engine → loop): the checkpoint at ck_pos[0] was taken */
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

/* ---- export (export.c): Decode.Export, the cached state of a long-suffix hit sent into a
 * prefill worker's receive reservation (docs/design.md "Long-suffix hits") ---- */
int dc_export_register(dc_worker_t *w);
/* service.c: the live request under a router request id, or NULL. */
dc_req_t *dc_req_find(dc_worker_t *w, const char *id);

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
  k3_spools_t sp;             /* arena layouts: the runner's state arena as one pool */
  k3_xfer_src_pool_t src_pool; /* sp as a cuda-pull source pool (exports borrow it) */
  k3_xhooks_t *hooks;         /* device digest jobs (cuda arena), NULL otherwise */
  dc_cache_t cache;          /* prefix cache (loop thread) */
  uint64_t next_local_epoch; /* epochs of reservations without a handoff */
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

/* cache.c (loop thread). */
int dc_cache_init(dc_worker_t *w, bool on, uint64_t max_bytes, uint32_t local_max, int pin_max, char *err,
                  size_t errlen);
void dc_cache_free(dc_worker_t *w);
/* Page references: a request's new pages come from the free list with one request reference;
 * shared pages gain one; a page returns to the free list when its last reference goes. */
int dc_pages_take(dc_worker_t *w, int n, int32_t *out);
void dc_page_ref_req(dc_worker_t *w, int32_t p);
void dc_page_unref_req(dc_worker_t *w, int32_t p);
/* Frees cache entries (LRU, unpinned) until `pages` pages and `slots` slots are free; true when
 * they are. */
bool dc_cache_make_room(dc_worker_t *w, int pages, int slots);
/* Reserve-time plan for a prompt (sets q->split, start, xfer_tokens, cached, hit, and the
 * checkpoints to take). Takes the request's pages and slot (sharing the hit's pages) or
 * returns K3_ECAPACITY (nothing taken). */
int dc_cache_plan(dc_worker_t *w, dc_req_t *q, const uint32_t *ids, int need_pages, bool resume_ok);
/* An extra pin (an Export reading the entry) and its release (then the budget is enforced). */
void dc_cache_pin(dc_worker_t *w, dc_centry_t *e);
void dc_cache_unpin(dc_worker_t *w, dc_centry_t *e);
/* Admission of a split request: creates the pending entries of its planned checkpoints (as the
 * pin budget allows). */
void dc_cache_admit(dc_worker_t *w, dc_req_t *q);
/* The engine took the checkpoint at `pos` of request q. */
void dc_cache_ckpt_done(dc_worker_t *w, dc_req_t *q, uint32_t pos);
/* The request is over: unpins its entries (dropping the checkpoints it never took). */
void dc_cache_req_done(dc_worker_t *w, dc_req_t *q);
/* Evicts LRU unpinned entries while the cache holds more than its byte budget. */
void dc_cache_enforce(dc_worker_t *w);
/* Heartbeat summary: fills load->cached_prefix_hashes. */
void dc_cache_fill_load(dc_worker_t *w, K3pd__V1__WorkerLoad *load);

/* costprobe.c: measures this worker's prefill pass and full-batch decode step (up to `batch`
 * sequences, as many as its pools hold) on its runner (the engine thread must not have
 * started). Returns 0, K3_EINVAL (pool too small, err says why), K3_ENOMEM or the runner's
 * error. */
int dc_costs_measure(k3_runner_t *r, int num_pages, int page_tokens, int batch, dc_costs_t *out, char *err,
                     size_t errlen);

/* main.c: refresh pool gauges and transfer-derived counters (loop thread). */
void dc_metrics_refresh(dc_worker_t *w);

/* service.c */
int dc_service_register(dc_worker_t *w);
void dc_on_engine_msg(k3_msg_t *m, void *ud); /* outbox handler */
void dc_on_xfer_ready(void *ud, const k3_xfer_ready_t *r);
void dc_on_xfer_release(void *ud, uint64_t request_id, void *owner);
void dc_fill_load(void *ud, K3pd__V1__WorkerLoad *load);
/* Drops reservations without a handoff whose Attach did not come within their lease. */
void dc_expire_local(dc_worker_t *w);

#endif
