/* MOE_ROUTED (k3k.h: ROUTER → k3k_moe_plan → per expert GET_ROWS, G, G, SITU/SILU_MUL, G →
 * MOE_COMBINE) on every backend against "cpu", by t_fused.c's one tolerance model: "cpu" equal
 * bit for bit to the chain written out here op by op, "cpu-fast" equal to "cpu", a device
 * within the relative Frobenius bounds (idx exact). The expert weights are separate matrices
 * whose addresses on each backend fill the PTR table slot (ft_table_t).
 *
 * Tiny shapes (CI) cover MXFP4 and dense experts, both activations, the grouped router, and
 * batches on each side of the device's 16-rows-per-expert switch; the real expert shapes (K3
 * latent 3584 x 3072, Kimi-Linear-48B 2304 x 1024; few experts, so the single-threaded
 * reference stays cheap) run under --real on the GPU host. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
  int64_t T, E, K, D, F;
  bool mx;            /* MXFP4 experts, else dense wdt */
  k3k_dtype_t xdt, wdt;
  int act;            /* 0 SITU, 1 SILU_MUL */
  int n_groups, topk_group;
} mcase_t;

enum { LG, BIAS, X, TAB, IDX, W, Y, WS, NS };

/* The expert matrices in table order: MXFP4 rows gate packed/scale, up packed/scale, down
 * packed/scale ([6][E]); dense rows gate, up, down ([3][E]). */
static tt_t *make_mats(const mcase_t *c, int *n_out) {
  const int rows = c->mx ? 6 : 3;
  const int n = rows * (int)c->E;
  tt_t *m = calloc((size_t)n, sizeof *m);
  for (int j = 0; j < 3; j++)
    for (int64_t e = 0; e < c->E; e++) {
      const int64_t N = j < 2 ? c->F : c->D, Kd = j < 2 ? c->D : c->F;
      if (c->mx) {
        tt_t *p = &m[(2 * j) * c->E + e], *sc = &m[(2 * j + 1) * c->E + e];
        *p = tt_2d(K3K_U8, N, Kd / 2, 0);
        uint8_t *pb = p->buf;
        for (int64_t i = 0; i < N * Kd / 2; i++) pb[i] = (uint8_t)rng_u32();
        *sc = tt_2d(K3K_U8, N, Kd / 32, 0);
        uint8_t *sb = sc->buf;
        for (int64_t i = 0; i < N * Kd / 32; i++) sb[i] = (uint8_t)(119 + rng_u32() % 8);
      } else {
        tt_t *w = &m[j * c->E + e];
        *w = tt_2d(c->wdt, N, Kd, 0);
        tt_rand(w, -0.4, 0.4);
      }
    }
  *n_out = n;
  return m;
}

static k3k_moe_routed_params_t params_of(const mcase_t *c) {
  k3k_moe_routed_params_t p = {
      .router = {.top_k = (int32_t)c->K, .n_groups = c->n_groups, .topk_group = c->topk_group,
                 .renormalize = 1, .use_biased_weights = 0, .scaling = 2.5f},
      .wdtype = c->mx ? K3K_U8 : c->wdt,
      .F = (int32_t)c->F,
      .act = c->act,
      .situ = {4.0f, 25.0f}};
  return p;
}

/* One expert GEMM of the chain on "cpu": y = x · W_(j,e)ᵀ. */
static int chain_gemm(const mcase_t *c, const tt_t *m, int j, int64_t e, const k3k_tensor_t *x,
                      const k3k_tensor_t *y) {
  k3k_backend_t *cpu = k3k_backend_get("cpu");
  if (c->mx)
    return k3k_mxfp4_gemm(cpu, x, &m[(2 * j) * c->E + e].t, &m[(2 * j + 1) * c->E + e].t, y);
  return k3k_gemm(cpu, x, &m[j * c->E + e].t, y);
}

/* The chain op by op (written out here, independently of kernels/cpu/fused.c). */
static void moe_chain(const mcase_t *c, const k3k_moe_routed_params_t *p, tt_t *s, const tt_t *m,
                      void **chain, const char *name) {
  k3k_backend_t *cpu = k3k_backend_get("cpu");
  const int64_t T = c->T, K = c->K, TK = T * K;
  chain[IDX] = dup_buf(&s[IDX]), chain[W] = dup_buf(&s[W]), chain[Y] = dup_buf(&s[Y]);
  k3k_tensor_t idx = view_in(&s[IDX], chain[IDX]), w = view_in(&s[W], chain[W]);
  k3k_tensor_t y = view_in(&s[Y], chain[Y]);
  int rc = k3k_router(cpu, &p->router, &s[LG].t, &s[BIAS].t, &idx, &w);
  int32_t *off = malloc((size_t)(c->E + 1) * 4);
  tt_t gt = tt_1d(K3K_I32, TK), rt = tt_2d(K3K_I32, T, K, 0);
  if (!rc) rc = k3k_moe_plan(idx.data, (int32_t)T, (int32_t)K, (int32_t)c->E, off, gt.buf, rt.buf);
  tt_t xg = tt_2d(c->xdt, TK, c->D, 0), g = tt_2d(c->xdt, TK, c->F, 0), u = tt_2d(c->xdt, TK, c->F, 0);
  tt_t a = tt_2d(c->xdt, TK, c->F, 0), r = tt_2d(c->xdt, TK, c->D, 0);
  if (!rc) rc = k3k_get_rows(cpu, &s[X].t, &gt.t, &xg.t);
  for (int64_t e = 0; e < c->E && !rc; e++) {
    const int64_t b = off[e], n = off[e + 1] - off[e];
    if (!n) continue;
    k3k_tensor_t xe = k3k_tensor_slice(&xg.t, 0, b, n), ge = k3k_tensor_slice(&g.t, 0, b, n);
    k3k_tensor_t ue = k3k_tensor_slice(&u.t, 0, b, n), ae = k3k_tensor_slice(&a.t, 0, b, n);
    k3k_tensor_t re = k3k_tensor_slice(&r.t, 0, b, n);
    rc = chain_gemm(c, m, 0, e, &xe, &ge);
    if (!rc) rc = chain_gemm(c, m, 1, e, &xe, &ue);
    if (!rc) rc = c->act ? k3k_silu_mul(cpu, &ge, &ue, &ae) : k3k_situ(cpu, &p->situ, &ge, &ue, &ae);
    if (!rc) rc = chain_gemm(c, m, 2, e, &ae, &re);
  }
  if (!rc) rc = k3k_moe_combine(cpu, &r.t, &rt.t, &w, &y);
  check(rc == 0, "%s: chain rc %d", name, rc);
  free(off);
  tt_free(&gt), tt_free(&rt), tt_free(&xg), tt_free(&g), tt_free(&u), tt_free(&a), tt_free(&r);
}

static void moe_case(const mcase_t *c, bool with_chain) {
  tt_t s[NS];
  memset(s, 0, sizeof s);
  s[LG] = tt_2d(K3K_F32, c->T, c->E, 0), tt_rand(&s[LG], -3, 3);
  s[BIAS] = tt_1d(K3K_F32, c->E), tt_rand(&s[BIAS], -0.5, 0.5);
  s[X] = tt_2d(c->xdt, c->T, c->D, 0), tt_rand(&s[X], -1, 1);
  s[TAB] = tt_2d(K3K_PTR, c->mx ? 6 : 3, c->E, 0);
  s[IDX] = tt_2d(K3K_I32, c->T, c->K, 0), s[IDX].out = true;
  s[W] = tt_2d(K3K_F32, c->T, c->K, 0), s[W].out = true;
  s[Y] = tt_2d(c->xdt, c->T, c->D, 0), s[Y].out = true;
  int nm = 0;
  tt_t *m = make_mats(c, &nm);
  const k3k_moe_routed_params_t p = params_of(c);
  char name[160];
  snprintf(name, sizeof name, "moe_routed T=%lld E=%lld k=%lld D=%lld F=%lld %s x %s %s groups %d/%d",
           (long long)c->T, (long long)c->E, (long long)c->K, (long long)c->D, (long long)c->F,
           c->mx ? "mxfp4" : k3k_dtype_name(c->wdt), k3k_dtype_name(c->xdt),
           c->act ? "silu_mul" : "situ", c->topk_group, c->n_groups);
  void *chain[NS] = {0};
  if (with_chain) moe_chain(c, &p, s, m, chain, name);
  const ft_table_t tab = {.slot = TAB, .n = nm, .mats = m};
  fused_check(name, K3K_OP_MOE_ROUTED, &p, s, NS, with_chain ? chain : NULL, &tab);
  for (int i = 0; i < NS; i++) {
    free(chain[i]);
    if (s[i].buf) tt_free(&s[i]);
  }
  for (int i = 0; i < nm; i++) tt_free(&m[i]);
  free(m);
}

/* Validation names the field; a 0xFF scale of an active expert is refused by the reference. */
static void moe_errors(void) {
  const mcase_t c = {.T = 2, .E = 4, .K = 2, .D = 64, .F = 32, .mx = true, .xdt = K3K_F32,
                     .n_groups = 1, .topk_group = 1};
  tt_t s[NS];
  memset(s, 0, sizeof s);
  s[LG] = tt_2d(K3K_F32, c.T, c.E, 0), tt_rand(&s[LG], -1, 1);
  s[BIAS] = tt_1d(K3K_F32, c.E);
  s[X] = tt_2d(c.xdt, c.T, c.D, 0), tt_rand(&s[X], -1, 1);
  s[TAB] = tt_2d(K3K_PTR, 6, c.E, 0);
  s[IDX] = tt_2d(K3K_I32, c.T, c.K, 0);
  s[W] = tt_2d(K3K_F32, c.T, c.K, 0);
  s[Y] = tt_2d(c.xdt, c.T, c.D, 0);
  int nm = 0;
  tt_t *m = make_mats(&c, &nm);
  void **addr = s[TAB].buf; /* host addresses: the CPU backends' memory */
  for (int i = 0; i < nm; i++) addr[i] = m[i].buf;
  k3k_moe_routed_params_t p = params_of(&c);
  const k3k_tensor_t *t[NS] = {&s[LG].t, &s[BIAS].t, &s[X].t, &s[TAB].t, &s[IDX].t, &s[W].t, &s[Y].t, NULL};
  char err[256] = "";
  k3k_backend_t *cpu = k3k_backend_get("cpu");
  check(k3k_run(cpu, K3K_OP_MOE_ROUTED, &p, t, NS) == 0, "moe_routed: host table runs");
  p.wdtype = K3K_BF16; /* dense weights want a [3,E] table */
  check(k3k_op_validate(K3K_OP_MOE_ROUTED, &p, t, NS, err, sizeof err) == K3_EINVAL &&
            strstr(err, "moe_routed") && strstr(err, "t[3] experts"),
        "moe_routed: a [6,E] table with dense wdtype is refused naming t[3] (%s)", err);
  p = params_of(&c);
  p.x_mark = 3;
  err[0] = 0;
  check(k3k_op_validate(K3K_OP_MOE_ROUTED, &p, t, NS, err, sizeof err) == K3_EINVAL &&
            strstr(err, "params.x_mark"),
        "moe_routed: x_mark 3 refused (%s)", err);
  p = params_of(&c);
  p.F = 48;
  err[0] = 0;
  check(k3k_op_validate(K3K_OP_MOE_ROUTED, &p, t, NS, err, sizeof err) == K3_EINVAL &&
            strstr(err, "multiples of 32"),
        "moe_routed: MXFP4 F=48 refused (%s)", err);
  p = params_of(&c);
  p.router.top_k = 5;
  err[0] = 0;
  check(k3k_op_validate(K3K_OP_MOE_ROUTED, &p, t, NS, err, sizeof err) == K3_EINVAL &&
            strstr(err, "in its router"),
        "moe_routed: top_k 5 of 4 experts refused by the router's check (%s)", err);
  /* a 0xFF scale in every expert's gate: whatever the router picks, the reference refuses */
  p = params_of(&c);
  for (int64_t e = 0; e < c.E; e++) ((uint8_t *)m[1 * c.E + e].buf)[0] = 0xFF;
  check(k3k_run(cpu, K3K_OP_MOE_ROUTED, &p, t, NS) == K3_EINVAL,
        "moe_routed: a 0xFF expert scale is K3_EINVAL on the reference");
  for (int i = 0; i < NS; i++)
    if (s[i].buf) tt_free(&s[i]);
  for (int i = 0; i < nm; i++) tt_free(&m[i]);
  free(m);
}

void t_fused_moe(void) {
  rng_seed(4242);
  const mcase_t cs[] = {
      /* MXFP4, SiTU, f32 and bf16 activations, plain and grouped router */
      {.T = 3, .E = 8, .K = 2, .D = 64, .F = 32, .mx = true, .xdt = K3K_F32, .n_groups = 1, .topk_group = 1},
      {.T = 5, .E = 8, .K = 3, .D = 128, .F = 64, .mx = true, .xdt = K3K_BF16, .n_groups = 2, .topk_group = 1},
      {.T = 1, .E = 16, .K = 4, .D = 128, .F = 128, .mx = true, .xdt = K3K_BF16, .n_groups = 1, .topk_group = 1},
      /* > 16 rows per expert: the device's prefill tiling */
      {.T = 40, .E = 4, .K = 2, .D = 128, .F = 128, .mx = true, .xdt = K3K_BF16, .n_groups = 1, .topk_group = 1},
      /* dense experts: bf16 SiLU-gated (the 48B), f32 SiTU */
      {.T = 4, .E = 6, .K = 2, .D = 32, .F = 24, .xdt = K3K_BF16, .wdt = K3K_BF16, .act = 1, .n_groups = 1, .topk_group = 1},
      {.T = 40, .E = 4, .K = 2, .D = 64, .F = 64, .xdt = K3K_BF16, .wdt = K3K_BF16, .act = 1, .n_groups = 1, .topk_group = 1},
      {.T = 2, .E = 4, .K = 2, .D = 16, .F = 8, .xdt = K3K_F32, .wdt = K3K_F32, .n_groups = 1, .topk_group = 1},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) moe_case(&cs[i], true);
  moe_errors();
}

void t_fused_moe_real(void) {
  rng_seed(2027);
  const mcase_t cs[] = {
      /* K3's latent experts (3584 -> 3072, MXFP4, SiTU): decode batch 1 and 8 */
      {.T = 1, .E = 16, .K = 8, .D = 3584, .F = 3072, .mx = true, .xdt = K3K_BF16, .n_groups = 1, .topk_group = 1},
      {.T = 8, .E = 16, .K = 8, .D = 3584, .F = 3072, .mx = true, .xdt = K3K_BF16, .n_groups = 1, .topk_group = 1},
      /* Kimi-Linear-48B's bf16 experts (2304 -> 1024, SiLU): batch 1, and 32 rows per expert
       * (the device's batched pointer-array path) */
      {.T = 1, .E = 16, .K = 8, .D = 2304, .F = 1024, .xdt = K3K_BF16, .wdt = K3K_BF16, .act = 1, .n_groups = 1, .topk_group = 1},
      {.T = 64, .E = 16, .K = 8, .D = 2304, .F = 1024, .xdt = K3K_BF16, .wdt = K3K_BF16, .act = 1, .n_groups = 1, .topk_group = 1},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) moe_case(&cs[i], false);
}
