/* Private to k3_xfer: the structs shared by ctx.c, ep.c, pool.c, send*.c and recv*.c.
 *
 * Driving model: every UCX callback and every device-job notify only records facts (counters,
 * statuses, queued messages, a wake-up). All decisions — issuing more bytes, submitting and
 * polling device jobs, flushing, verifying a DONE, calling user callbacks — happen in
 * xf_drive(), which runs on the loop outside any UCX callback: from the worker's event-fd poll,
 * from the async handle device jobs wake, from an idle handle while work is pending, from a
 * timer, and after API calls. This keeps UCX callbacks re-entrancy free and lets user callbacks
 * call back into the API. The one exception is DATA (recv_data.c): a rendezvous receive must be
 * started inside the AM callback; it writes only into a live reservation's own memory and calls
 * no user callback. */
#ifndef K3PD_XFER_INT_H
#define K3PD_XFER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <ucp/api/ucp.h>
#include <uv.h>

#include "k3pd/digest.h"
#include "k3pd/xfer.h"
#include "wire.h"

#define XF_RKEY_CACHE 16  /* unreferenced unpacked rkeys kept per endpoint */
/* While a send or a live reservation is waiting for the peer, the loop also progresses the
 * worker at least this often: under load a shm wake-up was seen lost once in a few dozen
 * bench runs (UCX 1.13 mm transports), which stalled a transfer until its deadline. */
#define XF_TICK_NS (10ull * 1000000ull)
/* A cuda-ipc send keeps the loop polling this long after its DONE (spin_jobs): the receiver's
 * verification of an 8K-token state takes ~0.3 ms, and an ACK picked up by the poll arrives
 * tens of us before one that wakes the loop through the shm signal and epoll. */
#define XF_ACK_SPIN_NS (2ull * 1000000ull)

/* An unpacked remote key, cached per endpoint: unpacking a shm rkey attaches (maps) the
 * receiver's segment, and destroying it detaches it again, so a fresh unpack per send paid a
 * page fault per 4 KiB of the receiver's pool on every transfer (measured: most of the shm
 * time). Owned by the endpoint; a send holds a reference while it uses it. */
typedef struct xf_rkey {
  struct xf_rkey *next;
  uint8_t *packed;
  size_t len;
  ucp_rkey_h h; /* NULL once the endpoint is closed */
  uint32_t refs;
} xf_rkey_t;

/* Cached endpoint to one peer worker address. Referenced by sends (and ACK replies); a failed
 * endpoint leaves the cache at once and is closed when its last reference goes. */
typedef struct xf_ep {
  struct xf_ep *next;
  k3_xfer_ctx_t *ctx;
  ucp_ep_h ep;
  uint8_t *addr;
  size_t addr_len;
  uint32_t refs;
  bool failed;   /* error handler ran, or torn down on purpose */
  bool in_cache;
  bool closed;   /* ucp endpoint closed; the struct lives until refs == 0 */
  xf_rkey_t *rkeys; /* unpacked rkeys of this peer's pools */
} xf_ep_t;

/* A queued incoming active message (copied out of the UCX callback). */
typedef struct xf_msg {
  struct xf_msg *next;
  size_t len;
  uint8_t data[];
} xf_msg_t;

struct k3_xfer_ctx {
  uv_loop_t *loop;
  uv_poll_t poll;  /* worker event fd */
  uv_idle_t idle;  /* keeps driving while work is pending, without blocking in epoll */
  uv_timer_t timer; /* earliest deadline of sends and reservations */
  uv_async_t async; /* k3_xfer_ctx_wake: device jobs completing on other threads */
  ucp_context_h ucp;
  ucp_worker_h worker;
  ucp_address_t *addr;
  size_t addr_len;
  bool cuda_capable;
  bool in_drive, drive_again, closing;
  bool api_drive; /* inside xf_drive_api: no user callback may run */
  bool no_peer_mode; /* peer error mode left no AM transport (shm): endpoints use NONE */
  bool trace;        /* K3PD_XFER_TRACE set: xf_trace lines on stderr */
  /* While a device job of ours runs, keep driving from the idle handle (poll its event every
   * loop turn) instead of sleeping until its notify: the notify travels a CUDA host-function
   * callback (which also holds the next job on the stream), a driver thread and uv_async.
   * Jobs are then submitted without a notify. Jobs are short (bounded by one state's copy,
   * ~0.4 ms for an 8K-token K3 state on an H200), so the spin is too. K3PD_XFER_SPIN=0: no
   * spin, jobs notify. */
  bool spin_jobs;
  uint32_t jobs_running; /* device jobs of this ctx submitted and not yet seen finished */
  bool spin_ack;         /* a cuda-ipc send sent DONE < XF_ACK_SPIN_NS ago: poll for its ACK */
  bool pull_off;          /* K3PD_XFER_PULL=0: never send or offer cuda-pull */
  int last_path;          /* the path of the previous send (-1: none yet), for the info line */
  uint64_t pull_job_bytes; /* K3PD_XFER_PULL_JOB_MIB: a receiver's pull job covers ~this (0: one job) */
  uint64_t job_max_bytes; /* K3PD_XFER_JOB_MIB: a sender's job covers at most ~this (0: no cap) */
  uint32_t handles_open; /* uv handles still to close before the ctx memory goes */
  k3_xfer_stats_t stats;
  xf_ep_t *eps;                 /* cached endpoints (in_cache) */
  k3_xfer_send_t *sends;        /* live and draining sends */
  k3_xfer_recv_t *recv;         /* at most one */
  xf_msg_t *done_q, **done_tail; /* DONE messages for recv */
  xf_msg_t *ack_q, **ack_tail;   /* ACK messages for sends */
  xf_msg_t *layer_q, **layer_tail; /* LAYER messages for recv (per-layer digests) */
  struct xf_rx *rx;             /* rendezvous receives in flight (recv_data.c), freed at close */
  uint64_t next_send_id;
};

struct k3_xfer_pool {
  k3_xfer_ctx_t *ctx;
  ucp_mem_h memh; /* NULL when UCX did not register it (device memory without CUDA UCX) */
  void *base;     /* a device address when mem is K3_XFER_MEM_CUDA: never dereferenced */
  uint64_t size;
  k3_xfer_mem_t mem;
  void *rkey; /* packed, from ucp_rkey_pack; NULL when memh is NULL */
  size_t rkey_len;
  uint8_t *blob; /* owned copy of the mapping blob, or NULL */
  uint32_t blob_len;
};

/* desc.c: like k3_xfer_region_locate, but a run goes on across consecutive indices whose
 * units sit back to back (stride == unit, e.g. a request's pages inside an arena tensor), up to
 * max bytes: fewer, larger copies, segments and DATA messages. Returns the run's bytes (> 0). */
uint64_t xf_region_run(const k3_xfer_desc_t *d, uint32_t region, uint64_t off, uint64_t max,
                       uint64_t *pool_off);

/* ctx.c; endpoints, rkeys and eager AMs: ep.c */
void xf_drive(k3_xfer_ctx_t *ctx);        /* run now unless already inside a drive */
void xf_drive_api(k3_xfer_ctx_t *ctx);    /* from API calls: moves data, fires nothing */
void xf_rearm_timer(k3_xfer_ctx_t *ctx);  /* after any deadline changed */
void xf_drive_soon(k3_xfer_ctx_t *ctx);   /* a drive on the loop's next turn; nothing now */
void xf_notify_wake(void *arg);           /* device-job notify: arg is the ctx; any thread */
/* The notify to give a device job: NULL while spin_jobs (the loop polls every running job each
 * turn, so a host-function callback would only delay the next job on the stream), else
 * xf_notify_wake. */
static inline void (*xf_job_notify(const k3_xfer_ctx_t *ctx))(void *) { return ctx->spin_jobs ? NULL : xf_notify_wake; }
/* Returns a referenced endpoint for addr (cached or new) or NULL (error logged). */
xf_ep_t *xf_ep_get(k3_xfer_ctx_t *ctx, const uint8_t *addr, size_t len);
void xf_ep_put(xf_ep_t *e);          /* drop a reference; closes a failed ep at zero */
/* Tear down: leaves the cache, sends on it fail, the UCP ep is force-closed now; the struct is
 * freed at once if unreferenced, else by the last xf_ep_put. Never call from a UCX callback. */
void xf_ep_fail(xf_ep_t *e);
/* A referenced unpacked rkey for `packed` on e (cached), or NULL with *st set. */
xf_rkey_t *xf_rkey_get(xf_ep_t *e, const uint8_t *packed, size_t len, ucs_status_t *st);
void xf_rkey_put(xf_ep_t *e, xf_rkey_t *k);
/* Fire-and-forget eager AM on e. Takes ownership of the malloc'd `data` (freed when UCX is done
 * with it, also on error). Returns 0 or K3_ETRANSPORT. */
int xf_am_send(xf_ep_t *e, unsigned id, void *data, size_t len);
const char *xf_ucs_str(ucs_status_t st);
/* K3PD_XFER_TRACE=1: one stderr line per protocol step ("xfer-trace <pid> <k3_now_ns in us>
 * ..."), monotonic clock shared by the processes of one host, so a sender's and a receiver's
 * lines merge into one timeline (k3pd-xfer-bench on the GPU host). Off: one branch. */
void xf_trace(const k3_xfer_ctx_t *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define XF_TRACE(ctx, ...)                 \
  do {                                     \
    if ((ctx)->trace) xf_trace(ctx, __VA_ARGS__); \
  } while (0)

/* send*.c, called by ctx.c */
uint64_t xf_send_pump(k3_xfer_ctx_t *ctx, uint64_t now_ns, uint64_t *next_deadline_ns); /* work done */
void xf_send_on_ack(k3_xfer_ctx_t *ctx, const uint8_t *msg, size_t len);
void xf_send_on_ep_failed(k3_xfer_ctx_t *ctx, xf_ep_t *e);
void xf_send_shutdown_all(k3_xfer_ctx_t *ctx);

/* recv*.c, called by ctx.c */
uint64_t xf_recv_pump(k3_xfer_recv_t *r, uint64_t now_ns, uint64_t *next_deadline_ns);
int xf_recv_on_done(k3_xfer_recv_t *r, const uint8_t *msg, size_t len);
/* LAYER/DONE return 1 when the message must wait (its data is still landing, or device
 * verification of the reservation is running), else 0. */
int xf_recv_on_layer(k3_xfer_recv_t *r, const uint8_t *msg, size_t len);
/* DATA, called from inside the UCX AM callback (it must start the rendezvous receive there):
 * writes the chunk into the live reservation's own memory or drops it. No user callback. */
void xf_recv_on_data(k3_xfer_ctx_t *ctx, const void *hdr, size_t hdr_len, void *data, size_t len,
                     const ucp_am_recv_param_t *param);
void xf_recv_rx_free_all(k3_xfer_ctx_t *ctx); /* ctx close: records of cancelled receives */

#endif
