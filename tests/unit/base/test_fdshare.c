/* Unit tests for fdshare (k3pd/fdshare.h): a descriptor fetched from another process refers to
 * the same file (memfd written through one, read through the other), unknown objects, no
 * server, a server that never answers (bounded), malformed replies from a fake server, replace
 * and remove, stale / live / non-socket files at start, stop removes the socket, the uid check
 * (as root: a child that drops to nobody is refused), the boot id.
 * Cross-process cases fork BEFORE anything in the process starts a thread (the server thread
 * lives in the child). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/fdshare.h"

static char g_dir[256];

/* g_dir is made by main() before the runner forks, so every test and the clean-up see it. */
static void mkpath(char *out, size_t cap, const char *leaf) { snprintf(out, cap, "%s/%s", g_dir, leaf); }

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int mk_memfd(const char *text) {
  int fd = memfd_create("k3fs-test", MFD_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, 4096), 0);
  if (text) ck_assert_int_eq(pwrite(fd, text, strlen(text), 0), (ssize_t)strlen(text));
  return fd;
}

/* A bound (optionally listening) Unix socket at path; returns its fd. */
static int raw_socket(const char *path, bool do_listen) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(s, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
  if (do_listen) ck_assert_int_eq(listen(s, 4), 0);
  return s;
}

START_TEST(test_cross_process_memfd) {
  char path[300];
  mkpath(path, sizeof path, "xp.sock");
  int ready[2], done[2];
  ck_assert_int_eq(pipe(ready), 0);
  ck_assert_int_eq(pipe(done), 0);
  pid_t pid = fork(); /* nothing threaded yet in this process */
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* child: the owner. Serves a memfd holding "hello", waits, then checks the parent's write */
    int fd = mk_memfd("hello");
    k3_fdshare_t *s = NULL;
    if (k3_fdshare_start(path, &s) || k3_fdshare_add(s, "weights", fd, "meta!", 5)) _exit(10);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(11);
    if (read(done[0], &c, 1) != 1) _exit(12);
    char buf[6] = {0};
    if (pread(fd, buf, 5, 100) != 5 || memcmp(buf, "world", 5)) _exit(13);
    k3_fdshare_stop(s);
    close(fd);
    _exit(0);
  }
  char c;
  ck_assert_int_eq(read(ready[0], &c, 1), 1);
  int fd = -1;
  void *meta = NULL;
  size_t ml = 0;
  ck_assert_int_eq(k3_fdshare_fetch(path, "weights", 2000, &fd, &meta, &ml), 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_uint_eq(ml, 5);
  ck_assert_int_eq(memcmp(meta, "meta!", 5), 0);
  free(meta);
  ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  char buf[6] = {0};
  ck_assert_int_eq(pread(fd, buf, 5, 0), 5);
  ck_assert_str_eq(buf, "hello");
  ck_assert_int_eq(pwrite(fd, "world", 5, 100), 5);
  /* also through a mapping, the way device memory is used */
  char *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ck_assert_ptr_ne(m, MAP_FAILED);
  ck_assert_int_eq(memcmp(m + 100, "world", 5), 0);
  munmap(m, 4096);
  /* unknown object, same live server */
  int fd2 = -1;
  ck_assert_int_eq(k3_fdshare_fetch(path, "nope", 2000, &fd2, NULL, NULL), K3_ENOENT);
  ck_assert_int_eq(fd2, -1);
  ck_assert_int_eq(write(done[1], "d", 1), 1);
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  close(fd);
  /* the child's stop removed its socket */
  struct stat sb;
  ck_assert_int_ne(lstat(path, &sb), 0);
}
END_TEST

START_TEST(test_no_server) {
  char path[300];
  mkpath(path, sizeof path, "none.sock");
  int fd = -1;
  ck_assert_int_eq(k3_fdshare_fetch(path, "weights", 500, &fd, NULL, NULL), K3_ENOENT);
  /* a socket file nobody listens on (a dead process's) */
  int s = raw_socket(path, false);
  close(s);
  ck_assert_int_eq(k3_fdshare_fetch(path, "weights", 500, &fd, NULL, NULL), K3_ENOENT);
  unlink(path);
  ck_assert_int_eq(k3_fdshare_fetch(path, "", 500, &fd, NULL, NULL), K3_EINVAL);
}
END_TEST

START_TEST(test_never_answers) {
  char path[300];
  mkpath(path, sizeof path, "mute.sock");
  int s = raw_socket(path, true); /* listens, never accepts */
  int fd = -1;
  int64_t t0 = now_ms();
  ck_assert_int_eq(k3_fdshare_fetch(path, "weights", 300, &fd, NULL, NULL), K3_ETIMEDOUT);
  int64_t dt = now_ms() - t0;
  ck_assert_int_ge(dt, 250);
  ck_assert_int_lt(dt, 1500);
  close(s);
  unlink(path);
}
END_TEST

/* ---- a fake server answering one connection with fixed bytes (and maybe a descriptor) ---- */
typedef struct {
  int lfd;
  const uint8_t *rep;
  size_t len;
  int send_fd; /* -1: none */
} fake_t;

static void *fake_main(void *arg) {
  fake_t *f = arg;
  int c = accept(f->lfd, NULL, NULL);
  if (c < 0) return NULL;
  uint8_t req[128];
  (void)!read(c, req, sizeof req);
  struct iovec iov = {.iov_base = (void *)f->rep, .iov_len = f->len};
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int))];
  } cb;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (f->send_fd >= 0) {
    memset(&cb, 0, sizeof cb);
    m.msg_control = cb.b;
    m.msg_controllen = sizeof cb.b;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &f->send_fd, sizeof(int));
  }
  if (f->len) (void)!sendmsg(c, &m, MSG_NOSIGNAL);
  close(c);
  return NULL;
}

static int fetch_from_fake(const uint8_t *rep, size_t len, bool with_fd) {
  char path[300];
  mkpath(path, sizeof path, "fake.sock");
  unlink(path);
  fake_t f = {raw_socket(path, true), rep, len, with_fd ? mk_memfd(NULL) : -1};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, fake_main, &f), 0);
  int fd = -1;
  void *meta = NULL;
  int rc = k3_fdshare_fetch(path, "weights", 2000, &fd, &meta, NULL);
  pthread_join(th, NULL);
  if (!rc) {
    close(fd);
    free(meta);
  }
  if (f.send_fd >= 0) close(f.send_fd);
  close(f.lfd);
  unlink(path);
  return rc;
}

START_TEST(test_malformed_replies) {
  /* good header: "K3FS", version 1, status 0, meta length 0 */
  const uint8_t ok[12] = {'K', '3', 'F', 'S', 1, 0, 0, 0, 0, 0, 0, 0};
  ck_assert_int_eq(fetch_from_fake(ok, 12, true), 0); /* the fake itself is well formed */
  uint8_t b[12];
  memcpy(b, ok, 12);
  b[0] = 'X'; /* bad magic */
  ck_assert_int_eq(fetch_from_fake(b, 12, true), K3_EPROTO);
  memcpy(b, ok, 12);
  b[4] = 2; /* unknown version */
  ck_assert_int_eq(fetch_from_fake(b, 12, true), K3_EPROTO);
  ck_assert_int_eq(fetch_from_fake(ok, 12, false), K3_EPROTO); /* ok without a descriptor */
  ck_assert_int_eq(fetch_from_fake(ok, 7, true), K3_EPROTO);   /* truncated header, then EOF */
  ck_assert_int_eq(fetch_from_fake(ok, 0, false), K3_EPROTO);  /* closed unanswered */
  memcpy(b, ok, 12);
  b[6] = 9; /* unknown status */
  ck_assert_int_eq(fetch_from_fake(b, 12, true), K3_EPROTO);
  memcpy(b, ok, 12);
  b[10] = 1; /* meta length 65536 > K3_FDSHARE_META_MAX */
  ck_assert_int_eq(fetch_from_fake(b, 12, true), K3_EPROTO);
  memcpy(b, ok, 12);
  b[8] = 8; /* 8 bytes of meta announced, none sent */
  ck_assert_int_eq(fetch_from_fake(b, 12, true), K3_EPROTO);
  memcpy(b, ok, 12);
  b[6] = 1; /* "no such object" carrying a descriptor */
  ck_assert_int_eq(fetch_from_fake(b, 12, true), K3_EPROTO);
  ck_assert_int_eq(fetch_from_fake(b, 12, false), K3_ENOENT);
}
END_TEST

static ino_t ino_of(int fd) {
  struct stat st;
  ck_assert_int_eq(fstat(fd, &st), 0);
  return st.st_ino;
}

START_TEST(test_replace_remove_stop) {
  char path[300];
  mkpath(path, sizeof path, "rr.sock");
  k3_fdshare_t *s = NULL;
  ck_assert_int_eq(k3_fdshare_start(path, &s), 0);
  ck_assert_str_eq(k3_fdshare_path(s), path);
  struct stat st;
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert(S_ISSOCK(st.st_mode));
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  int a = mk_memfd("a"), b = mk_memfd("b");
  ck_assert_int_eq(k3_fdshare_add(s, "obj", a, "one", 3), 0);
  close(a); /* the server keeps its own duplicate */
  int fd = -1;
  void *meta = NULL;
  size_t ml = 0;
  ck_assert_int_eq(k3_fdshare_fetch(path, "obj", 2000, &fd, &meta, &ml), 0);
  ck_assert_uint_eq(ml, 3);
  ck_assert_int_eq(memcmp(meta, "one", 3), 0);
  free(meta);
  char c = 0;
  ck_assert_int_eq(pread(fd, &c, 1, 0), 1);
  ck_assert_int_eq(c, 'a');
  close(fd);
  /* replace: same name, another file and meta */
  ck_assert_int_eq(k3_fdshare_add(s, "obj", b, "second", 6), 0);
  ck_assert_int_eq(k3_fdshare_fetch(path, "obj", 2000, &fd, &meta, &ml), 0);
  ck_assert_uint_eq(ml, 6);
  ck_assert_int_eq(memcmp(meta, "second", 6), 0);
  free(meta);
  ck_assert_uint_eq(ino_of(fd), ino_of(b));
  close(fd);
  /* empty metadata */
  ck_assert_int_eq(k3_fdshare_add(s, "bare", b, NULL, 0), 0);
  meta = (void *)1;
  ck_assert_int_eq(k3_fdshare_fetch(path, "bare", 2000, &fd, &meta, &ml), 0);
  ck_assert_ptr_null(meta);
  ck_assert_uint_eq(ml, 0);
  close(fd);
  /* bad arguments change nothing */
  char longname[K3_FDSHARE_NAME_MAX + 2];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  ck_assert_int_eq(k3_fdshare_add(s, longname, b, NULL, 0), K3_EINVAL);
  ck_assert_int_eq(k3_fdshare_add(s, "", b, NULL, 0), K3_EINVAL);
  ck_assert_int_eq(k3_fdshare_add(s, "x", -1, NULL, 0), K3_EINVAL);
  ck_assert_int_eq(k3_fdshare_add(s, "x", b, "m", K3_FDSHARE_META_MAX + 1), K3_EINVAL);
  /* remove */
  k3_fdshare_remove(s, "obj");
  k3_fdshare_remove(s, "unknown"); /* no-op */
  ck_assert_int_eq(k3_fdshare_fetch(path, "obj", 2000, &fd, NULL, NULL), K3_ENOENT);
  ck_assert_int_eq(k3_fdshare_fetch(path, "bare", 2000, &fd, NULL, NULL), 0);
  close(fd);
  close(b);
  /* a second server on a live socket is refused */
  k3_fdshare_t *s2 = NULL;
  ck_assert_int_eq(k3_fdshare_start(path, &s2), K3_EEXIST);
  ck_assert_ptr_null(s2);
  /* stop is prompt and removes the socket */
  int64_t t0 = now_ms();
  k3_fdshare_stop(s);
  ck_assert_int_lt(now_ms() - t0, 500);
  ck_assert_int_ne(lstat(path, &st), 0);
  ck_assert_int_eq(k3_fdshare_fetch(path, "bare", 500, &fd, NULL, NULL), K3_ENOENT);
  k3_fdshare_stop(NULL);
}
END_TEST

START_TEST(test_start_files) {
  char path[300];
  mkpath(path, sizeof path, "stale.sock");
  /* a stale socket (bound by a process that is gone) is replaced */
  int raw = raw_socket(path, false);
  close(raw);
  k3_fdshare_t *s = NULL;
  ck_assert_int_eq(k3_fdshare_start(path, &s), 0);
  int m = mk_memfd("z");
  ck_assert_int_eq(k3_fdshare_add(s, "w", m, NULL, 0), 0);
  int fd = -1;
  ck_assert_int_eq(k3_fdshare_fetch(path, "w", 2000, &fd, NULL, NULL), 0);
  close(fd);
  close(m);
  k3_fdshare_stop(s);
  /* a live socket served by someone else (listening, not ours): K3_EEXIST, file untouched */
  raw = raw_socket(path, true);
  s = NULL;
  ck_assert_int_eq(k3_fdshare_start(path, &s), K3_EEXIST);
  struct stat st;
  ck_assert_int_eq(lstat(path, &st), 0);
  close(raw);
  unlink(path);
  /* a regular file is never replaced */
  int f = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ck_assert_int_ge(f, 0);
  close(f);
  ck_assert_int_eq(k3_fdshare_start(path, &s), K3_EEXIST);
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert(S_ISREG(st.st_mode));
  unlink(path);
  /* a path too long for sun_path */
  char lp[200];
  memset(lp, 'p', sizeof lp - 1);
  lp[0] = '/';
  lp[sizeof lp - 1] = 0;
  ck_assert_int_eq(k3_fdshare_start(lp, &s), K3_EINVAL);
}
END_TEST

START_TEST(test_other_uid_refused) {
  if (geteuid() != 0) return; /* needs root to become another user */
  char path[300];
  mkpath(path, sizeof path, "uid.sock");
  chmod(g_dir, 0755);
  int ready[2], done[2];
  ck_assert_int_eq(pipe(ready), 0);
  ck_assert_int_eq(pipe(done), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) { /* the server, as root */
    int fd = mk_memfd("secret");
    k3_fdshare_t *s = NULL;
    if (k3_fdshare_start(path, &s) || k3_fdshare_add(s, "w", fd, NULL, 0)) _exit(10);
    chmod(path, 0666); /* let the socket be reached: the uid check must still refuse */
    char c = 'r';
    if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) _exit(11);
    k3_fdshare_stop(s);
    _exit(0);
  }
  char c;
  ck_assert_int_eq(read(ready[0], &c, 1), 1);
  pid_t p2 = fork();
  ck_assert_int_ge(p2, 0);
  if (p2 == 0) {
    if (setgid(65534) || setuid(65534)) _exit(20);
    int fd = -1;
    int rc = k3_fdshare_fetch(path, "w", 1000, &fd, NULL, NULL);
    _exit(rc == K3_EPROTO ? 0 : 21 + (rc == 0));
  }
  int st = 0;
  ck_assert_int_eq(waitpid(p2, &st, 0), p2);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  ck_assert_int_eq(write(done[1], "d", 1), 1);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
}
END_TEST

START_TEST(test_boot_id) {
  uint8_t a[16], b[16];
  memset(a, 0, 16);
  ck_assert_int_eq(k3_host_boot_id(a), 0);
  ck_assert_int_eq(k3_host_boot_id(b), 0);
  ck_assert_int_eq(memcmp(a, b, 16), 0);
  static const uint8_t zero[16];
  ck_assert_int_ne(memcmp(a, zero, 16), 0);
}
END_TEST

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_dir, sizeof g_dir, "/tmp/k3fs-test-XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  Suite *s = suite_create("fdshare");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_cross_process_memfd);
  tcase_add_test(tc, test_no_server);
  tcase_add_test(tc, test_never_answers);
  tcase_add_test(tc, test_malformed_replies);
  tcase_add_test(tc, test_replace_remove_stop);
  tcase_add_test(tc, test_start_files);
  tcase_add_test(tc, test_other_uid_refused);
  tcase_add_test(tc, test_boot_id);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  static const char *leaves[] = {"xp.sock", "none.sock", "mute.sock", "fake.sock", "rr.sock", "stale.sock", "uid.sock"};
  for (size_t i = 0; i < sizeof leaves / sizeof leaves[0]; i++) {
    char p[300];
    mkpath(p, sizeof p, leaves[i]);
    unlink(p);
  }
  rmdir(g_dir);
  return failed ? 1 : 0;
}
