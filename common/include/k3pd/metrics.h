/* k3_metrics: a small Prometheus client (counters, gauges, histograms with fixed label sets)
 * and an HTTP endpoint (/metrics, /healthz, /readyz) on libmicrohttpd.
 *
 * Model. A registry (k3_metrics_t) holds metric families (k3_metric_t) in registration order.
 * A family has a name, help text, type and 0..K3_METRIC_MAX_LABELS label names; each distinct
 * tuple of label values is a series (k3_mseries_t). Label cardinality is meant to be small and
 * fixed (status, role, region kind, reason): a family holds at most K3_METRIC_MAX_SERIES series
 * and refuses more with K3_ECAPACITY rather than growing without bound. An unlabelled family
 * has exactly one series, created at registration.
 *
 * Threads. Registration happens at start-up (it takes a mutex). Updates on a series are
 * lock-free atomics and may come from any thread (the serving loops); rendering (the HTTP
 * thread) reads the same atomics. Series are never freed before the registry, so a series
 * pointer obtained once stays valid until k3_metrics_free(). Looking up a series by label
 * values (k3_metric_series) is lock-free for existing series and takes the registry mutex
 * only to append a new one; hot paths should look up once and keep the pointer.
 *
 * Values are doubles. Counter updates with a negative or NaN delta are ignored (a counter
 * never goes down). A histogram keeps one atomic count per bucket plus sum; when rendered,
 * bucket counts are made cumulative and _count is the +Inf bucket, so the exposition is
 * always self-consistent even while observations race with the scrape.
 *
 * Exposition is text format 0.0.4: "# HELP" (escaping \ and newline), "# TYPE", one line per
 * series; label values escape \, " and newline; histograms emit _bucket{le="..."} for every
 * bound then le="+Inf", then _sum and _count. Counter names carry their "_total" suffix in
 * the TYPE line too (as the Go and Python clients write them).
 *
 * Not here: summaries, exemplars, OpenMetrics, push gateways, metric expiry. */
#ifndef K3PD_METRICS_H
#define K3PD_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#define K3_METRIC_MAX_LABELS 4
#define K3_METRIC_MAX_SERIES 80 /* http_requests_total: 5 routes x 13 codes */
#define K3_METRIC_MAX_BUCKETS 32

typedef enum {
  K3_METRIC_COUNTER = 0,
  K3_METRIC_GAUGE = 1,
  K3_METRIC_HISTOGRAM = 2,
} k3_metric_type_t;

typedef struct k3_metrics k3_metrics_t;  /* registry */
typedef struct k3_metric k3_metric_t;    /* one family (owned by the registry) */
typedef struct k3_mseries k3_mseries_t;  /* one labelled series (owned by its family) */

/* Description of a family. Every string is copied at registration (the caller keeps
 * ownership of the desc). */
typedef struct {
  const char *name; /* [a-zA-Z_:][a-zA-Z0-9_:]*; counters must end in "_total" */
  const char *help; /* one line of text; may contain any bytes but NUL */
  k3_metric_type_t type;
  const char *const *label_names; /* nlabels names, [a-zA-Z_][a-zA-Z0-9_]*, not "le", no "__" prefix */
  size_t nlabels;
  /* Histograms only: strictly increasing finite upper bounds (the +Inf bucket is implicit);
   * NULL/0 selects K3_METRIC_LATENCY_BUCKETS. At most K3_METRIC_MAX_BUCKETS. */
  const double *buckets;
  size_t nbuckets;
  /* Optional: label-value tuples created at registration so they render (as 0) before the
   * first update, which keeps rate() and absent() well-behaved. npresets tuples of nlabels
   * values each, flattened. */
  const char *const *presets;
  size_t npresets;
} k3_metric_desc_t;

/* Default histogram bounds for latencies in seconds: 1 ms .. 60 s. */
#define K3_METRIC_LATENCY_BUCKETS_N 15
extern const double K3_METRIC_LATENCY_BUCKETS[K3_METRIC_LATENCY_BUCKETS_N];

/* Creates an empty registry. Returns 0 or K3_ENOMEM. Free with k3_metrics_free(). */
int k3_metrics_init(k3_metrics_t **out);
/* Frees the registry, its families and series. Any HTTP server using it must be stopped
 * first. NULL is a no-op. */
void k3_metrics_free(k3_metrics_t *m);

/* Registers a family. Returns 0 and *out (owned by the registry), or K3_EINVAL (bad name,
 * label name, bucket list, preset arity; the message names the field and is logged at
 * debug), K3_EEXIST (name already registered), K3_ECAPACITY, K3_ENOMEM. On error the registry
 * is unchanged. */
int k3_metrics_register(k3_metrics_t *m, const k3_metric_desc_t *d, k3_metric_t **out);

/* Finds the family with this exact name, or NULL. */
k3_metric_t *k3_metrics_find(k3_metrics_t *m, const char *name);

/* Finds or creates the series with these label values (nlabels strings, in label-name
 * order; NULL for an unlabelled family). Returns 0 and *out, or K3_EINVAL (NULL value),
 * K3_ECAPACITY (family already holds K3_METRIC_MAX_SERIES series), K3_ENOMEM. */
int k3_metric_series(k3_metric_t *f, const char *const *label_values, k3_mseries_t **out);
/* The single series of an unlabelled family (NULL for a labelled one). */
k3_mseries_t *k3_metric_default(k3_metric_t *f);

k3_metric_type_t k3_metric_type(const k3_metric_t *f);
const char *k3_metric_name(const k3_metric_t *f);

/* Series updates (lock-free; safe from any thread). Each is a no-op on a series of the wrong
 * type (a programmer error caught by the tests, not worth a crash in a serving loop). */
void k3_counter_add(k3_mseries_t *s, double v); /* v >= 0; negative/NaN ignored */
void k3_counter_inc(k3_mseries_t *s);
void k3_gauge_set(k3_mseries_t *s, double v);
void k3_gauge_add(k3_mseries_t *s, double v); /* v may be negative */
void k3_histogram_observe(k3_mseries_t *s, double v); /* NaN ignored */

/* Reads back a counter/gauge value, or a histogram's sum (tests, HPA-style self checks). */
double k3_mseries_value(const k3_mseries_t *s);
/* Histogram: total count of observations; 0 for other types. */
unsigned long long k3_mseries_count(const k3_mseries_t *s);

/* Convenience for call sites that have label values at hand: look up (or create) and update.
 * Errors from the lookup are returned (the update is skipped). */
int k3_metric_inc(k3_metric_t *f, const char *const *label_values);
int k3_metric_add(k3_metric_t *f, const char *const *label_values, double v);
int k3_metric_set(k3_metric_t *f, const char *const *label_values, double v);
int k3_metric_observe(k3_metric_t *f, const char *const *label_values, double v);

/* Renders the whole registry in text format 0.0.4 into a malloc'd NUL-terminated buffer
 * (*out; caller frees) of *len bytes (excluding the NUL). Returns 0 or K3_ENOMEM. */
int k3_metrics_render(k3_metrics_t *m, char **out, size_t *len);

/* Formats a sample value the way the exposition does: shortest text that reads back to the
 * same double, "+Inf", "-Inf", "NaN". Returns buf. cap >= 32. */
char *k3_metrics_fmt_value(double v, char *buf, size_t cap);

/* ---- HTTP endpoint ---------------------------------------------------------------------
 * One libmicrohttpd daemon with its own polling thread:
 *   GET /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8"
 *   GET /healthz  200 "ok" while live, 503 "not live" after k3_metrics_http_set_live(false)
 *   GET /readyz   200 "ready" after k3_metrics_http_set_ready(true), else 503 "not ready"
 *   other paths 404; methods other than GET/HEAD 405.
 * Readiness starts false (the binary flips it once weights are loaded and it is registered),
 * liveness starts true. Slow clients are cut after 10 s; at most 64 connections. */
typedef struct k3_metrics_http k3_metrics_http_t;

/* Starts serving registry m (which must outlive the server) on bind_host:port. bind_host
 * NULL or "" or "0.0.0.0" means every IPv4 interface; otherwise a numeric IPv4 address.
 * port 0 picks an ephemeral port (see k3_metrics_http_port). Returns 0 and *out, or
 * K3_EINVAL (port outside 0..65535, unparsable host), K3_EUNAVAIL (bind/listen failed; e.g.
 * port in use), K3_ENOMEM. */
int k3_metrics_http_start(k3_metrics_t *m, const char *bind_host, int port,
                          k3_metrics_http_t **out);
/* The same over HTTPS with cert_pem/key_pem (PEM texts, which must outlive the server); with
 * ca_pem, GET /metrics also needs a client certificate that verifies against it (403
 * otherwise); /healthz and /readyz stay open. K3_ENOTSUP when libmicrohttpd lacks TLS. */
int k3_metrics_http_start_tls(k3_metrics_t *m, const char *bind_host, int port, const char *cert_pem,
                              const char *key_pem, const char *ca_pem, k3_metrics_http_t **out);
/* The bound TCP port (the real one when started with port 0). */
int k3_metrics_http_port(const k3_metrics_http_t *h);
void k3_metrics_http_set_ready(k3_metrics_http_t *h, bool ready);
void k3_metrics_http_set_live(k3_metrics_http_t *h, bool live);
bool k3_metrics_http_ready(const k3_metrics_http_t *h);
/* Stops the daemon (joins its thread; in-flight responses are finished or dropped) and frees
 * h. NULL is a no-op. */
void k3_metrics_http_stop(k3_metrics_http_t *h);

#endif
