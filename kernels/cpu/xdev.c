/* k3k_xdev (k3k_xdev.h): the front end of every backend, and the host implementation.
 *
 * What it is for: the argument checks (one place, kernels/core/xdev_plan.c, so both
 * implementations refuse the same inputs before doing anything), dispatch to the CUDA
 * implementation (kernels/cuda/xdev.cu) for the "cuda" backend, and the jobs of host backends
 * ("cpu", "cpu-fast", and every backend of a build without CUDA): k3k_xdev_submit runs the job
 * there and then over host memory with the K3 digest reference (k3_digest_update, or
 * k3_digest_copy when dst is set: one pass over the source, streaming stores, a store fence at
 * the end), calls notify before returning, and the job only holds the digests.
 * What it is not: a thread pool. A host job runs on the caller's thread, like the CPU worker's
 * transfer path did before (a 650 MiB sequence costs ~0.1 s of one core).
 * k3k_device_uuid / k3k_device_mem live here too: K3_ENOTSUP on host backends. */
#include <stdlib.h>
#include <string.h>

#include "core/xdev_int.h"
#include "core/xdev_plan.h"
#include "k3pd/digest.h"
#include "k3pd/err.h"

typedef struct {
  k3k_xdev_t base;
  k3_digest_t dg; /* reused by every job (an xdev is used by one thread at a time) */
} host_xdev;

typedef struct {
  k3k_xjob_t base;
  uint32_t n_regions;
  uint64_t dig[]; /* [n_regions] */
} host_xjob;

#ifdef K3K_HAVE_CUDA
static bool is_cuda(const k3k_backend_t *be) { return be->name && !strcmp(be->name, "cuda"); }
#endif

int k3k_xdev_open(k3k_backend_t *be, k3k_xdev_t **out) {
  if (!be || !out) return K3_EINVAL;
#ifdef K3K_HAVE_CUDA
  if (is_cuda(be)) return k3k_cuda_xdev_open(be, out);
#endif
  if (!be->host_memory) return K3_ENOTSUP;
  host_xdev *x = calloc(1, sizeof *x);
  if (!x) return K3_ENOMEM;
  if (k3_digest_init(&x->dg)) {
    free(x);
    return K3_ENOMEM;
  }
  *out = &x->base;
  return 0;
}

void k3k_xdev_close(k3k_xdev_t *x) {
  if (!x) return;
#ifdef K3K_HAVE_CUDA
  if (x->device) {
    k3k_cuda_xdev_close(x);
    return;
  }
#endif
  host_xdev *h = (host_xdev *)x;
  k3_digest_free(&h->dg);
  free(h);
}

bool k3k_xdev_on_device(const k3k_xdev_t *x) { return x && x->device; }

int k3k_xdev_submit(k3k_xdev_t *x, const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                    void (*notify)(void *ud), void *ud, k3k_xjob_t **out) {
  if (!x || !out) return K3_EINVAL;
  int rc = k3k_xdev_check(segs, first, n_regions);
  if (rc) return rc;
#ifdef K3K_HAVE_CUDA
  if (x->device) return k3k_cuda_xdev_submit(x, segs, first, n_regions, notify, ud, out);
#endif
  host_xdev *h = (host_xdev *)x;
  host_xjob *j = malloc(sizeof *j + (size_t)n_regions * sizeof j->dig[0]);
  if (!j) return K3_ENOMEM;
  j->base.device = false;
  j->n_regions = n_regions;
  for (uint32_t r = 0; r < n_regions; r++) {
    k3_digest_reset(&h->dg);
    for (uint32_t i = first[r]; i < first[r + 1]; i++) {
      if (!segs[i].len) continue;
      if (segs[i].dst)
        k3_digest_copy(&h->dg, segs[i].dst, segs[i].src, segs[i].len);
      else
        k3_digest_update(&h->dg, segs[i].src, segs[i].len);
    }
    j->dig[r] = k3_digest_final(&h->dg);
  }
  *out = &j->base;
  if (notify) notify(ud);
  return 0;
}

int k3k_xdev_poll(k3k_xjob_t *j, uint64_t *digests) {
  if (!j) return K3_EINVAL;
#ifdef K3K_HAVE_CUDA
  if (j->device) return k3k_cuda_xdev_poll(j, digests);
#endif
  host_xjob *h = (host_xjob *)j;
  if (h->n_regions && digests) memcpy(digests, h->dig, (size_t)h->n_regions * sizeof h->dig[0]);
  return 1; /* digests NULL: only "done" */
}

void k3k_xdev_job_free(k3k_xjob_t *j) {
  if (!j) return;
#ifdef K3K_HAVE_CUDA
  if (j->device) {
    k3k_cuda_xdev_job_free(j);
    return;
  }
#endif
  free(j);
}

int k3k_device_uuid(k3k_backend_t *be, uint8_t uuid[16]) {
  if (!be || !uuid) return K3_EINVAL;
#ifdef K3K_HAVE_CUDA
  if (is_cuda(be)) return k3k_cuda_device_uuid(be, uuid);
#endif
  return K3_ENOTSUP;
}

int k3k_device_mem(k3k_backend_t *be, size_t *free_bytes, size_t *total_bytes) {
  if (!be || !free_bytes || !total_bytes) return K3_EINVAL;
#ifdef K3K_HAVE_CUDA
  if (is_cuda(be)) return k3k_cuda_device_mem(be, free_bytes, total_bytes);
#endif
  return K3_ENOTSUP;
}
