/* Grouped MXFP4 W4A16 expert GEMM, decode form, fed by TMA bulk copies through a shared-memory
 * ring (mx_dec_tma; k3k_cu_moe_gemm picks it for rows_hint <= 16).
 *
 * What it is for: at decode (a few tokens per expert) the expert GEMMs only stream weights, and
 * what bounds them is how many bytes each SM keeps in flight (docs/perf-gpu-moe.md). Here one
 * block per SM is persistent over a contiguous range of work items; an item is one expert's 16
 * output rows (fused: the gate rows and the same up rows; plain: 32 rows as two 16-row tiles),
 * i.e. two stages of 16 contiguous weight rows each. A producer warp (one thread issuing
 * cp.async.bulk per row plus one for the 16 rows' scales, completion on a per-stage "full"
 * mbarrier) keeps a ring of 5-8 stages (~150-210 KB) filled, so the copies run continuously
 * while 8 consumer warps compute: each warp takes a K range of every stage (chunks of 128 k),
 * dequantises in registers right at its mma.sync (dq, mxfp4_tc.cuh) and releases the stage on
 * its "empty" mbarrier; the 8 partial 16×8 tiles meet in a double-buffered shared reduction
 * buffer, and all 256 consumer threads share the epilogue (SiTU / SiLU·mul / plain store).
 * x rows (gathered through the plan) stay in registers while consecutive items need the same
 * tokens (always at batch 1).
 * What it is not: the prefill kernel or the cp.async decode kernel (mxfp4_tc.cu), which remains
 * for shapes whose 16-row stage does not fit the ring at least 3 deep.
 * Invariants: same arithmetic as the cp.async decode kernel (results differ from the reference
 * chain only by fp32 summation order); producer and consumers walk the same item sequence,
 * derived from the plan on the device; every mbarrier wait is bounded (trap, not a hang).
 * Rows of packed weights are 16-byte aligned (moe_ops.h); scale rows are copied in bulk when
 * they are contiguous and 16-byte aligned, else by the producer warp's lanes. */
#include <stdlib.h>

#include "mxfp4_tc.cuh"

namespace mxtc {
namespace {

constexpr int TD_CW = 7;                       /* warps of one consumer group */
constexpr int TD_NG = 2;                       /* consumer groups (alternate items) */
constexpr int TD_THREADS = (TD_NG * TD_CW + 1) * 32; /* + the producer warp */
constexpr int TD_XC = 4;                       /* 128-k chunks of x held in registers per warp */
constexpr int TD_RED = TD_CW * 2 * 16 * 8;     /* floats of one reduction buffer */
constexpr int TD_MAXSTG = 8;
constexpr int TD_SMEM_MAX = 227 * 1024;

__device__ __forceinline__ unsigned td_u32(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void td_bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void td_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void td_arrive_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
/* Waits for the completion of the phase with parity par; ~2^31 polls (seconds) then trap. */
__device__ __forceinline__ void td_wait(unsigned bar, unsigned par) {
  for (unsigned n = 0;; n++) {
    unsigned ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(bar), "r"(par)
                 : "memory");
    if (ok) return;
    if (n > (1u << 31)) __trap();
  }
}
__device__ __forceinline__ void td_bulk(unsigned dst, const void *src, unsigned bytes,
                                        unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
               "%2, [%3];\n" ::"r"(dst),
               "l"((uint64_t)src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void td_named_sync(int grp) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + grp), "n"(TD_CW * 32) : "memory");
}

struct tdlay {
  int tiles;  /* items per expert */
  int pitch;  /* bytes between packed rows in a stage (≡ 64 mod 128: conflict-free reads) */
  int slot;   /* bytes per stage: 16 packed rows, then 16 scale rows of K/32 bytes */
  int nstg;
  int exp; /* EXPERIMENT bits (timing only): 1 no compute, 2 one bulk copy per stage */
};

/* The item's expert, grouped rows, first weight row and which of its two tiles exist. */
template <bool FUSED>
__device__ __forceinline__ bool td_item(const gargs &a, const tdlay &L, int it, int &e, int &rb,
                                        int &re, int &row0, bool &v1) {
  if (!expert_rows(a, it / L.tiles, e, rb, re)) return false;
  row0 = (it % L.tiles) * (FUSED ? 16 : 32);
  v1 = FUSED || row0 + 16 < a.N;
  return true;
}

template <bool FUSED>
__global__ void __launch_bounds__(TD_THREADS, 1) mx_tma_kernel(gargs a, tdlay L) {
  extern __shared__ __align__(128) unsigned char tsm[];
  unsigned char *stages = tsm;
  float *red = reinterpret_cast<float *>(tsm + L.nstg * L.slot);
  uint64_t *bars = reinterpret_cast<uint64_t *>(red + TD_NG * 2 * TD_RED); /* full, empty [nstg] */
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L.nstg; s++) {
      td_bar_init(td_u32(bars + s), 32);
      td_bar_init(td_u32(bars + L.nstg + s), TD_CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  const int nact = a.expert_off ? __ldg(a.active) : 1;
  const int64_t nitems = (int64_t)nact * L.tiles;
  const int i0 = (int)(nitems * blockIdx.x / gridDim.x);
  const int i1 = (int)(nitems * (blockIdx.x + 1) / gridDim.x);
  const int sb = a.K >> 5; /* scale bytes per row */

  if (threadIdx.x >> 5 == TD_NG * TD_CW) { /* ---- producer ---- */
    int q = 0;
    for (int it = i0; it < i1; it++) {
      int e, rb, re, row0;
      bool v1;
      if (!td_item<FUSED>(a, L, it, e, rb, re, row0, v1)) continue;
#pragma unroll
      for (int m = 0; m < 2; m++) {
        if (m == 1 && !v1) continue;
        const int s = q % L.nstg;
        const unsigned u = (unsigned)(q / L.nstg);
        q++;
        if (u) td_wait(td_u32(bars + L.nstg + s), (u - 1) & 1);
        const mxk &set = (FUSED && m == 1) ? a.up : a.w;
        const int rm = FUSED ? row0 : row0 + 16 * m;
        const uint8_t *P = mx_packed(set, e) + (int64_t)rm * set.ldp;
        const uint8_t *S = mx_scale(set, e) + (int64_t)rm * set.lds;
        unsigned char *dst = stages + s * L.slot;
        const bool sbulk = set.lds == sb && ((uintptr_t)S & 15) == 0;
        if (!sbulk)
          for (int i = lane; i < 16 * sb; i += 32) dst[16 * L.pitch + i] = S[(i / sb) * set.lds + i % sb];
        const unsigned fb = td_u32(bars + s);
        if (lane == 0) {
          td_arrive_tx(fb, 16u * (unsigned)(a.K >> 1) + (sbulk ? 16u * sb : 0u));
          if (L.exp & 2)
            td_bulk(td_u32(dst), P, 16u * (unsigned)(a.K >> 1), fb);
          else
            for (int r = 0; r < 16; r++)
              td_bulk(td_u32(dst + r * L.pitch), P + (int64_t)r * set.ldp, (unsigned)(a.K >> 1), fb);
          if (sbulk) td_bulk(td_u32(dst + 16 * L.pitch), S, 16u * sb, fb);
        } else {
          td_arrive(fb);
        }
      }
    }
    return;
  }

  /* ---- consumers: group grp takes the items i0 + grp, i0 + grp + TD_NG, ... ---- */
  const int grp = (threadIdx.x >> 5) / TD_CW, warp = (threadIdx.x >> 5) % TD_CW;
  const int g = lane >> 2, tig = lane & 3;
  const int nk = a.K >> 7, c0 = warp * nk / TD_CW, c1 = (warp + 1) * nk / TD_CW;
  const bool xkeep = c1 - c0 <= TD_XC;
  /* x of token g for this warp's chunks, already as mma B fragments: xb[j][2s + 0/1] */
  uint32_t xb[TD_XC][16];
  int xkey = -2;
  int q = 0, rbuf = 0;
  float *gred = red + grp * 2 * TD_RED;
  for (int it = i0; it < i1; it++) {
    int e, rb, re, row0;
    bool v1;
    if (!td_item<FUSED>(a, L, it, e, rb, re, row0, v1)) continue;
    int sm[2];
    unsigned um[2];
    sm[0] = q % L.nstg;
    um[0] = (unsigned)(q / L.nstg);
    q++;
    sm[1] = sm[0];
    um[1] = um[0];
    if (v1) {
      sm[1] = q % L.nstg;
      um[1] = (unsigned)(q / L.nstg);
      q++;
    }
    if ((it - i0) % TD_NG != grp) continue;
    for (int tb = rb; tb < re; tb += 8) {
      const int tok = tb + g;
      const bool tv = tok < re;
      const int key = tv ? (a.x_gather ? __ldg(a.x_gather + tok) : tok) : -1;
      float c[2][2][4]; /* [m][two accumulation chains][fragment] */
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int j = 0; j < 4; j++) c[m][h][j] = 0.0f;
      /* one stage (16 rows of one matrix) at a time, released as soon as this warp is done */
#pragma unroll
      for (int m = 0; m < 2; m++) {
        if (m == 1 && !v1) break;
        const unsigned char *stm = stages + sm[m] * L.slot;
        for (int cb = c0; cb < c1; cb += TD_XC) {
          if (!xkeep || key != xkey) {
            const uint16_t *xrow = a.x + (int64_t)(key < 0 ? 0 : key) * a.ldx + tig * 32;
#pragma unroll
            for (int j = 0; j < TD_XC; j++) {
              uint32_t u[16];
              if (cb + j < c1 && key >= 0) {
                const uint4 *xp = reinterpret_cast<const uint4 *>(xrow + (cb + j) * 128);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                  const uint4 t4 = __ldg(xp + v);
                  u[4 * v] = t4.x;
                  u[4 * v + 1] = t4.y;
                  u[4 * v + 2] = t4.z;
                  u[4 * v + 3] = t4.w;
                }
              } else {
#pragma unroll
                for (int v = 0; v < 16; v++) u[v] = 0;
              }
              /* (x[8q+i], x[8q+i+4]) pairs for registers i = 2hs, 2hs+1 of word q */
#pragma unroll
              for (int qw = 0; qw < 4; qw++)
#pragma unroll
                for (int hs = 0; hs < 2; hs++) {
                  xb[j][4 * qw + 2 * hs] = __byte_perm(u[4 * qw + hs], u[4 * qw + 2 + hs], 0x5410);
                  xb[j][4 * qw + 2 * hs + 1] = __byte_perm(u[4 * qw + hs], u[4 * qw + 2 + hs], 0x7632);
                }
            }
            xkey = xkeep ? key : -2;
          }
          td_wait(td_u32(bars + sm[m]), um[m] & 1);
          if (L.exp & 1) continue;
#pragma unroll
          for (int j = 0; j < TD_XC; j++) {
            const int kc = cb + j;
            if (kc >= c1) break;
            uint4 raw[2];
            uint32_t F1[2], F2[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
              const int r = g + 8 * h;
              raw[h] = *reinterpret_cast<const uint4 *>(stm + r * L.pitch + kc * 64 + tig * 16);
              scale_factors1(stm[16 * L.pitch + r * sb + kc * 4 + tig], F1[h], F2[h]);
            }
#pragma unroll
            for (int qw = 0; qw < 4; qw++) {
              const uint32_t w0 = word_of(raw[0], qw), w1 = word_of(raw[1], qw);
              const uint32_t v0 = w0 >> 8, v1w = w1 >> 8;
#pragma unroll
              for (int hs = 0; hs < 2; hs++) { /* registers 2hs, 2hs + 1 of word qw */
                uint32_t af[4];
                af[0] = dq_pre(w0, v0, 2 * hs, F1[0], F2[0]);
                af[1] = dq_pre(w1, v1w, 2 * hs, F1[1], F2[1]);
                af[2] = dq_pre(w0, v0, 2 * hs + 1, F1[0], F2[0]);
                af[3] = dq_pre(w1, v1w, 2 * hs + 1, F1[1], F2[1]);
                mma_bf16(c[m][hs], af, xb[j][4 * qw + 2 * hs], xb[j][4 * qw + 2 * hs + 1]);
              }
            }
          }
        }
        if (tb + 8 >= re) { /* last token tile: the stage goes back to the producer */
          /* a warp with no chunks must not arrive before the stage was filled: its arrival
           * would count toward the previous use's phase (another group's item) */
          td_wait(td_u32(bars + sm[m]), um[m] & 1);
          __syncwarp();
          if (lane == 0) td_arrive(td_u32(bars + L.nstg + sm[m]));
        }
      }
      /* partial tiles → red[rbuf][warp][m][row][tok]; c[m][.][2h + j] = (row g + 8h, tok 2tig + j) */
      float *rw = gred + rbuf * TD_RED;
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int j = 0; j < 2; j++)
            rw[((warp * 2 + m) * 16 + g + 8 * h) * 8 + 2 * tig + j] = c[m][0][2 * h + j] + c[m][1][2 * h + j];
      td_named_sync(grp);
      const int t0 = threadIdx.x - grp * TD_CW * 32; /* 0 .. TD_CW*32-1 */
      if (FUSED) {
        for (int t = t0; t < 128; t += TD_CW * 32) {
          const int row = t >> 3, tk = t & 7;
          float gs = 0.0f, us = 0.0f;
#pragma unroll
          for (int w = 0; w < TD_CW; w++) {
            gs += rw[((w * 2) * 16 + row) * 8 + tk];
            us += rw[((w * 2 + 1) * 16 + row) * 8 + tk];
          }
          if (tb + tk < re) store_y(a, tb + tk, row0 + row, act_fn(a, gs, us));
        }
      } else {
        for (int t = t0; t < 256; t += TD_CW * 32) {
          const int m = t >> 7, row = (t >> 3) & 15, tk = t & 7;
          if (m == 1 && !v1) continue;
          float ys = 0.0f;
#pragma unroll
          for (int w = 0; w < TD_CW; w++) ys += rw[((w * 2 + m) * 16 + row) * 8 + tk];
          if (tb + tk < re) store_y(a, tb + tk, row0 + 16 * m + row, ys);
        }
      }
      rbuf ^= 1;
    }
  }
}

int g_sms = 0;
bool g_lim[2];

} // namespace

int mx_dec_tma(cudaStream_t st, const gargs &g, int max_active, bool fused) {
  tdlay L;
  L.tiles = fused ? g.N / 16 : (g.N + 31) / 32;
  const int half = g.K / 2;
  L.pitch = half % 128 == 64 ? half : half + 64;
  L.slot = 16 * L.pitch + 16 * (g.K / 32);
  L.slot = (L.slot + 127) & ~127;
  const int fixed = TD_NG * 2 * TD_RED * 4 + 2 * TD_MAXSTG * 8;
  L.nstg = (TD_SMEM_MAX - fixed) / L.slot;
  if (L.nstg > TD_MAXSTG) L.nstg = TD_MAXSTG;
  if (L.nstg < 3) return 1;
  static int exp = -1;
  if (exp < 0) exp = getenv("K3K_MX_EXP") ? atoi(getenv("K3K_MX_EXP")) : 0;
  L.exp = exp & 7;
  const int smem = L.nstg * L.slot + TD_NG * 2 * TD_RED * 4 + 2 * L.nstg * 8;
  if (!g_sms) {
    int dev = 0;
    K3K_CU(cudaGetDevice(&dev));
    K3K_CU(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
  }
  const int64_t items = (int64_t)max_active * L.tiles;
  const unsigned grid = (unsigned)(items < g_sms ? items : g_sms);
  if (fused) {
    if (!g_lim[0]) {
      K3K_CU(cudaFuncSetAttribute(mx_tma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TD_SMEM_MAX));
      g_lim[0] = true;
    }
    mx_tma_kernel<true><<<grid, TD_THREADS, smem, st>>>(g, L);
  } else {
    if (!g_lim[1]) {
      K3K_CU(cudaFuncSetAttribute(mx_tma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TD_SMEM_MAX));
      g_lim[1] = true;
    }
    mx_tma_kernel<false><<<grid, TD_THREADS, smem, st>>>(g, L);
  }
  K3K_LAUNCHED("mxfp4_grouped_gemm_decode_tma");
  return 0;
}

} // namespace mxtc
