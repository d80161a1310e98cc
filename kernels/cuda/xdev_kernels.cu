/* The device digest kernels (xdev_kernels.h): kernels/core/xxh3_warp.h (kernel 1) and
 * kernels/core/xxh3_half.h (kernel 2) glued with warp shuffles, plus how a job's chunk table
 * reaches them.
 *
 * The table travels as a kernel parameter (__grid_constant__: no local copy; each block copies
 * it to shared memory with register-indexed parameter loads) when it has <= 8, <= 120 or <= 248
 * entries (parameter blocks of ~0.3, 4 and 8 KB), and is uploaded to device memory beforehand
 * only when bigger (a 1M-token MLA layer: one entry per page), where the upload is small next to
 * the job. Why no copies around the kernel: a 6 MiB job's copy takes ~3 us on an H200; an upload
 * of the table plus a download of the digests would add ~4 us of copy-engine latency. Chunk
 * digests go straight to mapped pinned host memory, up to 64 bytes per store.
 *
 * Kernel 1 (a warp per chunk, 8 warps a block, 80 registers): every 1 KiB step of a chunk ends
 * in a warp-wide reduce-scatter before the scramble (xxh3_warp.h). Kept selectable
 * (K3PD_XDEV_KERNEL=1) as the reference design and a fallback.
 * Kernel 2 (a half-warp per chunk, a warp hashes 1..4 chunk pairs, 4 warps a block): lanes own
 * accumulator pairs, one exchange pair per 1 KiB block, the whole chunk's 16 loads in flight
 * per lane (xxh3_half.h). ~470 instructions a lane per 2 chunks against ~500 per chunk for
 * kernel 1, 6x fewer shuffles (docs/kernels.md has the estimates and the measurements).
 * Invariants: every launch is checked; the constants are uploaded once per xdev (idempotent). */
#include <stddef.h>
#include <string.h>

#include "cuda_common.cuh"
#include "xdev_kernels.h"
#include "core/xxh3_half.h"

#define XK_WARPS 8  /* kernel 1: chunks (warps) per block */
#define XH_WARPS 4  /* kernel 2: warps per block (4 blocks of 128 spread a small job over more SMs) */
#define XH_MINB 4   /* kernel 2: blocks per SM the register budget allows: <= 128 registers */

__constant__ k3k_xw_consts c_xw;

template <int NI>
struct xk_args {
  uint32_t n_chunks, n_groups;
  uint32_t n_ent;       /* NI > 0: entries in inl */
  uint32_t per;         /* kernel 2: units (chunk pairs) per warp, 1..XH_PER_MAX */
  const k3k_xent *gtab; /* NI == 0: the table in device memory */
  uint64_t *out;        /* [n_chunks] chunk digests (device view of mapped host memory) */
  k3k_xent inl[NI > 0 ? NI : 1];
};
static_assert(sizeof(xk_args<XK_NI_MID>) <= 4096, "the mid inline table fits a 4 KB parameter block");
static_assert(sizeof(xk_args<XK_NI_BIG>) <= 8192, "the big inline table fits an 8 KB parameter block");

/* Word t of the inline table, read straight from the parameter block (ld.param with a register
 * offset: no generic pointer into parameter space, whose loads the table walk would pay). */
template <int NI>
__device__ __forceinline__ uint64_t inl_word(const xk_args<NI> &a, uint32_t t) {
  const k3k_xent &e = a.inl[t >> 2];
  switch (t & 3) {
  case 0: return e.src;
  case 1: return e.dst;
  case 2: return e.chunk | (uint64_t)e.n << 32;
  default: return e.len | (uint64_t)e.flags << 32;
  }
}
static_assert(sizeof(k3k_xent) == 32 && offsetof(k3k_xent, chunk) == 16 && offsetof(k3k_xent, len) == 24,
              "inl_word's layout");

/* The group holding chunk c: a 32-ary search by the whole warp (xxh3_warp.h). */
__device__ __forceinline__ uint32_t warp_search(const k3k_xent *tab, uint32_t n_groups, uint32_t c, int l) {
  uint32_t lo = 0, hi = n_groups;
  while (hi - lo > 1) {
    uint32_t step = xw_search_step(lo, hi);
    uint32_t k = __popc(__ballot_sync(0xffffffffu, xw_probe(tab, lo, hi, step, l, c)));
    xw_narrow(&lo, &hi, step, k);
  }
  return lo;
}

/* ---- kernel 1: a warp per chunk ---- */

/* Grid: ceil(n_chunks / 8) blocks of 8 warps; warp w of block b hashes chunk 8 b + w.
 * Shapes per warp: lane l holds bytes [1024 k + 32 l, +32) of its chunk for k < 4 (32 regs).
 * An inline table is first copied to shared memory by the block. */
template <int NI>
__global__ void __launch_bounds__(XK_WARPS * 32, 3) xdev_kernel(const __grid_constant__ xk_args<NI> a) {
  __shared__ uint64_t sk64[24];
  __shared__ __align__(16) uint8_t sstage[XK_WARPS][XW_STAGE];
  __shared__ uint64_t sdig[XK_WARPS];
  __shared__ __align__(16) k3k_xent stab[NI > 0 ? NI : 1];
  const int l = threadIdx.x & 31, wi = threadIdx.x >> 5;
  if (threadIdx.x < 24) sk64[threadIdx.x] = c_xw.k64[threadIdx.x]; /* lanes index it freely */
  if (NI > 0)
    for (uint32_t t = threadIdx.x; t < 4 * a.n_ent; t += XK_WARPS * 32) ((uint64_t *)stab)[t] = inl_word(a, t);
  __syncthreads();
  const uint32_t c = blockIdx.x * XK_WARPS + wi;
  if (c < a.n_chunks) {
    const k3k_xent *tab = NI > 0 ? stab : a.gtab;
    xw_chunk ch;
    xw_resolve(tab, warp_search(tab, a.n_groups, c, l), c, &ch);
    uint64_t w[XW_STEPS][4];
    xw_lane_read(&ch, l, w); /* every load in flight before the first use */
    xw_cur wcu;
    xw_cur_init(&ch, &wcu);
    uint8_t *stage = sstage[wi];
    const uint32_t ns = xw_nsteps(ch.len);
    uint64_t h;
    if (ch.len <= XW_MIDSIZE) { /* one step */
      if (ns) {
        xw_lane_write_step(&ch, &wcu, l, 0, w[0]);
        xw_stage(stage, ch.len, 32 * l, w[0]);
      }
      __syncwarp();
      h = xw_short(stage, ch.len, c_xw.secret); /* every lane, same bytes: no divergence */
    } else {
      uint64_t key[4], kscr;
      xw_lane_keys(sk64, l, key, &kscr);
      uint64_t acc = c_xw.init[xw_lane_acc(l)];
      XW_UNROLL
      for (uint32_t k = 0; k < XW_STEPS; k++) {
        if (k < ns) { /* store, stage and hash step k: waits for w[k] only */
          uint64_t p[4], keep[2], send[2], q[2], kb, sb;
          xw_lane_write_step(&ch, &wcu, l, k, w[k]);
          xw_stage(stage, ch.len, XW_STEP * k + 32 * l, w[k]);
          if (k + 1 == ns) __syncwarp(); /* the last stripe's bytes are staged */
          xw_lane_contrib(&c_xw, ch.len, k, l, w[k], key, stage, p);
          xw_red_a(l, p, keep, send);
          q[0] = keep[0] + __shfl_xor_sync(0xffffffffu, send[0], 2);
          q[1] = keep[1] + __shfl_xor_sync(0xffffffffu, send[1], 2);
          xw_red_b(l, q, &kb, &sb);
          uint64_t v = kb + __shfl_xor_sync(0xffffffffu, sb, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          acc = xw_acc_step(ch.len, k, acc, v, kscr);
        }
      }
      uint64_t accs[8];
      XW_UNROLL
      for (int m = 0; m < 8; m++) accs[m] = __shfl_sync(0xffffffffu, acc, xw_acc_lane(m));
      h = xw_merge(&c_xw, accs, ch.len);
    }
    if (l == 0) sdig[wi] = h;
  }
  __syncthreads();
  if (threadIdx.x < XK_WARPS) { /* one 64-byte write per block over PCIe */
    uint32_t cc = blockIdx.x * XK_WARPS + threadIdx.x;
    if (cc < a.n_chunks) a.out[cc] = sdig[threadIdx.x];
  }
}

/* ---- kernel 2: a half-warp per chunk ---- */

/* Block b of a chunk by the half-warp of lane hl (hmask: the half's lanes), after its rows
 * are loaded and stored: the lane's contribution, the reduce-scatter, the accumulator step. */
__device__ __forceinline__ uint64_t half_block(const k3k_xw_consts &sc, uint32_t len, uint32_t b, int hl,
                                               unsigned hmask, const uint64_t wb[4][2],
                                               const uint64_t key[4][2], uint64_t kscr,
                                               const uint8_t *stage, uint64_t acc) {
  uint64_t p[2], keep, send;
  xh_lane_contrib(&sc, len, b, hl, wb, key, stage, p);
  xh_red(hl, p, &keep, &send);
  uint64_t v = keep + __shfl_xor_sync(hmask, send, 4);
  v += __shfl_xor_sync(hmask, v, 8);
  return xw_acc_step(len, b, acc, v, kscr);
}
__device__ __forceinline__ uint64_t half_merge(const k3k_xw_consts &sc, uint32_t len, int hl, unsigned hmask,
                                               uint64_t acc) {
  const uint64_t x = xh_merge_x(&sc, hl, acc);
  uint64_t f = xw_fold64(x, __shfl_xor_sync(hmask, x, 4));
  f += __shfl_xor_sync(hmask, f, 1);
  f += __shfl_xor_sync(hmask, f, 2);
  return xh_merge_final(len, f);
}

/* The fast path: one 16-byte aligned piece of 4096 bytes (dst 0: not copied), run by the whole
 * warp at once (both halves fast), so the shuffles name all 32 lanes: a mask that varies by
 * lane costs ~400 more instructions per chunk (sm_90a, nvcc 13). len is a constant here: the
 * stripe conditions fold away but the last stripe's (r == 3, row 15).
 * Shapes: w[16][2] = the lane's 16 rows (64 registers), key[4][2] its stripe keys. */
__device__ __forceinline__ uint64_t half_fast(const k3k_xw_consts &sc, uint64_t src, uint64_t dst, int hl) {
  const unsigned all = 0xffffffffu;
  uint64_t w[XH_ROWS][2];
  xh_read_fast(src, hl, w); /* all 16 loads in flight before the first use */
  uint64_t key[4][2], kscr;
  xh_lane_keys(sc.k64, hl, key, &kscr);
  uint64_t acc = sc.init[xh_lane_acc(hl)];
  XW_UNROLL
  for (uint32_t b = 0; b < 4; b++) { /* store and hash block b: waits for rows 4b..4b+3 only */
    if (dst) {
      XW_UNROLL
      for (uint32_t j = 0; j < 4; j++) xh_write_fast(dst, hl, 4 * b + j, w[4 * b + j]);
    }
    acc = half_block(sc, XW_CHUNK, b, hl, all, &w[4 * b], key, kscr, NULL, acc);
  }
  return half_merge(sc, XW_CHUNK, hl, all, acc);
}

/* Any other chunk (several pieces, misaligned, shorter), or a fast one beside such a chunk:
 * block by block through cursors; every length but 4096 stages what the last stripe or the
 * short paths need. The halves may take different branches here, so the shuffles name the
 * half only (hmask). */
__device__ __forceinline__ uint64_t half_slow(const k3k_xw_consts &sc, const xw_chunk &ch, int hl,
                                              unsigned hmask, uint8_t *stage) {
  xw_cur rcu, wcu;
  xw_cur_init(&ch, &rcu);
  xw_cur_init(&ch, &wcu);
  const uint32_t len = ch.len;
  uint64_t wb[4][2];
  if (len <= XW_MIDSIZE) { /* row 0 holds every byte */
    xh_read_block(&ch, &rcu, hl, 0, wb);
    xh_write_block(&ch, &wcu, hl, 0, wb);
    xh_stage_block(stage, len, hl, 0, wb);
    __syncwarp(hmask);
    return xw_short(stage, len, sc.secret); /* every lane of the half, same bytes */
  }
  uint64_t key[4][2], kscr;
  xh_lane_keys(sc.k64, hl, key, &kscr);
  uint64_t acc = sc.init[xh_lane_acc(hl)];
  const uint32_t nb = xw_nfull(len);
  XW_UNROLL
  for (uint32_t b = 0; b < 4; b++) {
    if (b <= nb) { /* uniform in the half */
      xh_read_block(&ch, &rcu, hl, b, wb);
      xh_write_block(&ch, &wcu, hl, b, wb);
      if (xh_staged(len)) {
        xh_stage_block(stage, len, hl, b, wb);
        if (b == nb) __syncwarp(hmask); /* the last stripe's bytes are staged */
      }
      acc = half_block(sc, len, b, hl, hmask, wb, key, kscr, stage, acc);
    }
  }
  return half_merge(sc, len, hl, hmask, acc);
}

/* Grid: ceil(warps / 4) blocks of 4 warps, warps = ceil(units / per); warp w hashes units
 * [w per, w per + per) (unit u = chunks 2u, 2u + 1; half h of the warp takes chunk 2u + h) and
 * writes their digests with one store of up to 64 bytes from lanes 0..2 per - 1. */
template <int NI>
__global__ void __launch_bounds__(XH_WARPS * 32, XH_MINB) xdev_kernel2(const __grid_constant__ xk_args<NI> a) {
  __shared__ k3k_xw_consts sc; /* lanes index the keys freely */
  __shared__ __align__(16) uint8_t sstage[XH_WARPS][2][XW_STAGE];
  __shared__ __align__(16) k3k_xent stab[NI > 0 ? NI : 1];
  static_assert(sizeof(k3k_xw_consts) % 8 == 0, "the constants copy in words");
  const int l = threadIdx.x & 31, wi = threadIdx.x >> 5, h = l >> 4, hl = l & 15;
  const unsigned hmask = 0xffffu << (16 * h);
  for (uint32_t t = threadIdx.x; t < sizeof sc / 8; t += XH_WARPS * 32)
    ((uint64_t *)&sc)[t] = ((const uint64_t *)&c_xw)[t];
  if (NI > 0)
    for (uint32_t t = threadIdx.x; t < 4 * a.n_ent; t += XH_WARPS * 32) ((uint64_t *)stab)[t] = inl_word(a, t);
  __syncthreads(); /* the only barrier: warps may leave from here on */
  const uint32_t n_units = xh_units(a.n_chunks);
  const uint32_t u0 = (blockIdx.x * XH_WARPS + wi) * a.per;
  if (u0 >= n_units) return;
  const uint32_t u1 = min(u0 + a.per, n_units);
  const k3k_xent *tab = NI > 0 ? stab : a.gtab;
  uint32_t g = warp_search(tab, a.n_groups, 2 * u0, l);
  uint64_t dig = 0;
  uint8_t *stage = sstage[wi][h];
  for (uint32_t u = u0; u < u1; u++) { /* warp-uniform trip count */
    const uint32_t c = 2 * u + (uint32_t)h;
    g = xh_step(tab, a.n_groups, g, 2 * u);
    __syncwarp(); /* the previous unit's reads of the stage are done */
    const bool valid = c < a.n_chunks; /* the second half of a job's last unit may have none */
    xw_chunk ch;
    if (valid) xw_resolve(tab, xh_step(tab, a.n_groups, g, c), c, &ch);
    uint64_t hv = 0;
    if (__all_sync(0xffffffffu, valid && xw_fast(&ch))) hv = half_fast(sc, ch.src, ch.dst, hl);
    else if (valid) hv = half_slow(sc, ch, hl, hmask, stage);
    const uint64_t d0 = __shfl_sync(0xffffffffu, hv, 0), d1 = __shfl_sync(0xffffffffu, hv, 16);
    dig = xh_gather(l, u - u0, d0, d1, dig);
  }
  if ((uint32_t)l < 2 * (u1 - u0) && 2 * u0 + (uint32_t)l < a.n_chunks) a.out[2 * u0 + l] = dig;
}

/* ---- launch ---- */

template <int NI>
static int launch_t(cudaStream_t st, const k3k_xk_caps *caps, int kernel, int path, uint32_t n_chunks,
                    uint32_t n_groups, const k3k_xent *ent, size_t n_ent, const k3k_xent *gtab, uint64_t *out) {
  xk_args<NI> a;
  memset(&a, 0, sizeof a);
  a.n_chunks = n_chunks;
  a.n_groups = n_groups;
  a.n_ent = NI > 0 ? (uint32_t)n_ent : 0;
  a.gtab = gtab;
  a.out = out;
  if (NI > 0) memcpy(a.inl, ent, n_ent * sizeof *ent);
  if (kernel == 1) {
    unsigned grid = (unsigned)((n_chunks + XK_WARPS - 1) / XK_WARPS);
    xdev_kernel<NI><<<grid, XK_WARPS * 32, 0, st>>>(a);
    K3K_LAUNCHED("xdev_kernel");
    return 0;
  }
  const uint32_t units = xh_units(n_chunks);
  a.per = xh_per_warp(units, caps->cap_warps[path - 1]);
  const uint32_t warps = xh_warps(units, a.per);
  xdev_kernel2<NI><<<(warps + XH_WARPS - 1) / XH_WARPS, XH_WARPS * 32, 0, st>>>(a);
  K3K_LAUNCHED("xdev_kernel2");
  return 0;
}

template <int NI>
static int cap_of(int sms, uint32_t *cap) {
  int nb = 0;
  K3K_CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, xdev_kernel2<NI>, XH_WARPS * 32, 0));
  if (nb < 1) {
    K3_ERROR("cuda xdev: xdev_kernel2<%d> cannot run on this device (occupancy 0)", NI);
    return K3_EDEVICE;
  }
  *cap = (uint32_t)(nb * sms * XH_WARPS);
  return 0;
}

int k3k_xk_setup(cudaStream_t st, int device, k3k_xk_caps *caps) {
  k3k_xw_consts cs;
  uint8_t secret[192];
  k3k_xxh3_secret(secret);
  xw_consts_init(&cs, secret);
  K3K_CU(cudaMemcpyToSymbolAsync(c_xw, &cs, sizeof cs, 0, cudaMemcpyHostToDevice, st));
  K3K_CU(cudaStreamSynchronize(st));
  int sms = 0, rc;
  K3K_CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if ((rc = cap_of<XK_NI_SMALL>(sms, &caps->cap_warps[0])) || (rc = cap_of<XK_NI_MID>(sms, &caps->cap_warps[1])) ||
      (rc = cap_of<XK_NI_BIG>(sms, &caps->cap_warps[2])) || (rc = cap_of<0>(sms, &caps->cap_warps[3])))
    return rc;
  return 0;
}

int k3k_xk_launch(cudaStream_t st, const k3k_xk_caps *caps, int kernel, uint32_t n_chunks, uint32_t n_groups,
                  const k3k_xent *hent, size_t n_ent, k3k_xent *dent, uint64_t *out, int *path) {
  if (n_ent <= XK_NI_SMALL) {
    *path = XK_PATH_SMALL;
    return launch_t<XK_NI_SMALL>(st, caps, kernel, *path, n_chunks, n_groups, hent, n_ent, NULL, out);
  }
  if (n_ent <= XK_NI_MID) {
    *path = XK_PATH_MID;
    return launch_t<XK_NI_MID>(st, caps, kernel, *path, n_chunks, n_groups, hent, n_ent, NULL, out);
  }
  if (n_ent <= XK_NI_BIG) {
    *path = XK_PATH_BIG;
    return launch_t<XK_NI_BIG>(st, caps, kernel, *path, n_chunks, n_groups, hent, n_ent, NULL, out);
  }
  *path = XK_PATH_DEVICE;
  K3K_CU(cudaMemcpyAsync(dent, hent, n_ent * sizeof(k3k_xent), cudaMemcpyHostToDevice, st));
  return launch_t<0>(st, caps, kernel, *path, n_chunks, n_groups, NULL, 0, dent, out);
}
