/* Parity of the fused KDA decode step (k3k_cu_kda_decode, no op slot in k3k.h) against the
 * composition of reference ops it replaces:
 *   CONV_STEP(q,k,v) → L2NORM(q,k) → KDA_GATE → SIGMOID(b) → KDA_STEP → GATED_RMSNORM
 * with bf16 conv outputs, fp32 q/k/g/beta and a bf16 o, exactly the fused kernel's rounding
 * points. Checks the output, the fp32 state and the three conv states. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static int ref_run(gctx *g, k3k_op_t op, const void *prm, const k3k_tensor_t **t, int n,
                   const char *what) {
  int rc = k3k_run(g->ref, op, prm, t, n);
  if (rc) g_record(g, false, "%s: reference %s failed: %s", what, k3k_op_name(op), k3_strerror(rc));
  return rc;
}

static void fused_case(gctx *g, int64_t B, int64_t NH, k3k_dtype_t bdt) {
  const int64_t P = NH * 128, S = B + 1;
  enum { QL, KL, VL, GR, BR, Z, CQ, CK, CV, WQ, WK, WV, AL, DT, ON, ST, SL, QC, KC, VC, QN, KN,
         G, BE, O, OUT, NP };
  gpair p[NP];
  memset(p, 0, sizeof p);
  char what[96];
  snprintf(what, sizeof what, "kda_fused_decode B=%lld NH=%lld b_raw %s", (long long)B, (long long)NH,
           bdt == K3K_BF16 ? "bf16" : "f32");
  int rc = 0;
  for (int i = QL; i <= Z; i++)
    rc |= gpair_new(g, &p[i], i == BR ? bdt : K3K_BF16, 2, SH(B, i == BR ? NH : P));
  for (int i = CQ; i <= CV; i++) rc |= gpair_new(g, &p[i], K3K_BF16, 3, SH(S, P, 3));
  for (int i = WQ; i <= WV; i++) rc |= gpair_new(g, &p[i], K3K_F32, 2, SH(P, 4));
  rc |= gpair_new(g, &p[AL], K3K_F32, 1, SH(128));
  rc |= gpair_new(g, &p[DT], K3K_F32, 1, SH(P));
  rc |= gpair_new(g, &p[ON], K3K_F32, 1, SH(128));
  rc |= gpair_new(g, &p[ST], K3K_F32, 4, SH(S, NH, 128, 128));
  rc |= gpair_new(g, &p[SL], K3K_I32, 1, SH(B));
  for (int i = QC; i <= VC; i++) rc |= gpair_new(g, &p[i], K3K_BF16, 2, SH(B, P));
  for (int i = QN; i <= G; i++) rc |= gpair_new(g, &p[i], K3K_F32, 2, SH(B, P));
  rc |= gpair_new(g, &p[BE], K3K_F32, 2, SH(B, NH));
  rc |= gpair_new(g, &p[O], K3K_BF16, 2, SH(B, P));
  rc |= gpair_new(g, &p[OUT], K3K_BF16, 2, SH(B, P));
  if (rc) {
    g_record(g, false, "%s: allocation failed", what);
    goto out;
  }
  for (int i = QL; i <= Z; i++) gpair_rand(g, &p[i], -2, 2);
  for (int i = CQ; i <= CV; i++) gpair_rand(g, &p[i], -2, 2);
  for (int i = WQ; i <= WV; i++) gpair_rand(g, &p[i], -0.7f, 0.7f);
  gpair_rand(g, &p[AL], -1, 1.5f), gpair_rand(g, &p[DT], -1, 1), gpair_rand(g, &p[ON], 0.5f, 1.5f);
  gpair_rand(g, &p[ST], -0.5f, 0.5f);
  for (int64_t i = 0; i < B; i++) gpair_host_set(&p[SL], i, (float)(B - i));
  gpair_upload(g, &p[SL]);
  gpair_poison(g, &p[OUT]);

  /* Reference composition on the host tensors. */
  {
    k3k_conv_params_t cp = {(int32_t)B, 1, 1};
    for (int j = 0; j < 3; j++) {
      const k3k_tensor_t *t[] = {&p[QL + j].h, &p[WQ + j].h, &p[SL].h, &p[CQ + j].h, &p[QC + j].h};
      if (ref_run(g, K3K_OP_CONV_STEP, &cp, t, 5, what)) goto out;
    }
    k3k_l2norm_params_t lp = {128, 1e-6f, 1.0f};
    for (int j = 0; j < 2; j++) {
      const k3k_tensor_t *t[] = {&p[QC + j].h, &p[QN + j].h};
      if (ref_run(g, K3K_OP_L2NORM, &lp, t, 2, what)) goto out;
    }
    k3k_kda_gate_params_t gp = {K3K_GATE_LOWER_BOUND, 128, -5.0f};
    const k3k_tensor_t *tg[] = {&p[GR].h, &p[AL].h, &p[DT].h, &p[G].h};
    if (ref_run(g, K3K_OP_KDA_GATE, &gp, tg, 4, what)) goto out;
    const k3k_tensor_t *tb[] = {&p[BR].h, &p[BE].h};
    if (ref_run(g, K3K_OP_SIGMOID, NULL, tb, 2, what)) goto out;
    k3k_kda_params_t kp = {(int32_t)B, (int32_t)NH, 1, 0.0f, 0};
    const k3k_tensor_t *ts[] = {&p[QN].h, &p[KN].h, &p[VC].h, &p[G].h, &p[BE].h,
                                &p[SL].h, &p[ST].h, &p[O].h};
    if (ref_run(g, K3K_OP_KDA_STEP, &kp, ts, 8, what)) goto out;
    k3k_gated_rmsnorm_params_t np = {128, 1e-5f};
    const k3k_tensor_t *tn[] = {&p[O].h, &p[Z].h, &p[ON].h, &p[OUT].h};
    if (ref_run(g, K3K_OP_GATED_RMSNORM, &np, tn, 4, what)) goto out;
  }
  {
    k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
    k3k_cu_kda_decode_args a;
    memset(&a, 0, sizeof a);
    a.batch = (int)B;
    a.heads = (int)NH;
    a.q = p[QL].d.data, a.k = p[KL].d.data, a.v = p[VL].d.data, a.ld_qkv = (size_t)P;
    a.g_raw = p[GR].d.data, a.ld_g = (size_t)P;
    a.b_raw = p[BR].d.data, a.ld_b = (size_t)NH, a.b_raw_bf16 = bdt == K3K_BF16;
    a.z = p[Z].d.data, a.ld_z = (size_t)P;
    a.conv_q = p[CQ].d.data, a.conv_k = p[CK].d.data, a.conv_v = p[CV].d.data;
    a.wq = p[WQ].d.data, a.wk = p[WK].d.data, a.wv = p[WV].d.data;
    a.a_log = p[AL].d.data, a.dt_bias = p[DT].d.data, a.o_norm_w = p[ON].d.data;
    a.state = p[ST].d.data, a.slots = p[SL].d.data, a.n_slots = (int)p[ST].h.shape[0];
    a.out = p[OUT].d.data, a.ld_out = (size_t)P;
    a.lower_bound = -5.0f, a.q_scale = 1.0f / sqrtf(128.0f), a.l2_eps = 1e-6f, a.rms_eps = 1e-5f;
    rc = k3k_cu_kda_decode(cx->stream, &a);
    if (!rc) rc = g->cuda->synchronize(g->cuda);
    if (rc) {
      g_record(g, false, "%s: launch failed: %s", what, k3_strerror(rc));
      goto out;
    }
  }
  char w2[128];
  gpair_check(g, &p[OUT], 1e-2, what);
  snprintf(w2, sizeof w2, "%s state", what);
  gpair_check(g, &p[ST], 1e-4, w2);
  static const char *cn[] = {"conv_q", "conv_k", "conv_v"};
  for (int j = 0; j < 3; j++) {
    snprintf(w2, sizeof w2, "%s %s", what, cn[j]);
    gpair_check(g, &p[CQ + j], 0.0, w2);
  }
out:
  for (int i = 0; i < NP; i++) gpair_free(g, &p[i]);
}

/* b_raw as fp32 (the kernel's first form) and as bf16 (what the runner's bf16 GEMM gives). */
void gpu_fused_kda_case(gctx *g, int64_t B, int64_t NH) {
  fused_case(g, B, NH, K3K_F32);
  fused_case(g, B, NH, K3K_BF16);
}
