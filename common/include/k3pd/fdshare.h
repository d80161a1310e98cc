/* Handing file descriptors (CUDA VMM shareable handles) to other processes on the same host.
 *
 * What it is for: two k3pd processes on one GPU share device memory by exchanging a POSIX file
 * descriptor of a CUDA VMM allocation (k3k_vmm.h): the weights one process generated (a prefill
 * and a decode worker sharing one read-only copy), and the decode worker's state pools (a
 * prefill worker on the same GPU writes a sequence's state straight into them). A descriptor can
 * only cross a process boundary through a Unix-domain socket (SCM_RIGHTS), so every process that
 * holds shareable memory runs one small server, and others fetch named objects from it.
 *
 * What it is not: a general IPC layer. Objects are registered fds plus a small metadata blob
 * the owner defines (sizes, fingerprints); the fetcher checks the metadata. Nothing here knows
 * CUDA.
 *
 * Security: the socket is created mode 0600 (the directory should be private to the service's
 * user; k3pd creates it 0700 when missing) and every connection's peer credentials
 * (SO_PEERCRED) must have the server's uid or uid 0, else the connection is closed unanswered.
 *
 * Threads: the server runs its own thread (blocking accept with a poll timeout so stop is
 * prompt); add/remove/path may be called from any thread (internally locked). fetch is a
 * blocking call bounded by its timeout: call it at start-up or from a thread that may block
 * (never from an event loop's handler).
 *
 * Wire (version 1): request = "K3FS" u32 magic, u16 version, u16 name length, name bytes;
 * reply = "K3FS" u32, u16 version, u16 status (0 ok, 1 no such object), u32 meta length, meta
 * bytes, with the descriptor attached (SCM_RIGHTS) when status is 0. One request per
 * connection. */
#ifndef K3PD_FDSHARE_H
#define K3PD_FDSHARE_H

#include <stddef.h>
#include <stdint.h>

#define K3_FDSHARE_NAME_MAX 63
#define K3_FDSHARE_META_MAX 4096

typedef struct k3_fdshare k3_fdshare_t;

/* Creates the socket at `path` (an existing socket file nobody listens on is replaced; an
 * existing non-socket file is K3_EEXIST; a live server on it is K3_EEXIST) and starts the
 * server thread. Returns 0, K3_EINVAL (path too long for a Unix socket: named), K3_EEXIST,
 * K3_EIO (errno text logged), K3_ENOMEM. */
int k3_fdshare_start(const char *path, k3_fdshare_t **out);
/* Registers (or replaces) object `name` (1..K3_FDSHARE_NAME_MAX bytes): the server keeps its
 * own duplicate of fd, so the caller may close fd. meta_len <= K3_FDSHARE_META_MAX. Returns 0,
 * K3_EINVAL, K3_EIO (dup failed), K3_ENOMEM. */
int k3_fdshare_add(k3_fdshare_t *s, const char *name, int fd, const void *meta, size_t meta_len);
/* Forgets object `name` (closes the server's duplicate). No-op when unknown. */
void k3_fdshare_remove(k3_fdshare_t *s, const char *name);
/* Stops the thread, closes every duplicate, removes the socket file, frees. NULL is a no-op. */
void k3_fdshare_stop(k3_fdshare_t *s);
const char *k3_fdshare_path(const k3_fdshare_t *s);

/* Asks the server at `path` for object `name`, waiting at most timeout_ms for connect + reply.
 * On success *fd is a new descriptor the caller owns and *meta (malloc'd, caller frees, may be
 * NULL when meta_len is 0) its metadata. Returns 0, K3_ENOENT (no socket / nobody listening /
 * no such object), K3_ETIMEDOUT, K3_EPROTO (a malformed reply), K3_EIO. */
int k3_fdshare_fetch(const char *path, const char *name, int timeout_ms, int *fd, void **meta,
                     size_t *meta_len);

/* This host's boot id (/proc/sys/kernel/random/boot_id as 16 bytes): two processes with the
 * same boot id run on the same kernel instance, so a socket path means the same file for both.
 * Returns 0 or K3_EIO. */
int k3_host_boot_id(uint8_t id[16]);

#endif
