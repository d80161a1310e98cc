/* CUDA: the state-independent half of KDA_CHUNK (spec §3.8), one block per (chunk, head).
 *
 * What it is for: everything of a 64-row chunk that does not need the incoming state, computed
 * for all chunks and heads at once (the grid is (chunk slots, heads), no sequential
 * dependency), written as one record per (chunk, head) for the state pass (kda_chunk.cuh):
 *   P1  G = cumsum(g) per key channel (fp32, in registers: thread = 4 rows x 8 channels; padded
 *       rows have g = 0 so they repeat G_{n-1}); beta.
 *   P2  bf16 operands from registers with 16-byte stores: k_r e^{G_r-G_ni}, q_r e^{G_r-G_ni}
 *       (n_i = first row of the row's 16-row block i), k_s e^{G_ni-G_s} for every block i >= the
 *       block of s (one copy per i: the sub-chunk factorisation; every exponent <= 0 except
 *       inside the diagonal block, bounded by its gate span); and straight to the record
 *       e^G k, q e^G and k e^{Gl-G}.
 *   P3  L = beta_r (k k^T)_gated (strict lower) and Aqk (lower incl. diagonal) on tensor cores
 *       (mma.sync m16n8k16 bf16, fp32 accumulate). A 16-row block whose gate span exceeds
 *       KC_SPAN (never with K3's g > -5; possible with the 48B softplus gate) gets its diagonal
 *       recomputed per element with exp(sum of g) from global memory, as the reference does.
 *   P4  X = (I + L)^-1 in fp32: the four diagonal 16x16 blocks by forward substitution with the
 *       column in registers (Aqk goes to the record meanwhile), then the off-diagonal blocks by
 *       distance (X_ij = -X_ii sum_m L_im X_mj) on tensor cores in 3xTF32 (fp32-level accuracy);
 *       T = X diag(beta) -> bf16 record.
 * W = T (e^G k) and U = T v are not formed here: the state pass computes Vn = T (v - (e^G k) S)
 * (kda_chunk_state_wg.cu), so v is never read here and the record is 66 KB instead of 74 KB.
 * What it is not: the state recurrence (kda_chunk_state_wg.cu). Dk = Dv = 128, chunk 64 only.
 * Shared memory 82 KB, 128 registers: two blocks share an SM (one block's loads overlap the
 * other's math).
 * Numerics: bf16 operands into the tensor cores (relative 2^-9), fp32 accumulation, fp32 G,
 * L, X; k and q are rounded to bf16 once (after their exponential factors). */
#include "kda_chunk.cuh"

#define KA_THREADS 256
#define KP 136 /* bf16 pitch of 128-wide rows (272 B: conflict-free ldmatrix) */
#define KPF 65 /* fp32 pitch of 64x64 matrices */
#define KPW 129 /* fp32 pitch of the wide-span staging rows (16 x 128 per array) */

/* Shared memory map (bytes); the regions are reused phase by phase. */
#define KA_RA 0                      /* Kr bf16 [64][KP] | L fp32 [64][KPF] */
#define KA_RB (KA_RA + 64 * KP * 2)  /* Qr bf16 [64][KP] | Aqk fp32 [64][KPF] */
#define KA_RC (KA_RB + 64 * KP * 2)  /* Bc bf16 [160][KP] | X fp32 at KA_RC_X */
#define KA_MISC (KA_RC + 160 * KP * 2)
#define KA_GB KA_MISC                   /* G at rows 0,16,32,48 and 63: fp32 [5][128] */
#define KA_BETA (KA_GB + 5 * 128 * 4)   /* fp32 [64] */
#define KA_Y (KA_BETA + 64 * 4)         /* fp32 [6 warps][16][8] inversion temporaries */
#define KA_FLAG (KA_Y + 6 * 16 * 8 * 4)
#define KA_SMEM (KA_FLAG + 16)
#define KA_RC_X (64 * KP * 2) /* inside RC */
static_assert(3 * 16 * KPW * 4 <= 160 * KP * 2, "wide-span staging fits in RC");

/* Eight consecutive elements (row, col..col+7) of a [T, C] tensor as floats. */
__device__ __forceinline__ void kc_ld8(const dv &t, int vec, int64_t row, int64_t col, float f[8]) {
  if (vec && t.dt == 1) {
    bf16x8 p = *(const bf16x8 *)((const uint16_t *)t.p + row * t.s[0] + col);
    unpack8(p, f);
  } else if (vec) {
    const float4 *p = (const float4 *)((const float *)t.p + row * t.s[0] + col);
    float4 x = p[0], y = p[1];
    f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
  } else {
#pragma unroll
    for (int u = 0; u < 8; u++) f[u] = dv_ld(t, row * t.s[0] + (col + u) * t.s[1]);
  }
}

/* k and q of one row as floats: from the registers (bf16 inputs, exact) or, for other inputs,
 * re-read in fp32 so they are rounded to bf16 only once, after the exponential factors. */
__device__ __forceinline__ void kc_kq(const kc_args &a, bool fast, const bf16x8 &kp,
                                      const bf16x8 &qp, int64_t row, int64_t col, bool in,
                                      float kf[8], float qf[8]) {
  if (fast) {
    unpack8(kp, kf);
    unpack8(qp, qf);
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) kf[j] = qf[j] = 0.0f;
    if (in) {
      kc_ld8(a.k, a.vk, row, col, kf);
      kc_ld8(a.q, a.vq, row, col, qf);
    }
  }
}

__device__ __forceinline__ void st8(void *p, const float f[8]) { *(bf16x8 *)p = pack8(f); }

/* x = hi + lo with hi a tf32 value (10-bit mantissa: the low 13 bits cleared after rounding to
 * nearest, done here on the bits so nothing depends on how cvt fills them) and lo = x - hi
 * (exact); the tensor cores read lo's top 19 bits. A product of two split operands summed as
 * hi*hi + hi*lo + lo*hi (3xTF32) keeps ~2^-21 relative accuracy, i.e. fp32-level. */
__device__ __forceinline__ void kc_split(float x, uint32_t &hi, uint32_t &lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
/* (hi, lo) (16x8) += A (16x8) B (8x8), mma.sync m16n8k8 tf32 in 3xTF32: the hi*hi term into
 * hi, the two small terms into lo (separate accumulators, so the dependent mma chain is short;
 * the caller sums them). Fragments (PTX ISA "mma.m16n8k8" .tf32), lane = 4g + t4: af = A(g, t4),
 * A(g+8, t4), A(g, t4+4), A(g+8, t4+4); bf = B(t4, g), B(t4+4, g); accumulators C(g, 2t4..+1),
 * C(g+8, 2t4..+1). */
__device__ __forceinline__ void kc_mma3(float hi[4], float lo[4], const float af[4], const float bf[2]) {
  uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
  for (int q = 0; q < 4; q++) kc_split(af[q], ah[q], al[q]);
  kc_split(bf[0], bh[0], bl[0]);
  kc_split(bf[1], bh[1], bl[1]);
#define KC_MMA_TF32(C, A, B0, B1)                                                                   \
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%0,%1,%2,%3};\n"                                                        \
               : "+f"(C[0]), "+f"(C[1]), "+f"(C[2]), "+f"(C[3])                                   \
               : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B0), "r"(B1))
  KC_MMA_TF32(lo, al, bh[0], bh[1]);
  KC_MMA_TF32(lo, ah, bl[0], bl[1]);
  KC_MMA_TF32(hi, ah, bh[0], bh[1]);
#undef KC_MMA_TF32
}

/* FAST: bf16 q/k and fp32 g, rows contiguous and 16-byte aligned (the model's case). */
template <bool FAST>
__global__ void __launch_bounds__(KA_THREADS, 2) kc_intra_kernel(kc_args a) {
  extern __shared__ __align__(16) unsigned char sm[];
  kc_bf *Kr = (kc_bf *)(sm + KA_RA), *Qr = (kc_bf *)(sm + KA_RB), *Bc = (kc_bf *)(sm + KA_RC);
  float *Lf = (float *)(sm + KA_RA), *Af = (float *)(sm + KA_RB);
  float *X = (float *)(sm + KA_RC + KA_RC_X);
  float *Gb = (float *)(sm + KA_GB), *beta_s = (float *)(sm + KA_BETA), *Y = (float *)(sm + KA_Y);
  int *flag = (int *)(sm + KA_FLAG);

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int c = blockIdx.x, h = a.h0 + blockIdx.y;
  const int seq = kc_find_seq(a.cfirst, a.n_seqs, c);
  if (seq >= a.n_seqs) return; /* slot past the last chunk (the grid is an upper bound) */
  const int end = a.cu[(seq + 1) * a.cu_s];
  const int cs = a.cu[seq * a.cu_s] + (c - a.cfirst[seq]) * KC_C, n = min(KC_C, end - cs);
  const int64_t ch = (int64_t)h * KC_D;
  unsigned char *rec = a.rec + ((size_t)c * a.hg + blockIdx.y) * KC_REC;

  /* ---- P1: loads (k, q, g for 4 rows x 8 channels), G by a two-level scan ---- */
  const int cg = tid & 15, rg = tid >> 4, d0 = cg * 8, r0 = rg * 4, blk = rg >> 2;
  float G[4][8];
  bf16x8 kp[4], qp[4]; /* k, q as loaded (bf16 inputs only; others re-read in fp32 in P2) */
  const bool fast = FAST;
  if (fast) {
    /* Fast path: all 16 vector loads in flight before the first use (rows past n re-read row
     * n-1 and are zeroed afterwards, so no load sits behind a branch). */
    float4 g4[4][2];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int64_t row = cs + min(r0 + u, n - 1);
      const float4 *pg = (const float4 *)((const float *)a.g.p + row * a.g.s[0] + ch + d0);
      g4[u][0] = pg[0], g4[u][1] = pg[1];
      kp[u] = *(const bf16x8 *)((const uint16_t *)a.k.p + row * a.k.s[0] + ch + d0);
      qp[u] = *(const bf16x8 *)((const uint16_t *)a.q.p + row * a.q.s[0] + ch + d0);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const bool in = r0 + u < n;
      G[u][0] = g4[u][0].x, G[u][1] = g4[u][0].y, G[u][2] = g4[u][0].z, G[u][3] = g4[u][0].w;
      G[u][4] = g4[u][1].x, G[u][5] = g4[u][1].y, G[u][6] = g4[u][1].z, G[u][7] = g4[u][1].w;
      if (!in) {
#pragma unroll
        for (int j = 0; j < 8; j++) G[u][j] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) kp[u].w[j] = qp[u].w[j] = 0u;
      }
    }
  } else {
#pragma unroll
    for (int u = 0; u < 4; u++) {
      float f[8] = {0, 0, 0, 0, 0, 0, 0, 0}, e[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 8; j++) G[u][j] = 0.0f;
      if (r0 + u < n) kc_ld8(a.g, a.vg, cs + r0 + u, ch + d0, G[u]);
      kp[u] = pack8(f); /* unused on this path (kc_kq re-reads) */
      qp[u] = pack8(e);
    }
  }
  if (tid < KC_C) beta_s[tid] = tid < n ? dv_ld(a.beta, (int64_t)(cs + tid) * a.beta.s[0] + h * a.beta.s[1]) : 0.0f;
  if (tid == 0) *flag = 0;
#pragma unroll
  for (int u = 1; u < 4; u++)
#pragma unroll
    for (int j = 0; j < 8; j++) G[u][j] += G[u - 1][j];
  float *tot = (float *)(sm + KA_RC); /* [16][128] row-group totals, before Bc is built */
  ((float4 *)(tot + rg * 128 + d0))[0] = make_float4(G[3][0], G[3][1], G[3][2], G[3][3]);
  ((float4 *)(tot + rg * 128 + d0))[1] = make_float4(G[3][4], G[3][5], G[3][6], G[3][7]);
  __syncthreads();
  if (tid < KC_D) { /* exclusive prefix over the 16 row groups in place, one channel per thread */
    float t[16], run = 0.0f;
#pragma unroll
    for (int q2 = 0; q2 < 16; q2++) t[q2] = tot[q2 * 128 + tid];
#pragma unroll
    for (int q2 = 0; q2 < 16; q2++) {
      tot[q2 * 128 + tid] = run;
      run += t[q2];
    }
  }
  __syncthreads();
  {
    const float4 o0 = ((const float4 *)(tot + rg * 128 + d0))[0], o1 = ((const float4 *)(tot + rg * 128 + d0))[1];
    const float off[8] = {o0.x, o0.y, o0.z, o0.w, o1.x, o1.y, o1.z, o1.w};
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int j = 0; j < 8; j++) G[u][j] += off[j];
  }
  if ((rg & 3) == 0)
#pragma unroll
    for (int j = 0; j < 8; j++) Gb[blk * 128 + d0 + j] = G[0][j];
  if (rg == 15)
#pragma unroll
    for (int j = 0; j < 8; j++) Gb[4 * 128 + d0 + j] = G[3][j];
  __syncthreads(); /* Gb complete; tot dead */
  if ((rg & 3) == 3) { /* block span check on the block's last row */
    bool wide = false;
#pragma unroll
    for (int j = 0; j < 8; j++) wide |= Gb[blk * 128 + d0 + j] - G[3][j] > KC_SPAN;
    if (wide) atomicOr(flag, 1 << blk);
  }

  /* ---- P2: operands ---- */
  {
    const float *gl = Gb + 4 * 128 + d0; /* G of the last row */
    if (rg == 15) { /* e^{G_last} for the state decay */
      float e8[8];
#pragma unroll
      for (int j = 0; j < 8; j++) e8[j] = __expf(gl[j]);
      float4 *pe = (float4 *)(rec + KC_REC_E) + cg * 2;
      pe[0] = make_float4(e8[0], e8[1], e8[2], e8[3]);
      pe[1] = make_float4(e8[4], e8[5], e8[6], e8[7]);
    }
    /* Exponentials factorised through the block's first row (gb = G_{n_i}) so most are shared
     * by the thread's 4 rows: e^G = e^gb e^{G-gb}, e^{Gl-G} = e^{Gl-gb} e^{gb-G},
     * e^{G_b2-G} = e^{G_b2-gb} e^{gb-G}; each factor is <= 1 except e^{gb-G} <= e^KC_SPAN. A
     * thread with a row past the span (wide gates only) takes the direct form instead. */
    float gb[8], eb[8], elb[8];
    bool wide_t = false;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      gb[j] = Gb[blk * 128 + d0 + j];
      eb[j] = __expf(gb[j]);
      elb[j] = __expf(gl[j] - gb[j]);
#pragma unroll
      for (int u = 0; u < 4; u++) wide_t |= gb[j] - G[u][j] > KC_SPAN;
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int r = r0 + u;
      float kf[8], qf[8], t0[8], t1[8], t2[8];
      kc_kq(a, fast, kp[u], qp[u], cs + min(r, n - 1), ch + d0, r < n, kf, qf);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        qf[j] *= a.scale;
        const float dn = __expf(G[u][j] - gb[j]), up = __expf(fminf(gb[j] - G[u][j], KC_SPAN));
        t0[j] = kf[j] * dn; /* Kr */
        t1[j] = qf[j] * dn; /* Qr */
        t2[j] = kf[j] * up; /* diagonal copy of Bc (clamped; wide blocks are redone per element) */
        G[u][j] = wide_t ? G[u][j] : up;
      }
      st8(Kr + r * KP + d0, t0);
      st8(Qr + r * KP + d0, t1);
      st8(Bc + (8 * blk * (blk + 1) + r) * KP + d0, t2);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        t0[j] *= eb[j]; /* k e^G = (k e^{G-gb}) e^gb */
        t1[j] *= eb[j];
        t2[j] = wide_t ? kf[j] * __expf(gl[j] - G[u][j]) : t2[j] * elb[j];
      }
      st8(rec + KC_REC_KQ + kc_sw(r, cg, 16384), t0);
      st8(rec + KC_REC_KQ + kc_sw(64 + r, cg, 16384), t1);
      st8(rec + KC_REC_K + kc_sw(r, cg, 8192), t2);
    }
    for (int b2 = blk + 1; b2 < 4; b2++) { /* off-diagonal copies of Bc */
      float f[8];
#pragma unroll
      for (int j = 0; j < 8; j++) f[j] = __expf(Gb[b2 * 128 + d0 + j] - gb[j]);
#pragma unroll
      for (int u = 0; u < 4; u++) {
        float kf[8], qf[8], t0[8];
        kc_kq(a, fast, kp[u], qp[u], cs + min(r0 + u, n - 1), ch + d0, r0 + u < n, kf, qf);
#pragma unroll
        for (int j = 0; j < 8; j++)
          t0[j] = wide_t ? kf[j] * __expf(Gb[b2 * 128 + d0 + j] - G[u][j]) : kf[j] * f[j] * G[u][j];
        st8(Bc + (8 * b2 * (b2 + 1) + r0 + u) * KP + d0, t0);
      }
    }
  }
  __syncthreads();

  /* ---- P3: L and Aqk. Jobs (block row i, product p, 8-wide n-tile j < 2(i+1)): 40 ---- */
  {
    float acc[5][4];
    int jb[5];
#pragma unroll
    for (int u = 0; u < 5; u++) {
      const int job = w + 8 * u, i = job < 4 ? 0 : job < 12 ? 1 : job < 24 ? 2 : 3;
      const int rem = job - (i == 0 ? 0 : i == 1 ? 4 : i == 2 ? 12 : 24), p = rem & 1, j = rem >> 1;
      jb[u] = (i << 8) | (p << 7) | j;
      acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0.0f;
      const kc_bf *A = (p ? Qr : Kr) + ((i << 4) + (lane & 15)) * KP + (lane >> 4) * 8;
      const kc_bf *B = Bc + (8 * i * (i + 1) + j * 8 + (lane & 7)) * KP + (lane >> 3) * 8;
#pragma unroll
      for (int k0 = 0; k0 < KC_D; k0 += 32) {
        uint32_t a0[4], a1[4], b[4];
        ldsm_x4(a0, A + k0);
        ldsm_x4(a1, A + k0 + 16);
        ldsm_x4(b, B + k0);
        mma_bf16(acc[u], a0, b[0], b[1]);
        mma_bf16(acc[u], a1, b[2], b[3]);
      }
    }
    __syncthreads(); /* Lf/Af overlay Kr/Qr */
#pragma unroll
    for (int u = 0; u < 5; u++) {
      const int i = jb[u] >> 8, p = (jb[u] >> 7) & 1, j = jb[u] & 127;
#pragma unroll
      for (int q2 = 0; q2 < 4; q2++) {
        const int r = (i << 4) + g + (q2 >> 1) * 8, s = j * 8 + 2 * t4 + (q2 & 1);
        if (p)
          Af[r * KPF + s] = s <= r ? acc[u][q2] : 0.0f;
        else
          Lf[r * KPF + s] = s < r ? beta_s[r] * acc[u][q2] : 0.0f;
      }
    }
  }
  __syncthreads();
  const int fl = *flag;
  if (fl) { /* diagonal blocks whose gate span is too wide to factorise: per element, from the
             * block's own cumulative gates; its k, q (times the scale) and gate sums are staged
             * in RC (free between P3's last read of Bc and P4's first write of X), one flagged
             * block at a time; a thread per (r, s) pair of the block, channels in order */
    float *Gs = (float *)(sm + KA_RC), *Ks = Gs + 16 * KPW, *Qs = Ks + 16 * KPW;
    for (int bl = 0; bl < 4; bl++) {
      if (!((fl >> bl) & 1)) continue; /* fl is the same in every thread */
      const int b0 = bl << 4;
      for (int e = tid; e < 16 * KC_D; e += KA_THREADS) {
        const int rr = e / KC_D, d = e % KC_D, row = b0 + rr;
        const bool in = row < n;
        Ks[rr * KPW + d] = in ? dv_ld(a.k, (int64_t)(cs + row) * a.k.s[0] + (ch + d) * a.k.s[1]) : 0.0f;
        Qs[rr * KPW + d] =
            in ? dv_ld(a.q, (int64_t)(cs + row) * a.q.s[0] + (ch + d) * a.q.s[1]) * a.scale : 0.0f;
      }
      if (tid < KC_D) { /* Gs[rr] = g_{b0+1} + ... + g_{b0+rr}: G_r - G_s = Gs[r] - Gs[s] */
        float acc = 0.0f;
        Gs[tid] = 0.0f;
        for (int rr = 1; rr < 16; rr++) {
          const int row = b0 + rr;
          if (row < n) acc += dv_ld(a.g, (int64_t)(cs + row) * a.g.s[0] + (ch + tid) * a.g.s[1]);
          Gs[rr * KPW + tid] = acc;
        }
      }
      __syncthreads();
      for (int m = tid; m < 136; m += KA_THREADS) {
        int rr = 0;
        while ((rr + 1) * (rr + 2) / 2 <= m) rr++;
        const int ss = m - rr * (rr + 1) / 2, r = b0 + rr, s2 = b0 + ss;
        if (r >= n) continue;
        const float *Gr = Gs + rr * KPW, *Gq = Gs + ss * KPW, *Kr2 = Ks + rr * KPW, *Kq = Ks + ss * KPW,
                    *Qr2 = Qs + rr * KPW;
        float lk = 0.0f, aq = 0.0f;
        for (int d = 0; d < KC_D; d++) {
          const float e = expf(Gr[d] - Gq[d]), ke = Kq[d] * e;
          lk += Kr2[d] * ke;
          aq += Qr2[d] * ke;
        }
        Lf[r * KPF + s2] = s2 < r ? beta_s[r] * lk : 0.0f;
        Af[r * KPF + s2] = aq;
      }
      __syncthreads();
    }
  }

  /* ---- P4: X = (I + L)^-1. Diagonal blocks: one thread per column, the column in registers;
   * meanwhile the other 192 threads store Aqk (final since P3) to the record. ---- */
  if (tid < KC_C) {
    const int b0 = tid & ~15, cl = tid & 15;
    float x[16];
    x[0] = cl == 0 ? 1.0f : 0.0f;
#pragma unroll
    for (int rr = 1; rr < 16; rr++) {
      const float *Lr = Lf + (b0 + rr) * KPF + b0;
      float s0 = 0.0f, s1 = 0.0f; /* two chains: half the dependent FMA latency per row */
#pragma unroll
      for (int m = 0; m < rr; m += 2) {
        s0 += Lr[m] * x[m];
        if (m + 1 < rr) s1 += Lr[m + 1] * x[m + 1];
      }
      x[rr] = rr == cl ? 1.0f : -(s0 + s1); /* rows above cl: all x[m] are 0, so -s = 0 */
    }
#pragma unroll
    for (int rr = 0; rr < 16; rr++) X[(b0 + rr) * KPF + b0 + cl] = x[rr];
  } else {
    for (int e = tid - KC_C; e < 64 * 8; e += KA_THREADS - KC_C) {
      const int r = e >> 3, s0 = (e & 7) * 8;
      float f[8];
#pragma unroll
      for (int u = 0; u < 8; u++) f[u] = s0 + u > r ? 0.0f : Af[r * KPF + s0 + u];
      st8(rec + KC_REC_A + kc_sw(r, s0 >> 3, 8192), f);
    }
  }
  __syncthreads();
  /* Off-diagonal blocks by distance (3, 2, 1 blocks per round): X_ij = -X_ii Y with
   * Y = sum_{m in [16j, 16i)} L_im X_mj, i = j + dist, on tensor cores in 3xTF32 (kc_mma3:
   * fp32-level accuracy). One warp per (block, 8-column half): 6, 4, 2 warps per round; Y goes
   * through a per-warp 16x8 tile to become the B operand of the second product. */
  float *Yw = Y + w * 128;
#pragma unroll 1
  for (int dist = 1; dist < 4; dist++) {
    if (w < 2 * (4 - dist)) {
      const int j = w >> 1, i = j + dist, cn = 16 * j + 8 * (w & 1);
      /* Accumulators per k-step parity and term (kc_mma3): chains of <= 3 dependent mmas. */
      float yh[2][4] = {}, yl[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < 6; kk++) {
        const int k0 = 16 * j + 8 * kk;
        if (k0 < 16 * i) {
          const float *La = Lf + (16 * i + g) * KPF + k0 + t4, *Xb = X + (k0 + t4) * KPF + cn + g;
          const float af[4] = {La[0], La[8 * KPF], La[4], La[8 * KPF + 4]}, bf[2] = {Xb[0], Xb[4 * KPF]};
          kc_mma3(yh[kk & 1], yl[kk & 1], af, bf);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; q++) Yw[(g + 8 * (q >> 1)) * 8 + 2 * t4 + (q & 1)] = (yh[0][q] + yh[1][q]) + (yl[0][q] + yl[1][q]);
      __syncwarp();
      float xh[2][4] = {}, xl[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < 2; kk++) {
        const float *Xa = X + (16 * i + g) * KPF + 16 * i + 8 * kk + t4;
        const float af[4] = {Xa[0], Xa[8 * KPF], Xa[4], Xa[8 * KPF + 4]};
        const float bf[2] = {Yw[(8 * kk + t4) * 8 + g], Yw[(8 * kk + t4 + 4) * 8 + g]};
        kc_mma3(xh[kk], xl[kk], af, bf);
      }
      float x[4];
#pragma unroll
      for (int q = 0; q < 4; q++) x[q] = (xh[0][q] + xh[1][q]) + (xl[0][q] + xl[1][q]);
      float *Xo = X + (16 * i + g) * KPF + cn + 2 * t4;
      Xo[0] = -x[0], Xo[1] = -x[1], Xo[8 * KPF] = -x[2], Xo[8 * KPF + 1] = -x[3];
    }
    __syncthreads();
  }
  /* T = X diag(beta) -> bf16 record. 64 rows x 8 groups of 8 columns. */
  for (int e = tid; e < 64 * 8; e += KA_THREADS) {
    const int r = e >> 3, s0 = (e & 7) * 8;
    float f[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      const int s = s0 + u;
      f[u] = s > r ? 0.0f : X[r * KPF + s] * beta_s[s];
    }
    st8(rec + KC_REC_T + kc_sw(r, s0 >> 3, 8192), f);
  }
}

int kc_intra_launch(const kc_args &a, int n_chunk_slots, cudaStream_t st) {
  static bool attr_set = false; /* per process: the attribute belongs to the kernel */
  if (!attr_set) {
    K3K_CU(cudaFuncSetAttribute(kc_intra_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, KA_SMEM));
    K3K_CU(cudaFuncSetAttribute(kc_intra_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, KA_SMEM));
    attr_set = true;
  }
  const dim3 grid((unsigned)n_chunk_slots, (unsigned)a.hg);
  if (a.vg && a.vk && a.vq && a.g.dt == 0 && a.k.dt == 1 && a.q.dt == 1)
    kc_intra_kernel<true><<<grid, KA_THREADS, KA_SMEM, st>>>(a);
  else
    kc_intra_kernel<false><<<grid, KA_THREADS, KA_SMEM, st>>>(a);
  K3K_LAUNCHED("kda_chunk intra");
  return 0;
}
