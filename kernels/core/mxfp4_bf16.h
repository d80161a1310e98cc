/* One MXFP4 weight as bf16 bits: the E2M1 code c (bit 3 sign, bits 2..1 exponent, bit 0
 * mantissa) times 2^(s-127) for an E8M0 scale byte s (s != 255, which the loaders reject).
 *
 * What it is for: the dequant-once MoE path (kernels/cuda/moe_dq.cu) writes whole experts as
 * bf16 with it, and test_kernels (tests/kernels/t_mxfp4.c) checks it on the host for all 16
 * codes x 255 scales against an independent float64 decode. Host and device compile the same
 * lines, so the test covers the device's arithmetic (IEEE fp32 multiply with subnormals: nvcc's
 * default, no fast-math flush).
 * Invariants: exact. The E2M1 magnitude is built as an fp32 (0, 0.5, 1, 1.5, 2, 3, 4, 6) and
 * multiplied by the scale (2^-127 as the subnormal 0x00400000 for s = 0); the product has at most
 * two significant bits and an exponent in fp32's range (down to 2^-128), so it is exact and its
 * low 16 bits are zero: the top half is the bf16 value. Code 8 gives -0 (as k3k_e2m1_table). */
#ifndef K3K_MXFP4_BF16_H
#define K3K_MXFP4_BF16_H

#include <stdint.h>

#ifdef __CUDACC__
#define K3K_MXBF_FN static __host__ __device__ __forceinline__
#else
#define K3K_MXBF_FN static inline
#endif

K3K_MXBF_FN uint32_t k3k_mx_bf16_bits(uint32_t c, uint32_t s) {
  union {
    uint32_t u;
    float f;
  } v, sc;
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  v.u = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3F000000u : 0u);
  sc.u = s ? s << 23 : 0x00400000u;
  v.f = v.f * sc.f;
  return (v.u >> 16) | ((c & 8u) << 12);
}

#endif
