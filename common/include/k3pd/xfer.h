/* k3_xfer: moves a sequence's state regions from a prefill worker into a decode worker's
 * registered memory (host or device), then fences and verifies it.
 *
 * What it is for: the data plane of the handoff (ARCHITECTURE.md §2). One k3_xfer_ctx_t per
 * process (per libuv loop): a UCX context + worker with RMA, AM and WAKEUP, progressed from the
 * loop through the worker's event fd. The decode side registers pools once
 * (k3_xfer_pool_alloc_host, k3_xfer_pool_register), reserves regions per request
 * (k3_xfer_recv_reserve → descriptor bytes for the control plane), and gets on_ready after a
 * verified DONE. The prefill side starts a send from a decoded descriptor, signals each layer as
 * it becomes final (its bytes move while later layers compute), then finishes: fence, DONE
 * active message, wait for the receiver's ACK. Four data paths (k3_xfer_path_t), chosen per
 * send and reported, never silent.
 *
 * What it is not: model code (regions are generic, see xfer_desc.h), the control plane (the
 * descriptor and the outcome travel over gRPC elsewhere), or a device library: device memory is
 * reached only through the caller's hooks (k3_xfer_dev_t, k3_xfer_stage_t). k3_xfer never
 * links CUDA and never dereferences an address in a K3_XFER_MEM_CUDA pool or a device source.
 *
 * Threads: everything here runs on the loop thread that owns the ctx; nothing is thread-safe
 * except k3_xfer_ctx_wake. Callbacks are called from the loop, never from inside the function
 * that registered them (device hooks are called from the loop; only their notify may run on
 * another thread).
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

/* Which memory path moves the bytes (chosen per send, logged, reported in the send result and
 * exported by the workers as the transfer-path metric; docs/transfer.md "Data paths"). */
typedef enum {
  K3_XFER_PATH_AUTO = 0,     /* send option only: let k3_xfer choose */
  K3_XFER_PATH_HOST = 1,     /* host sources into host pools: direct (shm map), am or put */
  K3_XFER_PATH_STAGED = 2,   /* device sources (k3_xfer_stage_t d2h) into host pools */
  K3_XFER_PATH_CUDA_IPC = 3, /* device sources, device pools mapped here (k3_xfer_dev_t map):
                                one device job per layer copies and hashes; no UCX data */
  K3_XFER_PATH_UCX_CUDA = 4, /* device sources, device pools, UCX with CUDA memory: a hash job
                                plus DATA rendezvous messages from device memory */
  K3_XFER_PATH_CUDA_PULL = 5, /* device sources in pools the sender exports (send opts
                                src_pools), device pools of a receiver that can pull (descriptor
                                flag K3_XFER_DESC_F_PULL): the receiver maps the sender's pools
                                and copies + hashes with its own job (two HBM passes, verified
                                against the producer's digests); no UCX data */
  K3_XFER_PATH_COUNT = 6
} k3_xfer_path_t;
/* "auto", "host", "staged", "cuda-ipc", "ucx-cuda", "cuda-pull" ("?" for other values). */
const char *k3_xfer_path_name(k3_xfer_path_t path);
/* The path named s (as above), or -1. */
int k3_xfer_path_parse(const char *s);

/* ---- context ------------------------------------------------------------------------ */

typedef struct {
  const char *tls; /* UCX_TLS for this context ("shm", "tcp", ...); NULL = environment/default */
} k3_xfer_ctx_opts_t;

/* Creates the UCX context and worker and starts polling its event fd on `loop`. Create it in
 * the process that uses it (never before fork()). Returns 0, K3_ETRANSPORT (UCX failed; logged
 * with the UCX status) or K3_ENOMEM. */
int k3_xfer_ctx_init(uv_loop_t *loop, const k3_xfer_ctx_opts_t *opts, k3_xfer_ctx_t **out);

/* Tears down: fails every send still running with K3_ESHUTDOWN (their callbacks run now),
 * waits for their device jobs (dev->release), closes endpoints, destroys the worker and context
 * and closes the loop handles. Every pool and receiver must have been freed first. The ctx
 * memory is freed in the handles' close callbacks, so run the loop once more (uv_run) after. */
void k3_xfer_ctx_close(k3_xfer_ctx_t *ctx);

/* The worker address for the control plane (bytes owned by ctx, valid until close). */
void k3_xfer_ctx_address(const k3_xfer_ctx_t *ctx, const uint8_t **addr, size_t *len);

/* True when this UCX build reports CUDA memory support (then device pools are registered with
 * UCX and the ucx-cuda path is possible; Debian's UCX says false). */
bool k3_xfer_ctx_cuda_capable(const k3_xfer_ctx_t *ctx);

/* Thread-safe (the only such function here): wakes the loop (uv_async_send), which then drives
 * the ctx: polls device jobs, advances sends and verifications. This is what device-job notify
 * callbacks call. Must not be called after k3_xfer_ctx_close returned. */
void k3_xfer_ctx_wake(k3_xfer_ctx_t *ctx);

/* Counters (monotonic, for metrics). */
typedef struct {
  uint64_t sends_ok, sends_failed, sends_timed_out;
  uint64_t bytes_put; /* sender: bytes handed on by finished sends, all paths */
  uint64_t done_accepted;
  uint64_t done_rejected_unknown;     /* K3_ENOENT: no live reservation for the request */
  uint64_t done_rejected_stale;       /* K3_ESTALE: epoch differs */
  uint64_t done_rejected_fingerprint; /* K3_EFINGERPRINT */
  uint64_t done_rejected_digest;      /* K3_EDIGEST */
  uint64_t done_rejected_malformed;   /* K3_EPROTO */
  uint64_t done_rejected_device;      /* K3_EDEVICE: a device job, or h2d (staged), failed */
  uint64_t leases_expired, reservations_cancelled, reservations_released;
  uint64_t slots_quarantined, slots_poisoned;
  uint64_t ep_errors;
  uint64_t layers_verified; /* layers verified as they landed (LAYER), before DONE */
  uint64_t data_dropped;    /* DATA chunks (rendezvous path) for no live reservation/epoch */
  uint64_t data_eager, data_rndv; /* DATA chunks placed from the message / by a rendezvous */
  uint64_t data_rejected_dev; /* eager DATA aimed at device memory: rejected, never memcpy'd */
  uint64_t dev_jobs;          /* device jobs submitted (sender copies/hashes, receiver hashes) */
  uint64_t dev_jobs_failed;   /* submit or job errors (the send / DONE fails with K3_EDEVICE) */
  uint64_t path_bytes[K3_XFER_PATH_COUNT]; /* sender: bytes handed on by finished sends, by path */
  uint64_t poison_skipped;    /* quarantined reservations in device pools, not poisoned */
  uint64_t pulls;             /* receiver: SRC messages accepted (cuda-pull sends served) */
  uint64_t pull_bytes;        /* receiver: bytes copied by its pull jobs */
  uint64_t pull_refused;      /* receiver: SRC messages refused (malformed, mismatch, unmappable) */
  uint64_t pull_fallbacks;    /* sender: cuda-pull sends the receiver could not map, redone as cuda-ipc */
} k3_xfer_stats_t;
void k3_xfer_ctx_stats(const k3_xfer_ctx_t *ctx, k3_xfer_stats_t *out);

/* ---- registered pools (receiver side) -------------------------------------------------- */

/* Allocates `bytes` of host memory through UCX (UCP_MEM_MAP_ALLOCATE: one-sided puts on shm need
 * no target progress, C-STACK.md P9, and a same-host sender maps it with ucp_rkey_ptr), faults
 * every page in and packs its rkey. Register pools once at start-up: this costs ~170 ms per
 * 256 MiB. Returns 0, K3_EINVAL (bytes 0), K3_ETRANSPORT, K3_ENOMEM; on error nothing is left. */
int k3_xfer_pool_alloc_host(k3_xfer_ctx_t *ctx, uint64_t bytes, k3_xfer_pool_t **out);
/* Registers memory someone else allocated (and keeps owning; it must outlive the pool):
 * - K3_XFER_MEM_HOST: ucp_mem_map of [base, base+bytes) and a packed rkey. Note (C-STACK P9):
 *   puts into such memory over shm/tcp need the receiver's progress; the am path does not care.
 * - K3_XFER_MEM_CUDA: device memory, never touched by k3_xfer. Registered with UCX (memory type
 *   CUDA, rkey packed) only when k3_xfer_ctx_cuda_capable(ctx); otherwise the pool has no rkey
 *   and only the blob lets a same-host sender reach it (cuda-ipc).
 * blob (0..K3_XFER_MAX_BLOB_BYTES, copied) is the opaque mapping blob every descriptor of this
 * pool carries (k3_xfer_dev_t map interprets it on the sender). Returns 0, K3_EINVAL,
 * K3_ETRANSPORT (UCX refused the registration, logged), K3_ENOMEM. */
int k3_xfer_pool_register(k3_xfer_ctx_t *ctx, void *base, uint64_t bytes, k3_xfer_mem_t mem,
                          const uint8_t *blob, uint32_t blob_len, k3_xfer_pool_t **out);
/* Unregisters (and, for alloc_host, frees) the pool. No reservation that references it may be
 * live. NULL is a no-op. */
void k3_xfer_pool_free(k3_xfer_pool_t *pool);
void *k3_xfer_pool_base(const k3_xfer_pool_t *pool); /* first byte (a device address for CUDA) */
uint64_t k3_xfer_pool_size(const k3_xfer_pool_t *pool);
k3_xfer_mem_t k3_xfer_pool_mem(const k3_xfer_pool_t *pool);
/* Packed rkey bytes (owned by the pool; len 0 when not registered with UCX). */
void k3_xfer_pool_rkey(const k3_xfer_pool_t *pool, const uint8_t **rkey, size_t *len);
/* The mapping blob (owned by the pool; len 0 when none). */
void k3_xfer_pool_blob(const k3_xfer_pool_t *pool, const uint8_t **blob, size_t *len);

/* ---- device hooks (supplied by the workers over their device services) ----------------- */

/* One piece of a region's byte stream: len bytes read at src (device address); when dst is not
 * NULL the same bytes are written to dst (device address, possibly a peer pool mapped here). */
typedef struct {
  const void *src;
  void *dst;
  uint64_t len;
} k3_xfer_seg_t;

/* How k3_xfer reaches device memory without touching it. Filled by the worker (over k3k_xdev,
 * fdshare and k3k_vmm, common/worker/xdev_hooks.c); k3_xfer copies the struct. All hooks are
 * called on the loop thread. */
typedef struct k3_xfer_dev {
  void *ud;
  /* Queues a job: region r's byte stream is segs[first[r]] .. segs[first[r+1] - 1] in order
   * (first has n_regions + 1 entries, first[0] == 0); computes each region's K3 digest
   * (k3pd/digest.h) of the bytes read at src, writing them to dst where dst is set. The arrays
   * are copied before return. notify(arg) runs once when the job is complete and its writes
   * are visible to other processes; it may run on another thread (k3_xfer passes a function
   * that only calls k3_xfer_ctx_wake, or NULL while its loop polls the job every turn: then no
   * notify is wanted). Returns 0 or K3_E*; on error notify never runs. */
  int (*submit)(void *ud, const k3_xfer_seg_t *segs, const uint32_t *first, uint32_t n_regions,
                void (*notify)(void *arg), void *arg, void **job);
  /* Non-blocking: 1 done (digests[n_regions] filled), 0 running, < 0 failed (K3_EDEVICE).
   * digests NULL: only whether it is done (writes complete and visible); the digests are
   * collected by a later poll with digests (cuda-ipc announces a layer before that). */
  int (*poll)(void *ud, void *job, uint64_t *digests);
  /* Frees a job after poll returned non-zero; a job still running is waited for first, and
   * its notify has run (or never will) when release returns. */
  void (*release)(void *ud, void *job);
  /* Maps a peer's pool on this host from its descriptor blob: *base = a local device pointer
   * to the pool's first byte (the hook caches mappings; they stay valid until the hook's owner
   * tears it down, after k3_xfer_ctx_close). `writable`: true when this process will write the
   * pool (cuda-ipc push: a sender maps the receiver's pool), false when it only reads it
   * (cuda-pull: a receiver maps the sender's source pool) — the hook must then map it read-only,
   * so no bug on this side can write a peer's state. A cached read-write mapping may answer a
   * read-only request; never the reverse. Called on the loop: a cached answer must be fast (the
   * first mapping of a peer may block briefly, bounded). Returns 0, K3_ENOTSUP / K3_EUNAVAIL
   * (not mappable here: another host or GPU, ...). NULL = never mappable. */
  int (*map)(void *ud, const uint8_t *blob, uint32_t blob_len, uint64_t size_bytes, bool writable, void **base);
} k3_xfer_dev_t;

/* ---- staging hooks for device memory (supplied by the model runner) -------------------- */

typedef struct {
  /* Sender: copy `len` bytes of region `region` starting at region byte `off` from device
   * memory into the pinned host buffer `dst` (the range may span several of the source's
   * units: it is cut by the receiver's units and chunk_bytes); complete when it returns 0. */
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
 * byte b is at base + offset + idx[b / unit] * stride + b % unit, or base + offset + b when idx
 * is NULL. With device sources (opts dev) or a staging d2h hook, `base` is never dereferenced
 * by k3_xfer: device jobs or d2h read it. */
typedef struct {
  const void *base;
  uint64_t stride_bytes;
  const uint32_t *idx; /* borrowed; must stay valid until the send completes */
  uint32_t n_idx;
  uint64_t offset_bytes;
  uint64_t unit_bytes;
} k3_xfer_src_t;

/* A device pool of the sender that a same-host receiver can map (cuda-pull): the allocation
 * holding device sources, exported by the caller's device services, and the blob by which the
 * receiver's dev->map reaches it (the same blob format as the receiver's pools carry). */
typedef struct {
  const void *base;    /* first byte (device address; never dereferenced by k3_xfer) */
  uint64_t size_bytes; /* the exported size */
  const uint8_t *blob; /* borrowed until the send completes */
  uint32_t blob_len;   /* 1..K3_XFER_MAX_BLOB_BYTES */
} k3_xfer_src_pool_t;

typedef struct {
  uint32_t deadline_ms;   /* whole operation, from start to ACK; 0 = 30000; clamped to the lease */
  uint64_t chunk_bytes;   /* max bytes per put/DATA message; 0 = 1 MiB (64 MiB on ucx-cuda) */
  uint32_t max_inflight;  /* puts/DATA messages in flight; 0 = 32 */
  const k3_xfer_stage_t *stage; /* non-NULL with d2h: staged path (copied) */
  /* Sources are device memory reached through these hooks (copied; the hooks' ud must outlive
   * the send). NULL: host sources (or staged through stage->d2h). */
  const k3_xfer_dev_t *dev;
  /* K3_XFER_PATH_AUTO (0) chooses; anything else forces that path or fails the start with
   * K3_ENOTSUP (logged with the reason) when it cannot serve this descriptor. */
  k3_xfer_path_t path;
  /* Host path: always ucp_put_nbx, never a mapped pointer nor DATA messages (one-sided puts on
   * an RDMA fabric; tests and comparisons). */
  bool puts_only;
  /* cuda-pull: the exported device pools the sources lie in (borrowed until completion; at most
   * K3_XFER_MAX_POOLS). With them, device sources and a receiver whose descriptor carries
   * K3_XFER_DESC_F_PULL (and whose pools dev->map maps here: the same host and GPU), AUTO picks
   * cuda-pull; every region's source must then lie inside one of these pools, else the push
   * paths are used (logged). The sources must stay unchanged until the callback (the receiver
   * reads them until it verified everything). */
  const k3_xfer_src_pool_t *src_pools;
  uint32_t n_src_pools;
} k3_xfer_send_opts_t;

/* Outcome of a send, passed to the completion callback. */
typedef struct {
  int status;           /* 0: receiver verified and accepted; else K3_E* (receiver's verdict
                           K3_ESTALE/K3_ENOENT/K3_EFINGERPRINT/K3_EDIGEST, or K3_ETIMEDOUT,
                           K3_ETRANSPORT, K3_ECANCELED, K3_ESHUTDOWN) */
  uint64_t request_id, epoch;
  k3_xfer_path_t path;  /* the path this send used (for the transfer-path metric) */
  uint64_t bytes;       /* bytes handed on (copied, put, sent, or submitted to device jobs) */
  uint64_t t_start_ns, t_last_layer_ns, t_flushed_ns, t_done_ns; /* k3_now_ns stamps */
  uint64_t kind_bytes[K3_XFER_KIND_COUNT];
  uint64_t kind_ns[K3_XFER_KIND_COUNT]; /* first put issued → last put completed, per kind */
} k3_xfer_send_result_t;

typedef void (*k3_xfer_send_cb)(void *ud, const k3_xfer_send_result_t *res);

/* Starts a send of `desc` (borrowed until completion) from srcs[desc->n_regions] (borrowed),
 * choosing the data path (logged at debug, k3_xfer_send_path):
 *   host sources (no dev):   HOST into host pools, STAGED with stage->d2h;
 *   device sources (dev):    STAGED into host pools (needs stage->d2h); into device pools
 *                            CUDA_PULL when the descriptor offers it (K3_XFER_DESC_F_PULL),
 *                            opts.src_pools cover every source and every pool maps here, else
 *                            CUDA_IPC when every pool has a blob that dev->map maps, else
 *                            UCX_CUDA when this ctx is cuda capable and every pool has an rkey;
 *   anything else (e.g. device to device with no mapping and no CUDA UCX, host sources into
 *   device pools, pools of mixed memory types): K3_ENOTSUP, with a log line saying why.
 * No bytes move until k3_xfer_send_layer_ready. The callback runs exactly once, after which
 * the handle is gone (device jobs cannot be cancelled: a failed send's memory lives on inside
 * the ctx until its jobs completed; none is submitted after the deadline). Returns 0, K3_EINVAL
 * (descriptor/sources mismatch, message logged), K3_ENOTSUP, K3_ETIMEDOUT (lease over),
 * K3_EUNAVAIL (cannot reach the receiver's address), K3_EPROTO (rkey rejected), K3_ENOMEM. */
int k3_xfer_send_start(k3_xfer_ctx_t *ctx, const k3_xfer_desc_t *desc, const k3_xfer_src_t *srcs,
                       const k3_xfer_send_opts_t *opts, k3_xfer_send_cb cb, void *ud,
                       k3_xfer_send_t **out);
/* Layer `layer` (< desc->n_layers) is final: hash and push its regions. Each layer once.
 * On cuda-pull the sender hashes the layer's sources with a device job (the producer's digest,
 * computed while later layers are produced) and announces it; the receiver pulls.
 * Returns 0, K3_EINVAL (bad/repeated layer) or the send's error if it already failed. */
int k3_xfer_send_layer_ready(k3_xfer_send_t *s, uint32_t layer);
/* The same, with the layer's digests already computed by the state's producer (digests[k] = the
 * K3 digest, k3pd/digest.h, of the k-th region of that layer in ascending region order, over
 * exactly the bytes its source holds): nothing is hashed here, the layer is announced at once.
 * On the other paths the digests are ignored (they hash what they move). Returns as above. */
int k3_xfer_send_layer_ready_digests(k3_xfer_send_t *s, uint32_t layer, const uint64_t *digests,
                                     uint32_t n_digests);
/* Regions of `layer` in the descriptor (the length k3_xfer_send_layer_ready_digests wants). */
uint32_t k3_xfer_send_layer_regions(const k3_xfer_send_t *s, uint32_t layer);
/* All layers signalled: after every put completes, flush, send DONE with the first sampled
 * token, and wait for the ACK. Returns 0 or K3_EINVAL (layers missing, called twice). */
int k3_xfer_send_finish(k3_xfer_send_t *s, uint32_t first_token, float first_logprob);
/* Aborts: the callback runs with K3_ECANCELED (from the loop). The endpoint is closed so no
 * queued put lands later. */
void k3_xfer_send_cancel(k3_xfer_send_t *s);
k3_xfer_path_t k3_xfer_send_path(const k3_xfer_send_t *s);
/* True when this send writes the receiver's pools directly through a UCX-mapped pointer
 * (ucp_rkey_ptr: same host, shm pools), hashing and copying each 4 KiB chunk in one pass with
 * streaming stores; false otherwise. */
bool k3_xfer_send_direct(const k3_xfer_send_t *s);
/* How the bytes move: "direct" (mapped pointer), "am" (DATA active messages: eager or
 * rendezvous, placed by the receiver; host path without mapping, e.g. tcp, and ucx-cuda),
 * "put" (ucp_put_nbx; only with puts_only) or "job" (cuda-ipc: device jobs write the mapped
 * pools). */
const char *k3_xfer_send_mode(const k3_xfer_send_t *s);
/* (mode "pull": cuda-pull, the receiver's jobs read the sender's exported pools.) */

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
  /* Fill quarantined host memory with 0xFF before release (default off). Regions in device
   * pools are not poisoned (k3_xfer has no device memset; counted in poison_skipped): epochs
   * and digests already keep a stale state from being admitted. */
  bool poison;
  const k3_xfer_stage_t *stage; /* non-NULL with h2d: staged path (copied) */
  /* Hooks for reservations in K3_XFER_MEM_CUDA pools (copied; ud must outlive the receiver):
   * they are verified by hash-only device jobs over the receiver's own memory (submit, poll,
   * release; map is not used). Reserving device pools without them is K3_EINVAL. */
  const k3_xfer_dev_t *dev;
  /* Test hook: called before each verification step of a live reservation whose epoch and
   * fingerprint matched (each LAYER announcement, then DONE if anything is left to hash; for
   * device pools, before the verification job is submitted); may modify memory (to prove
   * corruption is detected). NULL in production. */
  void (*test_before_verify)(void *ud, uint64_t request_id);
  /* MEASUREMENT ONLY (k3pd-xfer-bench --verify sender); the workers never set it. Regions in
   * device pools are NOT re-read: the digests the sender's copy kernel computed from the values
   * it stored (LAYER, DONE) are recorded as ours. Two HBM passes instead of three, but nothing
   * then checks what landed in our memory at our addresses: a wrong destination mapping or
   * address, a late write by a stale sender, or a visibility fault is admitted silently
   * (docs/transfer.md "Two passes"). Host regions are verified as always. */
  bool trust_sender_digests;
  /* Do not offer cuda-pull (K3_XFER_DESC_F_PULL) in descriptors even when the device hooks can
   * map a sender's pools (K3PD_XFER_PULL=0 in the environment does the same). Offered by
   * default when dev has submit, poll, release and map and the reservation is in device pools.
   * Regions pulled are never "trusted": the receiver's own job reads, writes and hashes them. */
  bool no_pull;
} k3_xfer_recv_opts_t;

/* One receiver per ctx (it owns the DONE handler). Returns 0, K3_EEXIST, K3_ENOMEM. */
int k3_xfer_recv_init(k3_xfer_ctx_t *ctx, const k3_xfer_recv_opts_t *opts, k3_xfer_recv_t **out);
/* Cancels every reservation (released immediately: the ctx is going away; device verification
 * jobs still running are waited for through dev->release) and frees. */
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
/* Cancels: an unfinished reservation goes to quarantine (on_release later, not before its
 * device verification jobs and rendezvous receives finished); a ready one is released now.
 * Returns 0 or K3_ENOENT. */
int k3_xfer_recv_cancel(k3_xfer_recv_t *r, uint64_t request_id);
/* Decode finished with a ready sequence: release now (on_release runs before this returns).
 * Returns 0, K3_ENOENT, K3_EINVAL (not ready: use cancel). */
int k3_xfer_recv_release(k3_xfer_recv_t *r, uint64_t request_id);
/* Reservations live + in quarantine (for leak checks). */
uint32_t k3_xfer_recv_live(const k3_xfer_recv_t *r);
uint32_t k3_xfer_recv_quarantined(const k3_xfer_recv_t *r);
/* STAGED when the receiver copies verified extents to the device (stage->h2d), else HOST;
 * the sender's path is the authoritative one (k3_xfer_send_result_t.path). */
k3_xfer_path_t k3_xfer_recv_path(const k3_xfer_recv_t *r);

#endif
