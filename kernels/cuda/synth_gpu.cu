/* CUDA: the synthetic-weight generator of common/ckpt/synth.c on the device, bit-exact with the
 * host generator through an "uncertain element" list the host patches (k3k_cuda_ops.h).
 *
 * What it is for: the medium preset (91.6 GB, mostly MXFP4 experts) takes ~20 minutes to
 * generate on the GPU host's 16 cores (two Box-Muller normals per master, every master generated
 * twice: once for the packed codes, once for the scales); the model runner generates it on the
 * GPU instead (k3_runner_init_synth) in seconds.
 * Exactness: every step is the host's IEEE arithmetic done in the same order with explicit
 * round-to-nearest intrinsics (no FMA contraction: the host code has none either), except log
 * and cos, where CUDA's double versions (<= 1 and 2 ulp) and glibc's (< 1 ulp) may differ by a
 * few double ulps. A value can then round to a different float only when it lies within a few
 * double ulps of a float rounding midpoint, so every value within 256 double ulps of one (or
 * tiny) is listed as "uncertain" (~1 in 2^20 values); the caller recomputes those on the host
 * with k3_synth_fill and overwrites them (for MXFP4: the whole 32-group). Everything after the
 * float conversion (bf16 RNE, the MXFP4 quantizer) is exact float arithmetic on both sides.
 * What it is not: a general RNG. The role parameters (a, b, kind) are the caller's mapping of
 * synth.c's role_value.
 * Invariants: nothing synchronises; flags beyond `cap` are counted but not stored (the caller
 * treats n_flags > cap as an error). */
#include "cuda_common.cuh"
#include "k3k_cuda_ops.h"

__device__ __forceinline__ uint64_t sm_u64(uint64_t key, uint64_t ctr) {
  uint64_t z = key + (ctr + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* ((double)(x >> 11) + 0.5) * 2^-53: every step exact */
__device__ __forceinline__ double sm_uniform(uint64_t key, uint64_t ctr) {
  return __dmul_rn(__dadd_rn((double)(sm_u64(key, ctr) >> 11), 0.5), 1.0 / 9007199254740992.0);
}
__device__ __forceinline__ double sm_normal(uint64_t key, uint64_t idx) {
  double u1 = sm_uniform(key, 2 * idx), u2 = sm_uniform(key, 2 * idx + 1);
  return __dmul_rn(__dsqrt_rn(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(6.283185307179586, u2)));
}
/* Could float(v) differ from the host's float of its (few-ulp different) v? */
__device__ __forceinline__ bool uncertain(double v) {
  if (fabs(v) < 1e-30) return true;
  long long bits = __double_as_longlong(v);
  long long low = bits & 0x1FFFFFFFll, d = low - 0x10000000ll;
  return d > -256 && d < 256;
}

__device__ __forceinline__ void flag(uint64_t idx, uint64_t *flags, unsigned *n, unsigned cap) {
  unsigned at = atomicAdd(n, 1u);
  if (at < cap) flags[at] = idx;
}

__global__ void synth_plain_kernel(k3k_cu_synth_plain p, void *dst, int64_t n, uint64_t *flags,
                                   unsigned *n_flags, unsigned cap) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double v;
    bool exact = false;
    if (p.kind == K3K_SYN_NORMAL) {
      v = __dmul_rn(p.a, sm_normal(p.key, (uint64_t)i));
      if (p.has_b) v = __dadd_rn(p.b, v);
    } else if (p.kind == K3K_SYN_AFFINE_UNIFORM) {
      v = __dadd_rn(p.b, __dmul_rn(p.a, sm_uniform(p.key, (uint64_t)i)));
      exact = true; /* no libm: the host computes the same bits */
    } else { /* K3K_SYN_LOG_UNIFORM: log(1 + 15u) for the first n_valid, 0 after */
      if (i < p.n_valid) {
        v = log(__dadd_rn(1.0, __dmul_rn(15.0, sm_uniform(p.key, (uint64_t)i))));
      } else {
        v = 0.0;
        exact = true;
      }
    }
    if (!exact && uncertain(v)) flag((uint64_t)i, flags, n_flags, cap);
    float f = __double2float_rn(v);
    if (p.f32)
      ((float *)dst)[i] = f;
    else
      ((uint16_t *)dst)[i] = f2bf(f);
  }
}

__constant__ float c_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* k3_e2m1_encode: nearest magnitude, ties to the even code, > 6 saturates, sign in bit 3. */
__device__ __forceinline__ unsigned e2m1(float x) {
  float mag = fabsf(x);
  unsigned best = 0;
  float bestd = __int_as_float(0x7f800000);
  for (unsigned c = 0; c < 8; c++) {
    float d = fabsf(__fsub_rn(mag, c_e2m1[c]));
    if (d < bestd || (d == bestd && (c & 1) == 0)) {
      best = c;
      bestd = d;
    }
  }
  if (mag > 6.0f) best = 7;
  if (x < 0 && best != 0) best |= 8;
  return best;
}

/* One thread per 32-group of the logical [N, K] master: 16 packed bytes or the scale byte. */
__global__ void synth_mx_kernel(uint64_t mkey, int64_t groups, int64_t K, int want_scale,
                                uint8_t *dst, uint64_t *flags, unsigned *n_flags, unsigned cap) {
  for (int64_t gi = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; gi < groups;
       gi += (int64_t)gridDim.x * blockDim.x) {
    const int64_t gpr = K / 32, row = gi / gpr, g = gi % gpr;
    const uint64_t base = (uint64_t)row * (uint64_t)K + (uint64_t)g * 32;
    float w[32];
    bool unc = false;
    float amax = 0.0f;
#pragma unroll 4
    for (int i = 0; i < 32; i++) {
      double v = __dmul_rn(0.02, sm_normal(mkey, base + (uint64_t)i));
      unc |= uncertain(v);
      w[i] = bf2f(f2bf(__double2float_rn(v)));
      amax = fmaxf(amax, fabsf(w[i]));
    }
    if (unc) flag((uint64_t)gi, flags, n_flags, cap);
    int e = 127;
    if (amax > 0.0f) {
      int ex;
      frexpf(amax, &ex);
      e = 127 + (ex - 1) - 2;
      e = e < 1 ? 1 : (e > 254 ? 254 : e);
    }
    if (want_scale) {
      dst[gi] = (uint8_t)e;
      continue;
    }
    const float inv = ldexpf(1.0f, 127 - e);
    uint8_t *out = dst + gi * 16;
    for (int j = 0; j < 16; j++) {
      unsigned lo = amax > 0.0f ? e2m1(__fmul_rn(w[2 * j], inv)) : 0;
      unsigned hi = amax > 0.0f ? e2m1(__fmul_rn(w[2 * j + 1], inv)) : 0;
      out[j] = (uint8_t)(lo | (hi << 4));
    }
  }
}

static unsigned grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b > 8192 ? 8192 : (b < 1 ? 1 : b));
}

int k3k_cu_synth_plain_fill(cudaStream_t st, const k3k_cu_synth_plain *p, void *dst, int64_t n,
                            uint64_t *flags, unsigned *n_flags, unsigned cap) {
  if (n <= 0) return 0;
  synth_plain_kernel<<<grid_for(n), 256, 0, st>>>(*p, dst, n, flags, n_flags, cap);
  K3K_LAUNCHED("synth_plain");
  return 0;
}

int k3k_cu_synth_mx_fill(cudaStream_t st, uint64_t mkey, int64_t N, int64_t K, int want_scale,
                         uint8_t *dst, uint64_t *flags, unsigned *n_flags, unsigned cap) {
  if (N <= 0 || K <= 0) return 0;
  if (K % 32) return K3_EINVAL;
  int64_t groups = N * (K / 32);
  synth_mx_kernel<<<grid_for(groups), 128, 0, st>>>(mkey, groups, K, want_scale, dst, flags,
                                                    n_flags, cap);
  K3K_LAUNCHED("synth_mx");
  return 0;
}
