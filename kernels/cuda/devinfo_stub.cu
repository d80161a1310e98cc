/* LOCAL STUB of branch `load` (issue 17), to be DELETED when the kdev work (kernels/cuda/xdev.cu)
 * with the real k3k_device_uuid / k3k_device_mem is merged into main.
 *
 * What it is for: the shared-weights loader (kernels/runner/share.c) puts the GPU's UUID in
 * its fdshare metadata through k3k_device_uuid (k3k_xdev.h), which the kdev engineer
 * implements. Until that lands this file gives the same contract with plain runtime calls.
 * Both functions are WEAK: if both files end up in one build the real definitions win and the
 * link still succeeds. */
#include <string.h>

#include "cuda_common.cuh"
extern "C" {
#include "k3k_xdev.h"
}

extern "C" __attribute__((weak)) int k3k_device_uuid(k3k_backend_t *be, uint8_t uuid[16]) {
  k3k_cuda_ctx *cx = be ? k3k_cuda_ctx_of(be) : NULL;
  if (!cx) return K3_ENOTSUP;
  cudaDeviceProp p;
  K3K_CU(cudaGetDeviceProperties(&p, cx->device));
  memcpy(uuid, p.uuid.bytes, 16);
  return 0;
}

extern "C" __attribute__((weak)) int k3k_device_mem(k3k_backend_t *be, size_t *free_bytes,
                                                    size_t *total_bytes) {
  k3k_cuda_ctx *cx = be ? k3k_cuda_ctx_of(be) : NULL;
  if (!cx) return K3_ENOTSUP;
  size_t f = 0, t = 0;
  K3K_CU(cudaSetDevice(cx->device));
  K3K_CU(cudaMemGetInfo(&f, &t));
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return 0;
}
