/* CUDA: MLA_PREFILL (spec §4.1 non-absorbed attention: varlen, causal bottom-right, prefix).
 *
 * What it is for: the prefill attention of every MLA layer. Per sequence i and head h, query j
 * (0-based in the sequence) sees keys 0 .. Lk − Lq + j; score = [q_nope | q_rot]·[k_nope_h |
 * k_rot]·scale (192 dims), fp32 online softmax, o = Σ p·v_h (128 dims). Flash-style: a block
 * holds 128 queries of one head (8 warps x 16 rows, Q fragments in registers), streams 64-key
 * tiles of K (k_nope | k_rot, 192 dims) and V (128 dims) through shared memory (two-stage
 * cp.async) and never materialises a T x T matrix. Tensor cores: mma.sync m16n8k16 bf16, fp32
 * accumulate; P goes from the score accumulators straight into A fragments (no shared memory).
 * What it is not: the absorbed decode (mla.cu); the kv_b_proj GEMM or cache gather that build
 * its inputs (chunked prefill: MLA_CACHE_GATHER + GEMM, then this op over prefix + chunk).
 * Numerics vs the reference (fp32): q, k, v are bf16 tensors already; p is rounded to bf16 for
 * the P·V product (2^-9 relative); accumulation and softmax are fp32.
 * Invariants (k3k_cuda_mla_prefill_ok): Dn = 128, Dr = 64, Dv = 128; q, kv, k_rot BF16 with
 * inner stride 1, row strides multiples of 8 elements and 16-byte aligned data; o BF16 or F32
 * with inner stride 1. cu_q/cu_k are validated on the host after one copy (one stream
 * synchronisation): non-decreasing from >= 0, last <= rows → K3_ERANGE; Lk < Lq → K3_EINVAL
 * (the reference's codes); nothing is written on error. */
#include <string.h>

#include "mma_sm80.cuh"

#define MP_QROWS 128 /* queries per block */
#define MP_KT 64     /* keys per tile */
#define MP_THREADS 256
#define MP_DQK 192
#define MP_DV 128
#define MP_KP 200 /* K/Q smem pitch (bf16): 400 B = 25 x 16 B, ldmatrix conflict-free */
#define MP_VP 136 /* V smem pitch: 272 B = 17 x 16 B */
#define MP_OFF_K (MP_QROWS * MP_KP * 2)
#define MP_OFF_V (MP_OFF_K + 2 * MP_KT * MP_KP * 2)
#define MP_SMEM (MP_OFF_V + 2 * MP_KT * MP_VP * 2)

typedef struct {
  const uint16_t *q, *kv, *kr;  /* bf16 */
  int64_t ldq, ldkv, ldkr, ldo; /* row strides (elements) */
  const int32_t *cu_q, *cu_k;   /* device, stride in elements */
  int64_t sq, sk;
  void *o;
  int o_f32;
  float scale;
} mp_args;

/* Grid (q tiles, NH, N), q tiles walked last-first so the longest (latest) tiles start first. */
__global__ void __launch_bounds__(MP_THREADS, 1) mla_prefill_kernel(mp_args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t *Qs = (uint16_t *)smem, *Ks = (uint16_t *)(smem + MP_OFF_K),
           *Vs = (uint16_t *)(smem + MP_OFF_V);
  const int h = blockIdx.y, n = blockIdx.z, nh = gridDim.y;
  const int q0 = a.cu_q[(int64_t)n * a.sq], lq = a.cu_q[(int64_t)(n + 1) * a.sq] - q0;
  const int k0 = a.cu_k[(int64_t)n * a.sk], lk = a.cu_k[(int64_t)(n + 1) * a.sk] - k0;
  const int qt = (int)gridDim.x - 1 - (int)blockIdx.x, r0 = qt * MP_QROWS;
  if (r0 >= lq) return;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int off = lk - lq; /* query j sees keys <= off + j */
  const int kend = min(lk, off + min(lq, r0 + MP_QROWS)); /* keys this block needs */
  (void)nh;

  /* Q tile: 128 rows x 24 chunks; rows past lq are zero. */
  for (int i = tid; i < MP_QROWS * 24; i += MP_THREADS) {
    int r = i / 24, c = i % 24;
    bool valid = r0 + r < lq;
    const uint16_t *src = a.q + (int64_t)(q0 + r0 + r) * a.ldq + (int64_t)h * MP_DQK + c * 8;
    cp_async16(Qs + r * MP_KP + c * 8, valid ? src : a.q, valid);
  }
  /* K tile = [k_nope_h (16 chunks) | k_rot (8 chunks)], V tile = v_h (16 chunks). */
  auto load_tile = [&](int kt0, int buf) {
    uint16_t *kd = Ks + buf * MP_KT * MP_KP, *vd = Vs + buf * MP_KT * MP_VP;
    for (int i = tid; i < MP_KT * 40; i += MP_THREADS) {
      int r = i / 40, c = i % 40, key = kt0 + r;
      bool valid = key < kend;
      int64_t row = (int64_t)(k0 + key);
      const uint16_t *src;
      uint16_t *dst;
      if (c < 16) {
        src = a.kv + row * a.ldkv + (int64_t)h * 256 + c * 8;
        dst = kd + r * MP_KP + c * 8;
      } else if (c < 24) {
        src = a.kr + row * a.ldkr + (c - 16) * 8;
        dst = kd + r * MP_KP + c * 8;
      } else {
        src = a.kv + row * a.ldkv + (int64_t)h * 256 + 128 + (c - 24) * 8;
        dst = vd + r * MP_VP + (c - 24) * 8;
      }
      cp_async16(dst, valid ? src : a.kv, valid);
    }
  };
  load_tile(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  /* This warp's 16 query rows as A fragments, 12 k-steps (48 registers). */
  uint32_t qf[12][4];
  {
    const uint16_t *qa = Qs + (w * 16 + (lane & 15)) * MP_KP + (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < 12; ks++) ldsm_x4(qf[ks], qa + ks * 16);
  }
  const int wr0 = r0 + w * 16;                  /* first query row of this warp */
  const int lim_lo = off + wr0 + g, lim_hi = lim_lo + 8; /* last visible key of rows g, g+8 */
  const int warp_last = min(off + wr0 + 15, lk - 1);   /* last key any row of the warp sees */
  const float sl2 = a.scale * 1.4426950408889634f;
  float oacc[16][4];
#pragma unroll
  for (int i = 0; i < 16; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  int buf = 0;
  for (int kt0 = 0; kt0 < kend; kt0 += MP_KT, buf ^= 1) {
    if (kt0 > 0) {
      cp_async_wait<0>();
      __syncthreads(); /* tile landed; the other buffer is no longer read */
    }
    if (kt0 + MP_KT < kend) load_tile(kt0 + MP_KT, buf ^ 1);
    cp_async_commit();
    /* Warps whose rows see none of this tile (causal upper triangle, rows past lq) skip it. */
    if (kt0 > warp_last || wr0 >= lq) continue;
    const uint16_t *kb = Ks + buf * MP_KT * MP_KP, *vb = Vs + buf * MP_KT * MP_VP;
    float sacc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
    {
      const uint16_t *kp = kb + (((lane >> 4) << 3) + (lane & 7)) * MP_KP + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int ks = 0; ks < 12; ks++) {
#pragma unroll
        for (int np = 0; np < 4; np++) {
          uint32_t bf[4];
          ldsm_x4(bf, kp + np * 16 * MP_KP + ks * 16);
          mma_bf16(sacc[2 * np], qf[ks], bf[0], bf[1]);
          mma_bf16(sacc[2 * np + 1], qf[ks], bf[2], bf[3]);
        }
      }
    }
    /* Scale to log2 units; mask keys past a row's causal limit (and past lk). */
    bool need_mask = kt0 + MP_KT - 1 > off + wr0 || kt0 + MP_KT > lk;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      int key = kt0 + nt * 8 + 2 * t4;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float s = sacc[nt][j] * sl2;
        if (need_mask) {
          int kk = key + (j & 1), lim = (j < 2) ? lim_lo : lim_hi;
          if (kk > lim || kk >= lk) s = -INFINITY;
        }
        sacc[nt][j] = s;
      }
    }
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      mx_lo = fmaxf(mx_lo, fmaxf(sacc[nt][0], sacc[nt][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(sacc[nt][2], sacc[nt][3]));
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o));
    }
    /* Key 0 is in the first tile and visible to every row, so the running max is finite from
     * the first tile on; a row with no visible key in a later tile keeps its max. */
    float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    float al_lo = exp2f(m_lo - mn_lo), al_hi = exp2f(m_hi - mn_hi);
    m_lo = mn_lo, m_hi = mn_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      sacc[nt][0] = exp2f(sacc[nt][0] - mn_lo);
      sacc[nt][1] = exp2f(sacc[nt][1] - mn_lo);
      sacc[nt][2] = exp2f(sacc[nt][2] - mn_hi);
      sacc[nt][3] = exp2f(sacc[nt][3] - mn_hi);
      sum_lo += sacc[nt][0] + sacc[nt][1];
      sum_hi += sacc[nt][2] + sacc[nt][3];
    }
    l_lo = l_lo * al_lo + sum_lo;
    l_hi = l_hi * al_hi + sum_hi;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      oacc[i][0] *= al_lo, oacc[i][1] *= al_lo;
      oacc[i][2] *= al_hi, oacc[i][3] *= al_hi;
    }
    /* O += P V: key step ks covers keys 16ks..+16 = score n-tiles 2ks, 2ks+1. */
    const uint16_t *vp = vb + (((lane >> 3) & 1) * 8 + (lane & 7)) * MP_VP + (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
      uint32_t pa[4];
      pa[0] = pack_bf2(sacc[2 * ks][0], sacc[2 * ks][1]);
      pa[1] = pack_bf2(sacc[2 * ks][2], sacc[2 * ks][3]);
      pa[2] = pack_bf2(sacc[2 * ks + 1][0], sacc[2 * ks + 1][1]);
      pa[3] = pack_bf2(sacc[2 * ks + 1][2], sacc[2 * ks + 1][3]);
#pragma unroll
      for (int np = 0; np < 8; np++) {
        uint32_t bf[4];
        ldsm_x4_trans(bf, vp + ks * 16 * MP_VP + np * 16);
        mma_bf16(oacc[2 * np], pa, bf[0], bf[1]);
        mma_bf16(oacc[2 * np + 1], pa, bf[2], bf[3]);
      }
    }
  }
  cp_async_wait<0>();

  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    int row = wr0 + g + 8 * hh;
    if (row >= lq) continue;
    float il = 1.0f / (hh ? l_hi : l_lo);
    int64_t base = (int64_t)(q0 + row) * a.ldo + (int64_t)h * MP_DV + 2 * t4;
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      float x0 = oacc[nt][2 * hh] * il, x1 = oacc[nt][2 * hh + 1] * il;
      if (a.o_f32)
        *(float2 *)((float *)a.o + base + nt * 8) = make_float2(x0, x1);
      else
        *(uint32_t *)((uint16_t *)a.o + base + nt * 8) = pack_bf2(x0, x1);
    }
  }
}

static bool bf16_rows_ok(const k3k_tensor_t *t) {
  return t->dtype == K3K_BF16 && t->ndim == 2 && t->stride[1] == 1 && t->stride[0] % 8 == 0 &&
         ((uintptr_t)t->data & 15) == 0;
}

bool k3k_cuda_mla_prefill_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  if (p->d_nope != 128 || p->d_rope != 64 || p->d_v != 128) return false;
  if (!bf16_rows_ok(t[0]) || !bf16_rows_ok(t[1]) || !bf16_rows_ok(t[2])) return false;
  const k3k_tensor_t *o = t[5];
  if (o->ndim != 2 || o->stride[1] != 1 || (o->stride[0] & 1) || ((uintptr_t)o->data & 7))
    return false;
  if (o->dtype != K3K_BF16 && o->dtype != K3K_F32) return false;
  /* grid.x = q tiles, grid.y = heads, grid.z = sequences */
  return p->n_seqs <= 65535 && p->n_heads <= 65535 && t[0]->shape[0] / MP_QROWS < INT32_MAX;
}

int k3k_cuda_mla_prefill(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *q = t[0], *kv = t[1], *kr = t[2], *cq = t[3], *ck = t[4], *o = t[5];
  int64_t N = p->n_seqs;
  /* Sequence bounds to the host (both arrays, one synchronisation): validation as the
   * reference does it, and the longest query run for the grid. */
  int32_t *hb;
  int rc = k3k_cuda_host_scratch(cx, (size_t)(N + 1) * 2 * sizeof(int32_t), (void **)&hb);
  if (rc) return rc;
  K3K_CU(cudaMemcpy2DAsync(hb, sizeof(int32_t), cq->data, (size_t)cq->stride[0] * 4,
                           sizeof(int32_t), (size_t)N + 1, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaMemcpy2DAsync(hb + N + 1, sizeof(int32_t), ck->data, (size_t)ck->stride[0] * 4,
                           sizeof(int32_t), (size_t)N + 1, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  const int32_t *hq = hb, *hk = hb + N + 1;
  int64_t max_lq = 0;
  if (hq[0] < 0 || hk[0] < 0) return K3_ERANGE;
  for (int64_t i = 1; i <= N; i++)
    if (hq[i] < hq[i - 1] || hk[i] < hk[i - 1]) return K3_ERANGE;
  if (hq[N] > q->shape[0] || hk[N] > kv->shape[0] || hk[N] > kr->shape[0]) return K3_ERANGE;
  for (int64_t i = 0; i < N; i++) {
    int64_t lq = hq[i + 1] - hq[i], lk = hk[i + 1] - hk[i];
    if (lk < lq) return K3_EINVAL; /* every query needs its own key */
    if (lq > max_lq) max_lq = lq;
  }
  if (N == 0 || max_lq == 0) return 0;
  mp_args a;
  memset(&a, 0, sizeof a);
  a.q = (const uint16_t *)q->data;
  a.kv = (const uint16_t *)kv->data;
  a.kr = (const uint16_t *)kr->data;
  a.ldq = q->stride[0];
  a.ldkv = kv->stride[0];
  a.ldkr = kr->stride[0];
  a.ldo = o->stride[0];
  a.cu_q = (const int32_t *)cq->data;
  a.cu_k = (const int32_t *)ck->data;
  a.sq = cq->stride[0];
  a.sk = ck->stride[0];
  a.o = o->data;
  a.o_f32 = o->dtype == K3K_F32;
  a.scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf(192.0f);
  K3K_CU(cudaFuncSetAttribute(mla_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              MP_SMEM));
  dim3 grid((unsigned)((max_lq + MP_QROWS - 1) / MP_QROWS), (unsigned)p->n_heads, (unsigned)N);
  mla_prefill_kernel<<<grid, MP_THREADS, MP_SMEM, cx->stream>>>(a);
  K3K_LAUNCHED("mla_prefill");
  return 0;
}
