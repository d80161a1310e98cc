/* XXH3-64 (seed 0, the default 192-byte secret) of one <= 4096-byte chunk by one GPU warp, as
 * per-lane functions shared by the first CUDA kernel (xdev_kernel in kernels/cuda/xdev_kernels.cu,
 * K3PD_XDEV_KERNEL=1) and its CPU emulation (tests/unit/kernels/test_kernels_xw.c); the helpers
 * before "the long path" (scalar math, short paths) and after it (table search, chunk
 * resolution, cursor reads and writes) serve the second kernel too (xxh3_half.h).
 *
 * What it is for: the kernel is these functions glued together with warp shuffles; the CPU test
 * runs the same functions for 32 lanes in loops, with the shuffles written as explicit sums
 * over the lane arrays, and checks the result against libxxhash for every length 0..4096 and
 * for whole jobs planned by xdev_plan.h. Everything but the glue is thereby tested without a
 * GPU. Plain C17 (gcc) and CUDA C++ (nvcc: __host__ __device__, force-inlined so the register
 * arrays stay in registers).
 *
 * The algorithm (XXH3, xxhash.h 0.8.1 / doc/xxhash_spec.md), and how the warp splits it:
 *   len <= 240: the short paths (0-16, 17-128, 129-240) on one byte array (the warp's staging
 *     buffer); every lane computes the same value, lane 0's is used.
 *   len > 240: 8 u64 accumulators acc[0..8) start as {P32_3, P64_1, P64_2, P64_3, P64_4,
 *     P32_2, P64_5, P32_1}. The input is cut into 1024-byte blocks of 16 stripes of 64 bytes.
 *     Stripe s of a block uses the secret at 8 s: for each of its 8 words d_i (LE u64)
 *       k = d_i ^ LE64(secret + 8 s + 8 i);  acc[i] += lo32(k) * hi32(k);  acc[i ^ 1] += d_i.
 *     After each FULL block (nb = (len - 1) / 1024 of them):
 *       acc[i] = ((acc[i] ^ (acc[i] >> 47)) ^ LE64(secret + 128 + 8 i)) * P32_1.
 *     The last block accumulates its first ((len - 1) - 1024 nb) / 64 stripes the same way,
 *     then the stripe at len - 64 with the secret at 121 (= 192 - 64 - 7).
 *     Result: avalanche(len * P64_1 + sum_{m<4} fold(acc[2m] ^ LE64(secret + 11 + 16 m),
 *     acc[2m+1] ^ LE64(secret + 19 + 16 m))), fold(a, b) = lo64(a*b) ^ hi64(a*b).
 *   Warp decomposition of one 1024-byte step: lane l reads bytes [32 l, 32 l + 32) of the block
 *     (coalesced, two 16-byte loads): stripe s = l / 2, half h = l % 2, words i = 4 h + j,
 *     j < 4. Its products and data only touch acc[4 h .. 4 h + 4) (i ^ 1 stays in the half), so
 *     it keeps 4 partial sums p[j]. A reduce-scatter over the 16 lanes of one parity gives each
 *     lane ONE accumulator: exchange 2 of 4 partials with lane ^ 2, 1 of 2 with lane ^ 4, then
 *     add lane ^ 8 and lane ^ 16; lane l ends with acc index a(l) = 4 (l&1) + 2 ((l>>1)&1) +
 *     ((l>>2)&1) (4 copies: bits 3, 4), adds the block sum to it and scrambles it. 12 shuffles
 *     of 32 bits per lane and step instead of 32 for an all-reduce of 4 partials.
 *   The last stripe (len - 64 .. len) may span the last two steps and is not 32-byte aligned:
 *     every lane whose window meets [base, len) (base = (len - 64) & ~31, or 0 when len <= 240)
 *     stages it in the warp's 256-byte buffer; lanes 0 and 1 read the stripe's halves from it.
 * Memory access (the fused copy): xw_lane_read loads a lane's 4 steps x 32 bytes up front (all
 * loads in flight together); then step by step the lane stores its 32 bytes to dst
 * (xw_lane_write_step), stages what the last stripe needs and hashes, so a warp's work on step
 * k overlaps the arrival of steps k+1.. and only the last step's hashing trails. A chunk of one
 * 16-byte aligned piece of 4096 bytes takes 8 plain 16-byte loads (and stores); any other chunk
 * walks its pieces with a cursor, 16 bytes at a time where VEC allows, byte by byte otherwise.
 * Invariants: no lane reads outside [src, src + len) of a piece or writes outside its dst. */
#ifndef K3K_XXH3_WARP_H
#define K3K_XXH3_WARP_H

#include <stdint.h>
#include <string.h>

#include "core/xdev_plan.h"

#ifdef __CUDACC__
#define XW_FN static __host__ __device__ __forceinline__
#else
#define XW_FN static inline
#endif
#ifdef __CUDA_ARCH__ /* the device pass only: the host compiler does not know the pragma */
#define XW_UNROLL _Pragma("unroll")
#else
#define XW_UNROLL
#endif

#define XW_CHUNK 4096u
#define XW_STEP 1024u   /* bytes a warp hashes per step: one XXH3 block of 16 stripes */
#define XW_STEPS 4u     /* steps of a full chunk */
#define XW_STAGE 256u   /* bytes of a warp's staging buffer */
#define XW_MIDSIZE 240u /* longest input of the short paths */

/* The primes of the XXH3 specification (checked against xxhash.h by xxh3_secret.c). */
#define XW_P32_1 0x9E3779B1u
#define XW_P32_2 0x85EBCA77u
#define XW_P32_3 0xC2B2AE3Du
#define XW_P64_1 0x9E3779B185EBCA87ull
#define XW_P64_2 0xC2B2AE3D27D4EB4Full
#define XW_P64_3 0x165667B19E3779F9ull
#define XW_P64_4 0x85EBCA77C2B2AE63ull
#define XW_P64_5 0x27D4EB2F165667C5ull
#define XW_MX1 0x165667919E3779F9ull /* XXH3 avalanche multiplier */
#define XW_MX2 0x9FB21C651E98DF25ull /* rrmxmx multiplier (4..8-byte inputs) */

#ifdef __cplusplus
extern "C" {
#endif
/* Copies the 192 bytes of XXH3's default secret (kernels/core/xxh3_secret.c, from xxhash.h). */
void k3k_xxh3_secret(uint8_t out[192]);
#ifdef __cplusplus
}
#endif

/* The secret and the words derived from it once, at open (device: __constant__). */
typedef struct {
  uint8_t secret[192]; /* XXH3_kSecret (xxh3_secret.c) */
  uint64_t k64[24];    /* LE64(secret + 8 i): stripe s word i uses k64[s + i]; scramble k64[16 + i] */
  uint64_t klast[8];   /* LE64(secret + 121 + 8 i): the last stripe */
  uint64_t kmerge[8];  /* LE64(secret + 11 + 8 i): the merge of the accumulators */
  uint64_t init[8];    /* the accumulators' start values */
} k3k_xw_consts;

/* ---- scalar helpers ---- */

XW_FN uint64_t xw_rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; b--) v = (v << 8) | p[b];
  return v;
}
XW_FN uint32_t xw_rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
XW_FN uint64_t xw_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
XW_FN uint64_t xw_swap64(uint64_t x) {
  uint64_t r = 0;
  for (int b = 0; b < 8; b++) r = (r << 8) | ((x >> (8 * b)) & 0xff);
  return r;
}
/* lo64(a*b) ^ hi64(a*b) */
XW_FN uint64_t xw_fold64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 u128;
  u128 p = (u128)a * b;
  return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}
XW_FN uint64_t xw_avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= XW_MX1;
  return h ^ (h >> 32);
}
XW_FN uint64_t xw_avalanche64(uint64_t h) { /* XXH64's */
  h ^= h >> 33;
  h *= XW_P64_2;
  h ^= h >> 29;
  h *= XW_P64_3;
  return h ^ (h >> 32);
}
XW_FN uint64_t xw_rrmxmx(uint64_t h, uint64_t len) {
  h ^= xw_rotl64(h, 49) ^ xw_rotl64(h, 24);
  h *= XW_MX2;
  h ^= (h >> 35) + len;
  h *= XW_MX2;
  return h ^ (h >> 28);
}
XW_FN uint64_t xw_mix16(const uint8_t *in, const uint8_t *sec) {
  return xw_fold64(xw_rd64(in) ^ xw_rd64(sec), xw_rd64(in + 8) ^ xw_rd64(sec + 8));
}

/* Derives the constants from the secret (host only, once). */
static inline void xw_consts_init(k3k_xw_consts *c, const uint8_t secret[192]) {
  const uint64_t init[8] = {XW_P32_3, XW_P64_1, XW_P64_2, XW_P64_3,
                                   XW_P64_4, XW_P32_2, XW_P64_5, XW_P32_1};
  memcpy(c->secret, secret, 192);
  for (int i = 0; i < 24; i++) c->k64[i] = xw_rd64(secret + 8 * i);
  for (int i = 0; i < 8; i++) {
    c->klast[i] = xw_rd64(secret + 192 - 64 - 7 + 8 * i);
    c->kmerge[i] = xw_rd64(secret + 11 + 8 * i);
    c->init[i] = init[i];
  }
}

/* ---- the short paths: XXH3-64 of p[0..len), len <= 240 ---- */

XW_FN uint64_t xw_short(const uint8_t *p, uint32_t len, const uint8_t *sec) {
  if (len <= 16) {
    if (len > 8) {
      uint64_t lo = xw_rd64(p) ^ (xw_rd64(sec + 24) ^ xw_rd64(sec + 32));
      uint64_t hi = xw_rd64(p + len - 8) ^ (xw_rd64(sec + 40) ^ xw_rd64(sec + 48));
      return xw_avalanche(len + xw_swap64(lo) + hi + xw_fold64(lo, hi));
    }
    if (len >= 4) {
      uint64_t in64 = xw_rd32(p + len - 4) + ((uint64_t)xw_rd32(p) << 32);
      return xw_rrmxmx(in64 ^ (xw_rd64(sec + 8) ^ xw_rd64(sec + 16)), len);
    }
    if (len) {
      uint32_t comb = (uint32_t)p[0] << 16 | (uint32_t)p[len >> 1] << 24 | (uint32_t)p[len - 1] |
                      len << 8;
      return xw_avalanche64((uint64_t)comb ^ (uint64_t)(xw_rd32(sec) ^ xw_rd32(sec + 4)));
    }
    return xw_avalanche64(xw_rd64(sec + 56) ^ xw_rd64(sec + 64));
  }
  uint64_t acc = len * XW_P64_1;
  if (len <= 128) { /* pairs from both ends, outermost last */
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += xw_mix16(p + 48, sec + 96);
          acc += xw_mix16(p + len - 64, sec + 112);
        }
        acc += xw_mix16(p + 32, sec + 64);
        acc += xw_mix16(p + len - 48, sec + 80);
      }
      acc += xw_mix16(p + 16, sec + 32);
      acc += xw_mix16(p + len - 32, sec + 48);
    }
    acc += xw_mix16(p, sec);
    acc += xw_mix16(p + len - 16, sec + 16);
    return xw_avalanche(acc);
  }
  for (uint32_t i = 0; i < 8; i++) acc += xw_mix16(p + 16 * i, sec + 16 * i);
  acc = xw_avalanche(acc);
  for (uint32_t i = 8; i < len / 16; i++) acc += xw_mix16(p + 16 * i, sec + 16 * (i - 8) + 3);
  acc += xw_mix16(p + len - 16, sec + 136 - 17);
  return xw_avalanche(acc);
}

/* ---- the long path, per lane ---- */

/* Steps (1024-byte blocks) of a chunk, full blocks, and the stripes step k accumulates with
 * the regular keys (len > 240). */
XW_FN uint32_t xw_nsteps(uint32_t len) { return (len + XW_STEP - 1) / XW_STEP; }
XW_FN uint32_t xw_nfull(uint32_t len) { return (len - 1) / XW_STEP; }
XW_FN uint32_t xw_stripes(uint32_t len, uint32_t k) {
  uint32_t nb = xw_nfull(len);
  return k < nb ? 16u : ((len - 1) - XW_STEP * nb) / 64u;
}
/* The accumulator lane l ends up holding after the reduce-scatter, and the lane holding acc a. */
XW_FN int xw_lane_acc(int l) { return 4 * (l & 1) + 2 * ((l >> 1) & 1) + ((l >> 2) & 1); }
XW_FN int xw_acc_lane(int a) { return (a >> 2) | (((a >> 1) & 1) << 1) | ((a & 1) << 2); }
/* Lane l's stripe keys (its 4 words of stripe l/2, half l%2) and the scramble key of the
 * accumulator it ends up holding. */
XW_FN void xw_lane_keys(const uint64_t *k64, int l, uint64_t key[4], uint64_t *kscr) {
  XW_UNROLL
  for (int j = 0; j < 4; j++) key[j] = k64[(l >> 1) + 4 * (l & 1) + j];
  *kscr = k64[16 + xw_lane_acc(l)];
}
/* accumulate_512 restricted to 4 words of one half: p[j] is acc[4 h + j]'s partial sum. */
XW_FN void xw_accum(const uint64_t w[4], const uint64_t key[4], uint64_t p[4]) {
  XW_UNROLL
  for (int j = 0; j < 4; j++) {
    uint64_t k = w[j] ^ key[j];
    p[j] += (k & 0xffffffffu) * (k >> 32);
    p[j ^ 1] += w[j];
  }
}
/* An 8-byte aligned LE u64 (the stage is 16-byte aligned). */
XW_FN uint64_t xw_ld64_al(const uint8_t *p) {
#ifdef __CUDA_ARCH__
  return *(const uint64_t *)p;
#else
  if ((uintptr_t)p & 7) __builtin_trap();
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
#endif
}
/* Staging: the first window kept, and whether the window at stream offset o is needed. */
XW_FN uint32_t xw_stage_base(uint32_t len) { return len <= XW_MIDSIZE ? 0 : (len - 64) & ~31u; }
XW_FN void xw_stage(uint8_t *stage, uint32_t len, uint32_t o, const uint64_t w[4]) {
  uint32_t base = xw_stage_base(len);
  if (o < base || o >= len) return;
  XW_UNROLL
  for (int j = 0; j < 4; j++) {
#ifdef __CUDA_ARCH__
    *(uint64_t *)(stage + (o - base) + 8 * j) = w[j];
#else
    if ((uintptr_t)(stage + (o - base) + 8 * j) & 7) __builtin_trap();
    memcpy(stage + (o - base) + 8 * j, &w[j], 8);
#endif
  }
}
/* Lane l's partial sums for step k: its words of stripe l/2 when that stripe is accumulated,
 * plus, in the last step, lanes 0 and 1 add their half of the last stripe (from the stage). */
XW_FN void xw_lane_contrib(const k3k_xw_consts *c, uint32_t len, uint32_t k, int l,
                           const uint64_t w[4], const uint64_t key[4], const uint8_t *stage,
                           uint64_t p[4]) {
  p[0] = p[1] = p[2] = p[3] = 0;
  if ((uint32_t)(l >> 1) < xw_stripes(len, k)) xw_accum(w, key, p);
  if (k + 1 == xw_nsteps(len) && l < 2) {
    uint64_t fw[4], fk[4];
    const uint8_t *q = stage + (len - 64 + 32 * l - xw_stage_base(len));
    XW_UNROLL
    for (int j = 0; j < 4; j++) {
      fw[j] = (len & 7) ? xw_rd64(q + 8 * j) : xw_ld64_al(q + 8 * j);
      fk[j] = c->klast[4 * l + j];
    }
    xw_accum(fw, fk, p);
  }
}
/* Reduce-scatter, first exchange (partner l ^ 2): keep the pair of partials for j in
 * {2 b1, 2 b1 + 1} (b1 = bit 1 of l), send the other pair. The partner's pair is added to keep. */
XW_FN void xw_red_a(int l, const uint64_t p[4], uint64_t keep[2], uint64_t send[2]) {
  int b1 = (l >> 1) & 1;
  keep[0] = b1 ? p[2] : p[0];
  keep[1] = b1 ? p[3] : p[1];
  send[0] = b1 ? p[0] : p[2];
  send[1] = b1 ? p[1] : p[3];
}
/* Second exchange (partner l ^ 4): keep q[b2] (j = 2 b1 + b2), send the other. */
XW_FN void xw_red_b(int l, const uint64_t q[2], uint64_t *keep, uint64_t *send) {
  int b2 = (l >> 2) & 1;
  *keep = b2 ? q[1] : q[0];
  *send = b2 ? q[0] : q[1];
}
/* Adds the step's sum v to the lane's accumulator; full blocks end with the scramble. */
XW_FN uint64_t xw_acc_step(uint32_t len, uint32_t k, uint64_t acc, uint64_t v, uint64_t kscr) {
  acc += v;
  if (k < xw_nfull(len)) {
    acc ^= acc >> 47;
    acc ^= kscr;
    acc *= XW_P32_1;
  }
  return acc;
}
XW_FN uint64_t xw_merge(const k3k_xw_consts *c, const uint64_t acc[8], uint32_t len) {
  uint64_t r = len * XW_P64_1;
  XW_UNROLL
  for (int m = 0; m < 4; m++)
    r += xw_fold64(acc[2 * m] ^ c->kmerge[2 * m], acc[2 * m + 1] ^ c->kmerge[2 * m + 1]);
  return xw_avalanche(r);
}

/* ---- finding and reading a chunk ---- */

/* 32-ary search for the group holding chunk c among n groups (sorted by first chunk id): while
 * hi - lo > 1, lane l probes lo + l * step; the probes with tab[.].chunk <= c form a prefix of
 * k >= 1 lanes (a ballot); the group lies in [lo + (k-1) step, lo + k step). */
XW_FN uint32_t xw_search_step(uint32_t lo, uint32_t hi) { return (hi - lo + 31) / 32; }
XW_FN int xw_probe(const k3k_xent *tab, uint32_t lo, uint32_t hi, uint32_t step, int l,
                   uint32_t c) {
  uint64_t idx = lo + (uint64_t)l * step;
  return idx < hi && tab[idx].chunk <= c;
}
XW_FN void xw_narrow(uint32_t *lo, uint32_t *hi, uint32_t step, uint32_t k) {
  *lo += (k - 1) * step;
  if (*hi - *lo > step) *hi = *lo + step;
}

/* One chunk as a lane reads it. */
typedef struct {
  const k3k_xent *piece; /* MULTI: its first piece; NULL: the single piece (src, dst, len) */
  uint64_t src, dst;     /* single piece; dst 0: not copied */
  uint32_t n;            /* pieces */
  uint32_t len;          /* bytes of the chunk */
  uint32_t flags;        /* K3K_XENT_VEC, K3K_XENT_DST */
} xw_chunk;

XW_FN void xw_resolve(const k3k_xent *tab, uint32_t g, uint32_t c, xw_chunk *ch) {
  const k3k_xent *e = &tab[g];
  uint32_t fl = e->flags;
  ch->flags = fl;
  if (fl & K3K_XENT_MULTI) {
    ch->piece = tab + e->src;
    ch->src = ch->dst = 0;
    ch->n = e->n;
    ch->len = e->len;
  } else {
    uint32_t k = c - e->chunk;
    ch->piece = 0;
    ch->src = e->src + (uint64_t)k * XW_CHUNK;
    ch->dst = e->dst ? e->dst + (uint64_t)k * XW_CHUNK : 0;
    ch->n = 1;
    ch->len = k + 1 == e->n ? e->len : XW_CHUNK;
  }
}
XW_FN int xw_fast(const xw_chunk *ch) {
  return !ch->piece && (ch->flags & K3K_XENT_VEC) && ch->len == XW_CHUNK;
}

/* Cursor over a chunk's pieces: the piece holding stream offsets [start, start + plen). */
typedef struct {
  const k3k_xent *pe;
  uint32_t left, start, plen;
  uint64_t src, dst;
} xw_cur;

XW_FN void xw_cur_init(const xw_chunk *ch, xw_cur *cu) {
  cu->start = 0;
  if (ch->piece) {
    cu->pe = ch->piece;
    cu->left = ch->n - 1;
    cu->plen = cu->pe->len;
    cu->src = cu->pe->src;
    cu->dst = cu->pe->dst;
  } else {
    cu->pe = 0;
    cu->left = 0;
    cu->plen = ch->len;
    cu->src = ch->src;
    cu->dst = ch->dst;
  }
}
XW_FN void xw_cur_seek(xw_cur *cu, uint32_t off) {
  while (off >= cu->start + cu->plen && cu->left) {
    cu->start += cu->plen;
    cu->pe++;
    cu->left--;
    cu->plen = cu->pe->len;
    cu->src = cu->pe->src;
    cu->dst = cu->pe->dst;
  }
}

XW_FN void xw_ld16(uint64_t a, uint64_t w[2]) {
#ifdef __CUDA_ARCH__
  uint4 v = __ldg((const uint4 *)a);
  w[0] = v.x | (uint64_t)v.y << 32;
  w[1] = v.z | (uint64_t)v.w << 32;
#else
  if (a & 15) __builtin_trap(); /* the device's 16-byte loads need it: the emulation checks */
  memcpy(w, (const void *)(uintptr_t)a, 16);
#endif
}
XW_FN void xw_st16(uint64_t a, const uint64_t w[2]) {
#ifdef __CUDA_ARCH__
  __stwb((uint4 *)a, make_uint4((uint32_t)w[0], (uint32_t)(w[0] >> 32), (uint32_t)w[1], (uint32_t)(w[1] >> 32)));
#else
  if (a & 15) __builtin_trap();
  memcpy((void *)(uintptr_t)a, w, 16);
#endif
}

/* The 16 bytes at chunk offset off (zeros past the end). */
XW_FN void xw_read_unit(const xw_chunk *ch, xw_cur *cu, uint32_t off, uint64_t w[2]) {
  w[0] = w[1] = 0;
  if (off >= ch->len) return;
  if ((ch->flags & K3K_XENT_VEC) && off + 16 <= ch->len) {
    xw_cur_seek(cu, off);
    xw_ld16(cu->src + (off - cu->start), w);
    return;
  }
  uint64_t lo = 0, hi = 0; /* w is never indexed at run time: it must stay in registers */
  for (uint32_t b = 0; b < 16 && off + b < ch->len; b++) {
    xw_cur_seek(cu, off + b);
    uint64_t v = *(const uint8_t *)(uintptr_t)(cu->src + (off + b - cu->start));
    if (b < 8) lo |= v << (8 * b);
    else hi |= v << (8 * (b - 8));
  }
  w[0] = lo;
  w[1] = hi;
}
XW_FN void xw_write_unit(const xw_chunk *ch, xw_cur *cu, uint32_t off, const uint64_t w[2]) {
  if (off >= ch->len) return;
  if ((ch->flags & K3K_XENT_VEC) && off + 16 <= ch->len) {
    xw_cur_seek(cu, off);
    if (cu->dst) xw_st16(cu->dst + (off - cu->start), w);
    return;
  }
  const uint64_t lo = w[0], hi = w[1];
  for (uint32_t b = 0; b < 16 && off + b < ch->len; b++) {
    xw_cur_seek(cu, off + b);
    uint8_t v = (uint8_t)(b < 8 ? lo >> (8 * b) : hi >> (8 * (b - 8)));
    if (cu->dst) *(uint8_t *)(uintptr_t)(cu->dst + (off + b - cu->start)) = v;
  }
}

/* Lane l's 4 x 32 bytes: w[k] = LE words of chunk bytes [1024 k + 32 l, +32) (zeros past the
 * end). All loads first: nothing between them depends on loaded data. */
XW_FN void xw_lane_read(const xw_chunk *ch, int l, uint64_t w[XW_STEPS][4]) {
  if (xw_fast(ch)) {
    XW_UNROLL
    for (uint32_t k = 0; k < XW_STEPS; k++) {
      xw_ld16(ch->src + XW_STEP * k + 32 * l, &w[k][0]);
      xw_ld16(ch->src + XW_STEP * k + 32 * l + 16, &w[k][2]);
    }
    return;
  }
  xw_cur cu;
  xw_cur_init(ch, &cu);
  XW_UNROLL
  for (uint32_t k = 0; k < XW_STEPS; k++) {
    xw_read_unit(ch, &cu, XW_STEP * k + 32 * l, &w[k][0]);
    xw_read_unit(ch, &cu, XW_STEP * k + 32 * l + 16, &w[k][2]);
  }
}
/* Stores step k's 32 bytes (as xw_lane_read loaded them) to the pieces' dst, where set. cu is
 * a cursor from xw_cur_init carried over the steps in order. Per step, so that a warp stores
 * and hashes step k while the loads of the later steps are still in flight. */
XW_FN void xw_lane_write_step(const xw_chunk *ch, xw_cur *cu, int l, uint32_t k, const uint64_t w[4]) {
  if (!(ch->flags & K3K_XENT_DST)) return;
  uint32_t o = XW_STEP * k + 32 * l;
  if (xw_fast(ch)) {
    xw_st16(ch->dst + o, &w[0]);
    xw_st16(ch->dst + o + 16, &w[2]);
    return;
  }
  xw_write_unit(ch, cu, o, &w[0]);
  xw_write_unit(ch, cu, o + 16, &w[2]);
}

#endif
