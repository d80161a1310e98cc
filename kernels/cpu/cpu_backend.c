/* The "cpu" backend: the reference (specification) backend. Single-threaded, plain loops; every
 * op is implemented in kernels/cpu/<family>.c. Memory is ordinary host memory, 64-byte aligned.
 * The memory entry points are shared with "cpu-fast". */
/* madvise/MADV_HUGEPAGE are not ISO C: ask glibc for them (this file only). */
#define _DEFAULT_SOURCE 1
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/k3k_internal.h"

/* Large buffers (weights, host copies of device weights: tens of GB) are 2 MiB-aligned, padded
 * to whole 2 MiB, and advised MADV_HUGEPAGE, so that the first touch (a pageable cudaMemcpy
 * from the device, or loading a checkpoint) faults in 2 MiB pages instead of 4 KiB ones: a
 * copy into fresh 4 KiB pages ran at ~1 GB/s, fault-bound. Only an advice: when THP is off or
 * the call fails, nothing changes but the page size. Both sizes come from aligned_alloc and go
 * back through free(). */
#define HUGE_MIN_BYTES ((size_t)32 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)

int k3k_cpu_mem_alloc(k3k_backend_t *be, size_t bytes, void **out) {
  size_t n = (bytes + 63) & ~(size_t)63;
  if (n < bytes) return K3_ENOMEM; /* size_t overflow */
  void *p;
  if (n >= HUGE_MIN_BYTES && n + HUGE_ALIGN > n) {
    n = (n + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
    p = aligned_alloc(HUGE_ALIGN, n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) (void)madvise(p, n, MADV_HUGEPAGE);
#endif
  } else {
    p = aligned_alloc(64, n ? n : 64);
  }
  if (!p) return K3_ENOMEM;
  *out = p;
  return 0;
}
void k3k_cpu_mem_free(k3k_backend_t *be, void *p) { free(p); }
int k3k_cpu_mem_copy(k3k_backend_t *be, void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
  return 0;
}
int k3k_cpu_mem_memset(k3k_backend_t *be, void *dst, int byte, size_t bytes) {
  if (bytes) memset(dst, byte, bytes);
  return 0;
}
int k3k_cpu_sync(k3k_backend_t *be) { return 0; }

/* One reference entry per op of k3k_ops.def: k3k_cpu_<name>. */
static const k3k_cpu_fn k_ref[K3K_OP_COUNT] = {
#define K3K_OP_X(ENUM, name, n_tensors) [K3K_OP_##ENUM] = k3k_cpu_##name,
#include "k3k_ops.def"
#undef K3K_OP_X
};

k3k_cpu_fn k3k_cpu_ref_fn(k3k_op_t op) {
  return (op >= 0 && op < K3K_OP_COUNT) ? k_ref[op] : NULL;
}

/* Host memory only: a tensor owned by another backend (a device) cannot be read here. */
static bool host_tensors(const k3k_tensor_t *const *t, int nt) {
  for (int i = 0; i < nt; i++)
    if (t[i] && t[i]->backend && !t[i]->backend->host_memory) return false;
  return true;
}

static bool cpu_supports(k3k_backend_t *be, k3k_op_t op, const void *params,
                         const k3k_tensor_t *const *t, int nt) {
  return k3k_cpu_ref_fn(op) != NULL && host_tensors(t, nt);
}

static int cpu_run(k3k_backend_t *be, k3k_op_t op, const void *params,
                   const k3k_tensor_t *const *t, int nt) {
  return k_ref[op](params, t);
}

k3k_backend_t *k3k_cpu_backend_create(void) {
  k3k_backend_t *be = calloc(1, sizeof *be);
  if (!be) return NULL;
  be->name = "cpu";
  be->host_memory = true;
  be->alloc = k3k_cpu_mem_alloc;
  be->free = k3k_cpu_mem_free;
  be->copy_from_host = k3k_cpu_mem_copy;
  be->copy_to_host = k3k_cpu_mem_copy;
  be->copy = k3k_cpu_mem_copy;
  be->memset = k3k_cpu_mem_memset;
  be->synchronize = k3k_cpu_sync;
  be->supports = cpu_supports;
  be->run = cpu_run;
  return be;
}

void k3k_cpu_backend_destroy(k3k_backend_t *be) { free(be); }

/* ---- Metadata checks shared by both CPU backends (run before any write). ---- */

/* cu [n+1]: cu[0] >= 0, non-decreasing, cu[n] <= total. */
int k3k_cpu_check_seqs(const k3k_tensor_t *cu, int32_t n, int64_t total, const char *what) {
  int32_t prev = k3k_ldi(cu, 0);
  if (prev < 0) return K3_ERANGE;
  for (int32_t i = 1; i <= n; i++) {
    int32_t c = k3k_ldi(cu, i * cu->stride[0]);
    if (c < prev) return K3_ERANGE;
    prev = c;
  }
  return prev <= total ? 0 : K3_ERANGE;
}

/* slots [n]: each in [0, n_slots) and pairwise distinct (two sequences sharing a state slot
 * would make the result depend on processing order). */
int k3k_cpu_check_slots(const k3k_tensor_t *slots, int32_t n, int64_t n_slots) {
  for (int32_t i = 0; i < n; i++) {
    int32_t s = k3k_ldi(slots, i * slots->stride[0]);
    if (s < 0 || s >= n_slots) return K3_ERANGE;
    for (int32_t j = 0; j < i; j++)
      if (k3k_ldi(slots, j * slots->stride[0]) == s) return K3_EINVAL;
  }
  return 0;
}
