/* Model-runner invariants on the tiny presets (K3 `tiny` and `tiny-48b`), synthetic weights
 * with seed 1 (k3_weights_synth == what k3pd-mkckpt writes):
 *   - prefill(T) == prefill(T-k) + k decode steps (fp32: 1e-5 relative; bf16: see BF16_TOL);
 *   - a sequence's logits are bit-identical alone and batched with others of other lengths;
 *   - export -> import into a fresh slot/pages -> continue == never exported, bit for bit;
 *   - chunked prefill (64-token rounds) == one-shot prefill, bit for bit;
 *   - the reference backend equals the fast one (bit for bit: k3k keeps the summation order);
 *   - golden logits / greedy ids from tests/model/data (K3PD_REGEN_GOLDEN=1 rewrites them);
 *   - bf16 vs fp32: teacher-forced logits within tolerance, per-layer state deviation printed.
 * The long-sequence sweeps use cpu-fast to stay fast under ASan; the reference is covered by
 * the backend-equality and golden tests. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/weights.h"

static const char *PRESETS[2] = {"tiny", "tiny-48b"};
static k3_weights_t *g_w[2];

/* bf16 mode: prefill and decode take different KDA (chunked WY vs recurrent) and MLA
 * (non-absorbed vs absorbed) paths whose fp32-internal differences are re-rounded to bf16 at
 * every stored activation; one bf16 ulp is 2^-8 = 0.4% relative, and the block residual mixes
 * amplify it through depth. 3% of the logit range bounds this comfortably on the tiny models
 * (measured max: printed by the test) while any real bug (wrong state, leaked token) gives
 * O(1) differences. */
#define BF16_TOL 3e-2

/* Both presets' weights are synthesised once in main(), before Check forks a child per test,
 * so every test shares them instead of re-synthesising (seconds each under ASan). */
static int load_weights(void) {
  for (int p = 0; p < 2; p++) {
    const char *json = k3_model_config_preset(PRESETS[p]);
    k3_model_config_t cfg;
    char err[512] = "";
    int rc = json ? k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err) : K3_ENOENT;
    if (!rc) rc = k3_weights_synth(&cfg, 1, &g_w[p], err, sizeof err);
    if (rc) {
      fprintf(stderr, "test_model: cannot synthesise %s weights: %s (%s)\n", PRESETS[p], err,
              k3_strerror(rc));
      return rc;
    }
  }
  return 0;
}

static k3_weights_t *weights(int p) {
  ck_assert_ptr_nonnull(g_w[p]);
  return g_w[p];
}

static k3_runner_t *mk(int p, k3_runner_precision_t prec, const char *be, int page_tokens,
                       int chunk) {
  k3_runner_opts_t o;
  k3_runner_opts_default(&o);
  o.precision = prec;
  o.backend = be;
  o.threads = 2;
  o.page_tokens = page_tokens;
  o.num_pages = 64;
  o.num_slots = 8;
  o.max_batch_seqs = 8;
  o.prefill_chunk_tokens = chunk;
  k3_runner_t *r = NULL;
  char err[512];
  int rc = k3_runner_init(weights(p), &o, &r, err, sizeof err);
  ck_assert_msg(rc == 0, "runner init: %s", err);
  return r;
}

/* Deterministic prompt: token t of stream s. */
static int32_t tok(int s, int64_t t) { return (int32_t)((s * 977 + t * 131 + 7) % 4000); }

typedef struct {
  k3_seq_t seq;
  int32_t pages[64];
} tseq_t;

static void seq_init(k3_runner_t *r, tseq_t *s, int64_t total) {
  memset(s, 0, sizeof *s);
  s->seq.slot = -1;
  s->seq.pages = s->pages;
  s->seq.cap_pages = 64;
  ck_assert_int_eq(k3_runner_seq_reserve(r, &s->seq, total), 0);
}

static void prefill1(k3_runner_t *r, tseq_t *s, int stream, int64_t from, int64_t n, float *lg) {
  int32_t *ids = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) ids[i] = tok(stream, from + i);
  k3_prefill_item_t it = {&s->seq, ids, n, lg, false};
  char err[512];
  int rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err);
  ck_assert_msg(rc == 0, "prefill: %s", err);
  free(ids);
}

static void decode1(k3_runner_t *r, tseq_t *s, int32_t id, float *lg) {
  k3_decode_item_t d = {.seq = &s->seq, .token = id, .logits = lg};
  char err[512];
  int rc = k3_runner_decode_step(r, &d, 1, err, sizeof err);
  ck_assert_msg(rc == 0, "decode: %s", err);
}

/* max |a-b| / max |a| */
static double rel_diff(const float *a, const float *b, int64_t n) {
  double md = 0, ma = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > md) md = d;
    if (fabs(a[i]) > ma) ma = fabs(a[i]);
  }
  return ma > 0 ? md / ma : md;
}

/* prefill(T) vs prefill(T-k) + k decode steps feeding the same tokens */
static double prefill_vs_decode(int p, k3_runner_precision_t prec, int64_t T, int k) {
  k3_runner_t *r = mk(p, prec, "cpu-fast", 16, 256);
  int64_t V = k3_runner_vocab(r);
  float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
  tseq_t s1, s2;
  seq_init(r, &s1, T);
  seq_init(r, &s2, T);
  prefill1(r, &s1, 0, 0, T, a);
  if (T - k > 0) prefill1(r, &s2, 0, 0, T - k, NULL);
  for (int64_t t = T - k; t < T; t++) decode1(r, &s2, tok(0, t), b);
  ck_assert_int_eq(s1.seq.len, T);
  ck_assert_int_eq(s2.seq.len, T);
  double d = rel_diff(a, b, V);
  k3_runner_seq_release(r, &s1.seq);
  k3_runner_seq_release(r, &s2.seq);
  k3_runner_free(r);
  free(a);
  free(b);
  return d;
}

static const int64_t TS[6] = {1, 3, 63, 64, 65, 130};

START_TEST(test_prefill_vs_decode_fp32) {
  int p = _i;
  for (int j = 0; j < 6; j++) {
    int k = TS[j] < 3 ? (int)TS[j] : 3;
    double d = prefill_vs_decode(p, K3_RUNNER_FP32, TS[j], k);
    printf("[%s fp32] prefill(%lld) vs prefill(%lld)+%d decode: rel diff %.3g\n", PRESETS[p],
           (long long)TS[j], (long long)(TS[j] - k), k, d);
    ck_assert_msg(d < 1e-5, "%s T=%lld: rel diff %g", PRESETS[p], (long long)TS[j], d);
  }
}
END_TEST

START_TEST(test_prefill_vs_decode_bf16) {
  int p = _i;
  for (int j = 0; j < 6; j += 2) {
    int64_t T = TS[j + 1];
    double d = prefill_vs_decode(p, K3_RUNNER_BF16, T, 2);
    printf("[%s bf16] prefill(%lld) vs prefill(%lld)+2 decode: rel diff %.3g\n", PRESETS[p],
           (long long)T, (long long)(T - 2), d);
    ck_assert_msg(d < BF16_TOL, "%s T=%lld: rel diff %g", PRESETS[p], (long long)T, d);
  }
}
END_TEST

/* Batched with others of different lengths == alone, bit for bit (prefill, then decode). */
START_TEST(test_batch_invariance) {
  int p = _i;
  static const int64_t L[4] = {65, 3, 130, 1};
  k3_runner_t *r = mk(p, K3_RUNNER_FP32, "cpu-fast", 16, 64);
  int64_t V = k3_runner_vocab(r);
  float *alone = malloc((size_t)(4 * V) * 4), *batch = malloc((size_t)(4 * V) * 4);
  float *da = malloc((size_t)(4 * V) * 4), *db = malloc((size_t)(4 * V) * 4);
  for (int i = 0; i < 4; i++) {
    tseq_t s;
    seq_init(r, &s, L[i] + 1);
    prefill1(r, &s, i, 0, L[i], alone + i * V);
    decode1(r, &s, 5, da + i * V);
    k3_runner_seq_release(r, &s.seq);
  }
  tseq_t s[4];
  int32_t *ids[4];
  k3_prefill_item_t it[4];
  k3_decode_item_t d[4];
  for (int i = 0; i < 4; i++) {
    seq_init(r, &s[i], L[i] + 1);
    ids[i] = malloc((size_t)L[i] * 4);
    for (int64_t t = 0; t < L[i]; t++) ids[i][t] = tok(i, t);
    it[i] = (k3_prefill_item_t){&s[i].seq, ids[i], L[i], batch + i * V, false};
    d[i] = (k3_decode_item_t){.seq = &s[i].seq, .token = 5, .logits = db + i * V};
  }
  char err[512];
  ck_assert_msg(k3_runner_prefill(r, it, 4, NULL, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(k3_runner_decode_step(r, d, 4, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 4; i++) {
    ck_assert_msg(memcmp(alone + i * V, batch + i * V, (size_t)V * 4) == 0,
                  "%s: prefill of seq %d (len %lld) changed when batched", PRESETS[p], i, (long long)L[i]);
    ck_assert_msg(memcmp(da + i * V, db + i * V, (size_t)V * 4) == 0,
                  "%s: decode of seq %d changed when batched", PRESETS[p], i);
    k3_runner_seq_release(r, &s[i].seq);
    free(ids[i]);
  }
  ck_assert_int_eq(k3_runner_free_pages(r), 64);
  ck_assert_int_eq(k3_runner_free_slots(r), 8);
  k3_runner_free(r);
  free(alone);
  free(batch);
  free(da);
  free(db);
}
END_TEST

/* Sampling inside the decode step (k3_decode_item_t.sample) gives the token k3k_sample_row picks
 * from the same step's logits, greedy and drawn, for rows with and without logits wanted. */
START_TEST(test_step_sampling) {
  int p = _i;
  k3_runner_t *r = mk(p, K3_RUNNER_FP32, "cpu-fast", 16, 64);
  int64_t V = k3_runner_vocab(r);
  float *lg = malloc((size_t)(4 * V) * 4), *lg2 = malloc((size_t)(4 * V) * 4);
  tseq_t a[4], b[4];
  k3_decode_item_t da[4], db[4];
  k3k_sample_cfg_t cfg[4] = {{.temperature = 0}, {.temperature = 0.9f, .top_k = 50, .seed = 7, .step = 3},
                             {.temperature = 1.2f, .top_p = 0.9f, .seed = 11, .step = 1}, {.temperature = 0}};
  int32_t got[4] = {-1, -1, -1, -1};
  for (int i = 0; i < 4; i++) {
    seq_init(r, &a[i], 40);
    seq_init(r, &b[i], 40);
    prefill1(r, &a[i], i, 0, 9 + 5 * i, NULL);
    prefill1(r, &b[i], i, 0, 9 + 5 * i, NULL);
    da[i] = (k3_decode_item_t){.seq = &a[i].seq, .token = 7, .logits = lg + i * V};
    db[i] = (k3_decode_item_t){.seq = &b[i].seq, .token = 7, .logits = i == 3 ? lg2 + i * V : NULL,
                               .sample = &cfg[i], .sampled = &got[i]};
  }
  char err[512];
  ck_assert_msg(k3_runner_decode_step(r, da, 4, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(k3_runner_decode_step(r, db, 4, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 4; i++) {
    int32_t want = -2;
    ck_assert_int_eq(k3k_sample_row(lg + i * V, V, &cfg[i], &want), 0);
    ck_assert_msg(got[i] == want, "%s row %d: sampled in the step %d, from the logits %d", PRESETS[p], i, got[i],
                  want);
    k3_runner_seq_release(r, &a[i].seq);
    k3_runner_seq_release(r, &b[i].seq);
  }
  ck_assert_msg(memcmp(lg + 3 * V, lg2 + 3 * V, (size_t)V * 4) == 0, "row 3's logits differ");
  k3_runner_free(r);
  free(lg);
  free(lg2);
}
END_TEST

/* Layer callback: counts calls and checks they come in layer order. */
typedef struct {
  int calls, next;
} cb_t;
static int on_layer(int layer, void *ctx) {
  cb_t *c = ctx;
  if (layer != c->next) return K3_EINTERNAL;
  c->next++;
  c->calls++;
  return 0;
}

/* export -> import into a fresh slot/pages of another runner -> continue == uninterrupted. */
static void export_import(int p, k3_runner_precision_t prec) {
  k3_runner_t *r1 = mk(p, prec, "cpu-fast", 16, 64), *r2 = mk(p, prec, "cpu-fast", 16, 64);
  ck_assert_uint_eq(k3_runner_fingerprint(r1), k3_runner_fingerprint(r2));
  int64_t V = k3_runner_vocab(r1), T = 70;
  float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
  tseq_t s1, s2, burn;
  seq_init(r1, &s1, T + 4);
  seq_init(r2, &burn, 20); /* makes s2's slot and pages differ from s1's */
  seq_init(r2, &s2, T + 4);
  int32_t ids[70];
  for (int t = 0; t < T; t++) ids[t] = tok(3, t);
  k3_prefill_item_t it = {&s1.seq, ids, T, NULL, false};
  cb_t cb = {0, 0};
  char err[512];
  ck_assert_msg(k3_runner_prefill(r1, &it, 1, on_layer, &cb, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(cb.calls, k3_runner_config(r1)->num_layers); /* only in the last round */
  const k3_manifest_t *m = k3_runner_manifest(r1);
  s2.seq.len = s1.seq.len;
  for (size_t i = 0; i < m->n; i++) {
    uint64_t nb = k3_runner_region_bytes(r1, (int)i, s1.seq.len);
    ck_assert_uint_gt(nb, 0);
    void *buf = malloc(nb);
    ck_assert_int_eq(k3_runner_export_region(r1, &s1.seq, (int)i, buf, nb - 1), K3_ERANGE);
    ck_assert_int_eq(k3_runner_export_region(r1, &s1.seq, (int)i, buf, nb), 0);
    ck_assert_int_eq(k3_runner_import_region(r2, &s2.seq, (int)i, buf, nb), 0);
    free(buf);
  }
  for (int step = 0; step < 4; step++) {
    decode1(r1, &s1, (int32_t)(100 + step), a);
    decode1(r2, &s2, (int32_t)(100 + step), b);
    ck_assert_msg(memcmp(a, b, (size_t)V * 4) == 0, "%s: step %d differs after import", PRESETS[p], step);
  }
  k3_runner_free(r1);
  k3_runner_free(r2);
  free(a);
  free(b);
}

START_TEST(test_export_import) {
  export_import(_i, K3_RUNNER_FP32);
  export_import(_i, K3_RUNNER_BF16);
}
END_TEST

/* Chunked prefill (64-token rounds, and a manual split at 64) == one-shot, bit for bit. */
START_TEST(test_chunked_prefill) {
  int p = _i;
  k3_runner_t *one = mk(p, K3_RUNNER_FP32, "cpu-fast", 16, 256);
  k3_runner_t *chk = mk(p, K3_RUNNER_FP32, "cpu-fast", 16, 64);
  int64_t V = k3_runner_vocab(one), T = 130;
  float *a = malloc((size_t)(T * V) * 4), *b = malloc((size_t)(T * V) * 4), *c = malloc((size_t)V * 4);
  tseq_t s1, s2, s3;
  seq_init(one, &s1, T);
  seq_init(chk, &s2, T);
  seq_init(one, &s3, T);
  int32_t ids[130];
  for (int t = 0; t < T; t++) ids[t] = tok(1, t);
  k3_prefill_item_t i1 = {&s1.seq, ids, T, a, true}, i2 = {&s2.seq, ids, T, b, true};
  char err[512];
  ck_assert_msg(k3_runner_prefill(one, &i1, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(k3_runner_prefill(chk, &i2, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(memcmp(a, b, (size_t)(T * V) * 4) == 0, "%s: chunked prefill differs", PRESETS[p]);
  prefill1(one, &s3, 1, 0, 64, NULL);
  prefill1(one, &s3, 1, 64, T - 64, c);
  ck_assert_msg(memcmp(a + (T - 1) * V, c, (size_t)V * 4) == 0, "%s: split prefill differs", PRESETS[p]);
  k3_runner_free(one);
  k3_runner_free(chk);
  free(a);
  free(b);
  free(c);
}
END_TEST

/* Reference backend == fast backend (both precisions), small T to stay quick under ASan.
 * K3PD_FAST_MIN_WORK=0 makes cpu-fast use its worker threads even for these small shapes (by
 * default they run on the caller), so the threaded path is the one compared here; the other
 * tests run the default. Check forks each test, so the setting stays in this one. */
START_TEST(test_reference_vs_fast) {
  int p = _i;
  setenv("K3PD_FAST_MIN_WORK", "0", 1);
  for (int prec = 0; prec < 2; prec++) {
    k3_runner_t *rr = mk(p, (k3_runner_precision_t)prec, "cpu", 16, 64);
    k3_runner_t *rf = mk(p, (k3_runner_precision_t)prec, "cpu-fast", 16, 64);
    int64_t V = k3_runner_vocab(rr);
    float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    tseq_t s1, s2;
    seq_init(rr, &s1, 20);
    seq_init(rf, &s2, 20);
    prefill1(rr, &s1, 2, 0, 17, a);
    prefill1(rf, &s2, 2, 0, 17, b);
    double d0 = rel_diff(a, b, V);
    decode1(rr, &s1, 9, a);
    decode1(rf, &s2, 9, b);
    double d1 = rel_diff(a, b, V);
    printf("[%s %s] reference vs cpu-fast: prefill %.3g, decode %.3g\n", PRESETS[p],
           prec ? "bf16" : "fp32", d0, d1);
    ck_assert_msg(d0 < 1e-5 && d1 < 1e-5, "%s: reference vs fast %g %g", PRESETS[p], d0, d1);
    k3_runner_free(rr);
    k3_runner_free(rf);
    free(a);
    free(b);
  }
}
END_TEST

/* ---- golden values ------------------------------------------------------------------------
 * tests/model/data/golden_<preset>.txt: fp32 reference backend, seed-1 synthetic weights,
 * prompt tok(4, 0..15): selected last-position logits and 8 greedy ids. Regenerate with
 *   K3PD_REGEN_GOLDEN=1 ctest --test-dir build -R test_model
 * (writes into the source tree; commit the diff together with the change that explains it). */
static const int GIDX[8] = {0, 1, 17, 100, 1000, 2047, 3001, 4095};

static void golden_compute(int p, float *vals, int32_t *gids) {
  k3_runner_t *r = mk(p, K3_RUNNER_FP32, "cpu", 16, 64);
  int64_t V = k3_runner_vocab(r);
  float *lg = malloc((size_t)V * 4);
  tseq_t s;
  seq_init(r, &s, 16 + 8);
  prefill1(r, &s, 4, 0, 16, lg);
  for (int i = 0; i < 8; i++) vals[i] = lg[GIDX[i]];
  k3k_sample_cfg_t sc = {0};
  for (int i = 0; i < 8; i++) {
    ck_assert_int_eq(k3k_sample_row(lg, V, &sc, &gids[i]), 0);
    if (i < 7) decode1(r, &s, gids[i], lg);
  }
  k3_runner_free(r);
  free(lg);
}

START_TEST(test_golden) {
  int p = _i;
  float vals[8];
  int32_t gids[8];
  golden_compute(p, vals, gids);
  const char *src = getenv("K3PD_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/model/data/golden_%s.txt", src ? src : ".", PRESETS[p]);
  if (getenv("K3PD_REGEN_GOLDEN")) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# k3pd runner golden values: preset %s, synthetic seed 1, fp32, backend cpu,\n"
               "# prompt tok(4,0..15) (tests/model/test_model.c); regenerate: K3PD_REGEN_GOLDEN=1\n",
            PRESETS[p]);
    for (int i = 0; i < 8; i++) fprintf(f, "logit %d %.9g\n", GIDX[i], vals[i]);
    fprintf(f, "ids");
    for (int i = 0; i < 8; i++) fprintf(f, " %d", gids[i]);
    fprintf(f, "\n");
    fclose(f);
    printf("[%s] golden values rewritten: %s\n", PRESETS[p], path);
    return;
  }
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "missing golden file %s", path);
  char line[512];
  int nl = 0, ni = 0;
  while (fgets(line, sizeof line, f)) {
    int idx;
    float v;
    if (sscanf(line, "logit %d %f", &idx, &v) == 2) {
      ck_assert_int_eq(idx, GIDX[nl]);
      double tol = 1e-5 * (fabs(v) > 1 ? fabs(v) : 1);
      ck_assert_msg(fabs(vals[nl] - v) <= tol, "%s: golden logit[%d] = %.9g, now %.9g", PRESETS[p],
                    idx, v, vals[nl]);
      nl++;
    } else if (!strncmp(line, "ids", 3)) {
      char *q = line + 3;
      for (ni = 0; ni < 8; ni++) {
        long id = strtol(q, &q, 10);
        ck_assert_msg(id == gids[ni], "%s: golden greedy id %d = %ld, now %d", PRESETS[p], ni, id,
                      gids[ni]);
      }
    }
  }
  fclose(f);
  ck_assert_int_eq(nl, 8);
  ck_assert_int_eq(ni, 8);
}
END_TEST

/* bf16 vs fp32: teacher-forced logits of every prompt position within tolerance, and the
 * per-layer deviation of the exported decode state printed (relative L2). */
static void region_floats(const k3_runner_t *r, const k3_seq_t *s, int i, float **out, size_t *n) {
  uint64_t nb = k3_runner_region_bytes(r, i, s->len);
  void *buf = malloc(nb);
  ck_assert_int_eq(k3_runner_export_region(r, s, i, buf, nb), 0);
  k3_dtype_t dt = k3_runner_manifest(r)->regions[i].dtype;
  *n = nb / k3_dtype_size(dt);
  *out = malloc(*n * 4);
  for (size_t j = 0; j < *n; j++)
    (*out)[j] = dt == K3_DT_F32 ? ((float *)buf)[j] : k3_bf16_to_f32(((uint16_t *)buf)[j]);
  free(buf);
}

START_TEST(test_bf16_vs_fp32) {
  int p = _i;
  k3_runner_t *r32 = mk(p, K3_RUNNER_FP32, "cpu-fast", 16, 64);
  k3_runner_t *r16 = mk(p, K3_RUNNER_BF16, "cpu-fast", 16, 64);
  ck_assert_uint_ne(k3_runner_fingerprint(r32), k3_runner_fingerprint(r16));
  int64_t V = k3_runner_vocab(r32), T = 64;
  float *a = malloc((size_t)(T * V) * 4), *b = malloc((size_t)(T * V) * 4);
  tseq_t s1, s2;
  seq_init(r32, &s1, T);
  seq_init(r16, &s2, T);
  int32_t ids[64];
  for (int t = 0; t < T; t++) ids[t] = tok(5, t);
  k3_prefill_item_t i1 = {&s1.seq, ids, T, a, true}, i2 = {&s2.seq, ids, T, b, true};
  char err[512];
  ck_assert_msg(k3_runner_prefill(r32, &i1, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(k3_runner_prefill(r16, &i2, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
  double worst = 0, sum = 0;
  for (int64_t t = 0; t < T; t++) {
    double d = rel_diff(a + t * V, b + t * V, V);
    sum += d;
    if (d > worst) worst = d;
  }
  printf("[%s] bf16 vs fp32 teacher-forced logits over %lld positions: max rel %.3g, mean %.3g\n",
         PRESETS[p], (long long)T, worst, sum / T);
  const k3_manifest_t *m = k3_runner_manifest(r32);
  for (size_t i = 0; i < m->n; i++) {
    float *x, *y;
    size_t nx, ny;
    region_floats(r32, &s1.seq, (int)i, &x, &nx);
    region_floats(r16, &s2.seq, (int)i, &y, &ny);
    ck_assert_uint_eq(nx, ny);
    double num = 0, den = 0;
    for (size_t j = 0; j < nx; j++) {
      num += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
      den += (double)x[j] * x[j];
    }
    printf("[%s] bf16 vs fp32 layer %d %-14s rel L2 %.3g\n", PRESETS[p], m->regions[i].layer,
           m->regions[i].name, den > 0 ? sqrt(num / den) : sqrt(num));
    ck_assert(den > 0);
    /* layer 0 sees only a few bf16 roundings (~1 ulp = 0.4%); deeper layers amplify them and
     * flip near-tied experts of the random tiny models (measured up to ~16% at layer 5) */
    double lim = m->regions[i].layer == 0 ? 0.02 : 0.5;
    ck_assert_msg(sqrt(num / den) < lim, "%s: state %s deviates %g", PRESETS[p], m->regions[i].name,
                  sqrt(num / den));
    free(x);
    free(y);
  }
  /* measured: tiny max 0.62 / mean 0.24 (flipped experts at a few positions), tiny-48b 0.14 /
   * 0.05; a wrong state dtype, a leaked token or a missing rounding point is O(1) everywhere */
  ck_assert_msg(worst < 1.0 && sum / T < 0.35, "%s: bf16 vs fp32 logits max rel %g mean %g",
                PRESETS[p], worst, sum / T);
  k3_runner_free(r32);
  k3_runner_free(r16);
  free(a);
  free(b);
}
END_TEST

/* Bad input is rejected with nothing changed. */
START_TEST(test_errors) {
  int p = _i;
  k3_runner_t *r = mk(p, K3_RUNNER_FP32, "cpu", 16, 64);
  char err[512];
  tseq_t s;
  seq_init(r, &s, 10);
  int32_t bad[2] = {1, 5000};
  k3_prefill_item_t it = {&s.seq, bad, 2, NULL, false};
  ck_assert_int_eq(k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "token"));
  int32_t ok[20] = {0};
  it = (k3_prefill_item_t){&s.seq, ok, 20, NULL, false};
  if (k3_runner_config(r)->num_mla > 0)
    ck_assert_int_eq(k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err), K3_ECAPACITY);
  ck_assert_int_eq(s.seq.len, 0);
  ck_assert_int_eq(k3_runner_slot_free(r, 7), K3_EINVAL);
  int32_t pg = 63;
  ck_assert_int_eq(k3_runner_pages_free(r, 1, &pg), K3_EINVAL);
  k3_runner_free(r);
  k3_runner_opts_t o;
  k3_runner_opts_default(&o);
  o.backend = "nope";
  k3_runner_t *r2 = NULL;
  ck_assert_int_eq(k3_runner_init(weights(p), &o, &r2, err, sizeof err), K3_ENOTSUP);
  ck_assert_ptr_null(r2);
  ck_assert_ptr_nonnull(strstr(err, "nope"));
}
END_TEST

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive a failing forked test */
  if (load_weights()) return 1;
  Suite *su = suite_create("model");
  struct {
    const char *name;
    const TTest *fn;
  } tests[] = {{"prefill_vs_decode_fp32", test_prefill_vs_decode_fp32},
               {"prefill_vs_decode_bf16", test_prefill_vs_decode_bf16},
               {"batch_invariance", test_batch_invariance},
               {"step_sampling", test_step_sampling},
               {"export_import", test_export_import},
               {"chunked_prefill", test_chunked_prefill},
               {"reference_vs_fast", test_reference_vs_fast},
               {"golden", test_golden},
               {"bf16_vs_fp32", test_bf16_vs_fp32},
               {"errors", test_errors}};
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    TCase *tc = tcase_create(tests[i].name);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, tests[i].fn, 0, 2);
    suite_add_tcase(su, tc);
  }
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int p = 0; p < 2; p++) k3_weights_free(g_w[p]);
  k3k_backends_shutdown();
  return failed ? 1 : 0;
}
