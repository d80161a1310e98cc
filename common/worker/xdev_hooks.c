/* k3_xfer's device hooks over k3k_xdev, k3k_vmm and fdshare; see k3pd/xdev_hooks.h.
 *
 * The hook table forwards submit/poll/release to k3k_xdev one to one (k3_xfer_seg_t and
 * k3k_xseg_t have the same layout, checked below). map parses the receiver's blob, refuses
 * another host or GPU, and keeps one mapping per (socket path, object name, access): the first
 * use fetches the descriptor from the peer's fdshare socket and imports it read-write (a sender
 * pushing into a receiver's pool) or read-only (a receiver pulling from a sender's source pool:
 * cuMemSetAccess PROT_READ, so a fault on this side cannot write the peer's state); a read-write
 * mapping also serves read-only requests. A peer that
 * restarts on the same path exports a new object name; the old mapping is dropped at once (its
 * process is gone, and our mapping would keep its whole arena allocated). */
#include "k3pd/xdev_hooks.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/fdshare.h"
#include "k3pd/log.h"

_Static_assert(sizeof(k3_xfer_seg_t) == sizeof(k3k_xseg_t) &&
                   offsetof(k3_xfer_seg_t, src) == offsetof(k3k_xseg_t, src) &&
                   offsetof(k3_xfer_seg_t, dst) == offsetof(k3k_xseg_t, dst) &&
                   offsetof(k3_xfer_seg_t, len) == offsetof(k3k_xseg_t, len),
               "k3_xfer_seg_t and k3k_xseg_t must share one layout");

#define BLOB_MAGIC 0x4256334bu /* "K3VB" */
#define BLOB_VERSION 1
#define BLOB_HDR 52

typedef struct map {
  struct map *next;
  char path[108];
  char name[K3_FDSHARE_NAME_MAX + 1];
  uint64_t size;
  bool writable;
  k3k_vmm_t *vmm;
  int dead_ticks; /* consecutive k3_xhooks_gc calls that found its socket dead */
} map_t;

struct k3_xhooks {
  k3k_backend_t *be;
  k3k_xdev_t *xd;
  k3_xfer_dev_t dev;
  uint8_t boot[16], uuid[16];
  map_t *maps;
};

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

int k3_xhooks_blob(k3k_backend_t *be, const char *sock_path, const char *name, uint64_t size,
                   uint8_t *blob, uint32_t *len) {
  if (!be || !sock_path || !name || !blob || !len) return K3_EINVAL;
  size_t pl = strlen(sock_path), nl = strlen(name);
  if (pl >= sizeof(((map_t *)0)->path) || nl > K3_FDSHARE_NAME_MAX || BLOB_HDR + pl + nl > *len)
    return K3_ERANGE;
  uint8_t boot[16], uuid[16];
  int rc = k3k_device_uuid(be, uuid);
  if (rc) return rc;
  if ((rc = k3_host_boot_id(boot))) return rc;
  put32(blob, BLOB_MAGIC);
  put16(blob + 4, BLOB_VERSION);
  put16(blob + 6, 0);
  memcpy(blob + 8, boot, 16);
  memcpy(blob + 24, uuid, 16);
  put64(blob + 40, size);
  put16(blob + 48, (uint16_t)pl);
  put16(blob + 50, (uint16_t)nl);
  memcpy(blob + BLOB_HDR, sock_path, pl);
  memcpy(blob + BLOB_HDR + pl, name, nl);
  *len = (uint32_t)(BLOB_HDR + pl + nl);
  return 0;
}

/* ---- hooks ------------------------------------------------------------------------------ */

static int h_submit(void *ud, const k3_xfer_seg_t *segs, const uint32_t *first, uint32_t n_regions,
                    void (*notify)(void *arg), void *arg, void **job) {
  k3_xhooks_t *h = ud;
  k3k_xjob_t *j = NULL;
  int rc = k3k_xdev_submit(h->xd, (const k3k_xseg_t *)segs, first, n_regions, notify, arg, &j);
  if (!rc) *job = j;
  return rc;
}

static int h_poll(void *ud, void *job, uint64_t *digests) { return k3k_xdev_poll(job, digests); }

static void h_release(void *ud, void *job) { k3k_xdev_job_free(job); }

static void map_free(map_t *m) {
  k3k_vmm_free(m->vmm);
  free(m);
}

static int h_map(void *ud, const uint8_t *blob, uint32_t blob_len, uint64_t size_bytes, bool writable,
                 void **base) {
  k3_xhooks_t *h = ud;
  if (blob_len < BLOB_HDR || get32(blob) != BLOB_MAGIC || get16(blob + 4) != BLOB_VERSION) return K3_ENOTSUP;
  uint16_t pl = get16(blob + 48), nl = get16(blob + 50);
  uint64_t size = get64(blob + 40);
  if (BLOB_HDR + (uint32_t)pl + nl != blob_len || pl == 0 || pl >= sizeof(((map_t *)0)->path) || nl == 0 ||
      nl > K3_FDSHARE_NAME_MAX || size < size_bytes)
    return K3_ENOTSUP;
  if (memcmp(blob + 8, h->boot, 16) != 0) return K3_ENOTSUP;  /* another host (kernel) */
  if (memcmp(blob + 24, h->uuid, 16) != 0) return K3_ENOTSUP; /* another GPU */
  char path[108], name[K3_FDSHARE_NAME_MAX + 1];
  memcpy(path, blob + BLOB_HDR, pl);
  path[pl] = 0;
  memcpy(name, blob + BLOB_HDR + pl, nl);
  name[nl] = 0;
  for (map_t **pp = &h->maps; *pp;) {
    map_t *m = *pp;
    if (!strcmp(m->path, path)) {
      if (!strcmp(m->name, name)) {
        if (m->size >= size_bytes && (m->writable || !writable)) {
          m->dead_ticks = 0;
          *base = k3k_vmm_ptr(m->vmm);
          return 0;
        }
        pp = &m->next; /* the same pool mapped read-only: a read-write mapping is added beside it */
        continue;
      }
      /* the peer on this socket restarted with a new arena: the old one's process is gone */
      K3_INFO("xfer: peer %s now serves %s: unmapping its previous pool %s", path, name, m->name);
      *pp = m->next;
      map_free(m);
      continue;
    }
    pp = &m->next;
  }
  int fd = -1;
  void *meta = NULL;
  size_t meta_len = 0;
  int rc = k3_fdshare_fetch(path, name, K3_XHOOKS_FETCH_MS, &fd, &meta, &meta_len);
  free(meta);
  if (rc) {
    K3_WARN("xfer: cannot map the peer's pool %s from %s: %s", name, path, k3_strerror(rc));
    return K3_EUNAVAIL;
  }
  map_t *m = calloc(1, sizeof *m);
  if (!m) {
    close(fd);
    return K3_ENOMEM;
  }
  rc = k3k_vmm_import(h->be, fd, size, writable, &m->vmm);
  close(fd);
  if (rc) {
    free(m);
    K3_WARN("xfer: importing the peer's pool %s (%llu bytes, %s) failed: %s", name, (unsigned long long)size,
            writable ? "read-write" : "read-only", k3_strerror(rc));
    return K3_EUNAVAIL;
  }
  snprintf(m->path, sizeof m->path, "%s", path);
  snprintf(m->name, sizeof m->name, "%s", name);
  m->size = size;
  m->writable = writable;
  m->next = h->maps;
  h->maps = m;
  K3_INFO("xfer: mapped the %s pool %s (%.1f MiB) from %s, %s", writable ? "receiver's" : "sender's", name,
          (double)size / 1048576.0, path, writable ? "read-write" : "read-only");
  *base = k3k_vmm_ptr(m->vmm);
  return 0;
}

int k3_xhooks_open(k3k_backend_t *be, k3_xhooks_t **out) {
  if (!be || !out) return K3_EINVAL;
  if (be->host_memory) return K3_ENOTSUP;
  k3_xhooks_t *h = calloc(1, sizeof *h);
  if (!h) return K3_ENOMEM;
  h->be = be;
  int rc = k3k_xdev_open(be, &h->xd);
  if (!rc) rc = k3k_device_uuid(be, h->uuid);
  if (!rc) rc = k3_host_boot_id(h->boot);
  if (rc) {
    k3k_xdev_close(h->xd);
    free(h);
    return rc;
  }
  h->dev = (k3_xfer_dev_t){.ud = h, .submit = h_submit, .poll = h_poll, .release = h_release, .map = h_map};
  *out = h;
  return 0;
}

void k3_xhooks_close(k3_xhooks_t *h) {
  if (!h) return;
  while (h->maps) {
    map_t *m = h->maps;
    h->maps = m->next;
    map_free(m);
  }
  k3k_xdev_close(h->xd);
  free(h);
}

const k3_xfer_dev_t *k3_xhooks_dev(k3_xhooks_t *h) { return &h->dev; }

int k3_xhooks_mapped(const k3_xhooks_t *h) {
  int n = 0;
  for (const map_t *m = h ? h->maps : NULL; m; m = m->next) n++;
  return n;
}

/* True when nobody listens on the Unix socket at path (connect refused or no such file). */
static bool socket_dead(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false; /* cannot tell: keep it */
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  int e = errno;
  close(fd);
  return rc != 0 && (e == ECONNREFUSED || e == ENOENT);
}

int k3_xhooks_gc(k3_xhooks_t *h) {
  int dropped = 0;
  for (map_t **pp = h ? &h->maps : NULL; pp && *pp;) {
    map_t *m = *pp;
    if (!socket_dead(m->path)) {
      m->dead_ticks = 0;
    } else if (++m->dead_ticks >= 2) {
      K3_INFO("xfer: the receiver behind %s is gone: unmapping its pool %s", m->path, m->name);
      *pp = m->next;
      map_free(m);
      dropped++;
      continue;
    }
    pp = &m->next;
  }
  return dropped;
}

int k3_xhooks_d2h(k3k_backend_t *be, const k3_xfer_src_t *src, uint64_t off, void *dst, uint64_t len) {
  if (!be || !src || (len && !dst)) return K3_EINVAL;
  uint8_t *d = dst;
  while (len) {
    const uint8_t *p;
    uint64_t contig;
    if (!src->idx) {
      p = (const uint8_t *)src->base + src->offset_bytes + off;
      contig = len;
    } else {
      if (!src->unit_bytes) return K3_EINVAL;
      uint64_t i = off / src->unit_bytes, in = off % src->unit_bytes;
      if (i >= src->n_idx) return K3_EINVAL;
      p = (const uint8_t *)src->base + src->offset_bytes + (uint64_t)src->idx[i] * src->stride_bytes + in;
      contig = src->unit_bytes - in;
    }
    uint64_t n = contig < len ? contig : len;
    int rc = k3k_dev_copy(be, d, p, (size_t)n);
    if (rc) return rc;
    d += n, off += n, len -= n;
  }
  return 0;
}
