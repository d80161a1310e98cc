/* k3pd-generate --requests FILE: many generations in one process (one model load), optionally
 * teacher-forced on another engine's tokens, for comparing the cluster with the monolithic path
 * on a GPU where results are not batch-invariant.
 *
 * FILE: one request per line, tab-separated fields:
 *   PROMPT_IDS [TAB TEACHER_IDS [TAB MAX_NEW [TAB SEED]]]
 * ids comma-separated; an empty TEACHER_IDS (or none) means "generate freely"; MAX_NEW defaults
 * to --max-new-tokens (or the teacher's length), SEED to --seed. Lines starting with '#' and empty
 * lines are skipped.
 * Teacher forcing: at every step the monolithic choice (sampled from its own logits with the
 * request's sampling) is compared with the teacher's token, then the TEACHER's token is fed, so
 * every later step is judged in the teacher's context. At each disagreement the gap is
 * logit[mono] - logit[teacher] (>= 0 for greedy; either sign when sampling), and its size relative
 * to max(|logit[mono]|, 1); a disagreement is a near tie when that relative size is <= --near-tie (default 0.02: the bf16
 * GEMMs' own spread between batch shapes, docs/gpu-cluster.md "Correctness").
 * Output (stdout), per request i:
 *   req <i> ids: <the monolithic choice at each step>
 *   req <i> diverge step <s> mono <m> given <t> gap <g> rel <r> <near-tie|NOT-near-tie>   (each)
 *   req <i> teacher: steps <n> divergences <d> near_ties <k> first_token <same|DIFFERENT>
 * and a last line:
 *   requests: <n> teacher_forced <t> first_tokens_equal <a>/<t> divergences <d> near_ties <k>
 *             not_near_ties <b>
 * Exit status: 0 when every request ran (the verdict is the caller's to draw from the lines). */
#ifndef K3PD_GENERATE_REQUESTS_H
#define K3PD_GENERATE_REQUESTS_H

#include <stdint.h>

#include "k3_runner.h"
#include "k3k.h"

typedef struct {
  int32_t *prompt, *teacher;
  int n_prompt, n_teacher, max_new;
  uint64_t seed;
} gen_req_t;

typedef struct {
  gen_req_t *v;
  int n;
  int64_t max_total; /* largest prompt + max_new */
} gen_reqs_t;

/* Parses FILE. default_max_new/default_seed fill absent fields. Errors name the line. Returns
 * 0, K3_EIO, K3_EINVAL (message in err), K3_ENOMEM. */
int gen_reqs_load(const char *path, int default_max_new, uint64_t default_seed, int64_t vocab, gen_reqs_t *out,
                  char *err, size_t errlen);
void gen_reqs_free(gen_reqs_t *q);

/* Runs every request on r (needs one free slot and pages for max_total tokens). sc: sampling
 * (its seed and step are set per request/step). block_split > 0: each prompt is prefilled in two
 * passes split at its last multiple of block_split before the end (what the cluster computes
 * with the prefix cache on; docs/gpu-cluster.md "Correctness"); 0: one prefill call. stop(id)
 * ends a free generation early (NULL: never). Returns 0 or 1 (message printed). */
int gen_reqs_run(k3_runner_t *r, const gen_reqs_t *q, const k3k_sample_cfg_t *sc, double near_tie, int block_split,
                 bool (*stop)(const k3_runner_t *r, int32_t id));

#endif
