/* Pre-tokenizer tests: the PCRE2 rewrite of the K3 regex is equivalent to the original
 * (class intersections, Script vs Script_Extensions, White_Space) over every code point;
 * exact pieces for every branch; the ASCII fast path equals PCRE2 on random ASCII; the
 * 25,000-run and 400,000-chunk rules; the Unicode 15.0 corrections of PCRE2's Unicode 14
 * tables (tok_uni15.h) only add code points PCRE2 calls unassigned, and split as Unicode 15. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "tok_internal.h"

static k3_tok_splitter_t sp;

static void setup(void) {
  char err[256];
  ck_assert_int_eq(k3_tok_splitter_init(&sp, err, sizeof err), 0);
}
static void teardown(void) { k3_tok_splitter_free(&sp); }

typedef struct {
  size_t n;
  size_t off[4096], len[4096];
  size_t last_off[2], last_len[2]; /* the last two pieces: [1] is the last */
} pieces_t;

static int collect(void *ctx, const char *s, size_t off, size_t len) {
  pieces_t *p = ctx;
  if (p->n < 4096) {
    p->off[p->n] = off;
    p->len[p->n] = len;
  }
  p->last_off[0] = p->last_off[1], p->last_len[0] = p->last_len[1];
  p->last_off[1] = off, p->last_len[1] = len;
  p->n++;
  return 0;
}

static pieces_t *split(const char *s, size_t len, bool fast) {
  pieces_t *p = calloc(1, sizeof *p);
  ck_assert_int_eq(k3_tok_split(&sp, s, len, fast, collect, p), 0);
  return p;
}

/* Asserts that s splits into exactly the NULL-terminated list of pieces, on both paths. */
static void expect(const char *s, const char *const *want) {
  for (int fast = 0; fast < 2; fast++) {
    pieces_t *p = split(s, strlen(s), fast);
    size_t nw = 0;
    while (want[nw]) nw++;
    ck_assert_msg(p->n == nw, "\"%s\": %zu pieces, want %zu", s, p->n, nw);
    for (size_t i = 0; i < nw; i++) {
      ck_assert_msg(p->len[i] == strlen(want[i]) && memcmp(s + p->off[i], want[i], p->len[i]) == 0,
                    "\"%s\" piece %zu: \"%.*s\", want \"%s\"", s, i, (int)p->len[i], s + p->off[i], want[i]);
    }
    free(p);
  }
}
#define EXPECT(s, ...) expect(s, (const char *const[]){__VA_ARGS__, NULL})

static size_t put_utf8(uint32_t cp, uint8_t *o) {
  if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
  if (cp < 0x800) return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 63)), 2;
  if (cp < 0x10000)
    return o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 63)),
           o[2] = (uint8_t)(0x80 | (cp & 63)), 3;
  return o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 63)),
         o[2] = (uint8_t)(0x80 | (cp >> 6 & 63)), o[3] = (uint8_t)(0x80 | (cp & 63)), 4;
}

static pcre2_code *compile(const char *pat) {
  int ec;
  PCRE2_SIZE eo;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
  ck_assert_msg(re != NULL, "compile %s", pat);
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  return re;
}

static bool full(pcre2_code *re, pcre2_match_data *md, const uint8_t *s, size_t n) {
  return pcre2_match(re, s, n, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_NO_UTF_CHECK, md, NULL) >= 0;
}

/* Unicode White_Space (PropList.txt), which is what Rust's `\s` matches. */
static bool white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

START_TEST(test_class_rewrites_equivalent_on_every_code_point) {
  pcre2_code *upper = compile(K3_RE_UPPERISH), *lower = compile(K3_RE_LOWERISH);
  pcre2_code *up_union = compile("[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]");
  pcre2_code *lo_union = compile("[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]");
  pcre2_code *han = compile(K3_RE_HAN), *space = compile(K3_RE_SPACE), *nonspace = compile(K3_RE_NONSPACE);
  pcre2_match_data *md = pcre2_match_data_create(4, NULL);
  size_t n_up = 0, n_han_letters = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    uint8_t b[4];
    size_t n = put_utf8(cp, b);
    bool h = full(han, md, b, n);
    bool u = full(up_union, md, b, n), l = full(lo_union, md, b, n);
    /* [A && [^\p{Han}]] == A minus Han */
    /* (plain ifs: every passing ck_assert costs Check a write(2)) */
    if (full(upper, md, b, n) != (u && !h)) ck_abort_msg("U+%04X upper-ish", cp);
    if (full(lower, md, b, n) != (l && !h)) ck_abort_msg("U+%04X lower-ish", cp);
    if (full(space, md, b, n) != white_space(cp)) ck_abort_msg("U+%04X \\s", cp);
    if (full(nonspace, md, b, n) == white_space(cp)) ck_abort_msg("U+%04X \\S", cp);
    n_up += u && !h;
    n_han_letters += u && h;
  }
  /* The subtraction is not vacuous: tens of thousands of Han letters are removed. */
  ck_assert_uint_gt(n_han_letters, 80000);
  ck_assert_uint_gt(n_up, 30000);
  pcre2_match_data_free(md);
  pcre2_code *all[] = {upper, lower, up_union, lo_union, han, space, nonspace};
  for (size_t i = 0; i < 7; i++) pcre2_code_free(all[i]);
}
END_TEST

START_TEST(test_han_is_script_not_script_extensions) {
  pcre2_code *sc = compile(K3_RE_HAN), *scx = compile("\\p{Han}");
  pcre2_match_data *md = pcre2_match_data_create(4, NULL);
  uint8_t b[4];
  /* In Script=Han: 中 U+4E2D, 々 U+3005 (Lm), 〇 U+3007 (Nl), 𠀀 U+20000 */
  uint32_t in[] = {0x4E2D, 0x3005, 0x3007, 0x20000, 0x2E80};
  for (size_t i = 0; i < 5; i++) ck_assert_msg(full(sc, md, b, put_utf8(in[i], b)), "U+%04X", in[i]);
  /* Not Script=Han: ー U+30FC (scx Hira/Kana), ，U+FF0C */
  ck_assert(!full(sc, md, b, put_utf8(0x30FC, b)));
  ck_assert(!full(sc, md, b, put_utf8(0xFF0C, b)));
  /* Common script but Han in Script_Extensions: 、U+3001, 〃 U+3003 */
  uint32_t out[] = {0x3001, 0x3003};
  for (size_t i = 0; i < 2; i++) {
    ck_assert_msg(!full(sc, md, b, put_utf8(out[i], b)), "U+%04X", out[i]);
    ck_assert_msg(full(scx, md, b, put_utf8(out[i], b)), "PCRE2 bare \\p{Han} is scx: U+%04X", out[i]);
  }
  pcre2_match_data_free(md);
  pcre2_code_free(sc);
  pcre2_code_free(scx);
}
END_TEST

/* The Unicode 15.0 corrections (tok_uni15.h): on PCRE2 tables older than 15.0.0 the
 * splitter uses them; each corrected class is its plain class plus only code points that
 * PCRE2 itself calls unassigned (so nothing PCRE2 knows is reclassified), the negated prefix
 * class loses exactly the added letters/digits, and the additions are the 4,430 letters,
 * digits and marks Unicode 15.0 assigned (4,348 L + 40 N + 42 M). */
START_TEST(test_unicode15_classes_only_add_unassigned) {
  char uver[32];
  ck_assert_int_ge(pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, uver), 0);
  bool old = k3_tok_version_cmp(uver, K3_UNI15_VERSION) < 0;
  ck_assert_msg(sp.uni15 == old, "PCRE2 Unicode %s: uni15=%d", uver, sp.uni15);
  ck_assert(sp.uni15 == (sp.re_low != NULL)); /* the plain pattern for low subjects */
  pcre2_code *re[][2] = {
      {compile(K3_RE_HAN), compile(K3_RE_HAN_U15)},
      {compile(K3_RE_UPPERISH), compile(K3_RE_UPPERISH_U15)},
      {compile(K3_RE_LOWERISH), compile(K3_RE_LOWERISH_U15)},
      {compile("[\\p{L}\\p{N}\\p{M}]"),
       compile("[\\p{L}\\p{N}\\p{M}" K3_UNI15_ADD_L K3_UNI15_ADD_N K3_UNI15_ADD_M "]")},
  };
  pcre2_code *prefix = compile(K3_RE_PREFIX), *prefix15 = compile(K3_RE_PREFIX_U15);
  pcre2_code *ln15 = compile("[\\p{L}\\p{N}" K3_UNI15_ADD_L K3_UNI15_ADD_N "]");
  pcre2_code *cn = compile("\\p{Cn}");
  pcre2_match_data *md = pcre2_match_data_create(4, NULL);
  size_t added[4] = {0};
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    uint8_t b[4];
    size_t n = put_utf8(cp, b);
    bool unassigned = full(cn, md, b, n);
    for (size_t k = 0; k < 4; k++) {
      bool p = full(re[k][0], md, b, n), q = full(re[k][1], md, b, n);
      if (p && !q) ck_abort_msg("U+%04X left class %zu", cp, k);
      if (q && !p && !unassigned) ck_abort_msg("U+%04X (assigned in PCRE2) added to %zu", cp, k);
      /* the plain pattern serves subjects below K3_UNI15_MIN_CP: nothing is added there */
      if (q && !p && cp < K3_UNI15_MIN_CP) ck_abort_msg("U+%04X < K3_UNI15_MIN_CP added", cp);
      added[k] += q && !p;
    }
    if (full(prefix15, md, b, n) != (full(prefix, md, b, n) && !full(ln15, md, b, n)))
      ck_abort_msg("U+%04X prefix class", cp);
  }
  if (old && k3_tok_version_cmp(uver, "14.0.0") == 0) {
    ck_assert_uint_eq(added[3], 4430);
    ck_assert_uint_eq(added[0], 4193); /* CJK Ext H U+31350..U+323AF and U+2B739 */
    /* Lo 4,279 + Lm 63 + M 42 minus the 4,193 Han; the lower-ish class adds 6 Ll */
    ck_assert_uint_eq(added[1], 191);
    ck_assert_uint_eq(added[2], 197);
  }
  pcre2_match_data_free(md);
  for (size_t k = 0; k < 4; k++) pcre2_code_free(re[k][0]), pcre2_code_free(re[k][1]);
  pcre2_code *rest[] = {prefix, prefix15, ln15, cn};
  for (size_t i = 0; i < 4; i++) pcre2_code_free(rest[i]);
}
END_TEST

/* Pieces around code points first assigned in Unicode 15.0, as the Unicode 15 regex engine
 * of the real tokenizer splits them (each would split otherwise on Unicode 14 tables). */
START_TEST(test_unicode15_pieces) {
  /* Kawi letter U+11F04 (Lo) inside a word; Kawi sign U+11F00 (Mn) after a letter */
  EXPECT("a\U00011F04b", "a\U00011F04b");
  EXPECT("\U00011F04\U00011F00", "\U00011F04\U00011F00");
  /* CJK Ext H U+31350 (Han): joins Han runs, never a letter word */
  EXPECT("中\U00031350文x", "中\U00031350文", "x");
  EXPECT("a\U00031350", "a", "\U00031350");
  /* Kaktovik numerals U+1D2C0.. and Nag Mundari digit U+1E4F0 (N): \p{N}{1,3}, and not the
   * punctuation branch */
  EXPECT("\U0001D2C0\U0001D2C1\U0001D2C2\U0001D2C3!", "\U0001D2C0\U0001D2C1\U0001D2C2",
         "\U0001D2C3", "!");
  EXPECT("x\U0001E4F0", "x", "\U0001E4F0");
  /* Kannada U+0CF3 (Mc) after a letter; Cyrillic modifier U+1E030 (Lm); Latin U+1DF25 (Ll)
   * after an upper-case letter; the Unicode 15 letter is not a leading prefix character */
  EXPECT("\xe0\xb2\x95\xe0\xb3\xb3", "\xe0\xb2\x95\xe0\xb3\xb3");
  EXPECT("\xd0\xb4\U0001E030", "\xd0\xb4\U0001E030");
  EXPECT("A\U0001DF25", "A\U0001DF25");
  EXPECT("!\U00011F05", "!\U00011F05");
  EXPECT("\U00011F05!", "\U00011F05", "!");
  /* one Unicode 15 code point far into a subject of Latin/Cyrillic text (the plain pattern
   * is only for subjects without any code point >= K3_UNI15_MIN_CP) */
  EXPECT("caf\xc3\xa9 \xd0\xb4\xd0\xb0 na\xc3\xafve\U00011F04x 12\U0001D2C0",
         "caf\xc3\xa9", " \xd0\xb4\xd0\xb0", " na\xc3\xafve\U00011F04x", " ", "12\U0001D2C0");
}
END_TEST

START_TEST(test_version_cmp) {
  ck_assert_int_lt(k3_tok_version_cmp("14.0.0", "15.0.0"), 0);
  ck_assert_int_gt(k3_tok_version_cmp("15.1.0", "15.0.0"), 0);
  ck_assert_int_gt(k3_tok_version_cmp("16.0.0", "15.0.0"), 0);
  ck_assert_int_eq(k3_tok_version_cmp("15.0.0", "15.0.0"), 0);
  ck_assert_int_eq(k3_tok_version_cmp("15", "15.0.0"), 0);
  ck_assert_int_lt(k3_tok_version_cmp("9.0.0", "15.0.0"), 0); /* numeric, not text */
  ck_assert_int_gt(k3_tok_version_cmp("15.0.10", "15.0.9"), 0);
}
END_TEST

START_TEST(test_branch_pieces) {
  /* [\p{Han}]+ */
  EXPECT("中文abc", "中文", "abc");
  EXPECT("漢々字", "漢々字");
  EXPECT("中、文", "中", "、", "文");
  EXPECT("你好，世界！", "你好", "，", "世界", "！");
  /* letters with an optional leading non-letter, case runs, contractions */
  EXPECT("Hello world", "Hello", " world");
  EXPECT("HTTPServer", "HTTPServer");
  EXPECT("helloWorld", "hello", "World");
  EXPECT("I'm they're DON'T we'LL", "I'm", " they're", " DON'T", " we'LL");
  EXPECT("it'sx", "it's", "x");
  EXPECT("$hello", "$hello");
  EXPECT("\tfoo", "\tfoo");
  EXPECT("Ünïcödé ǅungla", "Ünïcödé", " ǅungla");
  EXPECT("e\xcc\x81t\xc3\xa9", "e\xcc\x81t\xc3\xa9");
  EXPECT("カー中", "カー", "中");
  /* \p{N}{1,3} */
  EXPECT("12345", "123", "45");
  EXPECT("x1", "x", "1");
  EXPECT("１２３４", "１２３", "４");
  /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
  EXPECT(" !!!\n\nabc", " !!!\n\n", "abc");
  EXPECT("a=\"b\"", "a", "=\"", "b", "\"");
  EXPECT("!\xc2\x85", "!", "\xc2\x85"); /* U+0085 is \s for Rust: not punctuation */
  /* \s*[\r\n]+ , \s+(?!\S) , \s+ */
  EXPECT("a\n\n  b", "a", "\n\n", " ", " b");
  EXPECT("a  b", "a", " ", " b");
  EXPECT("a   ", "a", "   ");
  EXPECT("\t\tx", "\t", "\tx");
  EXPECT("x \r\n y", "x", " \r\n", " y");
  EXPECT("a\xe3\x80\x80" "b", "a", "\xe3\x80\x80" "b"); /* U+3000 ideographic space + letter */
}
END_TEST

START_TEST(test_ascii_fast_path_matches_pcre2) {
  static const char alpha[] = "abcXYZ019 \t\r\n\v\f'!\"#$.,;:-_()\x01\x1f\x7f sStTdDmMlLrReEvV";
  srand(1234);
  char buf[96];
  for (int it = 0; it < 20000; it++) {
    size_t n = (size_t)(rand() % 80);
    for (size_t i = 0; i < n; i++) buf[i] = alpha[rand() % (int)(sizeof alpha - 1)];
    pieces_t *a = split(buf, n, true), *b = split(buf, n, false);
    if (a->n != b->n) ck_abort_msg("\"%.*s\": %zu vs %zu pieces", (int)n, buf, a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
      if (a->off[i] != b->off[i] || a->len[i] != b->len[i])
        ck_abort_msg("\"%.*s\": piece %zu differs", (int)n, buf, i);
    free(a);
    free(b);
  }
}
END_TEST

START_TEST(test_run_rule_25000) {
  size_t n = 30000;
  char *s = malloc(n + 2);
  memset(s, 'a', n);
  pieces_t *p = split(s, n, true);
  ck_assert_uint_eq(p->n, 2);
  ck_assert_uint_eq(p->len[0], 25000);
  ck_assert_uint_eq(p->len[1], 5000);
  free(p);
  /* 30,000 spaces then "x": the first 25,000 spaces are their own subject (a trailing run),
   * the remaining 5,000 split as "    ...", " x" */
  memset(s, ' ', n);
  s[n] = 'x';
  p = split(s, n + 1, true);
  ck_assert_uint_eq(p->n, 3);
  ck_assert_uint_eq(p->len[0], 25000);
  ck_assert_uint_eq(p->len[1], 4999);
  ck_assert_uint_eq(p->len[2], 2);
  free(p);
  /* The PCRE2 path with a 25,000-letter non-ASCII word (JIT stack) */
  char *u = malloc(2 * 26000);
  for (size_t i = 0; i < 26000; i++) u[2 * i] = (char)0xC3, u[2 * i + 1] = (char)0xA9; /* é */
  p = split(u, 2 * 26000, true);
  ck_assert_uint_eq(p->n, 2);
  ck_assert_uint_eq(p->len[0], 2 * 25000);
  free(p);
  free(u);
  /* Exactly 25,000 is not cut */
  memset(s, 'b', 25000);
  p = split(s, 25000, true);
  ck_assert_uint_eq(p->n, 1);
  free(p);
  /* U+001C..U+001F are Python spaces: they break a non-space run */
  ck_assert(k3_tok_py_isspace(0x1C) && k3_tok_py_isspace(0x85) && k3_tok_py_isspace(0x3000));
  ck_assert(!k3_tok_py_isspace(0x200B) && !k3_tok_py_isspace('a'));
  free(s);
}
END_TEST

START_TEST(test_chunk_400000) {
  /* "abcd " x 80000 = 400,000 chars, then "efgh": the chunk ends after the space, so the
   * last pieces are " " (a trailing space of its subject) and "efgh", not " efgh". */
  size_t n = 400000 + 4;
  char *s = malloc(n);
  for (size_t i = 0; i < 400000; i += 5) memcpy(s + i, "abcd ", 5);
  memcpy(s + 400000, "efgh", 4);
  pieces_t *p = split(s, n, true);
  ck_assert_uint_eq(p->n, 80000 + 1 + 1);
  ck_assert_uint_eq(p->last_off[0], 399999);
  ck_assert_uint_eq(p->last_len[0], 1);
  ck_assert_uint_eq(p->last_off[1], 400000);
  ck_assert_uint_eq(p->last_len[1], 4);
  free(p);
  /* Without the first "abcd " (399,999 chars): no chunk boundary, the last piece is " efgh". */
  pieces_t *q = split(s + 5, n - 5, true);
  ck_assert_uint_eq(q->n, 80000);
  ck_assert_uint_eq(q->last_len[1], 5);
  free(q);
  free(s);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tok_split");
  TCase *tc = tcase_create("split");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_class_rewrites_equivalent_on_every_code_point);
  tcase_add_test(tc, test_han_is_script_not_script_extensions);
  tcase_add_test(tc, test_unicode15_classes_only_add_unassigned);
  tcase_add_test(tc, test_unicode15_pieces);
  tcase_add_test(tc, test_version_cmp);
  tcase_add_test(tc, test_branch_pieces);
  tcase_add_test(tc, test_ascii_fast_path_matches_pcre2);
  tcase_add_test(tc, test_run_rule_25000);
  tcase_add_test(tc, test_chunk_400000);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
