/* Two-process transfers on loopback: a receiver process (reserve → descriptor bytes over a
 * pipe → verify) and a sender process (decode → push layer by layer → finish), each with its own
 * UCX context created after fork(). Region contents are pseudo-random from a seed both sides
 * know, so the receiver checks bit-identity independently of the digests. */
#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/xfer.h"

/* Tiny manifest: 2 KDA layers (S 4096 B + conv 384 B per slot) and 2 MLA layers (64 B per
 * token, pages of 16 tokens, 37 prompt tokens = 3 pages, the last one partial). */
#define PAGE_TOK 16
#define TOK_B 64
#define N_TOK 37
#define N_PAGES 256
#define N_SLOTS 40
#define S_B 4096
#define CONV_B 384
#define KDA_STRIDE (2 * (S_B + CONV_B))
#define KV_STRIDE (2 * PAGE_TOK * TOK_B)
#define N_REG 6
#define FP 0x5eedf00dull

enum { M_OK, M_STALE, M_UNKNOWN, M_FPRINT, M_DIGEST, M_SLOW, M_SENDER_DIES, M_RECV_DIES, M_STAGED, M_PUTS, M_RNDV };

typedef struct {
  const char *tls;
  int mode, n_req;
} cfg_t;

typedef struct { /* receiver → test */
  int ready, bit_identical, released, live, quarantined;
  k3_xfer_stats_t st;
} rres_t;

static void regions(k3_xfer_region_t *rg) {
  for (uint32_t l = 0; l < 2; l++) {
    rg[l * 2] = (k3_xfer_region_t){K3_XFER_KIND_KDA_S, 1, 1, l, l * (S_B + CONV_B), KDA_STRIDE, S_B, S_B};
    rg[l * 2 + 1] = (k3_xfer_region_t){K3_XFER_KIND_KDA_CONV, 1, 1, l, l * (S_B + CONV_B) + S_B,
                                       KDA_STRIDE, CONV_B, CONV_B};
    rg[4 + l] = (k3_xfer_region_t){K3_XFER_KIND_MLA_KV, 0, 0, 2 + l, l * PAGE_TOK * TOK_B, KV_STRIDE,
                                   PAGE_TOK * TOK_B, N_TOK * TOK_B};
  }
}

static uint8_t expect_byte(uint64_t req, uint32_t reg, uint64_t off) {
  uint64_t x = (req * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)reg << 40) ^ (off / 8);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return (uint8_t)(x >> (8 * (off % 8)));
}

static void wr(int fd, const void *p, size_t n) {
  for (size_t d = 0; d < n;) {
    ssize_t w = write(fd, (const char *)p + d, n - d);
    if (w <= 0) _exit(90);
    d += (size_t)w;
  }
}
static int rd(int fd, void *p, size_t n) {
  for (size_t d = 0; d < n;) {
    ssize_t r = read(fd, (char *)p + d, n - d);
    if (r <= 0) return -1;
    d += (size_t)r;
  }
  return 0;
}

/* ---- receiver ----------------------------------------------------------------------------- */

typedef struct {
  cfg_t c;
  k3_xfer_pool_t *kv, *kda;
  rres_t res;
  uv_loop_t *loop;
  uint8_t *dev; /* staged path: fake device memory, N_REG regions of one request */
  int flipped;
} rctx_t;

static void on_ready(void *ud, const k3_xfer_ready_t *r) {
  rctx_t *x = ud;
  x->res.ready++;
  if (r->first_token != 1000 + r->request_id) x->res.bit_identical = -1000;
}
static void on_release(void *ud, uint64_t id, void *owner) { ((rctx_t *)ud)->res.released++; }
/* Corrupts byte 100 of region 0 (KDA S, layer 0). The hook runs before every verification
 * step (each LAYER, then DONE), so the write is idempotent: whatever step verifies region 0
 * sees the bad byte even if the region's data landed after an earlier step's call. */
static void flip(void *ud, uint64_t id) {
  rctx_t *x = ud;
  if (x->c.mode != M_DIGEST) return;
  x->flipped++;
  uint8_t *p = (uint8_t *)k3_xfer_pool_base(x->kda) + (id % N_SLOTS) * KDA_STRIDE + 100;
  *p = (uint8_t)~expect_byte(id, 0, 100);
}
static int h2d(void *ud, uint64_t id, uint32_t reg, uint64_t off, const void *src, uint64_t len) {
  rctx_t *x = ud;
  memcpy(x->dev + reg * 4096 + off, src, len);
  return 0;
}

static void stop_cb(uv_timer_t *t) { uv_stop(t->loop); }
static void check_cb(uv_timer_t *t) {
  rctx_t *x = t->data;
  int want = x->c.mode == M_SENDER_DIES ? 0 : x->c.n_req;
  bool done = x->c.mode == M_SENDER_DIES ? x->res.released == 1
              : x->c.mode == M_OK || x->c.mode == M_SLOW || x->c.mode == M_STAGED || x->c.mode == M_PUTS || x->c.mode == M_RNDV
                  ? x->res.ready == want
                  : false;
  k3_xfer_stats_t st;
  (void)st;
  if (done) uv_stop(t->loop);
}

static int receiver(cfg_t c, int wfd, int resfd) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  rctx_t x = {.c = c, .loop = &loop};
  k3_xfer_ctx_t *ctx;
  k3_xfer_ctx_opts_t o = {.tls = c.tls};
  if (k3_xfer_ctx_init(&loop, &o, &ctx)) return 10;
  if (k3_xfer_pool_alloc_host(ctx, (uint64_t)N_PAGES * KV_STRIDE, &x.kv) ||
      k3_xfer_pool_alloc_host(ctx, (uint64_t)N_SLOTS * KDA_STRIDE, &x.kda))
    return 11;
  x.dev = calloc(N_REG, 4096);
  k3_xfer_stage_t stage = {.h2d = h2d, .ud = &x};
  k3_xfer_recv_opts_t ro = {.on_ready = on_ready, .on_release = on_release, .ud = &x,
                            .quarantine_ms = c.mode == M_SENDER_DIES ? 300 : 2000,
                            .poison = true, .test_before_verify = flip,
                            .stage = c.mode == M_STAGED ? &stage : NULL};
  k3_xfer_recv_t *r;
  if (k3_xfer_recv_init(ctx, &ro, &r)) return 12;
  k3_xfer_region_t rg[N_REG];
  regions(rg);
  uint32_t lease = c.mode == M_SENDER_DIES ? 500 : 8000;
  for (int i = 0; i < c.n_req; i++) {
    uint32_t pages[3] = {(uint32_t)(3 * i + 7), (uint32_t)(200 - i), (uint32_t)(3 * i + 8)};
    uint32_t slot = (uint32_t)(i % N_SLOTS);
    k3_xfer_layout_t lay = {.n_pools = 2, .pools = {x.kv, x.kda}, .n_lists = 2,
                            .lists = {{3, pages}, {1, &slot}}, .n_regions = N_REG, .regions = rg};
    k3_xfer_desc_t *d;
    if (k3_xfer_recv_reserve(r, &lay, (uint64_t)i, FP, lease, NULL, &d)) return 13;
    uint8_t *buf;
    size_t len;
    if (k3_xfer_desc_encode(d, &buf, &len)) return 14;
    uint32_t l32 = (uint32_t)len;
    wr(wfd, &l32, 4);
    wr(wfd, buf, len);
    free(buf);
    k3_xfer_desc_free(d);
  }
  if (c.mode == M_SLOW) usleep(300000); /* no progress at all while the sender pushes */
  uv_timer_t stop, chk;
  uv_timer_init(&loop, &stop);
  uv_timer_init(&loop, &chk);
  chk.data = &x;
  bool want_ok = c.mode == M_OK || c.mode == M_SLOW || c.mode == M_STAGED || c.mode == M_PUTS || c.mode == M_RNDV;
  uv_timer_start(&stop, stop_cb, want_ok ? 15000 : 2500, 0);
  uv_timer_start(&chk, check_cb, 5, 5);
  uv_run(&loop, UV_RUN_DEFAULT);
  /* Bit identity of every ready request, read back from our pools. */
  if (x.res.bit_identical == 0 && x.res.ready > 0) {
    x.res.bit_identical = 1;
    for (int i = 0; i < c.n_req; i++) {
      uint32_t pages[3] = {(uint32_t)(3 * i + 7), (uint32_t)(200 - i), (uint32_t)(3 * i + 8)};
      for (uint32_t reg = 0; reg < N_REG; reg++) {
        const k3_xfer_region_t *g = &rg[reg];
        const uint8_t *base = k3_xfer_pool_base(g->pool ? x.kda : x.kv);
        for (uint64_t off = 0; off < g->len_bytes; off++) {
          uint64_t unit = off / g->unit_bytes;
          uint64_t idx = g->pool ? (uint64_t)(i % N_SLOTS) : pages[unit];
          uint64_t stride = g->pool ? KDA_STRIDE : KV_STRIDE;
          uint8_t b = base[idx * stride + g->offset_bytes + off % g->unit_bytes];
          if (b != expect_byte((uint64_t)i, reg, off)) x.res.bit_identical = 0;
          if (c.mode == M_STAGED && x.dev[reg * 4096 + off] != b && c.n_req == 1) x.res.bit_identical = 0;
        }
      }
    }
  }
  x.res.live = (int)k3_xfer_recv_live(r);
  x.res.quarantined = (int)k3_xfer_recv_quarantined(r);
  k3_xfer_ctx_stats(ctx, &x.res.st);
  k3_xfer_recv_free(r);
  k3_xfer_pool_free(x.kv);
  k3_xfer_pool_free(x.kda);
  k3_xfer_ctx_close(ctx);
  uv_close((uv_handle_t *)&stop, NULL);
  uv_close((uv_handle_t *)&chk, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(x.dev);
  wr(resfd, &x.res, sizeof x.res);
  return 0;
}

/* ---- sender ------------------------------------------------------------------------------- */

typedef struct {
  int fired, status[64], done[64];
  int direct, am; /* sends that wrote through a mapped pointer / sent DATA messages */
  uint64_t t_done[64];
} sres_t;

typedef struct {
  sres_t *res;
  int i;
} sud_t;

static void sent(void *ud, const k3_xfer_send_result_t *r) {
  sud_t *u = ud;
  u->res->status[u->i] = r->status;
  u->res->done[u->i] = 1;
  u->res->t_done[u->i] = k3_now_ns();
  u->res->fired++;
}

static uint8_t *g_src[64][N_REG];
static int d2h(void *ud, uint32_t reg, uint64_t off, void *dst, uint64_t len) {
  memcpy(dst, g_src[(intptr_t)ud][reg] + off, len);
  return 0;
}

static void sstop_cb(uv_timer_t *t) {
  sres_t *s = t->data;
  if (s->fired == *(int *)t->loop->data) uv_stop(t->loop);
}

/* Returns via *out; kills `victim` after the first layer when > 0. */
static int sender(cfg_t c, int rfd, pid_t victim, sres_t *out, uint64_t *t_start) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  int n = c.n_req;
  loop.data = &n;
  k3_xfer_ctx_t *ctx;
  k3_xfer_ctx_opts_t o = {.tls = c.tls};
  if (k3_xfer_ctx_init(&loop, &o, &ctx)) return 20;
  k3_xfer_desc_t *d[64];
  k3_xfer_src_t src[64][N_REG];
  k3_xfer_send_t *s[64];
  sud_t ud[64];
  memset(out, 0, sizeof *out);
  for (int i = 0; i < n; i++) {
    uint32_t len;
    if (rd(rfd, &len, 4)) return 21;
    uint8_t *buf = malloc(len);
    if (rd(rfd, buf, len)) return 22;
    if (k3_xfer_desc_decode(buf, len, &d[i], NULL, 0)) return 23;
    free(buf);
    if (c.mode == M_STALE) d[i]->epoch--;
    if (c.mode == M_UNKNOWN) d[i]->request_id += 1000;
    if (c.mode == M_FPRINT) d[i]->fingerprint ^= 1;
    for (uint32_t r = 0; r < N_REG; r++) {
      uint64_t rl = d[i]->regions[r].len_bytes;
      g_src[i][r] = malloc(rl);
      uint64_t id = c.mode == M_UNKNOWN ? d[i]->request_id - 1000 : d[i]->request_id;
      for (uint64_t b = 0; b < rl; b++) g_src[i][r][b] = expect_byte(id, r, b);
      src[i][r] = (k3_xfer_src_t){.base = g_src[i][r]};
    }
  }
  *t_start = k3_now_ns();
  for (int i = 0; i < n; i++) {
    ud[i] = (sud_t){out, i};
    k3_xfer_stage_t st = {.d2h = d2h, .ud = (void *)(intptr_t)i};
    k3_xfer_send_opts_t so = {.deadline_ms = 2000, .chunk_bytes = c.mode == M_RNDV ? 4096 : 1000, .max_inflight = 4,
                              .stage = c.mode == M_STAGED ? &st : NULL, .puts_only = c.mode == M_PUTS};
    int rc = k3_xfer_send_start(ctx, d[i], src[i], &so, sent, &ud[i], &s[i]);
    if (rc) return 24;
    out->direct += k3_xfer_send_direct(s[i]);
    out->am += strcmp(k3_xfer_send_mode(s[i]), "am") == 0;
    if (c.mode == M_STAGED && k3_xfer_send_path(s[i]) != K3_XFER_PATH_STAGED) return 25;
  }
  for (uint32_t l = 0; l < 4; l++) {
    for (int i = 0; i < n; i++)
      /* After its callback a send handle is gone: only live sends are driven. */
      if (!out->done[i] && k3_xfer_send_layer_ready(s[i], l) && victim <= 0) return 26;
    if (l == 0 && victim > 0) {
      uv_run(&loop, UV_RUN_NOWAIT);
      kill(victim, SIGKILL);
      waitpid(victim, NULL, 0);
    }
    if (c.mode == M_SENDER_DIES) {
      uv_run(&loop, UV_RUN_NOWAIT);
      _exit(0); /* mid-transfer: layer 0 pushed, no DONE ever */
    }
    uv_run(&loop, UV_RUN_NOWAIT); /* some compute happens between layers */
  }
  for (int i = 0; i < n; i++)
    if (!out->done[i] && k3_xfer_send_finish(s[i], 1000 + (uint32_t)i, -0.5f) && victim <= 0) return 27;
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  t.data = out;
  uv_timer_start(&t, sstop_cb, 2, 2);
  uv_run(&loop, UV_RUN_DEFAULT); /* every send has a deadline: this returns */
  uv_close((uv_handle_t *)&t, NULL);
  k3_xfer_ctx_close(ctx);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  for (int i = 0; i < n; i++) {
    k3_xfer_desc_free(d[i]);
    for (uint32_t r = 0; r < N_REG; r++) free(g_src[i][r]);
  }
  return 0;
}

/* ---- scenarios ------------------------------------------------------------------------------ */

/* Receiver in a child, sender here. */
static void run(cfg_t c, rres_t *rr, sres_t *sr) {
  int p1[2], p2[2];
  ck_assert_int_eq(pipe(p1), 0);
  ck_assert_int_eq(pipe(p2), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(p1[0]);
    _exit(receiver(c, p1[1], p1[1]));
  }
  close(p1[1]);
  uint64_t t0;
  int rc = sender(c, p1[0], c.mode == M_RECV_DIES ? pid : 0, sr, &t0);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sr->fired, c.n_req);
  if (c.mode == M_RECV_DIES) {
    for (int i = 0; i < c.n_req; i++) {
      ck_assert_msg(sr->status[i] == K3_ETIMEDOUT || sr->status[i] == K3_ETRANSPORT, "status %s",
                    k3_errname(sr->status[i]));
      ck_assert_uint_lt(sr->t_done[i] - t0, 2600000000ull); /* deadline 2 s + slack */
    }
    return;
  }
  ck_assert_int_eq(rd(p1[0], rr, sizeof *rr), 0);
  int st;
  waitpid(pid, &st, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(p1[0]);
  close(p2[0]);
  close(p2[1]);
}

/* direct: 1 = every send must write through the mapped pointer, 0 = none may; no mapping
 * means DATA messages unless the mode asks for puts. */
static void expect_ok(const char *tls, int mode, int n, int direct) {
  cfg_t c = {tls, mode, n};
  rres_t rr = {0};
  sres_t sr;
  run(c, &rr, &sr);
  ck_assert_int_eq(sr.direct, direct ? n : 0);
  ck_assert_int_eq(sr.am, direct || mode == M_PUTS ? 0 : n);
  for (int i = 0; i < n; i++) ck_assert_int_eq(sr.status[i], 0);
  ck_assert_int_eq(rr.ready, n);
  ck_assert_int_eq(rr.bit_identical, 1);
  ck_assert_uint_eq(rr.st.done_accepted, (uint64_t)n);
  ck_assert_int_eq(rr.released, n); /* recv_free released them all */
  if (mode == M_RNDV) ck_assert_uint_gt(rr.st.data_rndv, 0);
  if (mode == M_OK && !direct) ck_assert_uint_gt(rr.st.data_eager, 0);
  /* Every layer was verified from its LAYER announcement, before DONE. */
  ck_assert_uint_eq(rr.st.layers_verified, 4u * (uint64_t)n);
}

START_TEST(test_shm_ok) { expect_ok("shm", M_OK, 1, 1); }
END_TEST
START_TEST(test_shm_puts) { expect_ok("shm", M_PUTS, 1, 0); }
END_TEST
START_TEST(test_tcp_ok) { expect_ok("tcp", M_OK, 1, 0); }
END_TEST
START_TEST(test_tcp_puts) { expect_ok("tcp", M_PUTS, 2, 0); }
END_TEST
START_TEST(test_tcp_rndv) {
  /* DATA chunks of up to 4 KiB above a 512 B threshold: every chunk goes by rendezvous, so the
   * receiver's LAYER/DONE must wait for receives it started itself. (Check forks per test.) */
  setenv("UCX_RNDV_THRESH", "512", 1);
  expect_ok("tcp", M_RNDV, 4, 0);
}
END_TEST
START_TEST(test_many_concurrent) { expect_ok("shm", M_OK, 32, 1); }
END_TEST
START_TEST(test_tcp_many) { expect_ok("tcp", M_OK, 8, 0); }
END_TEST
START_TEST(test_slow_receiver) { expect_ok("tcp", M_SLOW, 2, 0); }
END_TEST
START_TEST(test_staged) { expect_ok("shm", M_STAGED, 1, 1); }
END_TEST

static void expect_reject(int mode, int code, size_t counter_off) {
  cfg_t c = {"shm", mode, 1};
  rres_t rr = {0};
  sres_t sr;
  run(c, &rr, &sr);
  ck_assert_msg(sr.status[0] == code, "sender got %s, want %s", k3_errname(sr.status[0]), k3_errname(code));
  ck_assert_int_eq(rr.ready, 0);
  ck_assert_uint_eq(*(uint64_t *)((char *)&rr.st + counter_off), 1);
  ck_assert_uint_eq(rr.st.done_accepted, 0);
}
START_TEST(test_stale_epoch) { expect_reject(M_STALE, K3_ESTALE, offsetof(k3_xfer_stats_t, done_rejected_stale)); }
END_TEST
START_TEST(test_unknown_request) { expect_reject(M_UNKNOWN, K3_ENOENT, offsetof(k3_xfer_stats_t, done_rejected_unknown)); }
END_TEST
START_TEST(test_fingerprint) { expect_reject(M_FPRINT, K3_EFINGERPRINT, offsetof(k3_xfer_stats_t, done_rejected_fingerprint)); }
END_TEST
START_TEST(test_digest) { expect_reject(M_DIGEST, K3_EDIGEST, offsetof(k3_xfer_stats_t, done_rejected_digest)); }
END_TEST

START_TEST(test_receiver_dies) {
  cfg_t c = {"tcp", M_RECV_DIES, 2};
  rres_t rr;
  sres_t sr;
  run(c, &rr, &sr);
}
END_TEST
START_TEST(test_receiver_dies_shm) {
  cfg_t c = {"shm", M_RECV_DIES, 2};
  rres_t rr;
  sres_t sr;
  run(c, &rr, &sr);
}
END_TEST

START_TEST(test_sender_dies) {
  /* Receiver here, sender in a child that exits after pushing layer 0. */
  cfg_t c = {"shm", M_SENDER_DIES, 1};
  int p1[2], p2[2];
  ck_assert_int_eq(pipe(p1), 0);
  ck_assert_int_eq(pipe(p2), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(p1[1]);
    sres_t sr;
    uint64_t t0;
    _exit(sender(c, p1[0], 0, &sr, &t0) ? 1 : 0);
  }
  close(p1[0]);
  pid_t rp = fork(); /* receiver in its own process too, reporting through p2 */
  if (rp == 0) _exit(receiver(c, p1[1], p2[1]) ? 1 : 0);
  close(p1[1]);
  close(p2[1]);
  rres_t rr;
  ck_assert_int_eq(rd(p2[0], &rr, sizeof rr), 0);
  int st;
  waitpid(pid, &st, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  waitpid(rp, &st, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* The lease expired, the slot went through quarantine (poisoned) and was released once. */
  ck_assert_int_eq(rr.ready, 0);
  ck_assert_int_eq(rr.released, 1);
  ck_assert_int_eq(rr.live, 0);
  ck_assert_int_eq(rr.quarantined, 0);
  ck_assert_uint_eq(rr.st.leases_expired, 1);
  ck_assert_uint_eq(rr.st.slots_quarantined, 1);
  ck_assert_uint_eq(rr.st.slots_poisoned, 1);
  ck_assert_uint_eq(rr.st.done_accepted, 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("xfer_e2e");
  TCase *tc = tcase_create("loopback");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_shm_ok);
  tcase_add_test(tc, test_shm_puts);
  tcase_add_test(tc, test_tcp_ok);
  tcase_add_test(tc, test_tcp_puts);
  tcase_add_test(tc, test_tcp_rndv);
  tcase_add_test(tc, test_many_concurrent);
  tcase_add_test(tc, test_tcp_many);
  tcase_add_test(tc, test_slow_receiver);
  tcase_add_test(tc, test_staged);
  tcase_add_test(tc, test_stale_epoch);
  tcase_add_test(tc, test_unknown_request);
  tcase_add_test(tc, test_fingerprint);
  tcase_add_test(tc, test_digest);
  tcase_add_test(tc, test_receiver_dies);
  tcase_add_test(tc, test_receiver_dies_shm);
  tcase_add_test(tc, test_sender_dies);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? 1 : 0;
}
