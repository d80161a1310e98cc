/* k3pd-xfer-bench --cpu-loops: the host sender's per-byte loops alone, one thread, no UCX and no
 * second process, over the plan's regions (the same bytes, region by region, that a host
 * transfer copies): glibc memcpy of the whole block (the transfer's baseline), memcpy region by
 * region, the receiver's hash from DRAM (k3_digest_update: libxxhash per chunk, the same with
 * the next chunk prefetched, or four chunks side by side), and k3_digest_copy with every loop
 * this CPU can run (k3pd/digest.h: legacy, fused, fused4, fused4-st, fused4-pf), then memcpy,
 * fused4 and legacy into a shared (memfd, 4 KiB pages) destination like the receiver's pool.
 * Each figure is the median
 * of 5 passes after one warm-up, loops taken round robin, printed beside the memcpy's. It answers "is the sender's loop
 * as cheap as a memcpy on this CPU" without the scheduling noise of a two-process transfer
 * (docs/transfer.md "Figures"). Measures; checks only that every loop gives the same digests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"
#include "k3pd/digest.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

enum { L_MEMCPY, L_MEMCPY_REG, L_HASH, L_COPY };

typedef struct {
  const char *name, *impl;
  int kind;
  bool shared; /* destination: a MAP_SHARED memfd mapping (4 KiB pages, like the receiver's shm pool) */
} run_t;

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One pass of loop kind k; returns seconds; xor of the region digests in *dg. */
static double one_pass(const bench_plan_t *p, int k, uint8_t *dst, const uint8_t *src, k3_digest_t *d,
                       uint64_t *dg) {
  uint64_t t0 = k3_now_ns(), x = 0;
  if (k == L_MEMCPY) {
    memcpy(dst, src, p->total_bytes);
  } else {
    for (uint32_t r = 0; r < p->n_regions; r++) {
      uint64_t off = p->src_off[r], len = p->rg[r].len_bytes;
      if (k == L_MEMCPY_REG) {
        memcpy(dst + off, src + off, len);
        continue;
      }
      k3_digest_reset(d);
      if (k == L_HASH) k3_digest_update(d, src + off, len);
      else k3_digest_copy(d, dst + off, src + off, len);
      x ^= k3_digest_final(d) * (r + 1);
    }
  }
  *dg = x;
  return (double)(k3_now_ns() - t0) / 1e9;
}

int bench_cpu_loops(const bench_plan_t *p) {
  uint8_t *src = aligned_alloc(4096, (p->total_bytes + 4095) & ~4095ull);
  uint8_t *dst = aligned_alloc(4096, (p->total_bytes + 4095) & ~4095ull);
  k3_digest_t d;
  if (!src || !dst || k3_digest_init(&d)) {
    free(src);
    free(dst);
    return K3_ENOMEM;
  }
  for (uint64_t b = 0; b < p->total_bytes; b++) src[b] = (uint8_t)(b * 131 + (b >> 12));
  memset(dst, 0, p->total_bytes);
  /* A second destination like the receiver's pool: shared memory of another object, 4 KiB
   * pages (the private one may get transparent huge pages), faulted in first. */
  uint8_t *sdst = NULL;
  int mfd = memfd_create("k3pd-cpu-loops", 0);
  if (mfd >= 0 && ftruncate(mfd, (off_t)p->total_bytes) == 0) {
    void *m = mmap(NULL, p->total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (m != MAP_FAILED) {
      sdst = m;
      memset(sdst, 0, p->total_bytes);
    }
  }
  if (mfd >= 0) close(mfd);
  static const char *const impls[] = {"legacy", "fused", "fused4", "fused4-st", "fused4-pf"};
  const char *def = k3_digest_copy_impl();
  run_t runs[14];
  int n = 0;
  runs[n++] = (run_t){"memcpy (baseline)", NULL, L_MEMCPY, false};
  runs[n++] = (run_t){"memcpy per region", NULL, L_MEMCPY_REG, false};
  runs[n++] = (run_t){"hash only (receiver)", "lib", L_HASH, false};
  runs[n++] = (run_t){"hash only (receiver)", "pf", L_HASH, false};
  runs[n++] = (run_t){"hash only (receiver)", "fused4", L_HASH, false};
  for (int i = 0; i < 5; i++) runs[n++] = (run_t){"hash+copy", impls[i], L_COPY, false};
  if (sdst) {
    runs[n++] = (run_t){"memcpy to shared", NULL, L_MEMCPY, true};
    runs[n++] = (run_t){"hash+copy to shared", "fused4", L_COPY, true};
    runs[n++] = (run_t){"hash+copy to shared", "legacy", L_COPY, true};
  }
  double base = 0;
  uint64_t ref = 0;
  int rc = 0;
  printf("cpu-loops: %llu bytes in %u regions, one thread; default copy loop %s, hash loop %s\n",
         (unsigned long long)p->total_bytes, p->n_regions, def, k3_digest_hash_impl());
  /* Round robin: pass k of every loop runs before pass k + 1 of any, so drift in the machine's
   * load hits all of them alike. */
  double t[14][6];
  uint64_t dg[14] = {0};
  bool ok[14];
  const char *hdef = k3_digest_hash_impl();
  for (int i = 0; i < n; i++)
    ok[i] = !runs[i].impl || (runs[i].kind == L_HASH ? k3_digest_hash_impl_set(runs[i].impl)
                                                     : k3_digest_copy_impl_set(runs[i].impl)) == 0;
  for (int k = 0; k < 6; k++)
    for (int i = 0; i < n; i++) {
      if (!ok[i]) continue;
      if (runs[i].impl && runs[i].kind == L_HASH) k3_digest_hash_impl_set(runs[i].impl);
      else if (runs[i].impl) k3_digest_copy_impl_set(runs[i].impl);
      uint8_t *to = runs[i].shared ? sdst : dst;
      t[i][k] = one_pass(p, runs[i].kind, to, src, &d, &dg[i]); /* pass 0: warm-up */
      if (runs[i].kind == L_COPY && memcmp(to, src, p->total_bytes) != 0) dg[i] = ~dg[i];
    }
  for (int i = 0; i < n; i++) {
    if (!ok[i]) {
      printf("  %-22s %-10s not usable on this CPU\n", runs[i].name, runs[i].impl);
      continue;
    }
    double *v = &t[i][1];
    qsort(v, 5, sizeof v[0], cmpd);
    double gbps = (double)p->total_bytes / v[2] / 1e9;
    if (runs[i].kind == L_MEMCPY && !runs[i].shared) base = gbps;
    if (runs[i].kind == L_HASH && !ref) ref = dg[i];
    bool same = runs[i].kind == L_MEMCPY || runs[i].kind == L_MEMCPY_REG || dg[i] == ref;
    if (!same) rc = K3_EDIGEST;
    printf("  %-22s %-10s median %7.2f ms (min %.2f max %.2f)  %6.2f GB/s  %.2f of memcpy%s\n", runs[i].name,
           runs[i].impl ? runs[i].impl : "", v[2] * 1e3, v[0] * 1e3, v[4] * 1e3, gbps, base > 0 ? gbps / base : 0,
           same ? "" : "  DIGEST OR BYTES DIFFER");
  }
  k3_digest_copy_impl_set(def);
  k3_digest_hash_impl_set(hdef);
  k3_digest_free(&d);
  free(src);
  free(dst);
  if (sdst) munmap(sdst, p->total_bytes);
  return rc;
}
