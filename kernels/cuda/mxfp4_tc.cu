/* Grouped MXFP4 W4A16 expert GEMM on tensor cores (k3k_cu_moe_gemm): a decode kernel that
 * streams weights and a prefill kernel that tiles them.
 *
 * What it is for: y = x · dequant(W_e)ᵀ for every active expert e over its grouped rows, W kept
 * in the checkpoint's packed layout (spec §6) and dequantised in registers; gate/up with the
 * activation fused (SiTU or SiLU·mul), down plain. mma.sync m16n8k16 bf16, fp32 accumulate.
 * What it is not: the fp32-x / odd-shape path (mxfp4.cu's CUDA-core kernel) or the ops' scale
 * check (mxfp4.cu). Invariants: results differ from the reference chain only by fp32 summation
 * order; E8M0 0xFF gives NaN here (weights are checked at load).
 *
 * Dequantisation without tables (dq): the 8 nibbles of a 32-bit word w go to 4 bf16x2
 * registers, register i holding nibbles i and i+4: ((w << (6-4i)) & 0x01C001C0) | ((w <<
 * (12-4i)) & 0x80008000) places e1 e0 m at the bf16 exponent/mantissa boundary and the sign at
 * bit 15, which is the E2M1 value times 2^-126 (the e = 0 codes land on bf16 subnormals, like
 * E2M1's own subnormal); one bf16x2 multiply by 2^(s−1) (two when s > 128) applies the E8M0
 * scale. All exact.
 *
 * Decode (few rows per expert; pure weight streaming): since session 4 the default decode kernel
 * is mxfp4_dec.cu's (register streaming, k3k_cu_moe_gemm_dec); the cp.async kernel below stays
 * selectable (k3k_cu_moe_dec_variant(-1)) and is tested next to it. A block of 8 warps owns one
 * expert's 16 output rows (gate and up rows for the fused form) or 32 rows (plain), and splits K
 * across its warps (3-4 chunks of 128 each at K3 shapes). Each warp issues every chunk of its K
 * range at once with cp.async (16-byte copies into its own shared-memory slots: up to 8 KB in
 * flight per warp, 128 KB per SM), then dequantises each register right at its mma; the 8 partial
 * tiles are summed through shared memory and one warp runs the epilogue. Short chains per warp
 * keep the last blocks short; a block's copies come in one burst, so what bounds it is the average
 * bytes in flight per SM (docs/perf-gpu-moe.md: measured ~2× the copy-bandwidth floor).
 * The mma's k order is free (it sums), so x is fed with the weights' (k, k+4) pairing by byte
 * permutes instead of reordering the weights.
 *
 * Prefill (many rows per expert). A block of 8 warps computes a 128 (weight rows) × 128
 * (tokens) tile over K in chunks of 64: x rows (gathered through the plan) and packed weights
 * arrive by cp.async in a 4-stage ring; one pass per chunk dequantises the packed tile into a
 * double-buffered bf16 tile in shared memory (each weight element once per block, pairs put
 * back into k order by byte permutes), and every warp takes its 64 × 32 sub-tile with ldmatrix
 * + mma.sync. Rows are XOR-swizzled by 16-byte segment, so ldmatrix is conflict-free. The
 * dequantisation of chunk k+1 runs in the same barrier interval as the mma of chunk k (one
 * barrier per chunk). An expert's rows are cut into ceil(rows/128) near-equal token tiles and
 * warps take interleaved 8-token column tiles, so a short last tile leaves no warp idle for
 * long. Fused: the tile's rows are 64 gate rows then the same 64 up rows. */
#include "cuda_common.cuh"
#include "mma_sm80.cuh"
#include "moe_ops.h"
#include "mxfp4_args.cuh"
#include "mxfp4_e2m1.cuh"
#include "mxfp4_wg.h"

namespace {



/* E8M0 byte s → the bf16x2 factor(s) that turn the 2^-126-biased codes into values: 2^(s−1),
 * split in two multiplies when s > 128 (f2 = 0: none). */
__device__ __forceinline__ void scale_factors(uint32_t s, uint32_t &f1, uint32_t &f2) {
  f2 = 0;
  if (s <= 128) {
    f1 = (s + 126) << 7;
  } else if (s == 255) {
    f1 = 0x7FC0; /* E8M0 NaN */
  } else {
    f1 = 254u << 7; /* 2^127, then 2^(s-128) */
    f2 = (s - 1) << 7;
  }
  f1 |= f1 << 16;
  f2 |= f2 << 16;
}
/* Register i (0..3) of word w: nibbles i and i+4 as scaled bf16x2. */
__device__ __forceinline__ uint32_t dq(uint32_t w, int i, uint32_t f1, uint32_t f2) {
  const uint32_t M1 = 0x01C001C0u, M2 = 0x80008000u;
  uint32_t r;
  if (i == 0) r = ((w << 6) & M1) | ((w << 12) & M2);
  else if (i == 1) r = ((w << 2) & M1) | ((w << 8) & M2);
  else if (i == 2) r = ((w >> 2) & M1) | ((w << 4) & M2);
  else r = ((w >> 6) & M1) | (w & M2);
  r = mx_bmul2(r, f1);
  return f2 ? mx_bmul2(r, f2) : r;
}
__device__ __forceinline__ uint32_t word_of(const uint4 &v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

/* cp.async.wait_group with a count known after unrolling. */
__device__ __forceinline__ void cp_wait_upto(int n) {
  if (n <= 0) cp_async_wait<0>();
  else if (n == 1) cp_async_wait<1>();
  else if (n == 2) cp_async_wait<2>();
  else cp_async_wait<3>();
}

/* ---------------- decode ---------------- */
constexpr int DEC_WARPS = 8, DEC_STG = 4;
constexpr int DEC_SLOT = 32 * 16;                     /* one (m, h) 16-byte load of a warp */
constexpr int DEC_WARP_BYTES = DEC_STG * 4 * DEC_SLOT; /* 8 KB */
constexpr int DEC_SMEM = DEC_WARPS * DEC_WARP_BYTES;   /* 64 KB */

/* FUSED: tile m = 0 gate rows, m = 1 up rows (same 16 rows); else tiles m = 0/1 are rows
 * row0..row0+15 and row0+16..row0+31 of one matrix. */
template <bool FUSED>
__global__ void __launch_bounds__(DEC_WARPS * 32, 2) mx_dec_kernel(mx_kargs a) {
  extern __shared__ __align__(16) unsigned char dsm[];
  int e, rb, re;
  if (!mx_expert_rows(a, blockIdx.y, e, rb, re)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int row0 = blockIdx.x * (FUSED ? 16 : 32);
  if (row0 >= a.N) return;
  const uint8_t *pk[2][2], *sp[2][2];
  bool valid[2];
#pragma unroll
  for (int m = 0; m < 2; m++) {
    const mx_dset &set = (FUSED && m == 1) ? a.up : a.w;
    int rm = FUSED ? row0 : row0 + 16 * m;
    valid[m] = rm < a.N;
    if (!valid[m]) rm = row0;
    const uint8_t *P = mx_packed(set, e), *S = mx_scale(set, e);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      pk[m][h] = P + (int64_t)(rm + g + 8 * h) * set.ldp + tig * 16;
      sp[m][h] = S + (int64_t)(rm + g + 8 * h) * set.lds + tig;
    }
  }
  const int nk = a.K >> 7, c0 = warp * nk / DEC_WARPS, c1 = (warp + 1) * nk / DEC_WARPS;
  unsigned char *wslots = dsm + warp * DEC_WARP_BYTES;
  for (int tb = rb; tb < re; tb += 8) {
    float c[2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int j = 0; j < 4; j++) c[m][j] = 0.0f;
    const int tok = tb + g;
    const bool tv = tok < re;
    const uint16_t *xr = a.x;
    if (tv) xr = a.x + (int64_t)(a.x_gather ? __ldg(a.x_gather + tok) : tok) * a.ldx + tig * 32;
    for (int base = c0; base < c1; base += DEC_STG) {
      uint32_t sc[DEC_STG][2][2];
#pragma unroll
      for (int j = 0; j < DEC_STG; j++) {
        if (base + j < c1) {
#pragma unroll
          for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
              if (valid[m])
                cp_async16(wslots + (j * 4 + m * 2 + h) * DEC_SLOT + lane * 16,
                           pk[m][h] + (int64_t)(base + j) * 64, true);
              sc[j][m][h] = __ldg(sp[m][h] + (base + j) * 4);
            }
        }
        cp_async_commit(); /* always DEC_STG groups (empty ones complete at once) */
      }
#pragma unroll
      for (int j = 0; j < DEC_STG; j++) {
        if (base + j >= c1) break;
        const int kc = base + j;
        uint32_t u[16];
        if (tv) {
          const uint4 *xp = reinterpret_cast<const uint4 *>(xr + kc * 128);
#pragma unroll
          for (int v = 0; v < 4; v++) {
            uint4 q = __ldg(xp + v);
            u[4 * v] = q.x;
            u[4 * v + 1] = q.y;
            u[4 * v + 2] = q.z;
            u[4 * v + 3] = q.w;
          }
        } else {
#pragma unroll
          for (int v = 0; v < 16; v++) u[v] = 0;
        }
        cp_wait_upto(DEC_STG - 1 - j);
        uint4 raw[2][2];
        uint32_t F1[2][2], F2[2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
          for (int h = 0; h < 2; h++) {
            raw[m][h] = *reinterpret_cast<const uint4 *>(wslots + (j * 4 + m * 2 + h) * DEC_SLOT +
                                                         lane * 16);
            scale_factors(sc[j][m][h], F1[m][h], F2[m][h]);
          }
#pragma unroll
        for (int s = 0; s < 8; s++) {
          const int q = s >> 1, i0 = 2 * (s & 1);
          /* xpair(q, i) = (x[8q+i], x[8q+i+4]) */
          const uint32_t b0 = __byte_perm(u[4 * q + (i0 >> 1)], u[4 * q + 2 + (i0 >> 1)], 0x5410);
          const uint32_t b1 = __byte_perm(u[4 * q + (i0 >> 1)], u[4 * q + 2 + (i0 >> 1)], 0x7632);
#pragma unroll
          for (int m = 0; m < 2; m++) {
            if (!valid[m]) continue;
            uint32_t af[4];
            af[0] = dq(word_of(raw[m][0], q), i0, F1[m][0], F2[m][0]);
            af[1] = dq(word_of(raw[m][1], q), i0, F1[m][1], F2[m][1]);
            af[2] = dq(word_of(raw[m][0], q), i0 + 1, F1[m][0], F2[m][0]);
            af[3] = dq(word_of(raw[m][1], q), i0 + 1, F1[m][1], F2[m][1]);
            mma_bf16(c[m], af, b0, b1);
          }
        }
      }
    }
    /* sum the warps' partial tiles (each warp's own slots hold its 1 KB of partials) */
    cp_async_wait<0>();
    __syncwarp();
    float4 *red = reinterpret_cast<float4 *>(wslots) + lane * 2;
    red[0] = make_float4(c[0][0], c[0][1], c[0][2], c[0][3]);
    red[1] = make_float4(c[1][0], c[1][1], c[1][2], c[1][3]);
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int w = 1; w < DEC_WARPS; w++) {
        const float4 *o = reinterpret_cast<const float4 *>(dsm + w * DEC_WARP_BYTES) + lane * 2;
        float4 p0 = o[0], p1 = o[1];
        c[0][0] += p0.x;
        c[0][1] += p0.y;
        c[0][2] += p0.z;
        c[0][3] += p0.w;
        c[1][0] += p1.x;
        c[1][1] += p1.y;
        c[1][2] += p1.z;
        c[1][3] += p1.w;
      }
      mx_store_frags<FUSED>(a, c, tb + 2 * tig, re, row0, g, valid);
    }
    __syncthreads(); /* the slots are reused by the next token tile */
  }
}

/* ---------------- prefill ---------------- */
constexpr int PRE_STG = 4;
constexpr int PRE_X_STAGE = 128 * 128;  /* 128 tokens × 64 k bf16 */
constexpr int PRE_W_STAGE = 128 * 32;   /* 128 rows × 64 k packed */
constexpr int PRE_WB = 128 * 128;       /* 128 rows × 64 k bf16 */
constexpr int PRE_SMEM = PRE_STG * (PRE_X_STAGE + PRE_W_STAGE) + 2 * PRE_WB; /* 112 KB */

/* Byte offset of 16-byte segment `seg` (0..7) of row `r` in a swizzled 128-byte-row tile. */
__device__ __forceinline__ int swz(int r, int seg) { return r * 128 + ((seg ^ (r & 7)) << 4); }

template <bool FUSED>
__global__ void __launch_bounds__(256, 2) mx_pre_kernel(mx_kargs a) {
  extern __shared__ __align__(128) unsigned char psm[];
  unsigned char *Xs = psm, *Wr = psm + PRE_STG * PRE_X_STAGE;
  unsigned char *Wb = Wr + PRE_STG * PRE_W_STAGE;
  int e, rb, re;
  if (!mx_expert_rows(a, blockIdx.y, e, rb, re)) return;
  const int nbase = blockIdx.x * (FUSED ? 64 : 128);
  if (nbase >= a.N) return;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, g = lane >> 2, tig = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;
  /* this thread's packed segment: tile row wr, k half wh (one 32-k scale group) */
  const int wr = t >> 1, wh = t & 1;
  const bool from_up = FUSED && wr >= 64;
  const int wrow = FUSED ? nbase + (wr & 63) : nbase + wr;
  const bool wvalid = wrow < a.N;
  const uint8_t *wsrc, *ssrc;
  {
    const mx_dset &set = from_up ? a.up : a.w;
    const int r = wvalid ? wrow : 0;
    wsrc = mx_packed(set, e) + (int64_t)r * set.ldp + wh * 16;
    ssrc = mx_scale(set, e) + (int64_t)r * set.lds + wh;
  }
  const int nk = a.K >> 6, rows = re - rb, ntt = (rows + 127) >> 7;
  for (int tt = 0; tt < ntt; tt++) {
    const int tb = rb + (int)((int64_t)tt * rows / ntt);
    const int tsz = rb + (int)((int64_t)(tt + 1) * rows / ntt) - tb;
    const uint16_t *xsrc[4];
    bool xv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = (t >> 3) + 32 * i;
      xv[i] = r < tsz;
      xsrc[i] = a.x;
      if (xv[i])
        xsrc[i] = a.x + (int64_t)(a.x_gather ? __ldg(a.x_gather + tb + r) : tb + r) * a.ldx +
                  (t & 7) * 8;
    }
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int v = 0; v < 4; v++) acc[i][j][v] = 0.0f;
    uint32_t sreg[PRE_STG];
    /* chunk kc (64 k) into stage st: 4 x segments, 1 packed segment, the scale byte in sreg */
    auto issue = [&](int kc, int st) {
      if (kc < nk) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int r = (t >> 3) + 32 * i;
          cp_async16(Xs + st * PRE_X_STAGE + swz(r, t & 7), xsrc[i] + kc * 64, xv[i]);
        }
        cp_async16(Wr + st * PRE_W_STAGE + wr * 32 + wh * 16, wsrc + kc * 32, wvalid);
        sreg[st] = wvalid ? (uint32_t)__ldg(ssrc + kc * 2) : 127u;
      }
      cp_async_commit();
    };
    /* stage st's packed segment → bf16 k-ordered pairs in Wb buffer wb */
    auto dequant = [&](int st, int wb) {
      const uint4 raw = *reinterpret_cast<const uint4 *>(Wr + st * PRE_W_STAGE + wr * 32 + wh * 16);
      uint32_t f1, f2;
      scale_factors(sreg[st], f1, f2);
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const uint32_t w = word_of(raw, q);
        const uint32_t r0 = dq(w, 0, f1, f2), r1 = dq(w, 1, f1, f2);
        const uint32_t r2 = dq(w, 2, f1, f2), r3 = dq(w, 3, f1, f2);
        uint4 o;
        o.x = __byte_perm(r0, r1, 0x5410); /* k 0,1 of the 8 */
        o.y = __byte_perm(r2, r3, 0x5410); /* k 2,3 */
        o.z = __byte_perm(r0, r1, 0x7632); /* k 4,5 */
        o.w = __byte_perm(r2, r3, 0x7632); /* k 6,7 */
        *reinterpret_cast<uint4 *>(Wb + wb * PRE_WB + swz(wr, wh * 4 + q)) = o;
      }
    };
    /* mma over stage st's x and Wb buffer wb */
    auto compute = [&](int st, int wb) {
      const unsigned char *xs = Xs + st * PRE_X_STAGE, *ws = Wb + wb * PRE_WB;
#pragma unroll
      for (int k16 = 0; k16 < 4; k16++) {
        /* B (x) fragments of the warp's column tiles wn + 4j, then one A (W) tile at a time */
        uint32_t bf[2][4];
#pragma unroll
        for (int p = 0; p < 2; p++) {
          const int nt = wn + 8 * p + ((lane >> 4) << 2);
          if ((wn + 8 * p) * 8 < tsz)
            ldsm_x4(bf[p], xs + swz(nt * 8 + (lane & 7), k16 * 2 + ((lane >> 3) & 1)));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int mt = (i < 2 ? 2 * wm + i : 4 + 2 * wm + (i - 2));
          uint32_t af[4];
          ldsm_x4(af, ws + swz(mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, k16 * 2 + (lane >> 4)));
#pragma unroll
          for (int j = 0; j < 4; j++)
            if ((wn + 4 * j) * 8 < tsz)
              mma_bf16(acc[i][j], af, bf[j >> 1][2 * (j & 1)], bf[j >> 1][2 * (j & 1) + 1]);
        }
      }
    };
    issue(0, 0);
    issue(1, 1);
    issue(2, 2);
    cp_async_wait<2>();
    dequant(0, 0); /* this thread's own copy: visible to it without a barrier */
    for (int kb = 0; kb < nk; kb += PRE_STG) {
#pragma unroll
      for (int s = 0; s < PRE_STG; s++) {
        const int kc = kb + s;
        if (kc >= nk) break;
        cp_async_wait<1>(); /* chunks <= kc+1 landed (this thread's copies) */
        __syncthreads();    /* ... everyone's; mma(kc-1) done: its stage and Wb buffer are free */
        issue(kc + 3, (s + 3) & 3);
        if (kc + 1 < nk) dequant((s + 1) & 3, (s + 1) & 1);
        compute(s, s & 1);
      }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the next token tile refills every buffer */
    /* epilogue: acc[i][j][2hh + jj] = (tile row 16·mt_i + g + 8hh, token 8·(wn + 4j) + 2tig + jj) */
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int nt = wn + 4 * j;
#pragma unroll
      for (int jj = 0; jj < 2; jj++) {
        const int r = nt * 8 + 2 * tig + jj;
        if (r >= tsz) continue;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          if (FUSED) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
              const int n = nbase + (2 * wm + i) * 16 + g + 8 * hh;
              if (n < a.N)
                mx_store_y(a, tb + r, n, mx_act(a, acc[i][j][2 * hh + jj], acc[i + 2][j][2 * hh + jj]));
            }
          } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
              const int mt = (i < 2 ? 2 * wm + i : 4 + 2 * wm + (i - 2));
              const int n = nbase + mt * 16 + g + 8 * hh;
              if (n < a.N) mx_store_y(a, tb + r, n, acc[i][j][2 * hh + jj]);
            }
          }
        }
      }
    }
  }
}


/* Raises a kernel's dynamic shared-memory limit once (not a stream operation: safe while a
 * graph is being captured, but done on the first call anyway). */
template <typename F>
int smem_limit(F *kernel, int bytes, bool &done) {
  if (!done) {
    K3K_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    done = true;
  }
  return 0;
}

} // namespace

int k3k_cu_moe_gemm(cudaStream_t st, const k3k_cu_moe_gemm_args *a) {
  if (a->K % 128 || a->N % 16 || a->ldx % 8 || ((uintptr_t)a->x & 15) || a->w.ld_packed % 16 ||
      a->max_active <= 0 || a->max_active > 65535)
    return K3_EINVAL;
  const bool fused = a->act != K3K_CU_ACT_NONE;
  if (fused && a->up.ld_packed % 16) return K3_EINVAL;
  mx_kargs g;
  mx_fill_args(&g, a);
  static bool lim[4];
  int rc;
  if (a->rows_hint > 16 && k3k_cu_moe_wg_wanted()) return k3k_cu_moe_gemm_wg(st, a); /* wgmma */
  if (a->rows_hint > 16) {
    const int rpb = fused ? 64 : 128;
    dim3 grid((unsigned)((a->N + rpb - 1) / rpb), (unsigned)a->max_active);
    if (fused) {
      if ((rc = smem_limit(mx_pre_kernel<true>, PRE_SMEM, lim[0]))) return rc;
      mx_pre_kernel<true><<<grid, 256, PRE_SMEM, st>>>(g);
    } else {
      if ((rc = smem_limit(mx_pre_kernel<false>, PRE_SMEM, lim[1]))) return rc;
      mx_pre_kernel<false><<<grid, 256, PRE_SMEM, st>>>(g);
    }
    K3K_LAUNCHED("mxfp4_grouped_gemm_prefill");
  } else {
    if ((rc = k3k_cu_moe_gemm_dec(st, a)) <= 0) return rc; /* 1: this kernel was chosen */
    const int rpb = fused ? 16 : 32;
    dim3 grid((unsigned)((a->N + rpb - 1) / rpb), (unsigned)a->max_active);
    if (fused) {
      if ((rc = smem_limit(mx_dec_kernel<true>, DEC_SMEM, lim[2]))) return rc;
      mx_dec_kernel<true><<<grid, DEC_WARPS * 32, DEC_SMEM, st>>>(g);
    } else {
      if ((rc = smem_limit(mx_dec_kernel<false>, DEC_SMEM, lim[3]))) return rc;
      mx_dec_kernel<false><<<grid, DEC_WARPS * 32, DEC_SMEM, st>>>(g);
    }
    K3K_LAUNCHED("mxfp4_grouped_gemm_decode");
  }
  return 0;
}
