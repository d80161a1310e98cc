/* k3k_vmm in builds without the CUDA backend: shareable device memory does not exist, every
 * entry is K3_ENOTSUP (k3k_xdev.h). With CUDA (K3K_HAVE_CUDA) kernels/cuda/vmm.cu defines them
 * and this file is empty; host backends get K3_ENOTSUP from there.
 * The k3k_device_uuid / k3k_device_mem definitions below are a LOCAL STUB of branch `load`
 * (weak, so the kdev work's kernels/cpu/xdev.c overrides them): delete them when it is merged. */
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

__attribute__((weak)) int k3k_device_uuid(k3k_backend_t *be, uint8_t uuid[16]) { return K3_ENOTSUP; }
__attribute__((weak)) int k3k_device_mem(k3k_backend_t *be, size_t *free_bytes, size_t *total_bytes) {
  return K3_ENOTSUP;
}
#endif
