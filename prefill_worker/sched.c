/* The prefill worker's scheduling policy; see sched.h for the rules and why they are safe. */
#include "sched.h"

#include <stddef.h>

int64_t pf_sched_score(int64_t remaining, uint32_t waited, int64_t chunk) {
  return remaining - chunk * (int64_t)waited;
}

/* Insertion sort: n is at most a few dozen, and stability is the tie rule. */
void pf_sched_sort(int *idx, int n, const int64_t *score) {
  for (int i = 1; i < n; i++) {
    int v = idx[i];
    int j = i - 1;
    while (j >= 0 && score[idx[j]] > score[v]) {
      idx[j + 1] = idx[j];
      j--;
    }
    idx[j + 1] = v;
  }
}

int pf_sched_pick(pf_cand_t *c, int n, int64_t chunk, int64_t budget, int max_seqs, int *order, int64_t *score) {
  int chosen = 0;
  int64_t toks = 0;
  if (n <= 0) return 0;
  for (int i = 0; i < n; i++) {
    order[i] = i;
    score[i] = pf_sched_score(c[i].remaining, c[i].waited, chunk);
    c[i].take = 0;
  }
  pf_sched_sort(order, n, score);
  for (int k = 0; k < n && chosen < max_seqs; k++) {
    pf_cand_t *x = &c[order[k]];
    int64_t take = x->remaining < chunk ? x->remaining : chunk;
    if (take <= 0) continue;
    /* A smaller chunk further down may still fit the budget: keep looking. */
    if (chosen > 0 && toks + take > budget) continue;
    x->take = take;
    toks += take;
    chosen++;
  }
  for (int i = 0; i < n; i++) {
    if (c[i].take > 0) c[i].waited = 0;
    else if (c[i].remaining > 0) c[i].waited++;
  }
  return chosen;
}

bool pf_sched_headroom_ok(int64_t tokens, int64_t chunk, int others, int free_slots, int64_t free_pages,
                          int64_t pages_needed, int64_t pages_one_chunk) {
  if (tokens <= chunk || others == 0) return true;
  return free_slots - 1 >= 1 && free_pages - pages_needed >= pages_one_chunk;
}
