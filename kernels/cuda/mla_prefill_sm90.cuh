/* Hopper (sm_90a) primitives for the MLA prefill kernel (mla_prefill.cu): warpgroup MMA
 * (wgmma) with shared-memory matrix descriptors, mbarriers, the async-proxy fence.
 *
 * What it is for: the few PTX instructions the warp-specialised prefill kernel needs, each
 * written once with its layout contract next to it, so the kernel reads as an algorithm.
 * What it is not: a general wgmma library (only m64n128k16 bf16 -> f32, the two operand forms
 * the kernel uses); a public header (kernels/cuda/ only); TMA (the kernel loads with cp.async,
 * mma_sm80.cuh, which zero-fills rows past a sequence exactly).
 *
 * Shared-memory layout contract (PTX ISA "matrix descriptor", 128-byte swizzle, bf16):
 *  - a swizzle atom is 8 rows x 128 bytes (64 bf16) at a 1024-byte aligned address; 16-byte
 *    chunk c of row r is stored at chunk c ^ (r & 7). Atoms of consecutive 8-row groups are
 *    1024 bytes apart (the stride byte offset, SBO).
 *  - K-major operand (rows = M or N, the 16-wide K slice inside one 128-byte row): descriptor
 *    start = atom base + 32 bytes per 16-element K step; LBO unused (K never leaves the row).
 *  - MN-major operand (rows = K, 64 MN elements per 128-byte row, "transposed" B): SBO = stride
 *    between 8-row K groups (1024), LBO = stride between 64-element MN blocks.
 * Accumulator layout (m64nN, f32): warp w of the warpgroup owns rows 16w..16w+15; for lane
 * 4g+t, d[4j+0..1] = (row g, cols 8j+2t..+1), d[4j+2..3] = (row g+8, same cols). The register
 * A operand (m64k16 bf16) of warp w is the mma.sync m16n8k16 A fragment of rows 16w..16w+15. */
#ifndef K3K_MLA_PREFILL_SM90_CUH
#define K3K_MLA_PREFILL_SM90_CUH

#include "mma_sm80.cuh"

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- mbarriers (CTA scope). Arrive has release, try_wait acquire semantics (the defaults). */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
/* Waits for the completion of the phase with the given parity. A wait that cannot end (a
 * pipeline bug) traps after ~2^26 polls (each try_wait suspends for a while), so the launch
 * fails with an error instead of hanging the device. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  for (uint32_t n = 0; !mbar_try_wait(bar, parity); n++)
    if (n > (1u << 26)) __trap();
}

/* ---- ordering between this thread's generic-proxy writes (cp.async included, once they
 * completed: cp_async_wait) and later async-proxy reads (wgmma operands). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- wgmma */
/* Descriptor: start address, LBO and SBO in 16-byte units; layout type 1 = 128-byte swizzle. */
__device__ __forceinline__ uint64_t gmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* The compiler sees an accumulator as written when the wgmma asm statement issues; this pins
 * every later use of the registers after the wait that really completes them. */
__device__ __forceinline__ void reg_fence64(float d[64]) {
#pragma unroll
  for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define K3K_D64_STR                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define K3K_D8(b)                                                                               \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define K3K_D64_OPS                                                                   \
  K3K_D8(0), K3K_D8(8), K3K_D8(16), K3K_D8(24), K3K_D8(32), K3K_D8(40), K3K_D8(48), \
      K3K_D8(56)

/* d (64x128 f32) = (acc ? d : 0) + A·B; A 64x16 K-major and B 128(N)x16 K-major, both in shared
 * memory (descriptors da, db). */
__device__ __forceinline__ void wgmma_ss_n128(float d[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " K3K_D64_STR
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : K3K_D64_OPS
      : "l"(da), "l"(db), "r"(acc));
}
/* d (64x128 f32) += A·B; A 64x16 bf16 in registers (4 x bf16x2 per thread, see above), B 16(K)
 * x 128(N) MN-major in shared memory (transposed operand). */
__device__ __forceinline__ void wgmma_rs_n128_tb(float d[64], const uint32_t a[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " K3K_D64_STR
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : K3K_D64_OPS
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* 2^x, MUFU approximation (flush-to-zero; 2^-inf = 0). */
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif
