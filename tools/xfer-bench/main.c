/* k3pd-xfer-bench: two processes move a state manifest's worth of regions over k3_xfer and
 * compare the bandwidth with a copy of the same bytes (host: one single-threaded memcpy).
 *
 * The receiver (forked child, its own UCX context) makes its pools from the plan (plan.c:
 * --layout paged = page-major KV pool + slot-major KDA pool; arena = every layer's tensor in one
 * pool), reserves 1 + --repeat requests (a warm-up and the measured ones) and sends the
 * descriptors over a pipe. The sender (parent) pushes layer by layer; with --layer-delay-us each
 * layer is signalled that long after the previous one (simulated compute), and the bench
 * reports how long after the last layer's signal the transfer finished. The measured time runs
 * from k3_xfer_send_start to the receiver's ACK (digests verified). Every measured transfer is
 * preceded by its own copy baseline (best of 3) and reports the sender's CPU time against the
 * baseline's; with --repeat > 1 a summary line gives min/median/max and RESULT carries the
 * medians. The library picks the data path (--path forces one) and the mode (direct mapping on
 * shm, DATA messages on tcp; --puts-only forces ucp_put_nbx). Memory and device hooks come from
 * one bench_mem_t (bench.h): --device host is built in; a device mode plugs in there.
 * Manifests: tiny (2 KDA layers of 64 KiB + 1 KiB, 2 MLA layers of 64 B/token) and k3 (spec
 * §10.2: 69 KDA layers of S 6,291,456 B + conv 221,184 B, 24 MLA layers of 1,152 B/token).
 * Last line: RESULT gbps=<x> memcpy_gbps=<y> ratio=<x/y> cpu_ratio=<baseline cpu / sender cpu>
 * path=<path> for the first --tls entry (medians).
 *
 * On the GPU host, once a device mode exists (bench.h: "--device cuda", one bench_mem_t):
 *   cuda-ipc:  k3pd-xfer-bench --device cuda --path cuda-ipc --layout arena --manifest k3 \
 *                --tokens 1024 --repeat 5 --tls shm
 *   ucx-cuda:  LD_LIBRARY_PATH=<ucx-cuda>/lib UCX_MODULE_DIR=<ucx-cuda>/lib/ucx \
 *              UCX_TLS=cuda_ipc,cuda_copy,tcp k3pd-xfer-bench --device cuda --path ucx-cuda \
 *                --layout arena --manifest k3 --tokens 1024 --repeat 5 --tls default
 *              (--tls default = UCX_TLS from the environment; a --tls list is one run per entry)
 *   staged:    k3pd-xfer-bench --device cuda --path staged --manifest k3 --tokens 1024 --repeat 5 \
 *                --tls shm */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "k3pd/digest.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/log.h"
#include "k3pd/util.h"

static const bench_manifest_t M_TINY = {2, 2, 65536, 1024, 64};
static const bench_manifest_t M_K3 = {69, 24, 6291456, 221184, 1152};

static void wr(int fd, const void *b, size_t n) {
  for (size_t d = 0; d < n;) {
    ssize_t w = write(fd, (const char *)b + d, n - d);
    if (w <= 0) _exit(3);
    d += (size_t)w;
  }
}
static int rd(int fd, void *b, size_t n) {
  for (size_t d = 0; d < n;) {
    ssize_t r = read(fd, (char *)b + d, n - d);
    if (r <= 0) return -1;
    d += (size_t)r;
  }
  return 0;
}

static double cpu_ms_now(void) {
  struct timespec c;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
  return (double)c.tv_sec * 1e3 + (double)c.tv_nsec / 1e6;
}

/* ---- receiver process ---- */
static int g_ready, g_repeat = 1; /* transfers: 1 warm-up + g_repeat measured (+ g_stream) */
static int g_stream, g_inflight = 4; /* --stream N transfers with --inflight K in flight at once */
static int g_swarm;                  /* untimed transfers before the stream (K: every slot warm) */
static bool g_base_once;             /* --baseline once: one copy baseline before the transfers */
static bool g_producer = true;       /* --digests producer: layer digests computed before the send */
static uint64_t *g_pdig;             /* the producer's digests, per region (NULL: not computed) */
static uint64_t g_chunk_bytes;    /* 0 = library default */
static bool g_puts_only;
static bool g_trust; /* --verify sender: the receiver records the sender's device digests (measurement) */
static k3_xfer_path_t g_path;
static bench_mem_t g_mem;

/* --check: request 0 (the warm-up, alone in flight) is read back from the receiver's memory
 * and compared byte for byte with the source pattern when it is ready (before its ACK leaves);
 * one more transfer at the end has a source byte changed after the producer's digests and must be
 * rejected (K3_EDIGEST) on cuda-pull with producer digests. */
static bool g_check;
static int g_check_result = -1; /* receiver: 1 identical, 0 differs, -1 not checked */
static k3_xfer_desc_t *g_chk_desc;
static k3_xfer_pool_t *g_chk_pools[2];
static uint64_t g_chk_bytes;
static const bench_plan_t *g_rplan;
static int check_request0(void) {
  const k3_xfer_desc_t *d = g_chk_desc;
  uint64_t cap = 64ull << 20;
  uint8_t *h = malloc(cap);
  if (!h) return 0;
  int ok = 1;
  for (uint32_t r = 0; r < d->n_regions && ok; r++) {
    uint64_t len = d->regions[r].len_bytes, base_src = g_rplan->src_off[r];
    uint8_t *pb = k3_xfer_pool_base(g_chk_pools[d->regions[r].pool]);
    for (uint64_t off = 0; off < len && ok;) {
      uint64_t po, n;
      k3_xfer_region_locate(d, r, off, &po, &n);
      if (n > cap) n = cap;
      if (g_mem.d2h(g_mem.self, h, pb + po, n)) ok = 0;
      for (uint64_t b = 0; b < n && ok; b++) {
        uint64_t o = base_src + off + b;
        if (h[b] != (uint8_t)(o * 131 + (o >> 12))) {
          printf("  check: region %u byte %llu differs\n", r, (unsigned long long)(off + b));
          ok = 0;
        }
      }
      g_chk_bytes += n;
      off += n;
    }
  }
  free(h);
  return ok;
}
static void on_ready(void *ud, const k3_xfer_ready_t *r) {
  g_ready++;
  if (g_check && r->request_id == 0) g_check_result = check_request0();
}
static k3_xfer_ctx_t *g_rctx;
static void rstop(uv_timer_t *t) {
  k3_xfer_stats_t st;
  k3_xfer_ctx_stats(g_rctx, &st);
  int expect = 1 + g_repeat + g_stream + (g_check ? 1 : 0); /* the check's corrupt transfer: judged either way */
  if (g_ready + (int)st.done_rejected_digest >= expect + g_swarm) uv_stop(t->loop);
}
static void rdeadline(uv_timer_t *t) { uv_stop(t->loop); }

static int receiver(const bench_plan_t *p, const char *tls, int wfd) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  k3_xfer_ctx_t *ctx;
  k3_xfer_ctx_opts_t o = {.tls = tls};
  if (k3_xfer_ctx_init(&loop, &o, &ctx)) return 2;
  g_rctx = ctx;
  g_rplan = p;
  /* staged: the receiver's pools are host memory whatever the mode (device sources, d2h). */
  bool staged = g_path == K3_XFER_PATH_STAGED;
  k3_xfer_pool_t *pools[2] = {NULL, NULL};
  for (uint32_t i = 0; i < p->n_pools; i++)
    if (staged ? k3_xfer_pool_alloc_host(ctx, p->pool_bytes[i], &pools[i])
               : g_mem.pool_make(g_mem.self, ctx, p->pool_bytes[i], &pools[i]))
      return 2;
  k3_xfer_recv_opts_t ro = {.on_ready = on_ready, .dev = g_mem.dev(g_mem.self), .trust_sender_digests = g_trust};
  k3_xfer_recv_t *r;
  if (k3_xfer_recv_init(ctx, &ro, &r)) return 2;
  uint32_t *pages = malloc((p->n_pages ? p->n_pages : 1) * sizeof(uint32_t)), slot;
  g_chk_pools[0] = pools[0];
  g_chk_pools[1] = pools[1];
  for (uint64_t id = 0; id < (uint64_t)(1 + g_repeat + g_swarm + g_stream + (g_check ? 1 : 0)); id++) {
    bench_plan_seq(p, (uint32_t)id, pages, &slot); /* requests in flight together: own pages, slot */
    k3_xfer_layout_t lay = {.n_pools = p->n_pools, .pools = {pools[0], pools[1]}, .n_lists = 2,
                            .lists = {{p->n_pages, pages}, {1, &slot}},
                            .n_regions = p->n_regions, .regions = p->rg};
    k3_xfer_desc_t *d;
    uint8_t *buf;
    size_t len;
    if (k3_xfer_recv_reserve(r, &lay, id, 0xB0B, 600000, NULL, &d) || k3_xfer_desc_encode(d, &buf, &len))
      return 2;
    uint32_t l32 = (uint32_t)len;
    wr(wfd, &l32, 4);
    wr(wfd, buf, len);
    free(buf);
    if (id == 0 && g_check) g_chk_desc = d;
    else k3_xfer_desc_free(d);
  }
  uv_timer_t t, dl;
  uv_timer_init(&loop, &t);
  uv_timer_init(&loop, &dl);
  uv_timer_start(&t, rstop, 1, 1);
  uv_timer_start(&dl, rdeadline, 120000, 0);
  double c0 = cpu_ms_now(); /* after the pools were faulted in */
  uv_run(&loop, UV_RUN_DEFAULT);
  double rcpu = cpu_ms_now() - c0;
  /* Give the last ACK a moment to leave before tearing down. */
  for (int i = 0; i < 50; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
  k3_xfer_stats_t st;
  k3_xfer_ctx_stats(ctx, &st);
  int n_tr = 1 + g_repeat + g_swarm + g_stream + (g_check ? 1 : 0);
  if (g_check)
    printf("%s check: request 0 read back from the receiver's memory: %s (%llu bytes); corrupt transfer: %llu "
           "rejected for digests\n", g_check_result == 1 ? "PASS" : "FAIL",
           g_check_result == 1 ? "bit-identical to the source" : g_check_result == 0 ? "DIFFERS" : "not checked",
           (unsigned long long)g_chk_bytes, (unsigned long long)st.done_rejected_digest);
  k3_xfer_desc_free(g_chk_desc);
  g_chk_desc = NULL;
  printf("  receiver: %llu of %u layers verified as they landed (%d transfers), %llu accepted, "
         "%llu device jobs, %llu pulls (%llu bytes pulled, %llu refused), cpu %.2f ms per transfer\n",
         (unsigned long long)st.layers_verified, n_tr * p->n_layers, n_tr,
         (unsigned long long)st.done_accepted, (unsigned long long)st.dev_jobs, (unsigned long long)st.pulls,
         (unsigned long long)st.pull_bytes, (unsigned long long)st.pull_refused, rcpu / n_tr);
  fflush(stdout);
  k3_xfer_recv_free(r);
  for (uint32_t i = 0; i < p->n_pools; i++) {
    if (staged) k3_xfer_pool_free(pools[i]);
    else g_mem.pool_free(g_mem.self, pools[i]);
  }
  k3_xfer_ctx_close(ctx);
  uv_close((uv_handle_t *)&t, NULL);
  uv_close((uv_handle_t *)&dl, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  free(pages);
  if (g_mem.close) g_mem.close(g_mem.self); /* this (forked) process's share of the mode */
  return g_ready + (int)st.done_rejected_digest == n_tr && (!g_check || g_check_result == 1) ? 0 : 4;
}

/* ---- sender process ---- */
typedef struct {
  k3_xfer_send_t *s;
  uint32_t next_layer, n_layers;
  bool done;
  k3_xfer_send_result_t res;
  uint64_t last_signal_ns;
  const char *mode;
  void *stream; /* --stream: the stream_t it belongs to */
} sstate_t;

static void sent(void *ud, const k3_xfer_send_result_t *r) {
  sstate_t *st = ud;
  st->res = *r;
  st->done = true;
  uv_stop(uv_default_loop());
}
/* Layer l is final: with producer digests (computed when the state was made, as a prefill
 * kernel writing the layer would) they go with it; else the sender hashes (cuda-pull) or the
 * path hashes what it moves. */
static const bench_plan_t *g_plan;
static int signal_layer(k3_xfer_send_t *s, uint32_t l) {
  if (!g_pdig) return k3_xfer_send_layer_ready(s, l);
  uint64_t dg[8];
  uint32_t n = 0;
  for (uint32_t r = 0; r < g_plan->n_regions && n < 8; r++)
    if (g_plan->rg[r].layer == l) dg[n++] = g_pdig[r];
  return k3_xfer_send_layer_ready_digests(s, l, dg, n);
}
static void layer_tick(uv_timer_t *t) {
  sstate_t *st = t->data;
  if (st->done) return;
  signal_layer(st->s, st->next_layer++);
  if (st->next_layer == st->n_layers) {
    st->last_signal_ns = k3_now_ns();
    uv_timer_stop(t);
    k3_xfer_send_finish(st->s, 1, 0.0f);
  }
}

/* --path staged: region r's source is contiguous at g_src_mem + src_off[r] (plan.c). */
static uint8_t *g_src_mem;
static k3_xfer_src_pool_t g_spool; /* the exported sources (cuda-pull), size 0 when not */
static int stage_d2h(void *ud, uint32_t region, uint64_t off, void *dst, uint64_t len) {
  return g_mem.d2h(g_mem.self, dst, g_src_mem + g_plan->src_off[region] + off, len);
}

static int one_send(k3_xfer_ctx_t *ctx, const k3_xfer_desc_t *d, const k3_xfer_src_t *src,
                    uint32_t delay_us, sstate_t *st) {
  memset(st, 0, sizeof *st);
  st->n_layers = d->n_layers;
  static const k3_xfer_stage_t stage = {.d2h = stage_d2h};
  k3_xfer_send_opts_t so = {.deadline_ms = 120000, .chunk_bytes = g_chunk_bytes, .puts_only = g_puts_only,
                            .dev = g_mem.dev(g_mem.self), .path = g_path,
                            .stage = g_path == K3_XFER_PATH_STAGED ? &stage : NULL,
                            .src_pools = g_spool.size_bytes ? &g_spool : NULL, .n_src_pools = g_spool.size_bytes ? 1 : 0};
  int rc = k3_xfer_send_start(ctx, d, src, &so, sent, st, &st->s);
  if (rc) return rc;
  st->mode = k3_xfer_send_mode(st->s);
  uv_timer_t t;
  uv_timer_init(uv_default_loop(), &t);
  t.data = st;
  if (delay_us == 0) {
    for (uint32_t l = 0; l < d->n_layers; l++) signal_layer(st->s, l);
    st->last_signal_ns = k3_now_ns();
    k3_xfer_send_finish(st->s, 1, 0.0f);
  } else {
    uint64_t ms = (delay_us + 999) / 1000;
    uv_timer_start(&t, layer_tick, ms, ms);
  }
  while (!st->done) uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(uv_default_loop(), UV_RUN_NOWAIT);
  return st->res.status;
}

typedef struct {
  double gbps, memcpy_gbps, ratio, cpu_ratio, ceiling;
  const char *path;
} fig_t;

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
/* Median and range of v[0..n) (sorts v). */
static double stats3(double *v, int n, double *lo, double *hi) {
  qsort(v, (size_t)n, sizeof *v, cmp_dbl);
  *lo = v[0];
  *hi = v[n - 1];
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void report(const bench_plan_t *p, const char *tls, const sstate_t *st, double mc,
                   double mc_cpu_ms, double cpu_ms, long faults, uint32_t delay_us, double *gbps) {
  double secs = (double)(st->res.t_done_ns - st->res.t_start_ns) / 1e9;
  *gbps = (double)p->total_bytes / secs / 1e9;
  printf("tls=%-8s path=%s mode=%s bytes=%llu time_ms=%.2f gbps=%.2f memcpy_gbps=%.2f ratio=%.2f\n",
         tls ? tls : "default", k3_xfer_path_name(st->res.path), st->mode,
         (unsigned long long)p->total_bytes, secs * 1e3, *gbps, mc, *gbps / mc);
  for (int k = 1; k < K3_XFER_KIND_COUNT; k++)
    if (st->res.kind_bytes[k])
      printf("  %-9s bytes=%llu push_ms=%.2f gbps=%.2f\n", k3_xfer_kind_name((uint32_t)k),
             (unsigned long long)st->res.kind_bytes[k], st->res.kind_ns[k] / 1e6,
             st->res.kind_ns[k] ? (double)st->res.kind_bytes[k] / (double)st->res.kind_ns[k] : 0.0);
  printf("  flush+DONE+verify+ACK after the last byte: %.2f ms\n",
         (double)(st->res.t_done_ns - st->res.t_flushed_ns) / 1e6);
  printf("  sender: cpu %.2f ms for %.2f ms wall, %ld minor faults; copy baseline cpu %.2f ms "
         "(cpu ratio baseline/sender %.2f)\n",
         cpu_ms, secs * 1e3, faults, mc_cpu_ms, cpu_ms > 0 ? mc_cpu_ms / cpu_ms : 0.0);
  if (delay_us)
    printf("  overlap: layer delay %u us x %u layers; finished %.2f ms after the last layer's "
           "signal (one layer = %.2f ms)\n",
           delay_us, p->n_layers, (double)(st->res.t_done_ns - st->last_signal_ns) / 1e6,
           ((delay_us + 999) / 1000) * 1.0);
}

/* The producer's digests of every region's source (--digests producer), computed once before
 * any timed transfer: in serving the kernel that writes a layer's state would produce them (or
 * the sender hashes the layer while later layers are computed); here the state is finished
 * before the clock starts, so they are computed before it too, by one device job (or k3_digest
 * on the host). */
static int producer_digests(const bench_plan_t *p, const uint8_t *mem) {
  g_pdig = calloc(p->n_regions, sizeof(uint64_t));
  if (!g_pdig) return K3_ENOMEM;
  const k3_xfer_dev_t *dv = g_mem.dev(g_mem.self);
  if (!dv) {
    k3_digest_t dg;
    if (k3_digest_init(&dg)) return K3_ENOMEM;
    for (uint32_t r = 0; r < p->n_regions; r++) {
      k3_digest_reset(&dg);
      k3_digest_update(&dg, mem + p->src_off[r], p->rg[r].len_bytes);
      g_pdig[r] = k3_digest_final(&dg);
    }
    k3_digest_free(&dg);
    return 0;
  }
  k3_xfer_seg_t *segs = calloc(p->n_regions, sizeof *segs);
  uint32_t *first = calloc(p->n_regions + 1, sizeof *first);
  if (!segs || !first) return K3_ENOMEM;
  for (uint32_t r = 0; r < p->n_regions; r++) {
    segs[r] = (k3_xfer_seg_t){.src = mem + p->src_off[r], .dst = NULL, .len = p->rg[r].len_bytes};
    first[r + 1] = r + 1;
  }
  void *job = NULL;
  int rc = dv->submit(dv->ud, segs, first, p->n_regions, NULL, NULL, &job);
  while (!rc && (rc = dv->poll(dv->ud, job, g_pdig)) == 0) usleep(100);
  if (job) dv->release(dv->ud, job);
  free(segs);
  free(first);
  return rc == 1 ? 0 : rc ? rc : K3_EDEVICE;
}

/* ---- steady state: a stream of transfers, several in flight ---- */
typedef struct {
  k3_xfer_ctx_t *ctx;
  k3_xfer_desc_t **d;
  const k3_xfer_src_t *src;
  int next, end, done, failed, inflight;
  uint64_t *t_ns; /* per transfer: start → ACK */
  sstate_t *st;   /* one per transfer */
} stream_t;
static void stream_next(stream_t *sm);
static void stream_sent(void *ud, const k3_xfer_send_result_t *r) {
  sstate_t *st = ud;
  stream_t *sm = st->stream;
  st->res = *r;
  st->done = true;
  sm->inflight--;
  sm->done++;
  if (r->status) sm->failed++;
  stream_next(sm);
  if (sm->done == sm->end) uv_stop(uv_default_loop());
}
static void stream_next(stream_t *sm) {
  while (sm->inflight < g_inflight && sm->next < sm->end && !sm->failed) {
    int i = sm->next++;
    sstate_t *st = &sm->st[i];
    memset(st, 0, sizeof *st);
    st->stream = sm;
    k3_xfer_send_opts_t so = {.deadline_ms = 120000, .dev = g_mem.dev(g_mem.self), .path = g_path,
                              .src_pools = g_spool.size_bytes ? &g_spool : NULL,
                              .n_src_pools = g_spool.size_bytes ? 1 : 0};
    int rc = k3_xfer_send_start(sm->ctx, sm->d[i], sm->src, &so, stream_sent, st, &st->s);
    if (rc) {
      fprintf(stderr, "stream: transfer %d did not start: %s\n", i, k3_errname(rc));
      sm->failed++;
      sm->done++;
      continue;
    }
    sm->inflight++;
    for (uint32_t l = 0; l < sm->d[i]->n_layers; l++) signal_layer(st->s, l);
    k3_xfer_send_finish(st->s, 1, 0.0f);
  }
}

/* --stream N: N transfers (each into its own pages and slot, --inflight K of them at once) from
 * one start to the last ACK: the bandwidth of a stream of handoffs, where one transfer's fixed
 * latencies (messages, wake-ups, combines) overlap the others' copies. */
static void run_stream(const bench_plan_t *p, k3_xfer_ctx_t *ctx, k3_xfer_desc_t **d, const k3_xfer_src_t *src,
                       double mc) {
  /* Warm-up, untimed: --inflight transfers at once, so the receiver's device services hold a
   * buffer set (pinned tables, digests, events) per job in flight: steady state allocates
   * nothing, and the first use of a set costs milliseconds (cudaHostAlloc). */
  stream_t wm = {.ctx = ctx, .d = d, .src = src, .next = 0, .end = g_swarm};
  wm.st = calloc((size_t)g_swarm + 1, sizeof *wm.st);
  if (!wm.st) return;
  stream_next(&wm);
  while (wm.done < wm.end) uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  if (wm.failed) fprintf(stderr, "stream: %d warm-up transfers failed\n", wm.failed);
  free(wm.st);
  d += g_swarm;
  stream_t sm = {.ctx = ctx, .d = d, .src = src, .next = 0, .end = g_stream};
  sm.st = calloc((size_t)g_stream, sizeof *sm.st);
  if (!sm.st) return;
  uint64_t t0 = k3_now_ns();
  stream_next(&sm);
  while (sm.done < sm.end) uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  uint64_t t1 = k3_now_ns();
  double *lat = calloc((size_t)g_stream, sizeof(double));
  int n = 0;
  for (int i = 0; i < g_stream; i++)
    if (sm.st[i].done && !sm.st[i].res.status)
      lat[n++] = (double)(sm.st[i].res.t_done_ns - sm.st[i].res.t_start_ns) / 1e6;
  double lo = 0, hi = 0, med = n ? stats3(lat, n, &lo, &hi) : 0;
  double secs = (double)(t1 - t0) / 1e9, gbps = (double)p->total_bytes * n / secs / 1e9;
  const char *path = n ? k3_xfer_path_name(sm.st[0].res.path) : "none";
  printf("stream path=%s transfers=%d inflight=%d failed=%d wall_ms=%.2f gbps=%.2f memcpy_gbps=%.2f ratio=%.2f "
         "per-transfer start->ACK ms min/median/max=%.2f/%.2f/%.2f\n",
         path, g_stream, g_inflight, sm.failed, secs * 1e3, gbps, mc, mc > 0 ? gbps / mc : 0.0, lo, med, hi);
  printf("RESULT-STREAM gbps=%.2f memcpy_gbps=%.2f ratio=%.2f inflight=%d transfers=%d failed=%d path=%s\n", gbps,
         mc, mc > 0 ? gbps / mc : 0.0, g_inflight, n, sm.failed, path);
  free(lat);
  free(sm.st);
}

static int read_descs(int fd, int n, k3_xfer_desc_t **d) {
  for (int i = 0; i < n; i++) {
    uint32_t len;
    uint8_t *buf = NULL;
    if (rd(fd, &len, 4) || !(buf = malloc(len)) || rd(fd, buf, len) ||
        k3_xfer_desc_decode(buf, len, &d[i], NULL, 0)) {
      free(buf);
      for (int j = 0; j < i; j++) k3_xfer_desc_free(d[j]);
      return K3_EUNAVAIL;
    }
    free(buf);
  }
  return 0;
}

static int run_tls(const bench_plan_t *p, const char *tls, uint32_t delay_us, fig_t *fig) {
  int pp[2];
  if (pipe(pp)) return K3_EIO;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(pp[0]);
    _exit(receiver(p, tls, pp[1]));
  }
  close(pp[1]);
  int n_d = 1 + g_repeat + g_swarm + g_stream + (g_check ? 1 : 0);
  k3_xfer_desc_t **d = calloc((size_t)n_d, sizeof *d);
  if (read_descs(pp[0], n_d, d)) {
    fprintf(stderr, "receiver failed to start (tls=%s)\n", tls ? tls : "default");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    free(d);
    return K3_EUNAVAIL;
  }
  k3_xfer_ctx_t *ctx;
  k3_xfer_ctx_opts_t o = {.tls = tls};
  if (k3_xfer_ctx_init(uv_default_loop(), &o, &ctx)) return K3_ETRANSPORT;
  k3_xfer_src_t *src = calloc(p->n_regions, sizeof *src);
  void *mem = NULL;
  int rc = g_mem.src_alloc(g_mem.self, p->total_bytes, &mem);
  g_plan = p;
  g_src_mem = mem;
  for (uint32_t r = 0; !rc && r < p->n_regions; r++)
    src[r] = (k3_xfer_src_t){.base = (const void *)((uintptr_t)mem + p->src_off[r])};
  memset(&g_spool, 0, sizeof g_spool);
  if (!rc && g_mem.src_pool && g_mem.src_pool(g_mem.self, &g_spool)) memset(&g_spool, 0, sizeof g_spool);
  if (!rc && g_producer && (rc = producer_digests(p, mem)))
    fprintf(stderr, "producer digests: %s\n", k3_errname(rc));
  sstate_t st;
  if (!rc) rc = one_send(ctx, d[0], src, 0, &st); /* warm-up: endpoint, rkeys, transport caches */
  /* Each measured transfer is paired with a copy baseline taken just before it, so drift in the
   * machine's load hits both; the figures are the medians over --repeat runs. */
  double *g = calloc((size_t)g_repeat, sizeof(double)), *m = calloc((size_t)g_repeat, sizeof(double));
  double *ratio = calloc((size_t)g_repeat, sizeof(double)), *cr = calloc((size_t)g_repeat, sizeof(double));
  int done = 0;
  double once_cpu = 0, once = g_base_once ? g_mem.copy_gbps(g_mem.self, mem, p->total_bytes, &once_cpu) : 0;
  if (g_base_once) usleep(20000); /* the copy's context is long idle when the transfers start */
  for (int i = 0; i < g_repeat && !rc; i++) {
    double mc_cpu = once_cpu;
    m[i] = g_base_once ? once : g_mem.copy_gbps(g_mem.self, mem, p->total_bytes, &mc_cpu);
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    double c0 = cpu_ms_now();
    rc = one_send(ctx, d[1 + i], src, delay_us, &st);
    double cpu_ms = cpu_ms_now() - c0;
    getrusage(RUSAGE_SELF, &ru1);
    if (rc) break;
    report(p, tls, &st, m[i], mc_cpu, cpu_ms, ru1.ru_minflt - ru0.ru_minflt, delay_us, &g[i]);
    ratio[i] = g[i] / m[i];
    cr[i] = cpu_ms > 0 ? mc_cpu / cpu_ms : 0;
    fig->path = k3_xfer_path_name(st.res.path);
    done++;
  }
  if (rc) fprintf(stderr, "transfer failed (tls=%s): %s\n", tls ? tls : "default", k3_errname(rc));
  if (done) {
    double glo, ghi, rlo, rhi, clo, chi, mlo, mhi;
    fig->gbps = stats3(g, done, &glo, &ghi);
    fig->memcpy_gbps = stats3(m, done, &mlo, &mhi);
    fig->ratio = stats3(ratio, done, &rlo, &rhi);
    fig->cpu_ratio = stats3(cr, done, &clo, &chi);
    /* The ceiling of a device-to-device handoff on one GPU against cudaMemcpy (2 HBM passes:
     * read + write): the sender's fused copy reads and writes (2), the receiver's verification
     * re-reads what landed (1 more) unless --verify sender. */
    bool dev_path = fig->path && (!strcmp(fig->path, "cuda-ipc") || !strcmp(fig->path, "ucx-cuda"));
    bool pull = fig->path && !strcmp(fig->path, "cuda-pull");
    /* cuda-pull: the receiver's one job reads the sender's bytes and writes its own (2 passes,
     * verified end to end against the producer's digests); the sender hashing at layer_ready
     * (--digests sender) adds a read of the sources on the critical path of a finished state. */
    fig->ceiling = pull ? (g_producer ? 1.0 : 2.0 / 3.0) : dev_path ? (g_trust ? 1.0 : 2.0 / 3.0) : 1.0;
    if (dev_path)
      printf("ceiling verify=%s: %.2f of the copy (HBM passes: copy 2, this mode %d)\n", g_trust ? "sender" : "full",
             fig->ceiling, g_trust ? 2 : 3);
    if (pull)
      printf("ceiling cuda-pull digests=%s: %.2f of the copy (HBM passes: copy 2, this mode %d on the critical path)\n",
             g_producer ? "producer" : "sender", fig->ceiling, g_producer ? 2 : 3);
    if (done > 1)
      printf("summary tls=%s path=%s runs=%d gbps min/median/max=%.2f/%.2f/%.2f memcpy median=%.2f "
             "ratio min/median/max=%.2f/%.2f/%.2f cpu_ratio min/median/max=%.2f/%.2f/%.2f\n",
             tls ? tls : "default", fig->path, done, glo, fig->gbps, ghi, fig->memcpy_gbps, rlo,
             fig->ratio, rhi, clo, fig->cpu_ratio, chi);
  }
  if (!rc && g_stream) {
    double mc_cpu = 0, mc = g_mem.copy_gbps(g_mem.self, mem, p->total_bytes, &mc_cpu);
    run_stream(p, ctx, d + 1 + g_repeat, src, mc);
  }
  if (!rc && g_check) { /* a source byte changed after the producer hashed it */
    uint8_t b;
    uint8_t *at = (uint8_t *)mem + p->src_off[0] + 12345;
    int crc = g_mem.d2h(g_mem.self, &b, at, 1);
    b ^= 0x5a;
    if (!crc) crc = g_mem.d2h(g_mem.self, at, &b, 1);
    int st_rc = crc ? crc : one_send(ctx, d[n_d - 1], src, 0, &st);
    bool pull_prod = st.res.path == K3_XFER_PATH_CUDA_PULL && g_pdig;
    int want = pull_prod ? K3_EDIGEST : 0; /* the push paths hash what they copy: the change travels, verified */
    printf("%s check: a source byte changed after the producer's digest: path %s, status %s (want %s)\n",
           st_rc == want ? "PASS" : "FAIL", k3_xfer_path_name(st.res.path), k3_errname(st_rc), k3_errname(want));
    if (st_rc != want) rc = K3_EDIGEST;
    b ^= 0x5a;
    g_mem.d2h(g_mem.self, at, &b, 1);
  }
  free(g), free(m), free(ratio), free(cr);
  free(g_pdig);
  g_pdig = NULL;
  k3_xfer_ctx_close(ctx);
  uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  if (rc) kill(pid, SIGKILL); /* it would wait out its 120 s for transfers that never come */
  int ws;
  waitpid(pid, &ws, 0);
  for (int i = 0; i < n_d; i++) k3_xfer_desc_free(d[i]);
  free(d);
  free(src);
  if (mem) g_mem.src_free(g_mem.self, mem, p->total_bytes);
  return rc;
}

int main(int argc, char **argv) {
  const char *manifest = "tiny", *tls = "shm,tcp,default", *layout = "paged", *path = "auto";
  const char *device = "host", *verify = "full", *digests = "producer", *baseline = "each";
  int stream = 0, inflight = 4;
  int gpu = 0;
  int tokens = 1024, delay_us = 0, chunk_kib = 0, repeat = 1;
  bool puts_only = false, cpu_loops = false;
  k3_flag_t flags[] = {
      {"manifest", K3_FLAG_STR, &manifest, "tiny|k3", "state manifest sizes to move", false},
      {"tokens", K3_FLAG_INT, &tokens, "N", "prompt tokens (MLA pages)", false},
      {"layout", K3_FLAG_STR, &layout, "paged|arena", "receiver pools: page/slot-major, or one arena of per-layer tensors", false},
      {"tls", K3_FLAG_STR, &tls, "LIST", "comma-separated UCX_TLS runs; 'default' = UCX's choice", false},
      {"device", K3_FLAG_STR, &device, "host|cuda", "memory and device hooks (bench.h bench_mem_t): cuda = device "
       "sources and a device arena (VMM exported over fdshare for cuda-ipc, plain device memory for ucx-cuda); one "
       "--tls entry per run", false},
      {"gpu", K3_FLAG_INT, &gpu, "N", "CUDA device (--device cuda)", false},
      {"path", K3_FLAG_STR, &path, "auto|host|staged|cuda-ipc|ucx-cuda", "force a data path", false},
      {"layer-delay-us", K3_FLAG_INT, &delay_us, "N", "simulated compute per layer (0 = all at once)", false},
      {"chunk-kib", K3_FLAG_INT, &chunk_kib, "N", "bytes per put/DATA message in KiB (0 = library default)", false},
      {"repeat", K3_FLAG_INT, &repeat, "N", "measured transfers per transport (figures are medians)", false},
      {"puts-only", K3_FLAG_BOOL, &puts_only, NULL, "always ucp_put_nbx (no mapped pointer, no DATA messages)", false},
      {"verify", K3_FLAG_STR, &verify, "full|sender", "full (default): the receiver re-reads and hashes what landed "
       "in its device pools; sender: it records the sender kernel's digests instead (two HBM passes instead of three; "
       "measurement only, docs/transfer.md \"Two passes\")", false},
      {"digests", K3_FLAG_STR, &digests, "producer|sender", "producer (default): every region's digest is computed "
       "once before the timed transfers (as the kernel producing the state would) and handed over with each layer "
       "(k3_xfer_send_layer_ready_digests); sender: each send hashes its sources itself (cuda-pull: a device job per "
       "signalled batch of layers, on the critical path of a finished state)", false},
      {"stream", K3_FLAG_INT, &stream, "N", "after the single transfers, N more back to back with --inflight at once "
       "(the steady-state bandwidth of a stream of handoffs; RESULT-STREAM line)", false},
      {"inflight", K3_FLAG_INT, &inflight, "K", "transfers in flight in --stream (each into its own pages and slot)",
       false},
      {"check", K3_FLAG_BOOL, &g_check, NULL, "correctness: the receiver reads request 0 back and compares it with the "
       "source byte for byte; one more transfer with a source byte changed after the producer's digests must be "
       "rejected on cuda-pull (PASS/FAIL lines; exit 1 on FAIL)", false},
      {"baseline", K3_FLAG_STR, &baseline, "each|once", "each (default): a copy baseline right before every measured "
       "transfer; once: one baseline before them all (on one GPU the baseline runs in the sender's CUDA context, "
       "and the receiver's first job after it waits for the GPU to switch contexts)", false},
      {"cpu-loops", K3_FLAG_BOOL, &cpu_loops, NULL, "only time the host sender's loops (memcpy, hash, every "
       "hash+copy loop) over the plan's regions in one thread, then exit (cpu_loops.c)", false},
  };
  k3_flags_info_t info = {"k3pd-xfer-bench", "Two-process UCX state-transfer benchmark vs memcpy.", NULL};
  char err[256];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-xfer-bench: %s\n", err);
    return 2;
  }
  bench_manifest_t m;
  if (!strcmp(manifest, "tiny")) m = M_TINY;
  else if (!strcmp(manifest, "k3")) m = M_K3;
  else {
    fprintf(stderr, "k3pd-xfer-bench: --manifest must be tiny or k3, got '%s'\n", manifest);
    return 2;
  }
  bench_layout_t lay = !strcmp(layout, "arena") ? LAYOUT_ARENA : LAYOUT_PAGED;
  if (strcmp(layout, "arena") && strcmp(layout, "paged")) {
    fprintf(stderr, "k3pd-xfer-bench: --layout must be paged or arena, got '%s'\n", layout);
    return 2;
  }
  int pi = k3_xfer_path_parse(path);
  if (pi < 0) {
    fprintf(stderr, "k3pd-xfer-bench: --path must be auto|host|staged|cuda-ipc|ucx-cuda, got '%s'\n", path);
    return 2;
  }
  if (tokens < 1 || tokens > (1 << 20) || delay_us < 0 || chunk_kib < 0 || chunk_kib > (1 << 20)) {
    fprintf(stderr, "k3pd-xfer-bench: --tokens must be 1..1048576, --layer-delay-us >= 0 and "
                    "--chunk-kib 0..1048576\n");
    return 2;
  }
  if (repeat < 1 || repeat > 100) {
    fprintf(stderr, "k3pd-xfer-bench: --repeat must be 1..100, got %d\n", repeat);
    return 2;
  }
  if (!strcmp(device, "cuda")) {
    if (strchr(tls, ',')) {
      fprintf(stderr, "k3pd-xfer-bench: --device cuda takes one --tls entry (CUDA does not survive the fork "
                      "of a second receiver)\n");
      return 2;
    }
    if (pi != K3_XFER_PATH_STAGED && lay != LAYOUT_ARENA) {
      fprintf(stderr, "k3pd-xfer-bench: --device cuda receives into one device arena: use --layout arena\n");
      return 2;
    }
    char g[16];
    snprintf(g, sizeof g, "%d", gpu);
    setenv("K3PD_CUDA_DEVICE", g, 1);
    if (bench_mem_cuda(&g_mem, pi != K3_XFER_PATH_UCX_CUDA)) return 2;
  } else if (!strcmp(device, "host")) {
    if (bench_mem_host(&g_mem)) return 2;
  } else {
    fprintf(stderr, "k3pd-xfer-bench: --device must be host or cuda, got '%s'\n", device);
    return 2;
  }
  if (strcmp(verify, "full") && strcmp(verify, "sender")) {
    fprintf(stderr, "k3pd-xfer-bench: --verify must be full or sender, got '%s'\n", verify);
    return 2;
  }
  g_trust = !strcmp(verify, "sender");
  if (strcmp(digests, "producer") && strcmp(digests, "sender")) {
    fprintf(stderr, "k3pd-xfer-bench: --digests must be producer or sender, got '%s'\n", digests);
    return 2;
  }
  g_producer = !strcmp(digests, "producer");
  if (stream < 0 || stream > 1000 || inflight < 1 || inflight > 16) {
    fprintf(stderr, "k3pd-xfer-bench: --stream must be 0..1000 and --inflight 1..16\n");
    return 2;
  }
  g_stream = stream;
  g_inflight = inflight;
  g_swarm = stream ? inflight : 0;
  if (strcmp(baseline, "each") && strcmp(baseline, "once")) {
    fprintf(stderr, "k3pd-xfer-bench: --baseline must be each or once, got '%s'\n", baseline);
    return 2;
  }
  g_base_once = !strcmp(baseline, "once");
  g_repeat = repeat;
  g_chunk_bytes = (uint64_t)chunk_kib << 10;
  g_puts_only = puts_only;
  g_path = (k3_xfer_path_t)pi;
  k3_log_set_level(K3_LOG_WARN);
  bench_plan_t p;
  if (bench_plan_build(&p, m, lay, (uint32_t)tokens, stream ? (uint32_t)inflight : 1)) return 2;
  printf("manifest=%s tokens=%d layout=%s device=%s copy_loop=%s regions=%u layers=%u kda_bytes=%llu "
         "mla_bytes=%llu\n", manifest, tokens, layout, g_mem.name, k3_digest_copy_impl(), p.n_regions, p.n_layers,
         (unsigned long long)(m.n_kda * (m.s_bytes + m.conv_bytes)),
         (unsigned long long)((uint64_t)m.n_mla * m.tok_bytes * (uint64_t)tokens));
  if (cpu_loops) {
    int r = bench_cpu_loops(&p);
    bench_plan_free(&p);
    if (g_mem.close) g_mem.close(g_mem.self);
    return r ? 1 : 0;
  }
  char *list = strdup(tls), *save = NULL;
  fig_t first = {0};
  bool have_first = false;
  int fails = 0;
  for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    fig_t f = {0};
    int r = run_tls(&p, strcmp(t, "default") ? t : NULL, (uint32_t)delay_us, &f);
    if (r) fails++;
    if (!have_first) {
      first = f;
      have_first = true;
    }
  }
  free(list);
  bench_plan_free(&p);
  if (g_mem.close) g_mem.close(g_mem.self);
  printf("RESULT gbps=%.2f memcpy_gbps=%.2f ratio=%.2f cpu_ratio=%.2f path=%s verify=%s digests=%s ceiling=%.2f\n",
         first.gbps, first.memcpy_gbps, first.ratio, first.cpu_ratio, first.path ? first.path : "none",
         g_trust ? "sender" : "full", g_producer ? "producer" : "sender", first.ceiling);
  return fails ? 1 : 0;
}
