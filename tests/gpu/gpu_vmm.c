/* k3k-gpu-vmm: shareable device memory (kernels/cuda/vmm.cu) and the runner's use of it, in one
 * process (the cross-process flow is scripts/gpu/share.sh):
 *   1. k3k_vmm_alloc rounds up to the granularity; bytes written through the allocation are read
 *      back through an import of its exported fd (read-write and read-only), and a write through
 *      the read-write import is seen by the allocation; export gives a new fd each time;
 *   2. host backends: K3_ENOTSUP; k3k_device_uuid gives a non-zero UUID;
 *   3. a runner whose state arena is a VMM allocation (opts.state.vmm): every pool inside it,
 *      and prefill + decode logits bit-identical to a runner with the backend's arena;
 *   4. shared weights between two runners of this process (--share-weights through a temporary
 *      directory): the first makes them (k3_runner_weights_shared 1), the second imports them
 *      (2) at the same layout hash, and both give bit-identical logits.
 * Output: one PASS/FAIL line per check, then "vmm: N passed, M failed".
 * Exit: 0 all passed, 1 a check failed, 77 no CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3_runner.h"
#include "k3k.h"
#include "k3k_xdev.h"
#include "k3pd/err.h"

static int g_pass, g_fail;

static void check(bool ok, const char *what) {
  printf("%s: %s\n", ok ? "PASS" : "FAIL", what);
  ok ? g_pass++ : g_fail++;
}

static void test_vmm(k3k_backend_t *be) {
  const size_t want = (3u << 20) + 1;
  k3k_vmm_t *v = NULL, *rw = NULL, *ro = NULL;
  int rc = k3k_vmm_alloc(be, want, &v);
  check(rc == 0 && v && k3k_vmm_ptr(v) && k3k_vmm_size(v) >= want, "k3k_vmm_alloc 3 MiB + 1");
  if (rc) return;
  size_t n = k3k_vmm_size(v);
  uint8_t *h = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (uint8_t)(i * 131 + 7);
  check(be->copy_from_host(be, k3k_vmm_ptr(v), h, n) == 0, "write through the allocation");
  int fd1 = -1, fd2 = -1;
  check(k3k_vmm_export(v, &fd1) == 0 && k3k_vmm_export(v, &fd2) == 0 && fd1 >= 0 && fd2 >= 0 && fd1 != fd2,
        "k3k_vmm_export gives a new fd each time");
  rc = k3k_vmm_import(be, fd1, n, true, &rw);
  check(rc == 0 && k3k_vmm_size(rw) == n && k3k_vmm_ptr(rw) != k3k_vmm_ptr(v), "import read-write (own mapping)");
  if (!rc) {
    memset(back, 0, n);
    check(be->copy_to_host(be, back, k3k_vmm_ptr(rw), n) == 0 && !memcmp(back, h, n),
          "the import reads the allocation's bytes");
    uint8_t x[64];
    memset(x, 0xEE, sizeof x);
    be->copy_from_host(be, (uint8_t *)k3k_vmm_ptr(rw) + 4096, x, sizeof x);
    be->copy_to_host(be, back, k3k_vmm_ptr(v), n);
    check(!memcmp(back + 4096, x, sizeof x) && back[4095] == h[4095], "a write through the import is seen");
  }
  rc = k3k_vmm_import(be, fd2, n, false, &ro);
  check(rc == 0, "import read-only");
  if (!rc) {
    be->copy_to_host(be, back, k3k_vmm_ptr(ro), n);
    check(back[0] == h[0] && back[n - 1] == h[n - 1] && back[4096] == 0xEE, "the read-only import reads");
  }
  k3k_vmm_t *big = NULL;
  check(k3k_vmm_import(be, fd2, 4 * n, false, &big) != 0 && !big, "an import larger than the allocation fails");
  k3k_vmm_free(ro);
  k3k_vmm_free(rw);
  k3k_vmm_free(v); /* the order does not matter: each holds its own reference */
  close(fd1);
  close(fd2);
  free(h);
  free(back);
  k3k_vmm_t *hv = NULL;
  check(k3k_vmm_alloc(k3k_backend_get("cpu"), 4096, &hv) == K3_ENOTSUP && !hv, "host backend: K3_ENOTSUP");
  uint8_t u[16] = {0}, z[16] = {0};
  check(k3k_device_uuid(be, u) == 0 && memcmp(u, z, 16), "k3k_device_uuid");
}

/* prefill 40 tokens, 3 decode steps: the last logits (malloc'd), or NULL */
static float *run_seq(k3_runner_t *r) {
  int64_t V = k3_runner_vocab(r);
  float *lg = malloc((size_t)V * sizeof *lg);
  int32_t pages[8], toks[40];
  for (int i = 0; i < 40; i++) toks[i] = 100 + 7 * i;
  k3_seq_t s = {.slot = -1, .pages = pages, .cap_pages = 8};
  char err[512];
  k3_prefill_item_t it = {&s, toks, 40, lg, false};
  int rc = k3_runner_seq_reserve(r, &s, 44);
  if (!rc) rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err);
  for (int i = 0; i < 3 && !rc; i++) {
    k3_decode_item_t d = {.seq = &s, .token = 5 + i, .logits = lg};
    rc = k3_runner_decode_step(r, &d, 1, err, sizeof err);
  }
  k3_runner_seq_release(r, &s);
  if (rc) {
    printf("  run failed: %s\n", k3_strerror(rc));
    free(lg);
    return NULL;
  }
  return lg;
}

static bool same(const k3_runner_t *a, float *x, float *y) {
  bool ok = x && y && !memcmp(x, y, (size_t)k3_runner_vocab(a) * sizeof(float));
  free(x);
  free(y);
  return ok;
}

static void test_runner(const k3_model_config_t *cfg) {
  k3_runner_opts_t o;
  k3_runner_opts_default(&o);
  o.backend = "cuda";
  o.precision = K3_RUNNER_BF16;
  o.num_pages = 16;
  o.num_slots = 2;
  char err[1024];
  k3_runner_t *ref = NULL, *rv = NULL, *s1 = NULL, *s2 = NULL;
  int rc = k3_runner_init_synth(cfg, 1, 0, &o, &ref, err, sizeof err);
  check(rc == 0, "runner with the backend's state arena");
  if (rc) {
    printf("  %s\n", err);
    return;
  }
  o.state.vmm = true;
  rc = k3_runner_init_synth(cfg, 1, 0, &o, &rv, err, sizeof err);
  check(rc == 0 && k3_runner_state_vmm(rv), "runner with a VMM state arena");
  if (!rc) {
    void *base;
    size_t bytes;
    k3_runner_state_arena(rv, &base, &bytes);
    bool in = base == k3k_vmm_ptr(k3_runner_state_vmm(rv)) && bytes <= k3k_vmm_size(k3_runner_state_vmm(rv));
    const k3_manifest_t *m = k3_runner_manifest(rv);
    for (size_t i = 0; i < m->n; i++) {
      void *b;
      size_t st, c;
      k3_runner_pool_mem(rv, (int)i, &b, &st, &c);
      in = in && (char *)b >= (char *)base && (char *)b + st * c <= (char *)base + bytes;
    }
    check(in, "every pool inside the VMM arena");
    check(same(rv, run_seq(ref), run_seq(rv)), "VMM state arena: logits bit-identical");
    k3_runner_free(rv);
  } else {
    printf("  %s\n", err);
  }
  o.state.vmm = false;
  char dir[] = "/tmp/k3-gpu-vmm-XXXXXX";
  if (!mkdtemp(dir)) return;
  o.share_weights_dir = dir;
  o.share_wait_ms = 10000;
  rc = k3_runner_init_synth(cfg, 1, 0, &o, &s1, err, sizeof err);
  check(rc == 0 && k3_runner_weights_shared(s1) == 1, "shared weights: the first runner makes them");
  if (rc) printf("  %s\n", err);
  rc = rc ? rc : k3_runner_init_synth(cfg, 1, 0, &o, &s2, err, sizeof err);
  check(rc == 0 && k3_runner_weights_shared(s2) == 2, "shared weights: the second runner imports them");
  if (!rc) {
    uint64_t h1, h2, h0;
    k3_runner_weights_arena(s1, NULL, NULL, &h1);
    k3_runner_weights_arena(s2, NULL, NULL, &h2);
    k3_runner_weights_arena(ref, NULL, NULL, &h0);
    check(h1 == h2 && h1 == h0, "the same layout hash in all three runners");
    check(same(s2, run_seq(ref), run_seq(s2)), "imported weights: logits bit-identical");
    k3_runner_free(s1); /* the maker goes first: the importer keeps the memory */
    s1 = NULL;
    check(same(s2, run_seq(ref), run_seq(s2)), "imported weights after the maker is freed: bit-identical");
  } else {
    printf("  %s\n", err);
  }
  k3_runner_free(s2);
  k3_runner_free(s1);
  k3_runner_free(ref);
  char lock[64]; /* every socket was removed at free: rmdir fails otherwise */
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  unlink(lock);
  check(rmdir(dir) == 0, "no socket left behind");
}

int main(int argc, char **argv) {
  k3k_backend_t *be = k3k_backend_get("cuda");
  if (!be) {
    printf("k3k-gpu-vmm: no CUDA device: skipped\n");
    return 77;
  }
  test_vmm(be);
  const char *preset = argc > 1 ? argv[1] : "tiny";
  k3_model_config_t cfg;
  char err[512];
  const char *json = k3_model_config_preset(preset);
  if (!json || k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err)) {
    printf("k3k-gpu-vmm: bad preset %s\n", preset);
    return 2;
  }
  test_runner(&cfg);
  printf("vmm: %d passed, %d failed\n", g_pass, g_fail);
  k3k_backends_shutdown();
  return g_fail ? 1 : 0;
}
