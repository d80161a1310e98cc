/* CUDA: MLA_DECODE (absorbed attention over a paged latent KV cache), MLA_CACHE_WRITE/GATHER.
 *
 * What it is for: spec §4.3. Per sequence, per head: scores = q(576) . kv(576) * scale over the
 * cached tokens, fp32 softmax, o_lat = sum p * kv[:512]. All 96 heads read the SAME cache rows,
 * so a block takes 48 heads and streams 64-token latent tiles once through shared memory.
 * Page sizes that are multiples of 8 go to the Hopper kernel (mla_decode_wg.cu: TMA + wgmma,
 * ~3x faster); this file keeps the kernel for any page size (two-stage cp.async, one page
 * lookup per token row), where tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate) do both
 * products with warp tiles chosen for few shared-memory bytes per mma (see the block shape
 * below), and an online softmax keeps nothing of size T. Long contexts and small batches are
 * split over blocks (split-KV); a second kernel merges the splits by their log-sum-exp.
 * The op is four launches: q → bf16 [q_nope | q_rot] staging; q_lat = W_UKᵀ q_nope per head
 * (cuBLASLt strided-batched, written into the 576-wide absorbed query); attention → o_lat
 * (bf16); o = W_UV o_lat per head (cuBLASLt, fp32) and a cast into o's dtype.
 * What it is not: prefill attention (mla_prefill.cu).
 * Numerics vs the reference (all fp32): q_lat, p and o_lat are rounded to bf16 for the tensor
 * cores (relative error ~2^-9 each), well inside the bf16 tolerance of the parity suite.
 * Invariants (k3k_cuda_mla_decode_ok): Dn = 128, Dr = 64, Dv = 128, c = 512, NH % 48 == 0 (or
 * NH % 8 == 0 with page sizes that are multiples of 8: the Hopper kernel pads the last group),
 * BF16 contiguous cache (any page size: pages are looked up per token row), BF16 weights with
 * inner stride 1. params.max_seqlen_k, when > 0, must bound every seq_len (it sizes the split
 * grid); otherwise the page-table capacity is used. */
#include <stdlib.h>
#include <string.h>

#include "mla_decode.cuh"
#include "mma_sm80.cuh"


/* Block shape. 48 heads share every 64-token latent tile the block streams through shared
 * memory (two stages, cp.async). Shared memory per block (226.9 KB of the 227 KB an SM offers):
 *   Q   48 x 584 bf16      56.1 KB   (pitch 584 = 1168 B = 73 x 16 B: ldmatrix conflict-free)
 *   KV  2 x 64 x 584 bf16 149.5 KB
 *   Sx  48 x 72 fp32       13.8 KB   (scores of one tile)
 *   Ps  48 x 72 bf16        6.9 KB   (probabilities of one tile, pitch 144 B)
 *   alpha, m, l  48 x 3 fp32
 * Why this split (smem bytes per mma.sync is what bounds a tensor-core kernel whose operands
 * come from shared memory; 4096·(1/Mw + 1/Nw) bytes per mma for a warp tile Mw x Nw):
 *   scores: warp (tg = w&3, kh = w>>2) computes 48 heads x 16 tokens over dims kh*288..+288
 *     (341 B/mma); the two K halves meet through Sx;
 *   P·V:    warp w owns output dims 64w..+64 for all 48 heads (149 B/mma), 96 fp32 regs.
 * The old layout (16 heads x 8 tokens per warp, A fragments by 32-bit loads) needed 768 B/mma. */
#define MLA_D 576
#define MLA_DV 512
#define MLA_LDS 584
#define MLA_TILE 64
#define MLA_HB 48
#define MLA_THREADS 256
#define MLA_SXP 72
#define MLA_PP 72
#define MLA_OFF_KV (MLA_HB * MLA_LDS * 2)
#define MLA_OFF_SX (MLA_OFF_KV + 2 * MLA_TILE * MLA_LDS * 2)
#define MLA_OFF_PS (MLA_OFF_SX + MLA_HB * MLA_SXP * 4)
#define MLA_OFF_ST (MLA_OFF_PS + MLA_HB * MLA_PP * 2)
#define MLA_SMEM (MLA_OFF_ST + 3 * MLA_HB * 4)

/* Grid (NH/48, splits, B): the head groups of one (sequence, split) are adjacent in launch
 * order, so the second group's cache reads hit L2. */
__global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_kernel(k3k_cu_mla_decode_args a,
                                                                     int chunk) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t *Qs = (uint16_t *)smem;
  uint16_t *KVs = (uint16_t *)(smem + MLA_OFF_KV);
  float *Sx = (float *)(smem + MLA_OFF_SX);
  uint16_t *Ps = (uint16_t *)(smem + MLA_OFF_PS);
  float *alpha_s = (float *)(smem + MLA_OFF_ST), *m_s = alpha_s + MLA_HB, *l_s = m_s + MLA_HB;
  const int split = blockIdx.y, b = blockIdx.z, hbase = blockIdx.x * MLA_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int len = a.seq_lens[(size_t)b * a.sl_stride];
  const int tok0 = split * chunk, tok1 = min(len, tok0 + chunk);
  const int32_t *bt = a.block_table + (size_t)b * a.pt_stride;

  /* Q rows: warp w copies rows w, w+8, ...; a row is 72 chunks of 16 B (lanes 0..31, +32, +64). */
  const uint16_t *qg = a.q + ((size_t)b * a.heads + hbase) * MLA_D;
  for (int r = w; r < MLA_HB; r += 8)
    for (int c = lane; c < MLA_D / 8; c += 32)
      cp_async16(Qs + r * MLA_LDS + c * 8, qg + (size_t)r * MLA_D + c * 8, true);
  /* KV tile: warp w copies token rows 8w..8w+7; each row's page is looked up once. Rows past
   * tok1 are zero-filled (their scores are masked; zero V keeps 0·V finite). */
  auto load_tile = [&](int ts, int buf) {
    uint16_t *dst = KVs + buf * MLA_TILE * MLA_LDS;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      int r = w * 8 + i, tok = ts + r;
      bool valid = tok < tok1;
      const uint16_t *src = a.kv;
      if (valid) src += ((size_t)bt[tok / a.page_size] * a.page_size + tok % a.page_size) * MLA_D;
      for (int c = lane; c < MLA_D / 8; c += 32)
        cp_async16(dst + r * MLA_LDS + c * 8, valid ? src + c * 8 : a.kv, valid);
    }
  };
  if (tok0 < tok1) load_tile(tok0, 0);
  cp_async_commit();

  const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */
  float oacc[3][8][4];
#pragma unroll
  for (int i = 0; i < 3; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) oacc[i][j][0] = oacc[i][j][1] = oacc[i][j][2] = oacc[i][j][3] = 0.f;
  /* Softmax state of rows 6w..6w+5 (warp-uniform m; l as per-lane partial sums). */
  float m_row[6], l_row[6];
#pragma unroll
  for (int i = 0; i < 6; i++) m_row[i] = -INFINITY, l_row[i] = 0.f;

  const int tg = w & 3, kh = w >> 2;
  int buf = 0;
  for (int ts = tok0; ts < tok1; ts += MLA_TILE, buf ^= 1) {
    cp_async_wait<0>();
    __syncthreads(); /* tile `buf` landed for all threads; the previous tile is fully used */
    if (ts + MLA_TILE < tok1) load_tile(ts + MLA_TILE, buf ^ 1);
    cp_async_commit();
    const uint16_t *kvb = KVs + buf * MLA_TILE * MLA_LDS;

    /* Scores: 48 heads x tokens 16tg..+16 over dims kh*288..+288. */
    float sacc[3][2][4];
#pragma unroll
    for (int i = 0; i < 3; i++)
#pragma unroll
      for (int j = 0; j < 2; j++) sacc[i][j][0] = sacc[i][j][1] = sacc[i][j][2] = sacc[i][j][3] = 0.f;
    {
      const uint16_t *qa = Qs + (lane & 15) * MLA_LDS + kh * 288 + (lane >> 4) * 8;
      const uint16_t *kb =
          kvb + (16 * tg + ((lane >> 4) << 3) + (lane & 7)) * MLA_LDS + kh * 288 + ((lane >> 3) & 1) * 8;
#pragma unroll 6
      for (int ks = 0; ks < 18; ks++) {
        uint32_t bf[4], af[3][4];
        ldsm_x4(bf, kb + ks * 16);
#pragma unroll
        for (int mt = 0; mt < 3; mt++) ldsm_x4(af[mt], qa + mt * 16 * MLA_LDS + ks * 16);
#pragma unroll
        for (int mt = 0; mt < 3; mt++) {
          mma_bf16(sacc[mt][0], af[mt], bf[0], bf[1]);
          mma_bf16(sacc[mt][1], af[mt], bf[2], bf[3]);
        }
      }
    }
    if (kh == 1) {
#pragma unroll
      for (int mt = 0; mt < 3; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          float *s = Sx + (16 * mt + g) * MLA_SXP + 16 * tg + 8 * nt + 2 * t4;
          *(float2 *)s = make_float2(sacc[mt][nt][0], sacc[mt][nt][1]);
          *(float2 *)(s + 8 * MLA_SXP) = make_float2(sacc[mt][nt][2], sacc[mt][nt][3]);
        }
    }
    __syncthreads();
    if (kh == 0) {
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
        int col = 16 * tg + 8 * nt + 2 * t4;
        bool v0 = ts + col < tok1, v1 = ts + col + 1 < tok1;
#pragma unroll
        for (int mt = 0; mt < 3; mt++) {
          float *s = Sx + (16 * mt + g) * MLA_SXP + col;
          float2 lo = *(float2 *)s, hi = *(float2 *)(s + 8 * MLA_SXP);
          lo.x = v0 ? (lo.x + sacc[mt][nt][0]) * sl2 : -INFINITY;
          lo.y = v1 ? (lo.y + sacc[mt][nt][1]) * sl2 : -INFINITY;
          hi.x = v0 ? (hi.x + sacc[mt][nt][2]) * sl2 : -INFINITY;
          hi.y = v1 ? (hi.y + sacc[mt][nt][3]) * sl2 : -INFINITY;
          *(float2 *)s = lo;
          *(float2 *)(s + 8 * MLA_SXP) = hi;
        }
      }
    }
    __syncthreads();
    /* Online softmax, warp w rows 6w..6w+5, lane tokens lane and lane+32. A tile always holds a
     * valid token, so the new max is finite. */
#pragma unroll
    for (int i = 0; i < 6; i++) {
      int row = 6 * w + i;
      float s0 = Sx[row * MLA_SXP + lane], s1 = Sx[row * MLA_SXP + lane + 32];
      float mx = warp_max(fmaxf(s0, s1));
      float mn = fmaxf(m_row[i], mx);
      float al = exp2f(m_row[i] - mn);
      m_row[i] = mn;
      float p0 = exp2f(s0 - mn), p1 = exp2f(s1 - mn);
      l_row[i] = l_row[i] * al + p0 + p1;
      Ps[row * MLA_PP + lane] = f2bf(p0);
      Ps[row * MLA_PP + lane + 32] = f2bf(p1);
      if (lane == 0) alpha_s[row] = al;
    }
    __syncthreads();
    /* O[48 x dims 64w..+64] = alpha * O + P V. */
    {
#pragma unroll
      for (int mt = 0; mt < 3; mt++) {
        float al0 = alpha_s[16 * mt + g], al1 = alpha_s[16 * mt + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
          oacc[mt][nt][0] *= al0;
          oacc[mt][nt][1] *= al0;
          oacc[mt][nt][2] *= al1;
          oacc[mt][nt][3] *= al1;
        }
      }
      const uint16_t *pa = Ps + (lane & 15) * MLA_PP + (lane >> 4) * 8;
      const uint16_t *vb = kvb + (((lane >> 3) & 1) * 8 + (lane & 7)) * MLA_LDS + 64 * w + (lane >> 4) * 8;
#pragma unroll
      for (int ks = 0; ks < 4; ks++) {
        uint32_t af[3][4];
#pragma unroll
        for (int mt = 0; mt < 3; mt++) ldsm_x4(af[mt], pa + mt * 16 * MLA_PP + ks * 16);
#pragma unroll
        for (int np = 0; np < 4; np++) {
          uint32_t bf[4];
          ldsm_x4_trans(bf, vb + ks * 16 * MLA_LDS + np * 16);
#pragma unroll
          for (int mt = 0; mt < 3; mt++) {
            mma_bf16(oacc[mt][2 * np], af[mt], bf[0], bf[1]);
            mma_bf16(oacc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  /* Row statistics to shared memory: m (log2 units) and l. */
#pragma unroll
  for (int i = 0; i < 6; i++) {
    float l = warp_sum(l_row[i]);
    if (lane == 0) {
      m_s[6 * w + i] = m_row[i];
      l_s[6 * w + i] = l;
    }
  }
  __syncthreads();
  int splits = gridDim.y;
  size_t nrow = (size_t)a.batch * a.heads;
  bool empty = tok0 >= tok1;
#pragma unroll
  for (int mt = 0; mt < 3; mt++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      int row = 16 * mt + g + 8 * hh;
      float il = empty ? 0.f : 1.0f / l_s[row];
      size_t orow = (size_t)b * a.heads + hbase + row;
      if (splits == 1) {
        uint16_t *o = a.out + orow * MLA_DV + 64 * w + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
          *(uint32_t *)(o + nt * 8) =
              pack_bf2(oacc[mt][nt][2 * hh] * il, oacc[mt][nt][2 * hh + 1] * il);
      } else {
        /* Split partials: normalised O (fp32) and lse (log2 units; -inf for an empty split). */
        size_t r = (size_t)split * nrow + orow;
        float *o = a.work + r * MLA_DV + 64 * w + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
          *(float2 *)(o + nt * 8) =
              make_float2(oacc[mt][nt][2 * hh] * il, oacc[mt][nt][2 * hh + 1] * il);
        if (w == 0 && t4 == 0)
          a.work[(size_t)splits * nrow * MLA_DV + r] =
              empty ? -INFINITY : m_s[row] + log2f(l_s[row]);
      }
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

/* Split count: minimises the estimated attention + merge time. One block per SM at a time; a
 * block costs (its tiles + 2) x ~1.2 us (the 2: Q load, pipeline fill and epilogue, which
 * nothing overlaps); splitting costs writing and re-reading B*NH*512 fp32 partials per split
 * (~4 TB/s) plus ~5 us for the merge launch. (Counting waves x tiles alone chose 43 splits at
 * B = 64 x 8K: 0.5 GB of partials, most of the old kernel's time.) */
static int mla_splits(const k3k_cu_mla_decode_args *a) {
  long units = (long)a->batch * ((a->heads + MLA_HB - 1) / MLA_HB);
  long tiles = (a->max_len + MLA_TILE - 1) / MLA_TILE;
  if (tiles < 1) return 1;
  int best = 1;
  double best_cost = -1;
  for (int s = 1; s <= 64 && s <= tiles; s++) {
    long per = (tiles + s - 1) / s;
    long waves = (units * s + a->num_sms - 1) / a->num_sms;
    double cost = (double)waves * (per + 2) * 1.2;
    if (s > 1) cost += 5.0 + 2.0 * s * a->batch * a->heads * MLA_DV * 4.0 / 4.0e6;
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

static size_t mla_work_bytes(const k3k_cu_mla_decode_args *a) {
  int s = mla_splits(a);
  if (s == 1) return 0;
  return (size_t)s * a->batch * a->heads * (MLA_DV + 1) * sizeof(float);
}

/* Benchmark hook: 1 = the mma.sync kernel even where the Hopper kernel applies; 1024 = the
 * Hopper kernel with an exact max exchange and rescale on every tile, 2048 = S of the next tile
 * queued behind P.V (the default of sessions 3-16), 4096 = warpgroup 1's producer thread does
 * the page lookups and L2 prefetches (the kernel before session 10), 8192 = the op path before session 10 (q staged,
 * output through fp32 + cast), 16384 = L2 prefetch 5 tiles ahead instead of 3, 32768 = split S
 * (S starts on the first refill batch; mla_decode_wg.cu) (all correct). Flags that leave a stage of
 * the Hopper kernel out (wrong results, timing only): 2 = no wgmma, 8 = only the first head
 * group runs, 32 = no loads after the first two tiles. 0 = normal. */
static int g_mla_probe;
void k3k_cuda_mla_probe(int mode) { g_mla_probe = mode; }

/* K3PD_MLA_DECODE_OLD=1: the op as measured on 2026-12-02 06:30 (the fallback): probe bits 4096
 * (warpgroup 1's producer thread does the page lookups and L2 prefetches), 8192 (q copied to a
 * bf16 staging buffer, output through fp32 + cast) and 2048 (S queued behind P.V). */
static int mla_old_bits(void) {
  static int bits = -1;
  if (bits < 0) {
    const char *e = getenv("K3PD_MLA_DECODE_OLD");
    bits = e && e[0] == '1' ? 4096 | 8192 | 2048 : 0;
  }
  return bits;
}

static int mla_attend(cudaStream_t st, k3k_cu_mla_decode_args *a) {
  if (a->batch == 0) return 0;
  int splits = mla_splits(a);
  int chunk = (a->max_len + splits - 1) / splits;
  chunk = (chunk + MLA_TILE - 1) / MLA_TILE * MLA_TILE;
  if (chunk < MLA_TILE) chunk = MLA_TILE;
  if (a->heads % MLA_HB != 0 && !mla_wg_ok(a)) return K3_ENOTSUP; /* k3k_cuda_mla_decode_ok */
  if ((!(a->probe & 1) || a->heads % MLA_HB != 0) && mla_wg_ok(a)) {
    int rc = mla_wg_launch(st, a, splits, chunk);
    if (rc) return rc;
  } else {
    /* Cheap and idempotent; set on every call so no global state is needed (per device). */
    K3K_CU(cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                MLA_SMEM));
    mla_decode_kernel<<<dim3(a->heads / MLA_HB, splits, a->batch), MLA_THREADS, MLA_SMEM, st>>>(
        *a, chunk);
    K3K_LAUNCHED("mla_decode");
  }
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

/* q bf16 with unit column stride and 16-byte aligned rows: the absorption GEMM reads q_nope
 * from q itself, so only q_rot goes to qabs, 16 bytes per thread (8 chunks per head). */
__global__ void mla_rope_copy_kernel(const uint16_t *q, int64_t ldq, int64_t nh, int64_t total,
                                     uint16_t *qabs) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= total) return;
  int64_t n = i / (nh * 8), rem = i % (nh * 8), h = rem / 8, c = rem % 8;
  *(uint4 *)(qabs + (n * nh + h) * MLA_D + MLA_DV + 8 * c) =
      *(const uint4 *)(q + n * ldq + h * 192 + 128 + 8 * c);
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
  /* 48-head groups; other multiples of 8 (the 48B's 32 heads) only on the Hopper kernel, i.e.
   * page sizes that are multiples of 8 */
  if (p->n_heads <= 0 || (p->n_heads % MLA_HB != 0 && (p->n_heads % 8 != 0 || cache->shape[1] % 8 != 0)))
    return false;
  if (w->dtype != K3K_BF16 || w->stride[1] != 1 || (w->stride[0] % 8) != 0 ||
      ((uintptr_t)w->data & 15))
    return false;
  if (cache->dtype != K3K_BF16 || !k3k_tensor_is_contiguous(cache) ||
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

int k3k_cuda_mla_decode_fast(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_mla_params_t *p = (const k3k_mla_params_t *)params;
  const k3k_tensor_t *q = t[0], *w = t[1], *cache = t[2], *pt = t[3], *sl = t[4], *o = t[5];
  int64_t N = p->n_seqs, NH = p->n_heads, ldw = w->stride[0];
  if (N == 0) return 0;
  const int probe = g_mla_probe | mla_old_bits();
  /* Direct paths (off with K3PD_MLA_DECODE_OLD=1 or probe 8192): the page check's host wait
   * overlaps q prep + absorption (they write scratch only); a bf16 q with unit column stride
   * and 16-byte aligned rows feeds the absorption GEMM as it is (only q_rot is copied); a bf16
   * o of that kind takes the output GEMM's result straight (no fp32 staging + cast). Same
   * products, same fp32 accumulation; the output is rounded to bf16 once either way. */
  const bool direct = !(probe & 8192);
  /* seq_lens within the page table and every used page id within the pool: checked on the
   * device before the kernels index the cache (old path: here, with its synchronisation). */
  int rc = direct ? 0 : k3k_cuda_check_pages(cx, pt, sl, N, cache->shape[1], cache->shape[0]);
  if (rc) return rc;
  k3k_cu_mla_decode_args a;
  memset(&a, 0, sizeof a);
  a.batch = (int)N;
  a.heads = (int)NH;
  a.kv = (const uint16_t *)cache->data;
  a.page_size = (int)cache->shape[1];
  a.pages = cache->shape[0];
  a.block_table = (const int32_t *)pt->data;
  a.pt_stride = pt->stride[0];
  a.seq_lens = (const int32_t *)sl->data;
  a.sl_stride = sl->stride[0];
  int64_t cap = pt->shape[1] * cache->shape[1];
  a.max_len = (int)(p->max_seqlen_k > 0 && p->max_seqlen_k < cap ? p->max_seqlen_k : cap);
  a.scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf(192.0f);
  a.num_sms = cx->num_sms;
  a.probe = probe;
  /* qabs: MLA_HB spare rows for a partial last head group (mla_decode.cuh) */
  size_t b_qb = al256(N * NH * 192 * 2), b_qabs = al256((N * NH + MLA_HB) * MLA_D * 2),
         b_olat = al256(N * NH * MLA_DV * 2), b_o32 = al256(N * NH * 128 * 4),
         b_work = al256(mla_work_bytes(&a));
  char *base;
  rc = k3k_cuda_scratch(cx, b_qb + b_qabs + b_olat + b_o32 + b_work + 256, (void **)&base);
  if (rc) return rc;
  bool chk = false;
  if (direct) {
    unsigned *res = (unsigned *)(base + b_qb + b_qabs + b_olat + b_o32 + b_work);
    rc = k3k_cuda_check_pages_begin(cx, pt, sl, N, cache->shape[1], cache->shape[0], res, &chk);
    if (rc) return rc;
  }
  uint16_t *qb = (uint16_t *)base, *qabs = (uint16_t *)(base + b_qb);
  uint16_t *olat = (uint16_t *)(base + b_qb + b_qabs);
  float *o32 = (float *)(base + b_qb + b_qabs + b_olat);
  a.work = (float *)(base + b_qb + b_qabs + b_olat + b_o32);
  a.q = qabs;
  a.out = olat;

  const bool q_direct = direct && q->dtype == K3K_BF16 && q->stride[1] == 1 &&
                        q->stride[0] % 8 == 0 && ((uintptr_t)q->data & 15) == 0;
  const bool o_direct = direct && o->dtype == K3K_BF16 && o->stride[1] == 1 &&
                        o->stride[0] % 8 == 0 && ((uintptr_t)o->data & 15) == 0;
  MLA_MARK(0);
  const void *qn = qb;
  int64_t ldq = NH * 192;
  if (q_direct) {
    int64_t total = N * NH * 8;
    mla_rope_copy_kernel<<<(unsigned)k3k_ceil_div(total, 256), 256, 0, cx->stream>>>(
        (const uint16_t *)q->data, q->stride[0], NH, total, qabs);
    K3K_LAUNCHED("mla_rope_copy");
    qn = q->data;
    ldq = q->stride[0];
  } else {
    mla_prep_kernel<<<dim3(k3k_ceil_div(NH * 192, 256), (unsigned)N), 256, 0, cx->stream>>>(
        mkdv(q), NH, qb, qabs);
    K3K_LAUNCHED("mla_prep");
  }
  MLA_MARK(1);
  /* q_lat[n][h][c] = Σ_d W[h*256+d][c] q_nope[n][h][d]  (col-major: 512 x N per head). */
  rc = k3k_cuda_lt_gemm(cx, 0, 0, MLA_DV, N, 128, w->data, CUDA_R_16BF, ldw, 256 * ldw, qn,
                        CUDA_R_16BF, ldq, 192, qabs, CUDA_R_16BF, NH * MLA_D, MLA_D, (int)NH);
  if (rc) return rc;
  rc = k3k_cuda_check_pages_end(cx, chk); /* the host waited for the check alone */
  if (rc) return rc;
  MLA_MARK(2);
  rc = mla_attend(cx->stream, &a);
  if (rc) return rc;
  MLA_MARK(3);
  /* o[n][h][v] = Σ_c W[h*256+128+v][c] o_lat[n][h][c]  (col-major: 128 x N per head). */
  if (o_direct) {
    rc = k3k_cuda_lt_gemm(cx, 1, 0, 128, N, MLA_DV, (const uint16_t *)w->data + 128 * ldw,
                          CUDA_R_16BF, ldw, 256 * ldw, olat, CUDA_R_16BF, NH * MLA_DV, MLA_DV,
                          o->data, CUDA_R_16BF, o->stride[0], 128, (int)NH);
    if (rc) return rc;
  } else {
    rc = k3k_cuda_lt_gemm(cx, 1, 0, 128, N, MLA_DV, (const uint16_t *)w->data + 128 * ldw,
                          CUDA_R_16BF, ldw, 256 * ldw, olat, CUDA_R_16BF, NH * MLA_DV, MLA_DV,
                          o32, CUDA_R_32F, NH * 128, 128, (int)NH);
    if (rc) return rc;
    mla_out_kernel<<<dim3(k3k_ceil_div(NH * 128, 256), (unsigned)N), 256, 0, cx->stream>>>(
        o32, NH * 128, mkdv(o));
    K3K_LAUNCHED("mla_out");
  }
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
