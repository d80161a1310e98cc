/* k3k-gpu-xdev: digest (and copy) jobs on the "cuda" backend (kernels/cuda/xdev.cu) against the
 * K3 digest reference, and (--perf) their speed next to the device's copy and read ceilings.
 *
 * What it proves that the CPU tests cannot: test_kernels_xw already runs the kernel's per-lane
 * functions for 32 emulated lanes against libxxhash, so a mismatch here points at the CUDA glue
 * (shuffles, ballot, shared-memory staging, the parameter/device table paths, the mapped digest
 * buffer) or the job plumbing (slots, events, notify, close). Every case runs on fresh random
 * data; every destination sits between guard bytes that are checked; digests are compared with
 * k3_digest_bytes over each region's concatenated stream (host, libxxhash).
 * Every case runs once per kernel (1: a warp per chunk, 2: a half-warp per chunk; the line says
 * which, "[k1]" or "[k2]"), so the program fails when either disagrees with the reference.
 * Cases: device queries; 300 random layouts (odd lengths and alignments, chunks over many
 * segments, empty regions, 1..3-byte regions, 240/241/4095/4096/4097-byte streams) with and
 * without copies; edge streams cut at every offset near chunk edges; page layouts (2560, 18432,
 * 73728 B) and 6 MiB regions; each table path (small parameter, 4 KB parameter, device copy,
 * with multi-piece chunks); the 8K-token K3 sequence (~645 MiB, 300 regions) copied and hashed;
 * 48 jobs in flight at once (notify exactly once each, results per job); results kept after the
 * source changes and after the job's buffers were reused; close with jobs running; bad
 * arguments refused with nothing queued; empty jobs.
 * Usage: k3k-gpu-xdev [--perf] [--seed N]. Exits 77 without a usable device (ctest SKIP),
 * 1 when a check failed, else 0; the last line is "N passed, N failed". */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_xdev.h"
#include "k3pd/digest.h"
#include "k3pd/err.h"
#include "xdev_cuda.h"

void xg_record(xg *g, bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  if (g->kernel) printf("[k%d] ", g->kernel);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  if (ok)
    g->passed++;
  else
    g->failed++;
}

int dlay_init(xg *g, dlay *D, xl_layout *L, uint64_t seed) {
  memset(D, 0, sizeof *D);
  D->L = *L;
  memset(L, 0, sizeof *L);
  uint64_t sb = D->L.src_bytes ? D->L.src_bytes : 1, db = D->L.dst_bytes ? D->L.dst_bytes : 1;
  D->h_src = malloc(sb);
  uint8_t *guard = malloc(db);
  D->want = malloc((D->L.n_regions + 1) * sizeof *D->want);
  if (!D->h_src || !guard || !D->want) {
    free(guard);
    xg_record(g, false, "%s: host memory", D->L.name);
    return -1;
  }
  xl_fill_random(D->h_src, D->L.src_bytes, seed);
  xl_fill_guard(guard, D->L.dst_bytes);
  xl_reference(&D->L, D->h_src, D->want);
  cudaError_t e = cudaMalloc((void **)&D->d_src, sb);
  if (e == cudaSuccess) e = cudaMalloc((void **)&D->d_dst, db);
  if (e == cudaSuccess) e = cudaMemcpy(D->d_src, D->h_src, D->L.src_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(D->d_dst, guard, D->L.dst_bytes, cudaMemcpyHostToDevice);
  free(guard);
  if (e != cudaSuccess) {
    xg_record(g, false, "%s: device arenas: %s", D->L.name, cudaGetErrorString(e));
    return -1;
  }
  D->segs = xl_segs(&D->L, D->d_src, D->d_dst);
  return 0;
}

void dlay_free(dlay *D) {
  cudaFree(D->d_src);
  cudaFree(D->d_dst);
  free(D->h_src);
  free(D->segs);
  free(D->want);
  xl_free(&D->L);
  memset(D, 0, sizeof *D);
}

bool dlay_check(xg *g, const dlay *D, const uint64_t *got, const char *what) {
  for (uint32_t r = 0; r < D->L.n_regions; r++)
    if (got[r] != D->want[r]) {
      xg_record(g, false, "%s (%s): region %u of %u (%llu B): digest %016llx, want %016llx", what,
                D->L.name, r, D->L.n_regions, (unsigned long long)xl_region_bytes(&D->L, r),
                (unsigned long long)got[r], (unsigned long long)D->want[r]);
      return false;
    }
  uint8_t *dst = malloc(D->L.dst_bytes ? D->L.dst_bytes : 1);
  cudaError_t e = dst ? cudaMemcpy(dst, D->d_dst, D->L.dst_bytes, cudaMemcpyDeviceToHost) : cudaErrorMemoryAllocation;
  uint64_t bad = e == cudaSuccess ? xl_check_dst(&D->L, D->h_src, dst) : 0;
  free(dst);
  if (bad != UINT64_MAX) {
    xg_record(g, false, "%s (%s): destination arena differs at byte %llu (%s)", what, D->L.name,
              (unsigned long long)bad, cudaGetErrorString(e));
    return false;
  }
  return true;
}

int xg_wait(k3k_xjob_t *j, uint64_t *digests) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int rc = k3k_xdev_poll(j, digests);
    if (rc) return rc;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 20) return 0;
  }
}

static void count_notify(void *ud) { atomic_fetch_add((atomic_int *)ud, 1); }

/* notify runs on a driver thread after the job's event: wait for it a little. */
static int settle(atomic_int *calls, int want) {
  for (int i = 0; i < 5000 && atomic_load(calls) < want; i++) {
    struct timespec d = {0, 1000000};
    nanosleep(&d, NULL);
  }
  return atomic_load(calls);
}

/* One job over D on x, waited for and checked; notify exactly once. */
static bool run_dlay(xg *g, k3k_xdev_t *x, dlay *D, const char *what) {
  atomic_int calls = 0;
  k3k_xjob_t *j = NULL;
  uint64_t *got = calloc(D->L.n_regions + 1, sizeof *got);
  int rc = k3k_xdev_submit(x, D->segs, D->L.first, D->L.n_regions, count_notify, &calls, &j);
  if (rc) {
    xg_record(g, false, "%s (%s): submit: %s", what, D->L.name, k3_strerror(rc));
    free(got);
    return false;
  }
  rc = xg_wait(j, got);
  bool ok = rc == 1;
  if (!ok) xg_record(g, false, "%s (%s): poll: %d %s", what, D->L.name, rc, k3_strerror(rc));
  if (ok) ok = dlay_check(g, D, got, what);
  k3k_xdev_job_free(j);
  int n = settle(&calls, 1);
  if (ok && n != 1) {
    xg_record(g, false, "%s (%s): notify ran %d times", what, D->L.name, n);
    ok = false;
  }
  free(got);
  return ok;
}

/* Builds, runs and frees one layout; records nothing when it passed (quiet for many). */
static bool one(xg *g, k3k_xdev_t *x, xl_layout *L, uint64_t seed, const char *what) {
  dlay D;
  if (dlay_init(g, &D, L, seed)) return false;
  bool ok = run_dlay(g, x, &D, what);
  dlay_free(&D);
  return ok;
}

static void check_device(xg *g, k3k_xdev_t *x) {
  uint8_t uuid[16], zero[16] = {0};
  size_t fr = 0, tot = 0;
  int a = k3k_device_uuid(g->be, uuid), b = k3k_device_mem(g->be, &fr, &tot);
  struct cudaDeviceProp p;
  int dev = 0;
  bool same = cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess &&
              !memcmp(p.uuid.bytes, uuid, 16);
  xg_record(g, a == 0 && b == 0 && memcmp(uuid, zero, 16) && same && fr > 0 && fr <= tot &&
                   k3k_xdev_on_device(x),
            "device queries: uuid %02x%02x%02x%02x-... (matches cudaDeviceProp: %d), %.1f of %.1f GiB "
            "free, on_device %d",
            uuid[0], uuid[1], uuid[2], uuid[3], same, fr / 1073741824.0, tot / 1073741824.0,
            k3k_xdev_on_device(x));
}

static void check_random(xg *g, k3k_xdev_t *x) {
  uint64_t rng = g->seed;
  int bad = 0, n = 300;
  for (int i = 0; i < n && bad < 3; i++) {
    xl_layout L;
    xl_random(&L, &rng, i % 3 != 0);
    bad += !one(g, x, &L, g->seed + 17 * (uint64_t)i, "random layout");
  }
  xg_record(g, !bad, "%d random layouts (odd lengths/alignments, many-piece chunks, empty and "
                     "1..3-byte regions), 2/3 with copies", n);
}

static void check_edges(xg *g, k3k_xdev_t *x) {
  static const uint64_t lens[] = {240, 241, 4095, 4096, 4097, 8193};
  int bad = 0, n = 0;
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
    for (uint64_t cut = 0; cut <= lens[i] && bad < 3; cut += (cut < 24 || lens[i] - cut < 24) ? 1 : 331) {
      xl_layout L;
      xl_init(&L, "edge stream");
      xl_region(&L); /* empty */
      xl_region(&L);
      xl_seg_add(&L, cut, (unsigned)(cut % 16), true, (unsigned)(cut % 5));
      xl_seg_add(&L, 0, 0, true, 0);
      xl_seg_add(&L, lens[i] - cut, (unsigned)(cut % 3) * 8, cut & 1, 0);
      xl_region(&L);
      for (int b = 0; b < 3; b++) xl_seg_add(&L, 1, (unsigned)b, true, (unsigned)b);
      bad += !one(g, x, &L, lens[i] * 1000 + cut, "edge stream");
      n++;
    }
  xg_record(g, !bad, "%d edge streams (240/241/4095/4096/4097/8193 B cut at every offset near the "
                     "ends), with empty and 1-byte regions", n);
}

static void check_pages(xg *g, k3k_xdev_t *x) {
  static const struct {
    uint32_t regions, pages;
    uint64_t page;
    int path; /* table path the job must take */
  } cases[] = {
      {1, 1, 6291456, 1},   /* one KDA state */
      {4, 1, 6291456, 1},   /* four (kernel 2: 2 units a warp on an H200) */
      {2, 1, 20971520, 1},  /* 40 MiB (kernel 2: 3 units a warp) */
      {3, 1, 13635584, 1},  /* 3 x 3329 chunks: an odd count, the last unit half empty */
      {2, 5, 73728, 2},     /* MLA pages of 64 tokens */
      {1, 128, 73728, 3},   /* an 8K-token MLA layer: 128 runs, 8 KB parameter */
      {1, 248, 73728, 3},   /* the largest 8 KB parameter table */
      {1, 250, 73728, 4},   /* just over it: device table, runs only */
      {3, 9, 18432, 2},     /* 4.5 chunks a page */
      {2, 40, 18432, 3},
      {2, 7, 2560, 2},      /* chunks of 2-3 pages */
      {2, 150, 2560, 4},    /* multi-piece chunks through the device table */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int copy = 0; copy < 2; copy++) {
      xl_layout L;
      xl_pages(&L, cases[i].regions, cases[i].pages, cases[i].page, copy);
      dlay D;
      if (dlay_init(g, &D, &L, 900 + i)) continue;
      bool ok = run_dlay(g, x, &D, "pages");
      int path = k3k_cuda_xdev_last_path(x);
      xg_record(g, ok && path == cases[i].path, "%s%s: digests%s, table path %d (want %d)", D.L.name,
                copy ? " copied" : "", copy ? " and copies" : "", path, cases[i].path);
      dlay_free(&D);
    }
}

static void check_sequence(xg *g, k3k_xdev_t *x) {
  for (int copy = 1; copy >= 0; copy--) {
    xl_layout L;
    xl_seq8k(&L, copy);
    dlay D;
    if (dlay_init(g, &D, &L, 4242 + copy)) return;
    bool ok = run_dlay(g, x, &D, "sequence");
    xg_record(g, ok, "8K-token K3 sequence: %u regions, %u segments, %.1f MiB %s", D.L.n_regions,
              D.L.n_segs, D.L.src_bytes / 1048576.0, copy ? "copied and hashed" : "hashed");
    dlay_free(&D);
  }
}

/* 48 jobs in flight on one xdev, then the same again (the buffers are reused, not regrown). */
static void check_in_flight(xg *g, k3k_xdev_t *x) {
  enum { N = 48 };
  static dlay D[N];
  static atomic_int calls[N];
  k3k_xjob_t *j[N] = {0};
  uint64_t rng = g->seed ^ 0xF11E, *got[N];
  size_t slots_after_first = 0;
  for (int round = 0; round < 2; round++) {
    int bad = 0, nok = 0;
    for (int i = 0; i < N; i++) {
      xl_layout L;
      if (i % 8 == 0) xl_pages(&L, 1, 1 + (uint32_t)(i / 8), 6291456, true);
      else xl_random(&L, &rng, i & 1);
      got[i] = NULL;
      if (dlay_init(g, &D[i], &L, rng + (uint64_t)i)) return;
      atomic_store(&calls[i], 0);
      got[i] = calloc(D[i].L.n_regions + 1, sizeof *got[i]);
    }
    /* the stream spins first, so all N are queued (and hold their buffers) at once */
    if (k3k_cu_spin(k3k_cuda_xdev_stream(x), 20 * 1000 * 1000)) bad++;
    for (int i = 0; i < N; i++) { /* back to back: all queued before any is polled */
      int rc = k3k_xdev_submit(x, D[i].segs, D[i].L.first, D[i].L.n_regions, count_notify, &calls[i], &j[i]);
      if (rc) {
        xg_record(g, false, "in flight: submit %d: %s", i, k3_strerror(rc));
        j[i] = NULL;
        bad++;
      }
    }
    for (int i = N - 1; i >= 0; i--) { /* polled in the other order */
      if (!j[i]) continue;
      int rc = xg_wait(j[i], got[i]);
      if (rc != 1 || !dlay_check(g, &D[i], got[i], "in flight")) bad++;
      else nok++;
    }
    for (int i = 0; i < N; i++) {
      int n = settle(&calls[i], 1);
      if (n != 1) {
        xg_record(g, false, "in flight: job %d notified %d times", i, n);
        bad++;
      }
      k3k_xdev_job_free(j[i]);
      free(got[i]);
      dlay_free(&D[i]);
    }
    size_t slots = k3k_cuda_xdev_slots(x);
    if (round == 0) slots_after_first = slots;
    xg_record(g, !bad && slots >= N && slots <= N + 1 && (round == 0 || slots == slots_after_first),
              "%d jobs in flight (round %d): %d right, notify once each, %zu buffer sets", N, round,
              nok, slots);
  }
}

/* Results are the job's own: the source changes after completion, and later jobs reuse its slot. */
static void check_results_kept(xg *g, k3k_xdev_t *x) {
  xl_layout L;
  xl_pages(&L, 3, 2, 6291456, false);
  dlay D;
  if (dlay_init(g, &D, &L, 777)) return;
  k3k_xjob_t *j = NULL;
  uint64_t a[3] = {0}, b[3] = {0};
  int rc = k3k_xdev_submit(x, D.segs, D.L.first, D.L.n_regions, NULL, NULL, &j);
  bool ok = rc == 0 && xg_wait(j, a) == 1 && dlay_check(g, &D, a, "kept");
  if (ok) {
    ok = cudaMemset(D.d_src, 0, D.L.src_bytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    for (int i = 0; i < 4 && ok; i++) { /* other jobs take the freed buffers */
      xl_layout L2;
      xl_pages(&L2, 1, 1, 4096 * (uint64_t)(i + 1), true);
      ok = one(g, x, &L2, 50 + (uint64_t)i, "kept (other job)");
    }
    ok = ok && k3k_xdev_poll(j, b) == 1 && !memcmp(a, b, sizeof a);
  }
  k3k_xdev_job_free(j);
  xg_record(g, ok, "digests kept after the source was zeroed and the job's buffers were reused");
  dlay_free(&D);
}

/* close with jobs still running: it waits, every notify runs once, the jobs stay pollable. */
static void check_close_running(xg *g) {
  enum { N = 6 };
  k3k_xdev_t *x = NULL;
  if (k3k_xdev_open(g->be, &x) || k3k_cuda_xdev_set_kernel(x, g->kernel)) {
    xg_record(g, false, "second xdev: open");
    if (x) k3k_xdev_close(x);
    return;
  }
  static dlay D[N];
  static atomic_int calls[N];
  k3k_xjob_t *j[N] = {0};
  int bad = 0;
  for (int i = 0; i < N; i++) {
    xl_layout L;
    xl_pages(&L, 2, 4, 6291456, true); /* 48 MiB copied per job */
    if (dlay_init(g, &D[i], &L, 31 * (uint64_t)i + 1)) return;
    atomic_store(&calls[i], 0);
  }
  cudaStream_t st = k3k_cuda_xdev_stream(x);
  if (k3k_cu_spin(st, 50 * 1000 * 1000)) bad++; /* 50 ms: every job is still queued at close */
  for (int i = 0; i < N; i++)
    if (k3k_xdev_submit(x, D[i].segs, D[i].L.first, D[i].L.n_regions, count_notify, &calls[i], &j[i])) bad++;
  bool running = cudaStreamQuery(st) == cudaErrorNotReady;
  k3k_xdev_close(x);
  for (int i = 0; i < N; i++) {
    uint64_t got[2];
    if (atomic_load(&calls[i]) != 1) bad++; /* close waited for the notifies too */
    if (!j[i] || k3k_xdev_poll(j[i], got) != 1 || !dlay_check(g, &D[i], got, "closed")) bad++;
    k3k_xdev_job_free(j[i]); /* after close */
    dlay_free(&D[i]);
  }
  xg_record(g, !bad && running, "close with %d jobs queued (running at close: %d): waited, notify "
                                 "once each, results pollable and correct after close, jobs freed after close",
            N, running);
}

/* Bad arguments: K3_EINVAL, *out untouched, nothing queued, no notify, destinations intact. */
static void check_errors(xg *g, k3k_xdev_t *x) {
  xl_layout L;
  xl_pages(&L, 2, 2, 4096, true);
  dlay D;
  if (dlay_init(g, &D, &L, 99)) return;
  cudaStream_t st = k3k_cuda_xdev_stream(x);
  size_t slots = k3k_cuda_xdev_slots(x);
  atomic_int calls = 0;
  k3k_xjob_t *sentinel = (k3k_xjob_t *)(uintptr_t)0x1234, *j = sentinel;
  uint32_t bad0[3] = {1, 2, 4}, dec[3] = {0, 4, 2};
  k3k_xseg_t segs[4];
  int bad = 0, n = 0;
#define REFUSED(expr)                                                                        do {                                                                                         j = sentinel;                                                                              int rc_ = (expr);                                                                          n++;                                                                                       if (rc_ != K3_EINVAL || j != sentinel || cudaStreamQuery(st) != cudaSuccess) {              xg_record(g, false, "bad arguments: %s returned %d", #expr, rc_);                          bad++;                                                                                   }                                                                                        } while (0)
  if (cudaStreamSynchronize(st) != cudaSuccess) bad++;
  REFUSED(k3k_xdev_submit(x, D.segs, NULL, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, D.segs, bad0, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, D.segs, dec, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, NULL, D.L.first, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, D.segs, D.L.first, 2, count_notify, &calls, NULL));
  memcpy(segs, D.segs, sizeof segs);
  segs[3].src = NULL;
  REFUSED(k3k_xdev_submit(x, segs, D.L.first, 2, count_notify, &calls, &j));
  memcpy(segs, D.segs, sizeof segs);
  segs[1].dst = (uint8_t *)segs[1].src + 100; /* overlaps its source */
  REFUSED(k3k_xdev_submit(x, segs, D.L.first, 2, count_notify, &calls, &j));
#undef REFUSED
  if (cudaStreamSynchronize(st) != cudaSuccess) bad++; /* anything queued would have run by now */
  uint8_t *dst = malloc(D.L.dst_bytes), *guard = malloc(D.L.dst_bytes);
  xl_fill_guard(guard, D.L.dst_bytes);
  bool intact = dst && guard && cudaMemcpy(dst, D.d_dst, D.L.dst_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
                !memcmp(dst, guard, D.L.dst_bytes);
  free(dst);
  free(guard);
  xg_record(g, !bad && atomic_load(&calls) == 0 && k3k_cuda_xdev_slots(x) == slots && intact,
            "%d kinds of bad arguments: K3_EINVAL, job untouched, stream idle, no notify, no "
            "buffer taken, destinations untouched", n);
  dlay_free(&D);
}

static void check_empty(xg *g, k3k_xdev_t *x) {
  k3k_xjob_t *j = NULL;
  uint32_t zero = 0;
  atomic_int calls = 0;
  bool ok = k3k_xdev_submit(x, NULL, &zero, 0, count_notify, &calls, &j) == 0 && xg_wait(j, NULL) == 1;
  k3k_xdev_job_free(j);
  ok = ok && settle(&calls, 1) == 1;
  xl_layout L; /* regions with no bytes at all: the empty digest, no kernel */
  xl_init(&L, "empty regions");
  xl_region(&L);
  xl_region(&L);
  xl_seg_add(&L, 0, 0, true, 0);
  xl_region(&L);
  ok = ok && one(g, x, &L, 1, "empty regions");
  xg_record(g, ok && k3k_cuda_xdev_last_path(x) == 0,
            "zero regions and empty regions (digest of nothing: %016llx)",
            (unsigned long long)k3_digest_bytes(NULL, 0));
}

int main(int argc, char **argv) {
  bool perf = false;
  xg g = {.seed = 0x5EED0017ull};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--perf")) perf = true;
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g.seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: %s [--perf] [--seed N]\n", argv[0]);
      return 2;
    }
  }
  g.be = k3k_backend_get("cuda");
  if (!g.be) {
    printf("SKIP: no usable CUDA device\n");
    return 77;
  }
  k3k_xdev_t *x = NULL;
  int rc = k3k_xdev_open(g.be, &x);
  if (rc) {
    printf("FAIL k3k_xdev_open: %s\n0 passed, 1 failed\n", k3_strerror(rc));
    return 1;
  }
  printf("k3k-gpu-xdev: seed=0x%llx, default kernel %d (K3PD_XDEV_KERNEL)\n", (unsigned long long)g.seed,
         k3k_cuda_xdev_kernel(x));
  const int dflt = k3k_cuda_xdev_kernel(x);
  for (g.kernel = 1; g.kernel <= 2; g.kernel++) { /* every case for both kernels */
    if (k3k_cuda_xdev_set_kernel(x, g.kernel)) {
      xg_record(&g, false, "k3k_cuda_xdev_set_kernel(%d)", g.kernel);
      continue;
    }
    check_device(&g, x);
    check_empty(&g, x);
    check_errors(&g, x);
    check_random(&g, x);
    check_edges(&g, x);
    check_pages(&g, x);
    check_sequence(&g, x);
    check_in_flight(&g, x);
    check_results_kept(&g, x);
    check_close_running(&g);
  }
  g.kernel = 0;
  if (k3k_cuda_xdev_set_kernel(x, dflt)) xg_record(&g, false, "k3k_cuda_xdev_set_kernel(%d)", dflt);
  if (perf) xg_perf(&g, x);
  k3k_xdev_close(x);
  k3k_backends_shutdown();
  printf("%d passed, %d failed\n", g.passed, g.failed);
  return g.failed ? 1 : 0;
}
