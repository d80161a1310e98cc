/* Device bodies shared by the RMSNORM / ATTN_RES_MIX kernels of norm.cu and the fused decode
 * kernel of resnorm.cu (ADD → ATTN_RES_MIX → RMSNORM in one launch). One copy of each
 * arithmetic sequence, so the fused kernel is bit-identical to the three op kernels by
 * construction: the same per-thread element order, the same reduction trees.
 *
 * rms_row<VPT>: one row of RMSNORM by the block's first 128 threads (4 warps; `active` says
 * whether the calling thread is one of them). Every thread of the block must call it (it has
 * two barriers); red holds >= 4 floats. x, w, y: the row, 16-byte aligned, d % 8 == 0,
 * d / 8 <= 128 * VPT.
 * arm_token<THREADS, VPT, P1, P2>: ATTN_RES_MIX of one token by a block of THREADS threads:
 * values j < nb are snaps + j·s_b, value nb is pc; y = Σ_j softmax_j(...) v_j (k3k.h). Every
 * thread calls it (barriers); red/alpha as declared in the kernels. */
#ifndef K3K_CUDA_NORM_BODY_CUH
#define K3K_CUDA_NORM_BODY_CUH

#include "cuda_common.cuh"

#define ARM_MAXV 16

template <int VPT>
__device__ __forceinline__ void rms_row(const uint16_t *x, const uint16_t *w, uint16_t *y, int d,
                                        float eps, int bf16_inner, float *red, bool active) {
  const bf16x8 *xr = (const bf16x8 *)x;
  const bf16x8 *wr = (const bf16x8 *)w;
  bf16x8 *yr = (bf16x8 *)y;
  const int d8 = d / 8, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  bf16x8 v[VPT], wv[VPT];
  /* x and the weight in one round trip (the weight used to be a second one after the sum) */
#pragma unroll
  for (int k = 0; k < VPT; k++) {
    int i = threadIdx.x + k * 128;
    if (active && i < d8) {
      v[k] = xr[i];
      wv[k] = wr[i];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; k++)
    if (active && threadIdx.x + k * 128 < d8) {
      float f[8];
      unpack8(v[k], f);
#pragma unroll
      for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    }
  /* the 4 active warps' sums, in warp order (block_sum's tree at 128 threads) */
  ss = warp_sum(ss);
  if (active && lane == 0) red[wid] = ss;
  __syncthreads();
  float r = lane < 4 ? red[lane] : 0.0f;
  r = warp_sum(r);
  __syncthreads();
  const float rstd = 1.0f / sqrtf(r / (float)d + eps);
#pragma unroll
  for (int k = 0; k < VPT; k++) {
    int i = threadIdx.x + k * 128;
    if (active && i < d8) {
      float f[8], g[8];
      unpack8(v[k], f);
      unpack8(wv[k], g);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        float xn = f[j] * rstd;
        if (bf16_inner) xn = round_bf(xn);
        f[j] = xn * g[j];
      }
      yr[i] = pack8(f);
    }
  }
}

template <int THREADS, int VPT, int P1, int P2>
__device__ __forceinline__ void arm_token(const uint16_t *snaps, int64_t s_b, const uint16_t *pc,
                                          const uint16_t *wn, const uint16_t *wp, uint16_t *y,
                                          int nb, int d, float eps,
                                          float (*red)[2 * ARM_MAXV], float *alpha) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, d8 = d / 8, nv = nb + 1;
  for (int j0 = 0; j0 < nv; j0 += P1) {
    bf16x8 v[P1][VPT];
#pragma unroll
    for (int h = 0; h < P1; h++) {
      int j = j0 + h;
      if (j >= nv) break;
      const bf16x8 *V = (const bf16x8 *)(j < nb ? snaps + j * s_b : pc);
#pragma unroll
      for (int k = 0; k < VPT; k++) {
        int i = threadIdx.x + k * THREADS;
        if (i < d8) v[h][k] = V[i];
      }
    }
    float ss[P1], dot[P1];
#pragma unroll
    for (int h = 0; h < P1; h++) ss[h] = dot[h] = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      int i = threadIdx.x + k * THREADS;
      if (i >= d8) break;
      float a[8], b[8];
      unpack8(((const bf16x8 *)wn)[i], a); /* L1 hits after the first token */
      unpack8(((const bf16x8 *)wp)[i], b);
#pragma unroll
      for (int e = 0; e < 8; e++) a[e] *= b[e];
#pragma unroll
      for (int h = 0; h < P1; h++)
        if (j0 + h < nv) {
          float f[8];
          unpack8(v[h][k], f);
#pragma unroll
          for (int e = 0; e < 8; e++) {
            ss[h] += f[e] * f[e];
            dot[h] += f[e] * a[e];
          }
        }
    }
#pragma unroll
    for (int h = 0; h < P1; h++) {
      int j = j0 + h;
      if (j >= nv) break;
      float s1 = warp_sum(ss[h]), d1 = warp_sum(dot[h]);
      if (lane == 0) {
        red[wid][2 * j] = s1;
        red[wid][2 * j + 1] = d1;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) { /* lane j: value j's alpha, then the softmax over the nv lanes */
    float a = -INFINITY;
    if (lane < nv) {
      float s1 = 0.0f, d1 = 0.0f;
      for (int w = 0; w < THREADS / 32; w++) {
        s1 += red[w][2 * lane];
        d1 += red[w][2 * lane + 1];
      }
      a = d1 / sqrtf(s1 / (float)d + eps);
    }
    float m = warp_max(a);
    float e = lane < nv ? expf(a - m) : 0.0f;
    float z = warp_sum(e);
    if (lane < nv) alpha[lane] = e / z;
  }
  __syncthreads();
  float acc[VPT][8];
#pragma unroll
  for (int k = 0; k < VPT; k++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
  for (int j0 = 0; j0 < nv; j0 += P2) {
    bf16x8 v[P2][VPT];
#pragma unroll
    for (int h = 0; h < P2; h++) {
      int j = j0 + h;
      if (j >= nv) break;
      const bf16x8 *V = (const bf16x8 *)(j < nb ? snaps + j * s_b : pc);
#pragma unroll
      for (int k = 0; k < VPT; k++) {
        int i = threadIdx.x + k * THREADS;
        if (i < d8) v[h][k] = V[i];
      }
    }
#pragma unroll
    for (int h = 0; h < P2; h++) {
      int j = j0 + h;
      if (j >= nv) break;
      float aj = alpha[j];
#pragma unroll
      for (int k = 0; k < VPT; k++)
        if (threadIdx.x + k * THREADS < d8) {
          float f[8];
          unpack8(v[h][k], f);
#pragma unroll
          for (int e = 0; e < 8; e++) acc[k][e] += aj * f[e];
        }
    }
  }
  bf16x8 *yr = (bf16x8 *)y;
#pragma unroll
  for (int k = 0; k < VPT; k++) {
    int i = threadIdx.x + k * THREADS;
    if (i < d8) yr[i] = pack8(acc[k]);
  }
  __syncthreads(); /* alpha and red are rewritten by the next token */
}

#endif
