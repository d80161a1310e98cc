/* Shared device helpers for the CUDA backend: error checking, bf16 loads/stores, reductions.
 *
 * What it is for: every kernels/cuda .cu file includes this and nothing else of its own.
 * What it is not: a public header. Nothing outside kernels/cuda/ may include it.
 * Invariants: every CUDA runtime call and every launch goes through K3K_CU / K3K_LAUNCHED,
 * which log the failing expression and return K3_EDEVICE (STYLE.md: one error convention). */
#ifndef K3K_CUDA_COMMON_CUH
#define K3K_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "k3pd/err.h"
#include "k3pd/log.h"
}
#include "k3k_cuda_ops.h"

/* Runs a CUDA runtime call; on failure logs it and returns K3_EDEVICE from the caller. */
#define K3K_CU(call)                                                                   \
  do {                                                                                 \
    cudaError_t k3k_e_ = (call);                                                       \
    if (k3k_e_ != cudaSuccess) {                                                       \
      K3_ERROR("cuda: %s failed: %s (%s)", #call, cudaGetErrorName(k3k_e_),           \
               cudaGetErrorString(k3k_e_));                                            \
      return K3_EDEVICE;                                                               \
    }                                                                                  \
  } while (0)

/* After a <<<>>> launch: catches bad configurations (grid, shared memory) at once. Faults
 * inside the kernel surface at the next synchronising call, which is also checked. */
#define K3K_LAUNCHED(name)                                                             \
  do {                                                                                 \
    cudaError_t k3k_e_ = cudaGetLastError();                                           \
    if (k3k_e_ != cudaSuccess) {                                                       \
      K3_ERROR("cuda: launch of %s failed: %s (%s)", name, cudaGetErrorName(k3k_e_),  \
               cudaGetErrorString(k3k_e_));                                            \
      return K3_EDEVICE;                                                               \
    }                                                                                  \
  } while (0)

typedef uint16_t k3k_bf16_bits; /* bf16 as stored in tensors (the host API's element type) */

__device__ __forceinline__ float bf2f(k3k_bf16_bits b) {
  return __uint_as_float(((uint32_t)b) << 16);
}
/* Round-to-nearest-even, NaN kept quiet: bit-identical to k3_f32_to_bf16 on the host. */
__device__ __forceinline__ k3k_bf16_bits f2bf(float f) {
  __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<k3k_bf16_bits *>(&h);
}
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }
/* Accurate variants where the CPU reference uses libm expf (gates feeding a recurrence). */
__device__ __forceinline__ float sigmoidf_acc(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Exclusive prefix sum of v over a block of NW warps (NW <= 32, blockDim.x == 32 * NW): returns
 * this thread's prefix, *total the block's sum. tmp holds >= 32 ints. Barriers inside, so every
 * thread of the block calls it; tmp may be reused at once. */
template <int NW>
__device__ __forceinline__ int block_excl_scan_w(int v, int *tmp, int *total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) tmp[w] = x;
  __syncthreads();
  if (w == 0) {
    int s = lane < NW ? tmp[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    tmp[lane] = s; /* inclusive over warps */
  }
  __syncthreads();
  const int r = x - v + (w ? tmp[w - 1] : 0);
  *total = tmp[NW - 1];
  __syncthreads();
  return r;
}

/* Block-wide sum; every thread gets the result. `scratch` holds >= 32 floats. blockDim.x must
 * be a multiple of 32. Ends with a barrier so scratch can be reused at once. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  float r = lane < nw ? scratch[lane] : 0.0f;
  r = warp_sum(r);
  __syncthreads();
  return r;
}

/* 8 bf16 in one 16-byte word. */
struct __align__(16) bf16x8 {
  uint32_t w[4];
};
__device__ __forceinline__ void unpack8(const bf16x8 &p, float f[8]) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = __uint_as_float(p.w[i] << 16);
    f[2 * i + 1] = __uint_as_float(p.w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ bf16x8 pack8(const float f[8]) {
  bf16x8 p;
#pragma unroll
  for (int i = 0; i < 4; i++) p.w[i] = (uint32_t)f2bf(f[2 * i]) | ((uint32_t)f2bf(f[2 * i + 1]) << 16);
  return p;
}

/* A tensor as kernels see it: data, dtype (K3K_F32 = 0 or K3K_BF16 = 1 for float data), and
 * strides in elements. Loads convert to fp32; stores round by the tensor's dtype, exactly like
 * k3k_ld / k3k_st of the reference, so a BF16 output is the same rounding point on both. */
struct dv {
  char *p;
  int64_t s[4];
  int dt;
};
__device__ __forceinline__ float dv_ld(const dv &v, int64_t off) {
  return v.dt == 0 ? ((const float *)v.p)[off] : bf2f(((const uint16_t *)v.p)[off]);
}
__device__ __forceinline__ void dv_st(const dv &v, int64_t off, float x) {
  if (v.dt == 0)
    ((float *)v.p)[off] = x;
  else
    ((uint16_t *)v.p)[off] = f2bf(x);
}
__device__ __forceinline__ int32_t dv_ldi(const dv &v, int64_t off) {
  return ((const int32_t *)v.p)[off];
}

static inline dv mkdv(const k3k_tensor_t *t) {
  dv v;
  v.p = (char *)t->data;
  for (int i = 0; i < 4; i++) v.s[i] = i < t->ndim ? t->stride[i] : 0;
  v.dt = t->dtype == K3K_F32 ? 0 : 1;
  return v;
}

static inline unsigned k3k_ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

#endif
