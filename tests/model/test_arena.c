/* The runner's state arena and the one model loader, on the CPU (label `model`):
 *   - every manifest region's pool lies inside the state arena, 256-byte aligned, and no two
 *     overlap (both presets, fp32 and bf16);
 *   - a caller-supplied allocator (how the decode worker hands in UCX-allocated memory) is called
 *     once with the arena's size, its memory is used (prefill + decode give the same logits as
 *     the backend's allocator, bit for bit) and it is freed once, at k3_runner_free, with the
 *     same pointer; a misaligned one is refused and its memory handed back; bad combinations
 *     (alloc without free, alloc + vmm, vmm on a host backend) are refused before anything is
 *     allocated;
 *   - the loader: the one default set, errors that name the flag, --device/--backend aliasing,
 *     --gpu against K3PD_CUDA_DEVICE, cuda-only flags refused elsewhere, a synthetic load, and
 *     --backend cuda without a CUDA backend failing with the device named. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3_load.h"
#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/weights.h"

static k3_weights_t *g_w[2];
static const char *g_presets[2] = {"tiny", "tiny-48b"};

static k3_weights_t *weights(int p) {
  if (!g_w[p]) {
    k3_model_config_t cfg;
    char err[512];
    const char *json = k3_model_config_preset(g_presets[p]);
    ck_assert_ptr_nonnull(json);
    ck_assert_int_eq(k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err), 0);
    ck_assert_msg(k3_weights_synth(&cfg, 1, &g_w[p], err, sizeof err) == 0, "%s", err);
  }
  return g_w[p];
}

static void check_layout(const k3_runner_t *r) {
  void *base = NULL;
  size_t bytes = 0;
  k3_runner_state_arena(r, &base, &bytes);
  ck_assert_ptr_nonnull(base);
  ck_assert_uint_gt(bytes, 0);
  ck_assert_ptr_null(k3_runner_state_vmm(r));
  const k3_manifest_t *m = k3_runner_manifest(r);
  const uintptr_t lo = (uintptr_t)base, hi = lo + bytes;
  uint64_t sum = 0;
  for (size_t i = 0; i < m->n; i++) {
    void *b = NULL;
    size_t stride = 0, count = 0;
    ck_assert_int_eq(k3_runner_pool_mem(r, (int)i, &b, &stride, &count), 0);
    uintptr_t s = (uintptr_t)b, e = s + stride * count;
    ck_assert_msg(s >= lo && e <= hi, "region %s outside the arena", m->regions[i].name);
    ck_assert_uint_eq(s % 256, 0);
    ck_assert_uint_eq(stride, m->regions[i].bytes);
    sum += stride * count;
    for (size_t j = 0; j < i; j++) {
      void *b2 = NULL;
      size_t st2 = 0, c2 = 0;
      k3_runner_pool_mem(r, (int)j, &b2, &st2, &c2);
      uintptr_t s2 = (uintptr_t)b2, e2 = s2 + st2 * c2;
      ck_assert_msg(e <= s2 || e2 <= s, "regions %s and %s overlap", m->regions[i].name, m->regions[j].name);
    }
  }
  /* nothing but alignment padding besides the pools */
  ck_assert_uint_ge(bytes, sum);
  ck_assert_uint_le(bytes, sum + 256 * (m->n + 1));
}

START_TEST(test_regions_inside_arena) {
  for (int p = 0; p < 2; p++)
    for (int prec = 0; prec < 2; prec++) {
      k3_runner_opts_t o;
      k3_runner_opts_default(&o);
      o.precision = prec ? K3_RUNNER_BF16 : K3_RUNNER_FP32;
      o.num_pages = 13; /* odd sizes: offsets must still align */
      o.num_slots = 3;
      o.page_tokens = 16;
      k3_runner_t *r = NULL;
      char err[512];
      ck_assert_msg(k3_runner_init(weights(p), &o, &r, err, sizeof err) == 0, "%s", err);
      check_layout(r);
      void *wb = (void *)1;
      size_t wbytes = 1;
      k3_runner_weights_arena(r, &wb, &wbytes, NULL);
      ck_assert_ptr_null(wb); /* host backends bind views onto the weights */
      ck_assert_uint_eq(wbytes, 0);
      ck_assert_int_eq(k3_runner_weights_shared(r), 0);
      k3_runner_free(r);
    }
}
END_TEST

/* ---- a caller allocator that counts ---- */
typedef struct {
  int allocs, frees;
  size_t bytes;
  void *ptr, *freed;
  int misalign; /* return base + 64 */
  void *raw;
} ualloc_t;

static void *u_alloc(void *ud, size_t bytes) {
  ualloc_t *u = ud;
  u->allocs++;
  u->bytes = bytes;
  u->raw = aligned_alloc(4096, (bytes + 64 + 4095) / 4096 * 4096);
  u->ptr = u->raw ? (char *)u->raw + (u->misalign ? 64 : 0) : NULL;
  if (u->ptr) memset(u->ptr, 0xA5, bytes); /* garbage: the runner must zero it */
  return u->ptr;
}

static void u_free(void *ud, void *p) {
  ualloc_t *u = ud;
  u->frees++;
  u->freed = p;
  free(u->raw);
  u->raw = NULL;
}

/* prefill 5 tokens then 2 decode steps; returns the last logits (malloc'd) */
static float *run_seq(k3_runner_t *r) {
  int64_t V = k3_runner_vocab(r);
  float *lg = malloc((size_t)V * sizeof *lg);
  int32_t pages[8];
  k3_seq_t s = {.slot = -1, .pages = pages, .cap_pages = 8};
  ck_assert_int_eq(k3_runner_seq_reserve(r, &s, 7), 0);
  int32_t toks[5] = {3, 17, 5, 99, 12};
  k3_prefill_item_t it = {&s, toks, 5, lg, false};
  char err[512];
  ck_assert_msg(k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 2; i++) {
    k3_decode_item_t d = {.seq = &s, .token = 40 + i, .logits = lg};
    ck_assert_msg(k3_runner_decode_step(r, &d, 1, err, sizeof err) == 0, "%s", err);
  }
  k3_runner_seq_release(r, &s);
  return lg;
}

START_TEST(test_caller_allocator) {
  for (int p = 0; p < 2; p++) {
    k3_runner_opts_t o;
    k3_runner_opts_default(&o);
    o.page_tokens = 16;
    o.num_pages = 9;
    o.num_slots = 2;
    char err[512];
    k3_runner_t *ref = NULL, *r = NULL;
    ck_assert_msg(k3_runner_init(weights(p), &o, &ref, err, sizeof err) == 0, "%s", err);
    ualloc_t u = {0};
    o.state = (k3_runner_arena_opts_t){.alloc = u_alloc, .free = u_free, .ud = &u};
    ck_assert_msg(k3_runner_init(weights(p), &o, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(u.allocs, 1);
    ck_assert_int_eq(u.frees, 0);
    void *base;
    size_t bytes, ref_bytes;
    k3_runner_state_arena(r, &base, &bytes);
    k3_runner_state_arena(ref, NULL, &ref_bytes);
    ck_assert_ptr_eq(base, u.ptr);
    ck_assert_uint_eq(bytes, u.bytes);
    ck_assert_uint_eq(bytes, ref_bytes); /* the same layout whoever allocates */
    check_layout(r);
    float *a = run_seq(ref), *b = run_seq(r);
    ck_assert_int_eq(memcmp(a, b, (size_t)k3_runner_vocab(r) * sizeof(float)), 0);
    free(a), free(b);
    k3_runner_free(r);
    ck_assert_int_eq(u.frees, 1);
    ck_assert_ptr_eq(u.freed, u.ptr);
    k3_runner_free(ref);
  }
}
END_TEST

START_TEST(test_bad_arena_opts) {
  k3_runner_opts_t o;
  k3_runner_opts_default(&o);
  o.page_tokens = 16;
  char err[512];
  k3_runner_t *r = NULL;
  ualloc_t u = {.misalign = 1};
  o.state = (k3_runner_arena_opts_t){.alloc = u_alloc, .free = u_free, .ud = &u};
  ck_assert_int_eq(k3_runner_init(weights(0), &o, &r, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_null(r);
  ck_assert_ptr_nonnull(strstr(err, "aligned"));
  ck_assert_int_eq(u.allocs, 1);
  ck_assert_int_eq(u.frees, 1); /* handed back */
  ck_assert_ptr_eq(u.freed, u.ptr);
  memset(&u, 0, sizeof u);
  o.state = (k3_runner_arena_opts_t){.alloc = u_alloc, .ud = &u};
  ck_assert_int_eq(k3_runner_init(weights(0), &o, &r, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "alloc and free"));
  o.state = (k3_runner_arena_opts_t){.alloc = u_alloc, .free = u_free, .ud = &u, .vmm = true};
  ck_assert_int_eq(k3_runner_init(weights(0), &o, &r, err, sizeof err), K3_EINVAL);
  ck_assert_int_eq(u.allocs, 0);
  o.state = (k3_runner_arena_opts_t){.vmm = true};
  ck_assert_int_eq(k3_runner_init(weights(0), &o, &r, err, sizeof err), K3_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(err, "vmm"));
  /* shared weights are for device backends */
  o.state = (k3_runner_arena_opts_t){0};
  o.share_weights_dir = "/tmp/k3-arena-test-share";
  o.weights_source = "test";
  ck_assert_int_eq(k3_runner_init(weights(0), &o, &r, err, sizeof err), K3_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(err, "device backend"));
  ck_assert_ptr_null(r);
}
END_TEST

/* ---- the loader ---- */

static int parse(k3_load_opts_t *o, const char *const *args, int n, char *err, size_t errlen) {
  k3_flag_t f[K3_LOAD_NFLAGS];
  size_t nf = k3_load_flags(o, f);
  ck_assert_uint_le(nf, K3_LOAD_NFLAGS);
  char *argv[32] = {"prog"};
  for (int i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
  k3_flags_info_t info = {"prog", "test", NULL};
  int rc = k3_flags_parse(&info, f, nf, n + 1, argv, NULL, err, errlen);
  return rc ? rc : k3_load_check(o, err, errlen);
}

#define ARGS(...) (const char *const[]){__VA_ARGS__}, (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))

static void expect_err(bool alias, const char *const *args, int n, const char *needle) {
  k3_load_opts_t o;
  k3_load_opts_default(&o);
  o.device_alias = alias;
  char err[512] = "";
  ck_assert_int_ne(parse(&o, args, n, err, sizeof err), 0);
  ck_assert_msg(strstr(err, needle), "'%s' not in '%s'", needle, err);
}

START_TEST(test_loader_flags) {
  unsetenv("K3PD_CUDA_DEVICE");
  k3_load_opts_t o;
  k3_load_opts_default(&o);
  ck_assert_int_eq(o.page_tokens, 64);
  ck_assert_int_eq(o.seed_weights, 1);
  ck_assert_str_eq(o.backend, "cpu");
  char err[512];
  ck_assert_int_eq(parse(&o, ARGS("--synthetic", "tiny"), err, sizeof err), 0);
  ck_assert_str_eq(o.precision, "fp32"); /* fp32 off cuda */
  ck_assert_int_eq(o.gpu, 0);
  ck_assert_str_eq(k3_load_model_name(&o), "tiny");
  expect_err(false, ARGS("--synthetic", "tiny", "--model", "/x"), "exactly one of --model");
  expect_err(false, ARGS("--page-tokens", "0", "--synthetic", "tiny"), "--page-tokens");
  expect_err(false, ARGS("--prefill-chunk", "0", "--synthetic", "tiny"), "--prefill-chunk 1..1048576");
  expect_err(false, ARGS("--threads", "0", "--synthetic", "tiny"), "--threads");
  expect_err(false, ARGS("--num-pages", "-1", "--synthetic", "tiny"), "--num-pages");
  expect_err(false, ARGS("--precision", "fp16", "--synthetic", "tiny"), "--precision");
  expect_err(false, ARGS("--backend", "tpu", "--synthetic", "tiny"), "unknown --backend 'tpu'");
  expect_err(false, ARGS("--backend", "cuda", "--precision", "fp32", "--synthetic", "tiny"), "bf16 only");
  expect_err(false, ARGS("--share-weights", "/tmp/x", "--synthetic", "tiny"), "--share-weights needs --backend cuda");
  expect_err(false, ARGS("--host-synth", "--synthetic", "tiny"), "--host-synth");
  expect_err(true, ARGS("--device", "cpu", "--backend", "cpu-fast", "--synthetic", "tiny"), "disagree");
  expect_err(true, ARGS("--device", "tpu", "--synthetic", "tiny"), "unknown --device 'tpu'");
  /* --device alias: --backend alone works, so does --device */
  k3_load_opts_default(&o);
  o.device_alias = true;
  ck_assert_int_eq(parse(&o, ARGS("--backend", "cpu-fast", "--synthetic", "tiny"), err, sizeof err), 0);
  ck_assert_str_eq(o.backend, "cpu-fast");
  k3_load_opts_default(&o);
  o.device_alias = true;
  ck_assert_int_eq(parse(&o, ARGS("--synthetic", "tiny"), err, sizeof err), 0);
  ck_assert_str_eq(o.backend, "cpu");
  /* --gpu and K3PD_CUDA_DEVICE */
  setenv("K3PD_CUDA_DEVICE", "2", 1);
  k3_load_opts_default(&o);
  ck_assert_int_eq(parse(&o, ARGS("--synthetic", "tiny"), err, sizeof err), 0);
  ck_assert_int_eq(o.gpu, 2);
  expect_err(false, ARGS("--gpu", "1", "--synthetic", "tiny"), "--gpu 1 disagrees with K3PD_CUDA_DEVICE=2");
  k3_load_opts_default(&o);
  ck_assert_int_eq(parse(&o, ARGS("--gpu", "2", "--synthetic", "tiny"), err, sizeof err), 0);
  unsetenv("K3PD_CUDA_DEVICE");
  k3_load_opts_default(&o);
  ck_assert_int_eq(parse(&o, ARGS("--gpu", "3", "--synthetic", "tiny"), err, sizeof err), 0);
  ck_assert_int_eq(o.gpu, 3);
}
END_TEST

START_TEST(test_loader_load) {
  unsetenv("K3PD_CUDA_DEVICE");
  k3_load_opts_t o;
  k3_load_opts_default(&o);
  o.num_slots = 3; /* a per-role default set before parsing */
  char err[512];
  ck_assert_int_eq(parse(&o, ARGS("--synthetic", "tiny-48b", "--page-tokens", "16", "--num-pages", "10"), err,
                         sizeof err), 0);
  k3_model_config_t cfg;
  ck_assert_int_eq(k3_load_config(&o, &cfg, err, sizeof err), 0);
  k3_weights_t *w = NULL;
  k3_runner_t *r = NULL;
  ck_assert_msg(k3_load_model(&o, &w, &r, err, sizeof err) == 0, "%s", err);
  ck_assert_ptr_nonnull(w);
  const k3_runner_opts_t *ro = k3_runner_opts(r);
  ck_assert_int_eq(ro->num_slots, 3);
  ck_assert_int_eq(ro->num_pages, 10);
  ck_assert_int_eq(ro->page_tokens, 16);
  ck_assert_int_eq(ro->precision, K3_RUNNER_FP32);
  ck_assert_int_eq(k3_runner_config(r)->vocab_size, cfg.vocab_size);
  /* the loader's weights are the same bytes as k3_weights_synth(seed 1): same logits */
  k3_runner_opts_t o2 = *ro;
  o2.backend = "cpu";
  k3_runner_t *ref = NULL;
  ck_assert_int_eq(k3_runner_init(weights(1), &o2, &ref, err, sizeof err), 0);
  float *a = run_seq(ref), *b = run_seq(r);
  ck_assert_int_eq(memcmp(a, b, (size_t)k3_runner_vocab(r) * sizeof(float)), 0);
  free(a), free(b);
  k3_runner_free(ref);
  k3_runner_free(r);
  k3_weights_free(w);
  /* an unknown preset names the flag; nothing is left allocated */
  k3_load_opts_default(&o);
  ck_assert_int_eq(parse(&o, ARGS("--synthetic", "nope"), err, sizeof err), 0);
  w = (k3_weights_t *)1;
  ck_assert_int_eq(k3_load_model(&o, &w, &r, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "--synthetic: unknown preset 'nope'"));
  ck_assert_ptr_eq(w, (k3_weights_t *)1);
}
END_TEST

START_TEST(test_loader_cuda_unusable) {
  /* this suite runs in CPU builds (K3PD_CUDA=OFF) or on hosts without a GPU: either way
   * --backend cuda must fail naming the device */
  unsetenv("K3PD_CUDA_DEVICE");
  if (k3k_backend_get("cuda")) return; /* a GPU host: nothing to check here */
  k3_load_opts_t o;
  k3_load_opts_default(&o);
  char err[512];
  ck_assert_int_eq(parse(&o, ARGS("--backend", "cuda", "--synthetic", "tiny"), err, sizeof err), 0);
  k3_weights_t *w = NULL;
  k3_runner_t *r = NULL;
  ck_assert_int_ne(k3_load_model(&o, &w, &r, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "--backend cuda: CUDA device 0 is not usable: "), "%s", err);
  ck_assert_ptr_null(r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("arena");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_regions_inside_arena);
  tcase_add_test(tc, test_caller_allocator);
  tcase_add_test(tc, test_bad_arena_opts);
  tcase_add_test(tc, test_loader_flags);
  tcase_add_test(tc, test_loader_load);
  tcase_add_test(tc, test_loader_cuda_unusable);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  for (int p = 0; p < 2; p++) k3_weights_free(g_w[p]);
  k3k_backends_shutdown();
  return failed ? 1 : 0;
}
