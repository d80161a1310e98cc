/* Cases for the sequence ops: short conv (prefill/step, packed sequences, states), KDA chunked
 * prefill and recurrent step against a float64 recurrence, chunked vs recurrent ops, and the
 * exactness of splitting a prefill at a chunk boundary. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---------------- conv ---------------- */

static void t_conv(void) {
  int32_t lens[4] = {1, 5, 0, 2}, N = 4, C = 7, W = 4, S = 6;
  int32_t slot_of[4] = {4, 0, 2, 5};
  int64_t T = 8;
  for (int rs = 0; rs < 2; rs++) {
    int64_t stsh[3] = {S, C, W - 1};
    tt_t s[6] = {tt_2d(K3K_BF16, T, C, 3), tt_2d(K3K_F32, C, W, 0), tt_1d(K3K_I32, N + 1),
                 tt_1d(K3K_I32, N), tt_new(K3K_F32, 3, stsh, 0), tt_2d(K3K_F32, T, C, 0)};
    tt_rand(&s[0], -2, 2);
    tt_rand(&s[1], -1, 1);
    tt_rand(&s[4], -2, 2);
    s[4].inout = true;
    int32_t cu = 0;
    for (int i = 0; i < N; i++) {
      tt_seti(&s[2], i, cu);
      tt_seti(&s[3], i, slot_of[i]);
      cu += lens[i];
    }
    tt_seti(&s[2], N, cu);
    double *wy = tt_expect(&s[5], 1e-6, 1e-5);
    double *ws = tt_expect(&s[4], 0, 1e-7);
    s[4].inout = true;
    for (int64_t i = 0; i < tt_numel(&s[4]); i++) ws[i] = tt_get(&s[4], i);
    for (int i = 0; i < N; i++) {
      int32_t st = tt_geti(&s[2], i), en = tt_geti(&s[2], i + 1), sl = slot_of[i];
      for (int c = 0; c < C; c++) {
        double xin[64];
        for (int j = 0; j < W - 1; j++)
          xin[j] = rs ? tt_get(&s[4], (sl * C + c) * (W - 1) + j) : 0.0;
        for (int t = st; t < en; t++) xin[W - 1 + t - st] = tt_get(&s[0], t * C + c);
        for (int t = 0; t < en - st; t++) {
          double a = 0;
          for (int j = 0; j < W; j++) a += tt_get(&s[1], c * W + j) * xin[t + j];
          wy[(st + t) * C + c] = a * sigm(a);
        }
        if (en > st)
          for (int j = 0; j < W - 1; j++) ws[(sl * C + c) * (W - 1) + j] = xin[en - st + j];
      }
    }
    k3k_conv_params_t p = {.n_seqs = N, .read_state = rs, .activation = 1};
    run_case(rs ? "conv_prefill with state" : "conv_prefill zero state", K3K_OP_CONV_PREFILL, &p, s, 6, 0);
    if (rs) {
      tt_seti(&s[3], 1, 4); /* duplicate slot */
      free(s[5].want);
      s[5].want = NULL;
      free(ws);
      s[4].want = NULL;
      run_case("conv_prefill duplicate slot", K3K_OP_CONV_PREFILL, &p, s, 6, K3_EINVAL);
    }
    for (int i = 0; i < 6; i++) tt_free(&s[i]);
  }

  /* CONV_STEP against float64 on every backend: 3 sequences in scrambled slots, bf16 state. */
  {
    int64_t sh[3] = {S, C, W - 1};
    tt_t s[5] = {tt_2d(K3K_BF16, 3, C, 1), tt_2d(K3K_BF16, C, W, 0), tt_1d(K3K_I32, 3),
                 tt_new(K3K_BF16, 3, sh, 0), tt_2d(K3K_BF16, 3, C, 0)};
    tt_rand(&s[0], -2, 2);
    tt_rand(&s[1], -1, 1);
    tt_rand(&s[3], -2, 2);
    int32_t sl3[3] = {3, 5, 1};
    double *wy = tt_expect(&s[4], 1e-6, 8e-3), *ws = tt_expect(&s[3], 0, 0);
    s[3].inout = true;
    for (int64_t e = 0; e < tt_numel(&s[3]); e++) ws[e] = tt_get(&s[3], e);
    for (int i = 0; i < 3; i++) {
      tt_seti(&s[2], i, sl3[i]);
      for (int c = 0; c < C; c++) {
        const double *st = ws + (sl3[i] * C + c) * (W - 1);
        double a = tt_get(&s[1], c * W + W - 1) * tt_get(&s[0], i * C + c);
        for (int j = 0; j < W - 1; j++) a += tt_get(&s[1], c * W + j) * st[j];
        wy[i * C + c] = rbf(a * sigm(a));
      }
    }
    for (int i = 0; i < 3; i++)
      for (int c = 0; c < C; c++) {
        double *st = ws + (sl3[i] * C + c) * (W - 1);
        for (int j = 0; j < W - 2; j++) st[j] = st[j + 1];
        st[W - 2] = tt_get(&s[0], i * C + c);
      }
    k3k_conv_params_t p = {.n_seqs = 3, .read_state = 1, .activation = 1};
    run_case("conv_step bf16 state", K3K_OP_CONV_STEP, &p, s, 5, 0);
    for (int i = 0; i < 5; i++) tt_free(&s[i]);
  }

  /* Prefill(5) == prefill(3) + step + step, bit for bit (same sum order, fp32 state). */
  int64_t stsh[3] = {1, C, W - 1};
  tt_t x = tt_2d(K3K_F32, 5, C, 0), w = tt_2d(K3K_F32, C, W, 0);
  tt_rand(&x, -2, 2);
  tt_rand(&w, -1, 1);
  tt_t st1 = tt_new(K3K_F32, 3, stsh, 0), st2 = tt_new(K3K_F32, 3, stsh, 0);
  tt_t y1 = tt_2d(K3K_F32, 5, C, 0), y2 = tt_2d(K3K_F32, 5, C, 0);
  tt_t cu = tt_1d(K3K_I32, 2), sl = tt_1d(K3K_I32, 1);
  tt_seti(&cu, 1, 5);
  k3k_conv_params_t p = {.n_seqs = 1, .read_state = 0, .activation = 1};
  tt_t a[6] = {x, w, cu, sl, st1, y1};
  int rc = run_host("cpu", K3K_OP_CONV_PREFILL, &p, a, 6);
  tt_seti(&cu, 1, 3);
  tt_t xa = x, ya = y2;
  xa.t = k3k_tensor_slice(&x.t, 0, 0, 3);
  ya.t = k3k_tensor_slice(&y2.t, 0, 0, 3);
  tt_t b[6] = {xa, w, cu, sl, st2, ya};
  rc |= run_host("cpu-fast", K3K_OP_CONV_PREFILL, &p, b, 6);
  p.read_state = 1;
  for (int t = 3; t < 5; t++) {
    tt_t xs = x, ys = y2;
    xs.t = k3k_tensor_slice(&x.t, 0, t, 1);
    ys.t = k3k_tensor_slice(&y2.t, 0, t, 1);
    tt_t c[5] = {xs, w, sl, st2, ys};
    rc |= run_host("cpu", K3K_OP_CONV_STEP, &p, c, 5);
  }
  check(rc == 0 && !memcmp(y1.buf, y2.buf, 5 * (size_t)C * 4) && !memcmp(st1.buf, st2.buf, (size_t)C * 3 * 4),
        "conv: prefill(5) == prefill(3) + 2 steps bitwise");
  tt_free(&x), tt_free(&w), tt_free(&st1), tt_free(&st2), tt_free(&y1), tt_free(&y2), tt_free(&cu), tt_free(&sl);
}

/* CONV_PREFILL at channel counts a device backend takes its 16-byte path for (C % 8 == 0): a
 * packed batch long enough that the device splits it into many token ranges, so ranges start
 * inside sequences (window from x rows before the range) and sequences start inside ranges
 * (window from the state), with an empty sequence and sequences shorter than W-1. */
static void conv_fast_case(int64_t C, int W, const int32_t *lens, int N, k3k_dtype_t ydt,
                           k3k_dtype_t sdt, int rs) {
  int64_t T = 0;
  for (int i = 0; i < N; i++) T += lens[i];
  const int64_t S = N + 3;
  int64_t stsh[3] = {S, C, W - 1};
  tt_t s[6] = {tt_2d(K3K_BF16, T, C, 0), tt_2d(K3K_F32, C, W, 0), tt_1d(K3K_I32, N + 1),
               tt_1d(K3K_I32, N), tt_new(sdt, 3, stsh, 0), tt_2d(ydt, T, C, 0)};
  tt_rand(&s[0], -2, 2);
  tt_rand(&s[1], -1, 1);
  tt_rand(&s[4], -2, 2);
  int32_t cu = 0;
  for (int i = 0; i < N; i++) {
    tt_seti(&s[2], i, cu);
    tt_seti(&s[3], i, (int32_t)(S - 1 - 2 * i % S)); /* scrambled, distinct (S odd vs 2i) */
    cu += lens[i];
  }
  tt_seti(&s[2], N, cu);
  /* F32 y: fp32 sums of W terms |w·x| <= 2 against float64, plus the fast SiLU's ulps */
  double *wy = ydt == K3K_BF16 ? tt_expect(&s[5], 1e-6, tol_rel(K3K_BF16)) : tt_expect(&s[5], 1e-5, 1e-5);
  double *ws = tt_expect(&s[4], 0, 0);
  s[4].inout = true;
  for (int64_t i = 0; i < tt_numel(&s[4]); i++) ws[i] = tt_get(&s[4], i);
  double *xin = malloc((size_t)(T + W) * sizeof *xin);
  for (int i = 0; i < N; i++) {
    int32_t st = tt_geti(&s[2], i), en = tt_geti(&s[2], i + 1), sl = tt_geti(&s[3], i);
    for (int64_t c = 0; c < C; c++) {
      for (int j = 0; j < W - 1; j++) xin[j] = rs ? tt_get(&s[4], (sl * C + c) * (W - 1) + j) : 0.0;
      for (int t = st; t < en; t++) xin[W - 1 + t - st] = tt_get(&s[0], t * C + c);
      for (int t = 0; t < en - st; t++) {
        double a = 0;
        for (int j = 0; j < W; j++) a += tt_get(&s[1], c * W + j) * xin[t + j];
        wy[(st + t) * C + c] = ydt == K3K_BF16 ? rbf(a * sigm(a)) : a * sigm(a);
      }
      if (en > st)
        for (int j = 0; j < W - 1; j++) {
          double v = xin[en - st + j]; /* a raw bf16 input or a state value: exact in sdt */
          ws[(sl * C + c) * (W - 1) + j] = v;
        }
    }
  }
  free(xin);
  char name[128];
  snprintf(name, sizeof name, "conv_prefill C=%lld W=%d T=%lld ->%s state %s%s", (long long)C, W,
           (long long)T, k3k_dtype_name(ydt), k3k_dtype_name(sdt), rs ? "" : " zero start");
  k3k_conv_params_t p = {.n_seqs = N, .read_state = rs, .activation = 1};
  run_case(name, K3K_OP_CONV_PREFILL, &p, s, 6, 0);
  for (int i = 0; i < 6; i++) tt_free(&s[i]);
}

static void t_conv_fast(void) {
  static const int32_t lens[] = {1, 70, 0, 129, 3, 97};
  const int N = (int)(sizeof lens / sizeof lens[0]);
  conv_fast_case(24, 4, lens, N, K3K_BF16, K3K_BF16, 1);
  conv_fast_case(24, 4, lens, N, K3K_F32, K3K_F32, 0);
  conv_fast_case(16, 2, lens, N, K3K_F32, K3K_BF16, 1);
  conv_fast_case(8, 8, lens, N, K3K_BF16, K3K_F32, 1);
  conv_fast_case(16, 5, lens, N, K3K_F32, K3K_F32, 1);
}

/* ---------------- KDA ---------------- */

enum { H = 2, DK = 16, DV = 12, NSLOT = 8 };

typedef struct {
  int n;
  int32_t lens[8];
  int64_t T;
  tt_t q, k, v, g, beta;
} kda_in_t;

static void l2rows(tt_t *x, int64_t T) {
  for (int64_t t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      double ss = 0;
      for (int d = 0; d < DK; d++) ss += pow(tt_get(x, t * H * DK + h * DK + d), 2);
      for (int d = 0; d < DK; d++)
        tt_set(x, t * H * DK + h * DK + d, tt_get(x, t * H * DK + h * DK + d) / sqrt(ss + 1e-6));
    }
}

static kda_in_t kda_inputs(const int32_t *lens, int n, k3k_dtype_t dt) {
  kda_in_t in = {.n = n};
  for (int i = 0; i < n; i++) in.T += (in.lens[i] = lens[i]);
  in.q = tt_2d(dt, in.T, H * DK, 0);
  in.k = tt_2d(dt, in.T, H * DK, 2);
  in.v = tt_2d(dt, in.T, H * DV, 0);
  in.g = tt_2d(K3K_F32, in.T, H * DK, 0);
  in.beta = tt_2d(K3K_F32, in.T, H, 0);
  tt_rand(&in.q, -1, 1);
  tt_rand(&in.k, -1, 1);
  l2rows(&in.q, in.T);
  l2rows(&in.k, in.T);
  tt_rand(&in.v, -1, 1);
  for (int64_t i = 0; i < tt_numel(&in.g); i++) /* mostly mild decay, some at the −5 bound */
    tt_set(&in.g, i, (rng_u32() % 8 == 0) ? rng_uniform(-5.0, -4.0) : rng_uniform(-0.6, -0.001));
  tt_rand(&in.beta, 0.05, 1.0);
  return in;
}

static void kda_free(kda_in_t *in) {
  tt_free(&in->q), tt_free(&in->k), tt_free(&in->v), tt_free(&in->g), tt_free(&in->beta);
}

/* float64 recurrence (§3.6) over packed sequences; state V-first; returns o and final pool. */
static void kda_want(const kda_in_t *in, const int32_t *slots, int read_state, const tt_t *pool,
                     double *wo, double *wst) {
  double scale = 1.0 / sqrt((double)DK);
  for (int64_t i = 0; i < tt_numel(pool); i++) wst[i] = tt_get(pool, i);
  int64_t t0 = 0;
  for (int i = 0; i < in->n; i++) {
    for (int h = 0; h < H; h++) {
      double S[DK][DV];
      double *ps = wst + ((int64_t)slots[i] * H + h) * DV * DK;
      for (int kk = 0; kk < DK; kk++)
        for (int vv = 0; vv < DV; vv++) S[kk][vv] = read_state ? ps[vv * DK + kk] : 0.0;
      if (in->lens[i] == 0) continue;
      for (int64_t t = t0; t < t0 + in->lens[i]; t++) {
        double kv[DK], qv[DK], u[DV], b = tt_get(&in->beta, t * H + h);
        for (int d = 0; d < DK; d++) {
          kv[d] = tt_get(&in->k, t * H * DK + h * DK + d);
          qv[d] = tt_get(&in->q, t * H * DK + h * DK + d) * scale;
          double a = exp(tt_get(&in->g, t * H * DK + h * DK + d));
          for (int e = 0; e < DV; e++) S[d][e] *= a;
        }
        for (int e = 0; e < DV; e++) {
          double acc = 0;
          for (int d = 0; d < DK; d++) acc += S[d][e] * kv[d];
          u[e] = tt_get(&in->v, t * H * DV + h * DV + e) - acc;
        }
        for (int d = 0; d < DK; d++)
          for (int e = 0; e < DV; e++) S[d][e] += b * kv[d] * u[e];
        for (int e = 0; e < DV; e++) {
          double acc = 0;
          for (int d = 0; d < DK; d++) acc += S[d][e] * qv[d];
          wo[t * H * DV + h * DV + e] = acc;
        }
      }
      for (int kk = 0; kk < DK; kk++)
        for (int vv = 0; vv < DV; vv++) ps[vv * DK + kk] = S[kk][vv];
    }
    t0 += in->lens[i];
  }
}

static void kda_chunk_case(const char *name, const int32_t *lens, int n, int read_state,
                           k3k_dtype_t dt) {
  kda_in_t in = kda_inputs(lens, n, dt);
  int32_t slots[8] = {5, 0, 7, 2, 3, 6, 1, 4};
  int64_t psh[4] = {NSLOT, H, DV, DK};
  tt_t s[9] = {in.q, in.k, in.v, in.g, in.beta, tt_1d(K3K_I32, n + 1), tt_1d(K3K_I32, n),
               tt_new(K3K_F32, 4, psh, 0), tt_2d(dt, in.T, H * DV, 0)};
  int32_t cu = 0;
  for (int i = 0; i < n; i++) {
    tt_seti(&s[5], i, cu);
    tt_seti(&s[6], i, slots[i]);
    cu += lens[i];
  }
  tt_seti(&s[5], n, cu);
  tt_rand(&s[7], -0.5, 0.5);
  double *wst = tt_expect(&s[7], 2e-4, 2e-3);
  s[7].inout = true;
  double *wo = tt_expect(&s[8], 2e-4, dt == K3K_BF16 ? 1e-2 : 2e-3);
  kda_want(&in, slots, read_state, &s[7], wo, wst);
  k3k_kda_params_t p = {.n_seqs = n, .n_heads = H, .read_state = read_state};
  run_case(name, K3K_OP_KDA_CHUNK, &p, s, 9, 0);

  for (int i = 5; i < 9; i++) tt_free(&s[i]);
  kda_free(&in);
}

/* Row range [r0, r0+n) of a 2-D host tensor as a view sharing its buffer. */
static tt_t rows(const tt_t *x, int64_t r0, int64_t n) {
  tt_t v = *x;
  v.want = NULL;
  v.t = k3k_tensor_slice(&x->t, 0, r0, n);
  return v;
}

/* Chunked op vs recurrent op (token by token) on the same packed data and incoming states, and
 * a prefill split at a chunk boundary vs one shot (bit-identical by construction). */
static void kda_chunk_vs_step(const int32_t *lens, int n, int rs) {
  kda_in_t in = kda_inputs(lens, n, K3K_F32);
  int64_t psh[4] = {NSLOT, H, DV, DK};
  tt_t pa = tt_new(K3K_F32, 4, psh, 0), pb = tt_new(K3K_F32, 4, psh, 0);
  tt_rand(&pa, -0.5, 0.5);
  memcpy(pb.buf, pa.buf, pa.bytes);
  tt_t oa = tt_2d(K3K_F32, in.T, H * DV, 0), ob = tt_2d(K3K_F32, in.T, H * DV, 0);
  tt_t cu = tt_1d(K3K_I32, n + 1), sl = tt_1d(K3K_I32, n), sl1 = tt_1d(K3K_I32, 1);
  int32_t c = 0;
  for (int i = 0; i < n; i++) {
    tt_seti(&cu, i, c);
    tt_seti(&sl, i, (i * 3) % NSLOT);
    c += lens[i];
  }
  tt_seti(&cu, n, c);
  k3k_kda_params_t p = {.n_seqs = n, .n_heads = H, .read_state = rs};
  tt_t a[9] = {in.q, in.k, in.v, in.g, in.beta, cu, sl, pa, oa};
  int rc = run_host("cpu", K3K_OP_KDA_CHUNK, &p, a, 9);
  int64_t t0 = 0;
  for (int i = 0; i < n; i++) {
    tt_seti(&sl1, 0, (i * 3) % NSLOT);
    for (int64_t t = t0; t < t0 + lens[i]; t++) {
      k3k_kda_params_t ps = {.n_seqs = 1, .n_heads = H, .read_state = (t == t0) ? rs : 1};
      tt_t b[8] = {rows(&in.q, t, 1), rows(&in.k, t, 1), rows(&in.v, t, 1), rows(&in.g, t, 1),
                   rows(&in.beta, t, 1), sl1, pb, rows(&ob, t, 1)};
      rc |= run_host("cpu", K3K_OP_KDA_STEP, &ps, b, 8);
    }
    t0 += lens[i];
  }
  double md = 0, ms = 0;
  for (int64_t e = 0; e < tt_numel(&oa); e++) md = fmax(md, fabs(tt_get(&oa, e) - tt_get(&ob, e)));
  for (int64_t e = 0; e < tt_numel(&pa); e++) ms = fmax(ms, fabs(tt_get(&pa, e) - tt_get(&pb, e)));
  check(rc == 0 && md < 2e-4 && ms < 2e-4, "kda chunk vs recurrent op (n=%d, state=%d): max |do| %.3g |dS| %.3g",
        n, rs, md, ms);
  tt_free(&pa), tt_free(&pb), tt_free(&oa), tt_free(&ob), tt_free(&cu), tt_free(&sl), tt_free(&sl1);
  kda_free(&in);
}

static void kda_split_exact(int rs) {
  const int32_t len = 130;
  kda_in_t in = kda_inputs(&len, 1, K3K_F32);
  int64_t psh[4] = {1, H, DV, DK};
  tt_t pa = tt_new(K3K_F32, 4, psh, 0), pb = tt_new(K3K_F32, 4, psh, 0);
  tt_rand(&pa, -0.5, 0.5);
  memcpy(pb.buf, pa.buf, pa.bytes);
  tt_t oa = tt_2d(K3K_F32, len, H * DV, 0), ob = tt_2d(K3K_F32, len, H * DV, 0);
  tt_t cu = tt_1d(K3K_I32, 2), sl = tt_1d(K3K_I32, 1);
  tt_seti(&cu, 1, len);
  k3k_kda_params_t p = {.n_seqs = 1, .n_heads = H, .read_state = rs};
  tt_t a[9] = {in.q, in.k, in.v, in.g, in.beta, cu, sl, pa, oa};
  int rc = run_host("cpu", K3K_OP_KDA_CHUNK, &p, a, 9);
  int64_t cuts[3] = {0, 64, len};
  for (int part = 0; part < 2; part++) {
    int64_t r0 = cuts[part], nr = cuts[part + 1] - r0;
    tt_seti(&cu, 1, (int32_t)nr);
    p.read_state = part ? 1 : rs;
    tt_t b[9] = {rows(&in.q, r0, nr), rows(&in.k, r0, nr), rows(&in.v, r0, nr), rows(&in.g, r0, nr),
                 rows(&in.beta, r0, nr), cu, sl, pb, rows(&ob, r0, nr)};
    rc |= run_host("cpu-fast", K3K_OP_KDA_CHUNK, &p, b, 9);
  }
  check(rc == 0 && !memcmp(oa.buf, ob.buf, oa.bytes) && !memcmp(pa.buf, pb.buf, pa.bytes),
        "kda prefill(130) == prefill(64) + prefill(66) bitwise (state=%d)", rs);
  tt_free(&pa), tt_free(&pb), tt_free(&oa), tt_free(&ob), tt_free(&cu), tt_free(&sl);
  kda_free(&in);
}

static void kda_step_case(void) {
  const int32_t ones[3] = {1, 1, 1};
  kda_in_t in = kda_inputs(ones, 3, K3K_BF16);
  int32_t slots[3] = {6, 1, 3};
  int64_t psh[4] = {NSLOT, H, DV, DK};
  tt_t s[8] = {in.q, in.k, in.v, in.g, in.beta, tt_1d(K3K_I32, 3), tt_new(K3K_F32, 4, psh, 0),
               tt_2d(K3K_F32, 3, H * DV, 0)};
  for (int i = 0; i < 3; i++) tt_seti(&s[5], i, slots[i]);
  tt_rand(&s[6], -0.5, 0.5);
  double *wst = tt_expect(&s[6], 1e-5, 1e-4);
  s[6].inout = true;
  double *wo = tt_expect(&s[7], 1e-5, 1e-4);
  kda_want(&in, slots, 1, &s[6], wo, wst);
  k3k_kda_params_t p = {.n_seqs = 3, .n_heads = H, .read_state = 1};
  run_case("kda_step batch of 3", K3K_OP_KDA_STEP, &p, s, 8, 0);
  for (int i = 5; i < 8; i++) tt_free(&s[i]);
  kda_free(&in);
}

static void t_kda(void) {
  const int32_t all[6] = {1, 3, 63, 64, 65, 130};
  for (int rs = 0; rs < 2; rs++) {
    char name[96];
    for (int i = 0; i < 6; i++) {
      snprintf(name, sizeof name, "kda_chunk T=%d %s", all[i], rs ? "with state" : "zero state");
      kda_chunk_case(name, &all[i], 1, rs, K3K_F32);
    }
    snprintf(name, sizeof name, "kda_chunk packed {1,3,63,64,65,130} %s", rs ? "with state" : "zero state");
    kda_chunk_case(name, all, 6, rs, K3K_F32);
  }
  const int32_t mix[3] = {70, 0, 5};
  kda_chunk_case("kda_chunk bf16 io, empty sequence", mix, 3, 1, K3K_BF16);
  kda_chunk_vs_step(all, 6, 0);
  kda_chunk_vs_step(all, 6, 1);
  kda_split_exact(0);
  kda_split_exact(1);
  kda_step_case();
}

void t_seq(void) {
  rng_seed(3);
  t_conv();
  t_conv_fast();
  t_kda();
}
