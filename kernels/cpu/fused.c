/* Reference of the fused ops (k3k.h "Fusions"): each is the chain of reference ops it means,
 * called in order with the intermediate dtypes k3k.h names, so it is the specification by
 * construction and a device's one-launch kernel is tested against exactly what it replaces.
 *
 * What it is not: fast. Intermediates live in malloc'd host scratch (the CPU backends only;
 * "cpu-fast" runs these too, except GEMM_MULTI, whose GEMMs it runs packed: fast_backend.c).
 * Invariants: on error nothing was written: metadata the chain checks is checked before the
 * first write (KDA_DECODE's slots against every pool it touches). */
#include <stdlib.h>
#include <string.h>

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

/* MOE_ROUTED: ROUTER → k3k_moe_plan → GET_ROWS → per expert G, G, SITU/SILU_MUL, G →
 * MOE_COMBINE (k3k.h), intermediates in x's dtype. Expert views come from the PTR table (host
 * addresses on the CPU backends). */
int k3k_moe_routed_chain(k3k_chain_fn run, void *ctx, const void *params,
                         const k3k_tensor_t *const *t) {
  const k3k_moe_routed_params_t *p = params;
  const k3k_tensor_t *lg = t[0], *x = t[2], *tab = t[3], *idx = t[4], *w = t[5], *y = t[6];
  const int64_t T = lg->shape[0], E = lg->shape[1], K = p->router.top_k, D = x->shape[1];
  const int64_t F = p->F, TK = T * K;
  const bool mx = p->wdtype == K3K_U8;
  const k3k_dtype_t A = x->dtype;
  const k3k_tensor_t *ro[4] = {lg, t[1], idx, w};
  int rc = run(ctx, K3K_OP_ROUTER, &p->router, ro);
  if (rc || T == 0) return rc;
  /* plan: idx is contiguous host memory ([T,k] I32, innermost stride 1; rows may be strided) */
  int32_t *hidx = malloc((size_t)TK * 4), *off = malloc((size_t)(E + 1) * 4);
  int32_t *gtok = malloc((size_t)TK * 4), *ridx = malloc((size_t)TK * 4);
  const size_t es = k3k_dtype_size(A);
  char *buf = malloc((size_t)TK * (size_t)(2 * D + 3 * F) * es);
  if (!hidx || !off || !gtok || !ridx || !buf) rc = K3_ENOMEM;
  for (int64_t i = 0; i < T && !rc; i++)
    memcpy(hidx + i * K, (const int32_t *)idx->data + i * idx->stride[0], (size_t)K * 4);
  if (!rc) rc = k3k_moe_plan(hidx, (int32_t)T, (int32_t)K, (int32_t)E, off, gtok, ridx);
  k3k_tensor_t gt = k3k_tensor_1d(NULL, K3K_I32, gtok, TK), rt = k3k_tensor_2d(NULL, K3K_I32, ridx, T, K);
  char *q = buf;
  k3k_tensor_t xg = k3k_tensor_2d(NULL, A, q, TK, D);
  q += (size_t)(TK * D) * es;
  k3k_tensor_t g = k3k_tensor_2d(NULL, A, q, TK, F);
  q += (size_t)(TK * F) * es;
  k3k_tensor_t u = k3k_tensor_2d(NULL, A, q, TK, F);
  q += (size_t)(TK * F) * es;
  k3k_tensor_t a = k3k_tensor_2d(NULL, A, q, TK, F);
  q += (size_t)(TK * F) * es;
  k3k_tensor_t r = k3k_tensor_2d(NULL, A, q, TK, D);
  const k3k_tensor_t *gr[3] = {x, &gt, &xg};
  if (!rc) rc = run(ctx, K3K_OP_GET_ROWS, NULL, gr);
  void *const *ptr = tab->data;
  const k3k_op_t gop = mx ? K3K_OP_MXFP4_GEMM : K3K_OP_GEMM;
  for (int64_t e = 0; e < E && !rc; e++) {
    const int64_t b = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    k3k_tensor_t xe = k3k_tensor_slice(&xg, 0, b, n), ge = k3k_tensor_slice(&g, 0, b, n);
    k3k_tensor_t ue = k3k_tensor_slice(&u, 0, b, n), ae = k3k_tensor_slice(&a, 0, b, n);
    k3k_tensor_t re = k3k_tensor_slice(&r, 0, b, n);
    const k3k_tensor_t *in[3] = {&xe, &xe, &ae}, *out[3] = {&ge, &ue, &re};
    for (int j = 0; j < 3 && !rc; j++) {
      const int64_t N = j < 2 ? F : D, Kd = j < 2 ? D : F;
      if (j == 2) { /* the activation between up and down */
        const k3k_tensor_t *ac[3] = {&ge, &ue, &ae};
        rc = run(ctx, p->act ? K3K_OP_SILU_MUL : K3K_OP_SITU, p->act ? NULL : &p->situ, ac);
        if (rc) break;
      }
      if (mx) {
        k3k_tensor_t wp = k3k_tensor_2d(NULL, K3K_U8, ptr[(2 * j) * E + e], N, Kd / 2);
        k3k_tensor_t ws = k3k_tensor_2d(NULL, K3K_U8, ptr[(2 * j + 1) * E + e], N, Kd / 32);
        const k3k_tensor_t *m[4] = {in[j], &wp, &ws, out[j]};
        rc = run(ctx, gop, NULL, m);
      } else {
        k3k_tensor_t wd = k3k_tensor_2d(NULL, p->wdtype, ptr[j * E + e], N, Kd);
        const k3k_tensor_t *m[3] = {in[j], &wd, out[j]};
        rc = run(ctx, gop, NULL, m);
      }
    }
  }
  const k3k_tensor_t *cb[4] = {&r, &rt, w, y};
  if (!rc) rc = run(ctx, K3K_OP_MOE_COMBINE, NULL, cb);
  free(hidx);
  free(off);
  free(gtok);
  free(ridx);
  free(buf);
  return rc;
}

static int ref_run(void *ctx, k3k_op_t op, const void *params, const k3k_tensor_t *const *t) {
  (void)ctx;
  return k3k_cpu_ref_fn(op)(params, t);
}

int k3k_cpu_moe_routed(const void *params, const k3k_tensor_t *const *t) {
  return k3k_moe_routed_chain(ref_run, NULL, params, t);
}
