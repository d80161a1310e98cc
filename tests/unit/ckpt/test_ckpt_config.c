/* Unit tests for the strict model config: the real released configs and the presets parse with
 * the derived values of the spec; every rejection names the offending keys. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/model_config.h"

static void load_data(const char *name, k3_model_config_t *c) {
  char path[1024], err[4096];
  const char *src = getenv("K3PD_SOURCE_DIR");
  ck_assert_ptr_nonnull(src);
  snprintf(path, sizeof path, "%s/tests/unit/ckpt/data/%s", src, name);
  int rc = k3_model_config_load(path, c, err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
}

START_TEST(test_real_k3) {
  k3_model_config_t c;
  load_data("k3-config.json", &c);
  ck_assert_int_eq(c.type, K3_MODEL_K3);
  ck_assert_int_eq(c.num_layers, 93);
  ck_assert_int_eq(c.num_kda, 69);
  ck_assert_int_eq(c.num_mla, 24);
  /* 0-based MLA layers 3,7,...,91 and 92 */
  for (int l = 0; l < 93; l++)
    ck_assert_int_eq(c.layer_kind[l], ((l + 1) % 4 == 0 || l == 92) ? K3_LAYER_MLA : K3_LAYER_KDA);
  ck_assert_int_eq(c.kind_index[92], 23);
  ck_assert_int_eq(c.kind_index[91], 22);
  ck_assert_int_eq(c.kind_index[90], 68);
  ck_assert_int_eq(c.num_attn_res_boundaries, 8);
  for (int l = 0; l < 93; l++) ck_assert_int_eq(c.attn_res_boundary[l], l % 12 == 0);
  ck_assert_int_eq(c.num_moe, 92);
  ck_assert(!c.layer_is_moe[0] && c.layer_is_moe[1]);
  ck_assert_int_eq(c.kda_proj_dim, 12288);
  ck_assert_int_eq(c.mla_qk_head_dim, 192);
  ck_assert_int_eq(c.mla_cache_dim, 576);
  ck_assert(fabs(c.mla_softmax_scale - 1.0 / sqrt(192.0)) < 1e-15);
  ck_assert_int_eq(c.kda_gate, K3_KDA_GATE_LOWER_BOUND);
  ck_assert(c.gate_lower_bound == -5.0);
  ck_assert(c.experts_mxfp4);
  ck_assert_int_eq(c.dt_conv, K3_DT_F32);
  ck_assert_int_eq(c.dt_router_bias, K3_DT_F32);
  ck_assert(c.eps_norm == 1e-5 && c.eps_mla_lora == 1e-6 && c.eps_kda_l2 == 1e-6);
  ck_assert_int_eq(c.a_log_len, 128);
  ck_assert_str_eq(c.tensor_prefix, "language_model.");
  ck_assert_uint_eq(c.kda_bytes_per_seq, 449372160ull);
  ck_assert_uint_eq(c.mla_bytes_per_token, 27648ull);
  ck_assert_int_eq(c.expert_in_dim, 3584);
  ck_assert_int_eq(c.shared_expert_width, 6144);
  ck_assert_int_eq(c.eos_token_id, 163586);
  ck_assert_int_eq(c.media_placeholder_token_id, 163605);
  ck_assert(!c.router_bias_in_weights);
}
END_TEST

START_TEST(test_real_48b) {
  k3_model_config_t c;
  load_data("48b-config.json", &c);
  ck_assert_int_eq(c.type, K3_MODEL_LINEAR);
  ck_assert_int_eq(c.num_kda, 20);
  ck_assert_int_eq(c.num_mla, 7);
  int mla[] = {3, 7, 11, 15, 19, 23, 26};
  for (int i = 0; i < 7; i++) ck_assert_int_eq(c.layer_kind[mla[i]], K3_LAYER_MLA);
  ck_assert_int_eq(c.layer_kind[24], K3_LAYER_KDA);
  ck_assert_int_eq(c.num_attn_res_boundaries, 0);
  ck_assert_int_eq(c.attn_res_block_size, 0);
  ck_assert_int_eq(c.kda_gate, K3_KDA_GATE_SOFTPLUS);
  ck_assert_int_eq(c.q_lora_rank, 0);
  ck_assert(!c.mla_use_output_gate && !c.use_full_rank_gate && !c.experts_mxfp4);
  ck_assert_int_eq(c.act, K3_ACT_SILU);
  ck_assert_int_eq(c.dt_conv, K3_DT_BF16);
  ck_assert_int_eq(c.dt_o_norm, K3_DT_BF16);
  ck_assert_str_eq(c.tensor_prefix, "");
  ck_assert(fabs(c.routed_scaling_factor - 2.446) < 1e-12);
  ck_assert_uint_eq(c.kda_bytes_per_seq, 43417600ull);
  ck_assert_uint_eq(c.mla_bytes_per_token, 8064ull);
  ck_assert_int_eq(c.expert_in_dim, 2304);
  ck_assert_int_eq(c.a_log_len, 32);
  ck_assert_int_eq(c.max_position_embeddings, 1048576);
}
END_TEST

START_TEST(test_presets) {
  k3_model_config_t c;
  char err[4096];
  const char *t = k3_model_config_preset("tiny");
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(k3_model_config_parse(t, strlen(t), &c, err, sizeof err), 0);
  ck_assert_int_eq(c.num_layers, 8);
  ck_assert(c.layer_kind[3] == K3_LAYER_MLA && c.layer_kind[7] == K3_LAYER_MLA);
  ck_assert(c.attn_res_boundary[0] && c.attn_res_boundary[3] && c.attn_res_boundary[6]);
  ck_assert_int_eq(c.num_attn_res_boundaries, 3);
  ck_assert_int_eq(c.kda_proj_dim, 128);
  ck_assert_int_eq(c.mla_qk_head_dim, 48);
  ck_assert_int_eq(c.mla_cache_dim, 80);
  t = k3_model_config_preset("tiny-48b");
  ck_assert_int_eq(k3_model_config_parse(t, strlen(t), &c, err, sizeof err), 0);
  ck_assert(c.layer_kind[3] == K3_LAYER_MLA && c.layer_kind[6] == K3_LAYER_MLA);
  ck_assert_int_eq(c.num_layers, 7);
  t = k3_model_config_preset("medium");
  ck_assert_int_eq(k3_model_config_parse(t, strlen(t), &c, err, sizeof err), 0);
  ck_assert_int_eq(c.num_layers, 16);
  ck_assert_int_eq(c.num_experts, 256);
  ck_assert(c.attn_res_boundary[0] && c.attn_res_boundary[12]);
  ck_assert_int_eq(c.num_attn_res_boundaries, 2);
  ck_assert_uint_eq(c.kda_bytes_per_seq, 12ull * 6512640ull);
  ck_assert_ptr_null(k3_model_config_preset("nope"));
}
END_TEST

/* Parses the tiny preset after applying `edit` to its text_config (or root when root != 0). */
typedef void (*edit_fn)(json_t *root, json_t *tc, json_t *lac);
static int parse_edited(const char *preset, edit_fn edit, char *err, size_t errlen) {
  const char *t = k3_model_config_preset(preset);
  json_t *root = json_loads(t, 0, NULL);
  ck_assert_ptr_nonnull(root);
  json_t *tc = json_object_get(root, "text_config");
  json_t *lac = json_object_get(tc ? tc : root, "linear_attn_config");
  edit(root, tc ? tc : root, lac);
  char *s = json_dumps(root, 0);
  k3_model_config_t c;
  memset(&c, 0x5a, sizeof c);
  k3_model_config_t before = c;
  int rc = k3_model_config_parse(s, strlen(s), &c, err, errlen);
  if (rc) ck_assert_msg(memcmp(&c, &before, sizeof c) == 0, "config changed on error");
  free(s);
  json_decref(root);
  return rc;
}

static void e_unknown(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(tc, "frobnicate", json_integer(1));
  json_object_set_new(lac, "chunk_size", json_integer(64));
  json_object_set_new(r, "weird_root", json_true());
}
static void e_missing(json_t *r, json_t *tc, json_t *lac) {
  json_object_del(tc, "hidden_size");
  json_object_del(tc, "kv_lora_rank");
  json_object_del(lac, "num_heads");
}
static void e_zero_indexed(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(lac, "kda_layers", json_pack("[i,i,i,i,i,i]", 0, 1, 2, 4, 5, 6));
  json_object_set_new(lac, "full_attn_layers", json_pack("[i,i]", 3, 7));
}
static void e_overlap(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(lac, "kda_layers", json_pack("[i,i,i,i,i,i]", 1, 2, 3, 4, 6, 7));
}
static void e_first_mla(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(lac, "kda_layers", json_pack("[i,i,i,i,i,i]", 2, 3, 4, 5, 6, 7));
  json_object_set_new(lac, "full_attn_layers", json_pack("[i,i]", 1, 8));
}
static void e_last_kda(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(lac, "kda_layers", json_pack("[i,i,i,i,i,i]", 1, 2, 3, 5, 6, 8));
  json_object_set_new(lac, "full_attn_layers", json_pack("[i,i]", 4, 7));
}
static void e_model_type(json_t *r, json_t *tc, json_t *lac) { json_object_set_new(r, "model_type", json_string("llama")); }
static void e_invariants(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(tc, "num_key_value_heads", json_integer(2));
  json_object_set_new(tc, "num_experts_per_token", json_integer(17));
  json_object_set_new(tc, "mla_use_nope", json_false());
  json_object_set_new(tc, "hidden_act", json_string("silu"));
  json_object_set_new(tc, "moe_intermediate_size", json_integer(48));
  json_object_set_new(tc, "num_expert_group", json_integer(3));
}
static void e_types(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(tc, "hidden_size", json_string("256"));
  json_object_set_new(tc, "moe_renormalize", json_integer(1));
}
static void e_k3_key_in_48b(json_t *r, json_t *tc, json_t *lac) {
  json_object_set_new(tc, "attn_res_block_size", json_integer(3));
  json_object_set_new(lac, "gate_lower_bound", json_real(-5.0));
}

START_TEST(test_reject) {
  char err[4096];
  ck_assert_int_eq(parse_edited("tiny", e_unknown, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "unknown key 'text_config.frobnicate'"));
  ck_assert_ptr_nonnull(strstr(err, "unknown key 'text_config.linear_attn_config.chunk_size'"));
  ck_assert_ptr_nonnull(strstr(err, "unknown key 'weird_root'"));
  ck_assert_ptr_nonnull(strstr(err, "(3 problems)"));

  ck_assert_int_eq(parse_edited("tiny", e_missing, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "missing key 'text_config.hidden_size'"));
  ck_assert_ptr_nonnull(strstr(err, "missing key 'text_config.kv_lora_rank'"));
  ck_assert_ptr_nonnull(strstr(err, "missing key 'text_config.linear_attn_config.num_heads'"));

  ck_assert_int_eq(parse_edited("tiny", e_zero_indexed, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "kda_layers[0] = 0 is outside 1..8 (lists are 1-indexed)"));
  ck_assert_ptr_nonnull(strstr(err, "layer 8 (1-based) is in neither"));

  ck_assert_int_eq(parse_edited("tiny", e_overlap, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "layer 4 is in both kda_layers and full_attn_layers"));
  ck_assert_ptr_nonnull(strstr(err, "layer 5 (1-based) is in neither"));

  ck_assert_int_eq(parse_edited("tiny", e_first_mla, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "layer 1 must be a KDA layer"));

  ck_assert_int_eq(parse_edited("tiny", e_last_kda, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "the last layer (8) must be in full_attn_layers"));

  ck_assert_int_eq(parse_edited("tiny", e_model_type, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "model_type must be \"kimi_k3\" or \"kimi_linear\" (got \"llama\")"));

  ck_assert_int_eq(parse_edited("tiny", e_invariants, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "num_key_value_heads (2) must equal num_attention_heads (4)"));
  ck_assert_ptr_nonnull(strstr(err, "num_experts_per_token (17) exceeds num_experts (16)"));
  ck_assert_ptr_nonnull(strstr(err, "mla_use_nope must be true"));
  ck_assert_ptr_nonnull(strstr(err, "hidden_act = 'silu'"));
  ck_assert_ptr_nonnull(strstr(err, "multiples of 32"));
  ck_assert_ptr_nonnull(strstr(err, "not a multiple of num_expert_group (3)"));

  ck_assert_int_eq(parse_edited("tiny", e_types, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "key 'text_config.hidden_size' must be an integer"));
  ck_assert_ptr_nonnull(strstr(err, "key 'text_config.moe_renormalize' must be true or false"));

  ck_assert_int_eq(parse_edited("tiny-48b", e_k3_key_in_48b, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "unknown key 'attn_res_block_size'"));
  ck_assert_ptr_nonnull(strstr(err, "unknown key 'linear_attn_config.gate_lower_bound'"));

  k3_model_config_t c;
  ck_assert_int_eq(k3_model_config_parse("{\"model_type\": ", 15, &c, err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "bad JSON"));
  ck_assert_int_eq(k3_model_config_parse("[1]", 3, &c, err, sizeof err), K3_ECONFIG);
  ck_assert_int_eq(k3_model_config_load("/nonexistent/config.json", &c, err, sizeof err), K3_ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/config.json"));
}
END_TEST

START_TEST(test_canonical_and_print) {
  k3_model_config_t c;
  char err[512];
  const char *t = k3_model_config_preset("tiny");
  ck_assert_int_eq(k3_model_config_parse(t, strlen(t), &c, err, sizeof err), 0);
  size_t need = k3_model_config_canonical(&c, NULL, 0);
  char *buf = malloc(need + 1);
  ck_assert_uint_eq(k3_model_config_canonical(&c, buf, need + 1), need);
  ck_assert_ptr_nonnull(strstr(buf, "hidden_size=256\n"));
  ck_assert_ptr_nonnull(strstr(buf, "layers=KKKMKKKM\n"));
  free(buf);
  char *out = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&out, &len);
  k3_model_config_print(&c, fp);
  fclose(fp);
  ck_assert_ptr_nonnull(strstr(out, "8: 6 KDA + 2 MLA; MLA at 0-based 3 7"));
  ck_assert_ptr_nonnull(strstr(out, "boundaries at 0 3 6"));
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt_config");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_real_k3);
  tcase_add_test(tc, test_real_48b);
  tcase_add_test(tc, test_presets);
  tcase_add_test(tc, test_reject);
  tcase_add_test(tc, test_canonical_and_print);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
