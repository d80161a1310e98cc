/* Worker registry and pairing policy; see registry.h for the rules. */
#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/prefix_hash.h"

void rt_registry_init(rt_registry_t *r) { memset(r, 0, sizeof *r); }

void rt_registry_free(rt_registry_t *r) {
  free(r->workers);
  memset(r, 0, sizeof *r);
}

rt_worker_t *rt_registry_find(rt_registry_t *r, const char *id) {
  for (size_t i = 0; i < r->n; i++)
    if (strcmp(r->workers[i].info.id, id) == 0) return &r->workers[i];
  return NULL;
}

static int validate(const rt_worker_info_t *in, char *err, size_t errlen) {
  if (in->id[0] == 0 || strnlen(in->id, RT_ID_MAX) == RT_ID_MAX) {
    snprintf(err, errlen, "worker_id: must be 1..%d bytes", RT_ID_MAX - 1);
    return K3_EINVAL;
  }
  if (in->role != RT_ROLE_PREFILL && in->role != RT_ROLE_DECODE) {
    snprintf(err, errlen, "role: must be PREFILL or DECODE");
    return K3_EINVAL;
  }
  if (in->address[0] == 0 || strnlen(in->address, RT_ADDR_MAX) == RT_ADDR_MAX || !strchr(in->address, ':')) {
    snprintf(err, errlen, "address: must be HOST:PORT");
    return K3_EINVAL;
  }
  if (in->role == RT_ROLE_DECODE) {
    if (in->page_tokens <= 0) {
      snprintf(err, errlen, "capacity.page_tokens: must be > 0");
      return K3_EINVAL;
    }
    if (in->kv_pages_total <= 0 || in->kda_slots_total <= 0) {
      snprintf(err, errlen, "capacity.%s: must be > 0", in->kv_pages_total <= 0 ? "kv_pages" : "kda_slots");
      return K3_EINVAL;
    }
    if (in->kv_pages_used < 0 || in->kv_pages_used > in->kv_pages_total || in->kda_slots_used < 0 ||
        in->kda_slots_used > in->kda_slots_total) {
      snprintf(err, errlen, "load.%s: outside 0..capacity",
               (in->kv_pages_used < 0 || in->kv_pages_used > in->kv_pages_total) ? "kv_pages_used" : "kda_slots_used");
      return K3_EINVAL;
    }
  }
  if (in->queued_prompt_tokens < 0 || in->running < 0) {
    snprintf(err, errlen, "load.%s: must be >= 0", in->running < 0 ? "running" : "queued_prompt_tokens");
    return K3_EINVAL;
  }
  return 0;
}

int rt_registry_upsert(rt_registry_t *r, const rt_worker_info_t *info, int64_t now_ms, bool *is_new, char *err,
                       size_t errlen) {
  int rc = validate(info, err, errlen);
  if (rc) return rc;
  rt_worker_t *w = rt_registry_find(r, info->id);
  bool fresh = w == NULL;
  if (fresh) {
    if (r->n == r->cap) {
      size_t nc = r->cap ? r->cap * 2 : 8;
      rt_worker_t *nw = realloc(r->workers, nc * sizeof *nw);
      if (!nw) return K3_ENOMEM;
      r->workers = nw;
      r->cap = nc;
    }
    w = &r->workers[r->n++];
    memset(w, 0, sizeof *w);
  } else if (w->info.role != info->role || strcmp(w->info.address, info->address) != 0 ||
             w->info.fingerprint != info->fingerprint) {
    /* Same id, different identity: a replacement pod. Treat as a new registration. */
    fresh = true;
  }
  uint32_t gen = w->generation + (fresh ? 1u : 0u);
  if (fresh) { /* a new process: nothing of ours is in flight there, nothing of its cache known */
    w->inflight_pages = 0;
    w->inflight_slots = 0;
    w->n_cache_keys = 0;
    w->incarnation++;
  }
  w->info = *info;
  w->state = info->draining ? RT_WORKER_DRAINING : RT_WORKER_ACTIVE;
  w->last_seen_ms = now_ms;
  w->pending_prompt_tokens = 0;
  w->generation = gen;
  if (is_new) *is_new = fresh;
  return 0;
}

int rt_registry_remove(rt_registry_t *r, const char *id) {
  for (size_t i = 0; i < r->n; i++) {
    if (strcmp(r->workers[i].info.id, id) == 0) {
      r->workers[i] = r->workers[--r->n];
      return 0;
    }
  }
  return K3_ENOENT;
}

size_t rt_registry_expire(rt_registry_t *r, int64_t now_ms, int64_t timeout_ms) {
  size_t dropped = 0;
  for (size_t i = 0; i < r->n;) {
    if (now_ms - r->workers[i].last_seen_ms > timeout_ms) {
      r->workers[i] = r->workers[--r->n];
      dropped++;
    } else {
      i++;
    }
  }
  return dropped;
}

size_t rt_registry_count(const rt_registry_t *r, rt_role_t role, bool active_only) {
  size_t c = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->workers[i].info.role == role && (!active_only || r->workers[i].state == RT_WORKER_ACTIVE)) c++;
  return c;
}

int64_t rt_max_context(const rt_registry_t *r, uint64_t fingerprint) {
  int64_t best = 0;
  for (size_t i = 0; i < r->n; i++) {
    const rt_worker_t *w = &r->workers[i];
    if (w->info.role != RT_ROLE_DECODE || w->state != RT_WORKER_ACTIVE) continue;
    if (fingerprint && w->info.fingerprint != fingerprint) continue;
    if (w->info.max_context > best) best = w->info.max_context;
  }
  return best;
}

int64_t rt_pages_needed(int64_t prompt_tokens, int64_t max_new_tokens, int32_t page_tokens) {
  if (page_tokens <= 0) return -1;
  int64_t t = prompt_tokens + max_new_tokens;
  return (t + page_tokens - 1) / page_tokens;
}

static bool excluded(const char *id, const char *const *exclude, size_t n_exclude) {
  for (size_t k = 0; k < n_exclude; k++)
    if (strcmp(exclude[k], id) == 0) return true;
  return false;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

void rt_worker_set_cache(rt_worker_t *w, const uint64_t *keys, size_t n, uint32_t block) {
  if (n > RT_CACHE_KEYS_MAX) n = RT_CACHE_KEYS_MAX;
  if (n) memcpy(w->cache_keys, keys, n * sizeof *keys);
  qsort(w->cache_keys, n, sizeof *w->cache_keys, cmp_u64);
  w->n_cache_keys = (uint32_t)n;
  w->cache_block = block;
}

static bool has_key(const rt_worker_t *w, uint64_t k) {
  return bsearch(&k, w->cache_keys, w->n_cache_keys, sizeof k, cmp_u64) != NULL;
}

/* Longest reported prefix among hashes h[0..nb) of the worker's block size, <= n - 1 tokens. */
static int64_t cached_of(const rt_worker_t *w, const uint64_t *h, size_t nb, size_t n) {
  for (size_t k = nb; k > 0; k--)
    if ((uint64_t)k * w->cache_block <= n - 1 && has_key(w, h[k - 1])) return (int64_t)k * w->cache_block;
  return 0;
}

int64_t rt_worker_cached_tokens(const rt_worker_t *w, const uint32_t *ids, size_t n) {
  if (!ids || n < 2 || !w->n_cache_keys || !w->cache_block) return 0;
  size_t nb = n / w->cache_block;
  uint64_t *h = malloc((nb ? nb : 1) * sizeof *h);
  if (!h) return 0;
  k3_prefix_hashes(ids, n, w->cache_block, h, nb);
  int64_t c = cached_of(w, h, nb, n);
  free(h);
  return c;
}

static int choose_decode(const rt_registry_t *r, const uint32_t *ids, int64_t prompt_tokens, int64_t max_new_tokens,
                         uint64_t fingerprint, bool use_reports, const char *const *exclude, size_t n_exclude,
                         double load_tokens, size_t *out, int64_t *cached_out) {
  bool any = false;
  double best_util = 2.0, best_cost = 0;
  int32_t best_running = 0;
  int64_t best_cached = 0;
  size_t best = (size_t)-1;
  /* the prompt's block hashes, for the block size of the workers seen (normally one) */
  uint64_t *h = NULL;
  uint32_t h_block = 0;
  size_t nb = 0;
  for (size_t i = 0; i < r->n; i++) {
    const rt_worker_t *w = &r->workers[i];
    if (w->info.role != RT_ROLE_DECODE || w->state != RT_WORKER_ACTIVE) continue;
    if (fingerprint && w->info.fingerprint != fingerprint) continue;
    if (excluded(w->info.id, exclude, n_exclude)) continue;
    any = true;
    int64_t need = rt_pages_needed(prompt_tokens, max_new_tokens, w->info.page_tokens);
    int64_t rp = use_reports ? w->info.kv_pages_used : 0, rs = use_reports ? w->info.kda_slots_used : 0;
    int64_t used_pages = rp > w->inflight_pages ? rp : w->inflight_pages;
    int64_t used_slots = rs > w->inflight_slots ? rs : w->inflight_slots;
    if (need < 0 || used_pages + need > w->info.kv_pages_total || used_slots + 1 > w->info.kda_slots_total) continue;
    if (w->info.max_context > 0 && prompt_tokens + max_new_tokens > w->info.max_context) continue;
    double up = (double)(used_pages + need) / (double)w->info.kv_pages_total;
    double us = (double)(used_slots + 1) / (double)w->info.kda_slots_total;
    double util = up > us ? up : us;
    int64_t cached = 0;
    if (ids && w->n_cache_keys && w->cache_block && prompt_tokens >= 2) {
      if (h_block != w->cache_block) {
        free(h);
        nb = (size_t)prompt_tokens / w->cache_block;
        h = malloc((nb ? nb : 1) * sizeof *h);
        h_block = h ? w->cache_block : 0;
        if (h) k3_prefix_hashes(ids, (size_t)prompt_tokens, w->cache_block, h, nb);
      }
      if (h) cached = cached_of(w, h, nb, (size_t)prompt_tokens);
    }
    double cost = ids ? (double)(prompt_tokens - cached) + load_tokens * util : util;
    bool better = best == (size_t)-1 || cost < best_cost - 1e-9 ||
                  (cost <= best_cost + 1e-9 &&
                   (util < best_util - 1e-12 ||
                    (util <= best_util + 1e-12 &&
                     (w->info.running < best_running ||
                      (w->info.running == best_running && strcmp(w->info.id, r->workers[best].info.id) < 0)))));
    if (better) {
      best = i;
      best_cost = cost;
      best_util = util;
      best_running = w->info.running;
      best_cached = cached;
    }
  }
  free(h);
  if (!any) return K3_EUNAVAIL;
  if (best != (size_t)-1 && cached_out) *cached_out = best_cached;
  if (best == (size_t)-1) return K3_ECAPACITY;
  *out = best;
  return 0;
}

int rt_choose_decode(const rt_registry_t *r, int64_t prompt_tokens, int64_t max_new_tokens, uint64_t fingerprint,
                     size_t *out) {
  return choose_decode(r, NULL, prompt_tokens, max_new_tokens, fingerprint, true, NULL, 0, 0, out, NULL);
}

int rt_choose_decode_except(const rt_registry_t *r, int64_t prompt_tokens, int64_t max_new_tokens,
                            uint64_t fingerprint, bool use_reports, const char *const *exclude, size_t n_exclude,
                            size_t *out) {
  return choose_decode(r, NULL, prompt_tokens, max_new_tokens, fingerprint, use_reports, exclude, n_exclude, 0, out,
                       NULL);
}

int rt_choose_decode_cached(const rt_registry_t *r, const uint32_t *ids, int64_t prompt_tokens, int64_t max_new_tokens,
                            uint64_t fingerprint, bool use_reports, const char *const *exclude, size_t n_exclude,
                            double load_tokens, size_t *out, int64_t *cached) {
  if (cached) *cached = 0;
  return choose_decode(r, ids, prompt_tokens, max_new_tokens, fingerprint, use_reports, exclude, n_exclude,
                       load_tokens, out, cached);
}

int rt_choose_decode_optimistic(const rt_registry_t *r, int64_t prompt_tokens, int64_t max_new_tokens,
                                uint64_t fingerprint, size_t *out) {
  return choose_decode(r, NULL, prompt_tokens, max_new_tokens, fingerprint, false, NULL, 0, 0, out, NULL);
}

int rt_choose_prefill(const rt_registry_t *r, uint64_t fingerprint, const char *const *exclude, size_t n_exclude,
                      size_t *out) {
  size_t best = (size_t)-1;
  int64_t best_q = 0;
  for (size_t i = 0; i < r->n; i++) {
    const rt_worker_t *w = &r->workers[i];
    if (w->info.role != RT_ROLE_PREFILL || w->state != RT_WORKER_ACTIVE) continue;
    if (fingerprint && w->info.fingerprint != fingerprint) continue;
    if (excluded(w->info.id, exclude, n_exclude)) continue;
    int64_t q = w->info.queued_prompt_tokens + w->pending_prompt_tokens;
    if (best == (size_t)-1 || q < best_q || (q == best_q && strcmp(w->info.id, r->workers[best].info.id) < 0)) {
      best = i;
      best_q = q;
    }
  }
  if (best == (size_t)-1) return K3_EUNAVAIL;
  *out = best;
  return 0;
}

void rt_worker_add_inflight(rt_worker_t *w, int64_t pages, int32_t slots) {
  w->inflight_pages += pages;
  w->inflight_slots += slots;
}

void rt_worker_sub_inflight(rt_worker_t *w, int64_t pages, int32_t slots) {
  w->inflight_pages = w->inflight_pages > pages ? w->inflight_pages - pages : 0;
  w->inflight_slots = w->inflight_slots > slots ? w->inflight_slots - slots : 0;
}

void rt_worker_add_pending(rt_worker_t *w, int64_t prompt_tokens) { w->pending_prompt_tokens += prompt_tokens; }

void rt_worker_sub_pending(rt_worker_t *w, int64_t prompt_tokens) {
  /* cleared by every heartbeat, so a late subtraction may go below zero: clamp */
  w->pending_prompt_tokens = w->pending_prompt_tokens > prompt_tokens ? w->pending_prompt_tokens - prompt_tokens : 0;
}
