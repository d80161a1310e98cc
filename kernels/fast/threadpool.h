/* A minimal fork-join pthread pool for the "cpu-fast" backend: k3k_pool_run() runs fn(ctx, task,
 * worker) for task = 0..n_tasks−1 on the caller plus (threads−1) workers, handing out tasks
 * through an atomic counter, and returns when all are done. One run at a time per pool (the
 * backend serialises calls). Tasks must not block on each other. Idle workers spin (yielding)
 * for K3PD_FAST_SPIN_US microseconds (read at creation; default 100, 0 = never) after a run
 * before sleeping, and so does the caller waiting for the workers: back-to-back runs (the
 * per-expert GEMMs of a decode step) then skip the condition-variable wake-ups. */
#ifndef K3K_THREADPOOL_H
#define K3K_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct k3k_pool k3k_pool_t;
typedef void (*k3k_task_fn)(void *ctx, int64_t task, int worker);

/* threads >= 1 (1 = run everything on the caller). Returns NULL on allocation/thread failure. */
k3k_pool_t *k3k_pool_create(int threads);
void k3k_pool_destroy(k3k_pool_t *pool);
int k3k_pool_threads(const k3k_pool_t *pool);
void k3k_pool_run(k3k_pool_t *pool, int64_t n_tasks, k3k_task_fn fn, void *ctx);

/* Default work (about multiply-adds or elements touched) below which waking and joining the
 * workers costs more than the op itself (decode-sized ops of small models; measured on the
 * tiny presets). Each pool reads K3PD_FAST_MIN_WORK from the environment at creation instead
 * when set (0 = always use the workers: tests use it to exercise the threaded path on small
 * shapes). */
#define K3K_POOL_MIN_WORK ((int64_t)1 << 18)
int64_t k3k_pool_min_work(const k3k_pool_t *pool);
/* A scratch buffer of at least `bytes` bytes, 64-byte aligned, owned by the pool: kept (and
 * only grown) between calls, freed by k3k_pool_destroy. Valid until the next call; for the one
 * op using the pool at a time (the backend serialises ops). NULL when it cannot grow (the old
 * buffer is then kept). Its contents are not preserved when it grows. */
void *k3k_pool_scratch(k3k_pool_t *pool, size_t bytes);
/* k3k_pool_run, except that a run whose estimated `work` is below the pool's minimum executes
 * every task on the caller (worker 0). Tasks are independent, so results do not change. */
void k3k_pool_run_work(k3k_pool_t *pool, int64_t n_tasks, int64_t work, k3k_task_fn fn, void *ctx);

#endif
