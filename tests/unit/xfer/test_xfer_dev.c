/* Device paths of k3_xfer with a fake device (fake_dev.h): "device memory" whose addresses are
 * PROT_NONE to host code, so k3_xfer touching it from the CPU crashes the test.
 *
 * Two processes on loopback (shm), each with its own UCX context created after fork(), as in
 * test_xfer_e2e.c. The receiver keeps its state in ONE fake-device arena holding every layer's
 * own tensor (MLA: [128 pages, 1024 B] per layer; KDA: [20 slots, 4096 B] S and [20, 384] conv
 * per layer), registered as K3_XFER_MEM_CUDA with a mapping blob (no rkey: this UCX has no CUDA).
 * The sender's sources are fake device memory too, MLA ones scattered (units of 512 B out of
 * order) so segments split, and merge, at unit boundaries on both sides. cuda-ipc: the sender
 * maps the arena through the blob and its device jobs copy + hash; the receiver verifies each
 * layer with a hash-only job. Contents are pseudo-random from a seed both sides know, so the
 * receiver checks bit identity through its shadow view independently of the digests.
 * cuda-pull (cfg pull): the sender exports its source area (its blob in send opts src_pools),
 * the receiver offers pull in its descriptors, maps the sender's area from the SRC message and
 * copies + hashes with its own jobs; the digests come from the sender's hash-only jobs (pull 1)
 * or from the "producer" (pull 2: computed by the test before the send, handed over with
 * k3_xfer_send_layer_ready_digests). */
#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_dev.h"
#include "k3pd/digest.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/xfer.h"

#define R_PAGES 128
#define R_SLOTS 20
#define PAGE_B 1024 /* 16 tokens x 64 B */
#define TOK_B 64
#define N_TOK 37
#define S_B 4096
#define CONV_B 384
#define N_REG 6
#define MAX_REQ 16
#define BLOCK 8192 /* sender: one source block per (request, region) */
#define SRC_UNIT 512
#define FP 0x5eedf00dull
/* Arena: MLA layers' tensors, then per KDA layer S and conv tensors. */
#define A_MLA(l) ((uint64_t)(l) * R_PAGES * PAGE_B)
#define A_S(l) (2ull * R_PAGES * PAGE_B + (uint64_t)(l) * R_SLOTS * (S_B + CONV_B))
#define A_C(l) (A_S(l) + (uint64_t)R_SLOTS * S_B)
#define ARENA (2ull * R_PAGES * PAGE_B + 2ull * R_SLOTS * (S_B + CONV_B))

enum { D_OK, D_STALE, D_DIGEST, D_SENDER_DIES, D_RECV_DIES, D_STAGED, D_REJECT /* nothing done wrong here */ };

typedef struct {
  int mode, n_req, async_us;
  bool together; /* every layer signalled in one go (a finished state), no loop turn between */
  int pull;      /* 0 push (cuda-ipc); 1 cuda-pull, sender hashes; 2 cuda-pull, producer digests */
  bool no_pull;  /* receiver: k3_xfer_recv_opts_t no_pull (the sender must fall back to cuda-ipc) */
  bool recv_nomap; /* receiver: offers pull but its map hook refuses (SRC refused, K3_EDEVICE) */
  const char *pull_job; /* receiver: K3PD_XFER_PULL_JOB_MIB (pull jobs cut by size) or NULL */
} cfg_t;

typedef struct { /* receiver → test */
  int ready, bit_identical, released, live, quarantined, flipped, maps, maps_ro, segs;
  k3_xfer_stats_t st;
} rres_t;

typedef struct { /* sender → test */
  int fired, status[MAX_REQ], done[MAX_REQ];
  int path[MAX_REQ];
  uint64_t t_done[MAX_REQ];
  k3_xfer_stats_t st;
  int maps, maps_ro, segs;
} sres_t;

static void regions(k3_xfer_region_t *rg) {
  for (uint32_t l = 0; l < 2; l++) {
    rg[l * 2] = (k3_xfer_region_t){K3_XFER_KIND_KDA_S, 0, 1, l, A_S(l), S_B, S_B, S_B};
    rg[l * 2 + 1] = (k3_xfer_region_t){K3_XFER_KIND_KDA_CONV, 0, 1, l, A_C(l), CONV_B, CONV_B, CONV_B};
    rg[4 + l] = (k3_xfer_region_t){K3_XFER_KIND_MLA_KV, 0, 0, 2 + l, A_MLA(l), PAGE_B, PAGE_B, N_TOK * TOK_B};
  }
}
/* Pages 0 and 1 of a request are consecutive: inside the arena's tensor (stride == unit) they
 * form one run (one segment, one copy); page 2 is elsewhere. */
static void pages_of(int i, uint32_t p[3]) {
  p[0] = (uint32_t)(3 * i + 7), p[1] = (uint32_t)(3 * i + 8), p[2] = (uint32_t)(R_PAGES - 1 - i);
}

static uint8_t expect_byte(uint64_t req, uint32_t reg, uint64_t off) {
  uint64_t x = (req * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)reg << 40) ^ (off / 8);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return (uint8_t)(x >> (8 * (off % 8)));
}

/* Where the receiver keeps byte `off` of region `reg` of request i (offset into its arena). */
static uint64_t recv_off(const k3_xfer_region_t *rg, int i, uint32_t reg, uint64_t off) {
  uint32_t pages[3];
  pages_of(i, pages);
  const k3_xfer_region_t *g = &rg[reg];
  uint64_t idx = g->list == 0 ? pages[off / g->unit_bytes] : (uint64_t)(i % R_SLOTS);
  return g->offset_bytes + idx * g->stride_bytes + off % g->unit_bytes;
}

/* Where the sender keeps byte `off` of region `reg` of request i (offset into its source
 * arena): MLA regions in 512-byte units, back to back, in the order 0 1 3 2 4 (units 0-1 are
 * one run, the others single): segments split wherever either side stops being contiguous. */
static const uint32_t SRC_IDX[5] = {0, 1, 3, 2, 4};
static uint64_t src_off(int i, uint32_t reg, uint64_t off) {
  uint64_t block = ((uint64_t)i * N_REG + reg) * BLOCK;
  if (reg < 4) return block + off;
  return block + SRC_IDX[off / SRC_UNIT] * (uint64_t)SRC_UNIT + off % SRC_UNIT;
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
  fake_dev_t dev;
  uint8_t *shadow; /* the arena's read-write view (device pools), or the host pool */
  uint8_t *h2d;    /* staged: what h2d delivered, per (request, region) at recv_off */
  rres_t res;
  k3_xfer_region_t rg[N_REG];
} rctx_t;

static void on_ready(void *ud, const k3_xfer_ready_t *r) {
  rctx_t *x = ud;
  x->res.ready++;
  if (r->first_token != 1000 + r->request_id) x->res.bit_identical = -1000;
}
static void on_release(void *ud, uint64_t id, void *owner) { ((rctx_t *)ud)->res.released++; }
/* Corrupts byte 100 of region 0 (KDA S, layer 0) through the shadow, before every verification
 * step (idempotent: whichever step verifies region 0 sees the bad byte). */
static void flip(void *ud, uint64_t id) {
  rctx_t *x = ud;
  if (x->c.mode != D_DIGEST) return;
  x->res.flipped++;
  x->shadow[recv_off(x->rg, (int)id, 0, 100)] = (uint8_t)~expect_byte(id, 0, 100);
}
static int h2d(void *ud, uint64_t id, uint32_t reg, uint64_t off, const void *src, uint64_t len) {
  rctx_t *x = ud;
  for (uint64_t b = 0; b < len; b++) x->h2d[recv_off(x->rg, (int)id, reg, off + b)] = ((const uint8_t *)src)[b];
  return 0;
}

static void stop_cb(uv_timer_t *t) { uv_stop(t->loop); }
static void check_cb(uv_timer_t *t) {
  rctx_t *x = t->data;
  bool done = x->c.mode == D_SENDER_DIES ? x->res.released == 1
              : x->c.mode == D_OK || x->c.mode == D_STAGED ? x->res.ready == x->c.n_req
                                                           : false;
  if (done) uv_stop(t->loop);
}

static int receiver(cfg_t c, int wfd, int resfd) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  rctx_t *x = calloc(1, sizeof *x);
  x->c = c;
  regions(x->rg);
  fake_dev_init(&x->dev, c.async_us);
  x->dev.refuse_map = c.recv_nomap;
  if (c.pull_job) setenv("K3PD_XFER_PULL_JOB_MIB", c.pull_job, 1); /* this (forked) process only */
  k3_xfer_ctx_t *ctx;
  k3_xfer_ctx_opts_t o = {.tls = "shm"};
  if (k3_xfer_ctx_init(&loop, &o, &ctx)) return 10;
  k3_xfer_pool_t *pool;
  if (c.mode == D_STAGED) { /* staged: the receiver's pools are host memory */
    if (k3_xfer_pool_alloc_host(ctx, ARENA, &pool)) return 11;
    x->shadow = k3_xfer_pool_base(pool);
    x->h2d = calloc(1, ARENA);
  } else {
    void *dev;
    const char *blob;
    if (fake_dev_alloc(&x->dev, ARENA, &dev, &x->shadow, &blob)) return 11;
    if (k3_xfer_pool_register(ctx, dev, ARENA, K3_XFER_MEM_CUDA, (const uint8_t *)blob,
                              (uint32_t)strlen(blob), &pool))
      return 11;
  }
  k3_xfer_stage_t stage = {.h2d = h2d, .ud = x};
  k3_xfer_recv_opts_t ro = {.on_ready = on_ready, .on_release = on_release, .ud = x,
                            .quarantine_ms = c.mode == D_SENDER_DIES ? 300 : 2000,
                            .poison = true, .test_before_verify = flip,
                            .stage = c.mode == D_STAGED ? &stage : NULL,
                            .dev = c.mode == D_STAGED ? NULL : &x->dev.hooks, .no_pull = c.no_pull};
  k3_xfer_recv_t *r;
  if (k3_xfer_recv_init(ctx, &ro, &r)) return 12;
  uint32_t lease = c.mode == D_SENDER_DIES ? 500 : 8000;
  for (int i = 0; i < c.n_req; i++) {
    uint32_t pages[3], slot = (uint32_t)(i % R_SLOTS);
    pages_of(i, pages);
    k3_xfer_layout_t lay = {.n_pools = 1, .pools = {pool}, .n_lists = 2,
                            .lists = {{3, pages}, {1, &slot}}, .n_regions = N_REG, .regions = x->rg};
    k3_xfer_desc_t *d;
    if (k3_xfer_recv_reserve(r, &lay, (uint64_t)i, FP, lease, NULL, &d)) return 13;
    /* Pull is offered exactly when the hooks can map and it was not switched off. */
    bool offer = c.mode != D_STAGED && !c.no_pull;
    if (!(d->flags & K3_XFER_DESC_F_PULL) != !offer) return 15;
    uint8_t *buf;
    size_t len;
    if (k3_xfer_desc_encode(d, &buf, &len)) return 14;
    uint32_t l32 = (uint32_t)len;
    wr(wfd, &l32, 4);
    wr(wfd, buf, len);
    free(buf);
    k3_xfer_desc_free(d);
  }
  uv_timer_t stop, chk;
  uv_timer_init(&loop, &stop);
  uv_timer_init(&loop, &chk);
  chk.data = x;
  bool want_ok = c.mode == D_OK || c.mode == D_STAGED;
  uv_timer_start(&stop, stop_cb, want_ok ? 15000 : 2500, 0);
  uv_timer_start(&chk, check_cb, 5, 5);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (x->res.bit_identical == 0 && x->res.ready > 0) { /* read back through the shadow */
    x->res.bit_identical = 1;
    for (int i = 0; i < c.n_req; i++)
      for (uint32_t reg = 0; reg < N_REG; reg++)
        for (uint64_t off = 0; off < x->rg[reg].len_bytes; off++) {
          uint64_t at = recv_off(x->rg, i, reg, off);
          uint8_t want = expect_byte((uint64_t)i, reg, off);
          if (x->shadow[at] != want || (x->h2d && x->h2d[at] != want)) x->res.bit_identical = 0;
        }
  }
  x->res.live = (int)k3_xfer_recv_live(r);
  x->res.quarantined = (int)k3_xfer_recv_quarantined(r);
  k3_xfer_ctx_stats(ctx, &x->res.st);
  x->res.maps = x->dev.maps;
  x->res.maps_ro = x->dev.maps_ro;
  x->res.segs = x->dev.segs;
  k3_xfer_recv_free(r);
  k3_xfer_pool_free(pool);
  k3_xfer_ctx_close(ctx);
  uv_close((uv_handle_t *)&stop, NULL);
  uv_close((uv_handle_t *)&chk, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  wr(resfd, &x->res, sizeof x->res);
  fake_dev_free_all(&x->dev);
  free(x->h2d);
  free(x);
  return 0;
}

/* ---- sender ------------------------------------------------------------------------------- */

typedef struct {
  sres_t *res;
  int i;
} sud_t;

static void sent(void *ud, const k3_xfer_send_result_t *r) {
  sud_t *u = ud;
  u->res->status[u->i] = r->status;
  u->res->path[u->i] = (int)r->path;
  u->res->done[u->i] = 1;
  u->res->t_done[u->i] = k3_now_ns();
  u->res->fired++;
}

static uint8_t *g_src_shadow; /* the sender's source arena, read-write view */
/* Staged: d2h reads the source through the shadow (a real one would cudaMemcpy). */
static int d2h(void *ud, uint32_t reg, uint64_t off, void *dst, uint64_t len) {
  int i = (int)(intptr_t)ud;
  for (uint64_t b = 0; b < len; b++) ((uint8_t *)dst)[b] = g_src_shadow[src_off(i, reg, off + b)];
  return 0;
}

static void sstop_cb(uv_timer_t *t) {
  sres_t *s = t->data;
  if (s->fired == *(int *)t->loop->data) uv_stop(t->loop);
}

static int sender(cfg_t c, int rfd, pid_t victim, sres_t *out, uint64_t *t_start) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  int n = c.n_req;
  loop.data = &n;
  memset(out, 0, sizeof *out);
  fake_dev_t *fd = calloc(1, sizeof *fd);
  fake_dev_init(fd, c.async_us);
  void *src_dev;
  const char *sblob;
  if (fake_dev_alloc(fd, (size_t)MAX_REQ * N_REG * BLOCK, &src_dev, &g_src_shadow, &sblob)) return 19;
  k3_xfer_src_pool_t spool = {.base = src_dev, .size_bytes = (uint64_t)MAX_REQ * N_REG * BLOCK,
                              .blob = (const uint8_t *)sblob, .blob_len = (uint32_t)strlen(sblob)};
  uint64_t pdig[MAX_REQ][N_REG]; /* the producer's digests (pull 2) */
  k3_digest_t dg;
  if (k3_digest_init(&dg)) return 19;
  k3_xfer_ctx_t *ctx;
  k3_xfer_ctx_opts_t o = {.tls = "shm"};
  if (k3_xfer_ctx_init(&loop, &o, &ctx)) return 20;
  k3_xfer_desc_t *d[MAX_REQ];
  k3_xfer_src_t src[MAX_REQ][N_REG];
  k3_xfer_send_t *s[MAX_REQ];
  sud_t ud[MAX_REQ];
  for (int i = 0; i < n; i++) {
    uint32_t len;
    if (rd(rfd, &len, 4)) return 21;
    uint8_t *buf = malloc(len);
    if (rd(rfd, buf, len)) return 22;
    if (k3_xfer_desc_decode(buf, len, &d[i], NULL, 0)) return 23;
    free(buf);
    if (c.mode == D_STALE) d[i]->epoch--;
    for (uint32_t r = 0; r < N_REG; r++) {
      for (uint64_t b = 0; b < d[i]->regions[r].len_bytes; b++)
        g_src_shadow[src_off(i, r, b)] = expect_byte((uint64_t)i, r, b);
      uintptr_t block = (uintptr_t)src_dev + ((uint64_t)i * N_REG + r) * BLOCK;
      src[i][r] = r < 4 ? (k3_xfer_src_t){.base = (const void *)block}
                        : (k3_xfer_src_t){.base = (const void *)block, .stride_bytes = SRC_UNIT,
                                          .idx = SRC_IDX, .n_idx = 5, .unit_bytes = SRC_UNIT};
      k3_digest_reset(&dg);
      for (uint64_t b = 0; b < d[i]->regions[r].len_bytes; b++) k3_digest_update(&dg, &g_src_shadow[src_off(i, r, b)], 1);
      pdig[i][r] = k3_digest_final(&dg);
    }
    /* cuda-pull, corruption: the source changes after its producer hashed it (a bit flip in
     * memory, a late writer); the receiver's pull hashes what it read and rejects. */
    if (c.pull && c.mode == D_DIGEST) g_src_shadow[src_off(i, 0, 100)] ^= 0x5a;
  }
  k3_digest_free(&dg);
  *t_start = k3_now_ns();
  for (int i = 0; i < n; i++) {
    ud[i] = (sud_t){out, i};
    k3_xfer_stage_t st = {.d2h = d2h, .ud = (void *)(intptr_t)i};
    k3_xfer_send_opts_t so = {.deadline_ms = 2000, .chunk_bytes = 1000, .max_inflight = 4,
                              .stage = c.mode == D_STAGED ? &st : NULL, .dev = &fd->hooks,
                              .src_pools = c.pull ? &spool : NULL, .n_src_pools = c.pull ? 1 : 0};
    if (k3_xfer_send_start(ctx, d[i], src[i], &so, sent, &ud[i], &s[i])) return 24;
    bool pull = c.pull && !c.no_pull;
    k3_xfer_path_t want = c.mode == D_STAGED ? K3_XFER_PATH_STAGED : pull ? K3_XFER_PATH_CUDA_PULL : K3_XFER_PATH_CUDA_IPC;
    if (k3_xfer_send_path(s[i]) != want) return 25;
    if (strcmp(k3_xfer_send_mode(s[i]), c.mode == D_STAGED ? "direct" : pull ? "pull" : "job")) return 28;
  }
  for (uint32_t l = 0; l < 4; l++) {
    for (int i = 0; i < n; i++) {
      if (out->done[i]) continue;
      int rc;
      if (c.pull == 2) { /* layer l's regions in ascending order: 0-1, 2-3, 4, 5 */
        uint32_t r0 = l < 2 ? 2 * l : 2 + l, nr = l < 2 ? 2 : 1;
        if (k3_xfer_send_layer_regions(s[i], l) != nr) return 29;
        rc = k3_xfer_send_layer_ready_digests(s[i], l, &pdig[i][r0], nr);
      } else {
        rc = k3_xfer_send_layer_ready(s[i], l);
      }
      if (rc && victim <= 0) return 26;
    }
    if (l == 0 && victim > 0) {
      uv_run(&loop, UV_RUN_NOWAIT);
      kill(victim, SIGKILL);
      waitpid(victim, NULL, 0);
    }
    if (c.mode == D_SENDER_DIES) {
      uv_run(&loop, UV_RUN_NOWAIT);
      _exit(0); /* mid-transfer: layer 0 pushed, no DONE ever */
    }
    if (!c.together) uv_run(&loop, UV_RUN_NOWAIT); /* some compute happens between layers */
  }
  for (int i = 0; i < n; i++)
    if (!out->done[i] && k3_xfer_send_finish(s[i], 1000 + (uint32_t)i, -0.5f) && victim <= 0) return 27;
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  t.data = out;
  uv_timer_start(&t, sstop_cb, 2, 2);
  uv_run(&loop, UV_RUN_DEFAULT); /* every send has a deadline: this returns */
  uv_close((uv_handle_t *)&t, NULL);
  k3_xfer_ctx_stats(ctx, &out->st);
  out->maps = fd->maps;
  out->maps_ro = fd->maps_ro;
  out->segs = fd->segs;
  k3_xfer_ctx_close(ctx);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  for (int i = 0; i < n; i++) k3_xfer_desc_free(d[i]);
  fake_dev_free_all(fd);
  free(fd);
  return 0;
}

/* ---- scenarios ------------------------------------------------------------------------------ */

static void run(cfg_t c, rres_t *rr, sres_t *sr) {
  int p1[2];
  ck_assert_int_eq(pipe(p1), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(p1[0]);
    _exit(receiver(c, p1[1], p1[1]));
  }
  close(p1[1]);
  uint64_t t0;
  int rc = sender(c, p1[0], c.mode == D_RECV_DIES ? pid : 0, sr, &t0);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(sr->fired, c.n_req);
  if (c.mode == D_RECV_DIES) {
    for (int i = 0; i < c.n_req; i++) {
      ck_assert_msg(sr->status[i] == K3_ETIMEDOUT || sr->status[i] == K3_ETRANSPORT, "status %s",
                    k3_errname(sr->status[i]));
      ck_assert_uint_lt(sr->t_done[i] - t0, 2600000000ull); /* deadline 2 s + slack */
    }
    close(p1[0]);
    return;
  }
  ck_assert_int_eq(rd(p1[0], rr, sizeof *rr), 0);
  int st;
  waitpid(pid, &st, 0);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "receiver exit %d", st);
  close(p1[0]);
}

static void expect_ok_cfg(cfg_t c);
static void expect_ok(int mode, int n, int async_us) { expect_ok_cfg((cfg_t){mode, n, async_us, false, 0, false, false, NULL}); }
static void expect_ok_cfg(cfg_t c) {
  int mode = c.mode, n = c.n_req;
  rres_t rr = {0};
  sres_t sr;
  run(c, &rr, &sr);
  bool pull = c.pull && !c.no_pull && !c.recv_nomap; /* recv_nomap: started as pull, redone as cuda-ipc */
  const uint64_t bytes = (uint64_t)n * (S_B + CONV_B + N_TOK * TOK_B) * 2;
  for (int i = 0; i < n; i++) {
    ck_assert_msg(sr.status[i] == 0, "send %d: %s", i, k3_errname(sr.status[i]));
    ck_assert_int_eq(sr.path[i], mode == D_STAGED ? K3_XFER_PATH_STAGED
                                 : pull           ? K3_XFER_PATH_CUDA_PULL
                                                  : K3_XFER_PATH_CUDA_IPC);
  }
  ck_assert_int_eq(rr.ready, n);
  ck_assert_int_eq(rr.bit_identical, 1);
  ck_assert_uint_eq(rr.st.done_accepted, (uint64_t)n);
  ck_assert_int_eq(rr.released, n);
  /* Every layer was verified from its LAYER announcement, before DONE. */
  ck_assert_uint_eq(rr.st.layers_verified, 4u * (uint64_t)n);
  if (pull) {
    /* The receiver moved every byte with its own jobs (at most one per layer, none for DONE:
     * every layer was pulled from its LAYER), reading the sender's area mapped once; the sender
     * only hashed (pull 1: hash-only jobs, the same 12 source segments per request) or did
     * nothing on the device (pull 2: the producer's digests). */
    ck_assert_uint_eq(rr.st.pulls, (uint64_t)n);
    ck_assert_uint_eq(rr.st.pull_refused, 0);
    ck_assert_uint_eq(rr.st.pull_bytes, bytes);
    ck_assert_uint_eq(sr.st.path_bytes[K3_XFER_PATH_CUDA_PULL], bytes);
    ck_assert_msg(rr.st.dev_jobs >= (uint64_t)n && rr.st.dev_jobs <= 4u * (uint64_t)n, "receiver jobs %llu",
                  (unsigned long long)rr.st.dev_jobs);
    ck_assert_int_eq(rr.maps, 1);
    ck_assert_int_eq(rr.maps_ro, 1); /* the sender's state mapped read-only: a pull never writes it */
    ck_assert_int_eq(rr.segs, 12 * n);
    if (c.pull == 2) {
      ck_assert_uint_eq(sr.st.dev_jobs, 0);
      ck_assert_int_eq(sr.segs, 0);
    } else {
      ck_assert_msg(sr.st.dev_jobs >= (uint64_t)n && sr.st.dev_jobs <= 4u * (uint64_t)n, "sender jobs %llu",
                    (unsigned long long)sr.st.dev_jobs);
      ck_assert_int_eq(sr.segs, 12 * n);
    }
    ck_assert_uint_eq(rr.st.data_eager + rr.st.data_rndv + rr.st.data_dropped, 0);
    if (c.together && !c.pull_job) ck_assert_uint_eq(rr.st.dev_jobs, (uint64_t)n); /* one pull job per finished state */
    if (c.together && c.pull_job) /* at most 5 KiB of whole regions a job: S0+conv0 | S1+conv1 | MLA2+MLA3 */
      ck_assert_uint_eq(rr.st.dev_jobs, 3u * (uint64_t)n);
  } else if (mode == D_STAGED) {
    ck_assert_uint_eq(sr.st.dev_jobs, 0);
    ck_assert_uint_eq(sr.st.path_bytes[K3_XFER_PATH_STAGED], (uint64_t)n * (S_B + CONV_B + N_TOK * TOK_B) * 2);
  } else {
    /* At most one copy+hash job per layer on the sender and one hash job per layer on the
     * receiver (layers signalled or announced together share a job; no DONE remainder: every
     * layer was verified from its LAYER, above), one mapping of the arena for all sends,
     * nothing through UCX data. A cuda-pull redone as cuda-ipc (recv_nomap) whose sender hashed
     * first (pull 1) may have run hash jobs too before the refusal came (at most as many, over
     * the same 12 source segments; how many depends on timing). */
    const int hashed_first = c.recv_nomap && c.pull == 1 ? 2 : 1;
    ck_assert_msg(sr.st.dev_jobs >= (uint64_t)n && sr.st.dev_jobs <= 4u * hashed_first * (uint64_t)n,
                  "sender jobs %llu", (unsigned long long)sr.st.dev_jobs);
    ck_assert_msg(rr.st.dev_jobs >= (uint64_t)n && rr.st.dev_jobs <= 4u * (uint64_t)n, "receiver jobs %llu",
                  (unsigned long long)rr.st.dev_jobs);
    ck_assert_int_eq(sr.maps, 1);
    ck_assert_int_eq(sr.maps_ro, 0); /* a push writes the receiver's pool: mapped read-write */
    /* Per request: S and conv one segment each (x2 layers); each MLA region 4: source runs
     * [0,1024) [1024,1536) [1536,2048) [2048,2368) inside destination runs [0,2048) (pages 0-1
     * back to back) and [2048,2368). */
    ck_assert_msg(sr.segs >= 12 * n && sr.segs <= 12 * n * hashed_first, "sender segments %d", sr.segs);
    ck_assert_uint_eq(sr.st.path_bytes[K3_XFER_PATH_CUDA_IPC], (uint64_t)n * (S_B + CONV_B + N_TOK * TOK_B) * 2);
    ck_assert_uint_eq(rr.st.data_eager + rr.st.data_rndv + rr.st.data_dropped, 0);
  }
  if (c.together && mode == D_OK && !pull) {
    /* A finished state: ONE copy job per request, its layers announced by one LAYER run (wire
     * v4) and verified by ONE receiver job, still counted layer by layer. */
    ck_assert_uint_eq(sr.st.dev_jobs, (uint64_t)n);
    ck_assert_uint_eq(rr.st.dev_jobs, (uint64_t)n);
  }
}

START_TEST(test_ipc_ok) { expect_ok(D_OK, 1, 0); }

START_TEST(test_ipc_together) { expect_ok_cfg((cfg_t){D_OK, 1, 0, true, 0, false, false, NULL}); }
END_TEST
START_TEST(test_ipc_ok_async) { expect_ok(D_OK, 2, 3000); } /* notify from job threads */
END_TEST
START_TEST(test_ipc_many) { expect_ok(D_OK, 16, 500); }
END_TEST
START_TEST(test_staged_dev_src) { expect_ok(D_STAGED, 1, 0); }
END_TEST

static void expect_reject_cfg(cfg_t c, int code, size_t counter_off) {
  rres_t rr = {0};
  sres_t sr;
  run(c, &rr, &sr);
  ck_assert_msg(sr.status[0] == code, "sender got %s, want %s", k3_errname(sr.status[0]), k3_errname(code));
  ck_assert_int_eq(rr.ready, 0);
  ck_assert_uint_eq(*(uint64_t *)((char *)&rr.st + counter_off), 1);
  ck_assert_uint_eq(rr.st.done_accepted, 0);
}
static void expect_reject(int mode, int code, size_t counter_off, int async_us) {
  expect_reject_cfg((cfg_t){mode, 1, async_us, false, 0, false, false, NULL}, code, counter_off);
}
START_TEST(test_ipc_digest) {
  /* Corruption through the shadow before the verification job: K3_EDIGEST. */
  expect_reject(D_DIGEST, K3_EDIGEST, offsetof(k3_xfer_stats_t, done_rejected_digest), 1000);
}
END_TEST
START_TEST(test_ipc_stale) { expect_reject(D_STALE, K3_ESTALE, offsetof(k3_xfer_stats_t, done_rejected_stale), 0); }
END_TEST

/* ---- cuda-pull ---- */
START_TEST(test_pull_ok) { expect_ok_cfg((cfg_t){D_OK, 1, 0, false, 1, false, false, NULL}); }
END_TEST
START_TEST(test_pull_producer) { expect_ok_cfg((cfg_t){D_OK, 2, 0, false, 2, false, false, NULL}); }
END_TEST
START_TEST(test_pull_together) { expect_ok_cfg((cfg_t){D_OK, 1, 0, true, 2, false, false, NULL}); }
END_TEST
START_TEST(test_pull_split) {
  /* A finished state pulled in jobs of ~5 KiB (whole regions), queued back to back. */
  cfg_t c = {D_OK, 1, 0, true, 2, false, false, NULL};
  c.pull_job = "5K";
  expect_ok_cfg(c);
}
END_TEST
START_TEST(test_pull_many_async) { expect_ok_cfg((cfg_t){D_OK, 16, 500, false, 1, false, false, NULL}); }
END_TEST
START_TEST(test_pull_fallback) {
  /* The receiver does not offer pull: the sender's exported pools are not used, cuda-ipc is. */
  expect_ok_cfg((cfg_t){D_OK, 1, 0, false, 2, true, false, NULL});
}
END_TEST
START_TEST(test_pull_digest) {
  /* The source changed after its producer's digest: the receiver's pull hashes what it read. */
  cfg_t c = {D_DIGEST, 1, 1000, false, 2, false, false, NULL};
  expect_reject_cfg(c, K3_EDIGEST, offsetof(k3_xfer_stats_t, done_rejected_digest));
}
END_TEST
START_TEST(test_pull_stale) {
  cfg_t c = {D_STALE, 1, 0, false, 1, false, false, NULL};
  expect_reject_cfg(c, K3_ESTALE, offsetof(k3_xfer_stats_t, done_rejected_stale));
}
END_TEST
START_TEST(test_pull_unmappable) {
  /* Offered, but the receiver cannot map the sender's area: it answers SRC with K3_ENOTSUP and
   * the sender redoes the send as cuda-ipc (push into the receiver's pools), accepted. */
  cfg_t c = {D_OK, 2, 0, false, 2, false, true, NULL};
  expect_ok_cfg(c);
  /* the same with the sender hashing (its jobs still running when the refusal comes) */
  expect_ok_cfg((cfg_t){D_OK, 2, 1000, false, 1, false, true, NULL});
  rres_t rr = {0};
  sres_t sr;
  c.n_req = 1;
  c.together = true;
  run(c, &rr, &sr);
  ck_assert_int_eq(sr.status[0], 0);
  ck_assert_int_eq(sr.path[0], K3_XFER_PATH_CUDA_IPC);
  ck_assert_uint_eq(sr.st.pull_fallbacks, 1);
  ck_assert_uint_eq(rr.st.pull_refused, 1);
  ck_assert_uint_eq(rr.st.pulls, 0);
  ck_assert_int_eq(rr.bit_identical, 1);
}
END_TEST

START_TEST(test_ipc_receiver_dies) {
  cfg_t c = {D_RECV_DIES, 2, 1000, false, 0, false, false, NULL};
  rres_t rr;
  sres_t sr;
  run(c, &rr, &sr);
}
END_TEST

START_TEST(test_ipc_sender_dies) {
  /* Receiver here, sender in a child that exits after layer 0. */
  cfg_t c = {D_SENDER_DIES, 1, 0, false, _i, false, false, NULL}; /* push, then pull (the loop index) */
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
  pid_t rp = fork();
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
  /* Lease expired, quarantined, released once; device memory is not poisoned (counted). */
  ck_assert_int_eq(rr.ready, 0);
  ck_assert_int_eq(rr.released, 1);
  ck_assert_int_eq(rr.live, 0);
  ck_assert_int_eq(rr.quarantined, 0);
  ck_assert_uint_eq(rr.st.leases_expired, 1);
  ck_assert_uint_eq(rr.st.slots_quarantined, 1);
  ck_assert_uint_eq(rr.st.slots_poisoned, 0);
  ck_assert_uint_eq(rr.st.poison_skipped, 1);
  ck_assert_uint_eq(rr.st.done_accepted, 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("xfer_dev");
  TCase *tc = tcase_create("fake_device");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_ipc_ok);
  tcase_add_test(tc, test_ipc_together);
  tcase_add_test(tc, test_ipc_ok_async);
  tcase_add_test(tc, test_ipc_many);
  tcase_add_test(tc, test_staged_dev_src);
  tcase_add_test(tc, test_ipc_digest);
  tcase_add_test(tc, test_ipc_stale);
  tcase_add_test(tc, test_ipc_receiver_dies);
  tcase_add_loop_test(tc, test_ipc_sender_dies, 0, 2);
  tcase_add_test(tc, test_pull_ok);
  tcase_add_test(tc, test_pull_producer);
  tcase_add_test(tc, test_pull_together);
  tcase_add_test(tc, test_pull_split);
  tcase_add_test(tc, test_pull_many_async);
  tcase_add_test(tc, test_pull_fallback);
  tcase_add_test(tc, test_pull_digest);
  tcase_add_test(tc, test_pull_stale);
  tcase_add_test(tc, test_pull_unmappable);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? 1 : 0;
}
