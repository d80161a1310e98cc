/* The fake device (fake_dev.h): memfd-backed "device memory" with PROT_NONE device addresses,
 * and k3_xfer_dev_t hooks that hash and copy through read-write shadows. */
#include "fake_dev.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "k3pd/digest.h"
#include "k3pd/err.h"

typedef struct {
  fake_dev_t *f;
  k3_xfer_seg_t *segs;
  uint32_t *first, n_regions;
  uint64_t *digests;
  int status; /* 0 or K3_EDEVICE, valid once done */
  atomic_int done;
  void (*notify)(void *);
  void *arg;
  pthread_t th;
  int has_thread;
} fake_job_t;

static int map_twice(int fd, size_t len, fake_area_t *a) {
  void *dev = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
  void *sh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (dev == MAP_FAILED || sh == MAP_FAILED) {
    if (dev != MAP_FAILED) munmap(dev, len);
    if (sh != MAP_FAILED) munmap(sh, len);
    return -1;
  }
  a->dev = (uintptr_t)dev;
  a->shadow = sh;
  a->len = len;
  a->fd = fd;
  return 0;
}

/* The shadow of [dev, dev+len) when one area covers all of it (a writable one when `write`),
 * else NULL. */
static uint8_t *shadow_range(fake_dev_t *f, const void *dev, uint64_t len, bool write) {
  uintptr_t p = (uintptr_t)dev;
  uint8_t *out = NULL;
  pthread_mutex_lock(&f->mu);
  for (int i = 0; i < f->n_areas && !out; i++)
    if (p >= f->areas[i].dev && len <= f->areas[i].len && p - f->areas[i].dev <= f->areas[i].len - len &&
        (f->areas[i].writable || !write))
      out = f->areas[i].shadow + (p - f->areas[i].dev);
  pthread_mutex_unlock(&f->mu);
  return out;
}

uint8_t *fake_dev_shadow(fake_dev_t *f, const void *dev) { return shadow_range(f, dev, 1, false); }

static void run_job(fake_job_t *j) {
  k3_digest_t d;
  if (k3_digest_init(&d)) {
    j->status = K3_EDEVICE;
    return;
  }
  for (uint32_t r = 0; r < j->n_regions && !j->status; r++) {
    k3_digest_reset(&d);
    for (uint32_t s = j->first[r]; s < j->first[r + 1]; s++) {
      const k3_xfer_seg_t *g = &j->segs[s];
      const uint8_t *src = shadow_range(j->f, g->src, g->len, false);
      uint8_t *dst = g->dst ? shadow_range(j->f, g->dst, g->len, true) : NULL;
      if (!src || (g->dst && !dst)) { /* an address no device allocation covers, or a read-only one written */
        j->status = K3_EDEVICE;
        break;
      }
      k3_digest_update(&d, src, g->len);
      if (dst) memcpy(dst, src, g->len);
    }
    j->digests[r] = k3_digest_final(&d);
  }
  k3_digest_free(&d);
}

static void *job_thread(void *arg) {
  fake_job_t *j = arg;
  usleep((useconds_t)j->f->async_us);
  run_job(j);
  atomic_store(&j->done, 1);
  if (j->notify) j->notify(j->arg); /* on this thread: k3_xfer_ctx_wake (NULL: k3_xfer polls) */
  return NULL;
}

static int submit(void *ud, const k3_xfer_seg_t *segs, const uint32_t *first, uint32_t n_regions,
                  void (*notify)(void *), void *arg, void **out) {
  fake_dev_t *f = ud;
  fake_job_t *j = calloc(1, sizeof *j);
  uint32_t n_segs = first[n_regions];
  if (!j) return K3_ENOMEM;
  j->f = f;
  j->segs = malloc((n_segs ? n_segs : 1) * sizeof *segs);
  j->first = malloc(((size_t)n_regions + 1) * sizeof *first);
  j->digests = calloc(n_regions ? n_regions : 1, sizeof *j->digests);
  if (!j->segs || !j->first || !j->digests) {
    free(j->segs), free(j->first), free(j->digests), free(j);
    return K3_ENOMEM;
  }
  memcpy(j->segs, segs, n_segs * sizeof *segs); /* the contract: copied before return */
  memcpy(j->first, first, ((size_t)n_regions + 1) * sizeof *first);
  j->n_regions = n_regions;
  j->notify = notify;
  j->arg = arg;
  f->jobs++;
  f->segs += (int)n_segs;
  if (f->async_us > 0 && pthread_create(&j->th, NULL, job_thread, j) == 0) {
    j->has_thread = 1;
  } else {
    run_job(j);
    atomic_store(&j->done, 1);
    if (notify) notify(arg);
  }
  *out = j;
  return 0;
}

static int poll_job(void *ud, void *job, uint64_t *digests) {
  fake_job_t *j = job;
  if (!atomic_load(&j->done)) return 0;
  if (j->status) return j->status;
  if (digests) memcpy(digests, j->digests, j->n_regions * sizeof *digests); /* NULL: only "done" */
  return 1;
}

static void release(void *ud, void *job) {
  fake_job_t *j = job;
  if (j->has_thread) pthread_join(j->th, NULL); /* waits; notify has run when it returns */
  free(j->segs);
  free(j->first);
  free(j->digests);
  free(j);
}

static int map(void *ud, const uint8_t *blob, uint32_t blob_len, uint64_t size_bytes, bool writable, void **base) {
  fake_dev_t *f = ud;
  if (f->refuse_map) return K3_ENOTSUP;
  char b[64];
  if (blob_len == 0 || blob_len >= sizeof b) return K3_EINVAL;
  memcpy(b, blob, blob_len);
  b[blob_len] = 0;
  pthread_mutex_lock(&f->mu);
  for (int i = 0; i < f->n_areas; i++) /* cached: one mapping per peer pool */
    if (strcmp(f->areas[i].blob, b) == 0 && (f->areas[i].writable || !writable)) {
      *base = (void *)f->areas[i].dev;
      pthread_mutex_unlock(&f->mu);
      return 0;
    }
  pthread_mutex_unlock(&f->mu);
  char path[48];
  size_t len = 0;
  if (sscanf(b, "%47s %zu", path, &len) != 2 || len < size_bytes || f->n_areas == FAKE_MAX_AREAS)
    return K3_EINVAL;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return K3_EUNAVAIL;
  fake_area_t a = {0};
  if (map_twice(fd, len, &a)) {
    close(fd);
    return K3_EUNAVAIL;
  }
  snprintf(a.blob, sizeof a.blob, "%s", b);
  a.writable = writable;
  pthread_mutex_lock(&f->mu);
  f->areas[f->n_areas++] = a;
  pthread_mutex_unlock(&f->mu);
  f->maps++;
  if (!writable) f->maps_ro++;
  *base = (void *)a.dev;
  return 0;
}

void fake_dev_init(fake_dev_t *f, int async_us) {
  memset(f, 0, sizeof *f);
  pthread_mutex_init(&f->mu, NULL);
  f->async_us = async_us;
  f->hooks = (k3_xfer_dev_t){.ud = f, .submit = submit, .poll = poll_job, .release = release, .map = map};
}

int fake_dev_alloc(fake_dev_t *f, size_t len, void **dev, uint8_t **shadow, const char **blob) {
  if (f->n_areas == FAKE_MAX_AREAS) return -1;
  int fd = memfd_create("k3fake", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)len)) {
    if (fd >= 0) close(fd);
    return -1;
  }
  fake_area_t a = {0};
  if (map_twice(fd, len, &a)) {
    close(fd);
    return -1;
  }
  snprintf(a.blob, sizeof a.blob, "/proc/%d/fd/%d %zu", (int)getpid(), fd, len);
  a.writable = 1;
  pthread_mutex_lock(&f->mu);
  int i = f->n_areas++;
  f->areas[i] = a;
  pthread_mutex_unlock(&f->mu);
  *dev = (void *)a.dev;
  *shadow = a.shadow;
  if (blob) *blob = f->areas[i].blob;
  return 0;
}

void fake_dev_free_all(fake_dev_t *f) {
  for (int i = 0; i < f->n_areas; i++) {
    munmap((void *)f->areas[i].dev, f->areas[i].len);
    munmap(f->areas[i].shadow, f->areas[i].len);
    close(f->areas[i].fd);
  }
  f->n_areas = 0;
}
