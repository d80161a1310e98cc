/* The "cpu-fast" backend: host memory like "cpu", a thread pool, the packed GEMMs of
 * fast_gemm.c and the parallel drivers of fast_ops.c; every op without a faster version runs
 * the reference. A mutex serialises run() so the pool serves one op at a time. */
#include <pthread.h>
#include <stdlib.h>

#include "fast/fast.h"

typedef struct {
  pthread_mutex_t mu;
  k3k_pool_t *pool;
} fast_t;

static bool fast_supports(k3k_backend_t *be, k3k_op_t op, const void *params,
                          const k3k_tensor_t *const *t, int nt) {
  if (!k3k_cpu_ref_fn(op)) return false;
  for (int i = 0; i < nt; i++)
    if (t[i] && t[i]->backend && !t[i]->backend->host_memory) return false;
  return true;
}

static int dispatch(k3k_pool_t *pool, k3k_op_t op, const void *params,
                    const k3k_tensor_t *const *t, int nt);

/* An op of MOE_ROUTED's chain through this backend's own dispatch (GEMMs packed). */
static int chain_run(void *ctx, k3k_op_t op, const void *params, const k3k_tensor_t *const *t) {
  return dispatch(ctx, op, params, t, k3k_op_nargs(op));
}

static int fast_run(k3k_backend_t *be, k3k_op_t op, const void *params,
                    const k3k_tensor_t *const *t, int nt) {
  fast_t *f = be->ctx;
  pthread_mutex_lock(&f->mu);
  const int rc = dispatch(f->pool, op, params, t, nt);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

/* One op on the pool (the caller holds the mutex). */
static int dispatch(k3k_pool_t *pool, k3k_op_t op, const void *params,
                    const k3k_tensor_t *const *t, int nt) {
  int rc;
  if (op == K3K_OP_MOE_ROUTED) {
    rc = k3k_moe_routed_chain(chain_run, pool, params, t);
  } else if (op == K3K_OP_GEMM || op == K3K_OP_MXFP4_GEMM) {
    rc = k3k_fast_gemm(pool, t, op == K3K_OP_MXFP4_GEMM);
  } else if (op == K3K_OP_GEMM_MULTI) { /* the reference's chain, each GEMM packed */
    rc = 0;
    for (int j = 0; j < ((const k3k_gemm_multi_params_t *)params)->n && !rc; j++) {
      const k3k_tensor_t *g[3] = {t[0], t[1 + j], t[1 + K3K_GEMM_MULTI_MAX + j]};
      rc = k3k_fast_gemm(pool, g, false);
    }
  } else if ((rc = k3k_fast_op(pool, op, params, t, nt)) == K3_ENOTSUP) {
    rc = k3k_cpu_ref_fn(op)(params, t);
  }
  return rc;
}

k3k_backend_t *k3k_cpu_fast_backend_create(int threads) {
  k3k_backend_t *be = calloc(1, sizeof *be);
  fast_t *f = calloc(1, sizeof *f);
  if (!be || !f || !(f->pool = k3k_pool_create(threads))) {
    free(be);
    free(f);
    return NULL;
  }
  pthread_mutex_init(&f->mu, NULL);
  be->name = "cpu-fast";
  be->ctx = f;
  be->host_memory = true;
  be->alloc = k3k_cpu_mem_alloc;
  be->free = k3k_cpu_mem_free;
  be->copy_from_host = k3k_cpu_mem_copy;
  be->copy_to_host = k3k_cpu_mem_copy;
  be->copy = k3k_cpu_mem_copy;
  be->memset = k3k_cpu_mem_memset;
  be->synchronize = k3k_cpu_sync;
  be->supports = fast_supports;
  be->run = fast_run;
  return be;
}

int k3k_cpu_fast_resize(k3k_backend_t *be, int threads) {
  fast_t *f = be->ctx;
  k3k_pool_t *np = k3k_pool_create(threads);
  if (!np) return K3_ENOMEM;
  pthread_mutex_lock(&f->mu);
  k3k_pool_t *old = f->pool;
  f->pool = np;
  pthread_mutex_unlock(&f->mu);
  k3k_pool_destroy(old);
  return 0;
}

void k3k_cpu_fast_backend_destroy(k3k_backend_t *be) {
  if (!be) return;
  fast_t *f = be->ctx;
  k3k_pool_destroy(f->pool);
  pthread_mutex_destroy(&f->mu);
  free(f);
  free(be);
}
