/* Reference kernels for the digest jobs' perf table (tests/gpu/gpu_xdev.c --perf): the device's
 * read bandwidth, measured by a kernel that does nothing but read (the ceiling a digest-only
 * job is compared with), and a spin kernel that keeps the stream busy so that timed work
 * starts without host launch gaps.
 * What it is not: used by any worker. */
#include "cuda_common.cuh"
#include "xdev_cuda.h"

/* Grid-stride over n16 16-byte words, 4 independent loads in flight per thread and iteration;
 * the XOR keeps the loads alive; one atomic per block. */
__global__ void __launch_bounds__(256) read_xor_kernel(const uint4 *__restrict__ p, size_t n16,
                                                       unsigned long long *out) {
  __shared__ unsigned long long red[8];
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t x = 0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
          d = __ldcs(p + i + 3 * stride);
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    uint4 a = __ldcs(p + i);
    x ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int o = 16; o > 0; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long r = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) r ^= red[w];
    atomicXor(out, r);
  }
}

extern "C" int k3k_cu_read_xor(cudaStream_t st, const void *p, size_t bytes, uint64_t *out) {
  int dev = 0, sms = 0;
  K3K_CU(cudaGetDevice(&dev));
  K3K_CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  size_t n16 = bytes / 16;
  if (!n16) return 0;
  read_xor_kernel<<<sms * 8, 256, 0, st>>>((const uint4 *)p, n16, (unsigned long long *)out);
  K3K_LAUNCHED("read_xor_kernel");
  return 0;
}

__global__ void spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

extern "C" int k3k_cu_spin(cudaStream_t st, uint32_t ns) {
  spin_kernel<<<1, 32, 0, st>>>(ns);
  K3K_LAUNCHED("spin_kernel");
  return 0;
}
