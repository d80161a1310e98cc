/* The HTTP front's JSON writer (contract in jsonw.h). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonw.h"
#include "k3pd/detok.h"
#include "k3pd/err.h"

void rt_jw_rawn(rt_jw_t *w, const char *s, size_t n) {
  if (!w->err && n) w->err = k3_tok_str_append(&w->s, s, n);
}

void rt_jw_raw(rt_jw_t *w, const char *lit) { rt_jw_rawn(w, lit, strlen(lit)); }

static void escape(rt_jw_t *w, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[6];
    size_t el = 2;
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    e[0] = '\\';
    switch (c) {
      case '"': e[1] = '"'; break;
      case '\\': e[1] = '\\'; break;
      case '\n': e[1] = 'n'; break;
      case '\r': e[1] = 'r'; break;
      case '\t': e[1] = 't'; break;
      case '\b': e[1] = 'b'; break;
      case '\f': e[1] = 'f'; break;
      default:
        memcpy(e, "\\u00", 4);
        e[4] = hex[c >> 4];
        e[5] = hex[c & 15];
        el = 6;
    }
    rt_jw_rawn(w, s + run, i - run);
    rt_jw_rawn(w, e, el);
    run = i + 1;
  }
  rt_jw_rawn(w, s + run, n - run);
}

void rt_jw_str_body(rt_jw_t *w, const char *s, size_t n) {
  if (k3_tok_utf8_valid_prefix(s, n) == n) {
    escape(w, s, n);
    return;
  }
  k3_tok_str_t t = {0};
  if (k3_tok_utf8_sanitize(s, n, &t)) {
    w->err = K3_ENOMEM;
  } else {
    escape(w, t.data ? t.data : "", t.len);
  }
  free(t.data);
}

void rt_jw_str(rt_jw_t *w, const char *s, size_t n) {
  rt_jw_rawn(w, "\"", 1);
  rt_jw_str_body(w, s, n);
  rt_jw_rawn(w, "\"", 1);
}

void rt_jw_strz(rt_jw_t *w, const char *s) {
  if (s) rt_jw_str(w, s, strlen(s));
  else rt_jw_raw(w, "null");
}

void rt_jw_i64(rt_jw_t *w, int64_t v) {
  char b[24];
  int n = snprintf(b, sizeof b, "%" PRId64, v);
  rt_jw_rawn(w, b, (size_t)n);
}

void rt_jw_f64(rt_jw_t *w, double v) {
  if (isnan(v)) {
    rt_jw_raw(w, "null");
    return;
  }
  if (isinf(v)) {
    rt_jw_raw(w, v < 0 ? "-9999.0" : "9999.0");
    return;
  }
  char b[32];
  int n = 0;
  for (int prec = 1; prec <= 17; prec++) { /* the shortest digits that read back the same */
    n = snprintf(b, sizeof b, "%.*g", prec, v);
    if (strtod(b, NULL) == v) break;
  }
  if (!strpbrk(b, ".eEn")) n += snprintf(b + n, sizeof b - (size_t)n, ".0"); /* keep it a float */
  rt_jw_rawn(w, b, (size_t)n);
}
