/* k3k-gpu-check: parity of the "cuda" backend against the reference backend, and (--perf) the
 * GPU perf table. Exits 77 (ctest SKIP) when no CUDA device is usable, so CI machines without a
 * GPU pass it as skipped; 0 when every check passed; 1 otherwise.
 * Usage: k3k-gpu-check [--quick] [--perf] [--only GROUPS] [--no-parity] [--ref cpu|cpu-fast] [--seed N]
 * GROUPS (comma-separated, perf only): kda_decode, mla_decode, mla_prefill, kda_chunk, gemm, rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k.h"

int gpu_parity(gctx *g, bool quick);
int gpu_perf(gctx *g);

int main(int argc, char **argv) {
  bool quick = false, perf = false, parity = true;
  const char *ref = "cpu-fast", *only = NULL;
  uint64_t seed = 0x5EED1234ull;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--perf")) perf = true;
    else if (!strcmp(argv[i], "--no-parity")) parity = false;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: %s [--quick] [--perf] [--only GROUPS] [--no-parity] [--ref cpu|cpu-fast] [--seed N]\n",
              argv[0]);
      return 2;
    }
  }
  gctx g;
  int orc = gctx_open(&g, ref, seed, "k3k-gpu-check");
  if (orc) return orc;
  g.perf_only = only;
  if (parity) gpu_parity(&g, quick);
  if (perf) gpu_perf(&g);
  printf("%d passed, %d failed\n", g.passed, g.failed);
  k3k_backends_shutdown();
  return g.failed ? 1 : 0;
}
