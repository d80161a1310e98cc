/* Typed wrappers of k3k.h: each packs its tensors in the documented slot order and calls
 * k3k_run(). Generated once by hand from the op table; keep in the order of k3k_op_t. */
#include "k3k.h"
#include "k3pd/err.h"

int k3k_copy(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, y};
  return k3k_run(be, K3K_OP_COPY, NULL, t, 2);
}

int k3k_add(k3k_backend_t *be, const k3k_tensor_t *a, const k3k_tensor_t *b, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {a, b, y};
  return k3k_run(be, K3K_OP_ADD, NULL, t, 3);
}

int k3k_get_rows(k3k_backend_t *be, const k3k_tensor_t *table, const k3k_tensor_t *ids, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {table, ids, y};
  return k3k_run(be, K3K_OP_GET_ROWS, NULL, t, 3);
}

int k3k_rmsnorm(k3k_backend_t *be, const k3k_rmsnorm_params_t *p, const k3k_tensor_t *x, const k3k_tensor_t *w, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, w, y};
  return k3k_run(be, K3K_OP_RMSNORM, p, t, 3);
}

int k3k_gated_rmsnorm(k3k_backend_t *be, const k3k_gated_rmsnorm_params_t *p, const k3k_tensor_t *x, const k3k_tensor_t *z, const k3k_tensor_t *w, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, z, w, y};
  return k3k_run(be, K3K_OP_GATED_RMSNORM, p, t, 4);
}

int k3k_gemm(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *w, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, w, y};
  return k3k_run(be, K3K_OP_GEMM, NULL, t, 3);
}

int k3k_mxfp4_gemm(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *packed, const k3k_tensor_t *scale, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, packed, scale, y};
  return k3k_run(be, K3K_OP_MXFP4_GEMM, NULL, t, 4);
}

int k3k_mxfp4_dequant(k3k_backend_t *be, const k3k_tensor_t *packed, const k3k_tensor_t *scale, const k3k_tensor_t *w) {
  const k3k_tensor_t *t[] = {packed, scale, w};
  return k3k_run(be, K3K_OP_MXFP4_DEQUANT, NULL, t, 3);
}

int k3k_conv_prefill(k3k_backend_t *be, const k3k_conv_params_t *p, const k3k_tensor_t *x, const k3k_tensor_t *w, const k3k_tensor_t *cu_seqlens, const k3k_tensor_t *slots, const k3k_tensor_t *state, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, w, cu_seqlens, slots, state, y};
  return k3k_run(be, K3K_OP_CONV_PREFILL, p, t, 6);
}

int k3k_conv_step(k3k_backend_t *be, const k3k_conv_params_t *p, const k3k_tensor_t *x, const k3k_tensor_t *w, const k3k_tensor_t *slots, const k3k_tensor_t *state, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, w, slots, state, y};
  return k3k_run(be, K3K_OP_CONV_STEP, p, t, 5);
}

int k3k_l2norm(k3k_backend_t *be, const k3k_l2norm_params_t *p, const k3k_tensor_t *x, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, y};
  return k3k_run(be, K3K_OP_L2NORM, p, t, 2);
}

int k3k_kda_gate(k3k_backend_t *be, const k3k_kda_gate_params_t *p, const k3k_tensor_t *g_raw, const k3k_tensor_t *a_log, const k3k_tensor_t *dt_bias, const k3k_tensor_t *g) {
  const k3k_tensor_t *t[] = {g_raw, a_log, dt_bias, g};
  return k3k_run(be, K3K_OP_KDA_GATE, p, t, 4);
}

int k3k_sigmoid(k3k_backend_t *be, const k3k_tensor_t *x, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, y};
  return k3k_run(be, K3K_OP_SIGMOID, NULL, t, 2);
}

int k3k_kda_chunk(k3k_backend_t *be, const k3k_kda_params_t *p, const k3k_tensor_t *q, const k3k_tensor_t *k, const k3k_tensor_t *v, const k3k_tensor_t *g, const k3k_tensor_t *beta, const k3k_tensor_t *cu_seqlens, const k3k_tensor_t *slots, const k3k_tensor_t *state, const k3k_tensor_t *o) {
  const k3k_tensor_t *t[] = {q, k, v, g, beta, cu_seqlens, slots, state, o};
  return k3k_run(be, K3K_OP_KDA_CHUNK, p, t, 9);
}

int k3k_kda_step(k3k_backend_t *be, const k3k_kda_params_t *p, const k3k_tensor_t *q, const k3k_tensor_t *k, const k3k_tensor_t *v, const k3k_tensor_t *g, const k3k_tensor_t *beta, const k3k_tensor_t *slots, const k3k_tensor_t *state, const k3k_tensor_t *o) {
  const k3k_tensor_t *t[] = {q, k, v, g, beta, slots, state, o};
  return k3k_run(be, K3K_OP_KDA_STEP, p, t, 8);
}

int k3k_mla_prefill(k3k_backend_t *be, const k3k_mla_params_t *p, const k3k_tensor_t *q, const k3k_tensor_t *kv, const k3k_tensor_t *k_rot, const k3k_tensor_t *cu_q, const k3k_tensor_t *cu_k, const k3k_tensor_t *o) {
  const k3k_tensor_t *t[] = {q, kv, k_rot, cu_q, cu_k, o};
  return k3k_run(be, K3K_OP_MLA_PREFILL, p, t, 6);
}

int k3k_mla_decode(k3k_backend_t *be, const k3k_mla_params_t *p, const k3k_tensor_t *q, const k3k_tensor_t *w_kvb, const k3k_tensor_t *cache, const k3k_tensor_t *page_table, const k3k_tensor_t *seq_lens, const k3k_tensor_t *o) {
  const k3k_tensor_t *t[] = {q, w_kvb, cache, page_table, seq_lens, o};
  return k3k_run(be, K3K_OP_MLA_DECODE, p, t, 6);
}

int k3k_mla_cache_write(k3k_backend_t *be, const k3k_tensor_t *c_n, const k3k_tensor_t *k_rot, const k3k_tensor_t *slot_mapping, const k3k_tensor_t *cache) {
  const k3k_tensor_t *t[] = {c_n, k_rot, slot_mapping, cache};
  return k3k_run(be, K3K_OP_MLA_CACHE_WRITE, NULL, t, 4);
}

int k3k_mla_cache_gather(k3k_backend_t *be, const k3k_tensor_t *cache, const k3k_tensor_t *slot_mapping, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {cache, slot_mapping, y};
  return k3k_run(be, K3K_OP_MLA_CACHE_GATHER, NULL, t, 3);
}

int k3k_sigmoid_mul(k3k_backend_t *be, const k3k_sigmoid_mul_params_t *p, const k3k_tensor_t *x, const k3k_tensor_t *g, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {x, g, y};
  return k3k_run(be, K3K_OP_SIGMOID_MUL, p, t, 3);
}

int k3k_router(k3k_backend_t *be, const k3k_router_params_t *p, const k3k_tensor_t *logits, const k3k_tensor_t *bias, const k3k_tensor_t *idx, const k3k_tensor_t *w) {
  const k3k_tensor_t *t[] = {logits, bias, idx, w};
  return k3k_run(be, K3K_OP_ROUTER, p, t, 4);
}

int k3k_situ(k3k_backend_t *be, const k3k_situ_params_t *p, const k3k_tensor_t *gate, const k3k_tensor_t *up, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {gate, up, y};
  return k3k_run(be, K3K_OP_SITU, p, t, 3);
}

int k3k_silu_mul(k3k_backend_t *be, const k3k_tensor_t *gate, const k3k_tensor_t *up, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {gate, up, y};
  return k3k_run(be, K3K_OP_SILU_MUL, NULL, t, 3);
}

int k3k_moe_combine(k3k_backend_t *be, const k3k_tensor_t *rows, const k3k_tensor_t *row_idx, const k3k_tensor_t *w, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {rows, row_idx, w, y};
  return k3k_run(be, K3K_OP_MOE_COMBINE, NULL, t, 4);
}

int k3k_attn_res_mix(k3k_backend_t *be, const k3k_attn_res_params_t *p, const k3k_tensor_t *snaps, const k3k_tensor_t *p_cur, const k3k_tensor_t *w_norm, const k3k_tensor_t *w_proj, const k3k_tensor_t *y) {
  const k3k_tensor_t *t[] = {snaps, p_cur, w_norm, w_proj, y};
  return k3k_run(be, K3K_OP_ATTN_RES_MIX, p, t, 5);
}

int k3k_sample(k3k_backend_t *be, const k3k_sample_params_t *p, const k3k_tensor_t *logits, const k3k_tensor_t *ids) {
  const k3k_tensor_t *t[] = {logits, ids};
  return k3k_run(be, K3K_OP_SAMPLE, p, t, 2);
}

int k3k_res_mix_norm(k3k_backend_t *be, const k3k_res_mix_norm_params_t *p, const k3k_tensor_t *a,
                     const k3k_tensor_t *P, const k3k_tensor_t *snaps, const k3k_tensor_t *w_norm,
                     const k3k_tensor_t *w_proj, const k3k_tensor_t *h, const k3k_tensor_t *lnw,
                     const k3k_tensor_t *xn) {
  const k3k_tensor_t *t[] = {a, P, snaps, w_norm, w_proj, h, lnw, xn};
  return k3k_run(be, K3K_OP_RES_MIX_NORM, p, t, 8);
}

int k3k_gemm_multi(k3k_backend_t *be, const k3k_gemm_multi_params_t *p, const k3k_tensor_t *x,
                   const k3k_tensor_t *const *w, const k3k_tensor_t *const *y) {
  const k3k_tensor_t *t[1 + 2 * K3K_GEMM_MULTI_MAX] = {x};
  if (!p || p->n < 1 || p->n > K3K_GEMM_MULTI_MAX) return K3_EINVAL;
  for (int j = 0; j < p->n; j++) {
    t[1 + j] = w[j];
    t[1 + K3K_GEMM_MULTI_MAX + j] = y[j];
  }
  return k3k_run(be, K3K_OP_GEMM_MULTI, p, t, 1 + 2 * K3K_GEMM_MULTI_MAX);
}

int k3k_moe_routed(k3k_backend_t *be, const k3k_moe_routed_params_t *p,
                   const k3k_tensor_t *const *t) {
  return k3k_run(be, K3K_OP_MOE_ROUTED, p, t, 8);
}

int k3k_kda_decode(k3k_backend_t *be, const k3k_kda_decode_params_t *p,
                   const k3k_tensor_t *const *t) {
  return k3k_run(be, K3K_OP_KDA_DECODE, p, t, 18);
}
