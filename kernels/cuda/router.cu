/* ROUTER on CUDA: the sigmoid noaux_tc router of spec §5.3 (48B §5.3), one block per token.
 *
 * What it is for: K3K_OP_ROUTER on the "cuda" backend, fed by a GEMM with an F32 output
 * (gate.weight bf16 upcast · x). Same selection as the CPU reference (kernels/cpu/moe.c):
 * scores descending with ties to the lower index, group step = sum of the top-2 biased scores
 * per group, keep the topk_group best groups (ties to the lower group), weights = s (or sc) of
 * the chosen experts in selection order, renormalised with the sum taken in that order.
 * What it is not: the logits GEMM (K3K_OP_GEMM does it) or the MoE plan (moe.cu).
 * Invariants: sigmoid uses accurate expf like the reference, so s differs by at most an ulp or
 * two; expert choice is identical whenever no two candidates are that close (tests avoid ties).
 * Limits (supports): E <= 8192, n_groups <= 256, top_k <= 256. */
#include "cuda_common.cuh"
#include "moe_ops.h"

#define RT_THREADS 256

/* (v, i) is better than (bv, bi): higher score, ties to the lower index; i < 0 = nothing. */
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}
__device__ __forceinline__ void warp_best(float &v, int &i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

/* Best kept, not-yet-taken expert of the whole block (all threads get it). */
__device__ int block_best(const float *sc, const unsigned char *ok, int E, float *rv, int *ri) {
  float v = 0.0f;
  int b = -1;
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (ok[e] && better(sc[e], e, v, b)) {
      v = sc[e];
      b = e;
    }
  warp_best(v, b);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
    rv[w] = v;
    ri[w] = b;
  }
  __syncthreads();
  if (w == 0) {
    int nw = blockDim.x >> 5;
    v = lane < nw ? rv[lane] : 0.0f;
    b = lane < nw ? ri[lane] : -1;
    warp_best(v, b);
    if (lane == 0) ri[32] = b;
  }
  __syncthreads();
  int r = ri[32];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(RT_THREADS)
    router_kernel(dv lg, dv bias, int32_t *idx, int64_t ld_idx, float *wt, int64_t ld_w, int E,
                  int G, int topk_group, int k, int renorm, int biased, float scaling) {
  extern __shared__ float sm[];
  float *s = sm, *sc = sm + E, *gsc = sc + E;             /* [E], [E], [G] */
  unsigned char *ok = (unsigned char *)(gsc + G);          /* [E] */
  unsigned char *keep = ok + E;                            /* [G] */
  __shared__ float rv[32];
  __shared__ int ri[33];
  __shared__ int chosen[256];
  const int64_t t = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float x = dv_ld(lg, t * lg.s[0] + e * lg.s[1]);
    float si = 1.0f / (1.0f + expf(-x));
    s[e] = si;
    sc[e] = si + dv_ld(bias, e * bias.s[0]);
    ok[e] = 1;
  }
  __syncthreads();
  if (G > 1) {
    const int gs = E / G, lane = threadIdx.x & 31;
    for (int g = threadIdx.x >> 5; g < G; g += blockDim.x >> 5) { /* one warp per group */
      const float *q = sc + g * gs;
      float v1 = 0.0f, v2 = 0.0f;
      int b1 = -1, b2 = -1;
      for (int j = lane; j < gs; j += 32)
        if (better(q[j], j, v1, b1)) {
          v1 = q[j];
          b1 = j;
        }
      warp_best(v1, b1);
      for (int j = lane; j < gs; j += 32)
        if (j != b1 && better(q[j], j, v2, b2)) {
          v2 = q[j];
          b2 = j;
        }
      warp_best(v2, b2);
      if (lane == 0) gsc[g] = q[b1] + q[b2];
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* G is small: the reference's sequential pick */
      for (int g = 0; g < G; g++) keep[g] = 0;
      for (int j = 0; j < topk_group; j++) {
        int b = -1;
        for (int g = 0; g < G; g++)
          if (!keep[g] && (b < 0 || gsc[g] > gsc[b])) b = g;
        keep[b] = 1;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) ok[e] = keep[e / gs];
    __syncthreads();
  }
  for (int j = 0; j < k; j++) {
    int b = block_best(sc, ok, E, rv, ri);
    if (threadIdx.x == 0) {
      chosen[j] = b;
      ok[b] = 0;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
      int e = chosen[j];
      float w = biased ? sc[e] : s[e];
      idx[t * ld_idx + j] = e;
      wt[t * ld_w + j] = w;
      sum += w;
    }
    for (int j = 0; j < k; j++) {
      float w = wt[t * ld_w + j];
      if (renorm) w = w / (sum + 1e-20f);
      wt[t * ld_w + j] = w * scaling;
    }
  }
}

static size_t router_smem(int64_t E, int64_t G) { return (size_t)(2 * E + G) * 4 + (size_t)(E + G); }

static bool router_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_router_params_t *p = (const k3k_router_params_t *)params;
  int64_t E = t[0]->shape[1];
  return E <= 8192 && p->n_groups <= 256 && p->top_k <= 256 && t[2]->stride[1] == 1 &&
         t[3]->stride[1] == 1 && t[0]->shape[0] <= INT32_MAX;
}

int k3k_cu_router_launch(cudaStream_t st, const k3k_router_params_t *p,
                         const k3k_tensor_t *const *t) {
  int64_t T = t[0]->shape[0], E = t[0]->shape[1];
  if (T == 0) return 0;
  size_t smem = router_smem(E, p->n_groups);
  if (smem > 48 * 1024)
    K3K_CU(cudaFuncSetAttribute(router_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem));
  router_kernel<<<(unsigned)T, RT_THREADS, smem, st>>>(
      mkdv(t[0]), mkdv(t[1]), (int32_t *)t[2]->data, t[2]->stride[0], (float *)t[3]->data,
      t[3]->stride[0], (int)E, p->n_groups, p->topk_group, p->top_k, p->renormalize,
      p->use_biased_weights, p->scaling);
  K3K_LAUNCHED("router");
  return 0;
}

int k3k_cuda_router(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return k3k_cu_router_launch(cx->stream, (const k3k_router_params_t *)params, t);
}

bool k3k_cuda_moe_ok(k3k_op_t op, const void *params, const k3k_tensor_t *const *t) {
  switch (op) {
  case K3K_OP_ROUTER: return router_ok(params, t);
  case K3K_OP_MOE_COMBINE: return t[1]->stride[1] == 1 && t[2]->stride[1] == 1;
  default: return true;
  }
}
