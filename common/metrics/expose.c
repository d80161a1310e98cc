/* Text exposition format 0.0.4 for a registry (what GET /metrics returns).
 *
 * Layout per family, in registration order:
 *   # HELP <name> <help with \ and newline escaped>
 *   # TYPE <name> counter|gauge|histogram
 *   <name>{l1="v1",...} <value>                         (counter, gauge)
 *   <name>_bucket{l1="v1",...,le="<bound>"} <cumulative> (each bound, then le="+Inf")
 *   <name>_sum{...} <sum>
 *   <name>_count{...} <+Inf bucket>
 * Series appear in creation order. A family with labels and no series prints only its
 * HELP/TYPE lines. Values use the shortest decimal text that reads back exactly.
 *
 * Not here: content negotiation (always 0.0.4 text) or compression. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "metrics_int.h"

typedef struct {
  char *p;
  size_t len, cap;
  bool oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

/* Escapes \ and newline (and " when quote is set, for label values). */
static void put_escaped(buf_t *b, const char *s, bool quote) {
  const char *run = s;
  for (; *s; s++) {
    const char *rep = NULL;
    if (*s == '\\') rep = "\\\\";
    else if (*s == '\n') rep = "\\n";
    else if (quote && *s == '"') rep = "\\\"";
    if (!rep) continue;
    put(b, run, (size_t)(s - run));
    puts_(b, rep);
    run = s + 1;
  }
  put(b, run, (size_t)(s - run));
}

char *k3_metrics_fmt_value(double v, char *buf, size_t cap) {
  if (isnan(v)) snprintf(buf, cap, "NaN");
  else if (isinf(v)) snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 1e15) {
    /* Counts and integral gauges print as plain integers ("75000", not "7.5e+04"). */
    snprintf(buf, cap, "%.0f", v);
  } else {
    /* Shortest %g that round-trips, so 0.1 prints as "0.1". */
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(buf, cap, "%.*g", prec, v);
      if (strtod(buf, NULL) == v) break;
    }
  }
  return buf;
}

/* name{labels[,le="x"]} value\n */
static void put_sample(buf_t *b, const k3_metric_t *f, const char *suffix,
                       const k3_mseries_t *s, const char *le, double v) {
  char num[40];
  puts_(b, f->name);
  puts_(b, suffix);
  if (f->nlabels || le) {
    puts_(b, "{");
    for (size_t i = 0; i < f->nlabels; i++) {
      if (i) puts_(b, ",");
      puts_(b, f->labels[i]);
      puts_(b, "=\"");
      put_escaped(b, s->values[i], true);
      puts_(b, "\"");
    }
    if (le) {
      if (f->nlabels) puts_(b, ",");
      puts_(b, "le=\"");
      puts_(b, le);
      puts_(b, "\"");
    }
    puts_(b, "}");
  }
  puts_(b, " ");
  puts_(b, k3_metrics_fmt_value(v, num, sizeof num));
  puts_(b, "\n");
}

static void put_family(buf_t *b, const k3_metric_t *f) {
  static const char *const tname[] = {"counter", "gauge", "histogram"};
  puts_(b, "# HELP ");
  puts_(b, f->name);
  puts_(b, " ");
  put_escaped(b, f->help, false);
  puts_(b, "\n# TYPE ");
  puts_(b, f->name);
  puts_(b, " ");
  puts_(b, tname[f->type]);
  puts_(b, "\n");
  size_t n = atomic_load_explicit(&f->nseries, memory_order_acquire);
  for (size_t i = 0; i < n; i++) {
    const k3_mseries_t *s = f->series[i];
    if (f->type != K3_METRIC_HISTOGRAM) {
      put_sample(b, f, "", s, NULL, k3_metrics_load_f64(&s->bits));
      continue;
    }
    /* Read the sum first: an observation racing with us then shows in the counts but not
     * the sum, never a sum without its count. */
    double sum = k3_metrics_load_f64(&s->bits);
    unsigned long long cum = 0;
    char le[40];
    for (size_t j = 0; j <= f->nbuckets; j++) {
      cum += atomic_load_explicit(&s->buckets[j], memory_order_relaxed);
      if (j < f->nbuckets) k3_metrics_fmt_value(f->bounds[j], le, sizeof le);
      else snprintf(le, sizeof le, "+Inf");
      put_sample(b, f, "_bucket", s, le, (double)cum);
    }
    put_sample(b, f, "_sum", s, NULL, sum);
    put_sample(b, f, "_count", s, NULL, (double)cum);
  }
}

int k3_metrics_render(k3_metrics_t *m, char **out, size_t *len) {
  buf_t b = {0};
  put(&b, "", 0); /* an empty registry still yields a valid empty string */
  pthread_mutex_lock(&m->mu);
  for (size_t i = 0; i < m->nfams; i++) put_family(&b, m->fams[i]);
  pthread_mutex_unlock(&m->mu);
  if (b.oom) {
    free(b.p);
    return K3_ENOMEM;
  }
  *out = b.p;
  *len = b.len;
  return 0;
}
