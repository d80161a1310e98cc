/* Cases for the row-wise ops, GEMMs and MXFP4: each builds random inputs (odd sizes, strided
 * views), computes the expectation in float64 here, and runs on every backend. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void t_copy_add(void) {
  tt_t s[3];
  s[0] = tt_2d(K3K_F32, 7, 13, 5); /* strided source */
  s[1] = tt_2d(K3K_BF16, 7, 13, 0);
  tt_rand(&s[0], -3, 3);
  double *w = tt_expect(&s[1], 0, 0);
  for (int64_t i = 0; i < 7 * 13; i++) w[i] = rbf(tt_get(&s[0], i));
  run_case("copy f32->bf16 strided", K3K_OP_COPY, NULL, s, 2, 0);
  tt_free(&s[0]);
  tt_free(&s[1]);

  s[0] = tt_2d(K3K_BF16, 9, 31, 3);
  s[1] = tt_2d(K3K_F32, 9, 31, 0);
  s[2] = tt_2d(K3K_BF16, 9, 31, 1);
  tt_rand(&s[0], -2, 2);
  tt_rand(&s[1], -2, 2);
  w = tt_expect(&s[2], 1e-30, tol_rel(K3K_BF16));
  for (int64_t i = 0; i < 9 * 31; i++) w[i] = rbf(tt_get(&s[0], i) + tt_get(&s[1], i));
  run_case("add bf16+f32->bf16", K3K_OP_ADD, NULL, s, 3, 0);
  for (int i = 0; i < 3; i++) tt_free(&s[i]);
}

static void t_get_rows(void) {
  tt_t s[3];
  s[0] = tt_2d(K3K_BF16, 37, 19, 0);
  s[1] = tt_1d(K3K_I32, 11);
  s[2] = tt_2d(K3K_F32, 11, 19, 2);
  tt_rand(&s[0], -1, 1);
  double *w = tt_expect(&s[2], 0, 0);
  for (int i = 0; i < 11; i++) {
    int id = (int)(rng_u32() % 37);
    tt_seti(&s[1], i, id);
    for (int d = 0; d < 19; d++) w[i * 19 + d] = tt_get(&s[0], id * 19 + d);
  }
  run_case("get_rows", K3K_OP_GET_ROWS, NULL, s, 3, 0);
  tt_seti(&s[1], 5, 37);
  run_case("get_rows id out of range", K3K_OP_GET_ROWS, NULL, s, 3, K3_ERANGE);
  for (int i = 0; i < 3; i++) tt_free(&s[i]);
}

static void t_rmsnorm(void) {
  for (int inner = 0; inner < 2; inner++) {
    int64_t R = 6, D = 45;
    k3k_dtype_t yd = inner ? K3K_BF16 : K3K_F32;
    tt_t s[3] = {tt_2d(inner ? K3K_BF16 : K3K_F32, R, D, 7), tt_1d(K3K_BF16, D), tt_2d(yd, R, D, 0)};
    tt_rand(&s[0], -4, 4);
    tt_rand(&s[1], 0.5, 1.5);
    double *w = tt_expect(&s[2], 1e-6, inner ? 1.6e-2 : 1e-5);
    for (int64_t r = 0; r < R; r++) {
      double ss = 0;
      for (int64_t d = 0; d < D; d++) ss += tt_get(&s[0], r * D + d) * tt_get(&s[0], r * D + d);
      double rstd = 1.0 / sqrt(ss / D + 1e-5);
      for (int64_t d = 0; d < D; d++) {
        double xn = tt_get(&s[0], r * D + d) * rstd;
        w[r * D + d] = inner ? rbf(tt_get(&s[1], d) * rbf(xn)) : xn * tt_get(&s[1], d);
      }
    }
    k3k_rmsnorm_params_t p = {.eps = 1e-5f, .bf16_inner = inner};
    run_case(inner ? "rmsnorm bf16_inner" : "rmsnorm fp32", K3K_OP_RMSNORM, &p, s, 3, 0);
    for (int i = 0; i < 3; i++) tt_free(&s[i]);
  }
}

static void t_gated_l2_sigmoid(void) {
  int64_t R = 5, Dh = 16, NH = 3, C = NH * Dh;
  tt_t s[4] = {tt_2d(K3K_F32, R, C, 3), tt_2d(K3K_BF16, R, C, 0), tt_1d(K3K_F32, Dh),
               tt_2d(K3K_F32, R, C, 0)};
  tt_rand(&s[0], -2, 2);
  tt_rand(&s[1], -4, 4);
  tt_rand(&s[2], 0.5, 1.5);
  double *w = tt_expect(&s[3], 1e-6, 1e-5);
  for (int64_t r = 0; r < R; r++)
    for (int64_t h = 0; h < NH; h++) {
      double ss = 0;
      for (int64_t d = 0; d < Dh; d++) ss += pow(tt_get(&s[0], r * C + h * Dh + d), 2);
      double rstd = 1.0 / sqrt(ss / Dh + 1e-5);
      for (int64_t d = 0; d < Dh; d++) {
        int64_t i = r * C + h * Dh + d;
        w[i] = tt_get(&s[0], i) * rstd * tt_get(&s[2], d) * sigm(tt_get(&s[1], i));
      }
    }
  k3k_gated_rmsnorm_params_t gp = {.head_dim = (int32_t)Dh, .eps = 1e-5f};
  run_case("gated_rmsnorm", K3K_OP_GATED_RMSNORM, &gp, s, 4, 0);
  for (int i = 0; i < 4; i++) tt_free(&s[i]);

  tt_t l[2] = {tt_2d(K3K_BF16, 7, 3 * 24, 1), tt_2d(K3K_F32, 7, 3 * 24, 0)};
  tt_rand(&l[0], -3, 3);
  w = tt_expect(&l[1], 1e-6, 1e-5);
  for (int64_t r = 0; r < 7; r++)
    for (int64_t h = 0; h < 3; h++) {
      double ss = 0;
      for (int d = 0; d < 24; d++) ss += pow(tt_get(&l[0], r * 72 + h * 24 + d), 2);
      for (int d = 0; d < 24; d++)
        w[r * 72 + h * 24 + d] = tt_get(&l[0], r * 72 + h * 24 + d) / sqrt(ss + 1e-6) * 0.5;
    }
  k3k_l2norm_params_t lp = {.head_dim = 24, .eps = 1e-6f, .scale = 0.5f};
  run_case("l2norm", K3K_OP_L2NORM, &lp, l, 2, 0);
  for (int i = 0; i < 2; i++) tt_free(&l[i]);

  tt_t g[2] = {tt_2d(K3K_F32, 3, 29, 0), tt_2d(K3K_F32, 3, 29, 0)};
  tt_rand(&g[0], -30, 30);
  w = tt_expect(&g[1], 1e-7, 1e-5);
  for (int i = 0; i < 87; i++) w[i] = sigm(tt_get(&g[0], i));
  run_case("sigmoid", K3K_OP_SIGMOID, NULL, g, 2, 0);
  for (int i = 0; i < 2; i++) tt_free(&g[i]);
}

static void t_activations(void) {
  for (int inner = 0; inner < 2; inner++) {
    k3k_dtype_t dt = inner ? K3K_BF16 : K3K_F32;
    tt_t s[3] = {tt_2d(dt, 4, 33, 2), tt_2d(dt, 4, 33, 0), tt_2d(dt, 4, 33, 0)};
    tt_rand(&s[0], -3, 3);
    tt_rand(&s[1], -6, 6);
    double *w = tt_expect(&s[2], 1e-7, inner ? 8e-3 : 1e-5);
    for (int i = 0; i < 4 * 33; i++) {
      double x = tt_get(&s[0], i), gg = tt_get(&s[1], i);
      w[i] = inner ? rbf(rbf(x) * rbf(sigm(gg))) : x * sigm(gg);
    }
    k3k_sigmoid_mul_params_t p = {.bf16_inner = inner};
    run_case(inner ? "sigmoid_mul bf16" : "sigmoid_mul fp32", K3K_OP_SIGMOID_MUL, &p, s, 3, 0);
    for (int i = 0; i < 3; i++) tt_free(&s[i]);
  }
  /* SiTU at large magnitudes: the tanh caps (±4, ±25) and a vanishing sigmoid must hold. */
  tt_t s[3] = {tt_2d(K3K_F32, 5, 41, 0), tt_2d(K3K_F32, 5, 41, 0), tt_2d(K3K_F32, 5, 41, 0)};
  for (int i = 0; i < 5 * 41; i++) {
    double mag = i % 3 == 0 ? 300 : i % 3 == 1 ? 40 : 3;
    tt_set(&s[0], i, rng_uniform(-mag, mag));
    tt_set(&s[1], i, rng_uniform(-mag * 10, mag * 10));
  }
  double *w = tt_expect(&s[2], 1e-6, 2e-5);
  for (int i = 0; i < 5 * 41; i++) {
    double g = tt_get(&s[0], i), u = tt_get(&s[1], i);
    w[i] = 4.0 * tanh(g / 4.0) * sigm(g) * 25.0 * tanh(u / 25.0);
  }
  k3k_situ_params_t sp = {.beta = 4.0f, .beta_lin = 25.0f};
  run_case("situ large magnitudes", K3K_OP_SITU, &sp, s, 3, 0);
  bool capped = true;
  for (int i = 0; i < 5 * 41; i++) capped &= fabs(tt_get(&s[2], i)) <= 4.0 * 25.0 + 1e-3;
  check(capped, "situ: |y| <= beta*beta_lin");
  w = tt_expect(&s[2], 1e-6, 2e-5);
  for (int i = 0; i < 5 * 41; i++) {
    tt_set(&s[0], i, rng_uniform(-8, 8));
    double g = tt_get(&s[0], i), u = tt_get(&s[1], i);
    w[i] = g * sigm(g) * u;
  }
  run_case("silu_mul", K3K_OP_SILU_MUL, NULL, s, 3, 0);
  for (int i = 0; i < 3; i++) tt_free(&s[i]);
}

/* y = x·Wᵀ in double. */
static void gemm_want(const tt_t *x, const tt_t *W, double *w, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += tt_get(x, m * K + k) * tt_get(W, n * K + k);
      w[m * N + n] = acc;
    }
}

static void t_gemm(void) {
  /* W is a sliced view: rows 5..27 and columns 2..38 of a [50,40] bf16 matrix. */
  tt_t big = tt_2d(K3K_BF16, 50, 40, 0);
  tt_rand(&big, -1, 1);
  int64_t M = 9, K = 37, N = 23;
  tt_t s[3];
  s[0] = tt_2d(K3K_F32, M, K, 4);
  tt_rand(&s[0], -1, 1);
  s[1] = (tt_t){0};
  s[1].buf = malloc(big.bytes);
  memcpy(s[1].buf, big.buf, big.bytes);
  s[1].bytes = big.bytes;
  s[1].t = big.t;
  s[1].t.data = s[1].buf;
  s[1].t = k3k_tensor_slice(&s[1].t, 0, 5, N);
  s[1].t = k3k_tensor_slice(&s[1].t, 1, 2, K);
  for (int pass = 0; pass < 3; pass++) {
    k3k_dtype_t yd = pass == 1 ? K3K_BF16 : K3K_F32;
    if (pass == 2) { /* decode-shaped: M=3 rows take the fast path's no-packing kernel */
      M = 3;
      s[0].t.shape[0] = M;
    }
    s[2] = tt_2d(yd, M, N, 3);
    double *w = tt_expect(&s[2], 1e-5, pass == 1 ? 8e-3 : 1e-5);
    gemm_want(&s[0], &s[1], w, M, N, K);
    if (pass == 1)
      for (int64_t i = 0; i < M * N; i++) w[i] = rbf(w[i]);
    run_case(pass == 2 ? "gemm sliced W, M=3" : pass ? "gemm sliced W, bf16 out" : "gemm sliced W, f32 out",
             K3K_OP_GEMM, NULL, s, 3, 0);
    tt_free(&s[2]);
  }
  for (int i = 0; i < 2; i++) tt_free(&s[i]);
  tt_free(&big);
  /* Larger, to cover full register blocks and several tasks. */
  M = 13, K = 130, N = 70;
  tt_t g[3] = {tt_2d(K3K_BF16, M, K, 0), tt_2d(K3K_BF16, N, K, 0), tt_2d(K3K_F32, M, N, 0)};
  tt_rand(&g[0], -1, 1);
  tt_rand(&g[1], -1, 1);
  gemm_want(&g[0], &g[1], tt_expect(&g[2], 1e-5, 1e-4), M, N, K);
  run_case("gemm bf16 13x130x70", K3K_OP_GEMM, NULL, g, 3, 0);
  for (int i = 0; i < 3; i++) tt_free(&g[i]);
  M = 1, K = 4 * 33 + 3, N = 8 * 5;
  tt_t d[3] = {tt_2d(K3K_BF16, M, K, 0), tt_2d(K3K_F32, N, K, 0), tt_2d(K3K_F32, M, N, 0)};
  tt_rand(&d[0], -1, 1);
  tt_rand(&d[1], -1, 1);
  gemm_want(&d[0], &d[1], tt_expect(&d[2], 1e-5, 1e-5), M, N, K);
  run_case("gemm decode 1x135x40 f32 W", K3K_OP_GEMM, NULL, d, 3, 0);
  for (int i = 0; i < 3; i++) tt_free(&d[i]);
}

/* MXFP4: random codes and scales near 127, checked by an independent decoder here. */
static double e2m1(int code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

static void t_mxfp4(void) {
  int64_t M = 5, N = 19, K = 96;
  tt_t pk = tt_2d(K3K_U8, N, K / 2, 0), sc = tt_2d(K3K_U8, N, K / 32, 0);
  for (int64_t i = 0; i < N * K / 2; i++) tt_set(&pk, i, rng_u32() & 0xFF);
  for (int64_t i = 0; i < N * K / 32; i++) tt_set(&sc, i, 122 + rng_u32() % 10);
  tt_t Wd = tt_2d(K3K_F32, N, K, 0);
  double *wd = tt_expect(&Wd, 0, 0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) {
      int byte = tt_geti(&pk, n * (K / 2) + k / 2);
      int code = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
      wd[n * K + k] = e2m1(code) * pow(2.0, tt_geti(&sc, n * (K / 32) + k / 32) - 127);
    }
  tt_t d[3] = {pk, sc, Wd};
  run_case("mxfp4_dequant exact", K3K_OP_MXFP4_DEQUANT, NULL, d, 3, 0);
  Wd = d[2];
  tt_t x = tt_2d(K3K_BF16, M, K, 0);
  tt_rand(&x, -1, 1);
  tt_t y = tt_2d(K3K_F32, M, N, 0);
  gemm_want(&x, &Wd, tt_expect(&y, 1e-5, 1e-5), M, N, K);
  tt_t g[4] = {x, pk, sc, y};
  run_case("mxfp4_gemm", K3K_OP_MXFP4_GEMM, NULL, g, 4, 0);
  /* Dequantize-then-GEMM must equal the fused op bit for bit (same k order, exact dequant). */
  tt_t y2 = tt_2d(K3K_F32, M, N, 0);
  tt_t gg[3] = {x, Wd, y2};
  check(run_host("cpu", K3K_OP_GEMM, NULL, gg, 3) == 0, "gemm on dequantized W");
  check(!memcmp(y2.buf, g[3].buf, (size_t)(M * N) * 4), "mxfp4_gemm == dequant + gemm bitwise");
  tt_set(&sc, 3, 255);
  tt_t bad[4] = {x, pk, sc, g[3]};
  bad[3].want = NULL;
  check(run_host("cpu", K3K_OP_MXFP4_GEMM, NULL, bad, 4) == K3_EINVAL, "mxfp4 NaN scale rejected");
  tt_free(&x);
  tt_free(&pk);
  tt_free(&sc);
  tt_free(&Wd);
  tt_free(&g[3]);
  tt_free(&y2);
}

static void t_mix(void) {
  for (int nb = 0; nb <= 3; nb += 3) {
    int64_t T = 4, D = 27;
    int64_t sh[3] = {nb, T, D};
    tt_t s[5] = {tt_new(K3K_BF16, 3, sh, 0), tt_2d(K3K_BF16, T, D, 2), tt_1d(K3K_BF16, D),
                 tt_1d(K3K_BF16, D), tt_2d(K3K_F32, T, D, 0)};
    tt_rand(&s[0], -2, 2);
    tt_rand(&s[1], -2, 2);
    tt_rand(&s[2], 0.5, 1.5);
    tt_rand(&s[3], -0.5, 0.5);
    double *w = tt_expect(&s[4], 1e-6, 1e-5);
    for (int64_t t = 0; t < T; t++) {
      double sc[8], v[8][64], mx = -1e300, z = 0;
      for (int j = 0; j <= nb; j++) {
        double ss = 0;
        for (int64_t d = 0; d < D; d++) {
          v[j][d] = j < nb ? tt_get(&s[0], (j * T + t) * D + d) : tt_get(&s[1], t * D + d);
          ss += v[j][d] * v[j][d];
        }
        double r = 1.0 / sqrt(ss / D + 1e-5), acc = 0;
        for (int64_t d = 0; d < D; d++) acc += v[j][d] * r * tt_get(&s[2], d) * tt_get(&s[3], d);
        sc[j] = acc;
        mx = acc > mx ? acc : mx;
      }
      for (int j = 0; j <= nb; j++) z += (sc[j] = exp(sc[j] - mx));
      for (int64_t d = 0; d < D; d++) {
        double acc = 0;
        for (int j = 0; j <= nb; j++) acc += sc[j] / z * v[j][d];
        w[t * D + d] = acc;
      }
    }
    k3k_attn_res_params_t p = {.eps = 1e-5f};
    run_case(nb ? "attn_res_mix nb=3" : "attn_res_mix nb=0", K3K_OP_ATTN_RES_MIX, &p, s, 5, 0);
    for (int i = 0; i < 5; i++) tt_free(&s[i]);
  }
}

static void t_gate(void) {
  for (int form = 0; form < 2; form++) {
    int64_t T = 5, NH = 3, Dh = 8, C = NH * Dh;
    tt_t s[4] = {tt_2d(K3K_BF16, T, C, 0), tt_1d(K3K_F32, 4), tt_1d(K3K_F32, C), tt_2d(K3K_F32, T, C, 0)};
    tt_rand(&s[0], form ? -30 : -3, form ? 30 : 3); /* softplus: cross its threshold 20 */
    tt_rand(&s[1], -1, 1);
    tt_rand(&s[2], -1, 1);
    double *w = tt_expect(&s[3], 1e-6, 2e-5);
    for (int64_t t = 0; t < T; t++)
      for (int64_t c = 0; c < C; c++) {
        double A = exp(tt_get(&s[1], c / Dh)), a = tt_get(&s[0], t * C + c) + tt_get(&s[2], c);
        w[t * C + c] = form ? -A * (a > 20 ? a : log1p(exp(a))) : -5.0 * sigm(A * a);
      }
    k3k_kda_gate_params_t p = {.form = form ? K3K_GATE_SOFTPLUS : K3K_GATE_LOWER_BOUND,
                               .head_dim = (int32_t)Dh, .lower_bound = -5.0f};
    run_case(form ? "kda_gate softplus" : "kda_gate lower_bound", K3K_OP_KDA_GATE, &p, s, 4, 0);
    for (int i = 0; i < 4; i++) tt_free(&s[i]);
  }
}

/* Bad arguments: a clear message naming the op, slot and field; K3_EINVAL from k3k_run. */
static void t_validate(void) {
  float x[12], w[5], y[12];
  k3k_tensor_t tx = k3k_tensor_2d(NULL, K3K_F32, x, 3, 4), tw = k3k_tensor_1d(NULL, K3K_F32, w, 5),
               ty = k3k_tensor_2d(NULL, K3K_F32, y, 3, 4);
  const k3k_tensor_t *t[3] = {&tx, &tw, &ty};
  k3k_rmsnorm_params_t p = {.eps = 1e-5f};
  char err[200] = "";
  int rc = k3k_op_validate(K3K_OP_RMSNORM, &p, t, 3, err, sizeof err);
  check(rc == K3_EINVAL && strstr(err, "rmsnorm") && strstr(err, "t[1] w") && strstr(err, "shape[0]=5"),
        "validate names the bad tensor: '%s'", err);
  check(k3k_rmsnorm(k3k_backend_get("cpu"), &p, &tx, &tw, &ty) == K3_EINVAL, "k3k_run rejects it");
  check(k3k_op_validate(K3K_OP_RMSNORM, &p, t, 2, err, sizeof err) == K3_EINVAL && strstr(err, "2 tensors"),
        "validate checks the tensor count: '%s'", err);
  tw.shape[0] = 4;
  tx.dtype = K3K_I32;
  check(k3k_op_validate(K3K_OP_RMSNORM, &p, t, 3, err, sizeof err) == K3_EINVAL && strstr(err, "dtype i32"),
        "validate checks dtypes: '%s'", err);
  check(k3k_backend_get("no-such-backend") == NULL, "unknown backend is NULL");
}

/* The op tables generated from k3k_ops.def: every op has a distinct name, the list and the
 * enum agree (name by op, op count), and "unknown-op" only outside the range. */
static void t_op_list(void) {
  static const char *const want[] = {
#define K3K_OP_X(ENUM, name, n_tensors) #name,
#include "k3k_ops.def"
#undef K3K_OP_X
  };
  bool ok = sizeof want / sizeof *want == (size_t)K3K_OP_COUNT;
  for (int i = 0; ok && i < K3K_OP_COUNT; i++) {
    ok = strcmp(k3k_op_name((k3k_op_t)i), want[i]) == 0;
    for (int j = 0; ok && j < i; j++) ok = strcmp(want[i], want[j]) != 0;
  }
  ok = ok && strcmp(k3k_op_name(K3K_OP_COUNT), "unknown-op") == 0 &&
       strcmp(k3k_op_name((k3k_op_t)-1), "unknown-op") == 0;
  check(ok, "op list (k3k_ops.def): %d ops, names distinct and in enum order", (int)K3K_OP_COUNT);
}

void t_basic(void) {
  t_op_list();
  t_validate();
  rng_seed(1);
  t_copy_add();
  t_get_rows();
  t_rmsnorm();
  t_gated_l2_sigmoid();
  t_activations();
  t_gemm();
  t_mxfp4();
  t_mix();
  t_gate();
}
