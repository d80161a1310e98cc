/* A fake device for the k3_xfer device-path tests: "device memory" that host code cannot touch.
 *
 * What it is for: every fake allocation is a memfd mapped twice: once PROT_NONE (the "device
 * address" handed to k3_xfer: any host access by k3_xfer code segfaults, which is exactly the
 * bug that crashed the prefill worker on the GPU: it hashed device memory from the CPU) and once
 * read-write (the "shadow" only these hooks and the test use, translating addresses by offset).
 * The hooks implement k3_xfer_dev_t: submit computes each region's K3 digest (k3_digest) over
 * the shadows, copying where dst is set, either inside submit or on a thread of its own after a
 * delay (then notify runs on that thread, exercising k3_xfer_ctx_wake); map opens a peer
 * process's memfd from the pool's blob ("/proc/<pid>/fd/<n> <size>") and maps it twice too,
 * read-only when k3_xfer asks so: a job that writes into a read-only mapping fails like a
 * device fault would (K3_EDEVICE).
 *
 * What it is not: a model of CUDA timing or of partial failures beyond "an address no
 * allocation or mapping covers" (the job then fails with K3_EDEVICE).
 *
 * Threads: the hooks are called from one (the loop's) thread; a job's worker thread runs
 * concurrently and reads the area table (mu guards it: map appends while jobs translate). */
#ifndef K3PD_TEST_FAKE_DEV_H
#define K3PD_TEST_FAKE_DEV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/xfer.h"

#define FAKE_MAX_AREAS 16

typedef struct {
  uintptr_t dev;   /* PROT_NONE view */
  uint8_t *shadow; /* read-write view of the same pages */
  size_t len;
  int fd;
  char blob[64]; /* "/proc/<pid>/fd/<fd> <len>" (own allocations), or the blob mapped */
  int writable;  /* own allocations and read-write mappings; a job writing elsewhere fails */
} fake_area_t;

typedef struct {
  k3_xfer_dev_t hooks; /* ud = this struct */
  pthread_mutex_t mu; /* guards areas/n_areas */
  fake_area_t areas[FAKE_MAX_AREAS];
  int n_areas;
  int async_us;         /* 0: jobs complete inside submit; > 0: on a thread after this delay */
  int jobs, maps, segs; /* counters: jobs submitted, peer pools mapped, segments submitted */
  int maps_ro;          /* of maps: mapped read-only (a receiver pulling from a sender) */
  int refuse_map;       /* map returns K3_ENOTSUP */
} fake_dev_t;

/* Hooks over f (f must stay put: hooks.ud points at it). */
void fake_dev_init(fake_dev_t *f, int async_us);
/* Allocates `len` bytes of fake device memory (zeroed): *dev is the PROT_NONE address,
 * *shadow the read-write view, blob (NUL-terminated) what a peer passes to map. 0 or -1. */
int fake_dev_alloc(fake_dev_t *f, size_t len, void **dev, uint8_t **shadow, const char **blob);
/* The shadow address of a device address (own or mapped), or NULL. */
uint8_t *fake_dev_shadow(fake_dev_t *f, const void *dev);
void fake_dev_free_all(fake_dev_t *f);

#endif
