/* k3k-gpu-moe: parity and performance of the CUDA MoE kernels (router, device MoE plan, MXFP4
 * W4A16 GEMMs, combine, the grouped expert pipeline) against the reference backend.
 *
 * What it is for: issue 9 items 1-2 on the H200. Parity runs every case on fresh random data at
 * real K3 shapes (E = 896, k = 16, w1/w3 [3072,3584], w2 [3584,3072]), outputs poisoned first;
 * --perf times the MoE block at decode batch 1 and 16 and at an 8K-token prefill against
 * ceilings measured in the same run (copy bandwidth, cuBLASLt bf16 GEMM rate).
 * What it is not: the per-op suite of the other CUDA kernels (k3k-gpu-check).
 * Tolerances: router indices and plans exact (no ties: continuous random logits); router
 * weights 1e-5 (expf ulps); BF16 outputs 1e-2 (one bf16 rounding, ~2e-3 expected); F32 GEMM
 * outputs 1e-5 (fp32 summation order only); dequant exact.
 * Exit: 0 all passed, 1 some failed, 77 no device (ctest SKIP).
 * Usage: k3k-gpu-moe [--perf] [--perf-t T,T,..] [--no-parity] [--dec-variants-only]
 *        [--ref cpu|cpu-fast] [--seed N]   (--dec-variants-only: of the parity cases, only the
 *        decode-variant ones)
 * Environment: K3PD_MXDEC (decode kernel for the whole run), K3PD_MXDEC_TEST (decode variants
 * whose cases are re-run, default -1,1,2; variants 3+ also bit-for-bit against variant 0),
 * K3PD_MXDEC_PERF (decode variants timed by --perf). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"

cudaStream_t stream_of(gctx *g) { return k3k_cuda_ctx_of(g->cuda)->stream; }

/* Random MXFP4 weights: random code bytes, scale bytes uniform in [slo, shi]. */
int mx_rand(gctx *g, gpair *pk, gpair *sc, int slo, int shi) {
  for (size_t i = 0; i < pk->bytes; i++) ((uint8_t *)pk->h.data)[i] = (uint8_t)(g_rand_u64(g) >> 56);
  for (size_t i = 0; i < sc->bytes; i++)
    ((uint8_t *)sc->h.data)[i] = (uint8_t)(slo + (int)(g_rand_u64(g) % (uint64_t)(shi - slo + 1)));
  int rc = gpair_upload(g, pk);
  return rc ? rc : gpair_upload(g, sc);
}

/* ---- router ---- */
static void router_case(gctx *g, int64_t T, int64_t E, int k, int G, int tg, int renorm,
                        int biased, k3k_dtype_t bdt) {
  char what[160];
  snprintf(what, sizeof what, "router T=%lld E=%lld k=%d groups=%d/%d renorm=%d biased=%d bias=%s",
           (long long)T, (long long)E, k, tg, G, renorm, biased, k3k_dtype_name(bdt));
  gpair lg, bs, ix, wt;
  int64_t s_lg[2] = {T, E}, s_b[1] = {E}, s_o[2] = {T, k};
  if (gpair_new(g, &lg, K3K_F32, 2, s_lg) || gpair_new(g, &bs, bdt, 1, s_b) ||
      gpair_new(g, &ix, K3K_I32, 2, s_o) || gpair_new(g, &wt, K3K_F32, 2, s_o)) {
    g_record(g, false, "%s: alloc", what);
    return;
  }
  k3k_router_params_t p = {.top_k = k, .n_groups = G, .topk_group = tg, .renormalize = renorm,
                           .use_biased_weights = biased, .scaling = 2.827f};
  gpair *ps[4] = {&lg, &bs, &ix, &wt};
  if (!gpair_rand(g, &lg, -6.0f, 6.0f) && !gpair_rand(g, &bs, -0.2f, 0.2f) && !gpair_poison(g, &ix) &&
      !gpair_poison(g, &wt) && !g_run2(g, K3K_OP_ROUTER, &p, ps, 4, what)) {
    char w2[200];
    snprintf(w2, sizeof w2, "%s idx", what);
    gpair_check(g, &ix, 0, w2);
    snprintf(w2, sizeof w2, "%s w", what);
    gpair_check(g, &wt, 1e-5, w2);
  }
  gpair_free(g, &lg);
  gpair_free(g, &bs);
  gpair_free(g, &ix);
  gpair_free(g, &wt);
}

/* ---- MXFP4_GEMM / DEQUANT ---- */
void mx_gemm_case(gctx *g, int64_t M, int64_t N, int64_t K, k3k_dtype_t xdt,
                  k3k_dtype_t ydt, int slo, int shi) {
  char what[160];
  snprintf(what, sizeof what, "mxfp4_gemm M=%lld N=%lld K=%lld x=%s y=%s scales %d..%d",
           (long long)M, (long long)N, (long long)K, k3k_dtype_name(xdt), k3k_dtype_name(ydt), slo,
           shi);
  gpair x, pk, sc, y;
  int64_t sx[2] = {M, K}, sp[2] = {N, K / 2}, ss[2] = {N, K / 32}, sy[2] = {M, N};
  if (gpair_new(g, &x, xdt, 2, sx) || gpair_new(g, &pk, K3K_U8, 2, sp) ||
      gpair_new(g, &sc, K3K_U8, 2, ss) || gpair_new(g, &y, ydt, 2, sy)) {
    g_record(g, false, "%s: alloc", what);
    return;
  }
  gpair *ps[4] = {&x, &pk, &sc, &y};
  if (!gpair_rand(g, &x, -1.0f, 1.0f) && !mx_rand(g, &pk, &sc, slo, shi) && !gpair_poison(g, &y) &&
      !g_run2(g, K3K_OP_MXFP4_GEMM, NULL, ps, 4, what))
    gpair_check(g, &y, ydt == K3K_F32 ? 1e-5 : 1e-2, what);
  gpair_free(g, &x);
  gpair_free(g, &pk);
  gpair_free(g, &sc);
  gpair_free(g, &y);
}

static void mx_bad_scale_case(gctx *g) {
  gpair x, pk, sc, y, w;
  int64_t sx[2] = {4, 256}, sp[2] = {32, 128}, ss[2] = {32, 8}, sy[2] = {4, 32}, sw[2] = {32, 256};
  if (gpair_new(g, &x, K3K_BF16, 2, sx) || gpair_new(g, &pk, K3K_U8, 2, sp) ||
      gpair_new(g, &sc, K3K_U8, 2, ss) || gpair_new(g, &y, K3K_BF16, 2, sy) ||
      gpair_new(g, &w, K3K_F32, 2, sw)) {
    g_record(g, false, "mxfp4 bad scale: alloc");
    return;
  }
  gpair_rand(g, &x, -1, 1);
  mx_rand(g, &pk, &sc, 120, 130);
  ((uint8_t *)sc.h.data)[77] = 0xFF;
  gpair_upload(g, &sc);
  gpair_poison(g, &y);
  int rc = k3k_mxfp4_gemm(g->cuda, &x.d, &pk.d, &sc.d, &y.d);
  int rc2 = k3k_mxfp4_dequant(g->cuda, &pk.d, &sc.d, &w.d);
  g_record(g, rc == K3_EINVAL && rc2 == K3_EINVAL, "mxfp4 scale 0xFF rejected: gemm %s, dequant %s",
           k3_errname(rc), k3_errname(rc2));
  gpair_check(g, &y, 0, "mxfp4 scale 0xFF: output untouched (still poison)");
  gpair_free(g, &x);
  gpair_free(g, &pk);
  gpair_free(g, &sc);
  gpair_free(g, &y);
  gpair_free(g, &w);
}

static void mx_dequant_case(gctx *g, int64_t N, int64_t K, k3k_dtype_t wdt) {
  char what[120];
  snprintf(what, sizeof what, "mxfp4_dequant N=%lld K=%lld W=%s", (long long)N, (long long)K,
           k3k_dtype_name(wdt));
  gpair pk, sc, w;
  int64_t sp[2] = {N, K / 2}, ss[2] = {N, K / 32}, sw[2] = {N, K};
  if (gpair_new(g, &pk, K3K_U8, 2, sp) || gpair_new(g, &sc, K3K_U8, 2, ss) ||
      gpair_new(g, &w, wdt, 2, sw)) {
    g_record(g, false, "%s: alloc", what);
    return;
  }
  gpair *ps[3] = {&pk, &sc, &w};
  if (!mx_rand(g, &pk, &sc, 100, 150) && !gpair_poison(g, &w) &&
      !g_run2(g, K3K_OP_MXFP4_DEQUANT, NULL, ps, 3, what))
    gpair_check(g, &w, 0, what);
  gpair_free(g, &pk);
  gpair_free(g, &sc);
  gpair_free(g, &w);
}

/* ---- MOE_COMBINE ---- */
static void combine_case(gctx *g, int64_t T, int k, int64_t D, k3k_dtype_t dt, bool bad) {
  char what[120];
  snprintf(what, sizeof what, "moe_combine T=%lld k=%d D=%lld %s%s", (long long)T, k, (long long)D,
           k3k_dtype_name(dt), bad ? " bad row" : "");
  int64_t R = T * k;
  gpair rows, ri, w, y;
  int64_t sr[2] = {R, D}, si[2] = {T, k}, sy[2] = {T, D};
  if (gpair_new(g, &rows, dt, 2, sr) || gpair_new(g, &ri, K3K_I32, 2, si) ||
      gpair_new(g, &w, K3K_F32, 2, si) || gpair_new(g, &y, dt, 2, sy)) {
    g_record(g, false, "%s: alloc", what);
    return;
  }
  int32_t *p = (int32_t *)ri.h.data;
  for (int64_t i = 0; i < R; i++) p[i] = (int32_t)i;
  for (int64_t i = R - 1; i > 0; i--) { /* scramble */
    int64_t j = (int64_t)(g_rand_u64(g) % (uint64_t)(i + 1));
    int32_t t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
  p[R / 3] = -1;
  if (bad) p[R / 2] = (int32_t)R;
  gpair_upload(g, &ri);
  gpair_rand(g, &rows, -2, 2);
  gpair_rand(g, &w, 0, 0.3f);
  gpair_poison(g, &y);
  if (bad) {
    int rc1 = k3k_moe_combine(g->ref, &rows.h, &ri.h, &w.h, &y.h);
    int rc2 = k3k_moe_combine(g->cuda, &rows.d, &ri.d, &w.d, &y.d);
    g_record(g, rc1 == K3_ERANGE && rc2 == K3_ERANGE, "%s: ref %s cuda %s", what, k3_errname(rc1),
             k3_errname(rc2));
  } else {
    gpair *ps[4] = {&rows, &ri, &w, &y};
    if (!g_run2(g, K3K_OP_MOE_COMBINE, NULL, ps, 4, what))
      gpair_check(g, &y, dt == K3K_F32 ? 1e-6 : 1e-2, what);
  }
  gpair_free(g, &rows);
  gpair_free(g, &ri);
  gpair_free(g, &w);
  gpair_free(g, &y);
}

/* ---- device plan vs k3k_moe_plan ---- */
/* repeats: a token may choose one expert more than once (no router does, but the plan's order
 * (by expert, then token, then choice) still defines the rows, and the host plan follows it) */
static void plan_case(gctx *g, int32_t T, int32_t k, int32_t E, bool repeats) {
  char what[120];
  snprintf(what, sizeof what, "moe_plan T=%d k=%d E=%d%s", T, k, E, repeats ? " repeats" : "");
  int32_t TK = T * k;
  int32_t *idx = malloc((size_t)TK * 4), *off = malloc((size_t)(E + 1) * 4);
  int32_t *gt = malloc((size_t)TK * 4), *ri = malloc((size_t)TK * 4);
  int32_t *d_back = malloc((size_t)(2 * TK + 2 * E + 2) * 4);
  void *dmem = NULL, *scr = NULL;
  size_t dbytes = (size_t)(3 * TK + 2 * E + 3) * 4 + 64;
  bool ok = idx && off && gt && ri && d_back && !g->cuda->alloc(g->cuda, dbytes, &dmem) &&
            !g->cuda->alloc(g->cuda, k3k_cu_moe_plan_scratch(T, E) + 64, &scr);
  if (!ok) {
    g_record(g, false, "%s: alloc", what);
    goto out;
  }
  for (int32_t t = 0; t < T; t++) /* k experts per token, skewed toward low ids */
    for (int32_t i = 0; i < k; i++) {
      int32_t e;
      bool dup;
      do {
        uint64_t r = g_rand_u64(g);
        e = (int32_t)((r % 3 == 0) ? (r >> 8) % (uint64_t)(E < 40 ? E : 40) : (r >> 8) % (uint64_t)E);
        dup = false;
        for (int32_t j = 0; j < i && !repeats; j++) dup |= idx[t * k + j] == e;
      } while (dup);
      idx[t * k + i] = e;
    }
  k3k_moe_plan(idx, T, k, E, off, gt, ri);
  int32_t *d_idx = (int32_t *)dmem, *d_off = d_idx + TK, *d_gt = d_off + E + 1, *d_ri = d_gt + TK;
  int32_t *d_act = d_ri + TK;
  int *d_bad = (int *)(d_act + E + 1);
  cudaStream_t st = stream_of(g);
  int rc = g->cuda->copy_from_host(g->cuda, d_idx, idx, (size_t)TK * 4);
  if (!rc) rc = g->cuda->memset(g->cuda, d_bad, 0, 4);
  if (!rc) rc = k3k_cu_moe_plan(st, d_idx, T, k, E, d_off, d_gt, d_ri, d_act, d_bad, scr);
  int32_t *h_off = d_back, *h_gt = h_off + E + 1, *h_ri = h_gt + TK, *h_act = h_ri + TK;
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, h_off, d_off, (size_t)(E + 1 + 2 * TK) * 4);
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, h_act, d_act, (size_t)(E + 1) * 4);
  int bad = 1;
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, &bad, d_bad, 4);
  if (rc) {
    g_record(g, false, "%s: device plan failed: %s", what, k3_strerror(rc));
    goto out;
  }
  int nact = 0, mism = 0;
  for (int32_t e = 0; e <= E; e++) mism += h_off[e] != off[e];
  for (int32_t i = 0; i < TK; i++) mism += (h_gt[i] != gt[i]) + (h_ri[i] != ri[i]);
  for (int32_t e = 0; e < E; e++)
    if (off[e + 1] > off[e]) mism += h_act[1 + nact++] != e;
  mism += h_act[0] != nact;
  g_record(g, mism == 0 && bad == 0, "%s: %d mismatches (%d active experts), bad=%d", what, mism,
           nact, bad);
out:
  if (dmem) g->cuda->free(g->cuda, dmem);
  if (scr) g->cuda->free(g->cuda, scr);
  free(idx);
  free(off);
  free(gt);
  free(ri);
  free(d_back);
}

/* ---- fused router + plan (k3k_cu_moe_route_plan) vs the ROUTER op + k3k_moe_plan ---- */
static void route_plan_case(gctx *g, int32_t T, int32_t E, int k, int G, int tg, int biased) {
  char what[160];
  snprintf(what, sizeof what, "moe_route_plan T=%d E=%d k=%d groups=%d/%d biased=%d", T, E, k,
           tg, G, biased);
  gpair lg, bs, ix, wt;
  memset(&lg, 0, sizeof lg);
  memset(&bs, 0, sizeof bs);
  memset(&ix, 0, sizeof ix);
  memset(&wt, 0, sizeof wt);
  int64_t s_lg[2] = {T, E}, s_b[1] = {E}, s_o[2] = {T, k};
  int32_t TK = T * k;
  int32_t *off = malloc((size_t)(E + 1) * 4), *gt = malloc((size_t)TK * 4);
  int32_t *ri = malloc((size_t)TK * 4), *back = malloc((size_t)(2 * TK + 2 * E + 2) * 4);
  void *dmem = NULL, *scr = NULL;
  bool ok = off && gt && ri && back && !gpair_new(g, &lg, K3K_F32, 2, s_lg) &&
            !gpair_new(g, &bs, K3K_F32, 1, s_b) && !gpair_new(g, &ix, K3K_I32, 2, s_o) &&
            !gpair_new(g, &wt, K3K_F32, 2, s_o) &&
            !g->cuda->alloc(g->cuda, (size_t)(2 * TK + 2 * E + 2) * 4 + 64, &dmem) &&
            !g->cuda->alloc(g->cuda, k3k_cu_moe_plan_scratch(T, E) + 64, &scr);
  k3k_router_params_t p = {.top_k = k, .n_groups = G, .topk_group = tg, .renormalize = 1,
                           .use_biased_weights = biased, .scaling = 2.827f};
  int rc = ok ? 0 : K3_ENOMEM;
  if (!rc) rc = gpair_rand(g, &lg, -6.0f, 6.0f) || gpair_rand(g, &bs, -0.2f, 0.2f) ||
                gpair_poison(g, &ix) || gpair_poison(g, &wt);
  if (!rc) rc = k3k_router(g->ref, &p, &lg.h, &bs.h, &ix.h, &wt.h);
  if (!rc) rc = k3k_moe_plan((const int32_t *)ix.h.data, T, k, E, off, gt, ri);
  int32_t *d_off = (int32_t *)dmem, *d_gt = d_off + E + 1, *d_ri = d_gt + TK, *d_act = d_ri + TK;
  if (!rc) rc = g->cuda->memset(g->cuda, dmem, 0xFF, (size_t)(2 * TK + 2 * E + 2) * 4);
  if (!rc)
    rc = k3k_cu_moe_route_plan(stream_of(g), &p, &lg.d, &bs.d, &ix.d, &wt.d, d_off, d_gt, d_ri,
                               d_act, scr);
  int32_t *h_off = back, *h_gt = h_off + E + 1, *h_ri = h_gt + TK, *h_act = h_ri + TK;
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, back, dmem, (size_t)(2 * TK + 2 * E + 2) * 4);
  if (rc) {
    g_record(g, false, "%s: failed: %s", what, k3_strerror(rc));
  } else {
    char w2[200];
    snprintf(w2, sizeof w2, "%s idx", what);
    gpair_check(g, &ix, 0, w2);
    snprintf(w2, sizeof w2, "%s w", what);
    gpair_check(g, &wt, 1e-5, w2);
    int nact = 0, mism = 0;
    for (int32_t e = 0; e <= E; e++) mism += h_off[e] != off[e];
    for (int32_t i = 0; i < TK; i++) mism += (h_gt[i] != gt[i]) + (h_ri[i] != ri[i]);
    for (int32_t e = 0; e < E; e++)
      if (off[e + 1] > off[e]) mism += h_act[1 + nact++] != e;
    mism += h_act[0] != nact;
    g_record(g, mism == 0, "%s plan: %d mismatches (%d active experts)", what, mism, nact);
  }
  gpair *all[] = {&lg, &bs, &ix, &wt};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i]->h.data) gpair_free(g, all[i]);
  if (dmem) g->cuda->free(g->cuda, dmem);
  if (scr) g->cuda->free(g->cuda, scr);
  free(off);
  free(gt);
  free(ri);
  free(back);
}

int gpu_moe_parity(gctx *g) {
  router_case(g, 64, 896, 16, 1, 1, 1, 0, K3K_F32);  /* K3 */
  router_case(g, 1, 896, 16, 1, 1, 1, 0, K3K_F32);
  router_case(g, 33, 256, 8, 8, 4, 1, 0, K3K_BF16);  /* DeepSeek-style grouped form */
  router_case(g, 16, 896, 16, 8, 3, 0, 1, K3K_F32);  /* grouped, biased weights, no renorm */
  router_case(g, 7, 64, 6, 1, 1, 1, 1, K3K_BF16);    /* 48B-like quirk */
  mx_gemm_case(g, 1, H1, DL, K3K_BF16, K3K_BF16, 118, 123);   /* w1/w3 decode */
  mx_gemm_case(g, 16, H1, DL, K3K_BF16, K3K_BF16, 118, 123);
  mx_gemm_case(g, 100, H1, DL, K3K_BF16, K3K_BF16, 118, 123); /* prefill tiling */
  mx_gemm_case(g, 16, DL, H1, K3K_BF16, K3K_BF16, 118, 123);  /* w2 */
  mx_gemm_case(g, 37, DL, H1, K3K_BF16, K3K_F32, 118, 123);   /* fp32 out: order only */
  mx_gemm_case(g, 300, DL, H1, K3K_BF16, K3K_F32, 118, 123);  /* 3 token tiles of 100 */
  mx_gemm_case(g, 5, 256, 512, K3K_BF16, K3K_F32, 100, 160);  /* scales > 128 (two multiplies) */
  mx_gemm_case(g, 3, 512, 1024, K3K_BF16, K3K_F32, 0, 20);    /* tiny scales: bf16 subnormals */
  mx_gemm_case(g, 3, 300, 640, K3K_F32, K3K_F32, 110, 140);   /* fp32 x: generic kernel */
  mx_gemm_case(g, 4, 24, 64, K3K_BF16, K3K_BF16, 118, 123);   /* odd shape: generic kernel */
  mx_gemm_case(g, 80, 208, 256, K3K_BF16, K3K_BF16, 118, 123); /* prefill: partial weight tile */
  mx_gemm_case(g, 40, 256, 512, K3K_BF16, K3K_F32, 100, 160);   /* prefill: scales > 128 */
  mx_gemm_case(g, 33, 512, 1024, K3K_BF16, K3K_F32, 0, 20);     /* prefill: bf16 subnormals */
  mx_dequant_case(g, 256, 512, K3K_F32);
  mx_dequant_case(g, 96, 3584, K3K_BF16);
  mx_bad_scale_case(g);
  combine_case(g, 16, 16, DL, K3K_BF16, false);
  combine_case(g, 5, 16, DL, K3K_F32, false);
  combine_case(g, 3, 4, 100, K3K_BF16, false); /* scalar path */
  combine_case(g, 4, 4, 64, K3K_BF16, true);
  combine_case(g, 2, 20, DL, K3K_BF16, false); /* k > 16: two batches of row loads */
  plan_case(g, 1, 16, 896, false);
  plan_case(g, 16, 16, 896, false);
  plan_case(g, 300, 16, 896, false); /* three chunks */
  plan_case(g, 64, 8, 32, false);
  plan_case(g, 64, 16, 256, false);  /* medium decode, batch 64 (the 3-launch plan) */
  plan_case(g, 64, 16, 256, true);
  plan_case(g, 300, 40, 896, true);  /* 5120 pairs per chunk: three shared-memory stages */
  plan_case(g, 8192, 16, 896, false); /* K3 prefill */
  route_plan_case(g, 1, 896, 16, 1, 1, 0);  /* K3 decode: one launch (warp form: E² too big) */
  route_plan_case(g, 1, 256, 16, 1, 1, 1);  /* medium decode, batch 1 (rank form) */
  route_plan_case(g, 4, 256, 16, 1, 1, 0);  /* warp form (T·E² > 2^16) */
  route_plan_case(g, 2, 128, 16, 1, 1, 0);  /* rank form, 2 threads per candidate */
  route_plan_case(g, 16, 256, 16, 1, 1, 0); /* warp form */
  route_plan_case(g, 3, 16, 8, 1, 1, 0);    /* 4-layer config, batch 3 (rank form) */
  route_plan_case(g, 16, 896, 16, 1, 1, 0);
  route_plan_case(g, 256, 896, 16, 1, 1, 1); /* T*k = 4096: the fused limit */
  route_plan_case(g, 300, 896, 16, 1, 1, 0); /* T*k > 4096: router kernel + 3-launch plan */
  route_plan_case(g, 40, 64, 6, 1, 1, 1);    /* 48B-like: E = 64 (two lanes' worth of 32) */
  route_plan_case(g, 9, 256, 8, 8, 4, 0);    /* grouped: fallback path */
  pipeline_case(g, 1, 32, 16);
  pipeline_case(g, 16, 32, 8);
  pipeline_case(g, 96, 4, 2); /* ~48 rows per expert: prefill tiling */
  pipeline_case(g, 200, 3, 2); /* ~133 rows per expert: two token tiles, ragged column tiles */
  pipeline_case(g, 600, 2, 1); /* ~300 rows per expert: two wgmma token tiles per expert */
  mx_gemm_case(g, 11, 272, 384, K3K_BF16, K3K_F32, 110, 130); /* decode: half tile, 3 k steps */
  dec_variant_cases(g);
  gpu_moe_dq_parity(g);        /* dequant-once prefill path (gpu_moe_dq.c) */
  gpu_moe_bf16_parity(g);      /* 48B bf16 experts (gpu_moe_bf16.c) */
  return g->failed;
}

int main(int argc, char **argv) {
  bool perf = false, parity = true, dec_only = false, dq_only = false;
  int32_t perf_e = 896;
  int32_t *Ts = NULL;
  size_t nT = 0;
  const char *ref = "cpu-fast";
  uint64_t seed = 0xC0FFEE11ull;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--perf")) perf = true;
    else if (!strcmp(argv[i], "--no-parity")) parity = false;
    else if (!strcmp(argv[i], "--dec-variants-only")) dec_only = true;
    else if (!strcmp(argv[i], "--dq-only")) dq_only = true;
    else if (!strcmp(argv[i], "--perf-e") && i + 1 < argc) {
      perf_e = atoi(argv[++i]);
      if (perf_e < 16 || perf_e > 1024) {
        fprintf(stderr, "--perf-e: expert count %d outside 16..1024\n", perf_e);
        free(Ts);
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--perf-t") && i + 1 < argc) {
      char err[128];
      free(Ts);
      Ts = NULL;
      if (k3_parse_int_list(argv[++i], &Ts, &nT, err, sizeof err) || nT == 0) {
        fprintf(stderr, "--perf-t: %s\n", nT == 0 ? "empty list" : err);
        free(Ts);
        return 2;
      }
      for (size_t j = 0; j < nT; j++)
        if (Ts[j] < 1 || Ts[j] > 65536) {
          fprintf(stderr, "--perf-t: token count %d outside 1..65536\n", Ts[j]);
          free(Ts);
          return 2;
        }
      perf = true;
    }
    else if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr,
              "usage: %s [--perf] [--perf-t T,T,..] [--perf-e E] [--no-parity] [--dec-variants-only] [--dq-only] "
              "[--ref cpu|cpu-fast] [--seed N]\n",
              argv[0]);
      free(Ts);
      return 2;
    }
  }
  gctx g;
  int orc = gctx_open(&g, ref, seed, "k3k-gpu-moe");
  if (orc) {
    free(Ts);
    return orc;
  }
  if (parity && dec_only)
    dec_variant_cases(&g);
  else if (parity && dq_only) { /* the dequant-once path and its bf16 mode (and the bf16 cases) */
    gpu_moe_dq_parity(&g);
    gpu_moe_bf16_parity(&g);
  }
  else if (parity)
    gpu_moe_parity(&g);
  if (perf) gpu_moe_perf(&g, Ts, nT, perf_e);
  free(Ts);
  printf("%d passed, %d failed\n", g.passed, g.failed);
  k3k_backends_shutdown();
  return g.failed ? 1 : 0;
}
