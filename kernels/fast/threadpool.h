/* A minimal fork-join pthread pool for the "cpu-fast" backend: k3k_pool_run() runs fn(ctx, task,
 * worker) for task = 0..n_tasks−1 on the caller plus (threads−1) workers, handing out tasks
 * through an atomic counter, and returns when all are done. One run at a time per pool (the
 * backend serialises calls). Tasks must not block on each other. */
#ifndef K3K_THREADPOOL_H
#define K3K_THREADPOOL_H

#include <stdint.h>

typedef struct k3k_pool k3k_pool_t;
typedef void (*k3k_task_fn)(void *ctx, int64_t task, int worker);

/* threads >= 1 (1 = run everything on the caller). Returns NULL on allocation/thread failure. */
k3k_pool_t *k3k_pool_create(int threads);
void k3k_pool_destroy(k3k_pool_t *pool);
int k3k_pool_threads(const k3k_pool_t *pool);
void k3k_pool_run(k3k_pool_t *pool, int64_t n_tasks, k3k_task_fn fn, void *ctx);

#endif
