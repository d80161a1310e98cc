/* Hooks of the CUDA k3k_xdev implementation (kernels/cuda/xdev.cu, xdev_bench.cu) for the GPU
 * test program (tests/gpu/gpu_xdev.c): the job stream for timing, pool statistics, the kernel
 * choice, and the kernels the perf table compares against.
 * What it is not: API. Workers use k3k_xdev.h only. */
#ifndef K3K_XDEV_CUDA_H
#define K3K_XDEV_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k_xdev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The stream the xdev's jobs run on (NULL for a host xdev). */
cudaStream_t k3k_cuda_xdev_stream(k3k_xdev_t *x);
/* Buffer sets (slots) the xdev allocated so far: jobs in flight at once, at most. */
size_t k3k_cuda_xdev_slots(k3k_xdev_t *x);
/* How the last submitted job's table travelled: 0 no kernel, 1 small kernel parameter
 * (<= 8 entries), 2 4 KB parameter (<= 120), 3 8 KB parameter (<= 248), 4 device copy. */
int k3k_cuda_xdev_last_path(k3k_xdev_t *x);
/* The kernel later jobs run: 1 (a warp per chunk) or 2 (a half-warp per chunk); the default
 * comes from K3PD_XDEV_KERNEL at open (unset: 2). Jobs already queued keep theirs. Returns 0,
 * or K3_EINVAL (not a device xdev, or another number). */
int k3k_cuda_xdev_set_kernel(k3k_xdev_t *x, int kernel);
/* The kernel later jobs run (0 for a host xdev). */
int k3k_cuda_xdev_kernel(k3k_xdev_t *x);
/* Kernel 2's resident warps on the device for a table path 1..4 (the occupancy API's answer
 * at open, which sizes its grids); 0 for a host xdev or another path. */
uint32_t k3k_cuda_xdev_cap_warps(k3k_xdev_t *x, int path);

/* Read ceiling: XOR of the bytes..n & ~15 of p read as 16-byte words into *out (device u64,
 * caller-zeroed), one pass over p at full occupancy. Queued on st. 0 or K3_EDEVICE. */
int k3k_cu_read_xor(cudaStream_t st, const void *p, size_t bytes, uint64_t *out);
/* Keeps st busy for about ns nanoseconds (one thread spinning on the global timer), so that
 * the work queued after it starts without host launch gaps. 0 or K3_EDEVICE. */
int k3k_cu_spin(cudaStream_t st, uint32_t ns);

#ifdef __cplusplus
}
#endif

#endif
