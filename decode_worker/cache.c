/* The decode worker's prefix cache (docs/design.md "Prefix cache"): page references, entries
 * (exact KDA checkpoints + shared MLA pages), the Reserve-time plan of who computes which part
 * of a prompt, LRU eviction under a byte budget, and the heartbeat summary.
 *
 * Exactness: the runner computes prefill(A) then prefill(B) == prefill(A|B) bit for bit when |A|
 * is a multiple of the KDA chunk (64; tests/model/test_prefix_state.c), so every position this
 * file splits a prompt at (a hit, a handoff, a checkpoint) is a multiple of the block
 * (lcm(64, page_tokens)). A split request's tokens therefore equal those of the same prompt
 * computed in one piece, and with the cache off.
 * Entries never change once ready: their pages are full (len is page-aligned) and sequences only
 * append after their own length, so sharing needs no copy-on-write. A request pins its hit
 * until it ends and the entries it creates until their checkpoint is taken; only unpinned
 * entries are evicted, and a page returns to the free list only when neither a request nor an
 * entry references it (a running sequence's pages are never evicted).
 * Threads: the loop thread only (the engine copies slots; it learns ids from ADMIT messages). */
#include <stdlib.h>
#include <string.h>

#include "dc.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/prefix_hash.h"

static uint32_t gcd32(uint32_t a, uint32_t b) {
  while (b) {
    uint32_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int dc_cache_init(dc_worker_t *w, bool on, uint64_t max_bytes, uint32_t local_max, int pin_max, char *err,
                  size_t errlen) {
  dc_cache_t *c = &w->cache;
  memset(c, 0, sizeof *c);
  uint32_t pt = (uint32_t)w->page_tokens;
  c->on = on;
  if (on && (pin_max < 1 || pin_max >= w->num_slots)) {
    snprintf(err, errlen, "--prefix-cache-pinned-slots: must be in 1..%d", w->num_slots - 1);
    return K3_EINVAL;
  }
  c->pin_max = on ? (uint32_t)pin_max : 0;
  c->req_slots_max = (uint32_t)w->num_slots - c->pin_max;
  c->block = 64 / gcd32(64, pt) * pt;
  c->local_max = local_max;
  c->page_bytes = w->manifest->mla_bytes_per_page;
  c->slot_bytes = w->manifest->kda_bytes_per_slot;
  c->max_bytes = max_bytes;
  c->req_ref = calloc((size_t)w->num_pages + 1, sizeof *c->req_ref);
  c->cache_ref = calloc((size_t)w->num_pages + 1, sizeof *c->cache_ref);
  c->report = calloc(DC_CACHE_REPORT_MAX, sizeof *c->report);
  if (!c->req_ref || !c->cache_ref || !c->report) {
    snprintf(err, errlen, "prefix cache: out of memory");
    return K3_ENOMEM;
  }
  return 0;
}

static void entry_free(dc_centry_t *e) {
  free(e->chain);
  free(e->pages);
  free(e);
}

void dc_cache_free(dc_worker_t *w) {
  dc_cache_t *c = &w->cache;
  while (c->entries) {
    dc_centry_t *e = c->entries;
    c->entries = e->next;
    entry_free(e);
  }
  free(c->req_ref);
  free(c->cache_ref);
  free(c->report);
  memset(c, 0, sizeof *c);
}

/* ---- page references ---- */

static void page_change(dc_worker_t *w, int32_t p, int dreq, int dcache) {
  dc_cache_t *c = &w->cache;
  bool before = c->req_ref[p] == 0 && c->cache_ref[p] > 0;
  c->req_ref[p] = (uint32_t)((int64_t)c->req_ref[p] + dreq);
  c->cache_ref[p] = (uint32_t)((int64_t)c->cache_ref[p] + dcache);
  bool after = c->req_ref[p] == 0 && c->cache_ref[p] > 0;
  c->pages_cache_only = c->pages_cache_only + (after ? 1u : 0u) - (before ? 1u : 0u);
  if ((dreq < 0 || dcache < 0) && c->req_ref[p] == 0 && c->cache_ref[p] == 0) w->free_pages[w->n_free_pages++] = p;
}

int dc_pages_take(dc_worker_t *w, int n, int32_t *out) {
  if (n > w->n_free_pages) return K3_ECAPACITY;
  for (int i = 0; i < n; i++) {
    out[i] = w->free_pages[--w->n_free_pages];
    page_change(w, out[i], 1, 0);
  }
  return 0;
}

void dc_page_ref_req(dc_worker_t *w, int32_t p) { page_change(w, p, 1, 0); }
void dc_page_unref_req(dc_worker_t *w, int32_t p) { page_change(w, p, -1, 0); }

/* ---- entries ---- */

static void evict(dc_worker_t *w, dc_centry_t *e, bool count) {
  dc_cache_t *c = &w->cache;
  for (dc_centry_t **pp = &c->entries; *pp; pp = &(*pp)->next) {
    if (*pp == e) {
      *pp = e->next;
      break;
    }
  }
  for (int i = 0; i < e->n_pages; i++) page_change(w, e->pages[i], 0, -1);
  w->free_slots[w->n_free_slots++] = e->slot;
  c->slots--;
  c->n_entries--;
  if (count) {
    c->evictions++;
    k3_counter_inc(k3_metric_default(w->m.cache_evictions_total));
  }
  entry_free(e);
}

static void pin(dc_cache_t *c, dc_centry_t *e) {
  if (e->pins++ == 0) c->n_pinned++;
}

static void unpin(dc_cache_t *c, dc_centry_t *e) {
  if (--e->pins == 0) c->n_pinned--;
}

void dc_cache_pin(dc_worker_t *w, dc_centry_t *e) { pin(&w->cache, e); }

void dc_cache_unpin(dc_worker_t *w, dc_centry_t *e) {
  unpin(&w->cache, e);
  dc_cache_enforce(w);
}

static uint32_t req_slots(const dc_worker_t *w) {
  return (uint32_t)(w->num_slots - w->n_free_slots) - w->cache.slots;
}

static dc_centry_t *lru_unpinned(dc_cache_t *c) {
  dc_centry_t *best = NULL;
  for (dc_centry_t *e = c->entries; e; e = e->next)
    if (!e->pins && (!best || e->last_use < best->last_use)) best = e;
  return best;
}

bool dc_cache_make_room(dc_worker_t *w, int pages, int slots) {
  while (w->n_free_pages < pages || w->n_free_slots < slots) {
    dc_centry_t *e = lru_unpinned(&w->cache);
    if (!e) return false;
    evict(w, e, true);
  }
  return true;
}

static uint64_t cache_bytes(const dc_cache_t *c) {
  return (uint64_t)c->pages_cache_only * c->page_bytes + (uint64_t)c->slots * c->slot_bytes;
}

void dc_cache_enforce(dc_worker_t *w) {
  dc_cache_t *c = &w->cache;
  while (cache_bytes(c) > c->max_bytes) {
    dc_centry_t *e = lru_unpinned(c);
    if (!e) break;
    evict(w, e, true);
  }
}

static dc_centry_t *find_key(dc_cache_t *c, uint64_t key, uint32_t len) {
  for (dc_centry_t *e = c->entries; e; e = e->next)
    if (e->key == key && e->len == len) return e;
  return NULL;
}

/* A pending entry for the prefix [0, pos) of q (whose pages hold it once computed). */
static dc_centry_t *entry_new(dc_worker_t *w, dc_req_t *q, const uint64_t *h, uint32_t pos) {
  dc_cache_t *c = &w->cache;
  uint32_t nb = pos / c->block;
  int np = (int)(pos / (uint32_t)w->page_tokens);
  /* Within the pin budget (beyond it a pinned entry would eat into the registered capacity),
   * with one exception: a request whose hit pin is the only pin of its hit entry may create one
   * checkpoint beyond it. That hit pin goes within the engine's next turn (it copies every
   * admitted hit first), so the excess is transient and bounded by the hits pinned (<= the
   * budget); without it, conversations whose turns arrive together (their hits pinned at once)
   * found the budget taken by their own hits and never checkpointed their new turn. */
  uint32_t lend = q->hit && q->hit->pins == 1 && q->n_ck == 0 ? 1u : 0u;
  if (c->n_pinned >= c->pin_max + lend) return NULL;
  if (w->n_free_slots < 1 && !dc_cache_make_room(w, 0, 1)) return NULL;
  dc_centry_t *e = calloc(1, sizeof *e);
  if (e) e->chain = malloc(nb * sizeof *e->chain);
  if (e) e->pages = malloc((size_t)(np > 0 ? np : 1) * sizeof *e->pages);
  if (!e || !e->chain || !e->pages) {
    if (e) entry_free(e);
    return NULL;
  }
  memcpy(e->chain, h, nb * sizeof *e->chain);
  e->key = h[nb - 1];
  e->len = pos;
  e->n_pages = np;
  for (int i = 0; i < np; i++) {
    e->pages[i] = q->pages[i];
    page_change(w, e->pages[i], 0, 1);
  }
  e->slot = w->free_slots[--w->n_free_slots];
  c->slots++;
  pin(c, e);
  e->last_use = ++c->tick;
  e->next = c->entries;
  c->entries = e;
  c->n_entries++;
  return e;
}

/* Longest k with chain[0..k) == h[0..k) (chained hashes: equal at k implies equal below). */
static uint32_t common_blocks(const dc_centry_t *e, uint32_t eb, const uint64_t *h, uint32_t nb) {
  uint32_t k = eb < nb ? eb : nb;
  while (k > 0 && e->chain[k - 1] != h[k - 1]) k--;
  return k;
}

static int take_plain(dc_worker_t *w, dc_req_t *q, int need_pages) {
  if (req_slots(w) >= w->cache.req_slots_max || !dc_cache_make_room(w, need_pages, 1)) return K3_ECAPACITY;
  dc_pages_take(w, need_pages, q->pages);
  q->n_pages = need_pages;
  q->slot = w->free_slots[--w->n_free_slots];
  return 0;
}

int dc_cache_plan(dc_worker_t *w, dc_req_t *q, const uint32_t *ids, int need_pages, bool resume_ok) {
  dc_cache_t *c = &w->cache;
  const uint32_t n = q->n_prompt, B = c->block, pt = (uint32_t)w->page_tokens;
  q->split = false;
  q->start = q->xfer_tokens = q->cached = q->resume = 0;
  q->exp = NULL;
  if (!c->on || !ids) return take_plain(w, q, need_pages);
  if (req_slots(w) >= c->req_slots_max) return K3_ECAPACITY;
  uint32_t nb = n / B;
  uint64_t *h = malloc((nb ? nb : 1) * sizeof *h);
  if (!h) return K3_ENOMEM;
  k3_prefix_hashes(ids, n, B, h, nb);
  /* p: the longest ready checkpoint that is a prefix of the prompt and leaves >= 1 token to
   * compute (the first token needs the last position's logits); m: the longest prefix, in
   * blocks, that any entry shares with the prompt, checkpointed or not (where a new
   * checkpoint pays off: other prompts share it). */
  const uint32_t cmax = (n - 1) / B * B;
  uint32_t p = 0, m = 0;
  dc_centry_t *hit = NULL;
  for (dc_centry_t *e = c->entries; e; e = e->next) {
    uint32_t eb = e->len / B;
    uint32_t k = common_blocks(e, eb, h, nb);
    uint32_t shared = k * B < cmax ? k * B : cmax;
    if (shared > m) m = shared;
    /* a hit must be pinned until the engine copied it: only when the pin budget allows */
    if (e->ready && k == eb && e->len <= cmax && e->len > p && (e->pins || c->n_pinned < c->pin_max)) {
      p = e->len;
      hit = e;
    }
  }
  bool resume = false;
  if (hit && n - p <= c->local_max) {
    q->split = true;
    q->start = q->cached = p;
  } else if (hit && resume_ok && c->resume && p < cmax) {
    /* Long-suffix hit (docs/design.md "Long-suffix hits"): the prefill worker receives the
     * entry's state (Export) and computes [p, cmax); this worker shares [0, p) and computes the
     * last block. The entry stays pinned until the request ends (its slot is what Export reads). */
    resume = true;
    q->split = true;
    q->xfer_tokens = q->start = cmax;
    q->cached = q->resume = p;
  } else if (cmax == 0) {
    free(h);
    c->misses++;
    k3_metric_inc(w->m.cache_lookups_total, &(const char *){"miss"});
    return take_plain(w, q, need_pages); /* nothing cacheable: one block or less */
  } else {
    /* The prefill worker computes [0, s) and hands it off; this worker the rest. A hit whose
     * suffix is too long for this worker is not used (the prefill worker recomputes it: it does
     * not receive cached state, docs/design.md). */
    q->split = true;
    q->xfer_tokens = q->start = (m > 0 && n - m <= c->local_max) ? m : cmax;
    hit = NULL;
  }
  /* pages: the hit's (shared) + new ones; pin the hit first so making room cannot evict it */
  int shared = hit ? (int)(p / pt) : 0;
  if (hit) pin(c, hit);
  if (!dc_cache_make_room(w, need_pages - shared, 1)) {
    if (hit) unpin(c, hit);
    free(h);
    q->split = false;
    return K3_ECAPACITY;
  }
  for (int i = 0; i < shared; i++) {
    q->pages[i] = hit->pages[i];
    dc_page_ref_req(w, q->pages[i]);
  }
  dc_pages_take(w, need_pages - shared, q->pages + shared);
  q->n_pages = need_pages;
  q->slot = w->free_slots[--w->n_free_slots];
  q->hit = resume ? NULL : hit; /* a resume's state at cmax comes from the prefill worker */
  q->exp = resume ? hit : NULL;
  if (hit) {
    hit->last_use = ++c->tick;
    c->hits++;
    c->hit_tokens += p;
    k3_metric_inc(w->m.cache_lookups_total, &(const char *){"hit"});
    k3_counter_add(k3_metric_default(w->m.cache_hit_tokens_total), (double)p);
  } else {
    c->misses++;
    k3_metric_inc(w->m.cache_lookups_total, &(const char *){"miss"});
  }
  c->local_tokens += n - q->start;
  k3_counter_add(k3_metric_default(w->m.local_prefill_tokens_total), (double)(n - q->start));
  /* checkpoints to take (ascending): the handed-off state, the shared prefix, the last block
   * boundary before the prompt's end, and the prompt's end when it is one */
  uint32_t cand[DC_MAX_CKPT], nc = 0;
  uint32_t want[4] = {q->xfer_tokens, m, cmax, n % B == 0 ? n : 0};
  for (int i = 0; i < 4; i++) {
    uint32_t pos = want[i];
    if (pos == 0 || pos < q->start || (pos == q->start && !q->xfer_tokens)) continue;
    if (nc && cand[nc - 1] >= pos) continue;
    cand[nc++] = pos;
  }
  /* the entries are created at admission (dc_cache_admit): a checkpoint pins a slot only from
   * then until the engine took it, not during the prefill worker's part */
  q->n_ck = 0;
  q->n_cand = nc;
  memcpy(q->cand, cand, nc * sizeof *cand);
  q->hashes = h;
  return 0;
}

void dc_cache_admit(dc_worker_t *w, dc_req_t *q) {
  dc_cache_t *c = &w->cache;
  q->n_ck = 0;
  /* most useful first when the pin budget is short: the last block boundary (a chat's next
   * turn), then the shared prefix and the others; the engine takes them in position order */
  for (int k = (int)q->n_cand - 1; k >= 0 && q->hashes; k--) {
    uint32_t pos = q->cand[k];
    if (find_key(c, q->hashes[pos / c->block - 1], pos)) continue; /* cached, or another request makes it */
    dc_centry_t *e = entry_new(w, q, q->hashes, pos);
    if (!e) break; /* no slot to spare: fewer checkpoints, same tokens */
    int j = q->n_ck++;
    for (; j > 0 && q->ck[j - 1]->len > pos; j--) q->ck[j] = q->ck[j - 1];
    q->ck[j] = e;
  }
  q->n_cand = 0;
  free(q->hashes);
  q->hashes = NULL;
}

void dc_cache_ckpt_done(dc_worker_t *w, dc_req_t *q, uint32_t pos) {
  if (pos == 0) { /* the engine copied the hit's checkpoint: it is no longer needed */
    if (q->hit) unpin(&w->cache, q->hit);
    q->hit = NULL;
    return;
  }
  for (int i = 0; i < q->n_ck; i++) {
    dc_centry_t *e = q->ck[i];
    if (e && e->len == pos) {
      e->ready = true;
      unpin(&w->cache, e);
      e->last_use = ++w->cache.tick;
      q->ck[i] = NULL;
    }
  }
  dc_cache_enforce(w);
  k3_registrar_kick(w->reg); /* the router learns the new prefix with the next heartbeat */
}

void dc_cache_req_done(dc_worker_t *w, dc_req_t *q) {
  if (q->hit) {
    unpin(&w->cache, q->hit);
    q->hit = NULL;
  }
  if (q->exp) {
    unpin(&w->cache, q->exp);
    q->exp = NULL;
  }
  for (int i = 0; i < q->n_ck; i++) {
    dc_centry_t *e = q->ck[i];
    if (!e) continue;
    q->ck[i] = NULL;
    unpin(&w->cache, e);
    if (!e->ready) evict(w, e, false); /* never computed (cancelled or failed) */
  }
  q->n_ck = 0;
  free(q->hashes);
  q->hashes = NULL;
}

typedef struct {
  uint64_t key, tick;
} rep_t;

static int by_tick_desc(const void *a, const void *b) {
  const rep_t *x = a, *y = b;
  return x->tick < y->tick ? 1 : x->tick > y->tick ? -1 : 0;
}

void dc_cache_fill_load(dc_worker_t *w, K3pd__V1__WorkerLoad *load) {
  dc_cache_t *c = &w->cache;
  if (!c->on) return;
  load->cache_block_tokens = c->block;
  rep_t *r = malloc((c->n_entries ? c->n_entries : 1) * sizeof *r);
  if (!r) return;
  size_t n = 0;
  for (dc_centry_t *e = c->entries; e; e = e->next)
    if (e->ready) r[n++] = (rep_t){e->key, e->last_use};
  qsort(r, n, sizeof *r, by_tick_desc);
  if (n > DC_CACHE_REPORT_MAX) n = DC_CACHE_REPORT_MAX;
  for (size_t i = 0; i < n; i++) c->report[i] = r[i].key;
  free(r);
  load->cached_prefix_hashes = c->report;
  load->n_cached_prefix_hashes = n;
}
