/* CUDA: skinny GEMM for decode, y[M,N] = x[M,K] · W[N,K]ᵀ with M <= 16, bf16 x and W, fp32
 * accumulation, F32 or BF16 y (see gemv.h for the contract).
 *
 * Why: at decode the model is a weight stream; cuBLASLt reads the dense projections at 1.2-1.4x
 * the copy-bandwidth floor at these shapes. This kernel does nothing but stream W once with
 * 16-byte non-allocating loads, many in flight per thread, and lets the tensor cores do the
 * (tiny) arithmetic so no M needs more than a few instructions per loaded byte.
 *
 * Work split. A warp step covers 32 consecutive k of 8·NT weight rows: lane (g = lane/4,
 * t4 = lane%4) loads the 16 bytes W[n0 + 8j + g][k0 + 8·t4 .. +8] for each row tile j < NT, and
 * the same 16 bytes of x rows g and g+8 (when < M). Those 8 k-values are the lane's k slots of
 * two mma.m16n8k16 (slots 2t4, 2t4+1, 2t4+8, 2t4+9 of each): the permutation of k inside the
 * step is the same for A (x) and B (W), so Σ_k is unchanged, and every load is 16 bytes of a
 * row-major operand with no shuffles. A CTA = 8 warps owns 8·NT rows; its steps are dealt to the
 * warps round-robin (warp w: steps w, w+8, ...), U = 8/NT steps (8 weight loads per lane) issued
 * before their mma. For shapes with few row tiles the K range is further split over a cluster of
 * `split` CTAs (1, 2, 4, 8; contiguous step ranges), so that every shape has enough CTAs.
 *
 * Reduction order (fixed): each warp's mma accumulator chain in increasing step order; then the
 * 8 warps summed in warp order through shared memory; then the cluster's CTAs in rank order by
 * rank 0 through distributed shared memory. Nothing depends on the SM count, on scheduling or on
 * timing, and no atomics are used: identical inputs give bit-identical outputs on every run.
 * The split and NT come from the shape only (k3k_cuda_gemv_plan). */
#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

#include "gemv.h"
#include "mma_sm80.cuh"

namespace cg = cooperative_groups;

#define GEMV_WARPS 8

struct gemv_args {
  const uint16_t *x;
  int64_t ldx; /* elements */
  const uint16_t *w;
  int64_t ldw;
  dv y;
  int M, N, K, split;
};

/* 16 bytes of weights: read once per token, so keep them out of L1. */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

/* HI: M > 8, so x rows g+8 exist. NT: row tiles (8 rows each) per warp step. */
template <int NT, bool HI>
__global__ void __launch_bounds__(GEMV_WARPS * 32, HI ? 2 : 3) gemv_kernel(gemv_args a) {
  constexpr int U = 8 / NT; /* steps per batch: 8 weight loads in flight per lane */
  __shared__ float red[GEMV_WARPS][NT][32][4];
  __shared__ float part[16 * 8 * NT]; /* this CTA's partial sums, read by cluster rank 0 */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int rank = blockIdx.x, n0 = blockIdx.y * 8 * NT;
  const int S = (a.K + 31) >> 5; /* steps of 32 k */
  const int s_lo = (int)((int64_t)S * rank / a.split), s_hi = (int)((int64_t)S * (rank + 1) / a.split);

  const uint16_t *wrow[NT];
  bool nok[NT];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    int n = n0 + 8 * j + g;
    nok[j] = n < a.N;
    wrow[j] = a.w + (int64_t)(nok[j] ? n : 0) * a.ldw + 8 * t4;
  }
  const bool xlo = g < a.M, xhi = HI && g + 8 < a.M;
  const uint16_t *xr0 = a.x + (int64_t)(xlo ? g : 0) * a.ldx + 8 * t4;
  const uint16_t *xr1 = a.x + (int64_t)(xhi ? g + 8 : 0) * a.ldx + 8 * t4;
  const uint4 z4 = make_uint4(0, 0, 0, 0);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  for (int s = s_lo + warp; s < s_hi; s += GEMV_WARPS * U) {
    uint4 wv[U][NT];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int ss = s + u * GEMV_WARPS;
      int k = ss * 32 + 8 * t4;
      bool ok = ss < s_hi && k < a.K;
#pragma unroll
      for (int j = 0; j < NT; j++) wv[u][j] = ok && nok[j] ? ld_stream16(wrow[j] + ss * 32) : z4;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int ss = s + u * GEMV_WARPS;
      bool ok = ss < s_hi && ss * 32 + 8 * t4 < a.K;
      uint4 xa = ok && xlo ? __ldg((const uint4 *)(xr0 + ss * 32)) : z4;
      uint4 xb = ok && xhi ? __ldg((const uint4 *)(xr1 + ss * 32)) : z4;
      const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y}, a1[4] = {xa.z, xb.z, xa.w, xb.w};
#pragma unroll
      for (int j = 0; j < NT; j++) {
        mma_bf16(acc[j], a0, wv[u][j].x, wv[u][j].y);
        mma_bf16(acc[j], a1, wv[u][j].z, wv[u][j].w);
      }
    }
  }

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
  /* K split: aim for >= 1024 CTAs (several waves of 8-warp CTAs on any Hopper part; a shape
   * constant, never the SM count), keeping >= one full batch (8/NT steps) per warp. */
  int s = 1;
  while (s < 8 && tiles * s < 1024 && steps / (2 * s * GEMV_WARPS) >= 8 / t) s *= 2;
  *split = s;
  *nt = t;
}

static int gemv_env(void) {
  static int env = -1;
  if (env < 0) {
    const char *e = getenv("K3PD_CUDA_GEMV");
    env = !(e && !strcmp(e, "0"));
  }
  return env;
}

bool k3k_cuda_gemv_wanted(const k3k_tensor_t *const *t) {
  return gemv_env() && k3k_cuda_gemv_fits(t);
}

template <int NT, bool HI>
static cudaError_t launch(cudaStream_t st, const gemv_args &a) {
  int64_t tiles = (a.N + 8 * NT - 1) / (8 * NT);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)a.split, (unsigned)tiles, 1);
  cfg.blockDim = dim3(GEMV_WARPS * 32, 1, 1);
  cfg.stream = st;
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)a.split;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = a.split > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, gemv_kernel<NT, HI>, a);
}

int k3k_cuda_gemv(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t, int split, int nt) {
  if (!k3k_cuda_gemv_fits(t)) return K3_EINVAL;
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  gemv_args a;
  a.x = (const uint16_t *)x->data, a.ldx = x->stride[0];
  a.w = (const uint16_t *)w->data, a.ldw = w->stride[0];
  a.y = mkdv(y);
  a.M = (int)x->shape[0], a.N = (int)w->shape[0], a.K = (int)x->shape[1];
  int ps, pn;
  k3k_cuda_gemv_plan(a.M, a.N, a.K, &ps, &pn);
  a.split = split > 0 ? split : ps;
  if (nt <= 0) nt = pn;
  if ((a.split != 1 && a.split != 2 && a.split != 4 && a.split != 8) ||
      (nt != 1 && nt != 2 && nt != 4))
    return K3_EINVAL;
  bool hi = a.M > 8;
  cudaError_t e;
  if (nt == 1) e = hi ? launch<1, true>(cx->stream, a) : launch<1, false>(cx->stream, a);
  else if (nt == 2) e = hi ? launch<2, true>(cx->stream, a) : launch<2, false>(cx->stream, a);
  else e = hi ? launch<4, true>(cx->stream, a) : launch<4, false>(cx->stream, a);
  if (e != cudaSuccess) {
    K3_ERROR("cuda: launch of gemv (M=%d N=%d K=%d split=%d nt=%d) failed: %s", a.M, a.N, a.K,
             a.split, nt, cudaGetErrorString(e));
    return K3_EDEVICE;
  }
  K3K_LAUNCHED("gemv");
  return 0;
}
