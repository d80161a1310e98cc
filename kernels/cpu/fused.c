/* Reference of the fused ops (k3k.h "Fusions"): each is the chain of reference ops it means,
 * called in order with the intermediate dtypes k3k.h names, so it is the specification by
 * construction and a device's one-launch kernel is tested against exactly what it replaces.
 *
 * What it is not: fast. Intermediates live in malloc'd host scratch (the CPU backends only;
 * "cpu-fast" runs these too, except GEMM_MULTI, whose GEMMs it runs packed: fast_backend.c).
 * Invariants: on error nothing was written: metadata the chain checks is checked before the
 * first write (KDA_DECODE's slots against every pool it touches). */
#include <stdlib.h>

#include "core/k3k_internal.h"

/* RES_MIX_NORM: ADD → ATTN_RES_MIX → RMSNORM (each optional part as k3k.h says). */
int k3k_cpu_res_mix_norm(const void *params, const k3k_tensor_t *const *t) {
  const k3k_res_mix_norm_params_t *p = params;
  int rc = 0;
  if (t[0]) {
    const k3k_tensor_t *a[3] = {t[1], t[0], t[1]}; /* P = P + a */
    if ((rc = k3k_cpu_add(NULL, a))) return rc;
  }
  if (t[2]) {
    const k3k_attn_res_params_t mp = {.eps = p->eps_mix};
    const k3k_tensor_t *m[5] = {t[2], t[1], t[3], t[4], t[5]};
    if ((rc = k3k_cpu_attn_res_mix(&mp, m))) return rc;
  }
  const k3k_rmsnorm_params_t np = {.eps = p->eps, .bf16_inner = p->bf16_inner};
  const k3k_tensor_t *n[3] = {t[2] ? t[5] : t[1], t[6], t[7]};
  return k3k_cpu_rmsnorm(&np, n);
}

/* GEMM_MULTI: GEMM per output, in order. */
int k3k_cpu_gemm_multi(const void *params, const k3k_tensor_t *const *t) {
  const k3k_gemm_multi_params_t *p = params;
  for (int j = 0; j < p->n; j++) {
    const k3k_tensor_t *g[3] = {t[0], t[1 + j], t[1 + K3K_GEMM_MULTI_MAX + j]};
    int rc = k3k_cpu_gemm(NULL, g);
    if (rc) return rc;
  }
  return 0;
}

/* KDA_DECODE: CONV_STEP x3 → L2NORM x2 → KDA_GATE → SIGMOID → KDA_STEP → GATED_RMSNORM, shapes
 * [N,P] with P = NH·Dh; conv outputs and o in out's dtype D, q/k/g/beta fp32 (k3k.h). */
int k3k_cpu_kda_decode(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_decode_params_t *p = params;
  const k3k_tensor_t *out = t[17];
  const int64_t N = p->n_seqs, P = out->shape[1], NH = p->n_heads;
  const k3k_dtype_t D = out->dtype;
  int64_t pool = t[16]->shape[0];
  for (int j = 0; j < 3; j++)
    if (t[9 + j]->shape[0] < pool) pool = t[9 + j]->shape[0];
  int rc = k3k_cpu_check_slots(t[15], p->n_seqs, pool);
  if (rc || N == 0) return rc;
  const size_t es = k3k_dtype_size(D), nP = (size_t)(N * P);
  /* scratch: c_q, c_k, c_v, o in D; qn, kn, g fp32 [N,P]; beta fp32 [N,NH] */
  char *buf = malloc(4 * nP * es + (3 * nP + (size_t)(N * NH)) * sizeof(float));
  if (!buf) return K3_ENOMEM;
  k3k_tensor_t c[3], o, qn, kn, g, beta;
  char *q = buf;
  for (int j = 0; j < 3; j++, q += nP * es) c[j] = k3k_tensor_2d(NULL, D, q, N, P);
  o = k3k_tensor_2d(NULL, D, q, N, P), q += nP * es;
  qn = k3k_tensor_2d(NULL, K3K_F32, q, N, P), q += nP * sizeof(float);
  kn = k3k_tensor_2d(NULL, K3K_F32, q, N, P), q += nP * sizeof(float);
  g = k3k_tensor_2d(NULL, K3K_F32, q, N, P), q += nP * sizeof(float);
  beta = k3k_tensor_2d(NULL, K3K_F32, q, N, NH);
  const k3k_conv_params_t cp = {.n_seqs = p->n_seqs, .read_state = 1, .activation = 1};
  for (int j = 0; j < 3 && !rc; j++) {
    const k3k_tensor_t *a[5] = {t[j], t[6 + j], t[15], t[9 + j], &c[j]};
    rc = k3k_cpu_conv_step(&cp, a);
  }
  const k3k_l2norm_params_t lp = {.head_dim = p->head_dim, .eps = p->l2_eps, .scale = 1.0f};
  const k3k_tensor_t *lq[2] = {&c[0], &qn}, *lk[2] = {&c[1], &kn};
  if (!rc) rc = k3k_cpu_l2norm(&lp, lq);
  if (!rc) rc = k3k_cpu_l2norm(&lp, lk);
  const k3k_kda_gate_params_t gp = {.form = p->gate_form, .head_dim = p->head_dim,
                                    .lower_bound = p->lower_bound};
  const k3k_tensor_t *ga[4] = {t[3], t[12], t[13], &g}, *sb[2] = {t[4], &beta};
  if (!rc) rc = k3k_cpu_kda_gate(&gp, ga);
  if (!rc) rc = k3k_cpu_sigmoid(NULL, sb);
  const k3k_kda_params_t kp = {.n_seqs = p->n_seqs, .n_heads = p->n_heads, .read_state = 1,
                               .scale = p->scale};
  const k3k_tensor_t *ks[8] = {&qn, &kn, &c[2], &g, &beta, t[15], t[16], &o};
  if (!rc) rc = k3k_cpu_kda_step(&kp, ks);
  const k3k_gated_rmsnorm_params_t np = {.head_dim = p->head_dim, .eps = p->rms_eps};
  const k3k_tensor_t *gn[4] = {&o, t[5], t[14], out};
  if (!rc) rc = k3k_cpu_gated_rmsnorm(&np, gn);
  free(buf);
  return rc;
}
