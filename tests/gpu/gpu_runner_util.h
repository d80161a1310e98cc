/* Helpers shared by the GPU programs that drive the model runner (k3k-gpu-model,
 * k3k-gpu-opdiff): a sequence with its own page table, and a bf16 runner with the test
 * programs' pool sizes. Not a public API. */
#ifndef K3K_GPU_RUNNER_UTIL_H
#define K3K_GPU_RUNNER_UTIL_H

#include <stdint.h>

#include "k3_runner.h"
#include "k3pd/weights.h"

#define GSEQ_MAX_PAGES 64

typedef struct {
  k3_seq_t s;
  int32_t pages[GSEQ_MAX_PAGES];
} gseq_t;

/* Empty sequence (no slot, no pages) whose page table is the struct's own array. */
void gseq_init(gseq_t *q);

/* bf16 runner on backend `be`: 64-token pages, `num_pages` pages, 4 slots, batch 4, 512-token
 * prefill chunks, CUDA graphs off (every decode step eager, k3k-gpu-opdiff's shadow needs it). Errors are printed prefixed with `prog`; returns 0 or the k3_runner_init code. */
int grunner_new(const k3_weights_t *w, const char *be, int threads, int num_pages, const char *prog,
                k3_runner_t **r);
/* The options grunner_new_ex uses: bf16 on backend `be`, 64-token pages and the sizes given
 * (for the init paths that take options rather than weights: k3_runner_init_synth/_copy). */
void grunner_opts(k3_runner_opts_t *o, const char *be, int threads, int num_pages, int num_slots, int max_batch,
                  int prefill_chunk);
/* Same with the pool/batch sizes given: num_slots KDA slots, batches of up to max_batch
 * sequences, prefill_chunk tokens per sequence per pass. */
int grunner_new_ex(const k3_weights_t *w, const char *be, int threads, int num_pages, int num_slots,
                   int max_batch, int prefill_chunk, const char *prog, k3_runner_t **r);

#endif
