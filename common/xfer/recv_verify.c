/* Receiver: verification of LAYER and DONE over our own memory, verdicts and ACKs.
 *
 * What it is for: a DONE is accepted only for a live reservation of the same epoch and
 * fingerprint, and only after every region's K3 digest (k3pd/digest.h), recomputed over our own
 * memory at the reservation's own addresses (never addresses taken from a message), matches the
 * sender's. Every outcome is ACKed to the sender and counted.
 *
 * Incremental verification: the sender announces each layer (LAYER: that layer's digests) once
 * its bytes are complete and visible, and we verify the layer then, while later layers stream;
 * DONE only re-checks the recorded digests and hashes what no LAYER covered. Host regions are
 * hashed here, on the loop; regions in device pools by hash-only jobs through the receiver's
 * device hooks (their notify wakes the loop; xf_recv_jobs_pump records the result). A LAYER for
 * anything but a live reservation of the same epoch and fingerprint is ignored (DONE gives the
 * verdict); a mismatch is remembered and becomes DONE's verdict. A LAYER or DONE whose bytes are
 * still landing (DATA path), or a DONE while verification jobs run, is re-queued by the caller
 * (ctx.c) and looked at again on a later drive; the lease bounds the wait (an expired
 * reservation is quarantined, and the DONE then finds no live reservation).
 *
 * What it is not: the reservation table (recv.c) or DATA placement (recv_data.c). */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "recv_int.h"

static int hash_extent(void *arg, uint64_t off, uintptr_t p, uint64_t n) {
  k3_digest_update(arg, (const void *)p, n);
  return 0;
}

/* Host regions only: k3_digest over the region's extents in our memory. */
static uint64_t host_digest(k3_xfer_recv_t *r, const resv_t *v, uint32_t reg) {
  k3_digest_reset(&r->dg);
  xf_for_extents(v, reg, hash_extent, &r->dg);
  return k3_digest_final(&r->dg);
}

static void log_mismatch(const resv_t *v, uint32_t i, uint64_t want, uint64_t got) {
  K3_WARN("xfer: request %llu epoch %llu: digest mismatch in region %u (%s, layer %u): "
          "sender %016llx, memory %016llx",
          (unsigned long long)v->desc->request_id, (unsigned long long)v->desc->epoch, i,
          k3_xfer_kind_name(v->desc->regions[i].kind), v->desc->regions[i].layer,
          (unsigned long long)want, (unsigned long long)got);
}

/* ---- device verification jobs ------------------------------------------------------------ */

typedef struct {
  k3_xfer_seg_t *segs;
  uint32_t n, cap;
} segv_t;

static int seg_push(segv_t *sv, uintptr_t src, uintptr_t dst, uint64_t n) {
  if (sv->n == sv->cap) {
    uint32_t cap = sv->cap ? 2 * sv->cap : 64;
    k3_xfer_seg_t *ns = realloc(sv->segs, cap * sizeof *ns);
    if (!ns) return K3_ENOMEM;
    sv->segs = ns;
    sv->cap = cap;
  }
  sv->segs[sv->n++] = (k3_xfer_seg_t){.src = (const void *)src, .dst = (void *)dst, .len = n};
  return 0;
}

static int seg_extent(void *arg, uint64_t off, uintptr_t p, uint64_t n) { return seg_push(arg, p, 0, n); }

/* cuda-pull: region reg's byte stream as segments from the sender's pool (mapped here, at the
 * place its SRC gave) into our memory (at our own addresses), cut wherever either side stops
 * being contiguous. Pure arithmetic: nothing is dereferenced. */
static int pull_segs(segv_t *sv, const resv_t *v, uint32_t reg) {
  const k3_xfer_region_t *rg = &v->desc->regions[reg];
  uintptr_t dbase = (uintptr_t)v->pools[rg->pool]->base;
  uintptr_t sbase = (uintptr_t)v->sbase[v->src->regions[reg].pool];
  for (uint64_t off = 0; off < rg->len_bytes;) {
    uint64_t dpo, spo;
    uint64_t n = xf_region_run(v->desc, reg, off, UINT64_MAX, &dpo);
    n = xf_region_run(v->src, reg, off, n, &spo);
    int rc = seg_push(sv, sbase + spo, dbase + dpo, n);
    if (rc) return rc;
    off += n;
  }
  return 0;
}

static void vjob_free(xf_vjob_t *j) {
  free(j->regions);
  free(j->want);
  free(j->got);
  free(j);
}

/* Submits a hash-only job over regions[0..n) of v (our own addresses), or on cuda-pull (v->src
 * set) a pull job: copy from the sender's mapped pool into our memory, hashing what it read.
 * want: the digests to compare with (copied) or NULL. Returns 0 or K3_E*; on error nothing is
 * queued. */
static int submit_verify(k3_xfer_recv_t *r, resv_t *v, const uint32_t *regions, uint32_t n,
                         const uint64_t *want, uint32_t n_layers) {
  xf_vjob_t *j = calloc(1, sizeof *j);
  segv_t sv = {0};
  uint32_t *first = malloc(((size_t)n + 1) * sizeof *first);
  int rc = K3_ENOMEM;
  if (!j || !first || !(j->regions = malloc((size_t)n * sizeof(uint32_t))) ||
      !(j->got = calloc(n, sizeof(uint64_t))) || (want && !(j->want = malloc((size_t)n * 8))))
    goto out;
  memcpy(j->regions, regions, (size_t)n * sizeof(uint32_t));
  if (want) memcpy(j->want, want, (size_t)n * 8);
  for (uint32_t k = 0; k < n; k++) {
    first[k] = sv.n;
    if (v->src) {
      if ((rc = pull_segs(&sv, v, regions[k]))) goto out;
      j->pull_bytes += v->desc->regions[regions[k]].len_bytes;
    } else if ((rc = xf_for_extents(v, regions[k], seg_extent, &sv))) {
      goto out;
    }
  }
  first[n] = sv.n;
  uint64_t t_sub = k3_now_ns();
  rc = r->dev.submit(r->dev.ud, sv.segs, first, n, xf_job_notify(r->ctx), r->ctx, &j->job);
  t_sub = k3_now_ns() - t_sub;
  if (rc) {
    r->ctx->stats.dev_jobs_failed++;
    K3_ERROR("xfer: request %llu: device verification job refused: %s",
             (unsigned long long)v->desc->request_id, k3_errname(rc));
    goto out;
  }
  r->ctx->stats.dev_jobs++;
  r->ctx->jobs_running++;
  XF_TRACE(r->ctx, "recv %llu: %s job submitted (%u regions, %u segments, %u layers, %llu bytes copied, %.1f us "
           "in submit)", (unsigned long long)v->desc->request_id, v->src ? "pull" : "verification", n, sv.n, n_layers,
           (unsigned long long)j->pull_bytes, (double)t_sub / 1e3);
  j->v = v;
  j->epoch = v->desc->epoch;
  j->n = n;
  j->n_layers = n_layers;
  v->jobs_out++;
  /* FIFO: jobs complete in submission order (one stream), so the pump stops at the first
   * still running. */
  j->next = NULL;
  xf_vjob_t **tail = &r->jobs;
  while (*tail) tail = &(*tail)->next;
  *tail = j;
  j = NULL;
out:
  if (j) vjob_free(j);
  free(sv.segs);
  free(first);
  return rc;
}

/* A finished job: record digests (and compare with LAYER's) if the reservation is still live
 * in the job's epoch; anything else is stale and only releases the memory. */
static void job_done(k3_xfer_recv_t *r, xf_vjob_t *j, int prc) {
  resv_t *v = j->v;
  XF_TRACE(r->ctx, "recv %llu: verification job seen done (%d)", (unsigned long long)v->desc->request_id, prc);
  v->jobs_out--;
  r->ctx->drive_again = true; /* a re-queued DONE may be ready now */
  if (v->state != RS_LIVE || v->desc->epoch != j->epoch || v->verdict) return;
  if (prc < 0) {
    r->ctx->stats.dev_jobs_failed++;
    K3_ERROR("xfer: request %llu: device verification job failed: %s",
             (unsigned long long)v->desc->request_id, k3_errname(prc));
    v->verdict = K3_EDEVICE;
    return;
  }
  for (uint32_t k = 0; k < j->n; k++) {
    uint32_t i = j->regions[k];
    if (j->want && j->got[k] != j->want[k]) {
      log_mismatch(v, i, j->want[k], j->got[k]);
      v->verdict = K3_EDIGEST;
      return;
    }
    v->known[i] = 1;
    v->vdigest[i] = j->got[k];
  }
  r->ctx->stats.layers_verified += j->n_layers;
  r->ctx->stats.pull_bytes += j->pull_bytes;
}

void xf_recv_flush_pending(k3_xfer_recv_t *r, resv_t *v) {
  if (!v->pend_n) return;
  uint32_t n = v->pend_n, layers = v->pend_layers;
  v->pend_n = v->pend_layers = 0;
  if (v->state != RS_LIVE || v->verdict) return;
  uint64_t cap = r->ctx->pull_job_bytes;
  if (!v->src || !cap) {
    submit_verify(r, v, v->pend_reg, n, v->pend_want, layers); /* refused: DONE hashes the rest */
    return;
  }
  /* K3PD_XFER_PULL_JOB_MIB: pull jobs of ~cap bytes (whole regions), queued back to back: the
   * host combines one job's digests while the next copies, so only the last job's combine
   * follows the last byte. The layers count with the last job. */
  for (uint32_t k0 = 0; k0 < n;) {
    uint32_t k1 = k0;
    uint64_t b = 0;
    while (k1 < n && (k1 == k0 || b + v->desc->regions[v->pend_reg[k1]].len_bytes <= cap))
      b += v->desc->regions[v->pend_reg[k1++]].len_bytes;
    if (submit_verify(r, v, v->pend_reg + k0, k1 - k0, v->pend_want + k0, k1 == n ? layers : 0)) return;
    k0 = k1;
  }
}

uint64_t xf_recv_jobs_pump(k3_xfer_recv_t *r) {
  uint64_t work = 0;
  for (resv_t *v = r->list; v; v = v->next) xf_recv_flush_pending(r, v);
  for (xf_vjob_t **pp = &r->jobs; *pp;) {
    xf_vjob_t *j = *pp;
    int rc = r->dev.poll(r->dev.ud, j->job, j->got);
    if (rc == 0) break; /* the later ones are behind it on the same stream */
    r->dev.release(r->dev.ud, j->job);
    r->ctx->jobs_running--;
    *pp = j->next;
    job_done(r, j, rc);
    vjob_free(j);
    work++;
  }
  return work;
}

void xf_recv_jobs_release_all(k3_xfer_recv_t *r) {
  while (r->jobs) {
    xf_vjob_t *j = r->jobs;
    r->jobs = j->next;
    r->dev.release(r->dev.ud, j->job); /* waits for it */
    r->ctx->jobs_running--;
    j->v->jobs_out--;
    vjob_free(j);
  }
}

/* ---- LAYER -------------------------------------------------------------------------------- */

/* Rendezvous path: true while any byte of the regions selected by (layer or all) has not landed
 * yet, or a receive into this memory (of any epoch) is still in flight. */
static bool still_landing(const resv_t *v, bool all, uint32_t layer) {
  if (v->rx_pending) return true;
  for (uint32_t i = 0; i < v->desc->n_regions; i++)
    if ((all || v->desc->regions[i].layer == layer) && v->landed[i] < v->desc->regions[i].len_bytes)
      return true;
  return false;
}

/* LANDED (cuda-ipc): layers [l0, l1) are complete and visible in our memory; the sender's
 * digests come with DONE. Hash them now (device regions: one job without expected digests;
 * host regions: here), record what our memory holds, and let DONE compare. */
static int on_landed(k3_xfer_recv_t *r, resv_t *v, uint32_t l0, uint32_t l1) {
  const k3_xfer_desc_t *d = v->desc;
  if (l1 > d->n_layers) {
    K3_WARN("xfer: request %llu: LANDED for layers %u..%u, the request has %u",
            (unsigned long long)d->request_id, l0, l1 - 1, d->n_layers);
    v->verdict = K3_EPROTO;
    return 0;
  }
  if (r->opts.trust_sender_digests) return 0; /* measurement mode: DONE's digests are taken */
  if (r->opts.test_before_verify) r->opts.test_before_verify(r->opts.ud, d->request_id);
  uint32_t *dev = malloc((size_t)d->n_regions * sizeof(uint32_t)), n_dev = 0;
  if (!dev) return 0; /* DONE hashes what is left */
  for (uint32_t i = 0; i < d->n_regions; i++) {
    if (d->regions[i].layer < l0 || d->regions[i].layer >= l1 || v->known[i]) continue;
    if (xf_region_dev(v, i)) {
      dev[n_dev++] = i;
      continue;
    }
    v->vdigest[i] = host_digest(r, v, i);
    v->known[i] = 1;
  }
  if (n_dev) submit_verify(r, v, dev, n_dev, NULL, l1 - l0); /* refused: DONE hashes the rest */
  else r->ctx->stats.layers_verified += l1 - l0;
  free(dev);
  return 0;
}

/* SRC (cuda-pull): where the sender's bytes are. Checked against our reservation (same
 * request, epoch, fingerprint; region for region the same kind, layer and length; every region
 * of ours in device memory), then the sender's pools are mapped through our hooks. A malformed
 * or mismatched SRC becomes the reservation's verdict (DONE is rejected with it); pools that do
 * not map here are answered at once with an ACK of K3_ENOTSUP (the sender pushes instead, as
 * cuda-ipc) and this epoch's pull messages are dropped. Never an address taken from the
 * message as such: we read at offsets inside pools we mapped ourselves, bounded by their size
 * (the descriptor's validation), and write only at our own addresses. */
static void ack_to(k3_xfer_recv_t *r, const uint8_t *addr, size_t addr_len, uint64_t request_id, uint64_t epoch,
                   uint64_t send_id, int status);

static int on_src(k3_xfer_recv_t *r, const uint8_t *msg, size_t len) {
  xf_src_t m;
  k3_xfer_desc_t *x = NULL;
  char err[200] = "";
  if (xf_src_decode(msg, len, &m) || k3_xfer_desc_decode(m.desc, m.desc_len, &x, err, sizeof err)) {
    r->ctx->stats.pull_refused++;
    K3_WARN("xfer: malformed SRC (%zu bytes) dropped%s%s", len, err[0] ? ": " : "", err);
    return 0;
  }
  resv_t *v = xf_resv_find(r, x->request_id);
  if (!v || v->state != RS_LIVE || v->desc->epoch != x->epoch || v->desc->fingerprint != x->fingerprint ||
      v->verdict) {
    K3_DEBUG("xfer: SRC for request %llu epoch %llu ignored", (unsigned long long)x->request_id,
             (unsigned long long)x->epoch);
    r->ctx->stats.pull_refused++;
    k3_xfer_desc_free(x);
    return 0;
  }
  const k3_xfer_desc_t *d = v->desc;
  int verdict = K3_EPROTO;
  if (!r->can_pull) k3_fmt(err, sizeof err, "this receiver does not pull");
  else if (!(d->flags & K3_XFER_DESC_F_PULL)) k3_fmt(err, sizeof err, "pull was not offered for it");
  else if (v->src) k3_fmt(err, sizeof err, "a second SRC in one epoch");
  else if (x->n_regions != d->n_regions) k3_fmt(err, sizeof err, "%u regions, ours %u", x->n_regions, d->n_regions);
  for (uint32_t i = 0; !err[0] && i < d->n_regions; i++) {
    const k3_xfer_region_t *a = &x->regions[i], *b = &d->regions[i];
    if (a->kind != b->kind || a->layer != b->layer || a->len_bytes != b->len_bytes)
      k3_fmt(err, sizeof err, "region %u is kind %u layer %u %llu bytes, ours kind %u layer %u %llu bytes", i,
             a->kind, a->layer, (unsigned long long)a->len_bytes, b->kind, b->layer,
             (unsigned long long)b->len_bytes);
    else if (!xf_region_dev(v, i)) k3_fmt(err, sizeof err, "our region %u is not in device memory", i);
    else if (x->pools[a->pool].mem != K3_XFER_MEM_CUDA || !x->pools[a->pool].blob_len)
      k3_fmt(err, sizeof err, "its pool %u is not exported device memory", a->pool);
  }
  bool used[K3_XFER_MAX_POOLS] = {false};
  for (uint32_t i = 0; !err[0] && i < x->n_regions; i++) used[x->regions[i].pool] = true;
  for (uint32_t p = 0; !err[0] && p < x->n_pools; p++) {
    if (!used[p]) continue;
    void *base = NULL;
    int rc = r->dev.map(r->dev.ud, x->pools[p].blob, x->pools[p].blob_len, x->pools[p].size_bytes, false, &base);
    if (rc || !base) {
      k3_fmt(err, sizeof err, "its pool %u (%llu bytes) is not mappable here: %s", p,
             (unsigned long long)x->pools[p].size_bytes, rc ? k3_errname(rc) : "NULL base");
      verdict = K3_EDEVICE;
    }
    v->sbase[p] = base;
  }
  if (err[0] && verdict == K3_EDEVICE) {
    /* Nothing wrong with the transfer: its pools just do not map here. Tell the sender at once
     * (it redoes the send as cuda-ipc, pushing into our pools) and drop its pull messages. */
    K3_WARN("xfer: request %llu epoch %llu: SRC refused, sender asked to push instead: %s",
            (unsigned long long)d->request_id, (unsigned long long)d->epoch, err);
    r->ctx->stats.pull_refused++;
    v->src_refused = true;
    ack_to(r, x->worker_addr, x->worker_addr_len, d->request_id, d->epoch, m.send_id, K3_ENOTSUP);
    k3_xfer_desc_free(x);
    return 0;
  }
  if (err[0]) {
    K3_WARN("xfer: request %llu epoch %llu: SRC refused: %s", (unsigned long long)d->request_id,
            (unsigned long long)d->epoch, err);
    r->ctx->stats.pull_refused++;
    v->verdict = verdict;
    k3_xfer_desc_free(x);
    return 0;
  }
  v->src = x;
  r->ctx->stats.pulls++;
  XF_TRACE(r->ctx, "recv %llu: SRC accepted (%u pools, %u regions)", (unsigned long long)d->request_id,
           x->n_pools, x->n_regions);
  return 0;
}

int xf_recv_on_layer(k3_xfer_recv_t *r, const uint8_t *msg, size_t len) {
  if (xf_wire_type(msg, len) == 5) return on_src(r, msg, len);
  xf_layer_t m;
  if (xf_layer_decode(msg, len, &m)) {
    K3_WARN("xfer: malformed LAYER (%zu bytes) dropped", len);
    return 0;
  }
  resv_t *v = xf_resv_find(r, m.request_id);
  if (!v || v->state != RS_LIVE || v->desc->epoch != m.epoch ||
      v->desc->fingerprint != m.fingerprint || v->verdict) {
    K3_DEBUG("xfer: LAYER %u for request %llu epoch %llu ignored", m.layer,
             (unsigned long long)m.request_id, (unsigned long long)m.epoch);
    return 0;
  }
  const k3_xfer_desc_t *d = v->desc;
  const uint32_t l0 = m.layer, l1 = m.layer + m.n_layers; /* layers [l0, l1) */
  if (m.flags & XF_MSG_FLAG_LANDED) return on_landed(r, v, l0, l1);
  /* cuda-pull: the bytes are still the sender's; its SRC comes first on the same endpoint (a
   * LAYER that overtook it waits, bounded by the lease). A pull reservation only takes PULL
   * LAYERs. */
  if ((m.flags & XF_MSG_FLAG_PULL) && v->src_refused) return 0; /* the sender redoes it as cuda-ipc */
  if ((m.flags & XF_MSG_FLAG_PULL) && !v->src) return 1;
  if (!(m.flags & XF_MSG_FLAG_PULL) != !v->src) {
    K3_WARN("xfer: request %llu: LAYER %u..%u %s the PULL flag on a %s transfer", (unsigned long long)m.request_id,
            l0, l1 - 1, m.flags & XF_MSG_FLAG_PULL ? "with" : "without", v->src ? "pull" : "push");
    v->verdict = K3_EPROTO;
    return 0;
  }
  if (m.flags & XF_MSG_FLAG_AM_DATA)
    for (uint32_t l = l0; l < l1 && l < d->n_layers; l++)
      if (still_landing(v, false, l)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < d->n_regions; i++) n += d->regions[i].layer >= l0 && d->regions[i].layer < l1;
  if (n != m.n_digests || l1 > d->n_layers) {
    K3_WARN("xfer: request %llu: LAYER %u..%u carries %u digests, those layers have %u regions",
            (unsigned long long)m.request_id, l0, l1 - 1, m.n_digests, n);
    v->verdict = K3_EPROTO;
    return 0;
  }
  if (r->opts.test_before_verify) r->opts.test_before_verify(r->opts.ud, m.request_id);
  uint32_t *dev_regions = malloc((size_t)n * sizeof(uint32_t));
  uint64_t *dev_want = malloc((size_t)n * sizeof(uint64_t));
  uint32_t n_dev = 0, k = 0;
  bool ok = dev_regions && dev_want;
  /* Digests come layer by layer, each layer's regions in ascending order (the sender's). */
  for (uint32_t l = l0; l < l1 && ok; l++) {
    for (uint32_t i = 0; i < d->n_regions && ok; i++) {
      if (d->regions[i].layer != l) continue;
      uint64_t want;
      memcpy(&want, m.digests + 8 * (size_t)k++, 8);
      if (xf_region_dev(v, i) && r->opts.trust_sender_digests && !v->src) { /* measurement mode: not re-read */
        v->known[i] = 1;
        v->vdigest[i] = want;
        continue;
      }
      if (xf_region_dev(v, i)) { /* hashed (cuda-pull: pulled and hashed) by a device job below */
        dev_regions[n_dev] = i;
        dev_want[n_dev++] = want;
        continue;
      }
      uint64_t got = host_digest(r, v, i);
      if (got != want) {
        log_mismatch(v, i, want, got);
        v->verdict = K3_EDIGEST;
        ok = false;
        break;
      }
      v->known[i] = 1;
      v->vdigest[i] = got;
    }
  }
  /* The device part joins the reservation's pending verification (one job for every LAYER of
   * this drive, submitted by xf_recv_jobs_pump or before a DONE is judged), which counts the
   * layer when it completes. A refused job: not verified now; DONE hashes what is left. */
  if (ok && n_dev && v->pend_n + n_dev <= d->n_regions) { /* a repeated LAYER beyond that: DONE hashes */
    memcpy(v->pend_reg + v->pend_n, dev_regions, (size_t)n_dev * sizeof(uint32_t));
    memcpy(v->pend_want + v->pend_n, dev_want, (size_t)n_dev * sizeof(uint64_t));
    v->pend_n += n_dev;
    v->pend_layers += m.n_layers;
  } else if (ok && !n_dev) {
    r->ctx->stats.layers_verified += m.n_layers;
  }
  free(dev_regions);
  free(dev_want);
  return 0;
}

/* ---- DONE -------------------------------------------------------------------------------- */

typedef struct {
  k3_xfer_recv_t *r;
  uint64_t request_id;
  uint32_t region;
} h2d_arg_t;

static int h2d_extent(void *arg, uint64_t off, uintptr_t p, uint64_t n) {
  h2d_arg_t *a = arg;
  return a->r->stage.h2d(a->r->stage.ud, a->request_id, a->region, off, (const void *)p, n);
}

static void ack_to(k3_xfer_recv_t *r, const uint8_t *addr, size_t addr_len, uint64_t request_id, uint64_t epoch,
                   uint64_t send_id, int status) {
  xf_ep_t *e = xf_ep_get(r->ctx, addr, addr_len);
  if (!e) return; /* sender unreachable: it will time out */
  xf_ack_t a = {.request_id = request_id, .epoch = epoch, .send_id = send_id, .status = status};
  size_t len;
  uint8_t *msg = xf_ack_encode(&a, &len);
  if (msg) xf_am_send(e, XF_AM_ACK, msg, len);
  xf_ep_put(e);
}
static void ack(k3_xfer_recv_t *r, const xf_done_t *dm, int status) {
  ack_to(r, dm->addr, dm->addr_len, dm->request_id, dm->epoch, dm->send_id, status);
}

/* Decides on one DONE. Returns 0 (accepted) or the rejection code; counters are updated. */
static int judge(k3_xfer_recv_t *r, const xf_done_t *dm, resv_t **out) {
  k3_xfer_stats_t *st = &r->ctx->stats;
  resv_t *v = xf_resv_find(r, dm->request_id);
  if (!v) {
    st->done_rejected_unknown++;
    return K3_ENOENT;
  }
  if (v->desc->epoch != dm->epoch || v->state != RS_LIVE) { /* not ours, or a duplicate */
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
  if (v->verdict) { /* a LAYER, a DATA or a job of this epoch already failed */
    if (v->verdict == K3_EDIGEST) st->done_rejected_digest++;
    else if (v->verdict == K3_EDEVICE) st->done_rejected_device++;
    else st->done_rejected_malformed++;
    return v->verdict;
  }
  if (!(dm->flags & XF_MSG_FLAG_PULL) != !v->src) { /* a pull DONE without SRC, or the reverse */
    st->done_rejected_malformed++;
    return K3_EPROTO;
  }
  bool hooked = false;
  for (uint32_t i = 0; i < v->desc->n_regions; i++) {
    uint64_t want, got;
    memcpy(&want, dm->digests + 8 * (size_t)i, 8);
    if (v->known[i]) {
      got = v->vdigest[i]; /* hashed over our memory when its LAYER came (or for this DONE) */
    } else if (xf_region_dev(v, i)) { /* on_done hashed every device region first */
      st->done_rejected_device++;
      return K3_EDEVICE;
    } else {
      if (!hooked && r->opts.test_before_verify) r->opts.test_before_verify(r->opts.ud, dm->request_id);
      hooked = true;
      got = host_digest(r, v, i);
    }
    if (got != want) {
      log_mismatch(v, i, want, got);
      st->done_rejected_digest++;
      return K3_EDIGEST;
    }
  }
  if (r->staged) {
    for (uint32_t i = 0; i < v->desc->n_regions; i++) {
      h2d_arg_t a = {r, dm->request_id, i};
      int rc = xf_for_extents(v, i, h2d_extent, &a);
      if (rc) {
        K3_ERROR("xfer: request %llu: host-to-device copy of region %u failed: %s",
                 (unsigned long long)dm->request_id, i, k3_strerror(rc));
        st->done_rejected_device++;
        return K3_EDEVICE;
      }
    }
  }
  st->done_accepted++;
  *out = v;
  return 0;
}

/* Before judging a DONE that would reach the digests: wait for landing bytes and running jobs,
 * and hash the device regions no LAYER covered (one job). 1 = wait, 0 = judge now. */
static int must_wait(k3_xfer_recv_t *r, const xf_done_t *dm) {
  resv_t *v = xf_resv_find(r, dm->request_id);
  if (!v || v->state != RS_LIVE || v->desc->epoch != dm->epoch ||
      v->desc->fingerprint != dm->fingerprint || dm->n_digests != v->desc->n_regions || v->verdict)
    return 0;
  if ((dm->flags & XF_MSG_FLAG_AM_DATA) && still_landing(v, true, 0)) return 1;
  if ((dm->flags & XF_MSG_FLAG_PULL) && !v->src) return 1; /* its SRC has not come (lease bounds) */
  xf_recv_flush_pending(r, v);
  if (v->jobs_out) return 1;
  if (!v->any_dev) return 0;
  uint32_t *left = malloc((size_t)v->desc->n_regions * sizeof(uint32_t)), n = 0;
  if (!left) return 0; /* judge rejects the unhashed device regions (K3_EDEVICE) */
  for (uint32_t i = 0; i < v->desc->n_regions; i++) {
    if (!v->known[i] && xf_region_dev(v, i) && r->opts.trust_sender_digests && !v->src) {
      v->known[i] = 1; /* measurement mode: DONE's digest taken as ours */
      memcpy(&v->vdigest[i], dm->digests + 8 * (size_t)i, 8);
      continue;
    }
    if (!v->known[i] && xf_region_dev(v, i)) left[n++] = i;
  }
  int wait = 0;
  if (n) {
    if (r->opts.test_before_verify) r->opts.test_before_verify(r->opts.ud, dm->request_id);
    if (submit_verify(r, v, left, n, NULL, 0)) v->verdict = K3_EDEVICE;
    else wait = 1;
  }
  free(left);
  return wait;
}

int xf_recv_on_done(k3_xfer_recv_t *r, const uint8_t *msg, size_t len) {
  xf_done_t dm;
  if (xf_done_decode(msg, len, &dm)) {
    r->ctx->stats.done_rejected_malformed++;
    K3_WARN("xfer: malformed DONE (%zu bytes) dropped", len);
    return 0;
  }
  resv_t *rv = xf_resv_find(r, dm.request_id);
  if (rv && rv->state == RS_LIVE && rv->desc->epoch == dm.epoch && rv->src_refused && (dm.flags & XF_MSG_FLAG_PULL)) {
    K3_DEBUG("xfer: pull DONE for request %llu dropped: its sender redoes it as cuda-ipc",
             (unsigned long long)dm.request_id);
    return 0;
  }
  if (must_wait(r, &dm)) return 1;
  resv_t *v = NULL;
  int rc = judge(r, &dm, &v);
  ack(r, &dm, rc);
  XF_TRACE(r->ctx, "recv %llu: DONE judged, ACK %d sent", (unsigned long long)dm.request_id, rc);
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
