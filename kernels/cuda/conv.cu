/* CUDA: CONV_PREFILL and CONV_STEP, the KDA causal depthwise short conv (+ SiLU), spec §3.2.
 *
 * What it is for: packed ragged sequences (cu_seqlens) with a per-sequence state slot, and the
 * one-token decode update. W (kernel width) <= 8. Fast path (BF16 x rows with inner stride 1,
 * BF16/F32 y rows, 16-byte aligned, C % 8 == 0, 2 <= W <= 8): one thread per (8 channels, run of
 * CONV_RUN tokens) keeps the W-1 previous inputs in registers, so each input is loaded once (plus
 * a W-1 token halo per run) with 16-byte loads, CONV_UNROLL tokens in flight; the sequence of the
 * run's first token is found once by binary search and later ones by walking cu_seqlens. Same
 * summation order as the generic kernel (one thread per (token, channel)), which every other
 * view takes; the fast path's SiLU uses __expf/__fdividef (see silu_fast).
 * What it is not: fused with the projections; the fused decode step (kda.cu) has its own copy of
 * the step for the K3 shapes.
 * Invariants (k3k.h): state[slot][c][j] = x_{start-W+1+j}, oldest first; after the outputs the
 * slot holds the last W-1 raw inputs (from the old state when the sequence is shorter); a
 * sequence of length 0 keeps its state. The outputs are computed by one kernel and the states
 * rewritten by a second one queued after it, so no thread reads a state another has replaced. */
#include "cuda_common.cuh"

#define CONV_MAXW 8

__device__ __forceinline__ float silu_f(float a) { return a / (1.0f + expf(-a)); }

__global__ void conv_prefill_kernel(dv x, dv w, const int32_t *cu, const int32_t *slots,
                                    int nseq, dv st, dv y, int64_t T, int64_t c_total,
                                    int width, int read_state, int act) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= c_total) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) { /* T may exceed the grid's 65535 rows */
    int lo = 0, hi = nseq - 1; /* the last sequence s with cu[s] <= t (skips empty ones) */
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    int64_t start = cu[lo];
    int64_t slot = slots[lo];
    float acc = 0.0f;
    for (int j = 0; j < width; j++) { /* w[c][j] multiplies x_{t-W+1+j} */
      int64_t pidx = t - width + 1 + j;
      float xv = 0.0f;
      if (pidx >= start)
        xv = dv_ld(x, pidx * x.s[0] + c * x.s[1]);
      else if (read_state)
        xv = dv_ld(st, slot * st.s[0] + c * st.s[1] + (width - 1 - (start - pidx)) * st.s[2]);
      acc += dv_ld(w, c * w.s[0] + j * w.s[1]) * xv;
    }
    dv_st(y, t * y.s[0] + c * y.s[1], act ? silu_f(acc) : acc);
  }
}

__global__ void conv_state_kernel(dv x, const int32_t *cu, const int32_t *slots, dv st,
                                  int64_t c_total, int width, int read_state) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int s = blockIdx.y;
  if (c >= c_total) return;
  int64_t start = cu[s], end = cu[s + 1];
  if (end == start) return;
  int64_t base = slots[s] * st.s[0] + c * st.s[1];
  float nv[CONV_MAXW];
  for (int j = 0; j < width - 1; j++) {
    int64_t pidx = end - (width - 1) + j;
    if (pidx >= start)
      nv[j] = dv_ld(x, pidx * x.s[0] + c * x.s[1]);
    else
      nv[j] = read_state ? dv_ld(st, base + (width - 1 - (start - pidx)) * st.s[2]) : 0.0f;
  }
  for (int j = 0; j < width - 1; j++) dv_st(st, base + j * st.s[2], nv[j]);
}

#define CONV_RUN 32
#define CONV_UNROLL 4

/* win[j] holds the 8 inputs at position t-(W-1)+j (j < W-1) for the sequence [start, ...) that t
 * belongs to: earlier positions come from the slot's state (or zeros). */
template <int W>
__device__ __forceinline__ void conv_window(float win[W > 1 ? W - 1 : 1][8], const uint16_t *x,
                                            int64_t ldx, int64_t c, int64_t t, int64_t start,
                                            const dv &st, int64_t slot, int read_state) {
#pragma unroll
  for (int j = 0; j < W - 1; j++) {
    int64_t p = t - (W - 1) + j;
    if (p >= start) {
      bf16x8 v = ((const bf16x8 *)(x + p * ldx))[c];
      unpack8(v, win[j]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++)
        win[j][k] = read_state ? dv_ld(st, slot * st.s[0] + (c * 8 + k) * st.s[1] +
                                               (W - 1 - (start - p)) * st.s[2])
                               : 0.0f;
    }
  }
}

/* SiLU with the fast intrinsics (ex2.approx-based __expf, __fdividef): ~2 ulp in fp32, far
 * below the BF16 output rounding and the F32 tolerance (1e-4); it roughly halves the per-
 * element instruction count, which otherwise is on a par with the memory time here. For
 * a < -87, __expf(-a) = inf and __fdividef returns 0 (silu's limit). */
__device__ __forceinline__ float silu_fast(float a) { return __fdividef(a, 1.0f + __expf(-a)); }

template <int W, bool YF32>
__global__ void __launch_bounds__(128)
    conv_prefill_vec_kernel(const uint16_t *x, int64_t ldx, dv w, const int32_t *cu,
                            const int32_t *slots, int nseq, dv st, void *y, int64_t ldy,
                            int64_t c8, int64_t T, int read_state, int act) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t t0 = (int64_t)blockIdx.y * CONV_RUN;
  if (c >= c8 || t0 >= T) return;
  int64_t t_end = t0 + CONV_RUN < T ? t0 + CONV_RUN : T;
  float wr[8][W];
#pragma unroll
  for (int k = 0; k < 8; k++)
#pragma unroll
    for (int j = 0; j < W; j++) wr[k][j] = dv_ld(w, (c * 8 + k) * w.s[0] + j * w.s[1]);
  int lo = 0, hi = nseq - 1; /* the last sequence s with cu[s] <= t0 (skips empty ones) */
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t0) lo = mid; else hi = mid - 1;
  }
  int s = lo;
  int64_t start = cu[s], next = s + 1 < nseq ? cu[s + 1] : INT64_MAX;
  float win[W - 1][8];
  conv_window<W>(win, x, ldx, c, t0, start, st, slots[s], read_state);
  /* Software pipeline: the next CONV_UNROLL rows are loaded before this group's math, so a
   * thread always has loads in flight (the math alone is about as long as the load latency). */
  bf16x8 cur[CONV_UNROLL], nxt[CONV_UNROLL];
#pragma unroll
  for (int u = 0; u < CONV_UNROLL; u++)
    if (t0 + u < t_end) cur[u] = ((const bf16x8 *)(x + (t0 + u) * ldx))[c];
  for (int64_t tb = t0; tb < t_end; tb += CONV_UNROLL) {
#pragma unroll
    for (int u = 0; u < CONV_UNROLL; u++)
      if (tb + CONV_UNROLL + u < t_end) nxt[u] = ((const bf16x8 *)(x + (tb + CONV_UNROLL + u) * ldx))[c];
#pragma unroll
    for (int u = 0; u < CONV_UNROLL; u++) {
      int64_t t = tb + u;
      if (t >= t_end) break;
      if (t >= next) { /* a new sequence starts here (empty ones skipped) */
        while (s + 1 < nseq && cu[s + 1] <= t) s++;
        start = cu[s];
        next = s + 1 < nseq ? cu[s + 1] : INT64_MAX;
        conv_window<W>(win, x, ldx, c, t, start, st, slots[s], read_state);
      }
      float xt[8], o[8];
      unpack8(cur[u], xt);
#pragma unroll
      for (int k = 0; k < 8; k++) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < W - 1; j++) acc += wr[k][j] * win[j][k];
        acc += wr[k][W - 1] * xt[k];
        o[k] = act ? silu_fast(acc) : acc;
      }
#pragma unroll
      for (int j = 0; j + 1 < W - 1; j++)
#pragma unroll
        for (int k = 0; k < 8; k++) win[j][k] = win[j + 1][k];
#pragma unroll
      for (int k = 0; k < 8; k++) win[W - 2][k] = xt[k];
      if (YF32) {
        float4 *yr = (float4 *)((float *)y + t * ldy) + 2 * c;
        yr[0] = make_float4(o[0], o[1], o[2], o[3]);
        yr[1] = make_float4(o[4], o[5], o[6], o[7]);
      } else {
        ((bf16x8 *)((uint16_t *)y + t * ldy))[c] = pack8(o);
      }
    }
#pragma unroll
    for (int u = 0; u < CONV_UNROLL; u++) cur[u] = nxt[u];
  }
}

static bool al16c(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int W>
static void launch_conv_vec(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t,
                            const k3k_conv_params_t *p) {
  const k3k_tensor_t *x = t[0], *y = t[5];
  int64_t T = x->shape[0], c8 = x->shape[1] / 8;
  dim3 grid(k3k_ceil_div(c8, 128), k3k_ceil_div(T, CONV_RUN));
  if (y->dtype == K3K_F32)
    conv_prefill_vec_kernel<W, true><<<grid, 128, 0, cx->stream>>>(
        (const uint16_t *)x->data, x->stride[0], mkdv(t[1]), (const int32_t *)t[2]->data,
        (const int32_t *)t[3]->data, p->n_seqs, mkdv(t[4]), y->data, y->stride[0], c8, T,
        p->read_state, p->activation);
  else
    conv_prefill_vec_kernel<W, false><<<grid, 128, 0, cx->stream>>>(
        (const uint16_t *)x->data, x->stride[0], mkdv(t[1]), (const int32_t *)t[2]->data,
        (const int32_t *)t[3]->data, p->n_seqs, mkdv(t[4]), y->data, y->stride[0], c8, T,
        p->read_state, p->activation);
}

int k3k_cuda_conv_prefill(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_conv_params_t *p = (const k3k_conv_params_t *)params;
  const k3k_tensor_t *x = t[0], *w = t[1], *cu = t[2], *sl = t[3], *st = t[4], *y = t[5];
  int64_t T = x->shape[0], C = x->shape[1];
  int width = (int)w->shape[1];
  if (p->n_seqs == 0 || C == 0) return 0;
  /* cu_seqlens and slots (range, uniqueness) are checked on the device before any write. */
  int rc;
  if ((rc = k3k_cuda_check_seqs(cx, t[2], p->n_seqs, T)) ||
      (rc = k3k_cuda_check_ids(cx, t[3], p->n_seqs, t[4]->shape[0], 1, 0)))
    return rc;
  bool vec = x->dtype == K3K_BF16 && C % 8 == 0 && width >= 2 && width <= CONV_MAXW &&
             x->stride[1] == 1 && y->stride[1] == 1 && cu->stride[0] == 1 &&
             sl->stride[0] == 1 && al16c(x->data) && al16c(y->data) &&
             (x->stride[0] * 2) % 16 == 0 &&
             (y->stride[0] * (int64_t)k3k_dtype_size(y->dtype)) % 16 == 0;
  if (T > 0 && vec) {
    switch (width) {
      case 2: launch_conv_vec<2>(cx, t, p); break;
      case 3: launch_conv_vec<3>(cx, t, p); break;
      case 4: launch_conv_vec<4>(cx, t, p); break;
      case 5: launch_conv_vec<5>(cx, t, p); break;
      case 6: launch_conv_vec<6>(cx, t, p); break;
      case 7: launch_conv_vec<7>(cx, t, p); break;
      default: launch_conv_vec<8>(cx, t, p); break;
    }
    K3K_LAUNCHED("conv_prefill");
  } else if (T > 0) {
    conv_prefill_kernel<<<dim3(k3k_ceil_div(C, 256), (unsigned)(T < 65535 ? T : 65535)), 256, 0,
                          cx->stream>>>(
        mkdv(x), mkdv(w), (const int32_t *)cu->data, (const int32_t *)sl->data, p->n_seqs,
        mkdv(st), mkdv(y), T, C, width, p->read_state, p->activation);
    K3K_LAUNCHED("conv_prefill");
  }
  conv_state_kernel<<<dim3(k3k_ceil_div(C, 256), (unsigned)p->n_seqs), 256, 0, cx->stream>>>(
      mkdv(x), (const int32_t *)cu->data, (const int32_t *)sl->data, mkdv(st), C, width,
      p->read_state);
  K3K_LAUNCHED("conv_state");
  return 0;
}

/* CONV_STEP: y = act(Σ_{j<W-1} w[j]·s[j] + w[W-1]·x); state ← [s[1..W-2], x]. Each thread owns
 * one (sequence, channel) state row, so the in-place update is race-free. */
__global__ void conv_step_kernel(dv x, dv w, const int32_t *slots, dv st, dv y, int64_t c_total,
                                 int width, int act) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t b = blockIdx.y;
  if (c >= c_total) return;
  int64_t base = slots[b] * st.s[0] + c * st.s[1];
  float sv[CONV_MAXW];
  for (int j = 0; j < width - 1; j++) sv[j] = dv_ld(st, base + j * st.s[2]);
  float xv = dv_ld(x, b * x.s[0] + c * x.s[1]);
  float acc = 0.0f;
  for (int j = 0; j < width - 1; j++) acc += dv_ld(w, c * w.s[0] + j * w.s[1]) * sv[j];
  acc += dv_ld(w, c * w.s[0] + (width - 1) * w.s[1]) * xv;
  dv_st(y, b * y.s[0] + c * y.s[1], act ? silu_f(acc) : acc);
  for (int j = 0; j + 1 < width - 1; j++) dv_st(st, base + j * st.s[2], sv[j + 1]);
  if (width > 1) dv_st(st, base + (width - 2) * st.s[2], xv);
}

int k3k_cuda_conv_step(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_conv_params_t *p = (const k3k_conv_params_t *)params;
  const k3k_tensor_t *x = t[0], *w = t[1], *sl = t[2], *st = t[3], *y = t[4];
  int64_t N = x->shape[0], C = x->shape[1];
  if (N == 0 || C == 0) return 0;
  int rc = k3k_cuda_check_ids(cx, t[2], N, t[3]->shape[0], 1, 0);
  if (rc) return rc;
  conv_step_kernel<<<dim3(k3k_ceil_div(C, 256), (unsigned)N), 256, 0, cx->stream>>>(
      mkdv(x), mkdv(w), (const int32_t *)sl->data, mkdv(st), mkdv(y), C, (int)w->shape[1],
      p->activation);
  K3K_LAUNCHED("conv_step");
  return 0;
}
