/* A small append-only JSON writer for the HTTP front's responses and stream chunks: literal
 * pieces, escaped strings, numbers. Faster and more predictable than building jansson trees
 * for every streamed token (docs/perf.md: the per-token cost of the HTTP front).
 *
 * Strings: '"', '\\' and control characters are escaped (\n \r \t \b \f, else \u00XX);
 * other UTF-8 is written as is; ill-formed UTF-8 is replaced by U+FFFD (one per maximal
 * subpart) so the output is always valid JSON in UTF-8.
 * Errors are sticky: after an allocation failure every call is a no-op and `err` is K3_ENOMEM.
 * The buffer (w.s.data) belongs to the caller: free() it, or take it over. */
#ifndef K3PD_ROUTER_JSONW_H
#define K3PD_ROUTER_JSONW_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/tokenizer.h"

typedef struct {
  k3_tok_str_t s;
  int err;
} rt_jw_t;

void rt_jw_raw(rt_jw_t *w, const char *lit);              /* NUL-terminated literal, unescaped */
void rt_jw_rawn(rt_jw_t *w, const char *s, size_t n);     /* n bytes, unescaped */
void rt_jw_str(rt_jw_t *w, const char *s, size_t n);      /* "escaped" */
void rt_jw_strz(rt_jw_t *w, const char *s);               /* "escaped", or null for NULL */
void rt_jw_str_body(rt_jw_t *w, const char *s, size_t n); /* escaped, without the quotes */
void rt_jw_i64(rt_jw_t *w, int64_t v);
void rt_jw_f64(rt_jw_t *w, double v); /* shortest round-trip form; -inf → -9999.0, NaN → null */

#endif
