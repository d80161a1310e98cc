/* Programmatic dependent launch (PDL) for the decode step's kernels.
 *
 * What it is for: at batch 1 the decode step is ~500 launches, most of them a few µs long, so
 * the gap between one kernel's last block and the next kernel's first (launch, block
 * scheduling, the first loads' DRAM latency) is a visible share of the step. A kernel launched
 * with pdl_launch() may start while the previous kernel of the stream is still running; inside,
 * it must call pdl_wait() before it touches any memory the previous kernels write (or read:
 * no write before the wait either). Work before the wait may only read data that no kernel of
 * the step writes (weights). A kernel may call pdl_trigger() to let its dependent start early
 * (the dependent's blocks are scheduled once every block of this kernel has triggered or
 * exited, and the dependent's pdl_wait still waits for this kernel's completion and memory
 * flush, so triggering early is always safe; it only affects when the dependent's blocks
 * occupy SM slots). Captured into a CUDA graph the attribute becomes a programmatic edge.
 * What it is not: a change of any result. The instructions are no-ops for a kernel launched
 * without the attribute, and pdl_wait orders all memory exactly as plain stream order does.
 * K3PD_CUDA_PDL=0 (read once) launches everything without the attribute.
 * Invariants: every kernel launched through pdl_launch calls pdl_wait before its first access
 * to non-constant global memory. Transitively safe: a kernel's wait returns after its
 * predecessor completed, which itself waited for its own predecessor. */
#ifndef K3K_CUDA_PDL_CUH
#define K3K_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

/* Waits until the preceding kernel of the stream has completed and its writes are visible. */
__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/* Allows the dependent kernel (launched with the attribute) to be scheduled. */
__device__ __forceinline__ void pdl_trigger(void) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* Whether launches carry the PDL attribute (K3PD_CUDA_PDL, default on). */
static inline bool pdl_enabled(void) {
  static int env = -1;
  if (env < 0) {
    const char *e = getenv("K3PD_CUDA_PDL");
    env = !(e && !strcmp(e, "0"));
  }
  return env != 0;
}

/* Fills one launch attribute slot with the PDL attribute; returns how many it used (0 or 1). */
static inline unsigned pdl_attr(cudaLaunchAttribute *at) {
  if (!pdl_enabled()) return 0;
  at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at->val.programmaticStreamSerializationAllowed = 1;
  return 1;
}

/* kern<<<grid, block, smem, st>>>(args...) with the PDL attribute (when enabled). */
template <typename... KArgs, typename... Args>
static cudaError_t pdl_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t st, Args &&...args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1] = {};
  cfg.attrs = at;
  cfg.numAttrs = pdl_attr(&at[0]);
  return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
}

#endif
