/* The CUDA backend's side stream (k3k_cuda_side_*, kernels/cuda/side_stream.cu) inside
 * k3k-gpu-check's CUDA-internals groups (gpu_side_cases):
 *   - misuse is refused with K3_EINVAL and leaves the lane unchanged: mark/end on the main
 *     lane, begin twice, wait from the side lane, mark numbers outside 1..2;
 *   - ordering and results, eagerly and inside a CUDA graph capture: main writes x, the side
 *     lane runs a GEMM on it (its own cuBLASLt workspace) while main runs a second GEMM into
 *     another output, main waits for the side's mark and then adds the two; every output must be
 *     bit-identical to the same ops queued on the main stream alone, and each GEMM must match
 *     the reference backend (relative 1e-2, bf16). A missing fork edge would let the side GEMM
 *     read stale x (the input is re-randomised between the runs), a missing join would let the
 *     add read an unfinished product. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"

static void misuse(gctx *g, k3k_cuda_ctx *cx) {
  int a = k3k_cuda_side_mark(cx, 1), b = k3k_cuda_side_end(cx);
  int c = k3k_cuda_side_begin(cx), d = k3k_cuda_side_begin(cx), e = k3k_cuda_side_wait(cx, 1);
  int f = k3k_cuda_side_mark(cx, 0), h = k3k_cuda_side_mark(cx, 3), i = k3k_cuda_side_end(cx);
  int j = k3k_cuda_side_wait(cx, 3);
  g_record(g, a == K3_EINVAL && b == K3_EINVAL && c == 0 && d == K3_EINVAL && e == K3_EINVAL &&
                  f == K3_EINVAL && h == K3_EINVAL && i == 0 && j == K3_EINVAL && !cx->on_side,
           "side stream misuse refused (mark/end on main, begin twice, wait on side, marks 0/3): "
           "%d %d %d %d %d %d %d %d %d", a, b, c, d, e, f, h, i, j);
}

/* y1 = x·W1ᵀ (side when `side`), y2 = x·W2ᵀ (main), s = y1 + y2 (main, after the join). */
static int pipeline(k3k_backend_t *be, k3k_cuda_ctx *cx, bool side, gpair *x, gpair *w1,
                    gpair *w2, gpair *y1, gpair *y2, gpair *s) {
  int rc = 0;
  if (side && (rc = k3k_cuda_side_begin(cx))) return rc;
  rc = k3k_gemm(be, &x->d, &w1->d, &y1->d);
  if (side) {
    if (!rc) rc = k3k_cuda_side_mark(cx, 1);
    int rc2 = k3k_cuda_side_end(cx);
    if (!rc) rc = rc2;
  }
  if (!rc) rc = k3k_gemm(be, &x->d, &w2->d, &y2->d);
  if (!rc && side) rc = k3k_cuda_side_wait(cx, 1);
  if (!rc) rc = k3k_add(be, &y1->d, &y2->d, &s->d);
  return rc;
}

static bool same_bytes(k3k_backend_t *be, const gpair *p, void *host, const char *what, gctx *g) {
  void *now = malloc(p->bytes);
  bool ok = now && be->copy_to_host(be, now, p->d.data, p->bytes) == 0 &&
            !memcmp(now, host, p->bytes);
  if (!ok) g_record(g, false, "side stream: %s differs from the one-stream run", what);
  free(now);
  return ok;
}

void gpu_side_cases(gctx *g) {
  k3k_backend_t *be = g->cuda;
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  int rc = k3k_cuda_side_init(cx);
  g_record(g, rc == 0 && cx->side_ready, "side stream init: rc %d", rc);
  if (rc) return;
  misuse(g, cx);
  const int64_t M = 4, K = 4096, N = 4096;
  gpair x, w1, w2, y1, y2, s;
  const int64_t sx[2] = {M, K}, sw[2] = {N, K}, sy[2] = {M, N};
  if (gpair_new(g, &x, K3K_BF16, 2, sx) || gpair_new(g, &w1, K3K_BF16, 2, sw) ||
      gpair_new(g, &w2, K3K_BF16, 2, sw) || gpair_new(g, &y1, K3K_BF16, 2, sy) ||
      gpair_new(g, &y2, K3K_BF16, 2, sy) || gpair_new(g, &s, K3K_BF16, 2, sy)) {
    g_record(g, false, "side stream: allocation failed");
    return;
  }
  gpair_rand(g, &w1, -0.05f, 0.05f);
  gpair_rand(g, &w2, -0.05f, 0.05f);
  for (int mode = 0; mode < 2; mode++) { /* 0: eager, 1: inside a graph capture */
    gpair_rand(g, &x, -1.0f, 1.0f);
    gpair *outs[3] = {&y1, &y2, &s};
    void *ref[3] = {malloc(y1.bytes), malloc(y2.bytes), malloc(s.bytes)};
    for (int i = 0; i < 3; i++) gpair_poison(g, outs[i]);
    rc = pipeline(be, cx, false, &x, &w1, &w2, &y1, &y2, &s);
    for (int i = 0; i < 3 && !rc; i++)
      if (!ref[i] || be->copy_to_host(be, ref[i], outs[i]->d.data, outs[i]->bytes)) rc = K3_EDEVICE;
    /* the side run: fresh poison, and x rewritten on the main stream just before the fork */
    for (int i = 0; i < 3 && !rc; i++) rc = gpair_poison(g, outs[i]);
    void *xb = malloc(x.bytes);
    if (!rc && xb && !be->copy_to_host(be, xb, x.d.data, x.bytes)) {
      be->memset(be, x.d.data, 0, x.bytes); /* queued, then overwritten in stream order */
      cudaMemcpyAsync(x.d.data, xb, x.bytes, cudaMemcpyHostToDevice, cx->stream);
    }
    if (!rc && mode == 0) rc = pipeline(be, cx, true, &x, &w1, &w2, &y1, &y2, &s);
    if (!rc && mode == 1) {
      cudaGraph_t graph = NULL;
      cudaGraphExec_t exec = NULL;
      cudaStreamSynchronize(cx->stream);
      if (cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) rc = K3_EDEVICE;
      int prc = rc ? rc : pipeline(be, cx, true, &x, &w1, &w2, &y1, &y2, &s);
      if (!rc && (cudaStreamEndCapture(cx->stream, &graph) != cudaSuccess || prc)) rc = prc ? prc : K3_EDEVICE;
      if (!rc && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) rc = K3_EDEVICE;
      if (!rc && cudaGraphLaunch(exec, cx->stream) != cudaSuccess) rc = K3_EDEVICE;
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      if (rc) (void)cudaGetLastError();
    }
    if (!rc && be->synchronize(be)) rc = K3_EDEVICE;
    free(xb);
    const char *mn = mode ? "graph" : "eager";
    g_record(g, rc == 0, "side stream %s run: rc %d", mn, rc);
    bool same = !rc;
    char what[64];
    for (int i = 0; i < 3 && same; i++) {
      snprintf(what, sizeof what, "%s %s", mn, i == 0 ? "y1 (side)" : i == 1 ? "y2" : "sum");
      same = same_bytes(be, outs[i], ref[i], what, g);
    }
    if (same) g_record(g, true, "side stream %s: y1 (side), y2, sum bit-identical to one stream", mn);
    for (int i = 0; i < 3; i++) free(ref[i]);
  }
  /* the products themselves against the reference backend */
  gpair *a1[3] = {&x, &w1, &y1};
  if (!g_run2(g, K3K_OP_GEMM, NULL, a1, 3, "side stream gemm")) gpair_check(g, &y1, 1e-2, "side stream y1 vs reference");
  gpair *ps[6] = {&x, &w1, &w2, &y1, &y2, &s};
  for (int i = 0; i < 6; i++) gpair_free(g, ps[i]);
}
