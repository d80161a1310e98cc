/* k3pd-xfer-bench internals: the transfer plan (manifest x layout) and the memory services a
 * bench mode supplies.
 *
 * What it is for: main.c runs two processes and times transfers; plan.c turns a manifest and a
 * layout into the receiver's pools, index lists and regions (descriptor v2) plus where each
 * region's source bytes sit on the sender; a bench_mem_t says where memory comes from and how
 * k3_xfer reaches it. "host" (mem_host.c) is built in. A device mode ("--device cuda", the
 * lead's: k3k_xdev jobs + k3k_vmm arena) is one more bench_mem_t: allocate device sources and
 * the receiver's arena, fill the sources, give the k3_xfer_dev_t hooks, a device-to-host copy
 * (staged) and a same-device copy baseline; main.c needs no other change.
 *
 * What it is not: a test (tests/unit/xfer check correctness; this measures). */
#ifndef K3PD_XFER_BENCH_H
#define K3PD_XFER_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "k3pd/xfer.h"

#define BENCH_PAGE_TOK 64

typedef struct {
  uint32_t n_kda, n_mla;
  uint64_t s_bytes, conv_bytes, tok_bytes; /* per layer */
} bench_manifest_t;

typedef enum { LAYOUT_PAGED, LAYOUT_ARENA } bench_layout_t;

/* One transfer plan. Receiver pools: paged = pool 0 page-major KV [n_pages, all MLA layers'
 * rows], pool 1 slot-major KDA [n_slots, all KDA layers' S + conv]; arena = ONE pool holding
 * every layer's own tensor ([n_pages, page bytes] per MLA layer, [n_slots, S] and [n_slots,
 * conv] per KDA layer) at its own offset, as the runner's state arena has them. List 0 = the
 * request's pages (0..n_pages-1), list 1 = its slot (n_slots - 1, so strides matter). Sources:
 * one contiguous block per region, at src_off[r] of one allocation of total_bytes. */
typedef struct {
  bench_manifest_t m;
  bench_layout_t layout;
  uint32_t tokens, n_pages, n_slots, n_layers, n_regions, n_pools, seqs; /* n_pages: per sequence */
  uint64_t pool_bytes[2];
  k3_xfer_region_t *rg; /* n_regions, owned */
  uint64_t *src_off;    /* n_regions, owned */
  uint64_t total_bytes;
} bench_plan_t;

/* seqs: sequences the receiver's pools hold side by side (transfers in flight at once, each
 * into its own pages and slot: bench_plan_seq). */
int bench_plan_build(bench_plan_t *p, bench_manifest_t m, bench_layout_t layout, uint32_t tokens, uint32_t seqs);
/* Sequence q's pages (n_pages from q * n_pages) and slot (q + 1) in the receiver's pools. */
void bench_plan_seq(const bench_plan_t *p, uint32_t q, uint32_t *pages, uint32_t *slot);
void bench_plan_free(bench_plan_t *p);

/* Memory services of a bench mode. All functions return 0 or K3_E*. */
typedef struct bench_mem {
  const char *name;
  void *self;
  /* Sender: `bytes` of source memory (host or device), filled with a pattern that differs per
   * 4 KiB; freed with src_free. */
  int (*src_alloc)(void *self, uint64_t bytes, void **ptr);
  void (*src_free)(void *self, void *ptr, uint64_t bytes);
  /* cuda-pull: the exported allocation holding the sources (after src_alloc); NULL or an error:
   * the sources are not exported (then the push paths are used). */
  int (*src_pool)(void *self, k3_xfer_src_pool_t *out);
  /* Receiver: a pool of `bytes` registered with ctx (host: k3_xfer_pool_alloc_host; device:
   * the arena registered as K3_XFER_MEM_CUDA with its mapping blob). */
  int (*pool_make)(void *self, k3_xfer_ctx_t *ctx, uint64_t bytes, k3_xfer_pool_t **out);
  void (*pool_free)(void *self, k3_xfer_pool_t *pool);
  /* Device hooks for both processes (NULL: host memory, no hooks). Valid until the process
   * exits. */
  const k3_xfer_dev_t *(*dev)(void *self);
  /* --path staged: copy len bytes of source memory at src into the host buffer dst (device:
   * cudaMemcpy device-to-host; host: memcpy). The receiver then uses host pools. Also used by
   * --check in both directions (k3k_dev_copy and memcpy copy any way round). */
  int (*d2h)(void *self, void *dst, const void *src, uint64_t len);
  /* The baseline: one copy of `bytes` from src to a destination of the same kind, best of 3;
   * returns GB/s and the CPU ms of the fastest (host: a single-threaded memcpy). */
  double (*copy_gbps)(void *self, const void *src, uint64_t bytes, double *cpu_ms);
  void (*close)(void *self); /* frees what the mode holds (NULL: nothing) */
} bench_mem_t;

/* cpu_loops.c: times the host sender's loops over p's regions in this thread (--cpu-loops). */
int bench_cpu_loops(const bench_plan_t *p);

/* mem_host.c: host memory, no hooks. */
int bench_mem_host(bench_mem_t *out);
/* mem_cuda.c: device sources and a device arena (vmm_pool: exported VMM for cuda-ipc; else
 * plain device memory UCX can register, for ucx-cuda); the workers' device hooks. */
int bench_mem_cuda(bench_mem_t *out, bool vmm_pool);

#endif
