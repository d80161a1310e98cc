/* UCX context + worker on a libuv loop, the endpoint cache and the active-message dispatch.
 *
 * What it is for: one per process/loop. Progress is event driven (C-STACK.md §4): the worker's
 * event fd is polled by uv_poll; on readiness we progress until idle, then pump the senders and
 * the receiver, then ucp_worker_arm; UCS_ERR_BUSY means more events arrived, so go round again.
 * A bounded number of rounds runs per callback; if work remains an idle handle keeps the loop
 * spinning so other handles still get turns.
 *
 * What it is not: the sender or receiver logic (send.c, recv.c). Endpoints are created with
 * peer error handling so a dead peer surfaces as an error callback, never a hang. */
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

const char *k3_xfer_path_name(k3_xfer_path_t path) {
  switch (path) {
  case K3_XFER_PATH_STAGED: return "staged";
  case K3_XFER_PATH_CUDA_DIRECT: return "cuda-direct";
  default: return "host";
  }
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
 * copied) inside the callback. recv.c does that and nothing else (no user callback). */
static ucs_status_t am_data_cb(void *arg, const void *h, size_t hl, void *d, size_t l,
                               const ucp_am_recv_param_t *p) {
  k3_xfer_ctx_t *ctx = arg;
  xf_recv_on_data(ctx, h, hl, d, l, p);
  ctx->drive_again = true;
  return UCS_OK;
}

static void drain_queues(k3_xfer_ctx_t *ctx) {
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
  /* Still busy after the bounded rounds: let the loop breathe, come back from idle. */
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

static void poll_cb(uv_poll_t *h, int status, int events) {
  k3_xfer_ctx_t *ctx = h->data;
  if (status < 0) K3_WARN("xfer: worker fd poll: %s", uv_strerror(status));
  xf_drive(ctx);
}
static void idle_cb(uv_idle_t *h) { xf_drive(h->data); }
static void timer_cb(uv_timer_t *h) { xf_drive(h->data); }

int k3_xfer_ctx_init(uv_loop_t *loop, const k3_xfer_ctx_opts_t *opts, k3_xfer_ctx_t **out) {
  k3_xfer_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return K3_ENOMEM;
  ctx->loop = loop;
  ctx->done_tail = &ctx->done_q;
  ctx->ack_tail = &ctx->ack_q;
  ctx->layer_tail = &ctx->layer_q;
  ctx->next_send_id = ((uint64_t)k3_wall_ms() << 20) ^ (uint64_t)getpid();
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
  ctx->poll.data = ctx->idle.data = ctx->timer.data = ctx;
  ctx->handles_open = 3;
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

/* Closes the UCP endpoint (forced: queued operations complete as cancelled) without freeing
 * the struct, which sends may still reference. Bounded wait, so teardown never hangs. */
static void ep_close_ucp(xf_ep_t *e) {
  if (e->closed) return;
  e->closed = true;
  for (xf_rkey_t *k = e->rkeys; k; k = k->next)
    if (k->h) {
      ucp_rkey_destroy(k->h);
      k->h = NULL;
    }
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
  ucs_status_ptr_t req = ucp_ep_close_nbx(e->ep, &p);
  if (UCS_PTR_IS_PTR(req)) {
    uint64_t until = k3_now_ns() + 1000000000ull;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && k3_now_ns() < until)
      ucp_worker_progress(e->ctx->worker);
    ucp_request_free(req);
  }
}

static void ep_destroy(xf_ep_t *e) {
  ep_close_ucp(e);
  while (e->rkeys) {
    xf_rkey_t *k = e->rkeys;
    e->rkeys = k->next;
    free(k->packed);
    free(k);
  }
  free(e->addr);
  free(e);
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
}

void k3_xfer_ctx_address(const k3_xfer_ctx_t *ctx, const uint8_t **addr, size_t *len) {
  *addr = (const uint8_t *)ctx->addr;
  *len = ctx->addr_len;
}
bool k3_xfer_ctx_cuda_capable(const k3_xfer_ctx_t *ctx) { return ctx->cuda_capable; }
void k3_xfer_ctx_stats(const k3_xfer_ctx_t *ctx, k3_xfer_stats_t *out) { *out = ctx->stats; }

/* ---- endpoints ---------------------------------------------------------------------------- */

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st) {
  xf_ep_t *e = arg;
  K3_WARN("xfer: endpoint to peer failed: %s", xf_ucs_str(st));
  e->ctx->stats.ep_errors++;
  e->ctx->drive_again = true;
  /* Only record it here; sends are failed and the ep closed from xf_ep_fail on the loop. */
  if (!e->failed) {
    e->failed = true;
    xf_send_on_ep_failed(e->ctx, e);
  }
}

xf_ep_t *xf_ep_get(k3_xfer_ctx_t *ctx, const uint8_t *addr, size_t len) {
  for (xf_ep_t *e = ctx->eps; e; e = e->next)
    if (!e->failed && e->addr_len == len && memcmp(e->addr, addr, len) == 0) {
      e->refs++;
      return e;
    }
  xf_ep_t *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->addr = malloc(len);
  if (!e->addr) {
    free(e);
    return NULL;
  }
  memcpy(e->addr, addr, len);
  e->addr_len = len;
  e->ctx = ctx;
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
                        .address = (const ucp_address_t *)e->addr,
                        .err_mode = ctx->no_peer_mode ? UCP_ERR_HANDLING_MODE_NONE
                                                      : UCP_ERR_HANDLING_MODE_PEER,
                        .err_handler = {.cb = ep_err_cb, .arg = e}};
  ucs_status_t st = ucp_ep_create(ctx->worker, &ep, &e->ep);
  if (st == UCS_ERR_UNREACHABLE && !ctx->no_peer_mode) {
    ctx->no_peer_mode = true; /* learned once per process: UCX logs the refusal once */
    /* UCX 1.13 shm transports (posix/sysv) have no peer-failure support, so peer error mode
     * leaves no AM transport. Fall back to no error handling: a dead peer then surfaces as the
     * send's deadline (the ACK never comes), still never a hang. */
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(ctx->worker, &ep, &e->ep);
    if (st == UCS_OK) K3_DEBUG("xfer: endpoint without peer failure detection (shm)");
  }
  if (st != UCS_OK) {
    K3_ERROR("xfer: ucp_ep_create: %s", xf_ucs_str(st));
    free(e->addr);
    free(e);
    return NULL;
  }
  e->refs = 1;
  e->in_cache = true;
  e->next = ctx->eps;
  ctx->eps = e;
  return e;
}

static void ep_unlink(xf_ep_t *e) {
  if (!e->in_cache) return;
  for (xf_ep_t **pp = &e->ctx->eps; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      break;
    }
  e->in_cache = false;
}

void xf_ep_put(xf_ep_t *e) {
  K3_ASSERT(e->refs > 0);
  if (--e->refs == 0 && (e->failed || e->ctx->closing)) {
    ep_unlink(e);
    ep_destroy(e);
  }
}

void xf_ep_fail(xf_ep_t *e) {
  ep_unlink(e);
  if (!e->failed) {
    e->failed = true;
    xf_send_on_ep_failed(e->ctx, e);
  }
  ep_close_ucp(e);
  if (e->refs == 0) ep_destroy(e);
}

static void am_send_cb(void *req, ucs_status_t st, void *ud) {
  if (st != UCS_OK && st != UCS_ERR_CANCELED) K3_WARN("xfer: active message send: %s", xf_ucs_str(st));
  free(ud);
  ucp_request_free(req);
}

int xf_am_send(xf_ep_t *e, unsigned id, void *data, size_t len) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS |
                                           UCP_OP_ATTR_FIELD_USER_DATA,
                           .cb.send = am_send_cb,
                           .user_data = data,
                           .flags = UCP_AM_SEND_FLAG_EAGER};
  ucs_status_ptr_t req = ucp_am_send_nbx(e->ep, id, NULL, 0, data, len, &p);
  if (UCS_PTR_IS_ERR(req)) {
    K3_WARN("xfer: ucp_am_send_nbx: %s", xf_ucs_str(UCS_PTR_STATUS(req)));
    free(data);
    return K3_ETRANSPORT;
  }
  if (req == NULL) free(data); /* completed inline: UCX no longer needs the buffer */
  return 0;
}

/* ---- rkey cache --------------------------------------------------------------------------- */

xf_rkey_t *xf_rkey_get(xf_ep_t *e, const uint8_t *packed, size_t len, ucs_status_t *st) {
  *st = UCS_OK;
  if (e->closed) {
    *st = UCS_ERR_CANCELED;
    return NULL;
  }
  for (xf_rkey_t *k = e->rkeys; k; k = k->next)
    if (k->h && k->len == len && memcmp(k->packed, packed, len) == 0) {
      k->refs++;
      return k;
    }
  xf_rkey_t *k = calloc(1, sizeof *k);
  if (!k || !(k->packed = malloc(len))) {
    free(k);
    *st = UCS_ERR_NO_MEMORY;
    return NULL;
  }
  memcpy(k->packed, packed, len);
  k->len = len;
  *st = ucp_ep_rkey_unpack(e->ep, packed, &k->h);
  if (*st != UCS_OK) {
    free(k->packed);
    free(k);
    return NULL;
  }
  k->refs = 1;
  k->next = e->rkeys;
  e->rkeys = k;
  return k;
}

void xf_rkey_put(xf_ep_t *e, xf_rkey_t *k) {
  K3_ASSERT(k->refs > 0);
  k->refs--;
  /* Keep at most XF_RKEY_CACHE entries; drop unreferenced ones beyond that (oldest last). */
  uint32_t n = 0;
  for (xf_rkey_t **pp = &e->rkeys; *pp;) {
    xf_rkey_t *x = *pp;
    if (++n > XF_RKEY_CACHE && x->refs == 0) {
      *pp = x->next;
      if (x->h) ucp_rkey_destroy(x->h);
      free(x->packed);
      free(x);
      continue;
    }
    pp = &x->next;
  }
}
