/* A worker's runner state arena as one k3_xfer pool (k3pd/spools.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/spools.h"
#include "k3pd/util.h"
#include "k3pd/xdev_hooks.h"

/* Host backends: the runner's state arena comes from UCX (called once by the runner's init). */
static void *arena_alloc(void *ud, size_t bytes) {
  k3_spools_t *sp = ud;
  if (k3_xfer_pool_alloc_host(sp->xfer, bytes, &sp->pool)) return NULL;
  return k3_xfer_pool_base(sp->pool);
}

static void arena_free(void *ud, void *p) {
  k3_spools_t *sp = ud;
  if (sp->pool && k3_xfer_pool_base(sp->pool) == p) {
    k3_xfer_pool_free(sp->pool);
    sp->pool = NULL;
  }
}

int k3_spools_plan(k3_spools_t *sp, k3_xfer_ctx_t *x, k3_load_opts_t *mo, const char *ipc_dir, char *err,
                   size_t errlen) {
  memset(sp, 0, sizeof *sp);
  sp->xfer = x;
  if (!(mo->backend && !strcmp(mo->backend, "cuda"))) {
    sp->host = true;
    mo->state = (k3_runner_arena_opts_t){.alloc = arena_alloc, .free = arena_free, .ud = sp};
    return 0;
  }
  bool ipc = ipc_dir && *ipc_dir && strcmp(ipc_dir, "none");
  if (!ipc && !k3_xfer_ctx_cuda_capable(x)) {
    snprintf(err, errlen, "the device state arena is reachable by peers only through --ipc-dir (same host) or a "
                          "UCX with CUDA (this one lists no CUDA memory)");
    return K3_ENOTSUP;
  }
  sp->device = true;
  /* VMM: exportable to same-host peers. Without an ipc dir the arena is plain device memory
   * UCX's cuda_ipc can export (it cannot export VMM allocations). */
  mo->state = (k3_runner_arena_opts_t){.vmm = ipc};
  snprintf(sp->ipc_dir, sizeof sp->ipc_dir, "%s", ipc ? ipc_dir : "");
  return 0;
}

/* Exports the device arena on this process's fdshare socket and registers it as the pool. */
static int setup_device(k3_spools_t *sp, k3_runner_t *r, const char *role, void *base, size_t bytes, char *err,
                        size_t errlen) {
  k3k_backend_t *be = k3_runner_backend(r);
  uint8_t blob[K3_XHOOKS_BLOB_MAX];
  uint32_t blob_len = 0;
  int rc = 0;
  if (sp->ipc_dir[0]) {
    if (mkdir(sp->ipc_dir, 0700) && errno != EEXIST) {
      snprintf(err, errlen, "--ipc-dir %s: %s", sp->ipc_dir, strerror(errno));
      return K3_EIO;
    }
    char path[320], name[64];
    uint64_t id = k3_hash64(&base, sizeof base, (uint64_t)k3_now_ns() ^ (uint64_t)getpid());
    int pl = snprintf(path, sizeof path, "%s/%s-%d-%08x.sock", sp->ipc_dir, role, (int)getpid(),
                      (unsigned)(id >> 32));
    if (pl < 0 || pl >= 108) { /* sockaddr_un.sun_path */
      snprintf(err, errlen, "--ipc-dir %s: too long for a Unix socket path", sp->ipc_dir);
      return K3_EINVAL;
    }
    snprintf(name, sizeof name, "state-%016llx", (unsigned long long)id);
    int fd = -1;
    rc = k3k_vmm_export(k3_runner_state_vmm(r), &fd);
    if (!rc) rc = k3_fdshare_start(path, &sp->fds);
    if (!rc) rc = k3_fdshare_add(sp->fds, name, fd, &bytes, sizeof bytes);
    if (fd >= 0) close(fd);
    blob_len = sizeof blob;
    if (!rc) rc = k3_xhooks_blob(be, path, name, bytes, blob, &blob_len);
    if (rc) {
      snprintf(err, errlen, "exporting the state arena on %s: %s", path, k3_strerror(rc));
      return rc;
    }
    K3_INFO("state arena (%.1f MiB) exported as %s on %s", (double)bytes / 1048576.0, name, path);
  }
  rc = k3_xfer_pool_register(sp->xfer, base, bytes, K3_XFER_MEM_CUDA, blob, blob_len, &sp->pool);
  if (rc) {
    snprintf(err, errlen, "registering the device state arena: %s", k3_strerror(rc));
    return rc;
  }
  if (blob_len <= sizeof sp->blob) {
    memcpy(sp->blob, blob, blob_len);
    sp->blob_len = blob_len;
  }
  return 0;
}

bool k3_spools_src_pool(const k3_spools_t *sp, k3_xfer_src_pool_t *out) {
  if (!sp->device || !sp->pool || sp->blob_len == 0) return false;
  *out = (k3_xfer_src_pool_t){.base = k3_xfer_pool_base(sp->pool),
                              .size_bytes = k3_xfer_pool_size(sp->pool),
                              .blob = sp->blob,
                              .blob_len = sp->blob_len};
  return true;
}

int k3_spools_setup(k3_spools_t *sp, k3_runner_t *r, const char *role, char *err, size_t errlen) {
  const k3_manifest_t *m = k3_runner_manifest(r);
  sp->n = m->n;
  sp->roff = calloc(m->n ? m->n : 1, sizeof *sp->roff);
  sp->rstride = calloc(m->n ? m->n : 1, sizeof *sp->rstride);
  if (!sp->roff || !sp->rstride) {
    snprintf(err, errlen, "out of memory");
    return K3_ENOMEM;
  }
  void *base = NULL;
  size_t bytes = 0;
  k3_runner_state_arena(r, &base, &bytes);
  for (size_t i = 0; i < m->n; i++) { /* each region's own pool tensor inside the arena */
    void *rb;
    size_t stride, count;
    int rc = k3_runner_pool_mem(r, (int)i, &rb, &stride, &count);
    if (rc) {
      snprintf(err, errlen, "the runner's pool of region %zu: %s", i, k3_strerror(rc));
      return rc;
    }
    sp->roff[i] = (uint64_t)((uint8_t *)rb - (uint8_t *)base);
    sp->rstride[i] = stride;
  }
  if (sp->device) return setup_device(sp, r, role, base, bytes, err, errlen);
  if (!sp->pool || k3_xfer_pool_base(sp->pool) != base) {
    snprintf(err, errlen, "the runner's state arena is not the UCX-allocated memory");
    return K3_EINTERNAL;
  }
  return 0;
}

void k3_spools_free(k3_spools_t *sp) {
  if (sp->device) k3_xfer_pool_free(sp->pool); /* a host arena is the runner's (arena_free) */
  if (sp->device) sp->pool = NULL;
  k3_fdshare_stop(sp->fds);
  sp->fds = NULL;
  free(sp->roff);
  free(sp->rstride);
  sp->roff = sp->rstride = NULL;
}
