/* The MLA_DECODE kernel variants (kernels/cuda/mla.cu, mla_decode_wg.cu) that only a forced
 * path reaches, against the reference backend, inside k3k-gpu-check (CUDA internals).
 *
 * What it is for: k3k_cuda_mla_probe forces the split-S form (32768), the far L2 prefetch
 * (16384), S queued behind P.V (2048, the order of sessions 3-16) and the fallback path that
 * K3PD_MLA_DECODE_OLD=1 selects (4096 | 8192 | 2048), each over
 * partial tiles, page sizes 64 / 16 / 8, head groups that are not multiples of 48 and late-tile
 * score spikes, plus the refused calls (page id past the pool, seq_len past the table: K3_ERANGE
 * and the output untouched) on that path.
 * What it is not: the op's parity on the service path (probe 0): test_kernels --real
 * (tests/kernels/real_mla.c) runs those cases, MLA_PREFILL's and the cache ops' through the op
 * API with the one tolerance model.
 * Tolerance TOL_BF16 (1e-2 relative Frobenius with gpair_check's magnitude floor): the kernels
 * round q_lat, p and o_lat to bf16 for the tensor cores (~3 more 2^-9 terms than the bf16
 * output's own rounding); an indexing error gives O(1). */
#include <stdio.h>
#include <string.h>

#include "gpu_util.h"
#include "k3k_cuda_ops.h"
#include "k3pd/err.h"

#define TOL_BF16 1e-2

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define NEW(p, dt, nd, ...)                                        \
  do {                                                             \
    if (gpair_new(g, &(p), (dt), (nd), SH(__VA_ARGS__))) goto out; \
  } while (0)

/* spike: the token at len - 70 of every sequence of len >= 100 gets rope dims of +-24 (sign
 * from the RNG), so some heads' scores jump far above the running max in a late tile (the
 * Hopper kernel's exact rescale path) and others land a few units above it (the lazy path's
 * P > 1). */
/* probe: k3k_cuda_mla_probe bits for this case (0: the service path; 4096 | 8192 | 2048: the
 * path that K3PD_MLA_DECODE_OLD=1 selects, kept as fallback). */
static void t_mla_decode(gctx *g, int n, const int32_t *lens, int64_t NH, int64_t ps,
                         int spike, int probe) {
  int64_t maxp = 0, pages = 0;
  for (int i = 0; i < n; i++) {
    int64_t pg = (lens[i] + ps - 1) / ps;
    if (pg > maxp) maxp = pg;
    pages += pg;
  }
  if (maxp == 0) maxp = 1;
  pages += 3;
  gpair q = {0}, w = {0}, cache = {0}, pt = {0}, sl = {0}, o = {0};
  char what[160];
  int off = snprintf(what, sizeof what, "mla_decode%s%s NH=%lld ps=%lld lens=",
                     spike ? " spike" : "",
                     probe == 16384             ? " far-prefetch"
                     : probe == 32768           ? " split-S"
                     : probe == (32768 | 16384) ? " split-S far-prefetch"
                     : probe == 2048            ? " ordered"
                     : probe                    ? " old-path"
                                                : "",
                     (long long)NH, (long long)ps);
  for (int i = 0; i < n && off < 120; i++) off += snprintf(what + off, sizeof what - off, "%s%d", i ? "," : "", lens[i]);
  NEW(q, K3K_BF16, 2, n, NH * 192);
  NEW(w, K3K_BF16, 2, NH * 256, 512);
  NEW(cache, K3K_BF16, 3, pages, ps, 576);
  NEW(pt, K3K_I32, 2, n, maxp);
  NEW(sl, K3K_I32, 1, n);
  NEW(o, K3K_BF16, 2, n, NH * 128);
  gpair_rand(g, &q, -1, 1), gpair_rand(g, &w, -0.1f, 0.1f), gpair_rand(g, &cache, -1, 1);
  /* pages handed out in a scrambled order */
  int64_t next = 0;
  for (int i = 0; i < n; i++) {
    gpair_host_set(&sl, i, (float)lens[i]);
    for (int64_t j = 0; j < maxp; j++) {
      int64_t id = (next * 5 + 2) % pages;
      gpair_host_set(&pt, i * maxp + j, (float)id);
      next++;
    }
  }
  if (pages % 5 == 0) /* keep ids distinct: fall back to identity order */
    for (int64_t i = 0; i < n * maxp; i++) gpair_host_set(&pt, i, (float)(i % pages));
  for (int i = 0; spike && i < n; i++) {
    if (lens[i] < 100) continue;
    int64_t t = lens[i] - 70, id = (int64_t)gpair_host_get(&pt, i * maxp + t / ps);
    for (int d = 512; d < 576; d++)
      gpair_host_set(&cache, (id * ps + t % ps) * 576 + d, g_rand_unif(g, -1, 1) < 0 ? -24 : 24);
  }
  if (spike) gpair_upload(g, &cache);
  gpair_upload(g, &sl), gpair_upload(g, &pt);
  gpair_poison(g, &o);
  k3k_mla_params_t p = {n, (int32_t)NH, 128, 64, 128, 512, 1, 0, 0.0f};
  gpair *a[] = {&q, &w, &cache, &pt, &sl, &o};
  k3k_cuda_mla_probe(probe);
  int rrc = g_run2(g, K3K_OP_MLA_DECODE, &p, a, 6, what);
  k3k_cuda_mla_probe(0);
  if (!rrc) gpair_check(g, &o, TOL_BF16, what);
  if (lens[0] > 0) {
    /* Rejected calls on the device (the page check's flag gates the kernels): a used page id
     * past the pool and a seq_len past the page table -> K3_ERANGE, output untouched. */
    const k3k_tensor_t *td[] = {&q.d, &w.d, &cache.d, &pt.d, &sl.d, &o.d};
    gpair_poison(g, &o);
    int32_t p0 = (int32_t)gpair_host_get(&pt, 0);
    gpair_host_set(&pt, 0, (float)pages);
    gpair_upload(g, &pt);
    int rc1 = k3k_run(g->cuda, K3K_OP_MLA_DECODE, &p, td, 6);
    gpair_host_set(&pt, 0, (float)p0);
    gpair_upload(g, &pt);
    gpair_host_set(&sl, 0, (float)(maxp * ps + 1));
    gpair_upload(g, &sl);
    int rc2 = k3k_run(g->cuda, K3K_OP_MLA_DECODE, &p, td, 6);
    gpair_host_set(&sl, 0, (float)lens[0]);
    gpair_upload(g, &sl);
    int rc = g->cuda->synchronize(g->cuda);
    bool untouched = rc == 0;
    unsigned char *hb = (unsigned char *)o.h.data;
    if (untouched && g->cuda->copy_to_host(g->cuda, hb, o.d.data, o.bytes)) untouched = false;
    for (size_t i = 0; untouched && i < o.bytes; i++) untouched = hb[i] == 0xFF;
    g_record(g, rc1 == K3_ERANGE && rc2 == K3_ERANGE && untouched,
             "%s: bad page id -> %s, seq_len past the table -> %s, output %s", what,
             k3_errname(rc1), k3_errname(rc2), untouched ? "untouched" : "WRITTEN");
  }
out:
  gpair_free(g, &q), gpair_free(g, &w), gpair_free(g, &cache), gpair_free(g, &pt);
  gpair_free(g, &sl), gpair_free(g, &o);
}

void gpu_mla_path_cases(gctx *g, bool quick) {
  static const int32_t l2[] = {63, 64, 65, 1000, 1}, l3[] = {1000, 0, 130};
  /* split S (probe 32768): partial tiles, splits, page sizes 16 and 8, a partial head group */
  t_mla_decode(g, 5, l2, 96, 16, 1, 32768);
  t_mla_decode(g, 3, l3, 80, 8, 0, 32768);
  /* the fallback path (K3PD_MLA_DECODE_OLD=1) */
  t_mla_decode(g, 5, l2, 96, 64, 1, 4096 | 8192 | 2048);
  t_mla_decode(g, 3, l3, 80, 16, 0, 4096 | 8192 | 2048);
  /* S queued behind P.V (the default of sessions 3-16) */
  t_mla_decode(g, 5, l2, 96, 64, 1, 2048);
  if (!quick) {
    /* long splits (tens of tiles per block: the page lookups and L2 prefetches 3 tiles ahead
     * run in steady state), with spikes in late tiles, each forced variant */
    int32_t l5[16];
    for (int i = 0; i < 16; i++) l5[i] = 2500 + (i * 331) % 2600;
    t_mla_decode(g, 16, l5, 96, 64, 1, 4096 | 8192 | 2048);
    t_mla_decode(g, 16, l5, 96, 16, 1, 2048);
    t_mla_decode(g, 16, l5, 96, 16, 1, 16384); /* far L2 prefetch variant */
    t_mla_decode(g, 16, l5, 96, 64, 1, 32768); /* split S */
    t_mla_decode(g, 16, l5, 96, 16, 1, 32768 | 16384);
  }
}
