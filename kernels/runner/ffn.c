/* The FFN half of a layer as k3k ops: the dense MLP (layers < first_k_dense_replace) and the
 * MoE block: sigmoid noaux_tc router (fp32), routed experts (MXFP4 for K3, bf16 for the 48B)
 * as one MOE_ROUTED op over the layer's expert table (experts.c; one fused path on a device,
 * the reference chain on the CPU backends), or, without a table or where the backend refuses
 * the operands, the same chain run here per expert on the rows grouped by k3k_moe_plan; fp32
 * combine with one rounding, K3's
 * LatentMoE down/norm/up around the experts, plus the shared expert (spec §5; 48B §5).
 * Every expert GEMM computes each output row independently of the other rows, so a token's
 * result never depends on which other tokens share the batch. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "runner_internal.h"

#define TRY(x)                   \
  do {                           \
    int rc_ = (x);               \
    if (rc_) return rc_;         \
  } while (0)

/* y = down( act(gate x, up x) ) with act = SiTU (K3) or SiLU-gated (48B). */
static int gated_mlp(k3_runner_t *r, rn_ws_t *ws, const k3k_tensor_t *x, const k3k_tensor_t *wg,
                     const k3k_tensor_t *wu, const k3k_tensor_t *wd, const k3k_tensor_t *y) {
  const int64_t T = x->shape[0], F = wg->shape[0];
  k3k_tensor_t g = rn_buf(ws, r->act, T, F), u = rn_buf(ws, r->act, T, F), a = rn_buf(ws, r->act, T, F);
  if (ws->rc) return ws->rc;
  const k3k_tensor_t *gw[2] = {wg, wu}, *gy[2] = {&g, &u};
  const k3k_gemm_multi_params_t gm = {.n = 2}; /* gate, up: one launch where the gemv takes both */
  TRY(k3k_gemm_multi(r->be, &gm, x, gw, gy));
  if (r->cfg.act == K3_ACT_SITU) {
    k3k_situ_params_t sp = {(float)r->cfg.situ_beta, (float)r->cfg.situ_linear_beta};
    TRY(k3k_situ(r->be, &sp, &g, &u, &a));
  } else {
    TRY(k3k_silu_mul(r->be, &g, &u, &a));
  }
  return k3k_gemm(r->be, &a, wd, y);
}

static int expert_gemm(k3_runner_t *r, const rn_expw_t *w, const k3k_tensor_t *x,
                       const k3k_tensor_t *y) {
  if (w->mx) return k3k_mxfp4_gemm(r->be, x, &w->packed, &w->scale, y);
  return k3k_gemm(r->be, x, &w->w, y);
}

/* The routed experts op by op: the (token, choice) pairs are grouped by expert on the host
 * (one copy of the router's idx per layer), then each expert with rows runs its GEMMs on its
 * slice of the grouped rows; fp32 weighted combine with one rounding (§5.4). */
static int experts_ops(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, const k3k_tensor_t *z,
                       const k3k_tensor_t *idx, const k3k_tensor_t *wt, const k3k_tensor_t *comb) {
  const k3_model_config_t *c = &r->cfg;
  k3k_backend_t *be = r->be;
  const int64_t T = z->shape[0], E = c->num_experts, K = c->top_k;
  const int64_t F = c->moe_intermediate_size, D = c->expert_in_dim, TK = T * K;
  const k3k_dtype_t A = r->act;
  int32_t *hidx = malloc((size_t)TK * 4), *off = malloc((size_t)(E + 1) * 4);
  int32_t *gtok = malloc((size_t)TK * 4), *ridx = malloc((size_t)TK * 4);
  int rc = (!hidx || !off || !gtok || !ridx) ? K3_ENOMEM : 0;
  if (!rc) rc = be->copy_to_host(be, hidx, idx->data, (size_t)TK * 4);
  if (!rc) rc = k3k_moe_plan(hidx, (int32_t)T, (int32_t)K, (int32_t)E, off, gtok, ridx);
  k3k_tensor_t gt = {0}, rt = {0};
  if (!rc) {
    gt = rn_i32(ws, gtok, TK);
    rt = rn_i32(ws, ridx, TK);
    rt = k3k_tensor_2d(be, K3K_I32, rt.data, T, K);
    rc = ws->rc;
  }
  free(hidx);
  free(gtok);
  free(ridx);
  k3k_tensor_t xin = rn_buf(ws, A, TK, D), h1 = rn_buf(ws, A, TK, F), h3 = rn_buf(ws, A, TK, F);
  k3k_tensor_t ha = rn_buf(ws, A, TK, F), yr = rn_buf(ws, A, TK, D);
  if (!rc) rc = ws->rc;
  if (!rc) rc = k3k_get_rows(be, z, &gt, &xin);
  for (int64_t e = 0; e < E && !rc; e++) {
    int64_t b = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    k3k_tensor_t xe = k3k_tensor_slice(&xin, 0, b, n), g1 = k3k_tensor_slice(&h1, 0, b, n);
    k3k_tensor_t g3 = k3k_tensor_slice(&h3, 0, b, n), ga = k3k_tensor_slice(&ha, 0, b, n);
    k3k_tensor_t ye = k3k_tensor_slice(&yr, 0, b, n);
    rc = expert_gemm(r, &L->w1[e], &xe, &g1);
    if (!rc) rc = expert_gemm(r, &L->w3[e], &xe, &g3);
    if (!rc) {
      if (c->act == K3_ACT_SITU) {
        k3k_situ_params_t sp = {(float)c->situ_beta, (float)c->situ_linear_beta};
        rc = k3k_situ(be, &sp, &g1, &g3, &ga);
      } else {
        rc = k3k_silu_mul(be, &g1, &g3, &ga);
      }
    }
    if (!rc) rc = expert_gemm(r, &L->w2[e], &ga, &ye);
  }
  free(off);
  if (rc) return rc;
  return k3k_moe_combine(be, &yr, &rt, wt, comb);
}

/* The side lane's part of a decode-shaped MoE block (moe(): MOE_ROUTED taken, rn_dev_side_ok): z = lat_down x
 * (mark 1) and sh = the shared expert of x (mark 2), both independent of the router; always
 * back on the main stream when it returns. */
static int moe_side(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, const k3k_tensor_t *x,
                    const k3k_tensor_t *z, const k3k_tensor_t *sh) {
  int rc = rn_dev_side_begin(r);
  if (rc) return rc;
  if (z) rc = k3k_gemm(r->be, x, &L->lat_down, z);
  if (!rc && z) rc = rn_dev_side_mark(r, 1);
  if (!rc && sh) rc = gated_mlp(r, ws, x, &L->sh_gate, &L->sh_up, &L->sh_down, sh);
  if (!rc && sh) rc = rn_dev_side_mark(r, 2);
  int rc2 = rn_dev_side_end(r);
  return rc ? rc : rc2;
}

static int moe(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, const k3k_tensor_t *x,
               const k3k_tensor_t *out) {
  const k3_model_config_t *c = &r->cfg;
  k3k_backend_t *be = r->be;
  const int64_t T = x->shape[0], H = c->hidden_size, E = c->num_experts, K = c->top_k;
  const int64_t D = c->expert_in_dim;
  const k3k_dtype_t A = r->act;
  const bool latent = c->routed_expert_hidden_size > 0, shared = c->shared_expert_width > 0;
  /* router (fp32 logits, §5.3) */
  k3k_tensor_t lg = rn_buf(ws, K3K_F32, T, E), idx = rn_buf(ws, K3K_I32, T, K);
  k3k_tensor_t wt = rn_buf(ws, K3K_F32, T, K);
  k3k_tensor_t z = latent ? rn_buf(ws, A, T, D) : *x, comb = rn_buf(ws, A, T, D);
  k3k_tensor_t sh = shared ? rn_buf(ws, A, T, H) : comb;
  if (ws->rc) return ws->rc;
  /* the routed experts as one op (MOE_ROUTED: router to combine) where the layer has an expert
   * table and the backend takes the operands, else the chain of ops below */
  k3k_moe_routed_params_t mp = {
      .router = {.top_k = (int32_t)K,
                 .n_groups = c->use_grouped_topk ? c->num_expert_group : 1,
                 .topk_group = c->use_grouped_topk ? c->topk_group : 1,
                 .renormalize = c->moe_renormalize,
                 .use_biased_weights = c->router_bias_in_weights,
                 .scaling = (float)c->routed_scaling_factor},
      .wdtype = r->exp_wdtype,
      .F = (int32_t)c->moe_intermediate_size,
      .act = c->act == K3_ACT_SITU ? 0 : 1,
      .situ = {(float)c->situ_beta, (float)c->situ_linear_beta}};
  k3k_tensor_t wsb;
  const k3k_tensor_t *mt[8] = {&lg, &L->router_bias, &z, &L->etab, &idx, &wt, &comb, NULL};
  bool fused = L->etab.data != NULL;
  if (fused) {
    const size_t need = k3k_workspace(be, K3K_OP_MOE_ROUTED, &mp, mt, 8);
    if (need) {
      wsb = rn_buf(ws, K3K_U8, 1, (int64_t)need);
      if (ws->rc) return ws->rc;
      wsb = k3k_tensor_1d(be, K3K_U8, wsb.data, (int64_t)need);
      mt[7] = &wsb;
    }
    fused = k3k_supports(be, K3K_OP_MOE_ROUTED, &mp, mt, 8);
  }
  /* decode on a device: the latent projection and the shared expert go to the side lane first
   * (same ops, same inputs: the results do not change); the op joins the latent's mark */
  const bool side = fused && rn_dev_side_ok(r, T) && (latent || shared);
  if (side) TRY(moe_side(r, ws, L, x, latent ? &z : NULL, shared ? &sh : NULL));
  TRY(k3k_gemm(be, x, &L->router, &lg));
  if (!fused) TRY(k3k_router(be, &mp.router, &lg, &L->router_bias, &idx, &wt));
  /* expert inputs: the latent z (K3) or the normed x (48B) */
  if (latent && !side) TRY(k3k_gemm(be, x, &L->lat_down, &z));
  if (fused) {
    mp.x_mark = side && latent ? 1 : 0;
    TRY(k3k_moe_routed(be, &mp, mt));
  } else {
    TRY(experts_ops(r, ws, L, &z, &idx, &wt, &comb));
  }
  k3k_tensor_t routed = comb;
  if (latent) {
    k3k_tensor_t lat = comb;
    if (c->latent_moe_use_norm) {
      lat = rn_buf(ws, A, T, D);
      if (ws->rc) return ws->rc;
      k3k_rmsnorm_params_t np = {.eps = (float)c->eps_norm, .bf16_inner = r->bf16};
      TRY(k3k_rmsnorm(be, &np, &comb, &L->lat_norm, &lat));
    }
    routed = rn_buf(ws, A, T, H);
    if (ws->rc) return ws->rc;
    TRY(k3k_gemm(be, &lat, &L->lat_up, &routed));
  }
  if (shared) {
    if (side)
      TRY(rn_dev_side_wait(r, 2));
    else
      TRY(gated_mlp(r, ws, x, &L->sh_gate, &L->sh_up, &L->sh_down, &sh));
    return k3k_add(be, &routed, &sh, out);
  }
  return k3k_copy(be, &routed, out);
}

int rn_ffn_forward(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, const k3k_tensor_t *x,
                   const k3k_tensor_t *out) {
  if (!L->moe) return gated_mlp(r, ws, x, &L->d_gate, &L->d_up, &L->d_down, out);
  return moe(r, ws, L, x, out);
}
