/* Line-oriented logging to stderr. A line is formatted into a local buffer and written with one
 * write(2), so concurrent threads never interleave within a line. The level is read from
 * K3PD_LOG_LEVEL once, lazily; k3_log_set_level() overrides it. */
#include "k3pd/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "k3pd/err.h"

static atomic_int g_level = -1;
static const char *g_component = "k3pd";

int k3_log_parse_level(const char *s, k3_log_level_t *out) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, names[i]) == 0) {
      *out = (k3_log_level_t)i;
      return 0;
    }
  }
  return K3_EINVAL;
}

k3_log_level_t k3_log_get_level(void) {
  int l = atomic_load_explicit(&g_level, memory_order_relaxed);
  if (l >= 0) return (k3_log_level_t)l;
  k3_log_level_t lv = K3_LOG_INFO;
  const char *env = getenv("K3PD_LOG_LEVEL");
  if (env && k3_log_parse_level(env, &lv) != 0) lv = K3_LOG_INFO;
  atomic_store(&g_level, (int)lv);
  return lv;
}

void k3_log_set_level(k3_log_level_t level) { atomic_store(&g_level, (int)level); }
void k3_log_set_component(const char *component) { g_component = component ? component : "k3pd"; }

void k3_log_vwrite(k3_log_level_t level, const char *file, int line, const char *fmt, va_list ap) {
  static const char lv[] = "EWID";
  char buf[2048];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s: ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                   lv[level & 3], g_component);
  if (n < 0) return;
  if ((size_t)n < sizeof buf) {
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
  if (level == K3_LOG_DEBUG && file) {
    int m = snprintf(buf + n, sizeof buf - (size_t)n, " (%s:%d)", file, line);
    if (m > 0) n += m;
    if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
  }
  buf[n++] = '\n';
  ssize_t w = write(2, buf, (size_t)n);
  (void)w;
}

void k3_log_write(k3_log_level_t level, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  k3_log_vwrite(level, file, line, fmt, ap);
  va_end(ap);
}

void k3_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "k3pd: assertion failed: %s (%s:%d)\n", expr, file, line);
  abort();
}
