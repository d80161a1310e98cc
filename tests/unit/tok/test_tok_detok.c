/* Streaming detokeniser tests: multi-byte characters split across tokens, U+FFFD for
 * ill-formed bytes, stop ids, stop strings across token boundaries with the longest possible
 * prefix held back, and streaming == one-shot decode on random text. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/detok.h"
#include "k3pd/err.h"
#include "tok_testutil.h"

static char *dir;
static k3_tok_t *tok;
static void setup(void) {
  dir = tt_tiny_dir("kimi_k3");
  tok = tt_load(dir, NULL);
}
static void teardown(void) {
  k3_tok_free(tok);
  tt_rmdir(dir);
}

#define FFFD "\xef\xbf\xbd"

/* Feeds the bytes of s one single-byte id at a time (rank = byte in the tiny vocab);
 * returns the last state. */
static int feed_bytes(k3_detok_t *d, const char *s, k3_tok_str_t *out) {
  int st = 0;
  for (size_t i = 0; s[i]; i++) st = k3_detok_feed(d, (uint8_t)s[i], out);
  return st;
}

START_TEST(test_multibyte_split_across_tokens) {
  k3_detok_t *d;
  ck_assert_int_eq(k3_detok_init(tok, NULL, &d), 0);
  k3_tok_str_t out = {0};
  ck_assert_int_eq(k3_detok_feed(d, 0xE4, &out), K3_DETOK_RUNNING);
  ck_assert_int_eq(k3_detok_feed(d, 0xB8, &out), K3_DETOK_RUNNING);
  ck_assert_uint_eq(out.len, 0); /* nothing until the character is complete */
  ck_assert_int_eq(k3_detok_feed(d, 0xAD, &out), K3_DETOK_RUNNING);
  ck_assert_str_eq(out.data, "中");
  /* 4-byte emoji in two halves via a 2-byte feed then singles */
  feed_bytes(d, "\xf0\x9f", &out);
  ck_assert_str_eq(out.data, "中");
  feed_bytes(d, "\x98\x80", &out);
  ck_assert_str_eq(out.data, "中\xf0\x9f\x98\x80");
  /* ill-formed: a stray continuation byte, a lead followed by ASCII, a truncated tail */
  feed_bytes(d, "\xff" "a\xe4" "b\xe4\xb8", &out);
  ck_assert_str_eq(out.data, "中\xf0\x9f\x98\x80" FFFD "a" FFFD "b");
  ck_assert_int_eq(k3_detok_finish(d, &out), K3_DETOK_FINISHED);
  ck_assert_str_eq(out.data, "中\xf0\x9f\x98\x80" FFFD "a" FFFD "b" FFFD);
  ck_assert_int_eq(k3_detok_feed(d, 'x', &out), K3_DETOK_FINISHED);
  k3_detok_free(d);
  ck_assert_int_eq(k3_detok_init(tok, NULL, &d), 0);
  ck_assert_int_eq(k3_detok_feed(d, 99999, &out), K3_ERANGE);
  k3_detok_free(d);
  free(out.data);
}
END_TEST

START_TEST(test_stop_ids) {
  k3_detok_t *d;
  ck_assert_int_eq(k3_detok_init(tok, NULL, &d), 0);
  k3_tok_str_t out = {0};
  feed_bytes(d, "Hi \xe4\xb8", &out);
  ck_assert_str_eq(out.data, "Hi ");
  /* <|end_of_msg|> (3842): its text is not emitted, the held partial becomes U+FFFD */
  ck_assert_int_eq(k3_detok_feed(d, 3842, &out), K3_DETOK_STOP_ID);
  ck_assert_str_eq(out.data, "Hi " FFFD);
  ck_assert_int_eq(k3_detok_stop_index(d), 1);
  ck_assert_int_eq(k3_detok_feed(d, 'x', &out), K3_DETOK_STOP_ID);
  ck_assert_int_eq(k3_detok_finish(d, &out), K3_DETOK_STOP_ID);
  ck_assert_str_eq(out.data, "Hi " FFFD);
  k3_detok_free(d);
  /* [EOS] 3841 stops too */
  ck_assert_int_eq(k3_detok_init(tok, NULL, &d), 0);
  ck_assert_int_eq(k3_detok_feed(d, 3841, &out), K3_DETOK_STOP_ID);
  ck_assert_int_eq(k3_detok_stop_index(d), 0);
  k3_detok_free(d);
  /* no stop ids: specials are text, or skipped when asked (but not <|open|>) */
  k3_detok_opts_t o = {.stop_ids = (const int32_t[]){0}, .n_stop_ids = 0};
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  out.len = 0;
  k3_detok_feed(d, 3841, &out);
  ck_assert_str_eq(out.data, "[EOS]");
  k3_detok_free(d);
  o.skip_special = true;
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  out.len = 0;
  out.data[0] = '\0';
  k3_detok_feed(d, 3841, &out);
  k3_detok_feed(d, 3843, &out);
  ck_assert_str_eq(out.data, "<|open|>");
  k3_detok_free(d);
  free(out.data);
}
END_TEST

START_TEST(test_stop_strings_across_tokens) {
  const char *stops[] = {"END", "abcd", "bcx", "中文"};
  k3_detok_opts_t o = {.stop_strs = stops, .n_stop_strs = 4};
  k3_detok_t *d;
  k3_tok_str_t out = {0};
  /* "xEN" holds "EN"; "D" completes the stop: only "x" is emitted */
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  feed_bytes(d, "xEN", &out);
  ck_assert_str_eq(out.data, "x");
  ck_assert_int_eq(feed_bytes(d, "Dtail", &out), K3_DETOK_STOP_STR);
  ck_assert_str_eq(out.data, "x");
  ck_assert_int_eq(k3_detok_stop_index(d), 0);
  k3_detok_free(d);
  /* a held prefix that does not complete is released */
  out.len = 0;
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  feed_bytes(d, "ENx", &out);
  ck_assert_str_eq(out.data, "ENx");
  k3_detok_free(d);
  /* longest suffix held: "zab" holds "ab"; "c" holds "abc" (prefix of abcd) ; "x" → "bcx" */
  out.len = 0;
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  feed_bytes(d, "zab", &out);
  ck_assert_str_eq(out.data, "z");
  feed_bytes(d, "c", &out);
  ck_assert_str_eq(out.data, "z");
  ck_assert_int_eq(feed_bytes(d, "x", &out), K3_DETOK_STOP_STR);
  ck_assert_str_eq(out.data, "za");
  ck_assert_int_eq(k3_detok_stop_index(d), 2);
  k3_detok_free(d);
  /* multi-byte stop string fed byte by byte */
  out.len = 0;
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  ck_assert_int_eq(feed_bytes(d, "好中文好", &out), K3_DETOK_STOP_STR);
  ck_assert_str_eq(out.data, "好");
  k3_detok_free(d);
  /* a stop string spanning BPE tokens of real text */
  out.len = 0;
  const char *s2[] = {"STOP"};
  k3_detok_opts_t o2 = {.stop_strs = s2, .n_stop_strs = 1};
  ck_assert_int_eq(k3_detok_init(tok, &o2, &d), 0);
  k3_tok_ids_t v = tt_enc(tok, "Hello world, the STOP is here");
  int st = 0;
  for (size_t i = 0; i < v.n && st == 0; i++) st = k3_detok_feed(d, v.ids[i], &out);
  ck_assert_int_eq(st, K3_DETOK_STOP_STR);
  ck_assert_str_eq(out.data, "Hello world, the ");
  k3_detok_free(d);
  /* a pending prefix at the end of the stream is flushed as text by finish */
  out.len = 0;
  ck_assert_int_eq(k3_detok_init(tok, &o, &d), 0);
  feed_bytes(d, "hi EN", &out);
  ck_assert_str_eq(out.data, "hi ");
  ck_assert_int_eq(k3_detok_finish(d, &out), K3_DETOK_FINISHED);
  ck_assert_str_eq(out.data, "hi EN");
  k3_detok_free(d);
  free(v.ids);
  free(out.data);
  const char *empty[] = {""};
  k3_detok_opts_t o3 = {.stop_strs = empty, .n_stop_strs = 1};
  ck_assert_int_eq(k3_detok_init(tok, &o3, &d), K3_EINVAL);
}
END_TEST

START_TEST(test_streaming_equals_decode) {
  srand(99);
  const char *parts[] = {"中文", "the ", "模型", "😀", "é", "\n", "ab", "—", "123", " "};
  for (int it = 0; it < 300; it++) {
    char text[2048] = "";
    for (int k = rand() % 60; k > 0; k--) strcat(text, parts[rand() % 10]);
    k3_tok_ids_t v = tt_enc(tok, text);
    k3_detok_t *d;
    ck_assert_int_eq(k3_detok_init(tok, NULL, &d), 0);
    k3_tok_str_t out = {0};
    for (size_t i = 0; i < v.n; i++) {
      size_t before = out.len;
      k3_detok_feed(d, v.ids[i], &out);
      /* everything emitted so far is well-formed UTF-8 */
      if (k3_tok_utf8_valid_prefix(out.data ? out.data : "", out.len) != out.len) ck_abort_msg("partial UTF-8 emitted");
      (void)before;
    }
    k3_detok_finish(d, &out);
    if (strcmp(out.data, text) != 0) ck_abort_msg("stream != text at %d", it);
    k3_detok_free(d);
    free(out.data);
    free(v.ids);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("tok_detok");
  TCase *tc = tcase_create("detok");
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_multibyte_split_across_tokens);
  tcase_add_test(tc, test_stop_ids);
  tcase_add_test(tc, test_stop_strings_across_tokens);
  tcase_add_test(tc, test_streaming_equals_decode);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
