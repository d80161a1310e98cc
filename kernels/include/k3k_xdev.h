/* Device services for the state handoff: digests (and copies) of a sequence's state regions
 * computed where the state lives, and device memory other processes can map.
 *
 * What it is for: a prefill worker on a GPU pushes a sequence's MLA pages and KDA state into a
 * decode worker's pools without the bytes ever visiting the host (ARCHITECTURE.md §2 "On GPUs
 * the state never leaves the device"). Two services:
 *   - k3k_xdev: jobs that compute the K3 chunked-XXH3 digest (k3pd/digest.h) of each region's
 *     byte stream given as segments, optionally copying every segment to a destination (a peer
 *     pool mapped into this process) in the same pass: one read of the source, one write of the
 *     destination, the digest for free. Jobs run on the xdev's own stream, so they overlap the
 *     model's compute on the backend's stream.
 *   - k3k_vmm: one device allocation exportable as a POSIX file descriptor (CUDA VMM), mapped
 *     read-only or read-write by other processes (shared weights; the decode worker's state
 *     pools). The physical memory lives while any process still maps it.
 * What it is not: a transport (k3_xfer decides what moves where and sends the messages) or an
 * allocator for model tensors.
 *
 * Backends: "cuda" runs jobs on the GPU; the host backends ("cpu", "cpu-fast") run them
 * synchronously inside k3k_xdev_submit over host memory (the reference and the CPU workers'
 * path). k3k_vmm is cuda only (K3_ENOTSUP elsewhere).
 *
 * Threads: an xdev is used by one thread at a time (normally a worker's loop thread), which
 * need not be the thread that runs the backend's ops: the two share the device but no state.
 * The `notify` callback of a job may run on a CUDA driver thread: it must only wake its owner
 * (e.g. uv_async_send), never call back into this API.
 * Errors: 0 or negative K3_E*; on error nothing was queued and notify is never called. */
#ifndef K3K_XDEV_H
#define K3K_XDEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One piece of a region's byte stream: len bytes at src; when dst is not NULL the same bytes
 * are also written to dst. Device addresses on a device xdev (dst may be another process's
 * memory mapped here), host addresses on a host xdev. src and dst never overlap. */
typedef struct {
  const void *src;
  void *dst;
  uint64_t len;
} k3k_xseg_t;

typedef struct k3k_xdev k3k_xdev_t;
typedef struct k3k_xjob k3k_xjob_t;

/* Opens the services on backend be's device (cuda: the backend's device, made current on the
 * calling thread; a stream, pinned staging and device scratch of its own). Returns 0,
 * K3_ENOMEM or K3_EDEVICE. */
int k3k_xdev_open(k3k_backend_t *be, k3k_xdev_t **out);
/* Waits for the jobs still running (bounded by the device; their notify calls have run when
 * it returns), frees everything. Jobs not freed yet stay valid: they poll their result (or
 * K3_EDEVICE) and are still freed with k3k_xdev_job_free. NULL: no-op. */
void k3k_xdev_close(k3k_xdev_t *x);
/* True when jobs run on a GPU (addresses are device addresses). */
bool k3k_xdev_on_device(const k3k_xdev_t *x);

/* Queues a job over n_regions regions: region r's byte stream is segs[first[r]] ..
 * segs[first[r+1] - 1] in order (first has n_regions + 1 entries, first[0] == 0, non-
 * decreasing; a region with no segments has the empty digest). Computes each region's K3 digest
 * of the bytes read from src and writes them to dst where dst is set. The segment and first
 * arrays are copied before return. `notify(ud)` (may be NULL) runs once, after the job's last
 * write is complete and visible to other processes and kernels launched afterwards (device:
 * on a driver thread; host: before k3k_xdev_submit returns). Any length and alignment is
 * accepted; 16-byte aligned segments whose lengths are multiples of 16 take the fast path.
 * Returns 0, K3_EINVAL (bad arguments), K3_ENOMEM, K3_EDEVICE. */
int k3k_xdev_submit(k3k_xdev_t *x, const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                    void (*notify)(void *ud), void *ud, k3k_xjob_t **out);
/* Non-blocking: 1 when the job is done (then digests[n_regions] is filled), 0 while it runs,
 * K3_EDEVICE when it failed. digests NULL: only whether it is done (its writes complete and
 * visible), without collecting the digests; poll again with digests to get them. */
int k3k_xdev_poll(k3k_xjob_t *j, uint64_t *digests);
/* Frees a job; one still running is waited for first. NULL: no-op. */
void k3k_xdev_job_free(k3k_xjob_t *j);

/* ---- shareable device memory (CUDA VMM, POSIX file descriptor handles) ------------------- */

typedef struct k3k_vmm k3k_vmm_t;

/* Allocates at least `bytes` on be's device as one VMM allocation exportable as a file
 * descriptor, mapped read-write in this process (contents uninitialised). Returns 0,
 * K3_ENOTSUP (not a cuda backend, or the driver cannot export POSIX fds: named in the log),
 * K3_ENOMEM (device memory), K3_EDEVICE. */
int k3k_vmm_alloc(k3k_backend_t *be, size_t bytes, k3k_vmm_t **out);
/* A new file descriptor for the allocation (the caller closes it). 0, K3_EDEVICE. */
int k3k_vmm_export(const k3k_vmm_t *v, int *fd);
/* Maps an allocation another process exported (fd from k3k_vmm_export, received over
 * k3pd/fdshare.h) on be's device, read-write or read-only (a write through a read-only mapping
 * faults). `bytes` is the exporter's size. This process holds its own reference: the memory
 * stays alive until both sides freed it. fd stays the caller's. Returns 0, K3_ENOTSUP,
 * K3_EINVAL (bytes larger than the allocation), K3_EDEVICE. */
int k3k_vmm_import(k3k_backend_t *be, int fd, size_t bytes, bool writable, k3k_vmm_t **out);
void *k3k_vmm_ptr(const k3k_vmm_t *v);
size_t k3k_vmm_size(const k3k_vmm_t *v);
/* Unmaps and drops this process's reference. NULL: no-op. */
void k3k_vmm_free(k3k_vmm_t *v);

/* The 16-byte UUID of be's GPU (two processes that see the same UUID share the device).
 * Returns 0 or K3_ENOTSUP (host backend). */
int k3k_device_uuid(k3k_backend_t *be, uint8_t uuid[16]);
/* Bytes of device memory free and total on be's device (cudaMemGetInfo); K3_ENOTSUP on host. */
int k3k_device_mem(k3k_backend_t *be, size_t *free_bytes, size_t *total_bytes);
/* Copies n bytes between any two addresses of be's device and the host (host memory pageable
 * or pinned), synchronously, on be's device but NOT on the backend's stream: callable from
 * another thread than the one running the backend's ops (the staged transfer path's device to
 * host copies run on the loop thread). Host backends: memcpy. Returns 0, K3_EINVAL, K3_EDEVICE. */
int k3k_dev_copy(k3k_backend_t *be, void *dst, const void *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif
