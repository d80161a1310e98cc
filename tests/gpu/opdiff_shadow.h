/* Op-by-op shadow of a k3k backend for precision studies (k3k-gpu-opdiff).
 *
 * What it is for: answering "which op of the model runner's CUDA pass differs from the CPU
 * reference, and by how much" at real shapes with the runner's real dtypes. The shadow replaces
 * the `run` entry of a backend's vtable (the runner holds the same backend pointer, so every
 * k3k op of a runner pass goes through it). For each selected op it copies every argument to
 * the host, runs the same op with the same params on the reference backend ("cpu-fast", which is
 * bit-identical to "cpu") on those host copies, runs the op on the device, and compares the
 * device outputs with the reference outputs: the LOCAL error of that op from identical inputs.
 * Optionally ("fix") it then overwrites the device outputs with the reference outputs, so the
 * rest of the pass continues from the reference's values: fixing a set of ops measures how much
 * of the end-to-end error those ops cause.
 * What it is not: a backend (it borrows one), thread-safe (one runner, one thread), or a cover of
 * the work a runner does outside k3k ops (the device MoE path of ffn_device.c calls its CUDA
 * kernels directly and is not seen here).
 * Compared elements: the whole output view; for in/out state pools (KDA S, conv state, MLA
 * cache) only the slots / cache rows the op addresses, so stale slots do not dilute the figure.
 * Read-only weight arguments (GEMM W, MXFP4 codes/scales, kv_b in MLA_DECODE, the embedding
 * table) are copied once and cached by device address for the shadow's lifetime.
 * Ownership: od_shadow_install takes nothing; od_shadow_remove restores the vtable and frees
 * the caches. */
#ifndef K3K_OPDIFF_SHADOW_H
#define K3K_OPDIFF_SHADOW_H

#include <stdbool.h>
#include <stdint.h>

#include "k3k.h"

#define OD_MASK(op) (1ull << (op))
#define OD_ALL (((1ull << K3K_OP_COUNT) - 1) & ~OD_MASK(K3K_OP_SAMPLE))

/* Per-op aggregate of local errors since the last od_shadow_reset. */
typedef struct {
  int calls;
  double max_rel, sum_rel;   /* relative L2 error of the outputs */
  double max_abs;
  int64_t n_diff, n;         /* elements that differ / compared */
} od_opstat_t;

/* Installs the shadow on `be` with `ref` as the reference. check: ops whose local error is
 * measured; fix: ops whose device outputs are replaced by the reference outputs (implies
 * check). print: one line per checked call. Returns 0, K3_EINVAL (already installed). */
int od_shadow_install(k3k_backend_t *be, k3k_backend_t *ref, uint64_t check, uint64_t fix,
                      bool print);
/* Changes the masks / printing of the installed shadow. */
void od_shadow_set(uint64_t check, uint64_t fix, bool print);
/* Tag printed with each call line (e.g. "prefill L2"); copied. */
void od_shadow_tag(const char *tag);
/* Clears the per-op statistics and the first error. */
void od_shadow_reset(void);
/* First error seen by the shadow itself (host copy, reference op, compare), 0 if none. */
int od_shadow_error(void);
const od_opstat_t *od_shadow_stats(void); /* [K3K_OP_COUNT] */
/* Prints the per-op summary (ops with calls only) with a title. */
void od_shadow_print_summary(const char *title);
void od_shadow_remove(void);

#endif
