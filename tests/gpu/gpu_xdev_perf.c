/* k3k-gpu-xdev --perf: digest jobs (hash only, and copy + hash) of both kernels (1: a warp per
 * chunk, 2: a half-warp per chunk) next to the device's ceilings measured in the same run on
 * the same bytes:
 *   read ceiling: a kernel that only reads the bytes (16-byte loads at full occupancy, XOR-ed)
 *     — the floor of a digest-only job, which must read every byte once;
 *   copy ceiling: cudaMemcpyAsync device to device of the same bytes (one contiguous copy)
 *     — the floor of a copy + digest job, which must read and write every byte once.
 * Method: CUDA events on the xdev's stream around each operation, the stream kept busy by a
 * 200 us spin kernel before the first event (so host launch and planning time stay out unless
 * the GPU would wait for them), 5 warm-ups, then the median of 25 runs; inputs rotated over
 * >= 512 MiB of sources and destinations so the 60 MB L2 never holds the next run's bytes,
 * except in the "L2-hot" row (one 6 MiB buffer over and over: the receiver's case, which hashes
 * what just landed), whose ceilings are L2-hot too.
 * A job's time covers everything it queues: the table upload when it has one, the kernel and
 * the digest write-back. GB/s are payload bytes per second (a copy moves twice that).
 * The host time of k3k_xdev_submit (planning, launch) is printed beside, median over the runs.
 * "Layer jobs": the 8K-token sequence submitted as 93 jobs of one layer each (69 KDA layers of
 * 4 regions, 24 MLA layers of 128 pages), back to back without waiting, timed from an event
 * recorded before the first submit to the last job's completion (no spin: the host's submit
 * time counts), against the same bytes' ceilings from the sequence row (one job).
 * Goals (numbers, not checks): issue 17 for jobs >= 4 MiB, L2-cold: hash >= 0.80 of read, copy +
 * hash >= 0.85 of memcpy; the second kernel's for jobs >= 64 MiB: 0.85 and 0.90. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_xdev.h"
#include "k3pd/err.h"
#include "xdev_cuda.h"

enum { WARM = 5, RUNS = 25, LWARM = 2, LRUNS = 9 };
#define ROT_BYTES ((uint64_t)512 << 20)

typedef struct {
  k3k_xdev_t *x;
  cudaStream_t st;
  cudaEvent_t a, b;
  uint64_t *d_xor;
  /* the case: either rotated single segments of `bytes` in the arenas, or a fixed layout */
  uint8_t *src, *dst;
  uint64_t bytes, slots;
  const xl_layout *L;     /* fixed layout (the sequence), or NULL */
  k3k_xseg_t *lsegs[2];   /* its segments: [0] hash only, [1] with copies */
  int rot;
  double submit_us[RUNS];
} pcase;

typedef enum { OP_HASH, OP_COPYHASH, OP_READ, OP_MEMCPY } op_t;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Queues op once (rotating the inputs); returns 0 or -1. Jobs are polled after the event. */
static int queue_op(xg *g, pcase *P, op_t op, int run, k3k_xjob_t **job) {
  uint64_t s = P->L ? 0 : (uint64_t)(P->rot++ % (int)P->slots) * P->bytes;
  const uint8_t *src = P->src + s;
  uint8_t *dst = P->dst + s;
  switch (op) {
  case OP_READ: return k3k_cu_read_xor(P->st, src, P->bytes, P->d_xor) ? -1 : 0;
  case OP_MEMCPY: XG_CU(g, cudaMemcpyAsync(dst, src, P->bytes, cudaMemcpyDeviceToDevice, P->st)); return 0;
  default: break;
  }
  k3k_xseg_t one = {src, op == OP_COPYHASH ? dst : NULL, P->bytes};
  uint32_t first1[2] = {0, 1};
  const k3k_xseg_t *segs = P->L ? P->lsegs[op == OP_COPYHASH] : &one;
  const uint32_t *first = P->L ? P->L->first : first1;
  uint32_t nr = P->L ? P->L->n_regions : 1;
  double t0 = now_us();
  int rc = k3k_xdev_submit(P->x, segs, first, nr, NULL, NULL, job);
  if (run >= 0) P->submit_us[run] = now_us() - t0;
  if (rc) {
    xg_record(g, false, "perf: submit: %s", k3_strerror(rc));
    return -1;
  }
  return 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median milliseconds of op over RUNS runs after WARM warm-ups; < 0 on error. */
static double time_op(xg *g, pcase *P, op_t op) {
  double ms[RUNS];
  for (int i = -WARM; i < RUNS; i++) {
    k3k_xjob_t *j = NULL;
    if (k3k_cu_spin(P->st, 200000)) return -1; /* 200 us: longer than any submit */
    if (cudaEventRecord(P->a, P->st) != cudaSuccess) return -1;
    if (queue_op(g, P, op, i, &j)) return -1;
    if (cudaEventRecord(P->b, P->st) != cudaSuccess || cudaEventSynchronize(P->b) != cudaSuccess) {
      k3k_xdev_job_free(j);
      return -1;
    }
    if (j) {
      uint64_t dig[512];
      uint32_t nr = P->L ? P->L->n_regions : 1;
      int rc = nr <= 512 ? xg_wait(j, dig) : 1;
      k3k_xdev_job_free(j);
      if (rc != 1) {
        xg_record(g, false, "perf: job poll: %d", rc);
        return -1;
      }
    }
    float t = 0;
    if (cudaEventElapsedTime(&t, P->a, P->b) != cudaSuccess) return -1;
    if (i >= 0) ms[i] = t;
  }
  return median(ms, RUNS);
}

typedef struct {
  const char *name;
  uint64_t bytes;
  bool goal; /* L2-cold: counts for the goals */
  double hash[2], copyhash[2], read, memcpy_, submit_us[2]; /* ms per kernel 1, 2; us */
} prow;

static int run_case(xg *g, pcase *P, prow *r) {
  for (int k = 0; k < 2; k++) {
    if (k3k_cuda_xdev_set_kernel(P->x, k + 1)) return -1;
    r->hash[k] = time_op(g, P, OP_HASH);
    r->submit_us[k] = median(P->submit_us, RUNS);
    r->copyhash[k] = time_op(g, P, OP_COPYHASH);
    if (r->hash[k] < 0 || r->copyhash[k] < 0) {
      xg_record(g, false, "perf %s: a timed run of kernel %d failed", r->name, k + 1);
      return -1;
    }
  }
  r->read = time_op(g, P, OP_READ);
  r->memcpy_ = time_op(g, P, OP_MEMCPY);
  if (r->read < 0 || r->memcpy_ < 0) {
    xg_record(g, false, "perf %s: a ceiling run failed", r->name);
    return -1;
  }
  return 0;
}

/* ---- the sequence as 93 layer jobs ---- */

enum { N_KDA = 69, N_MLA = 24, N_LAYERS = N_KDA + N_MLA };

typedef struct {
  uint32_t r0, nr;   /* regions of the layer in the sequence layout */
  uint32_t first[5]; /* the layer's first[] relative to its first segment */
} layer;

/* The layers of xl_seq8k: 69 KDA layers of 4 regions (state + 3 conv), then 24 MLA layers of
 * one region (128 pages). 0, or -1 when the layout is not that shape. */
static int seq_layers(const xl_layout *L, layer *ly) {
  if (L->n_regions != 4 * N_KDA + N_MLA) return -1;
  for (uint32_t i = 0; i < N_LAYERS; i++) {
    layer *y = &ly[i];
    y->r0 = i < N_KDA ? 4 * i : 4 * N_KDA + (i - N_KDA);
    y->nr = i < N_KDA ? 4 : 1;
    for (uint32_t r = 0; r <= y->nr; r++) y->first[r] = L->first[y->r0 + r] - L->first[y->r0];
  }
  return 0;
}

/* Median ms from the first submit to the last completion of the 93 layer jobs (copy: with the
 * copies), and the mean host time per submit. Checks the digests of the first run. */
static int time_layers(xg *g, pcase *P, const dlay *S, const layer *ly, bool copy, double *ms_out,
                       double *sub_out) {
  double ms[LRUNS], sub[LRUNS];
  k3k_xjob_t *j[N_LAYERS];
  const k3k_xseg_t *segs = P->lsegs[copy];
  for (int i = -LWARM; i < LRUNS; i++) {
    int bad = 0;
    XG_CU(g, cudaStreamSynchronize(P->st));
    XG_CU(g, cudaEventRecord(P->a, P->st));
    double t0 = now_us();
    for (int l = 0; l < N_LAYERS; l++) {
      int rc = k3k_xdev_submit(P->x, segs + S->L.first[ly[l].r0], ly[l].first, ly[l].nr, NULL, NULL, &j[l]);
      if (rc) {
        xg_record(g, false, "perf layers: submit %d: %s", l, k3_strerror(rc));
        for (int m = 0; m < l; m++) k3k_xdev_job_free(j[m]);
        return -1;
      }
    }
    double t1 = now_us();
    cudaError_t e = cudaEventRecord(P->b, P->st);
    if (e == cudaSuccess) e = cudaEventSynchronize(P->b);
    for (int l = 0; l < N_LAYERS; l++) {
      uint64_t dig[4];
      if (xg_wait(j[l], dig) != 1) bad++;
      else if (i == -LWARM)
        for (uint32_t r = 0; r < ly[l].nr; r++) bad += dig[r] != S->want[ly[l].r0 + r];
      k3k_xdev_job_free(j[l]);
    }
    float t = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&t, P->a, P->b);
    if (e != cudaSuccess || bad) {
      xg_record(g, false, "perf layers (kernel %d%s): %d wrong digests or failed polls, %s", k3k_cuda_xdev_kernel(P->x),
                copy ? ", copies" : "", bad, cudaGetErrorString(e));
      return -1;
    }
    if (i >= 0) {
      ms[i] = t;
      sub[i] = (t1 - t0) / N_LAYERS;
    }
  }
  *ms_out = median(ms, LRUNS);
  *sub_out = median(sub, LRUNS);
  return 0;
}

static void print_row(const prow *r) {
  double gb = r->bytes / 1e9;
  printf("perf %-22s %10llu | %7.0f %7.0f %7.0f %5.2f %5.2f | %7.0f %7.0f %7.0f %5.2f %5.2f | %5.1f %5.1f\n", r->name,
         (unsigned long long)r->bytes, gb / (r->hash[0] * 1e-3), gb / (r->hash[1] * 1e-3), gb / (r->read * 1e-3),
         r->read / r->hash[0], r->read / r->hash[1], gb / (r->copyhash[0] * 1e-3), gb / (r->copyhash[1] * 1e-3),
         gb / (r->memcpy_ * 1e-3), r->memcpy_ / r->copyhash[0], r->memcpy_ / r->copyhash[1], r->submit_us[0],
         r->submit_us[1]);
}

/* "met" / "MISSED" for kernel k over the goal rows of at least min_bytes. */
static const char *goal(const prow *rows, int n, int k, uint64_t min_bytes, double hash, double copy) {
  for (int i = 0; i < n; i++)
    if (rows[i].goal && rows[i].bytes >= min_bytes &&
        (rows[i].read / rows[i].hash[k] < hash || rows[i].memcpy_ / rows[i].copyhash[k] < copy))
      return "MISSED";
  return "met";
}

void xg_perf(xg *g, k3k_xdev_t *x) {
  pcase P = {.x = x, .st = k3k_cuda_xdev_stream(x)};
  uint8_t *src = NULL, *dst = NULL;
  dlay S = {0};
  k3k_xseg_t *hsegs = NULL;
  const int dflt = k3k_cuda_xdev_kernel(x);
  if (cudaEventCreate(&P.a) != cudaSuccess || cudaEventCreate(&P.b) != cudaSuccess ||
      cudaMalloc((void **)&P.d_xor, 8) != cudaSuccess || cudaMalloc((void **)&src, ROT_BYTES) != cudaSuccess ||
      cudaMalloc((void **)&dst, ROT_BYTES) != cudaSuccess) {
    xg_record(g, false, "perf: setup: %s", cudaGetErrorString(cudaGetLastError()));
    goto out;
  }
  { /* random sources (never zeros), guard bytes in the destinations */
    uint8_t *h = malloc(ROT_BYTES);
    if (!h) goto out;
    xl_fill_random(h, ROT_BYTES, g->seed);
    cudaError_t e = cudaMemcpy(src, h, ROT_BYTES, cudaMemcpyHostToDevice);
    xl_fill_guard(h, ROT_BYTES);
    if (e == cudaSuccess) e = cudaMemcpy(dst, h, ROT_BYTES, cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) goto out;
  }
  prow rows[5] = {{.name = "1 MiB", .bytes = 1u << 20, .goal = true},
                  {.name = "6 MiB (a KDA state)", .bytes = 6u << 20, .goal = true},
                  {.name = "6 MiB L2-hot", .bytes = 6u << 20, .goal = false},
                  {.name = "64 MiB", .bytes = 64u << 20, .goal = true},
                  {.name = NULL}};
  int nrows = 0;
  for (int i = 0; i < 4; i++) {
    P.src = src;
    P.dst = dst;
    P.bytes = rows[i].bytes;
    P.slots = rows[i].goal ? ROT_BYTES / P.bytes : 1; /* one buffer: hot after the warm-ups */
    P.L = NULL;
    if (run_case(g, &P, &rows[i])) goto out;
    nrows++;
  }
  layer ly[N_LAYERS];
  double lms[2][2], lsub[2][2]; /* [kernel][copy] */
  { /* the 8K-token sequence: 300 regions, 3348 segments, a device table */
    xl_layout L;
    xl_seq8k(&L, true);
    if (dlay_init(g, &S, &L, g->seed + 1)) goto out;
    hsegs = malloc(S.L.n_segs * sizeof *hsegs);
    if (!hsegs) goto out;
    memcpy(hsegs, S.segs, S.L.n_segs * sizeof *hsegs);
    for (uint32_t i = 0; i < S.L.n_segs; i++) hsegs[i].dst = NULL;
    P.L = &S.L;
    P.lsegs[0] = hsegs;
    P.lsegs[1] = S.segs;
    P.src = S.d_src;
    P.dst = S.d_dst; /* memcpy: one contiguous copy of the same byte count */
    P.bytes = S.L.src_bytes;
    P.slots = 1;
    rows[4].name = "8K-token sequence";
    rows[4].bytes = S.L.src_bytes;
    rows[4].goal = true;
    if (S.L.dst_bytes < S.L.src_bytes || run_case(g, &P, &rows[4])) goto out;
    nrows++;
    if (seq_layers(&S.L, ly)) {
      xg_record(g, false, "perf layers: the sequence layout is not 69 KDA + 24 MLA layers");
      goto out;
    }
    for (int k = 0; k < 2; k++)
      for (int c = 0; c < 2; c++)
        if (k3k_cuda_xdev_set_kernel(x, k + 1) || time_layers(g, &P, &S, ly, c, &lms[k][c], &lsub[k][c])) goto out;
  }
  printf("perf: median of %d runs after %d warm-ups; CUDA events on the job stream behind a 200 us spin;\n"
         "perf: inputs rotated over 512 MiB (L2 60 MB) but in the L2-hot row; GB/s = payload bytes / time\n"
         "perf: (copies move 2x); read = read-only XOR kernel, memcpy = cudaMemcpyAsync D2D, same bytes;\n"
         "perf: k1 = a warp per chunk, k2 = a half-warp per chunk; r1, r2 = kernel / ceiling (time ratio)\n",
         RUNS, WARM);
  printf("perf: k2 resident warps (occupancy API, table paths 1..4): %u %u %u %u\n", k3k_cuda_xdev_cap_warps(x, 1),
         k3k_cuda_xdev_cap_warps(x, 2), k3k_cuda_xdev_cap_warps(x, 3), k3k_cuda_xdev_cap_warps(x, 4));
  printf("perf %-22s %10s | %7s %7s %7s %5s %5s | %7s %7s %7s %5s %5s | %11s\n", "case", "bytes", "hash k1",
         "hash k2", "read", "r1", "r2", "c+h k1", "c+h k2", "memcpy", "r1", "r2", "submit us");
  for (int i = 0; i < nrows; i++) print_row(&rows[i]);
  {
    const prow *q = &rows[4];
    double gb = q->bytes / 1e9;
    printf("perf layer jobs: the sequence as %d jobs (%d KDA x 6,512,640 B in 4 regions, %d MLA x 9,437,184 B in\n"
           "perf   128 pages), submitted back to back; first submit to last completion (host submit included)\n",
           N_LAYERS, N_KDA, N_MLA);
    for (int k = 0; k < 2; k++)
      printf("perf layers k%d: hash %5.0f GB/s = %4.2f x read, copy+hash %5.0f GB/s = %4.2f x memcpy; host %4.1f / %4.1f "
             "us a submit (hash / copy)\n",
             k + 1, gb / (lms[k][0] * 1e-3), q->read / lms[k][0], gb / (lms[k][1] * 1e-3), q->memcpy_ / lms[k][1],
             lsub[k][0], lsub[k][1]);
  }
  for (int k = 0; k < 2; k++)
    printf("perf goal k%d: issue 17 (jobs >= 4 MiB: hash >= 0.80 x read, copy+hash >= 0.85 x memcpy): %s; "
           "jobs >= 64 MiB (hash >= 0.85 x read, copy+hash >= 0.90 x memcpy): %s\n",
           k + 1, goal(rows, nrows, k, 4u << 20, 0.80, 0.85), goal(rows, nrows, k, 64u << 20, 0.85, 0.90));
out:
  if (k3k_cuda_xdev_set_kernel(x, dflt)) xg_record(g, false, "perf: restoring kernel %d", dflt);
  free(hsegs);
  if (S.d_src) dlay_free(&S);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(P.d_xor);
  if (P.a) cudaEventDestroy(P.a);
  if (P.b) cudaEventDestroy(P.b);
}
