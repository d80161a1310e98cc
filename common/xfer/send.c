/* Sender: pushes a request's regions into the receiver's reserved memory, layer by layer.
 *
 * What it is for: k3_xfer_send_start (path choice: send_dev.c) → k3_xfer_send_layer_ready (per
 * layer, as compute finishes it) → k3_xfer_send_finish. Regions of a signalled layer are handed
 * on in chunks by send_push.c (direct copy into the mapped pool, DATA messages, or puts),
 * hashing exactly those bytes, and/or by a device job (send_dev.c: cuda-ipc copies and hashes,
 * ucx-cuda hashes while DATA messages move the bytes). When all of a layer's chunks and its job
 * completed, the endpoint is flushed (UCX data only) and LAYER (that layer's digests; on cuda-ipc
 * a LANDED LAYER without digests, sent by send_dev.c the moment the job completed) is sent so
 * the receiver verifies it while later layers stream. After every layer was announced it flushes
 * again, and only after that flush completed does it send DONE: neither LAYER nor DONE can
 * overtake data (flush-first by construction). It then waits for the receiver's ACK, whose
 * status is the send's result.
 *
 * What it is not: a retry engine. Any failure (deadline, endpoint error, receiver rejection)
 * completes the send with an error; a failed send with operations in flight tears its endpoint
 * down so nothing queued lands later (other sends to that peer fail too: the peer is suspect).
 *
 * Lifetime: the callback fires once (from the pump, on the loop, never inside an API call); after
 * it the descriptor and sources are the caller's again and are never touched. The struct lives
 * on until every UCX request that points at it has completed and every device job it submitted
 * was released (jobs cannot be cancelled), then it is freed. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "send_int.h"

static void send_free(k3_xfer_send_t *s) {
  for (uint32_t p = 0; p < K3_XFER_MAX_POOLS; p++)
    if (s->rkeys[p]) xf_rkey_put(s->ep, s->rkeys[p]);
  if (s->ep) xf_ep_put(s->ep);
  if (s->dg_ready) k3_digest_free(&s->dg);
  if (s->slots)
    for (uint32_t i = 0; i < s->opts.max_inflight; i++) {
      if (!s->slots[i].stage) continue;
      if (s->stage.host_free) s->stage.host_free(s->stage.ud, s->slots[i].stage);
      else free(s->slots[i].stage);
    }
  free(s->layers);
  free(s->order);
  free(s->job_digests);
  free(s->slots);
  free(s->digest);
  free(s->queue);
  free(s->layer_ready);
  free(s->src_desc);
  free(s);
}

/* Sources must be able to supply every region byte (never dereferenced here). */
static int check_sources(const k3_xfer_desc_t *desc, const k3_xfer_src_t *srcs, bool staged) {
  for (uint32_t r = 0; r < desc->n_regions; r++) {
    const k3_xfer_src_t *sr = &srcs[r];
    const k3_xfer_region_t *rg = &desc->regions[r];
    bool ok = staged || sr->base;
    if (ok && sr->idx) {
      unsigned __int128 cap = (unsigned __int128)sr->n_idx * sr->unit_bytes;
      ok = sr->unit_bytes > 0 && sr->n_idx > 0 && cap >= rg->len_bytes &&
           (sr->n_idx == 1 || sr->unit_bytes <= sr->stride_bytes);
    }
    if (!ok) {
      K3_ERROR("xfer: send of request %llu: source %u cannot supply %llu bytes",
               (unsigned long long)desc->request_id, r, (unsigned long long)rg->len_bytes);
      return K3_EINVAL;
    }
  }
  return 0;
}

/* Groups the regions by layer (order[], each layer's slice) and sizes the per-layer state. */
static int build_layers(k3_xfer_send_t *s) {
  const k3_xfer_desc_t *d = s->desc;
  uint32_t max_n = 0;
  for (uint32_t r = 0; r < d->n_regions; r++) s->layers[d->regions[r].layer].n_regions++;
  for (uint32_t l = 0, at = 0; l < s->n_layers; l++) {
    xf_layer_st_t *ly = &s->layers[l];
    ly->s = s;
    ly->layer = l;
    ly->first_region = at;
    at += ly->n_regions;
    if (ly->n_regions > max_n) max_n = ly->n_regions;
    ly->n_regions = 0; /* refilled below */
  }
  for (uint32_t r = 0; r < d->n_regions; r++) {
    xf_layer_st_t *ly = &s->layers[d->regions[r].layer];
    s->order[ly->first_region + ly->n_regions++] = r;
  }
  (void)max_n;
  s->job_digests = calloc(d->n_regions ? d->n_regions : 1, sizeof(uint64_t)); /* a job may span layers */
  return s->job_digests ? 0 : K3_ENOMEM;
}

int k3_xfer_send_start(k3_xfer_ctx_t *ctx, const k3_xfer_desc_t *desc, const k3_xfer_src_t *srcs,
                       const k3_xfer_send_opts_t *opts, k3_xfer_send_cb cb, void *ud,
                       k3_xfer_send_t **out) {
  if (!ctx || !desc || !srcs || !cb || ctx->closing) return K3_EINVAL;
  k3_xfer_desc_t chk = *desc;
  char err[160];
  if (k3_xfer_desc_validate(&chk, err, sizeof err)) {
    K3_ERROR("xfer: send of request %llu: %s", (unsigned long long)desc->request_id, err);
    return K3_EINVAL;
  }
  k3_xfer_send_opts_t o = opts ? *opts : (k3_xfer_send_opts_t){0};
  if (!o.deadline_ms) o.deadline_ms = 30000;
  if (!o.max_inflight) o.max_inflight = 32;
  if ((unsigned)o.path >= K3_XFER_PATH_COUNT) return K3_EINVAL;
  /* Staging (d2h through host buffers) is for host receiver pools only: device sources into
   * device pools go device to device even when the caller also offers staging hooks (a
   * worker offers both and lets each descriptor decide). */
  bool dev_pools = false;
  for (uint32_t p = 0; p < desc->n_pools; p++) dev_pools |= desc->pools[p].mem == K3_XFER_MEM_CUDA;
  bool staged = o.stage && o.stage->d2h && !(o.dev && dev_pools);
  if (check_sources(desc, srcs, staged)) return K3_EINVAL;
  int64_t left_ms = desc->lease_expiry_ms - k3_wall_ms();
  if (left_ms <= 0) {
    K3_WARN("xfer: send of request %llu: lease already expired", (unsigned long long)desc->request_id);
    return K3_ETIMEDOUT;
  }
  if ((uint64_t)left_ms < o.deadline_ms) o.deadline_ms = (uint32_t)left_ms; /* stop before the lease */

  k3_xfer_send_t *s = calloc(1, sizeof *s);
  if (!s) return K3_ENOMEM;
  s->ctx = ctx;
  s->desc = desc;
  s->srcs = srcs;
  s->opts = o;
  s->staged = staged;
  if (staged) s->stage = *o.stage;
  s->opts.stage = NULL;
  if (o.dev) {
    s->dev = *o.dev;
    s->dev_src = true;
  }
  s->opts.dev = NULL;
  s->cb = cb;
  s->ud = ud;
  s->n_layers = chk.n_layers;
  s->layer_ready = calloc(chk.n_layers, 1);
  s->queue = calloc(desc->n_regions, sizeof(uint32_t));
  s->order = calloc(desc->n_regions, sizeof(uint32_t));
  s->layers = calloc(chk.n_layers, sizeof(xf_layer_st_t));
  s->digest = calloc(desc->n_regions, sizeof(uint64_t));
  s->slots = calloc(o.max_inflight, sizeof(xf_slot_t));
  int rc = K3_ENOMEM;
  if (!s->layer_ready || !s->queue || !s->order || !s->digest || !s->slots || !s->layers) goto fail;
  if (build_layers(s)) goto fail;
  s->ep = xf_ep_get(ctx, desc->worker_addr, desc->worker_addr_len);
  if (!s->ep) {
    rc = K3_EUNAVAIL;
    goto fail;
  }
  rc = xf_send_choose_path(s);
  if (rc) goto fail;
  rc = K3_ENOMEM;
  /* 1 MiB on the host paths: each chunk is hashed right before it is handed on, so the copy or
   * put reads it from cache. 64 MiB on ucx-cuda: every rendezvous costs ~23 us (C-STACK §4). */
  if (!s->opts.chunk_bytes) s->opts.chunk_bytes = s->path == K3_XFER_PATH_UCX_CUDA ? 64ull << 20 : 1ull << 20;
  bool host_hash = !s->dev_src || s->staged;
  if (host_hash) {
    if (k3_digest_init(&s->dg)) goto fail;
    s->dg_ready = true;
  }
  for (uint32_t i = 0; i < o.max_inflight; i++) {
    s->slots[i].s = s;
    if (!staged) continue;
    uint64_t cb_bytes = s->opts.chunk_bytes;
    s->slots[i].stage = s->stage.host_alloc ? s->stage.host_alloc(s->stage.ud, cb_bytes)
                                            : aligned_alloc(4096, (cb_bytes + 4095) & ~4095ull);
    if (!s->slots[i].stage) goto fail;
  }
  s->send_id = ctx->next_send_id++;
  s->res.request_id = desc->request_id;
  s->res.epoch = desc->epoch;
  s->res.path = s->path;
  s->res.t_start_ns = k3_now_ns();
  s->deadline_ns = s->res.t_start_ns + (uint64_t)o.deadline_ms * 1000000ull;
  s->next = ctx->sends;
  ctx->sends = s;
  XF_TRACE(ctx, "send %llu: started (path %s)", (unsigned long long)desc->request_id, k3_xfer_path_name(s->path));
  xf_drive_api(ctx); /* arms the deadline timer */
  *out = s;
  return 0;
fail:
  send_free(s);
  return rc;
}

k3_xfer_path_t k3_xfer_send_path(const k3_xfer_send_t *s) { return s->path; }
bool k3_xfer_send_direct(const k3_xfer_send_t *s) { return s->mode == XM_DIRECT; }
const char *k3_xfer_send_mode(const k3_xfer_send_t *s) {
  switch (s->mode) {
  case XM_DIRECT: return "direct";
  case XM_AM: return "am";
  case XM_PUT: return "put";
  case XM_PULL: return "pull";
  default: return "job";
  }
}

int k3_xfer_send_layer_ready(k3_xfer_send_t *s, uint32_t layer) {
  if (s->phase == PH_FIRED) return s->status ? s->status : K3_EINVAL;
  uint32_t n_layers = s->n_layers;
  if (layer >= n_layers || s->layer_ready[layer]) return K3_EINVAL;
  s->layer_ready[layer] = 1;
  s->layers_signalled++;
  xf_layer_st_t *ly = &s->layers[layer];
  ly->state = LY_PUSHING;
  if (s->dev_src && !s->staged) ly->job_state = XJ_DUE; /* copy+hash or hash-only job */
  if (!xf_send_jobs_only(s)) { /* the host movers hand the regions on (ucx-cuda: DATA) */
    ly->regions_left = ly->n_regions;
    for (uint32_t k = 0; k < ly->n_regions; k++) s->queue[s->q_len++] = s->order[ly->first_region + k];
  }
  if (s->layers_signalled == n_layers) s->res.t_last_layer_ns = k3_now_ns();
  /* cuda-ipc: the job is submitted by the loop's next drive anyway (layers signalled together
   * go as one job), so an API drive here would only progress UCX: 93 layers signalled at
   * once paid 93 of them before the first byte moved. */
  if (xf_send_jobs_only(s)) xf_drive_soon(s->ctx);
  else xf_drive_api(s->ctx);
  return 0;
}

uint32_t k3_xfer_send_layer_regions(const k3_xfer_send_t *s, uint32_t layer) {
  return layer < s->n_layers ? s->layers[layer].n_regions : 0;
}

int k3_xfer_send_layer_ready_digests(k3_xfer_send_t *s, uint32_t layer, const uint64_t *digests,
                                     uint32_t n_digests) {
  if (s->mode != XM_PULL) return k3_xfer_send_layer_ready(s, layer); /* they hash what they move */
  if (s->phase == PH_FIRED) return s->status ? s->status : K3_EINVAL;
  if (layer >= s->n_layers || s->layer_ready[layer] || !digests || n_digests != s->layers[layer].n_regions)
    return K3_EINVAL;
  int rc = k3_xfer_send_layer_ready(s, layer);
  if (rc) return rc;
  xf_layer_st_t *ly = &s->layers[layer];
  for (uint32_t k = 0; k < ly->n_regions; k++) s->digest[s->order[ly->first_region + k]] = digests[k];
  ly->job_state = XJ_NONE; /* the producer hashed it: announced by the next drive */
  return 0;
}

int k3_xfer_send_finish(k3_xfer_send_t *s, uint32_t first_token, float first_logprob) {
  if (s->phase == PH_FIRED) return s->status ? s->status : K3_EINVAL;
  if (s->finish_called || s->layers_signalled != s->n_layers) return K3_EINVAL;
  XF_TRACE(s->ctx, "send %llu: finish called", (unsigned long long)s->desc->request_id);
  s->finish_called = true;
  s->first_token = first_token;
  s->first_logprob = first_logprob;
  xf_drive_api(s->ctx);
  return 0;
}

void k3_xfer_send_cancel(k3_xfer_send_t *s) {
  if (s->phase == PH_FIRED) return;
  if (!s->status) s->status = K3_ECANCELED;
  xf_drive_api(s->ctx);
}

/* ---- UCX completions (record only) ------------------------------------------------------ */

static void layer_flush_cb(void *req, ucs_status_t st, void *ud) {
  xf_layer_st_t *ly = ud;
  k3_xfer_send_t *s = ly->s;
  ly->flush_out = false;
  s->layer_flushes_out--;
  if (st != UCS_OK && !s->status) s->status = st == UCS_ERR_CANCELED ? K3_ECANCELED : K3_ETRANSPORT;
  s->ctx->drive_again = true;
  ucp_request_free(req);
}

static void flush_cb(void *req, ucs_status_t st, void *ud) {
  k3_xfer_send_t *s = ud;
  s->flush_pending = false;
  if (st != UCS_OK && !s->status) s->status = K3_ETRANSPORT;
  s->ctx->drive_again = true;
  ucp_request_free(req);
}

/* ---- pump ------------------------------------------------------------------------------- */

static void fire(k3_xfer_send_t *s, int status) {
  k3_xfer_ctx_t *ctx = s->ctx;
  s->phase = PH_FIRED;
  s->status = status;
  s->res.status = status;
  s->res.t_done_ns = k3_now_ns();
  for (int k = 0; k < K3_XFER_KIND_COUNT; k++)
    s->res.kind_ns[k] = s->kind_last[k] > s->kind_first[k] ? s->kind_last[k] - s->kind_first[k] : 0;
  if (status == 0) ctx->stats.sends_ok++;
  else if (status == K3_ETIMEDOUT) ctx->stats.sends_timed_out++;
  else ctx->stats.sends_failed++;
  if (status == 0 && s->mode == XM_PULL) { /* the receiver's jobs read every byte it verified */
    s->res.bytes = k3_xfer_desc_total_bytes(s->desc);
    for (uint32_t r = 0; r < s->desc->n_regions; r++)
      s->res.kind_bytes[xf_kind_of(&s->desc->regions[r])] += s->desc->regions[r].len_bytes;
  }
  ctx->stats.bytes_put += s->res.bytes;
  ctx->stats.path_bytes[s->path] += s->res.bytes;
  if (status && (s->inflight || s->flush_pending || s->layer_flushes_out)) xf_ep_fail(s->ep); /* cancel what is queued */
  s->cb(s->ud, &s->res);
}


/* cuda-pull: SRC (where our bytes are) goes right before the first LAYER (or DONE), on the same
 * endpoint, so it arrives first. Not at start: a finished state's SRC, LAYER and DONE then reach
 * the receiver together (one wake-up, not two); while a prefill computes, the first layer's
 * announcement carries it. The receiver maps our pools once (cached) when it first sees it. */
static int send_src_msg(k3_xfer_send_t *s) {
  if (s->mode != XM_PULL || s->src_sent) return 0;
  size_t ml;
  uint8_t *msg = xf_src_encode(s->send_id, s->src_desc, (uint32_t)s->src_desc_len, &ml);
  if (!msg) return K3_ENOMEM;
  int rc = xf_am_send(s->ep, XF_AM_SRC, msg, ml);
  if (rc) return rc;
  s->src_sent = true;
  XF_TRACE(s->ctx, "send %llu: SRC sent (%zu bytes)", (unsigned long long)s->desc->request_id, ml);
  return 0;
}

static int send_done_msg(k3_xfer_send_t *s) {
  int src_rc = send_src_msg(s); /* every layer empty: no LAYER carried it */
  if (src_rc) return src_rc;
  const uint8_t *addr;
  size_t addr_len;
  k3_xfer_ctx_address(s->ctx, &addr, &addr_len);
  xf_done_t dm = {.request_id = s->desc->request_id,
                  .epoch = s->desc->epoch,
                  .fingerprint = s->desc->fingerprint,
                  .send_id = s->send_id,
                  .first_token = s->first_token,
                  .first_logprob = s->first_logprob,
                  .flags = s->mode == XM_AM ? XF_MSG_FLAG_AM_DATA : s->mode == XM_PULL ? XF_MSG_FLAG_PULL : 0,
                  .n_digests = s->desc->n_regions,
                  .addr_len = (uint32_t)addr_len,
                  .addr = addr};
  size_t len;
  uint8_t *msg = xf_done_encode(&dm, s->digest, &len);
  if (!msg) return K3_ENOMEM;
  return xf_am_send(s->ep, XF_AM_DONE, msg, len);
}

/* One LAYER for layers l0 .. l0 + nl - 1 (their regions are consecutive in order[]). */
static int send_layer_msg(k3_xfer_send_t *s, uint32_t l0, uint32_t nl) {
  const k3_xfer_desc_t *d = s->desc;
  int src_rc = send_src_msg(s);
  if (src_rc) return src_rc;
  const xf_layer_st_t *ly = &s->layers[l0], *lyn = &s->layers[l0 + nl - 1];
  uint32_t nr = lyn->first_region + lyn->n_regions - ly->first_region;
  uint64_t *dg = s->job_digests; /* scratch: no job of this send is being polled right now */
  for (uint32_t k = 0; k < nr; k++) dg[k] = s->digest[s->order[ly->first_region + k]];
  xf_layer_t m = {.request_id = d->request_id, .epoch = d->epoch, .fingerprint = d->fingerprint,
                  .send_id = s->send_id, .layer = l0, .n_digests = nr, .n_layers = nl,
                  .flags = s->mode == XM_AM ? XF_MSG_FLAG_AM_DATA : s->mode == XM_PULL ? XF_MSG_FLAG_PULL : 0};
  size_t len;
  uint8_t *msg = xf_layer_encode(&m, dg, &len);
  if (!msg) return K3_ENOMEM;
  return xf_am_send(s->ep, XF_AM_LAYER, msg, len);
}

int xf_send_landed_msg(k3_xfer_send_t *s, uint32_t l0, uint32_t nl) {
  const k3_xfer_desc_t *d = s->desc;
  xf_layer_t m = {.request_id = d->request_id, .epoch = d->epoch, .fingerprint = d->fingerprint,
                  .send_id = s->send_id, .layer = l0, .n_digests = 0, .n_layers = nl,
                  .flags = XF_MSG_FLAG_LANDED};
  size_t len;
  uint8_t *msg = xf_layer_encode(&m, NULL, &len);
  if (!msg) return K3_ENOMEM;
  XF_TRACE(s->ctx, "send %llu: LANDED sent for layers %u..%u", (unsigned long long)d->request_id, l0, l0 + nl - 1);
  return xf_am_send(s->ep, XF_AM_LAYER, msg, len);
}

/* Flushes every layer whose bytes were all handed on and completed (and whose device job
 * completed), and announces every flushed layer. cuda-ipc moves no UCX data: no flush. */
static uint64_t advance_layers(k3_xfer_send_t *s) {
  uint64_t work = 0;
  uint32_t ann0 = s->layers_announced;
  for (uint32_t l = 0; l < s->n_layers && !s->status; l++) {
    xf_layer_st_t *ly = &s->layers[l];
    bool complete = ly->regions_left == 0 && ly->puts_out == 0 &&
                    (ly->job_state == XJ_NONE || ly->job_state == XJ_DONE);
    if (ly->state == LY_PUSHING && complete && xf_send_jobs_only(s)) {
      ly->state = LY_FLUSHING;
    } else if (ly->state == LY_PUSHING && complete) {
      ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = layer_flush_cb,
                               .user_data = ly};
      ucs_status_ptr_t req = ucp_ep_flush_nbx(s->ep->ep, &p);
      if (UCS_PTR_IS_ERR(req)) {
        s->status = K3_ETRANSPORT;
        break;
      }
      if (req) {
        ly->flush_out = true;
        s->layer_flushes_out++;
      }
      ly->state = LY_FLUSHING;
      work++;
    }
  }
  /* Announce: one LAYER per run of consecutive layers flushed now (all of a finished state's
   * layers go in one message instead of one each: ~2 us of send and receive per message), at
   * most XF_LAYER_MSG_MAX digests a message. A layer with no regions is announced alone. */
  for (uint32_t l = 0; l < s->n_layers && !s->status;) {
    const xf_layer_st_t *ly = &s->layers[l];
    if (ly->state == LY_FLUSHING && ly->landed) { /* cuda-ipc: LANDED went out; digests in DONE */
      s->layers[l].state = LY_ANNOUNCED;
      s->layers_announced++;
      work++;
      l++;
      continue;
    }
    if (ly->state != LY_FLUSHING || ly->flush_out || ly->n_regions == 0) {
      if (ly->state == LY_FLUSHING && !ly->flush_out) { /* empty layer: nothing to verify */
        s->layers[l].state = LY_ANNOUNCED;
        s->layers_announced++;
        work++;
      }
      l++;
      continue;
    }
    uint32_t nl = 1, nd = ly->n_regions;
    while (l + nl < s->n_layers && s->layers[l + nl].state == LY_FLUSHING && !s->layers[l + nl].flush_out &&
           s->layers[l + nl].n_regions && nd + s->layers[l + nl].n_regions <= XF_LAYER_MSG_MAX)
      nd += s->layers[l + nl++].n_regions;
    int rc = send_layer_msg(s, l, nl);
    if (rc) {
      s->status = rc;
      break;
    }
    for (uint32_t i = 0; i < nl; i++) s->layers[l + i].state = LY_ANNOUNCED;
    s->layers_announced += nl;
    work++;
    l += nl;
  }
  if (s->layers_announced != ann0)
    XF_TRACE(s->ctx, "send %llu: %u layers announced (%u of %u)", (unsigned long long)s->desc->request_id,
             s->layers_announced - ann0, s->layers_announced, s->n_layers);
  return work;
}

/* The receiver offered cuda-pull but cannot map our pools (its SRC answer K3_ENOTSUP): the send
 * goes on as cuda-ipc (try_map proved at start that we map its pools), every layer signalled so
 * far copied and announced anew (LANDED, digests in DONE); the receiver drops what it got as
 * pull. Done once no hash job of ours runs. */
static void pull_fallback(k3_xfer_send_t *s) {
  s->fallback = false;
  s->mode = XM_JOB;
  s->path = s->res.path = K3_XFER_PATH_CUDA_IPC;
  for (uint32_t l = 0; l < s->n_layers; l++) {
    xf_layer_st_t *ly = &s->layers[l];
    if (!s->layer_ready[l]) continue;
    ly->state = LY_PUSHING;
    ly->job_state = XJ_DUE;
    ly->landed = false;
  }
  s->layers_announced = 0;
  if (s->phase == PH_FLUSH || s->phase == PH_WAIT_ACK) s->phase = PH_PUSH;
  s->flush_pending = false;
  s->ctx->stats.pull_fallbacks++;
  K3_WARN("xfer: request %llu epoch %llu: the receiver cannot map our pools; cuda-pull redone as cuda-ipc",
          (unsigned long long)s->desc->request_id, (unsigned long long)s->desc->epoch);
}

static uint64_t pump_one(k3_xfer_send_t *s, uint64_t now) {
  uint64_t work = 0;
  if (s->fallback && !s->status && s->jobs_out == 0) {
    pull_fallback(s);
    work++;
  }
  if (!s->status && s->ep_failed) s->status = K3_ETRANSPORT;
  if (!s->status && now >= s->deadline_ns) {
    K3_WARN("xfer: request %llu epoch %llu: deadline of %u ms exceeded (phase %d)",
            (unsigned long long)s->desc->request_id, (unsigned long long)s->desc->epoch,
            s->opts.deadline_ms, s->phase);
    s->status = K3_ETIMEDOUT;
  }
  if (s->status) {
    if (s->ctx->api_drive) return 0; /* the loop's next drive fires it */
    fire(s, s->status);
    return 1;
  }
  if (s->phase == PH_PUSH) {
    work += xf_send_dev_pump(s, now);
    if (s->status) return work + 1;
    work += xf_send_issue(s);
    if (s->status) return work + 1;
    work += advance_layers(s);
    if (s->status) return work + 1;
    if (s->finish_called && s->q_pos == s->q_len && s->inflight == 0 &&
        s->layers_announced == s->n_layers && xf_send_jobs_only(s)) {
      /* cuda-ipc and cuda-pull moved no UCX data (every byte was written by a job seen complete): nothing to
       * flush, DONE goes in this drive right behind the last LAYER. */
      s->flush_pending = false;
      s->phase = PH_FLUSH;
      work++;
    } else if (s->finish_called && s->q_pos == s->q_len && s->inflight == 0 &&
               s->layers_announced == s->n_layers) {
      ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = flush_cb,
                               .user_data = s};
      ucs_status_ptr_t req = ucp_ep_flush_nbx(s->ep->ep, &p);
      if (UCS_PTR_IS_ERR(req)) {
        s->status = K3_ETRANSPORT;
        return work + 1;
      }
      s->flush_pending = req != NULL;
      s->phase = PH_FLUSH;
      work++;
    }
  }
  if (s->phase == PH_FLUSH && !s->flush_pending) {
    s->res.t_flushed_ns = k3_now_ns();
    int rc = send_done_msg(s);
    XF_TRACE(s->ctx, "send %llu: DONE sent", (unsigned long long)s->desc->request_id);
    if (rc) {
      s->status = rc;
      return work + 1;
    }
    s->phase = PH_WAIT_ACK;
    work++;
  }
  return work;
}

uint64_t xf_send_pump(k3_xfer_ctx_t *ctx, uint64_t now, uint64_t *next_deadline) {
  uint64_t work = 0;
  ctx->spin_ack = false;
  /* Failed endpoints nobody references any more (e.g. ACK endpoints) are closed here. */
  for (xf_ep_t *e = ctx->eps, *nx; e; e = nx) {
    nx = e->next;
    if (e->failed && e->refs == 0) xf_ep_fail(e);
  }
  for (k3_xfer_send_t **pp = &ctx->sends; *pp;) {
    k3_xfer_send_t *s = *pp;
    if (s->phase != PH_FIRED) work += pump_one(s, now);
    else if (s->jobs_out) work += xf_send_dev_pump(s, now); /* only polls: jobs cannot be cancelled */
    if (s->phase == PH_FIRED && s->inflight == 0 && !s->flush_pending && !s->layer_flushes_out &&
        s->jobs_out == 0) {
      *pp = s->next;
      send_free(s);
      continue;
    }
    if (s->phase == PH_WAIT_ACK && xf_send_jobs_only(s) && now < s->res.t_flushed_ns + XF_ACK_SPIN_NS)
      ctx->spin_ack = true;
    if (s->phase == PH_FIRED) { /* draining jobs: their notify wakes us; tick as a backstop */
      if (now + XF_TICK_NS < *next_deadline) *next_deadline = now + XF_TICK_NS;
    } else {
      uint64_t due = s->deadline_ns < now + XF_TICK_NS ? s->deadline_ns : now + XF_TICK_NS;
      if (due < *next_deadline) *next_deadline = due;
    }
    pp = &s->next;
  }
  return work;
}

void xf_send_on_ack(k3_xfer_ctx_t *ctx, const uint8_t *msg, size_t len) {
  xf_ack_t a;
  if (xf_ack_decode(msg, len, &a)) {
    K3_WARN("xfer: malformed ACK (%zu bytes) ignored", len);
    return;
  }
  for (k3_xfer_send_t *s = ctx->sends; s; s = s->next) {
    if (s->send_id == a.send_id && s->phase != PH_FIRED && s->mode == XM_PULL && a.status == K3_ENOTSUP &&
        s->desc->request_id == a.request_id && s->desc->epoch == a.epoch) {
      XF_TRACE(ctx, "send %llu: cuda-pull refused (receiver cannot map): falling back", (unsigned long long)a.request_id);
      s->fallback = true; /* the next drive switches to cuda-ipc */
      ctx->drive_again = true;
      return;
    }
    if (s->send_id != a.send_id || s->phase != PH_WAIT_ACK) continue;
    if (s->desc->request_id != a.request_id || s->desc->epoch != a.epoch) break;
    XF_TRACE(ctx, "send %llu: ACK %d received", (unsigned long long)a.request_id, a.status);
    if (a.status)
      K3_WARN("xfer: request %llu epoch %llu rejected by the receiver: %s",
              (unsigned long long)a.request_id, (unsigned long long)a.epoch, k3_errname(a.status));
    fire(s, a.status);
    return;
  }
  K3_DEBUG("xfer: ACK for unknown send %llu ignored", (unsigned long long)a.send_id);
}

void xf_send_on_ep_failed(k3_xfer_ctx_t *ctx, xf_ep_t *e) {
  for (k3_xfer_send_t *s = ctx->sends; s; s = s->next)
    if (s->ep == e) s->ep_failed = true;
}

void xf_send_shutdown_all(k3_xfer_ctx_t *ctx) {
  for (k3_xfer_send_t *s = ctx->sends; s; s = s->next)
    if (s->phase != PH_FIRED) fire(s, K3_ESHUTDOWN);
  /* Forced closes complete the cancelled requests, so inflight drops to zero. */
  for (xf_ep_t *e = ctx->eps, *nx; e; e = nx) {
    nx = e->next;
    xf_ep_fail(e);
  }
  while (ctx->sends) {
    k3_xfer_send_t *s = ctx->sends;
    ctx->sends = s->next;
    if (s->inflight || s->flush_pending || s->layer_flushes_out)
      K3_WARN("xfer: shutdown with %u requests outstanding on request %llu", s->inflight,
              (unsigned long long)s->res.request_id);
    xf_send_dev_release_all(s); /* waits for running device jobs (dev->release) */
    send_free(s);
  }
}
