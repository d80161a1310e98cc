/* Receiver: DATA active messages, placed at the reservation's own addresses.
 *
 * What it is for: the data path for senders that cannot map our pools (tcp, another host) and
 * for ucx-cuda (device memory over UCX). A chunk is placed at OUR address for (region, offset)
 * of the live reservation whose epoch the header names, and nowhere else; DATA for an unknown
 * request or an old epoch is never written (counted as data_dropped). Eager chunks are copied
 * from the message into host memory; rendezvous chunks are received by UCX straight into our
 * memory (ucp_am_recv_data_nbx, with the CUDA memory type for device pools). Eager DATA aimed at
 * device memory is rejected (data_rejected_dev), never memcpy'd.
 *
 * What it is not: verification (recv_verify.c). Runs inside the UCX AM callback (a rendezvous
 * receive must be started there): it calls no user callback and touches only the reservation
 * table. A receive in flight holds no pointer to the reservation (which may be gone when it
 * completes): its record names the reservation by serial and is linked in the ctx, so ctx close
 * frees what UCX never completed; rx_pending keeps the memory from being handed back. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "recv_int.h"

/* A rendezvous receive in flight. */
typedef struct xf_rx {
  struct xf_rx *next, **pprev;
  k3_xfer_ctx_t *ctx;
  uint64_t serial, epoch, len;
  uint32_t region;
} xf_rx_t;

static void rx_unlink_free(xf_rx_t *x) {
  *x->pprev = x->next;
  if (x->next) x->next->pprev = x->pprev;
  free(x);
}

static void rx_done_cb(void *req, ucs_status_t st, size_t length, void *ud) {
  xf_rx_t *x = ud;
  k3_xfer_ctx_t *ctx = x->ctx;
  resv_t *v = ctx->recv ? xf_resv_find_serial(ctx->recv, x->serial) : NULL;
  if (v) {
    v->rx_pending--;
    if (st == UCS_OK && v->state == RS_LIVE && v->desc->epoch == x->epoch) v->landed[x->region] += x->len;
    else if (st != UCS_OK)
      K3_WARN("xfer: request %llu: receiving %llu bytes of region %u failed: %s",
              (unsigned long long)v->desc->request_id, (unsigned long long)x->len, x->region,
              xf_ucs_str(st));
  }
  rx_unlink_free(x);
  ctx->drive_again = true;
  if (req) ucp_request_free(req);
}

void xf_recv_on_data(k3_xfer_ctx_t *ctx, const void *hdr, size_t hdr_len, void *data, size_t len,
                     const ucp_am_recv_param_t *param) {
  k3_xfer_recv_t *r = ctx->recv;
  xf_data_t h;
  resv_t *v = NULL;
  if (!r || xf_data_decode(hdr, hdr_len, &h) || !(v = xf_resv_find(r, h.request_id)) || v->state != RS_LIVE ||
      v->desc->epoch != h.epoch) {
    /* Unknown, stale or not ours: never written. (UCX answers a dropped rendezvous.) */
    ctx->stats.data_dropped++;
    return;
  }
  const k3_xfer_desc_t *d = v->desc;
  uint64_t pool_off = 0, contig = 0;
  bool ok = h.region < d->n_regions && h.offset < d->regions[h.region].len_bytes &&
            len <= d->regions[h.region].len_bytes - h.offset;
  if (ok) {
    contig = xf_region_run(d, h.region, h.offset, len, &pool_off);
    ok = contig >= len;
  }
  if (!ok) {
    K3_WARN("xfer: request %llu: DATA for region %u at %llu (+%zu) is outside the reservation",
            (unsigned long long)h.request_id, h.region, (unsigned long long)h.offset, len);
    ctx->stats.data_dropped++;
    v->verdict = K3_EPROTO;
    return;
  }
  const k3_xfer_pool_t *pool = v->pools[d->regions[h.region].pool];
  void *dst = (void *)((uintptr_t)pool->base + pool_off);
  bool dev = pool->mem == K3_XFER_MEM_CUDA;
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (dev && (!rndv || !ctx->cuda_capable)) {
    /* Device memory is only written by UCX itself (rendezvous with the CUDA memory type): an
     * eager chunk would need a host memcpy into device memory. The sender broke the protocol
     * (ucx-cuda sends with UCP_AM_SEND_FLAG_RNDV): fail the epoch instead of waiting out the
     * lease for bytes that never land. */
    K3_WARN("xfer: request %llu: %s DATA for region %u in device memory rejected",
            (unsigned long long)h.request_id, rndv ? "rendezvous (no CUDA UCX here)" : "eager", h.region);
    ctx->stats.data_rejected_dev++;
    v->verdict = K3_EPROTO;
    return;
  }
  if (!rndv) {
    memcpy(dst, data, len); /* eager: the bytes are here now */
    v->landed[h.region] += len;
    ctx->stats.data_eager++;
    return;
  }
  xf_rx_t *x = calloc(1, sizeof *x);
  if (!x) {
    ctx->stats.data_dropped++; /* the bytes never land: DONE waits, the lease ends it */
    return;
  }
  *x = (xf_rx_t){.ctx = ctx, .serial = v->serial, .epoch = h.epoch, .len = len, .region = h.region};
  x->next = ctx->rx;
  if (ctx->rx) ctx->rx->pprev = &x->next;
  x->pprev = &ctx->rx;
  ctx->rx = x;
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                           .cb.recv_am = rx_done_cb,
                           .user_data = x};
  if (dev) { /* ucx-cuda: UCX writes device memory (cuda_ipc / cuda_copy), we never do */
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  v->rx_pending++;
  ctx->stats.data_rndv++;
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(ctx->worker, data, dst, len, &p);
  if (UCS_PTR_IS_ERR(req)) {
    K3_WARN("xfer: request %llu: ucp_am_recv_data_nbx: %s", (unsigned long long)h.request_id,
            xf_ucs_str(UCS_PTR_STATUS(req)));
    v->rx_pending--;
    rx_unlink_free(x);
    ctx->stats.data_dropped++;
  } else if (req == NULL) {
    rx_done_cb(NULL, UCS_OK, len, x); /* completed in place */
  }
}

void xf_recv_rx_free_all(k3_xfer_ctx_t *ctx) {
  while (ctx->rx) rx_unlink_free(ctx->rx);
}
