/* Path choice of k3_xfer sends (one process, fake device: fake_dev.h): every combination of
 * sources, receiver pools, hooks and forced paths either gets the path the table in xfer.h
 * names, or fails at start with K3_ENOTSUP and never calls the callback; a cancelled send whose
 * device job is still running answers at once and stays alive until the job completed; no job
 * is submitted after the deadline. The receiver is this process's own ctx (descriptors name our
 * own worker address), so no bytes need to move for these checks. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_dev.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/xfer.h"

#define POOL_B 65536
#define REG_B 8192

typedef struct {
  uv_loop_t loop;
  fake_dev_t f;
  k3_xfer_ctx_t *ctx;
  k3_xfer_recv_t *r;
  k3_xfer_pool_t *dev_blob, *dev_noblob, *host;
  void *src_dev;
  const char *src_blob; /* the source area's blob (exported for cuda-pull) */
  uint8_t *src_host;
  uint64_t next_id;
  int fired, status;
  uint64_t t_fired;
} env_t;

static void cb(void *ud, const k3_xfer_send_result_t *res) {
  env_t *e = ud;
  e->fired++;
  e->status = res->status;
  e->t_fired = k3_now_ns();
}

static void env_init(env_t *e, int async_us) {
  memset(e, 0, sizeof *e);
  uv_loop_init(&e->loop);
  fake_dev_init(&e->f, async_us);
  ck_assert_int_eq(k3_xfer_ctx_init(&e->loop, NULL, &e->ctx), 0);
  k3_xfer_recv_opts_t ro = {.dev = &e->f.hooks};
  ck_assert_int_eq(k3_xfer_recv_init(e->ctx, &ro, &e->r), 0);
  void *dev;
  uint8_t *shadow;
  const char *blob;
  ck_assert_int_eq(fake_dev_alloc(&e->f, POOL_B, &dev, &shadow, &blob), 0);
  ck_assert_int_eq(k3_xfer_pool_register(e->ctx, dev, POOL_B, K3_XFER_MEM_CUDA, (const uint8_t *)blob,
                                         (uint32_t)strlen(blob), &e->dev_blob), 0);
  ck_assert_int_eq(fake_dev_alloc(&e->f, POOL_B, &dev, &shadow, NULL), 0);
  ck_assert_int_eq(k3_xfer_pool_register(e->ctx, dev, POOL_B, K3_XFER_MEM_CUDA, NULL, 0, &e->dev_noblob), 0);
  const uint8_t *rk;
  size_t rk_len;
  k3_xfer_pool_rkey(e->dev_noblob, &rk, &rk_len);
  ck_assert_uint_eq(rk_len, 0); /* this UCX has no CUDA: device pools are not registered */
  ck_assert_int_eq(k3_xfer_pool_alloc_host(e->ctx, POOL_B, &e->host), 0);
  ck_assert_int_eq(fake_dev_alloc(&e->f, REG_B, &e->src_dev, &shadow, &e->src_blob), 0);
  e->src_host = calloc(1, REG_B);
}

static void env_close(env_t *e) {
  k3_xfer_recv_free(e->r);
  k3_xfer_pool_free(e->dev_blob);
  k3_xfer_pool_free(e->dev_noblob);
  k3_xfer_pool_free(e->host);
  k3_xfer_ctx_close(e->ctx);
  uv_run(&e->loop, UV_RUN_DEFAULT);
  uv_loop_close(&e->loop);
  fake_dev_free_all(&e->f);
  free(e->src_host);
}

/* A reservation of one 8 KiB region (two 4 KiB units, slots 3 and 5) in pool p. */
static k3_xfer_desc_t *reserve(env_t *e, k3_xfer_pool_t *p) {
  uint32_t idx[2] = {3, 5};
  k3_xfer_region_t rg = {K3_XFER_KIND_KDA_S, 0, 0, 0, 0, 4096, 4096, REG_B};
  k3_xfer_layout_t lay = {.n_pools = 1, .pools = {p}, .n_lists = 1, .lists = {{2, idx}},
                          .n_regions = 1, .regions = &rg};
  k3_xfer_desc_t *d;
  ck_assert_int_eq(k3_xfer_recv_reserve(e->r, &lay, e->next_id++, 1, 10000, NULL, &d), 0);
  return d;
}

/* Starts a send; returns its rc (and *s). dev: device sources through the fake hooks. */
static int start(env_t *e, const k3_xfer_desc_t *d, bool dev, bool stage, k3_xfer_path_t path,
                 uint32_t deadline_ms, k3_xfer_send_t **s);

static int d2h(void *ud, uint32_t reg, uint64_t off, void *dst, uint64_t len) {
  memset(dst, 7, len);
  return 0;
}

static k3_xfer_src_t g_src;
static int start(env_t *e, const k3_xfer_desc_t *d, bool dev, bool stage, k3_xfer_path_t path,
                 uint32_t deadline_ms, k3_xfer_send_t **s) {
  g_src = (k3_xfer_src_t){.base = dev ? e->src_dev : (const void *)e->src_host};
  static k3_xfer_stage_t st = {.d2h = d2h};
  k3_xfer_send_opts_t o = {.dev = dev ? &e->f.hooks : NULL, .stage = stage ? &st : NULL,
                           .path = path, .deadline_ms = deadline_ms};
  return k3_xfer_send_start(e->ctx, d, &g_src, &o, cb, e, s);
}

/* cuda-pull: a send with the source area exported (spool_bytes of it: smaller than the region
 * puts the source outside). */
static int start_pull(env_t *e, const k3_xfer_desc_t *d, k3_xfer_path_t path, uint64_t spool_bytes,
                      k3_xfer_send_t **s) {
  g_src = (k3_xfer_src_t){.base = e->src_dev};
  static k3_xfer_src_pool_t sp;
  sp = (k3_xfer_src_pool_t){.base = e->src_dev, .size_bytes = spool_bytes, .blob = (const uint8_t *)e->src_blob,
                            .blob_len = (uint32_t)strlen(e->src_blob)};
  k3_xfer_send_opts_t o = {.dev = &e->f.hooks, .path = path, .src_pools = &sp, .n_src_pools = 1};
  return k3_xfer_send_start(e->ctx, d, &g_src, &o, cb, e, s);
}

START_TEST(test_pull_choice) {
  env_t e;
  env_init(&e, 0);
  k3_xfer_desc_t *blob = reserve(&e, e.dev_blob), *host = reserve(&e, e.host);
  k3_xfer_send_t *s;
  /* This receiver maps (its hooks have map): device reservations offer pull, host ones not. */
  ck_assert_uint_eq(blob->flags, K3_XFER_DESC_F_PULL);
  ck_assert_uint_eq(host->flags, 0);
  /* Offered + exported sources that cover the region: AUTO picks cuda-pull. */
  ck_assert_int_eq(start_pull(&e, blob, K3_XFER_PATH_AUTO, REG_B, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_CUDA_PULL);
  ck_assert_str_eq(k3_xfer_send_mode(s), "pull");
  k3_xfer_send_cancel(s);
  /* The source lies partly outside the exported pool: AUTO falls back to cuda-ipc (push),
   * forcing cuda-pull is refused. */
  ck_assert_int_eq(start_pull(&e, blob, K3_XFER_PATH_AUTO, REG_B / 2, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_CUDA_IPC);
  k3_xfer_send_cancel(s);
  ck_assert_int_eq(start_pull(&e, blob, K3_XFER_PATH_CUDA_PULL, REG_B / 2, &s), K3_ENOTSUP);
  /* No exported sources: forced cuda-pull refused. */
  ck_assert_int_eq(start(&e, blob, true, false, K3_XFER_PATH_CUDA_PULL, 0, &s), K3_ENOTSUP);
  /* Not offered (a receiver that cannot or will not pull): push, or refused when forced. */
  k3_xfer_desc_t *nopull;
  ck_assert_int_eq(k3_xfer_desc_clone(blob, &nopull), 0);
  nopull->flags = 0;
  ck_assert_int_eq(start_pull(&e, nopull, K3_XFER_PATH_AUTO, REG_B, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_CUDA_IPC);
  k3_xfer_send_cancel(s);
  ck_assert_int_eq(start_pull(&e, nopull, K3_XFER_PATH_CUDA_PULL, REG_B, &s), K3_ENOTSUP);
  /* Offered, but the receiver's pool does not map here (another host or GPU): neither pull nor
   * cuda-ipc. */
  e.f.refuse_map = 1;
  ck_assert_int_eq(start_pull(&e, blob, K3_XFER_PATH_AUTO, REG_B, &s), K3_ENOTSUP);
  e.f.refuse_map = 0;
  /* Host pools: pull never applies. */
  ck_assert_int_eq(start_pull(&e, host, K3_XFER_PATH_CUDA_PULL, REG_B, &s), K3_ENOTSUP);
  for (int i = 0; i < 50 && e.fired < 3; i++) uv_run(&e.loop, UV_RUN_NOWAIT);
  ck_assert_int_eq(e.fired, 3); /* the three cancelled sends, nothing else */
  k3_xfer_desc_free(nopull);
  k3_xfer_desc_free(blob);
  k3_xfer_desc_free(host);
  env_close(&e);
}
END_TEST

START_TEST(test_refusals) {
  env_t e;
  env_init(&e, 0);
  k3_xfer_desc_t *noblob = reserve(&e, e.dev_noblob), *blob = reserve(&e, e.dev_blob);
  k3_xfer_desc_t *host = reserve(&e, e.host);
  k3_xfer_send_t *s;
  /* Device to device with no mapping and no CUDA UCX: no path, whatever is asked. */
  ck_assert_int_eq(start(&e, noblob, true, false, K3_XFER_PATH_AUTO, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, noblob, true, false, K3_XFER_PATH_CUDA_IPC, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, noblob, true, false, K3_XFER_PATH_UCX_CUDA, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, noblob, true, false, K3_XFER_PATH_HOST, 0, &s), K3_ENOTSUP);
  /* A blob the hooks cannot map (another host, say). */
  e.f.refuse_map = 1;
  ck_assert_int_eq(start(&e, blob, true, false, K3_XFER_PATH_AUTO, 0, &s), K3_ENOTSUP);
  e.f.refuse_map = 0;
  /* Host sources into device pools; device sources into host pools without staging hooks. */
  ck_assert_int_eq(start(&e, blob, false, false, K3_XFER_PATH_AUTO, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, host, true, false, K3_XFER_PATH_AUTO, 0, &s), K3_ENOTSUP);
  /* Forced paths that do not fit. */
  ck_assert_int_eq(start(&e, blob, true, false, K3_XFER_PATH_UCX_CUDA, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, blob, true, false, K3_XFER_PATH_STAGED, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, host, false, false, K3_XFER_PATH_CUDA_IPC, 0, &s), K3_ENOTSUP);
  ck_assert_int_eq(start(&e, host, true, true, K3_XFER_PATH_HOST, 0, &s), K3_ENOTSUP);
  /* And the ones that fit (cancelled before any byte moves). */
  ck_assert_int_eq(start(&e, blob, true, false, K3_XFER_PATH_AUTO, 0, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_CUDA_IPC);
  ck_assert_str_eq(k3_xfer_send_mode(s), "job");
  k3_xfer_send_cancel(s);
  ck_assert_int_eq(start(&e, host, true, true, K3_XFER_PATH_AUTO, 0, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_STAGED);
  k3_xfer_send_cancel(s);
  /* A worker offers both hooks: device pools still go device to device (the GPU prefill
   * worker's case; staging hooks are for host receive areas only). */
  ck_assert_int_eq(start(&e, blob, true, true, K3_XFER_PATH_AUTO, 0, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_CUDA_IPC);
  k3_xfer_send_cancel(s);
  ck_assert_int_eq(start(&e, host, false, false, K3_XFER_PATH_HOST, 0, &s), 0);
  ck_assert_int_eq(k3_xfer_send_path(s), K3_XFER_PATH_HOST);
  k3_xfer_send_cancel(s);
  ck_assert_int_eq(e.fired, 0); /* never inside a call, never for a refused start */
  while (e.fired < 4) uv_run(&e.loop, UV_RUN_ONCE);
  ck_assert_int_eq(e.status, K3_ECANCELED);
  ck_assert_int_eq(e.f.jobs, 0);
  k3_xfer_desc_free(noblob);
  k3_xfer_desc_free(blob);
  k3_xfer_desc_free(host);
  env_close(&e);
}
END_TEST

START_TEST(test_cancel_with_job_running) {
  env_t e;
  env_init(&e, 300000); /* jobs take 300 ms, on their own thread */
  k3_xfer_desc_t *d = reserve(&e, e.dev_blob);
  k3_xfer_send_t *s;
  ck_assert_int_eq(start(&e, d, true, false, K3_XFER_PATH_AUTO, 5000, &s), 0);
  uint64_t t0 = k3_now_ns();
  ck_assert_int_eq(k3_xfer_send_layer_ready(s, 0), 0);
  /* submitted by the loop's next drive (so layers signalled together share a job), not inside
   * the call; the copy still overlaps compute */
  ck_assert_int_eq(e.f.jobs, 0);
  for (int i = 0; i < 100 && e.f.jobs == 0; i++) uv_run(&e.loop, UV_RUN_NOWAIT);
  ck_assert_int_eq(e.f.jobs, 1);
  k3_xfer_send_cancel(s);
  while (!e.fired) uv_run(&e.loop, UV_RUN_ONCE);
  ck_assert_int_eq(e.status, K3_ECANCELED);
  ck_assert_uint_lt(e.t_fired - t0, 150000000ull); /* answered before the job finished */
  /* The send lives on inside the ctx until its job completed; the descriptor is ours again. */
  k3_xfer_desc_free(d);
  uint64_t until = k3_now_ns() + 2000000000ull;
  k3_xfer_stats_t st;
  do {
    uv_run(&e.loop, UV_RUN_NOWAIT);
    usleep(1000);
  } while (k3_now_ns() < until && k3_now_ns() - t0 < 400000000ull);
  k3_xfer_ctx_stats(e.ctx, &st);
  ck_assert_uint_eq(st.dev_jobs, 1);
  ck_assert_uint_eq(st.sends_failed, 1);
  env_close(&e);
}
END_TEST

START_TEST(test_close_waits_for_job) {
  env_t e;
  env_init(&e, 200000);
  k3_xfer_desc_t *d = reserve(&e, e.dev_blob);
  k3_xfer_send_t *s;
  ck_assert_int_eq(start(&e, d, true, false, K3_XFER_PATH_AUTO, 5000, &s), 0);
  ck_assert_int_eq(k3_xfer_send_layer_ready(s, 0), 0);
  for (int i = 0; i < 100 && e.f.jobs == 0; i++) uv_run(&e.loop, UV_RUN_NOWAIT);
  ck_assert_int_eq(e.f.jobs, 1);
  /* Closing with the job running: the callback runs (K3_ESHUTDOWN), close waits for the job
   * through release, and nothing touches freed memory afterwards (ASan). */
  k3_xfer_recv_free(e.r);
  e.r = NULL;
  k3_xfer_pool_free(e.dev_blob);
  k3_xfer_pool_free(e.dev_noblob);
  k3_xfer_pool_free(e.host);
  k3_xfer_ctx_close(e.ctx);
  ck_assert_int_eq(e.fired, 1);
  ck_assert_int_eq(e.status, K3_ESHUTDOWN);
  uv_run(&e.loop, UV_RUN_DEFAULT);
  uv_loop_close(&e.loop);
  fake_dev_free_all(&e.f);
  free(e.src_host);
  k3_xfer_desc_free(d);
}
END_TEST

START_TEST(test_no_submit_after_deadline) {
  env_t e;
  env_init(&e, 0);
  k3_xfer_desc_t *d = reserve(&e, e.dev_blob);
  k3_xfer_send_t *s;
  ck_assert_int_eq(start(&e, d, true, false, K3_XFER_PATH_AUTO, 30, &s), 0);
  usleep(60000); /* the deadline passes while "compute" runs */
  k3_xfer_send_layer_ready(s, 0);
  ck_assert_int_eq(e.f.jobs, 0);
  while (!e.fired) uv_run(&e.loop, UV_RUN_ONCE);
  ck_assert_int_eq(e.status, K3_ETIMEDOUT);
  ck_assert_int_eq(e.f.jobs, 0);
  k3_xfer_desc_free(d);
  env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("xfer_path");
  TCase *tc = tcase_create("choice");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_pull_choice);
  tcase_add_test(tc, test_cancel_with_job_running);
  tcase_add_test(tc, test_close_waits_for_job);
  tcase_add_test(tc, test_no_submit_after_deadline);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? 1 : 0;
}
