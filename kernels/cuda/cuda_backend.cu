/* The "cuda" backend: device context, memory pool, `supports`, and op dispatch.
 *
 * What it is for: implements k3k_backend_t on one NVIDIA GPU (device K3PD_CUDA_DEVICE, default
 * 0). All work is queued on one non-blocking stream in call order; copies to and from the host
 * are synchronous (the caller may reuse host buffers at once). Memory comes from plain
 * cudaMalloc (never managed memory) through a size-bucketed cache, so the model runner's
 * per-step scratch does not hit cudaMalloc/cudaFree in steady state.
 * What it is not: thread-safe (k3k.h: one thread per backend instance) or multi-GPU.
 * Invariants: every CUDA call is checked (K3K_CU) and every launch (K3K_LAUNCHED); with
 * K3PD_CUDA_SYNC=1 each op is followed by a stream synchronisation so an asynchronous fault is
 * reported by the op that caused it (the GPU tests set it), except while the stream is being
 * captured into a CUDA graph (a synchronisation would invalidate the capture). ctx->mem_gen
 * counts reallocations of the implicit scratch memory (graphs captured before are stale). `supports` answers false for any
 * tensor not owned by this backend. */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "generic.h"
#include "moe_dq.h"
#include "moe_ops.h"

/* ---- memory pool: live blocks in an open-addressed table, freed blocks cached by size ---- */
typedef struct {
  void *p;
  size_t bytes;
} blk;
struct k3k_cuda_pool {
  blk *live;      /* open addressing, p == NULL empty, p == (void*)1 tombstone */
  size_t live_cap, live_n, live_used;
  blk *cached;    /* freed blocks kept for reuse */
  size_t cached_n, cached_cap, cached_bytes;
};
#define TOMB ((void *)1)

static size_t round_size(size_t b) {
  if (b <= 4096) return 4096;
  if (b <= (1u << 20)) { /* powers of two up to 1 MiB */
    size_t r = 4096;
    while (r < b) r <<= 1;
    return r;
  }
  return (b + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1); /* 2 MiB granules */
}
static size_t hslot(void *p, size_t cap) { return ((uintptr_t)p >> 8) * 11400714819323198485ull % cap; }

static int live_put(k3k_cuda_pool *pl, void *p, size_t bytes);
static int live_grow(k3k_cuda_pool *pl) {
  size_t ncap = pl->live_cap ? pl->live_cap * 2 : 256;
  blk *old = pl->live;
  size_t ocap = pl->live_cap;
  blk *nt = (blk *)calloc(ncap, sizeof *nt);
  if (!nt) return K3_ENOMEM;
  pl->live = nt;
  pl->live_cap = ncap;
  pl->live_n = pl->live_used = 0;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].p && old[i].p != TOMB) live_put(pl, old[i].p, old[i].bytes);
  free(old);
  return 0;
}
static int live_put(k3k_cuda_pool *pl, void *p, size_t bytes) {
  if ((pl->live_used + 1) * 2 > pl->live_cap) {
    int rc = live_grow(pl);
    if (rc) return rc;
  }
  size_t i = hslot(p, pl->live_cap);
  while (pl->live[i].p && pl->live[i].p != TOMB) i = (i + 1) % pl->live_cap;
  if (!pl->live[i].p) pl->live_used++;
  pl->live[i].p = p;
  pl->live[i].bytes = bytes;
  pl->live_n++;
  return 0;
}
static bool live_take(k3k_cuda_pool *pl, void *p, size_t *bytes) {
  if (!pl->live_cap) return false;
  size_t i = hslot(p, pl->live_cap);
  while (pl->live[i].p) {
    if (pl->live[i].p == p) {
      *bytes = pl->live[i].bytes;
      pl->live[i].p = TOMB;
      pl->live_n--;
      return true;
    }
    i = (i + 1) % pl->live_cap;
  }
  return false;
}
static void pool_trim(k3k_cuda_pool *pl) {
  for (size_t i = 0; i < pl->cached_n; i++) cudaFree(pl->cached[i].p);
  pl->cached_n = 0;
  pl->cached_bytes = 0;
}

static int pool_alloc(k3k_cuda_pool *pl, size_t bytes, void **out) {
  size_t want = round_size(bytes);
  for (size_t i = 0; i < pl->cached_n; i++) /* exact bucket match keeps fragmentation low */
    if (pl->cached[i].bytes == want) {
      void *p = pl->cached[i].p;
      pl->cached[i] = pl->cached[--pl->cached_n];
      pl->cached_bytes -= want;
      if (live_put(pl, p, want)) {
        cudaFree(p);
        return K3_ENOMEM;
      }
      *out = p;
      return 0;
    }
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, want);
  if (e != cudaSuccess) { /* give the cache back and retry once */
    (void)cudaGetLastError();
    pool_trim(pl);
    e = cudaMalloc(&p, want);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    K3_ERROR("cuda: cudaMalloc(%zu) failed: %s", want, cudaGetErrorString(e));
    return K3_ENOMEM;
  }
  if (live_put(pl, p, want)) {
    cudaFree(p);
    return K3_ENOMEM;
  }
  *out = p;
  return 0;
}

static void pool_free(k3k_cuda_pool *pl, void *p) {
  size_t bytes;
  if (!p || !live_take(pl, p, &bytes)) return;
  if (pl->cached_n == pl->cached_cap) {
    size_t nc = pl->cached_cap ? pl->cached_cap * 2 : 64;
    blk *n = (blk *)realloc(pl->cached, nc * sizeof *n);
    if (!n) {
      cudaFree(p);
      return;
    }
    pl->cached = n;
    pl->cached_cap = nc;
  }
  pl->cached[pl->cached_n].p = p;
  pl->cached[pl->cached_n++].bytes = bytes;
  pl->cached_bytes += bytes;
}

static void pool_destroy(k3k_cuda_pool *pl) {
  if (!pl) return;
  pool_trim(pl);
  for (size_t i = 0; i < pl->live_cap; i++)
    if (pl->live[i].p && pl->live[i].p != TOMB) cudaFree(pl->live[i].p);
  free(pl->live);
  free(pl->cached);
  free(pl);
}

/* ---- context ---- */
k3k_cuda_ctx *k3k_cuda_ctx_of(k3k_backend_t *be) {
  return (be && be->name && !strcmp(be->name, "cuda")) ? (k3k_cuda_ctx *)be->ctx : NULL;
}

int k3k_cuda_scratch(k3k_cuda_ctx *cx, size_t bytes, void **out) {
  if (bytes > cx->scratch_bytes) {
    size_t nb = bytes + bytes / 4;
    void *p = NULL;
    /* Work queued on the stream may still read the old scratch. */
    K3K_CU(cudaStreamSynchronize(cx->stream));
    if (cx->scratch) K3K_CU(cudaFree(cx->scratch));
    cx->scratch = NULL;
    cx->scratch_bytes = 0;
    cx->mem_gen++; /* graphs captured with the old scratch are stale */
    if (cudaMalloc(&p, nb) != cudaSuccess) {
      (void)cudaGetLastError();
      K3_ERROR("cuda: scratch of %zu bytes unavailable", nb);
      return K3_ENOMEM;
    }
    cx->scratch = p;
    cx->scratch_bytes = nb;
  }
  *out = cx->scratch;
  return 0;
}

int k3k_cuda_host_scratch(k3k_cuda_ctx *cx, size_t bytes, void **out) {
  if (bytes > cx->host_bytes) {
    size_t nb = bytes + bytes / 4;
    void *p = NULL;
    K3K_CU(cudaStreamSynchronize(cx->stream));
    if (cx->host_buf) K3K_CU(cudaFreeHost(cx->host_buf));
    cx->host_buf = NULL;
    cx->host_bytes = 0;
    cx->mem_gen++;
    if (cudaMallocHost(&p, nb) != cudaSuccess) {
      (void)cudaGetLastError();
      K3_ERROR("cuda: pinned host scratch of %zu bytes unavailable", nb);
      return K3_ENOMEM;
    }
    cx->host_buf = p;
    cx->host_bytes = nb;
  }
  *out = cx->host_buf;
  return 0;
}

static k3k_cuda_ctx *CX(k3k_backend_t *be) { return (k3k_cuda_ctx *)be->ctx; }

static int be_alloc(k3k_backend_t *be, size_t bytes, void **out) {
  K3K_CU(cudaSetDevice(CX(be)->device));
  return pool_alloc(CX(be)->pool, bytes, out);
}
static void be_free(k3k_backend_t *be, void *p) {
  /* Queued work may still use p: wait before it can be handed out again. */
  if (cudaStreamSynchronize(CX(be)->stream) != cudaSuccess) (void)cudaGetLastError();
  pool_free(CX(be)->pool, p);
}
static int be_h2d(k3k_backend_t *be, void *dst, const void *src, size_t bytes) {
  if (!bytes) return 0;
  K3K_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CX(be)->stream));
  K3K_CU(cudaStreamSynchronize(CX(be)->stream));
  return 0;
}
static int be_d2h(k3k_backend_t *be, void *dst, const void *src, size_t bytes) {
  if (!bytes) return 0;
  K3K_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CX(be)->stream));
  K3K_CU(cudaStreamSynchronize(CX(be)->stream));
  return 0;
}
static int be_d2d(k3k_backend_t *be, void *dst, const void *src, size_t bytes) {
  if (!bytes) return 0;
  K3K_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CX(be)->stream));
  return 0;
}
static int be_memset(k3k_backend_t *be, void *dst, int byte, size_t bytes) {
  if (!bytes) return 0;
  K3K_CU(cudaMemsetAsync(dst, byte, bytes, CX(be)->stream));
  return 0;
}
static int be_sync(k3k_backend_t *be) {
  K3K_CU(cudaStreamSynchronize(CX(be)->stream));
  return 0;
}

cudaStream_t k3k_cuda_stream(const k3k_cuda_ctx *cx) { return cx->stream; }
uint64_t k3k_cuda_mem_gen(const k3k_cuda_ctx *cx) { return cx->mem_gen; }

/* ---- ops ---- */
/* One entry per op of k3k_ops.def (k3k_cuda_<name>); every op has a CUDA path, shapes it does
 * not take are refused by cuda_supports. KDA/MLA entries pick the fast or generic kernel. */
static const k3k_cuda_fn k_ops[K3K_OP_COUNT] = {
#define K3K_OP_X(ENUM, name, n_tensors) [K3K_OP_##ENUM] = k3k_cuda_##name,
#include "k3k_ops.def"
#undef K3K_OP_X
};
static k3k_cuda_fn op_fn(k3k_op_t op) {
  return ((int)op >= 0 && op < K3K_OP_COUNT) ? k_ops[op] : NULL;
}

/* Grid y/z dimensions are limited to 65535: ops that put rows there say so. */
static bool rows_fit(int64_t n) { return n <= 65535; }

static bool cuda_supports(k3k_backend_t *be, k3k_op_t op, const void *params,
                          const k3k_tensor_t *const *t, int nt) {
  if (!op_fn(op)) return false;
  for (int i = 0; i < nt; i++)
    if (t[i] && t[i]->backend != be) return false;
  switch (op) {
  case K3K_OP_GEMM: return k3k_cuda_gemm_ok(t);
  case K3K_OP_CONV_PREFILL:
    return t[1]->shape[1] <= 8 && rows_fit(((const k3k_conv_params_t *)params)->n_seqs);
  case K3K_OP_CONV_STEP: return t[1]->shape[1] <= 8 && rows_fit(t[0]->shape[0]);
  case K3K_OP_KDA_STEP: return k3k_cuda_kda_step_any_ok(params, t);
  case K3K_OP_KDA_CHUNK: return k3k_cuda_kda_chunk_any_ok(params, t);
  case K3K_OP_MLA_PREFILL: return k3k_cuda_mla_prefill_any_ok(params, t);
  case K3K_OP_MLA_DECODE: return k3k_cuda_mla_decode_any_ok(params, t);
  case K3K_OP_ATTN_RES_MIX: return t[0]->shape[0] + 1 <= 16;
  case K3K_OP_SAMPLE: return t[0]->shape[1] < INT32_MAX;
  case K3K_OP_ROUTER: case K3K_OP_MOE_COMBINE: return k3k_cuda_moe_ok(op, params, t);
  case K3K_OP_RES_MIX_NORM: case K3K_OP_GEMM_MULTI: case K3K_OP_KDA_DECODE:
    return k3k_cuda_fused_ok(CX(be), op, params, t);
  case K3K_OP_MOE_ROUTED: return k3k_cuda_moe_routed_ok(params, t);
  default: return true;
  }
}

static size_t cuda_workspace(k3k_backend_t *be, k3k_op_t op, const void *params,
                             const k3k_tensor_t *const *t, int nt) {
  (void)be;
  (void)nt;
  return op == K3K_OP_MOE_ROUTED ? k3k_cuda_moe_routed_ws(params, t) : 0;
}

static int cuda_run(k3k_backend_t *be, k3k_op_t op, const void *params,
                    const k3k_tensor_t *const *t, int nt) {
  k3k_cuda_ctx *cx = CX(be);
  K3K_CU(cudaSetDevice(cx->device));
  int rc = op_fn(op)(cx, params, t);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (rc == 0 && getenv("K3PD_CUDA_SYNC") &&
      cudaStreamIsCapturing(cx->stream, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone) {
    cudaError_t e = cudaStreamSynchronize(cx->stream);
    if (e != cudaSuccess) {
      K3_ERROR("cuda: op %s faulted: %s", k3k_op_name(op), cudaGetErrorString(e));
      return K3_EDEVICE;
    }
  }
  return rc;
}

/* The side lane (k3k.h k3k_backend_side): side_stream.cu. */
static int be_side(k3k_backend_t *be, int what, int mark) {
  k3k_cuda_ctx *cx = CX(be);
  switch (what) {
  case K3K_SIDE_INIT: return k3k_cuda_side_init(cx);
  case K3K_SIDE_BEGIN: return k3k_cuda_side_begin(cx);
  case K3K_SIDE_MARK: return k3k_cuda_side_mark(cx, mark);
  case K3K_SIDE_END: return k3k_cuda_side_end(cx);
  case K3K_SIDE_WAIT: return k3k_cuda_side_wait(cx, mark);
  default: return K3_EINVAL;
  }
}

/* Graph capture (k3k.h k3k_backend_graph) of the main stream, relaxed mode (other threads may
 * keep calling the runtime); *g is a cudaGraphExec_t. A capture that failed is cleared from the
 * runtime's error state here (it is not sticky). */
static int be_graph(k3k_backend_t *be, int what, void **g) {
  k3k_cuda_ctx *cx = CX(be);
  switch (what) {
  case K3K_GRAPH_BEGIN:
    K3K_CU(cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeRelaxed));
    return 0;
  case K3K_GRAPH_END: {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    *g = NULL;
    cudaError_t ce = cudaStreamEndCapture(cx->stream, &graph);
    if (ce == cudaSuccess && graph) ce = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (ce != cudaSuccess || !exec) {
      (void)cudaGetLastError();
      return K3_EDEVICE;
    }
    *g = exec;
    return 0;
  }
  case K3K_GRAPH_LAUNCH:
    K3K_CU(cudaGraphLaunch((cudaGraphExec_t)*g, cx->stream));
    return 0;
  case K3K_GRAPH_FREE:
    if (*g) cudaGraphExecDestroy((cudaGraphExec_t)*g);
    *g = NULL;
    return 0;
  default: return K3_EINVAL;
  }
}

void k3k_cuda_backend_destroy(k3k_backend_t *be) {
  if (!be) return;
  k3k_cuda_ctx *cx = CX(be);
  if (cx) {
    cudaSetDevice(cx->device);
    k3k_cuda_side_destroy(cx); /* back on the main lane first */
    if (cx->stream) cudaStreamSynchronize(cx->stream);
    k3k_cu_moe_dq_release(cx);
    if (cx->lt) cublasLtDestroy((cublasLtHandle_t)cx->lt);
    if (cx->lt_ws) cudaFree(cx->lt_ws);
    if (cx->scratch) cudaFree(cx->scratch);
    if (cx->host_buf) cudaFreeHost(cx->host_buf);
    if (cx->check_host) cudaFreeHost(cx->check_host);
    if (cx->check_ev) cudaEventDestroy(cx->check_ev);
    pool_destroy(cx->pool);
    if (cx->stream) cudaStreamDestroy(cx->stream);
    free(cx->algo_cache);
    free(cx);
  }
  free(be);
}

int k3k_cuda_backend_create(k3k_backend_t **out) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    K3_INFO("cuda: no usable device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return K3_EDEVICE;
  }
  k3k_backend_t *be = (k3k_backend_t *)calloc(1, sizeof *be);
  k3k_cuda_ctx *cx = (k3k_cuda_ctx *)calloc(1, sizeof *cx);
  if (!be || !cx) {
    free(be);
    free(cx);
    return K3_ENOMEM;
  }
  be->ctx = cx;
  be->name = "cuda";
  be->host_memory = false;
  be->alloc = be_alloc;
  be->free = be_free;
  be->copy_from_host = be_h2d;
  be->copy_to_host = be_d2h;
  be->copy = be_d2d;
  be->memset = be_memset;
  be->synchronize = be_sync;
  be->supports = cuda_supports;
  be->run = cuda_run;
  be->side = be_side;
  be->graph = be_graph;
  be->workspace = cuda_workspace;
  const char *dev = getenv("K3PD_CUDA_DEVICE");
  cx->device = dev ? atoi(dev) : 0;
  int rc = K3_EDEVICE;
  cublasLtHandle_t lt = NULL;
  cx->pool = (k3k_cuda_pool *)calloc(1, sizeof *cx->pool);
  cx->algo_cache = calloc(1, k3k_cuda_algo_cache_bytes());
  if (!cx->pool || !cx->algo_cache) {
    rc = K3_ENOMEM;
    goto fail;
  }
  if (cx->device < 0 || cx->device >= n) {
    K3_ERROR("cuda: K3PD_CUDA_DEVICE=%d but %d device(s)", cx->device, n);
    goto fail;
  }
  if (cudaSetDevice(cx->device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cx->num_sms, cudaDevAttrMultiProcessorCount, cx->device) !=
          cudaSuccess ||
      cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking) != cudaSuccess) {
    K3_ERROR("cuda: device %d setup failed: %s", cx->device, cudaGetErrorString(cudaGetLastError()));
    goto fail;
  }
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    K3_ERROR("cuda: cublasLtCreate failed");
    goto fail;
  }
  cx->lt = lt;
  cx->lt_ws_bytes = 32u << 20;
  if (cudaMalloc(&cx->lt_ws, cx->lt_ws_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    K3_ERROR("cuda: cuBLASLt workspace allocation failed");
    rc = K3_ENOMEM;
    goto fail;
  }
  *out = be;
  return 0;
fail:
  k3k_cuda_backend_destroy(be);
  return rc;
}
