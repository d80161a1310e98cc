/* Real-shape cases of the MLA ops (test_kernels --real, real.c): MLA_CACHE_WRITE and
 * MLA_CACHE_GATHER of c_n | k_rot rows (576 wide, pages of 64, scrambled slots); MLA_DECODE
 * (absorbed, paged) at K3's 96 heads and the 48B's 32, heads that are not multiples of 48
 * (48, 80), page sizes 64 / 16 / 8 (runs inside a page) / 7 (the mma.sync kernel) / 128 (two
 * tiles), sequences of 0 to 5100 tokens, rope spikes that move the running max in a late tile,
 * and the refused calls (a page id past the pool, a seq_len past the page table: nothing
 * written); MLA_PREFILL (non-absorbed, causal bottom-right) with one sequence of T tokens,
 * a prefix (chunked prefill), ragged sequences with an empty one and an F32 output, 96 heads,
 * and the refused metadata (Lk < Lq, cu_k past the rows). Ported from k3k-gpu-check
 * (gpu_parity.c, gpu_mla.c: the cases of the service path; the ones forcing a kernel variant
 * through k3k_cuda_mla_probe stay there).
 * Tolerances: the model's (tolerance.c); the cache ops are exact; MLA_PREFILL's output 1e-2
 * whatever its dtype: the device rounds p to bf16 for the P.V tensor-core product (2^-9
 * relative per term, averaging out over keys). */
#include <stdlib.h>
#include <string.h>

#include "real.h"

static void cache_case(int64_t T) {
  const int64_t ps = 64, pages = (T + ps - 1) / ps + 2, sh[3] = {pages, ps, 576};
  tt_t w[4] = {tt_2d(K3K_BF16, T, 512, 0), tt_2d(K3K_BF16, T, 64, 0), tt_1d(K3K_I32, T),
               tt_new(K3K_BF16, 3, sh, 0)};
  tt_rand(&w[0], -1, 1), tt_rand(&w[1], -1, 1), tt_rand(&w[3], -1, 1);
  for (int64_t i = 0; i < T; i++) tt_seti(&w[2], i, (int32_t)(pages * ps - 1 - i));
  real_inout(&w[3], TOL_EXACT);
  char name[96];
  snprintf(name, sizeof name, "mla_cache_write T=%lld", (long long)T);
  fused_check(name, K3K_OP_MLA_CACHE_WRITE, NULL, w, 4, NULL, NULL);
  tt_t g[3] = {w[3], w[2], tt_2d(K3K_BF16, T, 576, 0)};
  g[0].out = g[0].inout = false;
  real_out(&g[2], TOL_EXACT);
  snprintf(name, sizeof name, "mla_cache_gather T=%lld", (long long)T);
  fused_check(name, K3K_OP_MLA_CACHE_GATHER, NULL, g, 3, NULL, NULL);
  tt_free(&g[2]);
  tt_free_all(w, 4);
}

/* spike: the token at len - 70 of every sequence of len >= 100 gets rope dims of +-24, so some
 * heads' scores jump far above the running max in a late tile (the exact rescale path) and
 * others land a few units above it (the lazy path's P > 1). */
static void decode_case(int n, const int32_t *lens, int64_t NH, int64_t ps, bool spike) {
  int64_t maxp = 0, pages = 0;
  for (int i = 0; i < n; i++) {
    const int64_t pg = (lens[i] + ps - 1) / ps;
    if (pg > maxp) maxp = pg;
    pages += pg;
  }
  if (maxp == 0) maxp = 1;
  pages += 3;
  const int64_t sh[3] = {pages, ps, 576};
  tt_t s[6] = {tt_2d(K3K_BF16, n, NH * 192, 0), tt_2d(K3K_BF16, NH * 256, 512, 0),
               tt_new(K3K_BF16, 3, sh, 0),     tt_2d(K3K_I32, n, maxp, 0),
               tt_1d(K3K_I32, n),              tt_2d(K3K_BF16, n, NH * 128, 0)};
  tt_rand(&s[0], -1, 1), tt_rand(&s[1], -0.1, 0.1), tt_rand(&s[2], -1, 1), real_out(&s[5], 0);
  int64_t next = 0; /* pages handed out in a scrambled order (identity when 5 divides pages) */
  for (int i = 0; i < n; i++) {
    tt_seti(&s[4], i, lens[i]);
    for (int64_t j = 0; j < maxp; j++, next++)
      tt_seti(&s[3], i * maxp + j, (int32_t)(pages % 5 ? (next * 5 + 2) % pages : next % pages));
  }
  for (int i = 0; spike && i < n; i++) {
    if (lens[i] < 100) continue;
    const int64_t t = lens[i] - 70, id = tt_geti(&s[3], i * maxp + t / ps);
    for (int d = 512; d < 576; d++)
      tt_set(&s[2], (id * ps + t % ps) * 576 + d, rng_uniform(-1, 1) < 0 ? -24 : 24);
  }
  const k3k_mla_params_t p = {n, (int32_t)NH, 128, 64, 128, 512, 1, 0, 0.0f};
  char name[160];
  int off = snprintf(name, sizeof name, "mla_decode%s NH=%lld ps=%lld lens=", spike ? " spike" : "",
                     (long long)NH, (long long)ps);
  for (int i = 0; i < n && off < 120; i++)
    off += snprintf(name + off, sizeof name - (size_t)off, "%s%d", i ? "," : "", lens[i]);
  fused_check(name, K3K_OP_MLA_DECODE, &p, s, 6, NULL, NULL);
  if (lens[0] > 0) {
    char nm[200];
    const int32_t p0 = tt_geti(&s[3], 0);
    tt_seti(&s[3], 0, (int32_t)pages);
    snprintf(nm, sizeof nm, "%s bad page id", name);
    op_check_err(nm, K3K_OP_MLA_DECODE, &p, s, 6, K3_ERANGE);
    tt_seti(&s[3], 0, p0);
    tt_seti(&s[4], 0, (int32_t)(maxp * ps + 1));
    snprintf(nm, sizeof nm, "%s seq_len past the table", name);
    op_check_err(nm, K3K_OP_MLA_DECODE, &p, s, 6, K3_ERANGE);
  }
  tt_free_all(s, 6);
}

static void prefill_case(int n, const int32_t *lq, const int32_t *lk, int64_t NH,
                         k3k_dtype_t odt, bool bad) {
  int64_t Tq = 0, Tk = 0;
  for (int i = 0; i < n; i++) Tq += lq[i], Tk += lk[i];
  const int64_t Rq = Tq ? Tq : 1, Rk = Tk ? Tk : 1;
  tt_t s[6] = {tt_2d(K3K_BF16, Rq, NH * 192, 0), tt_2d(K3K_BF16, Rk, NH * 256, 0),
               tt_2d(K3K_BF16, Rk, 64, 0),       tt_1d(K3K_I32, n + 1),
               tt_1d(K3K_I32, n + 1),            tt_2d(odt, Rq, NH * 128, 0)};
  tt_rand(&s[0], -1, 1), tt_rand(&s[1], -1, 1), tt_rand(&s[2], -1, 1);
  real_out(&s[5], TOL_BF16);
  int64_t aq = 0, ak = 0;
  for (int i = 0; i < n; i++) {
    aq += lq[i], ak += lk[i];
    tt_seti(&s[3], i + 1, (int32_t)aq), tt_seti(&s[4], i + 1, (int32_t)ak);
  }
  const k3k_mla_params_t p = {n, (int32_t)NH, 128, 64, 128, 512, 0, 0, 0.0f};
  char name[200];
  int off = snprintf(name, sizeof name, "mla_prefill NH=%lld o=%s lq/lk=", (long long)NH,
                     k3k_dtype_name(odt));
  for (int i = 0; i < n && off < 150; i++)
    off += snprintf(name + off, sizeof name - (size_t)off, "%s%d/%d", i ? "," : "", lq[i], lk[i]);
  if (!bad) {
    fused_check(name, K3K_OP_MLA_PREFILL, &p, s, 6, NULL, NULL);
  } else { /* sequence 0 with Lk < Lq, then cu_k past the rows */
    char nm[240];
    tt_seti(&s[4], 1, lq[0] - 1);
    snprintf(nm, sizeof nm, "%s Lk < Lq", name);
    op_check_err(nm, K3K_OP_MLA_PREFILL, &p, s, 6, K3_EINVAL);
    tt_seti(&s[4], 1, lk[0]);
    tt_seti(&s[4], n, (int32_t)(Tk + 1));
    snprintf(nm, sizeof nm, "%s cu_k past the rows", name);
    op_check_err(nm, K3K_OP_MLA_PREFILL, &p, s, 6, K3_ERANGE);
  }
  tt_free_all(s, 6);
}

static void decode_cases(void) {
  static const int32_t l1[] = {1}, l2[] = {63, 64, 65, 1000, 1}, l3[] = {1000, 0, 130};
  decode_case(1, l1, 48, 64, false);
  decode_case(5, l2, 96, 64, false);
  decode_case(3, l3, 96, 64, false);
  decode_case(5, l2, 96, 7, false); /* the mma.sync kernel */
  decode_case(5, l2, 96, 64, true);
  decode_case(3, l3, 80, 16, true); /* two head groups, the second partial */
  if (g_quick) return;
  /* page sizes 16 and 8 (TMA runs inside a page), 128 (2 tiles) */
  decode_case(5, l2, 96, 16, false);
  decode_case(3, l3, 48, 8, false);
  decode_case(3, l3, 96, 128, false);
  decode_case(3, l3, 96, 16, true);
  /* the 48B's 32 heads at page sizes 64 and 8 */
  decode_case(5, l2, 32, 64, false);
  decode_case(1, l1, 32, 8, false);
  int32_t l4[64], l5[16];
  for (int i = 0; i < 64; i++) l4[i] = 1 + (i * 997) % 2048;
  decode_case(64, l4, 96, 64, false);
  /* long splits (tens of tiles per block) with spikes in late tiles, page sizes 64 and 16 */
  for (int i = 0; i < 16; i++) l5[i] = 2500 + (i * 331) % 2600;
  decode_case(16, l5, 96, 64, true);
  decode_case(16, l5, 96, 16, true);
}

static void prefill_cases(void) {
  for (int i = 0; i < g_real_nT; i++) {
    const int32_t T = (int32_t)g_real_T[i];
    prefill_case(1, &T, &T, 2, K3K_BF16, false);
  }
  static const int32_t pq[] = {65}, pk[] = {200}; /* prefix: the chunk is the last Lq of Lk */
  prefill_case(1, pq, pk, 4, K3K_BF16, false);
  static const int32_t rq[] = {63, 1, 0, 130, 129}, rk[] = {63, 100, 5, 300, 129};
  prefill_case(5, rq, rk, 3, K3K_F32, false); /* ragged, an empty sequence, prefixes, F32 out */
  static const int32_t hq[] = {65, 17}, hk[] = {65, 80};
  prefill_case(2, hq, hk, 96, K3K_BF16, false); /* real head count */
  static const int32_t eq[] = {10, 5}, ek[] = {20, 5};
  prefill_case(2, eq, ek, 2, K3K_BF16, true);
}

void real_mla(void) {
  rng_seed(3004);
  for (int i = 0; i < g_real_nT; i++) cache_case(g_real_T[i]);
  decode_cases();
  prefill_cases();
}
