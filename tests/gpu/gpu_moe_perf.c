/* k3k-gpu-moe --perf: the MoE block at real K3 shapes (E = 896, k = 16, latent 3584, expert
 * width 3072, every expert's MXFP4 weights resident: 15.7 GB) at decode batch 1 and 16 and an
 * 8K-token prefill (--perf-e E: another expert count, e.g. 256 for the medium preset), timed
 * with CUDA events (median after warm-up) next to ceilings measured in the same run: device copy bandwidth (2 GiB D2D, bytes read + written) and the cuBLASLt bf16
 * GEMM rate (8192^3, fp32 accumulate).
 * Floors: decode = expert bytes read (active experts × 17.6 MB of packed codes + scales) / copy
 * bandwidth; prefill = expert FLOPs (2 · T·k · 3 · 3072 · 3584) / GEMM rate. Lines start with
 * PERF; "x" is time / floor. K3PD_MXDEC_PERF=v,v,.. also times the decode-kernel variants
 * (k3k_cu_moe_dec_variant; v + 100: the same kernel without the math, timing only) on the
 * same data: gate/up, down, both, and the whole block (single and 20 back-to-back). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"

typedef int (*pfn)(void *arg);

static double median_s(gctx *g, pfn fn, void *arg, int iters) {
  cudaStream_t st = k3k_cuda_ctx_of(g->cuda)->stream;
  cudaEvent_t e0, e1;
  double ts[32];
  if (iters > 32) iters = 32;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double r = -1;
  for (int i = 0; i < 2; i++)
    if (fn(arg)) goto out;
  for (int i = 0; i < iters; i++) {
    cudaEventRecord(e0, st);
    if (fn(arg)) goto out;
    cudaEventRecord(e1, st);
    if (cudaEventSynchronize(e1) != cudaSuccess) goto out;
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    ts[i] = ms * 1e-3;
  }
  for (int i = 1; i < iters; i++)
    for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
      double t = ts[j];
      ts[j] = ts[j - 1];
      ts[j - 1] = t;
    }
  r = ts[iters / 2];
out:
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return r;
}

typedef struct {
  gctx *g;
  void *a, *b, *c;
  size_t bytes;
  int64_t n;
} ceil_arg;
static int run_copy(void *p) {
  ceil_arg *c = (ceil_arg *)p;
  return c->g->cuda->copy(c->g->cuda, c->a, c->b, c->bytes);
}
static int run_gemm(void *p) {
  ceil_arg *c = (ceil_arg *)p;
  return k3k_cuda_lt_gemm(k3k_cuda_ctx_of(c->g->cuda), 1, 0, c->n, c->n, c->n, c->a, CUDA_R_16BF,
                          c->n, 0, c->b, CUDA_R_16BF, c->n, 0, c->c, CUDA_R_16BF, c->n, 0, 1);
}

typedef struct {
  gctx *g;
  moe_run *m;
  unsigned mask;
} moe_arg;
static int run_moe(void *p) {
  moe_arg *a = (moe_arg *)p;
  return moe_gpu_stages(a->g, a->m, a->mask);
}
/* 20 back-to-back launches of the stages: the GPU time per launch without the host's launch
 * latency in between (what a CUDA graph of the decode step sees). */
static int run_moe20(void *p) {
  moe_arg *a = (moe_arg *)p;
  for (int i = 0; i < 20; i++) {
    int rc = moe_gpu_stages(a->g, a->m, a->mask);
    if (rc) return rc;
  }
  return 0;
}

/* The dequant-once path's dequantisation alone: K3K_CU_MOE_DQ_GROUP experts' gate + up matrices
 * (what one gate/up group writes) into bf16 slots. */
typedef struct {
  gctx *g;
  const moe_run *m;
  uint16_t *dst;
} dq_arg;
static int run_dequant(void *p) {
  dq_arg *d = (dq_arg *)p;
  int32_t ids[K3K_CU_MOE_DQ_GROUP];
  for (int i = 0; i < K3K_CU_MOE_DQ_GROUP; i++) ids[i] = i % d->m->E;
  return k3k_cu_mx_dequant_experts(k3k_cuda_ctx_of(d->g->cuda)->stream, &d->m->w1, &d->m->w3, ids,
                                   K3K_CU_MOE_DQ_GROUP, H1, DL, d->dst, 0);
}

static void line(const char *name, double t, double floor_t, double bytes, double flop) {
  printf("PERF %-52s %9.1f us  %7.1f GB/s %6.1f TFLOP/s  floor %8.1f us  x%.2f\n", name, t * 1e6,
         bytes / t * 1e-9, flop / t * 1e-12, floor_t * 1e6, t / floor_t);
  fflush(stdout);
}

static void *dalloc(gctx *g, size_t bytes) {
  void *p = NULL;
  return g->cuda->alloc(g->cuda, bytes, &p) ? NULL : p;
}

/* Relative Frobenius distance of two bf16 device arrays of n elements (the dequant-once path
 * against the grouped kernel at real shapes); -1 on failure. */
static double rel_dist_bf16(gctx *g, const void *a, const void *b, int64_t n) {
  uint16_t *ha = malloc((size_t)n * 2), *hb = malloc((size_t)n * 2);
  double num = 0, den = 0, r = -1;
  if (ha && hb && !g->cuda->copy_to_host(g->cuda, ha, a, (size_t)n * 2) &&
      !g->cuda->copy_to_host(g->cuda, hb, b, (size_t)n * 2)) {
    for (int64_t i = 0; i < n; i++) {
      union { uint32_t u; float f; } x = {(uint32_t)ha[i] << 16}, y = {(uint32_t)hb[i] << 16};
      num += ((double)x.f - y.f) * ((double)x.f - y.f);
      den += (double)x.f * x.f;
    }
    r = den > 0 ? sqrt(num / den) : sqrt(num);
  }
  free(ha);
  free(hb);
  return r;
}

int gpu_moe_perf(gctx *g, const int32_t *Ts, size_t nT, int32_t E) {
  cudaStream_t st = k3k_cuda_ctx_of(g->cuda)->stream;
  const int32_t K = 16;
  /* ceilings */
  ceil_arg c = {g, NULL, NULL, NULL, (size_t)1 << 31, 8192};
  c.a = dalloc(g, c.bytes);
  c.b = dalloc(g, c.bytes);
  if (!c.a || !c.b) {
    g_record(g, false, "perf: ceiling buffers");
    return 1;
  }
  k3k_cu_fill_random(st, c.b, (int64_t)(c.bytes / 2), K3K_BF16, 1, -1, 1);
  double bw = 2.0 * (double)c.bytes / median_s(g, run_copy, &c, 10);
  g->cuda->free(g->cuda, c.a);
  g->cuda->free(g->cuda, c.b);
  size_t gb = (size_t)c.n * c.n * 2;
  c.a = dalloc(g, gb);
  c.b = dalloc(g, gb);
  c.c = dalloc(g, gb);
  k3k_cu_fill_random(st, c.a, c.n * c.n, K3K_BF16, 2, -1, 1);
  k3k_cu_fill_random(st, c.b, c.n * c.n, K3K_BF16, 3, -1, 1);
  double rate = 2.0 * c.n * c.n * c.n / median_s(g, run_gemm, &c, 10);
  g->cuda->free(g->cuda, c.a);
  g->cuda->free(g->cuda, c.b);
  g->cuda->free(g->cuda, c.c);
  printf("PERF ceilings: copy %.0f GB/s (read+write), bf16 GEMM %.1f TFLOP/s\n", bw * 1e-9,
         rate * 1e-12);

  /* all 896 experts resident, stacked per matrix; random codes, scales near 2^-6 */
  const size_t p13 = (size_t)H1 * DL / 2, s13 = (size_t)H1 * DL / 32;
  const size_t p2 = (size_t)DL * H1 / 2, s2 = (size_t)DL * H1 / 32;
  const double expert_bytes = 2.0 * (double)(p13 + s13) + (double)(p2 + s2);
  uint8_t *w1p = dalloc(g, E * p13), *w1s = dalloc(g, E * s13), *w3p = dalloc(g, E * p13);
  uint8_t *w3s = dalloc(g, E * s13), *w2p = dalloc(g, E * p2), *w2s = dalloc(g, E * s2);
  if (!w1p || !w1s || !w3p || !w3s || !w2p || !w2s) {
    g_record(g, false, "perf: expert weights (15.7 GB)");
    return 1;
  }
  k3k_cu_fill_random(st, w1p, (int64_t)(E * p13 / 2), K3K_BF16, 11, -1e30f, 1e30f);
  k3k_cu_fill_random(st, w3p, (int64_t)(E * p13 / 2), K3K_BF16, 12, -1e30f, 1e30f);
  k3k_cu_fill_random(st, w2p, (int64_t)(E * p2 / 2), K3K_BF16, 13, -1e30f, 1e30f);
  g->cuda->memset(g->cuda, w1s, 121, E * s13);
  g->cuda->memset(g->cuda, w3s, 121, E * s13);
  g->cuda->memset(g->cuda, w2s, 121, E * s2);
  k3k_cu_mx_set S1 = {NULL, NULL, w1p, w1s, (int64_t)p13, (int64_t)s13, DL / 2, DL / 32};
  k3k_cu_mx_set S3 = {NULL, NULL, w3p, w3s, (int64_t)p13, (int64_t)s13, DL / 2, DL / 32};
  k3k_cu_mx_set S2 = {NULL, NULL, w2p, w2s, (int64_t)p2, (int64_t)s2, H1 / 2, H1 / 32};
  float *bias = dalloc(g, E * 4);
  k3k_cu_fill_random(st, bias, E, K3K_F32, 14, -0.01f, 0.01f);
  k3k_tensor_t tb = k3k_tensor_1d(g->cuda, K3K_F32, bias, E);

  static const int32_t Tdef[3] = {1, 16, 8192};
  if (!Ts) {
    Ts = Tdef;
    nT = 3;
  }
  for (int i = 0; i < (int)nT; i++) {
    int32_t T = Ts[i];
    float *lg = dalloc(g, (size_t)T * E * 4);
    uint16_t *z = dalloc(g, (size_t)T * DL * 2), *y = dalloc(g, (size_t)T * DL * 2);
    void *dev = dalloc(g, moe_dev_bytes(T, E, K));
    if (!lg || !z || !y || !dev) {
      g_record(g, false, "perf: buffers for T=%d", T);
      return 1;
    }
    k3k_cu_fill_random(st, lg, (int64_t)T * E, K3K_F32, 20 + i, -3, 3); /* unsaturated */
    k3k_cu_fill_random(st, z, (int64_t)T * DL, K3K_BF16, 30 + i, -1, 1);
    k3k_tensor_t tl = k3k_tensor_2d(g->cuda, K3K_F32, lg, T, E);
    k3k_tensor_t tz = k3k_tensor_2d(g->cuda, K3K_BF16, z, T, DL);
    k3k_tensor_t ty = k3k_tensor_2d(g->cuda, K3K_BF16, y, T, DL);
    moe_run m = {T, E, K, &tl, &tb, &tz, S1, S3, S2, &ty, dev, 0};
    moe_arg a = {g, &m, 15};
    if (moe_gpu(g, &m) || g->cuda->synchronize(g->cuda)) {
      g_record(g, false, "perf: MoE block T=%d failed", T);
      return 1;
    }
    int nact = moe_n_active(g, &m);
    double bytes = nact * expert_bytes, flop = 2.0 * T * K * 3.0 * H1 * DL;
    double floor_b = bytes / bw, floor_f = flop / rate, fl = floor_b > floor_f ? floor_b : floor_f;
    char name[96];
    /* K3PD_MOE_PERF_DQ_ONLY=1: time only the dequant-once path (the grouped kernel still
     * produces the comparison output above) */
    const bool grouped = !getenv("K3PD_MOE_PERF_DQ_ONLY");
    a.mask = 15;
    double t_all = grouped ? median_s(g, run_moe, &a, 20) : 0;
    a.mask = 6;
    double t_gemm = grouped ? median_s(g, run_moe, &a, 20) : 0;
    a.mask = 2;
    double t_13 = grouped ? median_s(g, run_moe, &a, 20) : 0;
    a.mask = 4;
    double t_2 = grouped ? median_s(g, run_moe, &a, 20) : 0;
    a.mask = 1;
    double t_rp = median_s(g, run_moe, &a, 20);
    double t_rp20 = median_s(g, run_moe20, &a, 10) / 20;
    a.mask = 16;
    double t_rp4 = median_s(g, run_moe, &a, 20);
    double t_rp420 = median_s(g, run_moe20, &a, 10) / 20;
    printf("PERF T=%d tokens, %d active experts, %.1f MB expert bytes, %.2f TFLOP\n", T, nact,
           bytes * 1e-6, flop * 1e-12);
    if (grouped) {
      snprintf(name, sizeof name, "moe block T=%d (router..combine)", T);
      line(name, t_all, fl, bytes, flop);
      snprintf(name, sizeof name, "moe expert GEMMs T=%d (gate/up+SiTU, down)", T);
      line(name, t_gemm, fl, bytes, flop);
      snprintf(name, sizeof name, "  gate/up+SiTU T=%d", T);
      line(name, t_13, fl * 2.0 / 3.0, bytes * 2.0 / 3.0, flop * 2.0 / 3.0);
      snprintf(name, sizeof name, "  down T=%d", T);
      line(name, t_2, fl / 3.0, bytes / 3.0, flop / 3.0);
    }
    snprintf(name, sizeof name, "  router+plan T=%d", T);
    double rb = (double)T * E * 4;
    line(name, t_rp, rb / bw, rb, 0);
    snprintf(name, sizeof name, "  router+plan T=%d, back-to-back", T);
    line(name, t_rp20, rb / bw, rb, 0);
    snprintf(name, sizeof name, "  router op + 3-launch plan T=%d", T);
    line(name, t_rp4, rb / bw, rb, 0);
    snprintf(name, sizeof name, "  router op + 3-launch plan T=%d, back-to-back", T);
    line(name, t_rp420, rb / bw, rb, 0);
    /* the dequant-once path (moe_dq.h) on the same data: its output against the grouped
     * kernel's, then the same timings; the path rule's answer for this batch is printed */
    if (!getenv("K3PD_MOE_PERF_NO_DQ")) {
      uint16_t *y0 = dalloc(g, (size_t)T * DL * 2);
      int rc = y0 ? g->cuda->copy(g->cuda, y0, y, (size_t)T * DL * 2) : K3_ENOMEM;
      m.dq = 1;
      if (!rc) rc = moe_gpu(g, &m);
      if (!rc) rc = g->cuda->synchronize(g->cuda);
      double d = rc ? -1 : rel_dist_bf16(g, y0, y, (int64_t)T * DL);
      g_record(g, !rc && d >= 0 && d < 1e-2,
               "perf: dequant-once block vs grouped kernel T=%d E=%d: rel dist %.2e (tol 1e-2)%s%s", T,
               E, d, rc ? " " : "", rc ? k3_strerror(rc) : "");
      if (y0) g->cuda->free(g->cuda, y0);
      if (!rc) {
        a.mask = 15;
        double d_all = median_s(g, run_moe, &a, 20);
        a.mask = 6;
        double d_gemm = median_s(g, run_moe, &a, 20);
        a.mask = 2;
        double d_13 = median_s(g, run_moe, &a, 20);
        a.mask = 4;
        double d_2 = median_s(g, run_moe, &a, 20);
        printf("PERF dequant-once T=%d E=%d: rows/active expert %.1f, path rule picks %s\n", T, E,
               (double)T * K / nact, k3k_cu_moe_dq_wanted(T, K, E) ? "dequant-once" : "grouped W4A16");
        snprintf(name, sizeof name, "dq moe block T=%d (router..combine)", T);
        line(name, d_all, fl, bytes, flop);
        snprintf(name, sizeof name, "dq expert GEMMs T=%d (gate/up+SiTU, down)", T);
        line(name, d_gemm, fl, bytes, flop);
        snprintf(name, sizeof name, "  dq gate/up+SiTU T=%d (incl. gather)", T);
        line(name, d_13, fl * 2.0 / 3.0, bytes * 2.0 / 3.0, flop * 2.0 / 3.0);
        snprintf(name, sizeof name, "  dq down T=%d", T);
        line(name, d_2, fl / 3.0, bytes / 3.0, flop / 3.0);
      }
      /* the dequantisation alone: bytes read (codes + scales) and written (bf16), copy floor */
      const double w_el = (double)K3K_CU_MOE_DQ_GROUP * 2 * H1 * DL;
      const double dq_bytes = w_el * 2 + w_el / 2 + w_el / 32;
      uint16_t *slots = rc ? NULL : dalloc(g, (size_t)w_el * 2);
      if (slots) {
        dq_arg da = {g, &m, slots};
        const double t_dq = median_s(g, run_dequant, &da, 20);
        snprintf(name, sizeof name, "  dq dequantise %d experts' gate+up", K3K_CU_MOE_DQ_GROUP);
        line(name, t_dq, dq_bytes / bw, dq_bytes, 0);
        g->cuda->free(g->cuda, slots);
      }
      m.dq = 0;
    }
    /* decode-kernel variants (K3PD_MXDEC_PERF, a list; k3k_cu_moe_dec_variant) on the same data */
    const char *vl = getenv("K3PD_MXDEC_PERF");
    int32_t *vs = NULL;
    size_t nv = 0;
    char err[96];
    if (vl && *vl && k3_parse_int_list(vl, &vs, &nv, err, sizeof err))
      g_record(g, false, "perf: K3PD_MXDEC_PERF: %s", err);
    else if (vl && *vl) {
      for (size_t j = 0; j < nv; j++) {
        const int prev = k3k_cu_moe_dec_variant(vs[j]);
        if (k3k_cu_moe_dec_variant(vs[j]) == vs[j]) {
          a.mask = 2;
          double v13 = median_s(g, run_moe, &a, 20);
          a.mask = 4;
          double v2 = median_s(g, run_moe, &a, 20);
          a.mask = 6;
          double v6 = median_s(g, run_moe, &a, 20);
          a.mask = 15; /* the whole block: route/plan → gate/up (PDL variants: launched early) */
          double v15 = median_s(g, run_moe, &a, 20);
          double v15b = median_s(g, run_moe20, &a, 10) / 20;
          snprintf(name, sizeof name, "  decode variant %d: gate/up+SiTU T=%d", vs[j], T);
          line(name, v13, fl * 2.0 / 3.0, bytes * 2.0 / 3.0, flop * 2.0 / 3.0);
          snprintf(name, sizeof name, "  decode variant %d: down T=%d", vs[j], T);
          line(name, v2, fl / 3.0, bytes / 3.0, flop / 3.0);
          snprintf(name, sizeof name, "  decode variant %d: expert GEMMs T=%d", vs[j], T);
          line(name, v6, fl, bytes, flop);
          snprintf(name, sizeof name, "  decode variant %d: moe block T=%d", vs[j], T);
          line(name, v15, fl, bytes, flop);
          snprintf(name, sizeof name, "  decode variant %d: moe block T=%d, back-to-back", vs[j], T);
          line(name, v15b, fl, bytes, flop);
        }
        k3k_cu_moe_dec_variant(prev);
      }
    }
    free(vs);
    g->cuda->free(g->cuda, lg);
    g->cuda->free(g->cuda, z);
    g->cuda->free(g->cuda, y);
    g->cuda->free(g->cuda, dev);
  }
  uint8_t *all[] = {w1p, w1s, w3p, w3s, w2p, w2s};
  for (int i = 0; i < 6; i++) g->cuda->free(g->cuda, all[i]);
  g->cuda->free(g->cuda, bias);
  return 0;
}
