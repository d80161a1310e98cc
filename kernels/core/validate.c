/* k3k_op_validate(): the one place where every op's tensor count, dtypes, ranks, shapes and
 * params are checked, so all backends receive well-formed calls. Contents of metadata tensors
 * (indices, lengths) live in backend memory and are checked by the backend before any write.
 * Messages name the op, the slot and the field: "rmsnorm: t[1] w: shape[0]=7 != 8". */
#include <stdarg.h>
#include <stdio.h>

#include "core/k3k_internal.h"

#define F32_BF16 ((1u << K3K_F32) | (1u << K3K_BF16))
#define M_F32 (1u << K3K_F32)
#define M_I32 (1u << K3K_I32)
#define M_U8 (1u << K3K_U8)

typedef struct {
  const char *op;
  char *err;
  size_t cap;
} vctx_t;

static int fail(vctx_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(vctx_t *v, const char *fmt, ...) {
  if (v->err && v->cap) {
    int n = snprintf(v->err, v->cap, "%s: ", v->op);
    if (n >= 0 && (size_t)n < v->cap) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(v->err + n, v->cap - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return K3_EINVAL;
}

/* Slot i: present, dtype in mask, rank nd, innermost stride 1 unless any_stride, non-negative
 * strides and shapes. */
static int slot(vctx_t *v, const k3k_tensor_t *const *t, int i, const char *nm, unsigned mask,
                int nd, bool any_stride) {
  const k3k_tensor_t *x = t[i];
  if (!x) return fail(v, "t[%d] %s: missing", i, nm);
  if (x->dtype > K3K_PTR || !(mask & (1u << x->dtype)))
    return fail(v, "t[%d] %s: dtype %s not accepted", i, nm, k3k_dtype_name(x->dtype));
  if (x->ndim != nd) return fail(v, "t[%d] %s: ndim %d, want %d", i, nm, x->ndim, nd);
  for (int d = 0; d < nd; d++) {
    if (x->shape[d] < 0) return fail(v, "t[%d] %s: shape[%d]=%lld < 0", i, nm, d, (long long)x->shape[d]);
    if (x->stride[d] < 0) return fail(v, "t[%d] %s: stride[%d] < 0", i, nm, d);
  }
  if (!any_stride && x->shape[nd - 1] > 1 && x->stride[nd - 1] != 1)
    return fail(v, "t[%d] %s: innermost stride %lld, want 1", i, nm, (long long)x->stride[nd - 1]);
  if (!x->data && k3k_tensor_numel(x) > 0) return fail(v, "t[%d] %s: NULL data", i, nm);
  return 0;
}

static int dim_eq(vctx_t *v, const k3k_tensor_t *const *t, int i, const char *nm, int d,
                  int64_t want) {
  if (t[i]->shape[d] != want)
    return fail(v, "t[%d] %s: shape[%d]=%lld, want %lld", i, nm, d, (long long)t[i]->shape[d],
                (long long)want);
  return 0;
}

#define S(i, nm, mask, nd) \
  do { if ((rc = slot(&v, t, i, nm, mask, nd, false))) return rc; } while (0)
#define SA(i, nm, mask, nd) \
  do { if ((rc = slot(&v, t, i, nm, mask, nd, true))) return rc; } while (0)
#define D(i, nm, d, want) \
  do { if ((rc = dim_eq(&v, t, i, nm, d, want))) return rc; } while (0)
#define NEED(cond, ...) \
  do { if (!(cond)) return fail(&v, __VA_ARGS__); } while (0)

/* Tensor counts and names, from the op list (k3k_ops.def). */
static const int k_nargs[K3K_OP_COUNT] = {
#define K3K_OP_X(ENUM, name, n_tensors) [K3K_OP_##ENUM] = n_tensors,
#include "k3k_ops.def"
#undef K3K_OP_X
};

static const char *k_names[K3K_OP_COUNT] = {
#define K3K_OP_X(ENUM, name, n_tensors) [K3K_OP_##ENUM] = #name,
#include "k3k_ops.def"
#undef K3K_OP_X
};

int k3k_op_nargs(k3k_op_t op) { return (op >= 0 && op < K3K_OP_COUNT) ? k_nargs[op] : 0; }

const char *k3k_op_name(k3k_op_t op) {
  return (op >= 0 && op < K3K_OP_COUNT) ? k_names[op] : "unknown-op";
}

/* Three same-shaped [R,C] slots (elementwise ops). */
static int ew3(vctx_t *v, const k3k_tensor_t *const *t, const char *a, const char *b,
               const char *y) {
  int rc;
  if ((rc = slot(v, t, 0, a, F32_BF16, 2, false)) || (rc = slot(v, t, 1, b, F32_BF16, 2, false)) ||
      (rc = slot(v, t, 2, y, F32_BF16, 2, false)))
    return rc;
  for (int i = 1; i < 3; i++)
    for (int d = 0; d < 2; d++)
      if ((rc = dim_eq(v, t, i, i == 1 ? b : y, d, t[0]->shape[d]))) return rc;
  return 0;
}

static int heads_ok(vctx_t *v, int64_t c, int32_t hd) {
  if (hd <= 0) return fail(v, "params.head_dim=%d must be > 0", hd);
  if (c % hd) return fail(v, "channels %lld not a multiple of head_dim %d", (long long)c, hd);
  return 0;
}

/* A fused op is valid when every op of the chain it means is (k3k.h "Fusions"): the component
 * checks are the component ops' own, so the two cannot drift apart. */
static int sub(vctx_t *v, k3k_op_t op, const void *params, const k3k_tensor_t *const *t, int nt) {
  char e[200];
  e[0] = 0;
  int rc = k3k_op_validate(op, params, t, nt, e, sizeof e);
  return rc ? fail(v, "in its %s", e) : 0;
}

/* A stand-in for an intermediate of a chain: shape [n0,n1] (ndim 2) or [n0] (n1 < 0), dtype dt,
 * only validated, never read or written (data is any non-NULL pointer). */
static k3k_tensor_t tmp_t(const k3k_tensor_t *like, k3k_dtype_t dt, int64_t n0, int64_t n1) {
  k3k_tensor_t x = n1 < 0 ? k3k_tensor_1d(like->backend, dt, like->data, n0)
                          : k3k_tensor_2d(like->backend, dt, like->data, n0, n1);
  if (!x.data) x.data = (void *)like; /* numel 0 views may have NULL data */
  return x;
}

static int v_res_mix_norm(vctx_t *v, const void *params, const k3k_tensor_t *const *t) {
  const k3k_res_mix_norm_params_t *p = params;
  int rc;
  if (!p) return fail(v, "params missing");
  if (!t[1] || !t[6] || !t[7]) return fail(v, "t[1] P, t[6] lnw and t[7] xn are required");
  const bool mix = t[2] != NULL;
  if ((t[3] != NULL) != mix || (t[4] != NULL) != mix || (t[5] != NULL) != mix)
    return fail(v, "t[2..5] (snaps, w_norm, w_proj, h): all present or all NULL");
  if (t[0]) {
    const k3k_tensor_t *a[3] = {t[1], t[0], t[1]};
    if ((rc = sub(v, K3K_OP_ADD, NULL, a, 3))) return rc;
  }
  if (mix) {
    const k3k_attn_res_params_t mp = {.eps = p->eps_mix};
    const k3k_tensor_t *m[5] = {t[2], t[1], t[3], t[4], t[5]};
    if ((rc = sub(v, K3K_OP_ATTN_RES_MIX, &mp, m, 5))) return rc;
  }
  const k3k_rmsnorm_params_t np = {.eps = p->eps, .bf16_inner = p->bf16_inner};
  const k3k_tensor_t *n[3] = {mix ? t[5] : t[1], t[6], t[7]};
  return sub(v, K3K_OP_RMSNORM, &np, n, 3);
}

static int v_gemm_multi(vctx_t *v, const void *params, const k3k_tensor_t *const *t) {
  const k3k_gemm_multi_params_t *p = params;
  int rc;
  if (!p) return fail(v, "params missing");
  if (p->n < 1 || p->n > K3K_GEMM_MULTI_MAX)
    return fail(v, "params.n=%d, want 1..%d", p->n, K3K_GEMM_MULTI_MAX);
  for (int j = 0; j < K3K_GEMM_MULTI_MAX; j++) {
    const bool used = j < p->n;
    if ((t[1 + j] != NULL) != used || (t[5 + j] != NULL) != used)
      return fail(v, "t[%d] W_%d / t[%d] y_%d: %s", 1 + j, j, 5 + j, j,
                  used ? "missing" : "must be NULL past params.n");
    if (!used) continue;
    const k3k_tensor_t *g[3] = {t[0], t[1 + j], t[5 + j]};
    if ((rc = sub(v, K3K_OP_GEMM, NULL, g, 3))) return rc;
  }
  return 0;
}

/* MOE_ROUTED: the chain's checks on stand-ins for its intermediates and one expert's weights
 * (every table entry has the same shape; the entries themselves are trusted pointers). */
static int v_moe_routed(vctx_t *v, const void *params, const k3k_tensor_t *const *t) {
  const k3k_moe_routed_params_t *p = params;
  int rc;
  if (!p) return fail(v, "params missing");
  for (int i = 0; i < 7; i++)
    if (!t[i]) return fail(v, "t[%d]: missing", i);
  if (p->act != 0 && p->act != 1) return fail(v, "params.act=%d, want 0 (SITU) or 1 (SILU_MUL)", p->act);
  if (p->x_mark < 0 || p->x_mark > 2) return fail(v, "params.x_mark=%d, want 0..2", p->x_mark);
  const bool mx = p->wdtype == K3K_U8;
  if (!mx && p->wdtype != K3K_F32 && p->wdtype != K3K_BF16)
    return fail(v, "params.wdtype %s, want u8 (MXFP4), f32 or bf16", k3k_dtype_name(p->wdtype));
  const k3k_tensor_t *r4[4] = {t[0], t[1], t[4], t[5]};
  if ((rc = sub(v, K3K_OP_ROUTER, &p->router, r4, 4))) return rc;
  if ((rc = slot(v, t, 2, "x", F32_BF16, 2, false)) ||
      (rc = slot(v, t, 3, "experts", 1u << K3K_PTR, 2, false)) ||
      (rc = slot(v, t, 6, "y", F32_BF16, 2, false)))
    return rc;
  const int64_t T = t[0]->shape[0], E = t[0]->shape[1], K = p->router.top_k;
  const int64_t D = t[2]->shape[1], F = p->F, TK = T * K;
  if ((rc = dim_eq(v, t, 2, "x", 0, T))) return rc;
  if ((rc = dim_eq(v, t, 3, "experts", 0, mx ? 6 : 3)) || (rc = dim_eq(v, t, 3, "experts", 1, E)))
    return rc;
  if (t[3]->shape[1] > 1 && t[3]->stride[0] != E)
    return fail(v, "t[3] experts: stride[0]=%lld, want %lld (contiguous)", (long long)t[3]->stride[0],
                (long long)E);
  if (t[6]->dtype != t[2]->dtype) return fail(v, "t[6] y: dtype %s != x's %s",
                                              k3k_dtype_name(t[6]->dtype), k3k_dtype_name(t[2]->dtype));
  if (F <= 0) return fail(v, "params.F=%d must be > 0", p->F);
  if (mx && (D % 32 || F % 32))
    return fail(v, "MXFP4 experts need D=%lld and params.F=%d multiples of 32", (long long)D, p->F);
  if (t[7] && (rc = slot(v, t, 7, "ws", M_U8, 1, false))) return rc;
  const k3k_dtype_t A = t[2]->dtype;
  const k3k_tensor_t *x = t[2];
  k3k_tensor_t gt = tmp_t(x, K3K_I32, TK, -1), ri = tmp_t(x, K3K_I32, T, K);
  k3k_tensor_t xg = tmp_t(x, A, TK, D), g = tmp_t(x, A, TK, F), u = tmp_t(x, A, TK, F);
  k3k_tensor_t a = tmp_t(x, A, TK, F), r = tmp_t(x, A, TK, D);
  const k3k_tensor_t *gr[3] = {x, &gt, &xg};
  if ((rc = sub(v, K3K_OP_GET_ROWS, NULL, gr, 3))) return rc;
  if (mx) {
    k3k_tensor_t wp = tmp_t(x, K3K_U8, F, D / 2), ws = tmp_t(x, K3K_U8, F, D / 32);
    k3k_tensor_t dp = tmp_t(x, K3K_U8, D, F / 2), ds = tmp_t(x, K3K_U8, D, F / 32);
    const k3k_tensor_t *m1[4] = {&xg, &wp, &ws, &g}, *m2[4] = {&a, &dp, &ds, &r};
    if ((rc = sub(v, K3K_OP_MXFP4_GEMM, NULL, m1, 4)) || (rc = sub(v, K3K_OP_MXFP4_GEMM, NULL, m2, 4)))
      return rc;
  } else {
    k3k_tensor_t wg = tmp_t(x, p->wdtype, F, D), wd = tmp_t(x, p->wdtype, D, F);
    const k3k_tensor_t *m1[3] = {&xg, &wg, &g}, *m2[3] = {&a, &wd, &r};
    if ((rc = sub(v, K3K_OP_GEMM, NULL, m1, 3)) || (rc = sub(v, K3K_OP_GEMM, NULL, m2, 3))) return rc;
  }
  const k3k_tensor_t *ac[3] = {&g, &u, &a};
  if ((rc = sub(v, p->act ? K3K_OP_SILU_MUL : K3K_OP_SITU, p->act ? NULL : &p->situ, ac, 3))) return rc;
  const k3k_tensor_t *cb[4] = {&r, &ri, t[5], t[6]};
  return sub(v, K3K_OP_MOE_COMBINE, NULL, cb, 4);
}

static int v_kda_decode(vctx_t *v, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_decode_params_t *p = params;
  int rc;
  if (!p) return fail(v, "params missing");
  for (int i = 0; i < 18; i++)
    if (!t[i]) return fail(v, "t[%d]: missing", i);
  const k3k_tensor_t *out = t[17];
  if (out->ndim != 2) return fail(v, "t[17] out: ndim %d, want 2", out->ndim);
  const int64_t N = p->n_seqs, P = out->shape[1];
  if (p->n_heads <= 0 || p->head_dim <= 0 || P != (int64_t)p->n_heads * p->head_dim)
    return fail(v, "t[17] out: %lld channels != params.n_heads %d x head_dim %d", (long long)P,
                p->n_heads, p->head_dim);
  if (out->shape[0] != N) return fail(v, "t[17] out: %lld rows != params.n_seqs %d",
                                      (long long)out->shape[0], p->n_seqs);
  const k3k_dtype_t D = out->dtype;
  k3k_tensor_t c[3], qn = tmp_t(out, K3K_F32, N, P), kn = tmp_t(out, K3K_F32, N, P);
  k3k_tensor_t g = tmp_t(out, K3K_F32, N, P), beta = tmp_t(out, K3K_F32, N, p->n_heads);
  k3k_tensor_t o = tmp_t(out, D, N, P);
  const k3k_conv_params_t cp = {.n_seqs = p->n_seqs, .read_state = 1, .activation = 1};
  for (int j = 0; j < 3; j++) {
    c[j] = tmp_t(out, D, N, P);
    const k3k_tensor_t *a[5] = {t[j], t[6 + j], t[15], t[9 + j], &c[j]};
    if ((rc = sub(v, K3K_OP_CONV_STEP, &cp, a, 5))) return rc;
  }
  const k3k_l2norm_params_t lp = {.head_dim = p->head_dim, .eps = p->l2_eps, .scale = 1.0f};
  const k3k_tensor_t *lq[2] = {&c[0], &qn}, *lk[2] = {&c[1], &kn};
  if ((rc = sub(v, K3K_OP_L2NORM, &lp, lq, 2)) || (rc = sub(v, K3K_OP_L2NORM, &lp, lk, 2)))
    return rc;
  const k3k_kda_gate_params_t gp = {.form = p->gate_form, .head_dim = p->head_dim,
                                    .lower_bound = p->lower_bound};
  const k3k_tensor_t *ga[4] = {t[3], t[12], t[13], &g}, *sb[2] = {t[4], &beta};
  if ((rc = sub(v, K3K_OP_KDA_GATE, &gp, ga, 4)) || (rc = sub(v, K3K_OP_SIGMOID, NULL, sb, 2)))
    return rc;
  const k3k_kda_params_t kp = {.n_seqs = p->n_seqs, .n_heads = p->n_heads, .read_state = 1,
                               .scale = p->scale};
  const k3k_tensor_t *ks[8] = {&qn, &kn, &c[2], &g, &beta, t[15], t[16], &o};
  if ((rc = sub(v, K3K_OP_KDA_STEP, &kp, ks, 8))) return rc;
  if (t[16]->shape[2] != p->head_dim || t[16]->shape[3] != p->head_dim)
    return fail(v, "t[16] state: head dims %lldx%lld, want Dv = Dk = %d",
                (long long)t[16]->shape[2], (long long)t[16]->shape[3], p->head_dim);
  const k3k_gated_rmsnorm_params_t np = {.head_dim = p->head_dim, .eps = p->rms_eps};
  const k3k_tensor_t *gn[4] = {&o, t[5], t[14], out};
  return sub(v, K3K_OP_GATED_RMSNORM, &np, gn, 4);
}

int k3k_op_validate(k3k_op_t op, const void *params, const k3k_tensor_t *const *t, int nt,
                    char *err, size_t errcap) {
  vctx_t v = {.op = k3k_op_name(op), .err = err, .cap = errcap};
  int rc;
  if (op < 0 || op >= K3K_OP_COUNT) return fail(&v, "unknown op %d", (int)op);
  if (!t || nt != k_nargs[op]) return fail(&v, "%d tensors, want %d", nt, k_nargs[op]);
  switch (op) {
    case K3K_OP_COPY: {
      const unsigned all = F32_BF16 | M_I32 | M_U8;
      NEED(t[0] && t[1] && t[0]->ndim >= 1 && t[0]->ndim <= K3K_MAX_DIMS, "t[0] x: bad rank");
      SA(0, "x", all, t[0]->ndim);
      SA(1, "y", all, t[0]->ndim);
      for (int d = 0; d < t[0]->ndim; d++) D(1, "y", d, t[0]->shape[d]);
      bool fx = (1u << t[0]->dtype) & F32_BF16, fy = (1u << t[1]->dtype) & F32_BF16;
      NEED((fx && fy) || t[0]->dtype == t[1]->dtype, "dtypes %s -> %s not convertible",
           k3k_dtype_name(t[0]->dtype), k3k_dtype_name(t[1]->dtype));
      return 0;
    }
    case K3K_OP_ADD: return ew3(&v, t, "a", "b", "y");
    case K3K_OP_SIGMOID_MUL:
      NEED(params, "params missing");
      return ew3(&v, t, "x", "g", "y");
    case K3K_OP_SITU:
      NEED(params, "params missing");
      NEED(((const k3k_situ_params_t *)params)->beta > 0 &&
               ((const k3k_situ_params_t *)params)->beta_lin > 0,
           "params.beta/beta_lin must be > 0");
      return ew3(&v, t, "gate", "up", "y");
    case K3K_OP_SILU_MUL: return ew3(&v, t, "gate", "up", "y");
    case K3K_OP_SIGMOID:
      S(0, "x", F32_BF16, 2);
      S(1, "y", F32_BF16, 2);
      D(1, "y", 0, t[0]->shape[0]);
      D(1, "y", 1, t[0]->shape[1]);
      return 0;
    case K3K_OP_GET_ROWS:
      S(0, "table", F32_BF16, 2);
      S(1, "ids", M_I32, 1);
      S(2, "y", F32_BF16, 2);
      D(2, "y", 0, t[1]->shape[0]);
      D(2, "y", 1, t[0]->shape[1]);
      return 0;
    case K3K_OP_RMSNORM: {
      NEED(params, "params missing");
      const k3k_rmsnorm_params_t *p = params;
      NEED(p->eps >= 0, "params.eps < 0");
      S(0, "x", F32_BF16, 2);
      S(1, "w", F32_BF16, 1);
      S(2, "y", F32_BF16, 2);
      D(1, "w", 0, t[0]->shape[1]);
      D(2, "y", 0, t[0]->shape[0]);
      D(2, "y", 1, t[0]->shape[1]);
      return 0;
    }
    case K3K_OP_GATED_RMSNORM: {
      NEED(params, "params missing");
      const k3k_gated_rmsnorm_params_t *p = params;
      S(0, "x", F32_BF16, 2);
      S(1, "z", F32_BF16, 2);
      S(2, "w", F32_BF16, 1);
      S(3, "y", F32_BF16, 2);
      if ((rc = heads_ok(&v, t[0]->shape[1], p->head_dim))) return rc;
      D(1, "z", 0, t[0]->shape[0]);
      D(1, "z", 1, t[0]->shape[1]);
      D(2, "w", 0, p->head_dim);
      D(3, "y", 0, t[0]->shape[0]);
      D(3, "y", 1, t[0]->shape[1]);
      return 0;
    }
    case K3K_OP_GEMM:
      SA(0, "x", F32_BF16, 2);
      SA(1, "W", F32_BF16, 2);
      SA(2, "y", F32_BF16, 2);
      D(1, "W", 1, t[0]->shape[1]);
      D(2, "y", 0, t[0]->shape[0]);
      D(2, "y", 1, t[1]->shape[0]);
      return 0;
    case K3K_OP_MXFP4_GEMM:
    case K3K_OP_MXFP4_DEQUANT: {
      int o = op == K3K_OP_MXFP4_GEMM ? 1 : 0;
      if (o) SA(0, "x", F32_BF16, 2);
      S(o, "packed", M_U8, 2);
      S(o + 1, "scale", M_U8, 2);
      SA(o + 2, o ? "y" : "W", F32_BF16, 2);
      int64_t N = t[o]->shape[0], K = 2 * t[o]->shape[1];
      NEED(K % 32 == 0, "t[%d] packed: K=%lld not a multiple of 32", o, (long long)K);
      D(o + 1, "scale", 0, N);
      D(o + 1, "scale", 1, K / 32);
      if (o) {
        D(0, "x", 1, K);
        D(3, "y", 0, t[0]->shape[0]);
        D(3, "y", 1, N);
      } else {
        D(2, "W", 0, N);
        D(2, "W", 1, K);
      }
      return 0;
    }
    case K3K_OP_CONV_PREFILL:
    case K3K_OP_CONV_STEP: {
      NEED(params, "params missing");
      const k3k_conv_params_t *p = params;
      bool pre = op == K3K_OP_CONV_PREFILL;
      int is = pre ? 3 : 2, ist = pre ? 4 : 3, iy = pre ? 5 : 4;
      S(0, "x", F32_BF16, 2);
      S(1, "w", F32_BF16, 2);
      S(ist, "state", F32_BF16, 3);
      S(iy, "y", F32_BF16, 2);
      S(is, "slots", M_I32, 1);
      int64_t C = t[0]->shape[1], W = t[1]->shape[1];
      NEED(p->n_seqs >= 0, "params.n_seqs < 0");
      NEED(W >= 2, "t[1] w: kernel width %lld < 2", (long long)W);
      D(1, "w", 0, C);
      D(ist, "state", 1, C);
      D(ist, "state", 2, W - 1);
      D(iy, "y", 0, t[0]->shape[0]);
      D(iy, "y", 1, C);
      D(is, "slots", 0, p->n_seqs);
      if (pre) {
        S(2, "cu_seqlens", M_I32, 1);
        D(2, "cu_seqlens", 0, (int64_t)p->n_seqs + 1);
      } else {
        D(0, "x", 0, p->n_seqs);
      }
      return 0;
    }
    case K3K_OP_L2NORM: {
      NEED(params, "params missing");
      const k3k_l2norm_params_t *p = params;
      S(0, "x", F32_BF16, 2);
      S(1, "y", F32_BF16, 2);
      if ((rc = heads_ok(&v, t[0]->shape[1], p->head_dim))) return rc;
      D(1, "y", 0, t[0]->shape[0]);
      D(1, "y", 1, t[0]->shape[1]);
      return 0;
    }
    case K3K_OP_KDA_GATE: {
      NEED(params, "params missing");
      const k3k_kda_gate_params_t *p = params;
      NEED(p->form == K3K_GATE_LOWER_BOUND || p->form == K3K_GATE_SOFTPLUS, "params.form %d unknown",
           (int)p->form);
      S(0, "g_raw", F32_BF16, 2);
      S(1, "A_log", M_F32, 1);
      S(2, "dt_bias", F32_BF16, 1);
      S(3, "g", M_F32, 2);
      if ((rc = heads_ok(&v, t[0]->shape[1], p->head_dim))) return rc;
      NEED(t[1]->shape[0] >= t[0]->shape[1] / p->head_dim, "t[1] A_log: %lld entries < %lld heads",
           (long long)t[1]->shape[0], (long long)(t[0]->shape[1] / p->head_dim));
      D(2, "dt_bias", 0, t[0]->shape[1]);
      D(3, "g", 0, t[0]->shape[0]);
      D(3, "g", 1, t[0]->shape[1]);
      return 0;
    }
    case K3K_OP_KDA_CHUNK:
    case K3K_OP_KDA_STEP: {
      NEED(params, "params missing");
      const k3k_kda_params_t *p = params;
      bool ch = op == K3K_OP_KDA_CHUNK;
      int is = ch ? 6 : 5, ist = ch ? 7 : 6, io = ch ? 8 : 7;
      NEED(p->n_heads > 0, "params.n_heads must be > 0");
      NEED(p->n_seqs >= 0, "params.n_seqs < 0");
      NEED(p->chunk >= 0 && p->chunk <= 1024, "params.chunk %d out of [0,1024]", p->chunk);
      S(0, "q", F32_BF16, 2);
      S(1, "k", F32_BF16, 2);
      S(2, "v", F32_BF16, 2);
      S(3, "g", M_F32, 2);
      S(4, "beta", M_F32, 2);
      S(is, "slots", M_I32, 1);
      S(ist, "state", M_F32, 4);
      S(io, "o", F32_BF16, 2);
      int64_t T = t[0]->shape[0], H = p->n_heads;
      NEED(t[0]->shape[1] % H == 0, "t[0] q: %lld channels not divisible by %lld heads",
           (long long)t[0]->shape[1], (long long)H);
      NEED(t[2]->shape[1] % H == 0, "t[2] v: %lld channels not divisible by %lld heads",
           (long long)t[2]->shape[1], (long long)H);
      int64_t Dk = t[0]->shape[1] / H, Dv = t[2]->shape[1] / H;
      for (int i = 1; i < 5; i++) D(i, i == 1 ? "k" : i == 2 ? "v" : i == 3 ? "g" : "beta", 0, T);
      D(1, "k", 1, H * Dk);
      D(3, "g", 1, H * Dk);
      D(4, "beta", 1, H);
      D(is, "slots", 0, p->n_seqs);
      D(ist, "state", 1, H);
      D(ist, "state", 2, Dv);
      D(ist, "state", 3, Dk);
      NEED(k3k_tensor_is_contiguous(t[ist]), "t[%d] state: must be contiguous", ist);
      D(io, "o", 0, T);
      D(io, "o", 1, H * Dv);
      if (ch) {
        S(5, "cu_seqlens", M_I32, 1);
        D(5, "cu_seqlens", 0, (int64_t)p->n_seqs + 1);
      } else {
        D(0, "q", 0, p->n_seqs);
      }
      return 0;
    }
    case K3K_OP_MLA_PREFILL:
    case K3K_OP_MLA_DECODE: {
      NEED(params, "params missing");
      const k3k_mla_params_t *p = params;
      NEED(p->n_heads > 0 && p->d_nope > 0 && p->d_rope >= 0 && p->d_v > 0,
           "params.n_heads/d_nope/d_rope/d_v invalid");
      NEED(p->n_seqs >= 0, "params.n_seqs < 0");
      int64_t H = p->n_heads, Dq = p->d_nope + p->d_rope;
      S(0, "q", F32_BF16, 2);
      D(0, "q", 1, H * Dq);
      if (op == K3K_OP_MLA_PREFILL) {
        S(1, "kv", F32_BF16, 2);
        SA(2, "k_rot", F32_BF16, 2);
        S(3, "cu_q", M_I32, 1);
        S(4, "cu_k", M_I32, 1);
        S(5, "o", F32_BF16, 2);
        D(1, "kv", 1, H * (p->d_nope + p->d_v));
        D(2, "k_rot", 0, t[1]->shape[0]);
        D(2, "k_rot", 1, p->d_rope);
        D(3, "cu_q", 0, (int64_t)p->n_seqs + 1);
        D(4, "cu_k", 0, (int64_t)p->n_seqs + 1);
        D(5, "o", 0, t[0]->shape[0]);
        D(5, "o", 1, H * p->d_v);
      } else {
        NEED(p->kv_lora > 0, "params.kv_lora must be > 0");
        SA(1, "w_kvb", F32_BF16, 2);
        S(2, "cache", F32_BF16, 3);
        S(3, "page_table", M_I32, 2);
        S(4, "seq_lens", M_I32, 1);
        S(5, "o", F32_BF16, 2);
        D(0, "q", 0, p->n_seqs);
        D(1, "w_kvb", 0, H * (p->d_nope + p->d_v));
        D(1, "w_kvb", 1, p->kv_lora);
        D(2, "cache", 2, (int64_t)p->kv_lora + p->d_rope);
        NEED(t[2]->shape[1] > 0, "t[2] cache: page_size must be > 0");
        D(3, "page_table", 0, p->n_seqs);
        D(4, "seq_lens", 0, p->n_seqs);
        D(5, "o", 0, p->n_seqs);
        D(5, "o", 1, H * p->d_v);
      }
      return 0;
    }
    case K3K_OP_MLA_CACHE_WRITE:
      SA(0, "c_n", F32_BF16, 2);
      SA(1, "k_rot", F32_BF16, 2);
      S(2, "slot_mapping", M_I32, 1);
      S(3, "cache", F32_BF16, 3);
      D(1, "k_rot", 0, t[0]->shape[0]);
      D(2, "slot_mapping", 0, t[0]->shape[0]);
      D(3, "cache", 2, t[0]->shape[1] + t[1]->shape[1]);
      NEED(k3k_tensor_is_contiguous(t[3]), "t[3] cache: must be contiguous");
      return 0;
    case K3K_OP_MLA_CACHE_GATHER:
      S(0, "cache", F32_BF16, 3);
      S(1, "slot_mapping", M_I32, 1);
      S(2, "y", F32_BF16, 2);
      NEED(k3k_tensor_is_contiguous(t[0]), "t[0] cache: must be contiguous");
      D(2, "y", 0, t[1]->shape[0]);
      D(2, "y", 1, t[0]->shape[2]);
      return 0;
    case K3K_OP_ROUTER: {
      NEED(params, "params missing");
      const k3k_router_params_t *p = params;
      S(0, "logits", M_F32, 2);
      S(1, "bias", F32_BF16, 1);
      S(2, "idx", M_I32, 2);
      S(3, "w", M_F32, 2);
      int64_t E = t[0]->shape[1];
      D(1, "bias", 0, E);
      NEED(p->top_k > 0 && p->top_k <= E, "params.top_k=%d out of [1,%lld]", p->top_k, (long long)E);
      NEED(p->n_groups >= 1 && E % p->n_groups == 0, "params.n_groups=%d does not divide %lld experts",
           p->n_groups, (long long)E);
      NEED(p->topk_group >= 1 && p->topk_group <= p->n_groups, "params.topk_group=%d out of [1,%d]",
           p->topk_group, p->n_groups);
      NEED(p->n_groups == 1 || E / p->n_groups >= 2, "groups need >= 2 experts each");
      NEED((int64_t)p->topk_group * (E / p->n_groups) >= p->top_k,
           "params.topk_group=%d groups hold fewer than top_k=%d experts", p->topk_group, p->top_k);
      D(2, "idx", 0, t[0]->shape[0]);
      D(2, "idx", 1, p->top_k);
      D(3, "w", 0, t[0]->shape[0]);
      D(3, "w", 1, p->top_k);
      return 0;
    }
    case K3K_OP_MOE_COMBINE:
      S(0, "rows", F32_BF16, 2);
      S(1, "row_idx", M_I32, 2);
      S(2, "w", M_F32, 2);
      S(3, "y", F32_BF16, 2);
      D(2, "w", 0, t[1]->shape[0]);
      D(2, "w", 1, t[1]->shape[1]);
      D(3, "y", 0, t[1]->shape[0]);
      D(3, "y", 1, t[0]->shape[1]);
      return 0;
    case K3K_OP_ATTN_RES_MIX:
      NEED(params, "params missing");
      S(0, "snaps", F32_BF16, 3);
      S(1, "p", F32_BF16, 2);
      S(2, "w_norm", F32_BF16, 1);
      S(3, "w_proj", F32_BF16, 1);
      S(4, "y", F32_BF16, 2);
      D(0, "snaps", 1, t[1]->shape[0]);
      D(0, "snaps", 2, t[1]->shape[1]);
      D(2, "w_norm", 0, t[1]->shape[1]);
      D(3, "w_proj", 0, t[1]->shape[1]);
      D(4, "y", 0, t[1]->shape[0]);
      D(4, "y", 1, t[1]->shape[1]);
      return 0;
    case K3K_OP_SAMPLE: {
      NEED(params, "params missing");
      const k3k_sample_params_t *p = params;
      S(0, "logits", F32_BF16, 2);
      S(1, "ids", M_I32, 1);
      NEED(t[0]->shape[1] > 0, "t[0] logits: vocabulary is empty");
      NEED(p->n_rows == t[0]->shape[0], "params.n_rows=%d != %lld logits rows", p->n_rows,
           (long long)t[0]->shape[0]);
      NEED(p->n_rows == 0 || p->rows, "params.rows missing");
      D(1, "ids", 0, t[0]->shape[0]);
      for (int32_t i = 0; i < p->n_rows; i++)
        NEED(isfinite(p->rows[i].temperature) && isfinite(p->rows[i].top_p),
             "params.rows[%d]: temperature/top_p not finite", i);
      return 0;
    }
    case K3K_OP_RES_MIX_NORM: return v_res_mix_norm(&v, params, t);
    case K3K_OP_GEMM_MULTI: return v_gemm_multi(&v, params, t);
    case K3K_OP_KDA_DECODE: return v_kda_decode(&v, params, t);
    case K3K_OP_MOE_ROUTED: return v_moe_routed(&v, params, t);
    case K3K_OP_COUNT: break;
  }
  return fail(&v, "unknown op");
}
