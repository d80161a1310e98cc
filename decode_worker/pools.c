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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Host backends: the runner's state arena comes from UCX (called once by the runner's init). */
static void *arena_alloc(void *ud, size_t bytes) {
  dc_worker_t *w = ud;
  if (k3_xfer_pool_alloc_host(w->xfer, bytes, &w->pools[0])) return NULL;
  w->n_pools = 1;
  return k3_xfer_pool_base(w->pools[0]);
}
static void arena_free(void *ud, void *p) {
  dc_worker_t *w = ud;
  if (w->pools[0] && k3_xfer_pool_base(w->pools[0]) == p) {
    k3_xfer_pool_free(w->pools[0]);
    w->pools[0] = NULL;
    w->n_pools = 0;
  }
}

int dc_pools_plan(dc_worker_t *w, k3_load_opts_t *mo, const char *receive, const char *ipc_dir, char *err,
                  size_t errlen) {
  bool cuda = mo->backend && !strcmp(mo->backend, "cuda");
  if (strcmp(receive, "auto") && strcmp(receive, "arena") && strcmp(receive, "staged")) {
    snprintf(err, errlen, "--xfer-receive: expected auto, arena or staged, got \"%s\"", receive);
    return K3_EINVAL;
  }
  if (!cuda) {
    if (!strcmp(receive, "staged")) {
      snprintf(err, errlen, "--xfer-receive staged: only for --backend cuda (host workers receive in place)");
      return K3_EINVAL;
    }
    w->recv_mode = DC_RECV_ARENA_HOST;
    mo->state = (k3_runner_arena_opts_t){.alloc = arena_alloc, .free = arena_free, .ud = w};
    return 0;
  }
  bool ipc = ipc_dir && *ipc_dir && strcmp(ipc_dir, "none");
  bool ucx = k3_xfer_ctx_cuda_capable(w->xfer);
  if (!strcmp(receive, "staged") || (!strcmp(receive, "auto") && !ipc && !ucx)) {
    if (!strcmp(receive, "auto"))
      K3_WARN("no --ipc-dir and UCX without CUDA: receiving through a host area (staged; slower)");
    w->recv_mode = DC_RECV_STAGED;
    return 0;
  }
  if (!ipc && !ucx) {
    snprintf(err, errlen, "--xfer-receive arena on cuda needs --ipc-dir (same-host senders) or a UCX with CUDA "
                          "(this one lists no CUDA memory)");
    return K3_EINVAL;
  }
  w->recv_mode = DC_RECV_ARENA_DEVICE;
  /* VMM: exportable to same-host senders. Without --ipc-dir the arena is plain device memory
   * UCX's cuda_ipc can export (it cannot export VMM allocations). */
  mo->state = (k3_runner_arena_opts_t){.vmm = ipc};
  snprintf(w->ipc_dir, sizeof w->ipc_dir, "%s", ipc ? ipc_dir : "");
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

/* Exports the device arena on this worker's fdshare socket and registers it as the one pool. */
static int setup_device(dc_worker_t *w, void *base, size_t bytes, char *err, size_t errlen) {
  k3k_backend_t *be = k3_runner_backend(w->runner);
  uint8_t blob[K3_XHOOKS_BLOB_MAX];
  uint32_t blob_len = 0;
  int rc = k3_xhooks_open(be, &w->hooks);
  if (rc) {
    snprintf(err, errlen, "device transfer services on the GPU: %s", k3_strerror(rc));
    return rc;
  }
  if (w->ipc_dir[0]) {
    if (mkdir(w->ipc_dir, 0700) && errno != EEXIST) {
      snprintf(err, errlen, "--ipc-dir %s: %s", w->ipc_dir, strerror(errno));
      return K3_EIO;
    }
    char path[320], name[64];
    uint64_t id = k3_hash64(&base, sizeof base, (uint64_t)k3_now_ns() ^ (uint64_t)getpid());
    int pl = snprintf(path, sizeof path, "%s/decode-%d-%08x.sock", w->ipc_dir, (int)getpid(), (unsigned)(id >> 32));
    if (pl < 0 || pl >= 108) { /* sockaddr_un.sun_path */
      snprintf(err, errlen, "--ipc-dir %s: too long for a Unix socket path", w->ipc_dir);
      return K3_EINVAL;
    }
    snprintf(name, sizeof name, "state-%016llx", (unsigned long long)id);
    int fd = -1;
    rc = k3k_vmm_export(k3_runner_state_vmm(w->runner), &fd);
    if (!rc) rc = k3_fdshare_start(path, &w->fds);
    if (!rc) rc = k3_fdshare_add(w->fds, name, fd, &bytes, sizeof bytes);
    if (fd >= 0) close(fd);
    blob_len = sizeof blob;
    if (!rc) rc = k3_xhooks_blob(be, path, name, bytes, blob, &blob_len);
    if (rc) {
      snprintf(err, errlen, "exporting the state arena on %s: %s", path, k3_strerror(rc));
      return rc;
    }
    K3_INFO("state arena (%.1f MiB) exported as %s on %s", (double)bytes / 1048576.0, name, path);
  }
  rc = k3_xfer_pool_register(w->xfer, base, bytes, K3_XFER_MEM_CUDA, blob, blob_len, &w->pools[0]);
  if (rc) {
    snprintf(err, errlen, "registering the device state arena: %s", k3_strerror(rc));
    return rc;
  }
  w->n_pools = 1;
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
    void *base = NULL;
    size_t bytes = 0;
    k3_runner_state_arena(w->runner, &base, &bytes);
    for (size_t i = 0; i < m->n && !rc; i++) { /* each region's own pool tensor inside the arena */
      void *rb;
      size_t stride, count;
      rc = k3_runner_pool_mem(w->runner, (int)i, &rb, &stride, &count);
      w->rpool[i] = 0;
      w->roff[i] = (uint64_t)((uint8_t *)rb - (uint8_t *)base);
      w->rstride[i] = stride;
    }
    if (!rc && w->recv_mode == DC_RECV_ARENA_DEVICE) rc = setup_device(w, base, bytes, err, errlen);
    else if (!rc && (!w->pools[0] || k3_xfer_pool_base(w->pools[0]) != base)) {
      snprintf(err, errlen, "the runner's state arena is not the UCX-allocated memory");
      rc = K3_EINTERNAL;
    }
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
  for (uint32_t p = 0; p < 2; p++) {
    if (w->recv_mode == DC_RECV_ARENA_HOST && p == 0) continue; /* the runner frees it (arena_free) */
    k3_xfer_pool_free(w->pools[p]);
    w->pools[p] = NULL;
  }
  k3_fdshare_stop(w->fds);
  w->fds = NULL;
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
  uint32_t prompt_pages = (uint32_t)((xt + (uint32_t)w->page_tokens - 1) / (uint32_t)w->page_tokens);
  lay->n_lists = 2;
  lay->lists[0].n = prompt_pages;
  lay->lists[0].idx = (uint32_t *)q->pages; /* copied by reserve */
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
