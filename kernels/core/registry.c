/* Backend registry and k3k_run(). Backends are created lazily on first k3k_backend_get() and
 * kept until k3k_backends_shutdown(); one mutex guards creation. The CUDA backend is linked in
 * only when kernels/cuda/ exists and CUDA was found (K3K_HAVE_CUDA); it is then created through
 * k3k_cuda_backend_create(), so this file needs no CUDA headers. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/k3k_internal.h"
#include "k3pd/log.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static k3k_backend_t *g_cpu, *g_fast, *g_cuda;
static bool g_cuda_tried;
static int g_fast_threads; /* 0 = not chosen yet */

static const char *const k_names[] = {"cpu", "cpu-fast",
#ifdef K3K_HAVE_CUDA
                                      "cuda",
#endif
                                      NULL};

const char *const *k3k_backend_names(void) { return k_names; }

static int default_threads(void) {
  const char *e = getenv("K3PD_KERNEL_THREADS");
  if (e && *e) {
    int n = atoi(e);
    if (n >= 1 && n <= 256) return n;
    K3_WARN("K3PD_KERNEL_THREADS=%s ignored (want 1..256)", e);
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

k3k_backend_t *k3k_backend_get(const char *name) {
  if (!name) return NULL;
  k3k_backend_t *be = NULL;
  pthread_mutex_lock(&g_mu);
  if (!strcmp(name, "cpu")) {
    if (!g_cpu) g_cpu = k3k_cpu_backend_create();
    be = g_cpu;
  } else if (!strcmp(name, "cpu-fast")) {
    if (!g_fast_threads) g_fast_threads = default_threads();
    if (!g_fast) g_fast = k3k_cpu_fast_backend_create(g_fast_threads);
    be = g_fast;
  } else if (!strcmp(name, "cuda")) {
#ifdef K3K_HAVE_CUDA
    if (!g_cuda && !g_cuda_tried) {
      g_cuda_tried = true;
      if (k3k_cuda_backend_create(&g_cuda) != 0) g_cuda = NULL;
    }
#endif
    be = g_cuda;
  }
  pthread_mutex_unlock(&g_mu);
  return be;
}

void k3k_backends_shutdown(void) {
  pthread_mutex_lock(&g_mu);
  if (g_cpu) k3k_cpu_backend_destroy(g_cpu);
  if (g_fast) k3k_cpu_fast_backend_destroy(g_fast);
#ifdef K3K_HAVE_CUDA
  if (g_cuda) k3k_cuda_backend_destroy(g_cuda);
#endif
  g_cpu = g_fast = g_cuda = NULL;
  g_cuda_tried = false;
  pthread_mutex_unlock(&g_mu);
}

int k3k_cpu_fast_set_threads(int n) {
  if (n < 1 || n > 256) return K3_EINVAL;
  pthread_mutex_lock(&g_mu);
  g_fast_threads = n;
  int rc = g_fast ? k3k_cpu_fast_resize(g_fast, n) : 0;
  pthread_mutex_unlock(&g_mu);
  return rc;
}

int k3k_cpu_fast_get_threads(void) {
  pthread_mutex_lock(&g_mu);
  if (!g_fast_threads) g_fast_threads = default_threads();
  int n = g_fast_threads;
  pthread_mutex_unlock(&g_mu);
  return n;
}

/* Names the op and its operands the first time a backend refuses an op kind (a runner error
 * "not supported" alone does not say which op of a forward pass it was). Once per (backend
 * name, op) for the process: refusals can be probes (the op tests skip on them). */
static void log_unsupported(const k3k_backend_t *be, k3k_op_t op, const k3k_tensor_t *const *t,
                            int nt) {
  static char seen[8][K3K_OP_COUNT];
  static const char *names[8];
  int b = 0;
  pthread_mutex_lock(&g_mu);
  while (b < 8 && names[b] && strcmp(names[b], be->name)) b++;
  bool first = false;
  if (b < 8 && (int)op >= 0 && (int)op < K3K_OP_COUNT) {
    if (!names[b]) names[b] = be->name;
    first = !seen[b][op];
    seen[b][op] = 1;
  }
  pthread_mutex_unlock(&g_mu);
  if (!first) return;
  char shapes[200];
  size_t o = 0;
  for (int i = 0; i < nt && o + 40 < sizeof shapes; i++) {
    o += (size_t)snprintf(shapes + o, sizeof shapes - o, "%s[", i ? " " : "");
    for (int d = 0; t[i] && d < t[i]->ndim; d++)
      o += (size_t)snprintf(shapes + o, sizeof shapes - o, d ? "x%lld" : "%lld", (long long)t[i]->shape[d]);
    o += (size_t)snprintf(shapes + o, sizeof shapes - o, "]%s", t[i] ? k3k_dtype_name(t[i]->dtype) : "-");
  }
  K3_WARN("k3k: backend %s does not support %s with operands %s (later refusals of this op are "
          "not logged)", be->name, k3k_op_name(op), shapes);
}

/* The slot of an op's device scratch (k3k.h k3k_workspace), -1 for ops without one. */
static int ws_slot(k3k_op_t op) { return op == K3K_OP_MOE_ROUTED ? 7 : -1; }

int k3k_run(k3k_backend_t *be, k3k_op_t op, const void *params, const k3k_tensor_t *const *t,
            int nt) {
  if (!be) return K3_EINVAL;
  char err[256];
  int rc = k3k_op_validate(op, params, t, nt, err, sizeof err);
  if (rc) {
    K3_DEBUG("k3k_run(%s): %s", be->name, err);
    return rc;
  }
  if (!be->supports(be, op, params, t, nt)) {
    log_unsupported(be, op, t, nt);
    return K3_ENOTSUP;
  }
  const int ws = ws_slot(op);
  if (ws >= 0) {
    const size_t need = k3k_workspace(be, op, params, t, nt);
    const size_t have = t[ws] ? (size_t)t[ws]->shape[0] : 0;
    if (have < need) {
      K3_DEBUG("k3k_run(%s): %s: t[%d] ws: %zu bytes, the backend needs %zu", be->name,
               k3k_op_name(op), ws, have, need);
      return K3_EINVAL;
    }
  }
  return be->run(be, op, params, t, nt);
}

size_t k3k_workspace(k3k_backend_t *be, k3k_op_t op, const void *params,
                     const k3k_tensor_t *const *t, int nt) {
  return be && be->workspace ? be->workspace(be, op, params, t, nt) : 0;
}

bool k3k_supports(k3k_backend_t *be, k3k_op_t op, const void *params, const k3k_tensor_t *const *t,
                  int nt) {
  return be && k3k_op_validate(op, params, t, nt, NULL, 0) == 0 &&
         be->supports(be, op, params, t, nt);
}

/* Defaults of the optional vtable slots: a backend that runs ops in issue order needs no side
 * lane (every request keeps the meaning as a no-op) and has no graphs (k3k.h). */
int k3k_backend_side(k3k_backend_t *be, int what, int mark) {
  if (!be || what < K3K_SIDE_INIT || what > K3K_SIDE_WAIT) return K3_EINVAL;
  return be->side ? be->side(be, what, mark) : 0;
}

int k3k_backend_graph(k3k_backend_t *be, int what, void **g) {
  if (!be || what < K3K_GRAPH_BEGIN || what > K3K_GRAPH_FREE) return K3_EINVAL;
  return be->graph ? be->graph(be, what, g) : K3_ENOTSUP;
}
