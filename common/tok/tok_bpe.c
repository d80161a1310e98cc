/* Byte-level merge-by-rank BPE of k3_tok and the bytes ↔ rank table it runs on.
 *
 * The algorithm is tiktoken's byte_pair_encode: if the whole piece is a token, that is the
 * answer; otherwise start from single bytes and repeatedly merge the adjacent pair whose
 * concatenation has the lowest rank (the leftmost one on ties) until no pair is a token.
 * Two implementations with identical output: tiktoken's quadratic scan (fastest for the
 * short pieces of ordinary text) and a heap with lazy invalidation, O(n log n), for long
 * pieces (a 25,000-character run would take ~10^9 steps quadratically).
 * Not here: splitting text into pieces (tok_split.c), file parsing (tok_load.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "tok_internal.h"

#define QUADRATIC_MAX_BYTES 256

static inline uint32_t slot_hash(const uint8_t *p, size_t len) {
  return (uint32_t)k3_hash64(p, len, 0x6b33746f6bULL);
}

int32_t k3_tok_ranks_get(const k3_tok_ranks_t *r, const uint8_t *p, size_t len) {
  if (len == 1) return r->byte_rank[p[0]];
  for (uint32_t h = slot_hash(p, len) & r->mask;; h = (h + 1) & r->mask) {
    uint32_t v = r->slots[h];
    if (v == 0) return -1;
    int32_t rank = (int32_t)(v - 1);
    uint32_t o = r->off[rank], l = r->off[rank + 1] - o;
    if (l == len && memcmp(r->bytes + o, p, len) == 0) return rank;
  }
}

int k3_tok_ranks_build(k3_tok_ranks_t *r, int32_t n, uint8_t *bytes, uint32_t *off, char *err,
                       size_t errlen) {
  memset(r, 0, sizeof *r);
  r->n = n;
  r->bytes = bytes;
  r->off = off;
  uint32_t cap = 1024;
  while (cap < (uint32_t)n * 2u) cap *= 2;
  r->mask = cap - 1;
  r->slots = calloc(cap, sizeof *r->slots);
  if (!r->slots) {
    k3_tok_ranks_free(r);
    return K3_ENOMEM;
  }
  for (int b = 0; b < 256; b++) r->byte_rank[b] = -1;
  for (int32_t rank = 0; rank < n; rank++) {
    const uint8_t *p = bytes + off[rank];
    size_t len = off[rank + 1] - off[rank];
    if (len == 0) {
      if (err) snprintf(err, errlen, "rank %d: empty token", rank);
      k3_tok_ranks_free(r);
      return K3_EFORMAT;
    }
    int32_t prev = -1;
    uint32_t h = slot_hash(p, len) & r->mask;
    for (;; h = (h + 1) & r->mask) {
      uint32_t v = r->slots[h];
      if (v == 0) break;
      uint32_t o = off[v - 1], l = off[v] - o;
      if (l == len && memcmp(bytes + o, p, len) == 0) {
        prev = (int32_t)(v - 1);
        break;
      }
    }
    if (prev >= 0) {
      if (err) snprintf(err, errlen, "rank %d: same bytes as rank %d", rank, prev);
      k3_tok_ranks_free(r);
      return K3_EFORMAT;
    }
    r->slots[h] = (uint32_t)rank + 1;
    if (len == 1) r->byte_rank[p[0]] = rank;
  }
  for (int b = 0; b < 256; b++) {
    if (r->byte_rank[b] < 0) {
      if (err) snprintf(err, errlen, "no rank for the single byte 0x%02x (byte-level BPE needs all 256)", b);
      k3_tok_ranks_free(r);
      return K3_EFORMAT;
    }
  }
  return 0;
}

void k3_tok_ranks_free(k3_tok_ranks_t *r) {
  free(r->bytes);
  free(r->off);
  free(r->slots);
  memset(r, 0, sizeof *r);
}

#define NO_RANK INT32_MAX

int k3_tok_bpe_quadratic(const k3_tok_ranks_t *r, const uint8_t *p, size_t len,
                         k3_tok_ids_t *out) {
  /* parts[i] = (start of part i, rank of the pair (part i, part i+1)); parts[m-1] is the
   * end sentinel. Exactly tiktoken's layout. */
  size_t startv[QUADRATIC_MAX_BYTES + 1];
  int32_t rankv[QUADRATIC_MAX_BYTES + 1];
  size_t m = len + 1;
  for (size_t i = 0; i < m; i++) startv[i] = i;
  for (size_t i = 0; i + 2 < m; i++) {
    int32_t rk = k3_tok_ranks_get(r, p + i, 2);
    rankv[i] = rk < 0 ? NO_RANK : rk;
  }
  rankv[m - 2] = rankv[m - 1] = NO_RANK;
  while (m > 2) {
    size_t best = 0;
    int32_t bestr = NO_RANK;
    for (size_t i = 0; i + 2 < m; i++)
      if (rankv[i] < bestr) bestr = rankv[i], best = i;
    if (bestr == NO_RANK) break;
    /* Merge parts best and best+1: drop boundary best+1. */
    memmove(startv + best + 1, startv + best + 2, (m - best - 2) * sizeof *startv);
    memmove(rankv + best + 1, rankv + best + 2, (m - best - 2) * sizeof *rankv);
    m--;
    for (size_t i = best ? best - 1 : 0; i <= best; i++) {
      if (i + 2 < m) {
        int32_t rk = k3_tok_ranks_get(r, p + startv[i], startv[i + 2] - startv[i]);
        rankv[i] = rk < 0 ? NO_RANK : rk;
      } else {
        rankv[i] = NO_RANK;
      }
    }
  }
  for (size_t i = 0; i + 1 < m; i++) {
    int32_t rk = k3_tok_ranks_get(r, p + startv[i], startv[i + 1] - startv[i]);
    if (rk < 0) return K3_EINTERNAL; /* unreachable: parts are bytes or merged tokens */
    int rc = k3_tok_ids_push(out, rk);
    if (rc) return rc;
  }
  return 0;
}

/* Heap entry: the pair starting at part `pos` had rank `rank` when pushed with `ver`. */
typedef struct {
  int32_t rank;
  uint32_t pos, ver;
} heap_ent_t;

static inline bool ent_less(heap_ent_t a, heap_ent_t b) {
  return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_ent_t *h, size_t *n, heap_ent_t e) {
  size_t i = (*n)++;
  while (i > 0 && ent_less(e, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = e;
}

static heap_ent_t heap_pop(heap_ent_t *h, size_t *n) {
  heap_ent_t top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && ent_less(h[c + 1], h[c])) c++;
    if (!ent_less(h[c], last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

int k3_tok_bpe_heap(const k3_tok_ranks_t *r, const uint8_t *p, size_t len, k3_tok_ids_t *out) {
  /* Parts are identified by their start byte; next/prev link live parts; ver[i] changes
   * whenever part i's extent or its right neighbour changes, invalidating old entries. A
   * merge only ever pushes new entries (at most 2 per merge), so n + 2n slots suffice. */
  uint32_t *next = malloc((len + 1) * sizeof *next), *prev = malloc((len + 1) * sizeof *prev);
  uint32_t *ver = calloc(len + 1, sizeof *ver);
  heap_ent_t *h = malloc(3 * (len + 1) * sizeof *h);
  int rc = 0;
  if (!next || !prev || !ver || !h) {
    rc = K3_ENOMEM;
    goto out;
  }
  size_t hn = 0;
  for (uint32_t i = 0; i <= len; i++) next[i] = i + 1, prev[i] = i ? i - 1 : 0;
  for (uint32_t i = 0; i + 1 < len; i++) {
    int32_t rk = k3_tok_ranks_get(r, p + i, 2);
    if (rk >= 0) heap_push(h, &hn, (heap_ent_t){rk, i, 0});
  }
  while (hn) {
    heap_ent_t e = heap_pop(h, &hn);
    uint32_t i = e.pos;
    if (ver[i] != e.ver || next[i] >= len) continue; /* stale */
    uint32_t j = next[i], k = next[j];
    /* merge i and j */
    next[i] = k;
    if (k <= len) prev[k] = i;
    ver[i]++;
    ver[j] = UINT32_MAX; /* j is dead; never matches a pushed version again */
    if (k < len) {
      int32_t rk = k3_tok_ranks_get(r, p + i, next[k] - i);
      if (rk >= 0) heap_push(h, &hn, (heap_ent_t){rk, i, ver[i]});
    }
    if (i > 0) {
      uint32_t a = prev[i];
      ver[a]++;
      int32_t rk = k3_tok_ranks_get(r, p + a, k - a);
      if (rk >= 0) heap_push(h, &hn, (heap_ent_t){rk, a, ver[a]});
    }
  }
  for (uint32_t i = 0; i < len; i = next[i]) {
    int32_t rk = k3_tok_ranks_get(r, p + i, next[i] - i);
    if (rk < 0) {
      rc = K3_EINTERNAL;
      break;
    }
    if ((rc = k3_tok_ids_push(out, rk))) break;
  }
out:
  free(next);
  free(prev);
  free(ver);
  free(h);
  return rc;
}

int k3_tok_bpe(const k3_tok_ranks_t *r, const uint8_t *p, size_t len, k3_tok_ids_t *out) {
  int32_t whole = k3_tok_ranks_get(r, p, len);
  if (whole >= 0) return k3_tok_ids_push(out, whole);
  if (len <= QUADRATIC_MAX_BYTES) return k3_tok_bpe_quadratic(r, p, len, out);
  return k3_tok_bpe_heap(r, p, len, out);
}
