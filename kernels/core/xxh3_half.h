/* XXH3-64 (seed 0) of one <= 4096-byte chunk by HALF a warp (16 lanes), lanes owning
 * accumulators instead of bytes: the per-lane functions of the device digest's second kernel
 * (xdev_kernel2 in kernels/cuda/xdev_kernels.cu, K3PD_XDEV_KERNEL=2, the default), shared with
 * its CPU emulation (tests/unit/kernels/test_kernels_xw.c). Same conventions as xxh3_warp.h,
 * whose scalar helpers, short paths, table search, chunk resolution and cursor reads it uses;
 * that header's comment states the XXH3 algorithm.
 *
 * Why a second decomposition: xxh3_warp.h gives each lane 32 bytes of every 1024-byte XXH3
 * block, so every block ends in a warp-wide reduce-scatter of 8 accumulators (a chain of 4
 * dependent exchanges, 12 shuffles a lane) before the scramble, and a warp hashes one chunk
 * with 4 KiB in flight; on an H200 that ran at 0.54-0.66 of the read ceiling (docs/kernels.md).
 * Here 4 lanes share each pair of accumulators and exchange only once per block:
 *
 *   A half-warp (lanes hl = 0..15, half h = lane / 16) hashes one chunk; a warp, two chunks
 *   (a "unit": chunks 2 u and 2 u + 1). The chunk is read as 16 rows of 256 bytes: lane hl
 *   loads bytes [256 t + 16 hl, +16) of row t, t = 0..15 (one contiguous 256-byte row per load
 *   across the half).
 *   With q = hl % 4 and r = hl / 4, those 16 bytes are words 2q, 2q+1 of stripe g = 4 t + r of
 *   the chunk (block t / 4, stripe s = 4 (t % 4) + r of the block). Word i of a stripe only
 *   feeds acc[i] (its product) and acc[i ^ 1] (its data), so words 2q, 2q+1 only touch
 *   acc[2q] and acc[2q+1]: the lane keeps 2 partial sums over its 4 stripes of a block, with
 *   no cross-lane traffic. The key of word i of stripe s is LE64(secret + 8 (s + i)): the lane
 *   needs k64[4 (t % 4) + r + 2q + e], e = 0, 1 — 8 words, loaded once.
 *   At the end of a block the 4 lanes of one q (partners hl ^ 4, hl ^ 8) reduce-scatter: the
 *   lane with r0 = r & 1 keeps p[r0], sends p[r0 ^ 1] to hl ^ 4 and adds what hl ^ 4 sent,
 *   then adds hl ^ 8's sum. Lane hl ends with accumulator a(hl) = 2 q + r0 (2 copies: bit 1
 *   of r), adds the block sum and scrambles it after a full block. 2 exchanges of 64 bits per
 *   block, 4 shuffles of 32 bits.
 *   Regular stripes: stripe g is accumulated with the regular keys iff g < (len - 1) / 64 (the
 *   full blocks' 16 each, then ((len - 1) - 1024 nb) / 64 of the last block).
 *   The last stripe [len - 64, len), secret offset 121, goes into the last block: for
 *   len == 4096 it is stripe 63 = row 15 of the lanes r == 3, words 2q, 2q+1 already in
 *   registers; any other length stages the 16-byte units that meet [base, len) (base =
 *   (len - 64) & ~15) in the half's 256-byte shared buffer and the lanes r == 0 read words
 *   2q, 2q+1 from it. Lengths <= 240 stage the whole chunk and run the short paths (every lane
 *   of the half on the same bytes).
 *   Merge: x = acc ^ kmerge[a(hl)]; hl ^ 4 holds the other accumulator of the pair, so
 *   fold(x, shfl_xor(x, 4)) is the pair's term (fold is symmetric) in all 4 lanes of q; two
 *   more exchanges (xor 1, xor 2) sum the 4 pairs; the avalanche ends it in every lane.
 * Two paths. Fast (xw_fast: one 16-byte aligned piece of 4096 bytes, the whole of a KDA state
 *   or an MLA page run): all 16 loads of the chunk in flight together (64 registers), then
 *   block by block the rows are stored (16-byte stores) and hashed; len is a compile-time 4096,
 *   so the stripe conditions fold away. The kernel takes it only when both halves of the warp
 *   can (a vote), so its shuffles name all 32 lanes. Slow (any other chunk, or a fast one
 *   beside a slow one): block by block, 4 rows at a time, through the piece cursors of
 *   xxh3_warp.h, staging for every length but 4096; its shuffles name the half only.
 * Work of a warp: `per` consecutive units (1..4: the host picks 1 when the job does not fill
 *   the device's resident warps, up to 4 to amortise the search); warp w of the grid hashes
 *   units [w per, w per + per). It finds its first chunk's group with the warp-wide ballot
 *   search of xxh3_warp.h, then steps forward (every group has >= 1 chunk, so the group of
 *   chunk c + 1 is the group of c or the next). The digests of its units are gathered in lanes
 *   0 .. 2 per - 1 and written as one store of up to 64 bytes.
 * Invariants: as xxh3_warp.h (no lane reads outside [src, src + len) of a piece or writes
 * outside its dst); every exchange stays inside a half (partners hl ^ 1, ^ 2, ^ 4, ^ 8), so the
 * slow path, whose halves may branch apart (a short chunk beside a long one), names the half
 * only. */
#ifndef K3K_XXH3_HALF_H
#define K3K_XXH3_HALF_H

#include "core/xxh3_warp.h"

#define XH_ROW 256u      /* bytes of a row: one 16-byte unit per lane of a half */
#define XH_ROWS 16u      /* rows of a full chunk */
#define XH_PER_MAX 4u    /* units (chunk pairs) a warp hashes at most */

/* ---- lane roles ---- */

/* The accumulator lane hl holds after a block's reduce-scatter. */
XW_FN int xh_lane_acc(int hl) { return 2 * (hl & 3) + ((hl >> 2) & 1); }
/* Lane hl's stripe keys (key[t % 4][e] for word 2q + e of its stripe in row t) and the
 * scramble key of its accumulator. */
XW_FN void xh_lane_keys(const uint64_t *k64, int hl, uint64_t key[4][2], uint64_t *kscr) {
  const int base = (hl >> 2) + 2 * (hl & 3);
  XW_UNROLL
  for (int j = 0; j < 4; j++) {
    key[j][0] = k64[base + 4 * j];
    key[j][1] = k64[base + 4 * j + 1];
  }
  *kscr = k64[16 + xh_lane_acc(hl)];
}

/* ---- reading and writing a chunk ---- */

/* The fast path (xw_fast: one 16-byte aligned piece of 4096 bytes): lane hl's 16 rows, w[t] =
 * LE words of chunk bytes [256 t + 16 hl, +16), all loads in flight before the first use. */
XW_FN void xh_read_fast(uint64_t src, int hl, uint64_t w[XH_ROWS][2]) {
  XW_UNROLL
  for (uint32_t t = 0; t < XH_ROWS; t++) xw_ld16(src + XH_ROW * t + 16u * (uint32_t)hl, w[t]);
}
XW_FN void xh_write_fast(uint64_t dst, int hl, uint32_t t, const uint64_t w[2]) {
  xw_st16(dst + XH_ROW * t + 16u * (uint32_t)hl, w);
}
/* Any other chunk, block by block (rows 4b .. 4b+3; zeros past the end), with cursors from
 * xw_cur_init carried over the blocks in order: a rare path, so it holds 16 data registers
 * instead of 64 and leaves the fast path's registers alone. */
XW_FN void xh_read_block(const xw_chunk *ch, xw_cur *cu, int hl, uint32_t b, uint64_t wb[4][2]) {
  XW_UNROLL
  for (uint32_t j = 0; j < 4; j++) xw_read_unit(ch, cu, XH_ROW * (4 * b + j) + 16u * (uint32_t)hl, wb[j]);
}
XW_FN void xh_write_block(const xw_chunk *ch, xw_cur *cu, int hl, uint32_t b, const uint64_t wb[4][2]) {
  if (!(ch->flags & K3K_XENT_DST)) return;
  XW_UNROLL
  for (uint32_t j = 0; j < 4; j++) xw_write_unit(ch, cu, XH_ROW * (4 * b + j) + 16u * (uint32_t)hl, wb[j]);
}

/* ---- staging (every length but 4096) ---- */

XW_FN int xh_staged(uint32_t len) { return len != XW_CHUNK; }
/* The first chunk offset kept in the stage: 0 for the short paths, else the 16-byte unit that
 * holds byte len - 64. The stage then spans < 96 (long) or <= 240 (short) bytes. */
XW_FN uint32_t xh_stage_base(uint32_t len) { return len <= XW_MIDSIZE ? 0 : (len - 64) & ~15u; }
/* Stages the unit at chunk offset o (16-byte aligned) when it meets [base, len). */
XW_FN void xh_stage(uint8_t *stage, uint32_t len, uint32_t o, const uint64_t w[2]) {
  const uint32_t base = xh_stage_base(len);
  if (o < base || o >= len) return;
  XW_UNROLL
  for (int e = 0; e < 2; e++) {
#ifdef __CUDA_ARCH__
    *(uint64_t *)(stage + (o - base) + 8 * e) = w[e];
#else
    if ((uintptr_t)(stage + (o - base) + 8 * e) & 7) __builtin_trap();
    memcpy(stage + (o - base) + 8 * e, &w[e], 8);
#endif
  }
}

/* Stages block b's units of lane hl that meet [base, len). */
XW_FN void xh_stage_block(uint8_t *stage, uint32_t len, int hl, uint32_t b, const uint64_t wb[4][2]) {
  XW_UNROLL
  for (uint32_t j = 0; j < 4; j++) xh_stage(stage, len, XH_ROW * (4 * b + j) + 16u * (uint32_t)hl, wb[j]);
}

/* ---- hashing ---- */

/* Two words of one stripe into the partial sums of acc[2q] (p[0]) and acc[2q+1] (p[1]). */
XW_FN void xh_accum(const uint64_t w[2], const uint64_t key[2], uint64_t p[2]) {
  XW_UNROLL
  for (int e = 0; e < 2; e++) {
    const uint64_t k = w[e] ^ key[e];
    p[e] += (k & 0xffffffffu) * (k >> 32);
    p[e ^ 1] += w[e];
  }
}
/* Lane hl's partial sums for block b (wb = rows 4b .. 4b+3): its regular stripes, and in the
 * last block the last stripe (lanes r == 3 from row 15 when len == 4096, lanes r == 0 from the
 * stage otherwise). len > 240. */
XW_FN void xh_lane_contrib(const k3k_xw_consts *c, uint32_t len, uint32_t b, int hl,
                           const uint64_t wb[4][2], const uint64_t key[4][2], const uint8_t *stage,
                           uint64_t p[2]) {
  const uint32_t nreg = (len - 1) / 64, r = (uint32_t)hl >> 2, q = (uint32_t)hl & 3;
  p[0] = p[1] = 0;
  XW_UNROLL
  for (uint32_t j = 0; j < 4; j++)
    if (16 * b + 4 * j + r < nreg) xh_accum(wb[j], key[j], p);
  if (b != xw_nfull(len)) return;
  const uint64_t fk[2] = {c->klast[2 * q], c->klast[2 * q + 1]};
  if (len == XW_CHUNK) {
    if (r == 3) xh_accum(wb[3], fk, p);
  } else if (r == 0) {
    const uint8_t *s = stage + (len - 64 + 16 * q - xh_stage_base(len));
    const uint64_t fw[2] = {xw_rd64(s), xw_rd64(s + 8)};
    xh_accum(fw, fk, p);
  }
}
/* The block's reduce-scatter, first exchange (partner hl ^ 4): keep p[r0], send p[r0 ^ 1]. The
 * sum keep + (partner's send) then goes through one more exchange (partner hl ^ 8, add). */
XW_FN void xh_red(int hl, const uint64_t p[2], uint64_t *keep, uint64_t *send) {
  const int r0 = (hl >> 2) & 1;
  *keep = r0 ? p[1] : p[0];
  *send = r0 ? p[0] : p[1];
}
/* Merge: lane hl's operand (its accumulator with the merge key), and the digest from the sum
 * f of the 4 pairs' folds. */
XW_FN uint64_t xh_merge_x(const k3k_xw_consts *c, int hl, uint64_t acc) {
  return acc ^ c->kmerge[xh_lane_acc(hl)];
}
XW_FN uint64_t xh_merge_final(uint32_t len, uint64_t f) { return xw_avalanche(len * XW_P64_1 + f); }

/* ---- a warp's units ---- */

/* Units (chunk pairs) of a job of n_chunks (<= 2^31) chunks. */
XW_FN uint32_t xh_units(uint32_t n_chunks) { return n_chunks / 2 + (n_chunks & 1); }
/* Units per warp: 1 while the job fits the cap_warps resident warps once, else up to 4. */
XW_FN uint32_t xh_per_warp(uint32_t n_units, uint32_t cap_warps) {
  const uint32_t cap = cap_warps ? cap_warps : 1;
  const uint32_t per = n_units / cap + (n_units % cap != 0);
  return per < 1 ? 1 : per > XH_PER_MAX ? XH_PER_MAX : per;
}
/* Warps a job of n_units needs at per units a warp. */
XW_FN uint32_t xh_warps(uint32_t n_units, uint32_t per) { return n_units / per + (n_units % per != 0); }
/* The group of chunk c, stepping forward from g (the group of a chunk <= c). */
XW_FN uint32_t xh_step(const k3k_xent *tab, uint32_t n_groups, uint32_t g, uint32_t c) {
  while (g + 1 < n_groups && tab[g + 1].chunk <= c) g++;
  return g;
}
/* The warp's digest batch: unit k's two digests (d0 from half 0, d1 from half 1) go to lanes
 * 2k and 2k + 1; lane l keeps cur otherwise. */
XW_FN uint64_t xh_gather(int l, uint32_t k, uint64_t d0, uint64_t d1, uint64_t cur) {
  return (uint32_t)l == 2 * k ? d0 : (uint32_t)l == 2 * k + 1 ? d1 : cur;
}

#endif
