/* The decode step's one-launch residual glue (k3k_cuda_add_mix_norm, kernels/cuda/resnorm.cu)
 * inside k3k-gpu-check (CUDA internals, gpu_resnorm_cases): for each form (add + mix + norm, mix
 * + norm, add + norm, norm alone) at K3's width 7168 and odd widths (each norm vector count
 * 1/2/4/8), 1-4 tokens, 0-15 snapshots:
 *   - P, h and xn of the fused launch are byte-identical to the ADD, ATTN_RES_MIX and RMSNORM
 *     ops queued one after the other on the same device and inputs (the promise the runner
 *     relies on: a device-only comparison the op test cannot make);
 *   - refusals of k3k_cuda_add_mix_norm_fits: more tokens than SMs, a misaligned row, xn
 *     aliasing P.
 * The fused op's parity against the reference at these shapes (RES_MIX_NORM through the op API)
 * is test_kernels --real's (tests/kernels/t_fused.c t_fused_real). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"

typedef struct {
  gpair P, a, S, wn, wp, h, lw, xn;
  int64_t T, d, nb;
} rcase;

static int rc_new(gctx *g, rcase *c, int64_t T, int64_t d, int64_t nb) {
  memset(c, 0, sizeof *c);
  c->T = T, c->d = d, c->nb = nb;
  const int64_t r2[2] = {T, d}, v1[1] = {d}, s3[3] = {nb > 0 ? nb : 1, T, d};
  int rc = gpair_new(g, &c->P, K3K_BF16, 2, r2);
  if (!rc) rc = gpair_new(g, &c->a, K3K_BF16, 2, r2);
  if (!rc) rc = gpair_new(g, &c->S, K3K_BF16, 3, s3);
  if (!rc) rc = gpair_new(g, &c->wn, K3K_BF16, 1, v1);
  if (!rc) rc = gpair_new(g, &c->wp, K3K_BF16, 1, v1);
  if (!rc) rc = gpair_new(g, &c->h, K3K_BF16, 2, r2);
  if (!rc) rc = gpair_new(g, &c->lw, K3K_BF16, 1, v1);
  if (!rc) rc = gpair_new(g, &c->xn, K3K_BF16, 2, r2);
  if (!rc) rc = gpair_rand(g, &c->P, -2, 2);
  if (!rc) rc = gpair_rand(g, &c->a, -1, 1);
  if (!rc) rc = gpair_rand(g, &c->S, -2, 2);
  if (!rc) rc = gpair_rand(g, &c->wn, 0.5f, 1.5f);
  if (!rc) rc = gpair_rand(g, &c->wp, -1, 1);
  if (!rc) rc = gpair_rand(g, &c->lw, 0.5f, 1.5f);
  if (!rc) rc = gpair_poison(g, &c->h);
  if (!rc) rc = gpair_poison(g, &c->xn);
  return rc;
}

static void rc_free(gctx *g, rcase *c) {
  gpair *ps[8] = {&c->P, &c->a, &c->S, &c->wn, &c->wp, &c->h, &c->lw, &c->xn};
  for (int i = 0; i < 8; i++) gpair_free(g, ps[i]);
}

/* The op chain on the device views (be: the cuda backend). */
static int chain(k3k_backend_t *be, rcase *c, bool add, bool mix) {
  k3k_tensor_t sv = k3k_tensor_slice(&c->S.d, 0, 0, c->nb);
  const k3k_attn_res_params_t mp = {.eps = 1e-5f};
  const k3k_rmsnorm_params_t np = {.eps = 1e-5f, .bf16_inner = 1};
  int rc = add ? k3k_add(be, &c->P.d, &c->a.d, &c->P.d) : 0;
  if (!rc && mix) rc = k3k_attn_res_mix(be, &mp, &sv, &c->P.d, &c->wn.d, &c->wp.d, &c->h.d);
  if (!rc) rc = k3k_rmsnorm(be, &np, mix ? &c->h.d : &c->P.d, &c->lw.d, &c->xn.d);
  return rc;
}

static void *dl(k3k_backend_t *be, const gpair *p) {
  void *b = malloc(p->bytes);
  if (b && be->copy_to_host(be, b, p->d.data, p->bytes)) {
    free(b);
    b = NULL;
  }
  return b;
}

static void one(gctx *g, int64_t T, int64_t d, int64_t nb, bool add, bool mix) {
  k3k_backend_t *be = g->cuda;
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  char what[128];
  snprintf(what, sizeof what, "add_mix_norm T=%lld d=%lld nb=%lld%s%s", (long long)T,
           (long long)d, (long long)nb, add ? " add" : "", mix ? " mix" : "");
  rcase c;
  void *p0 = NULL, *fused[3] = {0}, *ops[3] = {0};
  if (rc_new(g, &c, T, d, nb) || !(p0 = dl(be, &c.P))) {
    g_record(g, false, "%s: setup failed", what);
    goto done;
  }
  /* fused launch */
  k3k_tensor_t sv = k3k_tensor_slice(&c.S.d, 0, 0, nb);
  int rc = k3k_cuda_add_mix_norm(cx, add ? &c.a.d : NULL, &c.P.d, mix ? &sv : NULL, &c.wn.d,
                                 &c.wp.d, 1e-5f, &c.h.d, &c.lw.d, 1e-5f, 1, &c.xn.d);
  if (!rc) rc = be->synchronize(be);
  gpair *outs[3] = {&c.P, &c.h, &c.xn};
  for (int i = 0; i < 3 && !rc; i++)
    if (!(fused[i] = dl(be, outs[i]))) rc = K3_EDEVICE;
  /* the op chain from the same P, with fresh poison */
  if (!rc) rc = be->copy_from_host(be, c.P.d.data, p0, c.P.bytes);
  if (!rc) rc = gpair_poison(g, &c.h);
  if (!rc) rc = gpair_poison(g, &c.xn);
  if (!rc) rc = chain(be, &c, add, mix);
  if (!rc) rc = be->synchronize(be);
  for (int i = 0; i < 3 && !rc; i++)
    if (!(ops[i] = dl(be, outs[i]))) rc = K3_EDEVICE;
  if (rc) {
    g_record(g, false, "%s: run failed: %s", what, k3_errname(rc));
    goto done;
  }
  bool same = !memcmp(fused[0], ops[0], c.P.bytes) && !memcmp(fused[2], ops[2], c.xn.bytes) &&
              (!mix || !memcmp(fused[1], ops[1], c.h.bytes));
  g_record(g, same, "%s: P, h, xn byte-identical to the three ops", what);
done:
  free(p0);
  for (int i = 0; i < 3; i++) free(fused[i]), free(ops[i]);
  rc_free(g, &c);
}

static void refusals(gctx *g) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(g->cuda);
  rcase c, big;
  if (rc_new(g, &c, 2, 7168, 3) || rc_new(g, &big, cx->num_sms + 1, 256, 1)) {
    g_record(g, false, "add_mix_norm refusals: setup failed");
    return;
  }
  k3k_tensor_t sv = k3k_tensor_slice(&c.S.d, 0, 0, 3), bsv = k3k_tensor_slice(&big.S.d, 0, 0, 1);
  k3k_tensor_t mis = c.P.d;
  mis.data = (char *)mis.data + 2;
  mis.shape[1] -= 8;
  bool ok = !k3k_cuda_add_mix_norm_fits(cx, &big.a.d, &big.P.d, &bsv, &big.wn.d, &big.wp.d,
                                         &big.h.d, &big.lw.d, &big.xn.d) &&
            !k3k_cuda_add_mix_norm_fits(cx, NULL, &c.P.d, &sv, &c.wn.d, &c.wp.d, &c.h.d,
                                         &c.lw.d, &c.P.d) &&
            !k3k_cuda_add_mix_norm_fits(cx, NULL, &mis, NULL, NULL, NULL, NULL, &c.lw.d, &c.xn.d) &&
            k3k_cuda_add_mix_norm_fits(cx, &c.a.d, &c.P.d, &sv, &c.wn.d, &c.wp.d, &c.h.d,
                                        &c.lw.d, &c.xn.d);
  int rc = k3k_cuda_add_mix_norm(cx, NULL, &c.P.d, &sv, &c.wn.d, &c.wp.d, 1e-5f, &c.h.d, &c.lw.d,
                                 1e-5f, 1, &c.P.d);
  g_record(g, ok && rc == K3_EINVAL,
           "add_mix_norm refuses T > SMs, xn aliasing P, a misaligned row (and takes the good "
           "case): %s, call -> %s", ok ? "yes" : "no", k3_errname(rc));
  rc_free(g, &c);
  rc_free(g, &big);
}

void gpu_resnorm_cases(gctx *g) {
  refusals(g);
  static const int64_t ds[] = {7168, 1000, 2048, 4096, 8192};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    one(g, 1, ds[i], 12, true, true);
    one(g, 3, ds[i], 1, true, true);
  }
  one(g, 4, 7168, 0, true, true); /* a mix with no snapshot: h = P */
  one(g, 2, 7168, 8, false, true);
  one(g, 1, 7168, 0, true, false); /* the 48B form: add + norm */
  one(g, 2, 1000, 0, false, false);
  one(g, 1, 7168, 15, true, true); /* ARM_MAXV values */
}
