/* CUDA: MLA_PREFILL and MLA_DECODE at any head dims (generic.h), the correctness path for shapes
 * the fast kernels (mla_prefill.cu: 128/64/128 bf16; mla.cu + mla_decode_wg.cu: also c = 512,
 * bf16 cache and weights) do not take.
 *
 * What it is for: the tiny presets (4 heads, nope 32 / rope 16 / v 32, c = 64) and the op tests'
 * odd sizes on the GPU. Both mirror the CPU reference (kernels/cpu/mla.c):
 *   MLA_PREFILL: one warp per (query, head, sequence), bottom-right causal (query j of a
 *   sequence sees keys 0 .. Lk-Lq+j). Three passes over the keys recompute the same fp32
 *   scores (dot product in the reference's order, then x scale): the max, the sum of
 *   exp(s - max), and p = exp(s - max)/z applied to v in key order, 32 keys at a time
 *   (lanes compute the scores of a tile, then each lane accumulates its output columns over
 *   the tile). No score matrix in memory.
 *   MLA_DECODE: one block per (head, sequence): q_lat = W_UK^T q_nope (shared), the scores of
 *   the sequence's tokens into device scratch, block max / sum, o_lat in token order
 *   (shared), o = W_UV o_lat.
 * What it is not: fast (SIMT, scores recomputed; real shapes go to the fast kernels).
 * Invariants: MLA_PREFILL reads cu_q/cu_k on the host once (one synchronisation, like the fast
 * kernel) and returns K3_ERANGE / K3_EINVAL (Lk < Lq) exactly as the reference, before any
 * launch. MLA_DECODE checks seq_lens and used page ids on the device first (check.cu: K3_ERANGE,
 * skipped under trusted ids), never synchronises otherwise, and its scratch depends only on the
 * page-table shape, so the runner's decode step stays capturable. seq_len 0 gives o = 0. */
#include <string.h>

#include "cuda_common.cuh"
#include "generic.h"

static float mla_gen_scale(const k3k_mla_params_t *p) {
  return p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)(p->d_nope + p->d_rope));
}

/* ---- MLA_PREFILL ---- */
#define MG_WARPS 4
#define MG_MAXDV 256 /* 8 output columns per lane */
#define MG_MAXDQ 1024

struct mg_pre {
  dv q, kv, kr, o;
  const int32_t *cq, *ck; /* device copies of cu_q / cu_k (row stride cs_q / cs_k) */
  int64_t cs_q, cs_k;
  int dn, dr, dvv;
  float scale;
};

__device__ __forceinline__ float mg_score(const mg_pre &a, const float *qs, int64_t krow, int64_t h) {
  const int64_t ko = krow * a.kv.s[0] + h * (int64_t)(a.dn + a.dvv) * a.kv.s[1];
  float acc = 0.0f;
  for (int d = 0; d < a.dn; d++) acc += qs[d] * dv_ld(a.kv, ko + d * a.kv.s[1]);
  for (int d = 0; d < a.dr; d++) acc += qs[a.dn + d] * dv_ld(a.kr, krow * a.kr.s[0] + d * a.kr.s[1]);
  return acc * a.scale;
}

__global__ void __launch_bounds__(MG_WARPS * 32) mla_gen_prefill_kernel(mg_pre a) {
  __shared__ float qsm[MG_WARPS][MG_MAXDQ];
  __shared__ float psm[MG_WARPS][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i = blockIdx.z, h = blockIdx.y, j = (int64_t)blockIdx.x * MG_WARPS + warp;
  const int64_t q0 = a.cq[i * a.cs_q], lq = a.cq[(i + 1) * a.cs_q] - q0;
  const int64_t k0 = a.ck[i * a.cs_k], lk = a.ck[(i + 1) * a.cs_k] - k0;
  if (j >= lq) return; /* whole warps only: no block barrier below */
  const int dq = a.dn + a.dr;
  float *qs = qsm[warp], *ps = psm[warp];
  for (int d = lane; d < dq; d += 32)
    qs[d] = dv_ld(a.q, (q0 + j) * a.q.s[0] + (h * dq + d) * a.q.s[1]);
  __syncwarp();
  const int64_t nk = lk - lq + j + 1;
  float mx = -INFINITY;
  for (int64_t t = lane; t < nk; t += 32) mx = fmaxf(mx, mg_score(a, qs, k0 + t, h));
  mx = warp_max(mx);
  float z = 0.0f;
  for (int64_t t = lane; t < nk; t += 32) z += expf(mg_score(a, qs, k0 + t, h) - mx);
  z = warp_sum(z);
  float acc[MG_MAXDV / 32];
#pragma unroll
  for (int c = 0; c < MG_MAXDV / 32; c++) acc[c] = 0.0f;
  const int64_t vo = h * (int64_t)(a.dn + a.dvv) + a.dn;
  for (int64_t t0 = 0; t0 < nk; t0 += 32) {
    const int64_t tn = nk - t0 < 32 ? nk - t0 : 32;
    if (lane < tn) ps[lane] = expf(mg_score(a, qs, k0 + t0 + lane, h) - mx) / z;
    __syncwarp();
    for (int64_t tt = 0; tt < tn; tt++) {
      const float p = ps[tt];
      const int64_t vrow = (k0 + t0 + tt) * a.kv.s[0];
#pragma unroll
      for (int c = 0; c < MG_MAXDV / 32; c++) {
        const int e = lane + 32 * c;
        if (e < a.dvv) acc[c] += p * dv_ld(a.kv, vrow + (vo + e) * a.kv.s[1]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int c = 0; c < MG_MAXDV / 32; c++) {
    const int e = lane + 32 * c;
    if (e < a.dvv) dv_st(a.o, (q0 + j) * a.o.s[0] + (h * a.dvv + e) * a.o.s[1], acc[c]);
  }
}

bool k3k_cuda_gen_mla_prefill_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  return p->d_v <= MG_MAXDV && p->d_nope + p->d_rope <= MG_MAXDQ && p->n_seqs <= 65535 &&
         p->n_heads <= 65535 && t[0]->shape[0] / MG_WARPS < INT32_MAX;
}

int k3k_cuda_gen_mla_prefill(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *cq = t[3], *ck = t[4];
  const int64_t N = p->n_seqs;
  /* Sequence bounds to the host and checked in the reference's order (mla_prefill.cu). */
  int64_t max_lq;
  int rc = k3k_cuda_mla_prefill_bounds(cx, t, N, &max_lq);
  if (rc) return rc;
  if (N == 0 || max_lq == 0) return 0;
  mg_pre a;
  a.q = mkdv(t[0]), a.kv = mkdv(t[1]), a.kr = mkdv(t[2]), a.o = mkdv(t[5]);
  a.cq = (const int32_t *)cq->data, a.cs_q = cq->stride[0];
  a.ck = (const int32_t *)ck->data, a.cs_k = ck->stride[0];
  a.dn = p->d_nope, a.dr = p->d_rope, a.dvv = p->d_v;
  a.scale = mla_gen_scale(p);
  dim3 grid((unsigned)((max_lq + MG_WARPS - 1) / MG_WARPS), (unsigned)p->n_heads, (unsigned)N);
  mla_gen_prefill_kernel<<<grid, MG_WARPS * 32, 0, cx->stream>>>(a);
  K3K_LAUNCHED("mla_prefill_generic");
  return 0;
}

/* ---- MLA_DECODE: grid (NH, N), 256 threads; shared q_lat[c], o_lat[c], reductions ---- */
#define MD_THREADS 256

struct mg_dec {
  dv q, w, cache, o;
  const int32_t *pt, *sl;
  int64_t pt_s0, pt_s1, sl_s;
  int dn, dr, dvv, c, ps;
  int64_t cap; /* page-table capacity in tokens = scratch floats per (sequence, head) */
  float scale;
  float *scr;
};

__global__ void __launch_bounds__(MD_THREADS) mla_gen_decode_kernel(mg_dec a) {
  extern __shared__ float dsm[];
  __shared__ float red[32];
  float *qlat = dsm, *olat = dsm + a.c;
  const int64_t h = blockIdx.x, i = blockIdx.y, nh = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int64_t dq = a.dn + a.dr, dkv = a.dn + a.dvv, row = a.c + a.dr;
  int64_t len = a.sl[i * a.sl_s];
  if (len > a.cap) len = a.cap; /* validated (check.cu / the runner); bounds the scratch */
  if (len <= 0) {
    for (int e = tid; e < a.dvv; e += MD_THREADS)
      dv_st(a.o, i * a.o.s[0] + (h * a.dvv + e) * a.o.s[1], 0.0f);
    return;
  }
  const int64_t qo = i * a.q.s[0];
  for (int cc = tid; cc < a.c; cc += MD_THREADS) { /* q_lat = W_UK^T q_nope */
    float acc = 0.0f;
    for (int d = 0; d < a.dn; d++)
      acc += dv_ld(a.w, (h * dkv + d) * a.w.s[0] + cc * a.w.s[1]) *
             dv_ld(a.q, qo + (h * dq + d) * a.q.s[1]);
    qlat[cc] = acc;
  }
  __syncthreads();
  float *s = a.scr + (i * nh + h) * a.cap;
  float mx = -INFINITY;
  for (int64_t tau = tid; tau < len; tau += MD_THREADS) {
    const int64_t page = a.pt[i * a.pt_s0 + (tau / a.ps) * a.pt_s1];
    const int64_t base = (page * a.ps + tau % a.ps) * row;
    float acc = 0.0f;
    for (int cc = 0; cc < a.c; cc++) acc += qlat[cc] * dv_ld(a.cache, base + cc);
    for (int r = 0; r < a.dr; r++)
      acc += dv_ld(a.q, qo + (h * dq + a.dn + r) * a.q.s[1]) * dv_ld(a.cache, base + a.c + r);
    s[tau] = acc * a.scale;
    mx = fmaxf(mx, s[tau]);
  }
  mx = warp_max(mx);
  if (lane == 0) red[wid] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < MD_THREADS / 32; w++) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float z = 0.0f;
  for (int64_t tau = tid; tau < len; tau += MD_THREADS) {
    const float e = expf(s[tau] - mx);
    s[tau] = e;
    z += e;
  }
  z = block_sum(z, red);
  for (int64_t tau = tid; tau < len; tau += MD_THREADS) s[tau] /= z;
  __syncthreads();
  for (int cc = tid; cc < a.c; cc += MD_THREADS) { /* o_lat in token order */
    float acc = 0.0f;
    for (int64_t tau = 0; tau < len; tau++) {
      const int64_t page = a.pt[i * a.pt_s0 + (tau / a.ps) * a.pt_s1];
      acc += s[tau] * dv_ld(a.cache, (page * a.ps + tau % a.ps) * row + cc);
    }
    olat[cc] = acc;
  }
  __syncthreads();
  for (int e = wid; e < a.dvv; e += MD_THREADS / 32) { /* o = W_UV o_lat, a warp per column */
    float acc = 0.0f;
    for (int cc = lane; cc < a.c; cc += 32)
      acc += dv_ld(a.w, (h * dkv + a.dn + e) * a.w.s[0] + cc * a.w.s[1]) * olat[cc];
    acc = warp_sum(acc);
    if (lane == 0) dv_st(a.o, i * a.o.s[0] + (h * a.dvv + e) * a.o.s[1], acc);
  }
}

bool k3k_cuda_gen_mla_decode_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  /* 2c floats of shared memory; the reference reads the cache as contiguous rows */
  return p->kv_lora <= 6144 && p->n_seqs <= 65535 && p->n_heads <= 65535 &&
         k3k_tensor_is_contiguous(t[2]) && t[3]->shape[1] * t[2]->shape[1] <= INT32_MAX;
}

int k3k_cuda_gen_mla_decode(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *cache = t[2], *pt = t[3], *sl = t[4];
  const int64_t N = p->n_seqs;
  if (N == 0) return 0;
  int rc = k3k_cuda_check_pages(cx, pt, sl, N, cache->shape[1], cache->shape[0]);
  if (rc) return rc;
  mg_dec a;
  memset(&a, 0, sizeof a);
  a.cap = pt->shape[1] * cache->shape[1];
  void *sc = NULL;
  size_t bytes = (size_t)(N * p->n_heads * (a.cap > 0 ? a.cap : 1)) * sizeof(float);
  if ((rc = k3k_cuda_scratch(cx, bytes, &sc))) return rc;
  a.q = mkdv(t[0]), a.w = mkdv(t[1]), a.cache = mkdv(cache), a.o = mkdv(t[5]);
  a.pt = (const int32_t *)pt->data, a.pt_s0 = pt->stride[0], a.pt_s1 = pt->stride[1];
  a.sl = (const int32_t *)sl->data, a.sl_s = sl->stride[0];
  a.dn = p->d_nope, a.dr = p->d_rope, a.dvv = p->d_v, a.c = p->kv_lora;
  a.ps = (int)cache->shape[1];
  a.scale = mla_gen_scale(p);
  a.scr = (float *)sc;
  mla_gen_decode_kernel<<<dim3((unsigned)p->n_heads, (unsigned)N), MD_THREADS,
                          2 * (size_t)p->kv_lora * sizeof(float), cx->stream>>>(a);
  K3K_LAUNCHED("mla_decode_generic");
  return 0;
}

/* ---- dispatch: the fast kernels where they take the operands ---- */
bool k3k_cuda_mla_prefill_any_ok(const void *params, const k3k_tensor_t *const *t) {
  return k3k_cuda_mla_prefill_ok(params, t) || k3k_cuda_gen_mla_prefill_ok(params, t);
}
int k3k_cuda_mla_prefill(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return k3k_cuda_mla_prefill_ok(params, t) ? k3k_cuda_mla_prefill_fast(cx, params, t)
                                            : k3k_cuda_gen_mla_prefill(cx, params, t);
}
bool k3k_cuda_mla_decode_any_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  return (k3k_cuda_mla_decode_ok(params, t) && p->n_seqs <= 65535) ||
         k3k_cuda_gen_mla_decode_ok(params, t);
}
int k3k_cuda_mla_decode(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return k3k_cuda_mla_decode_ok(params, t) ? k3k_cuda_mla_decode_fast(cx, params, t)
                                           : k3k_cuda_gen_mla_decode(cx, params, t);
}
