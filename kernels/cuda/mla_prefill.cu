/* CUDA: MLA_PREFILL (spec §4.1 non-absorbed attention: varlen, causal bottom-right, prefix).
 *
 * What it is for: the prefill attention of every MLA layer. Per sequence i and head h, query j
 * (0-based in the sequence) sees keys 0 .. Lk − Lq + j; score = [q_nope | q_rot]·[k_nope_h |
 * k_rot]·scale (192 dims), fp32 online softmax, o = Σ p·v_h (128 dims).
 * How (Hopper, sm_90a; FlashAttention-3's schedule): a block owns 128 queries of one head and
 * streams 128-key tiles; nothing T x T is materialised. Three warpgroups:
 *  - warpgroup 0, the producer: cp.async 16-byte copies of the Q tile once and of
 *    K = [k_nope_h | k_rot] (128 x 192) and V = v_h (128 x 128) per key tile into a two-stage
 *    ring, written in the 128-byte swizzled layout wgmma reads (mla_prefill_sm90.cuh); keys past
 *    the block's last visible key are zero-filled, never read. K and V of a stage have their
 *    own "full"/"empty" mbarriers: K of tile t+2 is copied as soon as both consumers finished
 *    tile t's Q·Kᵀ (before their softmax), V once they finished its P·V — the K copy gets ~1.5
 *    tiles of lead instead of 1 (measured: ~6 % faster than one barrier pair per stage). After
 *    its copies land the producer fences them for the async proxy and arrives on "full".
 *  - warpgroups 1 and 2, the consumers, 64 query rows each: S = Q·Kᵀ by 12 wgmma m64n128k16
 *    with both operands in shared memory (then K is released), the causal mask only on tiles
 *    that cross a row's diagonal, online softmax in registers with exp2 and the scale·log2(e)
 *    folded in, P rounded to bf16 straight from the S accumulators into wgmma A registers,
 *    O += P·V by 8 register-A wgmma (V read MN-major, no transpose pass; then V is released).
 *    The two consumer warpgroups run unsynchronised, so one's softmax overlaps the other's
 *    tensor-core work (forcing FA3's ping-pong turns with named barriers measured no better).
 *    A warpgroup skips the math of tiles above its diagonal (and all math when its rows are
 *    past Lq) but still waits for and releases every stage, so the ring's phases stay in step.
 *  - Not done: overlapping a warpgroup's own P·V with its next Q·Kᵀ (FA3's intra-warpgroup
 *    pipelining) keeps ~190 registers live; the register file is split per SM sub-partition,
 *    so 3 warps there cap every thread at 168, ptxas (CUDA 13.0) did not allocate past that
 *    after setmaxnreg, and it serialised the wgmma instead. The kernel as it is fits in 168
 *    with no spills, so it uses no setmaxnreg.
 * The grid walks the latest (longest) query tiles of each head first for load balance, heads
 * next to each other so a head's K/V stays in L2 while its tiles run.
 * What it is not: the absorbed decode (mla.cu); the kv_b_proj GEMM or cache gather that build
 * its inputs (chunked prefill: MLA_CACHE_GATHER + GEMM, then this op over prefix + chunk).
 * Numerics vs the reference (fp32): q, k, v are bf16 tensors already; p is rounded to bf16 for
 * the P·V product (2^-9 relative); accumulation and softmax are fp32 (ex2.approx, 2 ulp).
 * Invariants (k3k_cuda_mla_prefill_ok): Dn = 128, Dr = 64, Dv = 128; q, kv, k_rot BF16 with
 * inner stride 1, row strides multiples of 8 elements and 16-byte aligned data; o BF16 or F32
 * with inner stride 1. cu_q/cu_k are validated on the host after one copy (one stream
 * synchronisation): non-decreasing from >= 0, last <= rows → K3_ERANGE; Lk < Lq → K3_EINVAL
 * (the reference's codes); nothing is written on error. */
#include <string.h>

#include "mla_prefill_sm90.cuh"

#define MP_BM 128 /* queries per block (2 consumer warpgroups x 64) */
#define MP_BN 128 /* keys per tile */
#define MP_THREADS 384
#define MP_DQK 192
#define MP_DV 128
/* Shared memory, from a 1024-byte aligned base (swizzle atoms). Every operand is a stack of
 * 16 KB blocks, each 128 rows x 64 bf16 (one 128-byte swizzled row per query/key):
 * Q: 3 blocks (dims 0-63, 64-127, 128-191); K stage: 3 blocks (k_nope 0-63, 64-127, k_rot);
 * V stage: 2 blocks (dv 0-63, 64-127). */
#define MP_BLK 16384
#define MP_OFF_Q 0
#define MP_OFF_K (3 * MP_BLK)
#define MP_KSTAGE (3 * MP_BLK)
#define MP_OFF_V (MP_OFF_K + 2 * MP_KSTAGE)
#define MP_VSTAGE (2 * MP_BLK)
#define MP_OFF_BAR (MP_OFF_V + 2 * MP_VSTAGE) /* 4 x 2 mbarriers of 8 bytes, see MP_BAR */
#define MP_SMEM (MP_OFF_BAR + 64 + 1024)      /* + alignment slack */
/* mbarrier of kind k for stage s: K full, V full (count: producer threads), K empty, V empty
 * (count: consumer threads). */
#define MP_FULLK 0
#define MP_FULLV 1
#define MP_EMPTYK 2
#define MP_EMPTYV 3
#define MP_BAR(sb, k, s) ((sb) + MP_OFF_BAR + 16 * (k) + 8 * (s))

typedef struct {
  const uint16_t *q, *kv, *kr;  /* bf16 */
  int64_t ldq, ldkv, ldkr, ldo; /* row strides (elements) */
  const int32_t *cu_q, *cu_k;   /* device, stride in elements */
  int64_t sq, sk;
  void *o;
  int o_f32;
  float scale;
} mp_args;

/* Byte offset of 16-byte chunk c (0..7) of row r inside a swizzled 128-row block. */
__device__ __forceinline__ uint32_t sw_off(int r, int c) {
  return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* Producer warpgroup: Q once, then K/V tiles 0..ntiles-1 through the two stages. */
__device__ __forceinline__ void mp_produce(const mp_args &a, unsigned char *smem, uint32_t sb,
                                           int h, int q0, int lq, int k0, int r0, int kend,
                                           int ntiles) {
  const int pt = threadIdx.x; /* 0..127 */
  /* Q: 128 rows x 24 chunks; rows past Lq are zero. */
  for (int it = 0; it < 24; it++) {
    int idx = it * 128 + pt, r = idx / 24, c = idx - r * 24;
    bool valid = r0 + r < lq;
    const uint16_t *src = a.q + (int64_t)(q0 + r0 + r) * a.ldq + (int64_t)h * MP_DQK + c * 8;
    cp_async16(smem + MP_OFF_Q + (c >> 3) * MP_BLK + sw_off(r, c & 7), valid ? src : a.q, valid);
  }
  for (int t = 0; t < ntiles; t++) {
    const int s = t & 1, kt0 = t * MP_BN, ph = ((t >> 1) & 1) ^ 1;
    unsigned char *kb = smem + MP_OFF_K + s * MP_KSTAGE, *vb = smem + MP_OFF_V + s * MP_VSTAGE;
    /* K = [k_nope_h | k_rot] as soon as the stage's K is free (its Q·Kᵀ of tile t-2 is done):
     * k_nope_h is the first 256 bytes of a kv row (a half-warp per row), k_rot 128 bytes. */
    if (t >= 2) mbar_wait(MP_BAR(sb, MP_EMPTYK, s), ph);
    for (int it = 0; it < 16; it++) {
      int idx = it * 128 + pt, r = idx >> 4, c = idx & 15, key = kt0 + r;
      bool valid = key < kend;
      const uint16_t *src = a.kv + (int64_t)(k0 + key) * a.ldkv + (int64_t)h * 256 + c * 8;
      cp_async16(kb + (c >> 3) * MP_BLK + sw_off(r, c & 7), valid ? src : a.kv, valid);
    }
    for (int it = 0; it < 8; it++) {
      int idx = it * 128 + pt, r = idx >> 3, c = idx & 7, key = kt0 + r;
      bool valid = key < kend;
      const uint16_t *src = a.kr + (int64_t)(k0 + key) * a.ldkr + c * 8;
      cp_async16(kb + 2 * MP_BLK + sw_off(r, c), valid ? src : a.kr, valid);
    }
    cp_async_commit(); /* (tile 0: the Q copies are in this group too) */
    /* V = v_h (the second 256 bytes of the kv row) once the stage's P·V of tile t-2 is done. */
    if (t >= 2) mbar_wait(MP_BAR(sb, MP_EMPTYV, s), ph);
    for (int it = 0; it < 16; it++) {
      int idx = it * 128 + pt, r = idx >> 4, c = idx & 15, key = kt0 + r;
      bool valid = key < kend;
      const uint16_t *src = a.kv + (int64_t)(k0 + key) * a.ldkv + (int64_t)h * 256 + 128 + c * 8;
      cp_async16(vb + (c >> 3) * MP_BLK + sw_off(r, c & 7), valid ? src : a.kv, valid);
    }
    cp_async_commit();
    cp_async_wait<1>(); /* K landed */
    fence_proxy_async(); /* the copies are read next by wgmma (async proxy) */
    mbar_arrive(MP_BAR(sb, MP_FULLK, s));
    cp_async_wait<0>(); /* V landed */
    fence_proxy_async();
    mbar_arrive(MP_BAR(sb, MP_FULLV, s));
  }
}

/* Consumer warpgroup c (0/1): query rows r0 + 64c .. +63 of the block. */
__device__ __forceinline__ void mp_consume(const mp_args &a, uint32_t sb, int c, int h, int q0,
                                           int lq, int lk, int r0, int ntiles) {
  const int ct = threadIdx.x - 128 * (c + 1), lane = ct & 31, wq = ct >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int off = lk - lq;                 /* query j sees keys <= off + j */
  const int wrow0 = r0 + 64 * c;           /* first query row of this warpgroup */
  const bool live = wrow0 < lq;            /* any row of the warpgroup is a real query */
  const int last_key = off + wrow0 + 63;   /* last key any row of the warpgroup sees */
  const int rlo = wrow0 + 16 * wq + g;     /* this thread's rows: rlo, rlo + 8 */
  const int lim_lo = off + rlo, lim_hi = lim_lo + 8;
  const float sl2 = a.scale * 1.4426950408889634f;
  const uint32_t qa = sb + MP_OFF_Q + c * 64 * 128;

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; i++) o[i] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  for (int t = 0; t < ntiles; t++) {
    const int s = t & 1, kt0 = t * MP_BN;
    const uint32_t ph = (t >> 1) & 1;
    mbar_wait(MP_BAR(sb, MP_FULLK, s), ph);
    if (!live || kt0 > last_key) { /* nothing visible here: release the stage only */
      mbar_wait(MP_BAR(sb, MP_FULLV, s), ph);
      mbar_arrive(MP_BAR(sb, MP_EMPTYK, s));
      mbar_arrive(MP_BAR(sb, MP_EMPTYV, s));
      continue;
    }
    float sacc[64];
    const uint32_t kb = sb + MP_OFF_K + s * MP_KSTAGE;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 12; kk++) {
      uint64_t da = gmma_desc(qa + (kk >> 2) * MP_BLK + (kk & 3) * 32, 16, 1024);
      uint64_t db = gmma_desc(kb + (kk >> 2) * MP_BLK + (kk & 3) * 32, 16, 1024);
      wgmma_ss_n128(sacc, da, db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence64(sacc);
    mbar_arrive(MP_BAR(sb, MP_EMPTYK, s)); /* K of this stage may be refilled */

    /* Scale to log2 units; mask keys past a row's causal limit (only on diagonal tiles). */
    const bool need_mask = kt0 + MP_BN - 1 > off + wrow0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float v = sacc[4 * j + e] * sl2;
        if (need_mask) {
          int key = kt0 + 8 * j + 2 * t4 + (e & 1);
          if (key > (e < 2 ? lim_lo : lim_hi)) v = -INFINITY;
        }
        sacc[4 * j + e] = v;
      }
    }
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      mx_lo = fmaxf(mx_lo, fmaxf(sacc[4 * j], sacc[4 * j + 1]));
      mx_hi = fmaxf(mx_hi, fmaxf(sacc[4 * j + 2], sacc[4 * j + 3]));
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
    }
    /* Key 0 is in tile 0, which every live warpgroup processes and every row sees, so the
     * running max is finite from the first processed tile on; a row whose keys in a later
     * tile are all masked keeps its max (exp2(-inf) = 0). */
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float al_lo = ex2_approx(m_lo - mn_lo), al_hi = ex2_approx(m_hi - mn_hi);
    m_lo = mn_lo, m_hi = mn_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      sacc[4 * j] = ex2_approx(sacc[4 * j] - mn_lo);
      sacc[4 * j + 1] = ex2_approx(sacc[4 * j + 1] - mn_lo);
      sacc[4 * j + 2] = ex2_approx(sacc[4 * j + 2] - mn_hi);
      sacc[4 * j + 3] = ex2_approx(sacc[4 * j + 3] - mn_hi);
      sum_lo += sacc[4 * j] + sacc[4 * j + 1];
      sum_hi += sacc[4 * j + 2] + sacc[4 * j + 3];
    }
    l_lo = l_lo * al_lo + sum_lo;
    l_hi = l_hi * al_hi + sum_hi;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      o[4 * j] *= al_lo, o[4 * j + 1] *= al_lo;
      o[4 * j + 2] *= al_hi, o[4 * j + 3] *= al_hi;
    }
    /* Key step kk (keys 16kk..16kk+15) = accumulator column blocks 2kk, 2kk+1. */
    uint32_t pf[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
      pf[kk][0] = pack_bf2(sacc[8 * kk], sacc[8 * kk + 1]);
      pf[kk][1] = pack_bf2(sacc[8 * kk + 2], sacc[8 * kk + 3]);
      pf[kk][2] = pack_bf2(sacc[8 * kk + 4], sacc[8 * kk + 5]);
      pf[kk][3] = pack_bf2(sacc[8 * kk + 6], sacc[8 * kk + 7]);
    }
    const uint32_t vb = sb + MP_OFF_V + s * MP_VSTAGE;
    mbar_wait(MP_BAR(sb, MP_FULLV, s), ph);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
      wgmma_rs_n128_tb(o, pf[kk], gmma_desc(vb + kk * 2048, MP_BLK, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence64(o);
    mbar_arrive(MP_BAR(sb, MP_EMPTYV, s)); /* V of this stage may be refilled */
  }
  if (!live) return;

  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    int row = rlo + 8 * hh;
    if (row >= lq) continue;
    float il = 1.0f / (hh ? l_hi : l_lo);
    int64_t base = (int64_t)(q0 + row) * a.ldo + (int64_t)h * MP_DV + 2 * t4;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      float x0 = o[4 * j + 2 * hh] * il, x1 = o[4 * j + 2 * hh + 1] * il;
      if (a.o_f32)
        *(float2 *)((float *)a.o + base + 8 * j) = make_float2(x0, x1);
      else
        *(uint32_t *)((uint16_t *)a.o + base + 8 * j) = pack_bf2(x0, x1);
    }
  }
}

/* Grid (q tiles, NH, N), q tiles walked last-first so the longest (latest) tiles start first. */
__global__ void __launch_bounds__(MP_THREADS, 1) mla_prefill_kernel(mp_args a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw), sb = (sraw + 1023u) & ~1023u;
  unsigned char *smem = smem_raw + (sb - sraw);
  const int h = blockIdx.y, n = blockIdx.z;
  const int q0 = a.cu_q[(int64_t)n * a.sq], lq = a.cu_q[(int64_t)(n + 1) * a.sq] - q0;
  const int k0 = a.cu_k[(int64_t)n * a.sk], lk = a.cu_k[(int64_t)(n + 1) * a.sk] - k0;
  const int r0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * MP_BM;
  if (r0 >= lq) return; /* the whole block leaves before any barrier exists */
  const int kend = min(lk, lk - lq + min(lq, r0 + MP_BM)); /* keys this block needs */
  const int ntiles = (kend + MP_BN - 1) / MP_BN;
  /* Warpgroup index broadcast from lane 0 so the compiler knows it is warp-uniform (the wgmma
   * paths must not look divergent, or ptxas serialises them). */
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; s++) {
      mbar_init(MP_BAR(sb, MP_FULLK, s), 128), mbar_init(MP_BAR(sb, MP_FULLV, s), 128);
      mbar_init(MP_BAR(sb, MP_EMPTYK, s), 256), mbar_init(MP_BAR(sb, MP_EMPTYV, s), 256);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (wg == 0) {
    mp_produce(a, smem, sb, h, q0, lq, k0, r0, kend, ntiles);
  } else {
    mp_consume(a, sb, wg - 1, h, q0, lq, lk, r0, ntiles);
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
  return p->n_seqs <= 65535 && p->n_heads <= 65535 && t[0]->shape[0] / MP_BM < INT32_MAX;
}

int k3k_cuda_mla_prefill_bounds(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t, int64_t N,
                                int64_t *max_lq) {
  const k3k_tensor_t *q = t[0], *kv = t[1], *kr = t[2], *cq = t[3], *ck = t[4];
  int32_t *hb;
  int rc = k3k_cuda_host_scratch(cx, (size_t)(N + 1) * 2 * sizeof(int32_t), (void **)&hb);
  if (rc) return rc;
  K3K_CU(cudaMemcpy2DAsync(hb, sizeof(int32_t), cq->data, (size_t)cq->stride[0] * 4,
                           sizeof(int32_t), (size_t)N + 1, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaMemcpy2DAsync(hb + N + 1, sizeof(int32_t), ck->data, (size_t)ck->stride[0] * 4,
                           sizeof(int32_t), (size_t)N + 1, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  const int32_t *hq = hb, *hk = hb + N + 1;
  *max_lq = 0;
  if (hq[0] < 0 || hk[0] < 0) return K3_ERANGE;
  for (int64_t i = 1; i <= N; i++)
    if (hq[i] < hq[i - 1] || hk[i] < hk[i - 1]) return K3_ERANGE;
  if (hq[N] > q->shape[0] || hk[N] > kv->shape[0] || hk[N] > kr->shape[0]) return K3_ERANGE;
  for (int64_t i = 0; i < N; i++) {
    int64_t lq = hq[i + 1] - hq[i], lk = hk[i + 1] - hk[i];
    if (lk < lq) return K3_EINVAL; /* every query needs its own key */
    if (lq > *max_lq) *max_lq = lq;
  }
  return 0;
}

int k3k_cuda_mla_prefill_fast(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *q = t[0], *kv = t[1], *kr = t[2], *cq = t[3], *ck = t[4], *o = t[5];
  int64_t N = p->n_seqs, max_lq;
  /* Sequence bounds to the host (both arrays, one synchronisation): validation as the
   * reference does it, and the longest query run for the grid. */
  int rc = k3k_cuda_mla_prefill_bounds(cx, t, N, &max_lq);
  if (rc) return rc;
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
  dim3 grid((unsigned)((max_lq + MP_BM - 1) / MP_BM), (unsigned)p->n_heads, (unsigned)N);
  mla_prefill_kernel<<<grid, MP_THREADS, MP_SMEM, cx->stream>>>(a);
  K3K_LAUNCHED("mla_prefill");
  return 0;
}
