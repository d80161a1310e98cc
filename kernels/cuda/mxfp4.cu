/* MXFP4 expert GEMMs on CUDA (W4A16): MXFP4_GEMM, MXFP4_DEQUANT and the grouped MoE GEMM.
 *
 * What it is for: y = x · dequant(W)ᵀ with W kept in the checkpoint's packed layout (spec §6)
 * and dequantised in registers. The tensor-core kernel takes bf16 x and runs mma.sync
 * m16n8k16 (bf16 in, fp32 accumulate): a warp owns 16-row tiles of W (two of them: w1 and w3
 * rows for the fused gate/up, or two row tiles of one matrix), token tiles of 8 form the mma N
 * dimension, K goes in chunks of 128 (each of the 4 threads of a quad owns one 32-k scale
 * group: one 16-byte load per row, one scale byte).
 * Dequantisation without tables (dq): the 8 nibbles of a 32-bit word w go to 4 bf16x2 registers,
 * register i holding nibbles i and i+4: ((w << (6-4i)) & 0x01C001C0) | ((w << (12-4i)) &
 * 0x80008000) places e1 e0 m at the bf16 exponent/mantissa boundary and the sign at bit 15,
 * which is the E2M1 value times 2^-126 (the e = 0 codes land on bf16 subnormals, exactly like
 * E2M1's own subnormal), then one bf16x2 multiply by 2^(s−1) (two when s > 128) applies the
 * E8M0 scale; all exact. mma sums over k, so the order of k inside an mma is free: B (x) is fed
 * with the same (k, k+4) pairing through byte permutes.
 * Decode (few rows per expert) is weight-streaming: the next chunk's 16-byte loads are issued
 * before the current chunk's math. Prefill reuses each dequantised chunk for up to 8 token
 * tiles (64 rows).
 * What it is not: a fp32-x kernel at speed: F32 x (fp32 model mode) or shapes outside
 * K % 128 == 0, N % 16 == 0 take a simple CUDA-core kernel with the same results up to
 * summation order. Invariants: results differ from the reference only by fp32 summation order;
 * E8M0 0xFF is rejected by the ops (one synchronisation) and gives NaN in the grouped kernel. */
#include <string.h>

#include "cuda_common.cuh"
#include "moe_ops.h"

struct mxk { /* one weight set as the kernel sees it */
  const uint8_t *const *ptab, *const *stab;
  const uint8_t *pbase, *sbase;
  int64_t pes, ses, ldp, lds;
};
__device__ __forceinline__ const uint8_t *mx_packed(const mxk &m, int e) {
  return m.ptab ? m.ptab[e] : m.pbase + (int64_t)e * m.pes;
}
__device__ __forceinline__ const uint8_t *mx_scale(const mxk &m, int e) {
  return m.stab ? m.stab[e] : m.sbase + (int64_t)e * m.ses;
}

struct gargs {
  mxk w, up;
  int act, round_inner;
  float beta, beta_lin;
  int N, K;
  const uint16_t *x;
  int64_t ldx;
  const int32_t *x_gather;
  void *y;
  int64_t ldy;
  int y_f32;
  const int32_t *expert_off, *active;
  int single_rows;
};

__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a),
                             *reinterpret_cast<__nv_bfloat162 *>(&b));
  return *reinterpret_cast<uint32_t *>(&r);
}

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
  r = bmul2(r, f1);
  return f2 ? bmul2(r, f2) : r;
}
__device__ __forceinline__ uint32_t word_of(const uint4 &v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float act_fn(const gargs &a, float g, float u) {
  if (a.round_inner) {
    g = round_bf(g);
    u = round_bf(u);
  }
  if (a.act == K3K_CU_ACT_SITU)
    return a.beta * tanhf(g / a.beta) * (1.0f / (1.0f + expf(-g))) * (a.beta_lin * tanhf(u / a.beta_lin));
  return g * (1.0f / (1.0f + expf(-g))) * u;
}

/* NT token tiles of 8 per pass; FUSED: tile 0 = gate rows, tile 1 = up rows (same rows);
 * otherwise tiles 0/1 = rows r0..r0+15 and r0+16..r0+31 of one matrix. 4 warps per block. */
template <int NT, bool FUSED>
__global__ void __launch_bounds__(128, NT == 1 ? 4 : 1) mx_gemm_kernel(gargs a) {
  int e, rb, re;
  if (a.expert_off) {
    if ((int)blockIdx.y >= a.active[0]) return;
    e = a.active[1 + blockIdx.y];
    rb = a.expert_off[e];
    re = a.expert_off[e + 1];
  } else {
    e = 0;
    rb = 0;
    re = a.single_rows;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int RPW = FUSED ? 16 : 32;
  const int row0 = (blockIdx.x * 4 + warp) * RPW;
  if (row0 >= a.N || rb >= re) return;
  const uint8_t *pk[2][2], *sp[2][2];
  bool valid[2];
#pragma unroll
  for (int m = 0; m < 2; m++) {
    const mxk &set = (FUSED && m == 1) ? a.up : a.w;
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
  const int nk = a.K >> 7;
  for (int tb = rb; tb < re; tb += 8 * NT) {
    float c[NT][2][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < 4; j++) c[t][m][j] = 0.0f;
    uint4 raw[2][2], nxt[2][2];
    uint32_t sc[2][2], scn[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        raw[m][h] = __ldg(reinterpret_cast<const uint4 *>(pk[m][h]));
        sc[m][h] = __ldg(sp[m][h]);
      }
    for (int kc = 0; kc < nk; kc++) {
      if (kc + 1 < nk) {
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
          for (int h = 0; h < 2; h++) {
            nxt[m][h] = __ldg(reinterpret_cast<const uint4 *>(pk[m][h] + (int64_t)(kc + 1) * 64));
            scn[m][h] = __ldg(sp[m][h] + (kc + 1) * 4);
          }
      }
      /* Decode (NT = 1): each register is used by one mma, so dequantise it right there (fewer
       * live registers, more warps per SM to stream weights). Prefill: once per chunk, reused
       * by every token tile. */
      uint32_t F1[2][2], F2[2][2];
      uint32_t A[2][2][NT == 1 ? 1 : 16];
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          scale_factors(sc[m][h], F1[m][h], F2[m][h]);
          if (NT > 1)
#pragma unroll
            for (int i = 0; i < 16; i++)
              A[m][h][NT == 1 ? 0 : i] = dq(word_of(raw[m][h], i >> 2), i & 3, F1[m][h], F2[m][h]);
        }
#pragma unroll
      for (int t = 0; t < NT; t++) {
        const int tok0 = tb + 8 * t;
        if (tok0 >= re) break;
        const int tok = tok0 + g;
        uint32_t u[16];
        if (tok < re) {
          const int xrow = a.x_gather ? __ldg(a.x_gather + tok) : tok;
          const uint4 *xp =
              reinterpret_cast<const uint4 *>(a.x + (int64_t)xrow * a.ldx + kc * 128 + tig * 32);
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
#pragma unroll
        for (int s = 0; s < 8; s++) {
          const int q = s >> 1, i0 = 2 * (s & 1);
          /* xpair(q, i) = (x[8q+i], x[8q+i+4]) */
          uint32_t b0 = __byte_perm(u[4 * q + (i0 >> 1)], u[4 * q + 2 + (i0 >> 1)], 0x5410);
          uint32_t b1 = __byte_perm(u[4 * q + (i0 >> 1)], u[4 * q + 2 + (i0 >> 1)], 0x7632);
#pragma unroll
          for (int m = 0; m < 2; m++) {
            if (!valid[m]) continue;
            uint32_t a0, a1, a2, a3;
            if (NT == 1) {
              a0 = dq(word_of(raw[m][0], q), i0, F1[m][0], F2[m][0]);
              a1 = dq(word_of(raw[m][1], q), i0, F1[m][1], F2[m][1]);
              a2 = dq(word_of(raw[m][0], q), i0 + 1, F1[m][0], F2[m][0]);
              a3 = dq(word_of(raw[m][1], q), i0 + 1, F1[m][1], F2[m][1]);
            } else {
              a0 = A[m][0][NT == 1 ? 0 : 4 * q + i0];
              a1 = A[m][1][NT == 1 ? 0 : 4 * q + i0];
              a2 = A[m][0][NT == 1 ? 0 : 4 * q + i0 + 1];
              a3 = A[m][1][NT == 1 ? 0 : 4 * q + i0 + 1];
            }
            mma_bf16(c[t][m], a0, a1, a2, a3, b0, b1);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          raw[m][h] = nxt[m][h];
          sc[m][h] = scn[m][h];
        }
    }
    /* epilogue: c[t][m][2h + j] = (row g + 8h of tile m, token tb + 8t + 2tig + j) */
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int tok = tb + 8 * t + 2 * tig + j;
        if (tok >= re) continue;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int m = 0; m < (FUSED ? 1 : 2); m++) {
            if (!valid[m]) continue;
            const int n = row0 + 16 * m + g + 8 * h;
            float v = FUSED ? act_fn(a, c[t][0][2 * h + j], c[t][1][2 * h + j]) : c[t][m][2 * h + j];
            int64_t off = (int64_t)tok * a.ldy + n;
            if (a.y_f32)
              ((float *)a.y)[off] = v;
            else
              ((uint16_t *)a.y)[off] = f2bf(v);
          }
      }
  }
}

static mxk to_mxk(const k3k_cu_mx_set *s) {
  mxk m;
  m.ptab = s->packed_tab;
  m.stab = s->scale_tab;
  m.pbase = s->packed_base;
  m.sbase = s->scale_base;
  m.pes = s->estride_packed;
  m.ses = s->estride_scale;
  m.ldp = s->ld_packed;
  m.lds = s->ld_scale;
  return m;
}

int k3k_cu_moe_gemm(cudaStream_t st, const k3k_cu_moe_gemm_args *a) {
  if (a->K % 128 || a->N % 16 || a->ldx % 8 || ((uintptr_t)a->x & 15) || a->w.ld_packed % 16 ||
      a->max_active <= 0 || a->max_active > 65535)
    return K3_EINVAL;
  const bool fused = a->act != K3K_CU_ACT_NONE;
  if (fused && a->up.ld_packed % 16) return K3_EINVAL;
  gargs g;
  g.w = to_mxk(&a->w);
  g.up = to_mxk(fused ? &a->up : &a->w);
  g.act = a->act;
  g.round_inner = a->round_inner;
  g.beta = a->beta;
  g.beta_lin = a->beta_lin;
  g.N = a->N;
  g.K = a->K;
  g.x = a->x;
  g.ldx = a->ldx;
  g.x_gather = a->x_gather;
  g.y = a->y;
  g.ldy = a->ldy;
  g.y_f32 = a->y_f32;
  g.expert_off = a->expert_off;
  g.active = a->active;
  g.single_rows = a->single_rows;
  const int rpb = fused ? 64 : 128;
  dim3 grid((unsigned)((a->N + rpb - 1) / rpb), (unsigned)a->max_active);
  const bool prefill = a->rows_hint > 16;
  if (fused) {
    if (prefill)
      mx_gemm_kernel<8, true><<<grid, 128, 0, st>>>(g);
    else
      mx_gemm_kernel<1, true><<<grid, 128, 0, st>>>(g);
  } else {
    if (prefill)
      mx_gemm_kernel<8, false><<<grid, 128, 0, st>>>(g);
    else
      mx_gemm_kernel<1, false><<<grid, 128, 0, st>>>(g);
  }
  K3K_LAUNCHED("mxfp4_grouped_gemm");
  return 0;
}

/* ---- scale check, generic kernels, ops ---- */
__global__ void mx_check_kernel(const uint8_t *s, int64_t rows, int64_t cols, int64_t ld,
                                int *bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
       i += (int64_t)gridDim.x * blockDim.x)
    if (s[(i / cols) * ld + i % cols] == 0xFF) *bad = 1;
}
int k3k_cu_mx_check(cudaStream_t st, const uint8_t *scale, int64_t rows, int64_t cols, int64_t ld,
                    int *bad) {
  if (rows * cols == 0) return 0;
  unsigned gx = k3k_ceil_div((size_t)(rows * cols), 256);
  mx_check_kernel<<<gx > 1024 ? 1024 : gx, 256, 0, st>>>(scale, rows, cols, ld, bad);
  K3K_LAUNCHED("mxfp4_check");
  return 0;
}

__device__ __forceinline__ float mx_val(const uint8_t *P, int64_t ps1, const uint8_t *S,
                                        int64_t ss1, int64_t k) {
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint8_t b = P[(k >> 1) * ps1];
  uint8_t code = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
  float v = e2m1[code & 7];
  if (code & 8) v = -v;
  uint8_t s = S[(k >> 5) * ss1];
  return s == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(v, (int)s - 127);
}

/* One warp per (token m, row n): fp32 x and any strides. */
__global__ void mx_gemm_generic(dv x, const uint8_t *P, int64_t ps0, int64_t ps1, const uint8_t *S,
                                int64_t ss0, int64_t ss1, dv y, int64_t N, int64_t K) {
  int64_t n = blockIdx.x * 8 + (threadIdx.x >> 5), m = blockIdx.y;
  int lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc = 0.0f;
  for (int64_t k = lane; k < K; k += 32)
    acc += dv_ld(x, m * x.s[0] + k * x.s[1]) * mx_val(P + n * ps0, ps1, S + n * ss0, ss1, k);
  acc = warp_sum(acc);
  if (lane == 0) dv_st(y, m * y.s[0] + n * y.s[1], acc);
}

__global__ void mx_dequant_kernel(const uint8_t *P, int64_t ps0, int64_t ps1, const uint8_t *S,
                                  int64_t ss0, int64_t ss1, dv w, int64_t N, int64_t K) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * K;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t n = i / K, k = i % K;
    dv_st(w, n * w.s[0] + k * w.s[1], mx_val(P + n * ps0, ps1, S + n * ss0, ss1, k));
  }
}

static int check_then(k3k_cuda_ctx *cx, const k3k_tensor_t *S, int **flag) {
  int rc = k3k_cuda_scratch(cx, sizeof(int), (void **)flag);
  if (rc) return rc;
  K3K_CU(cudaMemsetAsync(*flag, 0, sizeof(int), cx->stream));
  if (S->stride[1] != 1) { /* the check kernel reads rows of contiguous bytes */
    for (int64_t c = 0; c < S->shape[1]; c++) {
      rc = k3k_cu_mx_check(cx->stream, (const uint8_t *)S->data + c * S->stride[1], S->shape[0], 1,
                           S->stride[0], *flag);
      if (rc) return rc;
    }
    return 0;
  }
  return k3k_cu_mx_check(cx->stream, (const uint8_t *)S->data, S->shape[0], S->shape[1],
                         S->stride[0], *flag);
}
static int finish_flag(k3k_cuda_ctx *cx, int *flag) {
  int bad = 0;
  K3K_CU(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  return bad ? K3_EINVAL : 0;
}

/* Scales are checked first (one synchronisation) so a bad scale writes nothing. */
int k3k_cuda_mxfp4_gemm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *P = t[1], *S = t[2], *y = t[3];
  int64_t M = x->shape[0], K = x->shape[1], N = P->shape[0];
  int *flag;
  int rc = check_then(cx, S, &flag);
  if (!rc) rc = finish_flag(cx, flag);
  if (rc || M == 0 || N == 0) return rc;
  bool fast = x->dtype == K3K_BF16 && x->stride[1] == 1 && x->stride[0] % 8 == 0 &&
              !((uintptr_t)x->data & 15) && P->stride[1] == 1 && P->stride[0] % 16 == 0 &&
              !((uintptr_t)P->data & 15) && S->stride[1] == 1 && y->stride[1] == 1 &&
              K % 128 == 0 && N % 16 == 0 && M <= INT32_MAX;
  if (fast) {
    k3k_cu_moe_gemm_args a;
    memset(&a, 0, sizeof a);
    a.w.packed_base = (const uint8_t *)P->data;
    a.w.scale_base = (const uint8_t *)S->data;
    a.w.ld_packed = P->stride[0];
    a.w.ld_scale = S->stride[0];
    a.N = (int32_t)N;
    a.K = (int32_t)K;
    a.x = (const uint16_t *)x->data;
    a.ldx = x->stride[0];
    a.y = y->data;
    a.ldy = y->stride[0];
    a.y_f32 = y->dtype == K3K_F32;
    a.max_active = 1;
    a.single_rows = (int32_t)M;
    a.rows_hint = (int32_t)(M > INT32_MAX ? INT32_MAX : M);
    return k3k_cu_moe_gemm(cx->stream, &a);
  }
  for (int64_t m0 = 0; m0 < M; m0 += 65535) {
    int64_t mm = M - m0 < 65535 ? M - m0 : 65535;
    dv xv = mkdv(x), yv = mkdv(y);
    xv.p += m0 * x->stride[0] * (int64_t)k3k_dtype_size(x->dtype);
    yv.p += m0 * y->stride[0] * (int64_t)k3k_dtype_size(y->dtype);
    dim3 grid(k3k_ceil_div((size_t)N, 8), (unsigned)mm);
    mx_gemm_generic<<<grid, 256, 0, cx->stream>>>(xv, (const uint8_t *)P->data, P->stride[0],
                                                  P->stride[1], (const uint8_t *)S->data,
                                                  S->stride[0], S->stride[1], yv, N, K);
    K3K_LAUNCHED("mxfp4_gemm_generic");
  }
  return 0;
}

int k3k_cuda_mxfp4_dequant(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *P = t[0], *S = t[1], *W = t[2];
  int64_t N = W->shape[0], K = W->shape[1];
  int *flag;
  int rc = check_then(cx, S, &flag);
  if (!rc) rc = finish_flag(cx, flag);
  if (rc || N * K == 0) return rc;
  unsigned gx = k3k_ceil_div((size_t)(N * K), 256);
  mx_dequant_kernel<<<gx > 8192 ? 8192 : gx, 256, 0, cx->stream>>>(
      (const uint8_t *)P->data, P->stride[0], P->stride[1], (const uint8_t *)S->data, S->stride[0],
      S->stride[1], mkdv(W), N, K);
  K3K_LAUNCHED("mxfp4_dequant");
  return 0;
}
