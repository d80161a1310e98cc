/* Generic-shape CUDA paths: KDA chunked prefill, KDA recurrent step, MLA prefill attention, MLA
 * absorbed decode and the grouped MXFP4 expert GEMM at ANY head/expert size the CPU reference
 * accepts (kda_generic.cu, mla_generic.cu, moe_generic.cu).
 *
 * What it is for: the fast kernels (kda.cu, kda_chunk*.cu, mla*.cu, mxfp4_tc.cu) are written for
 * the real K3 / 48B shapes (KDA 128x128 heads, MLA 128/64/128 with c = 512, experts with K % 128
 * == 0). Everything else (the tiny presets: KDA 4 x 32, MLA 32/16/32 with c = 64, experts
 * 64 x 128; the op tests' odd sizes) takes these kernels, so the CUDA backend runs every op at
 * every shape. They mirror the CPU reference (kernels/cpu/kda.c, mla.c) loop for loop: one
 * thread per output element with the reference's summation order where that is natural, fp32
 * everywhere, the output dtype the only rounding point, so the reference's tolerances hold.
 * What it is not: fast. SIMT fp32, no tensor cores; they are the correctness path for non-K3
 * shapes (docs/perf-gpu.md "Generic-shape kernels" has their speed at one tiny shape).
 * Dispatch: the op entries k3k_cuda_kda_step, _kda_chunk, _mla_prefill, _mla_decode
 * (k3k_cuda_ops.h) run the fast kernel (k3k_cuda_<name>_fast) when that kernel's own *_ok
 * predicate accepts the operands (so real shapes run exactly as before) and the generic kernel
 * otherwise. *_any_ok is the matching `supports` answer.
 * Invariants: ids (slots, cu_seqlens, page tables) are checked on the device before anything is
 * written (check.cu; skipped under trusted ids like the fast kernels), with the CPU backend's
 * error codes, so "on error nothing changed" holds. Nothing here synchronises under trusted ids
 * except MLA_PREFILL (it reads the sequence bounds on the host, as the fast kernel does), so the
 * runner's decode step stays capturable. */
#ifndef K3K_CUDA_GENERIC_H
#define K3K_CUDA_GENERIC_H

#include <stdbool.h>

#include "k3k_cuda_ops.h"
#include "moe_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `supports` for the same ops: fast kernel's predicate OR the generic kernel's limits. */
bool k3k_cuda_kda_step_any_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_kda_chunk_any_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_mla_prefill_any_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_mla_decode_any_ok(const void *params, const k3k_tensor_t *const *t);

/* The generic kernels alone (tests and benchmarks compare them with the fast ones). */
bool k3k_cuda_gen_kda_step_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_gen_kda_chunk_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_gen_mla_prefill_ok(const void *params, const k3k_tensor_t *const *t);
bool k3k_cuda_gen_mla_decode_ok(const void *params, const k3k_tensor_t *const *t);
K3K_CUDA_DECL(gen_kda_step);
K3K_CUDA_DECL(gen_kda_chunk);
K3K_CUDA_DECL(gen_mla_prefill);
K3K_CUDA_DECL(gen_mla_decode);

/* Grouped MXFP4 expert GEMM with the semantics of k3k_cu_moe_gemm (moe_ops.h) at any N and any
 * K % 32 == 0 (no alignment rules on x beyond bf16 elements): one warp per (output column,
 * expert), the expert's rows in turn, CUDA-core fp32. Never synchronises, allocates nothing
 * (capture-safe). Returns 0 or K3_EINVAL (nothing queued) / K3_EDEVICE. */
int k3k_cu_moe_gemm_generic(cudaStream_t st, const k3k_cu_moe_gemm_args *a);

#ifdef __cplusplus
}
#endif
#endif
