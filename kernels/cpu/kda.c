/* Reference Kimi Delta Attention: the decay gate (K3 lower-bound and 48B softplus forms), the
 * chunked prefill in the WY/UT form of spec §3.8, and the recurrent step of §3.6.
 * State layout is V-FIRST: pool[slot][h][v][k] holds S[h][k][v] (fp32). q arrives L2-normed and
 * is multiplied by `scale` on load; everything inside is fp32. The chunk grid restarts at every
 * sequence start, so prefill(T) == prefill(T−64j) then continuing with the carried state. */
#include <stdlib.h>
#include <string.h>

#include "core/k3k_internal.h"

/* KDA_GATE, g_raw [T,NH*Dh], A_log [≥NH], dt_bias [NH*Dh] → g F32 [T,NH*Dh]:
 *   a = g_raw + dt_bias
 *   LOWER_BOUND: g = lb·sigmoid(exp(A_log[h])·a)          ∈ (lb, 0)
 *   SOFTPLUS:    g = −exp(A_log[h])·(a > 20 ? a : log1p(exp(a)))                         */
int k3k_cpu_kda_gate(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_gate_params_t *p = params;
  const k3k_tensor_t *Gr = t[0], *Al = t[1], *Db = t[2], *G = t[3];
  int64_t T = Gr->shape[0], C = Gr->shape[1], Dh = p->head_dim;
  for (int64_t r = 0; r < T; r++)
    for (int64_t c = 0; c < C; c++) {
      float A = expf(k3k_ld(Al, (c / Dh) * Al->stride[0]));
      float a = k3k_ld(Gr, r * Gr->stride[0] + c) + k3k_ld(Db, c * Db->stride[0]);
      float g;
      if (p->form == K3K_GATE_LOWER_BOUND)
        g = p->lower_bound * k3k_sigmoidf(A * a);
      else
        g = -A * (a > 20.0f ? a : log1pf(expf(a)));
      k3k_st(G, r * G->stride[0] + c, g);
    }
  return 0;
}

static float q_scale(const k3k_kda_params_t *p, int64_t Dk) {
  return p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)Dk);
}
static int32_t chunk_len(const k3k_kda_params_t *p) { return p->chunk ? p->chunk : 64; }

size_t k3k_cpu_kda_chunk_scratch_floats(const k3k_tensor_t *const *t, const k3k_kda_params_t *p) {
  size_t C = (size_t)chunk_len(p), Dk = (size_t)(t[0]->shape[1] / p->n_heads),
         Dv = (size_t)(t[2]->shape[1] / p->n_heads);
  /* q, k, G, W, e^G, e^{G_last−G}: C×Dk each; v, U, Vn: C×Dv each; L, X, Aqk: C×C each;
   * beta: C; one spare row. */
  return 6 * C * Dk + 3 * C * Dv + 3 * C * C + C + Dv;
}

/* One sequence, heads [h0,h1). Equations (rows r, s of one chunk, n ≤ chunk rows):
 *   G_r = Σ_{i≤r} g_i;  L[r][s] = β_r Σ_d k_r k_s e^{G_r−G_s} (s<r);  X = (I+L)^{-1} by forward
 *   substitution;  T = X·diag(β);  W = T·(e^G ⊙ k);  U = T·v;
 *   Aqk[r][s] = Σ_d q_r k_s e^{G_r−G_s} (s≤r);  Vn = U − W·S;  O = (q ⊙ e^G)·S + Aqk·Vn;
 *   S ← diag(e^{G_{n−1}})·S + (e^{G_{n−1}−G} ⊙ k)ᵀ·Vn.                                          */
int k3k_cpu_kda_chunk_seq(const k3k_kda_params_t *p, const k3k_tensor_t *const *t, int32_t seq,
                          int32_t h0, int32_t h1, float *scratch) {
  const k3k_tensor_t *Q = t[0], *K = t[1], *V = t[2], *Gt = t[3], *B = t[4], *cu = t[5],
                     *sl = t[6], *St = t[7], *O = t[8];
  const int64_t H = p->n_heads, Dk = Q->shape[1] / H, Dv = V->shape[1] / H, CH = chunk_len(p);
  const float scale = q_scale(p, Dk);
  int64_t start = k3k_ldi(cu, seq * cu->stride[0]), end = k3k_ldi(cu, (seq + 1) * cu->stride[0]);
  int64_t slot = k3k_ldi(sl, seq * sl->stride[0]);
  if (end == start) return 0;
  float *q = scratch, *k = q + CH * Dk, *G = k + CH * Dk, *Wm = G + CH * Dk, *v = Wm + CH * Dk,
        *U = v + CH * Dv, *Vn = U + CH * Dv, *L = Vn + CH * Dv, *X = L + CH * CH, *A = X + CH * CH,
        *beta = A + CH * CH, *eG = beta + CH, *eGl = eG + CH * Dk;
  for (int64_t h = h0; h < h1; h++) {
    float *S = (float *)St->data + (slot * H + h) * Dv * Dk; /* S[k][v] = S[v*Dk + k] */
    if (!p->read_state) memset(S, 0, (size_t)(Dv * Dk) * sizeof *S);
    for (int64_t cs = start; cs < end; cs += CH) {
      int64_t n = end - cs < CH ? end - cs : CH;
      for (int64_t r = 0; r < n; r++) {
        int64_t row = cs + r;
        for (int64_t d = 0; d < Dk; d++) {
          q[r * Dk + d] = k3k_ld(Q, row * Q->stride[0] + h * Dk + d) * scale;
          k[r * Dk + d] = k3k_ld(K, row * K->stride[0] + h * Dk + d);
          float g = k3k_ld(Gt, row * Gt->stride[0] + h * Dk + d);
          G[r * Dk + d] = r ? G[(r - 1) * Dk + d] + g : g;
        }
        for (int64_t e = 0; e < Dv; e++) v[r * Dv + e] = k3k_ld(V, row * V->stride[0] + h * Dv + e);
        beta[r] = k3k_ld(B, row * B->stride[0] + h);
      }
      /* e^{G_r} and e^{G_{n−1} − G_r}: exponents ≤ 0, computed once per chunk. */
      for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < Dk; d++) {
          eG[r * Dk + d] = expf(G[r * Dk + d]);
          eGl[r * Dk + d] = expf(G[(n - 1) * Dk + d] - G[r * Dk + d]);
        }
      /* L (strictly lower) and Aqk (lower incl. diagonal); exp of G differences only, s ≤ r. */
      for (int64_t r = 0; r < n; r++)
        for (int64_t s = 0; s <= r; s++) {
          float lk = 0.0f, aq = 0.0f;
          for (int64_t d = 0; d < Dk; d++) {
            float e = expf(G[r * Dk + d] - G[s * Dk + d]);
            lk += k[r * Dk + d] * k[s * Dk + d] * e;
            aq += q[r * Dk + d] * k[s * Dk + d] * e;
          }
          L[r * CH + s] = s < r ? beta[r] * lk : 0.0f;
          A[r * CH + s] = aq;
        }
      /* X = (I + L)^{-1}, unit lower triangular: X[r][s] = −Σ_{m=s}^{r−1} L[r][m]·X[m][s]. */
      for (int64_t r = 0; r < n; r++) {
        X[r * CH + r] = 1.0f;
        for (int64_t s = 0; s < r; s++) {
          float acc = 0.0f;
          for (int64_t m = s; m < r; m++) acc += L[r * CH + m] * X[m * CH + s];
          X[r * CH + s] = -acc;
        }
      }
      /* T[r][s] = X[r][s]·β_s (kept in X). W = T·(e^G ⊙ k), U = T·v. */
      for (int64_t r = 0; r < n; r++)
        for (int64_t s = 0; s <= r; s++) X[r * CH + s] *= beta[s];
      for (int64_t r = 0; r < n; r++) {
        for (int64_t d = 0; d < Dk; d++) {
          float acc = 0.0f;
          for (int64_t s = 0; s <= r; s++) acc += X[r * CH + s] * eG[s * Dk + d] * k[s * Dk + d];
          Wm[r * Dk + d] = acc;
        }
        for (int64_t e = 0; e < Dv; e++) {
          float acc = 0.0f;
          for (int64_t s = 0; s <= r; s++) acc += X[r * CH + s] * v[s * Dv + e];
          U[r * Dv + e] = acc;
        }
      }
      /* Vn = U − W·S;  O = (q ⊙ e^G)·S + Aqk·Vn. */
      for (int64_t r = 0; r < n; r++)
        for (int64_t e = 0; e < Dv; e++) {
          float acc = 0.0f;
          for (int64_t d = 0; d < Dk; d++) acc += Wm[r * Dk + d] * S[e * Dk + d];
          Vn[r * Dv + e] = U[r * Dv + e] - acc;
        }
      for (int64_t r = 0; r < n; r++)
        for (int64_t e = 0; e < Dv; e++) {
          float acc = 0.0f;
          for (int64_t d = 0; d < Dk; d++) acc += q[r * Dk + d] * eG[r * Dk + d] * S[e * Dk + d];
          for (int64_t s = 0; s <= r; s++) acc += A[r * CH + s] * Vn[s * Dv + e];
          k3k_st(O, (cs + r) * O->stride[0] + h * Dv + e, acc);
        }
      /* S ← diag(e^{G_{n−1}})·S + (e^{G_{n−1}−G} ⊙ k)ᵀ·Vn. */
      for (int64_t e = 0; e < Dv; e++)
        for (int64_t d = 0; d < Dk; d++) {
          float acc = eG[(n - 1) * Dk + d] * S[e * Dk + d];
          for (int64_t r = 0; r < n; r++) acc += eGl[r * Dk + d] * k[r * Dk + d] * Vn[r * Dv + e];
          S[e * Dk + d] = acc;
        }
    }
  }
  return 0;
}

int k3k_cpu_kda_chunk(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = params;
  int rc;
  if ((rc = k3k_cpu_check_seqs(t[5], p->n_seqs, t[0]->shape[0], "cu_seqlens")) ||
      (rc = k3k_cpu_check_slots(t[6], p->n_seqs, t[7]->shape[0])))
    return rc;
  float *scratch = malloc(k3k_cpu_kda_chunk_scratch_floats(t, p) * sizeof(float));
  if (!scratch) return K3_ENOMEM;
  for (int32_t i = 0; i < p->n_seqs && !rc; i++)
    rc = k3k_cpu_kda_chunk_seq(p, t, i, 0, p->n_heads, scratch);
  free(scratch);
  return rc;
}

/* KDA_STEP (§3.6), per sequence i and head h with S = the slot's state:
 *   S[k][v] *= e^{g[k]};  u[v] = v[v] − Σ_k S[k][v]·k[k];  S[k][v] += β·k[k]·u[v];
 *   o[v] = Σ_k S[k][v]·q[k]·scale                     (with the updated S). */
void k3k_cpu_kda_step_head(const k3k_kda_params_t *p, const k3k_tensor_t *const *t, int32_t i,
                           int32_t h) {
  const k3k_tensor_t *Q = t[0], *K = t[1], *V = t[2], *Gt = t[3], *B = t[4], *sl = t[5],
                     *St = t[6], *O = t[7];
  const int64_t H = p->n_heads, Dk = Q->shape[1] / H, Dv = V->shape[1] / H;
  const float scale = q_scale(p, Dk);
  int64_t slot = k3k_ldi(sl, i * sl->stride[0]);
  float *S = (float *)St->data + (slot * H + h) * Dv * Dk;
  if (!p->read_state) memset(S, 0, (size_t)(Dv * Dk) * sizeof *S);
  int64_t qo = i * Q->stride[0] + h * Dk, ko = i * K->stride[0] + h * Dk,
          go = i * Gt->stride[0] + h * Dk;
  float b = k3k_ld(B, i * B->stride[0] + h);
  for (int64_t e = 0; e < Dv; e++) {
    float *Se = S + e * Dk; /* row v = e of the V-first state: S[k][e] for all k */
    float dot = 0.0f;
    for (int64_t d = 0; d < Dk; d++) {
      Se[d] *= expf(k3k_ld(Gt, go + d));
      dot += Se[d] * k3k_ld(K, ko + d);
    }
    float u = k3k_ld(V, i * V->stride[0] + h * Dv + e) - dot;
    float o = 0.0f;
    for (int64_t d = 0; d < Dk; d++) {
      Se[d] += b * k3k_ld(K, ko + d) * u;
      o += Se[d] * (k3k_ld(Q, qo + d) * scale);
    }
    k3k_st(O, i * O->stride[0] + h * Dv + e, o);
  }
}

int k3k_cpu_kda_step(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = params;
  int rc = k3k_cpu_check_slots(t[5], p->n_seqs, t[6]->shape[0]);
  if (rc) return rc;
  for (int32_t i = 0; i < p->n_seqs; i++)
    for (int32_t h = 0; h < p->n_heads; h++) k3k_cpu_kda_step_head(p, t, i, h);
  return 0;
}
