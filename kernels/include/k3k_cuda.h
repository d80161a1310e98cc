/* What the model runner may use of the CUDA backend beyond the k3k.h ops: the device context
 * and its stream, trusted ids, the weight-constness promise, the raw decode copies, synthetic
 * weights and the expert scale check (issue 19: one public header; everything else in
 * kernels/cuda/ is private). The fusions that became ops (RES_MIX_NORM, GEMM_MULTI,
 * KDA_DECODE, MOE_ROUTED) and the side lane (k3k_backend_side) left this header for the
 * backend's private cuda_fused.h and moe_block.h: the runner reaches them through k3k.h.
 *
 * What it is for: kernels/runner/ (ffn_device.c, graph.c, kda_device.c, synth_dev.c) includes
 * this header and no header of kernels/cuda/. The declarations here are the ones those files
 * use, moved as they were from the backend's internal headers, which include this one.
 * What it is not: model code's API (that is k3k.h) or the tests' view (tests/gpu/ reaches the
 * internal headers through its own include path).
 * Invariants: every function queues work on the stream it is given (or the context's) and says
 * when it synchronises; return codes are 0 or negative K3_E* (k3pd/err.h). */
#ifndef K3K_CUDA_H
#define K3K_CUDA_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3k.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's context, opaque here (kernels/cuda/k3k_cuda_ops.h defines it). */
typedef struct k3k_cuda_ctx k3k_cuda_ctx;
/* Its main stream (what every op of the backend queues on) and its memory generation: bumped
 * whenever memory the ops use implicitly (scratch, pinned staging) was reallocated, so a CUDA
 * graph captured under an older value holds dangling pointers. */
cudaStream_t k3k_cuda_stream(const k3k_cuda_ctx *cx);
uint64_t k3k_cuda_mem_gen(const k3k_cuda_ctx *cx);

/* ---- context ---- */
/* The context of a "cuda" backend (NULL for any other backend). */
k3k_cuda_ctx *k3k_cuda_ctx_of(k3k_backend_t *be);

/* ---- trusted ids ---- */
/* Trusted ids (check.cu): while on, the three checks below return 0 at once (no launch, no
 * synchronisation), which makes the ops that call them capture-safe. Only for a caller that
 * builds the metadata itself and validated it on the host (the model runner: slots allocated and
 * distinct, cu_seqlens monotone by construction, page ids from its pool, seq_lens within the
 * page table); it turns the flag off again when its pass ends. Returns the previous value. */
int k3k_cuda_set_trusted_ids(k3k_cuda_ctx *cx, int on);

/* ---- row gather, cache write ---- */
/* Unchecked decode helpers for the model runner (runner_raw.cu), capture-safe (no
 * synchronisation, no allocation): the ids come from the runner's host-validated metadata.
 * Row gather: y[t][0..d) = table[ids[t]][0..d) for t < n, 2-byte elements (bf16 rows), row
 * strides in elements. Cache write: cache row slot_mapping[t] (page * page_size + offset of a
 * [pages, page_size, c + dr] bf16 cache with row stride c + dr) gets [c_n[t] | k_rot[t]]; a
 * negative slot skips the token. Same bytes as GET_ROWS / MLA_CACHE_WRITE on bf16 tensors. */
int k3k_cu_gather_rows_u16(cudaStream_t st, const uint16_t *table, int64_t ld_table,
                           const int32_t *ids, int64_t n, int64_t d, uint16_t *y, int64_t ld_y);
int k3k_cu_cache_write_u16(cudaStream_t st, const uint16_t *c_n, int64_t ld_cn, const uint16_t *k_rot,
                           int64_t ld_kr, const int32_t *slot_mapping, int64_t n, int64_t c,
                           int64_t dr, uint16_t *cache);

/* ---- synthetic weights ---- */
/* Synthetic weights on the device (synth_gpu.cu), the values of common/ckpt/synth.c: the caller
 * maps a tmap entry's role to a plain kind (K3K_SYN_NORMAL: v = [b +] a*N(0,1);
 * K3K_SYN_AFFINE_UNIFORM: v = b + a*U; K3K_SYN_LOG_UNIFORM: log(1 + 15U) for the first n_valid
 * elements, 0 after) or generates an MXFP4 entry (packed codes or scales of the logical [N, K]
 * master keyed mkey). Element/group indices whose value could round differently from the
 * host's libm are appended to flags (device, cap entries; *n_flags counts all of them, device
 * unsigned, caller-zeroed): recompute those with k3_synth_fill on the host and overwrite (one
 * element of a plain entry, one 32-group = 16 packed bytes or 1 scale byte of an MXFP4 entry).
 * With that the bytes equal k3_synth_fill's. Queued on st, not synchronised. */
enum { K3K_SYN_NORMAL = 0, K3K_SYN_AFFINE_UNIFORM = 1, K3K_SYN_LOG_UNIFORM = 2 };
typedef struct {
  int kind, has_b, f32; /* f32: F32 output, else BF16 (RNE) */
  uint64_t key;         /* k3_synth_key(full name, seed) */
  double a, b;
  int64_t n_valid;
} k3k_cu_synth_plain;
int k3k_cu_synth_plain_fill(cudaStream_t st, const k3k_cu_synth_plain *p, void *dst, int64_t n,
                            uint64_t *flags, unsigned *n_flags, unsigned cap);
int k3k_cu_synth_mx_fill(cudaStream_t st, uint64_t mkey, int64_t N, int64_t K, int want_scale,
                         uint8_t *dst, uint64_t *flags, unsigned *n_flags, unsigned cap);

/* ---- gemv ---- */
/* Promise (per calling thread) that no kernel launched until the next call with false writes
 * any W given to the kernel: its first weight loads may then precede the wait for the previous
 * kernel (PDL, pdl.cuh). The runner turns it on around its passes (weights are uploaded at
 * init); default off, so W made by the previous kernel (tests) is always read after the wait. */
void k3k_cuda_gemv_const_weights(bool on);

/* ---- MoE ---- */
/* The runner's one-time check of every expert scale at load (the MOE_ROUTED op's device path
 * does not check per call). */
/* Sets *bad (device int) to 1 when any of n scale bytes is 0xFF. Queued, not synchronised. */
int k3k_cu_mx_check(cudaStream_t st, const uint8_t *scale, int64_t rows, int64_t cols,
                    int64_t ld, int *bad);

#ifdef __cplusplus
}
#endif
#endif
