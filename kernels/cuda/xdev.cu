/* k3k_xdev on CUDA (k3k_xdev.h): digest and copy jobs over device memory on a stream of their
 * own; the kernels and the way a job's table reaches them are kernels/cuda/xdev_kernels.cu.
 *
 * A job: the host plans the chunk table (kernels/core/xdev_plan.h) into pinned staging; one
 * kernel launch hashes every chunk and copies it when its segment has a dst, in the same pass;
 * the chunk digests go straight to mapped pinned host memory; an event marks the end; notify is
 * queued behind it with cudaLaunchHostFunc; k3k_xdev_poll sees the event and combines each
 * region's chunk digests on the host (k3_digest_combine).
 * Kernel choice: K3PD_XDEV_KERNEL=1 (a warp per chunk) or 2 (a half-warp per chunk, the
 * default), read at open; both give the same digests bit for bit (xdev_kernels.h).
 * Buffers: each job takes a slot (pinned table staging, device table, mapped digests, event)
 * from the xdev's pool and returns it when it is seen finished, so jobs in flight at once never
 * share memory and steady state allocates nothing.
 * What it is not: thread-safe (k3k_xdev.h: one thread at a time), or ordered with the backend's
 * stream (the caller orders the producer of src before submit, e.g. by synchronising it).
 * Invariants: every CUDA call is checked; on an error before anything was queued nothing
 * changed; a job's slot is reused only after its event completed; k3k_xdev_job_free returns
 * only after the job's notify has run (a poller sees the event before the driver thread runs
 * the host function), so the notify never reaches an owner that freed its state. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_common.cuh"
#include "xdev_cuda.h"
#include "xdev_kernels.h"
extern "C" {
#include "core/xdev_int.h"
#include "k3pd/digest.h"
#include "k3pd/util.h"
}

/* ---- jobs and their buffers ---- */

typedef struct xslot {
  struct xslot *next;   /* free list */
  struct xslot *anext;  /* every slot of the xdev */
  k3k_xent *hent;       /* pinned: the table as planned, hent_cap entries */
  size_t hent_cap;
  k3k_xent *dent;       /* device copy for tables over XK_NI_BIG entries, dent_cap entries */
  size_t dent_cap;
  uint64_t *hdig, *ddig; /* mapped pinned chunk digests (host / device view), dig_cap */
  size_t dig_cap;
  uint32_t *rchunk;     /* [n_regions + 1] first chunk of each region (malloc) */
  size_t rchunk_cap;
  cudaEvent_t done;     /* recorded after the kernel */
  cudaEvent_t start;    /* recorded before it when tracing (K3PD_XFER_TRACE) */
} xslot;

enum { J_RUNNING = 0, J_DONE = 1, J_FAILED = 2 };

typedef struct cu_xjob {
  k3k_xjob_t base;
  struct cu_xdev *x;
  struct cu_xjob *prev, *next; /* the xdev's unfreed jobs */
  xslot *slot;                 /* while running */
  int state;
  uint32_t n_regions;
  uint64_t *dig;               /* [n_regions] region digests once done */
  uint64_t t_submit_ns, n_chunks; /* tracing */
  struct notify_rec *rec;      /* the queued notify, or NULL */
} cu_xjob;

typedef struct cu_xdev {
  k3k_xdev_t base;
  int device;
  cudaStream_t st;
  xslot *free_slots, *all_slots;
  size_t n_slots;
  cu_xjob *jobs;
  size_t live;  /* jobs not freed yet; a closed xdev is freed with the last one */
  bool closed;
  int last_path;
  int kernel;          /* 1 or 2 (xdev_kernels.h) */
  bool trace;          /* K3PD_XFER_TRACE: per-job timings on stderr */
  k3k_xk_caps caps;    /* kernel 2's occupancy, measured at open */
} cu_xdev;

/* A job's notify, queued behind its event with cudaLaunchHostFunc. The job owns it and frees it
 * in k3k_xdev_job_free only after `ran` is set: a caller that polls the event can see the job
 * finished (and free it) microseconds before the driver thread has run the notify, and the
 * notify's ud (e.g. k3_xfer's ctx) must not be gone by then. */
typedef struct notify_rec {
  void (*fn)(void *ud);
  void *ud;
  int ran; /* set (release) by run_notify after fn returned; read with acquire */
} notify_rec;

/* Logs a failed call and returns K3_EDEVICE (0 on success), for paths that clean up. */
static int cu_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  K3_ERROR("cuda xdev: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return K3_EDEVICE;
}

static void CUDART_CB run_notify(void *p) {
  notify_rec *r = (notify_rec *)p;
  r->fn(r->ud);
  __atomic_store_n(&r->ran, 1, __ATOMIC_RELEASE);
}

/* Waits (bounded: 2 s) until a finished job's notify has run, then frees it. The host function
 * follows the job's event on the stream, so it runs within microseconds of the event; a job
 * that failed (sticky error: host functions may never run) leaks its record instead. */
static void notify_drop(notify_rec *r, bool failed) {
  if (!r) return;
  if (failed && !__atomic_load_n(&r->ran, __ATOMIC_ACQUIRE)) return;
  uint64_t t0 = k3_now_ns();
  while (!__atomic_load_n(&r->ran, __ATOMIC_ACQUIRE)) {
    if (k3_now_ns() - t0 > 2000000000ull) {
      K3_ERROR("cuda xdev: a finished job's notify did not run within 2 s; its record is leaked");
      return;
    }
    usleep(10);
  }
  free(r);
}

static size_t grow(size_t want, size_t floor) { return want < floor ? floor : want + want / 4; }

/* Makes s hold a job of n_ent entries, n_chunks chunks, n_regions regions. Buffers are
 * replaced only when too small; s is free, so no queued work uses them. */
static int slot_fit(xslot *s, size_t n_ent, uint64_t n_chunks, uint32_t n_regions) {
  if (s->hent_cap < n_ent) {
    size_t cap = grow(n_ent, 256);
    void *p = NULL;
    if (s->hent && cu_ok(cudaFreeHost(s->hent), "cudaFreeHost")) return K3_EDEVICE;
    s->hent = NULL;
    s->hent_cap = 0;
    if (cudaMallocHost(&p, cap * sizeof(k3k_xent)) != cudaSuccess) {
      (void)cudaGetLastError();
      K3_ERROR("cuda xdev: pinned table staging of %zu entries unavailable", cap);
      return K3_ENOMEM;
    }
    s->hent = (k3k_xent *)p;
    s->hent_cap = cap;
  }
  if (n_ent > XK_NI_BIG && s->dent_cap < n_ent) {
    size_t cap = grow(n_ent, 1024);
    void *p = NULL;
    if (s->dent && cu_ok(cudaFree(s->dent), "cudaFree")) return K3_EDEVICE;
    s->dent = NULL;
    s->dent_cap = 0;
    if (cudaMalloc(&p, cap * sizeof(k3k_xent)) != cudaSuccess) {
      (void)cudaGetLastError();
      K3_ERROR("cuda xdev: device table of %zu entries unavailable", cap);
      return K3_ENOMEM;
    }
    s->dent = (k3k_xent *)p;
    s->dent_cap = cap;
  }
  if (s->dig_cap < n_chunks) {
    size_t cap = grow((size_t)n_chunks, 4096);
    void *h = NULL, *d = NULL;
    if (s->hdig && cu_ok(cudaFreeHost(s->hdig), "cudaFreeHost")) return K3_EDEVICE;
    s->hdig = s->ddig = NULL;
    s->dig_cap = 0;
    if (cudaHostAlloc(&h, cap * sizeof(uint64_t), cudaHostAllocMapped) != cudaSuccess) {
      (void)cudaGetLastError();
      K3_ERROR("cuda xdev: mapped digest buffer of %zu chunks unavailable", cap);
      return K3_ENOMEM;
    }
    if (cu_ok(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer")) {
      cudaFreeHost(h);
      return K3_EDEVICE;
    }
    s->hdig = (uint64_t *)h;
    s->ddig = (uint64_t *)d;
    s->dig_cap = cap;
  }
  if (s->rchunk_cap < (size_t)n_regions + 1) {
    size_t cap = grow((size_t)n_regions + 1, 64);
    uint32_t *p = (uint32_t *)realloc(s->rchunk, cap * sizeof *p);
    if (!p) return K3_ENOMEM;
    s->rchunk = p;
    s->rchunk_cap = cap;
  }
  return 0;
}

static void slot_put(cu_xdev *x, xslot *s) {
  s->next = x->free_slots;
  x->free_slots = s;
}

static bool slot_holds(const xslot *s, size_t n_ent, uint64_t n_chunks, uint32_t n_regions) {
  return s->hent_cap >= n_ent && (n_ent <= XK_NI_BIG || s->dent_cap >= n_ent) && s->dig_cap >= n_chunks &&
         s->rchunk_cap >= (size_t)n_regions + 1;
}

/* A free slot for the job: the one that already holds it with the fewest digest entries (best
 * fit), else the largest free one (grown), else a new one. Jobs of mixed sizes in flight (a
 * transfer cut into jobs, its last one smaller) then never regrow a slot in steady state: the
 * first-free choice handed a small slot to a big job, and regrowing costs a cudaFreeHost (which
 * waits for the device) and a cudaHostAlloc, milliseconds. */
static int slot_get(cu_xdev *x, size_t n_ent, uint64_t n_chunks, uint32_t n_regions, xslot **out) {
  xslot **fit = NULL, **big = NULL;
  for (xslot **pp = &x->free_slots; *pp; pp = &(*pp)->next) {
    const xslot *c = *pp;
    if (slot_holds(c, n_ent, n_chunks, n_regions)) {
      if (!fit || c->dig_cap < (*fit)->dig_cap) fit = pp;
    } else if (!big || c->dig_cap > (*big)->dig_cap) {
      big = pp;
    }
  }
  xslot **pick = fit ? fit : big;
  xslot *s = pick ? *pick : NULL;
  if (s) {
    *pick = s->next;
  } else {
    s = (xslot *)calloc(1, sizeof *s);
    if (!s) return K3_ENOMEM;
    if (cu_ok(cudaEventCreate(&s->done), "cudaEventCreate")) { /* timing on: the perf table reads it */
      free(s);
      return K3_EDEVICE;
    }
    if (cu_ok(cudaEventCreate(&s->start), "cudaEventCreate")) {
      cudaEventDestroy(s->done);
      free(s);
      return K3_EDEVICE;
    }
    s->anext = x->all_slots;
    x->all_slots = s;
    x->n_slots++;
  }
  int rc = slot_fit(s, n_ent, n_chunks, n_regions);
  if (rc) {
    slot_put(x, s);
    return rc;
  }
  *out = s;
  return 0;
}

static void slot_destroy(xslot *s) {
  if (s->hent) cudaFreeHost(s->hent);
  if (s->dent) cudaFree(s->dent);
  if (s->hdig) cudaFreeHost(s->hdig);
  if (s->done) cudaEventDestroy(s->done);
  if (s->start) cudaEventDestroy(s->start);
  free(s->rchunk);
  free(s);
}

/* The job's slot is no longer used by the device (its event completed, or failed): collect
 * the region digests and give the slot back. */
static void finish(cu_xjob *j, cudaError_t e) {
  xslot *s = j->slot;
  if (e == cudaSuccess) {
    uint64_t t0 = k3_now_ns();
    for (uint32_t r = 0; r < j->n_regions; r++)
      j->dig[r] = k3_digest_combine(s->hdig + s->rchunk[r], s->rchunk[r + 1] - s->rchunk[r]);
    j->state = J_DONE;
    if (j->x->trace) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, s->start, s->done) != cudaSuccess) (void)cudaGetLastError(), ms = -1;
      uint64_t t1 = k3_now_ns();
      fprintf(stderr, "xfer-trace %d %.1f xdev: job of %llu chunks (%.1f MB): kernel %.1f us on the GPU, submit to "
              "seen done %.1f us, combine of %u regions %.1f us\n", (int)getpid(), (double)t1 / 1e3,
              (unsigned long long)j->n_chunks, (double)j->n_chunks * 4096 / 1e6, ms * 1e3,
              (double)(t0 - j->t_submit_ns) / 1e3, j->n_regions, (double)(t1 - t0) / 1e3);
    }
  } else {
    K3_ERROR("cuda xdev: job failed: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    j->state = J_FAILED;
  }
  slot_put(j->x, s);
  j->slot = NULL;
}

/* ---- the API ---- */

/* K3PD_XDEV_KERNEL: "1" or "2"; unset: 2. Anything else is logged and ignored. */
static int kernel_from_env(void) {
  const char *e = getenv("K3PD_XDEV_KERNEL");
  if (!e || !*e) return 2;
  if (!strcmp(e, "1") || !strcmp(e, "2")) return e[0] - '0';
  K3_WARN("cuda xdev: K3PD_XDEV_KERNEL=%s is not 1 or 2: using kernel 2", e);
  return 2;
}

extern "C" int k3k_cuda_xdev_open(k3k_backend_t *be, k3k_xdev_t **out) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  if (!cx) return K3_EINVAL;
  cu_xdev *x = (cu_xdev *)calloc(1, sizeof *x);
  if (!x) return K3_ENOMEM;
  x->base.device = true;
  x->device = cx->device;
  x->kernel = kernel_from_env();
  const char *tr = getenv("K3PD_XFER_TRACE");
  x->trace = tr && *tr && strcmp(tr, "0") != 0;
  xslot *s = NULL;
  int rc = cu_ok(cudaSetDevice(x->device), "cudaSetDevice");
  if (!rc) rc = cu_ok(cudaStreamCreateWithFlags(&x->st, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!rc) rc = k3k_xk_setup(x->st, x->device, &x->caps);
  if (!rc) rc = slot_get(x, XK_NI_BIG, 16384, 64, &s); /* one slot ready: 64 MiB jobs */
  if (rc) {
    k3k_cuda_xdev_close(&x->base);
    return rc;
  }
  slot_put(x, s);
  *out = &x->base;
  return 0;
}

extern "C" void k3k_cuda_xdev_close(k3k_xdev_t *xb) {
  cu_xdev *x = (cu_xdev *)xb;
  cudaError_t e = cudaSetDevice(x->device);
  if (e == cudaSuccess && x->st) e = cudaStreamSynchronize(x->st); /* jobs and their notifies */
  for (cu_xjob *j = x->jobs; j; j = j->next)
    if (j->state == J_RUNNING) finish(j, e == cudaSuccess ? cudaEventQuery(j->slot->done) : e);
  (void)cudaGetLastError();
  while (x->all_slots) {
    xslot *s = x->all_slots;
    x->all_slots = s->anext;
    slot_destroy(s);
  }
  x->free_slots = NULL;
  if (x->st) cudaStreamDestroy(x->st);
  x->st = NULL;
  x->closed = true;
  if (!x->live) free(x);
}

static int launch(cu_xdev *x, xslot *s, const k3k_xplan_size_t *sz) {
  size_t n_ent = (size_t)(sz->n_groups + sz->n_pieces);
  if (!sz->n_chunks) {
    x->last_path = XK_PATH_NONE;
    return 0;
  }
  (void)cudaGetLastError(); /* a non-sticky error left by an earlier call is not ours */
  return k3k_xk_launch(x->st, &x->caps, x->kernel, (uint32_t)sz->n_chunks, (uint32_t)sz->n_groups, s->hent,
                       n_ent, s->dent, s->ddig, &x->last_path);
}

extern "C" int k3k_cuda_xdev_submit(k3k_xdev_t *xb, const k3k_xseg_t *segs, const uint32_t *first,
                                    uint32_t n_regions, void (*notify)(void *ud), void *ud,
                                    k3k_xjob_t **out) {
  cu_xdev *x = (cu_xdev *)xb;
  if (x->closed) return K3_EINVAL;
  k3k_xplan_size_t sz;
  k3k_xplan_measure(segs, first, n_regions, &sz);
  size_t n_ent = (size_t)(sz.n_groups + sz.n_pieces);
  cu_xjob *j = (cu_xjob *)calloc(1, sizeof *j);
  uint64_t *dig = (uint64_t *)malloc(((size_t)n_regions + 1) * sizeof *dig);
  notify_rec *rec = notify ? (notify_rec *)malloc(sizeof *rec) : NULL;
  if (!j || !dig || (notify && !rec)) {
    free(j);
    free(dig);
    free(rec);
    return K3_ENOMEM;
  }
  xslot *s = NULL;
  int rc = cu_ok(cudaSetDevice(x->device), "cudaSetDevice");
  if (!rc) rc = slot_get(x, n_ent, sz.n_chunks, n_regions, &s);
  if (rc) {
    free(j);
    free(dig);
    free(rec);
    return rc;
  }
  uint64_t t_sub = k3_now_ns();
  k3k_xplan_fill(segs, first, n_regions, &sz, s->hent, s->rchunk);
  if (x->trace) rc = cu_ok(cudaEventRecord(s->start, x->st), "cudaEventRecord");
  if (!rc) rc = launch(x, s, &sz);
  if (!rc) rc = cu_ok(cudaEventRecord(s->done, x->st), "cudaEventRecord");
  if (!rc && rec) {
    rec->fn = notify;
    rec->ud = ud;
    rec->ran = 0;
    rc = cu_ok(cudaLaunchHostFunc(x->st, run_notify, rec), "cudaLaunchHostFunc");
  }
  if (rc) { /* something may be queued: let it end before the slot can be reused */
    if (cudaStreamSynchronize(x->st) != cudaSuccess) (void)cudaGetLastError();
    slot_put(x, s);
    free(j);
    free(dig);
    free(rec);
    return rc;
  }
  j->base.device = true;
  j->x = x;
  j->slot = s;
  j->state = J_RUNNING;
  j->n_regions = n_regions;
  j->dig = dig;
  j->t_submit_ns = t_sub;
  j->n_chunks = sz.n_chunks;
  j->rec = rec;
  j->next = x->jobs;
  if (x->jobs) x->jobs->prev = j;
  x->jobs = j;
  x->live++;
  *out = &j->base;
  return 0;
}

extern "C" int k3k_cuda_xdev_poll(k3k_xjob_t *jb, uint64_t *digests) {
  cu_xjob *j = (cu_xjob *)jb;
  if (j->state == J_RUNNING) {
    if (cu_ok(cudaSetDevice(j->x->device), "cudaSetDevice")) return K3_EDEVICE;
    cudaError_t e = cudaEventQuery(j->slot->done);
    if (e == cudaErrorNotReady) { /* not an error: never leave it for a later launch check */
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      return 0;
    }
    if (e == cudaSuccess && !digests) return 1; /* done; the combine waits for a poll with digests */
    finish(j, e);
  }
  if (j->state == J_FAILED) return K3_EDEVICE;
  if (j->n_regions && digests) memcpy(digests, j->dig, (size_t)j->n_regions * sizeof *digests);
  return 1;
}

extern "C" void k3k_cuda_xdev_job_free(k3k_xjob_t *jb) {
  cu_xjob *j = (cu_xjob *)jb;
  cu_xdev *x = j->x;
  if (j->state == J_RUNNING) { /* only while x is open: close finished every job */
    cudaError_t e = cudaSetDevice(x->device);
    if (e == cudaSuccess) e = cudaEventSynchronize(j->slot->done);
    finish(j, e);
  }
  notify_drop(j->rec, j->state == J_FAILED);
  if (j->prev) j->prev->next = j->next;
  else x->jobs = j->next;
  if (j->next) j->next->prev = j->prev;
  free(j->dig);
  free(j);
  if (--x->live == 0 && x->closed) free(x);
}

extern "C" int k3k_cuda_device_uuid(k3k_backend_t *be, uint8_t uuid[16]) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  if (!cx) return K3_ENOTSUP;
  cudaDeviceProp p;
  K3K_CU(cudaGetDeviceProperties(&p, cx->device));
  memcpy(uuid, p.uuid.bytes, 16);
  return 0;
}

extern "C" int k3k_cuda_device_mem(k3k_backend_t *be, size_t *free_bytes, size_t *total_bytes) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  if (!cx) return K3_ENOTSUP;
  K3K_CU(cudaSetDevice(cx->device));
  K3K_CU(cudaMemGetInfo(free_bytes, total_bytes));
  return 0;
}

/* ---- hooks (xdev_cuda.h) ---- */

extern "C" cudaStream_t k3k_cuda_xdev_stream(k3k_xdev_t *xb) {
  return xb && xb->device ? ((cu_xdev *)xb)->st : NULL;
}
extern "C" size_t k3k_cuda_xdev_slots(k3k_xdev_t *xb) {
  return xb && xb->device ? ((cu_xdev *)xb)->n_slots : 0;
}
extern "C" int k3k_cuda_xdev_last_path(k3k_xdev_t *xb) {
  return xb && xb->device ? ((cu_xdev *)xb)->last_path : 0;
}
extern "C" int k3k_cuda_xdev_set_kernel(k3k_xdev_t *xb, int kernel) {
  if (!xb || !xb->device || (kernel != 1 && kernel != 2)) return K3_EINVAL;
  ((cu_xdev *)xb)->kernel = kernel;
  return 0;
}
extern "C" int k3k_cuda_xdev_kernel(k3k_xdev_t *xb) {
  return xb && xb->device ? ((cu_xdev *)xb)->kernel : 0;
}
extern "C" uint32_t k3k_cuda_xdev_cap_warps(k3k_xdev_t *xb, int path) {
  if (!xb || !xb->device || path < 1 || path > 4) return 0;
  return ((cu_xdev *)xb)->caps.cap_warps[path - 1];
}
