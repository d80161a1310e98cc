/* CUDA: KDA_CHUNK, the chunked KDA prefill of spec §3.8 (WY/UT form, chunk 64) on tensor cores.
 *
 * What it is for: prefill of the 69 KDA layers. One block per (value slice of 64, head,
 * sequence) walks the sequence's chunks in order, holding its slice of the fp32 state
 * S[v][k] (V-first, 64 x 128) in shared memory. The state recurrence separates over value
 * columns (Vn[:,v], O[:,v] and S[v][:] only involve column v), so two slices of one head run in
 * parallel blocks and only the state-independent intra-chunk work (L, Aqk, the inversion, W) is
 * done twice. Per chunk (rows r, s; n <= 64; chunk grid restarting at each sequence start):
 *   P1  G = cumsum(g) per key channel (fp32, padded rows repeat G_{n-1}); v^T, beta.
 *   P2  bf16 operands: k_r e^{G_r-G_ni} and q_r e^{G_r-G_ni} (rows of 16-row block i, first row
 *       ni), k_s e^{G_ni-G_s} for every s <= ni+15 (one copy per block i), (e^G k)^T,
 *       (e^{G_last-G} k)^T.  This is the sub-chunk factorisation of §3.8: every exponent is <= 0
 *       except e^{G_ni-G_s} for s inside block i, bounded by the block's gate span.
 *   P3  L and Aqk (mma.sync m16n8k16 bf16, fp32 accumulate). A block whose span exceeds
 *       KC_SPAN (possible with the 48B softplus gate, never with K3's g > -5) has its diagonal
 *       16x16 recomputed elementwise with exp(G_r-G_s) per element, as the reference does.
 *   P4  X = (I+L)^-1 in fp32: four 16x16 diagonal inverses by forward substitution (one lane per
 *       column), then the off-diagonal blocks by distance; T = X diag(beta) -> bf16.
 *   P5  W = T (e^G k) (stored negated), Vn = T v + (-W) S  (tensor cores; S as bf16 operand).
 *   P6  O = (q e^G) S + Aqk Vn -> o;  S <- e^{G_last} S + Vn^T (e^{G_last-G} k)  (fp32 accumulate
 *       onto the fp32 state; only the increment's operands are bf16).
 * What it is not: the decode step (kda.cu) or a general Dk/Dv kernel: Dk = Dv = 128, chunk 64.
 * Numerics vs the all-fp32 reference: q, k, v, e^G factors, T, W, Vn, Aqk and S enter the tensor
 * cores as bf16 (relative 2^-9 each, fp32 accumulate), so the fp32 state and the output agree to
 * ~1e-3 relative (docs/perf-gpu.md states the tolerance used and why).
 * Invariants: cu_seqlens and slots are checked on the device before any write (check.cu), so
 * bad ids return K3_ERANGE / K3_EINVAL with nothing changed. */
#include "cuda_common.cuh"

#define KC_THREADS 256
#define KC_DVS 64    /* value columns per block */
#define KC_PK 136    /* bf16 pitch of 128-wide rows: 68 words = 4 mod 32, conflict-free frags */
#define KC_PC 72     /* bf16 pitch of 64-wide rows: 36 words */
#define KC_PF 65     /* fp32 pitch of 64x64 matrices */
#define KC_SPAN 80.0f /* max G_ni - G_s inside a 16-row block for the factorised diagonal */

/* Shared memory map (bytes). Regions R1 and R2 are reused across phases (see the file header). */
#define KC_OFF_G 0                                   /* fp32 [64][128]          32768 */
#define KC_OFF_SS (KC_OFF_G + 64 * 128 * 4)          /* fp32 [DVS][132]         33792 */
#define KC_OFF_SB (KC_OFF_SS + KC_DVS * 132 * 4)     /* bf16 [DVS][PK]          17408 */
#define KC_OFF_VT (KC_OFF_SB + KC_DVS * KC_PK * 2)   /* bf16 [DVS][PC]           9216 */
#define KC_OFF_R1 (KC_OFF_VT + KC_DVS * KC_PC * 2)   /* Ar,Qr | Lf,Af | -W,Qg   34816 */
#define KC_OFF_R2 (KC_OFF_R1 + 2 * 64 * KC_PK * 2)   /* Bc | X,Y,T,Aqk,VnT      43520 */
#define KC_OFF_KG (KC_OFF_R2 + 160 * KC_PK * 2)      /* bf16 [128][PC]          18432 */
#define KC_OFF_KL (KC_OFF_KG + 128 * KC_PC * 2)      /* bf16 [128][PC]          18432 */
#define KC_OFF_MISC (KC_OFF_KL + 128 * KC_PC * 2)    /* beta[64], eGl[128], flag */
#define KC_SMEM (KC_OFF_MISC + (64 + 128 + 4) * 4)
/* Inside R2 after P3: */
#define KC_R2_X 0                                    /* fp32 [64][PF] 16640; VnT [DVS][PC] later */
#define KC_R2_Y (64 * KC_PF * 4)                     /* fp32 [3][16][17] 3264 */
#define KC_R2_T (KC_R2_Y + 3 * 16 * 17 * 4)          /* bf16 [64][PC] */
#define KC_R2_A (KC_R2_T + 64 * KC_PC * 2)           /* bf16 [64][PC] */

typedef uint16_t bf;

struct kc_args {
  dv q, k, v, g, beta, o;
  const int32_t *cu, *slots;
  int64_t cu_s, sl_s;
  float *state;   /* [S][NH][128][128] */
  int64_t st_slot; /* elements between slots */
  float scale;
  int read_state;
};

__device__ __forceinline__ void kc_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* acc[j] += A[16 x K] · B_j^T where A is row-major bf16 (pitch lda, K contiguous) and B_j is the
 * 8 x K row-major bf16 block starting at row j*8 of B (pitch ldb): C = A · Bᵀ. */
template <int NT>
__device__ __forceinline__ void warp_gemm(float (*acc)[4], const bf *A, int lda, const bf *B,
                                          int ldb, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const bf *a = A + g * lda + 2 * t4;
  const bf *b = B + g * ldb + 2 * t4;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a0 = *(const uint32_t *)(a + k0), a1 = *(const uint32_t *)(a + 8 * lda + k0);
    uint32_t a2 = *(const uint32_t *)(a + k0 + 8), a3 = *(const uint32_t *)(a + 8 * lda + k0 + 8);
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const bf *bj = b + j * 8 * ldb + k0;
      kc_mma(acc[j], a0, a1, a2, a3, *(const uint32_t *)bj, *(const uint32_t *)(bj + 8));
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (*acc)[4]) {
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
}

__global__ void __launch_bounds__(KC_THREADS, 1) kda_chunk_kernel(kc_args a) {
  extern __shared__ __align__(16) unsigned char sm[];
  float *Gs = (float *)(sm + KC_OFF_G), *Ss = (float *)(sm + KC_OFF_SS);
  bf *Sb = (bf *)(sm + KC_OFF_SB), *vT = (bf *)(sm + KC_OFF_VT);
  bf *Ar = (bf *)(sm + KC_OFF_R1), *Qr = Ar + 64 * KC_PK;          /* P2-P3 */
  float *Lf = (float *)(sm + KC_OFF_R1), *Af = Lf + 64 * KC_PF;    /* P3-P4 */
  bf *Wn = (bf *)(sm + KC_OFF_R1), *Qg = Wn + 64 * KC_PK;          /* P5-P6 */
  bf *Bc = (bf *)(sm + KC_OFF_R2);                                 /* P2-P3 */
  float *X = (float *)(sm + KC_OFF_R2 + KC_R2_X), *Y = (float *)(sm + KC_OFF_R2 + KC_R2_Y);
  bf *Tb = (bf *)(sm + KC_OFF_R2 + KC_R2_T), *Aq = (bf *)(sm + KC_OFF_R2 + KC_R2_A);
  bf *VnT = (bf *)(sm + KC_OFF_R2 + KC_R2_X);                      /* P5b-P6 (X is dead) */
  bf *kgT = (bf *)(sm + KC_OFF_KG), *klT = (bf *)(sm + KC_OFF_KL);
  float *beta_s = (float *)(sm + KC_OFF_MISC), *eGl = beta_s + 64;
  int *flag = (int *)(eGl + 128);

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int e0 = blockIdx.x * KC_DVS, h = blockIdx.y, seq = blockIdx.z;
  const int start = a.cu[seq * a.cu_s], end = a.cu[(seq + 1) * a.cu_s];
  if (end <= start) return; /* length 0 keeps its state */
  float *Sg = a.state + a.slots[seq * a.sl_s] * a.st_slot + ((int64_t)h * 128 + e0) * 128;
  const int64_t ch = (int64_t)h * 128; /* first q/k/g channel of this head */

  for (int i = tid; i < KC_DVS * 128; i += KC_THREADS) {
    int e = i >> 7, d = i & 127;
    float s = a.read_state ? Sg[(int64_t)e * 128 + d] : 0.0f;
    Ss[e * 132 + d] = s;
    Sb[e * KC_PK + d] = f2bf(s);
  }
  if (tid == 0) *flag = 0;
  __syncthreads();

  for (int cs = start; cs < end; cs += 64) {
    const int n = min(64, end - cs);
    /* ---- P1: G (threads 0-127, one key channel each), v^T and beta (threads 128-255) ---- */
    if (tid < 128) {
      const int d = tid;
      float run = 0.0f, gn = 0.0f;
      int bits = 0;
      for (int r0 = 0; r0 < 64; r0 += 16) { /* 16 independent loads in flight, then the scan */
        float gv[16];
#pragma unroll
        for (int u = 0; u < 16; u++)
          gv[u] = r0 + u < n ? dv_ld(a.g, (int64_t)(cs + r0 + u) * a.g.s[0] + (ch + d) * a.g.s[1]) : 0.0f;
#pragma unroll
        for (int u = 0; u < 16; u++) {
          run += gv[u];
          Gs[(r0 + u) * 128 + d] = run;
          if (u == 0) gn = run;
        }
        if (gn - run > KC_SPAN) bits |= 1 << (r0 >> 4);
      }
      eGl[d] = expf(run);
      if (bits) atomicOr(flag, bits);
    } else {
      const int t = tid - 128;
      for (int i0 = t; i0 < 64 * KC_DVS; i0 += 128 * 16) {
        float x[16];
#pragma unroll
        for (int u = 0; u < 16; u++) {
          int i = i0 + u * 128, r = i / KC_DVS, e = i % KC_DVS;
          x[u] = r < n ? dv_ld(a.v, (int64_t)(cs + r) * a.v.s[0] + (ch + e0 + e) * a.v.s[1]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 16; u++) {
          int i = i0 + u * 128, r = i / KC_DVS, e = i % KC_DVS;
          vT[e * KC_PC + r] = f2bf(x[u]);
        }
      }
      if (t < 64) beta_s[t] = t < n ? dv_ld(a.beta, (int64_t)(cs + t) * a.beta.s[0] + h * a.beta.s[1]) : 0.0f;
    }
    __syncthreads();

    /* ---- P2: bf16 operands ---- */
    for (int i0 = tid; i0 < 64 * 128; i0 += KC_THREADS * 8) { /* loads batched: 16 in flight */
      float kvs[8], qvs[8];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int i = i0 + u * KC_THREADS, r = i >> 7, d = i & 127;
        kvs[u] = r < n ? dv_ld(a.k, (int64_t)(cs + r) * a.k.s[0] + (ch + d) * a.k.s[1]) : 0.0f;
        qvs[u] = r < n ? dv_ld(a.q, (int64_t)(cs + r) * a.q.s[0] + (ch + d) * a.q.s[1]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int i = i0 + u * KC_THREADS, r = i >> 7, d = i & 127, blk = r >> 4;
        const float kv = kvs[u], qv = qvs[u] * a.scale;
        const float G = Gs[r * 128 + d], Gn = Gs[(blk << 4) * 128 + d];
        const float e1 = __expf(G - Gn), e0f = __expf(fminf(Gn - G, KC_SPAN));
        Ar[r * KC_PK + d] = f2bf(kv * e1);
        Qr[r * KC_PK + d] = f2bf(qv * e1);
        Bc[(8 * blk * (blk + 1) + r) * KC_PK + d] = f2bf(kv * e0f);
        for (int b2 = blk + 1; b2 < 4; b2++)
          Bc[(8 * b2 * (b2 + 1) + r) * KC_PK + d] = f2bf(kv * __expf(Gs[(b2 << 4) * 128 + d] - G));
        kgT[d * KC_PC + r] = f2bf(kv * __expf(G));
        klT[d * KC_PC + r] = f2bf(kv * __expf(Gs[63 * 128 + d] - G));
      }
    }
    __syncthreads();

    /* ---- P3: L and Aqk. Jobs (block i, product p, n-tile j < 2(i+1)): 40, five per warp ---- */
    {
      float acc[5][4];
      zero_acc<5>(acc);
      int jb[5];
#pragma unroll
      for (int u = 0; u < 5; u++) {
        int job = w + 8 * u, i = job < 4 ? 0 : job < 12 ? 1 : job < 24 ? 2 : 3;
        int rem = job - (i == 0 ? 0 : i == 1 ? 4 : i == 2 ? 12 : 24), p = rem & 1, j = rem >> 1;
        jb[u] = (i << 8) | (p << 7) | j;
        warp_gemm<1>(&acc[u], (p ? Qr : Ar) + (i << 4) * KC_PK, KC_PK,
                     Bc + (8 * i * (i + 1) + j * 8) * KC_PK, KC_PK, 128);
      }
      __syncthreads(); /* Lf/Af overlay Ar/Qr */
#pragma unroll
      for (int u = 0; u < 5; u++) {
        int i = jb[u] >> 8, p = (jb[u] >> 7) & 1, j = jb[u] & 127;
#pragma unroll
        for (int q2 = 0; q2 < 4; q2++) {
          int r = (i << 4) + g + (q2 >> 1) * 8, s = j * 8 + 2 * t4 + (q2 & 1);
          if (p)
            Af[r * KC_PF + s] = s <= r ? acc[u][q2] : 0.0f;
          else
            Lf[r * KC_PF + s] = s < r ? beta_s[r] * acc[u][q2] : 0.0f;
        }
      }
    }
    __syncthreads();
    const int fl = *flag;
    if (fl) { /* diagonal blocks whose gate span is too wide to factorise: per element */
      for (int pi = tid; pi < 4 * 136; pi += KC_THREADS) {
        int blk = pi / 136, m = pi % 136, rr = 0;
        while ((rr + 1) * (rr + 2) / 2 <= m) rr++;
        int ss = m - rr * (rr + 1) / 2, r = (blk << 4) + rr, s = (blk << 4) + ss;
        if (!((fl >> blk) & 1) || r >= n) continue;
        float lk = 0.0f, aq = 0.0f;
        for (int d = 0; d < 128; d++) {
          float ks = dv_ld(a.k, (int64_t)(cs + s) * a.k.s[0] + (ch + d) * a.k.s[1]);
          float kr = dv_ld(a.k, (int64_t)(cs + r) * a.k.s[0] + (ch + d) * a.k.s[1]);
          float qr = dv_ld(a.q, (int64_t)(cs + r) * a.q.s[0] + (ch + d) * a.q.s[1]) * a.scale;
          float e = expf(Gs[r * 128 + d] - Gs[s * 128 + d]);
          lk += kr * ks * e;
          aq += qr * ks * e;
        }
        Lf[r * KC_PF + s] = s < r ? beta_s[r] * lk : 0.0f;
        Af[r * KC_PF + s] = aq;
      }
      __syncthreads();
    }

    /* ---- P4: X = (I + L)^-1 ---- */
    if (tid < 64) { /* diagonal 16x16 blocks, lane = column */
      const int b0 = (tid >> 4) << 4, c = b0 + (tid & 15);
      X[c * KC_PF + c] = 1.0f;
      for (int r = c + 1; r < b0 + 16; r++) {
        float acc = 0.0f;
        for (int m = c; m < r; m++) acc += Lf[r * KC_PF + m] * X[m * KC_PF + c];
        X[r * KC_PF + c] = -acc;
      }
    }
    __syncthreads();
    for (int dist = 1; dist < 4; dist++) {
      const int nb = 4 - dist; /* blocks (i, i - dist), i = dist .. 3 */
      for (int e = tid; e < nb * 256; e += KC_THREADS) {
        int bi = e >> 8, i = bi + dist, j = bi, r = (e >> 4) & 15, c = e & 15;
        int col = (j << 4) + c;
        float acc = 0.0f; /* Y = sum over m in [16j, 16i) of L[16i+r][m] X[m][16j+c] */
        for (int m = col; m < (i << 4); m++) acc += Lf[((i << 4) + r) * KC_PF + m] * X[m * KC_PF + col];
        Y[(bi * 16 + r) * 17 + c] = acc;
      }
      __syncthreads();
      for (int e = tid; e < nb * 256; e += KC_THREADS) {
        int bi = e >> 8, i = bi + dist, j = bi, r = (e >> 4) & 15, c = e & 15;
        float acc = 0.0f; /* X_ij = -X_ii Y */
        for (int m = 0; m <= r; m++) acc += X[((i << 4) + r) * KC_PF + (i << 4) + m] * Y[(bi * 16 + m) * 17 + c];
        X[((i << 4) + r) * KC_PF + (j << 4) + c] = -acc;
      }
      __syncthreads();
    }
    for (int e = tid; e < 64 * 64; e += KC_THREADS) {
      int r = e >> 6, s = e & 63;
      Tb[r * KC_PC + s] = s <= r ? f2bf(X[r * KC_PF + s] * beta_s[s]) : (bf)0;
      Aq[r * KC_PC + s] = s <= r ? f2bf(Af[r * KC_PF + s]) : (bf)0;
    }
    if (tid == 0) *flag = 0;
    __syncthreads();

    /* ---- P5a: -W = -T (e^G k) -> Wn [64][128]; Qg = q e^G ---- */
    {
      const int mt = w & 3, nq = w >> 2;
      float acc[8][4];
      zero_acc<8>(acc);
      warp_gemm<8>(acc, Tb + mt * 16 * KC_PC, KC_PC, kgT + nq * 64 * KC_PC, KC_PC, 64);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        int r = mt * 16 + g, d = nq * 64 + j * 8 + 2 * t4;
        *(uint32_t *)(Wn + r * KC_PK + d) = (uint32_t)f2bf(-acc[j][0]) | ((uint32_t)f2bf(-acc[j][1]) << 16);
        *(uint32_t *)(Wn + (r + 8) * KC_PK + d) = (uint32_t)f2bf(-acc[j][2]) | ((uint32_t)f2bf(-acc[j][3]) << 16);
      }
    }
    for (int i0 = tid; i0 < 64 * 128; i0 += KC_THREADS * 16) {
      float qvs[16];
#pragma unroll
      for (int u = 0; u < 16; u++) {
        const int i = i0 + u * KC_THREADS, r = i >> 7, d = i & 127;
        qvs[u] = r < n ? dv_ld(a.q, (int64_t)(cs + r) * a.q.s[0] + (ch + d) * a.q.s[1]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 16; u++) {
        const int i = i0 + u * KC_THREADS, r = i >> 7, d = i & 127;
        Qg[r * KC_PK + d] = f2bf(qvs[u] * a.scale * __expf(Gs[r * 128 + d]));
      }
    }
    __syncthreads();

    /* ---- P5b: Vn = T v + (-W) S -> VnT [DVS][64] ---- */
    {
      const int mt = w & 3, nq = w >> 2; /* 4 m-tiles x 2 halves of 4 n-tiles (DVS = 64) */
      float acc[4][4];
      zero_acc<4>(acc);
      warp_gemm<4>(acc, Tb + mt * 16 * KC_PC, KC_PC, vT + nq * 32 * KC_PC, KC_PC, 64);
      warp_gemm<4>(acc, Wn + mt * 16 * KC_PK, KC_PK, Sb + nq * 32 * KC_PK, KC_PK, 128);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        int r = mt * 16 + g, e = nq * 32 + j * 8 + 2 * t4;
        VnT[e * KC_PC + r] = f2bf(acc[j][0]);
        VnT[(e + 1) * KC_PC + r] = f2bf(acc[j][1]);
        VnT[e * KC_PC + r + 8] = f2bf(acc[j][2]);
        VnT[(e + 1) * KC_PC + r + 8] = f2bf(acc[j][3]);
      }
    }
    __syncthreads();

    /* ---- P6: O = Qg S + Aqk Vn; S <- e^{G_last} S + Vn^T (e^{G_last-G} k) ---- */
    {
      const int mt = w & 3, nq = w >> 2;
      float acc[4][4];
      zero_acc<4>(acc);
      warp_gemm<4>(acc, Qg + mt * 16 * KC_PK, KC_PK, Sb + nq * 32 * KC_PK, KC_PK, 128);
      warp_gemm<4>(acc, Aq + mt * 16 * KC_PC, KC_PC, VnT + nq * 32 * KC_PC, KC_PC, 64);
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int q2 = 0; q2 < 4; q2++) {
          int r = mt * 16 + g + (q2 >> 1) * 8, e = e0 + nq * 32 + j * 8 + 2 * t4 + (q2 & 1);
          if (r < n) dv_st(a.o, (int64_t)(cs + r) * a.o.s[0] + (ch + e) * a.o.s[1], acc[j][q2]);
        }
    }
    {
      const int mt = w & 3, nq = w >> 2; /* state rows e: 4 m-tiles; d: 2 halves of 8 n-tiles */
      float acc[8][4];
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int q2 = 0; q2 < 4; q2++) {
          int e = mt * 16 + g + (q2 >> 1) * 8, d = nq * 64 + j * 8 + 2 * t4 + (q2 & 1);
          acc[j][q2] = eGl[d] * Ss[e * 132 + d];
        }
      warp_gemm<8>(acc, VnT + mt * 16 * KC_PC, KC_PC, klT + nq * 64 * KC_PC, KC_PC, 64);
      __syncthreads(); /* every reader of Sb (P5b, O) is done */
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int q2 = 0; q2 < 4; q2++) {
          int e = mt * 16 + g + (q2 >> 1) * 8, d = nq * 64 + j * 8 + 2 * t4 + (q2 & 1);
          Ss[e * 132 + d] = acc[j][q2];
          Sb[e * KC_PK + d] = f2bf(acc[j][q2]);
        }
    }
    __syncthreads();
  }
  for (int i = tid; i < KC_DVS * 128; i += KC_THREADS) {
    int e = i >> 7, d = i & 127;
    Sg[(int64_t)e * 128 + d] = Ss[e * 132 + d];
  }
}

bool k3k_cuda_kda_chunk_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  const k3k_tensor_t *st = t[7];
  return (p->chunk == 0 || p->chunk == 64) && t[0]->shape[1] == (int64_t)p->n_heads * 128 &&
         t[2]->shape[1] == (int64_t)p->n_heads * 128 && st->ndim == 4 && st->shape[2] == 128 &&
         st->shape[3] == 128 && st->stride[3] == 1 && st->stride[2] == 128 &&
         st->stride[1] == 128 * 128 && p->n_heads <= 65535 && p->n_seqs <= 65535 &&
         t[0]->shape[0] < INT32_MAX;
}

int k3k_cuda_kda_chunk(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  int rc;
  if (p->n_seqs == 0) return 0;
  if ((rc = k3k_cuda_check_seqs(cx, t[5], p->n_seqs, t[0]->shape[0])) ||
      (rc = k3k_cuda_check_ids(cx, t[6], p->n_seqs, t[7]->shape[0], 1, 0)))
    return rc;
  static bool attr_set = false; /* per process: the attribute belongs to the kernel */
  if (!attr_set) {
    K3K_CU(cudaFuncSetAttribute(kda_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                KC_SMEM));
    attr_set = true;
  }
  kc_args a;
  a.q = mkdv(t[0]), a.k = mkdv(t[1]), a.v = mkdv(t[2]), a.g = mkdv(t[3]), a.beta = mkdv(t[4]);
  a.o = mkdv(t[8]);
  a.cu = (const int32_t *)t[5]->data, a.cu_s = t[5]->stride[0];
  a.slots = (const int32_t *)t[6]->data, a.sl_s = t[6]->stride[0];
  a.state = (float *)t[7]->data, a.st_slot = t[7]->stride[0];
  a.scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf(128.0f);
  a.read_state = p->read_state;
  kda_chunk_kernel<<<dim3(128 / KC_DVS, p->n_heads, p->n_seqs), KC_THREADS, KC_SMEM,
                     cx->stream>>>(a);
  K3K_LAUNCHED("kda_chunk");
  return 0;
}
