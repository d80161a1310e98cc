/* Private interface between the k3k_xdev front end (kernels/cpu/xdev.c: argument checks,
 * dispatch, the host implementation) and the CUDA implementation (kernels/cuda/xdev.cu).
 *
 * Each implementation's xdev and job structs start with the base below, so the front end can
 * tell them apart. The CUDA entry points receive arguments that already passed
 * k3k_xdev_check; they exist only in builds with CUDA (K3K_HAVE_CUDA). */
#ifndef K3K_XDEV_INT_H
#define K3K_XDEV_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "k3k_xdev.h"

#ifdef __cplusplus
extern "C" {
#endif

struct k3k_xdev {
  bool device; /* true: the CUDA implementation */
};
struct k3k_xjob {
  bool device;
};

int k3k_cuda_xdev_open(k3k_backend_t *be, k3k_xdev_t **out);
void k3k_cuda_xdev_close(k3k_xdev_t *x);
int k3k_cuda_xdev_submit(k3k_xdev_t *x, const k3k_xseg_t *segs, const uint32_t *first,
                         uint32_t n_regions, void (*notify)(void *ud), void *ud, k3k_xjob_t **out);
int k3k_cuda_xdev_poll(k3k_xjob_t *j, uint64_t *digests);
void k3k_cuda_xdev_job_free(k3k_xjob_t *j);
int k3k_cuda_device_uuid(k3k_backend_t *be, uint8_t uuid[16]);
int k3k_cuda_device_mem(k3k_backend_t *be, size_t *free_bytes, size_t *total_bytes);

#ifdef __cplusplus
}
#endif

#endif
