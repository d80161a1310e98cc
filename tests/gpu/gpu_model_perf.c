/* k3k-gpu-model, part 2: CUDA-graph replay vs eager decode (a check), and --perf: the model's
 * figures on the H200 next to their ceilings.
 *
 * Graph check: 2n sequences get the same prompt in one prefill call; n of them decode op by op
 * (graphs off), the other n through captured graphs (graphs on), fed the same tokens: the
 * logits of every step must be bit-identical (graph.c launches the same kernels with the same
 * arguments), and the runner's counters must show the graphs were really replayed.
 * Perf (medium preset: issue 9's targets), each figure with its ceiling measured in the same run:
 *   - device copy bandwidth (1 GiB D2D, read + write) and the bf16 GEMM rate (8192^3 through
 *     k3k_gemm, i.e. cuBLASLt's pick), random data;
 *   - decode at batch 1, eager and graph, vs the weight-read floor k3_runner_decode_bytes(1) /
 *     copy bandwidth (target <= 1.3x);
 *   - decode at batch B (default 64) with graphs: tokens/s, vs k3_runner_decode_bytes(B) / bw;
 *   - prefill of one P-token prompt (default 8192, one pass): tokens/s vs the FLOP floor
 *     k3_runner_prefill_flops(P) / GEMM rate (second of two runs: the first pays the workspace
 *     growth and the first-use cuBLASLt plans).
 * Timing: host wall clock around whole steps, each step ending in a synchronisation (the logits
 * copy), i.e. what a serving loop sees.
 * --profile (gm_profile): three extra untimed regions between cudaProfilerStart/Stop for
 * `ncu --profile-from-start off`: one prefill pass of the P-token prompt, one eager decode step
 * at batch 1, one eager decode step at batch B; each region opens with a one-element
 * fill_random launch so scripts/gpu/ncu_sum.py can tell the regions apart. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "gpu_model.h"
#include "k3k.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

/* A sequence with a heap page table of cap pages. */
typedef struct {
  k3_seq_t s;
} hseq_t;

static int hseq_init(hseq_t *q, int cap) {
  memset(q, 0, sizeof *q);
  q->s.slot = -1;
  q->s.pages = calloc((size_t)cap, sizeof(int32_t));
  q->s.cap_pages = cap;
  return q->s.pages ? 0 : K3_ENOMEM;
}
static void hseq_free(k3_runner_t *r, hseq_t *q) {
  if (q->s.pages) k3_runner_seq_release(r, &q->s);
  free(q->s.pages);
  q->s.pages = NULL;
}

/* Prefill n sequences with the same `len` tokens each (tok), reserving room for `extra`. */
static int prefill_n(k3_runner_t *r, hseq_t *q, int n, const int32_t *tok, int64_t len,
                     int64_t extra, float *logits) {
  char err[512] = "";
  k3_prefill_item_t *it = calloc((size_t)n, sizeof *it);
  int rc = it ? 0 : K3_ENOMEM;
  for (int i = 0; i < n && !rc; i++) {
    rc = hseq_init(&q[i], k3_runner_pages_for(r, len + extra) + 1);
    if (!rc) rc = k3_runner_seq_reserve(r, &q[i].s, len + extra);
    it[i] = (k3_prefill_item_t){&q[i].s, tok, len, logits ? logits + (size_t)i * k3_runner_vocab(r) : NULL, false};
  }
  if (!rc) rc = k3_runner_prefill(r, it, n, NULL, NULL, err, sizeof err);
  if (rc) fprintf(stderr, "prefill of %d x %lld tokens: %s (%s)\n", n, (long long)len, err, k3_strerror(rc));
  free(it);
  return rc;
}

/* One decode step of q[0..n): sequence i is fed token (tok + 7919 i) mod (V - 1024), so the
 * rows of a batch differ and route to different experts as real traffic does (the same token
 * for every row of identically prefilled sequences would route all of them to one expert set:
 * a batch-B step would read k experts per layer, not the E(1-(1-k/E)^B) of its floor); logits
 * [n][V] (may be NULL). */
static int decode_n(k3_runner_t *r, hseq_t *q, int n, int32_t tok, float *logits) {
  char err[512] = "";
  k3_decode_item_t *d = calloc((size_t)n, sizeof *d);
  if (!d) return K3_ENOMEM;
  for (int i = 0; i < n; i++)
    d[i] = (k3_decode_item_t){.seq = &q[i].s,
                              .token = (int32_t)(((int64_t)tok + 7919 * (int64_t)i) % (k3_runner_vocab(r) - 1024)),
                              .logits = logits ? logits + (size_t)i * k3_runner_vocab(r) : NULL};
  int rc = k3_runner_decode_step(r, d, n, err, sizeof err);
  if (rc) fprintf(stderr, "decode of %d sequences: %s (%s)\n", n, err, k3_strerror(rc));
  free(d);
  return rc;
}

static int32_t tok_at(int64_t i, int64_t V) { return (int32_t)((i * 7919 + 13) % (V - 1024)); }

void gm_graph_check(k3_runner_t *gpu, int nb, int steps) {
  const int64_t V = k3_runner_vocab(gpu), len = 70;
  int32_t tok[70];
  for (int64_t t = 0; t < len; t++) tok[t] = tok_at(t, V);
  hseq_t *q = calloc((size_t)(2 * nb), sizeof *q);
  float *la = malloc((size_t)(steps * nb * V) * 4), *lb = malloc((size_t)(steps * nb * V) * 4);
  float *pf = malloc((size_t)(2 * nb * V) * 4);
  int rc = q && la && lb && pf ? 0 : K3_ENOMEM;
  if (!rc) rc = prefill_n(gpu, q, 2 * nb, tok, len, steps + 8, pf);
  bool same_prefill = !rc && !memcmp(pf, pf + (size_t)nb * V, (size_t)(nb * V) * 4);
  k3_runner_stats_t s0, s1;
  k3_runner_get_stats(gpu, &s0);
  k3_runner_set_graphs(gpu, false);
  for (int st = 0; st < steps && !rc; st++)
    rc = decode_n(gpu, q, nb, tok_at(1000 + st, V), la + (size_t)(st * nb) * V);
  k3_runner_set_graphs(gpu, true);
  for (int st = 0; st < steps && !rc; st++)
    rc = decode_n(gpu, q + nb, nb, tok_at(1000 + st, V), lb + (size_t)(st * nb) * V);
  k3_runner_get_stats(gpu, &s1);
  int same = 0;
  for (int st = 0; st < steps && !rc; st++)
    same += !memcmp(la + (size_t)(st * nb) * V, lb + (size_t)(st * nb) * V, (size_t)(nb * V) * 4);
  printf("  graphs batch %d: prefill rows identical %s; %llu eager steps, %llu captures, %llu replays, "
         "%llu abandoned captures\n", nb, same_prefill ? "yes" : "NO",
         (unsigned long long)(s1.eager_steps - s0.eager_steps),
         (unsigned long long)(s1.graph_captures - s0.graph_captures),
         (unsigned long long)(s1.graph_replays - s0.graph_replays),
         (unsigned long long)(s1.capture_failures - s0.capture_failures));
  char name[96];
  snprintf(name, sizeof name, "graph replay bit-identical to eager decode, batch %d", nb);
  gm_check(!rc && same == steps, name, "%g of %g steps identical", same, steps);
  snprintf(name, sizeof name, "graphs captured and replayed, batch %d", nb);
  gm_check(!rc && s1.graph_replays - s0.graph_replays >= (uint64_t)(steps - 2) &&
               s1.capture_failures == s0.capture_failures,
           name, "%g replays of %g steps", (double)(s1.graph_replays - s0.graph_replays), steps);
  for (int i = 0; q && i < 2 * nb; i++) hseq_free(gpu, &q[i]);
  free(q);
  free(la);
  free(lb);
  free(pf);
}

bool gm_profile = false;

/* Opens (on) or closes a profiled region; the marker launch names the region's start. */
static void prof_region(k3k_backend_t *be, bool on) {
  static void *mark;
  if (!gm_profile) return;
  if (on) {
    if (!mark && be->alloc(be, 64, &mark)) mark = NULL;
    be->synchronize(be);
    cudaProfilerStart();
    if (mark) k3k_cu_fill_random(k3k_cuda_ctx_of(be)->stream, mark, 1, K3K_F32, 1, 0.f, 1.f);
  } else {
    be->synchronize(be);
    cudaProfilerStop();
  }
}

/* ---- ceilings ---- */

static double copy_bandwidth(k3k_backend_t *be) {
  const size_t n = (size_t)1 << 30;
  void *x = NULL, *y = NULL;
  double bw = 0;
  if (be->alloc(be, n, &x) || be->alloc(be, n, &y)) goto out;
  k3k_cu_fill_random(k3k_cuda_ctx_of(be)->stream, x, (int64_t)(n / 2), K3K_BF16, 7, -1.f, 1.f);
  be->copy(be, y, x, n);
  be->synchronize(be);
  uint64_t t0 = k3_now_ns();
  for (int i = 0; i < 10; i++) be->copy(be, y, x, n);
  if (be->synchronize(be)) goto out;
  bw = 10.0 * 2.0 * (double)n / ((double)(k3_now_ns() - t0) / 1e9);
out:
  if (x) be->free(be, x);
  if (y) be->free(be, y);
  return bw;
}

static double gemm_rate(k3k_backend_t *be) {
  const int64_t M = 8192, N = 8192, K = 8192;
  void *a = NULL, *b = NULL, *c = NULL;
  double rate = 0;
  if (be->alloc(be, (size_t)(M * K) * 2, &a) || be->alloc(be, (size_t)(N * K) * 2, &b) ||
      be->alloc(be, (size_t)(M * N) * 2, &c))
    goto out;
  cudaStream_t st = k3k_cuda_ctx_of(be)->stream;
  k3k_cu_fill_random(st, a, M * K, K3K_BF16, 1, -1.f, 1.f);
  k3k_cu_fill_random(st, b, N * K, K3K_BF16, 2, -1.f, 1.f);
  k3k_tensor_t x = k3k_tensor_2d(be, K3K_BF16, a, M, K), w = k3k_tensor_2d(be, K3K_BF16, b, N, K);
  k3k_tensor_t y = k3k_tensor_2d(be, K3K_BF16, c, M, N);
  for (int i = 0; i < 2; i++)
    if (k3k_gemm(be, &x, &w, &y)) goto out;
  be->synchronize(be);
  uint64_t t0 = k3_now_ns();
  for (int i = 0; i < 5; i++)
    if (k3k_gemm(be, &x, &w, &y)) goto out;
  if (be->synchronize(be)) goto out;
  rate = 5.0 * 2.0 * (double)M * N * K / ((double)(k3_now_ns() - t0) / 1e9);
out:
  if (a) be->free(be, a);
  if (b) be->free(be, b);
  if (c) be->free(be, c);
  return rate;
}

/* Seconds per decode step of q[0..n) over `steps` steps (after `warm` untimed ones). */
static double time_decode(k3_runner_t *r, hseq_t *q, int n, int warm, int steps, int64_t *t) {
  const int64_t V = k3_runner_vocab(r);
  int rc = 0;
  for (int i = 0; i < warm && !rc; i++) rc = decode_n(r, q, n, tok_at((*t)++, V), NULL);
  uint64_t t0 = k3_now_ns();
  for (int i = 0; i < steps && !rc; i++) rc = decode_n(r, q, n, tok_at((*t)++, V), NULL);
  return rc ? -1 : (double)(k3_now_ns() - t0) / 1e9 / steps;
}

void gm_perf(k3_runner_t *gpu, int steps, int batch, int64_t ptok) {
  k3k_backend_t *be = k3k_backend_get("cuda");
  const int64_t V = k3_runner_vocab(gpu);
  const double bw = copy_bandwidth(be), gr = gemm_rate(be);
  printf("PERF ceilings: copy bandwidth %.0f GB/s (1 GiB D2D, read+write), bf16 GEMM %.0f TFLOP/s "
         "(8192^3 via k3k_gemm)\n", bw / 1e9, gr / 1e12);
  if (bw <= 0 || gr <= 0) return;
  /* prefill: one ptok-token prompt in one pass, second run timed */
  int32_t *tok = malloc((size_t)ptok * 4);
  hseq_t one;
  memset(&one, 0, sizeof one);
  int rc = tok ? 0 : K3_ENOMEM;
  for (int64_t t = 0; t < ptok && !rc; t++) tok[t] = tok_at(t, V);
  double pf = -1;
  for (int rep = 0; rep < 2 && !rc; rep++) {
    uint64_t t0 = k3_now_ns();
    rc = prefill_n(gpu, &one, 1, tok, ptok, 8, NULL);
    pf = (double)(k3_now_ns() - t0) / 1e9;
    hseq_free(gpu, &one);
  }
  if (!rc && gm_profile) {
    prof_region(be, true);
    rc = prefill_n(gpu, &one, 1, tok, ptok, 8, NULL);
    prof_region(be, false);
    hseq_free(gpu, &one);
  }
  if (!rc) {
    double fl = k3_runner_prefill_flops(gpu, ptok), floor = fl / gr;
    printf("PERF prefill %lld tokens (one pass): %.3f s = %.0f tokens/s; FLOP floor %.3f s "
           "(%.1f TFLOP / %.0f TFLOP/s) = %.2fx\n", (long long)ptok, pf, (double)ptok / pf, floor,
           fl / 1e12, gr / 1e12, pf / floor);
  }
  /* decode batch 1: eager then graphs, context 137..~250 (one context bucket) */
  const int64_t plen = 136;
  int64_t t = 5000;
  if (steps > 50) steps = 50;
  if (!rc) rc = prefill_n(gpu, &one, 1, tok, plen, 2 * (steps + 3) + 8, NULL);
  if (!rc) {
    double fl = k3_runner_decode_bytes(gpu, 1) / bw;
    k3_runner_set_graphs(gpu, false);
    double se = time_decode(gpu, &one, 1, 3, steps, &t);
    k3_runner_set_graphs(gpu, true);
    double sg = time_decode(gpu, &one, 1, 3, steps, &t);
    if (gm_profile && sg > 0) {
      k3_runner_set_graphs(gpu, false);
      prof_region(be, true);
      if (decode_n(gpu, &one, 1, tok_at(t++, V), NULL)) sg = -1;
      prof_region(be, false);
      k3_runner_set_graphs(gpu, true);
    }
    printf("PERF decode batch 1: eager %.3f ms/step, graph %.3f ms/step (%d steps, context ~%lld); "
           "weight-read floor %.3f ms (%.2f GB/step / %.0f GB/s) = eager %.2fx, graph %.2fx\n",
           se * 1e3, sg * 1e3, steps, (long long)(plen + steps), fl * 1e3,
           k3_runner_decode_bytes(gpu, 1) / 1e9, bw / 1e9, se / fl, sg / fl);
    hseq_free(gpu, &one);
    if (se < 0 || sg < 0) rc = K3_EDEVICE;
  }
  /* decode batch B with graphs (eager for comparison) */
  hseq_t *q = calloc((size_t)batch, sizeof *q);
  if (!rc && !q) rc = K3_ENOMEM;
  if (!rc) rc = prefill_n(gpu, q, batch, tok, plen, 2 * (steps + 3) + 8, NULL);
  if (!rc) {
    double fl = k3_runner_decode_bytes(gpu, batch) / bw;
    k3_runner_set_graphs(gpu, false);
    double se = time_decode(gpu, q, batch, 2, steps / 2 > 0 ? steps / 2 : 1, &t);
    k3_runner_set_graphs(gpu, true);
    double sg = time_decode(gpu, q, batch, 3, steps, &t);
    if (gm_profile && sg > 0) {
      k3_runner_set_graphs(gpu, false);
      prof_region(be, true);
      if (decode_n(gpu, q, batch, tok_at(t++, V), NULL)) sg = -1;
      prof_region(be, false);
      k3_runner_set_graphs(gpu, true);
    }
    printf("PERF decode batch %d: graph %.3f ms/step = %.0f tokens/s (eager %.3f ms/step = %.0f "
           "tokens/s); floor %.3f ms (%.2f GB/step: weights with E(1-(1-k/E)^B) experts + KDA state "
           "r/w / %.0f GB/s) = %.0f tokens/s ceiling; graph %.2fx floor\n", batch, sg * 1e3,
           batch / sg, se * 1e3, batch / se, fl * 1e3, k3_runner_decode_bytes(gpu, batch) / 1e9,
           bw / 1e9, batch / fl, sg / fl);
  }
  for (int i = 0; q && i < batch; i++) hseq_free(gpu, &q[i]);
  hseq_free(gpu, &one);
  free(q);
  free(tok);
  if (rc) gm_check(false, "perf ran", "rc %g %g", rc, 0);
}
