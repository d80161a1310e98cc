/* k3k_dev_copy on the "cuda" backend: cudaMemcpy (direction inferred from the unified address
 * space) on the backend's device, from whichever thread calls it. It does not use the backend's
 * stream (non-blocking, so the legacy default stream this copy runs on does not wait for the
 * backend's work, nor the backend for it): the caller orders it after the producer of src. */
#include "cuda_common.cuh"

extern "C" int k3k_cuda_dev_copy(k3k_backend_t *be, void *dst, const void *src, size_t n) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  if (!cx) return K3_EINVAL;
  cudaError_t e = cudaSetDevice(cx->device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  /* device to device, cudaMemcpy returns before the copy finished: wait for it (this stream
   * only: the backend's and the xdev's streams are non-blocking, so they are not waited for) */
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    K3_ERROR("cuda: copy of %zu bytes (%p -> %p) failed: %s", n, src, dst, cudaGetErrorString(e));
    return K3_EDEVICE;
  }
  return 0;
}
