/* The register-level MXFP4 → bf16 pieces shared by the MXFP4 kernels (mxfp4_tc.cu, mxfp4_dec.cu,
 * mxfp4_wg.cu), so the bit tricks exist once:
 *   - mx_bmul2: a bf16x2 multiply on raw 32-bit registers;
 *   - mx_e2m1_mul4: the 8 E2M1 codes of a word as 4 bf16x2 registers × 2^-126 (register i holds
 *     codes i and i+4), the multiply form: ((w_i & 0x000F000F) · (2^6 + 2^12)) & 0x81C081C0,
 *     where w_i has codes i, i+4 in its nibbles 0 and 4 (w, w >> 4 via the mask 0x00F000F0 and
 *     multiplier 2^2 + 2^8, the same on w >> 8 for i = 2, 3). The multiply makes two disjoint
 *     copies of each nibble (no carries): the low copy puts e1 e0 m on the bf16 exponent/mantissa
 *     boundary, the high copy the sign on bit 15; the mask keeps those. 13 integer operations
 *     per 8 codes, 4 of them IMAD (FMA pipe);
 *   - mx_scale_one: the E8M0 byte s as the one bf16x2 factor 2^(s−1) that turns those codes into
 *     values, exact for s <= 128 (larger scales need two factors: each kernel's slow path).
 * What it is not: a kernel, or the fragment layouts (each kernel permutes the registers itself).
 * Header-only, inline. */
#ifndef K3K_CUDA_MXFP4_E2M1_CUH
#define K3K_CUDA_MXFP4_E2M1_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t mx_bmul2(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a),
                             *reinterpret_cast<__nv_bfloat162 *>(&b));
  return *reinterpret_cast<uint32_t *>(&r);
}

/* Register i of mx_e2m1_mul4 alone (w2 = w >> 8). */
__device__ __forceinline__ uint32_t mx_e2m1_mul(uint32_t w, uint32_t w2, int i) {
  const uint32_t M = 0x81C081C0u;
  if (i == 0) return ((w & 0x000F000Fu) * 4160u) & M;
  if (i == 1) return ((w & 0x00F000F0u) * 260u) & M;
  if (i == 2) return ((w2 & 0x000F000Fu) * 4160u) & M;
  return ((w2 & 0x00F000F0u) * 260u) & M;
}

__device__ __forceinline__ void mx_e2m1_mul4(uint32_t w, uint32_t r[4]) {
  const uint32_t w2 = w >> 8;
  r[0] = mx_e2m1_mul(w, w2, 0);
  r[1] = mx_e2m1_mul(w, w2, 1);
  r[2] = mx_e2m1_mul(w, w2, 2);
  r[3] = mx_e2m1_mul(w, w2, 3);
}

__device__ __forceinline__ uint32_t mx_scale_one(uint32_t s) { return (s + 126u) * 0x00800080u; }

#endif
