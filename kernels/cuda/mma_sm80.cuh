/* Warp-level tensor-core and async-copy primitives (PTX inline), shared by the attention kernels
 * (mla.cu, mla_prefill.cu).
 *
 * What it is for: mma.sync m16n8k16 bf16 with fp32 accumulate, ldmatrix (plain and transposed)
 * and cp.async 16-byte copies with zero fill, written once so the kernels read as algorithms.
 * What it is not: wgmma/TMA (Hopper-only paths); a public header (kernels/cuda/ only).
 * Fragment layouts (PTX ISA "mma.m16n8k16"): lane = 4*g + t4. A (16x16, row): a0 (g, 2t4..+1),
 * a1 (g+8, 2t4..), a2 (g, 2t4+8..), a3 (g+8, 2t4+8..). B (16x8, col): b0 (k 2t4..+1, n g),
 * b1 (k 2t4+8.., n g). C (16x8): c0,c1 (g, 2t4..+1), c2,c3 (g+8, 2t4..+1). */
#ifndef K3K_MMA_SM80_CUH
#define K3K_MMA_SM80_CUH

#include "cuda_common.cuh"

/* 16 bytes global -> shared, asynchronous; !valid writes 16 zero bytes and reads nothing. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* c += a * b (bf16 inputs, fp32 accumulate). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

#endif
