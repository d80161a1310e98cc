/* Derived values of a model config (layer kinds/indices, attention-residual boundaries, head
 * dims, eps values, per-family dtypes, per-sequence state sizes: spec §1.5, §10.2, 48B §1.3,
 * §8.2), the human summary and the canonical rendering used by the manifest fingerprint.
 * Every other module reads these fields instead of re-deriving them. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config_internal.h"
#include "k3pd/model_config.h"

void ck_config_derive(k3_model_config_t *c) {
  int k3 = c->type == K3_MODEL_K3;
  c->num_kda = c->num_mla = c->num_moe = c->num_attn_res_boundaries = 0;
  for (int l = 0; l < c->num_layers; l++) {
    c->kind_index[l] = c->layer_kind[l] == K3_LAYER_KDA ? c->num_kda++ : c->num_mla++;
    c->layer_is_moe[l] = l >= c->first_k_dense_replace && l % c->moe_layer_freq == 0;
    c->num_moe += c->layer_is_moe[l];
    c->attn_res_boundary[l] = c->attn_res_block_size > 0 && l % c->attn_res_block_size == 0;
    c->num_attn_res_boundaries += c->attn_res_boundary[l];
  }
  c->tensor_prefix = k3 ? "language_model." : "";
  c->kda_gate = c->has_gate_lower_bound ? K3_KDA_GATE_LOWER_BOUND : K3_KDA_GATE_SOFTPLUS;
  c->kda_proj_dim = (int64_t)c->kda_num_heads * c->kda_head_dim;
  c->mla_qk_head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
  c->mla_cache_dim = c->kv_lora_rank + c->qk_rope_head_dim;
  c->mla_softmax_scale = 1.0 / sqrt((double)c->mla_qk_head_dim);
  c->expert_in_dim = c->routed_expert_hidden_size > 0 ? c->routed_expert_hidden_size : c->hidden_size;
  c->shared_expert_width = (int64_t)c->num_shared_experts * c->moe_intermediate_size;
  c->eps_norm = c->rms_norm_eps;
  c->eps_mla_lora = 1e-6; /* spec §4.1 / §12.5: q_a/kv_a layernorms built without eps */
  c->eps_kda_l2 = 1e-6;   /* spec §3.3: fla l2norm default, inside the sqrt of the sum */
  c->dt_conv = c->dt_o_norm = c->dt_router_bias = k3 ? K3_DT_F32 : K3_DT_BF16;
  c->a_log_len = k3 ? (c->kda_num_heads > 128 ? c->kda_num_heads : 128) : c->kda_num_heads;
  uint64_t hd = (uint64_t)c->kda_head_dim;
  c->kda_state_bytes_per_layer = (uint64_t)c->kda_num_heads * hd * hd * 4;
  c->kda_conv_bytes_per_layer = 3 * (uint64_t)c->kda_proj_dim * (uint64_t)(c->conv_kernel - 1) * 2;
  c->kda_bytes_per_seq = (c->kda_state_bytes_per_layer + c->kda_conv_bytes_per_layer) * (uint64_t)c->num_kda;
  c->mla_bytes_per_token_layer = (uint64_t)c->mla_cache_dim * 2;
  c->mla_bytes_per_token = c->mla_bytes_per_token_layer * (uint64_t)c->num_mla;
}

const char *k3_model_type_name(k3_model_type_t t) {
  return t == K3_MODEL_K3 ? "kimi_k3" : t == K3_MODEL_LINEAR ? "kimi_linear" : "unknown";
}

void k3_model_config_print(const k3_model_config_t *c, FILE *fp) {
  int k3 = c->type == K3_MODEL_K3;
  fprintf(fp, "model type      %s (%s)\n", k3_model_type_name(c->type), k3 ? "Kimi-K3" : "Kimi-Linear-48B form");
  fprintf(fp, "layers          %d: %d KDA + %d MLA; MLA at 0-based", c->num_layers, c->num_kda, c->num_mla);
  for (int l = 0; l < c->num_layers; l++)
    if (c->layer_kind[l] == K3_LAYER_MLA) fprintf(fp, " %d", l);
  fprintf(fp, "\n");
  fprintf(fp, "hidden / vocab  %lld / %lld\n", (long long)c->hidden_size, (long long)c->vocab_size);
  if (c->attn_res_block_size > 0) {
    fprintf(fp, "residual        block attention residuals, block %d, boundaries at", c->attn_res_block_size);
    for (int l = 0; l < c->num_layers; l++)
      if (c->attn_res_boundary[l]) fprintf(fp, " %d", l);
    fprintf(fp, "\n");
  } else {
    fprintf(fp, "residual        plain pre-norm\n");
  }
  fprintf(fp, "KDA             %d heads x %d, P=%lld, conv %d, gate %s", c->kda_num_heads, c->kda_head_dim,
          (long long)c->kda_proj_dim, c->conv_kernel,
          c->kda_gate == K3_KDA_GATE_LOWER_BOUND ? "lower-bound" : "softplus");
  if (c->has_gate_lower_bound) fprintf(fp, " (%g)", c->gate_lower_bound);
  fprintf(fp, ", output gate %s\n", c->use_full_rank_gate ? "full rank" : "low rank");
  fprintf(fp, "MLA             %d heads, q_lora %lld, kv_lora %lld, qk %lld+%lld, v %lld, NoPE, output gate %s\n",
          c->num_heads, (long long)c->q_lora_rank, (long long)c->kv_lora_rank, (long long)c->qk_nope_head_dim,
          (long long)c->qk_rope_head_dim, (long long)c->v_head_dim, c->mla_use_output_gate ? "yes" : "no");
  fprintf(fp, "FFN             %s; dense layers < %d width %lld; MoE %d layers: %d experts top-%d, F=%lld, %s, shared width %lld, %s experts\n",
          c->act == K3_ACT_SITU ? "SiTU" : "SiLU", c->first_k_dense_replace, (long long)c->intermediate_size,
          c->num_moe, c->num_experts, c->top_k, (long long)c->moe_intermediate_size,
          c->routed_expert_hidden_size > 0 ? "latent" : "hidden-space", (long long)c->shared_expert_width,
          c->experts_mxfp4 ? "MXFP4" : "bf16");
  fprintf(fp, "router          sigmoid, bias-corrected top-k, groups %d/%d, scale %g%s\n", c->num_expert_group,
          c->topk_group, c->routed_scaling_factor, c->router_bias_in_weights ? ", bias in weights (hub quirk)" : "");
  fprintf(fp, "state/sequence  KDA %llu B (%.2f MiB) + MLA %llu B/token\n", (unsigned long long)c->kda_bytes_per_seq,
          (double)c->kda_bytes_per_seq / 1048576.0, (unsigned long long)c->mla_bytes_per_token);
}

/* Appends printf output at buf+*len (bounded) and always advances *len by the full length. */
static void cat(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void cat(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, fmt, ap);
  va_end(ap);
  if (w > 0) *len += (size_t)w;
}

size_t k3_model_config_canonical(const k3_model_config_t *c, char *buf, size_t cap) {
  size_t n = 0;
  if (cap) buf[0] = '\0';
#define I(f) cat(buf, cap, &n, #f "=%lld\n", (long long)c->f)
#define D(f) cat(buf, cap, &n, #f "=%.17g\n", (double)c->f)
  cat(buf, cap, &n, "model_type=%s\n", k3_model_type_name(c->type));
  I(vocab_size); I(hidden_size); I(num_layers); I(intermediate_size); I(act); D(situ_beta);
  D(situ_linear_beta); D(rms_norm_eps); I(attn_res_block_size); I(first_k_dense_replace);
  I(moe_layer_freq); I(num_experts); I(top_k); I(num_shared_experts); I(moe_intermediate_size);
  I(routed_expert_hidden_size); I(latent_moe_use_norm); I(use_grouped_topk); I(num_expert_group);
  I(topk_group); I(moe_renormalize); D(routed_scaling_factor); I(num_heads); I(num_kv_heads);
  I(q_lora_rank); I(kv_lora_rank); I(qk_nope_head_dim); I(qk_rope_head_dim); I(v_head_dim);
  I(mla_use_nope); I(mla_use_output_gate); I(num_nextn_predict_layers); I(tie_word_embeddings);
  I(kda_num_heads); I(kda_head_dim); I(conv_kernel); I(use_full_rank_gate);
  I(has_gate_lower_bound); D(gate_lower_bound); I(experts_mxfp4); I(router_bias_in_weights);
#undef I
#undef D
  cat(buf, cap, &n, "layers=");
  for (int l = 0; l < c->num_layers; l++) cat(buf, cap, &n, "%c", c->layer_kind[l] == K3_LAYER_MLA ? 'M' : 'K');
  cat(buf, cap, &n, "\n");
  return n;
}

int k3_model_config_stop_ids(const k3_model_config_t *cfg, int32_t out[3]) {
  int n = 0;
  int64_t cand[3] = {cfg->eos_token_id, cfg->vocab_size - 256 + 1, cfg->vocab_size - 256 + 2};
  for (int i = 0; i < 3; i++) {
    if (cand[i] < 0 || cand[i] >= cfg->vocab_size) continue;
    bool dup = false;
    for (int j = 0; j < n; j++) dup |= out[j] == (int32_t)cand[i];
    if (!dup) out[n++] = (int32_t)cand[i];
  }
  return n;
}
