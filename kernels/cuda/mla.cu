/* CUDA: MLA_DECODE (absorbed attention over a paged latent KV cache), MLA_CACHE_WRITE/GATHER.
 *
 * What it is for: spec §4.3. Per sequence, per head: scores = q(576) . kv(576) * scale over the
 * cached tokens, fp32 softmax, o_lat = sum p * kv[:512]. All 96 heads read the SAME cache rows,
 * so a block takes 48 heads (3 warps' worth of 16-row MMA tiles) and streams the rows once
 * through shared memory; tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate) do both
 * products, and an online softmax keeps nothing of size T. Long contexts are split over blocks
 * (split-KV); a second kernel merges the splits by their log-sum-exp.
 * The op is four launches: q → bf16 [q_nope | q_rot] staging; q_lat = W_UKᵀ q_nope per head
 * (cuBLASLt strided-batched, written into the 576-wide absorbed query); attention → o_lat
 * (bf16); o = W_UV o_lat per head (cuBLASLt, fp32) and a cast into o's dtype.
 * What it is not: prefill attention (MLA_PREFILL is not implemented on CUDA yet).
 * Numerics vs the reference (all fp32): q_lat, p and o_lat are rounded to bf16 for the tensor
 * cores (relative error ~2^-9 each), well inside the bf16 tolerance of the parity suite.
 * Invariants (k3k_cuda_mla_decode_ok): Dn = 128, Dr = 64, Dv = 128, c = 512, NH % 48 == 0,
 * page_size % 32 == 0 (a 32-token tile never crosses a page), BF16 cache/weights with inner
 * stride 1. params.max_seqlen_k, when > 0, must bound every seq_len (it sizes the split grid);
 * otherwise the page-table capacity is used. */
#include <string.h>

#include "cuda_common.cuh"

typedef struct {
  int batch, heads;            /* heads % 48 == 0 */
  const uint16_t *q;           /* [B][NH][576] bf16: absorbed q_lat (512) | q_rot (64) */
  const uint16_t *kv;          /* page pool [pages][page_size][576] bf16, contiguous */
  int page_size;               /* tokens per page, % 32 == 0 */
  const int32_t *block_table;  /* [B][pt_stride] page ids */
  int64_t pt_stride;
  const int32_t *seq_lens;     /* [B * sl_stride] tokens cached */
  int64_t sl_stride;
  int max_len;                 /* upper bound of seq_lens (host side, picks the split count) */
  float scale;                 /* softmax scale, 192^-0.5 for K3 */
  uint16_t *out;               /* [B][NH][512] bf16 o_lat */
  float *work;                 /* split-KV scratch */
  int num_sms;
} k3k_cu_mla_decode_args;

#define MLA_D 576
#define MLA_DV 512
#define MLA_LDS 584 /* smem row pitch (bf16): 1168 B = 73 x 16 B, conflict-free for mma/ldmatrix */
#define MLA_TILE 32
#define MLA_HB 48 /* heads per block */
#define MLA_THREADS 384
#define MLA_SMEM ((MLA_HB * MLA_LDS + 2 * MLA_TILE * MLA_LDS) * 2 + MLA_HB * (MLA_TILE + 1) * 4)

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

/* Grid (NH/48, splits, B): the head groups of one (sequence, split) are adjacent in launch
 * order, so the second group's cache reads hit L2. Warp w: head group hg = w % 3 (16 heads), quarter dq = w / 3 (it
 * scores tokens dq*8..+8 of each tile and accumulates output dims dq*128..+128). */
__global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_kernel(k3k_cu_mla_decode_args a,
                                                                     int chunk) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t *Qs = (uint16_t *)smem;
  uint16_t *KVs = Qs + MLA_HB * MLA_LDS;
  float *Ss = (float *)(KVs + 2 * MLA_TILE * MLA_LDS);
  const int split = blockIdx.y, b = blockIdx.z, hbase = blockIdx.x * MLA_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, hg = w % 3, dq = w / 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int len = a.seq_lens[(size_t)b * a.sl_stride];
  const int tok0 = split * chunk, tok1 = min(len, tok0 + chunk);
  const int32_t *bt = a.block_table + (size_t)b * a.pt_stride;

  /* Q for 48 heads. */
  const uint16_t *qg = a.q + ((size_t)b * a.heads + hbase) * MLA_D;
  for (int i = tid; i < MLA_HB * (MLA_D / 8); i += MLA_THREADS) {
    int r = i / (MLA_D / 8), c8 = i % (MLA_D / 8);
    cp_async16(Qs + r * MLA_LDS + c8 * 8, qg + (size_t)r * MLA_D + c8 * 8, true);
  }
  auto load_tile = [&](int tile_start, int buf) {
    uint16_t *dst = KVs + buf * MLA_TILE * MLA_LDS;
    for (int i = tid; i < MLA_TILE * (MLA_D / 8); i += MLA_THREADS) {
      int r = i / (MLA_D / 8), c8 = i % (MLA_D / 8);
      int tok = tile_start + r;
      bool valid = tok < tok1;
      const uint16_t *src = a.kv;
      if (valid)
        src = a.kv + ((size_t)bt[tok / a.page_size] * a.page_size + tok % a.page_size) * MLA_D +
              c8 * 8;
      cp_async16(dst + r * MLA_LDS + c8 * 8, src, valid);
    }
  };
  if (tok0 < tok1) load_tile(tok0, 0);
  cp_async_commit();

  const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */
  float oacc[16][4];
#pragma unroll
  for (int i = 0; i < 16; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f; /* rows g, g+8 */
  const uint16_t *qa = Qs + (hg * 16 + g) * MLA_LDS + 2 * t4;

  int buf = 0;
  for (int ts = tok0; ts < tok1; ts += MLA_TILE, buf ^= 1) {
    if (ts + MLA_TILE < tok1) load_tile(ts + MLA_TILE, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t *kvb = KVs + buf * MLA_TILE * MLA_LDS;
    /* Scores for 16 heads x 8 tokens (dq*8..). */
    /* Four independent accumulators break the 36-long dependent mma chain. */
    float sc4[4][4] = {};
    const uint16_t *kb = kvb + (dq * 8 + g) * MLA_LDS + 2 * t4;
#pragma unroll 3
    for (int k0 = 0; k0 < MLA_D; k0 += 64) {
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int kk = k0 + u * 16;
        uint32_t af[4];
        af[0] = *(const uint32_t *)(qa + kk);
        af[1] = *(const uint32_t *)(qa + 8 * MLA_LDS + kk);
        af[2] = *(const uint32_t *)(qa + kk + 8);
        af[3] = *(const uint32_t *)(qa + 8 * MLA_LDS + kk + 8);
        mma_bf16(sc4[u], af, *(const uint32_t *)(kb + kk), *(const uint32_t *)(kb + kk + 8));
      }
    }
    float sc[4];
#pragma unroll
    for (int j = 0; j < 4; j++) sc[j] = (sc4[0][j] + sc4[1][j]) + (sc4[2][j] + sc4[3][j]);
    {
      int col = dq * 8 + 2 * t4;
      float *s_lo = Ss + (hg * 16 + g) * (MLA_TILE + 1), *s_hi = s_lo + 8 * (MLA_TILE + 1);
      bool v0 = ts + col < tok1, v1 = ts + col + 1 < tok1;
      s_lo[col] = v0 ? sc[0] * sl2 : -INFINITY;
      s_lo[col + 1] = v1 ? sc[1] * sl2 : -INFINITY;
      s_hi[col] = v0 ? sc[2] * sl2 : -INFINITY;
      s_hi[col + 1] = v1 ? sc[3] * sl2 : -INFINITY;
    }
    __syncthreads();
    /* Online softmax for rows g and g+8: this lane holds tokens {2t4, 2t4+1} + {0, 8, 16, 24}. */
    const float *r_lo = Ss + (hg * 16 + g) * (MLA_TILE + 1), *r_hi = r_lo + 8 * (MLA_TILE + 1);
    float p_lo[8], p_hi[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      p_lo[2 * j] = r_lo[j * 8 + 2 * t4];
      p_lo[2 * j + 1] = r_lo[j * 8 + 2 * t4 + 1];
      p_hi[2 * j] = r_hi[j * 8 + 2 * t4];
      p_hi[2 * j + 1] = r_hi[j * 8 + 2 * t4 + 1];
    }
    float mx_lo = p_lo[0], mx_hi = p_hi[0];
#pragma unroll
    for (int j = 1; j < 8; j++) {
      mx_lo = fmaxf(mx_lo, p_lo[j]);
      mx_hi = fmaxf(mx_hi, p_hi[j]);
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o));
    }
    float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    /* A tile always has >= 1 valid token, so mn_* is finite here. */
    float al_lo = exp2f(m_lo - mn_lo), al_hi = exp2f(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      p_lo[j] = exp2f(p_lo[j] - mn_lo);
      p_hi[j] = exp2f(p_hi[j] - mn_hi);
      sum_lo += p_lo[j];
      sum_hi += p_hi[j];
    }
    l_lo = l_lo * al_lo + sum_lo;
    l_hi = l_hi * al_hi + sum_hi;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      oacc[i][0] *= al_lo;
      oacc[i][1] *= al_lo;
      oacc[i][2] *= al_hi;
      oacc[i][3] *= al_hi;
    }
    /* P (16 x 32) as two k16 A fragments: k-step ks covers tokens ks*16 .. ks*16+15. */
#pragma unroll
    for (int ks = 0; ks < 2; ks++) {
      uint32_t pa[4];
      pa[0] = pack_bf2(p_lo[4 * ks], p_lo[4 * ks + 1]);
      pa[1] = pack_bf2(p_hi[4 * ks], p_hi[4 * ks + 1]);
      pa[2] = pack_bf2(p_lo[4 * ks + 2], p_lo[4 * ks + 3]);
      pa[3] = pack_bf2(p_hi[4 * ks + 2], p_hi[4 * ks + 3]);
      /* ldmatrix.x4.trans: matrices (k 0-7, n), (k 8-15, n), (k 0-7, n+8), (k 8-15, n+8). */
      int mi = lane >> 3, rr = lane & 7;
      const uint16_t *vrow = kvb + (ks * 16 + (mi & 1) * 8 + rr) * MLA_LDS + dq * 128 + (mi >> 1) * 8;
#pragma unroll
      for (int np = 0; np < 8; np++) {
        uint32_t bf[4];
        ldsm_x4_trans(bf, vrow + np * 16);
        mma_bf16(oacc[2 * np], pa, bf[0], bf[1]);
        mma_bf16(oacc[2 * np + 1], pa, bf[2], bf[3]);
      }
    }
    __syncthreads(); /* buffer `buf` and Ss are rewritten next iteration */
  }
  cp_async_wait<0>();

  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  const int h_lo = hbase + hg * 16 + g, h_hi = h_lo + 8;
  int splits = gridDim.y;
  if (splits == 1) {
    float il = len > 0 ? 1.0f / l_lo : 0.f, ih = len > 0 ? 1.0f / l_hi : 0.f;
    uint16_t *o_lo = a.out + ((size_t)b * a.heads + h_lo) * MLA_DV + dq * 128 + 2 * t4;
    uint16_t *o_hi = a.out + ((size_t)b * a.heads + h_hi) * MLA_DV + dq * 128 + 2 * t4;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      *(uint32_t *)(o_lo + i * 8) = pack_bf2(oacc[i][0] * il, oacc[i][1] * il);
      *(uint32_t *)(o_hi + i * 8) = pack_bf2(oacc[i][2] * ih, oacc[i][3] * ih);
    }
    return;
  }
  /* Split partials: normalised O (fp32) and lse (log2 units; -inf for an empty split). */
  size_t nrow = (size_t)a.batch * a.heads;
  float *wo = a.work, *wl = a.work + (size_t)splits * nrow * MLA_DV;
  size_t r_lo = (size_t)split * nrow + (size_t)b * a.heads + h_lo, r_hi = r_lo + 8;
  bool empty = tok0 >= tok1;
  float il = empty ? 0.f : 1.0f / l_lo, ih = empty ? 0.f : 1.0f / l_hi;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    *(float2 *)(wo + r_lo * MLA_DV + dq * 128 + i * 8 + 2 * t4) =
        make_float2(oacc[i][0] * il, oacc[i][1] * il);
    *(float2 *)(wo + r_hi * MLA_DV + dq * 128 + i * 8 + 2 * t4) =
        make_float2(oacc[i][2] * ih, oacc[i][3] * ih);
  }
  if (dq == 0 && t4 == 0) {
    wl[r_lo] = empty ? -INFINITY : m_lo + log2f(l_lo);
    wl[r_hi] = empty ? -INFINITY : m_hi + log2f(l_hi);
  }
}

/* One block of 128 threads per (b, h): out = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M). */
__global__ void mla_merge_kernel(const float *work, int splits, size_t nrow, uint16_t *out) {
  size_t r = blockIdx.x;
  const float *wl = work + (size_t)splits * nrow * MLA_DV;
  float m = -INFINITY;
  for (int s = 0; s < splits; s++) m = fmaxf(m, wl[s * nrow + r]);
  if (m == -INFINITY) m = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float den = 0.f;
  for (int s = 0; s < splits; s++) {
    float l = wl[s * nrow + r];
    if (l == -INFINITY) continue;
    float wt = exp2f(l - m);
    den += wt;
    float4 o = *((const float4 *)(work + (s * nrow + r) * MLA_DV) + threadIdx.x);
    acc.x += wt * o.x;
    acc.y += wt * o.y;
    acc.z += wt * o.z;
    acc.w += wt * o.w;
  }
  float inv = den > 0.f ? 1.0f / den : 0.f; /* seq_len 0: every split empty, o = 0 */
  *((uint2 *)(out + r * MLA_DV) + threadIdx.x) =
      make_uint2(pack_bf2(acc.x * inv, acc.y * inv), pack_bf2(acc.z * inv, acc.w * inv));
}

/* Splits: enough blocks for ~2 waves, each split at least 256 tokens. */
static int mla_splits(const k3k_cu_mla_decode_args *a) {
  int blocks1 = a->batch * (a->heads / MLA_HB);
  int want = (2 * a->num_sms + blocks1 - 1) / blocks1;
  int cap = (a->max_len + 255) / 256;
  int s = want < cap ? want : cap;
  return s < 1 ? 1 : (s > 64 ? 64 : s);
}

static size_t mla_work_bytes(const k3k_cu_mla_decode_args *a) {
  int s = mla_splits(a);
  if (s == 1) return 0;
  return (size_t)s * a->batch * a->heads * (MLA_DV + 1) * sizeof(float);
}

static int mla_attend(cudaStream_t st, const k3k_cu_mla_decode_args *a) {
  if (a->batch == 0) return 0;
  int splits = mla_splits(a);
  int chunk = (a->max_len + splits - 1) / splits;
  chunk = (chunk + MLA_TILE - 1) / MLA_TILE * MLA_TILE;
  /* Cheap and idempotent; set on every call so no global state is needed (per device). */
  K3K_CU(cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              MLA_SMEM));
  mla_decode_kernel<<<dim3(a->heads / MLA_HB, splits, a->batch), MLA_THREADS, MLA_SMEM, st>>>(
      *a, chunk);
  K3K_LAUNCHED("mla_decode");
  if (splits > 1) {
    size_t nrow = (size_t)a->batch * a->heads;
    mla_merge_kernel<<<(unsigned)nrow, MLA_DV / 4, 0, st>>>(a->work, splits, nrow, a->out);
    K3K_LAUNCHED("mla_merge");
  }
  return 0;
}


/* ---- MLA_DECODE op ---- */

/* q [N, NH*192] (any dtype/strides) → qb [N][NH][192] bf16 and the q_rot part of qabs. */
__global__ void mla_prep_kernel(dv q, int64_t nh, uint16_t *qb, uint16_t *qabs) {
  int64_t n = blockIdx.y, i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= nh * 192) return;
  int64_t h = i / 192, d = i % 192;
  uint16_t v = f2bf(dv_ld(q, n * q.s[0] + i * q.s[1]));
  qb[(n * nh + h) * 192 + d] = v;
  if (d >= 128) qabs[(n * nh + h) * MLA_D + MLA_DV + (d - 128)] = v;
}

/* o32 [N][NH*128] fp32 → o (its dtype/strides). */
__global__ void mla_out_kernel(const float *o32, int64_t cols, dv o) {
  int64_t n = blockIdx.y, i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= cols) return;
  dv_st(o, n * o.s[0] + i * o.s[1], o32[n * cols + i]);
}

bool k3k_cuda_mla_decode_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *w = t[1], *cache = t[2];
  if (p->d_nope != 128 || p->d_rope != 64 || p->d_v != 128 || p->kv_lora != 512) return false;
  if (p->n_heads % MLA_HB != 0) return false;
  if (w->dtype != K3K_BF16 || w->stride[1] != 1 || (w->stride[0] % 8) != 0 ||
      ((uintptr_t)w->data & 15))
    return false;
  if (cache->dtype != K3K_BF16 || !k3k_tensor_is_contiguous(cache) || cache->shape[1] % 32 ||
      ((uintptr_t)cache->data & 15))
    return false;
  return true;
}

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Benchmark hook (k3k_cuda_ops.h): when set, events 0..4 bracket prep, absorption GEMM,
 * attention, output GEMM + cast. */
static cudaEvent_t *g_mla_ev;
void k3k_cuda_mla_phase_events(cudaEvent_t *ev) { g_mla_ev = ev; }
#define MLA_MARK(i) \
  do { \
    if (g_mla_ev) K3K_CU(cudaEventRecord(g_mla_ev[i], cx->stream)); \
  } while (0)

int k3k_cuda_mla_decode(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *q = t[0], *w = t[1], *cache = t[2], *pt = t[3], *sl = t[4], *o = t[5];
  int64_t N = p->n_seqs, NH = p->n_heads, ldw = w->stride[0];
  if (N == 0) return 0;
  /* seq_lens within the page table and every used page id within the pool: checked on the
   * device before the kernels index the cache. */
  int rc = k3k_cuda_check_pages(cx, pt, sl, N, cache->shape[1], cache->shape[0]);
  if (rc) return rc;
  k3k_cu_mla_decode_args a;
  memset(&a, 0, sizeof a);
  a.batch = (int)N;
  a.heads = (int)NH;
  a.kv = (const uint16_t *)cache->data;
  a.page_size = (int)cache->shape[1];
  a.block_table = (const int32_t *)pt->data;
  a.pt_stride = pt->stride[0];
  a.seq_lens = (const int32_t *)sl->data;
  a.sl_stride = sl->stride[0];
  int64_t cap = pt->shape[1] * cache->shape[1];
  a.max_len = (int)(p->max_seqlen_k > 0 && p->max_seqlen_k < cap ? p->max_seqlen_k : cap);
  a.scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf(192.0f);
  a.num_sms = cx->num_sms;
  size_t b_qb = al256(N * NH * 192 * 2), b_qabs = al256(N * NH * MLA_D * 2),
         b_olat = al256(N * NH * MLA_DV * 2), b_o32 = al256(N * NH * 128 * 4),
         b_work = al256(mla_work_bytes(&a));
  char *base;
  rc = k3k_cuda_scratch(cx, b_qb + b_qabs + b_olat + b_o32 + b_work, (void **)&base);
  if (rc) return rc;
  uint16_t *qb = (uint16_t *)base, *qabs = (uint16_t *)(base + b_qb);
  uint16_t *olat = (uint16_t *)(base + b_qb + b_qabs);
  float *o32 = (float *)(base + b_qb + b_qabs + b_olat);
  a.work = (float *)(base + b_qb + b_qabs + b_olat + b_o32);
  a.q = qabs;
  a.out = olat;

  MLA_MARK(0);
  mla_prep_kernel<<<dim3(k3k_ceil_div(NH * 192, 256), (unsigned)N), 256, 0, cx->stream>>>(
      mkdv(q), NH, qb, qabs);
  K3K_LAUNCHED("mla_prep");
  MLA_MARK(1);
  /* q_lat[n][h][c] = Σ_d W[h*256+d][c] q_nope[n][h][d]  (col-major: 512 x N per head). */
  rc = k3k_cuda_lt_gemm(cx, 0, 0, MLA_DV, N, 128, w->data, CUDA_R_16BF, ldw, 256 * ldw, qb,
                        CUDA_R_16BF, NH * 192, 192, qabs, CUDA_R_16BF, NH * MLA_D, MLA_D,
                        (int)NH);
  if (rc) return rc;
  MLA_MARK(2);
  rc = mla_attend(cx->stream, &a);
  if (rc) return rc;
  MLA_MARK(3);
  /* o[n][h][v] = Σ_c W[h*256+128+v][c] o_lat[n][h][c]  (col-major: 128 x N per head). */
  rc = k3k_cuda_lt_gemm(cx, 1, 0, 128, N, MLA_DV, (const uint16_t *)w->data + 128 * ldw,
                        CUDA_R_16BF, ldw, 256 * ldw, olat, CUDA_R_16BF, NH * MLA_DV, MLA_DV, o32,
                        CUDA_R_32F, NH * 128, 128, (int)NH);
  if (rc) return rc;
  mla_out_kernel<<<dim3(k3k_ceil_div(NH * 128, 256), (unsigned)N), 256, 0, cx->stream>>>(
      o32, NH * 128, mkdv(o));
  K3K_LAUNCHED("mla_out");
  MLA_MARK(4);
  return 0;
}

/* ---- MLA_CACHE_WRITE / MLA_CACHE_GATHER: one block per token row. ---- */
__global__ void mla_cache_write_kernel(dv cn, dv kr, dv sm, dv cache, int64_t ps, int64_t c,
                                       int64_t dr) {
  int64_t tk = blockIdx.x;
  int32_t slot = dv_ldi(sm, tk * sm.s[0]);
  if (slot < 0) return;
  int64_t base = (slot / ps) * cache.s[0] + (slot % ps) * cache.s[1];
  for (int64_t j = threadIdx.x; j < c + dr; j += blockDim.x) {
    float v = j < c ? dv_ld(cn, tk * cn.s[0] + j * cn.s[1])
                    : dv_ld(kr, tk * kr.s[0] + (j - c) * kr.s[1]);
    dv_st(cache, base + j * cache.s[2], v);
  }
}
__global__ void mla_cache_gather_kernel(dv cache, dv sm, dv y, int64_t ps, int64_t width) {
  int64_t tk = blockIdx.x;
  int32_t slot = dv_ldi(sm, tk * sm.s[0]);
  int64_t base = (slot / ps) * cache.s[0] + (slot % ps) * cache.s[1];
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    dv_st(y, tk * y.s[0] + j * y.s[1], dv_ld(cache, base + j * cache.s[2]));
}

/* Slot values are validated on the device: an out-of-range slot sets `bad` and writes nothing
 * for that token; the host reads it back (one synchronisation) and returns K3_ERANGE. */
__global__ void slot_check_kernel(dv sm, int64_t n, int64_t limit, int allow_neg, int *bad) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int32_t s = dv_ldi(sm, i * sm.s[0]);
  if ((s < 0 && !allow_neg) || s >= limit) atomicExch(bad, 1);
}

static int check_slots(k3k_cuda_ctx *cx, const k3k_tensor_t *sm, int64_t limit, int allow_neg) {
  int64_t n = sm->shape[0];
  if (n == 0) return 0;
  void *flag;
  int rc = k3k_cuda_scratch(cx, sizeof(int), &flag);
  if (rc) return rc;
  K3K_CU(cudaMemsetAsync(flag, 0, sizeof(int), cx->stream));
  slot_check_kernel<<<k3k_ceil_div(n, 256), 256, 0, cx->stream>>>(mkdv(sm), n, limit, allow_neg,
                                                                  (int *)flag);
  K3K_LAUNCHED("slot_check");
  int bad = 0;
  K3K_CU(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  return bad ? K3_ERANGE : 0;
}

int k3k_cuda_mla_cache_write(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *cn = t[0], *kr = t[1], *sm = t[2], *cache = t[3];
  int64_t T = cn->shape[0], ps = cache->shape[1];
  int rc = check_slots(cx, sm, cache->shape[0] * ps, 1);
  if (rc || T == 0) return rc;
  mla_cache_write_kernel<<<(unsigned)T, 128, 0, cx->stream>>>(mkdv(cn), mkdv(kr), mkdv(sm),
                                                              mkdv(cache), ps, cn->shape[1],
                                                              kr->shape[1]);
  K3K_LAUNCHED("mla_cache_write");
  return 0;
}

int k3k_cuda_mla_cache_gather(k3k_cuda_ctx *cx, const void *params,
                              const k3k_tensor_t *const *t) {
  const k3k_tensor_t *cache = t[0], *sm = t[1], *y = t[2];
  int64_t T = sm->shape[0], ps = cache->shape[1];
  int rc = check_slots(cx, sm, cache->shape[0] * ps, 0);
  if (rc || T == 0) return rc;
  mla_cache_gather_kernel<<<(unsigned)T, 128, 0, cx->stream>>>(mkdv(cache), mkdv(sm), mkdv(y), ps,
                                                               cache->shape[2]);
  K3K_LAUNCHED("mla_cache_gather");
  return 0;
}
