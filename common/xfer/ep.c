/* Endpoints to peer workers, the unpacked-rkey cache per endpoint, and eager active messages.
 *
 * What it is for: every message and byte k3_xfer sends goes through a cached endpoint (one per
 * peer worker address, shared by all sends to that peer and the receiver's ACKs). An endpoint
 * that failed (UCX error callback, or torn down on purpose because a failed send had operations
 * in flight) leaves the cache at once, so the next send creates a fresh one; its struct lives
 * until the last reference goes. Unpacked rkeys are cached per endpoint: unpacking a shm rkey
 * attaches the receiver's segment, and destroying it detaches it again, so a fresh unpack per
 * send paid a page fault per 4 KiB of the receiver's pool on every transfer.
 *
 * What it is not: the decisions (which send fails when: send.c). UCX callbacks here only record.
 *
 * Invariants: e->closed implies every rkey handle of e is NULL; an endpoint is in ctx->eps iff
 * in_cache; a failed endpoint is never handed out again. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "xfer_int.h"

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
