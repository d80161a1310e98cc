/* GEMM cases aimed at cpu-fast's decode-shaped path (direct_panel in kernels/fast/fast_gemm.c):
 * every M from 1 to 5 (one compiled instance each) plus 6 (the packed path), bf16 and f32 W,
 * K a multiple of 4 and not (the sequential K % 4 tail), N = 29 (three full panels and a
 * 5-column tail through the pack), row-padded W, x and y. run_case demands byte equality of
 * cpu-fast with "cpu" and checks a float64 expectation computed here. */
#include "harness.h"

static void one(int64_t M, int64_t K, k3k_dtype_t wdt, k3k_dtype_t xdt, k3k_dtype_t ydt) {
  const int64_t N = 29;
  tt_t s[3] = {tt_2d(xdt, M, K, 2), tt_2d(wdt, N, K, 3), tt_2d(ydt, M, N, 1)};
  tt_rand(&s[0], -1, 1);
  tt_rand(&s[1], -1, 1);
  double *w = tt_expect(&s[2], 1e-5, ydt == K3K_BF16 ? tol_rel(K3K_BF16) : 1e-4);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += tt_get(&s[0], m * K + k) * tt_get(&s[1], n * K + k);
      w[m * N + n] = ydt == K3K_BF16 ? rbf(acc) : acc;
    }
  char nm[96];
  snprintf(nm, sizeof nm, "gemm direct M=%lld K=%lld W %s x %s y %s", (long long)M, (long long)K,
           wdt == K3K_BF16 ? "bf16" : "f32", xdt == K3K_BF16 ? "bf16" : "f32",
           ydt == K3K_BF16 ? "bf16" : "f32");
  run_case(nm, K3K_OP_GEMM, NULL, s, 3, 0);
  for (int i = 0; i < 3; i++) tt_free(&s[i]);
}

void t_gemm_direct(void) {
  rng_seed(91);
  for (int64_t M = 1; M <= 6; M++) {
    one(M, 64, K3K_BF16, K3K_BF16, K3K_F32);
    one(M, 67, K3K_BF16, K3K_F32, K3K_BF16);
    one(M, 64, K3K_F32, K3K_F32, K3K_F32);
    one(M, 66, K3K_F32, K3K_BF16, K3K_BF16);
  }
}
