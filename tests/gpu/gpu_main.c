/* k3k-gpu-check: the CUDA backend's internals and the GPU perf table. Exits 77 (ctest SKIP)
 * when no CUDA device is usable, so CI machines without a GPU pass it as skipped; 0 when every
 * check passed; 1 otherwise.
 *
 * What it is for: what the op API cannot reach, each against the reference backend or the
 * path it stands in for: the forced skinny-GEMM variants and splits vs cuBLASLt (gpu_gemv.c),
 * the grouped gemv's fit and refusal rules and internal entry point (gpu_gemv_multi.c), the
 * generic vs tensor-core MoE GEMM (gpu_generic.c), the side stream (gpu_side.c), the residual
 * glue's one launch byte for byte against the three ops (gpu_resnorm.c), and the MLA decode
 * variants only k3k_cuda_mla_probe selects (gpu_mla.c); and `--perf` (gpu_perf.c).
 * What it is not: the ops' parity. Every op of k3k_ops.def is judged at tiny shapes by
 * `test_kernels` and at the real K3 shapes by `test_kernels --real --require-device`
 * (tests/kernels, the one op-test program and its one tolerance model).
 * Usage: k3k-gpu-check [--quick] [--perf] [--only GROUPS] [--no-parity] [--cases LIST]
 *                      [--ref cpu|cpu-fast] [--seed N]
 * --quick: fewer of the long cases. --no-parity: skip the internal checks (perf only).
 * --cases LIST (comma-separated: gemv, gemv_multi, generic, side, resnorm, mla): only those
 * groups of checks, for a device round that has no time for all of them.
 * GROUPS (comma-separated, perf only): kda_decode, mla_decode, mla_prefill, kda_chunk, gemm, rows,
 * conv (the conv prefill lines of rows alone), gemv, gemvf, generic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csv.h"
#include "gpu_util.h"
#include "k3k.h"

int gpu_perf(gctx *g);
void gpu_gemv_cases(gctx *g, bool quick);       /* gpu_gemv.c */
void gpu_gemv_multi_cases(gctx *g, bool quick); /* gpu_gemv_multi.c */
void gpu_generic_cases(gctx *g);                /* gpu_generic.c */
void gpu_side_cases(gctx *g);                   /* gpu_side.c */
void gpu_resnorm_cases(gctx *g);                /* gpu_resnorm.c */
void gpu_mla_path_cases(gctx *g, bool quick);   /* gpu_mla.c */

static const char *const k_groups[] = {"gemv", "gemv_multi", "generic", "side", "resnorm", "mla"};
#define N_GROUPS (int)(sizeof k_groups / sizeof k_groups[0])

static void run_group(gctx *g, int i, bool quick) {
  switch (i) {
  case 0: gpu_gemv_cases(g, quick); break;
  case 1: gpu_gemv_multi_cases(g, quick); break;
  case 2: gpu_generic_cases(g); break;
  case 3: gpu_side_cases(g); break;
  case 4: gpu_resnorm_cases(g); break;
  default: gpu_mla_path_cases(g, quick); break;
  }
}

int main(int argc, char **argv) {
  bool quick = false, perf = false, checks = true;
  const char *ref = "cpu-fast", *only = NULL, *cases = NULL;
  uint64_t seed = 0x5EED1234ull;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--perf")) perf = true;
    else if (!strcmp(argv[i], "--no-parity")) checks = false;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = argv[++i];
    else if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: %s [--quick] [--perf] [--only GROUPS] [--no-parity] [--cases LIST] [--ref cpu|cpu-fast] [--seed N]\n",
              argv[0]);
      return 2;
    }
  }
  size_t len;
  const char *bad = cases ? csv_unknown(cases, k_groups, (size_t)N_GROUPS, &len) : NULL;
  if (bad) { /* every entry must be a known group */
    fprintf(stderr, "--cases: unknown group '%.*s' (known: gemv, gemv_multi, generic, side, "
            "resnorm, mla; the ops' parity is test_kernels --real)\n", (int)len, bad);
    return 2;
  }
  gctx g;
  int orc = gctx_open(&g, ref, seed, "k3k-gpu-check");
  if (orc) return orc;
  g.perf_only = only;
  for (int i = 0; i < N_GROUPS && checks; i++)
    if (!cases || csv_has(cases, k_groups[i])) run_group(&g, i, quick);
  if (perf) gpu_perf(&g);
  printf("%d passed, %d failed\n", g.passed, g.failed);
  k3k_backends_shutdown();
  return g.failed ? 1 : 0;
}
