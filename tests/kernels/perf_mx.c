/* test_kernels --perf-mxfp4: the MXFP4 GEMM shapes of the medium preset's routed experts
 * (gate/up K=3584 N=3072, down K=3072 N=3584) at M = 1, 2, 5, 6, 16, 79 rows (5: the average
 * rows per expert of a 79-token prefill at top-16 of 256; 6: the first packed shape), and a
 * bf16 decode GEMM 7168×7168 at M=1 and 2 for comparison, on "cpu-fast" with the pool's current
 * thread count (use `--threads 1` for per-thread figures). Prints ms, ns per weight element and GB/s of packed
 * weight bytes (codes + scales, or bf16). Not a test: it asserts nothing but that the op
 * returned 0 and that cpu-fast equals the cpu reference at M=1 (one run each). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Best of `reps` runs after one warm-up; -1 on a failed run. */
static double best_s(k3k_backend_t *be, k3k_op_t op, tt_t *s, int n, int reps) {
  const k3k_tensor_t *tp[K3K_MAX_ARGS];
  k3k_tensor_t tv[K3K_MAX_ARGS];
  for (int i = 0; i < n; i++) {
    tv[i] = s[i].t;
    tv[i].backend = be;
    tp[i] = &tv[i];
  }
  double best = 1e30;
  for (int r = 0; r <= reps; r++) {
    uint64_t t0 = k3_now_ns();
    if (k3k_run(be, op, NULL, tp, n)) return -1;
    double sec = (double)(k3_now_ns() - t0) * 1e-9;
    if (r > 0 && sec < best) best = sec;
  }
  return best;
}

static void mx_case(k3k_backend_t *fast, k3k_backend_t *ref, int64_t M, int64_t K, int64_t N) {
  tt_t s[4] = {tt_2d(K3K_BF16, M, K, 0), tt_2d(K3K_U8, N, K / 2, 0), tt_2d(K3K_U8, N, K / 32, 0),
               tt_2d(K3K_BF16, M, N, 0)};
  tt_rand(&s[0], -1, 1);
  uint8_t *pk = s[1].t.data, *sc = s[2].t.data;
  for (int64_t i = 0; i < N * K / 2; i++) pk[i] = (uint8_t)rng_u32();
  for (int64_t i = 0; i < N * K / 32; i++) sc[i] = (uint8_t)(118 + rng_u32() % 8);
  int reps = M * N * K > ((int64_t)1 << 28) ? 2 : 5;
  double t = best_s(fast, K3K_OP_MXFP4_GEMM, s, 4, reps);
  double wbytes = (double)N * K / 2 + (double)N * K / 32;
  if (t < 0) {
    printf("mxfp4 M=%-3lld K=%lld N=%lld: failed\n", (long long)M, (long long)K, (long long)N);
  } else {
    printf("mxfp4 M=%-3lld K=%-5lld N=%-5lld %9.3f ms %8.3f ns/weight %7.2f GB/s\n", (long long)M,
           (long long)K, (long long)N, t * 1e3, t * 1e9 / ((double)N * K), wbytes / t * 1e-9);
  }
  if (M == 1 && ref) { /* one bit-identity spot check at the real shape */
    size_t yb = (size_t)(M * N) * 2;
    void *y0 = malloc(yb);
    memcpy(y0, s[3].t.data, yb);
    int rc = run_host("cpu", K3K_OP_MXFP4_GEMM, NULL, s, 4);
    check(rc == 0 && !memcmp(y0, s[3].t.data, yb), "perf mxfp4 M=1 K=%lld N=%lld: cpu-fast == cpu",
          (long long)K, (long long)N);
    free(y0);
  }
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

int perf_mx_main(void) {
  rng_seed(11);
  k3k_backend_t *fast = k3k_backend_get("cpu-fast"), *ref = k3k_backend_get("cpu");
  if (!fast) return 1;
  printf("cpu-fast MXFP4 GEMM, %d thread(s)\n", k3k_cpu_fast_get_threads());
  static const int64_t Ms[] = {1, 2, 5, 6, 16, 79};
  for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
    mx_case(fast, ref, Ms[i], 3584, 3072);
    mx_case(fast, ref, Ms[i], 3072, 3584);
  }
  int64_t H = 7168;
  for (int64_t M = 1; M <= 2; M++) { /* decode of one and of two sequences */
    tt_t g[3] = {tt_2d(K3K_BF16, M, H, 0), tt_2d(K3K_BF16, H, H, 0), tt_2d(K3K_BF16, M, H, 0)};
    tt_rand(&g[0], -1, 1);
    tt_rand(&g[1], -1, 1);
    double t = best_s(fast, K3K_OP_GEMM, g, 3, 5);
    if (t > 0)
      printf("bf16  M=%-3lld K=%-5lld N=%-5lld %9.3f ms %8.3f ns/weight %7.2f GB/s\n", (long long)M,
             (long long)H, (long long)H, t * 1e3, t * 1e9 / ((double)H * H), 2.0 * H * H / t * 1e-9);
    for (int i = 0; i < 3; i++) tt_free(&g[i]);
  }
  /* First touch of a fresh 512 MiB buffer (what a pageable device → host copy pays): the
   * backend's allocation (2 MiB-aligned, MADV_HUGEPAGE) against plain malloc. */
  size_t nb = (size_t)512 << 20;
  void *p = NULL;
  if (ref && ref->alloc(ref, nb, &p) == 0) {
    uint64_t t0 = k3_now_ns();
    memset(p, 1, nb);
    double s1 = (double)(k3_now_ns() - t0) * 1e-9;
    ref->free(ref, p);
    char *q = malloc(nb);
    if (q) {
      t0 = k3_now_ns();
      memset(q, 1, nb);
      double s2 = (double)(k3_now_ns() - t0) * 1e-9;
      free(q);
      printf("first touch of 512 MiB: backend alloc %.2f GB/s, malloc %.2f GB/s\n", nb / s1 * 1e-9,
             nb / s2 * 1e-9);
    }
  }
  return g_fail ? 1 : 0;
}
