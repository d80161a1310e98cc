/* Fork-join pool (see threadpool.h). Workers sleep on a condition variable keyed by a
 * generation counter; a run publishes (fn, ctx, n_tasks), bumps the generation, works on tasks
 * itself, then waits until every worker has reported done for that generation. Lock order: only
 * pool->mu. Destroy sets `quit` and joins. */
#include "fast/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct k3k_pool {
  int threads;
  int64_t min_work; /* k3k_pool_run_work's threshold */
  pthread_t *tid;
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  uint64_t gen;  /* bumped per run; guarded by mu */
  int finished;  /* workers done with the current generation; guarded by mu */
  bool quit;
  k3k_task_fn fn;
  void *ctx;
  int64_t n_tasks;
  atomic_int_fast64_t next;
  void *scratch; /* k3k_pool_scratch's buffer (owned), scratch_bytes long */
  size_t scratch_bytes;
};

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
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->quit && p->gen == seen) pthread_cond_wait(&p->wake, &p->mu);
    if (p->quit) break;
    seen = p->gen;
    pthread_mutex_unlock(&p->mu);
    drain(p, a.worker);
    pthread_mutex_lock(&p->mu);
    if (++p->finished == p->threads - 1) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
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
  p->quit = true;
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
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->n_tasks = n_tasks;
  atomic_store(&p->next, 0);
  p->finished = 0;
  p->gen++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  drain(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->finished < p->threads - 1) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
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
