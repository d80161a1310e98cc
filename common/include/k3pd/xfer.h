/* k3_xfer: moves a sequence's state regions from a prefill worker into a decode worker's
 * registered memory over UCX (one-sided puts), then fences and verifies it.
 *
 * What it is for: the data plane of the handoff (ARCHITECTURE.md §2). One k3_xfer_ctx_t per
 * process (per libuv loop): a UCX context + worker with RMA, AM and WAKEUP, progressed from the
 * loop through the worker's event fd. The decode side registers pools once (k3_xfer_pool_init),
 * reserves regions per request (k3_xfer_recv_reserve → descriptor bytes for the control plane),
 * and gets on_ready after a verified DONE. The prefill side starts a send from a decoded
 * descriptor, signals each layer as it becomes final (puts overlap the remaining compute), then
 * finishes: flush, DONE active message, wait for the receiver's ACK.
 *
 * What it is not: model code (regions are generic, see xfer_desc.h), the control plane (the
 * descriptor and the outcome travel over gRPC elsewhere), or a device allocator (GPU memory is
 * reached through the caller's staging callbacks, k3_xfer_stage_t).
 *
 * Threads: everything here runs on the loop thread that owns the ctx; nothing is thread-safe.
 * Callbacks are called from the loop, never from inside the function that registered them.
 * Contract (STYLE.md): a function that takes a callback and returns an error never calls it;
 * on error nothing changed.
 *
 * Protocol and fencing rule: docs/transfer.md. */
#ifndef K3PD_XFER_H
#define K3PD_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "k3pd/xfer_desc.h"

typedef struct k3_xfer_ctx k3_xfer_ctx_t;
typedef struct k3_xfer_pool k3_xfer_pool_t;
typedef struct k3_xfer_send k3_xfer_send_t;
typedef struct k3_xfer_recv k3_xfer_recv_t;

/* Which memory path moves the bytes (logged and exported, never silent). */
typedef enum {
  K3_XFER_PATH_HOST = 0,        /* host memory on both sides (CPU builds) */
  K3_XFER_PATH_STAGED = 1,      /* device→pinned host per chunk, put, host→device on receive */
  K3_XFER_PATH_CUDA_DIRECT = 2, /* UCX with CUDA memory support puts device memory directly */
} k3_xfer_path_t;
const char *k3_xfer_path_name(k3_xfer_path_t path); /* "host", "staged", "cuda-direct" */

/* ---- context ------------------------------------------------------------------------ */

typedef struct {
  const char *tls; /* UCX_TLS for this context ("shm", "tcp", ...); NULL = environment/default */
} k3_xfer_ctx_opts_t;

/* Creates the UCX context and worker and starts polling its event fd on `loop`. Create it in
 * the process that uses it (never before fork()). Returns 0, K3_ETRANSPORT (UCX failed; logged
 * with the UCX status) or K3_ENOMEM. */
int k3_xfer_ctx_init(uv_loop_t *loop, const k3_xfer_ctx_opts_t *opts, k3_xfer_ctx_t **out);

/* Tears down: fails every send still running with K3_ESHUTDOWN (their callbacks run now),
 * closes endpoints, destroys the worker and context and closes the poll handle. Every pool and
 * receiver must have been freed first. The ctx memory is freed in the handle's close callback,
 * so run the loop once more (uv_run) after calling this. */
void k3_xfer_ctx_close(k3_xfer_ctx_t *ctx);

/* The worker address for the control plane (bytes owned by ctx, valid until close). */
void k3_xfer_ctx_address(const k3_xfer_ctx_t *ctx, const uint8_t **addr, size_t *len);

/* True when this UCX build reports CUDA memory support (then the cuda-direct path is possible
 * for pools registered from device memory by the caller; Debian's UCX says false). */
bool k3_xfer_ctx_cuda_capable(const k3_xfer_ctx_t *ctx);

/* Counters (monotonic, for metrics). */
typedef struct {
  uint64_t sends_ok, sends_failed, sends_timed_out;
  uint64_t bytes_put;
  uint64_t done_accepted;
  uint64_t done_rejected_unknown;     /* K3_ENOENT: no live reservation for the request */
  uint64_t done_rejected_stale;       /* K3_ESTALE: epoch differs */
  uint64_t done_rejected_fingerprint; /* K3_EFINGERPRINT */
  uint64_t done_rejected_digest;      /* K3_EDIGEST */
  uint64_t done_rejected_malformed;   /* K3_EPROTO */
  uint64_t leases_expired, reservations_cancelled, reservations_released;
  uint64_t slots_quarantined, slots_poisoned;
  uint64_t ep_errors;
  uint64_t layers_verified; /* layers verified as they landed (LAYER), before DONE */
  uint64_t data_dropped;    /* DATA chunks (rendezvous path) for no live reservation/epoch */
  uint64_t data_eager, data_rndv; /* DATA chunks placed from the message / by a rendezvous */
} k3_xfer_stats_t;
void k3_xfer_ctx_stats(const k3_xfer_ctx_t *ctx, k3_xfer_stats_t *out);

/* ---- registered pools (receiver side; also usable as registered send sources) ----------- */

/* Allocates n_slots * stride_bytes of memory through UCX (UCP_MEM_MAP_ALLOCATE: one-sided puts
 * on shm need no target progress, C-STACK.md P9) and packs its rkey. Register pools once at
 * start-up: mapping costs ~170 ms per 256 MiB. Returns 0, K3_EINVAL, K3_ETRANSPORT, K3_ENOMEM. */
int k3_xfer_pool_init(k3_xfer_ctx_t *ctx, uint64_t n_slots, uint64_t stride_bytes,
                      k3_xfer_pool_t **out);
/* Unmaps the pool. No reservation that references it may be live. NULL is a no-op. */
void k3_xfer_pool_free(k3_xfer_pool_t *pool);
void *k3_xfer_pool_base(const k3_xfer_pool_t *pool); /* host address of slot 0 */
uint64_t k3_xfer_pool_stride(const k3_xfer_pool_t *pool);
uint64_t k3_xfer_pool_slots(const k3_xfer_pool_t *pool);
/* Packed rkey bytes (owned by the pool). */
void k3_xfer_pool_rkey(const k3_xfer_pool_t *pool, const uint8_t **rkey, size_t *len);

/* ---- staging hooks for device memory (supplied by the model runner) -------------------- */

typedef struct {
  /* Sender: copy `len` bytes of region `region` starting at region byte `off` from device
   * memory into the pinned host buffer `dst`; must be complete when it returns 0. */
  int (*d2h)(void *ud, uint32_t region, uint64_t off, void *dst, uint64_t len);
  /* Receiver: copy `len` verified bytes (region byte `off`) from host `src` into device
   * memory. Called for every extent of every region after digests matched, before on_ready. */
  int (*h2d)(void *ud, uint64_t request_id, uint32_t region, uint64_t off, const void *src,
             uint64_t len);
  /* Optional: allocate/free the sender's staging buffers (max_inflight x chunk_bytes) as
   * pinned host memory (cudaHostAlloc); NULL = aligned_alloc, which works but is slower. */
  void *(*host_alloc)(void *ud, size_t bytes);
  void (*host_free)(void *ud, void *ptr);
  void *ud;
} k3_xfer_stage_t;

/* ---- sender ----------------------------------------------------------------------------- */

/* Where a region's bytes are on the sender (same addressing as xfer_desc.h):
 * byte b is at base + idx[b / unit] * stride + offset + b % unit, or base + offset + b when idx
 * is NULL. With a staging d2h hook, `base` is never dereferenced. */
typedef struct {
  const void *base;
  uint64_t stride_bytes;
  const uint32_t *idx; /* borrowed; must stay valid until the send completes */
  uint32_t n_idx;
  uint64_t offset_bytes;
  uint64_t unit_bytes;
} k3_xfer_src_t;

typedef struct {
  uint32_t deadline_ms;   /* whole operation, from start to ACK; 0 = 30000 */
  uint64_t chunk_bytes;   /* max bytes per put; 0 = 4 MiB */
  uint32_t max_inflight;  /* puts in flight; 0 = 16 */
  const k3_xfer_stage_t *stage; /* non-NULL with d2h: staged path (copied) */
  /* Always ucp_put_nbx: never a mapped pointer nor DATA messages (one-sided puts on an RDMA
   * fabric; tests and comparisons). */
  bool puts_only;
} k3_xfer_send_opts_t;

/* Outcome of a send, passed to the completion callback. */
typedef struct {
  int status;           /* 0: receiver verified and accepted; else K3_E* (receiver's verdict
                           K3_ESTALE/K3_ENOENT/K3_EFINGERPRINT/K3_EDIGEST, or K3_ETIMEDOUT,
                           K3_ETRANSPORT, K3_ECANCELED, K3_ESHUTDOWN) */
  uint64_t request_id, epoch;
  uint64_t bytes;       /* bytes put */
  uint64_t t_start_ns, t_last_layer_ns, t_flushed_ns, t_done_ns; /* k3_now_ns stamps */
  uint64_t kind_bytes[K3_XFER_KIND_COUNT];
  uint64_t kind_ns[K3_XFER_KIND_COUNT]; /* first put issued → last put completed, per kind */
} k3_xfer_send_result_t;

typedef void (*k3_xfer_send_cb)(void *ud, const k3_xfer_send_result_t *res);

/* Starts a send of `desc` (borrowed until completion) from srcs[desc->n_regions] (borrowed).
 * No bytes move until k3_xfer_send_layer_ready. The callback runs exactly once, after which
 * the handle is gone. Returns 0, K3_EINVAL (descriptor/sources mismatch, message logged),
 * K3_EUNAVAIL (cannot reach the receiver's address), K3_ENOMEM. */
int k3_xfer_send_start(k3_xfer_ctx_t *ctx, const k3_xfer_desc_t *desc, const k3_xfer_src_t *srcs,
                       const k3_xfer_send_opts_t *opts, k3_xfer_send_cb cb, void *ud,
                       k3_xfer_send_t **out);
/* Layer `layer` (< desc->n_layers) is final: hash and push its regions. Each layer once.
 * Returns 0, K3_EINVAL (bad/repeated layer) or the send's error if it already failed. */
int k3_xfer_send_layer_ready(k3_xfer_send_t *s, uint32_t layer);
/* All layers signalled: after every put completes, flush, send DONE with the first sampled
 * token, and wait for the ACK. Returns 0 or K3_EINVAL (layers missing, called twice). */
int k3_xfer_send_finish(k3_xfer_send_t *s, uint32_t first_token, float first_logprob);
/* Aborts: the callback runs with K3_ECANCELED (from the loop). The endpoint is closed so no
 * queued put lands later. */
void k3_xfer_send_cancel(k3_xfer_send_t *s);
k3_xfer_path_t k3_xfer_send_path(const k3_xfer_send_t *s);
/* True when this send writes the receiver's pools directly through a UCX-mapped pointer
 * (ucp_rkey_ptr: same host, shm pools), hashing and copying each block in one pass with
 * streaming stores; false when it uses ucp_put_nbx (tcp, other hosts, puts_only). */
bool k3_xfer_send_direct(const k3_xfer_send_t *s);
/* How the bytes move: "direct" (mapped pointer), "am" (DATA active messages: eager or
 * rendezvous, placed by the receiver; chosen when there is no mapping, e.g. tcp) or "put"
 * (ucp_put_nbx; only with puts_only). */
const char *k3_xfer_send_mode(const k3_xfer_send_t *s);

/* ---- receiver: registered pools + reservation table with leases ------------------------ */

typedef struct {
  uint64_t request_id, epoch;
  uint32_t first_token;
  float first_logprob;
  void *owner; /* as given to k3_xfer_recv_reserve */
} k3_xfer_ready_t;

typedef struct {
  void (*on_ready)(void *ud, const k3_xfer_ready_t *r);
  /* The reservation's memory may be reused now (normal release, or after quarantine). The
   * owner frees its pages/slot here. Called exactly once per reservation. */
  void (*on_release)(void *ud, uint64_t request_id, void *owner);
  void *ud;
  uint32_t quarantine_ms; /* after expiry/cancel of an unfinished reservation; 0 = 2000 */
  bool poison;            /* fill quarantined memory with 0xFF before release (default off) */
  const k3_xfer_stage_t *stage; /* non-NULL with h2d: staged path (copied) */
  /* Test hook: called before each verification step of a live reservation whose epoch and
   * fingerprint matched (each LAYER announcement, then DONE if anything is left to hash); may
   * modify memory (to prove corruption is detected). NULL in production. */
  void (*test_before_verify)(void *ud, uint64_t request_id);
} k3_xfer_recv_opts_t;

/* One receiver per ctx (it owns the DONE handler). Returns 0, K3_EEXIST, K3_ENOMEM. */
int k3_xfer_recv_init(k3_xfer_ctx_t *ctx, const k3_xfer_recv_opts_t *opts, k3_xfer_recv_t **out);
/* Cancels every reservation (released immediately: the ctx is going away) and frees. */
void k3_xfer_recv_free(k3_xfer_recv_t *r);

/* What a reservation covers: the receiver's pools, the request's index lists (copied) and the
 * regions (copied), in the descriptor's addressing. */
typedef struct {
  uint32_t n_pools;
  k3_xfer_pool_t *pools[K3_XFER_MAX_POOLS];
  uint32_t n_lists;
  k3_xfer_index_list_t lists[K3_XFER_MAX_LISTS];
  uint32_t n_regions;
  const k3_xfer_region_t *regions;
} k3_xfer_layout_t;

/* Creates a live reservation with a fresh epoch and a lease of lease_ms, and returns its
 * descriptor (*out_desc, caller frees with k3_xfer_desc_free) for the control plane. `owner`
 * is returned in callbacks. Returns 0, K3_EEXIST (request already reserved), K3_EINVAL
 * (layout invalid, message logged), K3_ENOMEM. */
int k3_xfer_recv_reserve(k3_xfer_recv_t *r, const k3_xfer_layout_t *layout, uint64_t request_id,
                         uint64_t fingerprint, uint32_t lease_ms, void *owner,
                         k3_xfer_desc_t **out_desc);
/* Re-issue after a failed prefill: new epoch (old DONEs become stale), renewed lease, new
 * descriptor. Only before ready. Returns 0, K3_ENOENT, K3_EINVAL (already ready), K3_ENOMEM. */
int k3_xfer_recv_reissue(k3_xfer_recv_t *r, uint64_t request_id, uint32_t lease_ms,
                         k3_xfer_desc_t **out_desc);
/* Cancels: an unfinished reservation goes to quarantine (on_release later); a ready one is
 * released now. Returns 0 or K3_ENOENT. */
int k3_xfer_recv_cancel(k3_xfer_recv_t *r, uint64_t request_id);
/* Decode finished with a ready sequence: release now (on_release runs before this returns).
 * Returns 0, K3_ENOENT, K3_EINVAL (not ready: use cancel). */
int k3_xfer_recv_release(k3_xfer_recv_t *r, uint64_t request_id);
/* Reservations live + in quarantine (for leak checks). */
uint32_t k3_xfer_recv_live(const k3_xfer_recv_t *r);
uint32_t k3_xfer_recv_quarantined(const k3_xfer_recv_t *r);
k3_xfer_path_t k3_xfer_recv_path(const k3_xfer_recv_t *r);

#endif
