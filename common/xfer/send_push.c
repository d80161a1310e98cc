/* Sender data movement on the host side: hands the queued regions' bytes on, one chunk at a
 * time.
 *
 * What it is for: the movers of the host and staged paths, and the DATA messages of ucx-cuda
 * (docs/transfer.md, "Data paths"). direct: the receiver's pool is mapped here (ucp_rkey_ptr),
 * so each chunk is hashed and copied in one pass (k3_digest_copy: every 4 KiB chunk is hashed
 * from DRAM, then copied out of L1 with streaming stores), synchronously, checking the deadline
 * before every chunk. am: DATA active messages the receiver places itself (tcp, where Debian
 * UCX emulates puts; and ucx-cuda, from device memory, always rendezvous). put: ucp_put_nbx
 * (puts_only). staged: each chunk is first copied from the device by stage.d2h into a host
 * buffer, then handled as above. A chunk is contiguous on both sides (it crosses a unit boundary
 * only where units sit back to back: xf_region_run), and the digest covers exactly the bytes
 * handed on, one region at a time.
 *
 * What it is not: the fencing (per-layer flush + LAYER, final flush + DONE: send.c) or the
 * device jobs (send_dev.c). With device sources (ucx-cuda) nothing here dereferences a source:
 * the addresses go to UCX with the CUDA memory type and the digests come from the hash job. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "send_int.h"

static void put_cb(void *req, ucs_status_t st, void *ud) {
  xf_slot_t *sl = ud;
  k3_xfer_send_t *s = sl->s;
  sl->busy = false;
  s->inflight--;
  s->layers[sl->layer].puts_out--;
  s->kind_last[sl->kind] = k3_now_ns();
  if (st != UCS_OK && !s->status) s->status = st == UCS_ERR_CANCELED ? K3_ECANCELED : K3_ETRANSPORT;
  s->ctx->drive_again = true;
  ucp_request_free(req);
}

/* Where the next chunk of region r comes from: a host pointer into the sources, the staging
 * buffer after d2h, or (ucx-cuda) a device address that is only handed to UCX. Shortens *n to
 * the source's contiguity. NULL with s->status set on a staging failure. */
static const uint8_t *chunk_src(k3_xfer_send_t *s, uint32_t r, uint8_t *stage, uint64_t *n) {
  if (s->staged) {
    int rc = s->stage.d2h(s->stage.ud, r, s->cur_off, stage, *n);
    if (rc) {
      K3_ERROR("xfer: request %llu: staging copy of region %u failed: %s",
               (unsigned long long)s->desc->request_id, r, k3_strerror(rc));
      s->status = K3_EDEVICE;
      return NULL;
    }
    return stage;
  }
  uintptr_t a = xf_src_addr(&s->srcs[r], s->cur_off, *n, n);
  return (const uint8_t *)a;
}

/* Bookkeeping after n bytes of region queue[q_pos] were handed on. */
static void advance(k3_xfer_send_t *s, const k3_xfer_region_t *rg, uint32_t r, uint64_t n) {
  s->res.kind_bytes[xf_kind_of(rg)] += n;
  s->res.bytes += n;
  s->cur_off += n;
  if (s->cur_off == rg->len_bytes) {
    if (s->dg_ready) s->digest[r] = k3_digest_final(&s->dg);
    s->layers[rg->layer].regions_left--;
    s->q_pos++;
    s->cur_off = 0;
  }
}

/* ---- direct path: hash and copy in one pass ---------------------------------------------- */

/* Writes up to DIRECT_BUDGET bytes per call (then lets the loop breathe). Returns chunks done. */
#define DIRECT_BUDGET (16u << 20)
static uint32_t issue_direct(k3_xfer_send_t *s) {
  const k3_xfer_desc_t *d = s->desc;
  uint32_t done = 0;
  uint64_t budget = DIRECT_BUDGET;
  while (!s->status && s->q_pos < s->q_len && budget > 0) {
    if (s->ep->closed || k3_now_ns() >= s->deadline_ns) break; /* pump_one fails the send */
    uint32_t r = s->queue[s->q_pos];
    const k3_xfer_region_t *rg = &d->regions[r];
    uint64_t pool_off, n = xf_region_run(d, r, s->cur_off, s->opts.chunk_bytes, &pool_off);
    const uint8_t *ptr = chunk_src(s, r, s->slots[0].stage, &n);
    if (!ptr) break;
    uint32_t kind = xf_kind_of(rg);
    if (!s->kind_first[kind]) s->kind_first[kind] = k3_now_ns();
    if (s->cur_off == 0) k3_digest_reset(&s->dg);
    k3_digest_copy(&s->dg, s->dbase[rg->pool] + pool_off, ptr, n); /* ends with a store fence */
    s->kind_last[kind] = k3_now_ns();
    budget = n < budget ? budget - n : 0;
    done++;
    advance(s, rg, r, n);
  }
  return done;
}

/* ---- am / put: UCX operations, up to max_inflight in flight ------------------------------- */

uint32_t xf_send_issue(k3_xfer_send_t *s) {
  if (s->mode == XM_DIRECT) return issue_direct(s);
  if (xf_send_jobs_only(s)) return 0; /* cuda-ipc, cuda-pull: device jobs move everything (send_dev.c) */
  const k3_xfer_desc_t *d = s->desc;
  bool dev_data = s->dev_src && !s->staged; /* ucx-cuda: device addresses, no host hashing */
  uint32_t issued = 0;
  while (!s->status && s->q_pos < s->q_len) {
    xf_slot_t *sl = NULL;
    for (uint32_t i = 0; i < s->opts.max_inflight; i++)
      if (!s->slots[i].busy) {
        sl = &s->slots[i];
        break;
      }
    if (!sl) break;
    uint32_t r = s->queue[s->q_pos];
    const k3_xfer_region_t *rg = &d->regions[r];
    uint64_t pool_off, n = xf_region_run(d, r, s->cur_off, s->opts.chunk_bytes, &pool_off);
    const uint8_t *ptr = chunk_src(s, r, sl->stage, &n);
    if (!ptr) break;
    if (!dev_data) {
      if (s->cur_off == 0) k3_digest_reset(&s->dg);
      k3_digest_update(&s->dg, ptr, n);
    }
    uint32_t kind = xf_kind_of(rg);
    if (!s->kind_first[kind]) s->kind_first[kind] = k3_now_ns();
    sl->kind = kind;
    sl->layer = rg->layer;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = put_cb,
                             .user_data = sl};
    ucs_status_ptr_t req;
    if (s->mode == XM_AM) {
      xf_data_t h = {.request_id = d->request_id, .epoch = d->epoch, .region = r, .offset = s->cur_off};
      xf_data_encode(&h, sl->hdr);
      if (dev_data) {
        /* Device memory: always rendezvous (the receiver never memcpy's into device memory),
         * and tell UCX the memory type instead of letting it probe the pointer. */
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        p.flags = UCP_AM_SEND_FLAG_RNDV;
        p.memory_type = UCS_MEMORY_TYPE_CUDA;
      }
      req = ucp_am_send_nbx(s->ep->ep, XF_AM_DATA, sl->hdr, XF_DATA_HDR, ptr, n, &p);
    } else {
      req = ucp_put_nbx(s->ep->ep, ptr, n, d->pools[rg->pool].base_addr + pool_off,
                        s->rkeys[rg->pool]->h, &p);
    }
    if (UCS_PTR_IS_ERR(req)) {
      K3_WARN("xfer: request %llu: %s failed: %s", (unsigned long long)d->request_id,
              s->mode == XM_AM ? "DATA send" : "put", xf_ucs_str(UCS_PTR_STATUS(req)));
      s->status = K3_ETRANSPORT;
      break;
    }
    if (req) {
      sl->busy = true;
      s->inflight++;
      s->layers[rg->layer].puts_out++;
    } else {
      s->kind_last[kind] = k3_now_ns();
    }
    issued++;
    advance(s, rg, r, n);
  }
  return issued;
}
