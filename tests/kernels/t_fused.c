/* The fused ops (k3k.h "Fusions": RES_MIX_NORM, GEMM_MULTI, KDA_DECODE; MOE_ROUTED in
 * t_fused_moe.c) on every backend against the reference, at the tiny shapes (CI,
 * `test_kernels`) and at the real K3 shapes (GPU host, `test_kernels --real`), through
 * fused_check (op_check.c) and so the one tolerance model (tolerance.c):
 *
 *   - "cpu" is the specification: its fused op must be bit-identical to the chain of ops the
 *     fusion means, run here op by op (tiny shapes; the chain is written out independently of
 *     kernels/cpu/fused.c).
 *   - every other host backend ("cpu-fast") must be bit-identical to the reference.
 *   - a device backend: the relative Frobenius bound of the model (1e-2 BF16, 1e-4 F32, with
 *     its magnitude floor), NaN where the reference has NaN only, I32 outputs exact.
 * A device backend that refuses a shape is a skip, except with --require-device (the
 * real-shape run on the GPU: the fused kernels must take those shapes). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

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
 * every one (--require-device). RES_MIX_NORM at the widths and snapshot counts of the device's
 * one-launch kernel (each norm vector count, up to 15 snapshots), KDA_DECODE at batch 1/63/64/65
 * with both b_raw dtypes (the fused kernel's two forms). */
void t_fused_real(void) {
  rng_seed(2026);
  res_case(1, 7168, 4, true, true, K3K_BF16, 1, false);
  res_case(64, 7168, 13, true, true, K3K_BF16, 1, false);
  res_case(8, 7168, 0, false, false, K3K_BF16, 1, false);
  static const int64_t ds[] = {7168, 1000, 2048, 4096, 8192};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0] && !g_quick; i++) {
    res_case(1, ds[i], 12, true, true, K3K_BF16, 1, false);
    res_case(3, ds[i], 1, true, true, K3K_BF16, 1, false);
  }
  res_case(4, 7168, 0, true, true, K3K_BF16, 1, false); /* a mix with no snapshot: h = P */
  res_case(2, 7168, 8, false, true, K3K_BF16, 1, false);
  res_case(1, 7168, 0, true, false, K3K_BF16, 1, false); /* the 48B form: add + norm */
  res_case(2, 1000, 0, false, false, K3K_BF16, 1, false);
  res_case(1, 7168, 15, true, true, K3K_BF16, 1, false); /* the kernel's most values per row */
  multi_case(1, 7168, 3, (const int64_t[]){12288, 12288, 12288}, K3K_BF16, 0, false);
  multi_case(4, 7168, 2, (const int64_t[]){2048, 2048}, K3K_BF16, 0, false);
  static const int64_t kN[] = {1, 63, 64, 65};
  for (int i = 0; i < 4; i++) {
    if (g_quick && (i == 1 || i == 2)) continue;
    kda_case(kN[i], 96, 128, 4, K3K_BF16, K3K_BF16, K3K_GATE_LOWER_BOUND, false);
    kda_case(kN[i], 96, 128, 4, K3K_BF16, K3K_F32, K3K_GATE_LOWER_BOUND, false);
  }
  kda_case(8, 96, 128, 4, K3K_BF16, K3K_F32, K3K_GATE_LOWER_BOUND, false);
  t_fused_moe_real();
}
