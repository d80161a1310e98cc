/* Pre-tokenisation of k3_tok: the long-run rules of tokenization_kimi.py, then the K3 split
 * regex through PCRE2 (UTF + UCP + JIT), with a hand-written ASCII fast path.
 *
 * The ASCII path implements exactly what the regex does on ASCII-only subjects (the tests
 * compare both on random ASCII strings); any sub-string with a byte >= 0x80 goes to PCRE2.
 * Order of operations (tokenization_kimi.py encode): cut the text into 400,000-code-point
 * chunks; cut each chunk so that no run of > 25,000 consecutive whitespace (str.isspace) or
 * non-whitespace code points remains; run the regex on each resulting sub-string as its own
 * subject (so `\s+(?!\S)` sees the sub-string's end as end of input).
 * Unicode version: the regex is compiled with the Unicode 15.0 additions of tok_uni15.h when
 * PCRE2's own tables are older (see k3_tok_splitter_init and docs/tokenizer.md); a subject
 * with no code point >= K3_UNI15_MIN_CP, where the additions cannot match, uses the plain
 * pattern, which is faster.
 * Not here: BPE (tok_bpe.c), UTF-8 validation (done by the caller before splitting). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "tok_internal.h"

int k3_tok_version_cmp(const char *a, const char *b) {
  /* Component by component; stops at anything that is not "digits[.digits...]". */
  while (*a || *b) {
    char *ea, *eb;
    unsigned long x = strtoul(a, &ea, 10), y = strtoul(b, &eb, 10);
    if (x != y) return x < y ? -1 : 1;
    a = ea + (*ea == '.');
    b = eb + (*eb == '.');
    if ((*a && (*a < '0' || *a > '9')) || (*b && (*b < '0' || *b > '9'))) break;
  }
  return 0;
}

int k3_tok_splitter_init(k3_tok_splitter_t *sp, char *err, size_t errlen) {
  int ec;
  PCRE2_SIZE eo;
  memset(sp, 0, sizeof *sp);
  /* PCRE2 10.42 (Debian 12) has Unicode 14 tables; the K3 tokenizer's regex engine has
   * Unicode 15.0. Older tables get the generated additions (tok_uni15.h); newer ones are
   * taken as they are. A PCRE2 that cannot say is treated as old: the additions only add
   * code points that Unicode 15.0 puts in the class, so they are right for any version. */
  char uver[32] = "";
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, uver) < 0) uver[0] = '\0';
  sp->uni15 = uver[0] == '\0' || k3_tok_version_cmp(uver, K3_UNI15_VERSION) < 0;
  if (uver[0] && k3_tok_version_cmp(uver, K3_UNI15_BASE_VERSION) < 0) {
    static atomic_flag warned = ATOMIC_FLAG_INIT; /* once per process */
    if (!atomic_flag_test_and_set(&warned)) {
      K3_WARN("PCRE2 Unicode tables are %s, older than %s (tok_uni15.h's base): code points "
              "assigned in between are split as unassigned", uver, K3_UNI15_BASE_VERSION);
    }
  }
  /* The range compares cost ~35% of PCRE2 throughput on Latin text, so subjects without a
   * code point >= K3_UNI15_MIN_CP (where the additions cannot match) use the plain pattern. */
  const char *pat[2] = {sp->uni15 ? K3_RE_PATTERN_U15 : K3_RE_PATTERN, K3_RE_PATTERN};
  pcre2_code **dst[2] = {&sp->re, &sp->re_low};
  sp->jit = true;
  for (int k = 0; k < 1 + sp->uni15; k++) {
    *dst[k] = pcre2_compile((PCRE2_SPTR)pat[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                            &ec, &eo, NULL);
    if (!*dst[k]) {
      PCRE2_UCHAR msg[160];
      pcre2_get_error_message(ec, msg, sizeof msg);
      if (err) snprintf(err, errlen, "split regex: PCRE2 error at %zu: %s", (size_t)eo, msg);
      k3_tok_splitter_free(sp);
      return K3_EINTERNAL;
    }
    /* JIT is an optimisation only: the interpreter gives the same matches. */
    sp->jit = sp->jit && pcre2_jit_compile(*dst[k], PCRE2_JIT_COMPLETE) == 0;
  }
  return 0;
}

void k3_tok_splitter_free(k3_tok_splitter_t *sp) {
  if (sp->re) pcre2_code_free(sp->re);
  if (sp->re_low) pcre2_code_free(sp->re_low);
  sp->re = sp->re_low = NULL;
}

/* ---- ASCII fast path: character classes of the regex restricted to ASCII ---- */
static inline bool a_space(uint8_t c) { return c == ' ' || (c >= 9 && c <= 13); }
static inline bool a_upper(uint8_t c) { return c >= 'A' && c <= 'Z'; }
static inline bool a_lower(uint8_t c) { return c >= 'a' && c <= 'z'; }
static inline bool a_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static inline bool a_alnum(uint8_t c) { return a_upper(c) || a_lower(c) || a_digit(c); }
static inline bool a_prefix(uint8_t c) { return c != '\r' && c != '\n' && !a_alnum(c); }
static inline bool a_punct(uint8_t c) { return !a_space(c) && !a_alnum(c); }
static inline uint8_t a_fold(uint8_t c) { return a_upper(c) ? (uint8_t)(c + 32) : c; }

/* Length of `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at s[i], 0 when absent. */
static size_t contraction(const uint8_t *s, size_t i, size_t n) {
  if (i + 1 >= n || s[i] != '\'') return 0;
  uint8_t c1 = a_fold(s[i + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 < n) {
    uint8_t c2 = a_fold(s[i + 2]);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  }
  return 0;
}

/* Length of the leftmost-first match of the regex at s[i] (ASCII subject); always >= 1. */
static size_t ascii_match(const uint8_t *s, size_t i, size_t n) {
  /* [^\r\n\p{L}\p{N}]? [A-Z]* [a-z]+ C?   (the prefix is tried first, then without it) */
  for (int withp = 1; withp >= 0; withp--) {
    size_t j = i;
    if (withp) {
      if (!a_prefix(s[j])) continue;
      j++;
    }
    size_t k = j;
    while (k < n && a_upper(s[k])) k++;
    size_t m = k;
    while (m < n && a_lower(s[m])) m++;
    if (m > k) return m + contraction(s, m, n) - i;
  }
  /* [^\r\n\p{L}\p{N}]? [A-Z]+ [a-z]* C? */
  for (int withp = 1; withp >= 0; withp--) {
    size_t j = i;
    if (withp) {
      if (!a_prefix(s[j])) continue;
      j++;
    }
    size_t k = j;
    while (k < n && a_upper(s[k])) k++;
    if (k == j) continue;
    while (k < n && a_lower(s[k])) k++;
    return k + contraction(s, k, n) - i;
  }
  /* \p{N}{1,3} */
  if (a_digit(s[i])) {
    size_t k = i;
    while (k < n && k - i < 3 && a_digit(s[k])) k++;
    return k - i;
  }
  /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
  for (int withsp = 1; withsp >= 0; withsp--) {
    size_t j = i;
    if (withsp) {
      if (s[j] != ' ') continue;
      j++;
    }
    size_t k = j;
    while (k < n && a_punct(s[k])) k++;
    if (k == j) continue;
    while (k < n && (s[k] == '\r' || s[k] == '\n')) k++;
    return k - i;
  }
  /* Only whitespace is left. r = end of the whitespace run. */
  size_t r = i;
  while (r < n && a_space(s[r])) r++;
  /* \s*[\r\n]+ : ends after the last CR/LF of the run */
  for (size_t m = r; m > i; m--)
    if (s[m - 1] == '\r' || s[m - 1] == '\n') return m - i;
  /* \s+(?!\S) then \s+ */
  if (r == n) return r - i;
  if (r - i >= 2) return r - 1 - i;
  return r - i;
}

typedef struct {
  const k3_tok_splitter_t *sp;
  const char *text; /* the whole original text (pieces are reported as offsets into it) */
  bool fast;
  pcre2_match_data *md;
  pcre2_match_context *mc;
  pcre2_jit_stack *js;
  k3_tok_piece_fn fn;
  void *ctx;
} split_state_t;

/* low: every code point of the subject is < K3_UNI15_MIN_CP. */
static int regex_split(split_state_t *st, size_t off, size_t len, bool ascii, bool low) {
  const uint8_t *s = (const uint8_t *)st->text + off;
  if (ascii && st->fast) {
    for (size_t i = 0; i < len;) {
      size_t m = ascii_match(s, i, len);
      int rc = st->fn(st->ctx, st->text, off + i, m);
      if (rc) return rc;
      i += m;
    }
    return 0;
  }
  /* Both patterns have no capture groups, so one match data serves either. */
  const pcre2_code *re = low && st->sp->re_low ? st->sp->re_low : st->sp->re;
  if (!st->md && !(st->md = pcre2_match_data_create_from_pattern(st->sp->re, NULL)))
    return K3_ENOMEM;
  size_t i = 0;
  while (i < len) {
    int rc = pcre2_match(re, s, len, i, PCRE2_NO_UTF_CHECK, st->md, st->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !st->js) {
      /* The lookahead-guarded class repeats keep one backtrack frame per code point, so a
       * long non-ASCII word overflows the 32 KiB default JIT stack. Only then is a large
       * stack made (reserved virtual memory, committed as used) and the match retried. */
      st->mc = pcre2_match_context_create(NULL);
      st->js = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
      if (!st->mc || !st->js) return K3_ENOMEM;
      pcre2_jit_stack_assign(st->mc, NULL, st->js);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break; /* cannot happen: every code point is covered */
    if (rc < 0) return rc == PCRE2_ERROR_NOMEMORY ? K3_ENOMEM : K3_EINTERNAL;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    if (ov[1] <= ov[0]) return K3_EINTERNAL; /* the regex has no empty matches */
    int cb = st->fn(st->ctx, st->text, off + ov[0], ov[1] - ov[0]);
    if (cb) return cb;
    i = ov[1];
  }
  return 0;
}

/* _split_whitespaces_or_nonwhitespaces over one chunk text[off..off+len). */
static int run_split(split_state_t *st, size_t off, size_t len) {
  if (len == 0) return 0;
  const uint8_t *s = (const uint8_t *)st->text;
  uint32_t cp;
  k3_tok_utf8_next(s + off, &cp);
  bool cur_space = k3_tok_py_isspace(cp), ascii = true, low = true;
  size_t cur_len = 0, start = off, end = off + len;
  for (size_t p = off; p < end;) {
    size_t n = k3_tok_utf8_next(s + p, &cp);
    bool now = k3_tok_py_isspace(cp);
    if (cur_space != now) {
      cur_len = 1;
      cur_space = now;
    } else if (++cur_len > K3_TOK_MAX_RUN_CHARS) {
      int rc = regex_split(st, start, p - start, ascii, low);
      if (rc) return rc;
      start = p;
      cur_len = 1;
      ascii = low = true;
    }
    if (cp >= 0x80) ascii = false;
    if (cp >= K3_UNI15_MIN_CP) low = false;
    p += n;
  }
  return regex_split(st, start, end - start, ascii, low);
}

int k3_tok_split(const k3_tok_splitter_t *sp, const char *text, size_t len, bool use_fast_path,
                 k3_tok_piece_fn fn, void *ctx) {
  split_state_t st = {.sp = sp, .text = text, .fast = use_fast_path, .fn = fn, .ctx = ctx};
  const uint8_t *s = (const uint8_t *)text;
  int rc = 0;
  size_t chunk = 0, nchars = 0;
  for (size_t p = 0; p < len && rc == 0;) {
    if (nchars == K3_TOK_MAX_ENCODE_CHARS) {
      rc = run_split(&st, chunk, p - chunk);
      chunk = p;
      nchars = 0;
    }
    /* Count code points: every byte that is not a continuation byte starts one. */
    nchars++;
    p++;
    while (p < len && (s[p] & 0xC0) == 0x80) p++;
  }
  if (rc == 0) rc = run_split(&st, chunk, len - chunk);
  if (st.md) pcre2_match_data_free(st.md);
  if (st.mc) pcre2_match_context_free(st.mc);
  if (st.js) pcre2_jit_stack_free(st.js);
  return rc;
}
