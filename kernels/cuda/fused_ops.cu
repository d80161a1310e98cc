/* The CUDA entries of the fused ops (k3k.h "Fusions"): each calls the one-launch kernel the model
 * runner called directly before issue 19, with the same arguments, so moving the runner onto
 * the op API changed which function it calls, not which kernel runs.
 *
 * What it is for: RES_MIX_NORM → k3k_cuda_add_mix_norm (resnorm.cu); GEMM_MULTI →
 * k3k_cuda_gemv_multi (gemv.cu) when every GEMM of the group would take the gemv, else the GEMM
 * op per output; KDA_DECODE → k3k_cu_kda_decode (kda.cu).
 * What it is not: a second implementation. Shapes a fused kernel does not take are refused in
 * k3k_cuda_fused_ok (cuda_supports), and the caller runs the chain of ops instead; the CPU
 * reference of each op is that chain (kernels/cpu/fused.c).
 * Invariants: nothing here synchronises or allocates (capture-safe); the environment switches
 * (K3PD_CUDA_GEMV_MULTI) are read once, so eager steps and graph replays run the same kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda_ops.h"

/* ---- RES_MIX_NORM ---- */
static bool res_mix_norm_ok(const k3k_cuda_ctx *cx, const k3k_tensor_t *const *t) {
  return k3k_cuda_add_mix_norm_fits(cx, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}

int k3k_cuda_res_mix_norm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_res_mix_norm_params_t *p = (const k3k_res_mix_norm_params_t *)params;
  return k3k_cuda_add_mix_norm(cx, t[0], t[1], t[2], t[3], t[4], p->eps_mix, t[5], t[6], p->eps,
                               p->bf16_inner, t[7]);
}

/* ---- GEMM_MULTI ---- */
static bool multi_env(void) {
  static int on = -1; /* K3PD_CUDA_GEMV_MULTI, read once (eager and captured steps agree) */
  if (on < 0) {
    const char *e = getenv("K3PD_CUDA_GEMV_MULTI");
    on = !(e && !strcmp(e, "0"));
  }
  return on != 0;
}

static int multi_n(const void *params) { return ((const k3k_gemm_multi_params_t *)params)->n; }

static bool gemm_multi_ok(const void *params, const k3k_tensor_t *const *t) {
  for (int j = 0; j < multi_n(params); j++) {
    const k3k_tensor_t *g[3] = {t[0], t[1 + j], t[1 + K3K_GEMM_MULTI_MAX + j]};
    if (!k3k_cuda_gemm_ok(g)) return false;
  }
  return true;
}

/* Whether the grouped gemv computes this group: it is exactly what the GEMM op's gemv path
 * computes for each output (k3k_cuda_gemv_multi's contract), so it is taken only when every
 * output would take that path. */
static bool gemv_group(int n, const k3k_tensor_t *const *t) {
  if (!multi_env() || n < 2 || n > K3K_GEMV_MULTI_MAX || t[0]->shape[0] > K3K_GEMV_NORM_MAX_M)
    return false;
  for (int j = 0; j < n; j++) {
    const k3k_tensor_t *g[3] = {t[0], t[1 + j], t[1 + K3K_GEMM_MULTI_MAX + j]};
    if (!k3k_cuda_gemv_wanted(g)) return false;
  }
  return k3k_cuda_gemv_multi_fits(t[0], n, t + 1, t + 1 + K3K_GEMM_MULTI_MAX, NULL);
}

int k3k_cuda_gemm_multi(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const int n = multi_n(params);
  if (gemv_group(n, t))
    return k3k_cuda_gemv_multi(cx, t[0], n, t + 1, t + 1 + K3K_GEMM_MULTI_MAX, NULL);
  for (int j = 0; j < n; j++) {
    const k3k_tensor_t *g[3] = {t[0], t[1 + j], t[1 + K3K_GEMM_MULTI_MAX + j]};
    int rc = k3k_cuda_gemm(cx, NULL, g);
    if (rc) return rc;
  }
  return 0;
}

/* ---- KDA_DECODE ---- */
/* Row stride in elements of a 2-D tensor of dtype dt with unit inner stride, or -1. */
static int64_t ld_of(const k3k_tensor_t *t, k3k_dtype_t dt) {
  return t->dtype == dt && t->ndim == 2 && (t->shape[1] <= 1 || t->stride[1] == 1) ? t->stride[0]
                                                                                   : -1;
}

static bool vec_f32(const k3k_tensor_t *t) {
  return t->dtype == K3K_F32 && t->ndim == 1 && t->stride[0] == 1;
}

/* The fused kernel's shapes (kda.cu): Dh = 128, conv width 4, the K3 lower-bound gate, bf16
 * activations and conv states, fp32 conv weights / A_log / dt_bias / o_norm, q/k/v sharing one
 * row stride, contiguous pools. */
static bool kda_decode_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_decode_params_t *p = (const k3k_kda_decode_params_t *)params;
  const int64_t NH = p->n_heads, P = NH * 128;
  if (p->head_dim != 128 || p->gate_form != K3K_GATE_LOWER_BOUND || t[6]->shape[1] != 4)
    return false;
  const int64_t ld = ld_of(t[0], K3K_BF16);
  if (ld < 0 || ld_of(t[1], K3K_BF16) != ld || ld_of(t[2], K3K_BF16) != ld ||
      ld_of(t[3], K3K_BF16) < 0 || ld_of(t[5], K3K_BF16) < 0 || ld_of(t[17], K3K_BF16) < 0 ||
      (ld_of(t[4], K3K_BF16) < 0 && ld_of(t[4], K3K_F32) < 0))
    return false;
  for (int j = 0; j < 3; j++) {
    const k3k_tensor_t *w = t[6 + j], *s = t[9 + j];
    if (w->dtype != K3K_F32 || w->stride[1] != 1 || w->stride[0] != 4) return false;
    if (s->dtype != K3K_BF16 || s->stride[0] != P * 3 || s->stride[1] != 3 || s->stride[2] != 1)
      return false;
  }
  if (!vec_f32(t[12]) || !vec_f32(t[13]) || !vec_f32(t[14])) return false;
  const k3k_tensor_t *S = t[16];
  return S->stride[0] == NH * 128 * 128 && S->stride[3] == 1 && S->shape[0] <= INT32_MAX;
}

int k3k_cuda_kda_decode(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_decode_params_t *p = (const k3k_kda_decode_params_t *)params;
  k3k_cu_kda_decode_args a;
  memset(&a, 0, sizeof a);
  a.batch = p->n_seqs;
  a.heads = p->n_heads;
  a.q = (const uint16_t *)t[0]->data, a.k = (const uint16_t *)t[1]->data;
  a.v = (const uint16_t *)t[2]->data, a.ld_qkv = (size_t)t[0]->stride[0];
  a.g_raw = (const uint16_t *)t[3]->data, a.ld_g = (size_t)t[3]->stride[0];
  a.b_raw = t[4]->data, a.ld_b = (size_t)t[4]->stride[0], a.b_raw_bf16 = t[4]->dtype == K3K_BF16;
  a.z = (const uint16_t *)t[5]->data, a.ld_z = (size_t)t[5]->stride[0];
  a.conv_q = (uint16_t *)t[9]->data, a.conv_k = (uint16_t *)t[10]->data;
  a.conv_v = (uint16_t *)t[11]->data;
  a.wq = (const float *)t[6]->data, a.wk = (const float *)t[7]->data;
  a.wv = (const float *)t[8]->data;
  a.a_log = (const float *)t[12]->data, a.dt_bias = (const float *)t[13]->data;
  a.o_norm_w = (const float *)t[14]->data;
  a.state = (float *)t[16]->data;
  a.slots = (const int32_t *)t[15]->data;
  a.n_slots = (int)t[16]->shape[0];
  a.out = (uint16_t *)t[17]->data, a.ld_out = (size_t)t[17]->stride[0];
  a.lower_bound = p->lower_bound;
  a.q_scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)p->head_dim); /* KDA_STEP's */
  a.l2_eps = p->l2_eps;
  a.rms_eps = p->rms_eps;
  if (a.batch == 0) return 0;
  return k3k_cu_kda_decode(cx->stream, &a);
}

bool k3k_cuda_fused_ok(const k3k_cuda_ctx *cx, k3k_op_t op, const void *params,
                       const k3k_tensor_t *const *t) {
  switch (op) {
  case K3K_OP_RES_MIX_NORM: return res_mix_norm_ok(cx, t);
  case K3K_OP_GEMM_MULTI: return gemm_multi_ok(params, t);
  case K3K_OP_KDA_DECODE: return kda_decode_ok(params, t);
  default: return false;
  }
}
