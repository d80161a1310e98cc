/* Grouped bf16 expert GEMM over a device MoE plan (moe_bf16.h): the 48B's routed experts at
 * decode without a host round trip.
 *
 * Schedule: grid (ceil(N / 32), max_active), 256 threads. Block (bx, j) takes the j-th active
 * expert and weight rows 32bx..+32, four per warp. The expert's grouped rows are processed in
 * chunks of R <= 8 (R = 48 KB / (2K), at most 8): the chunk's x rows are staged in shared memory
 * (16-byte copies, gathered through x_gather), then each warp streams its weight rows once per
 * chunk with 16-byte loads (four segments of 8 elements per lane in flight, eight with the up
 * matrix) and accumulates the R dot products in fp32 registers. Lane l owns the 8-element
 * segments l, l+32, l+64, ...; the lanes' partials meet in a fixed butterfly (warp_sum), so the
 * summation order never depends on the launch or the GPU.
 * Numerics: products and sums in fp32 (FMA), gate/up rounded to bf16 before the activation when
 * round_inner (the reference stores them bf16), one rounding of y. */
#include <string.h>

#include "cuda_common.cuh"
#include "moe_bf16.h"
#include "moe_ops.h"

namespace {

constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = 8 * kRowsPerWarp;
constexpr int kMaxChunk = 8;
constexpr int kUnroll = 4;
constexpr int kSmemBytes = 48 * 1024;

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const uint32_t *pw = reinterpret_cast<const uint32_t *>(&w);
  const uint32_t *px = reinterpret_cast<const uint32_t *>(&x);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    s = fmaf(__uint_as_float(pw[i] << 16), __uint_as_float(px[i] << 16), s);
    s = fmaf(__uint_as_float(pw[i] & 0xFFFF0000u), __uint_as_float(px[i] & 0xFFFF0000u), s);
  }
  return s;
}

/* acc[c] += W[n] . xs[c] for the chunk's nr rows; the lane's segments only. */
__device__ __forceinline__ void row_dots(const uint16_t *__restrict__ wrow, const uint4 *xs,
                                         int nseg, int nr, int lane, float *acc) {
  const uint4 *w4 = reinterpret_cast<const uint4 *>(wrow);
  for (int s0 = lane; s0 < nseg; s0 += 32 * kUnroll) {
    uint4 w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      int s = s0 + 32 * u;
      w[u] = s < nseg ? __ldg(w4 + s) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      int s = s0 + 32 * u;
      if (s < nseg) {
#pragma unroll
        for (int c = 0; c < kMaxChunk; c++)
          if (c < nr) acc[c] += dot8(w[u], xs[(size_t)c * nseg + s]);
      }
    }
  }
}

__global__ void __launch_bounds__(256) moe_bf16_kernel(k3k_cu_moe_bf16_args a, int chunk) {
  extern __shared__ uint4 xs[]; /* [chunk][K/8] */
  const int j = blockIdx.y;
  if (j >= a.active[0]) return;
  const int e = a.active[1 + j];
  const int r0 = a.expert_off[e], r1 = a.expert_off[e + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nseg = a.K / 8;
  const int n0 = blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp;
  const uint16_t *W = a.w_tab[e];
  const uint16_t *U = a.act == K3K_CU_ACT_SILU_MUL ? a.u_tab[e] : nullptr;
  for (int rc = r0; rc < r1; rc += chunk) {
    const int nr = min(chunk, r1 - rc);
    __syncthreads(); /* the previous chunk's readers are done */
    for (int i = threadIdx.x; i < nr * nseg; i += blockDim.x) {
      int c = i / nseg, s = i - c * nseg;
      int64_t xr = a.x_gather ? a.x_gather[rc + c] : rc + c;
      xs[i] = *reinterpret_cast<const uint4 *>(a.x + xr * a.ldx + (int64_t)s * 8);
    }
    __syncthreads();
    for (int q = 0; q < kRowsPerWarp; q++) {
      const int n = n0 + q;
      if (n >= a.N) break; /* warp-uniform */
      float g[kMaxChunk], u[kMaxChunk];
#pragma unroll
      for (int c = 0; c < kMaxChunk; c++) g[c] = u[c] = 0.0f;
      row_dots(W + (int64_t)n * a.ldw, xs, nseg, nr, lane, g);
      if (U) row_dots(U + (int64_t)n * a.ldw, xs, nseg, nr, lane, u);
#pragma unroll
      for (int c = 0; c < kMaxChunk; c++) {
        if (c >= nr) continue; /* nr is warp-uniform */
        float gv = warp_sum(g[c]);
        float v = gv;
        if (U) {
          float uv = warp_sum(u[c]);
          if (a.round_inner) {
            gv = round_bf(gv);
            uv = round_bf(uv);
          }
          v = gv * sigmoidf_acc(gv) * uv;
        }
        if (lane == 0) {
          int64_t o = (int64_t)(rc + c) * a.ldy + n;
          if (a.y_f32)
            reinterpret_cast<float *>(a.y)[o] = v;
          else
            reinterpret_cast<uint16_t *>(a.y)[o] = f2bf(v);
        }
      }
    }
  }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace

extern "C" bool k3k_cu_moe_bf16_wanted(int64_t T, int32_t k, int32_t E) {
  const int64_t pairs = T * k, active = pairs < E ? pairs : E;
  return active > 0 && pairs <= 16 * active;
}

extern "C" int k3k_cu_moe_bf16_gemm(cudaStream_t st, const k3k_cu_moe_bf16_args *a) {
  if (!a || !a->w_tab || !a->x || !a->y || !a->expert_off || !a->active || a->N <= 0 ||
      a->K <= 0 || a->K % 8 || a->K > 24576 || a->ldw % 8 || a->ldx % 8 || a->ldw < a->K ||
      a->ldx < a->K || a->ldy < a->N || !aligned16(a->x) ||
      (a->act != K3K_CU_ACT_NONE && a->act != K3K_CU_ACT_SILU_MUL) ||
      (a->act == K3K_CU_ACT_SILU_MUL && !a->u_tab))
    return K3_EINVAL;
  if (a->max_active <= 0) return 0;
  int chunk = kSmemBytes / (2 * a->K);
  if (chunk > kMaxChunk) chunk = kMaxChunk;
  const size_t smem = (size_t)chunk * a->K * 2;
  dim3 grid((unsigned)((a->N + kRowsPerBlock - 1) / kRowsPerBlock), (unsigned)a->max_active);
  moe_bf16_kernel<<<grid, 256, smem, st>>>(*a, chunk);
  K3K_LAUNCHED("moe_bf16");
  return 0;
}

extern "C" int k3k_cu_moe_bf16_experts(cudaStream_t st, const uint16_t *const *tab, int32_t E,
                                       int32_t F, int32_t D, const uint16_t *x, int64_t ldx,
                                       const int32_t *x_gather, const int32_t *expert_off,
                                       const int32_t *active, int32_t max_active, uint16_t *h,
                                       uint16_t *y) {
  k3k_cu_moe_bf16_args a;
  memset(&a, 0, sizeof a);
  a.w_tab = tab;
  a.u_tab = tab + E;
  a.ldw = D;
  a.act = K3K_CU_ACT_SILU_MUL;
  a.round_inner = 1;
  a.N = F;
  a.K = D;
  a.x = x;
  a.ldx = ldx;
  a.x_gather = x_gather;
  a.y = h;
  a.ldy = F;
  a.expert_off = expert_off;
  a.active = active;
  a.max_active = max_active;
  int rc = k3k_cu_moe_bf16_gemm(st, &a);
  if (rc) return rc;
  a.w_tab = tab + 2 * (int64_t)E;
  a.u_tab = nullptr;
  a.ldw = F;
  a.act = K3K_CU_ACT_NONE;
  a.round_inner = 0;
  a.N = D;
  a.K = F;
  a.x = h;
  a.ldx = F;
  a.x_gather = nullptr;
  a.y = y;
  a.ldy = D;
  return k3k_cu_moe_bf16_gemm(st, &a);
}
