/* Segment layouts for the k3k_xdev tests (xdev_layouts.h). */
#include "xdev_layouts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/digest.h"

uint64_t xl_rng(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q) {
    fprintf(stderr, "xdev_layouts: out of memory\n");
    abort();
  }
  return q;
}

void xl_init(xl_layout *L, const char *name) {
  memset(L, 0, sizeof *L);
  snprintf(L->name, sizeof L->name, "%s", name);
  L->reg_cap = 8;
  L->first = xrealloc(NULL, L->reg_cap * sizeof *L->first);
  L->first[0] = 0;
}

void xl_free(xl_layout *L) {
  free(L->segs);
  free(L->first);
  memset(L, 0, sizeof *L);
}

void xl_region(xl_layout *L) {
  if (L->n_regions + 2 > L->reg_cap) {
    L->reg_cap *= 2;
    L->first = xrealloc(L->first, L->reg_cap * sizeof *L->first);
  }
  L->n_regions++;
  L->first[L->n_regions] = L->n_segs;
}

static uint64_t up16(uint64_t x) { return (x + 15) & ~(uint64_t)15; }

void xl_seg_add(xl_layout *L, uint64_t len, unsigned src_mis, bool copy, unsigned dst_mis) {
  if (!L->n_regions) xl_region(L); /* segments before any xl_region belong to region 0 */
  if (L->n_segs == L->seg_cap) {
    L->seg_cap = L->seg_cap ? 2 * L->seg_cap : 16;
    L->segs = xrealloc(L->segs, L->seg_cap * sizeof *L->segs);
  }
  xl_seg *s = &L->segs[L->n_segs++];
  s->len = len;
  s->src_off = up16(L->src_bytes) + (src_mis & 15);
  L->src_bytes = s->src_off + len;
  s->dst_off = XL_NO_DST;
  if (copy) { /* 32 guard bytes after each copy, 0..31 more before the next */
    s->dst_off = up16(L->dst_bytes + (L->n_segs * 7) % 32) + (dst_mis & 15);
    L->dst_bytes = s->dst_off + len + 32;
  }
  L->first[L->n_regions] = L->n_segs;
}

static const uint64_t k_edge[] = {1,    2,    3,    15,   16,   17,   128,  129,  239,  240,
                                  241,  255,  256,  1023, 1024, 1025, 1088, 4032, 4095, 4096,
                                  4097, 5120, 8191, 8192, 8193, 12289};

void xl_random(xl_layout *L, uint64_t *rng, bool copy) {
  xl_init(L, "random");
  uint32_t nr = 1 + (uint32_t)(xl_rng(rng) % 5);
  for (uint32_t r = 0; r < nr; r++) {
    xl_region(L);
    bool aligned = xl_rng(rng) & 1;
#define MIS() (aligned ? 0u : (unsigned)(xl_rng(rng) % 16))
#define CP() (copy && (xl_rng(rng) % 4 != 0))
    switch (xl_rng(rng) % 7) {
    case 0: /* empty region, sometimes with empty segments */
      for (uint64_t n = xl_rng(rng) % 3; n; n--) xl_seg_add(L, 0, MIS(), CP(), MIS());
      break;
    case 1: { /* 1..3 bytes, maybe one byte per segment with empty segments between */
      uint64_t n = 1 + xl_rng(rng) % 3;
      if (xl_rng(rng) & 1) {
        xl_seg_add(L, n, MIS(), CP(), MIS());
      } else {
        for (uint64_t i = 0; i < n; i++) {
          xl_seg_add(L, 1, MIS(), CP(), MIS());
          if (xl_rng(rng) & 1) xl_seg_add(L, 0, MIS(), CP(), MIS());
        }
      }
      break;
    }
    case 2: /* one segment of an edge length */
      xl_seg_add(L, k_edge[xl_rng(rng) % (sizeof k_edge / sizeof k_edge[0])], MIS(), CP(), MIS());
      break;
    case 3: { /* many short segments: chunks of many pieces */
      uint64_t total = 0, want = 1 + xl_rng(rng) % 10000;
      while (total < want) {
        uint64_t n = (xl_rng(rng) & 1) ? 16 * (1 + xl_rng(rng) % 8) : xl_rng(rng) % 40;
        xl_seg_add(L, n, MIS(), CP(), MIS());
        total += n;
      }
      break;
    }
    case 4: { /* pages */
      uint64_t page = (xl_rng(rng) & 1) ? 2560 : 18432;
      for (uint64_t n = 1 + xl_rng(rng) % 6; n; n--) xl_seg_add(L, page, MIS(), CP(), MIS());
      break;
    }
    case 5: /* the edge stream lengths split in two at a random point */
    {
      uint64_t n = k_edge[xl_rng(rng) % (sizeof k_edge / sizeof k_edge[0])];
      uint64_t cut = xl_rng(rng) % (n + 1);
      xl_seg_add(L, cut, MIS(), CP(), MIS());
      xl_seg_add(L, n - cut, MIS(), CP(), MIS());
      break;
    }
    default: /* random lengths */
      for (uint64_t n = 1 + xl_rng(rng) % 6; n; n--)
        xl_seg_add(L, 1 + xl_rng(rng) % 20000, MIS(), CP(), MIS());
      break;
    }
#undef MIS
#undef CP
  }
}

void xl_pages(xl_layout *L, uint32_t n_regions, uint32_t n_pages, uint64_t page_bytes, bool copy) {
  char name[80];
  snprintf(name, sizeof name, "%u x %u pages of %llu B", n_regions, n_pages, (unsigned long long)page_bytes);
  xl_init(L, name);
  for (uint32_t r = 0; r < n_regions; r++) {
    xl_region(L);
    for (uint32_t p = 0; p < n_pages; p++) xl_seg_add(L, page_bytes, 0, copy, 0);
  }
}

void xl_seq8k(xl_layout *L, bool copy) {
  xl_init(L, "8K-token K3 sequence");
  for (int l = 0; l < 69; l++) {
    xl_region(L);
    xl_seg_add(L, 6291456, 0, copy, 0); /* S: [H, V, K] fp32 */
    for (int c = 0; c < 3; c++) {      /* conv q, k, v: [P, 3] bf16 */
      xl_region(L);
      xl_seg_add(L, 73728, 0, copy, 0);
    }
  }
  for (int l = 0; l < 24; l++) { /* MLA latent pages: 64 tokens x 1152 B */
    xl_region(L);
    for (int p = 0; p < 128; p++) xl_seg_add(L, 64 * 1152, 0, copy, 0);
  }
}

k3k_xseg_t *xl_segs(const xl_layout *L, const void *src_base, void *dst_base) {
  k3k_xseg_t *s = xrealloc(NULL, (L->n_segs ? L->n_segs : 1) * sizeof *s);
  for (uint32_t i = 0; i < L->n_segs; i++) {
    s[i].src = (const uint8_t *)src_base + L->segs[i].src_off;
    s[i].dst = L->segs[i].dst_off == XL_NO_DST ? NULL : (uint8_t *)dst_base + L->segs[i].dst_off;
    s[i].len = L->segs[i].len;
  }
  return s;
}

uint64_t xl_region_bytes(const xl_layout *L, uint32_t r) {
  uint64_t n = 0;
  for (uint32_t i = L->first[r]; i < L->first[r + 1]; i++) n += L->segs[i].len;
  return n;
}

void xl_reference(const xl_layout *L, const uint8_t *src, uint64_t *digests) {
  for (uint32_t r = 0; r < L->n_regions; r++) {
    uint64_t n = xl_region_bytes(L, r), o = 0;
    uint8_t *cat = xrealloc(NULL, n ? n : 1);
    for (uint32_t i = L->first[r]; i < L->first[r + 1]; i++) {
      memcpy(cat + o, src + L->segs[i].src_off, L->segs[i].len);
      o += L->segs[i].len;
    }
    digests[r] = k3_digest_bytes(cat, n);
    free(cat);
  }
}

void xl_fill_random(uint8_t *p, uint64_t n, uint64_t seed) {
  uint64_t s = seed, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = xl_rng(&s);
    memcpy(p + i, &v, 8);
  }
  for (uint64_t v = xl_rng(&s); i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}

static uint8_t guard_at(uint64_t i) { return (uint8_t)(0xA5 + i * 131 + (i >> 8) * 7); }

void xl_fill_guard(uint8_t *p, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) p[i] = guard_at(i);
}

uint64_t xl_check_dst(const xl_layout *L, const uint8_t *src, const uint8_t *dst) {
  uint8_t *want = xrealloc(NULL, L->dst_bytes ? L->dst_bytes : 1);
  xl_fill_guard(want, L->dst_bytes);
  for (uint32_t i = 0; i < L->n_segs; i++)
    if (L->segs[i].dst_off != XL_NO_DST)
      memcpy(want + L->segs[i].dst_off, src + L->segs[i].src_off, L->segs[i].len);
  uint64_t bad = UINT64_MAX;
  for (uint64_t i = 0; i < L->dst_bytes; i++)
    if (want[i] != dst[i]) {
      bad = i;
      break;
    }
  free(want);
  return bad;
}
