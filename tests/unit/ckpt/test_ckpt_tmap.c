/* Unit tests for the tensor map (real K3 and 48B configs reproduce the spec's tensor counts,
 * parameter and byte totals; medium reproduces spec §11.2's arithmetic) and the state manifest
 * (spec §10.2 / 48B §8.2 sizes, fingerprint sensitivity). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/manifest.h"
#include "k3pd/model_config.h"
#include "k3pd/tmap.h"

static void load(const char *what, k3_model_config_t *c) {
  char err[4096];
  const char *p = k3_model_config_preset(what);
  if (p) {
    ck_assert_msg(k3_model_config_parse(p, strlen(p), c, err, sizeof err) == 0, "%s", err);
    return;
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/unit/ckpt/data/%s", getenv("K3PD_SOURCE_DIR"), what);
  ck_assert_msg(k3_model_config_load(path, c, err, sizeof err) == 0, "%s", err);
}

static const k3_tmap_entry_t *need(const k3_tmap_t *m, const char *name, k3_dtype_t dt, int ndim, const int64_t *shape) {
  const k3_tmap_entry_t *e = k3_tmap_find(m, name);
  ck_assert_msg(e != NULL, "missing %s", name);
  ck_assert_int_eq(e->dtype, dt);
  ck_assert_int_eq(e->ndim, ndim);
  for (int i = 0; i < ndim; i++) ck_assert_int_eq(e->shape[i], shape[i]);
  return e;
}
#define SH(...) ((const int64_t[]){__VA_ARGS__})

static uint64_t sum_bytes(const k3_tmap_t *m, int layer, const char *contains) {
  uint64_t b = 0;
  for (size_t i = 0; i < m->n; i++)
    if (m->entries[i].layer == layer && strstr(m->entries[i].name, contains)) b += m->entries[i].nbytes;
  return b;
}

START_TEST(test_real_k3_map) {
  k3_model_config_t c;
  load("k3-config.json", &c);
  k3_tmap_t m;
  char err[256];
  ck_assert_int_eq(k3_tmap_plan(&c, &m, err, sizeof err), 0);
  /* spec §7/§10.1: 497,052 text tensors, 2,779,484,478,208 params, 1,559,965,606,912 bytes */
  ck_assert_uint_eq(m.n, 497052);
  ck_assert_uint_eq(m.total_params, 2779484478208ull);
  ck_assert_uint_eq(m.total_bytes, 1559965606912ull);
  need(&m, "language_model.model.embed_tokens.weight", K3_DT_BF16, 2, SH(163840, 7168));
  need(&m, "language_model.lm_head.weight", K3_DT_BF16, 2, SH(163840, 7168));
  need(&m, "language_model.model.output_attn_res_proj.weight", K3_DT_BF16, 2, SH(1, 7168));
  need(&m, "language_model.model.layers.0.self_attn.A_log", K3_DT_F32, 1, SH(128));
  need(&m, "language_model.model.layers.0.self_attn.q_conv1d.weight", K3_DT_F32, 3, SH(12288, 1, 4));
  need(&m, "language_model.model.layers.0.self_attn.o_norm.weight", K3_DT_F32, 1, SH(128));
  need(&m, "language_model.model.layers.0.mlp.down_proj.weight", K3_DT_BF16, 2, SH(7168, 33792));
  need(&m, "language_model.model.layers.92.self_attn.q_b_proj.weight", K3_DT_BF16, 2, SH(18432, 1536));
  need(&m, "language_model.model.layers.92.self_attn.kv_b_proj.weight", K3_DT_BF16, 2, SH(24576, 512));
  need(&m, "language_model.model.layers.3.self_attn.g_proj.weight", K3_DT_BF16, 2, SH(12288, 7168));
  need(&m, "language_model.model.layers.5.block_sparse_moe.gate.e_score_correction_bias", K3_DT_F32, 1, SH(896));
  const k3_tmap_entry_t *p = need(&m, "language_model.model.layers.1.block_sparse_moe.experts.895.w2.weight_packed",
                                  K3_DT_U8, 2, SH(3584, 1536));
  ck_assert_int_eq(p->logical_cols, 3072);
  ck_assert_int_eq(p->expert, 895);
  ck_assert_int_eq(p->role, K3_ROLE_EXPERT_PACKED);
  need(&m, "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", K3_DT_U8, 2, SH(3072, 112));
  ck_assert_ptr_null(k3_tmap_find(&m, "language_model.model.layers.0.block_sparse_moe.gate.weight"));
  ck_assert_str_eq(p->short_name, "model.layers.1.block_sparse_moe.experts.895.w2.weight_packed");
  /* per-layer figures of spec §7 */
  ck_assert_uint_eq(sum_bytes(&m, 0, ".self_attn."), 887160832ull + 640000ull);
  ck_assert_uint_eq(sum_bytes(&m, 3, ".self_attn."), 464392192ull);
  ck_assert_uint_eq(sum_bytes(&m, 1, ".experts.7."), 17547264ull);
  k3_tmap_free(&m);
}
END_TEST

START_TEST(test_real_48b_map) {
  k3_model_config_t c;
  load("48b-config.json", &c);
  k3_tmap_t m;
  char err[256];
  ck_assert_int_eq(k3_tmap_plan(&c, &m, err, sizeof err), 0);
  ck_assert_uint_eq(m.n, 20493);
  ck_assert_uint_eq(m.total_params, 49122681728ull);
  ck_assert_uint_eq(m.total_bytes, 98245528576ull);
  need(&m, "model.layers.0.self_attn.A_log", K3_DT_F32, 4, SH(1, 1, 32, 1));
  need(&m, "model.layers.0.self_attn.k_conv1d.weight", K3_DT_BF16, 3, SH(4096, 1, 4));
  need(&m, "model.layers.0.self_attn.g_a_proj.weight", K3_DT_BF16, 2, SH(128, 2304));
  need(&m, "model.layers.0.self_attn.g_b_proj.weight", K3_DT_BF16, 2, SH(4096, 128));
  need(&m, "model.layers.26.self_attn.q_proj.weight", K3_DT_BF16, 2, SH(6144, 2304));
  need(&m, "model.layers.26.block_sparse_moe.gate.e_score_correction_bias", K3_DT_BF16, 1, SH(256));
  need(&m, "model.layers.1.block_sparse_moe.experts.255.w2.weight", K3_DT_BF16, 2, SH(2304, 1024));
  ck_assert_ptr_null(k3_tmap_find(&m, "model.layers.0.self_attention_res_norm.weight"));
  ck_assert_ptr_null(k3_tmap_find(&m, "model.layers.3.self_attn.g_proj.weight"));
  ck_assert_uint_eq(sum_bytes(&m, 0, ".self_attn."), 79036800ull);
  ck_assert_uint_eq(sum_bytes(&m, 3, ".self_attn."), 58229760ull);
  ck_assert_uint_eq(sum_bytes(&m, 1, ".block_sparse_moe."), 3639214592ull);
  k3_tmap_free(&m);
}
END_TEST

START_TEST(test_medium_dry_run) {
  k3_model_config_t c;
  load("medium", &c);
  k3_tmap_t m;
  char err[256];
  ck_assert_int_eq(k3_tmap_plan(&c, &m, err, sizeof err), 0);
  /* spec §11.2: 12 KDA x 0.888 GB + 4 MLA x 0.464 GB + dense 1.45 GB + 15 MoE x (0.37 GB +
   * 256 x 17.55 MB) + embed/lm_head 4.70 GB (+ norms) = 91.6 GB. Exactly: */
  uint64_t kda = 887160832ull + 640000ull;          /* §7 KDA layer, bf16 + fp32 */
  uint64_t mla = 464392192ull;                      /* §7 MLA layer */
  uint64_t norms = 6ull * 7168 * 2;                 /* 4 norms + 2 res projs per layer */
  uint64_t dense = 3ull * 33792 * 7168 * 2;
  uint64_t moe = 256ull * 7168 * 2 + 256 * 4        /* router + fp32 bias */
                 + 2ull * 3584 * 7168 * 2 + 3584 * 2 /* latent down/up + norm */
                 + 3ull * 6144 * 7168 * 2;          /* shared expert */
  uint64_t experts = 256ull * 17547264ull;
  uint64_t head = 2ull * 163840 * 7168 * 2 + 3ull * 7168 * 2;
  uint64_t want = 12 * kda + 4 * mla + 16 * norms + dense + 15 * (moe + experts) + head;
  ck_assert_uint_eq(moe, 370679808ull); /* "0.37 GB non-expert" */
  ck_assert_uint_eq(want, 91605235712ull);
  ck_assert_uint_eq(m.total_bytes, want);
  ck_assert(m.total_bytes > 91.5e9 && m.total_bytes < 91.7e9);
  need(&m, "language_model.model.layers.15.self_attn.kv_a_proj_with_mqa.weight", K3_DT_BF16, 2, SH(576, 7168));
  need(&m, "language_model.model.layers.14.block_sparse_moe.experts.255.w3.weight_packed", K3_DT_U8, 2, SH(3072, 1792));
  ck_assert_ptr_null(k3_tmap_find(&m, "language_model.model.layers.14.block_sparse_moe.experts.256.w3.weight_packed"));
  ck_assert_ptr_null(k3_tmap_find(&m, "language_model.model.layers.16.input_layernorm.weight"));
  k3_tmap_free(&m);
}
END_TEST

START_TEST(test_check_view) {
  k3_model_config_t c;
  load("tiny", &c);
  k3_tmap_t m;
  char err[256], why[256];
  ck_assert_int_eq(k3_tmap_plan(&c, &m, err, sizeof err), 0);
  const k3_tmap_entry_t *a = need(&m, "language_model.model.layers.0.self_attn.A_log", K3_DT_F32, 1, SH(128));
  k3_tensor_view_t v = {.dtype = K3_DT_F32, .ndim = 1, .shape = {4}};
  ck_assert_int_eq(k3_tmap_check_view(&c, a, &v, why, sizeof why), 0); /* any length >= heads */
  v.shape[0] = 3;
  ck_assert_int_eq(k3_tmap_check_view(&c, a, &v, why, sizeof why), K3_EFORMAT);
  ck_assert_str_eq(why, "expected F32 [n >= 4], found F32 [3]");
  const k3_tmap_entry_t *q = need(&m, "language_model.model.layers.3.self_attn.q_b_proj.weight", K3_DT_BF16, 2, SH(192, 96));
  k3_tensor_view_t w = {.dtype = K3_DT_F16, .ndim = 2, .shape = {192, 96}};
  ck_assert_int_eq(k3_tmap_check_view(&c, q, &w, why, sizeof why), K3_EFORMAT);
  ck_assert_str_eq(why, "expected BF16 [192,96], found F16 [192,96]");
  ck_assert_uint_eq(m.total_params, 7797488ull); /* "7.8 M params" (spec §11.1) */
  k3_tmap_free(&m);
  load("tiny-48b", &c);
  ck_assert_int_eq(k3_tmap_plan(&c, &m, err, sizeof err), 0);
  ck_assert_uint_eq(m.total_params, 8561940ull); /* "8.56 M params" (48B spec §10) */
  k3_tmap_free(&m);
}
END_TEST

START_TEST(test_manifest_sizes) {
  k3_model_config_t c;
  load("k3-config.json", &c);
  k3_manifest_t m;
  ck_assert_int_eq(k3_manifest_build(&c, 64, &m), 0);
  ck_assert_uint_eq(m.n, 24 + 69 * 4);
  ck_assert_uint_eq(m.kda_bytes_per_slot, 449372160ull);
  ck_assert_uint_eq(m.mla_bytes_per_token, 27648ull);
  ck_assert_uint_eq(m.mla_bytes_per_page, 64ull * 27648);
  ck_assert_uint_eq(k3_manifest_handoff_bytes(&m, 1024), 449372160ull + 1024ull * 27648);
  ck_assert_uint_eq(k3_manifest_handoff_bytes(&m, 65), 449372160ull + 128ull * 27648);
  ck_assert_str_eq(m.regions[0].name, "L0.kda.state");
  ck_assert_int_eq(m.regions[0].dtype, K3_DT_F32);
  ck_assert_uint_eq(m.regions[0].bytes, 6291456ull);
  ck_assert_str_eq(m.regions[1].name, "L0.kda.conv_q");
  ck_assert_int_eq(m.regions[1].shape[0], 12288);
  ck_assert_int_eq(m.regions[1].shape[1], 3);
  ck_assert_uint_eq(m.regions[1].bytes + m.regions[2].bytes + m.regions[3].bytes, 221184ull);
  ck_assert_str_eq(m.regions[12].name, "L3.mla.latent");
  ck_assert_int_eq(m.regions[12].shape[1], 576);
  ck_assert_uint_eq(m.regions[12].bytes, 64ull * 1152);
  ck_assert_int_eq(m.regions[m.n - 1].layer, 92);
  ck_assert_int_eq(m.regions[m.n - 1].kind_index, 23);
  uint64_t fp = m.fingerprint;
  k3_manifest_free(&m);
  ck_assert_int_eq(k3_manifest_build(&c, 64, &m), 0);
  ck_assert_uint_eq(m.fingerprint, fp); /* stable */
  k3_manifest_free(&m);
  ck_assert_int_eq(k3_manifest_build(&c, 32, &m), 0);
  ck_assert_uint_ne(m.fingerprint, fp); /* page size is part of it */
  k3_manifest_free(&m);
  c.router_bias_in_weights = true;
  ck_assert_int_eq(k3_manifest_build(&c, 64, &m), 0);
  ck_assert_uint_ne(m.fingerprint, fp); /* so is every architecture field */
  k3_manifest_free(&m);
  ck_assert_int_eq(k3_manifest_build(&c, 0, &m), K3_EINVAL);

  load("48b-config.json", &c);
  ck_assert_int_eq(k3_manifest_build(&c, 16, &m), 0);
  ck_assert_uint_eq(m.kda_bytes_per_slot, 43417600ull);
  ck_assert_uint_eq(m.mla_bytes_per_token, 8064ull);
  ck_assert_uint_eq(m.n, 7 + 20 * 4);
  k3_manifest_free(&m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt_tmap");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_real_k3_map);
  tcase_add_test(tc, test_real_48b_map);
  tcase_add_test(tc, test_medium_dry_run);
  tcase_add_test(tc, test_check_view);
  tcase_add_test(tc, test_manifest_sizes);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
