/* Fork-join pool (see threadpool.h). A run publishes (fn, ctx, n_tasks), bumps the generation
 * counter, works on tasks itself, then waits until every worker has reported done for that
 * generation. Both waits spin first, then sleep: workers watch `gen` and the caller watches
 * `finished` for up to spin_ns (K3PD_FAST_SPIN_US, default 100 µs), yielding the CPU between
 * checks, before falling back to the condition variables. Why: a decode step makes thousands of
 * pool runs of 0.1–1 ms each (one per expert GEMM); a condition-variable wake and join costs
 * 50–60 µs per run on a VM (measured: test_kernels' 1×64×64 MXFP4 GEMM at 2 threads), about as
 * much as the work itself, while the spin catches the next run within a microsecond.
 * Protocol: gen and finished are atomics, also written under mu so that a sleeper cannot miss a
 * wake (a waiter re-checks them under mu before cond_wait; writers bump them and signal under
 * mu). A worker cannot skip a generation: the caller starts the next run only after every
 * worker reported the previous one. Lock order: only pool->mu. Destroy sets `quit` and joins. */
#define _DEFAULT_SOURCE 1 /* sched_yield */
#include "fast/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "k3pd/util.h"

/* Default spin before sleeping (ns); K3PD_FAST_SPIN_US overrides it (0 = sleep at once). */
#define SPIN_NS_DEFAULT ((uint64_t)100 * 1000)

struct k3k_pool {
  int threads;
  int64_t min_work; /* k3k_pool_run_work's threshold */
  uint64_t spin_ns; /* how long a wait spins before it sleeps */
  pthread_t *tid;
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  atomic_uint_fast64_t gen; /* bumped per run (under mu) */
  atomic_int finished;      /* workers done with the current generation */
  atomic_bool quit;         /* set under mu */
  k3k_task_fn fn;           /* fn, ctx, n_tasks: written by the caller before gen is bumped */
  void *ctx;
  int64_t n_tasks;
  atomic_int_fast64_t next;
  void *scratch; /* k3k_pool_scratch's buffer (owned), scratch_bytes long */
  size_t scratch_bytes;
};

/* spin_gen: until gen differs from `old` (or quit is set); spin_finished: until `finished`
 * reaches `want`. Each gives up after spin_ns and returns false (the caller then sleeps);
 * true when the condition holds. Yields every 16 checks so an oversubscribed machine (more
 * threads than free cores) still runs whoever has work. */
static bool spin_gen(const k3k_pool_t *p, uint64_t old) {
  if (!p->spin_ns) return false;
  uint64_t end = k3_now_ns() + p->spin_ns;
  for (unsigned i = 0;; i++) {
    if (atomic_load(&p->gen) != old || atomic_load(&p->quit)) return true;
    if ((i & 15) == 15) {
      if (k3_now_ns() > end) return false;
      sched_yield();
    }
  }
}
static bool spin_finished(const k3k_pool_t *p, int want) {
  if (!p->spin_ns) return false;
  uint64_t end = k3_now_ns() + p->spin_ns;
  for (unsigned i = 0;; i++) {
    if (atomic_load(&p->finished) >= want) return true;
    if ((i & 15) == 15) {
      if (k3_now_ns() > end) return false;
      sched_yield();
    }
  }
}

typedef struct {
  k3k_pool_t *pool;
  int worker;
} warg_t;

static void drain(k3k_pool_t *p, int worker) {
  for (;;) {
    int64_t t = atomic_fetch_add(&p->next, 1);
    if (t >= p->n_tasks) return;
    p->fn(p->ctx, t, worker);
  }
}

static void *worker_main(void *arg) {
  warg_t a = *(warg_t *)arg;
  free(arg);
  k3k_pool_t *p = a.pool;
  uint64_t seen = 0;
  for (;;) {
    if (!spin_gen(p, seen)) {
      pthread_mutex_lock(&p->mu);
      while (!atomic_load(&p->quit) && atomic_load(&p->gen) == seen)
        pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->quit)) break;
    seen = atomic_load(&p->gen);
    drain(p, a.worker);
    if (atomic_fetch_add(&p->finished, 1) + 1 == p->threads - 1) {
      /* The caller may be asleep on `done`: signal under mu (it re-checks under mu). */
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

k3k_pool_t *k3k_pool_create(int threads) {
  if (threads < 1) return NULL;
  k3k_pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = threads;
  p->min_work = K3K_POOL_MIN_WORK;
  const char *mw = getenv("K3PD_FAST_MIN_WORK");
  if (mw && *mw) {
    char *end;
    long long v = strtoll(mw, &end, 10);
    if (*end == 0 && v >= 0) p->min_work = v;
  }
  p->spin_ns = SPIN_NS_DEFAULT;
  const char *sp = getenv("K3PD_FAST_SPIN_US");
  if (sp && *sp) {
    char *end;
    long long v = strtoll(sp, &end, 10);
    if (*end == 0 && v >= 0 && v <= 1000000) p->spin_ns = (uint64_t)v * 1000;
  }
  atomic_init(&p->gen, 0);
  atomic_init(&p->finished, 0);
  atomic_init(&p->quit, false);
  atomic_init(&p->next, 0);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  p->tid = calloc((size_t)threads, sizeof *p->tid);
  if (!p->tid) goto err;
  for (int i = 1; i < threads; i++) {
    warg_t *a = malloc(sizeof *a);
    if (!a) goto err_threads;
    *a = (warg_t){p, i};
    if (pthread_create(&p->tid[i], NULL, worker_main, a)) {
      free(a);
      goto err_threads;
    }
    continue;
  err_threads:
    p->threads = i; /* only workers 1..i−1 exist */
    k3k_pool_destroy(p);
    return NULL;
  }
  return p;
err:
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  free(p);
  return NULL;
}

void k3k_pool_destroy(k3k_pool_t *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->quit, true);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->threads; i++) pthread_join(p->tid[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  free(p->tid);
  free(p->scratch);
  free(p);
}

int k3k_pool_threads(const k3k_pool_t *p) { return p->threads; }

void k3k_pool_run(k3k_pool_t *p, int64_t n_tasks, k3k_task_fn fn, void *ctx) {
  if (n_tasks <= 0) return;
  if (p->threads == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  p->fn = fn;
  p->ctx = ctx;
  p->n_tasks = n_tasks;
  atomic_store(&p->next, 0);
  atomic_store(&p->finished, 0);
  /* The seq_cst store of gen publishes fn/ctx/n_tasks to workers that see the new value. */
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->gen, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  drain(p, 0);
  if (!spin_finished(p, p->threads - 1)) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->finished) < p->threads - 1) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
}

int64_t k3k_pool_min_work(const k3k_pool_t *p) { return p->min_work; }

void k3k_pool_run_work(k3k_pool_t *p, int64_t n_tasks, int64_t work, k3k_task_fn fn, void *ctx) {
  if (work >= p->min_work) {
    k3k_pool_run(p, n_tasks, fn, ctx);
    return;
  }
  for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
}

void *k3k_pool_scratch(k3k_pool_t *p, size_t bytes) {
  if (bytes <= p->scratch_bytes && p->scratch) return p->scratch;
  size_t n = (bytes + 63) & ~(size_t)63;
  void *b = aligned_alloc(64, n ? n : 64);
  if (!b) return NULL;
  free(p->scratch);
  p->scratch = b;
  p->scratch_bytes = n;
  return b;
}
