/* Receiver: the reservation table with leases, quarantine and release (the fencing rule).
 *
 * What it is for: the decode side. k3_xfer_recv_reserve turns a layout over registered pools
 * into a live reservation (fresh epoch, lease) and a descriptor for the control plane; the
 * reservation ends in on_release exactly once: at once when the owner releases a READY one, or
 * after quarantine when it did not complete. Verification of LAYER/DONE lives in recv_verify.c,
 * DATA placement in recv_data.c.
 *
 * Fencing rule (docs/transfer.md): memory of a reservation that did not complete (lease expired,
 * cancelled) is quarantined for quarantine_ms before on_release hands it back to the owner, and
 * optionally poisoned (0xFF; host pools only: k3_xfer never writes device memory) first.
 * Senders stop writing at the lease expiry (their deadline is clamped to it, and device jobs are
 * never submitted after it) and force-close their endpoint on any failure, so quarantine_ms only
 * has to cover clock skew plus teardown plus one layer's device copy. A reservation's epoch
 * changes on re-issue, so a DONE from an earlier attempt is rejected (K3_ESTALE) and never admits
 * bytes of a reused slot. A quarantined reservation is not handed back while a rendezvous
 * receive or a device verification job that we started over its memory is still running.
 *
 * What it is not: the page/slot allocator (the owner's, freed in on_release). The table is a
 * list: a decode worker holds at most a few hundred reservations. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "recv_int.h"

int k3_xfer_recv_init(k3_xfer_ctx_t *ctx, const k3_xfer_recv_opts_t *opts, k3_xfer_recv_t **out) {
  if (ctx->recv) return K3_EEXIST;
  k3_xfer_recv_t *r = calloc(1, sizeof *r);
  if (!r) return K3_ENOMEM;
  if (k3_digest_init(&r->dg)) {
    free(r);
    return K3_ENOMEM;
  }
  r->ctx = ctx;
  if (opts) r->opts = *opts;
  if (!r->opts.quarantine_ms) r->opts.quarantine_ms = 2000;
  if (r->opts.stage && r->opts.stage->h2d) {
    r->stage = *r->opts.stage;
    r->staged = true;
  }
  if (r->opts.dev && r->opts.dev->submit && r->opts.dev->poll && r->opts.dev->release) {
    r->dev = *r->opts.dev;
    r->has_dev = true;
    r->can_pull = r->dev.map && !r->opts.no_pull && !ctx->pull_off;
  }
  r->opts.stage = NULL;
  r->opts.dev = NULL;
  /* Epochs are unique across restarts of this process too: wall-clock ms in the high bits. */
  r->next_epoch = ((uint64_t)k3_wall_ms() << 16) | 1;
  ctx->recv = r;
  *out = r;
  return 0;
}

k3_xfer_path_t k3_xfer_recv_path(const k3_xfer_recv_t *r) {
  return r->staged ? K3_XFER_PATH_STAGED : K3_XFER_PATH_HOST;
}

static void resv_release(k3_xfer_recv_t *r, resv_t *v) {
  K3_ASSERT(v->jobs_out == 0);
  for (resv_t **pp = &r->list; *pp; pp = &(*pp)->next)
    if (*pp == v) {
      *pp = v->next;
      break;
    }
  r->ctx->stats.reservations_released++;
  uint64_t id = v->desc->request_id;
  void *owner = v->owner;
  k3_xfer_desc_free(v->desc);
  k3_xfer_desc_free(v->src);
  free(v->known);
  free(v->vdigest);
  free(v->landed);
  free(v->pend_reg);
  free(v->pend_want);
  free(v);
  if (r->opts.on_release) r->opts.on_release(r->opts.ud, id, owner);
}

void k3_xfer_recv_free(k3_xfer_recv_t *r) {
  if (!r) return;
  xf_recv_jobs_release_all(r); /* device jobs read reservation memory: wait for them first */
  while (r->list) resv_release(r, r->list);
  k3_digest_free(&r->dg);
  r->ctx->recv = NULL;
  free(r);
}

resv_t *xf_resv_find(k3_xfer_recv_t *r, uint64_t request_id) {
  for (resv_t *v = r->list; v; v = v->next)
    if (v->desc->request_id == request_id && v->state != RS_QUAR) return v;
  return NULL;
}

resv_t *xf_resv_find_serial(k3_xfer_recv_t *r, uint64_t serial) {
  for (resv_t *v = r->list; v; v = v->next)
    if (v->serial == serial) return v;
  return NULL;
}

static int make_desc(k3_xfer_recv_t *r, resv_t *v, uint32_t lease_ms, k3_xfer_desc_t **out) {
  /* A new epoch forgets what earlier attempts announced. */
  memset(v->known, 0, v->desc->n_regions);
  memset(v->landed, 0, (size_t)v->desc->n_regions * sizeof(uint64_t));
  v->pend_n = v->pend_layers = 0;
  v->verdict = 0;
  k3_xfer_desc_free(v->src); /* a new attempt tells us where its bytes are anew */
  v->src = NULL;
  v->src_refused = false;
  v->desc->epoch = r->next_epoch++;
  v->desc->lease_expiry_ms = k3_wall_ms() + lease_ms;
  v->expiry_ns = k3_now_ns() + (uint64_t)lease_ms * 1000000ull;
  return k3_xfer_desc_clone(v->desc, out);
}

static int copy_blob(uint8_t **dst, const void *src, size_t len) {
  if (!len) return 0;
  if (!(*dst = malloc(len))) return K3_ENOMEM;
  memcpy(*dst, src, len);
  return 0;
}

int k3_xfer_recv_reserve(k3_xfer_recv_t *r, const k3_xfer_layout_t *layout, uint64_t request_id,
                         uint64_t fingerprint, uint32_t lease_ms, void *owner,
                         k3_xfer_desc_t **out_desc) {
  if (xf_resv_find(r, request_id)) return K3_EEXIST;
  if (!layout || layout->n_pools > K3_XFER_MAX_POOLS || layout->n_lists > K3_XFER_MAX_LISTS ||
      layout->n_regions > K3_XFER_MAX_REGIONS || lease_ms == 0)
    return K3_EINVAL;
  resv_t *v = calloc(1, sizeof *v);
  k3_xfer_desc_t *d = k3_xfer_desc_new();
  int rc = K3_ENOMEM;
  if (!v || !d) goto fail;
  v->desc = d;
  v->owner = owner;
  d->request_id = request_id;
  d->fingerprint = fingerprint;
  const uint8_t *addr;
  size_t addr_len;
  k3_xfer_ctx_address(r->ctx, &addr, &addr_len);
  if (copy_blob(&d->worker_addr, addr, addr_len)) goto fail;
  d->worker_addr_len = (uint32_t)addr_len;
  d->n_pools = layout->n_pools;
  for (uint32_t p = 0; p < layout->n_pools; p++) {
    const k3_xfer_pool_t *pl = layout->pools[p];
    rc = K3_EINVAL;
    if (!pl) goto fail;
    if (pl->mem == K3_XFER_MEM_CUDA && !r->has_dev) {
      K3_ERROR("xfer: reservation for request %llu: pool %u is device memory but the receiver "
               "has no device hooks (k3_xfer_recv_opts_t dev)", (unsigned long long)request_id, p);
      goto fail;
    }
    rc = K3_ENOMEM;
    v->pools[p] = layout->pools[p];
    k3_xfer_pool_desc_t *pd = &d->pools[p];
    pd->base_addr = (uint64_t)(uintptr_t)pl->base;
    pd->size_bytes = pl->size;
    pd->mem = pl->mem;
    if (copy_blob(&pd->rkey, pl->rkey, pl->rkey_len) || copy_blob(&pd->blob, pl->blob, pl->blob_len))
      goto fail;
    pd->rkey_len = (uint32_t)pl->rkey_len;
    pd->blob_len = pl->blob_len;
  }
  d->n_lists = layout->n_lists;
  for (uint32_t l = 0; l < layout->n_lists; l++) {
    uint32_t n = layout->lists[l].n;
    rc = K3_EINVAL;
    if (n == 0 || n > K3_XFER_MAX_INDICES || !layout->lists[l].idx) goto fail;
    rc = K3_ENOMEM;
    if (copy_blob((uint8_t **)&d->lists[l].idx, layout->lists[l].idx, (size_t)n * sizeof(uint32_t)))
      goto fail;
    d->lists[l].n = n;
  }
  d->n_regions = layout->n_regions;
  if (d->n_regions &&
      copy_blob((uint8_t **)&d->regions, layout->regions, (size_t)d->n_regions * sizeof(k3_xfer_region_t)))
    goto fail;
  char err[160];
  if (k3_xfer_desc_validate(d, err, sizeof err)) {
    K3_ERROR("xfer: reservation for request %llu: %s", (unsigned long long)request_id, err);
    rc = K3_EINVAL;
    goto fail;
  }
  v->known = calloc(d->n_regions, 1);
  v->vdigest = calloc(d->n_regions, sizeof(uint64_t));
  v->landed = calloc(d->n_regions, sizeof(uint64_t));
  if (!v->known || !v->vdigest || !v->landed) goto fail;
  bool all_dev = true;
  for (uint32_t i = 0; i < d->n_regions; i++) {
    v->any_dev |= xf_region_dev(v, i);
    all_dev &= xf_region_dev(v, i);
  }
  if (r->can_pull && all_dev) d->flags |= K3_XFER_DESC_F_PULL; /* cuda-pull offered */
  if (v->any_dev && (!(v->pend_reg = calloc(d->n_regions, sizeof(uint32_t))) ||
                     !(v->pend_want = calloc(d->n_regions, sizeof(uint64_t)))))
    goto fail;
  v->serial = ++r->next_serial;
  if (make_desc(r, v, lease_ms, out_desc)) goto fail;
  v->state = RS_LIVE;
  v->next = r->list;
  r->list = v;
  xf_drive_api(r->ctx); /* re-arm the timer for this lease */
  return 0;
fail:
  k3_xfer_desc_free(d);
  if (v) free(v->known), free(v->vdigest), free(v->landed), free(v->pend_reg), free(v->pend_want);
  free(v);
  return rc;
}

int k3_xfer_recv_reissue(k3_xfer_recv_t *r, uint64_t request_id, uint32_t lease_ms,
                         k3_xfer_desc_t **out_desc) {
  resv_t *v = xf_resv_find(r, request_id);
  if (!v) return K3_ENOENT;
  if (v->state != RS_LIVE || lease_ms == 0) return K3_EINVAL;
  uint64_t old_epoch = v->desc->epoch, old_exp = v->expiry_ns;
  int64_t old_wall = v->desc->lease_expiry_ms;
  int rc = make_desc(r, v, lease_ms, out_desc);
  if (rc) { /* on error nothing changed that matters: the old epoch's announcements are
             * dropped, so its DONE re-hashes every region */
    v->desc->epoch = old_epoch;
    v->desc->lease_expiry_ms = old_wall;
    v->expiry_ns = old_exp;
    return rc;
  }
  xf_drive_api(r->ctx);
  return 0;
}

static void quarantine(k3_xfer_recv_t *r, resv_t *v) {
  v->state = RS_QUAR;
  v->expiry_ns = k3_now_ns() + (uint64_t)r->opts.quarantine_ms * 1000000ull;
  r->ctx->stats.slots_quarantined++;
}

int k3_xfer_recv_cancel(k3_xfer_recv_t *r, uint64_t request_id) {
  resv_t *v = xf_resv_find(r, request_id);
  if (!v) return K3_ENOENT;
  r->ctx->stats.reservations_cancelled++;
  if (v->state == RS_READY) {
    resv_release(r, v);
    return 0;
  }
  quarantine(r, v);
  xf_drive_api(r->ctx);
  return 0;
}

int k3_xfer_recv_release(k3_xfer_recv_t *r, uint64_t request_id) {
  resv_t *v = xf_resv_find(r, request_id);
  if (!v) return K3_ENOENT;
  if (v->state != RS_READY) return K3_EINVAL;
  resv_release(r, v); /* READY: DONE waited for every job of the epoch; none is running */
  return 0;
}

uint32_t k3_xfer_recv_live(const k3_xfer_recv_t *r) {
  uint32_t n = 0;
  for (resv_t *v = r->list; v; v = v->next) n += v->state != RS_QUAR;
  return n;
}
uint32_t k3_xfer_recv_quarantined(const k3_xfer_recv_t *r) {
  uint32_t n = 0;
  for (resv_t *v = r->list; v; v = v->next) n += v->state == RS_QUAR;
  return n;
}

int xf_for_extents(const resv_t *v, uint32_t reg, int (*fn)(void *, uint64_t, uintptr_t, uint64_t),
                   void *arg) {
  const k3_xfer_region_t *rg = &v->desc->regions[reg];
  uintptr_t base = (uintptr_t)v->pools[rg->pool]->base;
  for (uint64_t off = 0; off < rg->len_bytes;) {
    uint64_t pool_off, n = xf_region_run(v->desc, reg, off, UINT64_MAX, &pool_off);
    int rc = fn(arg, off, base + pool_off, n);
    if (rc) return rc;
    off += n;
  }
  return 0;
}

static int poison_extent(void *arg, uint64_t off, uintptr_t p, uint64_t n) {
  memset((void *)p, 0xFF, n);
  return 0;
}

/* Poisons the host regions; device regions are skipped (no device memset here) and counted. */
static void poison(k3_xfer_recv_t *r, resv_t *v) {
  bool any_host = false;
  for (uint32_t i = 0; i < v->desc->n_regions; i++)
    if (!xf_region_dev(v, i)) {
      xf_for_extents(v, i, poison_extent, NULL);
      any_host = true;
    }
  if (v->any_dev) r->ctx->stats.poison_skipped++;
  if (any_host) r->ctx->stats.slots_poisoned++;
}

uint64_t xf_recv_pump(k3_xfer_recv_t *r, uint64_t now, uint64_t *next_deadline) {
  uint64_t work = xf_recv_jobs_pump(r);
  for (resv_t *v = r->list, *nx; v; v = nx) {
    nx = v->next;
    if (v->state == RS_LIVE && now >= v->expiry_ns) {
      K3_WARN("xfer: lease of request %llu epoch %llu expired; quarantined for %u ms",
              (unsigned long long)v->desc->request_id, (unsigned long long)v->desc->epoch,
              r->opts.quarantine_ms);
      r->ctx->stats.leases_expired++;
      quarantine(r, v);
      work++;
    }
    /* Never hand memory back while a receive or a device job we started over it still runs. */
    if (v->state == RS_QUAR && now >= v->expiry_ns && v->rx_pending == 0 && v->jobs_out == 0) {
      if (r->opts.poison) poison(r, v);
      resv_release(r, v);
      work++;
      continue;
    }
    if (v->state != RS_READY && v->expiry_ns < *next_deadline) *next_deadline = v->expiry_ns;
    if ((v->state == RS_LIVE || v->jobs_out) && now + XF_TICK_NS < *next_deadline)
      *next_deadline = now + XF_TICK_NS;
  }
  return work;
}
