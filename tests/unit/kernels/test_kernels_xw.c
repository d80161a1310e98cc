/* The GPU digest kernel's algorithm, emulated on the CPU (kernels/core/xxh3_warp.h).
 *
 * What it is for: the CUDA kernel (kernels/cuda/xdev.cu) is the per-lane functions of
 * xxh3_warp.h glued with warp shuffles and a ballot. Here the same functions run for 32 lanes in
 * loops; each shuffle becomes a read of the partner lane's value from the previous phase, the
 * ballot a count of the lanes' probes. The results are checked against libxxhash (XXH3_64bits,
 * the definition of a chunk digest) for every chunk length 0..4096 on fresh random data, in
 * three ways of reading (one aligned piece: the fast path; a misaligned piece: the byte path;
 * several pieces through the planner), and against the K3 digest (k3_digest_bytes) for whole
 * random jobs planned by kernels/core/xdev_plan.c, whose every source and destination segment
 * is its own exact-size allocation (so ASan sees any read or write outside a piece).
 * What is not tested here: the CUDA glue itself (shuffle and ballot semantics, shared memory,
 * launch, the digest write-back) and the driver plumbing; tests/gpu/gpu_xdev.c does that. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/xdev_plan.h"
#include "core/xxh3_warp.h"
#include "k3pd/digest.h"
#include "xdev_layouts.h"

static k3k_xw_consts C;

static void setup(void) {
  uint8_t secret[192];
  k3k_xxh3_secret(secret);
  xw_consts_init(&C, secret);
}

/* ---- the warp, lane by lane ---- */

static uint64_t W[32][XW_STEPS][4];

/* The kernel's per-warp body for one resolved chunk (xdev_kernel in xdev.cu, same order). */
static uint64_t warp_emulate(const xw_chunk *ch) {
  _Alignas(16) uint8_t stage[XW_STAGE]; /* as the kernel's shared buffer */
  memset(stage, 0xEE, sizeof stage); /* a read of an unstaged byte changes the digest */
  xw_cur wcu[32];
  for (int l = 0; l < 32; l++) {
    xw_lane_read(ch, l, W[l]);
    xw_cur_init(ch, &wcu[l]);
  }
  const uint32_t ns = xw_nsteps(ch->len);
  if (ch->len <= XW_MIDSIZE) {
    for (int l = 0; l < 32 && ns; l++) {
      xw_lane_write_step(ch, &wcu[l], l, 0, W[l][0]);
      xw_stage(stage, ch->len, 32 * l, W[l][0]);
    }
    return xw_short(stage, ch->len, C.secret); /* after __syncwarp */
  }
  uint64_t key[32][4], kscr[32], acc[32];
  for (int l = 0; l < 32; l++) {
    xw_lane_keys(C.k64, l, key[l], &kscr[l]);
    acc[l] = C.init[xw_lane_acc(l)];
  }
  for (uint32_t k = 0; k < XW_STEPS; k++) {
    if (k >= ns) continue;
    uint64_t p[32][4], keep[32][2], send[32][2], q[32][2], kb[32], sb[32], v1[32], v2[32], v3[32];
    for (int l = 0; l < 32; l++) {
      xw_lane_write_step(ch, &wcu[l], l, k, W[l][k]);
      xw_stage(stage, ch->len, XW_STEP * k + 32 * l, W[l][k]);
    }
    /* the kernel's __syncwarp() before the last step's reads of the stage */
    for (int l = 0; l < 32; l++) {
      xw_lane_contrib(&C, ch->len, k, l, W[l][k], key[l], stage, p[l]);
      xw_red_a(l, p[l], keep[l], send[l]);
    }
    for (int l = 0; l < 32; l++) { /* __shfl_xor_sync(send, 2) */
      q[l][0] = keep[l][0] + send[l ^ 2][0];
      q[l][1] = keep[l][1] + send[l ^ 2][1];
    }
    for (int l = 0; l < 32; l++) xw_red_b(l, q[l], &kb[l], &sb[l]);
    for (int l = 0; l < 32; l++) v1[l] = kb[l] + sb[l ^ 4];
    for (int l = 0; l < 32; l++) v2[l] = v1[l] + v1[l ^ 8];
    for (int l = 0; l < 32; l++) v3[l] = v2[l] + v2[l ^ 16];
    for (int l = 0; l < 32; l++) acc[l] = xw_acc_step(ch->len, k, acc[l], v3[l], kscr[l]);
  }
  for (int l = 0; l < 32; l++) /* the 4 copies of each accumulator agree */
    ck_assert_uint_eq(acc[l], acc[xw_acc_lane(xw_lane_acc(l))]);
  uint64_t accs[8];
  for (int m = 0; m < 8; m++) accs[m] = acc[xw_acc_lane(m)]; /* __shfl_sync(acc, lane of m) */
  return xw_merge(&C, accs, ch->len);
}

/* The kernel's group search: a ballot is the count of true probes, which must be a prefix. */
static uint32_t search_emulate(const k3k_xent *tab, uint32_t n_groups, uint32_t c) {
  uint32_t lo = 0, hi = n_groups;
  while (hi - lo > 1) {
    uint32_t step = xw_search_step(lo, hi), k = 0;
    for (int l = 0; l < 32; l++) {
      int pr = xw_probe(tab, lo, hi, step, l, c);
      if (pr) ck_assert_uint_eq((uint32_t)l, k); /* true probes form a prefix of the lanes */
      k += (uint32_t)pr;
    }
    ck_assert_uint_ge(k, 1);
    xw_narrow(&lo, &hi, step, k);
  }
  return lo;
}

/* A whole job: check, plan, every chunk by a warp, combine per region (as poll does). */
static void job_emulate(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                        uint64_t *digests, k3k_xplan_size_t *out_sz) {
  ck_assert_int_eq(k3k_xdev_check(segs, first, n_regions), 0);
  k3k_xplan_size_t sz;
  k3k_xplan_measure(segs, first, n_regions, &sz);
  k3k_xent *ent = malloc((sz.n_groups + sz.n_pieces + 1) * sizeof *ent);
  uint32_t *rc = malloc((n_regions + 1) * sizeof *rc);
  uint64_t *cd = malloc((sz.n_chunks + 1) * sizeof *cd);
  k3k_xplan_fill(segs, first, n_regions, &sz, ent, rc);
  for (uint32_t r = 0; r < n_regions; r++) { /* ceil(bytes / 4096) chunks per region */
    uint64_t bytes = 0;
    for (uint32_t i = first[r]; i < first[r + 1]; i++) bytes += segs[i].len;
    ck_assert_uint_eq(rc[r + 1] - rc[r], k3_digest_nchunks(bytes));
  }
  for (uint64_t g = 1; g < sz.n_groups; g++) ck_assert_uint_gt(ent[g].chunk, ent[g - 1].chunk);
  for (uint32_t c = 0; c < sz.n_chunks; c++) {
    uint32_t g = search_emulate(ent, (uint32_t)sz.n_groups, c);
    ck_assert_uint_le(ent[g].chunk, c);
    if (g + 1 < sz.n_groups) ck_assert_uint_lt(c, ent[g + 1].chunk);
    xw_chunk ch;
    xw_resolve(ent, g, c, &ch);
    ck_assert(ch.len >= 1 && ch.len <= XW_CHUNK);
    cd[c] = warp_emulate(&ch);
  }
  for (uint32_t r = 0; r < n_regions; r++) digests[r] = k3_digest_combine(cd + rc[r], rc[r + 1] - rc[r]);
  if (out_sz) *out_sz = sz;
  free(ent);
  free(rc);
  free(cd);
}

/* ---- tests ---- */

START_TEST(test_short_paths) { /* every length of the short paths, several inputs each */
  uint8_t buf[256];
  for (int round = 0; round < 8; round++) {
    xl_fill_random(buf, sizeof buf, 100 + (uint64_t)round);
    for (uint32_t len = 0; len <= XW_MIDSIZE; len++)
      ck_assert_uint_eq(xw_short(buf, len, C.secret), XXH3_64bits(buf, len));
  }
}
END_TEST

/* One piece at src (mis bytes past a 16-byte boundary), copied to a dst misaligned by dmis
 * (dmis < 0: not copied). Every buffer is exact-size; the bytes before the data are checked. */
static void one_piece(uint32_t len, unsigned mis, int dmis, uint64_t seed) {
  uint8_t *sb = malloc(mis + len + 1), *db = dmis >= 0 ? malloc((size_t)dmis + len + 1) : NULL;
  uint8_t *src = sb + mis, *dst = db ? db + dmis : NULL;
  xl_fill_random(sb, mis + len, seed);
  if (db) memset(db, 0x5A, (size_t)dmis + len);
  xw_chunk ch = {.piece = NULL, .src = (uint64_t)(uintptr_t)src, .dst = (uint64_t)(uintptr_t)dst,
                 .n = 1, .len = len, .flags = dst ? K3K_XENT_DST : 0};
  if ((mis & 15) == 0 && (!dst || (dmis & 15) == 0)) ch.flags |= K3K_XENT_VEC;
  uint64_t h = warp_emulate(&ch);
  if (h != XXH3_64bits(src, len))
    ck_abort_msg("length %u, src +%u, dst %+d: warp %016llx, XXH3 %016llx", len, mis, dmis,
                 (unsigned long long)h, (unsigned long long)XXH3_64bits(src, len));
  if (db) {
    ck_assert_int_eq(memcmp(dst, src, len), 0);
    for (int i = 0; i < dmis; i++) ck_assert_uint_eq(db[i], 0x5A);
  }
  free(sb);
  free(db);
}

START_TEST(test_every_length_one_piece) {
  for (uint32_t len = 0; len <= XW_CHUNK; len++) {
    one_piece(len, 0, (len & 1) ? 0 : -1, 7000 + len);               /* fast / vector path */
    one_piece(len, 1 + len % 15, (len & 2) ? -1 : (int)(len % 7), 9000 + len); /* byte path */
  }
}
END_TEST

/* Every length as a region of 2..4 segments at random cut points, through the planner. */
START_TEST(test_every_length_pieces) {
  uint64_t rng = 42;
  for (uint32_t len = 1; len <= XW_CHUNK + 1; len++) {
    xl_layout L;
    xl_init(&L, "cut");
    xl_region(&L);
    uint32_t nseg = 2 + (uint32_t)(xl_rng(&rng) % 3), left = len;
    bool vec = xl_rng(&rng) & 1;
    for (uint32_t i = 0; i < nseg; i++) {
      uint32_t n = i + 1 == nseg ? left : (uint32_t)(xl_rng(&rng) % (left + 1));
      if (vec && i + 1 < nseg) n &= ~15u; /* VEC chunks: 16-byte pieces, aligned */
      xl_seg_add(&L, n, vec ? 0 : (unsigned)(xl_rng(&rng) % 16), xl_rng(&rng) & 1,
                 vec ? 0 : (unsigned)(xl_rng(&rng) % 16));
      left -= n;
    }
    uint8_t *src = malloc(L.src_bytes + 1), *dst = malloc(L.dst_bytes + 1);
    xl_fill_random(src, L.src_bytes, 500 + len);
    xl_fill_guard(dst, L.dst_bytes);
    k3k_xseg_t *segs = xl_segs(&L, src, dst);
    uint64_t got, want;
    job_emulate(segs, L.first, L.n_regions, &got, NULL);
    xl_reference(&L, src, &want);
    ck_assert_uint_eq(got, want);
    ck_assert_uint_eq(xl_check_dst(&L, src, dst), UINT64_MAX);
    free(segs);
    free(src);
    free(dst);
    xl_free(&L);
  }
}
END_TEST

/* Random jobs; every segment's source and destination is its own exact-size allocation. */
static void isolated_job(xl_layout *L, uint64_t seed) {
  uint8_t *arena = malloc(L->src_bytes + 1);
  xl_fill_random(arena, L->src_bytes, seed);
  k3k_xseg_t *segs = xl_segs(L, arena, NULL);
  uint8_t **sbuf = calloc(L->n_segs + 1, sizeof *sbuf), **dbuf = calloc(L->n_segs + 1, sizeof *dbuf);
  for (uint32_t i = 0; i < L->n_segs; i++) {
    const xl_seg *s = &L->segs[i];
    unsigned mis = (unsigned)(s->src_off & 15), dmis = (unsigned)(s->dst_off & 15);
    sbuf[i] = malloc(mis + s->len + 1);
    memcpy(sbuf[i] + mis, arena + s->src_off, s->len);
    segs[i].src = sbuf[i] + mis;
    if (s->dst_off != XL_NO_DST) {
      dbuf[i] = malloc(dmis + s->len + 1);
      memset(dbuf[i], 0x3C, dmis + s->len);
      segs[i].dst = dbuf[i] + dmis;
    }
  }
  uint64_t *got = malloc((L->n_regions + 1) * 8), *want = malloc((L->n_regions + 1) * 8);
  job_emulate(segs, L->first, L->n_regions, got, NULL);
  xl_reference(L, arena, want);
  for (uint32_t r = 0; r < L->n_regions; r++) ck_assert_uint_eq(got[r], want[r]);
  for (uint32_t i = 0; i < L->n_segs; i++) {
    if (!dbuf[i]) continue;
    unsigned dmis = (unsigned)(L->segs[i].dst_off & 15);
    ck_assert_int_eq(memcmp(dbuf[i] + dmis, arena + L->segs[i].src_off, L->segs[i].len), 0);
    for (unsigned b = 0; b < dmis; b++) ck_assert_uint_eq(dbuf[i][b], 0x3C);
  }
  for (uint32_t i = 0; i < L->n_segs; i++) {
    free(sbuf[i]);
    free(dbuf[i]);
  }
  free(sbuf);
  free(dbuf);
  free(segs);
  free(got);
  free(want);
  free(arena);
}

START_TEST(test_random_jobs) {
  uint64_t rng = 0xC0FFEE;
  for (int round = 0; round < 300; round++) {
    xl_layout L;
    xl_random(&L, &rng, round & 1);
    isolated_job(&L, 77 + (uint64_t)round);
    xl_free(&L);
  }
}
END_TEST

START_TEST(test_pages_and_plan_shapes) {
  static const struct {
    uint32_t regions, pages;
    uint64_t page;
    uint64_t groups; /* table groups the planner must use */
  } cases[] = {
      {1, 1, 6291456, 1},  /* a KDA state: one run of 1536 chunks */
      {2, 5, 73728, 10},   /* MLA pages of 64 tokens: one run per page */
      {1, 4, 18432, 6},    /* 4.5 chunks a page: run 4, multi, run 4, run 4, multi, run 4 */
      {3, 7, 2560, 15},    /* 17,920 B: chunks of 2-3 pages, 5 per region */
      {1, 3, 4096, 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    xl_layout L;
    xl_pages(&L, cases[i].regions, cases[i].pages, cases[i].page, i & 1);
    uint8_t *src = malloc(L.src_bytes + 1), *dst = malloc(L.dst_bytes + 1);
    xl_fill_random(src, L.src_bytes, 31 + i);
    xl_fill_guard(dst, L.dst_bytes);
    k3k_xseg_t *segs = xl_segs(&L, src, dst);
    uint64_t got[8], want[8];
    k3k_xplan_size_t sz;
    job_emulate(segs, L.first, L.n_regions, got, &sz);
    xl_reference(&L, src, want);
    for (uint32_t r = 0; r < L.n_regions; r++) ck_assert_uint_eq(got[r], want[r]);
    ck_assert_uint_eq(xl_check_dst(&L, src, dst), UINT64_MAX);
    ck_assert_uint_eq(sz.n_groups, cases[i].groups);
    free(segs);
    free(src);
    free(dst);
    xl_free(&L);
  }
}
END_TEST

START_TEST(test_search_large_table) { /* 5000 groups of 1..4 chunks; every chunk id found */
  uint32_t ng = 5000;
  k3k_xent *tab = calloc(ng, sizeof *tab);
  uint64_t rng = 9;
  uint32_t c = 0;
  for (uint32_t g = 0; g < ng; g++) {
    tab[g].chunk = c;
    tab[g].n = 1 + (uint32_t)(xl_rng(&rng) % 4);
    c += tab[g].n;
  }
  for (uint32_t g = 0, id = 0; g < ng; g++)
    for (uint32_t k = 0; k < tab[g].n; k++, id++) ck_assert_uint_eq(search_emulate(tab, ng, id), g);
  free(tab);
}
END_TEST

int main(void) {
  setup();
  Suite *s = suite_create("kernels_xw");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_short_paths);
  tcase_add_test(tc, test_every_length_one_piece);
  tcase_add_test(tc, test_every_length_pieces);
  tcase_add_test(tc, test_random_jobs);
  tcase_add_test(tc, test_pages_and_plan_shapes);
  tcase_add_test(tc, test_search_large_table);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
