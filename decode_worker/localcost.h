/* The local-prefill threshold of conditional disaggregation, from a cost model
 * (docs/design.md "Prefix cache", "The local-prefill threshold").
 *
 * What it is for: a cache hit whose uncached suffix is at most `local_max` tokens is computed
 * by the decode worker itself, between two decode steps; every running stream's next token
 * waits for it. The largest suffix allowed is the longest whose estimated prefill time stays
 * within a stall budget of S decode steps of a full batch (the step the streams take when the
 * worker is busy, which is when a stall hurts):
 *   local_max = max { L : T_prefill(L) <= S x T_step(max_batch) }.
 * Costs come from a k3pd-bench --profile file (schema k3pd-profile/1, docs/plan.md) or from a
 * probe this worker runs at start-up (costprobe.c). Pure functions here: no clock, no runner,
 * so the derivation is tested exactly (tests/unit/decode/test_localcost.c).
 *
 * Not here: the full profile (tools/plan/profile.c reads every field for the planner; the
 * binaries do not link the tools, so this reads the eight cost fields it needs, with the same
 * schema and the same error wording). */
#ifndef K3PD_DECODE_LOCALCOST_H
#define K3PD_DECODE_LOCALCOST_H

#include <stddef.h>
#include <stdint.h>

/* The threshold when the start-up probe cannot run (the fixed default before the cost model). */
#define DC_LOCAL_MAX_FALLBACK 512

typedef struct {
  /* one prefill pass (runner call) in ms: fixed + per_seq x seqs + per_token x tokens
   *   + per_kctx x Σ(tokens of the pass x tokens before them) / 1000 (docs/plan.md) */
  double pass_fixed_ms, pass_per_seq_ms, pass_per_token_ms, pass_per_kctx_ms;
  int64_t chunk_tokens; /* tokens of one sequence per pass (the runner's --prefill-chunk) */
  /* one decode step in ms: fixed + per_seq x batch + per_kctx x Σ context / 1000 */
  double step_fixed_ms, step_per_seq_ms, step_per_kctx_ms;
  int step_batch;       /* the batch of the reference step: the worker's --max-batch (a probe:
                           the batch it measured, with the whole step in step_fixed_ms) */
  char source[200];     /* where the figures came from (for the start-up log line) */
} dc_costs_t;

/* Reads the cost fields of a k3pd-profile/1 file into *c (fields absent keep their value in *c;
 * neither chunk_tokens nor step_batch is read: the passes are this worker's, cut by its own --prefill-chunk,
 * while the profile's chunk_tokens describes the prefill workers it measured). A cost must be a
 * number >= 0 (a negative one would make the threshold non-monotonic). Errors name the file and
 * the field (`prefill.pass_per_token_ms`). Returns 0 or K3_EINVAL; on error *c is unchanged. */
int dc_costs_load(const char *path, dc_costs_t *c, char *err, size_t errlen);

/* Estimated time (ms) of prefilling `tokens` tokens of one sequence alone, in passes of
 * chunk_tokens, starting at context 0. Nondecreasing in tokens. */
double dc_costs_prefill_ms(const dc_costs_t *c, int64_t tokens);
/* Estimated time (ms) of one decode step of `batch` sequences with `ctx_tokens` of context in
 * total. */
double dc_costs_step_ms(const dc_costs_t *c, int batch, double ctx_tokens);

/* The reference step: dc_costs_step_ms(c, step_batch, step_batch x chunk_tokens) (a full batch,
 * each sequence a chunk of context). */
double dc_costs_ref_step_ms(const dc_costs_t *c);
/* The largest L in [0, cap] with dc_costs_prefill_ms(c, L) <= stall_steps x
 * dc_costs_ref_step_ms(c). Returns 0 when even one
 * token exceeds the budget; cap when everything up to cap fits. K3_EINVAL (negative) when the
 * costs cannot give a bound: no decode step cost or no prefill cost (err names the field). */
int64_t dc_local_max_derive(const dc_costs_t *c, double stall_steps, int64_t cap, char *err, size_t errlen);

#endif
