/* The generic-shape CUDA kernels (kernels/cuda/generic.h) inside k3k-gpu-check.
 *
 * Parity (gpu_generic_cases, one of k3k-gpu-check's groups of CUDA internals): the generic grouped MXFP4 expert GEMM
 * (k3k_cu_moe_gemm_generic) against the tensor-core kernel (k3k_cu_moe_gemm) on a shape both
 * take (N = 64, K = 128: the tiny preset's gate/up), one expert and a grouped plan with a row
 * gather (4 stacked experts, one without rows), plain with F32 y and fused SiTU with bf16 y, in
 * both tilings of the tensor-core kernel (rows_hint 2: decode, 32: prefill).
 * MXFP4 values are exact in bf16 and both accumulate in fp32, so plain outputs differ only by
 * summation order (tolerance 1e-5 relative); the fused ones by a bf16 rounding (1e-2). The KDA
 * and MLA generic kernels are checked against the CPU reference by test_kernels (their shapes
 * there are all generic) and end to end by k3k-gpu-model on the tiny presets.
 * Perf (gpu_generic_perf, `--perf --only generic`): each generic kernel at the tiny preset's
 * shapes (KDA 4 x 32, MLA 4 heads 32/16/32 with c = 64, experts 64 x 128), median of CUDA-event
 * timed runs. At these sizes every kernel is launch- and latency-bound (a few MB at most), so the
 * figure printed is the time per call next to the bytes it moves; no roofline ratio. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generic.h"
#include "gpu_util.h"
#include "k3pd/err.h"

/* ---------------- parity: grouped MXFP4 GEMM, generic vs tensor cores ---------------- */
typedef struct {
  int E, N, K, T, rows;
  uint8_t *hp, *hs;   /* stacked experts: packed [E][N][K/2], scales [E][N][K/32] */
  void *dp, *ds, *dup, *dus, *dx, *doff, *dact, *dgat, *dy1, *dy2;
} mxcase;

static void *up_bytes(gctx *g, const void *h, size_t n) {
  void *d = NULL;
  if (g->cuda->alloc(g->cuda, n ? n : 16, &d)) return NULL;
  if (n && g->cuda->copy_from_host(g->cuda, d, h, n)) return NULL;
  return d;
}

static void rand_mx(gctx *g, uint8_t *p, uint8_t *s, int64_t np, int64_t ns) {
  for (int64_t i = 0; i < np; i++) p[i] = (uint8_t)g_rand_u64(g);
  for (int64_t i = 0; i < ns; i++) s[i] = (uint8_t)(118 + g_rand_u64(g) % 8); /* 2^-9 .. 2^-2 */
}

static double rel(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += isnan(d) ? INFINITY : d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void mx_case(gctx *g, bool grouped, int act, int hint) {
  const int E = grouped ? 4 : 1, N = 64, K = 128, T = 7;
  const int32_t off[5] = {0, 3, 3, 8, 9}, active[4] = {3, 0, 2, 3};
  const int rows = grouped ? 9 : T;
  const int64_t np = (int64_t)E * N * K / 2, ns = (int64_t)E * N * K / 32;
  uint8_t *hp = malloc((size_t)(2 * np)), *hs = malloc((size_t)(2 * ns));
  int32_t gat[9];
  uint16_t *hx = malloc((size_t)T * K * 2);
  for (int i = 0; i < 9; i++) gat[i] = (int32_t)(g_rand_u64(g) % T);
  rand_mx(g, hp, hs, 2 * np, 2 * ns);
  for (int64_t i = 0; i < (int64_t)T * K; i++) {
    float f = g_rand_unif(g, -1, 1);
    uint32_t b;
    memcpy(&b, &f, 4);
    hx[i] = (uint16_t)(b >> 16);
  }
  const bool f32 = act == K3K_CU_ACT_NONE;
  const size_t ybytes = (size_t)rows * N * (f32 ? 4 : 2);
  void *dp = up_bytes(g, hp, (size_t)(2 * np)), *ds = up_bytes(g, hs, (size_t)(2 * ns));
  void *dx = up_bytes(g, hx, (size_t)T * K * 2), *doff = up_bytes(g, off, sizeof off);
  void *dact = up_bytes(g, active, sizeof active), *dgat = up_bytes(g, gat, sizeof gat);
  void *dy1 = NULL, *dy2 = NULL;
  g->cuda->alloc(g->cuda, ybytes, &dy1);
  g->cuda->alloc(g->cuda, ybytes, &dy2);
  char what[96];
  snprintf(what, sizeof what, "moe_gemm generic vs tensor cores (%s, %s, %s tiling)",
           grouped ? "4 experts, gather" : "1 expert", f32 ? "plain, f32 y" : "fused SiTU, bf16 y",
           hint > 16 ? "prefill" : "decode");
  if (!dp || !ds || !dx || !doff || !dact || !dgat || !dy1 || !dy2) {
    g_record(g, false, "%s: allocation", what);
  } else {
    k3k_cu_moe_gemm_args a;
    memset(&a, 0, sizeof a);
    a.w.packed_base = dp, a.w.scale_base = ds;
    a.w.estride_packed = (int64_t)N * K / 2, a.w.estride_scale = (int64_t)N * K / 32;
    a.w.ld_packed = K / 2, a.w.ld_scale = K / 32;
    if (!f32) {
      a.up = a.w;
      a.up.packed_base = (const uint8_t *)dp + np, a.up.scale_base = (const uint8_t *)ds + ns;
    }
    a.act = act, a.round_inner = 1, a.beta = 4.0f, a.beta_lin = 25.0f;
    a.N = N, a.K = K, a.x = dx, a.ldx = K, a.ldy = N, a.y_f32 = f32;
    a.max_active = E, a.rows_hint = hint, a.single_rows = T;
    if (grouped) a.x_gather = dgat, a.expert_off = doff, a.active = dact;
    g->cuda->memset(g->cuda, dy1, 0xFF, ybytes);
    g->cuda->memset(g->cuda, dy2, 0xFF, ybytes);
    k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
    a.y = dy1;
    int rc = k3k_cu_moe_gemm(cx->stream, &a);
    a.y = dy2;
    if (!rc) rc = k3k_cu_moe_gemm_generic(cx->stream, &a);
    float *y1 = malloc((size_t)rows * N * 4), *y2 = malloc((size_t)rows * N * 4);
    void *h1 = malloc(ybytes), *h2 = malloc(ybytes);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, h1, dy1, ybytes);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, h2, dy2, ybytes);
    double e = INFINITY;
    if (!rc) {
      for (int64_t i = 0; i < (int64_t)rows * N; i++) {
        if (f32) {
          y1[i] = ((float *)h1)[i], y2[i] = ((float *)h2)[i];
        } else {
          uint32_t b1 = (uint32_t)((uint16_t *)h1)[i] << 16, b2 = (uint32_t)((uint16_t *)h2)[i] << 16;
          memcpy(&y1[i], &b1, 4);
          memcpy(&y2[i], &b2, 4);
        }
      }
      e = rel(y2, y1, (int64_t)rows * N);
    }
    double tol = f32 ? 1e-5 : 1e-2;
    g_record(g, rc == 0 && e <= tol, "%s: rc %d, rel err %.3g (tol %.0e)", what, rc, e, tol);
    free(y1), free(y2), free(h1), free(h2);
  }
  void *bufs[] = {dp, ds, dx, doff, dact, dgat, dy1, dy2};
  for (int i = 0; i < 8; i++)
    if (bufs[i]) g->cuda->free(g->cuda, bufs[i]);
  free(hp), free(hs), free(hx);
}

void gpu_generic_cases(gctx *g) {
  for (int hint = 2; hint <= 32; hint += 30) /* the kernel's decode and prefill tilings */
    for (int grouped = 0; grouped <= 1; grouped++) {
      mx_case(g, grouped, K3K_CU_ACT_NONE, hint);
      mx_case(g, grouped, K3K_CU_ACT_SITU, hint);
    }
}

/* ---------------- perf at the tiny preset's shapes ---------------- */
typedef struct {
  gctx *g;
  k3k_op_t op;
  const void *prm;
  const k3k_tensor_t *t[K3K_MAX_ARGS];
  int n;
  const k3k_cu_moe_gemm_args *mx; /* instead of an op */
} gbench;

static int gb_run(const gbench *b) {
  if (b->mx) return k3k_cu_moe_gemm_generic(k3k_cuda_ctx_of(b->g->cuda)->stream, b->mx);
  return k3k_run(b->g->cuda, b->op, b->prm, b->t, b->n);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void gb_time(const gbench *b, const char *name, double bytes) {
  cudaStream_t st = k3k_cuda_ctx_of(b->g->cuda)->stream;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double ts[15];
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) rc = gb_run(b);
  for (int i = 0; i < 15 && !rc; i++) {
    float ms = 0;
    cudaEventRecord(e0, st);
    rc = gb_run(b);
    cudaEventRecord(e1, st);
    if (!rc && cudaEventSynchronize(e1) != cudaSuccess) rc = K3_EDEVICE;
    cudaEventElapsedTime(&ms, e0, e1);
    ts[i] = ms * 1e3;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (rc) {
    g_record(b->g, false, "perf generic %s: rc %d", name, rc);
    return;
  }
  qsort(ts, 15, sizeof ts[0], cmp_d);
  printf("PERF generic %-44s %9.1f us  (%.2f MB moved)\n", name, ts[7], bytes / 1e6);
  fflush(stdout);
}

static void *rbuf(gctx *g, int64_t n, k3k_dtype_t dt, float lo, float hi) {
  void *p = NULL;
  if (g->cuda->alloc(g->cuda, (size_t)(n ? n : 1) * k3k_dtype_size(dt), &p)) return NULL;
  if (dt == K3K_F32 || dt == K3K_BF16)
    k3k_cu_fill_random(k3k_cuda_ctx_of(g->cuda)->stream, p, n, dt, g_rand_u64(g), lo, hi);
  return p;
}
static void *ibuf(gctx *g, const int32_t *h, int64_t n) {
  return up_bytes(g, h, (size_t)n * 4);
}

void gpu_generic_perf(gctx *g) {
  k3k_backend_t *be = g->cuda;
  const int64_t NH = 4, D = 32, P = NH * D, T = 1024, B = 64;
  int32_t cu[9], sl[64], *pt = malloc(sizeof(int32_t) * 1024);
  void *all[64];
  int na = 0;
#define KEEP(p) (all[na++] = (p))
  /* KDA chunk: 1 x 1024 and 8 x 128 tokens; bf16 q/k/v/o, fp32 g/beta, state in/out */
  for (int nseq = 1; nseq <= 8; nseq *= 8) {
    for (int i = 0; i <= nseq; i++) cu[i] = (int32_t)(T / nseq * i);
    for (int i = 0; i < nseq; i++) sl[i] = i;
    void *q = KEEP(rbuf(g, T * P, K3K_BF16, -.15f, .15f)), *k = KEEP(rbuf(g, T * P, K3K_BF16, -.15f, .15f));
    void *v = KEEP(rbuf(g, T * P, K3K_BF16, -1, 1)), *gg = KEEP(rbuf(g, T * P, K3K_F32, -5, 0));
    void *bt = KEEP(rbuf(g, T * NH, K3K_F32, 0, 1)), *o = KEEP(rbuf(g, T * P, K3K_BF16, 0, 0));
    void *st = KEEP(rbuf(g, nseq * NH * D * D, K3K_F32, -.5f, .5f));
    void *dcu = KEEP(ibuf(g, cu, nseq + 1)), *dsl = KEEP(ibuf(g, sl, nseq));
    int64_t ssh[4] = {nseq, NH, D, D};
    k3k_tensor_t tq = k3k_tensor_2d(be, K3K_BF16, q, T, P), tk = k3k_tensor_2d(be, K3K_BF16, k, T, P),
                 tv = k3k_tensor_2d(be, K3K_BF16, v, T, P), tg = k3k_tensor_2d(be, K3K_F32, gg, T, P),
                 tb = k3k_tensor_2d(be, K3K_F32, bt, T, NH), tcu = k3k_tensor_1d(be, K3K_I32, dcu, nseq + 1),
                 tsl = k3k_tensor_1d(be, K3K_I32, dsl, nseq), tst = k3k_tensor_make(be, K3K_F32, st, 4, ssh),
                 to = k3k_tensor_2d(be, K3K_BF16, o, T, P);
    k3k_kda_params_t kp = {nseq, (int32_t)NH, 1, 0, 0};
    gbench b = {g, K3K_OP_KDA_CHUNK, &kp, {&tq, &tk, &tv, &tg, &tb, &tcu, &tsl, &tst, &to}, 9, NULL};
    char name[64];
    snprintf(name, sizeof name, "kda_chunk T=1024 NH=4 D=32 seqs=%d", nseq);
    gb_time(&b, name, (double)T * P * (2 * 4 + 4) + T * NH * 4.0 + 2.0 * nseq * NH * D * D * 4);
  }
  { /* KDA step, batch 64 */
    for (int i = 0; i < B; i++) sl[i] = i;
    void *q = KEEP(rbuf(g, B * P, K3K_F32, -.15f, .15f)), *k = KEEP(rbuf(g, B * P, K3K_F32, -.15f, .15f));
    void *v = KEEP(rbuf(g, B * P, K3K_F32, -1, 1)), *gg = KEEP(rbuf(g, B * P, K3K_F32, -1, 0));
    void *bt = KEEP(rbuf(g, B * NH, K3K_F32, 0, 1)), *o = KEEP(rbuf(g, B * P, K3K_BF16, 0, 0));
    void *st = KEEP(rbuf(g, B * NH * D * D, K3K_F32, -.5f, .5f)), *dsl = KEEP(ibuf(g, sl, B));
    int64_t ssh[4] = {B, NH, D, D};
    k3k_tensor_t tq = k3k_tensor_2d(be, K3K_F32, q, B, P), tk = k3k_tensor_2d(be, K3K_F32, k, B, P),
                 tv = k3k_tensor_2d(be, K3K_F32, v, B, P), tg = k3k_tensor_2d(be, K3K_F32, gg, B, P),
                 tb = k3k_tensor_2d(be, K3K_F32, bt, B, NH), tsl = k3k_tensor_1d(be, K3K_I32, dsl, B),
                 tst = k3k_tensor_make(be, K3K_F32, st, 4, ssh), to = k3k_tensor_2d(be, K3K_BF16, o, B, P);
    k3k_kda_params_t kp = {(int32_t)B, (int32_t)NH, 1, 0, 0};
    gbench b = {g, K3K_OP_KDA_STEP, &kp, {&tq, &tk, &tv, &tg, &tb, &tsl, &tst, &to}, 8, NULL};
    gb_time(&b, "kda_step B=64 NH=4 D=32", 2.0 * B * NH * D * D * 4 + B * P * 14.0);
  }
  { /* MLA prefill, one causal sequence of 1024 */
    const int64_t dq = 48, dkv = 64, dr = 16, dvv = 32;
    int32_t c2[2] = {0, (int32_t)T};
    void *q = KEEP(rbuf(g, T * NH * dq, K3K_BF16, -1, 1)), *kv = KEEP(rbuf(g, T * NH * dkv, K3K_BF16, -1, 1));
    void *kr = KEEP(rbuf(g, T * dr, K3K_BF16, -1, 1)), *o = KEEP(rbuf(g, T * NH * dvv, K3K_BF16, 0, 0));
    void *dcq = KEEP(ibuf(g, c2, 2)), *dck = KEEP(ibuf(g, c2, 2));
    k3k_tensor_t tq = k3k_tensor_2d(be, K3K_BF16, q, T, NH * dq), tkv = k3k_tensor_2d(be, K3K_BF16, kv, T, NH * dkv),
                 tkr = k3k_tensor_2d(be, K3K_BF16, kr, T, dr), tcq = k3k_tensor_1d(be, K3K_I32, dcq, 2),
                 tck = k3k_tensor_1d(be, K3K_I32, dck, 2), to = k3k_tensor_2d(be, K3K_BF16, o, T, NH * dvv);
    k3k_mla_params_t mp = {1, (int32_t)NH, 32, 16, 32, 64, (int32_t)T, (int32_t)T, 0};
    gbench b = {g, K3K_OP_MLA_PREFILL, &mp, {&tq, &tkv, &tkr, &tcq, &tck, &to}, 6, NULL};
    gb_time(&b, "mla_prefill T=1024 causal NH=4 32/16/32", (double)T * (NH * (dq + dkv + dvv) + dr) * 2);
  }
  { /* MLA decode, batch 64 x 1024 context, pages of 64 */
    const int64_t ctx = 1024, ps = 64, np = B * ctx / ps, row = 64 + 16;
    for (int64_t i = 0; i < np; i++) pt[i] = (int32_t)((i * 7919) % np);
    for (int i = 0; i < B; i++) sl[i] = (int32_t)ctx;
    void *q = KEEP(rbuf(g, B * NH * 48, K3K_BF16, -1, 1)), *w = KEEP(rbuf(g, NH * 64 * 64, K3K_BF16, -.1f, .1f));
    void *cache = KEEP(rbuf(g, np * ps * row, K3K_BF16, -1, 1)), *o = KEEP(rbuf(g, B * NH * 32, K3K_BF16, 0, 0));
    void *dpt = KEEP(ibuf(g, pt, np)), *dsl = KEEP(ibuf(g, sl, B));
    int64_t cs[3] = {np, ps, row};
    k3k_tensor_t tq = k3k_tensor_2d(be, K3K_BF16, q, B, NH * 48), tw = k3k_tensor_2d(be, K3K_BF16, w, NH * 64, 64),
                 tc = k3k_tensor_make(be, K3K_BF16, cache, 3, cs), tp = k3k_tensor_2d(be, K3K_I32, dpt, B, ctx / ps),
                 ts = k3k_tensor_1d(be, K3K_I32, dsl, B), to = k3k_tensor_2d(be, K3K_BF16, o, B, NH * 32);
    k3k_mla_params_t mp = {(int32_t)B, (int32_t)NH, 32, 16, 32, 64, 1, (int32_t)ctx, 0};
    gbench b = {g, K3K_OP_MLA_DECODE, &mp, {&tq, &tw, &tc, &tp, &ts, &to}, 6, NULL};
    gb_time(&b, "mla_decode B=64 ctx=1024 NH=4 c=64", (double)B * ctx * row * 2);
  }
  { /* grouped MXFP4 experts at batch 1 (top-4 of 16): fused gate/up 64 x 128, down 128 x 64 */
    int32_t off[17], act[17], gat[4];
    for (int e = 0; e <= 16; e++) off[e] = e < 4 ? e : 4;
    act[0] = 4;
    for (int i = 0; i < 4; i++) act[1 + i] = i, gat[i] = 0;
    uint8_t *hp = malloc(16 * 64 * 64 * 3), *hs = malloc(16 * 64 * 4 * 3);
    rand_mx(g, hp, hs, 16 * 64 * 64 * 3, 16 * 64 * 4 * 3);
    void *dp = KEEP(up_bytes(g, hp, 16 * 64 * 64 * 3)), *ds = KEEP(up_bytes(g, hs, 16 * 64 * 4 * 3));
    void *doff = KEEP(ibuf(g, off, 17)), *dact = KEEP(ibuf(g, act, 17)), *dg = KEEP(ibuf(g, gat, 4));
    void *x = KEEP(rbuf(g, 128, K3K_BF16, -1, 1)), *h = KEEP(rbuf(g, 4 * 64, K3K_BF16, 0, 0));
    void *y = KEEP(rbuf(g, 4 * 128, K3K_BF16, 0, 0));
    free(hp), free(hs);
    if (dp && ds) {
      k3k_cu_moe_gemm_args a;
      memset(&a, 0, sizeof a);
      a.w.packed_base = dp, a.w.scale_base = ds, a.w.estride_packed = 64 * 64, a.w.estride_scale = 64 * 4;
      a.w.ld_packed = 64, a.w.ld_scale = 4;
      a.up = a.w;
      a.up.packed_base = (const uint8_t *)dp + 16 * 64 * 64, a.up.scale_base = (const uint8_t *)ds + 16 * 64 * 4;
      a.act = K3K_CU_ACT_SITU, a.round_inner = 1, a.beta = 4, a.beta_lin = 25;
      a.N = 64, a.K = 128, a.x = x, a.ldx = 128, a.x_gather = dg, a.y = h, a.ldy = 64;
      a.expert_off = doff, a.active = dact, a.max_active = 4, a.rows_hint = 1;
      gbench b = {g, K3K_OP_COUNT, NULL, {NULL}, 0, &a};
      gb_time(&b, "moe gate/up fused E=16 top-4 64x128 B=1", 4.0 * 2 * 64 * 68);
      k3k_cu_moe_gemm_args d = a;
      memset(&d.up, 0, sizeof d.up);
      d.w.packed_base = (const uint8_t *)dp + 2 * 16 * 64 * 64, d.w.scale_base = (const uint8_t *)ds + 2 * 16 * 64 * 4;
      d.w.estride_packed = 128 * 32, d.w.estride_scale = 128 * 2, d.w.ld_packed = 32, d.w.ld_scale = 2;
      d.act = K3K_CU_ACT_NONE, d.round_inner = 0, d.N = 128, d.K = 64, d.x = h, d.ldx = 64;
      d.x_gather = NULL, d.y = y, d.ldy = 128;
      b.mx = &d;
      gb_time(&b, "moe down E=16 top-4 128x64 B=1", 4.0 * 128 * 34);
    }
  }
  for (int i = 0; i < na; i++)
    if (all[i]) be->free(be, all[i]);
  free(pt);
#undef KEEP
}
