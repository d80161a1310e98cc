/* Reference MLA (spec §4, NoPE): the non-absorbed varlen prefill attention (§4.1), the absorbed
 * decode over a paged latent cache (§4.3), and the cache write/gather ops. One cache row per
 * token is [c_n (kv_lora) | k_rot (d_rope)] = 576 values for K3/48B; the flattened row index is
 * page*page_size + offset ("slot mapping"). All attention math in fp32 with a max-subtracted
 * softmax; the output tensor's dtype is the only rounding point. */
#include <stdlib.h>

#include "core/k3k_internal.h"

static float mla_scale(const k3k_mla_params_t *p) {
  return p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)(p->d_nope + p->d_rope));
}

/* In place: s[0..n) ← softmax(s) (max-subtracted, fp32, normalised before use). */
static void softmax_inplace(float *s, int64_t n) {
  float mx = -INFINITY, z = 0.0f;
  for (int64_t i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
  for (int64_t i = 0; i < n; i++) {
    s[i] = expf(s[i] - mx);
    z += s[i];
  }
  for (int64_t i = 0; i < n; i++) s[i] /= z;
}

int k3k_cpu_check_mla_prefill(const k3k_mla_params_t *p, const k3k_tensor_t *const *t) {
  int rc;
  if ((rc = k3k_cpu_check_seqs(t[3], p->n_seqs, t[0]->shape[0], "cu_q")) ||
      (rc = k3k_cpu_check_seqs(t[4], p->n_seqs, t[1]->shape[0], "cu_k")))
    return rc;
  for (int32_t i = 0; i < p->n_seqs; i++) {
    int64_t lq = k3k_ldi(t[3], (i + 1) * t[3]->stride[0]) - k3k_ldi(t[3], i * t[3]->stride[0]);
    int64_t lk = k3k_ldi(t[4], (i + 1) * t[4]->stride[0]) - k3k_ldi(t[4], i * t[4]->stride[0]);
    if (lk < lq) return K3_EINVAL; /* every query needs its own key */
  }
  return 0;
}

/* MLA_PREFILL for sequence i, head h. Query j of the sequence sees keys 0..Lk−Lq+j:
 *   s_τ = (Σ_{d<Dn} q_nope[d]·k_nope_τ[d] + Σ_{d<Dr} q_rot[d]·k_rot_τ[d])·scale
 *   p = softmax(s);  o[e] = Σ_τ p_τ·v_τ[e]. */
void k3k_cpu_mla_prefill_head(const k3k_mla_params_t *p, const k3k_tensor_t *const *t,
                              int32_t i, int32_t h, float *s) {
  const k3k_tensor_t *Q = t[0], *KV = t[1], *KR = t[2], *cq = t[3], *ck = t[4], *O = t[5];
  const int64_t Dn = p->d_nope, Dr = p->d_rope, Dv = p->d_v, Dq = Dn + Dr, Dkv = Dn + Dv;
  const float scale = mla_scale(p);
  int64_t q0 = k3k_ldi(cq, i * cq->stride[0]), q1 = k3k_ldi(cq, (i + 1) * cq->stride[0]);
  int64_t k0 = k3k_ldi(ck, i * ck->stride[0]), k1 = k3k_ldi(ck, (i + 1) * ck->stride[0]);
  int64_t lq = q1 - q0, lk = k1 - k0;
  for (int64_t j = 0; j < lq; j++) {
    int64_t qo = (q0 + j) * Q->stride[0] + h * Dq, nk = lk - lq + j + 1;
    for (int64_t tau = 0; tau < nk; tau++) {
      int64_t ko = (k0 + tau) * KV->stride[0] + h * Dkv;
      float acc = 0.0f;
      for (int64_t d = 0; d < Dn; d++) acc += k3k_ld(Q, qo + d) * k3k_ld(KV, ko + d);
      for (int64_t d = 0; d < Dr; d++)
        acc += k3k_ld(Q, qo + Dn + d) * k3k_ld(KR, k3k_off2(KR, k0 + tau, d));
      s[tau] = acc * scale;
    }
    softmax_inplace(s, nk);
    for (int64_t e = 0; e < Dv; e++) {
      float acc = 0.0f;
      for (int64_t tau = 0; tau < nk; tau++)
        acc += s[tau] * k3k_ld(KV, (k0 + tau) * KV->stride[0] + h * Dkv + Dn + e);
      k3k_st(O, (q0 + j) * O->stride[0] + h * Dv + e, acc);
    }
  }
}

int k3k_cpu_mla_prefill(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = params;
  int rc = k3k_cpu_check_mla_prefill(p, t);
  if (rc) return rc;
  float *s = malloc((size_t)(t[1]->shape[0] + 1) * sizeof *s);
  if (!s) return K3_ENOMEM;
  for (int32_t i = 0; i < p->n_seqs; i++)
    for (int32_t h = 0; h < p->n_heads; h++) k3k_cpu_mla_prefill_head(p, t, i, h, s);
  free(s);
  return 0;
}

/* seq_lens within the page table's capacity, referenced pages within the pool. */
int k3k_cpu_check_mla_decode(const k3k_mla_params_t *p, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *C = t[2], *PT = t[3], *SL = t[4];
  int64_t ps = C->shape[1], maxp = PT->shape[1];
  for (int32_t i = 0; i < p->n_seqs; i++) {
    int64_t len = k3k_ldi(SL, i * SL->stride[0]);
    if (len < 0 || len > maxp * ps) return K3_ERANGE;
    for (int64_t pg = 0; pg < (len + ps - 1) / ps; pg++) {
      int32_t page = k3k_ldi(PT, k3k_off2(PT, i, pg));
      if (page < 0 || page >= C->shape[0]) return K3_ERANGE;
    }
  }
  return 0;
}

/* MLA_DECODE for sequence i, head h (absorbed, §4.3); scratch: kv_lora + 2·seq_len floats.
 *   q_lat[c] = Σ_{d<Dn} W_UK[d][c]·q_nope[d]
 *   s_τ = (Σ_c q_lat[c]·c_n_τ[c] + Σ_r q_rot[r]·k_rot_τ[r])·scale;  p = softmax(s)
 *   o_lat[c] = Σ_τ p_τ·c_n_τ[c];  o[e] = Σ_c W_UV[e][c]·o_lat[c]. */
void k3k_cpu_mla_decode_head(const k3k_mla_params_t *p, const k3k_tensor_t *const *t,
                             int32_t i, int32_t h, float *scratch) {
  const k3k_tensor_t *Q = t[0], *Wk = t[1], *C = t[2], *PT = t[3], *SL = t[4], *O = t[5];
  const int64_t Dn = p->d_nope, Dr = p->d_rope, Dv = p->d_v, Dq = Dn + Dr, Dkv = Dn + Dv,
                c = p->kv_lora, ps = C->shape[1], row = c + Dr;
  const float scale = mla_scale(p);
  int64_t len = k3k_ldi(SL, i * SL->stride[0]), qo = i * Q->stride[0] + h * Dq;
  float *qlat = scratch, *olat = qlat + c, *s = olat + c;
  for (int64_t e = 0; e < Dv; e++) {
    if (len == 0) k3k_st(O, i * O->stride[0] + h * Dv + e, 0.0f);
  }
  if (len == 0) return;
  for (int64_t cc = 0; cc < c; cc++) {
    float acc = 0.0f;
    for (int64_t d = 0; d < Dn; d++) acc += k3k_ld(Wk, k3k_off2(Wk, h * Dkv + d, cc)) * k3k_ld(Q, qo + d);
    qlat[cc] = acc;
  }
  for (int64_t tau = 0; tau < len; tau++) {
    int64_t base = ((int64_t)k3k_ldi(PT, k3k_off2(PT, i, tau / ps)) * ps + tau % ps) * row;
    float acc = 0.0f;
    for (int64_t cc = 0; cc < c; cc++) acc += qlat[cc] * k3k_ld(C, base + cc);
    for (int64_t r = 0; r < Dr; r++) acc += k3k_ld(Q, qo + Dn + r) * k3k_ld(C, base + c + r);
    s[tau] = acc * scale;
  }
  softmax_inplace(s, len);
  for (int64_t cc = 0; cc < c; cc++) olat[cc] = 0.0f;
  for (int64_t tau = 0; tau < len; tau++) {
    int64_t base = ((int64_t)k3k_ldi(PT, k3k_off2(PT, i, tau / ps)) * ps + tau % ps) * row;
    for (int64_t cc = 0; cc < c; cc++) olat[cc] += s[tau] * k3k_ld(C, base + cc);
  }
  for (int64_t e = 0; e < Dv; e++) {
    float acc = 0.0f;
    for (int64_t cc = 0; cc < c; cc++) acc += k3k_ld(Wk, k3k_off2(Wk, h * Dkv + Dn + e, cc)) * olat[cc];
    k3k_st(O, i * O->stride[0] + h * Dv + e, acc);
  }
}

int k3k_cpu_mla_decode(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = params;
  int rc = k3k_cpu_check_mla_decode(p, t);
  if (rc) return rc;
  int64_t maxlen = 0;
  for (int32_t i = 0; i < p->n_seqs; i++) {
    int64_t l = k3k_ldi(t[4], i * t[4]->stride[0]);
    maxlen = l > maxlen ? l : maxlen;
  }
  float *scratch = malloc((size_t)(2 * p->kv_lora + maxlen + 1) * sizeof *scratch);
  if (!scratch) return K3_ENOMEM;
  for (int32_t i = 0; i < p->n_seqs; i++)
    for (int32_t h = 0; h < p->n_heads; h++) k3k_cpu_mla_decode_head(p, t, i, h, scratch);
  free(scratch);
  return 0;
}

/* MLA_CACHE_WRITE: cache row slot[t] ← [c_n[t] | k_rot[t]]; slot < 0 skips the token. */
int k3k_cpu_mla_cache_write(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *Cn = t[0], *KR = t[1], *SM = t[2], *C = t[3];
  int64_t T = Cn->shape[0], c = Cn->shape[1], r = KR->shape[1], row = c + r;
  int64_t rows = C->shape[0] * C->shape[1];
  for (int64_t tk = 0; tk < T; tk++)
    if (k3k_ldi(SM, tk * SM->stride[0]) >= rows) return K3_ERANGE;
  for (int64_t tk = 0; tk < T; tk++) {
    int64_t s = k3k_ldi(SM, tk * SM->stride[0]);
    if (s < 0) continue;
    for (int64_t j = 0; j < c; j++) k3k_st(C, s * row + j, k3k_ld(Cn, k3k_off2(Cn, tk, j)));
    for (int64_t j = 0; j < r; j++) k3k_st(C, s * row + c + j, k3k_ld(KR, k3k_off2(KR, tk, j)));
  }
  return 0;
}

/* MLA_CACHE_GATHER: y[t] ← cache row slot[t] (every slot must be valid). */
int k3k_cpu_mla_cache_gather(const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *C = t[0], *SM = t[1], *Y = t[2];
  int64_t T = SM->shape[0], row = C->shape[2], rows = C->shape[0] * C->shape[1];
  for (int64_t tk = 0; tk < T; tk++) {
    int64_t s = k3k_ldi(SM, tk * SM->stride[0]);
    if (s < 0 || s >= rows) return K3_ERANGE;
  }
  for (int64_t tk = 0; tk < T; tk++) {
    int64_t s = k3k_ldi(SM, tk * SM->stride[0]);
    for (int64_t j = 0; j < row; j++) k3k_st(Y, tk * Y->stride[0] + j, k3k_ld(C, s * row + j));
  }
  return 0;
}
