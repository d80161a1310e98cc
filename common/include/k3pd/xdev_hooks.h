/* The device hooks k3_xfer needs (k3_xfer_dev_t), implemented over the kernel library's device
 * services: k3k_xdev jobs (digests and copies on a stream of their own), k3k_vmm (mapping a
 * peer's exported pool) and fdshare (fetching the peer's file descriptor).
 *
 * What it is for: the workers on a GPU. The decode worker exports its state arena (a k3k_vmm
 * allocation) on its fdshare socket and puts k3_xhooks_blob's bytes into every descriptor of
 * that pool; a prefill worker on the same host and GPU maps the arena once (cached) and then
 * moves a layer's state with one device job. Both sides verify with device digest jobs.
 * What it is not: a transport (k3_xfer), or an allocator.
 *
 * Blob (version 1, little-endian): "K3VB" u32 · version u16 · flags u16 (0) · boot id [16] ·
 * GPU UUID [16] · size u64 · path length u16 · name length u16 · path · name. A blob from
 * another boot id (another host or container kernel) or another GPU UUID is not mappable here
 * (K3_ENOTSUP: the sender then uses another path).
 *
 * Threads: the hooks run on the worker's loop thread (k3_xfer calls them there); a job's notify
 * runs on a CUDA driver thread and only wakes the loop (k3_xfer passes k3_xfer_ctx_wake). The
 * first mapping of a peer blocks on its socket for at most K3_XHOOKS_FETCH_MS.
 * Lifetime: mappings live until k3_xhooks_close, or until k3_xhooks_gc found the peer's socket
 * dead twice in a row (its memory is then unmapped: a dead peer's arena would otherwise stay
 * allocated on the GPU as long as we map it). */
#ifndef K3PD_XDEV_HOOKS_H
#define K3PD_XDEV_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "k3k_xdev.h"
#include "k3pd/xfer.h"

#define K3_XHOOKS_FETCH_MS 2000
#define K3_XHOOKS_BLOB_MAX 512

typedef struct k3_xhooks k3_xhooks_t;

/* Opens the hooks on backend be's device (k3k_xdev_open on the calling thread, which must be
 * the loop thread that drives k3_xfer). be must outlive the hooks. Returns 0, K3_ENOTSUP (a
 * host backend: host workers need no hooks), K3_ENOMEM, K3_EDEVICE. */
int k3_xhooks_open(k3k_backend_t *be, k3_xhooks_t **out);
/* Unmaps every peer pool and closes the device services (waits for running jobs). Call after
 * k3_xfer_ctx_close (k3_xfer may still release jobs until then). NULL: no-op. */
void k3_xhooks_close(k3_xhooks_t *h);
/* The hook table for k3_xfer_send_opts_t.dev / k3_xfer_recv_opts_t.dev (owned by h). */
const k3_xfer_dev_t *k3_xhooks_dev(k3_xhooks_t *h);
/* Unmaps peer pools whose fdshare socket was found dead at two calls in a row (call from a
 * timer every few seconds; the two-call rule leaves any job writing into it long finished).
 * Returns how many mappings were dropped. */
int k3_xhooks_gc(k3_xhooks_t *h);
/* Number of peer pools mapped now (for logs and tests). */
int k3_xhooks_mapped(const k3_xhooks_t *h);

/* Writes the blob of a pool of `size` bytes served as object `name` on the fdshare socket
 * `sock_path` of this process (be's GPU, this boot). *len in: capacity, out: bytes written.
 * Returns 0, K3_ERANGE (too small or names too long), K3_ENOTSUP (host backend), K3_EIO. */
int k3_xhooks_blob(k3k_backend_t *be, const char *sock_path, const char *name, uint64_t size,
                   uint8_t *blob, uint32_t *len);

/* Staged sender (device sources into a host receive area): copies `len` bytes of the source
 * region described by src, starting at region byte `off`, from device memory into host dst,
 * synchronously (k3k_dev_copy per contiguous piece). Returns 0, K3_EINVAL, K3_EDEVICE. */
int k3_xhooks_d2h(k3k_backend_t *be, const k3_xfer_src_t *src, uint64_t off, void *dst, uint64_t len);

#endif
