/* The fused ops (k3k.h "Fusions": RES_MIX_NORM, GEMM_MULTI, KDA_DECODE; MOE_ROUTED in
 * t_fused_moe.c) on every backend against
 * the "cpu" reference, at the tiny shapes (CI, `test_kernels`) and at the real K3 shapes (GPU
 * host, `test_kernels --real`), with ONE tolerance model for both:
 *
 *   - "cpu" is the specification: its fused op must be bit-identical to the chain of ops the
 *     fusion means, run here op by op (tiny shapes; the chain is written out independently of
 *     kernels/cpu/fused.c).
 *   - every other host backend ("cpu-fast") must be bit-identical to "cpu" on every output.
 *   - a device backend: per output, the relative Frobenius error ||got - ref|| / ||ref|| is at
 *     most 1e-2 for BF16 outputs and 1e-4 for F32 ones (the gpu parity suite's figures, derived
 *     in tests/gpu/gpu_parity.c: one bf16 ulp on a few elements stays ~2e-3; fp32 summation
 *     order ~5e-6), NaN where the reference has NaN and nowhere else, I32 outputs exact.
 * Outputs are poisoned (all-ones bytes: NaN) before each run; in/out tensors (states, P) start
 * from the same random contents on every backend. A device backend that refuses a shape is a
 * skip, except with --require-device (the real-shape run on the GPU: the fused kernels must take
 * those shapes). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-4

bool g_require_dev;

/* Uploads the table's matrices to be (dev: tab->n allocations) and writes their addresses into
 * the PTR slot's buffer dst (be's memory). */
static int upload_table(k3k_backend_t *be, const ft_table_t *tab, void **dev, void *dst) {
  void **addr = calloc((size_t)tab->n, sizeof *addr);
  int rc = addr ? 0 : K3_ENOMEM;
  for (int j = 0; j < tab->n && !rc; j++) {
    const tt_t *m = &tab->mats[j];
    if (be->alloc(be, m->bytes, &dev[j])) {
      rc = K3_ENOMEM;
      break;
    }
    be->copy_from_host(be, dev[j], m->buf, m->bytes);
    addr[j] = (char *)dev[j] + ((char *)m->t.data - (char *)m->buf);
  }
  if (!rc) be->copy_from_host(be, dst, addr, (size_t)tab->n * sizeof *addr);
  free(addr);
  return rc;
}

/* Runs op on be with slots (a slot with buf NULL is a NULL tensor) uploaded from orig (outputs
 * poisoned; tab's PTR slot filled with the addresses of its matrices uploaded to be; an op's
 * NULL ws slot given k3k_workspace bytes when the backend needs them), downloads every output
 * into got[i] (malloc'd, slot bytes). Returns the op's rc, or K3_ENOMEM. */
static int run_on(k3k_backend_t *be, k3k_op_t op, const void *params, tt_t *s, int n,
                  void **orig, void **got, const ft_table_t *tab) {
  void *dev[K3K_MAX_ARGS] = {0}, **mdev = tab ? calloc((size_t)tab->n, sizeof *mdev) : NULL;
  k3k_tensor_t tv[K3K_MAX_ARGS];
  const k3k_tensor_t *tp[K3K_MAX_ARGS];
  int rc = tab && !mdev ? K3_ENOMEM : 0;
  for (int i = 0; i < n && !rc; i++) {
    tp[i] = NULL;
    if (!s[i].buf) continue;
    if (be->alloc(be, s[i].bytes, &dev[i])) {
      rc = K3_ENOMEM;
      break;
    }
    if (s[i].out && !s[i].inout) {
      void *tmp = malloc(s[i].bytes);
      memset(tmp, 0xFF, s[i].bytes);
      be->copy_from_host(be, dev[i], tmp, s[i].bytes);
      free(tmp);
    } else {
      be->copy_from_host(be, dev[i], orig[i], s[i].bytes);
    }
    tv[i] = s[i].t;
    tv[i].data = (char *)dev[i] + ((char *)s[i].t.data - (char *)s[i].buf);
    tv[i].backend = be;
    tp[i] = &tv[i];
    if (tab && i == tab->slot) rc = upload_table(be, tab, mdev, dev[i]);
  }
  const int ws = op == K3K_OP_MOE_ROUTED ? 7 : -1;
  if (!rc && ws >= 0 && !tp[ws]) {
    const size_t need = k3k_workspace(be, op, params, tp, n);
    if (need && be->alloc(be, need, &dev[ws])) rc = K3_ENOMEM;
    if (need && !rc) {
      tv[ws] = k3k_tensor_1d(be, K3K_U8, dev[ws], (int64_t)need);
      tp[ws] = &tv[ws];
    }
  }
  if (!rc) rc = k3k_run(be, op, params, tp, n);
  be->synchronize(be);
  for (int i = 0; i < n; i++) {
    if (!dev[i]) continue;
    if (!rc && s[i].out) {
      got[i] = malloc(s[i].bytes);
      be->copy_to_host(be, got[i], dev[i], s[i].bytes);
    }
    be->free(be, dev[i]);
  }
  for (int j = 0; tab && mdev && j < tab->n; j++)
    if (mdev[j]) be->free(be, mdev[j]);
  free(mdev);
  return rc;
}

/* The one tolerance model (file comment) for output slot s: got vs ref, both host copies of the
 * slot's buffer; exact: the host backends' bit-identity. */
static void compare(const char *name, const char *be_name, bool exact, int i, const tt_t *s,
                    const void *got, const void *ref) {
  k3k_tensor_t gt = s->t, rt = s->t;
  const size_t off = (size_t)((char *)s->t.data - (char *)s->buf);
  gt.data = (char *)got + off;
  rt.data = (char *)ref + off;
  tt_t g = *s, r = *s;
  g.t = gt, r.t = rt;
  const int64_t n = tt_numel(s);
  if (exact || s->t.dtype == K3K_I32) { /* same value and sign; NaN where NaN */
    int64_t diff = -1;
    for (int64_t e = 0; e < n && diff < 0; e++) {
      double a = tt_get(&g, e), b = tt_get(&r, e);
      if (!((a == b && signbit(a) == signbit(b)) || (isnan(a) && isnan(b)))) diff = e;
    }
    check(diff < 0, "%s[%s] t[%d]: not identical to the reference at element %lld (%.9g vs %.9g)",
          name, be_name, i, (long long)diff, diff >= 0 ? tt_get(&g, diff) : 0.0,
          diff >= 0 ? tt_get(&r, diff) : 0.0);
    return;
  }
  double num = 0, den = 0;
  int64_t nan_bad = 0;
  for (int64_t e = 0; e < n; e++) {
    double a = tt_get(&g, e), b = tt_get(&r, e);
    if (isnan(a) != isnan(b)) nan_bad++;
    if (isnan(a) || isnan(b)) continue;
    num += (a - b) * (a - b);
    den += b * b;
  }
  const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
  const double tol = s->t.dtype == K3K_BF16 ? TOL_BF16 : TOL_F32;
  check(nan_bad == 0 && rel <= tol, "%s[%s] t[%d]: rel_fro %.3e > tol %.0e or %lld NaN mismatches",
        name, be_name, i, rel, tol, (long long)nan_bad);
  if (g_require_dev)
    printf("  %s[%s] t[%d]: rel_fro %.3e (tol %.0e)\n", name, be_name, i, rel, tol);
}

/* Runs the case on "cpu" (the reference) and every other backend, compares by the model (tab:
 * the PTR slot's matrices, or NULL).
 * chain: when not NULL, the reference outputs the test computed op by op (same layout as the
 * slots' buffers, NULL for non-outputs): "cpu" must equal them bit for bit. */
void fused_check(const char *name, k3k_op_t op, const void *params, tt_t *s, int n,
                 void **chain, const ft_table_t *tab) {
  void *orig[K3K_MAX_ARGS] = {0}, *ref[K3K_MAX_ARGS] = {0};
  for (int i = 0; i < n; i++) {
    if (!s[i].buf) continue;
    orig[i] = malloc(s[i].bytes);
    memcpy(orig[i], s[i].buf, s[i].bytes);
  }
  k3k_backend_t *cpu = k3k_backend_get("cpu");
  int rc = run_on(cpu, op, params, s, n, orig, ref, tab);
  check(rc == 0, "%s[cpu]: rc %d (%s)", name, rc, k3_errname(rc));
  for (int i = 0; i < n && !rc && chain; i++)
    if (s[i].out && chain[i]) compare(name, "cpu vs chain", true, i, &s[i], ref[i], chain[i]);
  for (const char *const *nm = k3k_backend_names(); *nm && !rc; nm++) {
    k3k_backend_t *be = k3k_backend_get(*nm);
    if (!be || be == cpu) continue;
    void *got[K3K_MAX_ARGS] = {0};
    int brc = run_on(be, op, params, s, n, orig, got, tab);
    if (brc == K3_ENOTSUP && !be->host_memory && !g_require_dev) {
      g_skip++;
      printf("SKIP: %s[%s]: not supported\n", name, be->name);
      continue;
    }
    check(brc == 0, "%s[%s]: rc %d (%s)", name, be->name, brc, k3_errname(brc));
    for (int i = 0; i < n; i++) {
      if (!brc && s[i].out) compare(name, be->name, be->host_memory, i, &s[i], got[i], ref[i]);
      free(got[i]);
    }
  }
  for (int i = 0; i < n; i++) {
    free(orig[i]);
    free(ref[i]);
  }
}

/* A host copy of slot s's buffer after running `fn` on cpu over views into it is the chain
 * output; helpers to make the chain's intermediates. */
void *dup_buf(const tt_t *s) {
  void *p = malloc(s->bytes);
  memcpy(p, s->buf, s->bytes);
  return p;
}
k3k_tensor_t view_in(const tt_t *s, void *buf) {
  k3k_tensor_t t = s->t;
  t.data = (char *)buf + ((char *)s->t.data - (char *)s->buf);
  return t;
}

/* ---- RES_MIX_NORM ---- */
static void res_case(int64_t T, int64_t D, int64_t nb, bool add, bool mix, k3k_dtype_t dt,
                     int inner, bool with_chain) {
  tt_t s[8];
  memset(s, 0, sizeof s);
  if (add) s[0] = tt_2d(dt, T, D, with_chain ? 3 : 0), tt_rand(&s[0], -1, 1);
  s[1] = tt_2d(dt, T, D, 0), tt_rand(&s[1], -2, 2);
  s[1].out = s[1].inout = true;
  if (mix) {
    int64_t sh[3] = {nb, T, D};
    s[2] = tt_new(dt, 3, sh, 0), tt_rand(&s[2], -2, 2);
    s[3] = tt_1d(dt, D), tt_rand(&s[3], 0.5, 1.5);
    s[4] = tt_1d(dt, D), tt_rand(&s[4], -1, 1);
    s[5] = tt_2d(dt, T, D, 0), s[5].out = true;
  }
  s[6] = tt_1d(dt, D), tt_rand(&s[6], 0.5, 1.5);
  s[7] = tt_2d(dt, T, D, 0), s[7].out = true;
  const k3k_res_mix_norm_params_t p = {.eps_mix = 1e-5f, .eps = 1e-6f, .bf16_inner = inner};
  char name[128];
  snprintf(name, sizeof name, "res_mix_norm T=%lld D=%lld nb=%lld%s%s %s inner=%d", (long long)T,
           (long long)D, (long long)nb, add ? " +a" : "", mix ? " mix" : "", k3k_dtype_name(dt),
           inner);
  void *chain[8] = {0};
  if (with_chain) { /* ADD → ATTN_RES_MIX → RMSNORM, op by op on "cpu" */
    k3k_backend_t *cpu = k3k_backend_get("cpu");
    chain[1] = dup_buf(&s[1]), chain[7] = dup_buf(&s[7]);
    k3k_tensor_t P = view_in(&s[1], chain[1]), xn = view_in(&s[7], chain[7]), h;
    int rc = add ? k3k_add(cpu, &P, &s[0].t, &P) : 0;
    if (mix) {
      chain[5] = dup_buf(&s[5]);
      h = view_in(&s[5], chain[5]);
      k3k_attn_res_params_t mp = {.eps = 1e-5f};
      if (!rc) rc = k3k_attn_res_mix(cpu, &mp, &s[2].t, &P, &s[3].t, &s[4].t, &h);
    }
    k3k_rmsnorm_params_t np = {.eps = 1e-6f, .bf16_inner = inner};
    if (!rc) rc = k3k_rmsnorm(cpu, &np, mix ? &h : &P, &s[6].t, &xn);
    check(rc == 0, "%s: chain rc %d", name, rc);
  }
  fused_check(name, K3K_OP_RES_MIX_NORM, &p, s, 8, with_chain ? chain : NULL, NULL);
  for (int i = 0; i < 8; i++) {
    free(chain[i]);
    if (s[i].buf) tt_free(&s[i]);
  }
}

/* ---- GEMM_MULTI ---- */
static void multi_case(int64_t M, int64_t K, int n, const int64_t *N, k3k_dtype_t dt,
                       int64_t xpad, bool with_chain) {
  tt_t s[9];
  memset(s, 0, sizeof s);
  s[0] = tt_2d(dt, M, K, xpad), tt_rand(&s[0], -1, 1);
  for (int j = 0; j < n; j++) {
    s[1 + j] = tt_2d(dt, N[j], K, 0), tt_rand(&s[1 + j], -0.5, 0.5);
    s[5 + j] = tt_2d(dt, M, N[j], 0), s[5 + j].out = true;
  }
  const k3k_gemm_multi_params_t p = {.n = n};
  char name[128];
  snprintf(name, sizeof name, "gemm_multi M=%lld K=%lld n=%d N0=%lld %s", (long long)M,
           (long long)K, n, (long long)N[0], k3k_dtype_name(dt));
  void *chain[9] = {0};
  if (with_chain) {
    for (int j = 0; j < n; j++) {
      chain[5 + j] = dup_buf(&s[5 + j]);
      k3k_tensor_t y = view_in(&s[5 + j], chain[5 + j]);
      int rc = k3k_gemm(k3k_backend_get("cpu"), &s[0].t, &s[1 + j].t, &y);
      check(rc == 0, "%s: chain rc %d", name, rc);
    }
  }
  fused_check(name, K3K_OP_GEMM_MULTI, &p, s, 9, with_chain ? chain : NULL, NULL);
  for (int i = 0; i < 9; i++) {
    free(chain[i]);
    if (s[i].buf) tt_free(&s[i]);
  }
}

/* ---- KDA_DECODE ---- */
enum { QL, KL, VL, GR, BR, Z, WQ, WK, WV, CQ, CK, CV, AL, DT, ON, SL, ST, OUT };

static void kda_chain(tt_t *s, const k3k_kda_decode_params_t *p, void **chain, const char *name) {
  k3k_backend_t *cpu = k3k_backend_get("cpu");
  const int64_t N = p->n_seqs, P = (int64_t)p->n_heads * p->head_dim;
  const k3k_dtype_t D = s[OUT].t.dtype;
  for (int i = CQ; i <= CV; i++) chain[i] = dup_buf(&s[i]);
  chain[ST] = dup_buf(&s[ST]);
  chain[OUT] = dup_buf(&s[OUT]);
  tt_t c[3] = {tt_2d(D, N, P, 0), tt_2d(D, N, P, 0), tt_2d(D, N, P, 0)};
  tt_t qn = tt_2d(K3K_F32, N, P, 0), kn = tt_2d(K3K_F32, N, P, 0), g = tt_2d(K3K_F32, N, P, 0);
  tt_t beta = tt_2d(K3K_F32, N, p->n_heads, 0), o = tt_2d(D, N, P, 0);
  k3k_tensor_t st[3], S = view_in(&s[ST], chain[ST]), out = view_in(&s[OUT], chain[OUT]);
  k3k_conv_params_t cp = {.n_seqs = p->n_seqs, .read_state = 1, .activation = 1};
  int rc = 0;
  for (int j = 0; j < 3 && !rc; j++) {
    st[j] = view_in(&s[CQ + j], chain[CQ + j]);
    rc = k3k_conv_step(cpu, &cp, &s[QL + j].t, &s[WQ + j].t, &s[SL].t, &st[j], &c[j].t);
  }
  k3k_l2norm_params_t lp = {.head_dim = p->head_dim, .eps = p->l2_eps, .scale = 1.0f};
  if (!rc) rc = k3k_l2norm(cpu, &lp, &c[0].t, &qn.t);
  if (!rc) rc = k3k_l2norm(cpu, &lp, &c[1].t, &kn.t);
  k3k_kda_gate_params_t gp = {.form = p->gate_form, .head_dim = p->head_dim,
                              .lower_bound = p->lower_bound};
  if (!rc) rc = k3k_kda_gate(cpu, &gp, &s[GR].t, &s[AL].t, &s[DT].t, &g.t);
  if (!rc) rc = k3k_sigmoid(cpu, &s[BR].t, &beta.t);
  k3k_kda_params_t kp = {.n_seqs = p->n_seqs, .n_heads = p->n_heads, .read_state = 1,
                         .scale = p->scale};
  if (!rc) rc = k3k_kda_step(cpu, &kp, &qn.t, &kn.t, &c[2].t, &g.t, &beta.t, &s[SL].t, &S, &o.t);
  k3k_gated_rmsnorm_params_t np = {.head_dim = p->head_dim, .eps = p->rms_eps};
  if (!rc) rc = k3k_gated_rmsnorm(cpu, &np, &o.t, &s[Z].t, &s[ON].t, &out);
  check(rc == 0, "%s: chain rc %d", name, rc);
  for (int j = 0; j < 3; j++) tt_free(&c[j]);
  tt_free(&qn), tt_free(&kn), tt_free(&g), tt_free(&beta), tt_free(&o);
}

static void kda_case(int64_t N, int64_t NH, int64_t Dh, int64_t W, k3k_dtype_t dt,
                     k3k_dtype_t bdt, k3k_gate_form_t form, bool with_chain) {
  const int64_t P = NH * Dh, S = N + 2;
  tt_t s[18];
  memset(s, 0, sizeof s);
  for (int i = QL; i <= Z; i++)
    s[i] = tt_2d(i == BR ? bdt : dt, N, i == BR ? NH : P, i == KL && Dh != 128 ? 8 : 0),
    tt_rand(&s[i], -2, 2);
  for (int i = WQ; i <= WV; i++) s[i] = tt_2d(K3K_F32, P, W, 0), tt_rand(&s[i], -0.7, 0.7);
  int64_t csh[3] = {S, P, W - 1};
  for (int i = CQ; i <= CV; i++) {
    s[i] = tt_new(dt, 3, csh, 0), tt_rand(&s[i], -2, 2);
    s[i].out = s[i].inout = true;
  }
  s[AL] = tt_1d(K3K_F32, NH), tt_rand(&s[AL], -1, 1.5);
  s[DT] = tt_1d(K3K_F32, P), tt_rand(&s[DT], -1, 1);
  s[ON] = tt_1d(K3K_F32, Dh), tt_rand(&s[ON], 0.5, 1.5);
  s[SL] = tt_1d(K3K_I32, N);
  for (int64_t i = 0; i < N; i++) tt_seti(&s[SL], i, (int32_t)((i * 7 + 1) % S)); /* distinct */
  int64_t ssh[4] = {S, NH, Dh, Dh};
  s[ST] = tt_new(K3K_F32, 4, ssh, 0), tt_rand(&s[ST], -0.5, 0.5);
  s[ST].out = s[ST].inout = true;
  s[OUT] = tt_2d(dt, N, P, 0), s[OUT].out = true;
  const k3k_kda_decode_params_t p = {.n_seqs = (int32_t)N, .n_heads = (int32_t)NH,
                                     .head_dim = (int32_t)Dh, .gate_form = form,
                                     .lower_bound = -5.0f, .l2_eps = 1e-6f, .rms_eps = 1e-5f};
  char name[128];
  snprintf(name, sizeof name, "kda_decode N=%lld NH=%lld Dh=%lld W=%lld %s b_raw %s %s",
           (long long)N, (long long)NH, (long long)Dh, (long long)W, k3k_dtype_name(dt),
           k3k_dtype_name(bdt), form == K3K_GATE_LOWER_BOUND ? "lower-bound" : "softplus");
  void *chain[18] = {0};
  if (with_chain) kda_chain(s, &p, chain, name);
  fused_check(name, K3K_OP_KDA_DECODE, &p, s, 18, with_chain ? chain : NULL, NULL);
  for (int i = 0; i < 18; i++) {
    free(chain[i]);
    if (s[i].buf) tt_free(&s[i]);
  }
}

/* Errors: the validation of a fused op is its chain's; a bad slot id writes nothing. */
static void fused_errors(void) {
  k3k_backend_t *cpu = k3k_backend_get("cpu");
  tt_t x = tt_2d(K3K_F32, 2, 8, 0), w = tt_2d(K3K_F32, 4, 8, 0), y = tt_2d(K3K_F32, 2, 5, 0);
  k3k_gemm_multi_params_t p = {.n = 1};
  const k3k_tensor_t *t[9] = {&x.t, &w.t, NULL, NULL, NULL, &y.t, NULL, NULL, NULL};
  char err[256] = "";
  check(k3k_op_validate(K3K_OP_GEMM_MULTI, &p, t, 9, err, sizeof err) == K3_EINVAL &&
            strstr(err, "gemm_multi") && strstr(err, "gemm"),
        "gemm_multi: a bad y shape is refused naming the fused op and its GEMM (%s)", err);
  p.n = 2;
  check(k3k_run(cpu, K3K_OP_GEMM_MULTI, &p, t, 9) == K3_EINVAL, "gemm_multi: n=2, one weight");
  check(!k3k_supports(cpu, K3K_OP_GEMM_MULTI, &p, t, 9), "k3k_supports: invalid args → false");
  tt_free(&x), tt_free(&w), tt_free(&y);
  /* RES_MIX_NORM: the mix's slots come all together */
  tt_t P = tt_2d(K3K_F32, 2, 8, 0), lw = tt_1d(K3K_F32, 8), xn = tt_2d(K3K_F32, 2, 8, 0);
  int64_t ssh[3] = {1, 2, 8};
  tt_t sn = tt_new(K3K_F32, 3, ssh, 0);
  k3k_res_mix_norm_params_t rp = {.eps_mix = 1e-5f, .eps = 1e-5f};
  const k3k_tensor_t *rt[8] = {NULL, &P.t, &sn.t, &lw.t, &lw.t, NULL, &lw.t, &xn.t};
  err[0] = 0;
  check(k3k_op_validate(K3K_OP_RES_MIX_NORM, &rp, rt, 8, err, sizeof err) == K3_EINVAL &&
            strstr(err, "all present or all NULL"),
        "res_mix_norm: snaps without h refused (%s)", err);
  tt_free(&P), tt_free(&lw), tt_free(&xn), tt_free(&sn);
  /* the CPU backends' side lane and graph slots keep the meaning (k3k.h) */
  check(k3k_backend_side(cpu, K3K_SIDE_BEGIN, 0) == 0 && k3k_backend_side(cpu, K3K_SIDE_END, 0) == 0,
        "cpu: side lane requests are no-ops");
  void *gr = NULL;
  check(k3k_backend_graph(cpu, K3K_GRAPH_BEGIN, &gr) == K3_ENOTSUP, "cpu: no graphs");
}

/* KDA_DECODE with a slot outside the smallest pool: K3_ERANGE and nothing written (the slots
 * are checked against every pool before the first CONV_STEP writes). */
static void kda_bad_slot(void) {
  const int64_t N = 2, NH = 2, Dh = 8, P = NH * Dh, W = 4;
  tt_t s[18];
  memset(s, 0, sizeof s);
  for (int i = QL; i <= Z; i++) s[i] = tt_2d(K3K_F32, N, i == BR ? NH : P, 0), tt_rand(&s[i], -1, 1);
  for (int i = WQ; i <= WV; i++) s[i] = tt_2d(K3K_F32, P, W, 0), tt_rand(&s[i], -1, 1);
  int64_t csh[3] = {4, P, W - 1}, ssh[4] = {3, NH, Dh, Dh}; /* conv pools 4 slots, state 3 */
  for (int i = CQ; i <= CV; i++) s[i] = tt_new(K3K_F32, 3, csh, 0), tt_rand(&s[i], -1, 1);
  s[AL] = tt_1d(K3K_F32, NH), s[DT] = tt_1d(K3K_F32, P), s[ON] = tt_1d(K3K_F32, Dh);
  s[SL] = tt_1d(K3K_I32, N), tt_seti(&s[SL], 0, 1), tt_seti(&s[SL], 1, 3); /* 3: not a state slot */
  s[ST] = tt_new(K3K_F32, 4, ssh, 0), tt_rand(&s[ST], -1, 1);
  s[OUT] = tt_2d(K3K_F32, N, P, 0);
  void *before[18] = {0};
  for (int i = CQ; i <= CV; i++) before[i] = dup_buf(&s[i]);
  before[ST] = dup_buf(&s[ST]);
  const k3k_kda_decode_params_t p = {.n_seqs = 2, .n_heads = 2, .head_dim = 8,
                                     .lower_bound = -5.0f, .l2_eps = 1e-6f, .rms_eps = 1e-5f};
  check(run_host("cpu", K3K_OP_KDA_DECODE, &p, s, 18) == K3_ERANGE, "kda_decode: slot 3 of 3");
  bool same = true;
  for (int i = CQ; i <= ST; i++)
    if (before[i] && memcmp(before[i], s[i].buf, s[i].bytes)) same = false;
  check(same, "kda_decode: a refused slot leaves every state as it was");
  for (int i = 0; i < 18; i++) {
    free(before[i]);
    tt_free(&s[i]);
  }
}

void t_fused(void) {
  rng_seed(1919);
  for (int dt = 0; dt < 2; dt++) {
    const k3k_dtype_t D = dt ? K3K_BF16 : K3K_F32;
    res_case(3, 24, 2, true, true, D, dt, true);
    res_case(3, 24, 0, true, true, D, dt, true);
    res_case(2, 40, 1, false, true, D, 0, true);
    res_case(5, 16, 0, true, false, D, dt, true);
    res_case(1, 24, 3, false, false, D, dt, true);
    multi_case(2, 40, 3, (const int64_t[]){24, 16, 8}, D, 3, true);
    multi_case(1, 64, 4, (const int64_t[]){8, 24, 16, 40}, D, 0, true);
    multi_case(3, 32, 1, (const int64_t[]){17}, D, 0, true);
    kda_case(3, 2, 8, 4, D, D, K3K_GATE_LOWER_BOUND, true);
    kda_case(2, 3, 16, 3, D, K3K_F32, K3K_GATE_SOFTPLUS, true);
  }
  kda_case(2, 2, 128, 4, K3K_BF16, K3K_BF16, K3K_GATE_LOWER_BOUND, true); /* the device's shape */
  fused_errors();
  kda_bad_slot();
  t_fused_moe();
}

/* The real K3 shapes (spec §1.5: hidden 7168, 96 KDA heads of 128, q/k/v 12288 wide), bf16
 * activations as the runner's bf16 mode has them; on a GPU host the device backend must take
 * every one (--require-device). */
void t_fused_real(bool require_device) {
  g_require_dev = require_device;
  if (require_device) { /* a GPU host without a usable device must not pass silently */
    int dev = 0;
    for (const char *const *nm = k3k_backend_names(); *nm; nm++) {
      k3k_backend_t *be = k3k_backend_get(*nm);
      dev += be && !be->host_memory;
    }
    check(dev > 0, "--require-device: no device backend is available");
  }
  rng_seed(2026);
  res_case(1, 7168, 4, true, true, K3K_BF16, 1, false);
  res_case(64, 7168, 13, true, true, K3K_BF16, 1, false);
  res_case(8, 7168, 0, false, false, K3K_BF16, 1, false);
  multi_case(1, 7168, 3, (const int64_t[]){12288, 12288, 12288}, K3K_BF16, 0, false);
  multi_case(4, 7168, 2, (const int64_t[]){2048, 2048}, K3K_BF16, 0, false);
  kda_case(1, 96, 128, 4, K3K_BF16, K3K_BF16, K3K_GATE_LOWER_BOUND, false);
  kda_case(8, 96, 128, 4, K3K_BF16, K3K_F32, K3K_GATE_LOWER_BOUND, false);
  t_fused_moe_real();
  g_require_dev = false;
}
