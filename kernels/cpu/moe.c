/* Reference row gather (embedding), the sigmoid noaux_tc router (spec §5.3, 48B §5.3) and the
 * MoE combine. Router selection is deterministic: scores descending, ties to the lower expert
 * (or group) index — torch.topk leaves tie order undefined, so exact-parity tests avoid ties. */
#include <stdlib.h>

#include "core/k3k_internal.h"

/* GET_ROWS: table [V,D], ids [T] → y[t] = table[ids[t]]; every id checked before any write. */
int k3k_cpu_get_rows(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *Tb = t[0], *Id = t[1], *Y = t[2];
  int64_t T = Id->shape[0], V = Tb->shape[0], D = Tb->shape[1];
  for (int64_t i = 0; i < T; i++) {
    int32_t id = k3k_ldi(Id, i * Id->stride[0]);
    if (id < 0 || id >= V) return K3_ERANGE;
  }
  for (int64_t i = 0; i < T; i++) {
    int64_t id = k3k_ldi(Id, i * Id->stride[0]);
    for (int64_t d = 0; d < D; d++)
      k3k_st(Y, i * Y->stride[0] + d, k3k_ld(Tb, id * Tb->stride[0] + d));
  }
  return 0;
}

/* Index of the best `score` among entries with ok[i], ties → lower index; −1 when none. */
static int64_t best(const float *score, const unsigned char *ok, int64_t n) {
  int64_t b = -1;
  for (int64_t i = 0; i < n; i++)
    if (ok[i] && (b < 0 || score[i] > score[b])) b = i;
  return b;
}

/* ROUTER: logits F32 [T,E], bias [E] → idx [T,k], w [T,k]. Per token:
 *   s = sigmoid(logit); sc = s + bias
 *   groups > 1: gscore[g] = top1 + top2 of sc in group g; keep the topk_group best groups
 *   idx = k times: best kept sc not yet taken (ties → lower index)
 *   w = (biased ? sc : s)[idx];  renormalize: w /= Σw + 1e-20 (Σ in idx order);  w *= scaling */
int k3k_cpu_router(const void *params, const k3k_tensor_t *const *t) {
  const k3k_router_params_t *p = params;
  const k3k_tensor_t *Lg = t[0], *Bs = t[1], *Ix = t[2], *Wt = t[3];
  int64_t T = Lg->shape[0], E = Lg->shape[1], G = p->n_groups, gs = E / G, k = p->top_k;
  float *s = malloc((size_t)(2 * E + G) * sizeof *s);
  unsigned char *ok = malloc((size_t)(E + G));
  if (!s || !ok) {
    free(s);
    free(ok);
    return K3_ENOMEM;
  }
  float *sc = s + E, *gsc = sc + E;
  unsigned char *gok = ok + E;
  for (int64_t tk = 0; tk < T; tk++) {
    for (int64_t e = 0; e < E; e++) {
      s[e] = k3k_sigmoidf(k3k_ld(Lg, tk * Lg->stride[0] + e));
      sc[e] = s[e] + k3k_ld(Bs, e * Bs->stride[0]);
      ok[e] = 1;
    }
    if (G > 1) {
      for (int64_t g = 0; g < G; g++) {
        int64_t b1 = best(sc + g * gs, ok + g * gs, gs);
        ok[g * gs + b1] = 0;
        int64_t b2 = best(sc + g * gs, ok + g * gs, gs);
        ok[g * gs + b1] = 1;
        gsc[g] = sc[g * gs + b1] + sc[g * gs + b2];
        gok[g] = 1;
      }
      unsigned char *keep = calloc((size_t)G, 1);
      if (!keep) {
        free(s);
        free(ok);
        return K3_ENOMEM;
      }
      for (int64_t j = 0; j < p->topk_group; j++) {
        int64_t g = best(gsc, gok, G);
        gok[g] = 0;
        keep[g] = 1;
      }
      for (int64_t e = 0; e < E; e++) ok[e] = keep[e / gs];
      free(keep);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
      int64_t e = best(sc, ok, E);
      ok[e] = 0;
      float w = p->use_biased_weights ? sc[e] : s[e];
      ((int32_t *)Ix->data)[tk * Ix->stride[0] + j] = (int32_t)e;
      ((float *)Wt->data)[tk * Wt->stride[0] + j] = w;
      sum += w;
    }
    for (int64_t j = 0; j < k; j++) {
      float *w = (float *)Wt->data + tk * Wt->stride[0] + j;
      if (p->renormalize) *w = *w / (sum + 1e-20f);
      *w *= p->scaling;
    }
  }
  free(s);
  free(ok);
  return 0;
}

/* MOE_COMBINE: rows [Rx,D], row_idx [T,k], w [T,k] → y[t] = Σ_i w[t][i]·rows[row_idx[t][i]]
 * (fp32, i ascending; row_idx −1 skips). */
int k3k_cpu_moe_combine(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *R = t[0], *RI = t[1], *Wt = t[2], *Y = t[3];
  int64_t T = RI->shape[0], k = RI->shape[1], D = R->shape[1];
  for (int64_t tk = 0; tk < T; tk++)
    for (int64_t i = 0; i < k; i++) {
      int32_t r = k3k_ldi(RI, k3k_off2(RI, tk, i));
      if (r < -1 || r >= R->shape[0]) return K3_ERANGE;
    }
  for (int64_t tk = 0; tk < T; tk++)
    for (int64_t d = 0; d < D; d++) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; i++) {
        int32_t r = k3k_ldi(RI, k3k_off2(RI, tk, i));
        if (r < 0) continue;
        acc += ((const float *)Wt->data)[k3k_off2(Wt, tk, i)] * k3k_ld(R, r * R->stride[0] + d);
      }
      k3k_st(Y, tk * Y->stride[0] + d, acc);
    }
  return 0;
}
