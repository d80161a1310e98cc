/* Private helpers shared by the k3k backends: element load/store with dtype conversion, the
 * 2-D offset helper, and the reference op entry points the fast backend falls back to.
 * Not installed; include only from kernels/. */
#ifndef K3K_INTERNAL_H
#define K3K_INTERNAL_H

#include <math.h>

#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

/* bf16 bits → fp32 (exact), as k3_bf16_to_f32 but through a union and always inlined: in
 * Debug/ASan builds (-O0) memcpy is an intercepted library call, paid once per element. */
static inline __attribute__((always_inline)) float k3k_bf16f(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } c = {.u = (uint32_t)h << 16};
  return c.f;
}
/* Element `off` (in elements from t->data) as fp32. F32/BF16 only. */
static inline float k3k_ld(const k3k_tensor_t *t, int64_t off) {
  if (t->dtype == K3K_F32) return ((const float *)t->data)[off];
  return k3k_bf16f(((const uint16_t *)t->data)[off]);
}
/* Stores fp32 `v` at `off` in t's dtype (the bf16 rounding point when t is BF16). */
static inline void k3k_st(const k3k_tensor_t *t, int64_t off, float v) {
  if (t->dtype == K3K_F32)
    ((float *)t->data)[off] = v;
  else
    ((uint16_t *)t->data)[off] = k3_f32_to_bf16(v);
}
static inline int32_t k3k_ldi(const k3k_tensor_t *t, int64_t off) {
  return ((const int32_t *)t->data)[off];
}
/* Offset of [i][j] in a 2-D view. */
static inline int64_t k3k_off2(const k3k_tensor_t *t, int64_t i, int64_t j) {
  return i * t->stride[0] + j * t->stride[1];
}
static inline float k3k_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* One reference function per op: (params, tensors) -> 0 or negative K3_E*. Arguments have
 * passed k3k_op_validate(); metadata contents (indices, lengths) are checked here before any
 * write. */
typedef int (*k3k_cpu_fn)(const void *params, const k3k_tensor_t *const *t);
k3k_cpu_fn k3k_cpu_ref_fn(k3k_op_t op);

#define K3K_CPU_DECL(name) int k3k_cpu_##name(const void *params, const k3k_tensor_t *const *t)
#define K3K_OP_X(ENUM, name, n_tensors) K3K_CPU_DECL(name);
#include "k3k_ops.def"
#undef K3K_OP_X

/* Tensor slots of op (k3k_ops.def), 0 for an unknown op. */
int k3k_op_nargs(k3k_op_t op);
/* Runs one validated op of a fused op's chain (the reference table, or the fast backend's
 * dispatch: its GEMMs packed); ctx is the dispatcher's. */
typedef int (*k3k_chain_fn)(void *ctx, k3k_op_t op, const void *params,
                            const k3k_tensor_t *const *t);
/* MOE_ROUTED's chain (k3k.h) over host memory with each op run by `run` (cpu/fused.c). */
int k3k_moe_routed_chain(k3k_chain_fn run, void *ctx, const void *params,
                         const k3k_tensor_t *const *t);

/* Pieces the fast backend reuses so both paths share one definition of the math. */
/* E2M1 code → value. */
extern const float k3k_e2m1_table[16];
/* 2^(e-127) for an E8M0 byte (e != 255), built from its bits (the same value ldexpf(1, e-127)
 * gives, without a libm call per weight): exponent field e for e >= 1, the subnormal 2^-127
 * (mantissa bit 22) for e == 0. */
static inline __attribute__((always_inline)) float k3k_e8m0(uint8_t e) {
  union {
    uint32_t u;
    float f;
  } c = {.u = e ? (uint32_t)e << 23 : 0x00400000u};
  return c.f;
}
/* Reference KDA over one sequence and head range [h0,h1) (the fast backend parallelises over
 * (sequence, head) with it). */
int k3k_cpu_kda_chunk_seq(const k3k_kda_params_t *p, const k3k_tensor_t *const *t, int32_t seq,
                          int32_t h0, int32_t h1, float *scratch);
size_t k3k_cpu_kda_chunk_scratch_floats(const k3k_tensor_t *const *t, const k3k_kda_params_t *p);
/* Reference KDA step of one (sequence, head). */
void k3k_cpu_kda_step_head(const k3k_kda_params_t *p, const k3k_tensor_t *const *t, int32_t i,
                           int32_t h);
/* Reference MLA decode of one (sequence, head); scratch >= kv_lora + max seq_len floats. */
void k3k_cpu_mla_decode_head(const k3k_mla_params_t *p, const k3k_tensor_t *const *t,
                             int32_t i, int32_t h, float *scratch);
/* Reference MLA prefill of one (sequence, head); scratch >= Lk floats. */
void k3k_cpu_mla_prefill_head(const k3k_mla_params_t *p, const k3k_tensor_t *const *t,
                              int32_t i, int32_t h, float *scratch);
/* Metadata checks shared by both CPU backends (return K3_ERANGE / K3_EINVAL before writes). */
int k3k_cpu_check_seqs(const k3k_tensor_t *cu, int32_t n, int64_t total, const char *what);
int k3k_cpu_check_slots(const k3k_tensor_t *slots, int32_t n, int64_t n_slots);
int k3k_cpu_check_mla_decode(const k3k_mla_params_t *p, const k3k_tensor_t *const *t);
int k3k_cpu_check_mla_prefill(const k3k_mla_params_t *p, const k3k_tensor_t *const *t);

/* CPU memory vtable entries shared by "cpu" and "cpu-fast". */
int k3k_cpu_mem_alloc(k3k_backend_t *be, size_t bytes, void **out);
void k3k_cpu_mem_free(k3k_backend_t *be, void *p);
int k3k_cpu_mem_copy(k3k_backend_t *be, void *dst, const void *src, size_t bytes);
int k3k_cpu_mem_memset(k3k_backend_t *be, void *dst, int byte, size_t bytes);
int k3k_cpu_sync(k3k_backend_t *be);

k3k_backend_t *k3k_cpu_backend_create(void);
void k3k_cpu_backend_destroy(k3k_backend_t *be);
k3k_backend_t *k3k_cpu_fast_backend_create(int threads);
void k3k_cpu_fast_backend_destroy(k3k_backend_t *be);
int k3k_cpu_fast_resize(k3k_backend_t *be, int threads);

#endif
