/* k3pd-bench: the prefix-cache lines of the report (docs/perf-cluster.md "Prefix cache").
 *
 * From the final chunks' usage: a request "hit" when usage.cached_prompt_tokens > 0; computed
 * prompt tokens = prompt - cached (what the cluster ran through the model). TTFT is split into
 * first turns (a chat's turn 1, or with --shared-prefix-len the first request) and later ones,
 * the figure the goal is about. Not here: the main table (report.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

void bn_report_prefix(const bn_report_in_t *in, const bn_run_t *run) {
  const bn_workload_t *w = in->w;
  uint64_t prompt = 0, cached = 0, hits = 0, ok = 0;
  double *first = malloc((run->n_res + 1) * sizeof *first), *later = malloc((run->n_res + 1) * sizeof *later);
  size_t nf = 0, nl = 0;
  if (!first || !later) {
    free(first);
    free(later);
    return;
  }
  for (size_t i = 0; i < run->n_res; i++) {
    const bn_result_t *x = &run->res[i];
    if (!x->complete) continue;
    ok++;
    prompt += x->prompt_tokens;
    cached += x->cached_tokens;
    hits += x->cached_tokens > 0;
    bool is_first = w->chat_turns ? x->index % w->chat_turns == 0 : x->index == 0;
    if (x->t_first) {
      double ms = (double)(x->t_first - x->t_start) / 1e6;
      if (is_first) first[nf++] = ms;
      else later[nl++] = ms;
    }
  }
  if (ok && (cached || w->chat_turns || w->shared_prefix_len)) {
    printf("  prefix cache: %llu of %llu requests hit (%.1f%%); prompt tokens %llu, cached %llu (%.1f%%), computed "
           "%llu\n",
           (unsigned long long)hits, (unsigned long long)ok, 100.0 * (double)hits / (double)ok,
           (unsigned long long)prompt, (unsigned long long)cached,
           prompt ? 100.0 * (double)cached / (double)prompt : 0.0, (unsigned long long)(prompt - cached));
    double f50 = bn_percentile(first, nf, 50), l50 = bn_percentile(later, nl, 50);
    double l90 = bn_percentile(later, nl, 90);
    printf("  TTFT %s: p50 %.2f ms (n %zu); later: p50 %.2f ms, p90 %.2f ms (n %zu)\n",
           w->chat_turns ? "first turns" : "first request", f50, nf, l50, l90, nl);
  }
  free(first);
  free(later);
}
