/* CUDA (sm_90a): MLA absorbed decode attention with TMA bulk tensor copies and wgmma.
 *
 * What it is for: the hot decode path of MLA_DECODE (spec §4.3) at page sizes that are
 * multiples of 8. One block per (48-head group, KV split, sequence) streams the sequence's
 * latent cache in 64-token tiles (64 x 576 bf16 = 72 KB) through two shared-memory stages
 * filled by TMA (cp.async.bulk.tensor, 128-byte swizzle, mbarrier completion) and feeds both
 * products to the tensor cores with wgmma straight from shared memory:
 *   S^T [64 tok x 48 heads] = K_tile [64 x 576] . Q^T         (36 x m64n48k16, K-major A and B)
 *   O^T [512 x 48]         += V_tile^T [512 x 64] . P^T       (V = K_tile[:, :512], M-major A)
 * Heads are the wgmma N dimension, so 48 heads need no padding (M would have to be 64). A head
 * count that is not a multiple of 48 (any multiple of 8: the 48B's 32) runs its last group with
 * the padding heads' Q rows zeroed in shared memory and their outputs not written.
 * Warp roles (256 threads): warpgroup 0 computes S, the online softmax (fp32 exp2) and P
 * (bf16, swizzled K-major), hands P over with a named barrier and goes on to the next tile;
 * warpgroup 1 keeps all of O^T (192 fp32 per thread) and does P.V. The tensor cores take P.V of
 * tile i before S of tile i+1 (warpgroup 0 waits at named barrier 8 until P.V is issued): the
 * stage of tile i is then released ~1.2 K cycles sooner, which is the refill window of a
 * 2-stage ring. Warpgroup 0 publishes the rescale flag and alpha (barrier 6/7) before it builds
 * P (barrier 2/3), so warpgroup 1's O^T rescale is off the path to the P.V issue. The softmax
 * rescales lazily: a
 * head keeps its reference max while the tile's scores stay within 2^8 of it (one OR vote over
 * the warpgroup, bar.red), and only a tile that breaks that for some head pays the exact step
 * (per-head max across the 4 warps through shared memory, alpha for warpgroup 1); at random
 * data that is tile 0 alone. Warpgroup 1's first thread issues the TMA copies (no separate
 * producer warp: ptxas sizes registers for whole warpgroups, and a third one would cap a
 * thread at 168); it refills a stage in two batches as P.V releases its blocks (see the
 * kernel). Warpgroup 0's thread 0 looks up the pool rows of tile i+3 and prefetches it into L2
 * before waiting for tile i (since session 10; probe 4096 = the producer thread did it).
 * S of tile i+1 is issued as soon as tile i+1 landed, ahead of P.V(i) if it comes to that.
 * Benchmark variants (probe bits, all correct): 2048 queues S(i+1) behind P.V(i) (sessions
 * 3-16); 16384 prefetches 5 tiles ahead; 32768 splits S over the two refill batches (their own
 * mbarriers, two accumulator chains).
 * What it is not: the op (mla.cu builds q_lat, picks this kernel or the mma.sync one, merges
 * splits); page sizes that are not multiples of 8 (mla.cu's kernel takes those).
 * Invariants: shared tiles are 1024-byte aligned (128-byte swizzle atoms); token rows past the
 * split end are zeroed in shared memory before P.V (pool rows there may hold anything, and
 * 0 * NaN would poison O); every mbarrier wait but split S's in-pipe one is bounded (a trap,
 * not a hang, if a phase never completes; the in-pipe wait follows one on full[s] of the same
 * refill, whose second batch was issued by then). */
#include <cuda.h> /* CUtensorMap and its enums only; the encoder comes from the runtime */
#include <string.h>

#include "mla_decode.cuh"

#define WG_D 576
#define WG_DV 512
#define WG_TILE 64
#define WG_HB 48
#define WG_THREADS 256
#define WG_TILE_BYTES (WG_TILE * WG_D * 2)  /* 73728: 9 blocks of 64 rows x 128 B */
#define WG_KBLK (WG_TILE * 128)              /* 8192: one 64-column block of a tile */
#define WG_QBLK (WG_HB * 128)                /* 6144: one 64-column block of Q */
#define WG_Q_BYTES (WG_HB * WG_D * 2)        /* 55296 */
#define WG_P_BYTES (WG_HB * 128)             /* 6144: P^T [48 heads][64 tok] bf16 */
/* Shared layout (offsets from a 1024-aligned base). */
#define WG_OFF_Q (2 * WG_TILE_BYTES)
#define WG_OFF_P (WG_OFF_Q + WG_Q_BYTES)
#define WG_OFF_RED (WG_OFF_P + 2 * WG_P_BYTES)   /* [2][4][48] fp32 column maxima */
#define WG_OFF_AL (WG_OFF_RED + 2 * 4 * WG_HB * 4) /* [2][48] fp32 alpha, then [2] int rescale */
#define WG_OFF_FIN (WG_OFF_AL + 2 * WG_HB * 4 + 16) /* [4][48] l partials + [48] m */
#define WG_OFF_ROWS (WG_OFF_FIN + 5 * WG_HB * 4)  /* [4][8] int: pool rows of a tile's runs */
#define WG_OFF_BAR (WG_OFF_ROWS + 4 * 8 * 4)      /* full[2], q, fullB[2]: 5 x 8 B */
#define WG_SMEM (WG_OFF_BAR + 5 * 8 + 1024)       /* + alignment slack */
/* Lazy rescaling: a tile whose scores exceed the running reference max by at most this much
 * (log2 units) keeps the old reference, so P <= 2^8 (exact in bf16's 8-bit exponent; l and O
 * stay far from fp32 overflow: 8192 tokens x 256) and no per-head max is exchanged. */
#define WG_LAZY 8.0f
/* Probe 16384: L2 prefetch distance in tiles (the default prefetches with the page lookup, 3
 * tiles ahead). 64 sequences x 5 tiles x 72 KB = 23 MB of the 60 MB L2 (the two head groups
 * of a sequence share their tiles). */
#define WG_PF_FAR 5

/* ---- PTX wrappers ---- */
__device__ __forceinline__ unsigned smem_u32(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase of parity `par` completed. Bounded: ~2^31 polls (seconds) then trap,
 * so a lost arrival surfaces as a launch failure instead of a hung stream. */
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned par) {
  for (unsigned n = 0;; n++) {
    unsigned ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(par)
        : "memory");
    if (ok) return;
    if (n > (1u << 31)) __trap();
  }
}
/* The same wait with its poll loop inside one asm block and no bound: placed between two
 * wgmma accumulator chains (each its own commit group), it does not make ptxas serialise
 * them (checked with -Xptxas -v: no C7520), unlike the C loop of mbar_wait. */
__device__ __forceinline__ void mbar_wait_in_pipe(unsigned bar, unsigned par) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(par)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap *map, int x, int y,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"((uint64_t)map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
/* Pulls a box into L2 only (no shared memory, no completion to wait for). */
__device__ __forceinline__ void tma_prefetch_2d(const CUtensorMap *map, int x, int y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(
                   (uint64_t)map),
               "r"(x), "r"(y)
               : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* Pins accumulator registers at this point of the program, so the compiler moves no access of
 * them across a wgmma issue or wait (the asm statements do not name the in-flight registers). */
template <int N>
__device__ __forceinline__ void fence_regs(float *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle. K-major operands: rows of 128 B, 8-row
 * groups 1024 B apart (SBO); LBO unused. The M-major V operand: 64 dims (128 B) x 8 tokens per
 * atom, token groups 1024 B apart; with a 64-wide M tile the other offset is unused, so both
 * are set to 1024 and either reading of the two fields gives the same matrix. */
__device__ __forceinline__ uint64_t sdesc(unsigned addr, unsigned lbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

/* The descriptor of addr + off from the one of addr: the start address field (addr >> 4, 14
 * bits, shared addresses < 256 KB) is the low bits, so a constant offset is one 32-bit add
 * instead of rebuilding the descriptor per wgmma (~5 uniform ops each, measured in the issue
 * loop). off must keep the address inside the shared window. */
__device__ __forceinline__ uint64_t dplus(uint64_t d, unsigned off) {
  return (d & 0xFFFFFFFF00000000ull) | (uint64_t)((unsigned)d + (off >> 4));
}

/* d[24] (+)= A . B, m64n48k16, bf16 in, fp32 accumulate; tA = 1: A is M-major. */
template <int TA>
__device__ __forceinline__ void wgmma48(float *d, uint64_t da, uint64_t db, int accum) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
      "%24, %25, p, 1, 1, %27, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(da), "l"(db), "r"(accum), "n"(TA));
}

template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ float ex2f(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
/* OR of v over the `n` threads of named barrier `id` (they also synchronise there). */
__device__ __forceinline__ bool bar_red_or(int id, int n, bool v) {
  unsigned r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"((unsigned)v), "r"(id), "r"(n)
      : "memory");
  return r != 0;
}

/* Output of warpgroup 1's O^T (all 512 dims) for its 12 head columns. */
__device__ __forceinline__ void wg_store(const k3k_cu_mla_decode_args &a, float (*o)[24],
                                         const float *il, int split, int b, int hbase, int wq,
                                         int g, int t4) {
  size_t nrow = (size_t)a.batch * a.heads;
#pragma unroll
  for (int mt = 0; mt < 8; mt++)
#pragma unroll
    for (int j = 0; j < 6; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int dim = 64 * mt + 16 * wq + g + 8 * (e >> 1);
        int head = 8 * j + 2 * t4 + (e & 1);
        if (hbase + head >= a.heads) continue; /* padding head of a partial group */
        size_t orow = (size_t)b * a.heads + hbase + head;
        float v = o[mt][4 * j + e] * il[2 * j + (e & 1)];
        if (gridDim.y == 1)
          a.out[orow * WG_DV + dim] = f2bf(v);
        else
          a.work[((size_t)split * nrow + orow) * WG_DV + dim] = v;
      }
}

/* 1/l of this thread's 12 head columns from the 4 warps' partial sums (0 for an empty split). */
__device__ __forceinline__ void wg_inv_l(const float *fin, float *il, int t4, bool empty) {
#pragma unroll
  for (int c = 0; c < 12; c++) {
    int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
    float l = fin[head] + fin[WG_HB + head] + fin[2 * WG_HB + head] + fin[3 * WG_HB + head];
    il[c] = empty ? 0.f : 1.0f / l;
  }
}

/* A stage is refilled in two batches as P.V of the tile in it finishes with its blocks: the
 * rope block 8 (read by S alone) and blocks 0-3 once P.V's M tiles 0-3 are done, blocks 4-7 once
 * all of P.V is, so the next-but-one tile's loads start ~500 cycles earlier than after the
 * whole tile (the 2-stage ring cannot grow: 3 stages do not fit next to Q). S reads of the
 * stage need no release of their own: warpgroup 0 finished S before it handed P over, which
 * is before warpgroup 1 works on the tile at all. `full` counts the 2 batches' expect_tx
 * arrivals plus their TMA bytes; warpgroup 1 tells its producer thread that all 4 warps' wgmma
 * reads completed with named barrier 5. The pool rows of a tile's runs are looked up once,
 * three tiles ahead, into shared memory (a page-table load on the issue path costs ~600
 * cycles), and the tile is prefetched into L2 then (ahead()).
 * Named barriers: 0 block, 1 warpgroup 0 (vote, max exchange), 2/3 P of stage 0/1, 4 end,
 * 5 warpgroup 1 (its P.V reads done), 6/7 flag + alpha of stage 0/1, 8 P.V issued. */
__global__ void __launch_bounds__(WG_THREADS, 1)
    mla_wg_kernel(const __grid_constant__ CUtensorMap tkv, const __grid_constant__ CUtensorMap tq,
                  k3k_cu_mla_decode_args a, int chunk, int box_rows) {
  extern __shared__ unsigned char smem_raw[];
  /* Aligned by pointer arithmetic on the shared array (not through an integer), so the
   * compiler keeps every access below in the shared space (STS/LDS, not generic ST/LD). */
  unsigned char *sm = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const unsigned s0 = smem_u32(sm);
  float *red = (float *)(sm + WG_OFF_RED), *alpha_s = (float *)(sm + WG_OFF_AL);
  int *resc_s = (int *)(sm + WG_OFF_AL + 2 * WG_HB * 4);
  float *fin = (float *)(sm + WG_OFF_FIN);
  int *rows_s = (int *)(sm + WG_OFF_ROWS);
  const unsigned bar0 = s0 + WG_OFF_BAR; /* full[s] = bar0 + 8s, q = bar0 + 16 */
  const unsigned qbar = bar0 + 16;
  /* Probe 32768 (split S): the refill's two batches complete on their own barriers, full[s]
   * (blocks 8, 0-3) and fullB[s] = bar0 + 24 + 8s (blocks 4-7), and S runs as two accumulator
   * chains: blocks 8, 0-3 as soon as batch 0 landed, blocks 4-7 after batch 1 (the refill of a
   * stage starts with batch 0 when P.V's first half is done, so S of the next-but-one tile can
   * start before the whole tile is there). Otherwise both batches complete on full[s]. */
  const bool split_s = (a.probe & 32768) != 0;
  const int split = blockIdx.y, b = blockIdx.z, hbase = blockIdx.x * WG_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int len = a.seq_lens[(size_t)b * a.sl_stride];
  const int tok0 = split * chunk, tok1 = min(len, tok0 + chunk);
  const int ntiles = tok1 > tok0 ? (tok1 - tok0 + WG_TILE - 1) / WG_TILE : 0;
  if ((a.probe & 8) && blockIdx.x > 0) return;

  if (tid == 0) {
    for (int s = 0; s < 2; s++) {
      mbar_init(bar0 + 8 * s, split_s ? 1 : 2);
      mbar_init(bar0 + 24 + 8 * s, 1);
    }
    mbar_init(qbar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  /* Producer (thread 128, warpgroup 1). A tile is 64/box_rows runs of box_rows rows, each
   * inside one page. ahead(i), three tiles before tile i's loads can start, looks up the runs'
   * pool rows (into slot i & 3 for issue) and prefetches the tile into L2, so the loads that
   * refill a stage hit L2: with two stages the window between a stage's release and its next
   * use is short, and HBM latency was the bound (probes: no loads 241 us, all 359 us). */
  const int32_t *bt = a.block_table + (size_t)b * a.pt_stride;
  auto tile_runs = [&](int i) {
    int ts = tok0 + i * WG_TILE, nv = min(WG_TILE, tok1 - ts);
    return (nv + box_rows - 1) / box_rows;
  };
  auto ahead = [&](int i, int page0) { /* page0: the page of the tile's first token */
    int ts = tok0 + i * WG_TILE, nseg = tile_runs(i);
    for (int sg = 0; sg < nseg; sg++) {
      int t = ts + sg * box_rows;
      int row = (sg ? bt[t / a.page_size] : page0) * a.page_size + t % a.page_size;
      rows_s[(i & 3) * 8 + sg] = row;
      if (!(a.probe & (32 | 16384)))
        for (int j = 0; j < 9; j++) tma_prefetch_2d(&tkv, 64 * j, row);
    }
  };
  /* Probe 16384 (far prefetch): tile i goes to L2 WG_PF_FAR tiles ahead instead of with its
   * page lookup 3 ahead (warpgroup 0's thread 0; page0 loaded an iteration earlier). */
  auto l2_far = [&](int i, int page0) {
    int ts = tok0 + i * WG_TILE, nseg = tile_runs(i);
    for (int sg = 0; sg < nseg; sg++) {
      int t = ts + sg * box_rows;
      int row = (sg ? bt[t / a.page_size] : page0) * a.page_size + t % a.page_size;
      for (int j = 0; j < 9; j++) tma_prefetch_2d(&tkv, 64 * j, row);
    }
  };
  /* Batch 0: blocks 8, 0-3; batch 1: blocks 4-7; each one expect_tx arrival on full. */
  auto issue = [&](int i, int batch) {
    const unsigned fb = bar0 + 8 * (i & 1) + (split_s && batch ? 24 : 0);
    if ((a.probe & 32) && i >= 2) { /* timing probe: reuse the resident tiles, no loads */
      mbar_arrive(fb);
      return;
    }
    const int nseg = tile_runs(i), nblk = batch ? 4 : 5;
    mbar_expect_tx(fb, (unsigned)(nblk * nseg * box_rows * 128));
    const unsigned dst = s0 + (i & 1) * WG_TILE_BYTES;
    for (int sg = 0; sg < nseg; sg++) {
      int row = rows_s[(i & 3) * 8 + sg];
      for (int k = 0; k < nblk; k++) {
        int j = batch ? 4 + k : (k == 0 ? 8 : k - 1);
        tma_load_2d(dst + j * WG_KBLK + sg * box_rows * 128, &tkv, 64 * j, row, fb);
      }
    }
  };
  if (tid == 128 && ntiles > 0) {
    mbar_expect_tx(qbar, WG_Q_BYTES);
    for (int j = 0; j < 9; j++)
      tma_load_2d(s0 + WG_OFF_Q + j * WG_QBLK, &tq, 64 * j, b * a.heads + hbase, qbar);
    for (int i = 0; i < 3 && i < ntiles; i++) {
      ahead(i, bt[(tok0 + i * WG_TILE) / a.page_size]);
      if (i < 2) issue(i, 0), issue(i, 1);
    }
  }

  const int wg = w >> 2, wq = w & 3, g = lane >> 2, t4 = lane & 3;
  const bool math = !(a.probe & 2);
  /* S(i+1) may run ahead of P.V(i) (session 17: 308 against 318-342 µs with the order kept,
   * B = 64 x 8K); probe 2048 keeps the order of sessions 3-16 (P.V(i) queued first, barrier 8),
   * which paid while warpgroup 1's producer thread also did the lookups (probe 4096). */
  const bool order = (a.probe & 2048) != 0;
  /* Who looks up and L2-prefetches tile i+3: warpgroup 0's thread 0 during S of tile i
   * (default), or warpgroup 1's producer thread after the P.V issue (probe 4096, the kernel as
   * measured on 2026-11-29). Either writes rows_s slot (i+3)&3 before the barrier that lets
   * the refill of tile i+3 (iteration i+1 of warpgroup 1) read it: bar 6/7 of tile i+1. */
  const bool ahead_wg0 = !(a.probe & 4096);
  /* The two warpgroups run separate loops, so each keeps only its own state live (warpgroup
   * 1's 192 accumulators never share registers with warpgroup 0's softmax state). */
  if (wg == 0) {
    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */
    const bool lazy = !(a.probe & 1024);
    /* Column c = 2j + k of this thread is head 8j + 2t4 + k. m_c is the reference max of the
     * head (the same in every thread of the warpgroup), l_c this thread's share of its sum. */
    float m_c[12], l_c[12];
#pragma unroll
    for (int c = 0; c < 12; c++) m_c[c] = -INFINITY, l_c[c] = 0.f;
    int page_nx = 0; /* first page of tile i+3 (thread 0, ahead_wg0) */
    if (ahead_wg0 && tid == 0 && ntiles > 3) page_nx = bt[(tok0 + 3 * WG_TILE) / a.page_size];
    /* Far prefetch (probe 16384, warpgroup 0's thread 0): tiles 3 .. WG_PF_FAR - 1 now, then
     * tile i + WG_PF_FAR at iteration i (tiles 0-2 were prefetched by the producer's prologue
     * lookups: ahead() skips its own prefetch under this probe, so do those here too). */
    const bool far = (a.probe & 16384) && ahead_wg0 && !(a.probe & 32);
    int page_far = 0;
    if (far && tid == 0) {
      for (int j = 0; j < WG_PF_FAR && j < ntiles; j++)
        l2_far(j, bt[(tok0 + j * WG_TILE) / a.page_size]);
      if (WG_PF_FAR < ntiles) page_far = bt[(tok0 + WG_PF_FAR * WG_TILE) / a.page_size];
    }
    if (ntiles > 0) mbar_wait(qbar, 0);
    /* A partial head group (heads % 48 != 0, e.g. the 48B's 32): the Q box also brought the
     * next rows of the q buffer; zero them so the padding heads score 0 everywhere and nothing
     * of another sequence reaches the softmax vote. Whole 128-byte rows of each 64-column block,
     * so the swizzle does not matter. */
    const int valid = min(WG_HB, a.heads - hbase);
    if (valid < WG_HB && ntiles > 0) {
      for (int i = tid; i < 9 * (WG_HB - valid) * 8; i += 128) {
        int j = i / ((WG_HB - valid) * 8), r = i % ((WG_HB - valid) * 8);
        *(uint4 *)(sm + WG_OFF_Q + j * WG_QBLK + (valid + r / 8) * 128 + (r % 8) * 16) =
            make_uint4(0, 0, 0, 0);
      }
      fence_async_smem(); /* generic-proxy writes read next by wgmma (async proxy) */
      bar_sync(1, 128);
    }
    for (int i = 0; i < ntiles; i++) {
      const int s = i & 1;
      const unsigned par = (i >> 1) & 1;
      const uint64_t dk = sdesc(s0 + s * WG_TILE_BYTES, 16), dq = sdesc(s0 + WG_OFF_Q, 16);
      const int ts = tok0 + i * WG_TILE, nv = min(WG_TILE, tok1 - ts);
      float sc[24];
#pragma unroll
      for (int k = 0; k < 24; k++) sc[k] = 0.f;
      /* Tile i+3's page lookup and L2 prefetch, before waiting for tile i (warpgroup 0 mostly
       * waits there anyway), with the page id loaded one iteration earlier. Off warpgroup 1's
       * producer thread, whose refill issues gate that warpgroup's barrier 5 (probe 4096: the
       * old placement). Not between the S commit and its wait: ptxas then serialises the wgmma
       * pipeline (C7514). */
      if (ahead_wg0 && tid == 0 && i + 3 < ntiles) {
        ahead(i + 3, page_nx);
        if (i + 4 < ntiles) page_nx = bt[(tok0 + (i + 4) * WG_TILE) / a.page_size];
      }
      if (far && tid == 0 && i + WG_PF_FAR < ntiles) {
        l2_far(i + WG_PF_FAR, page_far);
        if (i + WG_PF_FAR + 1 < ntiles)
          page_far = bt[(tok0 + (i + WG_PF_FAR + 1) * WG_TILE) / a.page_size];
      }
      /* S^T = K Q^T once the whole tile landed (an mbarrier poll between the wgmma issues of one
       * accumulator chain makes ptxas serialise them: it sees a divergent loop inside the
       * pipeline); under probe 32768 once batch 0 landed, batch 1 waited for between chains. */
      mbar_wait(bar0 + 8 * s, par);
      /* Probe 2048: P.V of the previous tile goes to the tensor cores first (its stage is then
       * released ~1.2 K cycles sooner, the refill window of sessions 3-9). */
      if (i > 0 && order) bar_sync(8, 256);
      if (math && !split_s) {
        fence_regs<24>(sc);
        wg_fence();
#pragma unroll
        for (int j = 0; j < 9; j++) {
#pragma unroll
          for (int kk = 0; kk < 4; kk++)
            wgmma48<0>(sc, dplus(dk, j * WG_KBLK + kk * 32), dplus(dq, j * WG_QBLK + kk * 32),
                       j + kk > 0);
        }
        wg_commit();
        wg_wait<0>();
        fence_regs<24>(sc);
      } else if (math) {
        /* split S (probe 32768): blocks 8, 0-3 into sc, then blocks 4-7 into sb once batch 1
         * landed; two chains, two commit groups, the wait between them. */
        float sb[24];
#pragma unroll
        for (int k = 0; k < 24; k++) sb[k] = 0.f;
        fence_regs<24>(sc);
        fence_regs<24>(sb);
        wg_fence();
#pragma unroll
        for (int jj = 0; jj < 5; jj++) {
          const int j = jj == 0 ? 8 : jj - 1;
#pragma unroll
          for (int kk = 0; kk < 4; kk++)
            wgmma48<0>(sc, dplus(dk, j * WG_KBLK + kk * 32), dplus(dq, j * WG_QBLK + kk * 32),
                       jj + kk > 0);
        }
        wg_commit();
        mbar_wait_in_pipe(bar0 + 24 + 8 * s, par);
        wg_fence();
#pragma unroll
        for (int j = 4; j < 8; j++) {
#pragma unroll
          for (int kk = 0; kk < 4; kk++)
            wgmma48<0>(sb, dplus(dk, j * WG_KBLK + kk * 32), dplus(dq, j * WG_QBLK + kk * 32),
                       j + kk > 4);
        }
        wg_commit();
        wg_wait<0>();
        fence_regs<24>(sc);
        fence_regs<24>(sb);
#pragma unroll
        for (int k = 0; k < 24; k++) sc[k] += sb[k];
      } else if (split_s) {
        mbar_wait(bar0 + 24 + 8 * s, par); /* no-wgmma probe: the whole tile before zeroing */
      }
      /* Mask rows past the split end and scale; then the lazy test per column (this thread's
       * 2 rows), OR-ed over the warpgroup. */
      if (nv < WG_TILE) {
#pragma unroll
        for (int j = 0; j < 6; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            int row = 16 * wq + g + 8 * (e >> 1);
            sc[4 * j + e] = row < nv ? sc[4 * j + e] * sl2 : -INFINITY;
          }
      } else {
#pragma unroll
        for (int k = 0; k < 24; k++) sc[k] *= sl2;
      }
      float loc[12];
      bool need = !lazy;
#pragma unroll
      for (int c = 0; c < 12; c++) {
        loc[c] = fmaxf(sc[4 * (c >> 1) + (c & 1)], sc[4 * (c >> 1) + 2 + (c & 1)]);
        need |= loc[c] > m_c[c] + WG_LAZY;
      }
      const bool resc = bar_red_or(1, 128, need);
      float al[12];
      if (resc) {
        /* Exact step: per-head max over the 64 tokens (8 row-lanes, then the 4 warps through
         * shared memory), new reference, alpha for warpgroup 1's O^T. */
        float *rd = red + s * 4 * WG_HB;
#pragma unroll
        for (int c = 0; c < 12; c++) {
          float v = loc[c];
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
          if (g == 0) rd[wq * WG_HB + 8 * (c >> 1) + 2 * t4 + (c & 1)] = v;
        }
        bar_sync(1, 128);
#pragma unroll
        for (int c = 0; c < 12; c++) {
          int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
          float mx = fmaxf(fmaxf(rd[head], rd[WG_HB + head]),
                           fmaxf(rd[2 * WG_HB + head], rd[3 * WG_HB + head]));
          float mn = fmaxf(m_c[c], mx); /* finite: every tile holds a valid token */
          al[c] = ex2f(m_c[c] - mn);
          m_c[c] = mn;
          if (wq == 0 && g == 0) alpha_s[s * WG_HB + head] = al[c];
        }
      } else {
#pragma unroll
        for (int c = 0; c < 12; c++) al[c] = 1.f;
      }
      if (tid == 0) resc_s[s] = resc;
      bar_arrive(6 + s, 256); /* flag and alpha out: warpgroup 1 rescales O^T while P is built */
      /* Token rows past the end: zero them (all 576 columns) for P.V. Swizzling permutes
       * 16-byte chunks within a 128-byte row, so whole rows are zeroed without it. No refill
       * can target this stage: a partial tile is the split's last. */
      if (nv < WG_TILE) {
        int n16 = (WG_TILE - nv) * 9 * 8;
        for (int x = tid; x < n16; x += 128) {
          int r = nv + x / 72, rem = x % 72;
          *(uint4 *)(sm + s * WG_TILE_BYTES + (rem >> 3) * WG_KBLK + r * 128 + (rem & 7) * 16) =
              make_uint4(0, 0, 0, 0);
        }
      }
      unsigned char *pp = sm + WG_OFF_P + s * WG_P_BYTES;
#pragma unroll
      for (int c = 0; c < 12; c++) {
        int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
        float p0 = ex2f(sc[4 * (c >> 1) + (c & 1)] - m_c[c]);
        float p1 = ex2f(sc[4 * (c >> 1) + 2 + (c & 1)] - m_c[c]);
        l_c[c] = l_c[c] * al[c] + (p0 + p1);
        /* P^T[head][tok], 128-byte rows, 16-byte chunk index XOR (head & 7). */
        int tk0 = 16 * wq + g, tk1 = tk0 + 8;
        *(uint16_t *)(pp + head * 128 + (((tk0 >> 3) ^ (head & 7)) << 4) + (tk0 & 7) * 2) =
            f2bf(p0);
        *(uint16_t *)(pp + head * 128 + (((tk1 >> 3) ^ (head & 7)) << 4) + (tk1 & 7) * 2) =
            f2bf(p1);
      }
      fence_async_smem(); /* P and zeroed rows: generic stores read next by wgmma */
      bar_arrive(2 + s, 256); /* P ready; this warpgroup goes on to the next tile's S */
    }
    /* Row statistics: l summed over the 8 row-lanes and the 4 warps. */
#pragma unroll
    for (int c = 0; c < 12; c++) {
      float v = l_c[c];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
      if (g == 0) fin[wq * WG_HB + head] = v;
    }
    bar_sync(4, 256);
    float il[12];
    wg_inv_l(fin, il, t4, ntiles == 0);
    if (gridDim.y > 1 && wq == 0 && g == 0) {
      size_t nrow = (size_t)a.batch * a.heads;
#pragma unroll
      for (int c = 0; c < 12; c++) {
        int head = 8 * (c >> 1) + 2 * t4 + (c & 1);
        if (hbase + head >= a.heads) continue; /* padding head of a partial group */
        size_t orow = (size_t)b * a.heads + hbase + head;
        a.work[(size_t)gridDim.y * nrow * WG_DV + (size_t)split * nrow + orow] =
            ntiles == 0 ? -INFINITY : m_c[c] + log2f(1.0f / il[c]);
      }
    }
  } else {
    /* Warpgroup 1: all of O^T [512 x 48] (8 M tiles of m64n48, 192 fp32 per thread). */
    float o[8][24];
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
      for (int i = 0; i < 24; i++) o[mt][i] = 0.f;
    for (int i = 0; i < ntiles; i++) {
      const int s = i & 1;
      const unsigned par = (i >> 1) & 1;
      const uint64_t dv = sdesc(s0 + s * WG_TILE_BYTES, 1024);
      const uint64_t dp = sdesc(s0 + WG_OFF_P + s * WG_P_BYTES, 16);
      const bool refill = tid == 128 && i + 2 < ntiles;
      /* Tile i+3's page-table load is issued here and used after P.V is issued (ahead() on
       * the path to the P.V issue delayed it, and warpgroup 0 waits for that issue). */
      const bool ah = !ahead_wg0 && tid == 128 && i + 3 < ntiles;
      int page3 = 0;
      if (ah) page3 = bt[(tok0 + (i + 3) * WG_TILE) / a.page_size];
      bar_sync(6 + s, 256); /* the rescale flag and alpha of this tile */
      {
        /* alpha of this tile's heads, 1 when warpgroup 0 kept the reference max. The multiply is
         * unconditional: a branch around it makes ptxas serialise the wgmma pipeline. */
        const bool resc = resc_s[s] != 0;
        float al[12];
#pragma unroll
        for (int c = 0; c < 12; c++) {
          float v = alpha_s[s * WG_HB + 8 * (c >> 1) + 2 * t4 + (c & 1)];
          al[c] = resc ? v : 1.f;
        }
#pragma unroll
        for (int mt = 0; mt < 8; mt++)
#pragma unroll
          for (int k = 0; k < 24; k++) o[mt][k] *= al[2 * (k >> 2) + (k & 1)];
      }
      bar_sync(2 + s, 256); /* P of this tile */
      mbar_wait(bar0 + 8 * s, par); /* TMA bytes visible here too */
      if (split_s) mbar_wait(bar0 + 24 + 8 * s, par);
      if (math) {
#pragma unroll
        for (int mt = 0; mt < 8; mt++) fence_regs<24>(o[mt]);
        wg_fence();
        /* Two commit groups (M tiles 0-3, 4-7): the first half's blocks refill early. */
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
          for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int mt = 4 * h; mt < 4 * h + 4; mt++)
              wgmma48<1>(o[mt], dplus(dv, mt * WG_KBLK + kk * 2048), dplus(dp, kk * 32), 1);
          wg_commit();
        }
      }
      if (i + 1 < ntiles && order) bar_arrive(8, 256); /* warpgroup 0 may queue S(i+1) */
      if (ah) ahead(i + 3, page3);
      wg_wait<1>();
      bar_sync(5, 128); /* all 4 warps' reads of blocks 0-3 (and S's of block 8) are done */
      if (refill) issue(i + 2, 0);
      wg_wait<0>();
      bar_sync(5, 128);
      if (refill) issue(i + 2, 1);
#pragma unroll
      for (int mt = 0; mt < 8; mt++) fence_regs<24>(o[mt]);
    }
    bar_sync(4, 256);
    float il[12];
    wg_inv_l(fin, il, t4, ntiles == 0);
    wg_store(a, o, il, split, b, hbase, wq, g, t4);
  }
}

/* ---- host side ---- */

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, looked up once through the runtime (no libcuda link). */
static encode_tiled_fn encoder(void) {
  static encode_tiled_fn fn;
  if (!fn) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (encode_tiled_fn)p;
  }
  return fn;
}

/* 2-D bf16 map over rows of 576 elements, box 64 columns x box_rows rows, 128-byte swizzle. */
static int make_map(CUtensorMap *m, const void *base, int64_t rows, int box_rows,
                    CUtensorMapL2promotion l2) {
  encode_tiled_fn fn = encoder();
  if (!fn) {
    K3_ERROR("mla_decode: cuTensorMapEncodeTiled not available from the driver");
    return K3_EDEVICE;
  }
  cuuint64_t dims[2] = {WG_D, (cuuint64_t)rows}, strides[1] = {WG_D * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, es[2] = {1, 1};
  CUresult r = fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    K3_ERROR("mla_decode: cuTensorMapEncodeTiled failed (%d), rows %lld box %d", (int)r,
             (long long)rows, box_rows);
    return K3_EDEVICE;
  }
  return 0;
}

bool mla_wg_ok(const k3k_cu_mla_decode_args *a) {
  return a->page_size > 0 && a->page_size % 8 == 0 && a->heads > 0 && a->heads % 8 == 0 &&
         a->pages * a->page_size < (1ll << 31) && encoder() != NULL;
}

int mla_wg_launch(cudaStream_t st, const k3k_cu_mla_decode_args *a, int splits, int chunk) {
  int box_rows = 64;
  while (a->page_size % box_rows) box_rows >>= 1; /* >= 8: mla_wg_ok */
  CUtensorMap tkv, tq;
  const CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  int rc = make_map(&tkv, a->kv, a->pages * a->page_size, box_rows, l2);
  /* a partial last head group reads WG_HB rows past the end (mla_decode.cuh) */
  const int64_t qrows = (int64_t)a->batch * a->heads + (a->heads % WG_HB ? WG_HB : 0);
  if (!rc) rc = make_map(&tq, a->q, qrows, WG_HB, l2);
  if (rc) return rc;
  K3K_CU(cudaFuncSetAttribute(mla_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              WG_SMEM));
  mla_wg_kernel<<<dim3((a->heads + WG_HB - 1) / WG_HB, splits, a->batch), WG_THREADS, WG_SMEM, st>>>(
      tkv, tq, *a, chunk, box_rows);
  K3K_LAUNCHED("mla_decode_wg");
  return 0;
}
