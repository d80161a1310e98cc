/* Sender: the choice of data path, and the device jobs of the cuda-ipc and ucx-cuda paths.
 *
 * What it is for: xf_send_choose_path decides, once per send, how the bytes move (the table in
 * xfer.h, k3_xfer_send_start) and logs it; a forced path that cannot serve the descriptor, or a
 * combination no path serves, fails the start with K3_ENOTSUP and a line saying why. For the
 * device paths, xf_send_dev_pump submits one job per signalled layer through the caller's hooks
 * (k3_xfer_dev_t):
 *   cuda-ipc: segments src → mapped destination for all the layer's regions (split wherever
 *             either side's unit ends); the job copies and hashes. Once it is seen complete
 *             (a poll without digests) a LANDED LAYER goes out at once, then its digests are
 *             collected for DONE. No UCX data moves at all.
 *   ucx-cuda: a hash-only job over the layer's sources (dst NULL); the bytes travel as DATA
 *             rendezvous messages from device memory (send_push.c) in parallel; the layer is
 *             announced after both finished (send.c).
 * and polls the running ones (their notify wakes the loop through k3_xfer_ctx_wake).
 *
 * What it is not: device code. Nothing here dereferences a source or destination address: they
 * are computed (uintptr_t arithmetic) and handed to the hooks.
 *
 * Invariants: a job is never submitted once the send has a status or its deadline passed (the
 * deadline is clamped to the lease); a submitted job is always polled to completion and released
 * (jobs cannot be cancelled), for a fired send too, so s->jobs_out == 0 before the send is freed;
 * after the callback fired, nothing here touches the descriptor or the sources. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "send_int.h"

/* ---- path choice ------------------------------------------------------------------------ */

typedef struct {
  bool used[K3_XFER_MAX_POOLS];
  bool any_host, any_cuda;
} pools_seen_t;

static void seen_pools(const k3_xfer_desc_t *d, pools_seen_t *ps) {
  memset(ps, 0, sizeof *ps);
  for (uint32_t r = 0; r < d->n_regions; r++) ps->used[d->regions[r].pool] = true;
  for (uint32_t p = 0; p < d->n_pools; p++) {
    if (!ps->used[p]) continue;
    if (d->pools[p].mem == K3_XFER_MEM_CUDA) ps->any_cuda = true;
    else ps->any_host = true;
  }
}

/* Host and staged paths: direct when every used pool maps here as one contiguous block (same
 * host, shm), else DATA messages, or puts when asked. Unpacks the rkeys it needs. */
static int choose_host_mode(k3_xfer_send_t *s, const pools_seen_t *ps, char *why, size_t wl) {
  const k3_xfer_desc_t *d = s->desc;
  bool all_rkeys = true;
  for (uint32_t p = 0; p < d->n_pools; p++) {
    if (!ps->used[p]) continue;
    if (!d->pools[p].rkey_len) {
      all_rkeys = false;
      continue;
    }
    ucs_status_t st;
    s->rkeys[p] = xf_rkey_get(s->ep, d->pools[p].rkey, d->pools[p].rkey_len, &st);
    if (!s->rkeys[p]) {
      K3_ERROR("xfer: send of request %llu: rkey of pool %u rejected: %s",
               (unsigned long long)d->request_id, p, xf_ucs_str(st));
      return K3_EPROTO;
    }
  }
  if (s->opts.puts_only) {
    if (!all_rkeys) {
      k3_fmt(why, wl, "puts_only, but a pool has no rkey");
      return K3_ENOTSUP;
    }
    s->mode = XM_PUT;
    return 0;
  }
  bool direct = all_rkeys;
  for (uint32_t p = 0; p < d->n_pools && direct; p++) {
    if (!ps->used[p]) continue;
    uint64_t last = d->pools[p].size_bytes - 1;
    void *p0 = NULL, *p1 = NULL;
    if (ucp_rkey_ptr(s->rkeys[p]->h, d->pools[p].base_addr, &p0) != UCS_OK ||
        ucp_rkey_ptr(s->rkeys[p]->h, d->pools[p].base_addr + last, &p1) != UCS_OK ||
        (uint8_t *)p1 != (uint8_t *)p0 + last)
      direct = false;
    else
      s->dbase[p] = p0;
  }
  /* No mapping (tcp, another host): Debian's UCX emulates puts on tcp (~1.4 GB/s, needs target
   * progress, C-STACK.md P9) while AM rendezvous moves 5-9 GB/s, so send DATA messages the
   * receiver places itself. */
  s->mode = direct ? XM_DIRECT : XM_AM;
  return 0;
}

/* cuda-ipc is possible when the hooks map every used pool from its blob. */
static bool try_map(k3_xfer_send_t *s, const pools_seen_t *ps, char *why, size_t wl) {
  const k3_xfer_desc_t *d = s->desc;
  if (!s->dev.map) {
    k3_fmt(why, wl, "no map hook");
    return false;
  }
  for (uint32_t p = 0; p < d->n_pools; p++) {
    if (!ps->used[p]) continue;
    if (!d->pools[p].blob_len) {
      k3_fmt(why, wl, "pool %u has no mapping blob", p);
      return false;
    }
    void *base = NULL;
    int rc = s->dev.map(s->dev.ud, d->pools[p].blob, d->pools[p].blob_len, d->pools[p].size_bytes, true, &base);
    if (rc || !base) {
      k3_fmt(why, wl, "pool %u not mappable here (%s)", p, rc ? k3_errname(rc) : "NULL base");
      return false;
    }
    s->dbase[p] = base;
  }
  return true;
}

/* cuda-pull: the source descriptor SRC carries (our exported pools, and where each region's
 * bytes lie in them), encoded into s->src_desc. False with a reason when a source lies outside
 * every exported pool or the sources need more than K3_XFER_MAX_LISTS index lists. */
static bool build_src_desc(k3_xfer_send_t *s, char *why, size_t wl) {
  const k3_xfer_desc_t *d = s->desc;
  const k3_xfer_src_pool_t *sp = s->opts.src_pools;
  uint32_t np = s->opts.n_src_pools;
  k3_xfer_desc_t *x = k3_xfer_desc_new();
  static uint32_t zero = 0;
  bool ok = false;
  if (!x || !(x->regions = calloc(d->n_regions, sizeof *x->regions))) {
    k3_fmt(why, wl, "out of memory");
    goto out;
  }
  x->request_id = d->request_id;
  x->epoch = d->epoch;
  x->lease_expiry_ms = d->lease_expiry_ms;
  x->fingerprint = d->fingerprint;
  const uint8_t *addr;
  size_t addr_len;
  k3_xfer_ctx_address(s->ctx, &addr, &addr_len);
  x->worker_addr = (uint8_t *)addr; /* borrowed for the encode; detached before the free */
  x->worker_addr_len = (uint32_t)addr_len;
  x->n_pools = np;
  for (uint32_t p = 0; p < np; p++)
    x->pools[p] = (k3_xfer_pool_desc_t){.base_addr = (uint64_t)(uintptr_t)sp[p].base, .size_bytes = sp[p].size_bytes,
                                        .mem = K3_XFER_MEM_CUDA, .blob_len = sp[p].blob_len,
                                        .blob = (uint8_t *)sp[p].blob}; /* borrowed likewise */
  /* Index lists: one per distinct (idx, count) of the sources; contiguous sources share a
   * one-entry list {0} with unit = stride = len. */
  const uint32_t *lidx[K3_XFER_MAX_LISTS];
  x->n_regions = d->n_regions;
  for (uint32_t r = 0; r < d->n_regions; r++) {
    const k3_xfer_src_t *sr = &s->srcs[r];
    const k3_xfer_region_t *rg = &d->regions[r];
    uintptr_t a = (uintptr_t)sr->base + sr->offset_bytes;
    uint32_t p = 0;
    while (p < np && !(a >= (uintptr_t)sp[p].base && a - (uintptr_t)sp[p].base < sp[p].size_bytes)) p++;
    if (p == np) {
      k3_fmt(why, wl, "source of region %u lies in none of the %u exported pools", r, np);
      goto out;
    }
    const uint32_t *idx = sr->idx ? sr->idx : &zero;
    uint64_t unit = sr->idx ? sr->unit_bytes : rg->len_bytes;
    uint32_t n = sr->idx ? (uint32_t)((rg->len_bytes + unit - 1) / unit) : 1;
    uint32_t l = 0;
    while (l < x->n_lists && !(lidx[l] == idx && x->lists[l].n == n)) l++;
    if (l == x->n_lists) {
      if (l == K3_XFER_MAX_LISTS) {
        k3_fmt(why, wl, "the sources use more than %u index lists", K3_XFER_MAX_LISTS);
        goto out;
      }
      lidx[l] = idx;
      x->lists[l] = (k3_xfer_index_list_t){.n = n, .idx = (uint32_t *)idx}; /* borrowed */
      x->n_lists++;
    }
    x->regions[r] = (k3_xfer_region_t){.kind = rg->kind, .pool = p, .list = l, .layer = rg->layer,
                                       .offset_bytes = a - (uintptr_t)sp[p].base,
                                       .stride_bytes = sr->idx ? sr->stride_bytes : unit,
                                       .unit_bytes = unit, .len_bytes = rg->len_bytes};
  }
  char err[160];
  if (k3_xfer_desc_validate(x, err, sizeof err)) {
    k3_fmt(why, wl, "sources do not fit the exported pools: %s", err);
    goto out;
  }
  if (k3_xfer_desc_encode(x, &s->src_desc, &s->src_desc_len)) {
    k3_fmt(why, wl, "source descriptor not encodable");
    goto out;
  }
  ok = true;
out:
  if (x) { /* detach what was borrowed */
    x->worker_addr = NULL;
    for (uint32_t p = 0; p < K3_XFER_MAX_POOLS; p++) x->pools[p].blob = NULL;
    for (uint32_t l = 0; l < K3_XFER_MAX_LISTS; l++) x->lists[l].idx = NULL;
    k3_xfer_desc_free(x);
  }
  return ok;
}

/* cuda-pull is possible when the receiver offers it, we export the sources' pools, the
 * receiver's pools map here (the same host and GPU, so ours map there: the blobs are of one
 * kind) and every source lies inside an exported pool. */
static bool pull_ok(k3_xfer_send_t *s, const pools_seen_t *ps, char *why, size_t wl) {
  if (!(s->desc->flags & K3_XFER_DESC_F_PULL)) {
    k3_fmt(why, wl, "the receiver does not offer it");
    return false;
  }
  if (s->ctx->pull_off) {
    k3_fmt(why, wl, "off (K3PD_XFER_PULL=0)");
    return false;
  }
  if (!s->opts.n_src_pools || !s->opts.src_pools || s->opts.n_src_pools > K3_XFER_MAX_POOLS) {
    k3_fmt(why, wl, "no exported source pools (send opts src_pools)");
    return false;
  }
  for (uint32_t p = 0; p < s->opts.n_src_pools; p++)
    if (!s->opts.src_pools[p].blob_len || s->opts.src_pools[p].blob_len > K3_XFER_MAX_BLOB_BYTES ||
        !s->opts.src_pools[p].blob || !s->opts.src_pools[p].size_bytes) {
      k3_fmt(why, wl, "exported source pool %u has no mapping blob or size", p);
      return false;
    }
  char mw[160] = "";
  if (!try_map(s, ps, mw, sizeof mw)) {
    k3_fmt(why, wl, "receiver not on this host and GPU (%s)", mw);
    return false;
  }
  return build_src_desc(s, why, wl);
}

static bool ucx_cuda_ok(const k3_xfer_send_t *s, const pools_seen_t *ps, char *why, size_t wl) {
  if (!s->ctx->cuda_capable) {
    k3_fmt(why, wl, "this UCX has no CUDA memory support");
    return false;
  }
  for (uint32_t p = 0; p < s->desc->n_pools; p++)
    if (ps->used[p] && !s->desc->pools[p].rkey_len) {
      k3_fmt(why, wl, "pool %u was not registered with CUDA UCX by the receiver (no rkey)", p);
      return false;
    }
  return true;
}

int xf_send_choose_path(k3_xfer_send_t *s) {
  const k3_xfer_desc_t *d = s->desc;
  k3_xfer_path_t want = s->opts.path;
  pools_seen_t ps;
  seen_pools(d, &ps);
  char why[200] = "", why2[200] = "", whyp[200] = "";
  int rc = 0;
  if (ps.any_host && ps.any_cuda) {
    k3_fmt(why, sizeof why, "the receiver's pools mix host and device memory");
    rc = K3_ENOTSUP;
  } else if (ps.any_host) { /* into host pools: host sources, or device sources staged */
    s->path = s->staged ? K3_XFER_PATH_STAGED : K3_XFER_PATH_HOST;
    if (s->dev_src && !s->staged) {
      k3_fmt(why, sizeof why, "device sources into host pools need staging hooks (stage d2h)");
      rc = K3_ENOTSUP;
    } else if (want != K3_XFER_PATH_AUTO && want != s->path) {
      k3_fmt(why, sizeof why, "path %s forced, but these sources into host pools take %s",
             k3_xfer_path_name(want), k3_xfer_path_name(s->path));
      rc = K3_ENOTSUP;
    } else {
      rc = choose_host_mode(s, &ps, why, sizeof why);
    }
  } else if (!s->dev_src || s->staged) {
    k3_fmt(why, sizeof why, "host%s sources into device pools: no path (needs device sources "
           "and device hooks)", s->staged ? " (staged)" : "");
    rc = K3_ENOTSUP;
  } else if (want == K3_XFER_PATH_HOST || want == K3_XFER_PATH_STAGED) {
    k3_fmt(why, sizeof why, "path %s forced, but device sources into device pools take cuda-ipc "
           "or ucx-cuda", k3_xfer_path_name(want));
    rc = K3_ENOTSUP;
  } else if (!s->dev.submit || !s->dev.poll || !s->dev.release) {
    k3_fmt(why, sizeof why, "device sources without submit/poll/release hooks");
    rc = K3_ENOTSUP;
  } else if ((want == K3_XFER_PATH_AUTO || want == K3_XFER_PATH_CUDA_PULL) &&
             pull_ok(s, &ps, whyp, sizeof whyp)) {
    s->path = K3_XFER_PATH_CUDA_PULL;
    s->mode = XM_PULL;
  } else if (want == K3_XFER_PATH_CUDA_PULL) {
    k3_fmt(why, sizeof why, "path cuda-pull forced: %s", whyp);
    rc = K3_ENOTSUP;
  } else if ((want == K3_XFER_PATH_AUTO || want == K3_XFER_PATH_CUDA_IPC) &&
             try_map(s, &ps, why, sizeof why)) {
    s->path = K3_XFER_PATH_CUDA_IPC;
    s->mode = XM_JOB;
  } else if ((want == K3_XFER_PATH_AUTO || want == K3_XFER_PATH_UCX_CUDA) &&
             ucx_cuda_ok(s, &ps, why2, sizeof why2)) {
    s->path = K3_XFER_PATH_UCX_CUDA;
    s->mode = XM_AM;
  } else {
    char tmp[200];
    k3_fmt(tmp, sizeof tmp, "%s", why);
    k3_fmt(why, sizeof why, "device to device%s%s: cuda-ipc: %s; ucx-cuda: %s",
           want ? ", forced " : "", want ? k3_xfer_path_name(want) : "",
           want == K3_XFER_PATH_UCX_CUDA ? "not allowed" : tmp[0] ? tmp : "not tried",
           want == K3_XFER_PATH_CUDA_IPC ? "not allowed" : why2[0] ? why2 : "not tried");
    rc = K3_ENOTSUP;
  }
  if (rc) {
    if (rc == K3_ENOTSUP)
      K3_ERROR("xfer: send of request %llu: no data path: %s", (unsigned long long)d->request_id, why);
    return rc;
  }
  K3_DEBUG("xfer: send of request %llu epoch %llu: path %s, mode %s%s%s%s%s%s",
           (unsigned long long)d->request_id, (unsigned long long)d->epoch,
           k3_xfer_path_name(s->path), k3_xfer_send_mode(s), whyp[0] ? " (cuda-pull: " : "",
           whyp[0] ? whyp : "", whyp[0] ? ")" : "", why[0] ? " (cuda-ipc: " : "", why[0] ? why : "");
  /* The first send on each path (and every change of path) is logged at info: the operator
   * sees which path a worker pair uses, and why pull was not chosen. */
  if (s->ctx->last_path != (int)s->path) {
    K3_INFO("xfer: sends now use path %s (mode %s)%s%s%s", k3_xfer_path_name(s->path), k3_xfer_send_mode(s),
            whyp[0] && s->path == K3_XFER_PATH_CUDA_IPC ? "; cuda-pull not chosen: " : "",
            whyp[0] && s->path == K3_XFER_PATH_CUDA_IPC ? whyp : "", "");
    s->ctx->last_path = (int)s->path;
  }
  return 0;
}

/* ---- device jobs ------------------------------------------------------------------------- */

/* Segments of the regions order[r0 .. r0 + nr) (whole layers): region by region, each region's
 * byte stream cut wherever the source or (cuda-ipc) the destination stops being contiguous. */
static int build_segs(k3_xfer_send_t *s, uint32_t r0, uint32_t nr, k3_xfer_seg_t **segs_out,
                      uint32_t **first_out, uint32_t *n_out, uint64_t *bytes_out) {
  const k3_xfer_desc_t *d = s->desc;
  bool copy = s->mode == XM_JOB;
  uint32_t cap = 64, n = 0;
  k3_xfer_seg_t *segs = malloc(cap * sizeof *segs);
  uint32_t *first = malloc(((size_t)nr + 1) * sizeof *first);
  uint64_t bytes = 0;
  if (!segs || !first) goto oom;
  for (uint32_t k = 0; k < nr; k++) {
    uint32_t r = s->order[r0 + k];
    const k3_xfer_region_t *rg = &d->regions[r];
    first[k] = n;
    for (uint64_t off = 0; off < rg->len_bytes;) {
      uint64_t pool_off = 0, len = rg->len_bytes - off;
      if (copy) len = xf_region_run(d, r, off, len, &pool_off);
      uintptr_t src = xf_src_addr(&s->srcs[r], off, len, &len);
      if (n == cap) {
        k3_xfer_seg_t *ns = realloc(segs, 2 * (size_t)cap * sizeof *segs);
        if (!ns) goto oom;
        segs = ns;
        cap *= 2;
      }
      segs[n++] = (k3_xfer_seg_t){.src = (const void *)src,
                                  .dst = copy ? (void *)((uintptr_t)s->dbase[rg->pool] + pool_off) : NULL,
                                  .len = len};
      off += len;
    }
    bytes += rg->len_bytes;
    s->res.kind_bytes[xf_kind_of(rg)] += copy ? rg->len_bytes : 0; /* ucx-cuda: counted as sent */
  }
  first[nr] = n;
  *segs_out = segs;
  *first_out = first;
  *n_out = n;
  *bytes_out = bytes;
  return 0;
oom:
  free(segs);
  free(first);
  return K3_ENOMEM;
}

/* One job for the consecutive layers l0 .. l0 + nl - 1 (all due): a layer's job costs a launch
 * and a completion round trip of a few microseconds whatever its size, so layers signalled
 * together (a transfer of a finished state, or layers that finished while a job was being
 * submitted) go as one. */
static int submit_group(k3_xfer_send_t *s, uint32_t l0, uint32_t nl) {
  xf_layer_st_t *ly0 = &s->layers[l0], *lyn = &s->layers[l0 + nl - 1];
  uint32_t r0 = ly0->first_region, nr = lyn->first_region + lyn->n_regions - r0;
  k3_xfer_seg_t *segs;
  uint32_t *first, n;
  uint64_t bytes;
  int rc = build_segs(s, r0, nr, &segs, &first, &n, &bytes);
  if (rc) return rc;
  void *job = NULL;
  uint64_t t0 = k3_now_ns();
  rc = s->dev.submit(s->dev.ud, segs, first, nr, xf_job_notify(s->ctx), s->ctx, &job);
  XF_TRACE(s->ctx, "send %llu: job for layers %u..%u submitted (%u regions, %u segments, %llu bytes, %.1f us "
           "in submit)", (unsigned long long)s->desc->request_id, l0, l0 + nl - 1, nr, n,
           (unsigned long long)bytes, (double)(k3_now_ns() - t0) / 1e3);
  free(segs);
  free(first);
  if (rc) {
    s->ctx->stats.dev_jobs_failed++;
    K3_ERROR("xfer: request %llu: device job for layers %u..%u (%u segments) refused: %s",
             (unsigned long long)s->desc->request_id, l0, l0 + nl - 1, n, k3_errname(rc));
    return K3_EDEVICE;
  }
  s->ctx->stats.dev_jobs++;
  s->ctx->jobs_running++;
  ly0->job = job;
  ly0->group_n = nl;
  for (uint32_t i = 0; i < nl; i++) {
    s->layers[l0 + i].job_state = XJ_OUT;
    s->layers[l0 + i].group_head = l0;
  }
  s->jobs_out++;
  if (s->mode == XM_JOB) s->res.bytes += bytes; /* ucx-cuda counts the DATA it sends instead */
  uint64_t now = k3_now_ns();
  for (uint32_t k = 0; k < nr; k++) {
    uint32_t kind = xf_kind_of(&s->desc->regions[s->order[r0 + k]]);
    if (!s->kind_first[kind]) s->kind_first[kind] = now;
  }
  return 0;
}

/* Polls the job headed by layer l0; 1 when it finished (released). Digests are kept unless
 * the send already fired. */
static int poll_group(k3_xfer_send_t *s, uint32_t l0) {
  xf_layer_st_t *ly0 = &s->layers[l0];
  uint32_t nl = ly0->group_n;
  /* cuda-ipc: the moment the copy job is complete and visible, tell the receiver (LANDED) so
   * its verification starts while we still combine our digests (~70 us for an 8K state). */
  if (s->mode == XM_JOB && !ly0->landed && s->phase != PH_FIRED && !s->status) {
    int d = s->dev.poll(s->dev.ud, ly0->job, NULL);
    if (d == 0) return 0;
    if (d == 1) {
      int rc = xf_send_landed_msg(s, l0, nl);
      if (rc) s->status = rc;
      for (uint32_t i = 0; i < nl; i++) s->layers[l0 + i].landed = rc == 0;
    }
  }
  int rc = s->dev.poll(s->dev.ud, ly0->job, s->job_digests);
  if (rc == 0) return 0;
  s->dev.release(s->dev.ud, ly0->job);
  ly0->job = NULL;
  for (uint32_t i = 0; i < nl; i++) s->layers[l0 + i].job_state = XJ_DONE;
  s->jobs_out--;
  s->ctx->jobs_running--;
  if (s->phase == PH_FIRED) return 1; /* desc may be gone: record nothing */
  if (rc < 0) {
    s->ctx->stats.dev_jobs_failed++;
    K3_ERROR("xfer: request %llu: device job for layers %u..%u failed: %s",
             (unsigned long long)s->desc->request_id, l0, l0 + nl - 1, k3_errname(rc));
    if (!s->status) s->status = K3_EDEVICE;
    return 1;
  }
  const xf_layer_st_t *lyn = &s->layers[l0 + nl - 1];
  uint32_t r0 = ly0->first_region, nr = lyn->first_region + lyn->n_regions - r0;
  uint64_t now = k3_now_ns();
  XF_TRACE(s->ctx, "send %llu: job for layers %u..%u seen done", (unsigned long long)s->desc->request_id, l0,
           l0 + nl - 1);
  for (uint32_t k = 0; k < nr; k++) {
    uint32_t r = s->order[r0 + k];
    s->digest[r] = s->job_digests[k];
    s->kind_last[xf_kind_of(&s->desc->regions[r])] = now;
  }
  return 1;
}

static uint64_t layer_bytes(const k3_xfer_send_t *s, uint32_t l) {
  const xf_layer_st_t *ly = &s->layers[l];
  uint64_t b = 0;
  for (uint32_t k = 0; k < ly->n_regions; k++) b += s->desc->regions[s->order[ly->first_region + k]].len_bytes;
  return b;
}

uint64_t xf_send_dev_pump(k3_xfer_send_t *s, uint64_t now) {
  uint64_t work = 0;
  if (!s->dev_src || s->staged) return 0;
  /* Jobs run in submission order on the hooks' one stream, and groups are submitted in layer
   * order: poll from the oldest and stop at the first still running (a drive costs one query,
   * not one per job in flight). */
  for (uint32_t l = 0; l < s->n_layers; l++) {
    xf_layer_st_t *ly = &s->layers[l];
    if (ly->job_state != XJ_OUT || ly->group_head != l) continue;
    if (!poll_group(s, l)) break;
    work++;
  }
  /* Submit from the loop's drive, not inside an API call: layers signalled in one loop
   * iteration (several engine messages drained together, or a finished state) then go as one
   * job. xf_drive_api schedules that drive at once (idle handle). */
  if (s->ctx->api_drive) return work;
  for (uint32_t l = 0; l < s->n_layers;) {
    if (s->layers[l].job_state != XJ_DUE || s->phase == PH_FIRED || s->status) {
      l++;
      continue;
    }
    if (now >= s->deadline_ns) break; /* pump_one fails the send; never submit late */
    /* A group stops at job_max_bytes (K3PD_XFER_JOB_MIB; 0 = no limit) so that the first
     * layers are announced, and verified by the receiver, while later ones still copy. */
    uint32_t nl = 1;
    uint64_t gb = layer_bytes(s, l), cap = s->ctx->job_max_bytes;
    while (l + nl < s->n_layers && s->layers[l + nl].job_state == XJ_DUE && (!cap || gb < cap))
      gb += layer_bytes(s, l + nl++);
    int rc = submit_group(s, l, nl);
    if (rc) {
      s->status = rc;
      break;
    }
    work++;
    l += nl;
  }
  return work;
}

void xf_send_dev_release_all(k3_xfer_send_t *s) {
  for (uint32_t l = 0; l < s->n_layers && s->jobs_out; l++) {
    xf_layer_st_t *ly = &s->layers[l];
    if (ly->job_state != XJ_OUT || ly->group_head != l) continue;
    s->dev.release(s->dev.ud, ly->job); /* waits for it */
    ly->job = NULL;
    for (uint32_t i = 0; i < ly->group_n; i++) s->layers[l + i].job_state = XJ_DONE;
    s->jobs_out--;
    s->ctx->jobs_running--;
  }
}
