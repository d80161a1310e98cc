/* The dequant-once MoE path's host schedule (contract in moe_dq_plan.h). */
#include "core/moe_dq_plan.h"

#include <stdlib.h>

int64_t k3k_moe_dq_pad_rows_max(int64_t tk, int32_t E, int32_t pad) {
  if (tk <= 0) return 0;
  const int64_t act = tk < E ? tk : E;
  return tk + (tk + 6) / 7 + (int64_t)pad * act;
}

static int by_rows_desc(const void *pa, const void *pb) {
  const k3k_moe_dq_item *a = (const k3k_moe_dq_item *)pa, *b = (const k3k_moe_dq_item *)pb;
  if (a->rows != b->rows) return a->rows > b->rows ? -1 : 1;
  return (a->expert > b->expert) - (a->expert < b->expert);
}

int32_t k3k_moe_dq_schedule(const int32_t *off, int32_t E, int32_t group, int32_t pad,
                            k3k_moe_dq_item *items, int64_t *pad_rows) {
  if (!off || !items || E < 1 || group < 1 || pad < 1 || off[0] != 0) return -1;
  int32_t n = 0;
  for (int32_t e = 0; e < E; e++) {
    if (off[e + 1] < off[e]) return -1;
    if (off[e + 1] == off[e]) continue;
    items[n++] = (k3k_moe_dq_item){e, 0, off[e], (int64_t)off[e + 1] - off[e], 0, 0};
  }
  qsort(items, (size_t)n, sizeof *items, by_rows_desc);
  int64_t base = 0;
  int32_t g = 0;
  for (int32_t i = 0; i < n; g++) {
    const int64_t cap = (items[i].rows + pad - 1) / pad * pad;
    int32_t m = 0;
    while (i + m < n && m < group && (m == 0 || items[i + m].rows * 8 >= cap * 7)) {
      items[i + m].group = g;
      items[i + m].cap = cap;
      items[i + m].prow0 = base + (int64_t)m * cap;
      m++;
    }
    base += (int64_t)m * cap;
    i += m;
  }
  if (pad_rows) *pad_rows = base;
  return n;
}
