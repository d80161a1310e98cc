/* UTF-8 helpers of k3_tok: well-formedness (Unicode Table 3-7), U+FFFD replacement by
 * maximal subpart (the practice Python's errors="replace" follows), Python's str.isspace,
 * and the growable id/byte arrays of tokenizer.h.
 * Not a general Unicode library: category questions go to PCRE2. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/detok.h"
#include "k3pd/err.h"
#include "tok_internal.h"
#include "tok_utf8.h"

int k3_tok_ids_push(k3_tok_ids_t *v, int32_t id) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return K3_ENOMEM;
    v->ids = p;
    v->cap = cap;
  }
  v->ids[v->n++] = id;
  return 0;
}

int k3_tok_str_append(k3_tok_str_t *s, const void *data, size_t len) {
  if (s->len + len + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->len + len + 1) cap *= 2;
    char *p = realloc(s->data, cap);
    if (!p) return K3_ENOMEM;
    s->data = p;
    s->cap = cap;
  }
  if (len) memcpy(s->data + s->len, data, len);
  s->len += len;
  s->data[s->len] = '\0';
  return 0;
}

/* Second-byte range of a lead byte (Table 3-7); lo > hi marks a byte that never leads. */
static void lead_info(uint8_t b, int *need, uint8_t *lo, uint8_t *hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b < 0x80) {
    *need = 0;
  } else if (b >= 0xC2 && b <= 0xDF) {
    *need = 1;
  } else if (b == 0xE0) {
    *need = 2, *lo = 0xA0;
  } else if (b >= 0xE1 && b <= 0xEC) {
    *need = 2;
  } else if (b == 0xED) {
    *need = 2, *hi = 0x9F;
  } else if (b >= 0xEE && b <= 0xEF) {
    *need = 2;
  } else if (b == 0xF0) {
    *need = 3, *lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    *need = 3;
  } else if (b == 0xF4) {
    *need = 3, *hi = 0x8F;
  } else {
    *need = -1; /* 80..C1, F5..FF */
  }
}

k3_utf8_status_t k3_tok_utf8_check(const uint8_t *s, size_t len, size_t *n) {
  int need;
  uint8_t lo, hi;
  lead_info(s[0], &need, &lo, &hi);
  if (need < 0) {
    *n = 1;
    return K3_UTF8_INVALID;
  }
  size_t i = 1;
  for (int k = 0; k < need; k++, i++) {
    if (i >= len) {
      *n = i;
      return K3_UTF8_TRUNCATED;
    }
    uint8_t c = s[i];
    uint8_t l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (c < l || c > h) {
      *n = i; /* the maximal subpart ends before the offending byte */
      return K3_UTF8_INVALID;
    }
  }
  *n = i;
  return K3_UTF8_OK;
}

size_t k3_tok_utf8_valid_prefix(const char *s, size_t len) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0;
  while (i < len) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    size_t n;
    if (k3_tok_utf8_check(u + i, len - i, &n) != K3_UTF8_OK) return i;
    i += n;
  }
  return len;
}

int k3_tok_utf8_sanitize(const char *src, size_t len, k3_tok_str_t *out) {
  static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
  const uint8_t *u = (const uint8_t *)src;
  size_t i = 0, run = 0;
  while (i < len) {
    size_t n = 1;
    k3_utf8_status_t st = u[i] < 0x80 ? K3_UTF8_OK : k3_tok_utf8_check(u + i, len - i, &n);
    if (st == K3_UTF8_OK) {
      i += n;
      continue;
    }
    int rc = k3_tok_str_append(out, src + run, i - run);
    if (rc == 0) rc = k3_tok_str_append(out, fffd, 3);
    if (rc) return rc;
    i += n;
    run = i;
  }
  return k3_tok_str_append(out, src + run, len - run);
}

size_t k3_tok_utf8_next(const uint8_t *s, uint32_t *cp) {
  uint8_t b = s[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  if (b < 0xE0) {
    *cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (b < 0xF0) {
    *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return 3;
  }
  *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
        ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  return 4;
}

/* CPython's _PyUnicode_IsWhitespace: bidirectional type WS, B or S, or category Zs. Note
 * U+001C..U+001F are spaces here although they are not Unicode White_Space; the 25,000-run
 * rule uses this definition because tokenization_kimi.py calls str.isspace(). */
bool k3_tok_py_isspace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  if (cp < 0x85) return false;
  switch (cp) {
  case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
  case 0x3000:
    return true;
  default:
    return cp >= 0x2000 && cp <= 0x200A;
  }
}
