/* k3k_moe_plan(): host-side grouping of router choices by expert (a counting sort), so the
 * runner can gather each expert's token rows contiguously, run that expert's GEMMs on them, and
 * combine with MOE_COMBINE. Deterministic: by expert, then token, then choice index. */
#include "k3k.h"
#include "k3pd/err.h"

int k3k_moe_plan(const int32_t *idx, int32_t T, int32_t k, int32_t E, int32_t *expert_off,
                 int32_t *gather_tok, int32_t *row_idx) {
  if (!idx || !expert_off || !gather_tok || !row_idx || T < 0 || k <= 0 || E <= 0)
    return K3_EINVAL;
  int64_t n = (int64_t)T * k;
  for (int64_t r = 0; r < n; r++)
    if (idx[r] < 0 || idx[r] >= E) return K3_ERANGE;
  for (int32_t e = 0; e <= E; e++) expert_off[e] = 0;
  for (int64_t r = 0; r < n; r++) expert_off[idx[r] + 1]++;
  for (int32_t e = 0; e < E; e++) expert_off[e + 1] += expert_off[e];
  /* Second pass places rows in (token, choice) order within each expert; expert_off[e] is used
   * as the cursor and restored afterwards. */
  for (int64_t r = 0; r < n; r++) {
    int32_t e = idx[r], dst = expert_off[e]++;
    gather_tok[dst] = (int32_t)(r / k);
    row_idx[r] = dst;
  }
  for (int32_t e = E; e > 0; e--) expert_off[e] = expert_off[e - 1];
  expert_off[0] = 0;
  return 0;
}
