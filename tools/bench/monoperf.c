/* k3pd-bench --mono-perf FILE: the monolithic twin of a cluster run's latencies, read from what
 * `k3pd-generate --perf [--perf-batch B]` printed on the same GPU (docs/perf-cluster.md): its
 * prefill of the prompt (second pass, no model load, no first-use costs) is the twin of TTFT,
 * its decode step at batch 1 / batch B the twin of the inter-token latency at concurrency 1 / B.
 * On a GPU the monolithic replay of every request (--compare-monolithic) would pay a model load
 * per process; this compares against one measured run instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

int bn_monoperf_load(const char *path, bn_monoperf_t *m, char *err, size_t errlen) {
  char *text = NULL;
  size_t len = 0;
  memset(m, 0, sizeof *m);
  if (k3_read_file(path, &text, &len)) {
    snprintf(err, errlen, "--mono-perf: cannot read %s", path);
    return K3_EIO;
  }
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    const char *p;
    long long n = 0;
    int b = 0;
    double x = 0;
    if ((p = strstr(line, "perf: prefill ")) && sscanf(p, "perf: prefill %lld tokens (second pass) %lf s", &n, &x) == 2) {
      m->prefill_tokens = n;
      m->prefill_ms = x * 1e3;
    } else if ((p = strstr(line, "perf: decode batch 1 ")) && sscanf(p, "perf: decode batch 1 %lf ms/step", &x) == 1) {
      m->step_ms[0] = x;
    } else if ((p = strstr(line, "perf: decode batch ")) &&
               sscanf(p, "perf: decode batch %d (prompts of %lld tokens) %lf ms/step", &b, &n, &x) == 3 && b > 1) {
      m->batch = b;
      m->step_ms[1] = x;
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  if (!m->prefill_ms && !m->step_ms[0] && !m->step_ms[1]) {
    snprintf(err, errlen, "--mono-perf: %s holds no k3pd-generate --perf figures", path);
    return K3_EINVAL;
  }
  return 0;
}

double bn_monoperf_step(const bn_monoperf_t *m, int concurrency, int *batch) {
  if (concurrency == 1 && m->step_ms[0] > 0) {
    *batch = 1;
    return m->step_ms[0];
  }
  if (concurrency > 1 && concurrency == m->batch && m->step_ms[1] > 0) {
    *batch = m->batch;
    return m->step_ms[1];
  }
  *batch = 0;
  return 0;
}
