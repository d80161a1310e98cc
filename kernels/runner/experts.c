/* The routed experts' pointer tables: MOE_ROUTED's t[3] (k3k.h) for every MoE layer, built once
 * at init from the bound expert weights, on every backend (device addresses on "cuda", host
 * addresses on the CPU backends).
 *
 * What it is for: ffn.c hands a layer's table to k3k_moe_routed, so the routed experts run as
 * one op (one fused device path, or the reference chain on the CPU backends) instead of the
 * runner's per-expert loop.
 * What it is not: a copy of the weights; the table holds their addresses only.
 * Invariants: a table exists only when every expert of every MoE layer is a contiguous
 * row-major matrix of the op's shape, 16-byte aligned, all MXFP4 or all dense of one dtype;
 * otherwise no layer has one and ffn.c keeps its chain of ops. The weights outlive the tables
 * (rn_experts_free runs before the weights are freed). */
#include <stdint.h>
#include <stdlib.h>

#include "k3pd/log.h"
#include "runner_internal.h"

static bool mat_ok(const k3k_tensor_t *w, k3k_dtype_t dt, int64_t n, int64_t k) {
  return w->dtype == dt && w->ndim == 2 && w->shape[0] == n && w->shape[1] == k &&
         w->stride[1] == 1 && w->stride[0] == k && ((uintptr_t)w->data & 15) == 0;
}

static bool expert_ok(const rn_expw_t *w, bool mx, k3k_dtype_t dt, int64_t n, int64_t k) {
  if (w->mx != mx) return false;
  if (!mx) return mat_ok(&w->w, dt, n, k);
  return k % 32 == 0 && mat_ok(&w->packed, K3K_U8, n, k / 2) &&
         mat_ok(&w->scale, K3K_U8, n, k / 32);
}

/* Whether every expert of the model has the op's layout; *wdt = the experts' MOE_ROUTED wdtype. */
static bool layout_ok(const k3_runner_t *r, k3k_dtype_t *wdt) {
  const k3_model_config_t *c = &r->cfg;
  const int64_t E = c->num_experts, F = c->moe_intermediate_size, D = c->expert_in_dim;
  bool first = true, mx = false;
  k3k_dtype_t dt = K3K_U8;
  for (int l = 0; l < c->num_layers; l++) {
    const rn_layer_t *L = &r->layers[l];
    if (!L->moe) continue;
    if (first) {
      mx = L->w1[0].mx;
      dt = mx ? K3K_U8 : L->w1[0].w.dtype;
      first = false;
    }
    for (int64_t e = 0; e < E; e++)
      if (!expert_ok(&L->w1[e], mx, dt, F, D) || !expert_ok(&L->w3[e], mx, dt, F, D) ||
          !expert_ok(&L->w2[e], mx, dt, D, F))
        return false;
  }
  *wdt = dt;
  return !first;
}

static int build(k3_runner_t *r, rn_layer_t *L, bool mx) {
  const int64_t E = r->cfg.num_experts, rows = mx ? 6 : 3;
  void **h = malloc((size_t)(rows * E) * sizeof *h);
  if (!h) return K3_ENOMEM;
  const rn_expw_t *sets[3] = {L->w1, L->w3, L->w2};
  for (int j = 0; j < 3; j++)
    for (int64_t e = 0; e < E; e++) {
      if (mx) {
        h[(2 * j) * E + e] = sets[j][e].packed.data;
        h[(2 * j + 1) * E + e] = sets[j][e].scale.data;
      } else {
        h[j * E + e] = sets[j][e].w.data;
      }
    }
  void *d = NULL;
  const size_t bytes = (size_t)(rows * E) * sizeof *h;
  int rc = r->be->alloc(r->be, bytes, &d);
  if (!rc && r->be->copy_from_host(r->be, d, h, bytes)) rc = K3_EDEVICE;
  free(h);
  if (rc) {
    if (d) r->be->free(r->be, d);
    return rc;
  }
  L->etab = k3k_tensor_2d(r->be, K3K_PTR, d, rows, E);
  return 0;
}

int rn_experts_init(k3_runner_t *r, char *err, size_t errlen) {
  k3k_dtype_t wdt = K3K_U8;
  if (r->cfg.num_experts <= 0) return 0;
  if (!layout_ok(r, &wdt)) {
    K3_INFO("runner: expert weights outside MOE_ROUTED's layout; the routed experts run op by op");
    return 0;
  }
  r->exp_wdtype = wdt;
  for (int l = 0; l < r->cfg.num_layers; l++) {
    if (!r->layers[l].moe) continue;
    int rc = build(r, &r->layers[l], wdt == K3K_U8);
    if (rc) {
      rn_seterr(err, errlen, "runner: cannot build the expert table of layer %d: %s", l,
                k3_strerror(rc));
      return rc;
    }
  }
  return 0;
}

void rn_experts_free(k3_runner_t *r) {
  if (!r->layers) return;
  for (int l = 0; l < r->cfg.num_layers; l++) {
    rn_layer_t *L = &r->layers[l];
    if (L->etab.data) r->be->free(r->be, L->etab.data);
    L->etab.data = NULL;
  }
}
