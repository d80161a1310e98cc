/* k3pd-xfer-bench: the host memory mode (bench.h bench_mem_t "host").
 *
 * Sources are malloc'd and touched (so the first transfer pays no page faults); receiver pools
 * come from k3_xfer_pool_alloc_host (UCX-allocated, mapped one-sidedly by a same-host sender);
 * no device hooks. The baseline is one single-threaded memcpy into a pre-faulted destination,
 * best of 3 by wall time. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

static double cpu_ms_now(void) {
  struct timespec c;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
  return (double)c.tv_sec * 1e3 + (double)c.tv_nsec / 1e6;
}

static int src_alloc(void *self, uint64_t bytes, void **ptr) {
  uint8_t *m = malloc(bytes ? bytes : 1);
  if (!m) return K3_ENOMEM;
  for (uint64_t b = 0; b < bytes; b++) m[b] = (uint8_t)(b * 131 + (b >> 12));
  *ptr = m;
  return 0;
}
static void src_free(void *self, void *ptr, uint64_t bytes) { free(ptr); }

static int pool_make(void *self, k3_xfer_ctx_t *ctx, uint64_t bytes, k3_xfer_pool_t **out) {
  return k3_xfer_pool_alloc_host(ctx, bytes, out);
}
static void pool_free(void *self, k3_xfer_pool_t *p) { k3_xfer_pool_free(p); }
static const k3_xfer_dev_t *no_dev(void *self) { return NULL; }
static int d2h(void *self, void *dst, const void *src, uint64_t len) {
  memcpy(dst, src, len); /* "device" = host memory: exercises the staged path on a CPU */
  return 0;
}

typedef struct {
  uint8_t *dst;
  uint64_t dst_bytes;
} host_t;

static double copy_gbps(void *self, const void *src, uint64_t bytes, double *cpu_ms) {
  host_t *h = self;
  if (h->dst_bytes < bytes) {
    free(h->dst);
    h->dst = malloc(bytes);
    if (!h->dst) return 0;
    memset(h->dst, 0, bytes);
    h->dst_bytes = bytes;
  }
  double best = 1e30;
  for (int i = 0; i < 3; i++) {
    double c0 = cpu_ms_now();
    uint64_t t0 = k3_now_ns();
    memcpy(h->dst, src, bytes);
    double s = (double)(k3_now_ns() - t0) / 1e9;
    if (s < best) best = s, *cpu_ms = cpu_ms_now() - c0;
  }
  return (double)bytes / best / 1e9;
}

static void host_close(void *self) {
  host_t *h = self;
  free(h->dst);
  free(h);
}

int bench_mem_host(bench_mem_t *out) {
  host_t *h = calloc(1, sizeof *h);
  if (!h) return K3_ENOMEM;
  *out = (bench_mem_t){.name = "host", .self = h, .src_alloc = src_alloc, .src_free = src_free,
                       .pool_make = pool_make, .pool_free = pool_free, .dev = no_dev, .d2h = d2h,
                       .copy_gbps = copy_gbps, .close = host_close};
  return 0;
}
