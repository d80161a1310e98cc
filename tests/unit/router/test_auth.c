/* Router API keys (auth.c) and the public status rule (status.c): key file parsing with errors
 * naming the line, bearer parsing, unknown keys, per-key concurrency and token-bucket rate limits
 * driven by an explicit clock (no sleeping: the verdicts do not depend on the machine's speed),
 * and the mapping of every gRPC code to one of the codes documented for Generate. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "k3pd/err.h"
#include "k3pd/metrics_k3pd.h"
#include "rt.h"

static char path[64];

static void write_keys(const char *text) {
  snprintf(path, sizeof path, "/tmp/k3pd-keys-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static int load(const char *text, const rt_auth_limits_t *d, rt_auth_t **a, char *err, size_t cap) {
  write_keys(text);
  int rc = rt_auth_load(path, d, a, err, cap);
  unlink(path);
  return rc;
}

#define KA "aaaaaaaaaaaaaaaa-alice"
#define KB "bbbbbbbbbbbbbbbb-bob"
#define NS 1000000000ull

START_TEST(test_file_errors) {
  rt_auth_limits_t d = {0};
  rt_auth_t *a = NULL;
  char err[512];
  ck_assert_int_eq(load("# nothing\n\n", &d, &a, err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, "no keys"));
  ck_assert_int_eq(load("alice short\n", &d, &a, err, sizeof err), K3_EINVAL);
  ck_assert_msg(strstr(err, "line 1") && strstr(err, "16..512"), "%s", err);
  ck_assert_int_eq(load("# c\nalice " KA "\nbob " KA "\n", &d, &a, err, sizeof err), K3_EINVAL);
  ck_assert_msg(strstr(err, "repeats"), "%s", err);
  ck_assert_int_eq(load("alice " KA " rate=x\n", &d, &a, err, sizeof err), K3_EINVAL);
  ck_assert_msg(strstr(err, "rate=x"), "%s", err);
  ck_assert_int_eq(load("al!ce " KA "\n", &d, &a, err, sizeof err), K3_EINVAL);
  ck_assert_int_eq(load("alice " KA " colour=blue\n", &d, &a, err, sizeof err), K3_EINVAL);
  ck_assert_int_eq(rt_auth_load("/nonexistent/keys", &d, &a, err, sizeof err), K3_ENOENT);
  ck_assert(strstr(err, "--api-keys /nonexistent/keys"));
  ck_assert_int_eq(load("  alice " KA "  \r\n\n# x\nbob " KB " concurrency=3\n", &d, &a, err, sizeof err), 0);
  ck_assert_uint_eq(rt_auth_count(a), 2);
  rt_auth_free(a);
}
END_TEST

START_TEST(test_admit) {
  rt_auth_limits_t d = {0};
  rt_auth_t *a = NULL;
  char err[512], msg[256];
  ck_assert_int_eq(load("alice " KA " concurrency=1\nbob " KB " rate=0.5 burst=2\n", &d, &a, err, sizeof err), 0);
  rt_key_t *k, *k2;
  const char *why;
  /* missing, malformed, unknown */
  ck_assert_int_eq(rt_auth_admit(a, NULL, 1, &k, &why, msg, sizeof msg), K3_RPC_UNAUTHENTICATED);
  ck_assert_str_eq(why, K3PD_AUTH_MISSING_KEY);
  ck_assert(strncmp(msg, "authorization: ", 15) == 0);
  ck_assert_int_eq(rt_auth_admit(a, KA, 1, &k, &why, msg, sizeof msg), K3_RPC_UNAUTHENTICATED); /* no scheme */
  ck_assert_int_eq(rt_auth_admit(a, "Basic " KA, 1, &k, &why, msg, sizeof msg), K3_RPC_UNAUTHENTICATED);
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KA "x", 1, &k, &why, msg, sizeof msg), K3_RPC_UNAUTHENTICATED);
  ck_assert_str_eq(why, K3PD_AUTH_UNKNOWN_KEY);
  ck_assert(!strstr(msg, KA)); /* a key never appears in a message */
  /* alice: concurrency 1 */
  ck_assert_int_eq(rt_auth_admit(a, "bearer  " KA " ", 1, &k, &why, msg, sizeof msg), K3_RPC_OK);
  ck_assert_str_eq(rt_auth_key_name(k), "alice");
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KA, 2, &k2, &why, msg, sizeof msg), K3_RPC_RESOURCE_EXHAUSTED);
  ck_assert_str_eq(why, K3PD_AUTH_CONCURRENCY_LIMITED);
  ck_assert_ptr_null(k2);
  rt_auth_release(k);
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KA, 3, &k2, &why, msg, sizeof msg), K3_RPC_OK);
  rt_auth_release(k2);
  rt_auth_release(NULL);
  /* bob: 0.5/s, burst 2, on an explicit clock */
  uint64_t t = 100 * NS;
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(rt_auth_admit(a, "Bearer " KB, t, &k, &why, msg, sizeof msg), K3_RPC_OK);
    rt_auth_release(k);
  }
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KB, t, &k, &why, msg, sizeof msg), K3_RPC_RESOURCE_EXHAUSTED);
  ck_assert_str_eq(why, K3PD_AUTH_RATE_LIMITED);
  ck_assert_msg(strstr(msg, "bob") && strstr(msg, "rate"), "%s", msg);
  t += NS; /* half a token */
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KB, t, &k, &why, msg, sizeof msg), K3_RPC_RESOURCE_EXHAUSTED);
  t += NS + 1; /* one token */
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KB, t, &k, &why, msg, sizeof msg), K3_RPC_OK);
  rt_auth_release(k);
  t += 100 * NS; /* refills to the burst, never above */
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(rt_auth_admit(a, "Bearer " KB, t, &k, &why, msg, sizeof msg), K3_RPC_OK);
    rt_auth_release(k);
  }
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KB, t, &k, &why, msg, sizeof msg), K3_RPC_RESOURCE_EXHAUSTED);
  rt_auth_free(a);
  /* defaults from the flags apply to keys without options */
  rt_auth_limits_t d2 = {.concurrency = 1};
  ck_assert_int_eq(load("carol " KA "\n", &d2, &a, err, sizeof err), 0);
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KA, 1, &k, &why, msg, sizeof msg), K3_RPC_OK);
  ck_assert_int_eq(rt_auth_admit(a, "Bearer " KA, 1, &k2, &why, msg, sizeof msg), K3_RPC_RESOURCE_EXHAUSTED);
  rt_auth_release(k);
  rt_auth_free(a);
}
END_TEST

START_TEST(test_public_status) {
  const int documented[] = {K3_RPC_OK, K3_RPC_CANCELLED, K3_RPC_INVALID_ARGUMENT, K3_RPC_DEADLINE_EXCEEDED,
                            K3_RPC_ALREADY_EXISTS, K3_RPC_RESOURCE_EXHAUSTED, K3_RPC_INTERNAL, K3_RPC_UNAVAILABLE};
  for (int c = 0; c <= 20; c++) {
    char msg[128] = "decode worker d0: Channel Destroyed";
    k3_rpc_code_t out = rt_status_public((k3_rpc_code_t)c, msg, sizeof msg);
    int ok = 0, same = 0;
    for (size_t i = 0; i < sizeof documented / sizeof documented[0]; i++) {
      ok |= (int)out == documented[i];
      same |= c == documented[i];
    }
    ck_assert_msg(ok, "code %d -> %d is not documented for Generate", c, (int)out);
    if (same) ck_assert_int_eq((int)out, c);
    else ck_assert_msg(strstr(msg, "[worker status "), "%s", msg); /* the original is kept for the logs */
  }
  char msg[128] = "x";
  ck_assert_int_eq(rt_status_public(K3_RPC_UNKNOWN, msg, sizeof msg), K3_RPC_UNAVAILABLE);
  ck_assert_str_eq(msg, "x [worker status UNKNOWN]");
  ck_assert_int_eq(rt_status_public(K3_RPC_UNIMPLEMENTED, NULL, 0), K3_RPC_INTERNAL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("router_auth");
  TCase *tc = tcase_create("auth");
  tcase_add_test(tc, test_file_errors);
  tcase_add_test(tc, test_admit);
  tcase_add_test(tc, test_public_status);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
