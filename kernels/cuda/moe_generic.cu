/* CUDA: the grouped MXFP4 expert GEMM at any shape (generic.h k3k_cu_moe_gemm_generic), the
 * correctness path for expert sizes the tensor-core kernels (mxfp4_tc.cu: K % 128 == 0,
 * N % 16 == 0, 16-byte aligned rows) do not take.
 *
 * What it is for: the tiny K3 preset's experts (gate/up 64 x 128, down 128 x 64) on the model
 * runner's device MoE path (kernels/runner/ffn_device.c), so its decode step needs no host
 * round trip and can be captured in a CUDA graph like the real shapes. Same contract as
 * k3k_cu_moe_gemm (moe_ops.h): active experts from the device plan, optional row gather, gate
 * and up fused with SiTU / SiLU-mul and the bf16 rounding of the GEMM outputs (round_inner).
 * What it is not: fast. One warp per (output column, active expert) walks the expert's rows;
 * lanes split K (fp32 partial sums, a fixed butterfly: deterministic, bit-identical between
 * runs). The weights are dequantised per element as MXFP4_GEMM's generic kernel does.
 * Invariants: never synchronises, allocates nothing (capture-safe); arguments it cannot take
 * return K3_EINVAL with nothing queued. */
#include "cuda_common.cuh"
#include "generic.h"
#include "mxfp4_args.cuh"

#define MXG_WARPS 8

struct mxg_args {
  mx_dset w, up;
  int act, round_inner, fused;
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

/* Element k of row n of expert e, dequantised: E2M1 code (low nibble = even k) x 2^(s-127);
 * scale 0xFF (E8M0 NaN) gives NaN, as the other MXFP4 kernels do. */
__device__ __forceinline__ float mxg_w(const uint8_t *prow, const uint8_t *srow, int k) {
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint8_t b = prow[k >> 1];
  const uint8_t code = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
  const float v = (code & 8) ? -e2m1[code & 7] : e2m1[code & 7];
  const uint8_t s = srow[k >> 5];
  return s == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(v, (int)s - 127);
}

__device__ __forceinline__ void mxg_rows(const mx_dset &m, int e, int n, const uint8_t *&p,
                                         const uint8_t *&s) {
  p = mx_packed(m, e) + (int64_t)n * m.ldp;
  s = mx_scale(m, e) + (int64_t)n * m.lds;
}

/* grid (ceil(N / MXG_WARPS), max_active); a warp per output column n of the slot's expert. */
__global__ void __launch_bounds__(MXG_WARPS * 32) mx_gen_grouped_kernel(mxg_args a) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * MXG_WARPS + (threadIdx.x >> 5);
  int e, rb, re;
  if (a.expert_off) {
    if ((int)blockIdx.y >= a.active[0]) return;
    e = a.active[1 + blockIdx.y];
    rb = a.expert_off[e];
    re = a.expert_off[e + 1];
  } else {
    e = 0, rb = 0, re = a.single_rows;
  }
  if (n >= a.N) return;
  const uint8_t *wp, *ws, *up = NULL, *us = NULL;
  mxg_rows(a.w, e, n, wp, ws);
  if (a.fused) mxg_rows(a.up, e, n, up, us);
  for (int r = rb; r < re; r++) {
    const uint16_t *xr = a.x + (int64_t)(a.x_gather ? a.x_gather[r] : r) * a.ldx;
    float g = 0.0f, u = 0.0f;
    for (int k = lane; k < a.K; k += 32) {
      const float xv = bf2f(xr[k]);
      g += xv * mxg_w(wp, ws, k);
      if (a.fused) u += xv * mxg_w(up, us, k);
    }
    g = warp_sum(g);
    if (a.fused) u = warp_sum(u);
    if (lane) continue;
    float y = g;
    if (a.fused) {
      if (a.round_inner) {
        g = round_bf(g);
        u = round_bf(u);
      }
      const float sg = 1.0f / (1.0f + expf(-g));
      y = a.act == K3K_CU_ACT_SITU
              ? a.beta * tanhf(g / a.beta) * sg * (a.beta_lin * tanhf(u / a.beta_lin))
              : g * sg * u;
    }
    mx_store_y(a, r, n, y);
  }
}

int k3k_cu_moe_gemm_generic(cudaStream_t st, const k3k_cu_moe_gemm_args *a) {
  const bool fused = a && a->act != K3K_CU_ACT_NONE;
  if (!a || !a->x || !a->y || a->N <= 0 || a->K <= 0 || a->K % 32 || a->ldx < a->K ||
      a->ldy < a->N || a->max_active <= 0 || a->max_active > 65535 ||
      (a->act != K3K_CU_ACT_NONE && a->act != K3K_CU_ACT_SITU && a->act != K3K_CU_ACT_SILU_MUL) ||
      (!a->w.packed_tab && !a->w.packed_base) || (!a->w.scale_tab && !a->w.scale_base) ||
      (fused && ((!a->up.packed_tab && !a->up.packed_base) ||
                 (!a->up.scale_tab && !a->up.scale_base))) ||
      (a->expert_off && !a->active))
    return K3_EINVAL;
  mxg_args g;
  mx_fill_args(&g, a);
  g.fused = fused;
  dim3 grid((unsigned)((a->N + MXG_WARPS - 1) / MXG_WARPS),
            (unsigned)(a->expert_off ? a->max_active : 1));
  mx_gen_grouped_kernel<<<grid, MXG_WARPS * 32, 0, st>>>(g);
  K3K_LAUNCHED("mxfp4_grouped_gemm_generic");
  return 0;
}

int k3k_cu_moe_gemm_any(cudaStream_t st, const k3k_cu_moe_gemm_args *a) {
  const int rc = k3k_cu_moe_gemm(st, a);
  return rc == K3_EINVAL ? k3k_cu_moe_gemm_generic(st, a) : rc;
}
