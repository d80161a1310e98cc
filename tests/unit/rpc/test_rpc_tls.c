/* k3_rpc mutual TLS (rpc_tls.h): the identity rules, the development CA, certificate files, and
 * a server with a mutual-TLS port and a plaintext port driven by clients holding the right
 * certificate, a certificate of another CA, none, or a certificate of the wrong identity. Also
 * the channel-forget fix: a call in flight on a forgotten channel ends with its real status,
 * never UNKNOWN "Channel Destroyed". Each test runs in a forked Check child (grpc_init there). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "k3pd/err.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/rpc_tls.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"

static char root[64], dir_a[256], dir_b[256];

static void make_dirs(void) {
  snprintf(root, sizeof root, "/tmp/k3pd-tls-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
  snprintf(dir_a, sizeof dir_a, "%s/ca", root);
  snprintf(dir_b, sizeof dir_b, "%s/other-ca", root);
}

/* Checked teardown (in the test's child): removes what make_dirs made. */
static void remove_dirs(void) {
  if (!root[0]) return;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  root[0] = 0;
}

START_TEST(test_identity_rules) {
  ck_assert(k3_rpc_tls_name_covers("decode-0", "decode-0"));
  ck_assert(k3_rpc_tls_name_covers("Decode-0", "decode-0"));
  ck_assert(!k3_rpc_tls_name_covers("decode-0", "decode-1"));
  ck_assert(!k3_rpc_tls_name_covers("decode-0", "decode-00"));
  ck_assert(k3_rpc_tls_name_covers("*.decode.k3pd", "pod-7.decode.k3pd"));
  ck_assert(!k3_rpc_tls_name_covers("*.decode.k3pd", "a.pod-7.decode.k3pd")); /* one label only */
  ck_assert(!k3_rpc_tls_name_covers("*.decode.k3pd", ".decode.k3pd"));
  ck_assert(!k3_rpc_tls_name_covers("*.decode.k3pd", "decode.k3pd"));
  ck_assert(!k3_rpc_tls_name_covers("*.decode.k3pd", "pod-7.prefill.k3pd"));
  ck_assert(!k3_rpc_tls_name_covers("", "x"));
  ck_assert(k3_rpc_tls_id_valid("prefill-127.0.0.1-5000"));
  ck_assert(k3_rpc_tls_id_valid("decode_0"));
  ck_assert(!k3_rpc_tls_id_valid("decode-127.0.0.1:5000"));
  ck_assert(!k3_rpc_tls_id_valid("-x"));
  ck_assert(!k3_rpc_tls_id_valid("x."));
  ck_assert(!k3_rpc_tls_id_valid("*.x"));
  ck_assert(!k3_rpc_tls_id_valid("a b"));
  ck_assert(!k3_rpc_tls_id_valid(""));
  char longid[200];
  memset(longid, 'a', sizeof longid - 1);
  longid[sizeof longid - 1] = 0;
  ck_assert(!k3_rpc_tls_id_valid(longid));
}
END_TEST

START_TEST(test_dev_ca) {
  make_dirs();
  char err[512];
  k3_rpc_tls_t *a, *b;
  ck_assert_int_eq(k3_rpc_tls_dev(dir_a, "decode-0", &a, err, sizeof err), 0);
  ck_assert_int_eq(k3_rpc_tls_dev(dir_a, "k3pd-router", &b, err, sizeof err), 0);
  /* one CA for both, two distinct leaves */
  ck_assert_str_eq(k3_rpc_tls_ca_pem(a), k3_rpc_tls_ca_pem(b));
  ck_assert_str_ne(k3_rpc_tls_cert_pem(a), k3_rpc_tls_cert_pem(b));
  const char *const *names;
  ck_assert_uint_eq(k3_rpc_tls_names(a, &names), 2);
  ck_assert_str_eq(names[0], "decode-0");
  ck_assert_str_eq(names[1], "localhost");
  ck_assert(k3_rpc_tls_covers(a, "decode-0") && !k3_rpc_tls_covers(a, "decode-1"));
  char id[128];
  ck_assert_int_eq(k3_rpc_tls_default_id(a, "host", id, sizeof id), 0);
  ck_assert_str_eq(id, "decode-0");
  struct stat st;
  ck_assert_int_eq(stat(dir_a, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0700);
  char kp[300];
  snprintf(kp, sizeof kp, "%s/ca.key", dir_a);
  ck_assert_int_eq(stat(kp, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0600);
  k3_rpc_tls_free(a);
  k3_rpc_tls_free(b);
  /* an invalid identity, a directory others can read */
  ck_assert_int_eq(k3_rpc_tls_dev(dir_a, "decode:0", &a, err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, "decode:0") != NULL);
  ck_assert_int_eq(chmod(dir_a, 0755), 0);
  ck_assert_int_eq(k3_rpc_tls_dev(dir_a, "decode-0", &a, err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, "--tls-dev-dir") && strstr(err, "0700"));
  ck_assert_int_eq(chmod(dir_a, 0700), 0);
}
END_TEST

START_TEST(test_files) {
  make_dirs();
  char err[512], pa[300], pb[300], c[310], k[310], ca[310], kb[310], cab[310];
  snprintf(pa, sizeof pa, "%s/alice", root);
  snprintf(pb, sizeof pb, "%s/bob", root);
  ck_assert_int_eq(k3_rpc_tls_dev_issue(dir_a, "alice", pa, err, sizeof err), 0);
  ck_assert_int_eq(k3_rpc_tls_dev_issue(dir_b, "bob", pb, err, sizeof err), 0);
  snprintf(c, sizeof c, "%s.crt", pa);
  snprintf(k, sizeof k, "%s.key", pa);
  snprintf(kb, sizeof kb, "%s.key", pb);
  snprintf(ca, sizeof ca, "%s/ca.crt", dir_a);
  snprintf(cab, sizeof cab, "%s/ca.crt", dir_b);
  k3_rpc_tls_t *t;
  ck_assert_int_eq(k3_rpc_tls_load(c, k, ca, &t, err, sizeof err), 0);
  ck_assert(k3_rpc_tls_covers(t, "alice"));
  k3_rpc_tls_free(t);
  ck_assert_int_eq(k3_rpc_tls_load(c, k, NULL, &t, err, sizeof err), 0); /* server-only */
  ck_assert_ptr_null(k3_rpc_tls_ca_pem(t));
  k3_rpc_tls_free(t);
  ck_assert_int_eq(k3_rpc_tls_load(c, kb, ca, &t, err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, "--tls-key") && strstr(err, "does not match"));
  ck_assert_int_eq(k3_rpc_tls_load(c, k, cab, &t, err, sizeof err), K3_EINVAL);
  ck_assert(strstr(err, "not valid under --tls-ca"));
  ck_assert_int_eq(k3_rpc_tls_load("/nonexistent.crt", k, ca, &t, err, sizeof err), K3_ENOENT);
  ck_assert(strstr(err, "--tls-cert /nonexistent.crt"));
  ck_assert_int_eq(k3_rpc_tls_load(ca, k, ca, &t, err, sizeof err), K3_EINVAL); /* CA cert, alice's key */
}
END_TEST

/* ---- a server with a mutual-TLS port and a plaintext port ---- */

typedef struct {
  uv_loop_t loop;
  uv_timer_t tick;
  k3_rpc_server_t *srv;
  k3_rpc_tls_t *srv_tls;
  char mtls[64], plain[64];
} sfx_t;

static sfx_t S;

static void noop_tick(uv_timer_t *t) { (void)t; }

static int run_until(volatile int *flag, int timeout_ms) {
  uint64_t end = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (!*flag && k3_now_ns() < end) uv_run(&S.loop, UV_RUN_ONCE);
  return *flag;
}

typedef struct {
  uv_timer_t t;
  k3_rpc_call_t *call;
} delayed_t;

static void delayed_closed(uv_handle_t *h) { free(h->data); }

static void reply_who(k3_rpc_call_t *call) {
  K3pd__V1__Reservation r = K3PD__V1__RESERVATION__INIT;
  const char *const *names;
  size_t n = k3_rpc_call_peer_names(call, &names);
  r.request_id = (char *)(n ? names[0] : "-");
  r.epoch = n;
  k3_rpc_call_reply(call, &r.base);
}

static void delayed_fire(uv_timer_t *t) {
  delayed_t *d = t->data;
  reply_who(d->call);
  uv_close((uv_handle_t *)&d->t, delayed_closed);
}

/* /k3test.T/Who: answers with the caller's first identity name; "delay" answers after 300 ms. */
static void who(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
  const K3pd__V1__ReserveRequest *r = (const void *)req;
  if (strcmp(r->request_id, "delay") == 0) {
    delayed_t *d = calloc(1, sizeof *d);
    d->call = call;
    uv_timer_init(&S.loop, &d->t);
    d->t.data = d;
    uv_timer_start(&d->t, delayed_fire, 300, 0);
    return;
  }
  reply_who(call);
}

static void server_up(const char *const *allowed, size_t n_allowed) {
  make_dirs();
  char err[512];
  memset(&S, 0, sizeof S);
  ck_assert_int_eq(uv_loop_init(&S.loop), 0);
  uv_timer_init(&S.loop, &S.tick);
  uv_timer_start(&S.tick, noop_tick, 5, 5);
  ck_assert_int_eq(k3_rpc_tls_dev(dir_a, "srv", &S.srv_tls, err, sizeof err), 0);
  k3_rpc_server_opts_t so = {.grace_ms = 300};
  ck_assert_int_eq(k3_rpc_server_init(&S.loop, &so, &S.srv), 0);
  ck_assert_int_eq(k3_rpc_server_add_method(S.srv, "/k3test.T/Who", K3_RPC_UNARY,
                                            &k3pd__v1__reserve_request__descriptor, who, NULL), 0);
  ck_assert_int_eq(k3_rpc_server_require_peer(S.srv, allowed, n_allowed), 0);
  int p1, p2;
  ck_assert_int_eq(k3_rpc_server_add_port(S.srv, "127.0.0.1:0", S.srv_tls, 1, &p1), 0);
  ck_assert_int_eq(k3_rpc_server_add_port(S.srv, "127.0.0.1:0", NULL, 0, &p2), 0);
  ck_assert_int_eq(k3_rpc_server_add_port(S.srv, "127.0.0.1:0", NULL, 1, NULL), K3_EINVAL); /* mutual, no CA */
  ck_assert_int_eq(k3_rpc_server_start(S.srv, NULL, NULL), 0);
  ck_assert_int_eq(k3_rpc_server_set_health(S.srv, "", K3_RPC_HEALTH_SERVING), 0);
  snprintf(S.mtls, sizeof S.mtls, "127.0.0.1:%d", p1);
  snprintf(S.plain, sizeof S.plain, "127.0.0.1:%d", p2);
}

static void set_flag(void *arg) { *(int *)arg = 1; }

static void server_down(void) {
  int done = 0;
  k3_rpc_server_shutdown(S.srv, set_flag, &done);
  ck_assert(run_until(&done, 10000));
  uv_close((uv_handle_t *)&S.tick, NULL);
  uv_run(&S.loop, UV_RUN_DEFAULT);
  ck_assert_int_eq(uv_loop_close(&S.loop), 0);
  k3_rpc_tls_free(S.srv_tls);
}

typedef struct {
  int done, code;
  char who[128], details[256];
} res_t;

static void on_who(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  res_t *r = arg;
  r->code = st->code;
  snprintf(r->details, sizeof r->details, "%s", st->details);
  if (resp) snprintf(r->who, sizeof r->who, "%s", ((const K3pd__V1__Reservation *)resp)->request_id);
  r->done = 1;
}

/* One call of Who on target through a fresh client holding `tls` (NULL: plaintext), expecting
 * the server name `peer`. Returns the status code; *r has the details. */
static int call_who(const char *target, const k3_rpc_tls_t *tls, const char *peer, const char *rid, int forget,
                    res_t *r) {
  k3_rpc_client_t *cli;
  k3_rpc_client_opts_t co = {.tls = tls, .peer_name = peer};
  ck_assert_int_eq(k3_rpc_client_init(&S.loop, &co, &cli), 0);
  K3pd__V1__ReserveRequest req = K3PD__V1__RESERVE_REQUEST__INIT;
  req.request_id = (char *)rid;
  k3_rpc_call_opts_t o = {.timeout_ms = 5000};
  ck_assert_int_eq(k3_rpc_unary(cli, target, "/k3test.T/Who", &req.base, &k3pd__v1__reservation__descriptor, &o,
                                on_who, r, NULL),
                   0);
  if (forget) ck_assert_int_eq(k3_rpc_client_forget(cli, target), 0);
  ck_assert(run_until(&r->done, 10000));
  int closed = 0;
  k3_rpc_client_close(cli, set_flag, &closed);
  ck_assert(run_until(&closed, 5000));
  return r->code;
}

static k3_rpc_tls_t *dev(const char *dir, const char *id) {
  char err[512];
  k3_rpc_tls_t *t;
  ck_assert_msg(k3_rpc_tls_dev(dir, id, &t, err, sizeof err) == 0, "%s", err);
  return t;
}

START_TEST(test_mutual_tls) {
  server_up(NULL, 0);
  k3_rpc_tls_t *alice = dev(dir_a, "alice"), *mallory = dev(dir_b, "alice");
  res_t r;
  /* the right CA and identity: served, and the handler sees who called */
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, alice, "srv", "x", 0, &r), K3_RPC_OK);
  ck_assert_str_eq(r.who, "alice");
  /* no client certificate (plaintext client on the TLS port): no handshake */
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, NULL, NULL, "x", 0, &r), K3_RPC_UNAVAILABLE);
  /* a certificate of another CA with the same name: refused at the handshake */
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, mallory, "srv", "x", 0, &r), K3_RPC_UNAVAILABLE);
  /* a client certificate of another CA, the client trusting the server's CA as well: the
   * server refuses it at the handshake */
  char err[512], pre[300], bundle[300], crt[310], key[310];
  snprintf(pre, sizeof pre, "%s/mallory", root);
  ck_assert_int_eq(k3_rpc_tls_dev_issue(dir_b, "alice", pre, err, sizeof err), 0);
  snprintf(bundle, sizeof bundle, "%s/both-cas.crt", root);
  char *pa, *pb;
  size_t la, lb;
  snprintf(crt, sizeof crt, "%s/ca.crt", dir_a);
  ck_assert_int_eq(k3_read_file(crt, &pa, &la), 0);
  snprintf(crt, sizeof crt, "%s/ca.crt", dir_b);
  ck_assert_int_eq(k3_read_file(crt, &pb, &lb), 0);
  FILE *f = fopen(bundle, "w");
  ck_assert_ptr_nonnull(f);
  fputs(pa, f);
  fputs(pb, f);
  fclose(f);
  free(pa);
  free(pb);
  snprintf(crt, sizeof crt, "%s.crt", pre);
  snprintf(key, sizeof key, "%s.key", pre);
  k3_rpc_tls_t *foreign;
  ck_assert_msg(k3_rpc_tls_load(crt, key, bundle, &foreign, err, sizeof err) == 0, "%s", err);
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, foreign, "srv", "x", 0, &r), K3_RPC_UNAVAILABLE);
  k3_rpc_tls_free(foreign);
  /* the server is not who the client expects: the client refuses it */
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, alice, "decode-0", "x", 0, &r), K3_RPC_UNAVAILABLE);
  /* the plaintext port serves health to anyone, but no other method */
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.plain, NULL, NULL, "x", 0, &r), K3_RPC_UNAUTHENTICATED);
  ck_assert_msg(strncmp(r.details, "peer: ", 6) == 0, "%s", r.details);
  /* a call in flight when its channel is forgotten ends with its real status */
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, alice, "srv", "delay", 1, &r), K3_RPC_OK);
  ck_assert_str_eq(r.who, "alice");
  k3_rpc_tls_free(alice);
  k3_rpc_tls_free(mallory);
  server_down();
}
END_TEST

typedef struct {
  int done, code, status;
} hres_t;

static void on_health(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp) {
  hres_t *h = arg;
  h->code = st->code;
  if (resp) h->status = ((const Grpc__Health__V1__HealthCheckResponse *)resp)->status;
  h->done = 1;
}

START_TEST(test_required_identity) {
  const char *allowed[] = {"k3pd-router"};
  server_up(allowed, 1);
  k3_rpc_tls_t *alice = dev(dir_a, "alice"), *router = dev(dir_a, "k3pd-router");
  res_t r;
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, alice, "srv", "x", 0, &r), K3_RPC_PERMISSION_DENIED);
  ck_assert_msg(strstr(r.details, "alice") && strstr(r.details, "k3pd-router"), "%s", r.details);
  memset(&r, 0, sizeof r);
  ck_assert_int_eq(call_who(S.mtls, router, "srv", "x", 0, &r), K3_RPC_OK);
  ck_assert_str_eq(r.who, "k3pd-router");
  /* health on the plaintext port (a Kubernetes probe) */
  k3_rpc_client_t *cli;
  ck_assert_int_eq(k3_rpc_client_init(&S.loop, NULL, &cli), 0);
  Grpc__Health__V1__HealthCheckRequest hq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hres_t h = {0};
  ck_assert_int_eq(k3_rpc_unary(cli, S.plain, "/grpc.health.v1.Health/Check", &hq.base,
                                &grpc__health__v1__health_check_response__descriptor, NULL, on_health, &h, NULL),
                   0);
  ck_assert(run_until(&h.done, 5000));
  ck_assert_int_eq(h.code, K3_RPC_OK);
  ck_assert_int_eq(h.status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  int closed = 0;
  k3_rpc_client_close(cli, set_flag, &closed);
  ck_assert(run_until(&closed, 5000));
  k3_rpc_tls_free(alice);
  k3_rpc_tls_free(router);
  server_down();
}
END_TEST

int main(void) {
  Suite *s = suite_create("rpc_tls");
  TCase *tc = tcase_create("tls");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, NULL, remove_dirs);
  tcase_add_test(tc, test_identity_rules);
  tcase_add_test(tc, test_dev_ca);
  tcase_add_test(tc, test_files);
  tcase_add_test(tc, test_mutual_tls);
  tcase_add_test(tc, test_required_identity);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
