/* test_kernels: the one op-test program of k3k. Runs every op of k3k_ops.def on every available
 * backend: at tiny shapes (the default; CI), "cpu" against float64 expectations, cpu-fast bit
 * for bit against "cpu", a device backend against "cpu" by the one tolerance model
 * (tolerance.c); `--real` every op at the real K3 shapes (real.c), each backend against the
 * reference (`--ref`, default cpu-fast there) by the same model; `--quick` a shorter --real,
 * `--groups LIST` only some of its files (fused, rows, gemm, seq, mla, moe);
 * `--require-device`: a device backend must be present and take every case, and every op must
 * have run on it. Both runs end with the coverage check (coverage.c). `--perf` prints timings
 * instead, `--perf-mxfp4` the MXFP4 GEMM shapes of the medium preset (perf_mx.c). `--threads N`
 * sets the cpu-fast pool size. Exit status 0 only when nothing failed; the last line is
 * "N passed, N failed, N skipped" (skipped: a device backend lacks the op). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

int main(int argc, char **argv) {
  bool perf = false, perf_mx = false, real = false;
  const char *ref = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--perf")) {
      perf = true;
    } else if (!strcmp(argv[i], "--real")) {
      real = true;
    } else if (!strcmp(argv[i], "--require-device")) {
      g_require_dev = true;
    } else if (!strcmp(argv[i], "--quick")) {
      g_quick = true;
    } else if (!strcmp(argv[i], "--groups") && i + 1 < argc && real_groups_valid(argv[i + 1])) {
      g_real_groups = argv[++i];
    } else if (!strcmp(argv[i], "--ref") && i + 1 < argc &&
               (!strcmp(argv[i + 1], "cpu") || !strcmp(argv[i + 1], "cpu-fast"))) {
      ref = argv[++i];
    } else if (!strcmp(argv[i], "--perf-mxfp4")) {
      perf_mx = true;
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      if (k3k_cpu_fast_set_threads(atoi(argv[++i]))) {
        fprintf(stderr, "--threads: want 1..256\n");
        return 2;
      }
    } else {
      fprintf(stderr,
              "usage: %s [--perf | --perf-mxfp4 | --real [--quick] [--groups LIST]] "
              "[--require-device] [--ref cpu|cpu-fast] [--threads N]\n"
              "  LIST: comma-separated of fused, rows, gemm, seq, mla, moe\n", argv[0]);
      return 2;
    }
  }
  int rc = 0;
  if (real) { /* every op at the real K3 shapes, every backend against the reference (real.c) */
    g_real = true;
    g_ref = ref ? ref : "cpu-fast";
    g_host_others = !g_require_dev;
    t_real();
    rc = g_fail ? 1 : 0;
  } else if (perf_mx) {
    rc = perf_mx_main();
  } else if (perf) {
    rc = perf_main(argc, argv);
  } else {
    if (ref) g_ref = ref; /* the fused cases' reference; run_case always judges against "cpu" */
    printf("backends:");
    for (const char *const *n = k3k_backend_names(); *n; n++)
      printf(" %s%s", *n, k3k_backend_get(*n) ? "" : " (unavailable)");
    printf("; cpu-fast threads %d\n", k3k_cpu_fast_get_threads());
    t_basic();
    t_route();
    t_seq();
    t_mla();
    t_mxfp4_fast();
    t_mx_bf16_bits();
    t_gemm_direct();
    t_mem();
    t_fused();
    /* Again with more workers than cores: more, smaller tasks and a resized pool. */
    int before = k3k_cpu_fast_get_threads();
    if (k3k_cpu_fast_set_threads(5) == 0) {
      printf("cpu-fast threads 5\n");
      t_basic();
      t_seq();
      t_mla();
      t_mxfp4_fast();
      t_gemm_direct();
      t_fused();
      k3k_cpu_fast_set_threads(before);
    } else {
      check(false, "k3k_cpu_fast_set_threads(5)");
    }
    cov_check(g_require_dev, false); /* every op of the list has a case */
    rc = g_fail ? 1 : 0;
  }
  k3k_backends_shutdown();
  if (!perf && !perf_mx) printf("%d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skip);
  return rc;
}
