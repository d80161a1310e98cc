/* Paired host/device tensors for the GPU parity and perf suites (see gpu_util.h). */
#include "gpu_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "tol_model.h"

uint64_t g_rand_u64(gctx *g) { /* xorshift64* */
  g->rng ^= g->rng >> 12;
  g->rng ^= g->rng << 25;
  g->rng ^= g->rng >> 27;
  return g->rng * 2685821657736338717ull;
}
float g_rand_unif(gctx *g, float lo, float hi) {
  return lo + (hi - lo) * (float)((g_rand_u64(g) >> 40) * (1.0 / 16777216.0));
}

int gpair_new(gctx *g, gpair *p, k3k_dtype_t dt, int ndim, const int64_t *shape) {
  memset(p, 0, sizeof *p);
  g->in_rms[0] = g->in_rms[1] = 0; /* a new case: the last g_run2's magnitudes no longer apply */
  p->h = k3k_tensor_make(g->ref, dt, NULL, ndim, shape);
  p->bytes = (size_t)k3k_tensor_numel(&p->h) * k3k_dtype_size(dt);
  size_t b = p->bytes ? p->bytes : 64;
  void *hb = NULL, *db = NULL;
  int rc = g->ref->alloc(g->ref, b, &hb);
  if (rc) return rc;
  rc = g->cuda->alloc(g->cuda, b, &db);
  if (rc) {
    g->ref->free(g->ref, hb);
    return rc;
  }
  p->h.data = hb;
  p->d = p->h;
  p->d.data = db;
  p->d.backend = g->cuda;
  return 0;
}

void gpair_free(gctx *g, gpair *p) {
  if (p->h.data) g->ref->free(g->ref, p->h.data);
  if (p->d.data) g->cuda->free(g->cuda, p->d.data);
  memset(p, 0, sizeof *p);
}

float gpair_host_get(const gpair *p, int64_t i) {
  switch (p->h.dtype) {
  case K3K_F32: return ((const float *)p->h.data)[i];
  case K3K_BF16: return k3_bf16_to_f32(((const uint16_t *)p->h.data)[i]);
  case K3K_I32: return (float)((const int32_t *)p->h.data)[i];
  default: return ((const uint8_t *)p->h.data)[i];
  }
}
void gpair_host_set(gpair *p, int64_t i, float v) {
  switch (p->h.dtype) {
  case K3K_F32: ((float *)p->h.data)[i] = v; break;
  case K3K_BF16: ((uint16_t *)p->h.data)[i] = k3_f32_to_bf16(v); break;
  case K3K_I32: ((int32_t *)p->h.data)[i] = (int32_t)v; break;
  default: ((uint8_t *)p->h.data)[i] = (uint8_t)v; break;
  }
}

int gpair_upload(gctx *g, gpair *p) {
  return g->cuda->copy_from_host(g->cuda, p->d.data, p->h.data, p->bytes);
}

int gpair_rand(gctx *g, gpair *p, float lo, float hi) {
  int64_t n = k3k_tensor_numel(&p->h);
  for (int64_t i = 0; i < n; i++) gpair_host_set(p, i, g_rand_unif(g, lo, hi));
  return gpair_upload(g, p);
}

int gpair_poison(gctx *g, gpair *p) {
  memset(p->h.data, 0xFF, p->bytes);
  return g->cuda->memset(g->cuda, p->d.data, 0xFF, p->bytes);
}

void g_record(gctx *g, bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  if (ok)
    g->passed++;
  else
    g->failed++;
}

bool gpair_check(gctx *g, gpair *p, double tol, const char *what) {
  int64_t n = k3k_tensor_numel(&p->h);
  void *dev = malloc(p->bytes ? p->bytes : 1);
  if (!dev) {
    g_record(g, false, "%s: out of host memory", what);
    return false;
  }
  int rc = g->cuda->copy_to_host(g->cuda, dev, p->d.data, p->bytes);
  if (rc) {
    free(dev);
    g_record(g, false, "%s: copy back failed: %s", what, k3_strerror(rc));
    return false;
  }
  gpair dp = *p;
  dp.h.data = dev;
  tol_sums_t sum = {0};
  int64_t int_mismatch = 0;
  for (int64_t i = 0; i < n; i++) {
    if (p->h.dtype == K3K_I32)
      int_mismatch += ((const int32_t *)p->h.data)[i] != ((const int32_t *)dev)[i];
    else
      tol_sums_add(&sum, gpair_host_get(&dp, i), gpair_host_get(p, i));
  }
  free(dev);
  const bool bf16 = p->h.dtype == K3K_BF16; /* the one tolerance model (tol_model.h) */
  const tol_verdict_t v =
      tol_model(&sum, n, bf16 ? TOL_ULP_BF16 : TOL_ULP_F32, g->in_rms[bf16 ? 0 : 1], tol);
  const bool ok = v.ok && int_mismatch == 0;
  if (p->h.dtype == K3K_I32)
    g_record(g, ok, "%s: %lld of %lld indices differ", what, (long long)int_mismatch,
             (long long)n);
  else /* rel_eff is rel unless the floor bound */
    g_record(g, ok, "%s: rel_fro=%.3e%s (tol %.0e) max_abs=%.3e nan_mismatch=%lld n=%lld", what,
             v.rel_eff, v.floored ? " against the magnitude floor" : "", tol, sum.maxabs,
             (long long)sum.nan_bad, (long long)n);
  if (v.floored) tol_print_floor(&v);
  return ok;
}

int g_run2(gctx *g, k3k_op_t op, const void *params, gpair **ps, int n, const char *what) {
  const k3k_tensor_t *th[K3K_MAX_ARGS], *td[K3K_MAX_ARGS];
  double sq[2] = {0, 0};
  int64_t cnt[2] = {0, 0};
  for (int i = 0; i < n; i++) {
    th[i] = &ps[i]->h;
    td[i] = &ps[i]->d;
    if (ps[i]->h.dtype != K3K_F32 && ps[i]->h.dtype != K3K_BF16) continue;
    int c = ps[i]->h.dtype == K3K_BF16 ? 0 : 1;
    int64_t m = k3k_tensor_numel(&ps[i]->h);
    for (int64_t j = 0; j < m; j++) { /* before the reference writes its outputs */
      float v = gpair_host_get(ps[i], j);
      if (isfinite(v)) sq[c] += (double)v * v, cnt[c]++;
    }
  }
  for (int c = 0; c < 2; c++) g->in_rms[c] = cnt[c] ? sqrt(sq[c] / (double)cnt[c]) : 0;
  int rc = k3k_run(g->ref, op, params, th, n);
  if (rc) {
    g_record(g, false, "%s: reference %s failed: %s", what, k3k_op_name(op), k3_strerror(rc));
    return rc;
  }
  rc = k3k_run(g->cuda, op, params, td, n);
  if (rc == 0) rc = g->cuda->synchronize(g->cuda);
  if (rc) {
    char err[256] = "";
    k3k_op_validate(op, params, td, n, err, sizeof err);
    g_record(g, false, "%s: cuda %s failed: %s %s", what, k3k_op_name(op), k3_strerror(rc), err);
    return rc;
  }
  return 0;
}

int gctx_open(gctx *g, const char *ref, uint64_t seed, const char *prog) {
  memset(g, 0, sizeof *g);
  g->rng = seed ? seed : 1;
  g->cuda = k3k_backend_get("cuda");
  if (!g->cuda) {
    printf("SKIP: no usable CUDA device\n");
    return 77;
  }
  g->ref = k3k_backend_get(ref);
  if (!g->ref) {
    fprintf(stderr, "unknown reference backend %s\n", ref);
    return 2;
  }
  printf("%s: reference=%s seed=0x%llx\n", prog, ref, (unsigned long long)seed);
  return 0;
}
