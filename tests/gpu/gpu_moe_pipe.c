/* k3k-gpu-moe's grouped-pipeline cases (the MoE block as the runner issues it against the
 * reference chain of ops) and the decode-kernel variant cases (each variant of K3PD_MXDEC_TEST
 * re-runs the decode cases; ring variants 3+ are also compared byte for byte with variant 0),
 * plus the block launcher moe_gpu_stages shared with --perf (gpu_moe.h). Split from gpu_moe.c,
 * which keeps the router, plan, MXFP4 op, combine and dequant cases and main. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"

/* ---- grouped pipeline vs the reference chain ---- */
typedef struct {
  int32_t T, E, k;
  gpair z, lg, bias, w1p, w1s, w3p, w3s, w2p, w2s; /* experts stacked [E*N, ...] */
} moe_case;

static int run_ref_chain(gctx *g, moe_case *c, k3k_router_params_t *rp, gpair *y) {
  k3k_backend_t *be = g->ref;
  int32_t T = c->T, k = c->k, E = c->E, TK = T * k;
  int32_t *idx = malloc((size_t)TK * 4), *off = malloc((size_t)(E + 1) * 4);
  int32_t *gt = malloc((size_t)TK * 4), *ri = malloc((size_t)TK * 4);
  float *w = malloc((size_t)TK * 4);
  uint16_t *xin = malloc((size_t)TK * DL * 2), *h1 = malloc((size_t)TK * H1 * 2);
  uint16_t *h3 = malloc((size_t)TK * H1 * 2), *yr = malloc((size_t)TK * DL * 2);
  uint16_t *ha = malloc((size_t)TK * H1 * 2);
  int rc = (idx && off && gt && ri && w && xin && h1 && h3 && yr && ha) ? 0 : K3_ENOMEM;
  k3k_tensor_t ti = k3k_tensor_2d(be, K3K_I32, idx, T, k), tw = k3k_tensor_2d(be, K3K_F32, w, T, k);
  if (!rc) rc = k3k_router(be, rp, &c->lg.h, &c->bias.h, &ti, &tw);
  if (!rc) rc = k3k_moe_plan(idx, T, k, E, off, gt, ri);
  k3k_tensor_t tgt = k3k_tensor_1d(be, K3K_I32, gt, TK), txin = k3k_tensor_2d(be, K3K_BF16, xin, TK, DL);
  if (!rc) rc = k3k_get_rows(be, &c->z.h, &tgt, &txin);
  k3k_tensor_t th1 = k3k_tensor_2d(be, K3K_BF16, h1, TK, H1), th3 = k3k_tensor_2d(be, K3K_BF16, h3, TK, H1);
  k3k_tensor_t tyr = k3k_tensor_2d(be, K3K_BF16, yr, TK, DL);
  k3k_tensor_t tha = k3k_tensor_2d(be, K3K_BF16, ha, TK, H1);
  k3k_situ_params_t sp = {4.0f, 25.0f};
  for (int32_t e = 0; e < E && !rc; e++) {
    int64_t b = off[e], n = off[e + 1] - off[e];
    if (!n) continue;
    k3k_tensor_t xe = k3k_tensor_slice(&txin, 0, b, n), g1 = k3k_tensor_slice(&th1, 0, b, n);
    k3k_tensor_t g3 = k3k_tensor_slice(&th3, 0, b, n), ye = k3k_tensor_slice(&tyr, 0, b, n);
    k3k_tensor_t ga = k3k_tensor_slice(&tha, 0, b, n);
    k3k_tensor_t p1 = k3k_tensor_slice(&c->w1p.h, 0, (int64_t)e * H1, H1);
    k3k_tensor_t s1 = k3k_tensor_slice(&c->w1s.h, 0, (int64_t)e * H1, H1);
    k3k_tensor_t p3 = k3k_tensor_slice(&c->w3p.h, 0, (int64_t)e * H1, H1);
    k3k_tensor_t s3 = k3k_tensor_slice(&c->w3s.h, 0, (int64_t)e * H1, H1);
    k3k_tensor_t p2 = k3k_tensor_slice(&c->w2p.h, 0, (int64_t)e * DL, DL);
    k3k_tensor_t s2 = k3k_tensor_slice(&c->w2s.h, 0, (int64_t)e * DL, DL);
    rc = k3k_mxfp4_gemm(be, &xe, &p1, &s1, &g1);
    if (!rc) rc = k3k_mxfp4_gemm(be, &xe, &p3, &s3, &g3);
    if (!rc) rc = k3k_situ(be, &sp, &g1, &g3, &ga);
    if (!rc) rc = k3k_mxfp4_gemm(be, &ga, &p2, &s2, &ye);
  }
  k3k_tensor_t tri = k3k_tensor_2d(be, K3K_I32, ri, T, k);
  if (!rc) rc = k3k_moe_combine(be, &tyr, &tri, &tw, &y->h);
  free(idx);
  free(off);
  free(gt);
  free(ri);
  free(w);
  free(xin);
  free(h1);
  free(h3);
  free(yr);
  free(ha);
  return rc;
}

size_t moe_dev_bytes(int32_t T, int32_t E, int32_t k) {
  size_t TK = (size_t)T * k;
  return TK * 4 * 4 + (size_t)(2 * E + 4) * 4 + TK * (H1 + DL) * 2 + k3k_cu_moe_plan_scratch(T, E) +
         k3k_cu_moe_dq_scratch_bytes((int64_t)TK, E, H1, DL) + 2048;
}
int moe_gpu_stages(gctx *g, const moe_run *m, unsigned stage_mask) {
  cudaStream_t st = stream_of(g);
  int32_t TK = m->T * m->k, E = m->E;
  char *p = (char *)m->dev;
#define TAKE(ptr, type, n)           \
  type *ptr = (type *)p;             \
  p += (((size_t)(n) * sizeof(type)) + 255) & ~(size_t)255;
  TAKE(idx, int32_t, TK);
  TAKE(w, float, TK);
  TAKE(gt, int32_t, TK);
  TAKE(ri, int32_t, TK);
  TAKE(off, int32_t, E + 1);
  TAKE(act, int32_t, E + 1);
  TAKE(h, uint16_t, (size_t)TK * H1);
  TAKE(yr, uint16_t, (size_t)TK * DL);
  TAKE(scr, char, k3k_cu_moe_plan_scratch(m->T, E));
  TAKE(dqs, char, k3k_cu_moe_dq_scratch_bytes(TK, E, H1, DL));
#undef TAKE
  k3k_tensor_t ti = k3k_tensor_2d(g->cuda, K3K_I32, idx, m->T, m->k);
  k3k_tensor_t tw = k3k_tensor_2d(g->cuda, K3K_F32, w, m->T, m->k);
  k3k_router_params_t rp = {.top_k = m->k, .n_groups = 1, .topk_group = 1, .renormalize = 1,
                            .scaling = 2.827f};
  int rc = 0;
  if (stage_mask & 1)
    rc = k3k_cu_moe_route_plan(st, &rp, m->lg, m->bias, &ti, &tw, off, gt, ri, act, scr);
  if (stage_mask & 16) rc = k3k_router(g->cuda, &rp, m->lg, m->bias, &ti, &tw);
  if (!rc && (stage_mask & 16)) rc = k3k_cu_moe_plan(st, idx, m->T, m->k, E, off, gt, ri, act, NULL, scr);
  int32_t maxa = TK < E ? TK : E;
  k3k_cu_moe_gemm_args a;
  memset(&a, 0, sizeof a);
  a.w = m->w1;
  a.up = m->w3;
  a.act = K3K_CU_ACT_SITU;
  a.round_inner = 1;
  a.beta = 4.0f;
  a.beta_lin = 25.0f;
  a.N = H1;
  a.K = DL;
  a.x = (const uint16_t *)m->z->data;
  a.ldx = m->z->stride[0];
  a.x_gather = gt;
  a.y = h;
  a.ldy = H1;
  a.expert_off = off;
  a.active = act;
  a.max_active = maxa;
  a.rows_hint = TK / maxa;
  if (m->dq && (stage_mask & 6)) { /* dequant-once experts: gate/up (bit 1), down (bit 2) */
    k3k_cu_moe_dq_args d;
    memset(&d, 0, sizeof d);
    d.w1 = m->w1;
    d.w3 = m->w3;
    d.w2 = m->w2;
    d.act = K3K_CU_ACT_SITU;
    d.beta = 4.0f;
    d.beta_lin = 25.0f;
    d.F = H1;
    d.D = DL;
    d.E = E;
    d.T = m->T;
    d.k = m->k;
    d.x = (const uint16_t *)m->z->data;
    d.ldx = m->z->stride[0];
    d.gather_tok = gt;
    d.expert_off = off;
    d.h = h;
    d.y = yr;
    d.scratch = dqs;
    d.parts = (stage_mask >> 1) & 3u;
    if (!rc) rc = k3k_cu_moe_dq_experts(k3k_cuda_ctx_of(g->cuda), &d);
    stage_mask &= ~6u;
  }
  if (!rc && (stage_mask & 2)) rc = k3k_cu_moe_gemm(st, &a);
  a.w = m->w2;
  a.act = K3K_CU_ACT_NONE;
  a.N = DL;
  a.K = H1;
  a.x = h;
  a.ldx = H1;
  a.x_gather = NULL;
  a.y = yr;
  a.ldy = DL;
  if (!rc && (stage_mask & 4)) rc = k3k_cu_moe_gemm(st, &a);
  k3k_tensor_t tyr = k3k_tensor_2d(g->cuda, K3K_BF16, yr, TK, DL);
  k3k_tensor_t tri = k3k_tensor_2d(g->cuda, K3K_I32, ri, m->T, m->k);
  if (!rc && (stage_mask & 8)) rc = k3k_cu_moe_combine_raw(st, &tyr, &tri, &tw, m->y, NULL);
  return rc;
}
int moe_gpu(gctx *g, const moe_run *m) { return moe_gpu_stages(g, m, 15); }

int moe_n_active(gctx *g, const moe_run *m) {
  size_t TK = (size_t)m->T * m->k;
  /* same layout as moe_gpu_stages: idx, w, gt, ri (TK each), off (E+1), then active */
  size_t o = 4 * ((TK * 4 + 255) & ~(size_t)255) + (((size_t)(m->E + 1) * 4 + 255) & ~(size_t)255);
  int32_t n = -1;
  if (g->cuda->copy_to_host(g->cuda, &n, (char *)m->dev + o, 4)) return -1;
  return n;
}

static k3k_cu_mx_set stacked(const gpair *pk, const gpair *sc, int64_t N) {
  k3k_cu_mx_set s;
  memset(&s, 0, sizeof s);
  s.packed_base = (const uint8_t *)pk->d.data;
  s.scale_base = (const uint8_t *)sc->d.data;
  s.ld_packed = pk->d.stride[0];
  s.ld_scale = sc->d.stride[0];
  s.estride_packed = N * s.ld_packed;
  s.estride_scale = N * s.ld_scale;
  return s;
}

void pipeline_case(gctx *g, int32_t T, int32_t E, int32_t k) { pipeline_case_path(g, T, E, k, 0); }

void pipeline_case_path(gctx *g, int32_t T, int32_t E, int32_t k, int dq) {
  char what[120];
  snprintf(what, sizeof what, "moe pipeline (router+plan+%s gate/up+SiTU+down+combine) T=%d E=%d k=%d",
           dq ? "dequant-once bf16" : "W4A16", T, E, k);
  moe_case c;
  memset(&c, 0, sizeof c);
  c.T = T;
  c.E = E;
  c.k = k;
  gpair y;
  memset(&y, 0, sizeof y);
  int64_t sz[2] = {T, DL}, sl[2] = {T, E}, sb[1] = {E};
  int64_t s1p[2] = {(int64_t)E * H1, DL / 2}, s1s[2] = {(int64_t)E * H1, DL / 32};
  int64_t s2p[2] = {(int64_t)E * DL, H1 / 2}, s2s[2] = {(int64_t)E * DL, H1 / 32};
  void *dev = NULL;
  int rc = gpair_new(g, &c.z, K3K_BF16, 2, sz) || gpair_new(g, &c.lg, K3K_F32, 2, sl) ||
           gpair_new(g, &c.bias, K3K_F32, 1, sb) || gpair_new(g, &c.w1p, K3K_U8, 2, s1p) ||
           gpair_new(g, &c.w1s, K3K_U8, 2, s1s) || gpair_new(g, &c.w3p, K3K_U8, 2, s1p) ||
           gpair_new(g, &c.w3s, K3K_U8, 2, s1s) || gpair_new(g, &c.w2p, K3K_U8, 2, s2p) ||
           gpair_new(g, &c.w2s, K3K_U8, 2, s2s) || gpair_new(g, &y, K3K_BF16, 2, sz) ||
           g->cuda->alloc(g->cuda, moe_dev_bytes(T, E, k), &dev);
  if (!rc)
    rc = gpair_rand(g, &c.z, -1, 1) || gpair_rand(g, &c.lg, -6, 6) || gpair_rand(g, &c.bias, -0.2f, 0.2f) ||
         mx_rand(g, &c.w1p, &c.w1s, 118, 123) || mx_rand(g, &c.w3p, &c.w3s, 118, 123) ||
         mx_rand(g, &c.w2p, &c.w2s, 118, 123) || gpair_poison(g, &y);
  k3k_router_params_t rp = {.top_k = k, .n_groups = 1, .topk_group = 1, .renormalize = 1,
                            .scaling = 2.827f};
  if (!rc) rc = run_ref_chain(g, &c, &rp, &y);
  if (rc) {
    g_record(g, false, "%s: setup/reference failed (%d)", what, rc);
  } else {
    moe_run m = {T, E, k, &c.lg.d, &c.bias.d, &c.z.d, stacked(&c.w1p, &c.w1s, H1),
                 stacked(&c.w3p, &c.w3s, H1), stacked(&c.w2p, &c.w2s, DL), &y.d, dev, dq};
    rc = moe_gpu(g, &m);
    if (!rc) rc = g->cuda->synchronize(g->cuda);
    if (rc)
      g_record(g, false, "%s: cuda failed: %s", what, k3_strerror(rc));
    else
      gpair_check(g, &y, 1e-2, what);
  }
  gpair *all[] = {&c.z, &c.lg, &c.bias, &c.w1p, &c.w1s, &c.w3p, &c.w3s, &c.w2p, &c.w2s, &y};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i]->h.data) gpair_free(g, all[i]);
  if (dev) g->cuda->free(g->cuda, dev);
}

/* Bytes of a and b equal; else the first differing element (elem bytes wide) is printed. Also
 * fails when a holds the poison pattern (all-ones element: NaN / -1), i.e. an unwritten output. */
static bool same_bytes(gctx *g, const void *a, const void *b, size_t bytes, size_t elem,
                       const char *what) {
  const uint8_t *pa = (const uint8_t *)a, *pb = (const uint8_t *)b;
  size_t poison = 0, first = bytes;
  for (size_t i = 0; i < bytes; i += elem) {
    bool ones = true;
    for (size_t j = 0; j < elem; j++) ones = ones && pa[i + j] == 0xFF;
    poison += ones;
    if (first == bytes && memcmp(pa + i, pb + i, elem)) first = i;
  }
  g_record(g, first == bytes && poison == 0, "%s: %s, %zu unwritten of %zu", what,
           first == bytes ? "bit-identical" : "differs", poison, bytes / elem);
  if (first < bytes) printf("   first difference at element %zu\n", first / elem);
  return first == bytes && poison == 0;
}

/* The MXFP4_GEMM op (decode kernel: M <= 16) under decode variant v against variant 0 on the
 * same device data: the ring variants (3+) compute the same units in the same order, so the
 * outputs must be bit-identical. scol > 0: the scales are columns scol.. of a [N, K/32 + scol]
 * tensor, so no scale row starts 4-byte aligned (the ring copies whole aligned words). */
static void dec_exact_op_case(gctx *g, int v, int64_t M, int64_t N, int64_t K, k3k_dtype_t ydt,
                              int slo, int shi, int scol) {
  char what[160];
  snprintf(what, sizeof what,
           "decode variant %d vs 0: mxfp4_gemm M=%lld N=%lld K=%lld y=%s scales %d..%d%s", v, (long long)M, (long long)N, (long long)K, k3k_dtype_name(ydt), slo, shi,
           scol ? " (unaligned scale rows)" : "");
  gpair x, pk, sc, y;
  int64_t sx[2] = {M, K}, sp[2] = {N, K / 2}, ss[2] = {N, K / 32 + scol}, sy[2] = {M, N};
  if (gpair_new(g, &x, K3K_BF16, 2, sx) || gpair_new(g, &pk, K3K_U8, 2, sp) ||
      gpair_new(g, &sc, K3K_U8, 2, ss) || gpair_new(g, &y, ydt, 2, sy)) {
    g_record(g, false, "%s: alloc", what);
    return;
  }
  k3k_tensor_t sv = scol ? k3k_tensor_slice(&sc.d, 1, scol, K / 32) : sc.d;
  void *out[2] = {malloc(y.bytes), malloc(y.bytes)};
  int rc = !out[0] || !out[1] ? K3_ENOMEM : 0;
  if (!rc && (gpair_rand(g, &x, -1.0f, 1.0f) || mx_rand(g, &pk, &sc, slo, shi))) rc = K3_EDEVICE;
  const int prev = k3k_cu_moe_dec_variant(0);
  for (int pass = 0; pass < 2 && !rc; pass++) {
    const int want = pass ? v : 0;
    k3k_cu_moe_dec_variant(want);
    if (k3k_cu_moe_dec_variant(want) != want) rc = K3_EINVAL;
    if (!rc) rc = gpair_poison(g, &y);
    if (!rc) rc = k3k_mxfp4_gemm(g->cuda, &x.d, &pk.d, &sv, &y.d);
    if (!rc) rc = g->cuda->synchronize(g->cuda);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, out[pass], y.d.data, y.bytes);
  }
  k3k_cu_moe_dec_variant(prev);
  if (rc)
    g_record(g, false, "%s: failed: %s", what, k3_strerror(rc));
  else
    same_bytes(g, out[1], out[0], y.bytes, k3k_dtype_size(ydt), what);
  free(out[0]);
  free(out[1]);
  gpair_free(g, &x);
  gpair_free(g, &pk);
  gpair_free(g, &sc);
  gpair_free(g, &y);
}

/* The whole block (route/plan → gate/up + SiTU with the gather → down → combine, moe_gpu) under
 * decode variant v against variant 0: the gate/up and down outputs (h, yr in the scratch) and
 * y must be bit-identical. Under the PDL variants this is the pass the PDL contract is written
 * for (gate/up waits first, down issues its first units before its wait). No reference, so the
 * weights are generated on the device (random code bytes, one scale per matrix). */
static void dec_exact_pipeline_case(gctx *g, int v, int32_t T, int32_t E, int32_t k) {
  char what[120];
  snprintf(what, sizeof what, "decode variant %d vs 0: moe block T=%d E=%d k=%d", v, T, E, k);
  cudaStream_t st = stream_of(g);
  gpair z, lg, bias, y;
  int64_t sz[2] = {T, DL}, sl[2] = {T, E}, sb[1] = {E};
  const size_t TK = (size_t)T * k, np = (size_t)E * H1 * DL / 2, ns = (size_t)E * H1 * DL / 32;
  /* h and yr in moe_gpu_stages' scratch layout: after idx, w, gt, ri (TK each), off, act (E+1) */
  const size_t oh =
      4 * ((TK * 4 + 255) & ~(size_t)255) + 2 * (((size_t)(E + 1) * 4 + 255) & ~(size_t)255);
  const size_t nh = TK * (H1 + DL) * 2; /* h's size is a multiple of 256: yr follows directly */
  void *dev = NULL, *wd[6] = {NULL}, *hh[2] = {malloc(nh), malloc(nh)}, *yy[2] = {NULL, NULL};
  memset(&z, 0, sizeof z);
  memset(&lg, 0, sizeof lg);
  memset(&bias, 0, sizeof bias);
  memset(&y, 0, sizeof y);
  int rc = !hh[0] || !hh[1] || gpair_new(g, &z, K3K_BF16, 2, sz) ||
           gpair_new(g, &lg, K3K_F32, 2, sl) || gpair_new(g, &bias, K3K_F32, 1, sb) || gpair_new(g, &y, K3K_BF16, 2, sz) ||
           g->cuda->alloc(g->cuda, moe_dev_bytes(T, E, k), &dev);
  for (int i = 0; i < 6 && !rc; i++) /* w1, w3, w2: packed, scales (w2 has the same sizes) */
    rc = g->cuda->alloc(g->cuda, i & 1 ? ns : np, &wd[i]);
  if (!rc) {
    yy[0] = malloc(y.bytes);
    yy[1] = malloc(y.bytes);
    rc = !yy[0] || !yy[1] || gpair_rand(g, &z, -1, 1) || gpair_rand(g, &lg, -6, 6) ||
         gpair_rand(g, &bias, -0.2f, 0.2f);
    for (int i = 0; i < 3 && !rc; i++)
      rc = k3k_cu_fill_random(st, wd[2 * i], (int64_t)(np / 2), K3K_BF16, 40 + i, -1e30f, 1e30f) ||
           g->cuda->memset(g->cuda, wd[2 * i + 1], 119 + 2 * i, ns);
  }
  k3k_cu_mx_set S[3];
  for (int i = 0; i < 3; i++) {
    const int64_t N = i == 2 ? DL : H1, Kc = i == 2 ? H1 : DL;
    memset(&S[i], 0, sizeof S[i]);
    S[i].packed_base = (const uint8_t *)wd[2 * i];
    S[i].scale_base = (const uint8_t *)wd[2 * i + 1];
    S[i].ld_packed = Kc / 2;
    S[i].ld_scale = Kc / 32;
    S[i].estride_packed = N * (Kc / 2);
    S[i].estride_scale = N * (Kc / 32);
  }
  const int prev = k3k_cu_moe_dec_variant(0);
  for (int pass = 0; pass < 2 && !rc; pass++) {
    const int want = pass ? v : 0;
    k3k_cu_moe_dec_variant(want);
    if (k3k_cu_moe_dec_variant(want) != want) rc = K3_EINVAL;
    moe_run m = {T, E, k, &lg.d, &bias.d, &z.d, S[0], S[1], S[2], &y.d, dev, 0};
    if (!rc) rc = gpair_poison(g, &y);
    if (!rc) rc = g->cuda->memset(g->cuda, (char *)dev + oh, 0xFF, nh);
    if (!rc) rc = moe_gpu(g, &m);
    if (!rc) rc = g->cuda->synchronize(g->cuda);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, hh[pass], (char *)dev + oh, nh);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, yy[pass], y.d.data, y.bytes);
  }
  k3k_cu_moe_dec_variant(prev);
  if (rc) {
    g_record(g, false, "%s: failed (%d)", what, rc);
  } else {
    char w2[160];
    snprintf(w2, sizeof w2, "%s: gate/up h and down yr", what);
    same_bytes(g, hh[1], hh[0], nh, 2, w2);
    snprintf(w2, sizeof w2, "%s: y", what);
    same_bytes(g, yy[1], yy[0], y.bytes, 2, w2);
  }
  gpair *all[] = {&z, &lg, &bias, &y};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i]->h.data) gpair_free(g, all[i]);
  for (int i = 0; i < 6; i++)
    if (wd[i]) g->cuda->free(g->cuda, wd[i]);
  if (dev) g->cuda->free(g->cuda, dev);
  for (int i = 0; i < 2; i++) {
    free(hh[i]);
    free(yy[i]);
  }
}

/* The decode-kernel cases (rows_hint <= 16) again under each decode variant of K3PD_MXDEC_TEST
 * (a list; default "-1,0,1,2,5,9,12,99": the older cp.async kernel, the register-streaming
 * kernel and its measured alternatives, the ring kernels 5 and 9/12 (mx_dec4_kernel) and the
 * default 99 (variant 9 since session 16), each ring form also compared bit for bit with
 * variant 0). */
void dec_variant_cases(gctx *g) {
  const char *s = getenv("K3PD_MXDEC_TEST");
  int32_t *vs = NULL;
  size_t nv = 0;
  char err[96];
  if (k3_parse_int_list(s && *s ? s : "-1,0,1,2,5,9,12,99", &vs, &nv, err, sizeof err)) {
    g_record(g, false, "K3PD_MXDEC_TEST: %s", err);
    return;
  }
  for (size_t i = 0; i < nv; i++) {
    const int prev = k3k_cu_moe_dec_variant(vs[i]);
    if (k3k_cu_moe_dec_variant(vs[i]) != vs[i]) {
      g_record(g, false, "decode variant %d: not selectable", vs[i]);
      k3k_cu_moe_dec_variant(prev);
      continue;
    }
    printf("-- decode kernel variant %d\n", vs[i]);
    mx_gemm_case(g, 1, H1, DL, K3K_BF16, K3K_BF16, 118, 123);
    mx_gemm_case(g, 16, H1, DL, K3K_BF16, K3K_BF16, 118, 123); /* two token chunks */
    mx_gemm_case(g, 16, DL, H1, K3K_BF16, K3K_BF16, 118, 123);
    mx_gemm_case(g, 5, 256, 512, K3K_BF16, K3K_F32, 100, 160);
    mx_gemm_case(g, 3, 512, 1024, K3K_BF16, K3K_F32, 0, 20);
    mx_gemm_case(g, 11, 272, 384, K3K_BF16, K3K_F32, 110, 130); /* half tile, 3 k steps */
    pipeline_case(g, 2, 16, 8); /* gather, fused SiTU, experts of 1-2 rows */
    k3k_cu_moe_dec_variant(prev);
    if (vs[i] >= 3) { /* the ring variants and the default: bit-identical to variant 0 */
      dec_exact_op_case(g, vs[i], 1, H1, DL, K3K_BF16, 118, 123, 0);
      dec_exact_op_case(g, vs[i], 16, DL, H1, K3K_F32, 118, 123, 0);  /* two token chunks */
      dec_exact_op_case(g, vs[i], 11, 272, 384, K3K_F32, 110, 130, 0); /* half tile, slow path */
      dec_exact_op_case(g, vs[i], 5, 256, 512, K3K_F32, 100, 160, 0);
      dec_exact_op_case(g, vs[i], 3, 512, 1024, K3K_F32, 0, 20, 0);
      dec_exact_op_case(g, vs[i], 9, 64, 128, K3K_F32, 118, 123, 0);   /* 1 k step: 3 idle warps */
      dec_exact_op_case(g, vs[i], 7, 48, 384, K3K_F32, 110, 130, 1);   /* scale rows unaligned */
      dec_exact_pipeline_case(g, vs[i], 1, 32, 16);
      dec_exact_pipeline_case(g, vs[i], 16, 32, 8);
      dec_exact_pipeline_case(g, vs[i], 16, 4, 2); /* ~8 rows per expert: two token chunks */
    }
  }
  free(vs);
}

