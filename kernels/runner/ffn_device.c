/* The routed-expert part of the MoE block on a "cuda" backend, without a host round trip:
 * router + device MoE plan in one launch (k3k_cu_moe_route_plan, the ROUTER op's ids and
 * weights), grouped expert GEMM of every active expert in one launch for gate+up with the
 * activation fused (W4A16 MXFP4 for K3, moe_ops.h; bf16 for the 48B, moe_bf16.h), a second
 * grouped launch for down, and the unchecked fp32 combine.
 *
 * What it is for: rn_ffn_forward (ffn.c) calls rn_dev_moe_experts instead of its per-expert loop
 * when rn_dev_init enabled it (cuda backend, bf16 precision, MXFP4 experts). The CPU path and
 * this one mean the same thing: the same router op (same expert choice), the same grouping
 * order (by expert, then token, then choice), bf16 rounding of the gate/up GEMM outputs before
 * the activation (round_inner), bf16 expert outputs, and one fp32 combine with one rounding.
 * They differ only in accumulation order inside the GEMMs (results within tolerance, not bit
 * for bit).
 * What it is not: a general device layer. Everything else of the block (router GEMM, latent
 * projections and norm, shared expert) stays on the k3k op API in ffn.c.
 *
 * Invariants: the expert pointer tables are built once at init from the uploaded weights (the
 * runner owns both); every expert scale is checked for 0xFF (E8M0 NaN) once at init, because
 * the grouped GEMM does not check them per call. Nothing here synchronises per layer, except
 * the dequant-once expert path of prefill batches (moe_dq.h: batches with many rows per expert,
 * K3PD_MOE_DQ=0 turns it off; one host round trip per layer for the plan's offsets; never taken
 * while a graph is captured). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "runner_internal.h"

/* Per MoE layer: one device array of 6*E pointers: w1 packed, w1 scale, w3 packed, w3 scale,
 * w2 packed, w2 scale (E entries each). */
struct rn_dev {
  void **tabs;     /* [num_layers], NULL for dense layers */
  int n_layers;
  bool bf16;       /* bf16 experts (48B): tabs hold 3*E weight pointers w1, w3, w2 */
  bool side;       /* the side stream is ready (K3PD_CUDA_SIDE not 0): rn_dev_side_wanted */
};

/* bf16 experts: one device array of 3*E pointers per MoE layer (w1, w3, w2; E each). Every
 * weight must be a contiguous [N][K] matrix with 16-byte aligned rows (the grouped kernel's
 * 16-byte loads); anything else keeps the per-expert op path. */
static bool bf16_expert_ok(const k3k_tensor_t *w, int64_t N, int64_t K) {
  return w->dtype == K3K_BF16 && w->ndim == 2 && w->shape[0] == N && w->shape[1] == K &&
         w->stride[1] == 1 && w->stride[0] == K && ((uintptr_t)w->data & 15) == 0;
}

/* h[0..3E): the layer's bf16 expert weights' device pointers, gate, up, down ([E] each). */
static void bf16_ptrs(const rn_layer_t *L, int64_t E, const void **h) {
  const rn_expw_t *sets[3] = {L->w1, L->w3, L->w2};
  for (int j = 0; j < 3; j++)
    for (int64_t e = 0; e < E; e++) h[j * E + e] = sets[j][e].w.data;
}

static int build_tab_bf16(k3_runner_t *r, const rn_layer_t *L, void **out) {
  const int64_t E = r->cfg.num_experts;
  const void **h = malloc((size_t)(3 * E) * sizeof *h);
  if (!h) return K3_ENOMEM;
  bf16_ptrs(L, E, h);
  void *d = NULL;
  int rc = r->be->alloc(r->be, (size_t)(3 * E) * sizeof *h, &d);
  if (!rc && r->be->copy_from_host(r->be, d, h, (size_t)(3 * E) * sizeof *h)) rc = K3_EDEVICE;
  free(h);
  if (rc) {
    if (d) r->be->free(r->be, d);
    return rc;
  }
  *out = d;
  return 0;
}

/* Whether every routed expert of the model can take the grouped bf16 kernel (moe_bf16.h). */
static bool bf16_experts_fit(const k3_runner_t *r) {
  const k3_model_config_t *c = &r->cfg;
  const int64_t F = c->moe_intermediate_size, D = c->expert_in_dim;
  if (c->act != K3_ACT_SILU || F % 8 || D % 8 || F > 24576 || D > 24576) return false;
  for (int l = 0; l < c->num_layers; l++) {
    const rn_layer_t *L = &r->layers[l];
    if (!L->moe) continue;
    for (int64_t e = 0; e < c->num_experts; e++)
      if (L->w1[e].mx || !bf16_expert_ok(&L->w1[e].w, F, D) || !bf16_expert_ok(&L->w3[e].w, F, D) ||
          !bf16_expert_ok(&L->w2[e].w, D, F))
        return false;
  }
  return true;
}

static int build_tab(k3_runner_t *r, const rn_layer_t *L, void **out) {
  const int64_t E = r->cfg.num_experts;
  const uint8_t **h = malloc((size_t)(6 * E) * sizeof *h);
  if (!h) return K3_ENOMEM;
  const rn_expw_t *sets[3] = {L->w1, L->w3, L->w2};
  for (int j = 0; j < 3; j++)
    for (int64_t e = 0; e < E; e++) {
      h[(2 * j) * E + e] = sets[j][e].packed.data;
      h[(2 * j + 1) * E + e] = sets[j][e].scale.data;
    }
  void *d = NULL;
  int rc = r->be->alloc(r->be, (size_t)(6 * E) * sizeof *h, &d);
  if (!rc && r->be->copy_from_host(r->be, d, h, (size_t)(6 * E) * sizeof *h)) rc = K3_EDEVICE;
  free(h);
  if (rc) {
    if (d) r->be->free(r->be, d);
    return rc;
  }
  *out = d;
  return 0;
}

/* Checks every expert scale of the model for 0xFF on the device; one synchronisation. */
static int check_scales(k3_runner_t *r, char *err, size_t errlen) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(r->be);
  void *bad = NULL;
  int hbad = 0;
  int rc = r->be->alloc(r->be, sizeof(int), &bad);
  if (rc) return rc;
  rc = r->be->memset(r->be, bad, 0, sizeof(int));
  for (int l = 0; l < r->cfg.num_layers && !rc; l++) {
    const rn_layer_t *L = &r->layers[l];
    if (!L->moe) continue;
    const rn_expw_t *sets[3] = {L->w1, L->w3, L->w2};
    for (int j = 0; j < 3 && !rc; j++)
      for (int64_t e = 0; e < r->cfg.num_experts && !rc; e++) {
        const k3k_tensor_t *s = &sets[j][e].scale;
        rc = k3k_cu_mx_check(k3k_cuda_stream(cx), s->data, s->shape[0], s->shape[1], s->stride[0],
                             bad);
      }
  }
  if (!rc) rc = r->be->copy_to_host(r->be, &hbad, bad, sizeof(int));
  r->be->free(r->be, bad);
  if (!rc && hbad) {
    rn_seterr(err, errlen, "runner: an MXFP4 expert scale is 0xFF (E8M0 NaN) in the checkpoint");
    rc = K3_EFORMAT;
  }
  return rc;
}

void rn_dev_free(k3_runner_t *r) {
  struct rn_dev *d = r->dev;
  if (!d) return;
  for (int l = 0; l < d->n_layers; l++)
    if (d->tabs[l]) r->be->free(r->be, d->tabs[l]);
  free(d->tabs);
  free(d);
  r->dev = NULL;
}

int rn_dev_init(k3_runner_t *r, char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  if (!k3k_cuda_ctx_of(r->be) || !r->bf16 || c->num_experts <= 0) return 0;
  const int64_t F = c->moe_intermediate_size, D = c->expert_in_dim;
  const bool bf16 = !c->experts_mxfp4;
  if (bf16 && (c->num_experts > 8192 || !bf16_experts_fit(r))) {
    K3_INFO("runner: bf16 experts outside the grouped CUDA kernel; per-expert ops");
    return 0;
  }
  /* The grouped GEMMs' shape rules (tensor cores: moe_ops.h; other shapes with K % 32 == 0:
   * the generic kernel, generic.h); a config outside them keeps the op path. */
  if (!bf16 && (F % 32 || D % 32 || c->num_experts > 8192)) {
    K3_INFO("runner: MoE shapes F=%lld D=%lld outside the grouped CUDA GEMMs; per-expert ops",
            (long long)F, (long long)D);
    return 0;
  }
  struct rn_dev *d = calloc(1, sizeof *d);
  if (!d) return K3_ENOMEM;
  d->n_layers = c->num_layers;
  d->bf16 = bf16;
  d->tabs = calloc((size_t)c->num_layers, sizeof *d->tabs);
  r->dev = d;
  if (!d->tabs) return K3_ENOMEM; /* the caller frees r (and d with it) */
  for (int l = 0; l < c->num_layers; l++) {
    if (!r->layers[l].moe) continue;
    int rc = bf16 ? build_tab_bf16(r, &r->layers[l], &d->tabs[l])
                  : build_tab(r, &r->layers[l], &d->tabs[l]);
    if (rc) {
      rn_seterr(err, errlen, "runner: cannot build the expert tables of layer %d: %s", l,
                k3_strerror(rc));
      return rc;
    }
  }
  const char *sv = getenv("K3PD_CUDA_SIDE");
  if (!sv || strcmp(sv, "0")) {
    int rc = k3k_backend_side(r->be, K3K_SIDE_INIT, 0);
    if (rc) K3_WARN("runner: no side stream (%s); the MoE block runs on one stream", k3_strerror(rc));
    d->side = rc == 0;
  }
  return bf16 ? 0 : check_scales(r, err, errlen);
}

/* Decode-shaped passes only: at prefill sizes every GEMM of the block is compute-bound and
 * would only contend (not measured there). */
#define RN_SIDE_MAX_T 256

bool rn_dev_side_ok(const k3_runner_t *r, int64_t T) {
  return r->dev && r->dev->side && T <= RN_SIDE_MAX_T;
}

bool rn_dev_side_wanted(const k3_runner_t *r, int64_t T) {
  return rn_dev_side_ok(r, T) && rn_dev_moe_wanted(r, T);
}

int rn_dev_side_gemms(k3_runner_t *r, int n, const k3k_tensor_t *const *x,
                      const k3k_tensor_t *const *w, const k3k_tensor_t *const *y) {
  int rc = rn_dev_side_begin(r);
  if (rc) return rc;
  for (int i = 0; i < n && !rc; i++) rc = k3k_gemm(r->be, x[i], w[i], y[i]);
  if (!rc) rc = rn_dev_side_mark(r, 1);
  int rc2 = rn_dev_side_end(r);
  return rc ? rc : rc2;
}

/* bf16 experts at prefill-sized groups: the batched path of moe_dq.h (pointer-array GEMMs over
 * a padded row layout) instead of the runner's per-expert host loop; K3PD_MOE_BF16_BATCHED=0
 * keeps the loop (read once). */
static bool bf16_batched_ok(const k3_runner_t *r) {
  static int env = -1;
  if (env < 0) {
    const char *e = getenv("K3PD_MOE_BF16_BATCHED");
    env = !(e && *e == '0');
  }
  return env && r->cfg.moe_intermediate_size % 32 == 0 && r->cfg.expert_in_dim % 32 == 0;
}

bool rn_dev_moe_wanted(const k3_runner_t *r, int64_t T) {
  if (!r->dev) return false;
  return !r->dev->bf16 || k3k_cu_moe_bf16_wanted(T, r->cfg.top_k, r->cfg.num_experts) ||
         bf16_batched_ok(r);
}

static k3k_cu_mx_set mx_set(void *tab, int j, int64_t E, int64_t cols) {
  k3k_cu_mx_set s;
  memset(&s, 0, sizeof s);
  const uint8_t *const *t = (const uint8_t *const *)tab;
  s.packed_tab = t + (2 * j) * E;
  s.scale_tab = t + (2 * j + 1) * E;
  s.ld_packed = cols / 2;
  s.ld_scale = cols / K3_MXFP4_GROUP;
  return s;
}

/* The routed experts of a prefill-sized group through the batched path of moe_dq.h: MXFP4
 * experts from the layer's device table (dequantised once per group), or bf16 experts from their
 * own weights (the layer's host pointers). K3_ENOTSUP (a capture is running): nothing queued. */
static int moe_batched(k3_runner_t *r, rn_ws_t *ws, int layer, void *tab, const k3k_tensor_t *z,
                       const k3k_tensor_t *gt, const k3k_tensor_t *off, const k3k_tensor_t *ha,
                       const k3k_tensor_t *yr) {
  const k3_model_config_t *c = &r->cfg;
  const int32_t T = (int32_t)z->shape[0], K = c->top_k, E = c->num_experts;
  const int32_t F = (int32_t)c->moe_intermediate_size, D = (int32_t)c->expert_in_dim;
  k3k_tensor_t dqs = rn_buf(ws, K3K_U8, 1, (int64_t)k3k_cu_moe_dq_scratch_bytes((int64_t)T * K, E, F, D));
  if (ws->rc) return ws->rc;
  k3k_cu_moe_dq_args d;
  memset(&d, 0, sizeof d);
  const void **h = NULL;
  if (r->dev->bf16) {
    if (!(h = malloc((size_t)(3 * E) * sizeof *h))) return K3_ENOMEM;
    bf16_ptrs(&r->layers[layer], E, h);
    d.w1_bf16 = h;
    d.w3_bf16 = h + E;
    d.w2_bf16 = h + 2 * E;
  } else {
    d.w1 = mx_set(tab, 0, E, D);
    d.w3 = mx_set(tab, 1, E, D);
    d.w2 = mx_set(tab, 2, E, F);
  }
  d.act = c->act == K3_ACT_SITU ? K3K_CU_ACT_SITU : K3K_CU_ACT_SILU_MUL;
  d.beta = (float)c->situ_beta;
  d.beta_lin = (float)c->situ_linear_beta;
  d.F = F;
  d.D = D;
  d.E = E;
  d.T = T;
  d.k = K;
  d.x = z->data;
  d.ldx = z->stride[0];
  d.gather_tok = gt->data;
  d.expert_off = off->data;
  d.h = ha->data;
  d.y = yr->data;
  d.scratch = dqs.data;
  const int rc = k3k_cu_moe_dq_experts(k3k_cuda_ctx_of(r->be), &d);
  free(h);
  return rc;
}

int rn_dev_moe_experts(k3_runner_t *r, rn_ws_t *ws, int layer, const k3k_tensor_t *z,
                       const k3k_router_params_t *rp, const k3k_tensor_t *lg,
                       const k3k_tensor_t *bias, const k3k_tensor_t *idx, const k3k_tensor_t *wt,
                       const k3k_tensor_t *comb, int side_wait) {
  const k3_model_config_t *c = &r->cfg;
  k3k_backend_t *be = r->be;
  cudaStream_t st = k3k_cuda_stream(k3k_cuda_ctx_of(be));
  void *tab = r->dev->tabs[layer];
  const int32_t T = (int32_t)z->shape[0], K = c->top_k, E = c->num_experts;
  const int32_t F = (int32_t)c->moe_intermediate_size, D = (int32_t)c->expert_in_dim;
  const int64_t TK = (int64_t)T * K;
  if (T == 0) return 0;
  k3k_tensor_t off = rn_buf(ws, K3K_I32, 1, E + 1), act = rn_buf(ws, K3K_I32, 1, E + 1);
  k3k_tensor_t gt = rn_buf(ws, K3K_I32, 1, TK), ri = rn_buf(ws, K3K_I32, T, K);
  k3k_tensor_t scr = rn_buf(ws, K3K_U8, 1, (int64_t)k3k_cu_moe_plan_scratch(T, E));
  k3k_tensor_t ha = rn_buf(ws, K3K_BF16, TK, F), yr = rn_buf(ws, K3K_BF16, TK, D);
  if (ws->rc) return ws->rc;
  int rc = k3k_cu_moe_route_plan(st, rp, lg, bias, idx, wt, off.data, gt.data, ri.data, act.data,
                                 scr.data);
  if (rc) return rc;
  /* z comes from the side stream: the route/plan launch above overlapped its projection */
  if (side_wait && (rc = rn_dev_side_wait(r, side_wait))) return rc;
  const int32_t maxa = TK < E ? (int32_t)TK : E;
  /* prefill-sized groups: the batched path (moe_dq.h); bf16 experts above the grouped W16A16
   * kernel's 16 rows per expert, MXFP4 experts from K3K_CU_MOE_DQ_ROWS_DEFAULT rows */
  const bool batched = r->dev->bf16 ? !k3k_cu_moe_bf16_wanted(T, K, E) && bf16_batched_ok(r)
                                    : k3k_cu_moe_dq_wanted(T, K, E);
  if (batched) {
    rc = moe_batched(r, ws, layer, tab, z, &gt, &off, &ha, &yr);
    if (!rc) return k3k_cu_moe_combine_raw(st, &yr, &ri, wt, comb, NULL);
    if (rc != K3_ENOTSUP) return rc; /* a capture is running, nothing queued: the grouped kernels */
  }
  if (r->dev->bf16) { /* gate/up with SiLU fused, then down (moe_bf16.h), then the combine */
    rc = k3k_cu_moe_bf16_experts(st, (const uint16_t *const *)tab, E, F, D, z->data, z->stride[0],
                                 gt.data, off.data, act.data, maxa, ha.data, yr.data);
    return rc ? rc : k3k_cu_moe_combine_raw(st, &yr, &ri, wt, comb, NULL);
  }
  k3k_cu_moe_gemm_args a;
  memset(&a, 0, sizeof a);
  a.w = mx_set(tab, 0, E, D);
  a.up = mx_set(tab, 1, E, D);
  a.act = c->act == K3_ACT_SITU ? K3K_CU_ACT_SITU : K3K_CU_ACT_SILU_MUL;
  a.round_inner = 1; /* bf16 mode: the reference stores the gate/up GEMM outputs bf16 */
  a.beta = (float)c->situ_beta;
  a.beta_lin = (float)c->situ_linear_beta;
  a.N = F;
  a.K = D;
  a.x = z->data;
  a.ldx = z->stride[0];
  a.x_gather = gt.data;
  a.y = ha.data;
  a.ldy = F;
  a.expert_off = off.data;
  a.active = act.data;
  a.max_active = maxa;
  a.rows_hint = (int32_t)(TK / maxa);
  if ((rc = k3k_cu_moe_gemm_any(st, &a))) return rc;
  memset(&a.up, 0, sizeof a.up);
  a.w = mx_set(tab, 2, E, F);
  a.act = K3K_CU_ACT_NONE;
  a.round_inner = 0;
  a.N = D;
  a.K = F;
  a.x = ha.data;
  a.ldx = F;
  a.x_gather = NULL;
  a.y = yr.data;
  a.ldy = D;
  if ((rc = k3k_cu_moe_gemm_any(st, &a))) return rc;
  return k3k_cu_moe_combine_raw(st, &yr, &ri, wt, comb, NULL);
}
