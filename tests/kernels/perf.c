/* test_kernels --perf: time per op on every backend, with achieved GB/s and GFLOP/s, and the
 * fast GEMM against a measured CPU peak (a register-resident mul+add loop in the same ISA the
 * build targets, times the thread count). Figures are best-of-3 wall times after a warm-up. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef float v4f __attribute__((vector_size(16)));

/* Single-core fp32 mul+add peak, shaped like a GEMM inner loop: 12 independent accumulators
 * `acc += b * w` (the multiply does not depend on the accumulator, so only the add latency is on
 * the chain); `b` is made opaque each iteration so the products cannot be hoisted. 2 flops per
 * lane per mul+add. */
static double peak_gflops_1core(void) {
  v4f b = {1.0000001f, 1.0000001f, 1.0000001f, 1.0000001f}, w0 = {1e-7f, 2e-7f, 3e-7f, 4e-7f},
      w1 = w0 * 2;
  v4f a0 = {0, 1, 2, 3}, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6,
      a7 = a0 + 7, a8 = a0 + 8, a9 = a0 + 9, a10 = a0 + 10, a11 = a0 + 11;
  const long iters = 10000000;
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    uint64_t t0 = k3_now_ns();
    for (long it = 0; it < iters; it++) {
      __asm__ volatile("" : "+x"(b));
      a0 += b * w0, a1 += b * w1, a2 += b * w0, a3 += b * w1, a4 += b * w0, a5 += b * w1;
      a6 += b * w0, a7 += b * w1, a8 += b * w0, a9 += b * w1, a10 += b * w0, a11 += b * w1;
    }
    double s = (k3_now_ns() - t0) * 1e-9, g = (double)iters * 12 * 4 * 2 / s * 1e-9;
    best = g > best ? g : best;
  }
  v4f sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  if (sum[0] == 12345.0f) printf("#");
  return best;
}

typedef struct {
  const char *name;
  k3k_op_t op;
  const void *params;
  tt_t *slots;
  int n;
  double flops, bytes;
} pcase_t;

static double time_case(k3k_backend_t *be, const pcase_t *c) {
  void *dev[K3K_MAX_ARGS];
  k3k_tensor_t tv[K3K_MAX_ARGS];
  const k3k_tensor_t *tp[K3K_MAX_ARGS];
  for (int i = 0; i < c->n; i++) {
    if (be->alloc(be, c->slots[i].bytes, &dev[i])) return -1;
    be->copy_from_host(be, dev[i], c->slots[i].buf, c->slots[i].bytes);
    tv[i] = c->slots[i].t;
    tv[i].data = (char *)dev[i] + ((char *)c->slots[i].t.data - (char *)c->slots[i].buf);
    tv[i].backend = be;
    tp[i] = &tv[i];
  }
  double best = 1e30;
  for (int rep = 0; rep < 4; rep++) {
    uint64_t t0 = k3_now_ns();
    int rc = k3k_run(be, c->op, c->params, tp, c->n);
    be->synchronize(be);
    double s = (k3_now_ns() - t0) * 1e-9;
    if (rc) {
      best = -1;
      break;
    }
    if (rep > 0 && s < best) best = s;
  }
  for (int i = 0; i < c->n; i++) be->free(be, dev[i]);
  return best;
}

int perf_main(int argc, char **argv) {
  rng_seed(9);
  /* GEMM prefill-shaped and decode-shaped (bf16 weights, nn.Linear). */
  int64_t M = 64, K = 1024, N = 1024;
  tt_t g1[3] = {tt_2d(K3K_BF16, M, K, 0), tt_2d(K3K_BF16, N, K, 0), tt_2d(K3K_BF16, M, N, 0)};
  tt_t g2[3] = {tt_2d(K3K_BF16, 1, 4096, 0), tt_2d(K3K_BF16, 4096, 4096, 0), tt_2d(K3K_F32, 1, 4096, 0)};
  tt_t mx[4] = {tt_2d(K3K_BF16, 16, 1024, 0), tt_2d(K3K_U8, 1024, 512, 0), tt_2d(K3K_U8, 1024, 32, 0),
                tt_2d(K3K_BF16, 16, 1024, 0)};
  for (tt_t *t = g1; t < g1 + 2; t++) tt_rand(t, -1, 1);
  for (tt_t *t = g2; t < g2 + 2; t++) tt_rand(t, -1, 1);
  tt_rand(&mx[0], -1, 1);
  for (int64_t i = 0; i < 1024 * 512; i++) tt_set(&mx[1], i, rng_u32() & 0xFF);
  for (int64_t i = 0; i < 1024 * 32; i++) tt_set(&mx[2], i, 120 + rng_u32() % 8);
  /* KDA chunked prefill T=256, 4 heads of 128; decode step 8 seqs × 8 heads. */
  int64_t T = 256, Hh = 4, D = 128;
  int64_t psh[4] = {8, 8, D, D};
  tt_t kc[9] = {tt_2d(K3K_BF16, T, Hh * D, 0), tt_2d(K3K_BF16, T, Hh * D, 0), tt_2d(K3K_BF16, T, Hh * D, 0),
                tt_2d(K3K_F32, T, Hh * D, 0), tt_2d(K3K_F32, T, Hh, 0), tt_1d(K3K_I32, 2), tt_1d(K3K_I32, 1),
                tt_new(K3K_F32, 4, psh, 0), tt_2d(K3K_BF16, T, Hh * D, 0)};
  for (int i = 0; i < 5; i++) tt_rand(&kc[i], -0.1, 0.1);
  tt_rand(&kc[3], -0.5, -0.01);
  tt_rand(&kc[4], 0.1, 0.9);
  tt_seti(&kc[5], 1, (int32_t)T);
  kc[7].t.shape[1] = Hh;
  kc[7].t.stride[0] = Hh * D * D;
  k3k_kda_params_t kp = {.n_seqs = 1, .n_heads = (int32_t)Hh, .read_state = 1};
  tt_t ks[8] = {tt_2d(K3K_BF16, 8, 8 * D, 0), tt_2d(K3K_BF16, 8, 8 * D, 0), tt_2d(K3K_BF16, 8, 8 * D, 0),
                tt_2d(K3K_F32, 8, 8 * D, 0), tt_2d(K3K_F32, 8, 8, 0), tt_1d(K3K_I32, 8),
                tt_new(K3K_F32, 4, psh, 0), tt_2d(K3K_BF16, 8, 8 * D, 0)};
  for (int i = 0; i < 5; i++) tt_rand(&ks[i], -0.1, 0.1);
  tt_rand(&ks[3], -0.5, -0.01);
  for (int i = 0; i < 8; i++) tt_seti(&ks[5], i, i);
  k3k_kda_params_t kps = {.n_seqs = 8, .n_heads = 8, .read_state = 1};
  /* MLA decode: 4 seqs × 512 cached tokens, 8 heads, K3 dims. */
  int64_t ctx = 512, ps = 64, npg = 4 * ctx / ps;
  int64_t csh[3] = {npg, ps, 576};
  tt_t md[6] = {tt_2d(K3K_BF16, 4, 8 * 192, 0), tt_2d(K3K_BF16, 8 * 256, 512, 0), tt_new(K3K_BF16, 3, csh, 0),
                tt_2d(K3K_I32, 4, ctx / ps, 0), tt_1d(K3K_I32, 4), tt_2d(K3K_BF16, 4, 8 * 128, 0)};
  for (int i = 0; i < 3; i++) tt_rand(&md[i], -0.3, 0.3);
  for (int64_t i = 0; i < npg; i++) tt_seti(&md[3], i, (int32_t)i);
  for (int i = 0; i < 4; i++) tt_seti(&md[4], i, (int32_t)ctx);
  k3k_mla_params_t mp = {.n_seqs = 4, .n_heads = 8, .d_nope = 128, .d_rope = 64, .d_v = 128, .kv_lora = 512};
  tt_t rn[3] = {tt_2d(K3K_BF16, 256, 4096, 0), tt_1d(K3K_BF16, 4096), tt_2d(K3K_BF16, 256, 4096, 0)};
  tt_rand(&rn[0], -1, 1);
  tt_rand(&rn[1], -1, 1);
  k3k_rmsnorm_params_t rp = {.eps = 1e-5f, .bf16_inner = 1};

  double kda_flops = (double)T * Hh * (4.0 * 64 * D + 6.0 * D * D); /* ≈ intra + inter chunk */
  pcase_t cases[] = {
      {"gemm bf16 64x1024x1024", K3K_OP_GEMM, NULL, g1, 3, 2.0 * M * K * N, 2.0 * (M * K + N * K + M * N)},
      {"gemm bf16 decode 1x4096x4096", K3K_OP_GEMM, NULL, g2, 3, 2.0 * 4096 * 4096, 2.0 * 4096 * 4096},
      {"mxfp4_gemm 16x1024x1024", K3K_OP_MXFP4_GEMM, NULL, mx, 4, 2.0 * 16 * 1024 * 1024, 1024 * 544.0},
      {"kda_chunk T=256 H=4 D=128", K3K_OP_KDA_CHUNK, &kp, kc, 9, kda_flops, 2.0 * 4 * T * Hh * D},
      {"kda_step N=8 H=8 D=128", K3K_OP_KDA_STEP, &kps, ks, 8, 8.0 * 8 * 6 * D * D, 8.0 * 8 * D * D * 4 * 2},
      {"mla_decode N=4 ctx=512 H=8", K3K_OP_MLA_DECODE, &mp, md, 6, 4.0 * 8 * (2 * ctx * 576 + 4 * 128 * 512),
       4.0 * ctx * 576 * 2},
      {"rmsnorm 256x4096 bf16", K3K_OP_RMSNORM, &rp, rn, 3, 4.0 * 256 * 4096, 2.0 * 2 * 256 * 4096},
  };
  double p1 = peak_gflops_1core();
  int thr = k3k_cpu_fast_get_threads();
  printf("measured fp32 mul+add peak (SSE, baseline x86-64 build): %.1f GFLOP/s per core, %.1f for %d threads\n",
         p1, p1 * thr, thr);
  printf("%-32s %-9s %10s %9s %10s\n", "op", "backend", "ms", "GB/s", "GFLOP/s");
  double fast_gemm = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (const char *const *n = k3k_backend_names(); *n; n++) {
      k3k_backend_t *be = k3k_backend_get(*n);
      if (!be) continue;
      double s = time_case(be, &cases[c]);
      if (s < 0) {
        printf("%-32s %-9s failed\n", cases[c].name, be->name);
        continue;
      }
      printf("%-32s %-9s %10.3f %9.2f %10.2f\n", cases[c].name, be->name, s * 1e3,
             cases[c].bytes / s * 1e-9, cases[c].flops / s * 1e-9);
      if (c == 0 && !strcmp(be->name, "cpu-fast")) fast_gemm = cases[c].flops / s * 1e-9;
    }
  if (fast_gemm > 0)
    printf("cpu-fast bf16 GEMM: %.2f GFLOP/s = %.0f%% of the measured %d-thread peak %.1f GFLOP/s\n",
           fast_gemm, 100.0 * fast_gemm / (p1 * thr), thr, p1 * thr);
  tt_t *all[] = {g1, g2, mx, kc, ks, md, rn};
  int cnt[] = {3, 3, 4, 9, 8, 6, 3};
  for (int a = 0; a < 7; a++)
    for (int i = 0; i < cnt[a]; i++) tt_free(&all[a][i]);
  return 0;
}
