/* Real-shape cases of the MoE routing ops (test_kernels --real, real.c): ROUTER at K3's 896
 * experts top-16 (flat and grouped 8/3, renormalised or not, plain or biased weights, F32 and
 * BF16 bias) and the 256-expert grouped form, and MOE_COMBINE at K3's latent width 3584 (F32
 * and BF16, a skipped row, k above 16: two batches of row loads, a width off the vector path)
 * with its refused call (a row index past the rows: nothing written). Ported from k3k-gpu-moe's
 * op cases (gpu_moe.c); the expert GEMMs are in real_gemm.c, the whole routed block
 * (MOE_ROUTED) in t_fused_moe.c.
 * Router indices are judged exactly, so a near-tie of two scores would make the case depend on
 * one ulp of expf: the T-loop cases draw each token's logits as a permutation of a spaced grid
 * over [-3, 3) (adjacent sigmoid scores >= 3e-4 apart) with a bias below 5e-5, which keeps
 * every gap far above an ulp; the cases with continuous random logits (where a bias of +-0.2
 * reorders the experts) keep k3k-gpu-moe's small batches. */
#include <stdlib.h>
#include <string.h>

#include "real.h"

static void router_case(int64_t T, int64_t E, int k, int G, int tg, int renorm, int biased,
                        k3k_dtype_t bdt, bool grid) {
  tt_t s[4] = {tt_2d(K3K_F32, T, E, 0), tt_1d(bdt, E), tt_2d(K3K_I32, T, k, 0),
               tt_2d(K3K_F32, T, k, 0)};
  real_out(&s[2], 0), real_out(&s[3], 0);
  if (grid) {
    int64_t *perm = malloc((size_t)E * sizeof *perm);
    for (int64_t t = 0; t < T; t++) {
      for (int64_t e = 0; e < E; e++) perm[e] = e;
      for (int64_t e = E - 1; e > 0; e--) {
        const int64_t j = rng_u32() % (e + 1), x = perm[e];
        perm[e] = perm[j], perm[j] = x;
      }
      for (int64_t e = 0; e < E; e++) tt_set(&s[0], t * E + e, -3.0 + 6.0 * (double)perm[e] / (double)E);
    }
    free(perm);
    tt_rand(&s[1], -5e-5, 5e-5);
  } else {
    tt_rand(&s[0], -6, 6), tt_rand(&s[1], -0.2, 0.2);
  }
  const k3k_router_params_t p = {.top_k = k, .n_groups = G, .topk_group = tg,
                                 .renormalize = renorm, .use_biased_weights = biased,
                                 .scaling = 2.827f};
  char name[160];
  snprintf(name, sizeof name, "router T=%lld E=%lld k=%d groups=%d/%d renorm=%d biased=%d bias=%s%s",
           (long long)T, (long long)E, k, tg, G, renorm, biased, k3k_dtype_name(bdt),
           grid ? " grid" : "");
  fused_check(name, K3K_OP_ROUTER, &p, s, 4, NULL, NULL);
  tt_free_all(s, 4);
}

static void combine_case(int64_t T, int k, int64_t D, k3k_dtype_t dt) {
  const int64_t R = T * k;
  tt_t s[4] = {tt_2d(dt, R, D, 0), tt_2d(K3K_I32, T, k, 0), tt_2d(K3K_F32, T, k, 0),
               tt_2d(dt, T, D, 0)};
  int32_t *ri = s[1].buf;
  for (int64_t i = 0; i < R; i++) ri[i] = (int32_t)i;
  for (int64_t i = R - 1; i > 0; i--) { /* scrambled: rows grouped by expert in any order */
    const int64_t j = rng_u32() % (i + 1);
    const int32_t x = ri[i];
    ri[i] = ri[j], ri[j] = x;
  }
  ri[R / 3] = -1; /* a skipped slot */
  tt_rand(&s[0], -2, 2), tt_rand(&s[2], 0, 0.3), real_out(&s[3], 0);
  char name[120];
  snprintf(name, sizeof name, "moe_combine T=%lld k=%d D=%lld %s", (long long)T, k, (long long)D,
           k3k_dtype_name(dt));
  fused_check(name, K3K_OP_MOE_COMBINE, NULL, s, 4, NULL, NULL);
  if (T == 4) {
    ri[R / 2] = (int32_t)R;
    strncat(name, " bad row", sizeof name - strlen(name) - 1);
    op_check_err(name, K3K_OP_MOE_COMBINE, NULL, s, 4, K3_ERANGE);
  }
  tt_free_all(s, 4);
}

void real_moe(void) {
  rng_seed(3005);
  for (int i = 0; i < g_real_nT; i++) {
    const int64_t T = g_real_T[i];
    router_case(T, 896, 16, 1, 1, 1, 0, K3K_F32, true);  /* K3 */
    router_case(T, 896, 16, 8, 3, 0, 1, K3K_BF16, true); /* grouped, biased weights, no renorm */
    router_case(T, 256, 8, 8, 4, 1, 0, K3K_F32, true);   /* DeepSeek-style grouped form */
    combine_case(T, 16, 3584, K3K_BF16);
  }
  router_case(64, 896, 16, 1, 1, 1, 0, K3K_F32, false);
  router_case(1, 896, 16, 1, 1, 1, 0, K3K_F32, false);
  router_case(33, 256, 8, 8, 4, 1, 0, K3K_BF16, false);
  router_case(16, 896, 16, 8, 3, 0, 1, K3K_F32, false);
  router_case(7, 64, 6, 1, 1, 1, 1, K3K_BF16, false); /* the 48B-like quirk */
  combine_case(16, 16, 3584, K3K_BF16);
  combine_case(5, 16, 3584, K3K_F32);
  combine_case(3, 4, 100, K3K_BF16); /* scalar path */
  combine_case(4, 4, 64, K3K_BF16);  /* and its refused call */
  combine_case(2, 20, 3584, K3K_BF16); /* k > 16: two batches of row loads */
}
