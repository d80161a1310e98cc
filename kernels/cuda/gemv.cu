/* CUDA: skinny GEMM for decode, y[M,N] = x[M,K] · W[N,K]ᵀ with M <= 16, bf16 x and W, fp32
 * accumulation, F32 or BF16 y (see gemv.h for the contract).
 *
 * Why: at decode the model is a weight stream; cuBLASLt reads the dense projections at 1.2-1.4x
 * the copy-bandwidth floor at these shapes, and the small ones (router, KDA f_a/b, MLA kv_a/q_a)
 * at 3-50x. This kernel does nothing but stream W once with 16-byte non-allocating loads, many
 * in flight per thread, and lets the tensor cores do the (tiny) arithmetic so no M needs more
 * than a few instructions per loaded byte. The GEMM op uses it only where it measured faster
 * (k3k_cuda_gemv_wanted; on the largest matrices cuBLASLt streams ~7 % faster).
 *
 * Work split. A warp step covers 32 consecutive k of 8·NT weight rows: lane (g = lane/4,
 * t4 = lane%4) loads the 16 bytes W[n0 + 8j + g][k0 + 8·t4 .. +8] for each row tile j < NT, and
 * the same 16 bytes of x rows g and g+8 (when < M). Those 8 k-values are the lane's k slots of
 * two mma.m16n8k16 (slots 2t4, 2t4+1, 2t4+8, 2t4+9 of each): the permutation of k inside the
 * step is the same for A (x) and B (W), so Σ_k is unchanged, and every load is 16 bytes of a
 * row-major operand with no shuffles. A CTA = 8 warps owns 8·NT rows; its steps are dealt to the
 * warps round-robin (warp w: steps w, w+8, ...), U = 8/NT steps (8 weight loads per lane) issued
 * before their mma (variants 2-4 of gemv.h: two adjacent chunks per lane and row, and/or 16
 * loads in flight; measured, none better across the board, so variant 1 is the default). For shapes with few row tiles the K range is further split over a cluster of
 * `split` CTAs (1, 2, 4, 8; contiguous step ranges), so that every shape has enough CTAs.
 *
 * Reduction order (fixed): each warp's mma accumulator chain in increasing step order; then the
 * 8 warps summed in warp order through shared memory; then the cluster's CTAs in rank order by
 * rank 0 through distributed shared memory. Nothing depends on the SM count, on scheduling or on
 * timing, and no atomics are used: identical inputs give bit-identical outputs on every run.
 * The split and NT come from the shape only (k3k_cuda_gemv_plan).
 *
 * Launched with PDL (pdl.cuh): inside a runner pass (k3k_cuda_gemv_const_weights) each warp's
 * first batch of weight loads is issued before the wait for the previous kernel, so the start
 * of the weight stream overlaps the previous kernel's tail; every CTA triggers the next kernel
 * once its weights are read (before the reduction). */
#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

#include "gemv.h"
#include "mma_sm80.cuh"
#include "pdl.cuh"

namespace cg = cooperative_groups;

#define GEMV_WARPS 8

struct gemv_args {
  const uint16_t *x;
  int64_t ldx; /* elements */
  const uint16_t *w;
  int64_t ldw;
  dv y;
  int M, N, K, split;
  int wpre; /* W is constant during the step: its first loads may precede the PDL wait */
};

/* 16 bytes of weights: read once per token, so keep them out of L1. */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

/* HI: M > 8, so x rows g+8 exist. NT: row tiles (8 rows each) per warp step. CH: 16-byte
 * chunks per lane and row in a step (step = 32·CH k; CH = 2 makes the 4 lanes of a row read one
 * whole 128-byte line). L: weight loads per lane in flight per batch. */
template <int NT, bool HI, int CH, int L>
__global__ void __launch_bounds__(GEMV_WARPS * 32, (HI || L > 8) ? 2 : 3) gemv_kernel(gemv_args a) {
  constexpr int U = L / (NT * CH) > 0 ? L / (NT * CH) : 1; /* steps per batch */
  constexpr int KS = 32 * CH;                              /* k per step */
  __shared__ float red[GEMV_WARPS][NT][32][4];
  __shared__ float part[16 * 8 * NT]; /* this CTA's partial sums, read by cluster rank 0 */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int rank = blockIdx.x, n0 = blockIdx.y * 8 * NT;
  const int S = (a.K + KS - 1) / KS;
  const int s_lo = (int)((int64_t)S * rank / a.split), s_hi = (int)((int64_t)S * (rank + 1) / a.split);

  const uint16_t *wrow[NT];
  bool nok[NT];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    int n = n0 + 8 * j + g;
    nok[j] = n < a.N;
    wrow[j] = a.w + (int64_t)(nok[j] ? n : 0) * a.ldw + 8 * CH * t4;
  }
  const bool xlo = g < a.M, xhi = HI && g + 8 < a.M;
  const uint16_t *xr0 = a.x + (int64_t)(xlo ? g : 0) * a.ldx + 8 * CH * t4;
  const uint16_t *xr1 = a.x + (int64_t)(xhi ? g + 8 : 0) * a.ldx + 8 * CH * t4;
  const uint4 z4 = make_uint4(0, 0, 0, 0);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  /* PDL (pdl.cuh): W may be read before the wait only when the caller vouched that no kernel
   * of the step writes it (k3k_cuda_gemv_const_weights); x and y always after it. */
  bool waited = !a.wpre;
  if (waited) pdl_wait();
  for (int s = s_lo + warp; s < s_hi; s += GEMV_WARPS * U) {
    uint4 wv[U][NT][CH];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int ss = s + u * GEMV_WARPS;
#pragma unroll
      for (int c = 0; c < CH; c++) {
        bool ok = ss < s_hi && ss * KS + 8 * CH * t4 + 8 * c < a.K;
#pragma unroll
        for (int j = 0; j < NT; j++)
          wv[u][j][c] = ok && nok[j] ? ld_stream16(wrow[j] + ss * KS + 8 * c) : z4;
      }
    }
    if (!waited) { /* PDL: the first weight batch is in flight; x is the previous kernel's */
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int ss = s + u * GEMV_WARPS;
#pragma unroll
      for (int c = 0; c < CH; c++) {
        bool ok = ss < s_hi && ss * KS + 8 * CH * t4 + 8 * c < a.K;
        /* plain loads, not __ldg: x is the previous kernel's output and, under PDL, this
         * kernel runs while it is written; a non-coherent (invariant) load may be hoisted
         * above pdl_wait by the compiler */
        uint4 xa = ok && xlo ? *(const uint4 *)(xr0 + ss * KS + 8 * c) : z4;
        uint4 xb = ok && xhi ? *(const uint4 *)(xr1 + ss * KS + 8 * c) : z4;
        const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y}, a1[4] = {xa.z, xb.z, xa.w, xb.w};
#pragma unroll
        for (int j = 0; j < NT; j++) {
          mma_bf16(acc[j], a0, wv[u][j][c].x, wv[u][j][c].y);
          mma_bf16(acc[j], a1, wv[u][j][c].z, wv[u][j][c].w);
        }
      }
    }
  }

  if (!waited) pdl_wait(); /* a warp without steps still writes y below */
  pdl_trigger();           /* every weight byte of this CTA is read: the next kernel may start */
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int r = 0; r < 4; r++) red[warp][j][lane][r] = acc[j][r];
  __syncthreads();

  /* Output (m, c) of the tile, c in [0, 8·NT): C fragment of lane 4·(m%8) + (c%8)/2, register
   * 2·(m >= 8) + c%2, row tile c/8. Warps summed in order. */
  const int n_out = 16 * 8 * NT;
  for (int o = threadIdx.x; o < n_out; o += GEMV_WARPS * 32) {
    int m = o / (8 * NT), c = o % (8 * NT), j = c >> 3, nn = c & 7;
    int l = 4 * (m & 7) + (nn >> 1), r = 2 * (m >> 3) + (nn & 1);
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < GEMV_WARPS; w++) v += red[w][j][l][r];
    part[o] = v;
  }
  if (a.split > 1) {
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); /* every rank's part[] is written */
    if (rank == 0) {
      for (int o = threadIdx.x; o < n_out; o += GEMV_WARPS * 32) {
        float v = part[o];
        for (int q = 1; q < a.split; q++) v += cl.map_shared_rank(part, q)[o];
        part[o] = v;
      }
    }
    cl.sync(); /* the other ranks keep their shared memory until rank 0 has read it */
    if (rank != 0) return;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < n_out; o += GEMV_WARPS * 32) {
    int m = o / (8 * NT), n = n0 + o % (8 * NT);
    if (m < a.M && n < a.N) dv_st(a.y, (int64_t)m * a.y.s[0] + (int64_t)n * a.y.s[1], part[o]);
  }
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Byte range [lo, hi) of a 2-D view. */
static void range2(const k3k_tensor_t *t, uintptr_t *lo, uintptr_t *hi) {
  size_t es = k3k_dtype_size(t->dtype);
  int64_t last = 0;
  for (int d = 0; d < 2; d++) last += (t->shape[d] - 1) * t->stride[d];
  *lo = (uintptr_t)t->data;
  *hi = *lo + (size_t)(last + 1) * es;
}

bool k3k_cuda_gemv_fits(const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  int64_t M = x->shape[0], K = x->shape[1], N = w->shape[0];
  if (x->dtype != K3K_BF16 || w->dtype != K3K_BF16) return false;
  if (y->dtype != K3K_BF16 && y->dtype != K3K_F32) return false;
  if (M < 1 || M > K3K_GEMV_MAX_M || N < 1 || K < 8 || K % 8) return false;
  if (K > (1 << 30) || N > 65535LL * 8) return false; /* int step math; grid.y of NT = 1 */
  if (x->stride[1] != 1 || w->stride[1] != 1) return false;
  if ((M > 1 && x->stride[0] % 8) || (N > 1 && w->stride[0] % 8)) return false;
  if (x->stride[0] < 0 || w->stride[0] < 0 || y->stride[0] < 0 || y->stride[1] < 0) return false;
  if (!al16(x->data) || !al16(w->data)) return false;
  uintptr_t ylo, yhi, lo, hi; /* the output must not alias an input (CTAs still read them) */
  range2(y, &ylo, &yhi);
  range2(x, &lo, &hi);
  if (ylo < hi && lo < yhi) return false;
  range2(w, &lo, &hi);
  if (ylo < hi && lo < yhi) return false;
  return true;
}

void k3k_cuda_gemv_plan(int64_t M, int64_t N, int64_t K, int *split, int *nt) {
  /* Row tiles per warp: x is re-read (from L1/L2) once per 8·NT weight rows; keep those x bytes
   * at <= half the weight bytes. */
  int t = M <= 4 ? 1 : M <= 8 ? 2 : 4;
  int64_t tiles = (N + 8 * t - 1) / (8 * t), steps = (K + 31) / 32;
  /* K split (a shape rule, never the SM count): only for shapes with few row tiles. Measured
   * (docs/perf-gpu.md "skinny GEMM"): every split costs time once there are >= ~400 CTAs (each
   * CTA's start-up latency and reduction are then paid more often for the same bytes), and
   * helps a little below ~200. */
  int s = 1;
  while (s < 8 && tiles * s < 200 && steps >= 2 * s * GEMV_WARPS) s *= 2;
  *split = s;
  *nt = t;
}

/* K3PD_CUDA_GEMV: "0" = off, "2" = also every M <= 4 shape with N <= 16384 and K <= 8192 (the
 * latent and shared-down projections, otherwise cuBLASLt split-K + reduce: an experiment inside
 * the PDL-launched decode graph), anything else = the measured rule below. */
static int gemv_env(void) {
  static int env = -1;
  if (env < 0) {
    const char *e = getenv("K3PD_CUDA_GEMV");
    env = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "2") ? 2 : 1;
  }
  return env;
}

/* Where the kernel measured faster than cuBLASLt (back-to-back calls, H200, docs/perf-gpu.md
 * "skinny GEMM"), as a rule on the shape only:
 *  - few weight rows or a short K, at any M <= 16: N <= 1024 (MLA kv_a, router, KDA f_a and b:
 *    5-7 us against cuBLASLt's 13-17 us) or K <= 256 (KDA f_b 12288 x 128: 6.5-10 vs 10-11 us);
 *  - M <= 4: N <= 2048 (MLA q_a: 10 vs 11-19 us) and the hidden-size projections
 *    7168 -> 6144..16384 (KDA q/k/v/g, MLA gate, shared-expert gate/up: 2-6 % faster).
 * Elsewhere (K >= 12288, N >= 18432, the 3584-wide latent projections, the shared-expert down
 * projection, M > 4 on the larger matrices) cuBLASLt streams the weights as fast or faster. */
static bool gemv_wins(int64_t M, int64_t N, int64_t K, int mode) {
  if (N <= 1024 || K <= 256) return true;
  if (M > 4) return false;
  if (mode == 2 && N <= 16384 && K <= 8192) return true; /* latent down/up, shared down */
  return N <= 2048 || (N >= 6144 && N <= 16384 && K >= 7168 && K <= 8192);
}

bool k3k_cuda_gemv_wanted(const k3k_tensor_t *const *t) {
  const int mode = gemv_env();
  return mode && k3k_cuda_gemv_fits(t) &&
         gemv_wins(t[0]->shape[0], t[1]->shape[0], t[0]->shape[1], mode);
}

/* The launch of both gemv kernels: split CTAs (one cluster when split > 1) per row tile, PDL. */
static void launch_cfg(cudaLaunchConfig_t *cfg, cudaLaunchAttribute (&at)[2], int split,
                       int64_t tiles, cudaStream_t st) {
  *cfg = cudaLaunchConfig_t{};
  cfg->gridDim = dim3((unsigned)split, (unsigned)tiles, 1);
  cfg->blockDim = dim3(GEMV_WARPS * 32, 1, 1);
  cfg->stream = st;
  unsigned na = 0;
  if (split > 1) {
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na].val.clusterDim.x = (unsigned)split;
    at[na].val.clusterDim.y = 1;
    at[na].val.clusterDim.z = 1;
    na++;
  }
  na += pdl_attr(&at[na]);
  cfg->attrs = at;
  cfg->numAttrs = na;
}

template <int NT, bool HI, int CH, int L>
static cudaError_t launch(cudaStream_t st, const gemv_args &a) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute at[2] = {};
  launch_cfg(&cfg, at, a.split, (a.N + 8 * NT - 1) / (8 * NT), st);
  return cudaLaunchKernelEx(&cfg, gemv_kernel<NT, HI, CH, L>, a);
}

template <int CH, int L>
static cudaError_t launch_v(cudaStream_t st, const gemv_args &a, int nt) {
  bool hi = a.M > 8;
  if (nt == 1) return hi ? launch<1, true, CH, L>(st, a) : launch<1, false, CH, L>(st, a);
  if (nt == 2) return hi ? launch<2, true, CH, L>(st, a) : launch<2, false, CH, L>(st, a);
  return hi ? launch<4, true, CH, L>(st, a) : launch<4, false, CH, L>(st, a);
}

static thread_local bool g_const_w;

void k3k_cuda_gemv_const_weights(bool on) { g_const_w = on; }

int k3k_cuda_gemv(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t, int split, int nt, int var) {
  if (!k3k_cuda_gemv_fits(t)) return K3_EINVAL;
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  gemv_args a;
  a.x = (const uint16_t *)x->data, a.ldx = x->stride[0];
  a.w = (const uint16_t *)w->data, a.ldw = w->stride[0];
  a.y = mkdv(y);
  a.M = (int)x->shape[0], a.N = (int)w->shape[0], a.K = (int)x->shape[1];
  a.wpre = g_const_w;
  int ps, pn;
  k3k_cuda_gemv_plan(a.M, a.N, a.K, &ps, &pn);
  a.split = split > 0 ? split : ps;
  if (nt <= 0) nt = pn;
  if ((a.split != 1 && a.split != 2 && a.split != 4 && a.split != 8) ||
      (nt != 1 && nt != 2 && nt != 4))
    return K3_EINVAL;
  if (var <= 0) var = K3K_GEMV_DEFAULT_VARIANT;
  cudaError_t e;
  switch (var) {
  case 1: e = launch_v<1, 8>(cx->stream, a, nt); break;
  case 2: e = launch_v<2, 8>(cx->stream, a, nt); break;
  case 3: e = launch_v<1, 16>(cx->stream, a, nt); break;
  case 4: e = launch_v<2, 16>(cx->stream, a, nt); break;
  default: return K3_EINVAL;
  }
  if (e != cudaSuccess) {
    K3_ERROR("cuda: launch of gemv (M=%d N=%d K=%d split=%d nt=%d variant %d) failed: %s", a.M,
             a.N, a.K, a.split, nt, var, cudaGetErrorString(e));
    return K3_EDEVICE;
  }
  K3K_LAUNCHED("gemv");
  return 0;
}

/* ---- Opt-in: several projections of one x in one launch, RMSNORM folded in (gemv.h) ----
 *
 * gemv_multi_kernel is gemv_kernel<NT = 1, HI = false, CH = 1, L = 8> (the default variant at
 * M <= 4) with two additions; the kernel above is left as it is (the default path's code):
 *  - the grid's row tiles are dealt to up to K3K_GEMV_MULTI_MAX outputs (tile0[j] = the first
 *    blockIdx.y of output j), each with its own W, y and N but the same x, K and split: a CTA
 *    does exactly what the single-output kernel's CTA for that tile does, so each y_j has the
 *    single-output kernel's reduction order (bit-identical, given the same split);
 *  - NORM: x is RMSNORM's *input*; every CTA computes 1/rms of the M rows itself (rms_prologue:
 *    the register kernel's fp32 order) and normalises each 16-byte x chunk as it is loaded
 *    (rms_apply8: the register kernel's expressions), so the mma operands are RMSNORM's output
 *    bytes. Optionally CTA (0, 0) writes the normed rows to xn for consumers that are not gemvs.
 * PDL as in gemv_kernel: the first weight batch may precede the wait (wpre), x, the norm weight
 * and every output only after it. */

struct gemv_multi_args {
  const uint16_t *x;
  int64_t ldx;
  const uint16_t *w[K3K_GEMV_MULTI_MAX];
  int64_t ldw[K3K_GEMV_MULTI_MAX];
  dv y[K3K_GEMV_MULTI_MAX];
  int N[K3K_GEMV_MULTI_MAX];
  int tile0[K3K_GEMV_MULTI_MAX];
  int n, M, K, split, wpre;
  const uint16_t *nw; /* NORM: the norm weight [K] */
  float eps;
  int bf16_inner;
  uint16_t *xn; /* NORM: NULL or the normed rows [M, K] (row stride ldxn) */
  int64_t ldxn;
};

/* RMSNORM's output bytes for 8 channels: x·rstd (rounded to bf16 when bf16_inner) times the
 * weight, rounded to bf16 (norm.cu rmsnorm_reg_kernel, the same expressions). */
__device__ __forceinline__ uint4 rms_apply8(uint4 xv, uint4 wv, float rstd, int bf16_inner) {
  bf16x8 xb, wb;
  xb.w[0] = xv.x, xb.w[1] = xv.y, xb.w[2] = xv.z, xb.w[3] = xv.w;
  wb.w[0] = wv.x, wb.w[1] = wv.y, wb.w[2] = wv.z, wb.w[3] = wv.w;
  float f[8], g[8];
  unpack8(xb, f);
  unpack8(wb, g);
#pragma unroll
  for (int j = 0; j < 8; j++) {
    float xn = f[j] * rstd;
    if (bf16_inner) xn = round_bf(xn);
    f[j] = xn * g[j];
  }
  bf16x8 o = pack8(f);
  return make_uint4(o.w[0], o.w[1], o.w[2], o.w[3]);
}

/* rs[m] = RMSNORM's rstd of row m < M, in the register kernel's fp32 order: that kernel runs
 * one 128-thread block per row, thread t summing the squares of its 16-byte vectors t, t + 128,
 * ... in order (8 squares each, in order), then block_sum over its 4 warps (warp_sum, lane 0 to
 * shared memory, warp_sum of the 4 partials at lanes 0-3, zeros elsewhere). Here each half of
 * the CTA (warps 0-3, warps 4-7) plays that block for one row per pass, with the same per-thread
 * order and the same two shuffle trees. Barriers inside: every thread of the CTA calls it.
 * K / 8 <= 1024 (the register kernel's range). */
__device__ __forceinline__ void rms_prologue(const gemv_multi_args &a, float *scratch, float *rs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = warp >> 2;
  const int t = threadIdx.x & 127, d8 = a.K / 8;
  for (int m0 = 0; m0 < a.M; m0 += 2) {
    const int m = m0 + h;
    float ss = 0.0f;
    if (m < a.M) {
      const bf16x8 *xr = (const bf16x8 *)(a.x + (int64_t)m * a.ldx);
#pragma unroll
      for (int k0 = 0; k0 < 8; k0 += 4) { /* 4 loads in flight: the first weight batch holds
                                             32 registers across this prologue */
        bf16x8 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
          int i = t + (k0 + k) * 128;
          if (i < d8) v[k] = xr[i];
        }
#pragma unroll
        for (int k = 0; k < 4; k++)
          if (t + (k0 + k) * 128 < d8) {
            float f[8];
            unpack8(v[k], f);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
          }
      }
    }
    ss = warp_sum(ss);
    if (lane == 0) scratch[warp] = ss;
    __syncthreads();
    float r = lane < 4 ? scratch[4 * h + lane] : 0.0f;
    r = warp_sum(r);
    if (t == 0 && m < a.M) rs[m] = 1.0f / sqrtf(r / (float)a.K + a.eps);
    __syncthreads(); /* rs[] complete; scratch free for the next pass */
  }
}

template <bool NORM>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 3) gemv_multi_kernel(gemv_multi_args a) {
  constexpr int U = 8; /* steps per batch: 8 weight loads per lane in flight */
  __shared__ float red[GEMV_WARPS][32][4];
  __shared__ float part[16 * 8];
  __shared__ float nsc[GEMV_WARPS];
  __shared__ float rs[K3K_GEMV_NORM_MAX_M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int rank = blockIdx.x, by = blockIdx.y;
  /* the output of this row tile (a select chain: no dynamic index into the parameters) */
  const uint16_t *W = a.w[0];
  int64_t ldw = a.ldw[0];
  dv Y = a.y[0];
  int N = a.N[0], t0 = 0;
#pragma unroll
  for (int q = 1; q < K3K_GEMV_MULTI_MAX; q++)
    if (q < a.n && by >= a.tile0[q]) {
      W = a.w[q];
      ldw = a.ldw[q];
      Y = a.y[q];
      N = a.N[q];
      t0 = a.tile0[q];
    }
  const int n0 = (by - t0) * 8;
  const int S = (a.K + 31) / 32;
  const int s_lo = (int)((int64_t)S * rank / a.split), s_hi = (int)((int64_t)S * (rank + 1) / a.split);
  const bool nok = n0 + g < N;
  const uint16_t *wrow = W + (int64_t)(nok ? n0 + g : 0) * ldw + 8 * t4;
  const bool xlo = g < a.M;
  const uint16_t *xr0 = a.x + (int64_t)(xlo ? g : 0) * a.ldx + 8 * t4;
  const uint16_t *nr = NORM ? a.nw + 8 * t4 : a.x;
  const uint4 z4 = make_uint4(0, 0, 0, 0);

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint4 wv[U];
  int s = s_lo + warp;
  if (!a.wpre) pdl_wait();
#pragma unroll
  for (int u = 0; u < U; u++) {
    int ss = s + u * GEMV_WARPS;
    bool ok = ss < s_hi && ss * 32 + 8 * t4 < a.K;
    wv[u] = ok && nok ? ld_stream16(wrow + ss * 32) : z4;
  }
  if (a.wpre) pdl_wait(); /* the first weight batch is in flight; x is the previous kernel's */
  float rstd = 1.0f;
  if (NORM) {
    rms_prologue(a, nsc, rs);
    if (xlo) rstd = rs[g];
    if (a.xn && rank == 0 && by == 0) { /* the normed rows for the other consumers */
      const int d8 = a.K / 8;
      for (int o = threadIdx.x; o < a.M * d8; o += GEMV_WARPS * 32) {
        int m = o / d8, i = o - m * d8;
        uint4 xv = *(const uint4 *)(a.x + (int64_t)m * a.ldx + 8 * i);
        uint4 nv = *(const uint4 *)(a.nw + 8 * i);
        *(uint4 *)(a.xn + (int64_t)m * a.ldxn + 8 * i) = rms_apply8(xv, nv, rs[m], a.bf16_inner);
      }
    }
  }
  /* the steps of gemv_kernel's loop, in its order: batch at s, then s + 8U, ... */
  while (s < s_hi) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      int ss = s + u * GEMV_WARPS;
      bool ok = ss < s_hi && ss * 32 + 8 * t4 < a.K;
      /* plain loads (not __ldg): x is the previous kernel's output (PDL, see gemv_kernel) */
      uint4 xa = ok && xlo ? *(const uint4 *)(xr0 + ss * 32) : z4;
      if (NORM && ok && xlo) xa = rms_apply8(xa, *(const uint4 *)(nr + ss * 32), rstd, a.bf16_inner);
      const uint32_t a0[4] = {xa.x, 0u, xa.y, 0u}, a1[4] = {xa.z, 0u, xa.w, 0u};
      mma_bf16(acc, a0, wv[u].x, wv[u].y);
      mma_bf16(acc, a1, wv[u].z, wv[u].w);
    }
    s += GEMV_WARPS * U;
    if (s < s_hi) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        int ss = s + u * GEMV_WARPS;
        bool ok = ss < s_hi && ss * 32 + 8 * t4 < a.K;
        wv[u] = ok && nok ? ld_stream16(wrow + ss * 32) : z4;
      }
    }
  }

  pdl_trigger(); /* every weight byte of this CTA is read */
#pragma unroll
  for (int r = 0; r < 4; r++) red[warp][lane][r] = acc[r];
  __syncthreads();
  /* gemv_kernel's output mapping and reduction order at NT = 1 */
  for (int o = threadIdx.x; o < 16 * 8; o += GEMV_WARPS * 32) {
    int m = o / 8, nn = o % 8;
    int l = 4 * (m & 7) + (nn >> 1), r = 2 * (m >> 3) + (nn & 1);
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < GEMV_WARPS; w++) v += red[w][l][r];
    part[o] = v;
  }
  if (a.split > 1) {
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    if (rank == 0) {
      for (int o = threadIdx.x; o < 16 * 8; o += GEMV_WARPS * 32) {
        float v = part[o];
        for (int q = 1; q < a.split; q++) v += cl.map_shared_rank(part, q)[o];
        part[o] = v;
      }
    }
    cl.sync();
    if (rank != 0) return;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < 16 * 8; o += GEMV_WARPS * 32) {
    int m = o / 8, nn = n0 + o % 8;
    if (m < a.M && nn < N) dv_st(Y, (int64_t)m * Y.s[0] + (int64_t)nn * Y.s[1], part[o]);
  }
}

static bool overlaps(const k3k_tensor_t *a, const k3k_tensor_t *b) {
  uintptr_t alo, ahi, blo, bhi;
  range2(a, &alo, &ahi);
  range2(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

/* The 1-D norm weight's byte range as a 2-D view for overlaps(). */
static k3k_tensor_t as_row(const k3k_tensor_t *v) {
  k3k_tensor_t r = *v;
  r.ndim = 2;
  r.shape[0] = 1, r.shape[1] = v->shape[0];
  r.stride[0] = v->shape[0], r.stride[1] = 1;
  return r;
}

bool k3k_cuda_gemv_multi_fits(const k3k_tensor_t *x, int n, const k3k_tensor_t *const *w,
                              const k3k_tensor_t *const *y, const k3k_gemv_norm_t *nm) {
  if (n < 1 || n > K3K_GEMV_MULTI_MAX || !x || x->ndim != 2) return false;
  const int64_t M = x->shape[0], K = x->shape[1];
  if (M < 1 || M > K3K_GEMV_NORM_MAX_M) return false;
  int64_t tiles = 0;
  int split0 = 0;
  for (int j = 0; j < n; j++) {
    if (!w[j] || !y[j] || w[j]->ndim != 2 || y[j]->ndim != 2 || w[j]->shape[1] != K ||
        y[j]->shape[0] != M || y[j]->shape[1] != w[j]->shape[0])
      return false;
    const k3k_tensor_t *t[3] = {x, w[j], y[j]};
    if (!k3k_cuda_gemv_fits(t)) return false;
    int sp, nt;
    k3k_cuda_gemv_plan(M, w[j]->shape[0], K, &sp, &nt);
    if (nt != 1 || (j > 0 && sp != split0)) return false; /* one split per launch */
    split0 = sp;
    tiles += (w[j]->shape[0] + 7) / 8;
    for (int i = 0; i < n; i++) /* no output may alias another output or any weight */
      if ((i != j && overlaps(y[j], w[i])) || (i < j && overlaps(y[j], y[i]))) return false;
  }
  if (tiles > 65535) return false;
  if (!nm) return true;
  const k3k_tensor_t *nw = nm->w;
  if (!nw || nw->dtype != K3K_BF16 || nw->ndim != 1 || nw->shape[0] != K || nw->stride[0] != 1 ||
      !al16(nw->data) || K / 8 > 1024)
    return false;
  k3k_tensor_t nr = as_row(nw);
  for (int j = 0; j < n; j++)
    if (overlaps(y[j], &nr)) return false;
  if (nm->xn) {
    const k3k_tensor_t *o = nm->xn;
    if (o->dtype != K3K_BF16 || o->ndim != 2 || o->shape[0] != M || o->shape[1] != K ||
        o->stride[1] != 1 || o->stride[0] < K || (M > 1 && o->stride[0] % 8) || !al16(o->data))
      return false;
    if (overlaps(o, x) || overlaps(o, &nr)) return false;
    for (int j = 0; j < n; j++)
      if (overlaps(o, w[j]) || overlaps(o, y[j])) return false;
  }
  return true;
}

int k3k_cuda_gemv_multi(k3k_cuda_ctx *cx, const k3k_tensor_t *x, int n,
                        const k3k_tensor_t *const *w, const k3k_tensor_t *const *y,
                        const k3k_gemv_norm_t *nm) {
  if (!k3k_cuda_gemv_multi_fits(x, n, w, y, nm)) return K3_EINVAL;
  gemv_multi_args a;
  memset(&a, 0, sizeof a);
  a.x = (const uint16_t *)x->data, a.ldx = x->stride[0];
  a.n = n, a.M = (int)x->shape[0], a.K = (int)x->shape[1];
  int tiles = 0, nt;
  for (int j = 0; j < n; j++) {
    a.w[j] = (const uint16_t *)w[j]->data, a.ldw[j] = w[j]->stride[0];
    a.y[j] = mkdv(y[j]);
    a.N[j] = (int)w[j]->shape[0];
    a.tile0[j] = tiles;
    tiles += (a.N[j] + 7) / 8;
  }
  k3k_cuda_gemv_plan(a.M, a.N[0], a.K, &a.split, &nt);
  a.wpre = g_const_w;
  if (nm) {
    a.nw = (const uint16_t *)nm->w->data;
    a.eps = nm->eps;
    a.bf16_inner = nm->bf16_inner;
    if (nm->xn) a.xn = (uint16_t *)nm->xn->data, a.ldxn = nm->xn->stride[0];
  }
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute at[2] = {};
  launch_cfg(&cfg, at, a.split, tiles, cx->stream);
  cudaError_t e = nm ? cudaLaunchKernelEx(&cfg, gemv_multi_kernel<true>, a)
                     : cudaLaunchKernelEx(&cfg, gemv_multi_kernel<false>, a);
  if (e != cudaSuccess) {
    K3_ERROR("cuda: launch of gemv_multi (n=%d M=%d K=%d split=%d norm=%d) failed: %s", n, a.M,
             a.K, a.split, nm != NULL, cudaGetErrorString(e));
    return K3_EDEVICE;
  }
  K3K_LAUNCHED("gemv_multi");
  return 0;
}
