/* Private to common/base: the fused hash-and-copy loops of digest_copy.c as digest.c calls them.
 * Not a public header (k3pd/digest.h is the API). */
#ifndef K3PD_DIGEST_INT_H
#define K3PD_DIGEST_INT_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/digest.h"

enum { XDC_LEGACY = 0, XDC_FUSED = 1, XDC_FUSED4 = 2, XDC_FUSED4_ST = 3, XDC_FUSED4_PF = 4 };

/* The loop in use (chosen once: K3PD_DIGEST_COPY, else fused4 where usable, else legacy). */
int xdc_impl(void);
/* Copies n_chunks whole 4096-byte chunks src -> dst and writes each chunk's XXH3-64 to h[i], in
 * one pass; returns the chunks done (0 for XDC_LEGACY or without AVX2: the caller does them).
 * Streaming stores are not fenced here: the caller issues the sfence. */
size_t xdc_chunks(int impl, uint8_t *dst, const uint8_t *src, size_t n_chunks, uint64_t *h);
/* Hash only: XXH3-64 of whole 4096-byte chunks, four side by side; returns the chunks done (a
 * multiple of 4; 0 for XDC_LEGACY or without AVX2: the caller hashes the rest). */
size_t xdc_hash_chunks(int impl, const uint8_t *src, size_t n_chunks, uint64_t *h);

/* The hash-only loop of k3_digest_update (the receiver's verification): K3PD_DIGEST_HASH=lib
 * (libxxhash per chunk), pf (the same with the next chunk's 64 lines prefetched first: a new
 * 4 KiB page restarts the hardware prefetcher), fused4 (four chunks side by side, AVX2).
 * Default: fused4 on Intel, pf elsewhere (digest_copy.c default_hash). */
enum { XDH_LIB = 0, XDH_PF = 1, XDH_FUSED4 = 2 };
int xdc_hash_impl(void);
/* Prefetches the 4096 bytes at p into the cache (no fault: a prefetch never faults). */
void xdc_prefetch_chunk(const uint8_t *p);

#endif
