/* Where the decode worker receives a sequence's state (docs/gpu-cluster.md §2, transfer.md).
 *
 * Two layouts, chosen at start-up (--xfer-receive):
 *   arena  (zero copy, the default): every descriptor region points straight into the runner's
 *          state arena, where the model reads it: on host backends the arena is memory UCX
 *          allocated (a same-host sender maps it and copies once); on cuda it is a CUDA VMM
 *          allocation exported on this worker's fdshare socket (its descriptor pool carries the
 *          mapping blob: a prefill worker on the same GPU writes into it with one device job
 *          per layer, cuda-ipc) and registered with UCX when UCX has CUDA (ucx-cuda). Verified
 *          by device digest jobs; admission only adopts the page and slot ids.
 *   staged (cuda only, for senders that can reach neither): the old host receive area, page-
 *          major (page p holds every MLA layer's rows of its tokens) and slot-major; the engine
 *          copies the verified state into the runner's device pools at admission
 *          (dc_pools_import).
 * What it is not: the page/slot allocator (main.c's free lists) or the transfer protocol.
 * Threads: setup and layout on the loop thread; dc_pools_import on the engine thread (it reads
 * the receive area, whose reservation the loop no longer touches once it is READY). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dc.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"

const char *dc_receive_name(int mode) {
  switch (mode) {
  case DC_RECV_ARENA_HOST: return "host arena (zero copy)";
  case DC_RECV_ARENA_DEVICE: return "device arena (zero copy)";
  case DC_RECV_STAGED: return "staged host area (copied to the device at admission)";
  default: return "?";
  }
}

int dc_pools_plan(dc_worker_t *w, k3_load_opts_t *mo, const char *receive, const char *ipc_dir, char *err,
                  size_t errlen) {
  bool cuda = mo->backend && !strcmp(mo->backend, "cuda");
  if (strcmp(receive, "auto") && strcmp(receive, "arena") && strcmp(receive, "staged")) {
    snprintf(err, errlen, "--xfer-receive: expected auto, arena or staged, got \"%s\"", receive);
    return K3_EINVAL;
  }
  if (!cuda && !strcmp(receive, "staged")) {
    snprintf(err, errlen, "--xfer-receive staged: only for --backend cuda (host workers receive in place)");
    return K3_EINVAL;
  }
  if (cuda && !strcmp(receive, "staged")) {
    w->recv_mode = DC_RECV_STAGED;
    return 0;
  }
  char why[256];
  int rc = k3_spools_plan(&w->sp, w->xfer, mo, ipc_dir, why, sizeof why);
  if (rc == K3_ENOTSUP && !strcmp(receive, "auto")) {
    K3_WARN("no --ipc-dir and UCX without CUDA: receiving through a host area (staged; slower)");
    w->recv_mode = DC_RECV_STAGED;
    return 0;
  }
  if (rc) {
    snprintf(err, errlen, "--xfer-receive arena on cuda: %s", why);
    return rc;
  }
  w->recv_mode = cuda ? DC_RECV_ARENA_DEVICE : DC_RECV_ARENA_HOST;
  return 0;
}

/* The receive area of the staged layout (setup_staged) and its per-region placement. */
static int setup_staged(dc_worker_t *w, char *err, size_t errlen) {
  const k3_manifest_t *m = w->manifest;
  uint64_t off_kv = 0, off_kda = 0;
  for (size_t i = 0; i < m->n; i++) {
    bool mla = m->regions[i].kind == K3_REGION_MLA_LATENT;
    w->rpool[i] = mla ? 0 : 1;
    w->roff[i] = mla ? off_kv : off_kda;
    if (mla) off_kv += m->regions[i].bytes;
    else off_kda += m->regions[i].bytes;
  }
  /* A model without MLA (or KDA) layers still gets a one-row pool so descriptors stay uniform. */
  w->kv_stride = off_kv ? off_kv : 64;
  w->kda_stride = off_kda ? off_kda : 64;
  for (size_t i = 0; i < m->n; i++) w->rstride[i] = w->rpool[i] ? w->kda_stride : w->kv_stride;
  uint64_t kv_rows = off_kv ? (uint64_t)w->num_pages : 1;
  int rc = k3_xfer_pool_alloc_host(w->xfer, kv_rows * w->kv_stride, &w->pools[0]);
  if (!rc) rc = k3_xfer_pool_alloc_host(w->xfer, (uint64_t)w->num_slots * w->kda_stride, &w->pools[1]);
  if (rc) {
    snprintf(err, errlen, "registering the receive area with UCX: %s", k3_strerror(rc));
    return rc;
  }
  w->n_pools = 2;
  return 0;
}

int dc_pools_setup(dc_worker_t *w, char *err, size_t errlen) {
  const k3_manifest_t *m = w->manifest;
  size_t n = m->n ? m->n : 1;
  w->rpool = calloc(n, 1);
  w->roff = calloc(n, sizeof *w->roff);
  w->rstride = calloc(n, sizeof *w->rstride);
  w->free_pages = malloc((size_t)w->num_pages * sizeof *w->free_pages);
  w->free_slots = malloc((size_t)w->num_slots * sizeof *w->free_slots);
  if (!w->rpool || !w->roff || !w->rstride || !w->free_pages || !w->free_slots) return K3_ENOMEM;
  int rc = 0;
  if (w->recv_mode == DC_RECV_STAGED) {
    rc = setup_staged(w, err, errlen);
  } else {
    if (w->recv_mode == DC_RECV_ARENA_DEVICE && (rc = k3_xhooks_open(k3_runner_backend(w->runner), &w->hooks))) {
      snprintf(err, errlen, "device transfer services on the GPU: %s", k3_strerror(rc));
      return rc;
    }
    rc = k3_spools_setup(&w->sp, w->runner, "decode", err, errlen);
    for (size_t i = 0; i < m->n && !rc; i++) {
      w->rpool[i] = 0;
      w->roff[i] = w->sp.roff[i];
      w->rstride[i] = w->sp.rstride[i];
    }
    w->pools[0] = w->sp.pool;
    w->n_pools = 1;
  }
  if (rc) return rc;
  /* Hand out low ids first (stack: push in reverse). */
  for (int i = 0; i < w->num_pages; i++) w->free_pages[i] = w->num_pages - 1 - i;
  w->n_free_pages = w->num_pages;
  for (int i = 0; i < w->num_slots; i++) w->free_slots[i] = w->num_slots - 1 - i;
  w->n_free_slots = w->num_slots;
  return 0;
}

void dc_pools_free(dc_worker_t *w) {
  if (w->recv_mode == DC_RECV_STAGED) {
    for (uint32_t p = 0; p < 2; p++) {
      k3_xfer_pool_free(w->pools[p]);
      w->pools[p] = NULL;
    }
  } else {
    k3_spools_free(&w->sp); /* a host arena is the runner's */
    w->pools[0] = NULL;
  }
}

void dc_pools_close_hooks(dc_worker_t *w) {
  k3_xhooks_close(w->hooks);
  w->hooks = NULL;
}

int dc_pools_layout(dc_worker_t *w, const dc_req_t *q, uint32_t *slot_idx, k3_xfer_layout_t *lay,
                    k3_xfer_region_t *regs) {
  const k3_manifest_t *m = w->manifest;
  memset(lay, 0, sizeof *lay);
  lay->n_pools = w->n_pools;
  for (uint32_t p = 0; p < w->n_pools; p++) lay->pools[p] = w->pools[p];
  /* the tokens the prefill worker computes: the whole prompt, or its first xfer_tokens (split) */
  uint32_t xt = q->split ? q->xfer_tokens : q->n_prompt;
  /* a long-suffix resume: pages [0, resume) are shared from the cache here; only the later ones
   * are the prefill worker's to write */
  uint32_t skip = q->resume / (uint32_t)w->page_tokens;
  uint32_t prompt_pages = (uint32_t)((xt + (uint32_t)w->page_tokens - 1) / (uint32_t)w->page_tokens) - skip;
  lay->n_lists = 2;
  lay->lists[0].n = prompt_pages;
  lay->lists[0].idx = (uint32_t *)q->pages + skip; /* copied by reserve */
  slot_idx[0] = (uint32_t)q->slot;
  lay->lists[1].n = 1;
  lay->lists[1].idx = slot_idx;
  /* Region i of page/slot id lives at pool base + roff[i] + id * rstride[i]. */
  for (size_t i = 0; i < m->n; i++) {
    const k3_region_t *rg = &m->regions[i];
    bool mla = rg->kind == K3_REGION_MLA_LATENT;
    regs[i] = (k3_xfer_region_t){
        .kind = mla ? K3_XFER_KIND_MLA_KV : rg->kind == K3_REGION_KDA_STATE ? K3_XFER_KIND_KDA_S : K3_XFER_KIND_KDA_CONV,
        .pool = w->rpool[i],
        .list = mla ? 0 : 1,
        .layer = (uint32_t)rg->layer,
        .offset_bytes = w->roff[i],
        .stride_bytes = w->rstride[i],
        .unit_bytes = rg->bytes,
        .len_bytes = mla ? (uint64_t)prompt_pages * rg->bytes : rg->bytes};
  }
  lay->n_regions = (uint32_t)m->n;
  lay->regions = regs;
  return 0;
}

/* Staged layout only: copies the verified state from the receive area into the runner's pools
 * (same page/slot ids) through the runner's import API. */
int dc_pools_import(dc_worker_t *w, k3_seq_t *seq, uint8_t **buf, size_t *cap) {
  const k3_manifest_t *m = w->manifest;
  const uint8_t *kv = k3_xfer_pool_base(w->pools[0]), *kda = k3_xfer_pool_base(w->pools[1]);
  for (size_t i = 0; i < m->n; i++) {
    const k3_region_t *rg = &m->regions[i];
    uint64_t need = k3_runner_region_bytes(w->runner, (int)i, seq->len);
    if (need > *cap) {
      uint8_t *nb = realloc(*buf, need);
      if (!nb) return K3_ENOMEM;
      *buf = nb;
      *cap = need;
    }
    if (rg->kind == K3_REGION_MLA_LATENT) {
      uint64_t np = need / rg->bytes;
      for (uint64_t p = 0; p < np; p++)
        memcpy(*buf + p * rg->bytes, kv + (uint64_t)seq->pages[p] * w->rstride[i] + w->roff[i], rg->bytes);
    } else {
      memcpy(*buf, kda + (uint64_t)seq->slot * w->rstride[i] + w->roff[i], rg->bytes);
    }
    int rc = k3_runner_import_region(w->runner, seq, (int)i, *buf, need);
    if (rc) return rc;
  }
  return 0;
}
