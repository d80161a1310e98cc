/* k3pd-generate --perf: the model's figures on the runner's backend next to their ceilings
 * (issue 9's three figures for the medium preset on one H200):
 *   - prefill of the prompt (timed on a second pass into a fresh sequence: the first pass pays
 *     the workspace growth and first-use GEMM plans) vs the FLOP floor
 *     k3_runner_prefill_flops(n) / the measured bf16 GEMM rate;
 *   - decode at batch 1: the median of the generation's own runner steps vs the weight-read floor
 *     k3_runner_decode_bytes(1) / the measured copy bandwidth (printed by main.c);
 *   - decode at batch B (--perf-batch B): B sequences prefilled with the prompt's first <= 128
 *     tokens in one call, then timed decode steps at batch B: tokens/s vs
 *     k3_runner_decode_bytes(B) / copy bandwidth.
 * Ceilings are measured in the same process on the same backend: a 1 GiB device copy (read +
 * write) and a bf16 GEMM through k3k_gemm (8192^3 on cuda, 512^3 on the host backends, where a
 * larger one would take minutes), random inputs uploaded from the host.
 * What it is not: a benchmark harness with warm-up statistics (k3k-gpu-model --perf is). */
#ifndef K3PD_GENERATE_PERF_H
#define K3PD_GENERATE_PERF_H

#include <stdint.h>

#include "k3_runner.h"

typedef struct {
  double copy_bw;   /* bytes/s, read + write; 0 = not measured */
  double gemm_rate; /* FLOP/s of the bf16 GEMM; 0 = not measured */
  int gemm_n;       /* the GEMM's M = N = K */
} gen_ceilings_t;

/* Measures both ceilings on backend `name`. Returns 0 or a negative K3_E* code (then the
 * figures that could not be measured are 0). */
int gen_perf_ceilings(const char *name, gen_ceilings_t *c);

/* Prefills the n-token prompt again into a fresh sequence of r (needs a free slot and pages for
 * n tokens), times it and prints the prefill line to stderr. Returns 0 or K3_E*. */
int gen_perf_prefill(k3_runner_t *r, const int32_t *prompt, int64_t n, const gen_ceilings_t *c);

/* Batch-B decode figure (see the file comment); `steps` timed steps after 3 untimed ones. The
 * runner needs B free slots, max_batch_seqs >= B and pages for B x (min(n,128) + steps + 8)
 * tokens. Prints the line to stderr. Returns 0 or K3_E*. */
int gen_perf_batch(k3_runner_t *r, const int32_t *prompt, int64_t n, int batch, int steps,
                   const gen_ceilings_t *c);

/* Tokens of the batch figure's prompt: min(n, 128). */
int64_t gen_perf_batch_prompt(int64_t n);

#endif
