/* k3k-gpu-moe, bf16 experts: the grouped W16A16 expert kernels (moe_bf16.h) behind the device
 * plan, against the reference op chain, at Kimi-Linear-48B shapes.
 *
 * Each case draws distinct expert ids per token and fp32 routing weights on the host (the router
 * has its own cases in gpu_moe.c), then:
 *   reference: k3k_moe_plan → per active expert GEMM gate/up (bf16) → SILU_MUL → GEMM down (bf16)
 *              → MOE_COMBINE, all on the reference backend;
 *   device:    k3k_cu_moe_plan → k3k_cu_moe_bf16_experts (gate/up+SiLU, then down: what the
 *              runner calls at decode) → k3k_cu_moe_combine_raw, and the same again to prove the
 *              result bit-identical from run to run (the kernel's fixed summation order); or, for
 *              the prefill cases, k3k_cu_moe_dq_experts with bf16 weights (padded layout,
 *              pointer-array batched cuBLASLt GEMMs) in place of k3k_cu_moe_bf16_experts.
 * Tolerance 1e-2 (bf16 outputs: one rounding each of gate, up, act, down, combine; the fp32 sums
 * differ from the reference's only in order). Outputs poisoned first. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"
#include "moe_bf16.h"
#include "moe_ops.h"

typedef struct {
  int32_t T, E, k, D, F;
  int batched; /* the prefill path: k3k_cu_moe_dq_experts in its bf16 mode (moe_dq.h) */
  gpair z, w1, w3, w2, y; /* experts stacked: w1/w3 [E*F, D], w2 [E*D, F] */
  int32_t *idx;
  float *wt;
} bcase;

static int reference(gctx *g, bcase *c) {
  k3k_backend_t *be = g->ref;
  const int32_t T = c->T, k = c->k, E = c->E, D = c->D, F = c->F, TK = T * k;
  int32_t *off = malloc((size_t)(E + 1) * 4), *gt = malloc((size_t)TK * 4), *ri = malloc((size_t)TK * 4);
  uint16_t *xin = malloc((size_t)TK * D * 2), *h1 = malloc((size_t)TK * F * 2);
  uint16_t *h3 = malloc((size_t)TK * F * 2), *ha = malloc((size_t)TK * F * 2);
  uint16_t *yr = malloc((size_t)TK * D * 2);
  int rc = off && gt && ri && xin && h1 && h3 && ha && yr ? 0 : K3_ENOMEM;
  if (!rc) rc = k3k_moe_plan(c->idx, T, k, E, off, gt, ri);
  k3k_tensor_t tgt = k3k_tensor_1d(be, K3K_I32, gt, TK), tx = k3k_tensor_2d(be, K3K_BF16, xin, TK, D);
  k3k_tensor_t t1 = k3k_tensor_2d(be, K3K_BF16, h1, TK, F), t3 = k3k_tensor_2d(be, K3K_BF16, h3, TK, F);
  k3k_tensor_t ta = k3k_tensor_2d(be, K3K_BF16, ha, TK, F), ty = k3k_tensor_2d(be, K3K_BF16, yr, TK, D);
  if (!rc) rc = k3k_get_rows(be, &c->z.h, &tgt, &tx);
  for (int32_t e = 0; e < E && !rc; e++) {
    int64_t b = off[e], n = off[e + 1] - off[e];
    if (!n) continue;
    k3k_tensor_t xe = k3k_tensor_slice(&tx, 0, b, n), g1 = k3k_tensor_slice(&t1, 0, b, n);
    k3k_tensor_t g3 = k3k_tensor_slice(&t3, 0, b, n), ga = k3k_tensor_slice(&ta, 0, b, n);
    k3k_tensor_t ye = k3k_tensor_slice(&ty, 0, b, n);
    k3k_tensor_t w1 = k3k_tensor_slice(&c->w1.h, 0, (int64_t)e * F, F);
    k3k_tensor_t w3 = k3k_tensor_slice(&c->w3.h, 0, (int64_t)e * F, F);
    k3k_tensor_t w2 = k3k_tensor_slice(&c->w2.h, 0, (int64_t)e * D, D);
    rc = k3k_gemm(be, &xe, &w1, &g1);
    if (!rc) rc = k3k_gemm(be, &xe, &w3, &g3);
    if (!rc) rc = k3k_silu_mul(be, &g1, &g3, &ga);
    if (!rc) rc = k3k_gemm(be, &ga, &w2, &ye);
  }
  k3k_tensor_t tri = k3k_tensor_2d(be, K3K_I32, ri, T, k), tw = k3k_tensor_2d(be, K3K_F32, c->wt, T, k);
  if (!rc) rc = k3k_moe_combine(be, &ty, &tri, &tw, &c->y.h);
  free(off), free(gt), free(ri), free(xin), free(h1), free(h3), free(ha), free(yr);
  return rc;
}

/* Device pipeline into y (device), from idx/wt already on the device. */
static int device(gctx *g, bcase *c, void *mem, const int32_t *didx, const float *dwt) {
  cudaStream_t st = k3k_cuda_ctx_of(g->cuda)->stream;
  const int32_t T = c->T, k = c->k, E = c->E, D = c->D, F = c->F, TK = T * k;
  char *p = mem;
#define TAKE(ptr, type, n)           \
  type *ptr = (type *)p;             \
  p += (((size_t)(n) * sizeof(type)) + 255) & ~(size_t)255;
  TAKE(gt, int32_t, TK);
  TAKE(ri, int32_t, TK);
  TAKE(off, int32_t, E + 1);
  TAKE(act, int32_t, E + 1);
  TAKE(tab, const uint16_t *, 3 * E);
  TAKE(h, uint16_t, (size_t)TK * F);
  TAKE(yr, uint16_t, (size_t)TK * D);
  TAKE(scr, char, k3k_cu_moe_plan_scratch(T, E));
  TAKE(bscr, char, c->batched ? k3k_cu_moe_dq_scratch_bytes(TK, E, F, D) : 0);
#undef TAKE
  const uint16_t **ht = malloc((size_t)(3 * E) * sizeof *ht);
  if (!ht) return K3_ENOMEM;
  for (int32_t e = 0; e < E; e++) {
    ht[e] = (const uint16_t *)c->w1.d.data + (size_t)e * F * D;
    ht[E + e] = (const uint16_t *)c->w3.d.data + (size_t)e * F * D;
    ht[2 * E + e] = (const uint16_t *)c->w2.d.data + (size_t)e * D * F;
  }
  int rc = g->cuda->copy_from_host(g->cuda, tab, ht, (size_t)(3 * E) * sizeof *ht);
  if (!rc) rc = k3k_cu_moe_plan(st, didx, T, k, E, off, gt, ri, act, NULL, scr);
  const int32_t maxa = TK < E ? TK : E;
  if (!rc && !c->batched)
    rc = k3k_cu_moe_bf16_experts(st, tab, E, F, D, c->z.d.data, D, gt, off, act, maxa, h, yr);
  if (!rc && c->batched) {
    k3k_cu_moe_dq_args d;
    memset(&d, 0, sizeof d);
    d.w1_bf16 = (const void *const *)ht;
    d.w3_bf16 = (const void *const *)ht + E;
    d.w2_bf16 = (const void *const *)ht + 2 * E;
    d.act = K3K_CU_ACT_SILU_MUL;
    d.F = F, d.D = D, d.E = E, d.T = T, d.k = k;
    d.x = (const uint16_t *)c->z.d.data;
    d.ldx = D;
    d.gather_tok = gt;
    d.expert_off = off;
    d.h = h;
    d.y = yr;
    d.scratch = bscr;
    rc = k3k_cu_moe_dq_experts(k3k_cuda_ctx_of(g->cuda), &d);
  }
  free(ht);
  k3k_tensor_t tyr = k3k_tensor_2d(g->cuda, K3K_BF16, yr, TK, D);
  k3k_tensor_t tri = k3k_tensor_2d(g->cuda, K3K_I32, ri, T, k);
  k3k_tensor_t tw = k3k_tensor_2d(g->cuda, K3K_F32, (void *)dwt, T, k);
  if (!rc) rc = k3k_cu_moe_combine_raw(st, &tyr, &tri, &tw, &c->y.d, NULL);
  if (!rc) rc = g->cuda->synchronize(g->cuda);
  return rc;
}

static void bf16_case(gctx *g, int32_t T, int32_t E, int32_t k, int32_t D, int32_t F, int batched) {
  char what[160];
  snprintf(what, sizeof what, "moe bf16 experts%s (plan+gate/up+SiLU+down+combine) T=%d E=%d k=%d D=%d F=%d",
           batched ? " batched prefill path" : "", T, E, k, D, F);
  bcase c;
  memset(&c, 0, sizeof c);
  c.T = T, c.E = E, c.k = k, c.D = D, c.F = F, c.batched = batched;
  const int32_t TK = T * k;
  const size_t mem_bytes = (size_t)TK * 8 + (size_t)(2 * E + 2) * 4 + (size_t)(3 * E) * 8 +
                           (size_t)TK * (F + D) * 2 + k3k_cu_moe_plan_scratch(T, E) + 9 * 256 +
                           (batched ? k3k_cu_moe_dq_scratch_bytes(TK, E, F, D) : 0);
  void *mem = NULL, *didx = NULL, *dwt = NULL;
  uint16_t *first = NULL;
  c.idx = malloc((size_t)TK * 4);
  c.wt = malloc((size_t)TK * 4);
  int rc = c.idx && c.wt ? 0 : K3_ENOMEM;
  rc = rc || gpair_new(g, &c.z, K3K_BF16, 2, (int64_t[]){T, D}) ||
       gpair_new(g, &c.w1, K3K_BF16, 2, (int64_t[]){(int64_t)E * F, D}) ||
       gpair_new(g, &c.w3, K3K_BF16, 2, (int64_t[]){(int64_t)E * F, D}) ||
       gpair_new(g, &c.w2, K3K_BF16, 2, (int64_t[]){(int64_t)E * D, F}) ||
       gpair_new(g, &c.y, K3K_BF16, 2, (int64_t[]){T, D}) || g->cuda->alloc(g->cuda, mem_bytes, &mem) ||
       g->cuda->alloc(g->cuda, (size_t)TK * 4, &didx) || g->cuda->alloc(g->cuda, (size_t)TK * 4, &dwt);
  if (!rc)
    rc = gpair_rand(g, &c.z, -1, 1) || gpair_rand(g, &c.w1, -0.05f, 0.05f) ||
         gpair_rand(g, &c.w3, -0.05f, 0.05f) || gpair_rand(g, &c.w2, -0.05f, 0.05f) ||
         gpair_poison(g, &c.y);
  /* k distinct experts per token (a partial Fisher-Yates over a fresh permutation) */
  int32_t *perm = malloc((size_t)E * 4);
  if (!perm) rc = K3_ENOMEM;
  for (int32_t t = 0; t < T && !rc; t++) {
    for (int32_t e = 0; e < E; e++) perm[e] = e;
    for (int32_t j = 0; j < k; j++) {
      int32_t s = j + (int32_t)(g_rand_u64(g) % (uint64_t)(E - j)), tmp = perm[j];
      perm[j] = perm[s], perm[s] = tmp;
      c.idx[t * k + j] = perm[j];
      c.wt[t * k + j] = g_rand_unif(g, 0.05f, 0.4f);
    }
  }
  free(perm);
  if (!rc) rc = g->cuda->copy_from_host(g->cuda, didx, c.idx, (size_t)TK * 4) ||
                g->cuda->copy_from_host(g->cuda, dwt, c.wt, (size_t)TK * 4);
  if (!rc) rc = reference(g, &c);
  if (rc) {
    g_record(g, false, "%s: setup/reference failed (%d)", what, rc);
    goto out;
  }
  rc = device(g, &c, mem, didx, dwt);
  if (rc) {
    g_record(g, false, "%s: cuda failed: %s", what, k3_strerror(rc));
    goto out;
  }
  gpair_check(g, &c.y, 1e-2, what);
  /* run again: bit-identical */
  first = malloc((size_t)T * D * 2);
  uint16_t *second = malloc((size_t)T * D * 2);
  rc = first && second ? 0 : K3_ENOMEM;
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, first, c.y.d.data, (size_t)T * D * 2);
  if (!rc) rc = gpair_poison(g, &c.y) || device(g, &c, mem, didx, dwt);
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, second, c.y.d.data, (size_t)T * D * 2);
  g_record(g, !rc && !memcmp(first, second, (size_t)T * D * 2), "%s: second run bit-identical (rc %d)",
           what, rc);
  free(second);
out:
  free(first);
  free(c.idx);
  free(c.wt);
  gpair *all[] = {&c.z, &c.w1, &c.w3, &c.w2, &c.y};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i]->h.data) gpair_free(g, all[i]);
  if (mem) g->cuda->free(g->cuda, mem);
  if (didx) g->cuda->free(g->cuda, didx);
  if (dwt) g->cuda->free(g->cuda, dwt);
}

/* The wanted rule and the argument checks, host only. */
static void bf16_rules(gctx *g) {
  bool ok = k3k_cu_moe_bf16_wanted(1, 8, 256) && k3k_cu_moe_bf16_wanted(64, 8, 256) &&
            !k3k_cu_moe_bf16_wanted(8192, 8, 256) && !k3k_cu_moe_bf16_wanted(0, 8, 256) &&
            k3k_cu_moe_bf16_wanted(2, 8, 1) && !k3k_cu_moe_bf16_wanted(3, 8, 1);
  g_record(g, ok, "moe bf16: path rule (<= 16 rows per active expert)");
  k3k_cu_moe_bf16_args a;
  memset(&a, 0, sizeof a);
  a.N = 16, a.K = 12, a.ldw = 16, a.ldx = 16, a.ldy = 16; /* K % 8 != 0 */
  g_record(g, k3k_cu_moe_bf16_gemm(k3k_cuda_ctx_of(g->cuda)->stream, &a) == K3_EINVAL,
           "moe bf16: bad arguments refused with K3_EINVAL");
}

int gpu_moe_bf16_parity(gctx *g) {
  bf16_rules(g);
  bf16_case(g, 1, 256, 8, 2304, 1024, 0);  /* 48B decode, batch 1 */
  bf16_case(g, 16, 256, 8, 2304, 1024, 0); /* batch 16: some experts with 2+ rows */
  bf16_case(g, 40, 6, 2, 2304, 1024, 0);   /* ~13 rows per expert: two x chunks of 8 */
  bf16_case(g, 7, 16, 4, 264, 72, 0);      /* odd widths: N tail of a block, K not a multiple of 256 */
  bf16_case(g, 1024, 256, 8, 2304, 1024, 1); /* 48B prefill: ~32 rows per expert, many groups */
  bf16_case(g, 300, 16, 4, 2304, 1024, 1);   /* ~75 rows per expert, groups of 4 */
  bf16_case(g, 97, 64, 2, 288, 96, 1);       /* ~3 rows, empty experts, small widths */
  return g->failed;
}
