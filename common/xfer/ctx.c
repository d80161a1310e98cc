/* The transfer context: UCX context + worker on a libuv loop, the drive loop, and the
 * active-message dispatch.
 *
 * What it is for: one per process/loop. Progress is event driven (C-STACK.md §4): the worker's
 * event fd is polled by uv_poll; on readiness we progress until idle, then pump the senders and
 * the receiver, then ucp_worker_arm; UCS_ERR_BUSY means more events arrived, so go round again.
 * A bounded number of rounds runs per callback; if work remains an idle handle keeps the loop
 * spinning so other handles still get turns. Device jobs finish on other threads: their notify
 * only calls k3_xfer_ctx_wake (uv_async_send), and the async handle drives like the poll does.
 * A timer covers the earliest deadline and a 10 ms tick while anything waits on a peer or a job.
 *
 * What it is not: the sender or receiver logic (send*.c, recv*.c), endpoints (ep.c), pools
 * (pool.c) or the message codecs (wire.c).
 *
 * Invariants: xf_drive never nests (a drive requested inside one sets drive_again); user
 * callbacks run only from drives the loop started (never from xf_drive_api); the ctx memory is
 * freed in the last loop handle's close callback. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "xfer_int.h"

#define DRIVE_ROUNDS 64

static void idle_cb(uv_idle_t *h);
static void timer_cb(uv_timer_t *h);

const char *xf_ucs_str(ucs_status_t st) { return ucs_status_string(st); }

void xf_trace(const k3_xfer_ctx_t *ctx, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "xfer-trace %d %.1f %s\n", (int)getpid(), (double)k3_now_ns() / 1e3, line);
  (void)ctx;
}

static const char *const PATH_NAMES[K3_XFER_PATH_COUNT] = {"auto", "host", "staged", "cuda-ipc",
                                                          "ucx-cuda", "cuda-pull"};

const char *k3_xfer_path_name(k3_xfer_path_t path) {
  return (unsigned)path < K3_XFER_PATH_COUNT ? PATH_NAMES[path] : "?";
}

int k3_xfer_path_parse(const char *s) {
  for (int i = 0; s && i < K3_XFER_PATH_COUNT; i++)
    if (strcmp(s, PATH_NAMES[i]) == 0) return i;
  return -1;
}

static void msg_push(xf_msg_t ***tail, const void *data, size_t len) {
  xf_msg_t *m = malloc(sizeof *m + len);
  if (!m) {
    K3_ERROR("xfer: out of memory queueing a %zu-byte message; dropped", len);
    return;
  }
  m->next = NULL;
  m->len = len;
  memcpy(m->data, data, len);
  **tail = m;
  *tail = &m->next;
}

/* AM callbacks: copy the eager payload out (valid only during the callback) and return. */
static ucs_status_t am_cb(void *arg, const void *header, size_t header_len, void *data,
                          size_t len, const ucp_am_recv_param_t *param, xf_msg_t ***tail) {
  k3_xfer_ctx_t *ctx = arg;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    /* Control messages are sent with UCP_AM_SEND_FLAG_EAGER; a rendezvous one is not ours. */
    ctx->stats.done_rejected_malformed++;
    return UCS_OK;
  }
  msg_push(tail, data, len);
  ctx->drive_again = true;
  return UCS_OK;
}
static ucs_status_t am_done_cb(void *arg, const void *h, size_t hl, void *d, size_t l,
                               const ucp_am_recv_param_t *p) {
  return am_cb(arg, h, hl, d, l, p, &((k3_xfer_ctx_t *)arg)->done_tail);
}
static ucs_status_t am_ack_cb(void *arg, const void *h, size_t hl, void *d, size_t l,
                              const ucp_am_recv_param_t *p) {
  return am_cb(arg, h, hl, d, l, p, &((k3_xfer_ctx_t *)arg)->ack_tail);
}
static ucs_status_t am_layer_cb(void *arg, const void *h, size_t hl, void *d, size_t l,
                                const ucp_am_recv_param_t *p) {
  return am_cb(arg, h, hl, d, l, p, &((k3_xfer_ctx_t *)arg)->layer_tail);
}
/* DATA is the exception to "record only": a rendezvous receive has to be started (or the data
 * copied) inside the callback. recv_data.c does that and nothing else (no user callback). */
static ucs_status_t am_data_cb(void *arg, const void *h, size_t hl, void *d, size_t l,
                               const ucp_am_recv_param_t *p) {
  k3_xfer_ctx_t *ctx = arg;
  xf_recv_on_data(ctx, h, hl, d, l, p);
  ctx->drive_again = true;
  return UCS_OK;
}

static void drain_queues(k3_xfer_ctx_t *ctx) {
  uint32_t n_msg[2] = {0, 0}, n_wait[2] = {0, 0};
  while (ctx->ack_q) {
    xf_msg_t *m = ctx->ack_q;
    ctx->ack_q = m->next;
    if (!ctx->ack_q) ctx->ack_tail = &ctx->ack_q;
    xf_send_on_ack(ctx, m->data, m->len);
    free(m);
  }
  /* LAYER before DONE: a DONE then finds its earlier layers verified already. A message whose
   * data is still landing (rendezvous path) goes back to the queue for a later drive; the
   * lease bounds how long (an expired reservation answers it). */
  for (int q = 0; q < 2; q++) {
    xf_msg_t **head = q ? &ctx->done_q : &ctx->layer_q, ***tail = q ? &ctx->done_tail : &ctx->layer_tail;
    xf_msg_t *m = *head, *keep = NULL, **keep_tail = &keep;
    *head = NULL;
    *tail = head;
    while (m) {
      xf_msg_t *nx = m->next;
      int wait = 0;
      if (!ctx->recv) {
        if (q) ctx->stats.done_rejected_unknown++;
      } else {
        wait = q ? xf_recv_on_done(ctx->recv, m->data, m->len) : xf_recv_on_layer(ctx->recv, m->data, m->len);
      }
      n_msg[q]++;
      n_wait[q] += wait != 0;
      if (wait) {
        m->next = NULL;
        *keep_tail = m;
        keep_tail = &m->next;
      } else {
        free(m);
      }
      m = nx;
    }
    if (keep) { /* waiting ones first, then anything that arrived meanwhile */
      *keep_tail = *head;
      if (!*head) *tail = keep_tail;
      *head = keep;
    }
  }
  if (n_msg[0] > n_wait[0] || n_msg[1] > n_wait[1])
    XF_TRACE(ctx, "recv: drained %u LAYER (%u wait), %u DONE (%u wait)", n_msg[0], n_wait[0], n_msg[1], n_wait[1]);
}

static uint64_t pump_all(k3_xfer_ctx_t *ctx, uint64_t *next_deadline) {
  uint64_t now = k3_now_ns(), work = 0;
  *next_deadline = UINT64_MAX;
  if (!ctx->api_drive) drain_queues(ctx);
  work += xf_send_pump(ctx, now, next_deadline);
  if (ctx->recv && !ctx->api_drive) work += xf_recv_pump(ctx->recv, now, next_deadline);
  return work;
}

static void arm_timer(k3_xfer_ctx_t *ctx, uint64_t next_deadline) {
  if (ctx->closing) return;
  if (next_deadline == UINT64_MAX) {
    uv_timer_stop(&ctx->timer);
    return;
  }
  uint64_t now = k3_now_ns();
  uint64_t ms = next_deadline > now ? (next_deadline - now + 999999) / 1000000 : 0;
  uv_timer_start(&ctx->timer, timer_cb, ms, 0);
}

void xf_drive(k3_xfer_ctx_t *ctx) {
  if (ctx->in_drive) {
    ctx->drive_again = true;
    return;
  }
  if (ctx->closing) return;
  ctx->in_drive = true;
  uint64_t next_deadline = UINT64_MAX;
  bool pending = true;
  /* An API call (e.g. layer_ready) does one round: it starts that layer's bytes moving (a
   * direct copy is bounded per round) and returns to the caller; the loop does the rest. */
  int rounds = ctx->api_drive ? 1 : DRIVE_ROUNDS;
  for (int round = 0; round < rounds; round++) {
    ctx->drive_again = false;
    while (ucp_worker_progress(ctx->worker)) {
    }
    uint64_t work = pump_all(ctx, &next_deadline);
    if (work || ctx->drive_again) continue;
    ucs_status_t st = ucp_worker_arm(ctx->worker);
    if (st == UCS_ERR_BUSY) continue;
    if (st != UCS_OK) K3_WARN("xfer: ucp_worker_arm: %s", xf_ucs_str(st));
    pending = false;
    break;
  }
  ctx->in_drive = false;
  /* Still busy after the bounded rounds: let the loop breathe, come back from idle. A device
   * job running: come back from idle too and poll it (spin_jobs). */
  if (ctx->spin_jobs && (ctx->jobs_running || ctx->spin_ack)) pending = true;
  if (pending) uv_idle_start(&ctx->idle, idle_cb);
  else uv_idle_stop(&ctx->idle);
  arm_timer(ctx, next_deadline);
}

/* From API calls: start puts/flushes at once (so layer_ready overlaps compute), but run no
 * user callback inside the caller's call: incoming messages, verdicts and lease expiries wait
 * for the loop's drive, which the idle handle schedules for the next loop iteration. */
void xf_drive_api(k3_xfer_ctx_t *ctx) {
  if (ctx->in_drive || ctx->closing) {
    ctx->drive_again = true;
    return;
  }
  ctx->api_drive = true;
  xf_drive(ctx);
  ctx->api_drive = false;
  if (!ctx->closing) uv_idle_start(&ctx->idle, idle_cb);
}

void xf_rearm_timer(k3_xfer_ctx_t *ctx) { xf_drive_api(ctx); }

void xf_drive_soon(k3_xfer_ctx_t *ctx) {
  if (ctx->in_drive) ctx->drive_again = true;
  else if (!ctx->closing) uv_idle_start(&ctx->idle, idle_cb);
}

static void poll_cb(uv_poll_t *h, int status, int events) {
  k3_xfer_ctx_t *ctx = h->data;
  if (status < 0) K3_WARN("xfer: worker fd poll: %s", uv_strerror(status));
  xf_drive(ctx);
}
static void idle_cb(uv_idle_t *h) { xf_drive(h->data); }
static void timer_cb(uv_timer_t *h) { xf_drive(h->data); }
static void async_cb(uv_async_t *h) { xf_drive(h->data); }

void k3_xfer_ctx_wake(k3_xfer_ctx_t *ctx) { uv_async_send(&ctx->async); }
void xf_notify_wake(void *arg) {
  k3_xfer_ctx_t *ctx = arg;
  XF_TRACE(ctx, "device job notify (driver thread)");
  k3_xfer_ctx_wake(ctx);
}

int k3_xfer_ctx_init(uv_loop_t *loop, const k3_xfer_ctx_opts_t *opts, k3_xfer_ctx_t **out) {
  k3_xfer_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return K3_ENOMEM;
  ctx->loop = loop;
  ctx->done_tail = &ctx->done_q;
  ctx->ack_tail = &ctx->ack_q;
  ctx->layer_tail = &ctx->layer_q;
  ctx->next_send_id = ((uint64_t)k3_wall_ms() << 20) ^ (uint64_t)getpid();
  const char *tr = getenv("K3PD_XFER_TRACE");
  ctx->trace = tr && *tr && strcmp(tr, "0") != 0;
  const char *sp = getenv("K3PD_XFER_SPIN");
  ctx->spin_jobs = !(sp && !strcmp(sp, "0"));
  const char *jm = getenv("K3PD_XFER_JOB_MIB");
  ctx->job_max_bytes = jm && *jm ? strtoull(jm, NULL, 10) << 20 : 0;
  const char *pl = getenv("K3PD_XFER_PULL");
  ctx->pull_off = pl && !strcmp(pl, "0");
  const char *pj = getenv("K3PD_XFER_PULL_JOB_MIB");
  if (pj && *pj) { /* MiB, or KiB with a K suffix (tests) */
    char *end = NULL;
    unsigned long long n = strtoull(pj, &end, 10);
    ctx->pull_job_bytes = end && (*end == 'K' || *end == 'k') ? n << 10 : n << 20;
  }
  ctx->last_path = -1;
  ucp_config_t *cfg = NULL;
  ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
  if (st != UCS_OK) goto ucx_err;
  if (opts && opts->tls) {
    st = ucp_config_modify(cfg, "TLS", opts->tls);
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      K3_ERROR("xfer: UCX_TLS=%s rejected: %s", opts->tls, xf_ucs_str(st));
      free(ctx);
      return K3_EINVAL;
    }
  }
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                    .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                    .mt_workers_shared = 0};
  st = ucp_init(&p, cfg, &ctx->ucp);
  ucp_config_release(cfg);
  if (st != UCS_OK) goto ucx_err;
  ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  if (ucp_context_query(ctx->ucp, &ca) == UCS_OK)
    ctx->cuda_capable = (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  st = ucp_worker_create(ctx->ucp, &wp, &ctx->worker);
  if (st != UCS_OK) goto ucx_err_ctx;
  st = ucp_worker_get_address(ctx->worker, &ctx->addr, &ctx->addr_len);
  if (st != UCS_OK) goto ucx_err_worker;
  ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                             UCP_AM_HANDLER_PARAM_FIELD_CB |
                                             UCP_AM_HANDLER_PARAM_FIELD_ARG,
                               .id = XF_AM_DONE, .cb = am_done_cb, .arg = ctx};
  st = ucp_worker_set_am_recv_handler(ctx->worker, &ap);
  if (st != UCS_OK) goto ucx_err_addr;
  ap.id = XF_AM_ACK;
  ap.cb = am_ack_cb;
  st = ucp_worker_set_am_recv_handler(ctx->worker, &ap);
  if (st != UCS_OK) goto ucx_err_addr;
  ap.id = XF_AM_LAYER;
  ap.cb = am_layer_cb;
  st = ucp_worker_set_am_recv_handler(ctx->worker, &ap);
  if (st != UCS_OK) goto ucx_err_addr;
  /* SRC shares LAYER's queue: handled in arrival order, before the LAYERs that need it. */
  ap.id = XF_AM_SRC;
  ap.cb = am_layer_cb;
  st = ucp_worker_set_am_recv_handler(ctx->worker, &ap);
  if (st != UCS_OK) goto ucx_err_addr;
  ap.id = XF_AM_DATA;
  ap.cb = am_data_cb;
  st = ucp_worker_set_am_recv_handler(ctx->worker, &ap);
  if (st != UCS_OK) goto ucx_err_addr;
  int efd = -1;
  st = ucp_worker_get_efd(ctx->worker, &efd);
  if (st != UCS_OK) goto ucx_err_addr;
  int rc = uv_poll_init(loop, &ctx->poll, efd);
  if (rc) {
    K3_ERROR("xfer: uv_poll_init on the UCX event fd: %s", uv_strerror(rc));
    ucp_worker_release_address(ctx->worker, ctx->addr);
    ucp_worker_destroy(ctx->worker);
    ucp_cleanup(ctx->ucp);
    free(ctx);
    return K3_ETRANSPORT;
  }
  uv_idle_init(loop, &ctx->idle);
  uv_timer_init(loop, &ctx->timer);
  uv_async_init(loop, &ctx->async, async_cb);
  ctx->poll.data = ctx->idle.data = ctx->timer.data = ctx->async.data = ctx;
  ctx->handles_open = 4;
  uv_poll_start(&ctx->poll, UV_READABLE, poll_cb);
  xf_drive(ctx); /* arms the worker before the first uv_run */
  K3_INFO("xfer: UCX worker ready (tls=%s, address %zu bytes, cuda memory %s)",
          opts && opts->tls ? opts->tls : "default", ctx->addr_len, ctx->cuda_capable ? "yes" : "no");
  *out = ctx;
  return 0;

ucx_err_addr:
  ucp_worker_release_address(ctx->worker, ctx->addr);
ucx_err_worker:
  ucp_worker_destroy(ctx->worker);
ucx_err_ctx:
  ucp_cleanup(ctx->ucp);
ucx_err:
  K3_ERROR("xfer: UCX initialisation failed: %s", xf_ucs_str(st));
  free(ctx);
  return K3_ETRANSPORT;
}

static void close_cb(uv_handle_t *h) {
  k3_xfer_ctx_t *ctx = h->data;
  if (--ctx->handles_open == 0) free(ctx);
}

void k3_xfer_ctx_close(k3_xfer_ctx_t *ctx) {
  if (!ctx || ctx->closing) return;
  K3_ASSERT(ctx->recv == NULL);
  xf_send_shutdown_all(ctx);
  ctx->closing = true;
  K3_ASSERT(ctx->eps == NULL); /* xf_send_shutdown_all failed and released every endpoint */
  for (int i = 0; i < 3; i++) {
    xf_msg_t **q = i == 0 ? &ctx->ack_q : i == 1 ? &ctx->done_q : &ctx->layer_q;
    while (*q) {
      xf_msg_t *m = *q;
      *q = m->next;
      free(m);
    }
  }
  uv_poll_stop(&ctx->poll);
  ucp_worker_release_address(ctx->worker, ctx->addr);
  ucp_worker_destroy(ctx->worker);
  xf_recv_rx_free_all(ctx);
  ucp_cleanup(ctx->ucp);
  uv_close((uv_handle_t *)&ctx->poll, close_cb);
  uv_close((uv_handle_t *)&ctx->idle, close_cb);
  uv_close((uv_handle_t *)&ctx->timer, close_cb);
  uv_close((uv_handle_t *)&ctx->async, close_cb); /* no job can notify any more: all released */
}

void k3_xfer_ctx_address(const k3_xfer_ctx_t *ctx, const uint8_t **addr, size_t *len) {
  *addr = (const uint8_t *)ctx->addr;
  *len = ctx->addr_len;
}
bool k3_xfer_ctx_cuda_capable(const k3_xfer_ctx_t *ctx) { return ctx->cuda_capable; }
void k3_xfer_ctx_stats(const k3_xfer_ctx_t *ctx, k3_xfer_stats_t *out) { *out = ctx->stats; }

