/* k3pd-generate --perf: prefill and batch-B decode figures with their ceilings (perf.h). */
#include "perf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

static int copy_bw(k3k_backend_t *be, double *out) {
  const size_t n = (size_t)1 << 30;
  void *x = NULL, *y = NULL;
  int rc = be->alloc(be, n, &x);
  if (!rc) rc = be->alloc(be, n, &y);
  if (!rc) rc = be->memset(be, x, 1, n);
  if (!rc) rc = be->copy(be, y, x, n); /* first use: page mapping, clocks */
  if (!rc && be->synchronize) rc = be->synchronize(be);
  uint64_t t0 = k3_now_ns();
  for (int i = 0; i < 5 && !rc; i++) rc = be->copy(be, y, x, n);
  if (!rc && be->synchronize) rc = be->synchronize(be);
  if (!rc) *out = 5.0 * 2.0 * (double)n / ((double)(k3_now_ns() - t0) / 1e9);
  if (x) be->free(be, x);
  if (y) be->free(be, y);
  return rc;
}

/* y[N,N] = x[N,N] w[N,N]^T in bf16 with uniform [-1,1) inputs (zeros would draw less power and
 * flatter the ceiling). */
static int gemm_rate(k3k_backend_t *be, int n, double *out) {
  const size_t elems = (size_t)n * (size_t)n, bytes = elems * 2;
  uint16_t *h = malloc(bytes);
  void *a = NULL, *b = NULL, *c = NULL;
  int rc = h ? 0 : K3_ENOMEM;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; h && i < elems; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = k3_f32_to_bf16((float)((double)(s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f);
  }
  if (!rc) rc = be->alloc(be, bytes, &a);
  if (!rc) rc = be->alloc(be, bytes, &b);
  if (!rc) rc = be->alloc(be, bytes, &c);
  if (!rc) rc = be->copy_from_host(be, a, h, bytes);
  if (!rc) rc = be->copy_from_host(be, b, h, bytes);
  k3k_tensor_t x = k3k_tensor_2d(be, K3K_BF16, a, n, n), w = k3k_tensor_2d(be, K3K_BF16, b, n, n);
  k3k_tensor_t y = k3k_tensor_2d(be, K3K_BF16, c, n, n);
  if (!rc) rc = k3k_gemm(be, &x, &w, &y); /* first use: the GEMM plan */
  if (!rc && be->synchronize) rc = be->synchronize(be);
  const int reps = n >= 4096 ? 5 : 2;
  uint64_t t0 = k3_now_ns();
  for (int i = 0; i < reps && !rc; i++) rc = k3k_gemm(be, &x, &w, &y);
  if (!rc && be->synchronize) rc = be->synchronize(be);
  if (!rc) *out = reps * 2.0 * (double)n * n * n / ((double)(k3_now_ns() - t0) / 1e9);
  if (a) be->free(be, a);
  if (b) be->free(be, b);
  if (c) be->free(be, c);
  free(h);
  return rc;
}

int gen_perf_ceilings(const char *name, gen_ceilings_t *c) {
  memset(c, 0, sizeof *c);
  k3k_backend_t *be = k3k_backend_get(name);
  if (!be) return K3_EINVAL;
  c->gemm_n = strcmp(name, "cuda") ? 512 : 8192;
  int rc = copy_bw(be, &c->copy_bw);
  int rg = gemm_rate(be, c->gemm_n, &c->gemm_rate);
  return rc ? rc : rg;
}

/* A sequence with a heap page table for `tokens` tokens. */
static int seq_new(k3_runner_t *r, k3_seq_t *s, int64_t tokens) {
  memset(s, 0, sizeof *s);
  s->slot = -1;
  s->cap_pages = k3_runner_pages_for(r, tokens) + 1;
  s->pages = calloc((size_t)s->cap_pages, sizeof *s->pages);
  if (!s->pages) return K3_ENOMEM;
  return k3_runner_seq_reserve(r, s, tokens);
}

static void seq_free(k3_runner_t *r, k3_seq_t *s) {
  if (!s->pages) return;
  k3_runner_seq_release(r, s);
  free(s->pages);
  s->pages = NULL;
}

int gen_perf_prefill(k3_runner_t *r, const int32_t *prompt, int64_t n, const gen_ceilings_t *c) {
  char err[512] = "";
  k3_seq_t s;
  int rc = seq_new(r, &s, n + 1);
  float *lg = malloc((size_t)k3_runner_vocab(r) * sizeof(float));
  if (!rc && !lg) rc = K3_ENOMEM;
  uint64_t t0 = k3_now_ns();
  k3_prefill_item_t it = {&s, prompt, n, lg, false};
  if (!rc) rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err);
  double sec = (double)(k3_now_ns() - t0) / 1e9;
  if (rc) {
    fprintf(stderr, "k3pd-generate: perf: second prefill failed: %s (%s)\n", err, k3_strerror(rc));
  } else {
    double fl = k3_runner_prefill_flops(r, n), floor = c->gemm_rate > 0 ? fl / c->gemm_rate : 0;
    fprintf(stderr,
            "k3pd-generate: perf: prefill %lld tokens (second pass) %.3f s = %.0f tokens/s vs FLOP "
            "floor %.3g s (%.3g TFLOP / %.3g TFLOP/s bf16 GEMM %d^3) = %.2fx\n",
            (long long)n, sec, (double)n / sec, floor, fl / 1e12, c->gemm_rate / 1e12, c->gemm_n,
            floor > 0 ? sec / floor : 0.0);
  }
  seq_free(r, &s);
  free(lg);
  return rc;
}

int64_t gen_perf_batch_prompt(int64_t n) { return n < 128 ? n : 128; }

int gen_perf_batch(k3_runner_t *r, const int32_t *prompt, int64_t n, int batch, int steps,
                   const gen_ceilings_t *c) {
  char err[512] = "";
  const int64_t len = gen_perf_batch_prompt(n), V = k3_runner_vocab(r);
  k3_seq_t *q = calloc((size_t)batch, sizeof *q);
  k3_prefill_item_t *it = calloc((size_t)batch, sizeof *it);
  k3_decode_item_t *d = calloc((size_t)batch, sizeof *d);
  int rc = q && it && d ? 0 : K3_ENOMEM;
  for (int i = 0; i < batch && !rc; i++) {
    rc = seq_new(r, &q[i], len + steps + 8);
    it[i] = (k3_prefill_item_t){&q[i], prompt, len, NULL, false};
  }
  if (!rc) rc = k3_runner_prefill(r, it, batch, NULL, NULL, err, sizeof err);
  uint64_t t0 = 0;
  for (int st = 0; st < steps + 3 && !rc; st++) {
    if (st == 3) t0 = k3_now_ns(); /* 3 untimed steps: graph capture, workspace growth */
    for (int i = 0; i < batch; i++)
      d[i] = (k3_decode_item_t){.seq = &q[i], .token = (int32_t)((st * 7919 + i * 31 + 13) % (V - 1))};
    rc = k3_runner_decode_step(r, d, batch, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "k3pd-generate: perf: batch-%d decode failed: %s (%s)\n", batch, err,
            k3_strerror(rc));
  } else {
    double step = (double)(k3_now_ns() - t0) / 1e9 / steps;
    double bytes = k3_runner_decode_bytes(r, batch);
    double floor = c->copy_bw > 0 ? bytes / c->copy_bw : 0;
    fprintf(stderr,
            "k3pd-generate: perf: decode batch %d (prompts of %lld tokens) %.3f ms/step = %.0f "
            "tokens/s vs floor %.3f ms (%.3g GB/step / %.0f GB/s copy) = %.0f tokens/s ceiling, "
            "%.2fx\n",
            batch, (long long)len, step * 1e3, batch / step, floor * 1e3, bytes / 1e9,
            c->copy_bw / 1e9, floor > 0 ? batch / floor : 0.0, floor > 0 ? step / floor : 0.0);
  }
  for (int i = 0; q && i < batch; i++) seq_free(r, &q[i]);
  free(q);
  free(it);
  free(d);
  return rc;
}
