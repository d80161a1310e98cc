/* Strict model configuration: parses config.json for `kimi_k3` (nested text_config, spec
 * k3-model.md §1) and `kimi_linear` (flat Kimi-Linear-48B form, kimi-linear-48b.md §1),
 * validates the architecture invariants and computes every derived value ONCE, so no other
 * module re-derives layer kinds, boundaries, head dims, eps values or state sizes.
 *
 * Strictness: every key is either an architecture key this parser understands, or on an
 * explicit allow-list of known non-architectural keys (transformers_version, initializer_range,
 * use_cache, rope_theta, auto_map, vision_config, ...). Any other key is an error, and so is a
 * missing required key; the error message names EVERY offending key at once, with its JSON path
 * (e.g. "text_config.linear_attn_config.num_heads").
 *
 * k3_model_config_t is a plain value (fixed arrays, no pointers): copy it freely, nothing to
 * free. Layer indices are 0-based everywhere in this struct; the JSON lists are 1-based. */
#ifndef K3PD_MODEL_CONFIG_H
#define K3PD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "k3pd/safetensors.h"

#define K3_MAX_LAYERS 256
#define K3_MXFP4_GROUP 32

typedef enum { K3_MODEL_K3 = 1, K3_MODEL_LINEAR = 2 } k3_model_type_t;  /* kimi_k3 / kimi_linear (48B) */
typedef enum { K3_LAYER_KDA = 0, K3_LAYER_MLA = 1 } k3_layer_kind_t;
typedef enum { K3_KDA_GATE_LOWER_BOUND = 0, K3_KDA_GATE_SOFTPLUS = 1 } k3_kda_gate_t;
typedef enum { K3_ACT_SITU = 0, K3_ACT_SILU = 1 } k3_act_t;

typedef struct {
  k3_model_type_t type;

  /* ---- architecture fields, as in config.json (text_config for K3) ---- */
  int64_t vocab_size;
  int64_t hidden_size;            /* H */
  int num_layers;                 /* num_hidden_layers */
  int64_t intermediate_size;      /* dense FFN width (layers < first_k_dense_replace) */
  k3_act_t act;                   /* hidden_act: situ (K3) or silu (48B) */
  double situ_beta, situ_linear_beta; /* 0 for silu */
  double rms_norm_eps;
  int attn_res_block_size;        /* 0 = plain residual (48B) */
  int first_k_dense_replace;
  int moe_layer_freq;
  int num_experts;
  int top_k;                      /* num_experts_per_token */
  int num_shared_experts;         /* width multiplier of ONE shared MLP */
  int64_t moe_intermediate_size;  /* F */
  int64_t routed_expert_hidden_size; /* LatentMoE latent width; 0 = experts in hidden space (48B) */
  bool latent_moe_use_norm;
  bool use_grouped_topk;
  int num_expert_group, topk_group;
  bool moe_renormalize;
  double routed_scaling_factor;
  int num_heads;                  /* MLA num_attention_heads */
  int num_kv_heads;
  int64_t q_lora_rank;            /* 0 = no q-LoRA (48B: null) */
  int64_t kv_lora_rank;           /* c */
  int64_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  bool mla_use_nope;
  bool mla_use_output_gate;
  int64_t max_position_embeddings; /* informational (NoPE); model_max_length for 48B */
  int num_nextn_predict_layers;
  bool tie_word_embeddings;
  int64_t bos_token_id, eos_token_id, pad_token_id;
  int64_t media_placeholder_token_id; /* -1 when absent */
  /* linear_attn_config */
  int kda_num_heads, kda_head_dim, conv_kernel;
  bool use_full_rank_gate;        /* KDA output gate g_proj full rank (K3) vs g_a/g_b (48B) */
  bool has_gate_lower_bound;
  double gate_lower_bound;        /* -5 for K3 */
  /* quantization */
  bool experts_mxfp4;             /* routed experts stored as MXFP4 weight_packed/weight_scale */

  /* ---- runtime flag (not in config.json) ---- */
  bool router_bias_in_weights;    /* 48B hub quirk (48B spec §11 Q1); default false */

  /* ---- derived (computed by the parser) ---- */
  k3_layer_kind_t layer_kind[K3_MAX_LAYERS];
  int kind_index[K3_MAX_LAYERS];  /* index among layers of the same kind (k-th KDA / k-th MLA) */
  bool layer_is_moe[K3_MAX_LAYERS];
  bool attn_res_boundary[K3_MAX_LAYERS]; /* l % attn_res_block_size == 0 (all false for 0) */
  int num_kda, num_mla, num_moe, num_attn_res_boundaries;
  const char *tensor_prefix;      /* "language_model." (K3) or "" (48B); static string */
  k3_kda_gate_t kda_gate;
  int64_t kda_proj_dim;           /* P = kda_num_heads * kda_head_dim */
  int64_t mla_qk_head_dim;        /* qk_nope + qk_rope (192) */
  int64_t mla_cache_dim;          /* kv_lora_rank + qk_rope_head_dim (576) */
  double mla_softmax_scale;       /* mla_qk_head_dim^-0.5 */
  int64_t expert_in_dim;          /* routed_expert_hidden_size or hidden_size */
  int64_t shared_expert_width;    /* num_shared_experts * moe_intermediate_size */
  double eps_norm;                /* rms_norm_eps: layer norms, final norm, o_norm, attn-res */
  double eps_mla_lora;            /* 1e-6: MLA q_a/kv_a layernorms */
  double eps_kda_l2;              /* 1e-6: KDA q/k l2norm (inside sqrt of the sum) */
  k3_dtype_t dt_conv, dt_o_norm, dt_router_bias; /* F32 in K3, BF16 in 48B */
  int a_log_len;                  /* stored A_log length written by mkckpt: 128 (K3, pad) or H */
  /* per-sequence decode state (spec §10.2, 48B §8.2) */
  uint64_t kda_state_bytes_per_layer; /* S fp32 [H,V,K] */
  uint64_t kda_conv_bytes_per_layer;  /* 3 x [P, conv_kernel-1] bf16 */
  uint64_t kda_bytes_per_seq;         /* (state + conv) x num_kda */
  uint64_t mla_bytes_per_token_layer; /* mla_cache_dim x bf16 */
  uint64_t mla_bytes_per_token;       /* x num_mla */
} k3_model_config_t;

/* Parses config.json text. On success fills *out (router_bias_in_weights = false) and returns
 * 0. On error returns K3_ECONFIG (or K3_EFORMAT for bad JSON), writes a message naming every
 * offending key into err, and leaves *out untouched. */
int k3_model_config_parse(const char *json, size_t len, k3_model_config_t *out, char *err,
                          size_t errlen);
/* Reads and parses a config.json file (errors are prefixed with the path). */
int k3_model_config_load(const char *path, k3_model_config_t *out, char *err, size_t errlen);

/* Built-in configs: "tiny" (spec §11.1 verbatim), "tiny-48b" (48B spec §10 verbatim),
 * "medium" (spec §11.2: the released K3 config with 16 layers / 256 experts).
 * Returns the JSON text (static), or NULL for an unknown name. */
const char *k3_model_config_preset(const char *name);
/* Space-separated list of preset names (static). */
const char *k3_model_config_preset_names(void);

/* The model's default end-of-sequence ids, the ONE rule every generator uses (k3pd-generate,
 * the router): config.json's eos_token_id, plus the two stop specials of the tokenizer's table
 * — [EOS] and <|end_of_msg|> (K3) / <|im_end|> (48B), real ids 163585 and 163586 — mapped into
 * this vocabulary the way the tokenizer maps specials (the top 256 ids: real 163584+k →
 * vocab_size-256+k). Writes up to 3 distinct ids into out (in that order) and returns the count. */
int k3_model_config_stop_ids(const k3_model_config_t *cfg, int32_t out[3]);

/* "kimi_k3" / "kimi_linear". */
const char *k3_model_type_name(k3_model_type_t t);

/* Multi-line human summary: model type, layers by kind (with 0-based MLA list), residual form,
 * head dims, MoE shape, gate form, per-sequence state bytes. */
void k3_model_config_print(const k3_model_config_t *cfg, FILE *fp);

/* Appends a canonical "key=value\n" rendering of every architecture field (not the runtime
 * flag's absence: router_bias_in_weights IS included, it changes numerics) to buf; returns the
 * length it needs (like snprintf). Used for the manifest fingerprint. */
size_t k3_model_config_canonical(const k3_model_config_t *cfg, char *buf, size_t cap);

#endif
