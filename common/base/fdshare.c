/* fdshare: a Unix-socket server per process that hands named file descriptors (SCM_RIGHTS) to
 * processes of the same user on this host, and the matching client (k3pd/fdshare.h).
 *
 * What it is for: CUDA VMM shareable handles (shared weights, the decode worker's state arena)
 * can cross a process boundary only as file descriptors, and a descriptor crosses only through
 * a Unix socket. What it is not: a general IPC layer or a transport (one request, one reply).
 *
 * Server: one thread polls the listening socket and a wake-up pipe (stop is immediate, not a
 * timeout); a connection is served inline with a short deadline per connection (1 s), so a
 * client that connects and never speaks delays the others by at most that and never blocks
 * stop for longer. Objects are kept in a small array under `mu` (add/remove/lookup from any
 * thread); the server sends a DUPLICATE of its own fd while holding the lock, so a concurrent
 * replace or remove never closes an fd that is being sent.
 * Security: the socket is bound, chmod 0600, then listened on (nobody can connect before the
 * mode is set: a connect to a bound, non-listening socket is refused); each accepted peer's
 * SO_PEERCRED uid must be ours or 0, else the connection is closed unanswered.
 * Client: non-blocking connect + poll, every step bounded by one deadline (CLOCK_MONOTONIC).
 * Invariants: every fd this file opens is CLOEXEC and closed on every path; "on error nothing
 * changed" for add (the old object stays). */
#include "k3pd/fdshare.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"

#define FS_MAGIC "K3FS"
#define FS_VERSION 1
#define FS_REQ_HDR 8  /* magic, u16 version, u16 name length */
#define FS_REP_HDR 12 /* magic, u16 version, u16 status, u32 meta length */
#define FS_CONN_MS 1000 /* the server's deadline for one connection */

typedef struct {
  char name[K3_FDSHARE_NAME_MAX + 1];
  int fd;
  uint8_t *meta;
  size_t meta_len;
} fs_obj_t;

struct k3_fdshare {
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  int lfd;            /* listening socket */
  int wake[2];        /* stop pipe: the thread polls wake[0] */
  pthread_t th;
  pthread_mutex_t mu; /* guards objs / n / cap */
  fs_obj_t *objs;
  size_t n, cap;
};

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(int64_t deadline) {
  int64_t l = deadline - mono_ms();
  return l < 0 ? 0 : l > 1 << 30 ? 1 << 30 : (int)l;
}

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int fill_addr(const char *path, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof sa->sun_path) return K3_EINVAL;
  memcpy(sa->sun_path, path, n + 1);
  return 0;
}

/* Waits until fd is readable (POLLIN) or writable (POLLOUT) before the deadline: 0, K3_ETIMEDOUT
 * or K3_EIO. */
static int wait_fd(int fd, short ev, int64_t deadline) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = ev};
    int r = poll(&p, 1, left_ms(deadline));
    if (r > 0) return 0;
    if (r == 0) return K3_ETIMEDOUT;
    if (errno != EINTR) return K3_EIO;
  }
}

/* Writes all of buf (with fd attached to the first byte when fd >= 0) before the deadline. */
static int send_all(int s, const uint8_t *buf, size_t len, int fd, int64_t deadline) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {.iov_base = (void *)(buf + off), .iov_len = len - off};
    union {
      struct cmsghdr h;
      char b[CMSG_SPACE(sizeof(int))];
    } cb;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0 && off == 0) {
      memset(&cb, 0, sizeof cb);
      m.msg_control = cb.b;
      m.msg_controllen = sizeof cb.b;
      struct cmsghdr *c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    ssize_t w = sendmsg(s, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_fd(s, POLLOUT, deadline);
      if (rc) return rc;
      continue;
    }
    /* the peer closed the connection unanswered (e.g. it refused our uid) */
    return errno == EPIPE || errno == ECONNRESET ? K3_EPROTO : K3_EIO;
  }
  return 0;
}

/* Reads exactly len bytes before the deadline. Descriptors that arrive with them go to
 * fds[*nfds..max) (any beyond max are closed and counted in *nfds). 0, K3_ETIMEDOUT, K3_EPROTO
 * (EOF or reset first), K3_EIO. */
static int recv_all(int s, uint8_t *buf, size_t len, int *fds, int *nfds, int max, int64_t deadline) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {.iov_base = buf + off, .iov_len = len - off};
    union {
      struct cmsghdr h;
      char b[CMSG_SPACE(4 * sizeof(int))];
    } cb;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
    ssize_t r = recvmsg(s, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_fd(s, POLLIN, deadline);
      if (rc) return rc;
      continue;
    }
    if (r < 0) return errno == ECONNRESET ? K3_EPROTO : K3_EIO; /* reset = closed unanswered */
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (fds && *nfds < max)
          fds[*nfds] = fd;
        else
          close(fd);
        if (nfds) (*nfds)++;
      }
    }
    if (r == 0) return K3_EPROTO;
    off += (size_t)r;
  }
  return 0;
}

/* ---- server ---------------------------------------------------------------------------- */

static fs_obj_t *find_locked(k3_fdshare_t *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (!strcmp(s->objs[i].name, name)) return &s->objs[i];
  return NULL;
}

static bool peer_allowed(int c) {
  struct ucred cr;
  socklen_t l = sizeof cr;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &l) || l != sizeof cr) return false;
  return cr.uid == geteuid() || cr.uid == 0;
}

/* One connection: request in, reply out (with the object's fd), within FS_CONN_MS. */
static void serve_conn(k3_fdshare_t *s, int c) {
  if (!peer_allowed(c)) {
    K3_WARN("fdshare %s: connection from another user refused", s->path);
    return;
  }
  int64_t deadline = mono_ms() + FS_CONN_MS;
  uint8_t hdr[FS_REQ_HDR];
  char name[K3_FDSHARE_NAME_MAX + 1];
  int nf = 0;
  if (recv_all(c, hdr, sizeof hdr, NULL, &nf, 0, deadline)) return;
  uint16_t nl = get16(hdr + 6);
  if (memcmp(hdr, FS_MAGIC, 4) || get16(hdr + 4) != FS_VERSION || nl == 0 || nl > K3_FDSHARE_NAME_MAX) {
    K3_WARN("fdshare %s: malformed request dropped", s->path);
    return;
  }
  if (recv_all(c, (uint8_t *)name, nl, NULL, &nf, 0, deadline)) return;
  name[nl] = 0;
  uint8_t *rep = NULL;
  size_t rl = FS_REP_HDR;
  int fd = -1;
  pthread_mutex_lock(&s->mu);
  fs_obj_t *o = memchr(name, 0, nl) ? NULL : find_locked(s, name);
  if (o && (fd = fcntl(o->fd, F_DUPFD_CLOEXEC, 0)) >= 0) rl += o->meta_len;
  rep = malloc(rl);
  if (rep) {
    memcpy(rep, FS_MAGIC, 4);
    put16(rep + 4, FS_VERSION);
    put16(rep + 6, fd >= 0 ? 0 : 1);
    put32(rep + 8, fd >= 0 ? (uint32_t)o->meta_len : 0);
    if (fd >= 0 && o->meta_len) memcpy(rep + FS_REP_HDR, o->meta, o->meta_len);
  }
  pthread_mutex_unlock(&s->mu);
  if (rep && send_all(c, rep, rl, fd, deadline))
    K3_DEBUG("fdshare %s: reply for '%s' not delivered", s->path, name);
  free(rep);
  if (fd >= 0) close(fd);
}

static void *server_main(void *arg) {
  k3_fdshare_t *s = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = s->lfd, .events = POLLIN}, {.fd = s->wake[0], .events = POLLIN}};
    int r = poll(p, 2, 1000);
    if (r < 0 && errno != EINTR) {
      K3_ERROR("fdshare %s: poll: %s", s->path, strerror(errno));
      return NULL;
    }
    if (p[1].revents) return NULL; /* stop */
    if (r <= 0 || !(p[0].revents & POLLIN)) continue;
    int c = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue; /* EAGAIN, ECONNABORTED, EMFILE: try again on the next wake-up */
    serve_conn(s, c);
    close(c);
  }
}

/* 1 when a server accepts connections at path, 0 when nobody does (ECONNREFUSED), < 0 else. */
static int probe_live(const struct sockaddr_un *sa) {
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0) return K3_EIO;
  int r = connect(c, (const struct sockaddr *)sa, sizeof *sa);
  int e = errno;
  close(c);
  if (r == 0) return 1;
  if (e == ECONNREFUSED || e == ENOENT) return 0;
  return K3_EIO;
}

int k3_fdshare_start(const char *path, k3_fdshare_t **out) {
  if (!path || !out) return K3_EINVAL;
  struct sockaddr_un sa;
  if (fill_addr(path, &sa)) {
    K3_ERROR("fdshare: socket path '%s' is empty or longer than %zu bytes", path, sizeof sa.sun_path - 1);
    return K3_EINVAL;
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      K3_ERROR("fdshare: %s exists and is not a socket", path);
      return K3_EEXIST;
    }
    int live = probe_live(&sa);
    if (live == 1) {
      K3_ERROR("fdshare: %s is served by a live process", path);
      return K3_EEXIST;
    }
    if (live < 0 || (unlink(path) && errno != ENOENT)) {
      K3_ERROR("fdshare: cannot replace the stale socket %s: %s", path, strerror(errno));
      return K3_EIO;
    }
  }
  k3_fdshare_t *s = calloc(1, sizeof *s);
  if (!s) return K3_ENOMEM;
  memcpy(s->path, sa.sun_path, sizeof s->path);
  s->lfd = s->wake[0] = s->wake[1] = -1;
  int rc = K3_EIO;
  const char *what = "socket";
  s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->lfd < 0) goto fail;
  what = "bind";
  if (bind(s->lfd, (struct sockaddr *)&sa, sizeof sa)) {
    if (errno == EADDRINUSE) rc = K3_EEXIST; /* another process bound it since the probe */
    goto fail;
  }
  what = "chmod";
  if (chmod(path, 0600)) goto fail_unlink;
  what = "listen";
  if (listen(s->lfd, 16)) goto fail_unlink;
  what = "pipe";
  if (pipe2(s->wake, O_CLOEXEC)) goto fail_unlink;
  what = "pthread_mutex_init";
  if (pthread_mutex_init(&s->mu, NULL)) goto fail_unlink;
  what = "pthread_create";
  if (pthread_create(&s->th, NULL, server_main, s)) {
    pthread_mutex_destroy(&s->mu);
    goto fail_unlink;
  }
  *out = s;
  return 0;
fail_unlink:
  unlink(path);
fail:
  K3_ERROR("fdshare: %s %s: %s", what, path, strerror(errno));
  if (s->lfd >= 0) close(s->lfd);
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  free(s);
  return rc;
}

int k3_fdshare_add(k3_fdshare_t *s, const char *name, int fd, const void *meta, size_t meta_len) {
  if (!s || !name || fd < 0 || meta_len > K3_FDSHARE_META_MAX || (meta_len && !meta)) return K3_EINVAL;
  size_t nl = strlen(name);
  if (nl == 0 || nl > K3_FDSHARE_NAME_MAX) return K3_EINVAL;
  uint8_t *m = NULL;
  if (meta_len && !(m = malloc(meta_len))) return K3_ENOMEM;
  if (meta_len) memcpy(m, meta, meta_len);
  int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) {
    K3_ERROR("fdshare %s: cannot duplicate fd %d: %s", s->path, fd, strerror(errno));
    free(m);
    return K3_EIO;
  }
  pthread_mutex_lock(&s->mu);
  fs_obj_t *o = find_locked(s, name);
  if (!o && s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 4;
    fs_obj_t *p = realloc(s->objs, cap * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&s->mu);
      close(dup);
      free(m);
      return K3_ENOMEM;
    }
    s->objs = p;
    s->cap = cap;
  }
  if (o) {
    close(o->fd);
    free(o->meta);
  } else {
    o = &s->objs[s->n++];
    memcpy(o->name, name, nl + 1);
  }
  o->fd = dup;
  o->meta = m;
  o->meta_len = meta_len;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void k3_fdshare_remove(k3_fdshare_t *s, const char *name) {
  if (!s || !name) return;
  pthread_mutex_lock(&s->mu);
  fs_obj_t *o = find_locked(s, name);
  if (o) {
    close(o->fd);
    free(o->meta);
    *o = s->objs[--s->n];
  }
  pthread_mutex_unlock(&s->mu);
}

void k3_fdshare_stop(k3_fdshare_t *s) {
  if (!s) return;
  ssize_t w;
  do {
    w = write(s->wake[1], "x", 1);
  } while (w < 0 && errno == EINTR);
  pthread_join(s->th, NULL);
  /* unlink only while the file is still ours (a successor may have replaced a socket we no
   * longer listen on: never the case while the thread ran, but cheap to respect) */
  struct stat a, b;
  if (fstat(s->lfd, &a) == 0 && lstat(s->path, &b) == 0 && S_ISSOCK(b.st_mode)) unlink(s->path);
  close(s->lfd);
  close(s->wake[0]);
  close(s->wake[1]);
  for (size_t i = 0; i < s->n; i++) {
    close(s->objs[i].fd);
    free(s->objs[i].meta);
  }
  free(s->objs);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

const char *k3_fdshare_path(const k3_fdshare_t *s) { return s ? s->path : NULL; }

/* ---- client ---------------------------------------------------------------------------- */

int k3_fdshare_fetch(const char *path, const char *name, int timeout_ms, int *fd, void **meta,
                     size_t *meta_len) {
  if (!path || !name || !fd || timeout_ms < 0) return K3_EINVAL;
  size_t nl = strlen(name);
  struct sockaddr_un sa;
  if (nl == 0 || nl > K3_FDSHARE_NAME_MAX || fill_addr(path, &sa)) return K3_EINVAL;
  int64_t deadline = mono_ms() + timeout_ms;
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return K3_EIO;
  int rc = 0, fds[1] = {-1}, nfds = 0;
  uint8_t *m = NULL;
  uint32_t ml = 0;
  if (connect(s, (struct sockaddr *)&sa, sizeof sa)) {
    if (errno == ENOENT || errno == ECONNREFUSED || errno == ENOTDIR) {
      rc = K3_ENOENT;
    } else if (errno == EINPROGRESS || errno == EAGAIN) {
      /* a full backlog: wait for the connection, then read its outcome */
      int e = 0;
      socklen_t el = sizeof e;
      rc = wait_fd(s, POLLOUT, deadline);
      if (!rc && (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el) || e))
        rc = e == ECONNREFUSED ? K3_ENOENT : K3_EIO;
    } else {
      rc = K3_EIO;
    }
  }
  uint8_t req[FS_REQ_HDR + K3_FDSHARE_NAME_MAX];
  memcpy(req, FS_MAGIC, 4);
  put16(req + 4, FS_VERSION);
  put16(req + 6, (uint16_t)nl);
  memcpy(req + FS_REQ_HDR, name, nl);
  if (!rc) rc = send_all(s, req, FS_REQ_HDR + nl, -1, deadline);
  uint8_t rep[FS_REP_HDR];
  if (!rc) rc = recv_all(s, rep, sizeof rep, fds, &nfds, 1, deadline);
  uint16_t status = 0;
  if (!rc) {
    status = get16(rep + 6);
    ml = get32(rep + 8);
    if (memcmp(rep, FS_MAGIC, 4) || get16(rep + 4) != FS_VERSION || status > 1 || ml > K3_FDSHARE_META_MAX ||
        (status == 1 && ml))
      rc = K3_EPROTO;
  }
  if (!rc && ml) {
    if (!(m = malloc(ml)))
      rc = K3_ENOMEM;
    else
      rc = recv_all(s, m, ml, fds, &nfds, 1, deadline);
  }
  if (!rc && status == 1) rc = nfds ? K3_EPROTO : K3_ENOENT;
  if (!rc && nfds != 1) rc = K3_EPROTO; /* ok without exactly one descriptor */
  close(s);
  if (rc) {
    if (nfds && fds[0] >= 0) close(fds[0]);
    free(m);
    return rc;
  }
  *fd = fds[0];
  if (meta)
    *meta = m;
  else
    free(m);
  if (meta_len) *meta_len = ml;
  return 0;
}

/* ---- host identity --------------------------------------------------------------------- */

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int k3_host_boot_id(uint8_t id[16]) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (!f) return K3_EIO;
  char buf[64];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  uint8_t t[16];
  int k = 0, hi = -1;
  for (size_t i = 0; i < n && k < 16; i++) {
    if (buf[i] == '-') continue;
    int v = hexval((unsigned char)buf[i]);
    if (v < 0) break;
    if (hi < 0) {
      hi = v;
    } else {
      t[k++] = (uint8_t)(hi << 4 | v);
      hi = -1;
    }
  }
  if (k != 16) return K3_EIO;
  memcpy(id, t, 16);
  return 0;
}
