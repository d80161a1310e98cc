/* Cases for the router (flat and grouped, unbiased and biased weights), the MoE plan and
 * combine, and sampling (greedy ties, reproducibility, distribution, top-k/top-p). */
#include <stdlib.h>
#include <string.h>

#include "core/moe_dq_plan.h"
#include "harness.h"

/* Independent router in double: sort by biased score (ties impossible by construction). */
static void router_want(const tt_t *lg, const tt_t *bias, int64_t T, int64_t E, int k, int G,
                        int tg, int biased, double scaling, int32_t *idx, double *w) {
  for (int64_t t = 0; t < T; t++) {
    double s[256], sc[256];
    int keep[256];
    for (int64_t e = 0; e < E; e++) {
      s[e] = sigm(tt_get(lg, t * E + e));
      sc[e] = s[e] + tt_get(bias, e);
      keep[e] = 1;
    }
    if (G > 1) {
      int64_t gs = E / G;
      double gsc[64];
      int gk[64] = {0};
      for (int g = 0; g < G; g++) {
        double a = -1e300, b = -1e300;
        for (int64_t e = g * gs; e < (g + 1) * gs; e++) {
          if (sc[e] > a) {
            b = a;
            a = sc[e];
          } else if (sc[e] > b) {
            b = sc[e];
          }
        }
        gsc[g] = a + b;
      }
      for (int j = 0; j < tg; j++) {
        int bg = -1;
        for (int g = 0; g < G; g++)
          if (!gk[g] && (bg < 0 || gsc[g] > gsc[bg])) bg = g;
        gk[bg] = 1;
      }
      for (int64_t e = 0; e < E; e++) keep[e] = gk[e / gs];
    }
    double sum = 0;
    for (int j = 0; j < k; j++) {
      int64_t be = -1;
      for (int64_t e = 0; e < E; e++)
        if (keep[e] && (be < 0 || sc[e] > sc[be])) be = e;
      keep[be] = 0;
      idx[t * k + j] = (int32_t)be;
      w[t * k + j] = biased ? sc[be] : s[be];
      sum += w[t * k + j];
    }
    for (int j = 0; j < k; j++) w[t * k + j] = w[t * k + j] / (sum + 1e-20) * scaling;
  }
}

static void router_case(const char *name, int64_t T, int64_t E, int k, int G, int tg, int biased,
                        double scaling) {
  tt_t s[4] = {tt_2d(K3K_F32, T, E, 0), tt_1d(K3K_BF16, E), tt_2d(K3K_I32, T, k, 0),
               tt_2d(K3K_F32, T, k, 0)};
  /* Well separated scores: logits are a random permutation of a spaced grid (no near-ties
   * after the bias, which is small against the spacing). */
  for (int64_t t = 0; t < T; t++) {
    int64_t perm[256];
    for (int64_t e = 0; e < E; e++) perm[e] = e;
    for (int64_t e = E - 1; e > 0; e--) {
      int64_t j = rng_u32() % (e + 1), tmp = perm[e];
      perm[e] = perm[j];
      perm[j] = tmp;
    }
    for (int64_t e = 0; e < E; e++) tt_set(&s[0], t * E + e, -3.0 + 6.0 * (double)perm[e] / (double)E);
  }
  for (int64_t e = 0; e < E; e++) tt_set(&s[1], e, rng_uniform(-0.5, 0.5) / (double)E);
  int32_t *idx = malloc((size_t)(T * k) * sizeof *idx);
  double *wi = tt_expect(&s[2], 0, 0), *ww = tt_expect(&s[3], 1e-7, 1e-5);
  router_want(&s[0], &s[1], T, E, k, G, tg, biased, scaling, idx, ww);
  for (int64_t i = 0; i < T * k; i++) wi[i] = idx[i];
  k3k_router_params_t p = {.top_k = k, .n_groups = G, .topk_group = tg, .renormalize = 1,
                           .use_biased_weights = biased, .scaling = (float)scaling};
  run_case(name, K3K_OP_ROUTER, &p, s, 4, 0);
  free(idx);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

/* Grouped selection must actually differ from flat selection somewhere: construct a token where
 * the flat top-k spans three groups but only two groups may be kept. */
static void router_grouped_effect(void) {
  int64_t E = 8;
  tt_t s[4] = {tt_2d(K3K_F32, 1, E, 0), tt_1d(K3K_F32, E), tt_2d(K3K_I32, 1, 2, 0),
               tt_2d(K3K_F32, 1, 2, 0)};
  /* groups of 2: {0,1} {2,3} {4,5} {6,7}. Expert 0 is the single best but its partner is poor;
   * groups {2,3} and {4,5} have the best pair sums. */
  double lg[8] = {3.0, -3.0, 1.0, 0.9, 0.8, 0.7, -2.0, -2.5};
  for (int e = 0; e < 8; e++) tt_set(&s[0], e, lg[e]);
  double *wi = tt_expect(&s[2], 0, 0);
  tt_expect(&s[3], 1, 1); /* weights checked by the other cases */
  wi[0] = 2;
  wi[1] = 3;
  k3k_router_params_t p = {.top_k = 2, .n_groups = 4, .topk_group = 2, .renormalize = 1, .scaling = 1};
  run_case("router grouped excludes the flat best", K3K_OP_ROUTER, &p, s, 4, 0);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

static void t_moe(void) {
  int32_t T = 5, k = 3, E = 7, D = 11;
  int32_t idx[15], off[8], tok[15], ri[15];
  for (int i = 0; i < T * k; i++) idx[i] = (int32_t)(rng_u32() % E);
  check(k3k_moe_plan(idx, T, k, E, off, tok, ri) == 0, "moe_plan ok");
  bool ok = off[0] == 0 && off[E] == T * k;
  for (int r = 0; r < T * k; r++) {
    int32_t row = ri[r];
    ok &= row >= off[idx[r]] && row < off[idx[r] + 1] && tok[row] == r / k;
  }
  for (int e = 0; e < E; e++)
    for (int32_t row = off[e] + 1; row < off[e + 1]; row++) ok &= tok[row - 1] <= tok[row];
  check(ok, "moe_plan groups rows by expert, tokens ascending");
  idx[4] = E;
  check(k3k_moe_plan(idx, T, k, E, off, tok, ri) == K3_ERANGE, "moe_plan rejects bad expert");

  tt_t s[4] = {tt_2d(K3K_BF16, T * k, D, 0), tt_2d(K3K_I32, T, k, 0), tt_2d(K3K_F32, T, k, 0),
               tt_2d(K3K_BF16, T, D, 0)};
  tt_rand(&s[0], -2, 2);
  tt_rand(&s[2], 0, 1);
  for (int r = 0; r < T * k; r++) tt_seti(&s[1], r, ri[r]);
  tt_seti(&s[1], 7, -1); /* a skipped choice */
  double *w = tt_expect(&s[3], 1e-6, 8e-3);
  for (int t = 0; t < T; t++)
    for (int d = 0; d < D; d++) {
      double acc = 0;
      for (int i = 0; i < k; i++) {
        int32_t row = tt_geti(&s[1], t * k + i);
        if (row >= 0) acc += tt_get(&s[2], t * k + i) * tt_get(&s[0], row * D + d);
      }
      w[t * D + d] = rbf(acc);
    }
  run_case("moe_combine", K3K_OP_MOE_COMBINE, NULL, s, 4, 0);
  tt_seti(&s[1], 2, T * k);
  run_case("moe_combine bad row", K3K_OP_MOE_COMBINE, NULL, s, 4, K3_ERANGE);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);
}

static int sample1(const float *lg, int64_t V, k3k_sample_cfg_t c) {
  int32_t id = -1;
  k3k_sample_row(lg, V, &c, &id);
  return id;
}

static void t_sample(void) {
  /* Greedy: ties resolve to the lowest index, on every backend, as a batch. */
  int64_t N = 3, V = 50;
  tt_t s[2] = {tt_2d(K3K_BF16, N, V, 0), tt_1d(K3K_I32, N)};
  tt_rand(&s[0], -5, 5);
  tt_set(&s[0], 0 * V + 17, 9.0);
  tt_set(&s[0], 0 * V + 33, 9.0);
  tt_set(&s[0], 1 * V + 4, 7.5);
  tt_set(&s[0], 2 * V + 49, 8.0);
  double *w = tt_expect(&s[1], 0, 0);
  w[0] = 17, w[1] = 4, w[2] = 49;
  k3k_sample_cfg_t rows[3] = {{.temperature = 0}, {.temperature = 0.7f, .top_k = 1}, {.temperature = 0}};
  k3k_sample_params_t p = {.n_rows = 3, .rows = rows};
  run_case("sample greedy", K3K_OP_SAMPLE, &p, s, 2, 0);

  /* Stochastic rows: the op must equal k3k_sample_row (pure function) on every backend, and a
   * row's token must not depend on its batch position. */
  for (int r = 0; r < 3; r++)
    rows[r] = (k3k_sample_cfg_t){.temperature = 0.9f, .top_k = r == 1 ? 10 : 0,
                                 .top_p = r == 2 ? 0.8f : 1.0f, .seed = 1234, .step = (uint64_t)r + 5};
  w = tt_expect(&s[1], 0, 0);
  float row[50];
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < V; i++) row[i] = (float)tt_get(&s[0], r * V + i);
    w[r] = sample1(row, V, rows[r]);
  }
  run_case("sample temperature/top-k/top-p", K3K_OP_SAMPLE, &p, s, 2, 0);
  for (int i = 0; i < 2; i++) tt_free(&s[i]);

  /* Distribution: p = [.1,.2,.3,.4] through logits log p; 4000 steps of one seed. */
  float lg[4];
  for (int i = 0; i < 4; i++) lg[i] = logf(0.1f * (float)(i + 1));
  int cnt[4] = {0}, cnt_k[4] = {0}, cnt_p[4] = {0};
  for (uint64_t st = 0; st < 4000; st++) {
    cnt[sample1(lg, 4, (k3k_sample_cfg_t){.temperature = 1, .seed = 99, .step = st})]++;
    cnt_k[sample1(lg, 4, (k3k_sample_cfg_t){.temperature = 1, .top_k = 2, .seed = 99, .step = st})]++;
    cnt_p[sample1(lg, 4, (k3k_sample_cfg_t){.temperature = 1, .top_p = 0.5f, .seed = 7, .step = st})]++;
  }
  bool ok = true;
  for (int i = 0; i < 4; i++) ok &= fabs(cnt[i] / 4000.0 - 0.1 * (i + 1)) < 0.03;
  check(ok, "sample distribution %d %d %d %d ~ 400 800 1200 1600", cnt[0], cnt[1], cnt[2], cnt[3]);
  check(cnt_k[0] == 0 && cnt_k[1] == 0 && fabs(cnt_k[3] / 4000.0 - 4.0 / 7.0) < 0.03,
        "sample top-k=2 keeps the two best (%d %d %d %d)", cnt_k[0], cnt_k[1], cnt_k[2], cnt_k[3]);
  check(cnt_p[0] == 0 && cnt_p[1] == 0 && cnt_p[2] > 0 && cnt_p[3] > 0,
        "sample top-p=0.5 keeps {0.4, 0.3} (%d %d %d %d)", cnt_p[0], cnt_p[1], cnt_p[2], cnt_p[3]);
  /* Reproducibility and step dependence. */
  float big[1000];
  for (int i = 0; i < 1000; i++) big[i] = (float)rng_uniform(-2, 2);
  k3k_sample_cfg_t c = {.temperature = 1.3f, .top_p = 0.95f, .seed = 42, .step = 3};
  int a = sample1(big, 1000, c), b = sample1(big, 1000, c);
  int differ = 0;
  for (uint64_t st = 0; st < 20; st++) {
    c.step = st;
    differ += sample1(big, 1000, c) != a;
  }
  check(a == b && differ > 10, "sample: same seed+step same token, steps vary (%d/20 differ)", differ);
  check(k3k_rng_uniform(1, 2) == k3k_rng_uniform(1, 2) && k3k_rng_uniform(1, 2) != k3k_rng_uniform(1, 3) &&
            k3k_rng_uniform(5, 0) >= 0.0f && k3k_rng_uniform(5, 0) < 1.0f,
        "rng is a pure function in [0,1)");
}

/* The dequant-once MoE path's host schedule (kernels/core/moe_dq_plan.h) on random plans:
 * every expert with rows once, ordered by rows descending (ties by expert); groups of at most G
 * consecutive items, cut only when full or when the next expert would waste more than an eighth
 * of the cap; a group's cap its first item's rows rounded up to the padding, every member within
 * 7/8 of it; members at base + i · cap, groups back to back from 0, the total within
 * k3k_moe_dq_pad_rows_max. Then every plan row is mapped into the padded space: no padded row
 * is claimed twice and none lies past the total (what makes one batched GEMM per group safe). */
static void t_moe_dq_schedule(void) {
  int bad = 0, cases = 0;
  for (int it = 0; it < 400; it++) {
    const int32_t E = 1 + (int32_t)(rng_u32() % 300), G = 1 + (int32_t)(rng_u32() % 4);
    const int32_t pad = (it & 1) ? 32 : 1 + (int32_t)(rng_u32() % 40);
    int32_t *off = malloc(sizeof(int32_t) * (size_t)(E + 1));
    off[0] = 0;
    const int mode = it % 5; /* dense, many empty, one big, multiples of pad, near-equal */
    for (int32_t e = 0; e < E; e++) {
      int32_t n = (int32_t)(rng_u32() % 200);
      if (mode == 1 && rng_u32() % 3) n = 0;
      if (mode == 2) n = e == E / 2 ? 5000 : (int32_t)(rng_u32() % 3);
      if (mode == 3) n = pad * (int32_t)(rng_u32() % 5);
      if (mode == 4) n = 500 + (int32_t)(rng_u32() % 40);
      off[e + 1] = off[e] + n;
    }
    const int64_t tk = off[E];
    k3k_moe_dq_item *items = malloc(sizeof *items * (size_t)E);
    int64_t prows = -1;
    const int32_t n = k3k_moe_dq_schedule(off, E, G, pad, items, &prows);
    int32_t active = 0;
    for (int32_t e = 0; e < E; e++) active += off[e + 1] > off[e];
    bool ok = n == active && prows >= tk && prows <= k3k_moe_dq_pad_rows_max(tk, E, pad);
    char *seen = calloc((size_t)E, 1);
    int64_t base = 0;
    for (int32_t i = 0, g = 0; ok && i < n; g++) { /* group by group */
      const int64_t cap = items[i].cap;
      int32_t m = 0;
      while (ok && i + m < n && items[i + m].group == g) {
        const k3k_moe_dq_item *x = &items[i + m];
        ok = x->rows > 0 && !seen[x->expert] && x->row0 == off[x->expert] &&
             x->rows == off[x->expert + 1] - off[x->expert] && x->cap == cap &&
             x->prow0 == base + (int64_t)m * cap && x->rows <= cap &&
             (m == 0 ? cap % pad == 0 && cap - x->rows < pad : x->rows * 8 >= cap * 7) &&
             (i + m == 0 || items[i + m - 1].rows > x->rows ||
              (items[i + m - 1].rows == x->rows && items[i + m - 1].expert < x->expert));
        seen[x->expert] = 1;
        m++;
      }
      ok = ok && m >= 1 && m <= G &&
           (i + m == n || items[i + m].group == g + 1) && /* cut only when full or too small */
           (i + m == n || m == G || items[i + m].rows * 8 < cap * 7);
      base += (int64_t)m * cap;
      i += m;
    }
    ok = ok && base == prows;
    char *claimed = calloc((size_t)prows + 1, 1);
    for (int32_t i = 0; ok && i < n; i++)
      for (int64_t r = items[i].row0; ok && r < items[i].row0 + items[i].rows; r++) {
        const int64_t pr = items[i].prow0 + (r - items[i].row0);
        ok = pr >= 0 && pr < prows && !claimed[pr];
        if (ok) claimed[pr] = 1;
      }
    bad += !ok;
    cases++;
    free(claimed);
    free(seen);
    free(items);
    free(off);
  }
  int32_t non_mono[4] = {0, 5, 3, 9};
  k3k_moe_dq_item tmp[3];
  int64_t pr = 0;
  check(bad == 0 && k3k_moe_dq_schedule(non_mono, 3, 2, 16, tmp, &pr) == -1,
        "moe_dq schedule: %d random plans (%d bad): groups by size within 7/8 of their cap, padded "
        "rows disjoint and within the bound; non-monotone offsets refused", cases, bad);
}

void t_route(void) {
  rng_seed(2);
  router_case("router flat k3-like (E=64,k=6)", 5, 64, 6, 1, 1, 0, 1.0);
  router_case("router biased weights, scaling 2.446", 3, 32, 4, 1, 1, 1, 2.446);
  router_case("router grouped (E=48,G=4,keep 2,k=5)", 4, 48, 5, 4, 2, 0, 1.0);
  router_grouped_effect();
  t_moe();
  t_moe_dq_schedule();
  t_sample();
}
