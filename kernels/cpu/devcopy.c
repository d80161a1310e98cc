/* k3k_dev_copy (k3k_xdev.h): a synchronous copy off the backend's stream. Host backends copy
 * with memcpy; the "cuda" backend's copy is kernels/cuda/devcopy.cu. */
#include <string.h>

#include "k3k_xdev.h"
#include "k3pd/err.h"

#ifdef K3K_HAVE_CUDA
int k3k_cuda_dev_copy(k3k_backend_t *be, void *dst, const void *src, size_t n);
#endif

int k3k_dev_copy(k3k_backend_t *be, void *dst, const void *src, size_t n) {
  if (!be || (n && (!dst || !src))) return K3_EINVAL;
  if (!n) return 0;
#ifdef K3K_HAVE_CUDA
  if (be->name && !strcmp(be->name, "cuda")) return k3k_cuda_dev_copy(be, dst, src, n);
#endif
  if (!be->host_memory) return K3_ENOTSUP;
  memmove(dst, src, n);
  return 0;
}
