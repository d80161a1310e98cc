/* CUDA: RMSNORM, GATED_RMSNORM (KDA o_norm), L2NORM (KDA q/k), ATTN_RES_MIX (depth mix).
 *
 * What it is for: the row-wise reductions of k3k.h (spec §2.2, §3.3, §3.7, §8) on device
 * tensors. One block per row for RMSNORM / ATTN_RES_MIX, one warp per (row, head) otherwise;
 * fp32 statistics; inner stride 1 (k3k.h addresses channels as `row*stride0 + d`).
 * What it is not: bit-identical to the CPU reference: sums are tree-ordered here and sequential
 * there, so results differ by fp32 rounding (~1e-7 relative) before the output rounding.
 * RMSNORM with BF16 x/y/w and 16-byte aligned rows takes a vectorised path (8 bf16 per load). */
#include "cuda_common.cuh"

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

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int k3k_cuda_rmsnorm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_rmsnorm_params_t *p = (const k3k_rmsnorm_params_t *)params;
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[2];
  int64_t rows = x->shape[0], d = x->shape[1];
  if (rows == 0) return 0;
  bool vec = x->dtype == K3K_BF16 && y->dtype == K3K_BF16 && w->dtype == K3K_BF16 &&
             w->stride[0] == 1 && d % 8 == 0 && x->stride[0] % 8 == 0 && y->stride[0] % 8 == 0 &&
             al16(x->data) && al16(y->data) && al16(w->data);
  if (vec && d >= 2048)
    rmsnorm_vec_kernel<256><<<(unsigned)rows, 256, 0, cx->stream>>>(
        (const uint16_t *)x->data, x->stride[0], (const uint16_t *)w->data, (uint16_t *)y->data,
        y->stride[0], (int)d, p->eps, p->bf16_inner);
  else if (vec)
    rmsnorm_vec_kernel<64><<<(unsigned)rows, 64, 0, cx->stream>>>(
        (const uint16_t *)x->data, x->stride[0], (const uint16_t *)w->data, (uint16_t *)y->data,
        y->stride[0], (int)d, p->eps, p->bf16_inner);
  else
    rmsnorm_kernel<256><<<(unsigned)rows, 256, 0, cx->stream>>>(mkdv(x), mkdv(w), mkdv(y), d,
                                                                p->eps, p->bf16_inner);
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

/* Dh = 128, BF16 x/z/y, F32 w, 8-byte aligned rows: each lane loads 4 channels at once. */
__global__ void gated_rmsnorm_vec_kernel(const uint16_t *x, int64_t ldx, const uint16_t *z,
                                         int64_t ldz, const float *w, uint16_t *y, int64_t ldy,
                                         int64_t rows, int nh, float eps) {
  int64_t gw = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (gw >= rows * nh) return;
  int64_t r = gw / nh;
  int64_t c0 = (gw - r * nh) * 128 + lane * 4;
  uint2 xv = *(const uint2 *)(x + r * ldx + c0), zv = *(const uint2 *)(z + r * ldz + c0);
  float4 wv = *(const float4 *)(w + lane * 4);
  float xf[4] = {__uint_as_float(xv.x << 16), __uint_as_float(xv.x & 0xffff0000u),
                 __uint_as_float(xv.y << 16), __uint_as_float(xv.y & 0xffff0000u)};
  float zf[4] = {__uint_as_float(zv.x << 16), __uint_as_float(zv.x & 0xffff0000u),
                 __uint_as_float(zv.y << 16), __uint_as_float(zv.y & 0xffff0000u)};
  float wf[4] = {wv.x, wv.y, wv.z, wv.w};
  float ss = warp_sum(xf[0] * xf[0] + xf[1] * xf[1] + xf[2] * xf[2] + xf[3] * xf[3]);
  float rstd = 1.0f / sqrtf(ss / 128.0f + eps);
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; j++) o[j] = f2bf(xf[j] * rstd * wf[j] * sigmoidf_acc(zf[j]));
  *(uint2 *)(y + r * ldy + c0) = make_uint2(o[0] | (o[1] << 16), o[2] | (o[3] << 16));
}

static bool al8(const void *p) { return ((uintptr_t)p & 7) == 0; }

int k3k_cuda_gated_rmsnorm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_gated_rmsnorm_params_t *p = (const k3k_gated_rmsnorm_params_t *)params;
  int64_t rows = t[0]->shape[0], dh = p->head_dim, nh = t[0]->shape[1] / dh;
  int64_t warps = rows * nh;
  if (warps == 0) return 0;
  const k3k_tensor_t *x = t[0], *z = t[1], *w = t[2], *y = t[3];
  if (dh == 128 && x->dtype == K3K_BF16 && z->dtype == K3K_BF16 && y->dtype == K3K_BF16 &&
      w->dtype == K3K_F32 && w->stride[0] == 1 && x->stride[0] % 4 == 0 &&
      z->stride[0] % 4 == 0 && y->stride[0] % 4 == 0 && al8(x->data) && al8(z->data) &&
      al8(y->data) && al16(w->data)) {
    gated_rmsnorm_vec_kernel<<<k3k_ceil_div(warps, 8), 256, 0, cx->stream>>>(
        (const uint16_t *)x->data, x->stride[0], (const uint16_t *)z->data, z->stride[0],
        (const float *)w->data, (uint16_t *)y->data, y->stride[0], rows, (int)nh, p->eps);
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

int k3k_cuda_l2norm(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_l2norm_params_t *p = (const k3k_l2norm_params_t *)params;
  int64_t rows = t[0]->shape[0], dh = p->head_dim, nh = t[0]->shape[1] / dh;
  int64_t warps = rows * nh;
  if (warps == 0) return 0;
  l2norm_kernel<<<k3k_ceil_div(warps, 8), 256, 0, cx->stream>>>(mkdv(t[0]), mkdv(t[1]), rows, nh,
                                                                dh, p->eps, p->scale);
  K3K_LAUNCHED("l2norm");
  return 0;
}

/* ---- ATTN_RES_MIX: one block per token; values read twice (the second time from L1/L2). ---- */
#define ARM_MAXV 16
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

int k3k_cuda_attn_res_mix(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_attn_res_params_t *p = (const k3k_attn_res_params_t *)params;
  int64_t nb = t[0]->shape[0], T = t[1]->shape[0], d = t[1]->shape[1];
  if (T == 0) return 0;
  if (nb + 1 > ARM_MAXV) return K3_ENOTSUP; /* cuda_supports() rejects this first */
  attn_res_kernel<<<(unsigned)T, 256, 0, cx->stream>>>(mkdv(t[0]), nb, mkdv(t[1]), mkdv(t[2]),
                                                       mkdv(t[3]), mkdv(t[4]), d, p->eps);
  K3K_LAUNCHED("attn_res_mix");
  return 0;
}
