/* The XTML output parser (router/xtml_out.c): the documented grammar (think, response, tools
 * with argument and json elements), argument JSON assembly, the degradations (unknown,
 * misplaced, unterminated and over-long tags become text; nothing is lost), and that any split
 * of the input gives the same events (byte by byte, every 2-split, random splits of random
 * marker soup). */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtml_out.h"

/* Events as "R:text|C:text|B:name|A:args|E", consecutive text of one kind coalesced. */
typedef struct {
  k3_tok_str_t s;
  int last;
} rec_t;

static void on_ev(void *ctx, rt_xo_kind_t k, const char *s, size_t n) {
  rec_t *r = ctx;
  static const char tag[] = "RCBAE";
  bool merge = (k == RT_XO_REASONING || k == RT_XO_CONTENT || k == RT_XO_CALL_ARGS) && r->last == (int)k;
  if (!merge) {
    if (r->s.len) k3_tok_str_append(&r->s, "|", 1);
    char h[3] = {tag[k], ':', 0};
    k3_tok_str_append(&r->s, h, k == RT_XO_CALL_END ? 1 : 2);
  }
  if (k != RT_XO_CALL_END) k3_tok_str_append(&r->s, s, n);
  r->last = (int)k;
}

/* Feeds `in` cut at the given offsets (sorted, may be empty) and returns the record. */
static char *run_cuts(const char *in, bool thinking, const size_t *cuts, size_t ncuts) {
  rt_xtml_t p;
  rec_t r = {{0}, -1};
  rt_xtml_init(&p, thinking, on_ev, &r);
  size_t at = 0, len = strlen(in);
  for (size_t i = 0; i <= ncuts; i++) {
    size_t to = i < ncuts ? cuts[i] : len;
    ck_assert_int_eq(rt_xtml_feed(&p, in + at, to - at), 0);
    at = to;
  }
  ck_assert_int_eq(rt_xtml_finish(&p), 0);
  rt_xtml_free(&p);
  k3_tok_str_append(&r.s, "", 0);
  return r.s.data;
}

static char *run(const char *in, bool thinking) { return run_cuts(in, thinking, NULL, 0); }

/* Whole feed, byte-by-byte feed and every 2-split agree; returns the whole-feed record. */
static char *run_all(const char *in, bool thinking) {
  char *whole = run(in, thinking);
  size_t len = strlen(in);
  size_t *cuts = malloc((len + 1) * sizeof *cuts);
  for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
  char *bytes = run_cuts(in, thinking, cuts, len ? len - 1 : 0);
  ck_assert_str_eq(bytes, whole);
  free(bytes);
  for (size_t c = 1; c < len; c++) {
    char *two = run_cuts(in, thinking, &c, 1);
    if (strcmp(two, whole) != 0) ck_abort_msg("split at %zu of %s: %s != %s", c, in, two, whole);
    free(two);
  }
  free(cuts);
  return whole;
}

#define EXPECT(in, thinking, want)        \
  do {                                    \
    char *got_ = run_all(in, thinking);   \
    ck_assert_str_eq(got_, want);         \
    free(got_);                           \
  } while (0)

#define O(t) "<|open|>" t "<|sep|>"
#define C(t) "<|close|>" t "<|sep|>"

START_TEST(test_channels) {
  EXPECT("let me think" C("think") O("response") "Hello!" C("response") C("message"), true, "R:let me think|C:Hello!");
  EXPECT("Hi there" C("response") C("message"), false, "C:Hi there");
  EXPECT("", true, "");
  EXPECT(C("think") O("response") "x" C("response"), true, "C:x");
  /* whitespace between elements is dropped, inside a channel it is kept */
  EXPECT(" a \n" C("think") "\n" O("response") " b " C("response") "\n" C("message"), true, "R: a \n|C: b ");
  /* text after </think> without <response>: content */
  EXPECT("r" C("think") "answer" C("response") C("message"), true, "R:r|C:answer");
  /* a channel opened without closing the previous one */
  EXPECT("r" O("response") "a" C("message"), true, "R:r|C:a");
}
END_TEST

START_TEST(test_tool_calls) {
  EXPECT("t" C("think") O("response") C("response") O("tools")
         O("call tool=\"get_weather\" index=\"1\"")
         O("argument key=\"city\" type=\"string\"") "Pa\"ris\n\\" C("argument")
         O("argument key=\"days\" type=\"number\"") "3" C("argument")
         O("argument key=\"opts\" type=\"object\"") "{\"a\": [1, 2]}" C("argument")
         C("call") C("tools") C("message"),
         true, "R:t|B:get_weather|A:{\"city\": \"Pa\\\"ris\\n\\\\\", \"days\": 3, \"opts\": {\"a\": [1, 2]}}|E");
  /* two calls, no arguments, attribute escapes */
  EXPECT("ok" C("response") O("tools") O("call tool=\"a&amp;b&quot;c\" index=\"1\"") C("call")
         O("call tool=\"now\" index=\"2\"") O("argument key=\"k&quot;\" type=\"boolean\"") "true" C("argument")
         C("call") C("tools") C("message"),
         false, "C:ok|B:a&b\"c|A:{}|E|B:now|A:{\"k\\\"\": true}|E");
  /* a non-string value that is not JSON becomes a string; a json element passes through */
  EXPECT(O("tools") O("call tool=\"f\" index=\"1\"") O("argument key=\"n\" type=\"number\"") " 12abc " C("argument")
         C("call") O("call tool=\"g\" index=\"2\"") O("json type=\"object\"") "{\"raw\": 1}" C("json") C("call")
         C("tools"),
         false, "B:f|A:{\"n\": \" 12abc \"}|E|B:g|A:{\"raw\": 1}|E");
  /* closing the call (or tools/message) closes an open argument */
  EXPECT(O("tools") O("call tool=\"f\" index=\"1\"") O("argument key=\"s\" type=\"string\"") "v" C("call")
         C("message"),
         false, "B:f|A:{\"s\": \"v\"}|E");
  EXPECT(O("tools") O("call tool=\"f\" index=\"1\"") O("argument key=\"s\" type=\"string\"") "v" C("message"), false,
         "B:f|A:{\"s\": \"v\"}|E");
  /* cut short inside a call: what was emitted stays (truncated arguments) */
  EXPECT(O("tools") O("call tool=\"f\" index=\"1\"") O("argument key=\"s\" type=\"string\"") "partial", false,
         "B:f|A:{\"s\": \"partial");
  EXPECT(O("tools") O("call tool=\"f\" index=\"1\"") O("argument key=\"n\" type=\"number\"") "4", false,
         "B:f|A:{\"n\": 4");
}
END_TEST

START_TEST(test_arguments_are_json) {
  const char *in = O("tools") O("call tool=\"f\" index=\"1\"")
      O("argument key=\"a\" type=\"string\"") "x\x01y\ttab \xe2\x9c\x93" C("argument")
      O("argument key=\"b\" type=\"array\"") "[1, \"two\"]" C("argument")
      O("argument key=\"c\" type=\"null\"") "null" C("argument")
      O("argument key=\"d\" type=\"object\"") "{broken" C("argument") C("call");
  char *got = run_all(in, false);
  char *a = strstr(got, "A:"), *e = strstr(got, "|E");
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(e);
  json_error_t je;
  json_t *j = json_loadb(a + 2, (size_t)(e - a - 2), 0, &je);
  ck_assert_msg(j != NULL, "arguments are not JSON: %s (%s)", a + 2, je.text);
  ck_assert_str_eq(json_string_value(json_object_get(j, "a")), "x\x01y\ttab \xe2\x9c\x93");
  ck_assert_int_eq(json_array_size(json_object_get(j, "b")), 2);
  ck_assert(json_is_null(json_object_get(j, "c")));
  ck_assert_str_eq(json_string_value(json_object_get(j, "d")), "{broken");
  json_decref(j);
  free(got);
}
END_TEST

START_TEST(test_degrades_to_content) {
  /* unknown and misplaced tags are text of the channel they appear in */
  EXPECT("a" O("foo x=\"1\"") "b" C("response"), false, "C:a<|open|>foo x=\"1\"<|sep|>b");
  EXPECT("a" O("call tool=\"f\"") "b", true, "R:a<|open|>call tool=\"f\"<|sep|>b");
  EXPECT(C("response") O("tools") "junk" O("call index=\"1\"") C("tools"), false,
         "C:junk<|open|>call index=\"1\"<|sep|>");
  /* unterminated tag, stray separator, literal '<' and marker-like text */
  EXPECT("x<|open|>respo", false, "C:x<|open|>respo");
  EXPECT("x<|sep|>y", false, "C:x<|sep|>y");
  EXPECT("a < b <| c <|op", false, "C:a < b <| c <|op");
  EXPECT("<|open|>abc" C("response") "tail", false, "C:<|open|>abctail");
  EXPECT("<", false, "C:<");
  /* a marker inside a tag: the tag so far is text, the new marker starts a tag */
  EXPECT("r<|open|>bad<|close|>think<|sep|>" O("response") "c", true, "R:r<|open|>bad|C:c");
  /* a malformed attribute list */
  EXPECT(O("tools") O("call tool=get index=\"1\"") "z", false, "C:<|open|>call tool=get index=\"1\"<|sep|>z");
  /* after the message: content, tags included */
  EXPECT("a" C("message") "more" O("message role=\"user\"") "x", false, "C:amore<|open|>message role=\"user\"<|sep|>x");
}
END_TEST

START_TEST(test_long_tag) {
  char in[2048];
  size_t n = (size_t)snprintf(in, sizeof in, "<|open|>");
  for (int i = 0; i < 600; i++) in[n++] = 'a';
  n += (size_t)snprintf(in + n, sizeof in - n, "<|sep|>end");
  char *got = run(in, false);
  ck_assert_int_eq(strncmp(got, "C:<|open|>aaaa", 14), 0);
  ck_assert_ptr_nonnull(strstr(got, "<|sep|>end"));
  free(got);
}
END_TEST

/* Random soup of markers, tag names, quotes and text: never an error, any split gives the
 * same events, and without any <|sep|> (so no tag can complete) all text comes out unchanged. */
START_TEST(test_random) {
  static const char *const pieces[] = {"<|open|>", "<|close|>", "<|sep|>", "think", "response", "tools",
                                       "call tool=\"f\" index=\"1\"", "argument key=\"k\" type=\"string\"",
                                       "argument key=\"n\" type=\"number\"", "json", "message", " ", "\n", "<",
                                       "|", ">", "\"", "x", "12", "\xc3\xa9", "&amp;"};
  size_t np = sizeof pieces / sizeof pieces[0];
  unsigned seed = 12345;
  for (int it = 0; it < 3000; it++) {
    char in[512];
    size_t n = 0;
    int len = 1 + (int)(rand_r(&seed) % 40);
    bool nosep = it % 3 == 0;
    for (int k = 0; k < len; k++) {
      const char *pc = pieces[rand_r(&seed) % np];
      if (nosep && strcmp(pc, "<|sep|>") == 0) pc = "y";
      size_t pl = strlen(pc);
      if (n + pl >= sizeof in) break;
      memcpy(in + n, pc, pl);
      n += pl;
    }
    in[n] = 0;
    bool thinking = it % 2;
    char *whole = run(in, thinking);
    size_t cuts[6];
    size_t nc = (size_t)(rand_r(&seed) % 6);
    for (size_t c = 0; c < nc; c++) cuts[c] = n ? (size_t)rand_r(&seed) % (n + 1) : 0;
    for (size_t a = 0; a < nc; a++) /* sort */
      for (size_t b = a + 1; b < nc; b++)
        if (cuts[b] < cuts[a]) {
          size_t t = cuts[a];
          cuts[a] = cuts[b];
          cuts[b] = t;
        }
    char *split = run_cuts(in, thinking, cuts, nc);
    if (strcmp(split, whole) != 0) ck_abort_msg("split differs for %s: %s vs %s", in, split, whole);
    if (nosep) {
      char want[600];
      snprintf(want, sizeof want, "%s%s", n ? (thinking ? "R:" : "C:") : "", in);
      if (strcmp(whole, want) != 0) ck_abort_msg("text lost for %s: %s", in, whole);
    }
    free(whole);
    free(split);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("xtml_out");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_channels);
  tcase_add_test(tc, test_tool_calls);
  tcase_add_test(tc, test_arguments_are_json);
  tcase_add_test(tc, test_degrades_to_content);
  tcase_add_test(tc, test_long_tag);
  tcase_add_test(tc, test_random);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
