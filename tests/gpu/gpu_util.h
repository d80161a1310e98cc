/* Helpers of the GPU test programs (k3k-gpu-check, k3k-gpu-moe): paired host/device tensors,
 * random fill, poisoning, and the relative Frobenius comparison.
 *
 * What it is for: a check of a CUDA internal builds its inputs once on the host, uploads the
 * same bytes to the "cuda" backend, runs the reference (an op on the reference backend, or the
 * path the internal stands in for) and the internal, and compares.
 * What it is not: the op test. Every op's parity is test_kernels' (tests/kernels, tiny and
 * --real shapes), whose tolerance model (tests/kernels/tolerance.c) gpair_check follows.
 * Ownership: a gpair owns both buffers; gpair_free releases them. */
#ifndef K3K_GPU_UTIL_H
#define K3K_GPU_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "k3k.h"

typedef struct {
  k3k_tensor_t h, d; /* host (reference backend) and device views, same shape/strides */
  size_t bytes;
} gpair;

typedef struct {
  k3k_backend_t *ref, *cuda;
  uint64_t rng;
  int passed, failed;
  bool verbose;
  const char *perf_only; /* --only: comma-separated perf groups to run (NULL = all) */
  /* RMS of the finite operand elements of the last g_run2 call per float dtype ([0] BF16,
   * [1] F32), taken before it ran (inputs and in/out state; poisoned outputs are NaN and drop
   * out); 0 once the next case allocates (gpair_new). The magnitude floor of gpair_check. */
  double in_rms[2];
} gctx;

/* Sets up g: the "cuda" backend and the reference backend `ref`, RNG seeded with seed (0 = 1),
 * and prints "<prog>: reference=... seed=...". Returns 0, 77 when there is no usable CUDA
 * device (the ctest skip code), or 2 for an unknown reference backend. */
int gctx_open(gctx *g, const char *ref, uint64_t seed, const char *prog);

int gpair_new(gctx *g, gpair *p, k3k_dtype_t dt, int ndim, const int64_t *shape);
void gpair_free(gctx *g, gpair *p);
/* Uniform in [lo, hi) (F32/BF16 rounded; I32 truncated), then uploaded. */
int gpair_rand(gctx *g, gpair *p, float lo, float hi);
/* Host copy -> device (after the host values were set by hand). */
int gpair_upload(gctx *g, gpair *p);
/* 0xFF bytes on both sides: NaN for F32/BF16, -1 for I32, so unwritten outputs show. */
int gpair_poison(gctx *g, gpair *p);
/* Compares device against host: relative Frobenius error over F32/BF16 (exact for I32).
 * A NaN on one side only fails. Records and prints one line; returns true when it passed.
 * Tolerance model (tests/common/tol_model.h, test_kernels' own): ‖dev − ref‖ ≤ tol · max(‖ref‖,
 * √n · ulp · r), r = g->in_rms of the output's dtype: the RMS of the case's operands held in
 * the output's precision (for a bf16 output its bf16 activations and weights; f32 gate logits,
 * betas and states do not count: a log-gate of -40 is no magnitude of the result). */
bool gpair_check(gctx *g, gpair *p, double tol, const char *what);
float gpair_host_get(const gpair *p, int64_t i);
void gpair_host_set(gpair *p, int64_t i, float v);

uint64_t g_rand_u64(gctx *g);
float g_rand_unif(gctx *g, float lo, float hi);

/* Records a result not coming from gpair_check (e.g. a failed op call). */
void g_record(gctx *g, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Both backends, same op; each runs on its own tensor views. Returns 0 when both succeeded. */
int g_run2(gctx *g, k3k_op_t op, const void *params, gpair **ps, int n, const char *what);

#endif
