/* The host sender's one-pass "hash while copying" of whole 4 KiB chunks (k3pd/digest.h,
 * k3_digest_copy): XXH3-64 of a 4096-byte chunk computed from the same 64-byte loads that are
 * stored to the destination, so reads and stores interleave at cache-line grain as in a memcpy.
 *
 * Why not libxxhash + a copy (the "legacy" loop, kept selectable): hashing a chunk from DRAM and
 * then copying it out of L1 runs two phases per chunk, a burst of loads then a burst of streaming
 * stores. On the GPU host's Intel Xeon the line-fill buffers are shared between the two, so a
 * single core moved 478 MB in 105 ms of CPU against 52 ms for glibc's memcpy (whose large-copy
 * loop streams loads and non-temporal stores together, four pages at a time); docs/transfer.md.
 * Here every 64-byte stripe is loaded once, fed to the accumulators and stored at once; "fused4"
 * runs four chunks (four pages) side by side so four hardware prefetch streams are in flight, as
 * glibc's large memcpy does.
 *
 * The hash is XXH3-64 (seed 0, default secret) for exactly 4096 bytes, written from the XXH3
 * specification's long-input path: 3 blocks of 16 stripes with a scramble after each, 15 stripes
 * of the last block, the last stripe (bytes 4032..4095, i.e. the 16th stripe of block 3) with the
 * secret at offset 121, then the 4-pair merge with start 4096 * PRIME64_1 and the avalanche.
 * The default secret and primes are xxHash's own (XXH_INLINE_ALL, static here). A self-test at
 * first use compares it with libxxhash on a random chunk; on any mismatch the legacy loop is
 * used (and logged), so a wrong hash can never reach the wire.
 *
 * Stores: streaming (non-temporal) when the destination chunk is 32-byte aligned: the
 * destination is another process's pool this core will not read, and a normal store would first
 * read the line (read-for-ownership). k3_digest_copy ends with an sfence before returning.
 * "fused4-st" uses normal stores (a measurement variant), "fused4-pf" adds software prefetches
 * 512 bytes ahead in each chunk (the default on Intel, default_copy below). x86-64 with AVX2 only; elsewhere, or
 * without AVX2, the legacy loop (libxxhash + memcpy) is the portable fallback.
 *
 * Choice: K3PD_DIGEST_COPY=legacy|fused|fused4|fused4-st|fused4-pf at first use, or
 * k3_digest_copy_impl_set (benchmarks). Default fused4-pf on Intel, fused4 elsewhere.
 * Process-wide, set before threads use it. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "digest_int.h"
#include "k3pd/err.h"
#include "k3pd/log.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_FUSED 1
#else
#define HAVE_FUSED 0
#endif

_Static_assert(sizeof(XXH3_kSecret) == 192, "XXH3 default secret is 192 bytes");
_Static_assert(XXH_VERSION_NUMBER >= 800, "XXH3's output is stable from xxHash 0.8.0");

static const char *const IMPL_NAMES[] = {"legacy", "fused", "fused4", "fused4-st", "fused4-pf"};
/* XDC_* once chosen. Atomic: the first k3_digest_copy calls of two threads may both choose
 * (the same value); later reads are plain loads. */
static _Atomic int g_impl = -1;

#if HAVE_FUSED
/* Accumulate one 32-byte half of a stripe: acc[i ^ 1] += x[i]; acc[i] += lo32(x^k) * hi32(x^k). */
#define XDC_ACC(acc, x, k)                                                      \
  do {                                                                          \
    __m256i dk_ = _mm256_xor_si256((x), (k));                                   \
    __m256i pr_ = _mm256_mul_epu32(dk_, _mm256_srli_epi64(dk_, 32));            \
    __m256i sw_ = _mm256_shuffle_epi32((x), _MM_SHUFFLE(1, 0, 3, 2));           \
    (acc) = _mm256_add_epi64((acc), _mm256_add_epi64(sw_, pr_));                \
  } while (0)
/* Scramble: acc ^= acc >> 47; acc ^= key; acc *= PRIME32_1 (64-bit by 32-bit). */
#define XDC_SCR(acc, k, prime)                                                  \
  do {                                                                          \
    __m256i a_ = _mm256_xor_si256(_mm256_xor_si256((acc), _mm256_srli_epi64((acc), 47)), (k)); \
    __m256i lo_ = _mm256_mul_epu32(a_, (prime));                                \
    __m256i hi_ = _mm256_mul_epu32(_mm256_srli_epi64(a_, 32), (prime));         \
    (acc) = _mm256_add_epi64(lo_, _mm256_slli_epi64(hi_, 32));                  \
  } while (0)

static uint64_t merge_4k(const uint64_t acc[8]) {
  const uint8_t *sec = XXH3_kSecret + XXH_SECRET_MERGEACCS_START;
  uint64_t r = (uint64_t)K3_DIGEST_CHUNK * XXH_PRIME64_1;
  for (int i = 0; i < 4; i++)
    r += XXH3_mul128_fold64(acc[2 * i] ^ XXH_readLE64(sec + 16 * i), acc[2 * i + 1] ^ XXH_readLE64(sec + 16 * i + 8));
  return XXH3_avalanche(r);
}

/* NC chunks at src + i * 4096 (i < NC) hashed into h[i] and copied to dst + i * 4096. nt: every
 * destination chunk is 32-byte aligned and streaming stores are wanted. */
#define XDC_BODY(NC)                                                                            \
  __m256i a0[NC], a1[NC];                                                                       \
  for (int c = 0; c < NC; c++) {                                                                \
    a0[c] = _mm256_setr_epi64x((long long)XXH_PRIME32_3, (long long)XXH_PRIME64_1,              \
                               (long long)XXH_PRIME64_2, (long long)XXH_PRIME64_3);             \
    a1[c] = _mm256_setr_epi64x((long long)XXH_PRIME64_4, (long long)XXH_PRIME32_2,              \
                               (long long)XXH_PRIME64_5, (long long)XXH_PRIME32_1);             \
  }                                                                                             \
  const __m256i prime = _mm256_set1_epi32((int)XXH_PRIME32_1);                                  \
  const uint8_t *sec = XXH3_kSecret;                                                            \
  for (int b = 0; b < 4; b++) {                                                                 \
    _Pragma("GCC unroll 16") for (int st = 0; st < 16; st++) {                               \
      const int off = 1024 * b + 64 * st;                                                       \
      const int ko = (b == 3 && st == 15) ? 192 - 64 - XXH_SECRET_LASTACC_START : 8 * st;       \
      const __m256i k0 = _mm256_loadu_si256((const __m256i *)(sec + ko));                       \
      const __m256i k1 = _mm256_loadu_si256((const __m256i *)(sec + ko + 32));                  \
      _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                 \
        const uint8_t *s = src + 4096 * c + off;                                                \
        uint8_t *d = dst + 4096 * c + off;                                                      \
        if (pf) _mm_prefetch((const char *)(s + XDC_PF_BYTES), _MM_HINT_T0);                    \
        __m256i x0 = _mm256_loadu_si256((const __m256i *)s);                                    \
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + 32));                             \
        if (!cp) {                                                                              \
          (void)d;                                                                              \
        } else if (nt) {                                                                        \
          _mm256_stream_si256((__m256i *)d, x0);                                                \
          _mm256_stream_si256((__m256i *)(d + 32), x1);                                         \
        } else {                                                                                \
          _mm256_storeu_si256((__m256i *)d, x0);                                                \
          _mm256_storeu_si256((__m256i *)(d + 32), x1);                                         \
        }                                                                                       \
        XDC_ACC(a0[c], x0, k0);                                                                 \
        XDC_ACC(a1[c], x1, k1);                                                                 \
      }                                                                                         \
    }                                                                                           \
    if (b < 3) {                                                                                \
      const __m256i s0 = _mm256_loadu_si256((const __m256i *)(sec + 192 - 64));                 \
      const __m256i s1 = _mm256_loadu_si256((const __m256i *)(sec + 192 - 32));                 \
      for (int c = 0; c < NC; c++) {                                                            \
        XDC_SCR(a0[c], s0, prime);                                                              \
        XDC_SCR(a1[c], s1, prime);                                                              \
      }                                                                                         \
    }                                                                                           \
  }                                                                                             \
  for (int c = 0; c < NC; c++) {                                                                \
    uint64_t acc[8];                                                                            \
    _mm256_storeu_si256((__m256i *)acc, a0[c]);                                                 \
    _mm256_storeu_si256((__m256i *)(acc + 4), a1[c]);                                           \
    h[c] = merge_4k(acc);                                                                       \
  }

/* fused4-pf: software prefetch this far ahead in each chunk (prefetches never fault, so the
 * last lines may point past the source). */
#define XDC_PF_BYTES 512

__attribute__((target("avx2"))) static void hc1(uint8_t *dst, const uint8_t *src, bool nt, uint64_t h[1]) {
  const bool pf = false, cp = true;
  XDC_BODY(1)
}
__attribute__((target("avx2"))) static void hc4(uint8_t *dst, const uint8_t *src, bool nt, uint64_t h[4]) {
  const bool pf = false, cp = true;
  XDC_BODY(4)
}
__attribute__((target("avx2"))) static void hc4pf(uint8_t *dst, const uint8_t *src, bool nt, uint64_t h[4]) {
  const bool pf = true, cp = true;
  XDC_BODY(4)
}
/* Hash only (the receiver's verification, k3_digest_update): four chunks (pages) side by side
 * as in hc4, so four hardware prefetch streams run; libxxhash's one chunk at a time measured
 * 0.61 of a memcpy's speed from DRAM on the GPU host's Xeon (each 4 KiB page restarts the
 * prefetcher), which left the receiver behind the sender. */
__attribute__((target("avx2"))) static void hh4(const uint8_t *src, uint64_t h[4]) {
  const bool pf = false, cp = false, nt = false;
  uint8_t *dst = (uint8_t *)(uintptr_t)src; /* never stored to (cp false) */
  XDC_BODY(4)
}

static bool self_test(void) {
  uint8_t *src = aligned_alloc(64, 4 * K3_DIGEST_CHUNK), *dst = aligned_alloc(64, 4 * K3_DIGEST_CHUNK);
  bool ok = src && dst;
  uint64_t x = 0x243F6A8885A308D3ull;
  for (size_t i = 0; ok && i < 4 * K3_DIGEST_CHUNK; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    src[i] = (uint8_t)x;
  }
  uint64_t h[4];
  for (int nt = 0; ok && nt < 2; nt++) {
    hc4(dst, src, nt, h);
    for (int c = 0; c < 4; c++) ok = ok && h[c] == XXH3_64bits(src + 4096 * c, 4096);
    ok = ok && memcmp(dst, src, 4 * K3_DIGEST_CHUNK) == 0;
    memset(dst, 0, 4 * K3_DIGEST_CHUNK);
    hc4pf(dst, src, nt, h);
    for (int c = 0; c < 4; c++) ok = ok && h[c] == XXH3_64bits(src + 4096 * c, 4096);
    ok = ok && memcmp(dst, src, 4 * K3_DIGEST_CHUNK) == 0;
    hc1(dst, src + 4096, nt, h);
    ok = ok && h[0] == XXH3_64bits(src + 4096, 4096) && memcmp(dst, src + 4096, 4096) == 0;
    hh4(src, h);
    for (int c = 0; c < 4; c++) ok = ok && h[c] == XXH3_64bits(src + 4096 * c, 4096);
  }
  _mm_sfence();
  free(src);
  free(dst);
  return ok;
}
#endif

static int impl_from_name(const char *s) {
  for (int i = 0; i < (int)(sizeof IMPL_NAMES / sizeof IMPL_NAMES[0]); i++)
    if (!strcmp(s, IMPL_NAMES[i])) return i;
  return -1;
}

/* The fused loops need AVX2 and a passing self-test; otherwise legacy. */
static int usable(int want) {
#if HAVE_FUSED
  static _Atomic int fused_ok = -1; /* racing first calls both self-test: same answer */
  if (want == XDC_LEGACY) return want;
  int ok = atomic_load_explicit(&fused_ok, memory_order_relaxed);
  if (ok < 0) {
    ok = __builtin_cpu_supports("avx2") && self_test();
    if (!ok && __builtin_cpu_supports("avx2"))
      K3_ERROR("digest: the fused XXH3 copy loop disagrees with libxxhash; using the legacy loop");
    atomic_store_explicit(&fused_ok, ok, memory_order_relaxed);
  }
  return ok ? want : XDC_LEGACY;
#else
  (void)want;
  return XDC_LEGACY;
#endif
}

/* The sender's default loop, by what was measured (docs/perf-gpu-cluster.md "Host path"): on the
 * GPU host's Xeon the four-wide loop with software prefetch 512 B ahead in each chunk ran at
 * 0.95 of a memcpy alone against fused4's 0.80 (k3pd-xfer-bench --cpu-loops, 2026-12-02: one
 * core's loads from DRAM are latency bound there, and a new 4 KiB page restarts the hardware
 * prefetcher); elsewhere fused4 (on the AMD VM the loops are within noise of each other). */
static int default_copy(void) {
#if HAVE_FUSED
  if (__builtin_cpu_is("intel")) return XDC_FUSED4_PF;
#endif
  return XDC_FUSED4;
}

int xdc_impl(void) {
  int v = atomic_load_explicit(&g_impl, memory_order_relaxed);
  if (v >= 0) return v;
  const char *e = getenv("K3PD_DIGEST_COPY");
  int want = default_copy();
  if (e && *e) {
    int i = impl_from_name(e);
    if (i < 0) K3_WARN("digest: K3PD_DIGEST_COPY=%s is not legacy|fused|fused4|fused4-st|fused4-pf: using %s", e, IMPL_NAMES[want]);
    else want = i;
  }
  v = usable(want);
  atomic_store_explicit(&g_impl, v, memory_order_relaxed);
  return v;
}

static const char *const HASH_NAMES[] = {"lib", "pf", "fused4"};

/* The receiver's default hash loop, by what was measured (docs/transfer.md "On the GPU host"):
 * on the GPU host's Xeon one core's hash from DRAM is latency bound (libxxhash per 4 KiB chunk:
 * 0.61 of a memcpy's speed) and four pages side by side is what brought the copy loop from
 * 0.50 to 0.89 of a memcpy there, so Intel takes fused4; on the AMD VM the hash is compute
 * bound and libxxhash's AVX-512 build beats the AVX2 four-wide loop (0.6-0.7x), so others take
 * pf (libxxhash with the next chunk prefetched: equal to libxxhash there). */
static int default_hash(void) {
#if HAVE_FUSED
  if (__builtin_cpu_is("intel") && usable(XDC_FUSED4) == XDC_FUSED4) return XDH_FUSED4;
#endif
  return XDH_PF;
}
static _Atomic int g_hash = -1;

int xdc_hash_impl(void) {
  int v = atomic_load_explicit(&g_hash, memory_order_relaxed);
  if (v >= 0) return v;
  const char *e = getenv("K3PD_DIGEST_HASH");
  v = default_hash();
  if (e && *e) {
    int i = -1;
    for (int k = 0; k < 3; k++)
      if (!strcmp(e, HASH_NAMES[k])) i = k;
    if (i < 0) K3_WARN("digest: K3PD_DIGEST_HASH=%s is not lib|pf|fused4: using %s", e, HASH_NAMES[v]);
    else v = i;
  }
  if (v == XDH_FUSED4 && usable(XDC_FUSED4) != XDC_FUSED4) v = XDH_PF;
  atomic_store_explicit(&g_hash, v, memory_order_relaxed);
  return v;
}

int k3_digest_hash_impl_set(const char *name) {
  for (int k = 0; name && k < 3; k++)
    if (!strcmp(name, HASH_NAMES[k])) {
      if (k == XDH_FUSED4 && usable(XDC_FUSED4) != XDC_FUSED4) return K3_ENOTSUP;
      atomic_store_explicit(&g_hash, k, memory_order_relaxed);
      return 0;
    }
  return K3_EINVAL;
}

const char *k3_digest_hash_impl(void) { return HASH_NAMES[xdc_hash_impl()]; }

void xdc_prefetch_chunk(const uint8_t *p) {
  for (int off = 0; off < (int)K3_DIGEST_CHUNK; off += 64) __builtin_prefetch(p + off, 0, 3);
}

int k3_digest_copy_impl_set(const char *name) {
  int i = name ? impl_from_name(name) : -1;
  if (i < 0) return K3_EINVAL;
  int got = usable(i);
  if (got != i) return K3_ENOTSUP;
  atomic_store_explicit(&g_impl, got, memory_order_relaxed);
  return 0;
}

const char *k3_digest_copy_impl(void) { return IMPL_NAMES[xdc_impl()]; }

size_t xdc_hash_chunks(int impl, const uint8_t *src, size_t n_chunks, uint64_t *h) {
#if HAVE_FUSED
  size_t done = 0;
  if (impl == XDC_LEGACY) return 0;
  for (; done + 4 <= n_chunks; done += 4) hh4(src + 4096 * done, h + done);
  return done; /* the last 0..3 chunks: libxxhash */
#else
  (void)impl, (void)src, (void)n_chunks, (void)h;
  return 0;
#endif
}

size_t xdc_chunks(int impl, uint8_t *dst, const uint8_t *src, size_t n_chunks, uint64_t *h) {
#if HAVE_FUSED
  size_t done = 0;
  if (impl == XDC_LEGACY) return 0;
  bool nt = impl != XDC_FUSED4_ST && ((uintptr_t)dst & 31) == 0;
  if (impl == XDC_FUSED4_PF)
    for (; done + 4 <= n_chunks; done += 4) hc4pf(dst + 4096 * done, src + 4096 * done, nt, h + done);
  else if (impl != XDC_FUSED)
    for (; done + 4 <= n_chunks; done += 4) hc4(dst + 4096 * done, src + 4096 * done, nt, h + done);
  for (; done < n_chunks; done++) hc1(dst + 4096 * done, src + 4096 * done, nt, h + done);
  return done;
#else
  (void)impl, (void)dst, (void)src, (void)n_chunks, (void)h;
  return 0;
#endif
}
