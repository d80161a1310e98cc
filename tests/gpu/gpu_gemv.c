/* Parity and perf of the skinny GEMM (kernels/cuda/gemv.cu) inside k3k-gpu-check (CUDA
 * internals: forced variants the op API cannot select).
 *
 * Parity (gpu_gemv_cases, one of k3k-gpu-check's groups):
 *   - small shapes compared in full against the reference GEMM: odd N (tails of row tiles), K not
 *     a multiple of 32 (partial steps), every M class (1..16), F32 and BF16 y, a strided y (column
 *     view) and an x row stride > K, each through the GEMM op (the dispatch) and then with every
 *     forced (split, NT, variant) configuration;
 *   - the medium model's decode projections at full size (weights generated on the device, 0.05
 *     wide) at M = 1, 3, 16: the op's output is checked in full for unwritten (poisoned NaN)
 *     values, compared with the reference on 512 sampled weight rows (16 blocks of 32 consecutive
 *     rows spread over N, the last block ending at N, so every row-tile position and the tail are
 *     covered), and run a second time to check the result is bit-identical; then each kernel
 *     variant forced with the shape rule's split and NT.
 * Tolerances as test_kernels' model (tests/kernels/tolerance.c): BF16 y 1e-2, F32 y 1e-4
 * (relative Frobenius, gpair_check with the same magnitude floor).
 * gemv_multi (gpu_gemv_multi.c; the runner's grouped projections, rn_dev_gemms): every output and
 * the optional normed-x side output compared BYTE FOR BYTE with the unfused chain (the RMSNORM op,
 * then k3k_cuda_gemv with the shape rule per output) at M = 1..4: the runner's groups at full
 * size (KDA q/k/v/g and f_a/b, MLA q_a/kv_a, router with xn, shared gate/up without the norm) and
 * small odd shapes (K % 32 != 0, x row stride > K, F32 and BF16 outputs, bf16_inner 0/1, the
 * PDL early-weight path); plus the refusals (M > 4, K > 8192 with the norm, mixed splits,
 * aliased outputs, n out of range), each against a positive control.
 *
 * Perf (gpu_gemv_perf, `--perf --only gemv`): at each decode shape and M = 1, 2, 4, 8, 16, 64,
 * cuBLASLt (k3k_cuda_lt_gemm, the GEMM op's other path) and the skinny kernel (each variant),
 * time per call of 10 back-to-back calls between two events (median of 15; at M = 1 also one
 * launch between the events), weights rotated over enough copies (>= 256 MB) that no run reads
 * them from L2, as in the model where each layer's weights are read once per token. Floor =
 * bytes / copy bandwidth measured in the same run. Sweeps: the split at M = 1 (N <= 4096), the
 * row tiles per warp at M = 8 and 16.
 * Perf of the fused forms (gpu_gemv_multi_perf, `--perf --only gemvf`): one layer's norm +
 * projections, unfused (RMSNORM op + one gemv per projection) vs fused (gemv_multi), each as 10
 * copies of the sequence captured in one CUDA graph with the runner's const-weights promise. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemv.h"
#include "gpu_util.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

typedef struct {
  int64_t N, K;
  k3k_dtype_t ydt;
  const char *name;
} gshape;

static const gshape kShapes[] = {
    {12288, 7168, K3K_BF16, "kda q/k/v/g, mla gate"},
    {7168, 12288, K3K_BF16, "kda o, mla o"},
    {1536, 7168, K3K_BF16, "mla q_a"},
    {18432, 1536, K3K_BF16, "mla q_b"},
    {576, 7168, K3K_F32, "mla kv_a"},
    {33792, 7168, K3K_BF16, "dense gate/up"},
    {7168, 33792, K3K_BF16, "dense down"},
    {3584, 7168, K3K_BF16, "latent down"},
    {7168, 3584, K3K_BF16, "latent up"},
    {6144, 7168, K3K_BF16, "shared gate/up"},
    {7168, 6144, K3K_BF16, "shared down"},
    {896, 7168, K3K_F32, "router"},
    {256, 7168, K3K_F32, "router (medium)"},
    {128, 7168, K3K_BF16, "kda f_a"},
    {12288, 128, K3K_BF16, "kda f_b"},
    {96, 7168, K3K_F32, "kda b"},
    {163840, 7168, K3K_F32, "lm_head"},
};
#define NSHAPES (int)(sizeof kShapes / sizeof kShapes[0])

static double tol_dt(k3k_dtype_t dt) { return dt == K3K_BF16 ? 1e-2 : 1e-4; }

float ld_any(const void *p, k3k_dtype_t dt, int64_t i) {
  return dt == K3K_F32 ? ((const float *)p)[i] : k3_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* ---- small shapes, full comparison ---- */
static void small_case(gctx *g, int64_t M, int64_t N, int64_t K, k3k_dtype_t ydt, bool views) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
  gpair xb = {0}, w = {0}, yb = {0};
  char what[160];
  /* x = xb[:, 0:K] (row stride K + 8 when views), y = yb[:, 3:3+N] (row stride N + 5). */
  int64_t xs = views ? K + 8 : K, ys = views ? N + 5 : N, yo = views ? 3 : 0;
  if (gpair_new(g, &xb, K3K_BF16, 2, (const int64_t[]){M, xs}) ||
      gpair_new(g, &w, K3K_BF16, 2, (const int64_t[]){N, K}) ||
      gpair_new(g, &yb, ydt, 2, (const int64_t[]){M, ys})) {
    g_record(g, false, "gemv small: allocation failed");
    goto out;
  }
  gpair_rand(g, &xb, -1, 1), gpair_rand(g, &w, -0.05f, 0.05f);
  gpair x = xb, y = yb;
  x.h = k3k_tensor_slice(&xb.h, 1, 0, K), x.d = k3k_tensor_slice(&xb.d, 1, 0, K);
  y.h = k3k_tensor_slice(&yb.h, 1, yo, N), y.d = k3k_tensor_slice(&yb.d, 1, yo, N);
  const k3k_tensor_t *td[3] = {&x.d, &w.d, &y.d};
  bool path = k3k_cuda_gemv_wanted(td);
  snprintf(what, sizeof what, "gemv op M=%lld N=%lld K=%lld ->%s%s [%s]", (long long)M,
           (long long)N, (long long)K, k3k_dtype_name(ydt), views ? " views" : "",
           path ? "gemv" : "cublasLt");
  gpair_poison(g, &yb);
  gpair *a[] = {&x, &w, &y};
  if (g_run2(g, K3K_OP_GEMM, NULL, a, 3, what)) goto out;
  /* The pad columns of yb stay poisoned on both sides, so the full check covers them too. */
  if (!gpair_check(g, &yb, tol_dt(ydt), what) || !k3k_cuda_gemv_fits(td)) goto out;
  static const int splits[] = {1, 2, 4, 8}, nts[] = {1, 2, 4};
  for (int c = 0; c < 4 * 3 * 4; c++) {
    int sp = splits[c % 4], nt = nts[c / 4 % 3], var = 1 + c / 12;
    snprintf(what, sizeof what, "gemv forced split=%d nt=%d var=%d M=%lld N=%lld K=%lld ->%s%s",
             sp, nt, var, (long long)M, (long long)N, (long long)K, k3k_dtype_name(ydt),
             views ? " views" : "");
    int rc = g->cuda->memset(g->cuda, yb.d.data, 0xFF, yb.bytes);
    if (!rc) rc = k3k_cuda_gemv(cx, td, sp, nt, var);
    if (!rc) rc = g->cuda->synchronize(g->cuda);
    if (rc) {
      g_record(g, false, "%s: %s", what, k3_strerror(rc));
      continue;
    }
    gpair_check(g, &yb, tol_dt(ydt), what);
  }
out:
  gpair_free(g, &xb), gpair_free(g, &w), gpair_free(g, &yb);
}

/* ---- decode shapes at full size, sampled comparison ---- */
#define BLOCKS 16
#define BROWS 32

static void full_case(gctx *g, const gshape *s, uint16_t *wd, const int64_t *M_list, int nm) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
  int64_t N = s->N, K = s->K, R = BLOCKS * BROWS;
  size_t es = k3k_dtype_size(s->ydt);
  uint16_t *wsub = malloc((size_t)(R * K) * 2);
  void *yh = malloc((size_t)(16 * N) * es), *yh2 = malloc((size_t)(16 * N) * es);
  void *ysub = malloc((size_t)(16 * R) * es);
  int64_t row0[BLOCKS];
  gpair x = {0};
  void *yd = NULL;
  if (!wsub || !yh || !yh2 || !ysub || g->cuda->alloc(g->cuda, (size_t)(16 * N) * es, &yd) ||
      gpair_new(g, &x, K3K_BF16, 2, (const int64_t[]){16, K})) {
    g_record(g, false, "gemv %s: allocation failed", s->name);
    goto out;
  }
  for (int b = 0; b < BLOCKS; b++) {
    row0[b] = b == BLOCKS - 1 ? N - BROWS : (N - BROWS) * b / (BLOCKS - 1) / 8 * 8;
    if (g->cuda->copy_to_host(g->cuda, wsub + b * BROWS * K, wd + row0[b] * K,
                              (size_t)(BROWS * K) * 2)) {
      g_record(g, false, "gemv %s: weight copy failed", s->name);
      goto out;
    }
  }
  gpair_rand(g, &x, -1, 1);
  for (int mi = 0; mi < nm; mi++) {
    int64_t M = M_list[mi];
    char what[160];
    k3k_tensor_t xd = k3k_tensor_2d(g->cuda, K3K_BF16, x.d.data, M, K),
                 wt = k3k_tensor_2d(g->cuda, K3K_BF16, wd, N, K),
                 yt = k3k_tensor_2d(g->cuda, s->ydt, yd, M, N);
    const k3k_tensor_t *td[3] = {&xd, &wt, &yt};
    int split = 0, nt = 0;
    k3k_cuda_gemv_plan(M, N, K, &split, &nt);
    snprintf(what, sizeof what, "gemv decode %s M=%lld N=%lld K=%lld ->%s [%s split=%d nt=%d]",
             s->name, (long long)M, (long long)N, (long long)K, k3k_dtype_name(s->ydt),
             k3k_cuda_gemv_wanted(td) ? "gemv" : "cublasLt", split, nt);
    size_t yb = (size_t)(M * N) * es;
    int rc = g->cuda->memset(g->cuda, yd, 0xFF, yb);
    if (!rc) rc = k3k_run(g->cuda, K3K_OP_GEMM, NULL, td, 3);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, yh, yd, yb);
    if (!rc) rc = g->cuda->memset(g->cuda, yd, 0xFF, yb);
    if (!rc) rc = k3k_run(g->cuda, K3K_OP_GEMM, NULL, td, 3);
    if (!rc) rc = g->cuda->copy_to_host(g->cuda, yh2, yd, yb);
    if (rc) {
      g_record(g, false, "%s: cuda failed: %s", what, k3_strerror(rc));
      continue;
    }
    k3k_tensor_t xh = k3k_tensor_2d(g->ref, K3K_BF16, x.h.data, M, K),
                 wh = k3k_tensor_2d(g->ref, K3K_BF16, wsub, R, K),
                 yr = k3k_tensor_2d(g->ref, s->ydt, ysub, M, R);
    const k3k_tensor_t *th[3] = {&xh, &wh, &yr};
    if ((rc = k3k_run(g->ref, K3K_OP_GEMM, NULL, th, 3))) {
      g_record(g, false, "%s: reference failed: %s", what, k3_strerror(rc));
      continue;
    }
    /* v = 0: the op's output (and its rerun); v = 1..4: each kernel variant, forced. */
    for (int v = 0; v <= 4; v++) {
      if (v > 0) {
        snprintf(what, sizeof what, "gemv decode %s M=%lld N=%lld K=%lld ->%s [variant %d]",
                 s->name, (long long)M, (long long)N, (long long)K, k3k_dtype_name(s->ydt), v);
        rc = g->cuda->memset(g->cuda, yd, 0xFF, yb);
        if (!rc) rc = k3k_cuda_gemv(cx, td, 0, 0, v);
        if (!rc) rc = g->cuda->copy_to_host(g->cuda, yh, yd, yb);
        if (rc) {
          g_record(g, false, "%s: cuda failed: %s", what, k3_strerror(rc));
          continue;
        }
      }
      int64_t nan = 0;
      for (int64_t i = 0; i < M * N; i++) nan += isnan(ld_any(yh, s->ydt, i));
      double num = 0, den = 0;
      for (int64_t m = 0; m < M; m++)
        for (int b = 0; b < BLOCKS; b++)
          for (int r = 0; r < BROWS; r++) {
            double d = ld_any(yh, s->ydt, m * N + row0[b] + r);
            double h = ld_any(ysub, s->ydt, m * R + b * BROWS + r);
            num += (d - h) * (d - h), den += h * h;
          }
      double rel = den > 0 ? sqrt(num / den) : sqrt(num);
      bool same = v > 0 || !memcmp(yh, yh2, yb);
      g_record(g, nan == 0 && rel <= tol_dt(s->ydt) && same,
               "%s: rel_fro=%.3e (tol %.0e) on %lld sampled rows, unwritten=%lld%s", what, rel,
               tol_dt(s->ydt), (long long)R, (long long)nan,
               v > 0 ? "" : same ? ", rerun bit-identical" : ", rerun DIFFERS");
      if (!k3k_cuda_gemv_fits(td)) break;
    }
  }
out:
  gpair_free(g, &x);
  if (yd) g->cuda->free(g->cuda, yd);
  free(wsub), free(yh), free(yh2), free(ysub);
}

void gpu_gemv_cases(gctx *g, bool quick) {
  static const struct { int64_t M, N, K; } sm[] = {
      {1, 1001, 520}, {2, 8, 32}, {3, 37, 8}, {4, 1001, 1544}, {5, 130, 264},
      {8, 1001, 520}, {9, 37, 1544}, {16, 1001, 520}, {16, 4100, 2056},
  };
  for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++) {
    small_case(g, sm[i].M, sm[i].N, sm[i].K, i & 1 ? K3K_F32 : K3K_BF16, false);
    small_case(g, sm[i].M, sm[i].N, sm[i].K, i & 1 ? K3K_BF16 : K3K_F32, true);
  }
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
  static const int64_t Ms[] = {1, 3, 16};
  for (int i = 0; i < NSHAPES; i++) {
    const gshape *s = &kShapes[i];
    void *wd = NULL;
    if (g->cuda->alloc(g->cuda, (size_t)(s->N * s->K) * 2, &wd)) {
      g_record(g, false, "gemv %s: weight allocation failed", s->name);
      continue;
    }
    k3k_cu_fill_random(cx->stream, wd, s->N * s->K, K3K_BF16, 0xC0FFEEull + (uint64_t)i, -0.05f,
                       0.05f);
    full_case(g, s, wd, Ms, quick ? 1 : 3);
    g->cuda->free(g->cuda, wd);
  }
}

/* ---- perf ---- */
typedef struct {
  k3k_cuda_ctx *cx;
  int mode; /* 0: cuBLASLt as the GEMM op calls it, 1: skinny kernel */
  int split, nt, var; /* forced configuration (0: the shape rule / default) */
  k3k_tensor_t x, w, y;
  char *wbase;
  size_t wbytes;
  int ncopies, next;
} gbench;

static int gb_run(gbench *b) {
  b->w.data = b->wbase + (size_t)b->next * b->wbytes;
  b->next = (b->next + 1) % b->ncopies;
  if (b->mode == 1) {
    const k3k_tensor_t *t[3] = {&b->x, &b->w, &b->y};
    return k3k_cuda_gemv(b->cx, t, b->split, b->nt, b->var);
  }
  int64_t M = b->x.shape[0], K = b->x.shape[1], N = b->w.shape[0];
  int ty = b->y.dtype == K3K_F32 ? CUDA_R_32F : CUDA_R_16BF;
  return k3k_cuda_lt_gemm(b->cx, 1, 0, N, M, K, b->w.data, CUDA_R_16BF, K, 0, b->x.data,
                          CUDA_R_16BF, K, 0, b->y.data, ty, N, 0, 1);
}

/* Median seconds per call over 15 samples after 3 warm-up calls; a sample is `reps` calls
 * between two events (reps = 1: one launch, host launch latency included; reps = 10:
 * back-to-back calls as in a captured decode graph, the queue kept ahead of the GPU). */
static double gb_time(gbench *b, int reps) {
  cudaEvent_t e0, e1;
  double ts[15];
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return -1;
  double r = -1;
  for (int i = 0; i < 3; i++)
    if (gb_run(b)) goto out;
  for (int i = 0; i < 15; i++) {
    float ms = 0;
    cudaEventRecord(e0, b->cx->stream);
    for (int k = 0; k < reps; k++)
      if (gb_run(b)) goto out;
    cudaEventRecord(e1, b->cx->stream);
    if (cudaEventSynchronize(e1) != cudaSuccess) goto out;
    cudaEventElapsedTime(&ms, e0, e1);
    ts[i] = ms * 1e-3 / reps;
  }
  for (int i = 1; i < 15; i++)
    for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
      double t = ts[j];
      ts[j] = ts[j - 1], ts[j - 1] = t;
    }
  r = ts[7];
out:
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return r;
}

static double gb_cfg(gbench *b, int split, int nt, int var) {
  b->mode = 1, b->split = split, b->nt = nt, b->var = var;
  return gb_time(b, 10);
}

void gpu_gemv_perf(gctx *g, double bw) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
  static const int64_t Ms[] = {1, 2, 4, 8, 16, 64};
  printf("GEMV lines: back-to-back time per call (10 calls between events), x = time / floor; "
         "'1x' = one launch between events\n");
  for (int i = 0; i < NSHAPES; i++) {
    const gshape *s = &kShapes[i];
    gbench b;
    memset(&b, 0, sizeof b);
    b.cx = cx;
    b.wbytes = (size_t)(s->N * s->K) * 2;
    b.ncopies = (int)((((size_t)256 << 20) + b.wbytes - 1) / b.wbytes);
    void *wb = NULL, *xb = NULL, *yb = NULL;
    size_t es = k3k_dtype_size(s->ydt);
    if (g->cuda->alloc(g->cuda, b.wbytes * b.ncopies, &wb) ||
        g->cuda->alloc(g->cuda, (size_t)(64 * s->K) * 2, &xb) ||
        g->cuda->alloc(g->cuda, (size_t)(64 * s->N) * es, &yb)) {
      g_record(g, false, "perf gemv %s: allocation failed", s->name);
      if (wb) g->cuda->free(g->cuda, wb);
      if (xb) g->cuda->free(g->cuda, xb);
      continue;
    }
    b.wbase = wb;
    k3k_cu_fill_random(cx->stream, wb, (int64_t)(b.wbytes / 2) * b.ncopies, K3K_BF16, 77 + i,
                       -0.05f, 0.05f);
    k3k_cu_fill_random(cx->stream, xb, 64 * s->K, K3K_BF16, 99 + i, -1, 1);
    for (int mi = 0; mi < 6; mi++) {
      int64_t M = Ms[mi];
      b.x = k3k_tensor_2d(g->cuda, K3K_BF16, xb, M, s->K);
      b.w = k3k_tensor_2d(g->cuda, K3K_BF16, wb, s->N, s->K);
      b.y = k3k_tensor_2d(g->cuda, s->ydt, yb, M, s->N);
      double bytes = (double)b.wbytes + 2.0 * M * s->K + (double)es * M * s->N;
      double fl = bytes / bw;
      b.mode = 0;
      double tl = gb_time(&b, 10), tl1 = M == 1 ? gb_time(&b, 1) : 0;
      const k3k_tensor_t *t[3] = {&b.x, &b.w, &b.y};
      int sp = 0, nt = 0;
      k3k_cuda_gemv_plan(M, s->N, s->K, &sp, &nt);
      printf("GEMV %-22s N=%6lld K=%5lld M=%2lld floor %7.1f us | lt %7.1f us x%.2f", s->name,
             (long long)s->N, (long long)s->K, (long long)M, fl * 1e6, tl * 1e6, tl / fl);
      if (M == 1) printf(" (1x %.1f)", tl1 * 1e6);
      bool bad = tl <= 0;
      if (k3k_cuda_gemv_fits(t)) {
        printf(" | split %d nt %d:", sp, nt);
        for (int v = 1; v <= 4; v++) {
          double tv = gb_cfg(&b, 0, 0, v);
          bad |= tv <= 0;
          printf(" v%d %7.1f x%.2f", v, tv * 1e6, tv / fl);
        }
        if (M == 1) {
          b.var = 0;
          printf(" (1x v%d %.1f)", K3K_GEMV_DEFAULT_VARIANT, gb_time(&b, 1) * 1e6);
        }
      }
      printf(" | op: %s\n", k3k_cuda_gemv_wanted(t) ? "gemv" : "cublasLt");
      /* Configuration sweeps with the default variant: the split at M = 1 for shapes with few
       * row tiles, the row tiles per warp at M = 8 and 16. */
      if (M == 1 && s->N <= 4096)
        for (int f = 1; f <= 8; f *= 2) {
          double tf = gb_cfg(&b, f, 1, 0);
          printf("GEMV-CFG %-18s M=1 split=%d nt=1: %7.1f us x%.2f\n", s->name, f, tf * 1e6,
                 tf / fl);
        }
      if (M == 8 || M == 16)
        for (int n = 1; n <= 4; n *= 2) {
          int f = 0, dummy;
          k3k_cuda_gemv_plan(M, s->N, s->K, &f, &dummy);
          double tf = gb_cfg(&b, f, n, 0);
          printf("GEMV-CFG %-18s M=%lld split=%d nt=%d: %7.1f us x%.2f\n", s->name, (long long)M,
                 f, n, tf * 1e6, tf / fl);
        }
      if (bad) g_record(g, false, "perf gemv %s M=%lld: run failed", s->name, (long long)M);
    }
    fflush(stdout);
    g->cuda->free(g->cuda, wb), g->cuda->free(g->cuda, xb), g->cuda->free(g->cuda, yb);
  }
}
