/* The chunk table of a device digest job (xdev_plan.h): argument checks and the two-pass plan.
 *
 * Walk of one region, stream offset by stream offset: a chunk that starts at a chunk boundary
 * inside a segment and ends inside the same segment joins a RUN; a chunk that crosses a segment
 * end is "open" and collects pieces until it holds 4096 bytes or the region ends (a MULTI
 * chunk). The region's last chunk, when it lies in its segment, ends the segment's run with
 * `len` < 4096. So a region of one segment is one entry whatever its size, and pages whose size
 * is a multiple of 4096 (MLA pages of 64 tokens: 73,728 bytes) are one run each. */
#include "core/xdev_plan.h"

#include <stdbool.h>
#include <stddef.h>

#include "k3pd/digest.h"
#include "k3pd/err.h"
#include "k3pd/log.h"

int k3k_xdev_check(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions) {
  if (!first) {
    K3_DEBUG("xdev: first is NULL");
    return K3_EINVAL;
  }
  if (first[0] != 0) {
    K3_DEBUG("xdev: first[0] = %u, want 0", first[0]);
    return K3_EINVAL;
  }
  for (uint32_t r = 0; r < n_regions; r++)
    if (first[r + 1] < first[r]) {
      K3_DEBUG("xdev: first[%u] = %u < first[%u] = %u", r + 1, first[r + 1], r, first[r]);
      return K3_EINVAL;
    }
  if (first[n_regions] && !segs) {
    K3_DEBUG("xdev: %u segments but segs is NULL", first[n_regions]);
    return K3_EINVAL;
  }
  uint64_t chunks = 0;
  for (uint32_t r = 0; r < n_regions; r++) {
    uint64_t bytes = 0;
    for (uint32_t i = first[r]; i < first[r + 1]; i++) {
      uint64_t n = segs[i].len, s = (uint64_t)(uintptr_t)segs[i].src, d = (uint64_t)(uintptr_t)segs[i].dst;
      if (!n) continue;
      if (!s || s + n < s || (d && d + n < d)) {
        K3_DEBUG("xdev: segs[%u]: src %p dst %p len %llu is not a valid range", i, segs[i].src,
                 segs[i].dst, (unsigned long long)n);
        return K3_EINVAL;
      }
      if (d && s < d + n && d < s + n) {
        K3_DEBUG("xdev: segs[%u]: dst %p overlaps src %p (len %llu)", i, segs[i].dst, segs[i].src,
                 (unsigned long long)n);
        return K3_EINVAL;
      }
      if (bytes + n < bytes) return K3_EINVAL;
      bytes += n;
    }
    chunks += k3_digest_nchunks(bytes);
    if (chunks > K3K_XPLAN_MAX_CHUNKS) {
      K3_DEBUG("xdev: more than %llu chunks", (unsigned long long)K3K_XPLAN_MAX_CHUNKS);
      return K3_EINVAL;
    }
  }
  return 0;
}

typedef struct {
  k3k_xent *ent;     /* NULL: pass 1 (count only) */
  uint64_t n_groups; /* pieces are written from ent + n_groups */
  uint64_t g, p;     /* groups and pieces so far */
  uint64_t chunk;    /* next chunk id */
  /* the open MULTI chunk */
  uint32_t fill;     /* its bytes so far; 0: none open */
  uint32_t np;       /* its pieces */
  uint64_t pfirst;   /* table index of its first piece */
  uint32_t last_len; /* length of its latest piece */
  bool vec, dst;
} walk;

static bool al16(uint64_t a) { return (a & 15) == 0; }

static void emit_run(walk *w, uint64_t src, uint64_t dst, uint64_t n, uint32_t last_len) {
  if (w->ent) {
    k3k_xent *e = &w->ent[w->g];
    e->src = src;
    e->dst = dst;
    e->chunk = (uint32_t)w->chunk;
    e->n = (uint32_t)n;
    e->len = last_len;
    e->flags = (al16(src) && al16(dst) ? K3K_XENT_VEC : 0) | (dst ? K3K_XENT_DST : 0);
  }
  w->g++;
  w->chunk += n;
}

static void add_piece(walk *w, uint64_t src, uint64_t dst, uint32_t len) {
  if (!w->np) {
    w->pfirst = w->n_groups + w->p;
    w->vec = true;
    w->dst = false;
  }
  w->vec = w->vec && al16(src) && al16(dst) && (!w->np || (w->last_len & 15) == 0);
  w->dst = w->dst || dst;
  if (w->ent) {
    k3k_xent *e = &w->ent[w->n_groups + w->p];
    e->src = src;
    e->dst = dst;
    e->chunk = 0;
    e->n = 0;
    e->len = len;
    e->flags = 0;
  }
  w->p++;
  w->np++;
  w->fill += len;
  w->last_len = len;
}

static void close_multi(walk *w) {
  if (w->ent) {
    k3k_xent *e = &w->ent[w->g];
    e->src = w->pfirst;
    e->dst = 0;
    e->chunk = (uint32_t)w->chunk;
    e->n = w->np;
    e->len = w->fill;
    e->flags = K3K_XENT_MULTI | (w->vec ? K3K_XENT_VEC : 0) | (w->dst ? K3K_XENT_DST : 0);
  }
  w->g++;
  w->chunk++;
  w->fill = 0;
  w->np = 0;
}

static void plan(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions, walk *w,
                 uint32_t *region_chunk) {
  for (uint32_t r = 0; r < n_regions; r++) {
    if (region_chunk) region_chunk[r] = (uint32_t)w->chunk;
    uint32_t last = first[r + 1]; /* last non-empty segment of the region */
    for (uint32_t i = first[r]; i < first[r + 1]; i++)
      if (segs[i].len) last = i;
    for (uint32_t i = first[r]; i < first[r + 1]; i++) {
      uint64_t len = segs[i].len, off = 0;
      if (!len) continue;
      uint64_t src = (uint64_t)(uintptr_t)segs[i].src, dst = (uint64_t)(uintptr_t)segs[i].dst;
      if (w->fill) { /* complete the open chunk first */
        uint64_t take = K3_DIGEST_CHUNK - w->fill;
        if (take > len) take = len;
        add_piece(w, src, dst, (uint32_t)take);
        if (w->fill == K3_DIGEST_CHUNK) close_multi(w);
        off = take;
        if (off == len) continue;
      }
      uint64_t rem = len - off, whole = rem / K3_DIGEST_CHUNK;
      uint32_t tail = (uint32_t)(rem % K3_DIGEST_CHUNK);
      uint64_t s = src + off, d = dst ? dst + off : 0;
      if (i == last && tail) { /* the region's last chunk ends inside this segment */
        emit_run(w, s, d, whole + 1, tail);
        continue;
      }
      if (whole) emit_run(w, s, d, whole, K3_DIGEST_CHUNK);
      if (tail) add_piece(w, s + whole * K3_DIGEST_CHUNK, d ? d + whole * K3_DIGEST_CHUNK : 0, tail);
    }
    if (w->fill) close_multi(w); /* the region ends inside a chunk of several pieces */
  }
  if (region_chunk) region_chunk[n_regions] = (uint32_t)w->chunk;
}

void k3k_xplan_measure(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                       k3k_xplan_size_t *sz) {
  walk w = {0};
  plan(segs, first, n_regions, &w, NULL);
  sz->n_chunks = w.chunk;
  sz->n_groups = w.g;
  sz->n_pieces = w.p;
}

void k3k_xplan_fill(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                    const k3k_xplan_size_t *sz, k3k_xent *ent, uint32_t *region_chunk) {
  walk w = {.ent = ent, .n_groups = sz->n_groups};
  plan(segs, first, n_regions, &w, region_chunk);
  K3_ASSERT(w.g == sz->n_groups && w.p == sz->n_pieces && w.chunk == sz->n_chunks);
}
