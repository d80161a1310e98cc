/* The GPU digest kernels' algorithms, emulated on the CPU (kernels/core/xxh3_warp.h for kernel
 * 1, kernels/core/xxh3_half.h for kernel 2).
 *
 * What it is for: the CUDA kernels (kernels/cuda/xdev_kernels.cu) are the per-lane functions of
 * those headers glued with warp shuffles, votes and a ballot. Here the same functions run for
 * 32 emulated lanes in loops (kernel 2: two halves of 16, a chunk each); each shuffle becomes a
 * read of the partner lane's value from the previous phase, the ballot a count of the lanes'
 * probes. Every test runs for both kernels (a loop test: _i is the kernel). The results are
 * checked against libxxhash (XXH3_64bits, the definition of a chunk digest) for every chunk
 * length 0..4096 on fresh random data, in three ways of reading (one aligned piece: the fast
 * path — kernel 2 also through its slow path, which a fast chunk takes beside a slow one; a
 * misaligned piece: the byte path; several pieces through the planner), and against the K3
 * digest (k3_digest_bytes) for whole random jobs planned by kernels/core/xdev_plan.c, whose every
 * source and destination segment is its own exact-size allocation (so ASan sees any read or
 * write outside a piece). Kernel 2's jobs are emulated warp by warp as the kernel splits them
 * (units per warp 1..4, the forward group steps, the digest batches), for several grid sizes.
 * What is not tested here: the CUDA glue itself (shuffle, vote and ballot semantics, shared
 * memory, launch, the digest write-back) and the driver plumbing; tests/gpu/gpu_xdev.c does. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/xdev_plan.h"
#include "core/xxh3_half.h"
#include "core/xxh3_warp.h"
#include "k3pd/digest.h"
#include "xdev_layouts.h"

static k3k_xw_consts C;
static int K; /* the kernel under test: 1 or 2 (the loop index of each test) */

static void setup(void) {
  uint8_t secret[192];
  k3k_xxh3_secret(secret);
  xw_consts_init(&C, secret);
}

/* ---- kernel 1: the warp, lane by lane ---- */

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

/* ---- kernel 2: two half-warps, lane by lane ---- */

/* One block of a chunk by the 16 lanes of a half (half_block in xdev_kernels.cu): wb[hl] are
 * lane hl's rows 4b..4b+3. */
static void half_block_emulate(uint32_t len, uint32_t b, uint64_t wb[16][4][2], uint64_t key[16][4][2],
                               const uint64_t kscr[16], const uint8_t *stage, uint64_t acc[16]) {
  uint64_t p[16][2], keep[16], send[16], v1[16], v2[16];
  for (int hl = 0; hl < 16; hl++) {
    xh_lane_contrib(&C, len, b, hl, wb[hl], key[hl], stage, p[hl]);
    xh_red(hl, p[hl], &keep[hl], &send[hl]);
  }
  for (int hl = 0; hl < 16; hl++) v1[hl] = keep[hl] + send[hl ^ 4]; /* __shfl_xor_sync(send, 4) */
  for (int hl = 0; hl < 16; hl++) v2[hl] = v1[hl] + v1[hl ^ 8];     /* __shfl_xor_sync(v, 8) */
  for (int hl = 0; hl < 16; hl++) acc[hl] = xw_acc_step(len, b, acc[hl], v2[hl], kscr[hl]);
  for (int hl = 0; hl < 16; hl++) ck_assert_uint_eq(acc[hl], acc[hl ^ 8]); /* 2 copies of each */
}

static uint64_t half_merge_emulate(uint32_t len, const uint64_t acc[16]) {
  uint64_t x[16], f[16], f1[16], h = 0;
  for (int hl = 0; hl < 16; hl++) x[hl] = xh_merge_x(&C, hl, acc[hl]);
  for (int hl = 0; hl < 16; hl++) f[hl] = xw_fold64(x[hl], x[hl ^ 4]);
  for (int hl = 0; hl < 16; hl++) f1[hl] = f[hl] + f[hl ^ 1];
  for (int hl = 0; hl < 16; hl++) {
    uint64_t v = xh_merge_final(len, f1[hl] + f1[hl ^ 2]);
    if (hl) ck_assert_uint_eq(v, h); /* every lane of the half ends with the digest */
    h = v;
  }
  return h;
}

static void half_init(uint64_t key[16][4][2], uint64_t kscr[16], uint64_t acc[16]) {
  for (int hl = 0; hl < 16; hl++) {
    xh_lane_keys(C.k64, hl, key[hl], &kscr[hl]);
    acc[hl] = C.init[xh_lane_acc(hl)];
  }
}

/* half_fast: the whole chunk loaded up front, block by block stored and hashed. */
static uint64_t half_fast_emulate(const xw_chunk *ch) {
  static uint64_t w[16][XH_ROWS][2];
  uint64_t key[16][4][2], kscr[16], acc[16], wb[16][4][2];
  ck_assert(xw_fast(ch));
  for (int hl = 0; hl < 16; hl++) xh_read_fast(ch->src, hl, w[hl]);
  half_init(key, kscr, acc);
  for (uint32_t b = 0; b < 4; b++) {
    for (int hl = 0; hl < 16; hl++)
      for (uint32_t j = 0; j < 4; j++) {
        if (ch->dst) xh_write_fast(ch->dst, hl, 4 * b + j, w[hl][4 * b + j]);
        memcpy(wb[hl][j], w[hl][4 * b + j], sizeof wb[hl][j]);
      }
    half_block_emulate(XW_CHUNK, b, wb, key, kscr, NULL, acc);
  }
  return half_merge_emulate(XW_CHUNK, acc);
}

/* half_slow: block by block through cursors, staging for every length but 4096. */
static uint64_t half_slow_emulate(const xw_chunk *ch) {
  _Alignas(16) uint8_t stage[XW_STAGE];
  memset(stage, 0xEE, sizeof stage); /* a read of an unstaged byte changes the digest */
  xw_cur rcu[16], wcu[16];
  uint64_t key[16][4][2], kscr[16], acc[16], wb[16][4][2];
  for (int hl = 0; hl < 16; hl++) {
    xw_cur_init(ch, &rcu[hl]);
    xw_cur_init(ch, &wcu[hl]);
  }
  const uint32_t len = ch->len;
  if (len <= XW_MIDSIZE) {
    for (int hl = 0; hl < 16; hl++) {
      xh_read_block(ch, &rcu[hl], hl, 0, wb[hl]);
      xh_write_block(ch, &wcu[hl], hl, 0, wb[hl]);
      xh_stage_block(stage, len, hl, 0, wb[hl]);
    }
    return xw_short(stage, len, C.secret); /* after __syncwarp; the same in every lane */
  }
  half_init(key, kscr, acc);
  const uint32_t nb = xw_nfull(len);
  for (uint32_t b = 0; b <= nb && b < 4; b++) {
    for (int hl = 0; hl < 16; hl++) {
      xh_read_block(ch, &rcu[hl], hl, b, wb[hl]);
      xh_write_block(ch, &wcu[hl], hl, b, wb[hl]);
      if (xh_staged(len)) xh_stage_block(stage, len, hl, b, wb[hl]);
    }
    /* the kernel's __syncwarp(hmask) after the last block's staging */
    half_block_emulate(len, b, wb, key, kscr, stage, acc);
  }
  return half_merge_emulate(len, acc);
}

/* Kernel 2's warps over a whole job (xdev_kernel2), writing the chunk digests to cd (poisoned
 * by the caller: each must be written exactly once). cap_warps is the device's resident warps
 * the host sizes the grid with. */
static void job_emulate2(const k3k_xent *tab, uint32_t n_groups, uint32_t n_chunks, uint32_t cap_warps,
                         uint64_t *cd, const uint64_t poison) {
  const uint32_t units = xh_units(n_chunks), per = xh_per_warp(units, cap_warps);
  const uint32_t warps = xh_warps(units, per), grid_warps = (warps + 3) / 4 * 4;
  ck_assert(per >= 1 && per <= XH_PER_MAX);
  ck_assert((uint64_t)warps * per >= units && (uint64_t)(warps - 1) * per < units);
  for (uint32_t wg = 0; wg < grid_warps; wg++) {
    const uint32_t u0 = wg * per;
    if (u0 >= units) continue; /* the warp returns */
    const uint32_t u1 = u0 + per < units ? u0 + per : units;
    uint32_t g = search_emulate(tab, n_groups, 2 * u0);
    uint64_t dig[32] = {0};
    for (uint32_t u = u0; u < u1; u++) {
      g = xh_step(tab, n_groups, g, 2 * u);
      xw_chunk ch[2];
      bool valid[2];
      uint64_t hv[2] = {0, 0};
      for (int h = 0; h < 2; h++) {
        const uint32_t c = 2 * u + (uint32_t)h;
        valid[h] = c < n_chunks;
        if (!valid[h]) continue;
        const uint32_t gh = xh_step(tab, n_groups, g, c);
        ck_assert_uint_le(tab[gh].chunk, c); /* the forward step found c's group */
        if (gh + 1 < n_groups) ck_assert_uint_lt(c, tab[gh + 1].chunk);
        xw_resolve(tab, gh, c, &ch[h]);
        ck_assert(ch[h].len >= 1 && ch[h].len <= XW_CHUNK);
      }
      const bool fast = valid[0] && valid[1] && xw_fast(&ch[0]) && xw_fast(&ch[1]); /* __all_sync */
      for (int h = 0; h < 2; h++)
        if (valid[h]) hv[h] = fast ? half_fast_emulate(&ch[h]) : half_slow_emulate(&ch[h]);
      for (int l = 0; l < 32; l++) dig[l] = xh_gather(l, u - u0, hv[0], hv[1], dig[l]); /* shfl 0, 16 */
    }
    for (uint32_t l = 0; l < 32; l++)
      if (l < 2 * (u1 - u0) && 2 * u0 + l < n_chunks) {
        ck_assert_uint_eq(cd[2 * u0 + l], poison); /* written once */
        cd[2 * u0 + l] = dig[l];
      }
  }
}

/* One resolved chunk as the kernel under test hashes it (kernel 2: through each path the
 * kernel may take for it, which must agree). */
static uint64_t chunk_emulate(const xw_chunk *ch) {
  if (K == 1) return warp_emulate(ch);
  uint64_t h = half_slow_emulate(ch);
  if (xw_fast(ch)) ck_assert_uint_eq(half_fast_emulate(ch), h);
  return h;
}

/* A whole job: check, plan, every chunk as the kernel under test hashes it, combine per region
 * (as poll does). */
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
  if (K == 2 && sz.n_chunks) { /* the kernel's split over warps, for a grid size that varies */
    static const uint32_t caps[] = {1, 3, 5, 64, 2112};
    static unsigned turn;
    const uint64_t poison = 0xD1D1D1D1D1D1D1D1ull;
    for (uint64_t c = 0; c < sz.n_chunks; c++) cd[c] = poison;
    job_emulate2(ent, (uint32_t)sz.n_groups, (uint32_t)sz.n_chunks, caps[turn++ % 5], cd, poison);
    for (uint64_t c = 0; c < sz.n_chunks; c++) ck_assert_uint_ne(cd[c], poison); /* every chunk */
  }
  for (uint32_t c = 0; K == 1 && c < sz.n_chunks; c++) {
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
  uint64_t h = chunk_emulate(&ch);
  if (h != XXH3_64bits(src, len))
    ck_abort_msg("kernel %d, length %u, src +%u, dst %+d: emulated %016llx, XXH3 %016llx", K, len, mis,
                 dmis, (unsigned long long)h, (unsigned long long)XXH3_64bits(src, len));
  if (db) {
    ck_assert_int_eq(memcmp(dst, src, len), 0);
    for (int i = 0; i < dmis; i++) ck_assert_uint_eq(db[i], 0x5A);
  }
  free(sb);
  free(db);
}

START_TEST(test_every_length_one_piece) {
  K = _i;
  for (uint32_t len = 0; len <= XW_CHUNK; len++) {
    one_piece(len, 0, (len & 1) ? 0 : -1, 7000 + len);               /* fast / vector path */
    one_piece(len, 1 + len % 15, (len & 2) ? -1 : (int)(len % 7), 9000 + len); /* byte path */
  }
}
END_TEST

/* Every length as a region of 2..4 segments at random cut points, through the planner. */
START_TEST(test_every_length_pieces) {
  K = _i;
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
  K = _i;
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
  K = _i;
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

/* Full aligned chunks (the fast path of both kernels) on many random inputs, with and without
 * a copy; kernel 2 also through its slow path. */
START_TEST(test_fast_chunks) {
  K = _i;
  for (uint32_t i = 0; i < 64; i++) one_piece(XW_CHUNK, 0, (i & 1) ? 0 : -1, 123456 + i);
}
END_TEST

/* Kernel 2's split of a job into warps: units, units per warp, warps, for every small job and
 * device size and some big ones; every unit is some warp's, no warp is empty. */
START_TEST(test_unit_split) {
  ck_assert_uint_eq(xh_units(1), 1);
  ck_assert_uint_eq(xh_units(2), 1);
  ck_assert_uint_eq(xh_units(3), 2);
  ck_assert_uint_eq(xh_units(1u << 31), 1u << 30);
  for (uint32_t units = 1; units < 300; units++)
    for (uint32_t cap = 0; cap < 70; cap++) {
      uint32_t per = xh_per_warp(units, cap), warps = xh_warps(units, per);
      ck_assert(per >= 1 && per <= XH_PER_MAX);
      ck_assert((uint64_t)warps * per >= units && (uint64_t)(warps - 1) * per < units);
      if (cap && units <= cap) ck_assert_uint_eq(per, 1); /* a job that fits runs one unit a warp */
      if (cap && units > XH_PER_MAX * (uint64_t)cap) ck_assert_uint_eq(per, XH_PER_MAX);
      if (cap && units <= XH_PER_MAX * (uint64_t)cap) ck_assert_uint_le(warps, cap); /* one wave */
    }
  ck_assert_uint_eq(xh_per_warp(1u << 30, 2112), XH_PER_MAX);
  ck_assert_uint_eq(xh_warps(1u << 30, XH_PER_MAX), 1u << 28);
  for (int l = 0; l < 32; l++) /* the digest batch: unit k's digests land in lanes 2k, 2k+1 */
    for (uint32_t k = 0; k < XH_PER_MAX; k++)
      ck_assert_uint_eq(xh_gather(l, k, 10, 11, 7), (uint32_t)l == 2 * k ? 10u : (uint32_t)l == 2 * k + 1 ? 11u : 7u);
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
  for (uint32_t from = 0; from < c; from += 1 + from % 7) { /* kernel 2's forward steps */
    uint32_t g = search_emulate(tab, ng, from);
    for (uint32_t id = from; id < c && id < from + 9; id++) {
      g = xh_step(tab, ng, g, id);
      ck_assert_uint_eq(g, search_emulate(tab, ng, id));
    }
  }
  free(tab);
}
END_TEST

int main(void) {
  setup();
  Suite *s = suite_create("kernels_xw");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_short_paths);
  tcase_add_test(tc, test_unit_split);
  tcase_add_test(tc, test_search_large_table);
  /* the rest once per kernel: _i = 1, 2 */
  tcase_add_loop_test(tc, test_fast_chunks, 1, 3);
  tcase_add_loop_test(tc, test_every_length_one_piece, 1, 3);
  tcase_add_loop_test(tc, test_every_length_pieces, 1, 3);
  tcase_add_loop_test(tc, test_random_jobs, 1, 3);
  tcase_add_loop_test(tc, test_pages_and_plan_shapes, 1, 3);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
