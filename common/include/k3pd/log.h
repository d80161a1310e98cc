/* Logging: one line per event to stderr, "ts level component: message".
 *
 * Level comes from K3PD_LOG_LEVEL (error|warn|info|debug, default info) at first use or from
 * k3_log_set_level(). Each line is written with a single write(2) so lines from different
 * threads never interleave. Log an error once, at the layer that decides what to do (STYLE.md). */
#ifndef K3PD_LOG_H
#define K3PD_LOG_H

#include <stdarg.h>

typedef enum { K3_LOG_ERROR = 0, K3_LOG_WARN = 1, K3_LOG_INFO = 2, K3_LOG_DEBUG = 3 } k3_log_level_t;

void k3_log_set_level(k3_log_level_t level);
k3_log_level_t k3_log_get_level(void);
/* Parses "error|warn|info|debug"; returns 0 or K3_EINVAL. */
int k3_log_parse_level(const char *s, k3_log_level_t *out);
/* Component name printed on every line (e.g. "router"); pointer must stay valid. */
void k3_log_set_component(const char *component);

void k3_log_write(k3_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void k3_log_vwrite(k3_log_level_t level, const char *file, int line, const char *fmt, va_list ap);

#define K3_LOG(level, ...)                                                          \
  do {                                                                              \
    if ((level) <= k3_log_get_level()) k3_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define K3_ERROR(...) K3_LOG(K3_LOG_ERROR, __VA_ARGS__)
#define K3_WARN(...) K3_LOG(K3_LOG_WARN, __VA_ARGS__)
#define K3_INFO(...) K3_LOG(K3_LOG_INFO, __VA_ARGS__)
#define K3_DEBUG(...) K3_LOG(K3_LOG_DEBUG, __VA_ARGS__)

/* Programmer errors only (never bad input): prints and aborts. */
#define K3_ASSERT(cond)                                                             \
  do {                                                                              \
    if (!(cond)) k3_assert_fail(#cond, __FILE__, __LINE__);                         \
  } while (0)
void k3_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
