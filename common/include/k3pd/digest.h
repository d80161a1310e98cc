/* The state-handoff digest ("K3 chunked XXH3", transfer wire version 3).
 *
 * What it is for: every region a prefill worker hands to a decode worker carries a 64-bit
 * digest that the receiver recomputes over its own memory (docs/transfer.md). The function must
 * be cheap on a CPU (fused with the copy, one pass over DRAM) AND on a GPU (thousands of warps
 * in parallel, at memory bandwidth), and give the same value on both, so CPU and GPU workers
 * can pair. Plain streaming XXH3 over a whole region is sequential; this one is a two-level tree:
 *
 *   the region's bytes, in region order, are cut into chunks of K3_DIGEST_CHUNK (4096) bytes,
 *   the last one possibly shorter;
 *   chunk digest  c_i = XXH3-64(chunk i, seed 0)                       (libxxhash XXH3_64bits)
 *   region digest     = XXH3-64(c_0 | c_1 | ... | c_{n-1}, seed 0)     (each c_i as 8 bytes,
 *                                                                      little-endian)
 *   an empty region: XXH3-64 of zero bytes.
 *
 * The CPU reference is this file's implementation over libxxhash; the GPU kernel
 * (kernels/cuda/xdev_kernels.cu) computes the chunk digests and the host finishes with
 * k3_digest_combine. Changing the chunk size or the combination changes the wire version.
 *
 * Threads: a k3_digest_t is used by one thread at a time; the free functions are pure. */
#ifndef K3PD_DIGEST_H
#define K3PD_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define K3_DIGEST_CHUNK 4096u

/* Streaming digest of one region fed in pieces of any size (the pieces need not align with
 * chunks: a partial chunk is buffered). */
typedef struct {
  void *outer;                     /* XXH3 state over the chunk digests (owned) */
  uint64_t total;                  /* bytes fed so far */
  uint32_t fill;                   /* bytes in part[] */
  uint8_t part[K3_DIGEST_CHUNK];   /* the current partial chunk */
} k3_digest_t;

/* 0 or K3_ENOMEM. A digest that was initialised is freed with k3_digest_free. */
int k3_digest_init(k3_digest_t *d);
void k3_digest_free(k3_digest_t *d);
/* Starts a new region (as after init). */
void k3_digest_reset(k3_digest_t *d);
/* Feeds n bytes. */
void k3_digest_update(k3_digest_t *d, const void *p, size_t n);
/* Copies n bytes from src to dst and feeds them, in ONE pass over src: each 64-byte stripe of
 * a whole chunk is loaded once, fed to XXH3 and stored with a streaming store (dst is memory
 * this core will not read again: another process's pool); k3_digest_copy_impl below. Ends with a store fence, so the bytes
 * are visible to other processes before anything sent after this call. dst and src must not
 * overlap. The digest equals k3_digest_update over the same bytes. */
void k3_digest_copy(k3_digest_t *d, void *dst, const void *src, size_t n);
/* Which whole-chunk loop k3_digest_copy uses: "fused4" (default: one pass, XXH3 computed from
 * the 64-byte loads that are stored, four chunks side by side, streaming stores; x86-64 with
 * AVX2), "fused" (one chunk at a time), "fused4-st" (normal stores) and "fused4-pf" (software
 * prefetch; both measurement variants), "legacy"
 * (libxxhash per chunk, then the copy; the portable fallback). K3PD_DIGEST_COPY picks one at
 * first use. _set returns 0, K3_EINVAL (unknown name) or K3_ENOTSUP (not usable on this CPU);
 * process-wide, call it before other threads copy. */
int k3_digest_copy_impl_set(const char *name);
const char *k3_digest_copy_impl(void);
/* Which whole-chunk loop k3_digest_update uses: "fused4" (four chunks side by side, AVX2; the
 * default on Intel), "pf" (libxxhash per chunk, the next chunk prefetched first; the default
 * elsewhere), "lib" (libxxhash alone).
 * K3PD_DIGEST_HASH picks one at first use; _set as above. Same digests. */
int k3_digest_hash_impl_set(const char *name);
const char *k3_digest_hash_impl(void);
/* The region digest of everything fed since init/reset (the state is left finished: reset it
 * before reuse). */
uint64_t k3_digest_final(k3_digest_t *d);

/* One chunk's digest: XXH3-64, seed 0 (n <= K3_DIGEST_CHUNK in a region; any n works). */
uint64_t k3_digest_chunk(const void *p, size_t n);
/* The region digest from its n chunk digests (little-endian u64 each, in order). */
uint64_t k3_digest_combine(const uint64_t *chunk_digests, size_t n);
/* The region digest of n contiguous bytes (= init + update + final). */
uint64_t k3_digest_bytes(const void *p, size_t n);
/* Chunks a region of n bytes has: ceil(n / K3_DIGEST_CHUNK). */
static inline uint64_t k3_digest_nchunks(uint64_t n) {
  return (n + K3_DIGEST_CHUNK - 1) / K3_DIGEST_CHUNK;
}

#endif
