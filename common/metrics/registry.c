/* Metrics registry: family registration with validation, label-series lookup, and the
 * lock-free update paths used from serving loops.
 *
 * Not here: text rendering (expose.c) and HTTP (http.c). Invariants are in metrics_int.h:
 * series are published with a release store of nseries, so lookups of existing series need
 * no lock; appends take the registry mutex and re-check under it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "metrics_int.h"

const double K3_METRIC_LATENCY_BUCKETS[K3_METRIC_LATENCY_BUCKETS_N] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

static bool name_ok(const char *s, bool allow_colon) {
  if (!s || !*s) return false;
  for (const char *p = s; *p; p++) {
    char c = *p;
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (allow_colon && c == ':');
    if (!alpha && !(p != s && c >= '0' && c <= '9')) return false;
  }
  return true;
}

static bool ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), k = strlen(suf);
  return n >= k && strcmp(s + n - k, suf) == 0;
}

/* Atomic "*p += v" on a double stored as bits. */
static void add_f64(_Atomic uint64_t *p, double v) {
  uint64_t old = atomic_load_explicit(p, memory_order_relaxed), nw;
  do {
    double d;
    memcpy(&d, &old, sizeof d);
    d += v;
    memcpy(&nw, &d, sizeof nw);
  } while (!atomic_compare_exchange_weak_explicit(p, &old, nw, memory_order_relaxed,
                                                  memory_order_relaxed));
}

static void store_f64(_Atomic uint64_t *p, double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  atomic_store_explicit(p, b, memory_order_relaxed);
}

int k3_metrics_init(k3_metrics_t **out) {
  k3_metrics_t *m = calloc(1, sizeof *m);
  if (!m) return K3_ENOMEM;
  pthread_mutex_init(&m->mu, NULL);
  *out = m;
  return 0;
}

static void series_free(k3_mseries_t *s, size_t nlabels) {
  if (!s) return;
  for (size_t i = 0; i < nlabels; i++) free(s->values[i]);
  free(s->buckets);
  free(s);
}

static void family_free(k3_metric_t *f) {
  if (!f) return;
  size_t n = atomic_load(&f->nseries);
  for (size_t i = 0; i < n; i++) series_free(f->series[i], f->nlabels);
  for (size_t i = 0; i < f->nlabels; i++) free(f->labels[i]);
  free(f->name);
  free(f->help);
  free(f);
}

void k3_metrics_free(k3_metrics_t *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nfams; i++) family_free(m->fams[i]);
  free(m->fams);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

static int validate(const k3_metric_desc_t *d) {
  const char *what = NULL;
  if (!name_ok(d->name, true)) what = "name";
  else if (!d->help || !*d->help) what = "help";
  else if (d->type != K3_METRIC_COUNTER && d->type != K3_METRIC_GAUGE &&
           d->type != K3_METRIC_HISTOGRAM) what = "type";
  else if (d->type == K3_METRIC_COUNTER && !ends_with(d->name, "_total"))
    what = "name (counters end in _total)";
  else if (d->nlabels > K3_METRIC_MAX_LABELS || (d->nlabels && !d->label_names))
    what = "label_names";
  if (!what) {
    for (size_t i = 0; i < d->nlabels && !what; i++) {
      const char *l = d->label_names[i];
      if (!name_ok(l, false) || strncmp(l, "__", 2) == 0 ||
          (d->type == K3_METRIC_HISTOGRAM && strcmp(l, "le") == 0))
        what = "label_names";
      for (size_t j = 0; j < i && !what; j++)
        if (strcmp(l, d->label_names[j]) == 0) what = "label_names (duplicate)";
    }
  }
  if (!what && d->type != K3_METRIC_HISTOGRAM && (d->buckets || d->nbuckets))
    what = "buckets (histograms only)";
  if (!what && d->type == K3_METRIC_HISTOGRAM && d->nbuckets) {
    if (!d->buckets || d->nbuckets > K3_METRIC_MAX_BUCKETS) what = "buckets";
    for (size_t i = 0; i < d->nbuckets && !what; i++)
      if (!isfinite(d->buckets[i]) || (i && !(d->buckets[i] > d->buckets[i - 1])))
        what = "buckets (finite, strictly increasing)";
  }
  if (!what && d->npresets && (!d->presets || !d->nlabels)) what = "presets";
  if (!what && d->npresets * d->nlabels > K3_METRIC_MAX_SERIES * K3_METRIC_MAX_LABELS)
    what = "presets (too many)";
  for (size_t i = 0; !what && i < d->npresets * d->nlabels; i++)
    if (!d->presets[i]) what = "presets (NULL value)";
  if (what) {
    K3_DEBUG("metrics: %s: invalid %s", d->name ? d->name : "(null)", what);
    return K3_EINVAL;
  }
  return 0;
}

static k3_mseries_t *series_new(k3_metric_t *f, const char *const *values) {
  k3_mseries_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->fam = f;
  for (size_t i = 0; i < f->nlabels; i++) {
    if (!(s->values[i] = strdup(values[i]))) goto err;
  }
  if (f->type == K3_METRIC_HISTOGRAM) {
    s->buckets = calloc(f->nbuckets + 1, sizeof *s->buckets);
    if (!s->buckets) goto err;
  }
  return s;
err:
  series_free(s, f->nlabels);
  return NULL;
}

static k3_mseries_t *find_series(k3_metric_t *f, const char *const *values, size_t n) {
  for (size_t i = 0; i < n; i++) {
    k3_mseries_t *s = f->series[i];
    size_t j = 0;
    while (j < f->nlabels && strcmp(s->values[j], values[j]) == 0) j++;
    if (j == f->nlabels) return s;
  }
  return NULL;
}

/* Appends a series; caller holds reg->mu (or owns f exclusively during registration). */
static int append_series_locked(k3_metric_t *f, const char *const *values, k3_mseries_t **out) {
  size_t n = atomic_load_explicit(&f->nseries, memory_order_relaxed);
  k3_mseries_t *s = find_series(f, values, n);
  if (s) {
    *out = s;
    return 0;
  }
  if (n == K3_METRIC_MAX_SERIES) return K3_ECAPACITY;
  if (!(s = series_new(f, values))) return K3_ENOMEM;
  f->series[n] = s;
  atomic_store_explicit(&f->nseries, n + 1, memory_order_release);
  *out = s;
  return 0;
}

k3_metric_t *k3_metrics_find(k3_metrics_t *m, const char *name) {
  k3_metric_t *r = NULL;
  pthread_mutex_lock(&m->mu);
  for (size_t i = 0; i < m->nfams && !r; i++)
    if (strcmp(m->fams[i]->name, name) == 0) r = m->fams[i];
  pthread_mutex_unlock(&m->mu);
  return r;
}

int k3_metrics_register(k3_metrics_t *m, const k3_metric_desc_t *d, k3_metric_t **out) {
  int rc = validate(d);
  if (rc) return rc;
  k3_metric_t *f = calloc(1, sizeof *f);
  if (!f) return K3_ENOMEM;
  f->reg = m;
  f->type = d->type;
  f->nlabels = d->nlabels;
  rc = K3_ENOMEM;
  if (!(f->name = strdup(d->name)) || !(f->help = strdup(d->help))) goto err;
  for (size_t i = 0; i < d->nlabels; i++)
    if (!(f->labels[i] = strdup(d->label_names[i]))) goto err;
  if (d->type == K3_METRIC_HISTOGRAM) {
    const double *b = d->nbuckets ? d->buckets : K3_METRIC_LATENCY_BUCKETS;
    f->nbuckets = d->nbuckets ? d->nbuckets : K3_METRIC_LATENCY_BUCKETS_N;
    memcpy(f->bounds, b, f->nbuckets * sizeof *b);
  }
  /* Series are built before the family is visible, so no lock is needed for them. */
  k3_mseries_t *s;
  if (d->nlabels == 0) {
    if ((rc = append_series_locked(f, NULL, &s))) goto err;
  }
  for (size_t i = 0; i < d->npresets; i++)
    if ((rc = append_series_locked(f, d->presets + i * d->nlabels, &s))) goto err;

  pthread_mutex_lock(&m->mu);
  rc = 0;
  for (size_t i = 0; i < m->nfams && !rc; i++)
    if (strcmp(m->fams[i]->name, d->name) == 0) rc = K3_EEXIST;
  if (!rc && m->nfams == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 16;
    k3_metric_t **nf = realloc(m->fams, cap * sizeof *nf);
    if (!nf) rc = K3_ENOMEM;
    else {
      m->fams = nf;
      m->cap = cap;
    }
  }
  if (!rc) m->fams[m->nfams++] = f;
  pthread_mutex_unlock(&m->mu);
  if (rc) goto err;
  *out = f;
  return 0;
err:
  family_free(f);
  return rc;
}

int k3_metric_series(k3_metric_t *f, const char *const *values, k3_mseries_t **out) {
  for (size_t i = 0; i < f->nlabels; i++)
    if (!values || !values[i]) return K3_EINVAL;
  size_t n = atomic_load_explicit(&f->nseries, memory_order_acquire);
  k3_mseries_t *s = find_series(f, values, n);
  if (s) {
    *out = s;
    return 0;
  }
  pthread_mutex_lock(&f->reg->mu);
  int rc = append_series_locked(f, values, out);
  pthread_mutex_unlock(&f->reg->mu);
  return rc;
}

k3_mseries_t *k3_metric_default(k3_metric_t *f) {
  return f->nlabels == 0 ? f->series[0] : NULL;
}

k3_metric_type_t k3_metric_type(const k3_metric_t *f) { return f->type; }
const char *k3_metric_name(const k3_metric_t *f) { return f->name; }

void k3_counter_add(k3_mseries_t *s, double v) {
  if (s->fam->type != K3_METRIC_COUNTER || !(v >= 0)) return;
  add_f64(&s->bits, v);
}

void k3_counter_inc(k3_mseries_t *s) { k3_counter_add(s, 1.0); }

void k3_gauge_set(k3_mseries_t *s, double v) {
  if (s->fam->type == K3_METRIC_GAUGE) store_f64(&s->bits, v);
}

void k3_gauge_add(k3_mseries_t *s, double v) {
  if (s->fam->type == K3_METRIC_GAUGE) add_f64(&s->bits, v);
}

void k3_histogram_observe(k3_mseries_t *s, double v) {
  const k3_metric_t *f = s->fam;
  if (f->type != K3_METRIC_HISTOGRAM || isnan(v)) return;
  /* Buckets are "less than or equal": a value exactly on a bound counts in that bound's
   * bucket. Linear scan: at most 32 bounds and it stays in one cache line or two. */
  size_t i = 0;
  while (i < f->nbuckets && v > f->bounds[i]) i++;
  atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
  add_f64(&s->bits, v);
}

double k3_mseries_value(const k3_mseries_t *s) { return k3_metrics_load_f64(&s->bits); }

unsigned long long k3_mseries_count(const k3_mseries_t *s) {
  if (s->fam->type != K3_METRIC_HISTOGRAM) return 0;
  unsigned long long n = 0;
  for (size_t i = 0; i <= s->fam->nbuckets; i++)
    n += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
  return n;
}

int k3_metric_inc(k3_metric_t *f, const char *const *lv) { return k3_metric_add(f, lv, 1.0); }

int k3_metric_add(k3_metric_t *f, const char *const *lv, double v) {
  k3_mseries_t *s;
  int rc = k3_metric_series(f, lv, &s);
  if (rc) return rc;
  if (f->type == K3_METRIC_GAUGE) k3_gauge_add(s, v);
  else k3_counter_add(s, v);
  return 0;
}

int k3_metric_set(k3_metric_t *f, const char *const *lv, double v) {
  k3_mseries_t *s;
  int rc = k3_metric_series(f, lv, &s);
  if (!rc) k3_gauge_set(s, v);
  return rc;
}

int k3_metric_observe(k3_metric_t *f, const char *const *lv, double v) {
  k3_mseries_t *s;
  int rc = k3_metric_series(f, lv, &s);
  if (!rc) k3_histogram_observe(s, v);
  return rc;
}
