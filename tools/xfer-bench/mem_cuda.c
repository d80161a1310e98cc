/* k3pd-xfer-bench: the CUDA memory mode (bench.h bench_mem_t "cuda", --device cuda).
 *
 * Sources are device memory of the "cuda" backend, filled from the host with the host mode's
 * pattern. The receiver's pool is the device arena the decode worker would have:
 *   - for cuda-ipc (and auto/staged): a k3k_vmm allocation exported on an fdshare socket, its
 *     mapping blob in the pool (the sender maps it and writes with one device job per layer);
 *     The sources are then an exported k3k_vmm allocation too (served on the sender's own
 *     fdshare socket), so a receiver that offers cuda-pull can map them (src_pool).
 *   - for ucx-cuda: plain device memory (cudaMalloc through the backend) registered with UCX,
 *     which can export it over cuda_ipc (it cannot export VMM allocations).
 * Both processes get the device hooks of common/worker/xdev_hooks.c (the workers' own). The
 * baseline is one synchronous device-to-device copy of the same bytes (cudaMemcpy), best of 3.
 * Everything CUDA is created lazily, after fork(): the receiver is a forked child, and CUDA does
 * not survive a fork, so run one --tls entry per invocation in this mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "k3k.h"
#include "k3k_xdev.h"
#include "k3pd/err.h"
#include "k3pd/fdshare.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "k3pd/xdev_hooks.h"

typedef struct {
  bool vmm_pool;         /* receiver pool as an exported VMM allocation (else plain device memory) */
  k3k_backend_t *be;     /* this process's, created on first use */
  k3_xhooks_t *hooks;
  k3_fdshare_t *fds;     /* receiver: serves the pool's fd */
  k3k_vmm_t *vmm;        /* receiver: the pool */
  void *plain;           /* receiver: the pool (ucx-cuda) */
  void *dst;             /* sender: the baseline's destination */
  uint64_t dst_bytes;
  k3k_vmm_t *svmm;       /* sender (cuda-ipc arena mode): the sources, exported for cuda-pull */
  k3_fdshare_t *sfds;    /* sender: serves the sources' fd */
  uint8_t sblob[K3_XHOOKS_BLOB_MAX];
  uint32_t sblob_len;
  uint64_t sbytes;
} cuda_t;

static int ensure(cuda_t *c) {
  if (c->be) return 0;
  c->be = k3k_backend_get("cuda");
  if (!c->be) {
    fprintf(stderr, "k3pd-xfer-bench: --device cuda: no usable CUDA device\n");
    return K3_EDEVICE;
  }
  int rc = k3_xhooks_open(c->be, &c->hooks);
  if (rc) fprintf(stderr, "k3pd-xfer-bench: device services: %s\n", k3_strerror(rc));
  return rc;
}

/* The sources as one exported VMM allocation served on this (the sender's) fdshare socket, as a
 * prefill worker would export its state arena for cuda-pull. */
static int src_export(cuda_t *c, uint64_t bytes, void **ptr) {
  char path[108], name[] = "bench-src";
  snprintf(path, sizeof path, "/tmp/k3pd-xbench-src-%d.sock", (int)getpid());
  int fd = -1;
  int rc = k3k_vmm_alloc(c->be, bytes, &c->svmm);
  if (!rc) rc = k3k_vmm_export(c->svmm, &fd);
  if (!rc) rc = k3_fdshare_start(path, &c->sfds);
  uint64_t size = rc ? 0 : k3k_vmm_size(c->svmm);
  if (!rc) rc = k3_fdshare_add(c->sfds, name, fd, &size, sizeof size);
  if (fd >= 0) close(fd);
  c->sblob_len = sizeof c->sblob;
  if (!rc) rc = k3_xhooks_blob(c->be, path, name, bytes, c->sblob, &c->sblob_len);
  if (rc) {
    fprintf(stderr, "k3pd-xfer-bench: exported sources of %llu bytes: %s\n", (unsigned long long)bytes, k3_strerror(rc));
    return rc;
  }
  c->sbytes = bytes;
  *ptr = k3k_vmm_ptr(c->svmm);
  return 0;
}

static int src_alloc(void *self, uint64_t bytes, void **ptr) {
  cuda_t *c = self;
  int rc = ensure(c);
  if (rc) return rc;
  if (c->vmm_pool) rc = src_export(c, bytes ? bytes : 64, ptr);
  else rc = c->be->alloc(c->be, bytes ? bytes : 64, ptr);
  if (rc) return rc;
  /* the host mode's pattern, uploaded in 64 MiB pieces */
  uint64_t piece = 64ull << 20;
  uint8_t *h = malloc(piece);
  if (!h) return K3_ENOMEM;
  for (uint64_t off = 0; off < bytes && !rc; off += piece) {
    uint64_t n = bytes - off < piece ? bytes - off : piece;
    for (uint64_t b = 0; b < n; b++) h[b] = (uint8_t)((off + b) * 131 + ((off + b) >> 12));
    rc = k3k_dev_copy(c->be, (uint8_t *)*ptr + off, h, n);
  }
  free(h);
  return rc;
}

static void src_free(void *self, void *ptr, uint64_t bytes) {
  cuda_t *c = self;
  if (c->svmm) {
    k3_fdshare_stop(c->sfds);
    c->sfds = NULL;
    k3k_vmm_free(c->svmm);
    c->svmm = NULL;
    return;
  }
  if (c->be && ptr) c->be->free(c->be, ptr);
}

static int src_pool(void *self, k3_xfer_src_pool_t *out) {
  cuda_t *c = self;
  if (!c->svmm) return K3_ENOTSUP;
  *out = (k3_xfer_src_pool_t){.base = k3k_vmm_ptr(c->svmm), .size_bytes = c->sbytes, .blob = c->sblob,
                              .blob_len = c->sblob_len};
  return 0;
}

static int pool_make(void *self, k3_xfer_ctx_t *ctx, uint64_t bytes, k3_xfer_pool_t **out) {
  cuda_t *c = self;
  int rc = ensure(c);
  if (rc) return rc;
  if (!c->vmm_pool) {
    if ((rc = c->be->alloc(c->be, bytes, &c->plain))) return rc;
    return k3_xfer_pool_register(ctx, c->plain, bytes, K3_XFER_MEM_CUDA, NULL, 0, out);
  }
  char path[108], name[] = "bench-pool";
  snprintf(path, sizeof path, "/tmp/k3pd-xbench-%d.sock", (int)getpid());
  int fd = -1;
  rc = k3k_vmm_alloc(c->be, bytes, &c->vmm);
  if (!rc) rc = k3k_vmm_export(c->vmm, &fd);
  if (!rc) rc = k3_fdshare_start(path, &c->fds);
  uint64_t size = k3k_vmm_size(c->vmm);
  if (!rc) rc = k3_fdshare_add(c->fds, name, fd, &size, sizeof size);
  if (fd >= 0) close(fd);
  uint8_t blob[K3_XHOOKS_BLOB_MAX];
  uint32_t blob_len = sizeof blob;
  if (!rc) rc = k3_xhooks_blob(c->be, path, name, bytes, blob, &blob_len);
  if (!rc) rc = k3_xfer_pool_register(ctx, k3k_vmm_ptr(c->vmm), bytes, K3_XFER_MEM_CUDA, blob, blob_len, out);
  if (rc) fprintf(stderr, "k3pd-xfer-bench: device pool of %llu bytes: %s\n", (unsigned long long)bytes, k3_strerror(rc));
  return rc;
}

static void pool_free(void *self, k3_xfer_pool_t *p) { k3_xfer_pool_free(p); }

static const k3_xfer_dev_t *dev(void *self) {
  cuda_t *c = self;
  return ensure(c) ? NULL : k3_xhooks_dev(c->hooks);
}

static int d2h(void *self, void *dst, const void *src, uint64_t len) {
  cuda_t *c = self;
  int rc = ensure(c);
  return rc ? rc : k3k_dev_copy(c->be, dst, src, len);
}

static double copy_gbps(void *self, const void *src, uint64_t bytes, double *cpu_ms) {
  cuda_t *c = self;
  if (ensure(c)) return 0;
  if (c->dst_bytes < bytes) {
    if (c->dst) c->be->free(c->be, c->dst);
    c->dst = NULL;
    c->dst_bytes = 0;
    if (c->be->alloc(c->be, bytes, &c->dst)) return 0;
    c->dst_bytes = bytes;
  }
  double best = 1e30;
  for (int i = 0; i < 4; i++) { /* the first warms the copy engine up */
    uint64_t t0 = k3_now_ns();
    if (k3k_dev_copy(c->be, c->dst, src, bytes)) return 0;
    double s = (double)(k3_now_ns() - t0) / 1e9;
    if (i && s < best) best = s;
  }
  *cpu_ms = best * 1e3; /* a synchronous copy: the calling thread waits it out */
  return (double)bytes / best / 1e9;
}

static void mem_close(void *self) {
  cuda_t *c = self;
  k3_fdshare_stop(c->fds);
  k3k_vmm_free(c->vmm);
  k3_xhooks_close(c->hooks);
  if (c->be && c->plain) c->be->free(c->be, c->plain);
  if (c->be && c->dst) c->be->free(c->be, c->dst);
  free(c);
}

int bench_mem_cuda(bench_mem_t *out, bool vmm_pool) {
  cuda_t *c = calloc(1, sizeof *c);
  if (!c) return K3_ENOMEM;
  c->vmm_pool = vmm_pool;
  *out = (bench_mem_t){.name = "cuda", .self = c, .src_alloc = src_alloc, .src_free = src_free, .src_pool = src_pool,
                       .pool_make = pool_make, .pool_free = pool_free, .dev = dev, .d2h = d2h,
                       .copy_gbps = copy_gbps, .close = mem_close};
  return 0;
}
