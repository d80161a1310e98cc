/* Tests for k3_metrics: exact text exposition per type, escaping, histogram bucket edges,
 * validation, concurrent updates, the HTTP endpoint on an ephemeral port (fetched over a
 * raw socket), readiness/liveness flips, and the k3pd catalogue (registration per role and
 * agreement with docs/metrics.md). */
#include <arpa/inet.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/metrics.h"
#include "k3pd/metrics_k3pd.h"
#include "k3pd/util.h"

static char *render(k3_metrics_t *m) {
  char *t;
  size_t n;
  ck_assert_int_eq(k3_metrics_render(m, &t, &n), 0);
  ck_assert_uint_eq(n, strlen(t));
  return t;
}

START_TEST(test_counter_exposition) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  k3_metric_t *c;
  k3_metric_desc_t d = {.name = "k3pd_test_requests_total", .help = "Requests.",
                        .type = K3_METRIC_COUNTER};
  ck_assert_int_eq(k3_metrics_register(m, &d, &c), 0);
  k3_counter_inc(k3_metric_default(c));
  k3_counter_add(k3_metric_default(c), 2.5);
  k3_counter_add(k3_metric_default(c), -10); /* ignored: counters never go down */
  k3_counter_add(k3_metric_default(c), NAN); /* ignored */
  char *t = render(m);
  ck_assert_str_eq(t, "# HELP k3pd_test_requests_total Requests.\n"
                      "# TYPE k3pd_test_requests_total counter\n"
                      "k3pd_test_requests_total 3.5\n");
  free(t);
  ck_assert_double_eq(k3_mseries_value(k3_metric_default(c)), 3.5);
  k3_metrics_free(m);
}
END_TEST

START_TEST(test_gauge_labels_escaping) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  static const char *const labels[] = {"role", "path"};
  static const char *const presets[] = {"prefill", "a", "decode", "b"};
  k3_metric_desc_t d = {.name = "k3pd_test_gauge", .help = "Back\\slash and\nnewline \"kept\".",
                        .type = K3_METRIC_GAUGE, .label_names = labels, .nlabels = 2,
                        .presets = presets, .npresets = 2};
  k3_metric_t *g;
  ck_assert_int_eq(k3_metrics_register(m, &d, &g), 0);
  ck_assert_ptr_null(k3_metric_default(g));
  const char *lv[] = {"we\"ird\\", "line\nbreak"};
  ck_assert_int_eq(k3_metric_set(g, lv, -2), 0);
  const char *dec[] = {"decode", "b"};
  ck_assert_int_eq(k3_metric_add(g, dec, 0.25), 0);
  ck_assert_int_eq(k3_metric_add(g, dec, 0.5), 0);
  char *t = render(m);
  ck_assert_str_eq(t, "# HELP k3pd_test_gauge Back\\\\slash and\\nnewline \"kept\".\n"
                      "# TYPE k3pd_test_gauge gauge\n"
                      "k3pd_test_gauge{role=\"prefill\",path=\"a\"} 0\n"
                      "k3pd_test_gauge{role=\"decode\",path=\"b\"} 0.75\n"
                      "k3pd_test_gauge{role=\"we\\\"ird\\\\\",path=\"line\\nbreak\"} -2\n");
  free(t);
  /* NULL label value is refused, and a lookup of an existing tuple returns the same series. */
  const char *bad[] = {"x", NULL};
  k3_mseries_t *s1, *s2;
  ck_assert_int_eq(k3_metric_series(g, bad, &s1), K3_EINVAL);
  ck_assert_int_eq(k3_metric_series(g, dec, &s1), 0);
  ck_assert_int_eq(k3_metric_series(g, dec, &s2), 0);
  ck_assert_ptr_eq(s1, s2);
  k3_metrics_free(m);
}
END_TEST

START_TEST(test_histogram_exposition_and_edges) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  static const double b[] = {0.25, 0.5, 1};
  static const char *const labels[] = {"region"};
  k3_metric_desc_t d = {.name = "k3pd_test_seconds", .help = "Latency.",
                        .type = K3_METRIC_HISTOGRAM, .buckets = b, .nbuckets = 3,
                        .label_names = labels, .nlabels = 1};
  k3_metric_t *h;
  ck_assert_int_eq(k3_metrics_register(m, &d, &h), 0);
  const char *lv[] = {"kda_state"};
  /* 0.25 and 1 sit exactly on bounds: "le" is inclusive. 2 goes to +Inf only; NaN is
   * dropped. Values are exact binary fractions so the sum text is exact. */
  double obs[] = {0.125, 0.25, 0.375, 1, 2, NAN};
  for (size_t i = 0; i < 6; i++) ck_assert_int_eq(k3_metric_observe(h, lv, obs[i]), 0);
  char *t = render(m);
  ck_assert_str_eq(t, "# HELP k3pd_test_seconds Latency.\n"
                      "# TYPE k3pd_test_seconds histogram\n"
                      "k3pd_test_seconds_bucket{region=\"kda_state\",le=\"0.25\"} 2\n"
                      "k3pd_test_seconds_bucket{region=\"kda_state\",le=\"0.5\"} 3\n"
                      "k3pd_test_seconds_bucket{region=\"kda_state\",le=\"1\"} 4\n"
                      "k3pd_test_seconds_bucket{region=\"kda_state\",le=\"+Inf\"} 5\n"
                      "k3pd_test_seconds_sum{region=\"kda_state\"} 3.75\n"
                      "k3pd_test_seconds_count{region=\"kda_state\"} 5\n");
  free(t);
  k3_mseries_t *s;
  ck_assert_int_eq(k3_metric_series(h, lv, &s), 0);
  ck_assert_uint_eq(k3_mseries_count(s), 5);
  k3_metrics_free(m);
}
END_TEST

START_TEST(test_histogram_default_buckets_unlabelled) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  k3_metric_desc_t d = {.name = "k3pd_test_latency_seconds", .help = "L.",
                        .type = K3_METRIC_HISTOGRAM};
  k3_metric_t *h;
  ck_assert_int_eq(k3_metrics_register(m, &d, &h), 0);
  k3_histogram_observe(k3_metric_default(h), 0.001);  /* on the first bound */
  k3_histogram_observe(k3_metric_default(h), 60);     /* on the last bound */
  k3_histogram_observe(k3_metric_default(h), -1);     /* below every bound */
  char *t = render(m);
  ck_assert_ptr_nonnull(strstr(t, "k3pd_test_latency_seconds_bucket{le=\"0.001\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(t, "k3pd_test_latency_seconds_bucket{le=\"0.0025\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(t, "k3pd_test_latency_seconds_bucket{le=\"30\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(t, "k3pd_test_latency_seconds_bucket{le=\"60\"} 3\n"));
  ck_assert_ptr_nonnull(strstr(t, "k3pd_test_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
  ck_assert_double_eq_tol(k3_mseries_value(k3_metric_default(h)), 59.001, 1e-9);
  ck_assert_ptr_nonnull(strstr(t, "k3pd_test_latency_seconds_count 3\n"));
  /* 15 bounds + Inf bucket lines. */
  int lines = 0;
  for (char *p = t; (p = strstr(p, "_bucket{")); p++) lines++;
  ck_assert_int_eq(lines, K3_METRIC_LATENCY_BUCKETS_N + 1);
  free(t);
  k3_metrics_free(m);
}
END_TEST

START_TEST(test_fmt_value) {
  char b[40];
  ck_assert_str_eq(k3_metrics_fmt_value(0.1, b, sizeof b), "0.1");
  ck_assert_str_eq(k3_metrics_fmt_value(42, b, sizeof b), "42");
  ck_assert_str_eq(k3_metrics_fmt_value(1e-05, b, sizeof b), "1e-05");
  ck_assert_str_eq(k3_metrics_fmt_value(123456789012.0, b, sizeof b), "123456789012");
  ck_assert_str_eq(k3_metrics_fmt_value(75000, b, sizeof b), "75000");
  ck_assert_str_eq(k3_metrics_fmt_value(-3, b, sizeof b), "-3");
  ck_assert_str_eq(k3_metrics_fmt_value(1e20, b, sizeof b), "1e+20");
  ck_assert_str_eq(k3_metrics_fmt_value(2.5e-7, b, sizeof b), "2.5e-07");
  ck_assert_str_eq(k3_metrics_fmt_value(INFINITY, b, sizeof b), "+Inf");
  ck_assert_str_eq(k3_metrics_fmt_value(-INFINITY, b, sizeof b), "-Inf");
  ck_assert_str_eq(k3_metrics_fmt_value(NAN, b, sizeof b), "NaN");
  double third = 1.0 / 3.0;
  ck_assert(strtod(k3_metrics_fmt_value(third, b, sizeof b), NULL) == third);
}
END_TEST

START_TEST(test_validation) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  k3_metric_t *f;
  static const char *const le[] = {"le"};
  static const char *const dup[] = {"a", "a"};
  static const char *const dunder[] = {"__x"};
  static const double dec[] = {1, 0.5};
  static const double inf[] = {1, INFINITY};
  k3_metric_desc_t bad[] = {
      {.name = "1bad", .help = "h", .type = K3_METRIC_GAUGE},
      {.name = "has-dash", .help = "h", .type = K3_METRIC_GAUGE},
      {.name = "k3pd_ok", .help = "", .type = K3_METRIC_GAUGE},
      {.name = "k3pd_count", .help = "h", .type = K3_METRIC_COUNTER}, /* no _total */
      {.name = "k3pd_h", .help = "h", .type = K3_METRIC_HISTOGRAM, .label_names = le, .nlabels = 1},
      {.name = "k3pd_g", .help = "h", .type = K3_METRIC_GAUGE, .label_names = dup, .nlabels = 2},
      {.name = "k3pd_g", .help = "h", .type = K3_METRIC_GAUGE, .label_names = dunder, .nlabels = 1},
      {.name = "k3pd_h", .help = "h", .type = K3_METRIC_HISTOGRAM, .buckets = dec, .nbuckets = 2},
      {.name = "k3pd_h", .help = "h", .type = K3_METRIC_HISTOGRAM, .buckets = inf, .nbuckets = 2},
      {.name = "k3pd_g", .help = "h", .type = K3_METRIC_GAUGE, .buckets = dec, .nbuckets = 2},
      {.name = "k3pd_g", .help = "h", .type = (k3_metric_type_t)7},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(k3_metrics_register(m, &bad[i], &f) == K3_EINVAL, "case %zu accepted", i);
  char *t = render(m);
  ck_assert_str_eq(t, ""); /* nothing was registered */
  free(t);
  k3_metric_desc_t ok = {.name = "k3pd_dup", .help = "h", .type = K3_METRIC_GAUGE};
  ck_assert_int_eq(k3_metrics_register(m, &ok, &f), 0);
  ck_assert_int_eq(k3_metrics_register(m, &ok, &f), K3_EEXIST);
  ck_assert_ptr_eq(k3_metrics_find(m, "k3pd_dup"), f);
  ck_assert_ptr_null(k3_metrics_find(m, "k3pd_none"));
  /* Wrong-type updates are no-ops. */
  k3_counter_inc(k3_metric_default(f));
  k3_histogram_observe(k3_metric_default(f), 3);
  ck_assert_double_eq(k3_mseries_value(k3_metric_default(f)), 0);
  k3_metrics_free(m);
}
END_TEST

START_TEST(test_series_capacity) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  static const char *const labels[] = {"id"};
  k3_metric_desc_t d = {.name = "k3pd_many_total", .help = "h", .type = K3_METRIC_COUNTER,
                        .label_names = labels, .nlabels = 1};
  k3_metric_t *f;
  ck_assert_int_eq(k3_metrics_register(m, &d, &f), 0);
  char v[16];
  const char *lv[] = {v};
  for (int i = 0; i < K3_METRIC_MAX_SERIES; i++) {
    snprintf(v, sizeof v, "s%d", i);
    ck_assert_int_eq(k3_metric_inc(f, lv), 0);
  }
  snprintf(v, sizeof v, "one_more");
  ck_assert_int_eq(k3_metric_inc(f, lv), K3_ECAPACITY);
  snprintf(v, sizeof v, "s3"); /* existing series still update */
  ck_assert_int_eq(k3_metric_inc(f, lv), 0);
  k3_mseries_t *s;
  ck_assert_int_eq(k3_metric_series(f, lv, &s), 0);
  ck_assert_double_eq(k3_mseries_value(s), 2);
  k3_metrics_free(m);
}
END_TEST

#define THREADS 4
#define ITERS 50000
typedef struct {
  k3_metric_t *c, *g, *h;
  int id;
} worker_arg_t;

static void *hammer(void *p) {
  worker_arg_t *a = p;
  const char *lv[] = {a->id % 2 ? "odd" : "even"};
  k3_mseries_t *c = k3_metric_default(a->c), *g = k3_metric_default(a->g);
  for (int i = 0; i < ITERS; i++) {
    k3_counter_inc(c);
    k3_gauge_add(g, 1);
    k3_gauge_add(g, -0.5);
    ck_assert_int_eq(k3_metric_observe(a->h, lv, (double)(i % 4) * 0.25), 0);
  }
  return NULL;
}

START_TEST(test_concurrent_updates) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  static const char *const labels[] = {"parity"};
  static const double b[] = {0.25, 0.5};
  k3_metric_desc_t dc = {.name = "k3pd_c_total", .help = "h", .type = K3_METRIC_COUNTER};
  k3_metric_desc_t dg = {.name = "k3pd_g", .help = "h", .type = K3_METRIC_GAUGE};
  k3_metric_desc_t dh = {.name = "k3pd_h_seconds", .help = "h", .type = K3_METRIC_HISTOGRAM,
                         .label_names = labels, .nlabels = 1, .buckets = b, .nbuckets = 2};
  worker_arg_t args[THREADS];
  k3_metric_t *c, *g, *h;
  ck_assert_int_eq(k3_metrics_register(m, &dc, &c), 0);
  ck_assert_int_eq(k3_metrics_register(m, &dg, &g), 0);
  ck_assert_int_eq(k3_metrics_register(m, &dh, &h), 0);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (worker_arg_t){c, g, h, i};
    ck_assert_int_eq(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
  }
  /* Scrape concurrently: every rendering must be self-consistent (+Inf bucket == _count). */
  for (int k = 0; k < 20; k++) {
    char *t = render(m);
    ck_assert_ptr_nonnull(strstr(t, "# TYPE k3pd_h_seconds histogram\n"));
    free(t);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  ck_assert_double_eq(k3_mseries_value(k3_metric_default(c)), THREADS * ITERS);
  ck_assert_double_eq(k3_mseries_value(k3_metric_default(g)), THREADS * ITERS * 0.5);
  const char *even[] = {"even"};
  k3_mseries_t *s;
  ck_assert_int_eq(k3_metric_series(h, even, &s), 0);
  ck_assert_uint_eq(k3_mseries_count(s), (THREADS / 2) * ITERS);
  /* Per thread, values 0,0.25,0.5,0.75 repeat: sum = ITERS/4 * 1.5 (exact in binary). */
  ck_assert_double_eq(k3_mseries_value(s), (THREADS / 2) * (ITERS / 4) * 1.5);
  char *t = render(m);
  char want[256];
  snprintf(want, sizeof want, "k3pd_h_seconds_bucket{parity=\"odd\",le=\"0.25\"} %d\n",
           (THREADS / 2) * ITERS / 2);
  ck_assert_msg(strstr(t, want), "missing %s in\n%s", want, t);
  free(t);
  k3_metrics_free(m);
}
END_TEST

/* ---- HTTP over a raw socket ---- */
typedef struct {
  int status;
  char head[1024];
  char *body; /* malloc'd */
} http_resp_t;

static int http_get(int port, const char *method, const char *path, http_resp_t *r) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  char req[256];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: localhost\r\n\r\n", method, path);
  ck_assert_int_eq(write(fd, req, (size_t)n), n);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t k;
  while ((k = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)k;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  close(fd);
  buf[len] = '\0';
  ck_assert_msg(k == 0, "read error or timeout");
  char *sep = strstr(buf, "\r\n\r\n");
  ck_assert_ptr_nonnull(sep);
  *sep = '\0';
  snprintf(r->head, sizeof r->head, "%s", buf);
  ck_assert_int_eq(sscanf(buf, "HTTP/1.%*d %d", &r->status), 1);
  r->body = strdup(sep + 4);
  free(buf);
  return 0;
}

START_TEST(test_http_endpoints) {
  k3_metrics_t *m;
  ck_assert_int_eq(k3_metrics_init(&m), 0);
  k3_router_metrics_t rm;
  ck_assert_int_eq(k3_router_metrics_register(m, "9.9.9", &rm), 0);
  k3_counter_inc(k3_metric_default(rm.requests_started_total));
  k3_metrics_http_t *h;
  ck_assert_int_eq(k3_metrics_http_start(m, "127.0.0.1", 0, &h), 0);
  int port = k3_metrics_http_port(h);
  ck_assert_int_gt(port, 0);

  http_resp_t r;
  ck_assert_int_eq(http_get(port, "GET", "/metrics", &r), 0);
  ck_assert_int_eq(r.status, 200);
  ck_assert_msg(strcasestr(r.head, "Content-Type: text/plain; version=0.0.4; charset=utf-8"),
                "%s", r.head);
  char *want = render(m);
  ck_assert_str_eq(r.body, want);
  ck_assert_ptr_nonnull(strstr(r.body, "k3pd_router_requests_started_total 1\n"));
  ck_assert_ptr_nonnull(strstr(r.body, "k3pd_build_info{role=\"router\",version=\"9.9.9\"} 1\n"));
  free(want);
  free(r.body);

  /* Readiness flips; liveness independent. */
  ck_assert(!k3_metrics_http_ready(h));
  ck_assert_int_eq(http_get(port, "GET", "/readyz", &r), 0);
  ck_assert_int_eq(r.status, 503);
  ck_assert_str_eq(r.body, "not ready\n");
  free(r.body);
  k3_metrics_http_set_ready(h, true);
  ck_assert(k3_metrics_http_ready(h));
  ck_assert_int_eq(http_get(port, "GET", "/readyz", &r), 0);
  ck_assert_int_eq(r.status, 200);
  ck_assert_str_eq(r.body, "ready\n");
  free(r.body);
  k3_metrics_http_set_ready(h, false); /* drain: not ready again */
  ck_assert_int_eq(http_get(port, "GET", "/readyz", &r), 0);
  ck_assert_int_eq(r.status, 503);
  free(r.body);
  ck_assert_int_eq(http_get(port, "GET", "/healthz", &r), 0);
  ck_assert_int_eq(r.status, 200);
  ck_assert_str_eq(r.body, "ok\n");
  free(r.body);
  k3_metrics_http_set_live(h, false);
  ck_assert_int_eq(http_get(port, "GET", "/healthz", &r), 0);
  ck_assert_int_eq(r.status, 503);
  free(r.body);
  ck_assert_int_eq(http_get(port, "GET", "/nope", &r), 0);
  ck_assert_int_eq(r.status, 404);
  free(r.body);
  ck_assert_int_eq(http_get(port, "POST", "/metrics", &r), 0);
  ck_assert_int_eq(r.status, 405);
  free(r.body);

  /* The same port cannot be bound twice; bad ports and hosts are refused. */
  k3_metrics_http_t *h2;
  ck_assert_int_eq(k3_metrics_http_start(m, "127.0.0.1", port, &h2), K3_EUNAVAIL);
  ck_assert_int_eq(k3_metrics_http_start(m, NULL, 70000, &h2), K3_EINVAL);
  ck_assert_int_eq(k3_metrics_http_start(m, NULL, -1, &h2), K3_EINVAL);
  ck_assert_int_eq(k3_metrics_http_start(m, "localhost:9", 0, &h2), K3_EINVAL);

  k3_metrics_http_stop(h);
  ck_assert_int_ne(http_get(port, "GET", "/metrics", &r), 0); /* nobody listens any more */
  k3_metrics_free(m);
}
END_TEST

/* ---- k3pd catalogue ---- */
static void assert_role_names_rendered(const char *text, const char *role) {
  size_t n = k3pd_metrics_catalog(0, &(const char *){0}, &(k3_metric_type_t){0},
                                  &(const char *){0}, &(const char *){0});
  for (size_t i = 0; i < n; i++) {
    const char *name, *help, *r;
    k3_metric_type_t t;
    k3pd_metrics_catalog(i, &name, &t, &help, &r);
    char line[200];
    static const char *const tn[] = {"counter", "gauge", "histogram"};
    snprintf(line, sizeof line, "# TYPE %s %s\n", name, tn[t]);
    bool mine = strcmp(r, role) == 0 || strcmp(r, "all") == 0;
    ck_assert_msg((strstr(text, line) != NULL) == mine, "%s: '%s' presence wrong", role, name);
    /* Conventions: k3pd_ prefix, role in the name, counters end in _total. */
    ck_assert(strncmp(name, "k3pd_", 5) == 0);
    if (t == K3_METRIC_COUNTER) ck_assert(strstr(name, "_total"));
  }
}

START_TEST(test_roles_register) {
  k3_metrics_t *mr, *mp, *md;
  ck_assert_int_eq(k3_metrics_init(&mr), 0);
  ck_assert_int_eq(k3_metrics_init(&mp), 0);
  ck_assert_int_eq(k3_metrics_init(&md), 0);
  k3_router_metrics_t r;
  k3_prefill_metrics_t p;
  k3_decode_metrics_t d;
  ck_assert_int_eq(k3_router_metrics_register(mr, "1.0", &r), 0);
  ck_assert_int_eq(k3_prefill_metrics_register(mp, "1.0", &p), 0);
  ck_assert_int_eq(k3_decode_metrics_register(md, "1.0", &d), 0);
  /* Every struct field was filled. */
  k3_metric_t **fr = (k3_metric_t **)&r, **fp = (k3_metric_t **)&p, **fd = (k3_metric_t **)&d;
  for (size_t i = 0; i < sizeof r / sizeof *fr; i++) ck_assert_ptr_nonnull(fr[i]);
  for (size_t i = 0; i < sizeof p / sizeof *fp; i++) ck_assert_ptr_nonnull(fp[i]);
  for (size_t i = 0; i < sizeof d / sizeof *fd; i++) ck_assert_ptr_nonnull(fd[i]);
  /* A second registration of the same role collides. */
  k3_router_metrics_t r2;
  ck_assert_int_eq(k3_router_metrics_register(mr, "1.0", &r2), K3_EEXIST);

  k3_decode_metrics_set_pools(&d, 10, 30, 60, 2, 1, 1); /* pages 40 %, slots 75 % */
  ck_assert_double_eq_tol(k3_mseries_value(k3_metric_default(d.kv_utilization_ratio)), 0.75,
                          1e-12);
  k3_decode_metrics_set_pools(&d, 0, 0, 0, 0, 0, 0);
  ck_assert_double_eq(k3_mseries_value(k3_metric_default(d.kv_utilization_ratio)), 0);
  k3_decode_metrics_set_pools(&d, 5, 90, 5, 0, 4, 4);
  ck_assert_int_eq(k3_prefill_metrics_set_path(&p, K3PD_PATH_CUDA_IPC), 0);
  ck_assert_int_eq(k3_prefill_metrics_set_path(&p, "carrier_pigeon"), K3_EINVAL);
  const char *reason[] = {K3PD_REJECT_DIGEST_MISMATCH};
  ck_assert_int_eq(k3_metric_inc(d.rejected_dones_total, reason), 0);

  char *tr = render(mr), *tp = render(mp), *td = render(md);
  assert_role_names_rendered(tr, "router");
  assert_role_names_rendered(tp, "prefill");
  assert_role_names_rendered(td, "decode");
  ck_assert_ptr_nonnull(strstr(tr, "k3pd_router_requests_total{status=\"unavailable\"} 0\n"));
  ck_assert_ptr_nonnull(strstr(tr, "k3pd_router_registered_workers{role=\"decode\"} 0\n"));
  ck_assert_ptr_nonnull(strstr(tp, "k3pd_prefill_transfer_path{path=\"host\"} 0\n"));
  ck_assert_ptr_nonnull(strstr(tp, "k3pd_prefill_transfer_path{path=\"cuda_ipc\"} 1\n"));
  ck_assert_ptr_nonnull(
      strstr(tp, "k3pd_prefill_handoff_seconds_bucket{region=\"mla_pages\",le=\"+Inf\"} 0\n"));
  ck_assert_ptr_nonnull(strstr(td, "k3pd_decode_kv_pages{state=\"used\"} 90\n"));
  ck_assert_ptr_nonnull(strstr(td, "k3pd_decode_kda_slots{state=\"free\"} 4\n"));
  ck_assert_ptr_nonnull(strstr(td, "k3pd_decode_kv_utilization_ratio 0.95\n"));
  ck_assert_ptr_nonnull(
      strstr(td, "k3pd_decode_rejected_dones_total{reason=\"digest_mismatch\"} 1\n"));
  ck_assert_ptr_nonnull(
      strstr(td, "k3pd_decode_rejected_dones_total{reason=\"stale_epoch\"} 0\n"));
  free(tr);
  free(tp);
  free(td);
  k3_metrics_free(mr);
  k3_metrics_free(mp);
  k3_metrics_free(md);
}
END_TEST

/* docs/metrics.md must list every metric as `name` in a table row, and name no k3pd_ metric
 * the catalogue lacks (so the reference page cannot drift from the code). */
START_TEST(test_docs_list_every_metric) {
  const char *src = getenv("K3PD_SOURCE_DIR");
  ck_assert_msg(src != NULL, "K3PD_SOURCE_DIR not set (run through ctest)");
  char path[1024];
  snprintf(path, sizeof path, "%s/docs/metrics.md", src);
  char *doc;
  size_t len;
  ck_assert_msg(k3_read_file(path, &doc, &len) == 0, "cannot read %s", path);
  const char *name, *help, *role;
  k3_metric_type_t t;
  size_t n = k3pd_metrics_catalog(0, &name, &t, &help, &role);
  for (size_t i = 0; i < n; i++) {
    k3pd_metrics_catalog(i, &name, &t, &help, &role);
    char cell[200];
    snprintf(cell, sizeof cell, "| `%s` |", name);
    ck_assert_msg(strstr(doc, cell), "docs/metrics.md lacks a row for %s", name);
  }
  /* Reverse direction: every "| `k3pd_...` |" row names a catalogue metric. */
  for (char *p = doc; (p = strstr(p, "| `k3pd_"));) {
    p += 3;
    char *end = strchr(p, '`');
    ck_assert_ptr_nonnull(end);
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
      k3pd_metrics_catalog(i, &name, &t, &help, &role);
      found = strlen(name) == (size_t)(end - p) && strncmp(name, p, (size_t)(end - p)) == 0;
    }
    ck_assert_msg(found, "docs/metrics.md names unknown metric %.*s", (int)(end - p), p);
  }
  free(doc);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_counter_exposition);
  tcase_add_test(tc, test_gauge_labels_escaping);
  tcase_add_test(tc, test_histogram_exposition_and_edges);
  tcase_add_test(tc, test_histogram_default_buckets_unlabelled);
  tcase_add_test(tc, test_fmt_value);
  tcase_add_test(tc, test_validation);
  tcase_add_test(tc, test_series_capacity);
  tcase_add_test(tc, test_concurrent_updates);
  tcase_add_test(tc, test_http_endpoints);
  tcase_add_test(tc, test_roles_register);
  tcase_add_test(tc, test_docs_list_every_metric);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
