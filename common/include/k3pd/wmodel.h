/* Loading the model in a worker process from flags: a checkpoint directory (--model DIR) or a
 * synthetic preset generated in memory (--synthetic tiny --seed-weights N, the generator
 * k3pd-mkckpt uses), then a runner with the requested precision, backend and pool sizes.
 * Shared by k3pd-prefill and k3pd-decode so both sides build identical manifests (and so
 * identical fingerprints) from identical flags. */
#ifndef K3PD_WMODEL_H
#define K3PD_WMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "k3_runner.h"
#include "k3pd/flags.h"
#include "k3pd/weights.h"

typedef struct {
  const char *model_dir;  /* checkpoint directory, or NULL with synthetic */
  const char *synthetic;  /* preset name for in-memory weights, or NULL */
  int64_t seed_weights;   /* seed of the synthetic weights (mkckpt --seed) */
  const char *precision;  /* "fp32" | "bf16" */
  const char *backend;    /* "cpu" | "cpu-fast" | "cuda" */
  int threads;
  int page_tokens, num_pages, num_slots, max_batch, prefill_chunk;
} k3_wmodel_opts_t;

void k3_wmodel_opts_default(k3_wmodel_opts_t *o);

/* Flag table entries for the options above (K3_WMODEL_NFLAGS entries); `o` must outlive parsing. */
#define K3_WMODEL_NFLAGS 11
void k3_wmodel_flags(k3_wmodel_opts_t *o, k3_flag_t *out /* K3_WMODEL_NFLAGS entries */);

/* Loads weights and builds the runner. On error returns K3_E* with a message naming the flag
 * or file in err, and nothing is left allocated. Caller frees with k3_runner_free then
 * k3_weights_free. */
int k3_wmodel_load(const k3_wmodel_opts_t *o, k3_weights_t **w, k3_runner_t **r, char *err, size_t errlen);

#endif
