/* k3k_vmm in builds without the CUDA backend: shareable device memory does not exist, every
 * entry is K3_ENOTSUP (k3k_xdev.h). With CUDA (K3K_HAVE_CUDA) kernels/cuda/vmm.cu defines them
 * and this file is empty; host backends get K3_ENOTSUP from there. */
#include "k3k_xdev.h"
#include "k3pd/err.h"

#ifndef K3K_HAVE_CUDA
int k3k_vmm_alloc(k3k_backend_t *be, size_t bytes, k3k_vmm_t **out) { return K3_ENOTSUP; }
int k3k_vmm_export(const k3k_vmm_t *v, int *fd) { return K3_ENOTSUP; }
int k3k_vmm_import(k3k_backend_t *be, int fd, size_t bytes, bool writable, k3k_vmm_t **out) {
  return K3_ENOTSUP;
}
void *k3k_vmm_ptr(const k3k_vmm_t *v) { return NULL; }
size_t k3k_vmm_size(const k3k_vmm_t *v) { return 0; }
void k3k_vmm_free(k3k_vmm_t *v) {}
#endif
