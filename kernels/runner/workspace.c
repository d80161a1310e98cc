/* The runner's activation workspace: one arena of backend memory per runner, reused by every
 * forward pass instead of one backend allocation per activation buffer per pass (on the CPU
 * that was dozens of malloc/free pairs per layer, and fresh pages for every large buffer).
 *
 * What it is not: a general allocator. Buffers are handed out by bumping an offset and are
 * released together: at the end of the pass (rn_ws_end), or back to a mark (rn_ws_mark /
 * rn_ws_release: the forward pass releases each mixer's and FFN's temporaries when the layer
 * part returns, so a pass needs one layer's temporaries, not the sum over all layers: an 8K
 * prefill of the medium preset would otherwise need ~80 GB). Nothing is freed individually.
 *
 * Invariants:
 *   - a buffer stays valid until rn_ws_end of its pass; contents are unspecified (like the
 *     backend's alloc), every op writes its whole output before anything reads it;
 *   - the arena is only reallocated in rn_ws_end, never while buffers are live: a pass that
 *     outgrows it takes the excess from separate backend allocations, and the arena then grows
 *     to that pass's high-water mark of live bytes (`need`), so steady state allocates nothing;
 *   - an overflow allocation made after a mark is freed by rn_ws_release(mark), like the arena
 *     space after it: the first 8K prefill of the medium preset runs before the arena has grown,
 *     and keeping every layer's overflow until the end of the pass needed the sum over all
 *     layers (~80 GB: out of memory on the H200) instead of one layer's temporaries. Freeing
 *     mid-pass is safe for the same reason arena reuse is (one stream, in order; the CUDA pool
 *     caches the block and hands it out again in stream order);
 *   - reuse after a release is safe on device backends because every op of the pass is queued
 *     on one stream in order (a later kernel cannot overtake the earlier reader);
 *   - every change of the arena's base bumps ws->gen (graph.c drops graphs captured before);
 *   - offsets are multiples of 64 bytes (the backend's alignment guarantee is kept);
 *   - under AddressSanitizer on a host backend every buffer is followed by a poisoned red zone
 *     and the arena outside live buffers is poisoned, so overruns between buffers and uses
 *     after the pass are still reported as they were with separate allocations.
 * One runner is used by one thread at a time (k3_runner.h), so the arena needs no lock. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "runner_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define WS_REDZONE 64
#else
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define WS_REDZONE 0
#endif

#define WS_ALIGN 64
#define WS_GRAIN ((size_t)64 << 10) /* arena sizes are rounded up to 64 KiB */

static bool ws_host(const rn_ws_t *ws) { return ws->r->be->host_memory; }

rn_ws_t *rn_ws_begin(k3_runner_t *r) {
  rn_ws_t *ws = &r->ws;
  ws->r = r;
  ws->used = ws->need = ws->cur = 0;
  ws->n_extra = 0;
  ws->extras_taken = 0;
  ws->rc = 0;
  return ws;
}

void rn_ws_end(rn_ws_t *ws) {
  k3k_backend_t *be = ws->r->be;
  for (int i = 0; i < ws->n_extra; i++) be->free(be, ws->extra[i]);
  ws->n_extra = 0;
  ws->extras_taken = 0;
  if (ws->need > ws->cap) {
    /* Grow to this pass's high-water mark; on failure keep working from extra allocations. */
    if (ws->base) {
      if (ws_host(ws)) ASAN_UNPOISON_MEMORY_REGION(ws->base, ws->cap);
      be->free(be, ws->base);
    }
    ws->base = NULL;
    ws->cap = 0;
    ws->gen++; /* captured decode graphs point into the old arena */
    size_t cap = (ws->need + WS_GRAIN - 1) / WS_GRAIN * WS_GRAIN;
    void *p = NULL;
    if (be->alloc(be, cap, &p) == 0) {
      ws->base = p;
      ws->cap = cap;
    }
  }
  if (ws->base && ws_host(ws)) ASAN_POISON_MEMORY_REGION(ws->base, ws->cap);
  ws->used = ws->need = ws->cur = 0;
}

rn_ws_mark_t rn_ws_mark(const rn_ws_t *ws) { return (rn_ws_mark_t){ws->used, ws->cur, ws->n_extra}; }

void rn_ws_release(rn_ws_t *ws, rn_ws_mark_t m) {
  if (m.used > ws->used || m.cur > ws->cur || m.n_extra > ws->n_extra) return; /* not a mark of this pass */
  k3k_backend_t *be = ws->r->be;
  for (int i = m.n_extra; i < ws->n_extra; i++) be->free(be, ws->extra[i]);
  ws->n_extra = m.n_extra;
  if (ws->base && ws_host(ws)) ASAN_POISON_MEMORY_REGION((char *)ws->base + m.used, ws->used - m.used);
  ws->used = m.used;
  ws->cur = m.cur;
}

void rn_ws_destroy(k3_runner_t *r) {
  rn_ws_t *ws = &r->ws;
  if (r->be) {
    for (int i = 0; i < ws->n_extra; i++) r->be->free(r->be, ws->extra[i]);
    if (ws->base) {
      if (ws_host(ws)) ASAN_UNPOISON_MEMORY_REGION(ws->base, ws->cap);
      r->be->free(r->be, ws->base);
    }
  }
  free(ws->extra);
  uint64_t gen = ws->gen + 1;
  memset(ws, 0, sizeof *ws);
  ws->gen = gen;
}

void *rn_ws_alloc(rn_ws_t *ws, size_t bytes) {
  if (ws->rc) return NULL;
  size_t sz = (bytes + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN + WS_REDZONE;
  if (sz == 0) sz = WS_ALIGN;
  ws->cur += sz;
  if (ws->cur > ws->need) ws->need = ws->cur;
  if (ws->base && ws->used + sz <= ws->cap) {
    char *p = (char *)ws->base + ws->used;
    ws->used += sz;
    if (ws_host(ws)) ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    return p;
  }
  if (ws->n_extra == ws->cap_extra) {
    int cap = ws->cap_extra ? 2 * ws->cap_extra : 16;
    void **e = realloc(ws->extra, (size_t)cap * sizeof *e);
    if (!e) {
      ws->rc = K3_ENOMEM;
      return NULL;
    }
    ws->extra = e;
    ws->cap_extra = cap;
  }
  void *d = NULL;
  if (ws->r->be->alloc(ws->r->be, bytes ? bytes : WS_ALIGN, &d)) {
    ws->rc = K3_ENOMEM;
    return NULL;
  }
  ws->extra[ws->n_extra++] = d;
  ws->extras_taken++;
  return d;
}

k3k_tensor_t rn_buf(rn_ws_t *ws, k3k_dtype_t dt, int64_t rows, int64_t cols) {
  void *d = rn_ws_alloc(ws, (size_t)(rows * cols) * k3k_dtype_size(dt));
  return k3k_tensor_2d(ws->r->be, dt, d, rows, cols);
}

k3k_tensor_t rn_i32(rn_ws_t *ws, const int32_t *host, int64_t n) {
  void *d = rn_ws_alloc(ws, (size_t)n * 4);
  if (d && n > 0 && ws->r->be->copy_from_host(ws->r->be, d, host, (size_t)n * 4))
    ws->rc = K3_EDEVICE;
  return k3k_tensor_1d(ws->r->be, K3K_I32, d, n);
}
