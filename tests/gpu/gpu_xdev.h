/* k3k-gpu-xdev: the device digest jobs (kernels/cuda/xdev.cu) against the K3 digest reference.
 * Shared by gpu_xdev.c (correctness) and gpu_xdev_perf.c (--perf).
 * A dlay is one layout (tests/unit/kernels/xdev_layouts.h) on the device: a random source arena
 * (host copy kept for the reference), a destination arena of guard bytes, the job's segments
 * and the expected digests. */
#ifndef GPU_XDEV_H
#define GPU_XDEV_H

#include <stdbool.h>
#include <stdint.h>

#include "k3k.h"
#include "k3k_xdev.h"
#include "xdev_layouts.h"

typedef struct {
  int passed, failed;
  uint64_t seed;
  k3k_backend_t *be;
  int kernel; /* the kernel the checks run (1 or 2, k3k_cuda_xdev_set_kernel); 0: none named */
} xg;

void xg_record(xg *g, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records a failed CUDA call and returns -1 from the caller. */
#define XG_CU(g, call)                                                                        \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      xg_record(g, false, "%s:%d %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return -1;                                                                              \
    }                                                                                         \
  } while (0)

typedef struct {
  xl_layout L;
  uint8_t *h_src;    /* host copy of the source arena */
  uint8_t *d_src;    /* device arenas */
  uint8_t *d_dst;
  k3k_xseg_t *segs;  /* device addresses */
  uint64_t *want;    /* [n_regions] k3_digest_bytes of each region */
} dlay;

/* Takes ownership of L; uploads random bytes (seed) and the guard pattern. 0 or -1 (recorded). */
int dlay_init(xg *g, dlay *D, xl_layout *L, uint64_t seed);
void dlay_free(dlay *D);
/* Digests equal want and the destination arena is exactly as expected. */
bool dlay_check(xg *g, const dlay *D, const uint64_t *got, const char *what);
/* Polls until done (or ~20 s): 1, or the error / 0 on timeout. */
int xg_wait(k3k_xjob_t *j, uint64_t *digests);

/* --perf: the table (gpu_xdev_perf.c), both kernels side by side. */
void xg_perf(xg *g, k3k_xdev_t *x);

#endif
