/* Reference sampling (SAMPLE) and its counter-based RNG. The algorithm is specified in k3k.h;
 * the token is a pure function of (logits, config, seed, step) so a prefill worker (step 0) and
 * a decode worker (steps 1..n) reproduce a monolithic run bit for bit. */
#include <math.h>
#include <stdlib.h>

#include "core/k3k_internal.h"

static uint64_t sm64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float k3k_rng_uniform(uint64_t seed, uint64_t step) {
  uint64_t x = sm64(seed ^ sm64(step));
  return (float)(x >> 40) * 0x1p-24f;
}

typedef struct {
  float z;
  int32_t i;
} cand_t;

/* z descending, index ascending: a total order, so qsort's instability does not matter. */
static int cand_cmp(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->z != y->z) return x->z > y->z ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

static inline float clean(float v) { return isnan(v) ? -INFINITY : v; }

int k3k_sample_row(const float *logits, int64_t V, const k3k_sample_cfg_t *cfg, int32_t *out) {
  if (!logits || !cfg || !out || V <= 0 || V > INT32_MAX) return K3_EINVAL;
  if (cfg->temperature <= 0.0f || cfg->top_k == 1) {
    int64_t b = 0;
    for (int64_t i = 1; i < V; i++)
      if (clean(logits[i]) > clean(logits[b])) b = i;
    *out = (int32_t)b;
    return 0;
  }
  cand_t *c = malloc((size_t)V * sizeof *c);
  if (!c) return K3_ENOMEM;
  for (int64_t i = 0; i < V; i++) c[i] = (cand_t){clean(logits[i]) / cfg->temperature, (int32_t)i};
  qsort(c, (size_t)V, sizeof *c, cand_cmp);
  int64_t n = (cfg->top_k > 0 && cfg->top_k < V) ? cfg->top_k : V;
  /* p_i = exp(z_i − z_max) in place of z (fp32); the max is c[0].z. A −inf max (all logits
   * −inf or NaN) degenerates to the first candidate. */
  float zmax = c[0].z, Z = 0.0f;
  if (zmax == -INFINITY) {
    *out = c[0].i;
    free(c);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) {
    c[i].z = expf(c[i].z - zmax);
    Z += c[i].z;
  }
  if (cfg->top_p > 0.0f && cfg->top_p < 1.0f) {
    float lim = cfg->top_p * Z, run = 0.0f;
    int64_t m = 0;
    while (m < n) {
      run += c[m].z;
      m++;
      if (run >= lim) break;
    }
    n = m;
    Z = run;
  }
  float target = k3k_rng_uniform(cfg->seed, cfg->step) * Z, run = 0.0f;
  int32_t pick = c[n - 1].i;
  for (int64_t i = 0; i < n; i++) {
    run += c[i].z;
    if (run > target) {
      pick = c[i].i;
      break;
    }
  }
  *out = pick;
  free(c);
  return 0;
}

/* SAMPLE: logits [N,V] → ids [N], row r with params.rows[r]. */
int k3k_cpu_sample(const void *params, const k3k_tensor_t *const *t) {
  const k3k_sample_params_t *p = params;
  const k3k_tensor_t *L = t[0], *Ids = t[1];
  int64_t N = L->shape[0], V = L->shape[1];
  float *row = malloc((size_t)V * sizeof *row);
  int32_t *ids = malloc((size_t)(N ? N : 1) * sizeof *ids);
  int rc = (row && ids) ? 0 : K3_ENOMEM;
  for (int64_t r = 0; r < N && !rc; r++) {
    for (int64_t i = 0; i < V; i++) row[i] = k3k_ld(L, r * L->stride[0] + i);
    rc = k3k_sample_row(row, V, &p->rows[r], &ids[r]);
  }
  /* Written only when every row succeeded ("on error nothing changed"). */
  for (int64_t r = 0; r < N && !rc; r++) ((int32_t *)Ids->data)[r * Ids->stride[0]] = ids[r];
  free(row);
  free(ids);
  return rc;
}

double k3k_logprob_row(const float *logits, int64_t V, int32_t tok) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
  double s = 0;
  for (int64_t i = 0; i < V; i++) s += exp((double)logits[i] - mx);
  return (double)logits[tok] - mx - log(s);
}
