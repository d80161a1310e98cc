/* Cases for MLA: varlen prefill attention with a prefix (non-absorbed form), cache write and
 * gather through scrambled pages, and the absorbed paged decode against the non-absorbed form
 * (in float64, and op against op). Small dims keep it quick under ASan. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { H = 2, DN = 8, DR = 4, DV = 6, CL = 10, PS = 4, NP = 9 };

static void t_prefill(void) {
  int32_t lq[3] = {3, 1, 4}, lk[3] = {3, 5, 9};
  int64_t Tq = 8, Tk = 17;
  tt_t krot_full = tt_2d(K3K_F32, Tk, 20, 0);
  tt_rand(&krot_full, -1, 1);
  tt_t s[6] = {tt_2d(K3K_BF16, Tq, H * (DN + DR), 0), tt_2d(K3K_F32, Tk, H * (DN + DV), 3),
               krot_full, tt_1d(K3K_I32, 4), tt_1d(K3K_I32, 4), tt_2d(K3K_F32, Tq, H * DV, 0)};
  s[2].t = k3k_tensor_slice(&krot_full.t, 1, 16, DR); /* strided column view */
  tt_rand(&s[0], -1, 1);
  tt_rand(&s[1], -1, 1);
  int32_t a = 0, b = 0;
  for (int i = 0; i < 3; i++) {
    tt_seti(&s[3], i, a);
    tt_seti(&s[4], i, b);
    a += lq[i];
    b += lk[i];
  }
  tt_seti(&s[3], 3, a);
  tt_seti(&s[4], 3, b);
  double *w = tt_expect(&s[5], 1e-5, 1e-4), scale = 1.0 / sqrt(DN + DR);
  int32_t q0 = 0, k0 = 0;
  for (int i = 0; i < 3; i++) {
    for (int h = 0; h < H; h++)
      for (int j = 0; j < lq[i]; j++) {
        int nk = lk[i] - lq[i] + j + 1;
        double sc[32], mx = -1e300, z = 0;
        for (int t = 0; t < nk; t++) {
          double acc = 0;
          for (int d = 0; d < DN; d++)
            acc += tt_get(&s[0], (q0 + j) * H * (DN + DR) + h * (DN + DR) + d) *
                   tt_get(&s[1], (k0 + t) * H * (DN + DV) + h * (DN + DV) + d);
          for (int d = 0; d < DR; d++)
            acc += tt_get(&s[0], (q0 + j) * H * (DN + DR) + h * (DN + DR) + DN + d) *
                   tt_get(&s[2], (k0 + t) * DR + d);
          sc[t] = acc * scale;
          mx = fmax(mx, sc[t]);
        }
        for (int t = 0; t < nk; t++) z += (sc[t] = exp(sc[t] - mx));
        for (int e = 0; e < DV; e++) {
          double acc = 0;
          for (int t = 0; t < nk; t++)
            acc += sc[t] / z * tt_get(&s[1], (k0 + t) * H * (DN + DV) + h * (DN + DV) + DN + e);
          w[(q0 + j) * H * DV + h * DV + e] = acc;
        }
      }
    q0 += lq[i];
    k0 += lk[i];
  }
  k3k_mla_params_t p = {.n_seqs = 3, .n_heads = H, .d_nope = DN, .d_rope = DR, .d_v = DV, .kv_lora = CL};
  run_case("mla_prefill varlen with prefix", K3K_OP_MLA_PREFILL, &p, s, 6, 0);
  tt_seti(&s[4], 1, 2); /* sequence 0 now has fewer keys than queries */
  run_case("mla_prefill lk < lq rejected", K3K_OP_MLA_PREFILL, &p, s, 6, K3_EINVAL);
  tt_free(&s[0]), tt_free(&s[1]), tt_free(&krot_full), tt_free(&s[3]), tt_free(&s[4]), tt_free(&s[5]);
}

/* Decode: 3 sequences of lengths 1, 6, 11 in scrambled pages written with MLA_CACHE_WRITE. */
static void t_decode(void) {
  int32_t lens[3] = {1, 6, 11}, T = 18;
  int32_t pages[3][3] = {{7, 0, 0}, {2, 5, 0}, {8, 1, 4}};
  int64_t csh[3] = {NP, PS, CL + DR};
  tt_t cn = tt_2d(K3K_F32, T, CL, 1), kr = tt_2d(K3K_BF16, T, DR, 0), sm = tt_1d(K3K_I32, T);
  tt_t cache = tt_new(K3K_BF16, 3, csh, 0);
  tt_rand(&cn, -1, 1);
  tt_rand(&kr, -1, 1);
  tt_rand(&cache, -1, 1);
  int32_t t = 0;
  for (int i = 0; i < 3; i++)
    for (int tau = 0; tau < lens[i]; tau++, t++) tt_seti(&sm, t, pages[i][tau / PS] * PS + tau % PS);
  tt_seti(&sm, 0, -1); /* skipped token: its row must stay as it was */
  tt_t w[4] = {cn, kr, sm, cache};
  double *wc = tt_expect(&w[3], 0, 0);
  w[3].inout = true;
  for (int64_t e = 0; e < tt_numel(&cache); e++) wc[e] = tt_get(&cache, e);
  for (int tk = 1; tk < T; tk++) {
    int32_t slot = tt_geti(&sm, tk);
    for (int j = 0; j < CL; j++) wc[slot * (CL + DR) + j] = rbf(tt_get(&cn, tk * CL + j));
    for (int j = 0; j < DR; j++) wc[slot * (CL + DR) + CL + j] = tt_get(&kr, tk * DR + j);
  }
  run_case("mla_cache_write scrambled pages", K3K_OP_MLA_CACHE_WRITE, NULL, w, 4, 0);
  cache = w[3];
  cache.want = NULL;
  tt_seti(&sm, 0, pages[0][0] * PS); /* now write token 0 too */
  tt_t w2[4] = {cn, kr, sm, cache};
  check(run_host("cpu", K3K_OP_MLA_CACHE_WRITE, NULL, w2, 4) == 0, "cache write token 0");

  tt_t gy = tt_2d(K3K_F32, T, CL + DR, 0);
  tt_t g[3] = {cache, sm, gy};
  double *wg = tt_expect(&g[2], 0, 0);
  for (int tk = 0; tk < T; tk++)
    for (int j = 0; j < CL + DR; j++) wg[tk * (CL + DR) + j] = tt_get(&cache, tt_geti(&sm, tk) * (CL + DR) + j);
  run_case("mla_cache_gather", K3K_OP_MLA_CACHE_GATHER, NULL, g, 3, 0);

  /* Absorbed decode vs the non-absorbed form in float64. */
  tt_t q = tt_2d(K3K_F32, 3, H * (DN + DR), 0), wkv = tt_2d(K3K_BF16, H * (DN + DV), CL, 0);
  tt_t pt = tt_2d(K3K_I32, 3, 3, 0), sl = tt_1d(K3K_I32, 3), o = tt_2d(K3K_F32, 3, H * DV, 0);
  tt_rand(&q, -1, 1);
  tt_rand(&wkv, -1, 1);
  for (int i = 0; i < 3; i++) {
    tt_seti(&sl, i, lens[i]);
    for (int j = 0; j < 3; j++) tt_seti(&pt, i * 3 + j, pages[i][j]);
  }
  double *wo = tt_expect(&o, 1e-5, 1e-4), scale = 1.0 / sqrt(DN + DR);
  for (int i = 0; i < 3; i++)
    for (int h = 0; h < H; h++) {
      double sc[16], mx = -1e300, z = 0;
      for (int tau = 0; tau < lens[i]; tau++) {
        int64_t row = (int64_t)(pages[i][tau / PS] * PS + tau % PS) * (CL + DR);
        double acc = 0;
        for (int d = 0; d < DN; d++) {
          double kn = 0; /* k_nope = W_UK c_n */
          for (int c = 0; c < CL; c++) kn += tt_get(&wkv, (h * (DN + DV) + d) * CL + c) * tt_get(&cache, row + c);
          acc += tt_get(&q, i * H * (DN + DR) + h * (DN + DR) + d) * kn;
        }
        for (int r = 0; r < DR; r++)
          acc += tt_get(&q, i * H * (DN + DR) + h * (DN + DR) + DN + r) * tt_get(&cache, row + CL + r);
        sc[tau] = acc * scale;
        mx = fmax(mx, sc[tau]);
      }
      for (int tau = 0; tau < lens[i]; tau++) z += (sc[tau] = exp(sc[tau] - mx));
      for (int e = 0; e < DV; e++) {
        double acc = 0;
        for (int tau = 0; tau < lens[i]; tau++) {
          int64_t row = (int64_t)(pages[i][tau / PS] * PS + tau % PS) * (CL + DR);
          double v = 0; /* v = W_UV c_n */
          for (int c = 0; c < CL; c++) v += tt_get(&wkv, (h * (DN + DV) + DN + e) * CL + c) * tt_get(&cache, row + c);
          acc += sc[tau] / z * v;
        }
        wo[i * H * DV + h * DV + e] = acc;
      }
    }
  k3k_mla_params_t p = {.n_seqs = 3, .n_heads = H, .d_nope = DN, .d_rope = DR, .d_v = DV, .kv_lora = CL};
  tt_t d[6] = {q, wkv, cache, pt, sl, o};
  run_case("mla_decode absorbed vs non-absorbed (f64)", K3K_OP_MLA_DECODE, &p, d, 6, 0);

  /* Op vs op: the last query of sequence 2 through MLA_PREFILL on kv = gather·W_kvbᵀ. */
  int32_t base = lens[0] + lens[1];
  tt_t sm2 = tt_1d(K3K_I32, lens[2]), lat = tt_2d(K3K_F32, lens[2], CL + DR, 0);
  for (int tau = 0; tau < lens[2]; tau++) tt_seti(&sm2, tau, tt_geti(&sm, base + tau));
  tt_t gg[3] = {cache, sm2, lat};
  int rc = run_host("cpu", K3K_OP_MLA_CACHE_GATHER, NULL, gg, 3);
  tt_t kv = tt_2d(K3K_F32, lens[2], H * (DN + DV), 0);
  tt_t cnv = lat, krv = lat;
  cnv.t = k3k_tensor_slice(&lat.t, 1, 0, CL);
  krv.t = k3k_tensor_slice(&lat.t, 1, CL, DR);
  tt_t gm[3] = {cnv, wkv, kv};
  rc |= run_host("cpu", K3K_OP_GEMM, NULL, gm, 3);
  tt_t q1 = q, cq = tt_1d(K3K_I32, 2), ck = tt_1d(K3K_I32, 2), o1 = tt_2d(K3K_F32, 1, H * DV, 0);
  q1.t = k3k_tensor_slice(&q.t, 0, 2, 1);
  tt_seti(&cq, 1, 1);
  tt_seti(&ck, 1, lens[2]);
  k3k_mla_params_t p1 = p;
  p1.n_seqs = 1;
  tt_t pf[6] = {q1, kv, krv, cq, ck, o1};
  rc |= run_host("cpu", K3K_OP_MLA_PREFILL, &p1, pf, 6);
  double md = 0;
  for (int e = 0; e < H * DV; e++) md = fmax(md, fabs(tt_get(&o1, e) - tt_get(&d[5], 2 * H * DV + e)));
  check(rc == 0 && md < 1e-4, "mla decode op == prefill op on the same context (max diff %.3g)", md);

  tt_seti(&pt, 4, NP); /* page out of range */
  d[5].want = NULL; /* o keeps (and frees) the expectation */
  run_case("mla_decode bad page", K3K_OP_MLA_DECODE, &p, d, 6, K3_ERANGE);
  tt_free(&cn), tt_free(&kr), tt_free(&sm), tt_free(&cache), tt_free(&gy), tt_free(&q), tt_free(&wkv);
  tt_free(&pt), tt_free(&sl), tt_free(&o), tt_free(&sm2), tt_free(&lat), tt_free(&kv), tt_free(&cq);
  tt_free(&ck), tt_free(&o1);
  free(wc);
  free(wg);
  (void)wo;
}

void t_mla(void) {
  rng_seed(4);
  t_prefill();
  t_decode();
}
