/* Reference normalisations: RMSNORM, GATED_RMSNORM (KDA o_norm), L2NORM (KDA q/k) and the block
 * attention-residual depth mix ATTN_RES_MIX. Sums run in fp32 in increasing channel order. */
#include <stdlib.h>

#include "core/k3k_internal.h"

/* RMSNORM, x [R,D], w [D] → y [R,D]:
 *   rstd = 1/sqrt(Σ_d x² / D + eps)
 *   fp32:  y = x·rstd·w          bf16_inner: y = w · bf16(x·rstd)   (§8, gain after downcast) */
int k3k_cpu_rmsnorm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_rmsnorm_params_t *p = params;
  const k3k_tensor_t *X = t[0], *W = t[1], *Y = t[2];
  int64_t R = X->shape[0], D = X->shape[1];
  for (int64_t r = 0; r < R; r++) {
    float ss = 0.0f;
    for (int64_t d = 0; d < D; d++) {
      float x = k3k_ld(X, r * X->stride[0] + d);
      ss += x * x;
    }
    float rstd = 1.0f / sqrtf(ss / (float)D + p->eps);
    for (int64_t d = 0; d < D; d++) {
      float xn = k3k_ld(X, r * X->stride[0] + d) * rstd;
      if (p->bf16_inner) xn = k3_round_bf16(xn);
      k3k_st(Y, r * Y->stride[0] + d, xn * k3k_ld(W, d * W->stride[0]));
    }
  }
  return 0;
}

/* GATED_RMSNORM (§3.7), x,z [R,NH*Dh], w [Dh] → y: per head h,
 *   rstd = 1/sqrt(Σ_d x[h,d]²/Dh + eps);  y = x·rstd·w[d]·sigmoid(z)   (all fp32). */
int k3k_cpu_gated_rmsnorm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_gated_rmsnorm_params_t *p = params;
  const k3k_tensor_t *X = t[0], *Z = t[1], *W = t[2], *Y = t[3];
  int64_t R = X->shape[0], Dh = p->head_dim, NH = X->shape[1] / Dh;
  for (int64_t r = 0; r < R; r++)
    for (int64_t h = 0; h < NH; h++) {
      int64_t c0 = h * Dh;
      float ss = 0.0f;
      for (int64_t d = 0; d < Dh; d++) {
        float x = k3k_ld(X, r * X->stride[0] + c0 + d);
        ss += x * x;
      }
      float rstd = 1.0f / sqrtf(ss / (float)Dh + p->eps);
      for (int64_t d = 0; d < Dh; d++) {
        float x = k3k_ld(X, r * X->stride[0] + c0 + d);
        float z = k3k_ld(Z, r * Z->stride[0] + c0 + d);
        float w = k3k_ld(W, d * W->stride[0]);
        k3k_st(Y, r * Y->stride[0] + c0 + d, x * rstd * w * k3k_sigmoidf(z));
      }
    }
  return 0;
}

/* L2NORM (§3.3), x [R,NH*Dh] → y: per head, y = x / sqrt(Σ_d x² + eps) · scale. */
int k3k_cpu_l2norm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_l2norm_params_t *p = params;
  const k3k_tensor_t *X = t[0], *Y = t[1];
  int64_t R = X->shape[0], Dh = p->head_dim, NH = X->shape[1] / Dh;
  for (int64_t r = 0; r < R; r++)
    for (int64_t h = 0; h < NH; h++) {
      float ss = 0.0f;
      for (int64_t d = 0; d < Dh; d++) {
        float x = k3k_ld(X, r * X->stride[0] + h * Dh + d);
        ss += x * x;
      }
      float rn = 1.0f / sqrtf(ss + p->eps);
      for (int64_t d = 0; d < Dh; d++)
        k3k_st(Y, r * Y->stride[0] + h * Dh + d,
               k3k_ld(X, r * X->stride[0] + h * Dh + d) * rn * p->scale);
    }
  return 0;
}

/* ATTN_RES_MIX (§2.2), snaps [nb,T,D], p [T,D], w_norm [D], w_proj [D] → y [T,D]. Per token:
 *   v_j = snaps[j] (j < nb), v_nb = p;   r_j = 1/sqrt(Σ v_j²/D + eps)
 *   s_j = Σ_d v_j[d]·r_j·w_norm[d]·w_proj[d]   (product evaluated left to right)
 *   α = softmax(s) (max-subtracted);  y = Σ_j α_j·v_j  (summed in j order). */
int k3k_cpu_attn_res_mix(const void *params, const k3k_tensor_t *const *t) {
  const k3k_attn_res_params_t *p = params;
  const k3k_tensor_t *Sn = t[0], *P = t[1], *Wn = t[2], *Wp = t[3], *Y = t[4];
  int64_t nb = Sn->shape[0], T = P->shape[0], D = P->shape[1], nv = nb + 1;
  float *s = malloc((size_t)nv * sizeof *s);
  if (!s) return K3_ENOMEM;
  for (int64_t tk = 0; tk < T; tk++) {
    float smax = -INFINITY;
    for (int64_t j = 0; j < nv; j++) {
      const k3k_tensor_t *V = j < nb ? Sn : P;
      int64_t base = j < nb ? j * Sn->stride[0] + tk * Sn->stride[1] : tk * P->stride[0];
      float ss = 0.0f;
      for (int64_t d = 0; d < D; d++) {
        float v = k3k_ld(V, base + d);
        ss += v * v;
      }
      float r = 1.0f / sqrtf(ss / (float)D + p->eps);
      float acc = 0.0f;
      for (int64_t d = 0; d < D; d++)
        acc += k3k_ld(V, base + d) * r * k3k_ld(Wn, d * Wn->stride[0]) * k3k_ld(Wp, d * Wp->stride[0]);
      s[j] = acc;
      if (acc > smax) smax = acc;
    }
    float z = 0.0f;
    for (int64_t j = 0; j < nv; j++) {
      s[j] = expf(s[j] - smax);
      z += s[j];
    }
    for (int64_t j = 0; j < nv; j++) s[j] /= z;
    for (int64_t d = 0; d < D; d++) {
      float acc = 0.0f;
      for (int64_t j = 0; j < nv; j++) {
        float v = j < nb ? k3k_ld(Sn, j * Sn->stride[0] + tk * Sn->stride[1] + d)
                         : k3k_ld(P, tk * P->stride[0] + d);
        acc += s[j] * v;
      }
      k3k_st(Y, tk * Y->stride[0] + d, acc);
    }
  }
  free(s);
  return 0;
}
