/* The K3 chunked-XXH3 digest (k3pd/digest.h) over libxxhash: the CPU reference, the receiver's
 * verification and the host senders' fused hash-and-copy.
 *
 * Why chunks of 4 KiB: small enough that a GPU warp per chunk keeps thousands of warps busy on
 * one layer's state, large enough that the chunk digests add 0.2 % to the bytes hashed. The
 * host sender's hash + copy is one pass over the source: digest_copy.c hashes the stripes it
 * stores (the "legacy" loop kept here hashes a chunk from DRAM, then copies it out of L1: 2x a
 * memcpy's CPU on the GPU host's Xeon); the receiver's hash prefetches the next chunk
 * (xdc_hash_impl). Measurements: docs/transfer.md. */
#include "k3pd/digest.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack in k3_digest_combine */
#include <xxhash.h>
#if defined(K3PD_HAVE_XXH_DISPATCH)
/* The chunk hash through libxxhash's runtime dispatch (AVX2/AVX-512 when the CPU has them):
 * the plain XXH3_64bits entry point is the library's baseline build, measured 5x slower per
 * 4 KiB chunk from L1 here, which made the fused copy cost 2x a memcpy's CPU instead of ~1x
 * (docs/transfer.md). Same values. */
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define chunk_hash XXH3_64bits_dispatch
#else
#define chunk_hash XXH3_64bits
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "digest_int.h"
#include "k3pd/err.h"

static void put_chunk(k3_digest_t *d, uint64_t h) {
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(h >> (8 * i));
  XXH3_64bits_update(d->outer, le, 8);
}

/* n chunk digests at once (the fused loop's batches). */
static void put_chunks(k3_digest_t *d, const uint64_t *h, size_t n) {
  uint8_t le[8 * 64];
  for (size_t i = 0; i < n;) {
    size_t m = n - i < 64 ? n - i : 64;
    for (size_t j = 0; j < m; j++)
      for (int k = 0; k < 8; k++) le[8 * j + k] = (uint8_t)(h[i + j] >> (8 * k));
    XXH3_64bits_update(d->outer, le, 8 * m);
    i += m;
  }
}

int k3_digest_init(k3_digest_t *d) {
  d->outer = XXH3_createState();
  if (!d->outer) return K3_ENOMEM;
  k3_digest_reset(d);
  return 0;
}

void k3_digest_free(k3_digest_t *d) {
  if (d && d->outer) XXH3_freeState(d->outer);
  if (d) d->outer = NULL;
}

void k3_digest_reset(k3_digest_t *d) {
  XXH3_64bits_reset(d->outer);
  d->total = 0;
  d->fill = 0;
}

/* Tops up the partial chunk from s; returns the bytes taken. */
static size_t top_up(k3_digest_t *d, void *dst, const uint8_t *s, size_t n) {
  size_t take = K3_DIGEST_CHUNK - d->fill;
  if (take > n) take = n;
  memcpy(d->part + d->fill, s, take);
  if (dst) memcpy(dst, s, take);
  d->fill += (uint32_t)take;
  if (d->fill == K3_DIGEST_CHUNK) {
    put_chunk(d, chunk_hash(d->part, K3_DIGEST_CHUNK));
    d->fill = 0;
  }
  return take;
}

void k3_digest_update(k3_digest_t *d, const void *p, size_t n) {
  const uint8_t *s = p;
  d->total += n;
  if (d->fill && n) {
    size_t t = top_up(d, NULL, s, n);
    s += t;
    n -= t;
  }
  /* Whole chunks (xdc_hash_impl): four side by side (digest_copy.c), or libxxhash per chunk
   * with the next chunk prefetched, or libxxhash alone. */
  int hi = xdc_hash_impl();
  uint64_t h[64];
  while (hi == XDH_FUSED4 && n >= 4 * K3_DIGEST_CHUNK) {
    size_t nc = n / K3_DIGEST_CHUNK < 64 ? n / K3_DIGEST_CHUNK : 64;
    size_t done = xdc_hash_chunks(XDC_FUSED4, s, nc, h);
    if (done == 0) break;
    put_chunks(d, h, done);
    s += done * K3_DIGEST_CHUNK, n -= done * K3_DIGEST_CHUNK;
  }
  for (; n >= K3_DIGEST_CHUNK; s += K3_DIGEST_CHUNK, n -= K3_DIGEST_CHUNK) {
    if (hi == XDH_PF && n >= 2 * K3_DIGEST_CHUNK) xdc_prefetch_chunk(s + K3_DIGEST_CHUNK);
    put_chunk(d, chunk_hash(s, K3_DIGEST_CHUNK));
  }
  if (n) top_up(d, NULL, s, n);
}

/* Copies with streaming (non-temporal) stores: the destination is another process's memory
 * this core will not read, so a normal store's read-for-ownership would double the DRAM
 * traffic. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void copy_stream_avx2(uint8_t *dst, const uint8_t *src, size_t n) {
  size_t head = (32 - ((uintptr_t)dst & 31)) & 31;
  if (head > n) head = n;
  memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 128; n -= 128, dst += 128, src += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)src), b = _mm256_loadu_si256((const __m256i *)(src + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(src + 64)), e = _mm256_loadu_si256((const __m256i *)(src + 96));
    _mm256_stream_si256((__m256i *)dst, a);
    _mm256_stream_si256((__m256i *)(dst + 32), b);
    _mm256_stream_si256((__m256i *)(dst + 64), c);
    _mm256_stream_si256((__m256i *)(dst + 96), e);
  }
  memcpy(dst, src, n);
}
static int have_avx2(void) {
  static int v = -1;
  if (v < 0) v = __builtin_cpu_supports("avx2") ? 1 : 0;
  return v;
}
#endif

static void copy_chunk(uint8_t *dst, const uint8_t *src, size_t n) {
#if defined(__x86_64__)
  if (have_avx2()) {
    copy_stream_avx2(dst, src, n);
    return;
  }
#endif
  memcpy(dst, src, n);
}

void k3_digest_copy(k3_digest_t *d, void *dstv, const void *p, size_t n) {
  const uint8_t *s = p;
  uint8_t *dst = dstv;
  d->total += n;
  if (d->fill && n) {
    size_t t = top_up(d, dst, s, n);
    s += t;
    dst += t;
    n -= t;
  }
  /* Whole chunks: the fused one-pass loop (digest_copy.c) in batches of 64 chunk digests, or
   * the legacy loop: hash the chunk from DRAM, then copy it out of L1. */
  int impl = xdc_impl();
  uint64_t h[64];
  while (impl != XDC_LEGACY && n >= K3_DIGEST_CHUNK) {
    size_t nc = n / K3_DIGEST_CHUNK < 64 ? n / K3_DIGEST_CHUNK : 64;
    size_t done = xdc_chunks(impl, dst, s, nc, h);
    if (done == 0) break;
    put_chunks(d, h, done);
    s += done * K3_DIGEST_CHUNK, dst += done * K3_DIGEST_CHUNK, n -= done * K3_DIGEST_CHUNK;
  }
  for (; n >= K3_DIGEST_CHUNK; s += K3_DIGEST_CHUNK, dst += K3_DIGEST_CHUNK, n -= K3_DIGEST_CHUNK) {
    put_chunk(d, chunk_hash(s, K3_DIGEST_CHUNK));
    copy_chunk(dst, s, K3_DIGEST_CHUNK);
  }
  if (n) top_up(d, dst, s, n);
#if defined(__x86_64__)
  _mm_sfence(); /* streaming stores are weakly ordered: visible before any later message */
#endif
  atomic_thread_fence(memory_order_seq_cst);
}

uint64_t k3_digest_final(k3_digest_t *d) {
  if (d->fill) {
    put_chunk(d, chunk_hash(d->part, d->fill));
    d->fill = 0;
  }
  return XXH3_64bits_digest(d->outer);
}

uint64_t k3_digest_chunk(const void *p, size_t n) { return chunk_hash(p, n); }

uint64_t k3_digest_combine(const uint64_t *c, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  /* The digests in memory ARE their little-endian concatenation, and one-shot XXH3 equals the
   * streaming one over the same bytes: one call through the dispatch, no byte shuffling. A
   * device job's combine of an 8K-token state (165,000 chunk digests, 1.3 MB) took ~0.5 ms on
   * the loop through the streaming baseline build; this is ~10x less (docs/transfer.md). */
  return chunk_hash(c, n * 8);
#else
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset(&st);
  uint8_t le[8 * 64];
  for (size_t i = 0; i < n;) {
    size_t m = n - i < 64 ? n - i : 64;
    for (size_t j = 0; j < m; j++)
      for (int k = 0; k < 8; k++) le[8 * j + k] = (uint8_t)(c[i + j] >> (8 * k));
    XXH3_64bits_update(&st, le, 8 * m);
    i += m;
  }
  return XXH3_64bits_digest(&st);
#endif
}

uint64_t k3_digest_bytes(const void *p, size_t n) {
  k3_digest_t d;
  if (k3_digest_init(&d)) return 0;
  k3_digest_update(&d, p, n);
  uint64_t h = k3_digest_final(&d);
  k3_digest_free(&d);
  return h;
}
