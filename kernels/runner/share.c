/* Shared weights (opts.share_weights_dir, `--share-weights DIR`; docs/gpu-cluster.md §4): the
 * processes on one GPU (a prefill and a decode worker, or k3pd-generate runs) hold ONE
 * read-only copy of the weights instead of one each.
 *
 * What it is for: runner.c computes the weights arena's layout (every tensor's name, dtype,
 * shape, bytes and offset; its XXH3 is the layout hash) and then asks rn_share_begin for the
 * arena. Under DIR/.lock (flock, bounded wait) we look for a live holder among the sockets
 * DIR/<name>.sock:
 *   - a holder with our identity, layout, size and GPU: import its fd read-only; the runner
 *     binds the tensors at the same offsets and generates / uploads NOTHING;
 *   - none: allocate a k3k_vmm arena; the runner fills it;
 *   - a holder with other weights (identity, layout or size differ): K3_EFINGERPRINT naming
 *     both identities; never a silent second copy. Holders on another GPU are skipped.
 * After the fill, rn_share_publish starts this process's own fdshare server DIR/<pid>-<tag>.sock
 * serving the same object (the fd we exported, or the one we received: re-export) and releases
 * the lock. The memory lives while any process maps it, so when the first holder dies the
 * others keep their mappings and keep serving; a restarted worker imports from a survivor.
 * Sockets nobody listens on (dead processes) are unlinked during the scan.
 * Socket names carry a random tag besides the pid: containers of one pod have PID namespaces of
 * their own, so two processes sharing DIR may well both be pid 1.
 * Identity = XXH3 of "k3 weights identity v1", the config's canonical text
 * (k3_model_config_canonical) and the source text (opts.weights_source: the synthetic seed or
 * the checkpoint's safetensors headers and file sizes, made by the loader).
 * Metadata (fdshare meta, text): "k3pd shared weights v1" then size=, layout=, identity=,
 * gpu= (k3k_device_uuid, hex), source= lines.
 * What it is not: a cache across reboots (nothing is written to DIR but sockets and .lock), or
 * a way to share weights between GPUs.
 * Invariants: no fd, mapping, server or lock leaks on any path: everything is recorded in
 * struct rn_share as soon as it exists and rn_share_free releases whatever is there. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "k3k_xdev.h"
#include "k3pd/err.h"
#include "k3pd/fdshare.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "runner_internal.h"

#define SH_OBJECT "weights"
#define SH_VERSION "k3pd shared weights v1"
#define SH_FETCH_MS 2000      /* a live holder answers at once; a hung one costs this */
#define SH_WAIT_DEFAULT_MS 600000
#define SH_SOURCE_MAX 300
#define SH_DIR_MAX 3072

struct rn_share {
  char dir[SH_DIR_MAX];
  char sock[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* our own socket */
  int lock_fd;            /* DIR/.lock, flock held while >= 0 */
  k3k_vmm_t *vmm;         /* our mapping (made here, or imported) */
  int fd;                 /* the fd we serve: exported or received; -1 none */
  k3_fdshare_t *srv;
  char meta[1024];
  size_t meta_len;
  char holder[SH_DIR_MAX + 300]; /* the socket we imported from ("" when we made the weights) */
};

typedef struct {
  char version[64];
  uint64_t size, layout, identity;
  char gpu[40];
  char source[SH_SOURCE_MAX + 1];
} sh_meta_t;

static void hex16(const uint8_t b[16], char out[33]) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static uint64_t identity_hash(const k3_model_config_t *cfg, const char *source) {
  size_t n = k3_model_config_canonical(cfg, NULL, 0);
  char *buf = malloc(n + 1);
  XXH3_state_t *st = XXH3_createState();
  uint64_t h = 0;
  if (buf && st) {
    k3_model_config_canonical(cfg, buf, n + 1);
    static const char tag[] = "k3 weights identity v1\n";
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, tag, sizeof tag - 1);
    XXH3_64bits_update(st, buf, n);
    XXH3_64bits_update(st, "\nsource=", 8);
    XXH3_64bits_update(st, source, strlen(source));
    h = XXH3_64bits_digest(st);
  }
  XXH3_freeState(st);
  free(buf);
  return h;
}

/* Parses our metadata text; 0 or K3_EPROTO. */
static int meta_parse(const char *m, size_t len, sh_meta_t *out) {
  memset(out, 0, sizeof *out);
  char buf[K3_FDSHARE_META_MAX + 1];
  if (len > K3_FDSHARE_META_MAX) return K3_EPROTO;
  memcpy(buf, m, len);
  buf[len] = 0;
  int seen = 0;
  char *save = NULL;
  for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    unsigned long long v;
    if (!(seen & 1)) {
      snprintf(out->version, sizeof out->version, "%s", line);
      seen |= 1;
    } else if (sscanf(line, "size=%llu", &v) == 1) {
      out->size = v, seen |= 2;
    } else if (sscanf(line, "layout=%llx", &v) == 1) {
      out->layout = v, seen |= 4;
    } else if (sscanf(line, "identity=%llx", &v) == 1) {
      out->identity = v, seen |= 8;
    } else if (!strncmp(line, "gpu=", 4)) {
      snprintf(out->gpu, sizeof out->gpu, "%s", line + 4), seen |= 16;
    } else if (!strncmp(line, "source=", 7)) {
      snprintf(out->source, sizeof out->source, "%s", line + 7), seen |= 32;
    }
  }
  return seen == 63 ? 0 : K3_EPROTO;
}

/* True when nobody listens on the socket at path (a dead process's file). */
static bool sock_dead(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return false;
  strcpy(sa.sun_path, path);
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0) return false;
  int r = connect(c, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(c);
  return r != 0 && (e == ECONNREFUSED || e == ENOENT);
}

/* mkdir DIR 0700 when missing, take DIR/.lock within wait_ms (progress every 10 s). */
static int lock_dir(struct rn_share *sh, int wait_ms, char *err, size_t errlen) {
  if (mkdir(sh->dir, 0700) && errno != EEXIST) {
    rn_seterr(err, errlen, "--share-weights %s: cannot create the directory: %s", sh->dir, strerror(errno));
    return K3_EIO;
  }
  struct stat st;
  if (stat(sh->dir, &st) || !S_ISDIR(st.st_mode)) {
    rn_seterr(err, errlen, "--share-weights %s: not a directory", sh->dir);
    return K3_EINVAL;
  }
  if (st.st_mode & 077)
    K3_WARN("--share-weights %s: the directory is open to other users (mode %03o); it should be private to "
            "the service user (0700)", sh->dir, (unsigned)(st.st_mode & 0777));
  char p[sizeof sh->dir + 8];
  snprintf(p, sizeof p, "%s/.lock", sh->dir);
  sh->lock_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (sh->lock_fd < 0) {
    rn_seterr(err, errlen, "--share-weights %s: cannot open %s: %s", sh->dir, p, strerror(errno));
    return K3_EIO;
  }
  uint64_t t0 = k3_now_ns(), next_log = 10000;
  for (;;) {
    if (flock(sh->lock_fd, LOCK_EX | LOCK_NB) == 0) return 0;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      rn_seterr(err, errlen, "--share-weights %s: flock %s: %s", sh->dir, p, strerror(errno));
      break;
    }
    uint64_t ms = (k3_now_ns() - t0) / 1000000;
    if (ms >= (uint64_t)wait_ms) {
      rn_seterr(err, errlen, "--share-weights %s: %s still held by another process after %d ms "
                "(--share-wait-ms): is a holder stuck loading?", sh->dir, p, wait_ms);
      close(sh->lock_fd);
      sh->lock_fd = -1;
      return K3_ETIMEDOUT;
    }
    if (ms >= next_log) {
      K3_INFO("--share-weights %s: waiting for %s (another process is loading the weights) for %llu s", sh->dir,
              p, (unsigned long long)(ms / 1000));
      next_log += 10000;
    }
    struct timespec ts = {0, 50 * 1000000};
    nanosleep(&ts, NULL);
  }
  close(sh->lock_fd);
  sh->lock_fd = -1;
  return K3_EIO;
}

/* Scans DIR for a live holder. 0 with sh->vmm imported (match), 1 when none fits, < 0 error. */
static int find_holder(k3_runner_t *r, struct rn_share *sh, const sh_meta_t *ours, char *err, size_t errlen) {
  DIR *d = opendir(sh->dir);
  if (!d) {
    rn_seterr(err, errlen, "--share-weights %s: cannot list the directory: %s", sh->dir, strerror(errno));
    return K3_EIO;
  }
  int rc = 1;
  struct dirent *de;
  while (rc >= 0 && (de = readdir(d))) {
    size_t n = strlen(de->d_name);
    if (n < 6 || strcmp(de->d_name + n - 5, ".sock")) continue;
    char path[sizeof sh->dir + 300];
    snprintf(path, sizeof path, "%s/%s", sh->dir, de->d_name);
    if (rc == 0) { /* found: only tidy up the sockets of dead processes */
      if (sock_dead(path)) {
        K3_INFO("--share-weights %s: removing the stale socket %s (its process is gone)", sh->dir, de->d_name);
        unlink(path);
      }
      continue;
    }
    int fd = -1;
    void *meta = NULL;
    size_t ml = 0;
    int f = k3_fdshare_fetch(path, SH_OBJECT, SH_FETCH_MS, &fd, &meta, &ml);
    if (f == K3_ENOENT || f == K3_EINVAL) {
      if (f == K3_ENOENT && sock_dead(path)) {
        K3_INFO("--share-weights %s: removing the stale socket %s (its process is gone)", sh->dir, de->d_name);
        unlink(path);
      }
      continue;
    }
    if (f) {
      K3_WARN("--share-weights %s: holder %s did not answer properly (%s); skipped", sh->dir, de->d_name,
              k3_strerror(f));
      continue;
    }
    sh_meta_t hm;
    if (meta_parse(meta, ml, &hm) || strcmp(hm.version, SH_VERSION)) {
      rn_seterr(err, errlen, "--share-weights %s: holder %s speaks another shared-weights format ('%s', we are "
                "'%s'): another k3pd version shares this directory", sh->dir, de->d_name,
                meta_parse(meta, ml, &hm) ? "unreadable" : hm.version, SH_VERSION);
      rc = K3_EFINGERPRINT;
    } else if (strcmp(hm.gpu, ours->gpu)) {
      K3_INFO("--share-weights %s: holder %s is on another GPU (%s, we are on %s); skipped", sh->dir,
              de->d_name, hm.gpu, ours->gpu);
    } else if (hm.identity != ours->identity) {
      rn_seterr(err, errlen, "--share-weights %s: holder %s shares other weights: its identity %016llx (%s), "
                "ours %016llx (%s); give each model its own directory", sh->dir, de->d_name,
                (unsigned long long)hm.identity, hm.source, (unsigned long long)ours->identity, ours->source);
      rc = K3_EFINGERPRINT;
    } else if (hm.layout != ours->layout || hm.size != ours->size) {
      rn_seterr(err, errlen, "--share-weights %s: holder %s has the same weights (%s) in another layout "
                "(layout %016llx, %llu bytes; ours %016llx, %llu bytes): another k3pd build?", sh->dir,
                de->d_name, ours->source, (unsigned long long)hm.layout, (unsigned long long)hm.size,
                (unsigned long long)ours->layout, (unsigned long long)ours->size);
      rc = K3_EFINGERPRINT;
    } else {
      int ir = k3k_vmm_import(r->be, fd, (size_t)hm.size, false, &sh->vmm);
      if (ir) {
        rn_seterr(err, errlen, "--share-weights %s: cannot map holder %s's weights read-only: %s (the log says "
                  "why)", sh->dir, de->d_name, k3_strerror(ir));
        rc = ir;
      } else {
        sh->fd = fd; /* served again from here (re-export) */
        fd = -1;
        snprintf(sh->holder, sizeof sh->holder, "%s", path);
        rc = 0;
      }
    }
    if (fd >= 0) close(fd);
    free(meta);
  }
  closedir(d);
  return rc;
}

int rn_share_begin(k3_runner_t *r, const char *identity, char *err, size_t errlen) {
  struct rn_share *sh = calloc(1, sizeof *sh);
  if (!sh) return K3_ENOMEM;
  sh->lock_fd = sh->fd = -1;
  r->share = sh; /* from here on rn_share_free releases whatever exists */
  const char *dir = r->opts.share_weights_dir;
  if (strlen(dir) >= sizeof sh->dir) {
    rn_seterr(err, errlen, "--share-weights: directory name too long");
    return K3_EINVAL;
  }
  snprintf(sh->dir, sizeof sh->dir, "%s", dir);
  /* our socket's name first: a directory too deep for a Unix socket fails before any wait */
  uint64_t tag = k3_hash64(&sh, sizeof sh, k3_now_ns() ^ (uint64_t)getpid());
  int n = snprintf(sh->sock, sizeof sh->sock, "%s/%ld-%08llx.sock", dir, (long)getpid(),
                   (unsigned long long)(tag & 0xffffffffu));
  if (n < 0 || (size_t)n >= sizeof sh->sock) {
    rn_seterr(err, errlen, "--share-weights %s: path too long for a Unix socket (at most about %zu bytes)", dir,
              sizeof sh->sock - 24);
    return K3_EINVAL;
  }
  sh_meta_t ours;
  memset(&ours, 0, sizeof ours);
  snprintf(ours.version, sizeof ours.version, "%s", SH_VERSION);
  ours.size = r->wa.bytes;
  ours.layout = r->wl_hash;
  ours.identity = identity_hash(&r->cfg, identity);
  snprintf(ours.source, sizeof ours.source, "%s", identity);
  for (char *c = ours.source; *c; c++)
    if (*c == '\n') *c = ' ';
  uint8_t uuid[16];
  int rc = k3k_device_uuid(r->be, uuid);
  if (rc) {
    rn_seterr(err, errlen, "--share-weights %s: cannot read the GPU's UUID: %s", dir, k3_strerror(rc));
    return rc;
  }
  hex16(uuid, ours.gpu);
  if ((rc = lock_dir(sh, r->opts.share_wait_ms > 0 ? r->opts.share_wait_ms : SH_WAIT_DEFAULT_MS, err, errlen)))
    return rc;
  rc = find_holder(r, sh, &ours, err, errlen);
  if (rc < 0) return rc;
  if (rc == 1) { /* nobody holds these weights on this GPU: make them here */
    if ((rc = k3k_vmm_alloc(r->be, r->wa.bytes, &sh->vmm))) {
      rn_seterr(err, errlen, "--share-weights %s: no shareable (VMM) device memory for the weights (%.2f GiB): "
                "%s (the log says why)", dir, (double)r->wa.bytes / (1 << 30), k3_strerror(rc));
      return rc;
    }
    if ((rc = k3k_vmm_export(sh->vmm, &sh->fd))) {
      rn_seterr(err, errlen, "--share-weights %s: cannot export the weights' memory: %s", dir, k3_strerror(rc));
      return rc;
    }
  }
  int ml = snprintf(sh->meta, sizeof sh->meta, "%s\nsize=%llu\nlayout=%016llx\nidentity=%016llx\ngpu=%s\nsource=%s\n",
                    SH_VERSION, (unsigned long long)ours.size, (unsigned long long)ours.layout,
                    (unsigned long long)ours.identity, ours.gpu, ours.source);
  sh->meta_len = ml > 0 && (size_t)ml < sizeof sh->meta ? (size_t)ml : sizeof sh->meta - 1;
  r->wa.base = k3k_vmm_ptr(sh->vmm);
  r->wa.imported = sh->holder[0] != 0;
  if (r->wa.imported)
    K3_INFO("runner: shared weights: imported %.2f GiB read-only from %s (identity %016llx, %s): nothing "
            "generated or uploaded", (double)r->wa.bytes / (1 << 30), sh->holder,
            (unsigned long long)ours.identity, ours.source);
  return 0;
}

int rn_share_publish(k3_runner_t *r, char *err, size_t errlen) {
  struct rn_share *sh = r->share;
  int rc = k3_fdshare_start(sh->sock, &sh->srv);
  if (!rc) rc = k3_fdshare_add(sh->srv, SH_OBJECT, sh->fd, sh->meta, sh->meta_len);
  if (rc) {
    rn_seterr(err, errlen, "--share-weights %s: cannot serve the weights on %s: %s", sh->dir, sh->sock,
              k3_strerror(rc));
    return rc;
  }
  close(sh->lock_fd); /* releases the flock: the next process may look */
  sh->lock_fd = -1;
  K3_INFO("runner: shared weights: serving %.2f GiB on %s (%s)", (double)r->wa.bytes / (1 << 30), sh->sock,
          r->wa.imported ? "re-exported from our import" : "made here");
  return 0;
}

void rn_share_free(k3_runner_t *r) {
  struct rn_share *sh = r->share;
  if (!sh) return;
  k3_fdshare_stop(sh->srv); /* removes our socket */
  if (sh->fd >= 0) close(sh->fd);
  if (sh->vmm && r->be) r->be->synchronize(r->be); /* nothing of ours still reads the weights */
  k3k_vmm_free(sh->vmm);
  if (sh->lock_fd >= 0) close(sh->lock_fd);
  free(sh);
  r->share = NULL;
}
