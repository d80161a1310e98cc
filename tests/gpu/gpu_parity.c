/* Parity suite: every op the "cuda" backend supports, against the reference backend, on fresh
 * random inputs, at tiny and real K3 shapes (spec §1.5) with T in {1, 63, 64, 65, 1000}, outputs
 * poisoned before each run, plus the fused KDA decode step against the composition of reference
 * ops it replaces.
 *
 * Tolerances (relative Frobenius error, see docs/perf-gpu.md):
 *   TOL_BF16 1e-2: a BF16 output is one RNE rounding (relative 2^-9) on each side; when the two
 *     fp32 values straddle a rounding boundary the outputs differ by one bf16 ulp (2^-8
 *     relative), so the aggregate stays ~2e-3; MLA decode adds bf16 roundings of q_lat, p, o_lat
 *     for the tensor cores (~3 more 2^-9 terms). 1e-2 leaves headroom yet fails any indexing or
 *     math error (those give O(1)).
 *   TOL_F32 1e-4: fp32 outputs differ only by summation order (tree vs sequential, K <= 7168:
 *     ~sqrt(K)·2^-24 ≈ 5e-6) and libm vs CUDA expf/sqrtf ulps; KDA state recurrences stay ~1e-6.
 *   Indices (sampling, I32 outputs) must match exactly. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-4

static const int64_t kT[] = {1, 63, 64, 65, 1000};
#define NT (int)(sizeof kT / sizeof kT[0])

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define NEW(p, dt, nd, ...)                                        \
  do {                                                             \
    if (gpair_new(g, &(p), (dt), (nd), SH(__VA_ARGS__))) goto out; \
  } while (0)

static double tol_of(const gpair *p) { return p->h.dtype == K3K_BF16 ? TOL_BF16 : TOL_F32; }

/* ---- row ops ---- */
static void t_rmsnorm(gctx *g, int64_t T, int64_t D, k3k_dtype_t dt, int inner, float eps) {
  gpair x = {0}, w = {0}, y = {0};
  char what[128];
  snprintf(what, sizeof what, "rmsnorm T=%lld D=%lld %s inner=%d", (long long)T, (long long)D,
           k3k_dtype_name(dt), inner);
  NEW(x, dt, 2, T, D);
  NEW(w, dt, 1, D);
  NEW(y, dt, 2, T, D);
  gpair_rand(g, &x, -2, 2);
  gpair_rand(g, &w, 0.5f, 1.5f);
  gpair_poison(g, &y);
  k3k_rmsnorm_params_t p = {eps, inner};
  gpair *a[] = {&x, &w, &y};
  if (!g_run2(g, K3K_OP_RMSNORM, &p, a, 3, what)) gpair_check(g, &y, tol_of(&y), what);
out:
  gpair_free(g, &x), gpair_free(g, &w), gpair_free(g, &y);
}

static void t_gated(gctx *g, int64_t T, int64_t NH) {
  gpair x = {0}, z = {0}, w = {0}, y = {0};
  char what[128];
  snprintf(what, sizeof what, "gated_rmsnorm T=%lld NH=%lld", (long long)T, (long long)NH);
  NEW(x, K3K_BF16, 2, T, NH * 128);
  NEW(z, K3K_BF16, 2, T, NH * 128);
  NEW(w, K3K_F32, 1, 128);
  NEW(y, K3K_BF16, 2, T, NH * 128);
  gpair_rand(g, &x, -2, 2), gpair_rand(g, &z, -4, 4), gpair_rand(g, &w, 0.5f, 1.5f);
  gpair_poison(g, &y);
  k3k_gated_rmsnorm_params_t p = {128, 1e-5f};
  gpair *a[] = {&x, &z, &w, &y};
  if (!g_run2(g, K3K_OP_GATED_RMSNORM, &p, a, 4, what)) gpair_check(g, &y, TOL_BF16, what);
out:
  gpair_free(g, &x), gpair_free(g, &z), gpair_free(g, &w), gpair_free(g, &y);
}

static void t_l2(gctx *g, int64_t T, int64_t NH) {
  gpair x = {0}, y = {0};
  char what[128];
  snprintf(what, sizeof what, "l2norm T=%lld NH=%lld ->f32", (long long)T, (long long)NH);
  NEW(x, K3K_BF16, 2, T, NH * 128);
  NEW(y, K3K_F32, 2, T, NH * 128);
  gpair_rand(g, &x, -2, 2);
  gpair_poison(g, &y);
  k3k_l2norm_params_t p = {128, 1e-6f, 1.0f};
  gpair *a[] = {&x, &y};
  if (!g_run2(g, K3K_OP_L2NORM, &p, a, 2, what)) gpair_check(g, &y, TOL_F32, what);
out:
  gpair_free(g, &x), gpair_free(g, &y);
}

static void t_gemm(gctx *g, int64_t M, int64_t N, int64_t K, k3k_dtype_t din, k3k_dtype_t dout) {
  gpair x = {0}, w = {0}, y = {0};
  char what[128];
  snprintf(what, sizeof what, "gemm M=%lld N=%lld K=%lld %s->%s", (long long)M, (long long)N,
           (long long)K, k3k_dtype_name(din), k3k_dtype_name(dout));
  NEW(x, din, 2, M, K);
  NEW(w, din, 2, N, K);
  NEW(y, dout, 2, M, N);
  gpair_rand(g, &x, -1, 1), gpair_rand(g, &w, -0.05f, 0.05f);
  gpair_poison(g, &y);
  gpair *a[] = {&x, &w, &y};
  if (!g_run2(g, K3K_OP_GEMM, NULL, a, 3, what)) gpair_check(g, &y, tol_of(&y), what);
out:
  gpair_free(g, &x), gpair_free(g, &w), gpair_free(g, &y);
}

/* GEMM on views cuBLASLt cannot take as they are (gemm.cu's scratch fallback) and on a sliced
 * W it can (row stride as leading dimension): F32 x times a BF16 W (rows 7.. and columns 3.. of
 * a bigger matrix) -> F32/BF16, and a transposed W view (inner stride != 1). */
static void t_gemm_views(gctx *g, int64_t M) {
  const int64_t N = 1000, K = 512;
  gpair x = {0}, big = {0}, bigt = {0}, y = {0}, yb = {0};
  char what[128];
  NEW(x, K3K_F32, 2, M, K);
  NEW(big, K3K_BF16, 2, N + 20, K + 9);
  NEW(bigt, K3K_BF16, 2, K, N + 5);
  NEW(y, K3K_F32, 2, M, N);
  NEW(yb, K3K_BF16, 2, M, N);
  gpair_rand(g, &x, -1, 1), gpair_rand(g, &big, -0.05f, 0.05f), gpair_rand(g, &bigt, -0.05f, 0.05f);
  gpair ws = big; /* W = big[7:7+N, 3:3+K] */
  ws.h = k3k_tensor_slice(&big.h, 0, 7, N), ws.h = k3k_tensor_slice(&ws.h, 1, 3, K);
  ws.d = k3k_tensor_slice(&big.d, 0, 7, N), ws.d = k3k_tensor_slice(&ws.d, 1, 3, K);
  gpair wt = bigt; /* W[n][k] = bigt[k][n]: strides (1, N + 5) */
  wt.h.shape[0] = wt.d.shape[0] = N, wt.h.shape[1] = wt.d.shape[1] = K;
  wt.h.stride[0] = wt.d.stride[0] = 1, wt.h.stride[1] = wt.d.stride[1] = N + 5;
  for (int c = 0; c < 5; c++) {
    gpair *out = c == 1 ? &yb : &y, *w = c == 2 || c == 3 ? &wt : &ws, *xx = &x;
    gpair xb = {0};
    if (c >= 3) { /* BF16 x: transposed W (BF16 path on a copy); the sliced W as it is (2-byte
                   * aligned leading dimension and pointer: cuBLASLt or, failing that, copies) */
      NEW(xb, K3K_BF16, 2, M, K);
      gpair_rand(g, &xb, -1, 1);
      xx = &xb;
    }
    snprintf(what, sizeof what, "gemm views M=%lld N=%lld K=%lld %s x %s W %s -> %s",
             (long long)M, (long long)N, (long long)K, k3k_dtype_name(xx->h.dtype),
             w == &wt ? "transposed" : "sliced", k3k_dtype_name(w->h.dtype),
             k3k_dtype_name(out->h.dtype));
    gpair_poison(g, out);
    gpair *a[] = {xx, w, out};
    if (!g_run2(g, K3K_OP_GEMM, NULL, a, 3, what)) gpair_check(g, out, tol_of(out), what);
    gpair_free(g, &xb);
  }
out:
  gpair_free(g, &x), gpair_free(g, &big), gpair_free(g, &bigt), gpair_free(g, &y);
  gpair_free(g, &yb);
}

static void t_get_rows(gctx *g, int64_t T, int64_t V, int64_t D) {
  gpair tab = {0}, ids = {0}, y = {0};
  char what[128];
  snprintf(what, sizeof what, "get_rows T=%lld V=%lld D=%lld", (long long)T, (long long)V,
           (long long)D);
  NEW(tab, K3K_BF16, 2, V, D);
  NEW(ids, K3K_I32, 1, T);
  NEW(y, K3K_BF16, 2, T, D);
  gpair_rand(g, &tab, -1, 1);
  for (int64_t i = 0; i < T; i++) gpair_host_set(&ids, i, (float)(g_rand_u64(g) % V));
  gpair_upload(g, &ids);
  gpair_poison(g, &y);
  gpair *a[] = {&tab, &ids, &y};
  if (!g_run2(g, K3K_OP_GET_ROWS, NULL, a, 3, what)) gpair_check(g, &y, 0.0, what);
out:
  gpair_free(g, &tab), gpair_free(g, &ids), gpair_free(g, &y);
}

/* Elementwise: ADD, SIGMOID, SIGMOID_MUL (both forms), SITU, SILU_MUL. */
static void t_elementwise(gctx *g, int64_t R, int64_t C) {
  gpair a = {0}, b = {0}, y = {0}, yf = {0};
  char what[128];
  NEW(a, K3K_BF16, 2, R, C);
  NEW(b, K3K_BF16, 2, R, C);
  NEW(y, K3K_BF16, 2, R, C);
  NEW(yf, K3K_F32, 2, R, C);
  gpair_rand(g, &a, -6, 6), gpair_rand(g, &b, -6, 6);
  for (int k = 0; k < 6; k++) {
    gpair *out = k == 1 ? &yf : &y;
    gpair_poison(g, out);
    k3k_sigmoid_mul_params_t sm = {k == 3};
    k3k_situ_params_t su = {4.0f, 25.0f};
    gpair *v3[] = {&a, &b, out}, *v2[] = {&a, out};
    static const char *nm[] = {"add", "sigmoid->f32", "sigmoid_mul", "sigmoid_mul_bf16inner",
                               "situ", "silu_mul"};
    snprintf(what, sizeof what, "%s R=%lld C=%lld", nm[k], (long long)R, (long long)C);
    int rc = k == 0   ? g_run2(g, K3K_OP_ADD, NULL, v3, 3, what)
             : k == 1 ? g_run2(g, K3K_OP_SIGMOID, NULL, v2, 2, what)
             : k <= 3 ? g_run2(g, K3K_OP_SIGMOID_MUL, &sm, v3, 3, what)
             : k == 4 ? g_run2(g, K3K_OP_SITU, &su, v3, 3, what)
                      : g_run2(g, K3K_OP_SILU_MUL, NULL, v3, 3, what);
    if (!rc) gpair_check(g, out, tol_of(out), what);
  }
out:
  gpair_free(g, &a), gpair_free(g, &b), gpair_free(g, &y), gpair_free(g, &yf);
}

/* ---- KDA pieces ---- */
/* Sequence lengths summing to T (ragged, with a zero-length sequence when T > 1). */
static int split_lens(int64_t T, int32_t *cu, int maxn) {
  static const int64_t pat[] = {1, 63, 0, 64, 65};
  int n = 0;
  int64_t pos = 0;
  cu[0] = 0;
  for (int i = 0; pos < T && n < maxn - 1; i++) {
    int64_t l = pat[i % 5];
    if (l > T - pos || i >= 4) l = T - pos;
    pos += l;
    cu[++n] = (int32_t)pos;
  }
  return n;
}

/* CONV_PREFILL of width W over T tokens: ragged (split_lens), `equal` > 0 sequences of T/equal
 * tokens, or -`equal` sequences covering rows [T/10, T - T/10) only (the rows outside every
 * sequence must stay as they were: poisoned on both sides); state of dtype sdt in reversed slots. With bad != 0 also the rejected calls: an
 * out-of-range slot and cu_seqlens past T (K3_ERANGE), a duplicate slot (K3_EINVAL), each
 * leaving y (poisoned first) and the state pool as they were. */
static void t_conv_w(gctx *g, int64_t T, int64_t C, int W, int read_state, k3k_dtype_t ydt,
                     k3k_dtype_t sdt, int equal, int bad) {
  int32_t cu[8];
  int n;
  if (equal > 0 && equal < 8) {
    n = equal;
    for (int i = 0; i <= n; i++) cu[i] = (int32_t)(T * i / n);
  } else if (equal < 0 && equal > -8) { /* -n: n sequences inside rows [T/10, T - T/10) */
    n = -equal;
    int64_t lo = T / 10, hi = T - T / 10;
    for (int i = 0; i <= n; i++) cu[i] = (int32_t)(lo + (hi - lo) * i / n);
  } else {
    n = split_lens(T, cu, 8);
  }
  int64_t S = n + 2;
  gpair x = {0}, w = {0}, cup = {0}, sl = {0}, st = {0}, y = {0};
  char what[160];
  snprintf(what, sizeof what, "conv_prefill T=%lld C=%lld W=%d seqs=%d read_state=%d ->%s state %s",
           (long long)T, (long long)C, W, n, read_state, k3k_dtype_name(ydt), k3k_dtype_name(sdt));
  NEW(x, K3K_BF16, 2, T, C);
  NEW(w, K3K_F32, 2, C, W);
  NEW(cup, K3K_I32, 1, n + 1);
  NEW(sl, K3K_I32, 1, n);
  NEW(st, sdt, 3, S, C, W - 1);
  NEW(y, ydt, 2, T, C);
  gpair_rand(g, &x, -2, 2), gpair_rand(g, &w, -0.7f, 0.7f), gpair_rand(g, &st, -2, 2);
  for (int i = 0; i <= n; i++) gpair_host_set(&cup, i, (float)cu[i]);
  for (int i = 0; i < n; i++) gpair_host_set(&sl, i, (float)(S - 1 - i)); /* reversed slots */
  gpair_upload(g, &cup), gpair_upload(g, &sl);
  gpair_poison(g, &y);
  k3k_conv_params_t p = {n, read_state, 1};
  gpair *a[] = {&x, &w, &cup, &sl, &st, &y};
  if (!g_run2(g, K3K_OP_CONV_PREFILL, &p, a, 6, what)) {
    gpair_check(g, &y, tol_of(&y), what);
    strncat(what, " state", sizeof what - strlen(what) - 1);
    gpair_check(g, &st, 0.0, what); /* raw inputs copied: exact */
  }
  if (bad && n >= 2) {
    const k3k_tensor_t *td[] = {&x.d, &w.d, &cup.d, &sl.d, &st.d, &y.d};
    gpair_poison(g, &y);
    int32_t good1 = (int32_t)gpair_host_get(&sl, 1), last = (int32_t)gpair_host_get(&cup, n);
    gpair_host_set(&sl, 1, (float)S); /* out of range */
    gpair_upload(g, &sl);
    int rc1 = k3k_run(g->cuda, K3K_OP_CONV_PREFILL, &p, td, 6);
    gpair_host_set(&sl, 1, gpair_host_get(&sl, 0)); /* duplicate */
    gpair_upload(g, &sl);
    int rc2 = k3k_run(g->cuda, K3K_OP_CONV_PREFILL, &p, td, 6);
    gpair_host_set(&sl, 1, (float)good1);
    gpair_upload(g, &sl);
    gpair_host_set(&cup, n, (float)(T + 1)); /* past T */
    gpair_upload(g, &cup);
    int rc3 = k3k_run(g->cuda, K3K_OP_CONV_PREFILL, &p, td, 6);
    gpair_host_set(&cup, n, (float)last);
    gpair_upload(g, &cup);
    g_record(g, rc1 == K3_ERANGE && rc2 == K3_EINVAL && rc3 == K3_ERANGE,
             "conv_prefill T=%lld W=%d bad slot -> %s, duplicate slot -> %s, cu past T -> %s",
             (long long)T, W, k3_errname(rc1), k3_errname(rc2), k3_errname(rc3));
    snprintf(what, sizeof what, "conv_prefill T=%lld W=%d y untouched by rejected calls",
             (long long)T, W);
    gpair_check(g, &y, 0.0, what);
    snprintf(what, sizeof what, "conv_prefill T=%lld W=%d state unchanged after rejected calls",
             (long long)T, W);
    gpair_check(g, &st, 0.0, what);
  }
out:
  gpair_free(g, &x), gpair_free(g, &w), gpair_free(g, &cup), gpair_free(g, &sl);
  gpair_free(g, &st), gpair_free(g, &y);
}

static void t_conv(gctx *g, int64_t T, int64_t C, int read_state, k3k_dtype_t ydt) {
  t_conv_w(g, T, C, 4, read_state, ydt, K3K_BF16, 0, 0);
}

/* The conv group (also alone: k3k-gpu-check --cases conv): the fast path at the perf shape (4
 * sequences of 2048 tokens x 12288 channels), ragged batches at every width the fast path
 * takes, F32 states, a zero start, the rejected calls; then the generic kernel's views. */
void gpu_conv_cases(gctx *g) {
  t_conv_w(g, 8192, 12288, 4, 1, K3K_BF16, K3K_BF16, 4, 1);
  t_conv_w(g, 8192, 12288, 4, 1, K3K_F32, K3K_F32, 0, 0);
  for (int W = 2; W <= 8; W++) {
    t_conv_w(g, 1000, 2048, W, 1, K3K_BF16, W & 1 ? K3K_F32 : K3K_BF16, 0, W == 8);
    t_conv_w(g, 65, 256, W, W & 1, K3K_F32, K3K_BF16, 0, 0);
  }
  t_conv_w(g, 3000, 512, 3, 0, K3K_BF16, K3K_F32, 3, 0);
  t_conv_w(g, 3000, 512, 4, 1, K3K_BF16, K3K_BF16, -3, 0); /* rows outside sequences */
  t_conv_w(g, 300, 12, 4, 1, K3K_F32, K3K_BF16, -2, 0);    /* the same, generic kernel */
  t_conv(g, 70000, 12, 1, K3K_BF16); /* more tokens than grid rows: generic kernel (C % 8) */
  t_conv(g, 70000, 16, 1, K3K_F32);  /* and the 16-byte kernel */
  for (int i = 0; i < NT; i++) {
    t_conv(g, kT[i], 12288, 1, K3K_BF16);
    t_conv(g, kT[i], 256, 0, K3K_F32);
    t_conv_w(g, kT[i], 12, 3, 1, K3K_F32, K3K_F32, 0, kT[i] > 1); /* generic kernel: C % 8 */
  }
}

static void t_conv_step(gctx *g, int64_t N, int64_t C) {
  gpair x = {0}, w = {0}, sl = {0}, st = {0}, y = {0};
  char what[128];
  snprintf(what, sizeof what, "conv_step N=%lld C=%lld", (long long)N, (long long)C);
  NEW(x, K3K_BF16, 2, N, C);
  NEW(w, K3K_F32, 2, C, 4);
  NEW(sl, K3K_I32, 1, N);
  NEW(st, K3K_BF16, 3, N + 1, C, 3);
  NEW(y, K3K_BF16, 2, N, C);
  gpair_rand(g, &x, -2, 2), gpair_rand(g, &w, -0.7f, 0.7f), gpair_rand(g, &st, -2, 2);
  for (int64_t i = 0; i < N; i++) gpair_host_set(&sl, i, (float)(N - i));
  gpair_upload(g, &sl);
  gpair_poison(g, &y);
  k3k_conv_params_t p = {(int32_t)N, 1, 1};
  gpair *a[] = {&x, &w, &sl, &st, &y};
  if (!g_run2(g, K3K_OP_CONV_STEP, &p, a, 5, what)) {
    gpair_check(g, &y, TOL_BF16, what);
    strncat(what, " state", sizeof what - strlen(what) - 1);
    gpair_check(g, &st, 0.0, what);
  }
out:
  gpair_free(g, &x), gpair_free(g, &w), gpair_free(g, &sl), gpair_free(g, &st), gpair_free(g, &y);
}

static void t_gate(gctx *g, int64_t T, int64_t NH, k3k_gate_form_t form) {
  gpair gr = {0}, al = {0}, dt = {0}, out = {0};
  char what[128];
  snprintf(what, sizeof what, "kda_gate T=%lld NH=%lld form=%d", (long long)T, (long long)NH, form);
  NEW(gr, K3K_BF16, 2, T, NH * 128);
  NEW(al, K3K_F32, 1, 128);
  NEW(dt, K3K_F32, 1, NH * 128);
  NEW(out, K3K_F32, 2, T, NH * 128);
  gpair_rand(g, &gr, -3, 3), gpair_rand(g, &al, -1, 1.5f), gpair_rand(g, &dt, -1, 1);
  gpair_poison(g, &out);
  k3k_kda_gate_params_t p = {form, 128, -5.0f};
  gpair *a[] = {&gr, &al, &dt, &out};
  if (!g_run2(g, K3K_OP_KDA_GATE, &p, a, 4, what)) gpair_check(g, &out, TOL_F32, what);
out:
  gpair_free(g, &gr), gpair_free(g, &al), gpair_free(g, &dt), gpair_free(g, &out);
}

/* Unit-norm rows per head (what L2NORM produces), as F32. */
static void rand_unit_heads(gctx *g, gpair *p, int64_t rows, int64_t nh) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h = 0; h < nh; h++) {
      float v[128], ss = 0;
      for (int d = 0; d < 128; d++) {
        v[d] = g_rand_unif(g, -1, 1);
        ss += v[d] * v[d];
      }
      for (int d = 0; d < 128; d++) gpair_host_set(p, (r * nh + h) * 128 + d, v[d] / sqrtf(ss));
    }
  gpair_upload(g, p);
}

static void t_kda_step(gctx *g, int64_t N, int64_t NH, int read_state) {
  gpair q = {0}, k = {0}, v = {0}, gg = {0}, b = {0}, sl = {0}, st = {0}, o = {0};
  char what[128];
  snprintf(what, sizeof what, "kda_step N=%lld NH=%lld read_state=%d", (long long)N,
           (long long)NH, read_state);
  int64_t S = N + 2;
  NEW(q, K3K_F32, 2, N, NH * 128);
  NEW(k, K3K_F32, 2, N, NH * 128);
  NEW(v, K3K_BF16, 2, N, NH * 128);
  NEW(gg, K3K_F32, 2, N, NH * 128);
  NEW(b, K3K_F32, 2, N, NH);
  NEW(sl, K3K_I32, 1, N);
  NEW(st, K3K_F32, 4, S, NH, 128, 128);
  NEW(o, K3K_BF16, 2, N, NH * 128);
  rand_unit_heads(g, &q, N, NH), rand_unit_heads(g, &k, N, NH);
  gpair_rand(g, &v, -2, 2), gpair_rand(g, &gg, -5, 0), gpair_rand(g, &b, 0, 1);
  gpair_rand(g, &st, -0.5f, 0.5f);
  for (int64_t i = 0; i < N; i++) gpair_host_set(&sl, i, (float)((i * 7 + 1) % S));
  /* distinct slots: 7 is coprime with S unless S % 7 == 0 */
  if (S % 7 == 0)
    for (int64_t i = 0; i < N; i++) gpair_host_set(&sl, i, (float)(i + 1));
  gpair_upload(g, &sl);
  gpair_poison(g, &o);
  k3k_kda_params_t p = {(int32_t)N, (int32_t)NH, read_state, 0.0f, 0};
  gpair *a[] = {&q, &k, &v, &gg, &b, &sl, &st, &o};
  if (!g_run2(g, K3K_OP_KDA_STEP, &p, a, 8, what)) {
    gpair_check(g, &o, TOL_BF16, what);
    strncat(what, " state", sizeof what - strlen(what) - 1);
    gpair_check(g, &st, TOL_F32, what);
  }
out:
  gpair_free(g, &q), gpair_free(g, &k), gpair_free(g, &v), gpair_free(g, &gg);
  gpair_free(g, &b), gpair_free(g, &sl), gpair_free(g, &st), gpair_free(g, &o);
}

/* ---- KDA chunked prefill ----
 * Tolerance TOL_KDA_CHUNK 1e-2 for the output AND the fp32 state: the CUDA kernel feeds the
 * tensor cores bf16 operands (q, k, v times exp factors, T, W, U, Vn, Aqk and the state itself;
 * relative 2^-9 each, fp32 accumulate; kernels/cuda/kda_chunk*.cu), so unlike KDA_STEP (fp32 CUDA
 * cores, 1e-4) the state carries bf16-operand error (~1e-3 observed). An indexing or math error
 * gives O(1). `gmin` < -5 makes 16-row gate spans exceed the kernel's factorisation bound, so the
 * per-element diagonal path runs. */
#define TOL_KDA_CHUNK 1e-2
static void t_kda_chunk(gctx *g, int64_t T, int64_t NH, int read_state, k3k_dtype_t dt,
                        float gmin, int one_seq) {
  int32_t cu[8];
  int n = one_seq ? 1 : split_lens(T, cu, 8);
  if (one_seq) cu[0] = 0, cu[1] = (int32_t)T;
  int64_t S = n + 2;
  gpair q = {0}, k = {0}, v = {0}, gg = {0}, b = {0}, cup = {0}, sl = {0}, st = {0}, o = {0};
  char what[160];
  snprintf(what, sizeof what, "kda_chunk T=%lld NH=%lld seqs=%d read_state=%d %s gmin=%g",
           (long long)T, (long long)NH, n, read_state, k3k_dtype_name(dt), gmin);
  NEW(q, dt, 2, T, NH * 128);
  NEW(k, dt, 2, T, NH * 128);
  NEW(v, dt, 2, T, NH * 128);
  NEW(gg, K3K_F32, 2, T, NH * 128);
  NEW(b, K3K_F32, 2, T, NH);
  NEW(cup, K3K_I32, 1, n + 1);
  NEW(sl, K3K_I32, 1, n);
  NEW(st, K3K_F32, 4, S, NH, 128, 128);
  NEW(o, dt, 2, T, NH * 128);
  rand_unit_heads(g, &q, T, NH), rand_unit_heads(g, &k, T, NH);
  gpair_rand(g, &v, -2, 2), gpair_rand(g, &gg, gmin, 0), gpair_rand(g, &b, 0, 1);
  gpair_rand(g, &st, -0.5f, 0.5f);
  for (int i = 0; i <= n; i++) gpair_host_set(&cup, i, (float)cu[i]);
  for (int i = 0; i < n; i++) gpair_host_set(&sl, i, (float)(S - 1 - i)); /* reversed slots */
  gpair_upload(g, &cup), gpair_upload(g, &sl);
  gpair_poison(g, &o);
  k3k_kda_params_t p = {n, (int32_t)NH, read_state, 0.0f, 0};
  gpair *a[] = {&q, &k, &v, &gg, &b, &cup, &sl, &st, &o};
  if (!g_run2(g, K3K_OP_KDA_CHUNK, &p, a, 9, what)) {
    gpair_check(g, &o, TOL_KDA_CHUNK, what);
    strncat(what, " state", sizeof what - strlen(what) - 1);
    gpair_check(g, &st, TOL_KDA_CHUNK, what);
  }
  if (n >= 2) { /* bad ids: K3_ERANGE / K3_EINVAL and the state pool untouched */
    const k3k_tensor_t *td[] = {&q.d, &k.d, &v.d, &gg.d, &b.d, &cup.d, &sl.d, &st.d, &o.d};
    int32_t good1 = (int32_t)gpair_host_get(&sl, 1);
    gpair_host_set(&sl, 1, (float)S); /* out of range */
    gpair_upload(g, &sl);
    int rc1 = k3k_run(g->cuda, K3K_OP_KDA_CHUNK, &p, td, 9);
    gpair_host_set(&sl, 1, gpair_host_get(&sl, 0)); /* duplicate */
    gpair_upload(g, &sl);
    int rc2 = k3k_run(g->cuda, K3K_OP_KDA_CHUNK, &p, td, 9);
    gpair_host_set(&sl, 1, (float)good1);
    gpair_upload(g, &sl);
    g_record(g, rc1 == K3_ERANGE && rc2 == K3_EINVAL,
             "kda_chunk T=%lld bad slot -> %s, duplicate slot -> %s", (long long)T,
             k3_errname(rc1), k3_errname(rc2));
    snprintf(what, sizeof what, "kda_chunk T=%lld state unchanged after rejected calls",
             (long long)T);
    gpair_check(g, &st, TOL_KDA_CHUNK, what);
  }
out:
  gpair_free(g, &q), gpair_free(g, &k), gpair_free(g, &v), gpair_free(g, &gg);
  gpair_free(g, &b), gpair_free(g, &cup), gpair_free(g, &sl), gpair_free(g, &st);
  gpair_free(g, &o);
}

static void t_mla_cache(gctx *g, int64_t T) {
  const int64_t ps = 64, pages = (T + ps - 1) / ps + 2;
  gpair cn = {0}, kr = {0}, sm = {0}, cache = {0}, y = {0};
  char what[96];
  snprintf(what, sizeof what, "mla_cache_write+gather T=%lld", (long long)T);
  NEW(cn, K3K_BF16, 2, T, 512);
  NEW(kr, K3K_BF16, 2, T, 64);
  NEW(sm, K3K_I32, 1, T);
  NEW(cache, K3K_BF16, 3, pages, ps, 576);
  NEW(y, K3K_BF16, 2, T, 576);
  gpair_rand(g, &cn, -1, 1), gpair_rand(g, &kr, -1, 1), gpair_rand(g, &cache, -1, 1);
  for (int64_t i = 0; i < T; i++) gpair_host_set(&sm, i, (float)(pages * ps - 1 - i));
  gpair_upload(g, &sm);
  gpair *a[] = {&cn, &kr, &sm, &cache};
  if (!g_run2(g, K3K_OP_MLA_CACHE_WRITE, NULL, a, 4, what)) gpair_check(g, &cache, 0.0, what);
  gpair_poison(g, &y);
  gpair *b[] = {&cache, &sm, &y};
  if (!g_run2(g, K3K_OP_MLA_CACHE_GATHER, NULL, b, 3, what)) gpair_check(g, &y, 0.0, what);
out:
  gpair_free(g, &cn), gpair_free(g, &kr), gpair_free(g, &sm), gpair_free(g, &cache);
  gpair_free(g, &y);
}

static void t_attn_res(gctx *g, int64_t nb, int64_t T, int64_t D) {
  gpair sn = {0}, pc = {0}, wn = {0}, wp = {0}, y = {0};
  char what[96];
  snprintf(what, sizeof what, "attn_res_mix nb=%lld T=%lld D=%lld", (long long)nb, (long long)T,
           (long long)D);
  NEW(sn, K3K_BF16, 3, nb, T, D);
  NEW(pc, K3K_BF16, 2, T, D);
  NEW(wn, K3K_BF16, 1, D);
  NEW(wp, K3K_BF16, 1, D);
  NEW(y, K3K_BF16, 2, T, D);
  gpair_rand(g, &sn, -2, 2), gpair_rand(g, &pc, -2, 2);
  gpair_rand(g, &wn, 0.5f, 1.5f), gpair_rand(g, &wp, -0.05f, 0.05f);
  gpair_poison(g, &y);
  k3k_attn_res_params_t p = {1e-5f};
  gpair *a[] = {&sn, &pc, &wn, &wp, &y};
  if (!g_run2(g, K3K_OP_ATTN_RES_MIX, &p, a, 5, what)) gpair_check(g, &y, TOL_BF16, what);
out:
  gpair_free(g, &sn), gpair_free(g, &pc), gpair_free(g, &wn), gpair_free(g, &wp), gpair_free(g, &y);
}

static void t_sample(gctx *g, int64_t V) {
  enum { R = 6 };
  gpair lg = {0}, ids = {0};
  char what[96];
  snprintf(what, sizeof what, "sample rows=%d V=%lld (greedy/temp/top-k/top-p)", R, (long long)V);
  NEW(lg, K3K_F32, 2, R, V);
  NEW(ids, K3K_I32, 1, R);
  gpair_rand(g, &lg, -8, 8);
  gpair_poison(g, &ids);
  k3k_sample_cfg_t cfg[R] = {{0.0f, 0, 1.0f, 1, 0},    {1.0f, 0, 1.0f, 7, 3},
                             {0.7f, 40, 1.0f, 9, 1},   {1.0f, 0, 0.9f, 11, 5},
                             {0.8f, 100, 0.95f, 13, 2}, {1.0f, 1, 1.0f, 17, 0}};
  k3k_sample_params_t p = {R, cfg};
  gpair *a[] = {&lg, &ids};
  if (!g_run2(g, K3K_OP_SAMPLE, &p, a, 2, what)) gpair_check(g, &ids, 0.0, what);
out:
  gpair_free(g, &lg), gpair_free(g, &ids);
}

/* All-greedy batches take the device-only argmax (split rows, no host round trip): ties (the
 * lowest index wins), NaN (never wins), -0 == +0, an all -inf row (id 0), and BF16 logits
 * (many exact ties at the maximum). Ids must match exactly. */
static void t_sample_greedy(gctx *g, int64_t N, int64_t V, k3k_dtype_t dt) {
  gpair lg = {0}, ids = {0};
  char what[96];
  snprintf(what, sizeof what, "sample all-greedy rows=%lld V=%lld %s", (long long)N,
           (long long)V, k3k_dtype_name(dt));
  NEW(lg, dt, 2, N, V);
  NEW(ids, K3K_I32, 1, N);
  gpair_rand(g, &lg, -8, 8);
  if (N >= 5) {
    gpair_host_set(&lg, 1 * V + 90000, 50.0f); /* tie: index 100 must win */
    gpair_host_set(&lg, 1 * V + 100, 50.0f);
    gpair_host_set(&lg, 2 * V + 5, NAN);
    gpair_host_set(&lg, 2 * V + 7, NAN);
    gpair_host_set(&lg, 2 * V + V - 1, 60.0f);
    for (int64_t i = 0; i < V; i++) {
      gpair_host_set(&lg, 3 * V + i, -INFINITY);
      gpair_host_set(&lg, 4 * V + i, -1.0f);
    }
    gpair_host_set(&lg, 4 * V + 70000, 0.0f);
    gpair_host_set(&lg, 4 * V + 60000, -0.0f); /* equals +0: the lower index wins */
    gpair_upload(g, &lg);
  }
  gpair_poison(g, &ids);
  k3k_sample_cfg_t cfg[64];
  memset(cfg, 0, sizeof cfg);
  for (int i = 0; i < 64; i++) cfg[i].top_k = i % 3 == 1 ? 1 : 0; /* both greedy forms */
  k3k_sample_params_t p = {(int32_t)N, cfg};
  gpair *a[] = {&lg, &ids};
  if (!g_run2(g, K3K_OP_SAMPLE, &p, a, 2, what)) gpair_check(g, &ids, 0.0, what);
out:
  gpair_free(g, &lg), gpair_free(g, &ids);
}

/* Fused decode step vs CONV_STEP x3 → L2NORM q,k → KDA_GATE → SIGMOID → KDA_STEP →
 * GATED_RMSNORM on the reference backend. */
void gpu_fused_kda_case(gctx *g, int64_t B, int64_t NH);
void gpu_mla_prefill_cases(gctx *g, bool quick);
void gpu_mla_decode_cases(gctx *g, bool quick);
void gpu_gemv_cases(gctx *g, bool quick);       /* gpu_gemv.c */
void gpu_gemv_multi_cases(gctx *g, bool quick); /* gpu_gemv.c: the opt-in fused forms */
void gpu_generic_cases(gctx *g);            /* gpu_generic.c */
void gpu_side_cases(gctx *g);               /* gpu_side.c */
void gpu_resnorm_cases(gctx *g);            /* gpu_resnorm.c */

int gpu_parity(gctx *g, bool quick) {
  t_gemm_views(g, 1);
  t_gemm_views(g, 65);
  t_sample_greedy(g, 64, 163840, K3K_F32);
  t_sample_greedy(g, 5, 163840, K3K_BF16);
  t_sample_greedy(g, 3, 1001, K3K_F32); /* one part per row, generic loads */
  t_sample_greedy(g, 3, 4100, K3K_F32); /* three float4 parts per row */
  /* More rows than a grid dimension holds (the 48B MoE gathers 64 x 136 tokens x top-8 rows):
   * the 16-byte path (D % 8 == 0) and the generic kernel's row loop (D = 100). */
  t_get_rows(g, 69632, 512, 2304);
  t_get_rows(g, 70001, 64, 100);
  gpu_conv_cases(g);
  for (int i = 0; i < NT; i++) {
    int64_t T = kT[i];
    t_rmsnorm(g, T, 7168, K3K_BF16, 1, 1e-5f);
    t_rmsnorm(g, T, 7168, K3K_BF16, 0, 1e-5f);
    t_rmsnorm(g, T, 1536, K3K_F32, 0, 1e-6f);
    t_rmsnorm(g, T, 512, K3K_BF16, 1, 1e-6f);
    t_gated(g, T, 96);
    t_l2(g, T, 96);
    t_get_rows(g, T, 4096, 7168);
    t_elementwise(g, T, 12288);
    t_gemm(g, T, T <= 65 ? 12288 : 1024, 7168, K3K_BF16, K3K_BF16);
    t_gemm(g, T, 576, 7168, K3K_BF16, K3K_F32);
    t_gemm(g, T, 96, 256, K3K_F32, K3K_F32);
    t_gate(g, T, 96, K3K_GATE_LOWER_BOUND);
    t_gate(g, T, 4, K3K_GATE_SOFTPLUS);
    t_attn_res(g, T == 1000 ? 8 : i % 3, T, 7168);
    t_mla_cache(g, T);
    t_kda_chunk(g, T, 4, 1, K3K_BF16, -5.0f, 1);
    t_kda_chunk(g, T, 4, 0, K3K_BF16, -5.0f, 1);
    t_kda_chunk(g, T, 2, i & 1, K3K_F32, -5.0f, 0);
    if (quick) break;
  }
  /* ATTN_RES_MIX decode form (T <= SM count: 512 threads, 8 values per load batch) */
  t_attn_res(g, 8, 1, 7168);
  t_attn_res(g, 15, 3, 7168); /* 16 values: two batches */
  t_attn_res(g, 3, 2, 2304);  /* 48B width: threads without a vector */
  t_attn_res(g, 5, 140, 7168); /* T > SM count: the persistent form */
  static const int64_t kN[] = {1, 63, 64, 65};
  for (int i = 0; i < 4; i++) {
    t_conv_step(g, kN[i], 12288);
    t_kda_step(g, kN[i], i == 0 ? 2 : 96, i != 1);
    gpu_fused_kda_case(g, kN[i], 96);
  }
  t_kda_chunk(g, 65, 96, 1, K3K_BF16, -5.0f, 0);  /* real head count, ragged */
  t_kda_chunk(g, 200, 2, 1, K3K_BF16, -40.0f, 0); /* wide gate spans: per-element diagonal */
  gpu_mla_decode_cases(g, quick);
  gpu_mla_prefill_cases(g, quick);
  t_sample(g, 163840);
  t_gemm(g, 4, 4096, 7168, K3K_BF16, K3K_F32); /* lm_head rows (vocab cut to 4096) */
  gpu_gemv_cases(g, quick);
  gpu_gemv_multi_cases(g, quick);
  gpu_generic_cases(g);
  gpu_side_cases(g);
  gpu_resnorm_cases(g);
  return 0;
}
