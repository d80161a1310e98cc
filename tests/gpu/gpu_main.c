/* k3k-gpu-check: parity of the "cuda" backend against the reference backend, and (--perf) the
 * GPU perf table. Exits 77 (ctest SKIP) when no CUDA device is usable, so CI machines without a
 * GPU pass it as skipped; 0 when every check passed; 1 otherwise.
 * Usage: k3k-gpu-check [--quick] [--perf] [--only GROUPS] [--no-parity] [--cases LIST]
 *                      [--ref cpu|cpu-fast] [--seed N]
 * GROUPS (comma-separated, perf only): kda_decode, mla_decode, mla_prefill, kda_chunk, gemm, rows,
 * conv (the conv prefill lines of rows alone). --cases LIST (comma-separated: conv, mla_decode):
 * of the parity suite only those groups (gpu_conv_cases, gpu_mla_decode_cases), for a device
 * round that has no time for the whole suite. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k.h"

int gpu_parity(gctx *g, bool quick);
int gpu_perf(gctx *g);
void gpu_conv_cases(gctx *g);                   /* gpu_parity.c */
void gpu_mla_decode_cases(gctx *g, bool quick); /* gpu_mla.c */

/* True when `name` is one of the comma-separated entries of `list`. */
static bool in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *s = list; *s;) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len == n && !strncmp(s, name, n)) return true;
    if (!e) break;
    s = e + 1;
  }
  return false;
}

int main(int argc, char **argv) {
  bool quick = false, perf = false, parity = true;
  const char *ref = "cpu-fast", *only = NULL, *cases = NULL;
  uint64_t seed = 0x5EED1234ull;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--perf")) perf = true;
    else if (!strcmp(argv[i], "--no-parity")) parity = false;
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
  for (const char *c = cases; c && *c;) { /* every entry must be a known group */
    const char *e = strchr(c, ',');
    size_t len = e ? (size_t)(e - c) : strlen(c);
    if (!((len == 4 && !strncmp(c, "conv", 4)) || (len == 10 && !strncmp(c, "mla_decode", 10)))) {
      fprintf(stderr, "--cases: unknown group '%.*s' (known: conv, mla_decode)\n", (int)len, c);
      return 2;
    }
    c = e ? e + 1 : c + len;
  }
  gctx g;
  int orc = gctx_open(&g, ref, seed, "k3k-gpu-check");
  if (orc) return orc;
  g.perf_only = only;
  if (parity && cases) {
    if (in_list(cases, "conv")) gpu_conv_cases(&g);
    if (in_list(cases, "mla_decode")) gpu_mla_decode_cases(&g, quick);
  } else if (parity)
    gpu_parity(&g, quick);
  if (perf) gpu_perf(&g);
  printf("%d passed, %d failed\n", g.passed, g.failed);
  k3k_backends_shutdown();
  return g.failed ? 1 : 0;
}
