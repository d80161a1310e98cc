/* The kernels of the device digest jobs (kernels/cuda/xdev_kernels.cu) as the job code
 * (kernels/cuda/xdev.cu) launches them: one call per job, whatever the kernel and the way the
 * chunk table travels.
 * What it is not: public (private to kernels/cuda), or aware of jobs, slots and events.
 * Kernels: 1 = a warp per chunk (kernels/core/xxh3_warp.h, the first design); 2 = a half-warp
 * per chunk, lanes owning accumulators (kernels/core/xxh3_half.h, the default). Both compute
 * the same chunk digests bit for bit; K3PD_XDEV_KERNEL picks one at k3k_xdev_open. */
#ifndef K3K_XDEV_KERNELS_H
#define K3K_XDEV_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "core/xdev_plan.h"

/* Table entries passed in the kernel's parameter block, by size class; beyond XK_NI_BIG the
 * table is uploaded to device memory first. */
#define XK_NI_SMALL 8  /* ~300-byte parameter block */
#define XK_NI_MID 120  /* 4 KB: the classic parameter limit */
#define XK_NI_BIG 248  /* 8 KB (CUDA >= 12.1 allows 32,764 bytes): an 8K-token MLA layer, 128 pages */

/* How a job's table travelled (k3k_cuda_xdev_last_path). */
enum { XK_PATH_NONE = 0, XK_PATH_SMALL = 1, XK_PATH_MID = 2, XK_PATH_BIG = 3, XK_PATH_DEVICE = 4 };

typedef struct {
  uint32_t cap_warps[4]; /* kernel 2: warps resident on the device at once, per path 1..4 */
} k3k_xk_caps;

/* Uploads the XXH3 constants to the device (on st, waited for) and measures kernel 2's
 * occupancy on `device`. 0 or K3_EDEVICE. */
int k3k_xk_setup(cudaStream_t st, int device, k3k_xk_caps *caps);
/* Queues the job's kernel on st: n_chunks chunk digests (n_chunks >= 1) to out (device view
 * of mapped host memory) from the n_ent-entry table hent (pinned host; n_groups groups first).
 * Tables over XK_NI_BIG entries are first copied to dent (device, >= n_ent entries) on st.
 * kernel is 1 or 2; *path says how the table travelled. 0 or K3_EDEVICE. */
int k3k_xk_launch(cudaStream_t st, const k3k_xk_caps *caps, int kernel, uint32_t n_chunks,
                  uint32_t n_groups, const k3k_xent *hent, size_t n_ent, k3k_xent *dent,
                  uint64_t *out, int *path);

#endif
