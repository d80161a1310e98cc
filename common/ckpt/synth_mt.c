/* k3_synth_fill_many: multi-threaded synthetic fill of a list of tensors (synth.h); used by
 * k3_weights_synth_opts for a whole plan.
 *
 * Work split: every tensor is cut into slices of at most SLICE_BYTES (a multiple of 64 bytes,
 * hence of every element size and of the 16-byte MXFP4 packed group, so slices stay
 * element-aligned and no group is quantized twice); small tensors are one slice each. Slices
 * are numbered globally in plan order (a prefix sum per tensor) and workers take the next number
 * from one atomic counter, so a checkpoint of a few huge tensors spreads over all workers as
 * well as one of many small ones, and no thread idles while work remains. Each slice is one
 * k3_synth_fill call, a pure function of (name, seed, byte range), so the bytes do not depend on
 * the thread count or the order in which slices run.
 *
 * Rejected: one thread per tensor (a plan dominated by a few large embeddings/experts would
 * serialise) and static ranges per thread (slices cost unevenly: MXFP4 groups are ~10x dearer
 * per byte than bf16, and the VM's cores are shared, so dynamic hand-out balances better).
 *
 * Not here: allocation and views (weights.c). Threads never outlive k3_synth_fill_many. */
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/synth.h"

#define SLICE_BYTES ((uint64_t)4 << 20)
#define GIB ((uint64_t)1 << 30)

typedef struct {
  const k3_model_config_t *cfg;
  const k3_tmap_entry_t *entries;
  size_t n;
  uint64_t seed;
  uint8_t *const *dst;
  uint64_t *first;       /* first[i] = global number of entry i's first slice; first[n] = total */
  uint64_t nslices;
  uint64_t total_bytes;
  bool progress;
  atomic_uint_fast64_t next;  /* next slice number to hand out */
  atomic_uint_fast64_t done;  /* bytes filled so far (for progress) */
  atomic_int rc;              /* first error, 0 while none */
  atomic_size_t failed;       /* entry of the first error */
} fill_ctx_t;

/* Entry owning global slice s: the last i with first[i] <= s (entries of 0 bytes own no slice,
 * so they share their first[] with the next entry and are skipped by taking the last). */
static size_t slice_entry(const fill_ctx_t *c, uint64_t s) {
  size_t lo = 0, hi = c->n; /* invariant: first[lo] <= s < first[hi] */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->first[mid] <= s) lo = mid;
    else hi = mid;
  }
  return lo;
}

static void report(const fill_ctx_t *c, uint64_t done) {
  char line[128];
  int n = snprintf(line, sizeof line, "k3_weights_synth: %.1f / %.1f GiB (%.0f%%)\n", (double)done / (double)GIB,
                   (double)c->total_bytes / (double)GIB, 100.0 * (double)done / (double)c->total_bytes);
  /* One write(2) per line so lines from different workers never interleave. */
  if (n > 0 && write(STDERR_FILENO, line, (size_t)n) < 0) { /* progress is best effort */ }
}

static void *worker(void *arg) {
  fill_ctx_t *c = arg;
  for (;;) {
    if (atomic_load_explicit(&c->rc, memory_order_relaxed)) break;
    uint64_t s = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    if (s >= c->nslices) break;
    size_t i = slice_entry(c, s);
    const k3_tmap_entry_t *e = &c->entries[i];
    uint64_t off = (s - c->first[i]) * SLICE_BYTES;
    size_t len = (size_t)(e->nbytes - off < SLICE_BYTES ? e->nbytes - off : SLICE_BYTES);
    int rc = k3_synth_fill(c->cfg, e, c->seed, off, len, c->dst[i] + off);
    if (rc) {
      int zero = 0;
      if (atomic_compare_exchange_strong(&c->rc, &zero, rc)) atomic_store(&c->failed, i);
      break;
    }
    if (c->progress) {
      uint64_t before = atomic_fetch_add_explicit(&c->done, len, memory_order_relaxed);
      if ((before + len) / GIB != before / GIB) report(c, before + len);
    }
  }
  return NULL;
}

static int resolve_threads(int requested) {
  long n = requested;
  if (n == 0) n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n > K3_SYNTH_MAX_THREADS) n = K3_SYNTH_MAX_THREADS;
  return (int)n;
}

int k3_synth_fill_many(const k3_model_config_t *cfg, const k3_tmap_entry_t *entries, size_t n,
                       uint64_t seed, uint8_t *const *dst, int threads, bool progress, size_t *failed) {
  if (threads < 0) return K3_EINVAL;
  if (n == 0) return 0;
  fill_ctx_t c = {.cfg = cfg, .entries = entries, .n = n, .seed = seed, .dst = dst};
  c.first = malloc((n + 1) * sizeof *c.first);
  if (!c.first) return K3_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    c.first[i] = c.nslices;
    c.nslices += (entries[i].nbytes + SLICE_BYTES - 1) / SLICE_BYTES;
    c.total_bytes += entries[i].nbytes;
  }
  c.first[n] = c.nslices;
  c.progress = progress && c.total_bytes >= GIB;
  atomic_init(&c.next, 0);
  atomic_init(&c.done, 0);
  atomic_init(&c.rc, 0);
  atomic_init(&c.failed, 0);

  threads = resolve_threads(threads);
  if ((uint64_t)threads > c.nslices) threads = (int)(c.nslices ? c.nslices : 1);
  pthread_t tid[K3_SYNTH_MAX_THREADS];
  int started = 0;
  /* The caller is worker 0; a thread that cannot be created just leaves its share to the others. */
  for (int t = 1; t < threads; t++)
    if (pthread_create(&tid[started], NULL, worker, &c) == 0) started++;
  worker(&c);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  free(c.first);
  int rc = atomic_load(&c.rc);
  if (rc && failed) *failed = atomic_load(&c.failed);
  return rc;
}
