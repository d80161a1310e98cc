/* Receiver: reservation table with leases, DONE verification and the fencing rule.
 *
 * What it is for: the decode side. k3_xfer_recv_reserve turns a layout over registered pools
 * into a live reservation (fresh epoch, lease) and a descriptor. A DONE is accepted only for a
 * live reservation of the same epoch and fingerprint, and only after every region's XXH3-64,
 * recomputed over our own memory at the reservation's own addresses (never addresses taken
 * from the message), matches the sender's. Every outcome is ACKed to the sender and counted.
 *
 * Incremental verification: the sender announces each layer (LAYER: that layer's digests)
 * after flushing its puts, and we verify the layer at once, while later layers stream; DONE then
 * only re-checks the recorded digests and hashes what was not announced (normally nothing but
 * a lost race). A LAYER for anything but a live reservation of the same epoch and fingerprint is
 * ignored (DONE gives the verdict); a mismatch is remembered and becomes DONE's verdict.
 *
 * DATA (the path for unmapped receivers, e.g. tcp): chunks are placed at the reservation's own
 * address for (region, offset), only for a live reservation of the message's epoch; rendezvous
 * receives are started from inside the UCX callback. LAYER/DONE of such a send wait (re-queued)
 * until their bytes landed, and a quarantined reservation is not released while a receive into
 * it is in flight.
 *
 * Fencing rule (docs/transfer.md): memory of a reservation that did not complete (lease expired,
 * cancelled) is quarantined for quarantine_ms before on_release hands it back to the owner, and
 * optionally poisoned (0xFF) first. Senders stop writing at the lease expiry (their deadline is
 * clamped to it) and force-close their endpoint on any failure, so quarantine_ms only has to
 * cover clock skew plus teardown. A reservation's epoch changes on re-issue, so a DONE from an
 * earlier attempt is rejected (K3_ESTALE) and never admits bytes of a reused slot.
 *
 * What it is not: the page/slot allocator (the owner's, freed in on_release). The table is a
 * list: a decode worker holds at most a few hundred reservations. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "xfer_int.h"

enum { RS_LIVE, RS_READY, RS_QUAR };

typedef struct resv {
  struct resv *next;
  int state;
  uint64_t expiry_ns; /* lease end (LIVE) or quarantine end (QUAR) */
  void *owner;
  k3_xfer_desc_t *desc; /* our copy: the only addresses we ever hash or release */
  k3_xfer_pool_t *pools[K3_XFER_MAX_POOLS];
  uint8_t *verified;  /* per region: verified by a LAYER of the current epoch */
  uint64_t *vdigest;  /* per region: the digest it was verified against */
  int verdict;        /* first LAYER failure of the current epoch (K3_EDIGEST/K3_EPROTO) or 0 */
  uint64_t serial;    /* unique per receiver: rendezvous records find the reservation by it */
  uint64_t *landed;   /* per region: bytes of the current epoch landed through DATA */
  uint32_t rx_pending; /* rendezvous receives into this memory still in flight (any epoch) */
} resv_t;

/* A rendezvous receive in flight (DATA path). Holds no pointer to the reservation, which may
 * be gone when it completes; linked in the ctx so ctx close frees what UCX never completed. */
typedef struct xf_rx {
  struct xf_rx *next, **pprev;
  k3_xfer_ctx_t *ctx;
  uint64_t serial, epoch, len;
  uint32_t region;
} xf_rx_t;

struct k3_xfer_recv {
  k3_xfer_ctx_t *ctx;
  k3_xfer_recv_opts_t opts;
  k3_xfer_stage_t stage;
  bool staged;
  resv_t *list;
  uint64_t next_epoch, next_serial;
};

int k3_xfer_recv_init(k3_xfer_ctx_t *ctx, const k3_xfer_recv_opts_t *opts, k3_xfer_recv_t **out) {
  if (ctx->recv) return K3_EEXIST;
  k3_xfer_recv_t *r = calloc(1, sizeof *r);
  if (!r) return K3_ENOMEM;
  r->ctx = ctx;
  if (opts) r->opts = *opts;
  if (!r->opts.quarantine_ms) r->opts.quarantine_ms = 2000;
  if (r->opts.stage && r->opts.stage->h2d) {
    r->stage = *r->opts.stage;
    r->staged = true;
  }
  r->opts.stage = NULL;
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
  for (resv_t **pp = &r->list; *pp; pp = &(*pp)->next)
    if (*pp == v) {
      *pp = v->next;
      break;
    }
  r->ctx->stats.reservations_released++;
  uint64_t id = v->desc->request_id;
  void *owner = v->owner;
  k3_xfer_desc_free(v->desc);
  free(v->verified);
  free(v->vdigest);
  free(v->landed);
  free(v);
  if (r->opts.on_release) r->opts.on_release(r->opts.ud, id, owner);
}

void k3_xfer_recv_free(k3_xfer_recv_t *r) {
  if (!r) return;
  while (r->list) resv_release(r, r->list);
  r->ctx->recv = NULL;
  free(r);
}

static resv_t *find(k3_xfer_recv_t *r, uint64_t request_id) {
  for (resv_t *v = r->list; v; v = v->next)
    if (v->desc->request_id == request_id && v->state != RS_QUAR) return v;
  return NULL;
}

static int make_desc(k3_xfer_recv_t *r, resv_t *v, uint32_t lease_ms, k3_xfer_desc_t **out) {
  /* A new epoch forgets what earlier attempts announced. */
  memset(v->verified, 0, v->desc->n_regions);
  memset(v->landed, 0, (size_t)v->desc->n_regions * sizeof(uint64_t));
  v->verdict = 0;
  v->desc->epoch = r->next_epoch++;
  v->desc->lease_expiry_ms = k3_wall_ms() + lease_ms;
  v->expiry_ns = k3_now_ns() + (uint64_t)lease_ms * 1000000ull;
  return k3_xfer_desc_clone(v->desc, out);
}

int k3_xfer_recv_reserve(k3_xfer_recv_t *r, const k3_xfer_layout_t *layout, uint64_t request_id,
                         uint64_t fingerprint, uint32_t lease_ms, void *owner,
                         k3_xfer_desc_t **out_desc) {
  if (find(r, request_id)) return K3_EEXIST;
  if (!layout || layout->n_pools > K3_XFER_MAX_POOLS || layout->n_lists > K3_XFER_MAX_LISTS ||
      layout->n_regions > K3_XFER_MAX_REGIONS || lease_ms == 0)
    return K3_EINVAL;
  resv_t *v = calloc(1, sizeof *v);
  k3_xfer_desc_t *d = k3_xfer_desc_new();
  if (!v || !d) goto oom;
  v->desc = d;
  v->owner = owner;
  d->request_id = request_id;
  d->fingerprint = fingerprint;
  const uint8_t *addr;
  size_t addr_len;
  k3_xfer_ctx_address(r->ctx, &addr, &addr_len);
  d->worker_addr = malloc(addr_len);
  if (!d->worker_addr) goto oom;
  memcpy(d->worker_addr, addr, addr_len);
  d->worker_addr_len = (uint32_t)addr_len;
  d->n_pools = layout->n_pools;
  for (uint32_t p = 0; p < layout->n_pools; p++) {
    const k3_xfer_pool_t *pl = layout->pools[p];
    if (!pl) goto inval;
    v->pools[p] = layout->pools[p];
    d->pools[p].base_addr = (uint64_t)(uintptr_t)pl->base;
    d->pools[p].stride_bytes = pl->stride_bytes;
    d->pools[p].n_slots = pl->n_slots;
    d->pools[p].rkey_len = (uint32_t)pl->rkey_len;
    d->pools[p].rkey = malloc(pl->rkey_len);
    if (!d->pools[p].rkey) goto oom;
    memcpy(d->pools[p].rkey, pl->rkey, pl->rkey_len);
  }
  d->n_lists = layout->n_lists;
  for (uint32_t l = 0; l < layout->n_lists; l++) {
    uint32_t n = layout->lists[l].n;
    if (n == 0 || n > K3_XFER_MAX_INDICES || !layout->lists[l].idx) goto inval;
    d->lists[l].n = n;
    d->lists[l].idx = malloc((size_t)n * sizeof(uint32_t));
    if (!d->lists[l].idx) goto oom;
    memcpy(d->lists[l].idx, layout->lists[l].idx, (size_t)n * sizeof(uint32_t));
  }
  d->n_regions = layout->n_regions;
  if (d->n_regions) {
    d->regions = malloc((size_t)d->n_regions * sizeof(k3_xfer_region_t));
    if (!d->regions) goto oom;
    memcpy(d->regions, layout->regions, (size_t)d->n_regions * sizeof(k3_xfer_region_t));
  }
  char err[160];
  if (k3_xfer_desc_validate(d, err, sizeof err)) {
    K3_ERROR("xfer: reservation for request %llu: %s", (unsigned long long)request_id, err);
    goto inval;
  }
  v->verified = calloc(d->n_regions ? d->n_regions : 1, 1);
  v->vdigest = calloc(d->n_regions ? d->n_regions : 1, sizeof(uint64_t));
  v->landed = calloc(d->n_regions ? d->n_regions : 1, sizeof(uint64_t));
  if (!v->verified || !v->vdigest || !v->landed) goto oom;
  v->serial = ++r->next_serial;
  int rc = make_desc(r, v, lease_ms, out_desc);
  if (rc) goto oom;
  v->state = RS_LIVE;
  v->next = r->list;
  r->list = v;
  xf_drive_api(r->ctx); /* re-arm the timer for this lease */
  return 0;
inval:
  k3_xfer_desc_free(d);
  if (v) free(v->verified), free(v->vdigest), free(v->landed);
  free(v);
  return K3_EINVAL;
oom:
  k3_xfer_desc_free(d);
  if (v) free(v->verified), free(v->vdigest), free(v->landed);
  free(v);
  return K3_ENOMEM;
}

int k3_xfer_recv_reissue(k3_xfer_recv_t *r, uint64_t request_id, uint32_t lease_ms,
                         k3_xfer_desc_t **out_desc) {
  resv_t *v = find(r, request_id);
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
  resv_t *v = find(r, request_id);
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
  resv_t *v = find(r, request_id);
  if (!v) return K3_ENOENT;
  if (v->state != RS_READY) return K3_EINVAL;
  resv_release(r, v);
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

/* Calls fn on every contiguous extent of region `reg` in our own memory. */
static int for_extents(resv_t *v, uint32_t reg, int (*fn)(void *, uint64_t, const uint8_t *, uint64_t),
                       void *arg) {
  const k3_xfer_region_t *rg = &v->desc->regions[reg];
  const uint8_t *base = v->pools[rg->pool]->base;
  for (uint64_t off = 0; off < rg->len_bytes;) {
    uint64_t pool_off, n;
    k3_xfer_region_locate(v->desc, reg, off, &pool_off, &n);
    int rc = fn(arg, off, base + pool_off, n);
    if (rc) return rc;
    off += n;
  }
  return 0;
}

static int hash_extent(void *arg, uint64_t off, const uint8_t *p, uint64_t n) {
  XXH3_64bits_update(arg, p, n);
  return 0;
}

static uint64_t region_digest(resv_t *v, uint32_t reg, xf_hash_t *h) {
  XXH3_64bits_reset(h);
  for_extents(v, reg, hash_extent, h);
  return XXH3_64bits_digest(h);
}

static void log_mismatch(resv_t *v, uint32_t i, uint64_t want, uint64_t got) {
  K3_WARN("xfer: request %llu epoch %llu: digest mismatch in region %u (%s, layer %u): "
          "sender %016llx, memory %016llx",
          (unsigned long long)v->desc->request_id, (unsigned long long)v->desc->epoch, i,
          k3_xfer_kind_name(v->desc->regions[i].kind), v->desc->regions[i].layer,
          (unsigned long long)want, (unsigned long long)got);
}

/* Rendezvous path: true while any byte of the regions selected by (layer or all) has not landed
 * yet, or a receive into this memory (of any epoch) is still in flight. */
static bool still_landing(const resv_t *v, bool all, uint32_t layer) {
  if (v->rx_pending) return true;
  for (uint32_t i = 0; i < v->desc->n_regions; i++)
    if ((all || v->desc->regions[i].layer == layer) && v->landed[i] < v->desc->regions[i].len_bytes)
      return true;
  return false;
}

int xf_recv_on_layer(k3_xfer_recv_t *r, const uint8_t *msg, size_t len) {
  xf_layer_t m;
  if (xf_layer_decode(msg, len, &m)) {
    K3_WARN("xfer: malformed LAYER (%zu bytes) dropped", len);
    return 0;
  }
  resv_t *v = find(r, m.request_id);
  if (!v || v->state != RS_LIVE || v->desc->epoch != m.epoch ||
      v->desc->fingerprint != m.fingerprint || v->verdict) {
    K3_DEBUG("xfer: LAYER %u for request %llu epoch %llu ignored", m.layer,
             (unsigned long long)m.request_id, (unsigned long long)m.epoch);
    return 0;
  }
  if ((m.flags & XF_MSG_FLAG_AM_DATA) && still_landing(v, false, m.layer)) return 1;
  const k3_xfer_desc_t *d = v->desc;
  uint32_t n = 0;
  for (uint32_t i = 0; i < d->n_regions; i++) n += d->regions[i].layer == m.layer;
  if (n != m.n_digests) {
    K3_WARN("xfer: request %llu: LAYER %u carries %u digests, the layer has %u regions",
            (unsigned long long)m.request_id, m.layer, m.n_digests, n);
    v->verdict = K3_EPROTO;
    return 0;
  }
  if (r->opts.test_before_verify) r->opts.test_before_verify(r->opts.ud, m.request_id);
  xf_hash_t *h = XXH3_createState();
  if (!h) return 0; /* not verified now: DONE hashes it */
  uint32_t k = 0;
  for (uint32_t i = 0; i < d->n_regions; i++) {
    if (d->regions[i].layer != m.layer) continue;
    uint64_t want;
    memcpy(&want, m.digests + 8 * (size_t)k++, 8);
    uint64_t got = region_digest(v, i, h);
    if (got != want) {
      log_mismatch(v, i, want, got);
      v->verdict = K3_EDIGEST;
      break;
    }
    v->verified[i] = 1;
    v->vdigest[i] = got;
  }
  if (h) XXH3_freeState(h);
  if (!v->verdict) r->ctx->stats.layers_verified++;
  return 0;
}

typedef struct {
  k3_xfer_recv_t *r;
  uint64_t request_id;
  uint32_t region;
} h2d_arg_t;

static int h2d_extent(void *arg, uint64_t off, const uint8_t *p, uint64_t n) {
  h2d_arg_t *a = arg;
  return a->r->stage.h2d(a->r->stage.ud, a->request_id, a->region, off, p, n);
}

static void ack(k3_xfer_recv_t *r, const xf_done_t *dm, int status) {
  xf_ep_t *e = xf_ep_get(r->ctx, dm->addr, dm->addr_len);
  if (!e) return; /* sender unreachable: it will time out */
  xf_ack_t a = {.request_id = dm->request_id, .epoch = dm->epoch, .send_id = dm->send_id, .status = status};
  size_t len;
  uint8_t *msg = xf_ack_encode(&a, &len);
  if (msg) xf_am_send(e, XF_AM_ACK, msg, len);
  xf_ep_put(e);
}

/* Decides on one DONE. Returns 0 (accepted) or the rejection code; counters are updated. */
static int judge(k3_xfer_recv_t *r, const xf_done_t *dm, resv_t **out) {
  k3_xfer_stats_t *st = &r->ctx->stats;
  resv_t *v = find(r, dm->request_id);
  if (!v) {
    st->done_rejected_unknown++;
    return K3_ENOENT;
  }
  if (v->desc->epoch != dm->epoch) {
    st->done_rejected_stale++;
    return K3_ESTALE;
  }
  if (v->state != RS_LIVE) { /* duplicate DONE for an admitted sequence */
    st->done_rejected_stale++;
    return K3_ESTALE;
  }
  if (v->desc->fingerprint != dm->fingerprint) {
    st->done_rejected_fingerprint++;
    return K3_EFINGERPRINT;
  }
  if (dm->n_digests != v->desc->n_regions) {
    st->done_rejected_malformed++;
    return K3_EPROTO;
  }
  if (v->verdict) { /* a LAYER of this epoch already failed */
    if (v->verdict == K3_EDIGEST) st->done_rejected_digest++;
    else st->done_rejected_malformed++;
    return v->verdict;
  }
  bool hooked = false;
  xf_hash_t *h = NULL;
  for (uint32_t i = 0; i < v->desc->n_regions; i++) {
    uint64_t want, got;
    memcpy(&want, dm->digests + 8 * (size_t)i, 8);
    if (v->verified[i]) {
      got = v->vdigest[i]; /* checked against our memory when its LAYER came */
    } else {
      if (!hooked && r->opts.test_before_verify) r->opts.test_before_verify(r->opts.ud, dm->request_id);
      hooked = true;
      if (!h && !(h = XXH3_createState())) return K3_ENOMEM;
      got = region_digest(v, i, h);
    }
    if (got != want) {
      if (h) XXH3_freeState(h);
      log_mismatch(v, i, want, got);
      st->done_rejected_digest++;
      return K3_EDIGEST;
    }
  }
  if (h) XXH3_freeState(h);
  if (r->staged) {
    for (uint32_t i = 0; i < v->desc->n_regions; i++) {
      h2d_arg_t a = {r, dm->request_id, i};
      int rc = for_extents(v, i, h2d_extent, &a);
      if (rc) {
        K3_ERROR("xfer: request %llu: host-to-device copy of region %u failed: %s",
                 (unsigned long long)dm->request_id, i, k3_strerror(rc));
        return K3_EDEVICE;
      }
    }
  }
  st->done_accepted++;
  *out = v;
  return 0;
}

int xf_recv_on_done(k3_xfer_recv_t *r, const uint8_t *msg, size_t len) {
  xf_done_t dm;
  if (xf_done_decode(msg, len, &dm)) {
    r->ctx->stats.done_rejected_malformed++;
    K3_WARN("xfer: malformed DONE (%zu bytes) dropped", len);
    return 0;
  }
  if (dm.flags & XF_MSG_FLAG_AM_DATA) { /* judged once every byte has landed */
    resv_t *w = find(r, dm.request_id);
    if (w && w->state == RS_LIVE && w->desc->epoch == dm.epoch && still_landing(w, true, 0)) return 1;
  }
  resv_t *v = NULL;
  int rc = judge(r, &dm, &v);
  ack(r, &dm, rc);
  if (rc) {
    K3_WARN("xfer: DONE for request %llu epoch %llu rejected: %s",
            (unsigned long long)dm.request_id, (unsigned long long)dm.epoch, k3_errname(rc));
    return 0;
  }
  v->state = RS_READY;
  K3_DEBUG("xfer: request %llu epoch %llu ready", (unsigned long long)dm.request_id,
           (unsigned long long)dm.epoch);
  k3_xfer_ready_t rd = {.request_id = dm.request_id, .epoch = dm.epoch,
                        .first_token = dm.first_token, .first_logprob = dm.first_logprob,
                        .owner = v->owner};
  if (r->opts.on_ready) r->opts.on_ready(r->opts.ud, &rd);
  return 0;
}

static int poison_extent(void *arg, uint64_t off, const uint8_t *p, uint64_t n) {
  memset((void *)p, 0xFF, n);
  return 0;
}

uint64_t xf_recv_pump(k3_xfer_recv_t *r, uint64_t now, uint64_t *next_deadline) {
  uint64_t work = 0;
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
    /* Never hand memory back while a receive we started into it may still write. */
    if (v->state == RS_QUAR && now >= v->expiry_ns && v->rx_pending == 0) {
      if (r->opts.poison) {
        for (uint32_t i = 0; i < v->desc->n_regions; i++) for_extents(v, i, poison_extent, NULL);
        r->ctx->stats.slots_poisoned++;
      }
      resv_release(r, v);
      work++;
      continue;
    }
    if (v->state != RS_READY && v->expiry_ns < *next_deadline) *next_deadline = v->expiry_ns;
    if (v->state == RS_LIVE && now + XF_TICK_NS < *next_deadline) *next_deadline = now + XF_TICK_NS;
  }
  return work;
}

/* ---- DATA: the rendezvous path --------------------------------------------------------------- */

static resv_t *find_serial(k3_xfer_recv_t *r, uint64_t serial) {
  for (resv_t *v = r->list; v; v = v->next)
    if (v->serial == serial) return v;
  return NULL;
}

static void rx_unlink_free(xf_rx_t *x) {
  *x->pprev = x->next;
  if (x->next) x->next->pprev = x->pprev;
  free(x);
}

static void rx_done_cb(void *req, ucs_status_t st, size_t length, void *ud) {
  xf_rx_t *x = ud;
  k3_xfer_ctx_t *ctx = x->ctx;
  resv_t *v = ctx->recv ? find_serial(ctx->recv, x->serial) : NULL;
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
  if (!r || xf_data_decode(hdr, hdr_len, &h) || !(v = find(r, h.request_id)) || v->state != RS_LIVE ||
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
    k3_xfer_region_locate(d, h.region, h.offset, &pool_off, &contig);
    ok = contig >= len;
  }
  if (!ok) {
    K3_WARN("xfer: request %llu: DATA for region %u at %llu (+%zu) is outside the reservation",
            (unsigned long long)h.request_id, h.region, (unsigned long long)h.offset, len);
    ctx->stats.data_dropped++;
    v->verdict = K3_EPROTO;
    return;
  }
  uint8_t *dst = (uint8_t *)v->pools[d->regions[h.region].pool]->base + pool_off;
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
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
