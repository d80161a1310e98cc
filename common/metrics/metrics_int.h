/* Private layout of the metrics registry, shared by registry.c (registration, updates) and
 * expose.c (text rendering). Not installed; nothing outside common/metrics includes it.
 *
 * Invariants: a family's series[] slots below nseries are fully built before nseries is
 * published (release store), so readers that load nseries (acquire) may scan without the
 * lock. Families and series are freed only by k3_metrics_free(). Lock order: only
 * k3_metrics.mu exists. */
#ifndef K3PD_METRICS_INT_H
#define K3PD_METRICS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "k3pd/metrics.h"

struct k3_mseries {
  k3_metric_t *fam;                 /* owning family */
  char *values[K3_METRIC_MAX_LABELS]; /* owned copies, nlabels of them */
  _Atomic uint64_t bits;            /* counter/gauge value, or histogram sum (double bits) */
  _Atomic uint64_t *buckets;        /* histogram: nbuckets + 1 non-cumulative counts (owned) */
};

struct k3_metric {
  char *name; /* owned */
  char *help; /* owned */
  k3_metric_type_t type;
  size_t nlabels;
  char *labels[K3_METRIC_MAX_LABELS]; /* owned */
  size_t nbuckets;
  double bounds[K3_METRIC_MAX_BUCKETS];
  k3_mseries_t *series[K3_METRIC_MAX_SERIES];
  _Atomic size_t nseries;
  k3_metrics_t *reg;
};

struct k3_metrics {
  pthread_mutex_t mu; /* guards fams/nfams/cap and series appends */
  k3_metric_t **fams; /* owned, registration order */
  size_t nfams, cap;
};

/* Double stored in an atomic uint64 (C11 has no portable atomic double add). */
static inline double k3_metrics_load_f64(const _Atomic uint64_t *p) {
  uint64_t b = atomic_load_explicit((_Atomic uint64_t *)p, memory_order_relaxed);
  double d;
  __builtin_memcpy(&d, &b, sizeof d);
  return d;
}

#endif
