/* Round trip k3pd-mkckpt -> loader for tiny and tiny-48b: every planned tensor present with the
 * right shape/dtype, bytes equal to the in-memory synthetic generator, deterministic per seed;
 * MXFP4 experts dequantize to the quantized masters; a damaged checkpoint reports every problem
 * at once. Runs the real binary (path compiled in as MKCKPT_PATH). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/mxfp4.h"
#include "k3pd/safetensors.h"
#include "k3pd/synth.h"
#include "k3pd/util.h"
#include "k3pd/weights.h"

static char g_dir[256];

static void run_mkckpt(const char *args) {
  char cmd[4096];
  int n = snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s/mk.err", MKCKPT_PATH, args, g_dir);
  ck_assert_msg(n > 0 && (size_t)n < sizeof cmd, "command too long: %s", args);
  ck_assert_msg(system(cmd) == 0, "failed: %s", cmd);
}

static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/k3rt.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
}
static void teardown(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
}

static void roundtrip(const char *preset, int expect_shards) {
  char args[512], out[300], err[8192];
  snprintf(out, sizeof out, "%s/%s", g_dir, preset);
  snprintf(args, sizeof args, "--preset %s --out %s --seed 7 --shard-size 3M", preset, out);
  run_mkckpt(args);
  char shard[400];
  snprintf(shard, sizeof shard, "%s/model-%05d-of-%05d.safetensors", out, expect_shards, expect_shards);
  ck_assert_msg(access(shard, F_OK) == 0, "no %s", shard);
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  int rc = k3_weights_open_dir(out, &cfg, &w, err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
  k3_weights_t *s = NULL;
  /* 3 workers here (mkckpt used its default): files == in-memory bytes for any thread count;
   * test_ckpt_synth_mt shows k3_weights_synth (1 thread) == any N. */
  k3_weights_synth_opts_t so = {.threads = 3};
  ck_assert_int_eq(k3_weights_synth_opts(&cfg, 7, &so, &s, err, sizeof err), 0);
  const k3_tmap_t *m = k3_weights_tmap(w);
  ck_assert_uint_gt(m->n, 100);
  for (size_t i = 0; i < m->n; i++) {
    const k3_tmap_entry_t *e = &m->entries[i];
    const k3_tensor_view_t *a = k3_weights_get_full(w, e->name), *b = k3_weights_get(s, e->short_name);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(a->dtype, e->dtype);
    ck_assert_int_eq(a->ndim, e->ndim);
    for (int d = 0; d < e->ndim; d++) ck_assert_int_eq(a->shape[d], e->shape[d]);
    ck_assert_uint_eq(a->nbytes, e->nbytes);
    ck_assert_msg(memcmp(a->data, b->data, a->nbytes) == 0, "bytes differ: %s", e->name);
  }
  /* seed matters; the same seed again gives the same bytes */
  k3_weights_t *s2 = NULL;
  ck_assert_int_eq(k3_weights_synth(&cfg, 8, &s2, err, sizeof err), 0);
  const k3_tensor_view_t *e1 = k3_weights_get(s, "model.embed_tokens.weight"), *e2 = k3_weights_get(s2, "model.embed_tokens.weight");
  ck_assert(memcmp(e1->data, e2->data, e1->nbytes) != 0);
  k3_weights_free(s2);
  k3_weights_free(s);
  k3_weights_free(w);
}

START_TEST(test_tiny) {
  roundtrip("tiny", 4);
  char err[4096], out[300];
  snprintf(out, sizeof out, "%s/tiny", g_dir);
  k3_model_config_t cfg;
  k3_weights_t *w;
  ck_assert_int_eq(k3_weights_open_dir(out, &cfg, &w, err, sizeof err), 0);
  /* values follow the spec distributions */
  const k3_tensor_view_t *al = k3_weights_get(w, "model.layers.0.self_attn.A_log");
  const float *a = al->data;
  for (int i = 0; i < 128; i++) {
    if (i < 4)
      ck_assert(a[i] >= 0.0f && a[i] <= logf(16.0f));
    else
      ck_assert(a[i] == 0.0f);
  }
  const float *dt = k3_weights_get(w, "model.layers.1.self_attn.dt_bias")->data;
  for (int i = 0; i < 128; i++) ck_assert(dt[i] >= -7.0f && dt[i] <= -2.0f);
  /* MXFP4: dequantized expert row == quantized bf16 masters of the generator */
  const k3_tmap_t *m = k3_weights_tmap(w);
  const k3_tmap_entry_t *pe = NULL;
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->entries[i].short_name, "model.layers.2.block_sparse_moe.experts.5.w2.weight_packed") == 0) pe = &m->entries[i];
  ck_assert_ptr_nonnull(pe);
  const k3_tensor_view_t *pk = k3_weights_get(w, "model.layers.2.block_sparse_moe.experts.5.w2.weight_packed");
  const k3_tensor_view_t *sc = k3_weights_get(w, "model.layers.2.block_sparse_moe.experts.5.w2.weight_scale");
  ck_assert_int_eq(pk->shape[0], 128);
  ck_assert_int_eq(pk->shape[1], 32);
  ck_assert_int_eq(sc->shape[1], 2);
  int64_t K = 64;
  for (int64_t n = 0; n < 128; n++) {
    float deq[64], master[64], want[64];
    uint8_t p[32], s[2];
    ck_assert_int_eq(k3_mxfp4_dequant_row((const uint8_t *)pk->data + n * 32, (const uint8_t *)sc->data + n * 2, K, deq, NULL), 0);
    for (int k = 0; k < K; k++) master[k] = k3_synth_value(&cfg, pe, 7, (uint64_t)(n * K + k));
    ck_assert_int_eq(k3_mxfp4_quantize_row(master, K, p, s), 0);
    ck_assert_int_eq(k3_mxfp4_dequant_row(p, s, K, want, NULL), 0);
    for (int k = 0; k < K; k++) ck_assert(deq[k] == want[k]);
  }
  double sum = 0, sq = 0;
  const uint16_t *q = k3_weights_get(w, "model.layers.0.self_attn.q_proj.weight")->data;
  for (int i = 0; i < 128 * 256; i++) {
    double x = k3_bf16_to_f32(q[i]);
    sum += x;
    sq += x * x;
  }
  double sd = sqrt(sq / (128 * 256));
  ck_assert_msg(sd > 0.019 && sd < 0.021 && fabs(sum / (128 * 256)) < 0.001, "sd %g", sd);
  ck_assert_ptr_null(k3_weights_get(w, "model.layers.0.block_sparse_moe.gate.weight"));
  ck_assert_int_eq(k3_weights_config(w)->num_layers, 8);
  k3_weights_free(w);
}
END_TEST

START_TEST(test_tiny_48b) {
  roundtrip("tiny-48b", 6);
  char err[4096], out[300];
  snprintf(out, sizeof out, "%s/tiny-48b", g_dir);
  k3_weights_t *w;
  k3_model_config_t cfg;
  ck_assert_int_eq(k3_weights_open_dir(out, &cfg, &w, err, sizeof err), 0);
  const k3_tensor_view_t *al = k3_weights_get(w, "model.layers.0.self_attn.A_log");
  ck_assert_int_eq(al->ndim, 4);
  ck_assert_int_eq(al->shape[2], 4);
  const float *dt = k3_weights_get(w, "model.layers.1.self_attn.dt_bias")->data;
  for (int i = 0; i < 128; i++) ck_assert(dt[i] >= -4.0f && dt[i] <= 1.0f);
  ck_assert_int_eq(k3_weights_get(w, "model.layers.0.self_attn.q_conv1d.weight")->dtype, K3_DT_BF16);
  k3_weights_free(w);
}
END_TEST

START_TEST(test_deterministic_files) {
  char a[300], b[300], args[700];
  snprintf(a, sizeof a, "%s/a", g_dir);
  snprintf(b, sizeof b, "%s/b", g_dir);
  snprintf(args, sizeof args, "--preset tiny --out %s --seed 3 --threads 1", a);
  run_mkckpt(args);
  snprintf(args, sizeof args, "--preset tiny --out %s --seed 3 --threads 2", b);
  run_mkckpt(args);
  char cmd[2000];
  snprintf(cmd, sizeof cmd, "cmp -s %s/model-00001-of-00001.safetensors %s/model-00001-of-00001.safetensors && "
           "cmp -s %s/model.safetensors.index.json %s/model.safetensors.index.json", a, b, a, b);
  ck_assert_int_eq(system(cmd), 0);
  /* config.json is the spec's tiny text verbatim */
  char p[400], *txt;
  size_t len;
  snprintf(p, sizeof p, "%s/config.json", a);
  ck_assert_int_eq(k3_read_file(p, &txt, &len), 0);
  ck_assert_str_eq(txt, k3_model_config_preset("tiny"));
  free(txt);
}
END_TEST

START_TEST(test_damaged_reports_all) {
  char out[300], err[8192], args[600];
  snprintf(out, sizeof out, "%s/d", g_dir);
  snprintf(args, sizeof args, "--preset tiny --out %s --seed 1", out);
  run_mkckpt(args);
  /* Rewrite the single shard without two tensors, with one wrong dtype and one extra tensor. */
  char shard[400], tmpd[400];
  snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", out);
  k3_st_t *st;
  ck_assert_int_eq(k3_st_open(shard, &st, err, sizeof err), 0);
  size_t n = k3_st_count(st);
  k3_st_decl_t *d = calloc(n + 2, sizeof *d);
  const void **src = calloc(n + 2, sizeof *src);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const k3_tensor_view_t *v = k3_st_at(st, i);
    if (strstr(v->name, "layers.2.self_attn.q_proj.weight") || strstr(v->name, "layers.7.self_attn.kv_b_proj.weight")) continue;
    d[k] = (k3_st_decl_t){v->name, v->dtype, v->ndim, {0}};
    memcpy(d[k].shape, v->shape, sizeof d[k].shape);
    if (strstr(v->name, "layers.1.self_attn.dt_bias")) d[k].dtype = K3_DT_U8, d[k].shape[0] *= 4;
    src[k++] = v->data;
  }
  static const uint8_t zero[16] = {0};
  d[k] = (k3_st_decl_t){"language_model.model.layers.0.bogus.weight", K3_DT_U8, 1, {16}};
  src[k++] = zero;
  d[k] = (k3_st_decl_t){"language_model.vision_tower.blocks.0.weight", K3_DT_U8, 1, {16}};
  src[k++] = zero;
  snprintf(tmpd, sizeof tmpd, "%s/new.safetensors", out);
  k3_st_writer_t *wr;
  ck_assert_int_eq(k3_st_writer_open(tmpd, d, k, NULL, 0, &wr, err, sizeof err), 0);
  uint64_t total = 0;
  for (size_t i = 0; i < k; i++) {
    uint64_t nb = k3_st_decl_bytes(&d[i]);
    ck_assert_int_eq(k3_st_writer_write(wr, src[i], nb, err, sizeof err), 0);
    total += nb;
  }
  ck_assert_int_eq(k3_st_writer_close(wr, err, sizeof err), 0);
  k3_st_close(st);
  free(d);
  free(src);
  ck_assert_int_eq(rename(tmpd, shard), 0);
  /* no index: the single file is found as model.safetensors */
  char idx[400], single[400];
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out);
  snprintf(single, sizeof single, "%s/model.safetensors", out);
  ck_assert_int_eq(unlink(idx), 0);
  ck_assert_int_eq(rename(shard, single), 0);
  k3_weights_t *w = NULL;
  ck_assert_int_eq(k3_weights_open_dir(out, NULL, &w, err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_null(w);
  ck_assert_ptr_nonnull(strstr(err, "missing tensor 'language_model.model.layers.2.self_attn.q_proj.weight'"));
  ck_assert_ptr_nonnull(strstr(err, "missing tensor 'language_model.model.layers.7.self_attn.kv_b_proj.weight'"));
  ck_assert_ptr_nonnull(strstr(err, "tensor 'language_model.model.layers.1.self_attn.dt_bias' in "));
  ck_assert_ptr_nonnull(strstr(err, "expected F32 [128], found U8 [512]"));
  ck_assert_ptr_nonnull(strstr(err, "unexpected tensor 'language_model.model.layers.0.bogus.weight'"));
  ck_assert_ptr_null(strstr(err, "vision_tower"));
  ck_assert_ptr_nonnull(strstr(err, "(4 problems)"));
  /* a bad config.json is reported with its path */
  char cfgp[400];
  snprintf(cfgp, sizeof cfgp, "%s/config.json", out);
  ck_assert_int_eq(k3_write_file(cfgp, "{\"model_type\":\"kimi_k3\"}", 24), 0);
  ck_assert_int_eq(k3_weights_open_dir(out, NULL, &w, err, sizeof err), K3_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "config.json: config: missing key 'text_config'"));
  (void)total;
}
END_TEST

START_TEST(test_cli_errors) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "%s --preset nope --out %s/x >/dev/null 2>&1", MKCKPT_PATH, g_dir);
  ck_assert_int_ne(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "%s --preset tiny >/dev/null 2>&1", MKCKPT_PATH);
  ck_assert_int_ne(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "%s --preset medium --dry-run | grep -q '^bytes           91605235712 '", MKCKPT_PATH);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "%s --preset medium --dry-run --list | grep -c ' model-' | grep -q '^23464$'", MKCKPT_PATH);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt_roundtrip");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_tiny);
  tcase_add_test(tc, test_tiny_48b);
  tcase_add_test(tc, test_deterministic_files);
  tcase_add_test(tc, test_damaged_reports_all);
  tcase_add_test(tc, test_cli_errors);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
