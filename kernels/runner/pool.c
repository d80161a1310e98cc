/* Page and slot pools of the model runner, and the monolithic sequence helpers.
 *
 * Both pools are plain "used" bitmaps over ids sized at init; alloc takes the lowest free ids
 * (deterministic, which keeps tests reproducible) and zeroes the memory it hands out, so a
 * fresh slot IS the zero KDA state and a fresh page has zero tail rows (exported pages are
 * then deterministic byte for byte). Not thread-safe: the runner is single-caller.
 * Invariant: free_pages/free_slots equal the number of zero entries of the bitmaps. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "runner_internal.h"

/* Bytes of one slot/page of a pool tensor (its leading dimension indexes ids). */
static size_t id_bytes(const k3k_tensor_t *t) {
  return (size_t)t->stride[0] * k3k_dtype_size(t->dtype);
}

static void zero_id(k3_runner_t *r, const k3k_tensor_t *t, int id) {
  size_t nb = id_bytes(t);
  r->be->memset(r->be, (char *)t->data + (size_t)id * nb, 0, nb);
}

static void zero_slot(k3_runner_t *r, int slot) {
  for (int i = 0; i < r->n_kda; i++) {
    zero_id(r, &r->kda_S[i], slot);
    for (int j = 0; j < 3; j++) zero_id(r, &r->kda_conv[i][j], slot);
  }
}

static void zero_page(k3_runner_t *r, int page) {
  for (int i = 0; i < r->n_mla; i++) zero_id(r, &r->mla_cache[i], page);
}

int k3_runner_slot_alloc(k3_runner_t *r, int *slot) {
  if (!slot) return K3_EINVAL;
  for (int s = 0; s < r->opts.num_slots; s++) {
    if (!r->slot_used[s]) {
      r->slot_used[s] = 1;
      r->free_slots--;
      zero_slot(r, s);
      *slot = s;
      return 0;
    }
  }
  return K3_ECAPACITY;
}

int k3_runner_slot_free(k3_runner_t *r, int slot) {
  if (slot < 0 || slot >= r->opts.num_slots || !r->slot_used[slot]) return K3_EINVAL;
  r->slot_used[slot] = 0;
  r->free_slots++;
  return 0;
}

int k3_runner_pages_alloc(k3_runner_t *r, int n, int32_t *pages) {
  if (n < 0 || (n > 0 && !pages)) return K3_EINVAL;
  if (n > r->free_pages) return K3_ECAPACITY;
  int got = 0;
  for (int p = 0; p < r->opts.num_pages && got < n; p++) {
    if (!r->page_used[p]) {
      r->page_used[p] = 1;
      zero_page(r, p);
      pages[got++] = p;
    }
  }
  r->free_pages -= n;
  return 0;
}

int k3_runner_pages_free(k3_runner_t *r, int n, const int32_t *pages) {
  if (n < 0 || (n > 0 && !pages)) return K3_EINVAL;
  /* Validate everything first (on error nothing changed), including duplicates in the list. */
  for (int i = 0; i < n; i++) {
    if (pages[i] < 0 || pages[i] >= r->opts.num_pages || !r->page_used[pages[i]]) return K3_EINVAL;
    for (int j = 0; j < i; j++)
      if (pages[j] == pages[i]) return K3_EINVAL;
  }
  for (int i = 0; i < n; i++) r->page_used[pages[i]] = 0;
  r->free_pages += n;
  return 0;
}

int k3_runner_slot_copy(k3_runner_t *r, int dst, int src) {
  if (dst < 0 || dst >= r->opts.num_slots || src < 0 || src >= r->opts.num_slots || dst == src ||
      !r->slot_used[dst] || !r->slot_used[src])
    return K3_EINVAL;
  for (int i = 0; i < r->n_kda; i++) {
    const k3k_tensor_t *ts[4] = {&r->kda_S[i], &r->kda_conv[i][0], &r->kda_conv[i][1], &r->kda_conv[i][2]};
    for (int j = 0; j < 4; j++) {
      size_t nb = id_bytes(ts[j]);
      int rc = r->be->copy(r->be, (char *)ts[j]->data + (size_t)dst * nb, (char *)ts[j]->data + (size_t)src * nb, nb);
      if (rc) return rc;
    }
  }
  return 0;
}

int k3_runner_claim_all(k3_runner_t *r) {
  for (int s = 0; s < r->opts.num_slots; s++) r->slot_used[s] = 1;
  for (int p = 0; p < r->opts.num_pages; p++) r->page_used[p] = 1;
  r->free_slots = 0;
  r->free_pages = 0;
  return 0;
}

int k3_runner_free_slots(const k3_runner_t *r) { return r->free_slots; }
int k3_runner_free_pages(const k3_runner_t *r) { return r->free_pages; }

int k3_runner_pages_for(const k3_runner_t *r, int64_t tokens) {
  if (tokens <= 0) return 0;
  return (int)((tokens + r->opts.page_tokens - 1) / r->opts.page_tokens);
}

int k3_runner_seq_reserve(k3_runner_t *r, k3_seq_t *seq, int64_t total_tokens) {
  if (!seq || total_tokens < 0 || seq->n_pages < 0) return K3_EINVAL;
  int need_pages = r->n_mla > 0 ? k3_runner_pages_for(r, total_tokens) : 0;
  int add = need_pages > seq->n_pages ? need_pages - seq->n_pages : 0;
  if (add > 0 && (!seq->pages || need_pages > seq->cap_pages)) return K3_ERANGE;
  bool need_slot = r->n_kda > 0 && seq->slot < 0;
  if (add > r->free_pages || (need_slot && r->free_slots < 1)) return K3_ECAPACITY;
  if (need_slot) {
    int rc = k3_runner_slot_alloc(r, &seq->slot);
    if (rc) return rc;
  }
  if (add > 0) {
    int rc = k3_runner_pages_alloc(r, add, seq->pages + seq->n_pages);
    if (rc) return rc; /* cannot happen: checked above */
    seq->n_pages += add;
  }
  return 0;
}

int k3_runner_seq_claim(k3_runner_t *r, const k3_seq_t *seq) {
  if (!seq || seq->n_pages < 0 || (seq->n_pages > 0 && !seq->pages)) return K3_EINVAL;
  bool want_slot = r->n_kda > 0;
  if (want_slot && (seq->slot < 0 || seq->slot >= r->opts.num_slots || r->slot_used[seq->slot])) return K3_EINVAL;
  for (int i = 0; i < seq->n_pages; i++) {
    int p = seq->pages[i];
    if (p < 0 || p >= r->opts.num_pages || r->page_used[p]) return K3_EINVAL;
    for (int j = 0; j < i; j++)
      if (seq->pages[j] == p) return K3_EINVAL;
  }
  if (want_slot) {
    r->slot_used[seq->slot] = 1;
    r->free_slots--;
  }
  for (int i = 0; i < seq->n_pages; i++) r->page_used[seq->pages[i]] = 1;
  r->free_pages -= seq->n_pages;
  return 0;
}

void k3_runner_seq_release(k3_runner_t *r, k3_seq_t *seq) {
  if (!seq) return;
  if (seq->slot >= 0 && r->n_kda > 0) k3_runner_slot_free(r, seq->slot);
  if (seq->n_pages > 0 && seq->pages) k3_runner_pages_free(r, seq->n_pages, seq->pages);
  seq->slot = -1;
  seq->n_pages = 0;
  seq->len = 0;
}
