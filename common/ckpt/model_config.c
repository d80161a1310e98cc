/* Strict config.json parser for kimi_k3 (nested text_config) and kimi_linear (flat 48B form).
 *
 * Three passes, each reporting ALL of its problems at once:
 *   1. keys: every key of every object we read is an architecture key of that form or on the
 *      allow-list of known non-architectural keys; required keys must be present;
 *   2. types: each architecture value has the right JSON type;
 *   3. invariants of spec §1/§12 (layer lists, SiTU, NoPE, heads, MoE shape, MXFP4 groups).
 * Derived values are computed in config_derive.c. Not here: presets (presets.c). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "config_internal.h"
#include "k3pd/err.h"
#include "k3pd/model_config.h"
#include "k3pd/util.h"

/* Keys allowed anywhere we parse, never architectural (read and ignored). */
static const char *const kIgnored[] = {
    "transformers_version", "initializer_range", "use_cache", "rope_theta", "rope_scaling",
    "rope_parameters", "auto_map", "dtype", "torch_dtype", "architectures", "_name_or_path",
    "head_dim", "model_max_length", "max_position_embeddings", "vision_config",
    "image_placeholder", "ignore_index", "media_placeholder_token_id", "bos_token_id",
    "eos_token_id", "pad_token_id", "output_attentions", "output_hidden_states",
    "use_return_dict", "return_dict", "attention_dropout", "model_type", NULL};

/* Architecture keys of the text config: R = required, O = optional; per form. */
typedef struct {
  const char *key;
  char k3, lin; /* 'R', 'O' or 0 (not allowed in that form) */
} key_rule_t;

static const key_rule_t kText[] = {
    {"vocab_size", 'R', 'R'}, {"hidden_size", 'R', 'R'}, {"num_hidden_layers", 'R', 'R'},
    {"intermediate_size", 'R', 'R'}, {"hidden_act", 'R', 'R'}, {"rms_norm_eps", 'R', 'R'},
    {"activation_situ_beta", 'R', 0}, {"activation_situ_linear_beta", 'R', 0},
    {"attn_res_block_size", 'R', 0}, {"first_k_dense_replace", 'R', 'R'},
    {"moe_layer_freq", 'R', 'R'}, {"num_experts", 'R', 'R'}, {"num_experts_per_token", 'R', 'R'},
    {"num_shared_experts", 'R', 'R'}, {"moe_intermediate_size", 'R', 'R'},
    {"routed_expert_hidden_size", 'R', 0}, {"latent_moe_use_norm", 'R', 0},
    {"moe_router_activation_func", 'R', 'R'}, {"topk_method", 'R', 0},
    {"use_grouped_topk", 'R', 'R'}, {"num_expert_group", 'R', 'R'}, {"topk_group", 'R', 'R'},
    {"moe_renormalize", 'R', 'R'}, {"routed_scaling_factor", 'R', 'R'},
    {"num_attention_heads", 'R', 'R'}, {"num_key_value_heads", 'R', 'R'},
    {"q_lora_rank", 'R', 'R'}, {"kv_lora_rank", 'R', 'R'}, {"qk_nope_head_dim", 'R', 'R'},
    {"qk_rope_head_dim", 'R', 'R'}, {"v_head_dim", 'R', 'R'}, {"mla_use_nope", 'R', 'R'},
    {"mla_use_output_gate", 'R', 0}, {"num_nextn_predict_layers", 'O', 'O'},
    {"tie_word_embeddings", 'O', 'O'}, {"linear_attn_config", 'R', 'R'},
    {"quantization_config", 'O', 0}, {NULL, 0, 0}};

static const key_rule_t kLinAttn[] = {
    {"kda_layers", 'R', 'R'}, {"full_attn_layers", 'R', 'R'}, {"num_heads", 'R', 'R'},
    {"head_dim", 'R', 'R'}, {"short_conv_kernel_size", 'R', 'R'},
    {"use_full_rank_gate", 'R', 0}, {"gate_lower_bound", 'R', 0}, {NULL, 0, 0}};

static const char *const kK3Root[] = {"text_config", "tie_word_embeddings", NULL};

static int in_list(const char *const *l, const char *k) {
  for (; *l; l++)
    if (strcmp(*l, k) == 0) return 1;
  return 0;
}

/* Pass 1 for one object: unknown and missing keys. */
static void check_keys(json_t *obj, const key_rule_t *rules, int k3, const char *path,
                       const char *const *extra, ck_errs_t *e) {
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    int known = 0;
    for (const key_rule_t *r = rules; r && r->key; r++)
      if (strcmp(r->key, key) == 0) known = (k3 ? r->k3 : r->lin) != 0;
    if (!known && !in_list(kIgnored, key) && !(extra && in_list(extra, key)))
      ck_errs_add(e, "unknown key '%s%s'", path, key);
  }
  for (const key_rule_t *r = rules; r && r->key; r++)
    if ((k3 ? r->k3 : r->lin) == 'R' && !json_object_get(obj, r->key))
      ck_errs_add(e, "missing key '%s%s'", path, r->key);
}

/* Typed getters: record a type error and leave *out unchanged. */
static void get_int(json_t *o, const char *k, const char *path, int64_t *out, ck_errs_t *e) {
  json_t *v = json_object_get(o, k);
  if (!v) return;
  if (!json_is_integer(v))
    ck_errs_add(e, "key '%s%s' must be an integer", path, k);
  else
    *out = json_integer_value(v);
}
static void get_int32(json_t *o, const char *k, const char *path, int *out, ck_errs_t *e) {
  int64_t x = *out;
  get_int(o, k, path, &x, e);
  if (x < -1000000000 || x > 1000000000)
    ck_errs_add(e, "key '%s%s' is out of range", path, k);
  else
    *out = (int)x;
}
static void get_num(json_t *o, const char *k, const char *path, double *out, ck_errs_t *e) {
  json_t *v = json_object_get(o, k);
  if (!v) return;
  if (!json_is_number(v))
    ck_errs_add(e, "key '%s%s' must be a number", path, k);
  else
    *out = json_number_value(v);
}
static void get_bool(json_t *o, const char *k, const char *path, bool *out, ck_errs_t *e) {
  json_t *v = json_object_get(o, k);
  if (!v) return;
  if (!json_is_boolean(v))
    ck_errs_add(e, "key '%s%s' must be true or false", path, k);
  else
    *out = json_is_true(v);
}
static const char *get_str(json_t *o, const char *k, const char *path, ck_errs_t *e) {
  json_t *v = json_object_get(o, k);
  if (!v) return NULL;
  if (!json_is_string(v)) {
    ck_errs_add(e, "key '%s%s' must be a string", path, k);
    return NULL;
  }
  return json_string_value(v);
}

/* Marks 1-based list entries into owner[] (1 = kda, 2 = mla); records bad entries. */
static void read_layer_list(json_t *lac, const char *k, const char *path, int n, int mark,
                            int *owner, ck_errs_t *e) {
  json_t *a = json_object_get(lac, k);
  if (!a) return;
  if (!json_is_array(a)) {
    ck_errs_add(e, "key '%s%s' must be a list of 1-based layer numbers", path, k);
    return;
  }
  size_t i;
  json_t *x;
  json_array_foreach(a, i, x) {
    if (!json_is_integer(x)) {
      ck_errs_add(e, "%s%s[%zu] is not an integer", path, k, i);
      continue;
    }
    json_int_t l = json_integer_value(x);
    if (l < 1 || l > n) {
      ck_errs_add(e, "%s%s[%zu] = %lld is outside 1..%d (lists are 1-indexed)", path, k, i, (long long)l, n);
      continue;
    }
    if (owner[l - 1] == mark)
      ck_errs_add(e, "%s%s lists layer %lld twice", path, k, (long long)l);
    else if (owner[l - 1])
      ck_errs_add(e, "layer %lld is in both kda_layers and full_attn_layers", (long long)l);
    else
      owner[l - 1] = mark;
  }
}

static void check_quant(json_t *q, const char *path, k3_model_config_t *c, ck_errs_t *e) {
  if (json_is_null(q)) return;
  const char *qm = json_string_value(json_object_get(q, "quant_method"));
  const char *fmt = json_string_value(json_object_get(q, "format"));
  json_t *w = json_object_get(json_object_get(json_object_get(q, "config_groups"), "group_0"), "weights");
  if (!qm || strcmp(qm, "compressed-tensors") || !fmt || strcmp(fmt, "mxfp4-pack-quantized")) {
    ck_errs_add(e, "%squantization_config: only compressed-tensors mxfp4-pack-quantized is supported", path);
    return;
  }
  json_t *nb = json_object_get(w, "num_bits"), *gs = json_object_get(w, "group_size");
  const char *ty = json_string_value(json_object_get(w, "type"));
  if (!json_is_integer(nb) || json_integer_value(nb) != 4 || !json_is_integer(gs) ||
      json_integer_value(gs) != K3_MXFP4_GROUP || !ty || strcmp(ty, "float")) {
    ck_errs_add(e, "%squantization_config.config_groups.group_0.weights must be 4-bit float, group_size 32", path);
    return;
  }
  c->experts_mxfp4 = true;
}

/* Pass 2+3 over the text config object t. */
static void read_text(json_t *t, int k3, const char *path, k3_model_config_t *c, ck_errs_t *e) {
  char lpath[96];
  snprintf(lpath, sizeof lpath, "%slinear_attn_config.", path);
  get_int(t, "vocab_size", path, &c->vocab_size, e);
  get_int(t, "hidden_size", path, &c->hidden_size, e);
  get_int32(t, "num_hidden_layers", path, &c->num_layers, e);
  get_int(t, "intermediate_size", path, &c->intermediate_size, e);
  get_num(t, "rms_norm_eps", path, &c->rms_norm_eps, e);
  get_num(t, "activation_situ_beta", path, &c->situ_beta, e);
  get_num(t, "activation_situ_linear_beta", path, &c->situ_linear_beta, e);
  get_int32(t, "attn_res_block_size", path, &c->attn_res_block_size, e);
  get_int32(t, "first_k_dense_replace", path, &c->first_k_dense_replace, e);
  get_int32(t, "moe_layer_freq", path, &c->moe_layer_freq, e);
  get_int32(t, "num_experts", path, &c->num_experts, e);
  get_int32(t, "num_experts_per_token", path, &c->top_k, e);
  get_int32(t, "num_shared_experts", path, &c->num_shared_experts, e);
  get_int(t, "moe_intermediate_size", path, &c->moe_intermediate_size, e);
  get_int(t, "routed_expert_hidden_size", path, &c->routed_expert_hidden_size, e);
  get_bool(t, "latent_moe_use_norm", path, &c->latent_moe_use_norm, e);
  get_bool(t, "use_grouped_topk", path, &c->use_grouped_topk, e);
  get_int32(t, "num_expert_group", path, &c->num_expert_group, e);
  get_int32(t, "topk_group", path, &c->topk_group, e);
  get_bool(t, "moe_renormalize", path, &c->moe_renormalize, e);
  get_num(t, "routed_scaling_factor", path, &c->routed_scaling_factor, e);
  get_int32(t, "num_attention_heads", path, &c->num_heads, e);
  get_int32(t, "num_key_value_heads", path, &c->num_kv_heads, e);
  if (!json_is_null(json_object_get(t, "q_lora_rank"))) get_int(t, "q_lora_rank", path, &c->q_lora_rank, e);
  get_int(t, "kv_lora_rank", path, &c->kv_lora_rank, e);
  get_int(t, "qk_nope_head_dim", path, &c->qk_nope_head_dim, e);
  get_int(t, "qk_rope_head_dim", path, &c->qk_rope_head_dim, e);
  get_int(t, "v_head_dim", path, &c->v_head_dim, e);
  get_bool(t, "mla_use_nope", path, &c->mla_use_nope, e);
  get_bool(t, "mla_use_output_gate", path, &c->mla_use_output_gate, e);
  get_int32(t, "num_nextn_predict_layers", path, &c->num_nextn_predict_layers, e);
  get_bool(t, "tie_word_embeddings", path, &c->tie_word_embeddings, e);
  get_int(t, k3 ? "max_position_embeddings" : "model_max_length", path, &c->max_position_embeddings, e);
  const char *act = get_str(t, "hidden_act", path, e);
  const char *ract = get_str(t, "moe_router_activation_func", path, e);
  const char *tkm = get_str(t, "topk_method", path, e);
  json_t *q = json_object_get(t, "quantization_config");
  if (q) check_quant(q, path, c, e);

  json_t *lac = json_object_get(t, "linear_attn_config");
  int owner[K3_MAX_LAYERS] = {0};
  int n = c->num_layers;
  if (n < 1 || n > K3_MAX_LAYERS) {
    ck_errs_add(e, "%snum_hidden_layers = %d is outside 1..%d", path, n, K3_MAX_LAYERS);
    n = 0;
  }
  if (lac && !json_is_object(lac)) {
    ck_errs_add(e, "key '%slinear_attn_config' must be an object", path);
  } else if (lac) {
    get_int32(lac, "num_heads", lpath, &c->kda_num_heads, e);
    get_int32(lac, "head_dim", lpath, &c->kda_head_dim, e);
    get_int32(lac, "short_conv_kernel_size", lpath, &c->conv_kernel, e);
    get_bool(lac, "use_full_rank_gate", lpath, &c->use_full_rank_gate, e);
    json_t *lb = json_object_get(lac, "gate_lower_bound");
    if (lb && !json_is_null(lb)) {
      c->has_gate_lower_bound = true;
      get_num(lac, "gate_lower_bound", lpath, &c->gate_lower_bound, e);
    }
    if (n) {
      read_layer_list(lac, "kda_layers", lpath, n, 1, owner, e);
      read_layer_list(lac, "full_attn_layers", lpath, n, 2, owner, e);
      if (json_object_get(lac, "kda_layers") && json_object_get(lac, "full_attn_layers")) {
        for (int l = 0; l < n; l++)
          if (!owner[l]) ck_errs_add(e, "layer %d (1-based) is in neither kda_layers nor full_attn_layers", l + 1);
        if (owner[0] == 2) ck_errs_add(e, "layer 1 must be a KDA layer (it is in full_attn_layers)");
        if (owner[n - 1] == 1) ck_errs_add(e, "the last layer (%d) must be in full_attn_layers", n);
      }
    }
  }
  for (int l = 0; l < n; l++) c->layer_kind[l] = owner[l] == 2 ? K3_LAYER_MLA : K3_LAYER_KDA;

  /* ---- invariants (spec §1 / §12) ---- */
  if (act && strcmp(act, k3 ? "situ" : "silu"))
    ck_errs_add(e, "%shidden_act = '%s' (a %s config needs '%s')", path, act, k3 ? "kimi_k3" : "kimi_linear",
                k3 ? "situ" : "silu");
  c->act = k3 ? K3_ACT_SITU : K3_ACT_SILU;
  if (k3 && (!(c->situ_beta > 0) || !(c->situ_linear_beta > 0)))
    ck_errs_add(e, "%sactivation_situ_beta and activation_situ_linear_beta must be > 0", path);
  if (ract && strcmp(ract, "sigmoid")) ck_errs_add(e, "%smoe_router_activation_func = '%s' (only sigmoid)", path, ract);
  if (tkm && strcmp(tkm, "noaux_tc")) ck_errs_add(e, "%stopk_method = '%s' (only noaux_tc)", path, tkm);
  if (json_object_get(t, "mla_use_nope") && !c->mla_use_nope) ck_errs_add(e, "%smla_use_nope must be true (k3pd implements NoPE MLA only)", path);
  if (c->num_kv_heads != c->num_heads)
    ck_errs_add(e, "%snum_key_value_heads (%d) must equal num_attention_heads (%d)", path, c->num_kv_heads, c->num_heads);
  if (c->tie_word_embeddings) ck_errs_add(e, "%stie_word_embeddings must be false (separate lm_head)", path);
  if (c->num_nextn_predict_layers != 0) ck_errs_add(e, "%snum_nextn_predict_layers must be 0 (no MTP)", path);
  if (!(c->rms_norm_eps > 0)) ck_errs_add(e, "%srms_norm_eps must be > 0", path);
  struct { const char *k; int64_t v; } pos[] = {
      {"vocab_size", c->vocab_size}, {"hidden_size", c->hidden_size},
      {"num_attention_heads", c->num_heads}, {"kv_lora_rank", c->kv_lora_rank},
      {"qk_nope_head_dim", c->qk_nope_head_dim}, {"qk_rope_head_dim", c->qk_rope_head_dim},
      {"v_head_dim", c->v_head_dim}, {"num_experts", c->num_experts},
      {"num_experts_per_token", c->top_k}, {"moe_intermediate_size", c->moe_intermediate_size},
      {"moe_layer_freq", c->moe_layer_freq}, {"num_expert_group", c->num_expert_group},
      {"topk_group", c->topk_group}, {"linear_attn_config.num_heads", c->kda_num_heads},
      {"linear_attn_config.head_dim", c->kda_head_dim}};
  /* Upper bounds keep every derived size far from int64 overflow and the tensor map finite
   * (the real K3 uses at most 163840 / 896 experts). */
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
    if (pos[i].v < 1) ck_errs_add(e, "%s%s must be >= 1", path, pos[i].k);
    if (pos[i].v > (1 << 24)) ck_errs_add(e, "%s%s = %lld is implausibly large (max %d)", path, pos[i].k, (long long)pos[i].v, 1 << 24);
  }
  if (c->num_experts > 65536) ck_errs_add(e, "%snum_experts = %d exceeds 65536", path, c->num_experts);
  if (c->intermediate_size > (1 << 24) || c->routed_expert_hidden_size > (1 << 24) || c->q_lora_rank > (1 << 24) ||
      c->num_shared_experts > 1024 || c->attn_res_block_size > K3_MAX_LAYERS)
    ck_errs_add(e, "%sa width (intermediate_size, routed_expert_hidden_size, q_lora_rank, num_shared_experts, attn_res_block_size) is implausibly large", path);
  if (c->conv_kernel > 64) ck_errs_add(e, "%sshort_conv_kernel_size = %d exceeds 64", lpath, c->conv_kernel);
  if (c->conv_kernel < 2) ck_errs_add(e, "%sshort_conv_kernel_size must be >= 2", lpath);
  if (c->q_lora_rank < 0) ck_errs_add(e, "%sq_lora_rank must be null or >= 1", path);
  if (c->num_shared_experts < 0) ck_errs_add(e, "%snum_shared_experts must be >= 0", path);
  if (c->top_k > c->num_experts)
    ck_errs_add(e, "%snum_experts_per_token (%d) exceeds num_experts (%d)", path, c->top_k, c->num_experts);
  if (c->num_expert_group >= 1 && c->num_experts % c->num_expert_group)
    ck_errs_add(e, "%snum_experts (%d) is not a multiple of num_expert_group (%d)", path, c->num_experts, c->num_expert_group);
  if (c->topk_group > c->num_expert_group)
    ck_errs_add(e, "%stopk_group (%d) exceeds num_expert_group (%d)", path, c->topk_group, c->num_expert_group);
  if (c->first_k_dense_replace < 0 || c->first_k_dense_replace > c->num_layers)
    ck_errs_add(e, "%sfirst_k_dense_replace (%d) is outside 0..num_hidden_layers", path, c->first_k_dense_replace);
  if (c->first_k_dense_replace > 0 && c->intermediate_size < 1)
    ck_errs_add(e, "%sintermediate_size must be >= 1 (dense layers exist)", path);
  if (k3) {
    if (c->attn_res_block_size < 1) ck_errs_add(e, "%sattn_res_block_size must be >= 1", path);
    if (c->routed_expert_hidden_size < 1) ck_errs_add(e, "%srouted_expert_hidden_size must be >= 1", path);
    if (!c->use_full_rank_gate) ck_errs_add(e, "%suse_full_rank_gate must be true for kimi_k3", lpath);
    if (!c->has_gate_lower_bound || !(c->gate_lower_bound < 0))
      ck_errs_add(e, "%sgate_lower_bound must be a negative number for kimi_k3", lpath);
  }
  int64_t ein = c->routed_expert_hidden_size > 0 ? c->routed_expert_hidden_size : c->hidden_size;
  if (c->experts_mxfp4 && (ein % K3_MXFP4_GROUP || c->moe_intermediate_size % K3_MXFP4_GROUP))
    ck_errs_add(e, "%sMXFP4 experts need expert input (%lld) and moe_intermediate_size (%lld) to be multiples of %d",
                path, (long long)ein, (long long)c->moe_intermediate_size, K3_MXFP4_GROUP);
}

int k3_model_config_parse(const char *json, size_t len, k3_model_config_t *out, char *err,
                          size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    ck_seterr(err, errlen, "config: bad JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    return K3_EFORMAT;
  }
  k3_model_config_t c;
  memset(&c, 0, sizeof c);
  c.media_placeholder_token_id = c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;
  ck_errs_t e;
  char tmp[4096];
  ck_errs_init(&e, tmp, sizeof tmp);
  int rc = K3_ECONFIG;
  const char *mt = json_is_object(root) ? json_string_value(json_object_get(root, "model_type")) : NULL;
  if (!json_is_object(root)) {
    ck_errs_add(&e, "config is not a JSON object");
    goto out;
  }
  if (!mt || (strcmp(mt, "kimi_k3") && strcmp(mt, "kimi_linear"))) {
    ck_errs_add(&e, "model_type must be \"kimi_k3\" or \"kimi_linear\" (got %s%s%s)", mt ? "\"" : "",
                mt ? mt : "none", mt ? "\"" : "");
    goto out;
  }
  int k3 = strcmp(mt, "kimi_k3") == 0;
  json_t *t = root;
  const char *path = "";
  if (k3) {
    check_keys(root, NULL, 1, "", kK3Root, &e);
    t = json_object_get(root, "text_config");
    if (!json_is_object(t)) {
      ck_errs_add(&e, t ? "key 'text_config' must be an object" : "missing key 'text_config'");
      goto out;
    }
    path = "text_config.";
    const char *tmt = json_string_value(json_object_get(t, "model_type"));
    if (!tmt || strcmp(tmt, "kimi_linear"))
      ck_errs_add(&e, "text_config.model_type must be \"kimi_linear\"");
    bool tie = false;
    get_bool(root, "tie_word_embeddings", "", &tie, &e);
    if (tie) ck_errs_add(&e, "tie_word_embeddings must be false (separate lm_head)");
    get_int(root, "media_placeholder_token_id", "", &c.media_placeholder_token_id, &e);
    get_int(root, "bos_token_id", "", &c.bos_token_id, &e);
    get_int(root, "eos_token_id", "", &c.eos_token_id, &e);
    get_int(root, "pad_token_id", "", &c.pad_token_id, &e);
  }
  check_keys(t, kText, k3, path, NULL, &e);
  json_t *lac = json_object_get(t, "linear_attn_config");
  if (json_is_object(lac)) {
    char lpath[96];
    snprintf(lpath, sizeof lpath, "%slinear_attn_config.", path);
    check_keys(lac, kLinAttn, k3, lpath, NULL, &e);
  }
  if (e.count) goto out; /* key problems first: type/invariant messages would be noise */
  c.type = k3 ? K3_MODEL_K3 : K3_MODEL_LINEAR;
  get_int(t, "bos_token_id", path, &c.bos_token_id, &e);
  get_int(t, "eos_token_id", path, &c.eos_token_id, &e);
  get_int(t, "pad_token_id", path, &c.pad_token_id, &e);
  read_text(t, k3, path, &c, &e);
  int64_t ids[] = {c.bos_token_id, c.eos_token_id, c.pad_token_id, c.media_placeholder_token_id};
  const char *idn[] = {"bos_token_id", "eos_token_id", "pad_token_id", "media_placeholder_token_id"};
  for (int i = 0; i < 4; i++)
    if (ids[i] < -1 || (c.vocab_size > 0 && ids[i] >= c.vocab_size))
      ck_errs_add(&e, "%s = %lld is outside the vocabulary (%lld)", idn[i], (long long)ids[i], (long long)c.vocab_size);
  if (e.count) goto out;
  ck_config_derive(&c);
  *out = c;
  rc = 0;
out:
  if (rc) {
    ck_errs_finish(&e);
    ck_seterr(err, errlen, "config: %s", tmp);
  }
  json_decref(root);
  return rc;
}

int k3_model_config_load(const char *path, k3_model_config_t *out, char *err, size_t errlen) {
  char *txt = NULL;
  size_t len = 0;
  int rc = k3_read_file(path, &txt, &len);
  if (rc) {
    ck_seterr(err, errlen, "%s: %s", path, k3_strerror(rc));
    return rc;
  }
  char inner[4096];
  rc = k3_model_config_parse(txt, len, out, inner, sizeof inner);
  free(txt);
  if (rc) ck_seterr(err, errlen, "%s: %s", path, inner);
  return rc;
}
