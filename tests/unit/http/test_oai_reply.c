/* The OpenAI front's sink (router/oai_reply.c) fed with XTML the way the request path feeds it
 * (text pieces, then finish), without sockets: the tiny test model never writes a tool call, so
 * this is where the response shapes of reasoning, content and tool calls are checked.
 * rt_hreq_* are stubbed to capture what the sink writes. Checked: the whole chat.completion
 * (reasoning_content, content null with tool calls, tool_calls with ids and JSON arguments,
 * finish_reason tool_calls, usage), the streamed chunks (role first, reasoning / content /
 * tool-call deltas, a call's first delta with id, type, name and empty arguments, finish_reason
 * null until the last chunk, the usage chunk, [DONE]) and that streaming the same text in any
 * cut gives the same message as the whole response; malformed output becomes content. */
#include <check.h>
#include <stdio.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"

/* ---- stubs of the HTTP server side ---- */

static k3_tok_str_t g_stream, g_body;
static unsigned g_status;
static bool g_ended;

void rt_hreq_set_gen(rt_hreq_t *r, struct rt_req *q) {
  (void)r;
  (void)q;
}
void rt_hreq_stream_begin(rt_hreq_t *r) { (void)r; }
void rt_hreq_stream_write(rt_hreq_t *r, const char *s, size_t n) {
  (void)r;
  k3_tok_str_append(&g_stream, s, n);
}
void rt_hreq_stream_end(rt_hreq_t *r) {
  (void)r;
  g_ended = true;
}
void rt_hreq_reply(rt_hreq_t *r, unsigned status, const char *ctype, char *body, size_t len) {
  (void)r;
  (void)ctype;
  g_status = status;
  k3_tok_str_append(&g_body, body ? body : "", len);
  free(body);
}
void rt_hreq_error(rt_hreq_t *r, unsigned status, const char *type, const char *param, const char *code,
                   const char *fmt, ...) {
  (void)r;
  (void)type;
  (void)param;
  (void)code;
  (void)fmt;
  g_status = status;
}
const char *rt_http_fingerprint(const rt_hreq_t *r) {
  (void)r;
  return "fp_test";
}

/* ---- driving the sink ---- */

#define O(t) "<|open|>" t "<|sep|>"
#define C(t) "<|close|>" t "<|sep|>"

static const char TOOL_OUTPUT[] =
    "Let me check." C("think") O("response") "Checking the weather." C("response") O("tools")
    O("call tool=\"get_weather\" index=\"1\"") O("argument key=\"city\" type=\"string\"") "Paris \"FR\"" C("argument")
    O("argument key=\"days\" type=\"number\"") "3" C("argument") C("call")
    O("call tool=\"get_time\" index=\"2\"") C("call") C("tools") C("message");

typedef struct {
  rt_oai_t *o;
  rt_req_t q;
} run_t;

static void clear(void) {
  free(g_stream.data);
  free(g_body.data);
  memset(&g_stream, 0, sizeof g_stream);
  memset(&g_body, 0, sizeof g_body);
}

static void start(run_t *x, bool stream, bool usage) {
  clear();
  g_status = 0;
  g_ended = false;
  memset(&x->q, 0, sizeof x->q);
  x->o = calloc(1, sizeof *x->o);
  x->o->hr = (rt_hreq_t *)&x->q; /* never dereferenced by the stubs */
  x->o->chat = true;
  x->o->stream = stream;
  x->o->include_usage = usage;
  x->o->thinking = true;
  x->o->created = 1700000000;
  strcpy(x->o->id, "chatcmpl-test");
  strcpy(x->o->model, "tiny");
  rt_oai_init_parser(x->o);
}

/* Feeds text cut at the given offsets, one "token" per piece, then finishes. */
static void feed(run_t *x, const char *text, const size_t *cuts, size_t ncuts, int finish) {
  size_t at = 0, len = strlen(text);
  uint32_t id = 7;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t to = i < ncuts ? cuts[i] : len;
    x->q.completion_tokens++;
    rt_oai_sink.tokens(&x->q, x->o, &id, 1, text + at, to - at, NULL, 0);
    at = to;
  }
  x->q.n_prompt = 11;
  x->q.finish_reason = finish;
  rt_oai_sink.finish(&x->q, x->o, "", 0);
  rt_oai_free(x->o);
  k3_tok_str_append(&g_stream, "", 0);
  k3_tok_str_append(&g_body, "", 0);
}

/* The streamed chunks folded into the message a client would assemble. */
static json_t *fold(const char *sse, json_t **usage, const char **finish, int *n_chunks) {
  json_t *msg = json_object(), *calls = json_array();
  k3_tok_str_t content = {0}, reasoning = {0};
  *usage = NULL;
  *finish = NULL;
  *n_chunks = 0;
  const char *p = sse;
  bool first = true, done = false;
  while (*p) {
    ck_assert_msg(strncmp(p, "data: ", 6) == 0, "not an event: %.60s", p);
    const char *e = strstr(p, "\n\n");
    ck_assert_ptr_nonnull(e);
    if (strncmp(p + 6, "[DONE]", 6) == 0) {
      ck_assert_int_eq((int)(e - p), 12);
      done = true;
      ck_assert_str_eq(e + 2, "");
      break;
    }
    json_error_t je;
    json_t *c = json_loadb(p + 6, (size_t)(e - p - 6), 0, &je);
    ck_assert_msg(c != NULL, "chunk is not JSON: %s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(c, "object")), "chat.completion.chunk");
    json_t *ch = json_object_get(c, "choices");
    if (json_array_size(ch) == 0) {
      *usage = json_incref(json_object_get(c, "usage"));
    } else {
      json_t *c0 = json_array_get(ch, 0), *d = json_object_get(c0, "delta");
      ck_assert_msg(*finish == NULL, "a chunk after the finish_reason");
      if (json_is_string(json_object_get(c0, "finish_reason"))) {
        static char fr[32];
        snprintf(fr, sizeof fr, "%s", json_string_value(json_object_get(c0, "finish_reason")));
        *finish = fr;
        ck_assert_int_eq(json_object_size(d), 0);
      }
      if (first) {
        ck_assert_str_eq(json_string_value(json_object_get(d, "role")), "assistant");
        first = false;
      }
      const char *s;
      if ((s = json_string_value(json_object_get(d, "content")))) k3_tok_str_append(&content, s, strlen(s));
      if ((s = json_string_value(json_object_get(d, "reasoning_content")))) k3_tok_str_append(&reasoning, s, strlen(s));
      json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
      if (tc) {
        size_t idx = (size_t)json_integer_value(json_object_get(tc, "index"));
        json_t *fn = json_object_get(tc, "function");
        if (json_object_get(tc, "id")) { /* a call's first delta */
          ck_assert_int_eq(idx, json_array_size(calls));
          ck_assert_str_eq(json_string_value(json_object_get(tc, "type")), "function");
          ck_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "");
          json_t *call = json_pack("{s:O,s:{s:O,s:s}}", "id", json_object_get(tc, "id"), "function", "name",
                                   json_object_get(fn, "name"), "arguments", "");
          json_array_append_new(calls, call);
        } else {
          ck_assert_int_lt(idx, json_array_size(calls));
          json_t *f = json_object_get(json_array_get(calls, idx), "function");
          char *joined = NULL;
          ck_assert_int_gt(asprintf(&joined, "%s%s", json_string_value(json_object_get(f, "arguments")),
                                    json_string_value(json_object_get(fn, "arguments"))), 0);
          json_object_set_new(f, "arguments", json_string(joined));
          free(joined);
        }
      }
      (*n_chunks)++;
    }
    json_decref(c);
    p = e + 2;
  }
  ck_assert(done);
  json_object_set_new(msg, "content", json_stringn(content.data ? content.data : "", content.len));
  json_object_set_new(msg, "reasoning_content", json_stringn(reasoning.data ? reasoning.data : "", reasoning.len));
  json_object_set_new(msg, "tool_calls", calls);
  free(content.data);
  free(reasoning.data);
  return msg;
}

START_TEST(test_whole_tool_calls) {
  run_t x;
  start(&x, false, false);
  feed(&x, TOOL_OUTPUT, NULL, 0, K3PD__V1__FINISH_REASON__FINISH_REASON_STOP);
  ck_assert_uint_eq(g_status, 200);
  json_error_t je;
  json_t *r = json_loads(g_body.data, 0, &je);
  ck_assert_msg(r != NULL, "%s", je.text);
  ck_assert_str_eq(json_string_value(json_object_get(r, "object")), "chat.completion");
  json_t *c0 = json_array_get(json_object_get(r, "choices"), 0), *m = json_object_get(c0, "message");
  ck_assert_str_eq(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls");
  ck_assert_str_eq(json_string_value(json_object_get(m, "reasoning_content")), "Let me check.");
  ck_assert_str_eq(json_string_value(json_object_get(m, "content")), "Checking the weather.");
  json_t *calls = json_object_get(m, "tool_calls");
  ck_assert_int_eq(json_array_size(calls), 2);
  json_t *c = json_array_get(calls, 0), *fn = json_object_get(c, "function");
  ck_assert_int_eq(strncmp(json_string_value(json_object_get(c, "id")), "call_", 5), 0);
  ck_assert_str_ne(json_string_value(json_object_get(c, "id")),
                   json_string_value(json_object_get(json_array_get(calls, 1), "id")));
  ck_assert_str_eq(json_string_value(json_object_get(c, "type")), "function");
  ck_assert_str_eq(json_string_value(json_object_get(fn, "name")), "get_weather");
  json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, &je);
  ck_assert_msg(args != NULL, "arguments not JSON: %s", json_string_value(json_object_get(fn, "arguments")));
  ck_assert_str_eq(json_string_value(json_object_get(args, "city")), "Paris \"FR\"");
  ck_assert_int_eq(json_integer_value(json_object_get(args, "days")), 3);
  json_decref(args);
  ck_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(calls, 1), "function"),
                                                     "arguments")), "{}");
  json_t *u = json_object_get(r, "usage");
  ck_assert_int_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 11);
  ck_assert_int_eq(json_integer_value(json_object_get(u, "completion_tokens")), 1);
  ck_assert_int_eq(json_integer_value(json_object_get(u, "total_tokens")), 12);
  /* OpenAI's prefix-cache field: what the decode worker's cache held (none here) */
  ck_assert(json_is_integer(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")));
  ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 0);
  json_decref(r);
  clear();
}
END_TEST

START_TEST(test_content_null_and_length) {
  run_t x;
  start(&x, false, false);
  feed(&x, C("think") O("tools") O("call tool=\"f\" index=\"1\"") C("call") C("tools"), NULL, 0,
       K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH);
  json_t *r = json_loads(g_body.data, 0, NULL);
  json_t *c0 = json_array_get(json_object_get(r, "choices"), 0), *m = json_object_get(c0, "message");
  ck_assert(json_is_null(json_object_get(m, "content")));
  ck_assert(json_is_null(json_object_get(m, "reasoning_content")));
  ck_assert_str_eq(json_string_value(json_object_get(c0, "finish_reason")), "length");
  json_decref(r);
  clear();
}
END_TEST

START_TEST(test_stream_matches_whole) {
  run_t x;
  start(&x, false, false);
  feed(&x, TOOL_OUTPUT, NULL, 0, K3PD__V1__FINISH_REASON__FINISH_REASON_STOP);
  json_t *whole = json_loads(g_body.data, 0, NULL);
  json_t *wm = json_object_get(json_array_get(json_object_get(whole, "choices"), 0), "message");
  size_t len = strlen(TOOL_OUTPUT);
  for (size_t step = 1; step <= 23; step += 11) { /* pieces of 1, 12 and 23 bytes */
    size_t cuts[512], n = 0;
    for (size_t at = step; at < len && n < 512; at += step) cuts[n++] = at;
    start(&x, true, true);
    feed(&x, TOOL_OUTPUT, cuts, n, K3PD__V1__FINISH_REASON__FINISH_REASON_STOP);
    ck_assert(g_ended);
    json_t *usage;
    const char *finish;
    int nch;
    json_t *sm = fold(g_stream.data, &usage, &finish, &nch);
    ck_assert_str_eq(finish, "tool_calls");
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "completion_tokens")), (json_int_t)n + 1);
    ck_assert_str_eq(json_string_value(json_object_get(sm, "content")), json_string_value(json_object_get(wm, "content")));
    ck_assert_str_eq(json_string_value(json_object_get(sm, "reasoning_content")),
                     json_string_value(json_object_get(wm, "reasoning_content")));
    json_t *sc = json_object_get(sm, "tool_calls"), *wc = json_object_get(wm, "tool_calls");
    ck_assert_int_eq(json_array_size(sc), json_array_size(wc));
    for (size_t i = 0; i < json_array_size(sc); i++)
      ck_assert(json_equal(json_object_get(json_array_get(sc, i), "function"),
                           json_object_get(json_array_get(wc, i), "function")));
    json_decref(usage);
    json_decref(sm);
  }
  json_decref(whole);
  clear();
}
END_TEST

START_TEST(test_malformed_is_content) {
  run_t x;
  start(&x, false, false);
  feed(&x, "r" C("think") O("response") "a" O("bogus x=1") "b" O("call tool=\"x\"") "c", NULL, 0,
       K3PD__V1__FINISH_REASON__FINISH_REASON_STOP);
  json_t *r = json_loads(g_body.data, 0, NULL);
  json_t *c0 = json_array_get(json_object_get(r, "choices"), 0), *m = json_object_get(c0, "message");
  ck_assert_str_eq(json_string_value(json_object_get(m, "content")),
                   "a<|open|>bogus x=1<|sep|>b<|open|>call tool=\"x\"<|sep|>c");
  ck_assert(json_object_get(m, "tool_calls") == NULL);
  ck_assert_str_eq(json_string_value(json_object_get(c0, "finish_reason")), "stop");
  json_decref(r);
  clear();
}
END_TEST

int main(void) {
  Suite *s = suite_create("oai_reply");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_whole_tool_calls);
  tcase_add_test(tc, test_content_null_and_length);
  tcase_add_test(tc, test_stream_matches_whole);
  tcase_add_test(tc, test_malformed_is_content);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
