/* The shared-weights protocol of kernels/runner/share.c on the CPU (label `model`), with the
 * device parts replaced by host stand-ins defined here: k3k_vmm_* over a memfd (alloc = memfd +
 * read-write mapping, export = dup, import = read-only mapping of the received fd) and
 * k3k_device_uuid from $K3_TEST_GPU_UUID. Everything else is the real code: DIR creation,
 * flock with its deadline, the scan of the sockets in DIR with fdshare fetches, metadata matching,
 * re-export, stale-socket removal, teardown. The CUDA side of the same flow is
 * scripts/gpu/share.sh.
 *   - the first process makes the arena and serves it; a second process (forked) imports it:
 *     same bytes (written by the first), read-only, and serves it too;
 *   - the first killed with SIGKILL: the second's mapping still reads the bytes and a third
 *     imports from it, removing the dead socket;
 *   - other weights (identity), another layout, another GPU (skipped: a copy of its own);
 *   - the lock held elsewhere: K3_ETIMEDOUT within --share-wait-ms;
 *   - no fd is leaked on success or error paths; teardown removes the socket. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3k_xdev.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "runner_internal.h"

/* ---- host stand-ins for the device services share.c uses ---- */
struct k3k_vmm {
  int fd;       /* the memfd (owner) or -1 (import: the caller keeps its fd) */
  void *p;
  size_t size;
};

int k3k_vmm_alloc(k3k_backend_t *be, size_t bytes, k3k_vmm_t **out) {
  k3k_vmm_t *v = calloc(1, sizeof *v);
  v->size = (bytes + 4095) / 4096 * 4096;
  v->fd = memfd_create("k3-test-vmm", MFD_CLOEXEC);
  if (v->fd < 0 || ftruncate(v->fd, (off_t)v->size)) abort();
  v->p = mmap(NULL, v->size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
  if (v->p == MAP_FAILED) abort();
  *out = v;
  return 0;
}
int k3k_vmm_export(const k3k_vmm_t *v, int *fd) {
  *fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
  return *fd >= 0 ? 0 : K3_EDEVICE;
}
int k3k_vmm_import(k3k_backend_t *be, int fd, size_t bytes, bool writable, k3k_vmm_t **out) {
  k3k_vmm_t *v = calloc(1, sizeof *v);
  v->fd = -1;
  v->size = (bytes + 4095) / 4096 * 4096;
  v->p = mmap(NULL, v->size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (v->p == MAP_FAILED) {
    free(v);
    return K3_EINVAL;
  }
  *out = v;
  return 0;
}
void *k3k_vmm_ptr(const k3k_vmm_t *v) { return v->p; }
size_t k3k_vmm_size(const k3k_vmm_t *v) { return v->size; }
void k3k_vmm_free(k3k_vmm_t *v) {
  if (!v) return;
  munmap(v->p, v->size);
  if (v->fd >= 0) close(v->fd);
  free(v);
}
int k3k_device_uuid(k3k_backend_t *be, uint8_t uuid[16]) {
  const char *g = getenv("K3_TEST_GPU_UUID");
  memset(uuid, 0x11, 16);
  if (g) uuid[0] = (uint8_t)atoi(g);
  return 0;
}
void rn_seterr(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int fake_sync(k3k_backend_t *be) { return 0; }
static k3k_backend_t g_be = {.name = "fake-device", .synchronize = fake_sync};
static char g_dir[256];

/* A runner as share.c sees it: config, options, layout. */
static k3_runner_t *mk(uint64_t layout, size_t bytes, int wait_ms) {
  k3_runner_t *r = calloc(1, sizeof *r);
  const char *json = k3_model_config_preset("tiny");
  char err[256];
  ck_assert_int_eq(k3_model_config_parse(json, strlen(json), &r->cfg, err, sizeof err), 0);
  r->be = &g_be;
  r->opts.share_weights_dir = g_dir;
  r->opts.share_wait_ms = wait_ms;
  r->wa.on = true;
  r->wa.bytes = bytes;
  r->wl_hash = layout;
  return r;
}

static void drop(k3_runner_t *r) {
  rn_share_free(r);
  ck_assert_ptr_null(r->share);
  free(r);
}

static int count_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static int count_socks(void) {
  int n = 0;
  DIR *d = opendir(g_dir);
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d))) n += strstr(de->d_name, ".sock") != NULL;
  closedir(d);
  return n;
}

/* begin + (fill) + publish as runner.c does; returns begin's/publish's code */
static int share(k3_runner_t *r, const char *ident, char *err, size_t errlen) {
  int rc = rn_share_begin(r, ident, err, errlen);
  if (!rc && !r->wa.imported) memset(r->wa.base, 0x5A, r->wa.bytes);
  if (!rc) rc = rn_share_publish(r, err, errlen);
  return rc;
}

START_TEST(test_make_import_survive) {
  int to_parent[2], to_child[2];
  ck_assert_int_eq(pipe(to_parent), 0);
  ck_assert_int_eq(pipe(to_child), 0);
  pid_t a = fork(); /* A: the first holder, in a child (nothing threaded yet here) */
  ck_assert_int_ge(a, 0);
  if (a == 0) {
    k3_runner_t *r = mk(0x1234, 100000, 5000);
    char err[512];
    if (share(r, "synthetic seed=1", err, sizeof err) || r->wa.imported) _exit(10);
    char c = 'r';
    if (write(to_parent[1], &c, 1) != 1) _exit(11);
    pause(); /* killed by the parent */
    _exit(12);
  }
  char c;
  ck_assert_int_eq(read(to_parent[0], &c, 1), 1);
  ck_assert_int_eq(count_socks(), 1);
  int fds0 = count_fds();
  /* B: imports A's arena read-only, nothing to fill, serves it too */
  k3_runner_t *b = mk(0x1234, 100000, 5000);
  char err[512] = "";
  ck_assert_msg(share(b, "synthetic seed=1", err, sizeof err) == 0, "%s", err);
  ck_assert(b->wa.imported);
  ck_assert_uint_eq(((uint8_t *)b->wa.base)[0], 0x5A);
  ck_assert_uint_eq(((uint8_t *)b->wa.base)[99999], 0x5A);
  ck_assert_int_eq(count_socks(), 2);
  /* A dies without cleaning up: B's mapping still reads, C imports from B, A's socket goes */
  kill(a, SIGKILL);
  int st;
  waitpid(a, &st, 0);
  ck_assert_uint_eq(((uint8_t *)b->wa.base)[4096], 0x5A);
  k3_runner_t *c3 = mk(0x1234, 100000, 5000);
  ck_assert_msg(share(c3, "synthetic seed=1", err, sizeof err) == 0, "%s", err);
  ck_assert(c3->wa.imported);
  ck_assert_uint_eq(((uint8_t *)c3->wa.base)[77], 0x5A);
  ck_assert_int_eq(count_socks(), 2); /* B's and C's; A's removed */
  drop(c3);
  ck_assert_int_eq(count_socks(), 1);
  /* other weights in the same directory: refused, both identities named, nothing leaked */
  k3_runner_t *d = mk(0x1234, 100000, 5000);
  ck_assert_int_eq(share(d, "synthetic seed=2", err, sizeof err), K3_EFINGERPRINT);
  ck_assert_msg(strstr(err, "shares other weights") && strstr(err, "synthetic seed=1") &&
                strstr(err, "synthetic seed=2"), "%s", err);
  drop(d);
  /* the same weights in another layout: refused */
  k3_runner_t *e = mk(0x9999, 100000, 5000);
  ck_assert_int_eq(share(e, "synthetic seed=1", err, sizeof err), K3_EFINGERPRINT);
  ck_assert_msg(strstr(err, "another layout"), "%s", err);
  drop(e);
  /* another GPU: B is skipped, a copy of its own is made and served */
  setenv("K3_TEST_GPU_UUID", "7", 1);
  k3_runner_t *g = mk(0x1234, 100000, 5000);
  ck_assert_msg(share(g, "synthetic seed=1", err, sizeof err) == 0, "%s", err);
  ck_assert(!g->wa.imported);
  ck_assert_int_eq(count_socks(), 2);
  drop(g);
  unsetenv("K3_TEST_GPU_UUID");
  drop(b);
  ck_assert_int_eq(count_socks(), 0);
  ck_assert_int_eq(count_fds(), fds0); /* every server, fd, mapping and lock released */
  close(to_parent[0]), close(to_parent[1]), close(to_child[0]), close(to_child[1]);
}
END_TEST

START_TEST(test_lock_deadline) {
  int ready[2];
  ck_assert_int_eq(pipe(ready), 0);
  mkdir(g_dir, 0700);
  pid_t h = fork();
  ck_assert_int_ge(h, 0);
  if (h == 0) { /* someone loading for a long time */
    char p[300];
    snprintf(p, sizeof p, "%s/.lock", g_dir);
    int fd = open(p, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || flock(fd, LOCK_EX)) _exit(1);
    if (write(ready[1], "r", 1) != 1) _exit(2);
    sleep(30);
    _exit(0);
  }
  char c;
  ck_assert_int_eq(read(ready[0], &c, 1), 1);
  int fds0 = count_fds();
  k3_runner_t *r = mk(1, 4096, 300);
  char err[512];
  uint64_t t0 = k3_now_ns();
  ck_assert_int_eq(share(r, "x", err, sizeof err), K3_ETIMEDOUT);
  uint64_t ms = (k3_now_ns() - t0) / 1000000;
  ck_assert_uint_ge(ms, 250);
  ck_assert_uint_lt(ms, 3000);
  ck_assert_msg(strstr(err, "--share-wait-ms"), "%s", err);
  drop(r);
  ck_assert_int_eq(count_fds(), fds0);
  kill(h, SIGKILL);
  waitpid(h, NULL, 0);
  /* the holder died: its flock went with it */
  r = mk(1, 4096, 300);
  ck_assert_msg(share(r, "x", err, sizeof err) == 0, "%s", err);
  drop(r);
  close(ready[0]), close(ready[1]);
}
END_TEST

START_TEST(test_bad_dirs) {
  k3_runner_t *r = mk(1, 4096, 300);
  char err[512], longdir[200];
  memset(longdir, 'd', sizeof longdir - 1);
  longdir[0] = '/';
  longdir[sizeof longdir - 1] = 0;
  r->opts.share_weights_dir = longdir;
  ck_assert_int_eq(share(r, "x", err, sizeof err), K3_EINVAL);
  ck_assert_msg(strstr(err, "too long"), "%s", err);
  drop(r);
  r = mk(1, 4096, 300);
  r->opts.share_weights_dir = "/proc/k3-no-such-parent/share";
  ck_assert_int_ne(share(r, "x", err, sizeof err), 0);
  ck_assert_msg(strstr(err, "--share-weights /proc/k3-no-such-parent/share"), "%s", err);
  drop(r);
}
END_TEST

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_dir, sizeof g_dir, "/tmp/k3share-test-%ld", (long)getpid()); /* created by share.c */
  Suite *s = suite_create("share");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_make_import_survive);
  tcase_add_test(tc, test_lock_deadline);
  tcase_add_test(tc, test_bad_dirs);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd)) failed++;
  return failed ? 1 : 0;
}
