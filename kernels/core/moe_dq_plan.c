/* The dequant-once MoE path's host schedule (contract in moe_dq_plan.h). */
#include "core/moe_dq_plan.h"

int32_t k3k_moe_dq_schedule(const int32_t *off, int32_t E, int32_t group, int32_t pad,
                            k3k_moe_dq_item *items) {
  if (!off || E < 1 || group < 1 || pad < 1 || off[0] != 0) return -1;
  const int64_t tk = off[E];
  int32_t n = 0;
  for (int32_t e = 0; e < E; e++) {
    if (off[e + 1] < off[e]) return -1;
    if (off[e + 1] == off[e]) continue;
    const int64_t row0 = off[e], rows = (int64_t)off[e + 1] - off[e];
    int64_t g = (rows + pad - 1) / pad * pad;
    if (row0 + g > tk) g = tk - row0;
    items[n] = (k3k_moe_dq_item){e, n / group, row0, rows, g};
    n++;
  }
  return n;
}
