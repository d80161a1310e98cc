/* Shared parts of k3k-gpu-model (gpu_model.c: parity vs the CPU reference and main;
 * gpu_model_perf.c: graph replay check and --perf figures). Not a public API. */
#ifndef K3K_GPU_MODEL_H
#define K3K_GPU_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "k3_runner.h"

/* Records and prints one check: "PASS|FAIL name: " + fmt (two doubles). */
void gm_check(bool ok, const char *name, const char *fmt, double a, double b);
/* Graph replay vs eager decode at batch nb over `steps` steps (two checks). */
void gm_graph_check(k3_runner_t *gpu, int nb, int steps);
/* Perf figures with their ceilings (prints PERF lines): decode batch 1 eager/graph, decode at
 * `batch` sequences, prefill of `ptok` tokens. The runner needs batch + 1 free slots, pages for
 * them and prefill_chunk_tokens >= ptok. */
void gm_perf(k3_runner_t *gpu, int steps, int batch, int64_t ptok);
/* --profile: gm_perf adds three cudaProfilerStart/Stop regions (prefill, decode batch 1, decode
 * batch B; see gpu_model_perf.c) for ncu --profile-from-start off. */
extern bool gm_profile;

#endif
