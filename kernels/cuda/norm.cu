/* CUDA: RMSNORM, GATED_RMSNORM (KDA o_norm), L2NORM (KDA q/k), ATTN_RES_MIX (depth mix).
 *
 * What it is for: the row-wise reductions of k3k.h (spec §2.2, §3.3, §3.7, §8) on device
 * tensors. One block per row for RMSNORM / ATTN_RES_MIX, one warp per (row, head) otherwise;
 * fp32 statistics; inner stride 1 (k3k.h addresses channels as `row*stride0 + d`).
 * What it is not: bit-identical to the CPU reference: sums are tree-ordered here and sequential
 * there, so results differ by fp32 rounding (~1e-7 relative) before the output rounding.
 * Fast paths (same fp32 math, only the reduction tree differs): RMSNORM with BF16 x/y/w and
 * 16-byte aligned rows keeps its row in registers (one read of x, 8 bf16 per load, D <= 8192);
 * GATED_RMSNORM (BF16 x/z/y, F32 w) and L2NORM (BF16 x, F32/BF16 y) at Dh = 128 give each head
 * to a half-warp (8 channels per lane, 16-byte loads) and 4 (gated) or 2 (L2) heads to each
 * half-warp, all loads first; the gated fast path's sigmoid uses __expf/__fdividef (~2 ulp in
 * fp32, far below its BF16 output rounding); ATTN_RES_MIX with BF16 operands keeps 3 values x 4
 * vectors per thread in flight, on a persistent grid of 2 blocks per SM so that a token's values
 * (<= 16 x D x 2 bytes) are still in L2 when the second pass reads them (at T <= SM count:
 * 512 threads per token, 8 values x 2 vectors in flight). Everything else takes
 * the generic strided kernels. The RMSNORM register kernel and the ATTN_RES_MIX fast kernel
 * are launched with PDL (pdl.cuh: they wait for the previous kernel before any access and let
 * the next one be scheduled at once). */
#include "cuda_common.cuh"
#include "norm_body.cuh"
#include "pdl.cuh"

/* ---- RMSNORM ---- */
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_kernel(dv x, dv w, dv y, int64_t d, float eps, int bf16_inner) {
  __shared__ float red[32];
  int64_t r = blockIdx.x;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += THREADS) {
    float v = dv_ld(x, r * x.s[0] + j);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  float rstd = 1.0f / sqrtf(ss / (float)d + eps);
  for (int64_t j = threadIdx.x; j < d; j += THREADS) {
    float xn = dv_ld(x, r * x.s[0] + j) * rstd;
    if (bf16_inner) xn = round_bf(xn);
    dv_st(y, r * y.s[0] + j, xn * dv_ld(w, j * w.s[0]));
  }
}

template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_vec_kernel(const uint16_t *x, int64_t ld_x, const uint16_t *w, uint16_t *y,
                       int64_t ld_y, int d, float eps, int bf16_inner) {
  __shared__ float red[32];
  const bf16x8 *xr = (const bf16x8 *)(x + blockIdx.x * ld_x);
  const bf16x8 *wr = (const bf16x8 *)w;
  bf16x8 *yr = (bf16x8 *)(y + blockIdx.x * ld_y);
  int d8 = d / 8;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d8; i += THREADS) {
    float f[8];
    unpack8(xr[i], f);
#pragma unroll
    for (int j = 0; j < 8; j++) ss += f[j] * f[j];
  }
  ss = block_sum(ss, red);
  float rstd = 1.0f / sqrtf(ss / (float)d + eps);
  for (int i = threadIdx.x; i < d8; i += THREADS) {
    float f[8], g[8];
    unpack8(xr[i], f);
    unpack8(wr[i], g);
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float xn = f[j] * rstd;
      if (bf16_inner) xn = round_bf(xn);
      f[j] = xn * g[j];
    }
    yr[i] = pack8(f);
  }
}

/* Row held in registers: VPT 16-byte vectors per thread (d8 <= 128 * VPT), x read once. */
template <int VPT>
__global__ void __launch_bounds__(128)
    rmsnorm_reg_kernel(const uint16_t *x, int64_t ld_x, const uint16_t *w, uint16_t *y,
                       int64_t ld_y, int d, float eps, int bf16_inner) {
  __shared__ float red[32];
  pdl_wait(); /* launched with PDL (pdl.cuh): x (and in tests w) may be the previous kernel's */
  pdl_trigger();
  rms_row<VPT>(x + blockIdx.x * ld_x, w, y + blockIdx.x * ld_y, d, eps, bf16_inner, red, true);
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int k3k_cuda_rmsnorm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_rmsnorm_params_t *p = (const k3k_rmsnorm_params_t *)params;
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  int64_t rows = x->shape[0], d = x->shape[1];
  if (rows == 0) return 0;
  bool vec = x->dtype == K3K_BF16 && y->dtype == K3K_BF16 && w->dtype == K3K_BF16 &&
             w->stride[0] == 1 && d % 8 == 0 && x->stride[0] % 8 == 0 && y->stride[0] % 8 == 0 &&
             al16(x->data) && al16(y->data) && al16(w->data);
  const uint16_t *px = (const uint16_t *)x->data, *pw = (const uint16_t *)w->data;
  uint16_t *py = (uint16_t *)y->data;
  int64_t d8 = d / 8;
  unsigned g = (unsigned)rows;
  if (vec && d8 <= 128) {
    K3K_CU(pdl_launch(rmsnorm_reg_kernel<1>, dim3(g), dim3(128), 0, cx->stream, px,
                      x->stride[0], pw, py, y->stride[0], (int)d, p->eps, p->bf16_inner));
  } else if (vec && d8 <= 256) {
    K3K_CU(pdl_launch(rmsnorm_reg_kernel<2>, dim3(g), dim3(128), 0, cx->stream, px,
                      x->stride[0], pw, py, y->stride[0], (int)d, p->eps, p->bf16_inner));
  } else if (vec && d8 <= 512) {
    K3K_CU(pdl_launch(rmsnorm_reg_kernel<4>, dim3(g), dim3(128), 0, cx->stream, px,
                      x->stride[0], pw, py, y->stride[0], (int)d, p->eps, p->bf16_inner));
  } else if (vec && d8 <= 1024) {
    K3K_CU(pdl_launch(rmsnorm_reg_kernel<8>, dim3(g), dim3(128), 0, cx->stream, px,
                      x->stride[0], pw, py, y->stride[0], (int)d, p->eps, p->bf16_inner));
  } else if (vec) {
    rmsnorm_vec_kernel<256><<<g, 256, 0, cx->stream>>>(px, x->stride[0], pw, py, y->stride[0],
                                                       (int)d, p->eps, p->bf16_inner);
  } else {
    rmsnorm_kernel<256><<<g, 256, 0, cx->stream>>>(mkdv(x), mkdv(w), mkdv(y), d, p->eps,
                                                   p->bf16_inner);
  }
  K3K_LAUNCHED("rmsnorm");
  return 0;
}

/* ---- GATED_RMSNORM and L2NORM: one warp per (row, head) ---- */
__global__ void gated_rmsnorm_kernel(dv x, dv z, dv w, dv y, int64_t rows, int64_t nh,
                                     int64_t dh, float eps) {
  int64_t gw = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (gw >= rows * nh) return;
  int64_t r = gw / nh, c0 = (gw % nh) * dh;
  float ss = 0.0f;
  for (int64_t d = lane; d < dh; d += 32) {
    float v = dv_ld(x, r * x.s[0] + c0 + d);
    ss += v * v;
  }
  ss = warp_sum(ss);
  float rstd = 1.0f / sqrtf(ss / (float)dh + eps);
  for (int64_t d = lane; d < dh; d += 32) {
    float v = dv_ld(x, r * x.s[0] + c0 + d), zz = dv_ld(z, r * z.s[0] + c0 + d);
    dv_st(y, r * y.s[0] + c0 + d, v * rstd * dv_ld(w, d * w.s[0]) * sigmoidf_acc(zz));
  }
}

/* Half-warp of 16 lanes per (row, head) at Dh = 128, 8 channels per lane; each half-warp
 * does two consecutive (row, head) items and loads both before the math. */
__device__ __forceinline__ float hw_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Item i -> offset of its 128 channels in a [rows][nh*128] matrix with row stride ld. The
 * fast paths run only when items < 2^31, so the division is 32-bit. */
__device__ __forceinline__ int64_t head_off(int64_t i, int nh, int64_t ld) {
  uint32_t r = (uint32_t)i / (uint32_t)nh;
  return (int64_t)r * ld + (int64_t)((uint32_t)i - r * (uint32_t)nh) * 128;
}

/* sigmoid with __expf/__fdividef (~2 ulp in fp32): the gated norm's output is BF16, whose
 * rounding (2^-9) dwarfs it; 1/(1+inf) -> 0 and 1/(1+0) -> 1 at the ends. */
__device__ __forceinline__ float sigmoid_fast(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }

/* Items are (row, head) pairs; blocks of 256 threads = 16 half-warps x GR_ITEMS items, all of a
 * half-warp's loads issued before its math. A half-warp past the last item does not return: it
 * reduces zeros, so the full-mask shuffles always see all 32 lanes of the warp. */
#define GR_ITEMS 4
__global__ void __launch_bounds__(256)
    gated_rmsnorm_vec_kernel(const uint16_t *x, int64_t ldx, const uint16_t *z, int64_t ldz,
                             const float *w, uint16_t *y, int64_t ldy, int64_t items, int nh,
                             float eps) {
  int64_t hw = blockIdx.x * (int64_t)(blockDim.x >> 4) + (threadIdx.x >> 4);
  int l = threadIdx.x & 15;
  int64_t i0 = hw * GR_ITEMS;
  int n = i0 >= items ? 0 : (items - i0 < GR_ITEMS ? (int)(items - i0) : GR_ITEMS);
  bf16x8 xv[GR_ITEMS], zv[GR_ITEMS];
#pragma unroll
  for (int k = 0; k < GR_ITEMS; k++)
    if (k < n) {
      xv[k] = *(const bf16x8 *)(x + head_off(i0 + k, nh, ldx) + l * 8);
      zv[k] = *(const bf16x8 *)(z + head_off(i0 + k, nh, ldz) + l * 8);
    }
  float4 w0 = *(const float4 *)(w + l * 8), w1 = *(const float4 *)(w + l * 8 + 4);
  float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
  for (int k = 0; k < GR_ITEMS; k++) {
    float xf[8], zf[8];
    if (k < n) {
      unpack8(xv[k], xf);
      unpack8(zv[k], zf);
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++) xf[j] = zf[j] = 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) ss += xf[j] * xf[j];
    ss = hw_sum(ss); /* every lane of the warp takes part (dead items reduce zeros) */
    float rstd = 1.0f / sqrtf(ss / 128.0f + eps);
    if (k < n) {
#pragma unroll
      for (int j = 0; j < 8; j++) xf[j] = xf[j] * rstd * wf[j] * sigmoid_fast(zf[j]);
      *(bf16x8 *)(y + head_off(i0 + k, nh, ldy) + l * 8) = pack8(xf);
    }
  }
}

int k3k_cuda_gated_rmsnorm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_gated_rmsnorm_params_t *p = (const k3k_gated_rmsnorm_params_t *)params;
  int64_t rows = t[0]->shape[0], dh = p->head_dim, nh = t[0]->shape[1] / dh;
  int64_t warps = rows * nh;
  if (warps == 0) return 0;
  const k3k_tensor_t *x = t[0], *z = t[1], *w = t[2], *y = t[3];
  if (dh == 128 && x->dtype == K3K_BF16 && z->dtype == K3K_BF16 && y->dtype == K3K_BF16 &&
      w->dtype == K3K_F32 && w->stride[0] == 1 && x->stride[1] == 1 && z->stride[1] == 1 &&
      y->stride[1] == 1 && x->stride[0] % 8 == 0 && z->stride[0] % 8 == 0 &&
      y->stride[0] % 8 == 0 && al16(x->data) && al16(z->data) && al16(y->data) &&
      al16(w->data) && warps < ((int64_t)1 << 31)) {
    /* 16 half-warps per block, GR_ITEMS items each */
    gated_rmsnorm_vec_kernel<<<k3k_ceil_div(warps, 16 * GR_ITEMS), 256, 0, cx->stream>>>(
        (const uint16_t *)x->data, x->stride[0], (const uint16_t *)z->data, z->stride[0],
        (const float *)w->data, (uint16_t *)y->data, y->stride[0], warps, (int)nh, p->eps);
    K3K_LAUNCHED("gated_rmsnorm");
    return 0;
  }
  gated_rmsnorm_kernel<<<k3k_ceil_div(warps, 8), 256, 0, cx->stream>>>(
      mkdv(t[0]), mkdv(t[1]), mkdv(t[2]), mkdv(t[3]), rows, nh, dh, p->eps);
  K3K_LAUNCHED("gated_rmsnorm");
  return 0;
}

__global__ void l2norm_kernel(dv x, dv y, int64_t rows, int64_t nh, int64_t dh, float eps,
                              float scale) {
  int64_t gw = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (gw >= rows * nh) return;
  int64_t r = gw / nh, c0 = (gw % nh) * dh;
  float ss = 0.0f;
  for (int64_t d = lane; d < dh; d += 32) {
    float v = dv_ld(x, r * x.s[0] + c0 + d);
    ss += v * v;
  }
  ss = warp_sum(ss);
  float rn = 1.0f / sqrtf(ss + eps);
  for (int64_t d = lane; d < dh; d += 32)
    dv_st(y, r * y.s[0] + c0 + d, dv_ld(x, r * x.s[0] + c0 + d) * rn * scale);
}

/* L2NORM at Dh = 128, BF16 x: the half-warp layout of the gated norm; F32 or BF16 y. */
template <bool YF32>
__global__ void __launch_bounds__(256)
    l2norm_vec_kernel(const uint16_t *x, int64_t ldx, void *y, int64_t ldy, int64_t items,
                      int nh, float eps, float scale) {
  int64_t hw = blockIdx.x * (int64_t)(blockDim.x >> 4) + (threadIdx.x >> 4);
  int l = threadIdx.x & 15;
  int64_t i0 = hw * 2;
  int n = i0 >= items ? 0 : i0 + 1 < items ? 2 : 1;
  bf16x8 xv[2];
#pragma unroll
  for (int k = 0; k < 2; k++)
    if (k < n) xv[k] = *(const bf16x8 *)(x + head_off(i0 + k, nh, ldx) + l * 8);
#pragma unroll
  for (int k = 0; k < 2; k++) {
    float f[8];
    if (k < n)
      unpack8(xv[k], f);
    else
#pragma unroll
      for (int j = 0; j < 8; j++) f[j] = 0.0f;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    ss = hw_sum(ss);
    float rn = 1.0f / sqrtf(ss + eps);
    if (k < n) {
#pragma unroll
      for (int j = 0; j < 8; j++) f[j] = f[j] * rn * scale;
      int64_t o = head_off(i0 + k, nh, ldy) + l * 8;
      if (YF32) {
        float4 *yr = (float4 *)((float *)y + o);
        yr[0] = make_float4(f[0], f[1], f[2], f[3]);
        yr[1] = make_float4(f[4], f[5], f[6], f[7]);
      } else {
        *(bf16x8 *)((uint16_t *)y + o) = pack8(f);
      }
    }
  }
}

int k3k_cuda_l2norm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_l2norm_params_t *p = (const k3k_l2norm_params_t *)params;
  int64_t rows = t[0]->shape[0], dh = p->head_dim, nh = t[0]->shape[1] / dh;
  int64_t warps = rows * nh;
  if (warps == 0) return 0;
  const k3k_tensor_t *x = t[0], *y = t[1];
  if (dh == 128 && x->dtype == K3K_BF16 && x->stride[1] == 1 && y->stride[1] == 1 &&
      x->stride[0] % 8 == 0 && (y->stride[0] * (int64_t)k3k_dtype_size(y->dtype)) % 16 == 0 &&
      al16(x->data) && al16(y->data) && warps < ((int64_t)1 << 31)) {
    if (y->dtype == K3K_F32)
      l2norm_vec_kernel<true><<<k3k_ceil_div(warps, 32), 256, 0, cx->stream>>>(
          (const uint16_t *)x->data, x->stride[0], y->data, y->stride[0], warps, (int)nh, p->eps,
          p->scale);
    else
      l2norm_vec_kernel<false><<<k3k_ceil_div(warps, 32), 256, 0, cx->stream>>>(
          (const uint16_t *)x->data, x->stride[0], y->data, y->stride[0], warps, (int)nh, p->eps,
          p->scale);
    K3K_LAUNCHED("l2norm");
    return 0;
  }
  l2norm_kernel<<<k3k_ceil_div(warps, 8), 256, 0, cx->stream>>>(mkdv(t[0]), mkdv(t[1]), rows, nh,
                                                                dh, p->eps, p->scale);
  K3K_LAUNCHED("l2norm");
  return 0;
}

/* ---- ATTN_RES_MIX: one block per token; values read twice (the second time from L1/L2). ---- */
__global__ void __launch_bounds__(256)
    attn_res_kernel(dv snaps, int64_t nb, dv pc, dv wn, dv wp, dv y, int64_t d, float eps) {
  __shared__ float red[32];
  __shared__ float alpha[ARM_MAXV];
  int64_t tk = blockIdx.x;
  int64_t nv = nb + 1;
  for (int64_t j = 0; j < nv; j++) {
    bool isp = j == nb;
    int64_t base = isp ? tk * pc.s[0] : j * snaps.s[0] + tk * snaps.s[1];
    const dv &V = isp ? pc : snaps;
    float ss = 0.0f, dot = 0.0f;
    for (int64_t e = threadIdx.x; e < d; e += 256) {
      float v = dv_ld(V, base + e);
      ss += v * v;
      dot += v * dv_ld(wn, e * wn.s[0]) * dv_ld(wp, e * wp.s[0]);
    }
    ss = block_sum(ss, red);
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) alpha[j] = dot / sqrtf(ss / (float)d + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = alpha[0];
    for (int64_t j = 1; j < nv; j++) m = fmaxf(m, alpha[j]);
    float z = 0.0f;
    for (int64_t j = 0; j < nv; j++) {
      alpha[j] = expf(alpha[j] - m);
      z += alpha[j];
    }
    for (int64_t j = 0; j < nv; j++) alpha[j] /= z;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < d; e += 256) {
    float acc = 0.0f;
    for (int64_t j = 0; j < nv; j++) {
      float v = j < nb ? dv_ld(snaps, j * snaps.s[0] + tk * snaps.s[1] + e)
                       : dv_ld(pc, tk * pc.s[0] + e);
      acc += alpha[j] * v;
    }
    dv_st(y, tk * y.s[0] + e, acc);
  }
}

/* BF16 fast path: 256 threads, up to ARM_VPT 16-byte vectors per thread per value
 * (D <= 8 * 256 * ARM_VPT). Pass 1 loads ARM_P1 values at a time (ARM_P1 x ARM_VPT loads in
 * flight per thread) and reduces each value's (ss, dot) with warp shuffles into shared memory
 * (one barrier per token); pass 2 re-reads the values (from L2), ARM_P2 at a time, and mixes.
 * The grid is persistent (blocks stride over tokens) and sized to 2 blocks per SM: between a
 * token's two passes the whole GPU streams ~264 tokens' values (~34 MB at K3's 9 x 7168), which
 * stays within the 50 MB L2; more blocks per SM would evict them first. */
#define ARM_VPT 4
#define ARM_P1 3
#define ARM_P2 2
/* THREADS per block, VPT vectors per thread and value, P1/P2 values per load batch of the two
 * passes. <256, ARM_VPT, ARM_P1, ARM_P2, 2> is the persistent prefill/batch form above; at
 * decode (T <= SM count: one block per token) <512, 2, 8, 8, 1> keeps 8 values x 2 vectors in
 * flight per thread, so a token with up to 8 values costs one round trip per pass instead of
 * ceil(nv/3) + ceil(nv/2) (the reduction tree differs: fp32 order only). */
template <int THREADS, int VPT, int P1, int P2, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
    attn_res_vec_kernel(const uint16_t *snaps, int64_t s_b, int64_t s_t, const uint16_t *pc,
                        int64_t ld_p, const uint16_t *wn, const uint16_t *wp, uint16_t *y,
                        int64_t ld_y, int64_t T, int nb, int d, float eps) {
  __shared__ float red[THREADS / 32][2 * ARM_MAXV];
  __shared__ float alpha[ARM_MAXV];
  pdl_wait(); /* launched with PDL: everything it reads may be the previous kernel's output */
  pdl_trigger();
  for (int64_t tk = blockIdx.x; tk < T; tk += gridDim.x)
    arm_token<THREADS, VPT, P1, P2>(snaps + tk * s_t, s_b, pc + tk * ld_p, wn, wp, y + tk * ld_y,
                                    nb, d, eps, red, alpha);
}

static bool arm_vec_ok(const k3k_tensor_t *const *t, int64_t d) {
  for (int i = 0; i < 5; i++)
    if (t[i]->dtype != K3K_BF16 || (!al16(t[i]->data) && !(i == 0 && t[0]->shape[0] == 0)))
      return false;
  const k3k_tensor_t *sn = t[0], *pc = t[1], *wn = t[2], *wp = t[3], *y = t[4];
  return d % 8 == 0 && d / 8 <= 256 * ARM_VPT && sn->stride[2] == 1 && pc->stride[1] == 1 &&
         y->stride[1] == 1 && wn->stride[0] == 1 && wp->stride[0] == 1 &&
         (sn->shape[0] <= 1 || sn->stride[0] % 8 == 0) && sn->stride[1] % 8 == 0 &&
         pc->stride[0] % 8 == 0 && y->stride[0] % 8 == 0;
}

int k3k_cuda_attn_res_mix(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_attn_res_params_t *p = (const k3k_attn_res_params_t *)params;
  int64_t nb = t[0]->shape[0], T = t[1]->shape[0], d = t[1]->shape[1];
  if (T == 0) return 0;
  if (nb + 1 > ARM_MAXV) return K3_ENOTSUP; /* cuda_supports() rejects this first */
  if (arm_vec_ok(t, d)) {
    int64_t g = 2 * (int64_t)cx->num_sms;
    const bool small = T <= cx->num_sms && d / 8 <= 512 * 2;
    K3K_CU(pdl_launch(small ? attn_res_vec_kernel<512, 2, 8, 8, 1>
                            : attn_res_vec_kernel<256, ARM_VPT, ARM_P1, ARM_P2, 2>,
                      dim3((unsigned)(T < g ? T : g)), dim3(small ? 512 : 256), 0, cx->stream,
                      (const uint16_t *)t[0]->data, t[0]->stride[0], t[0]->stride[1],
                      (const uint16_t *)t[1]->data, t[1]->stride[0], (const uint16_t *)t[2]->data,
                      (const uint16_t *)t[3]->data, (uint16_t *)t[4]->data, t[4]->stride[0], T,
                      (int)nb, (int)d, p->eps));
  } else {
    attn_res_kernel<<<(unsigned)T, 256, 0, cx->stream>>>(mkdv(t[0]), nb, mkdv(t[1]), mkdv(t[2]),
                                                         mkdv(t[3]), mkdv(t[4]), d, p->eps);
  }
  K3K_LAUNCHED("attn_res_mix");
  return 0;
}
