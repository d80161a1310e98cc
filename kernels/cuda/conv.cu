/* CUDA: CONV_PREFILL and CONV_STEP, the KDA causal depthwise short conv (+ SiLU), spec §3.2.
 *
 * What it is for: packed ragged sequences (cu_seqlens) with a per-sequence state slot, and the
 * one-token decode update. W (kernel width) <= 8. Fast path (BF16 x rows with inner stride 1,
 * BF16/F32 y rows, 16-byte aligned, C % 8 == 0, 2 <= W <= 8): a thread owns 8 channels of one
 * contiguous token range (one range per block, the grid CONV_WAVES waves), streams its 16-byte
 * chunk of each row through a private cp.async ring in shared memory (12 rows in flight, 4 per
 * step) and keeps the W-1 previous inputs and the weights in registers, so x is read once (plus a W-1 row
 * halo per range) and y written once, both in 512-byte warp-wide runs; steps of 4 tokens inside
 * one sequence run fully unrolled (window shifts become renames). The sequence of the range's
 * first token is found once by binary search and later ones by walking cu_seqlens. Same
 * summation order as the generic kernel (one thread per (token, channel)), which every other
 * view takes; the fast path's SiLU uses ex2/rcp.approx.ftz (see silu_fast). The cu_seqlens/slot
 * check is one kernel whose device flag gates the kernels here, with the op's one
 * synchronisation last. The fast path rewrites the states itself: range boundaries never fall
 * inside the first W-1 tokens of a sequence (conv_bound), so the block owning a sequence's first
 * token is the only reader of its old state and writes the new one right after (conv_new_state).
 * What it is not: fused with the projections; the fused decode step (kda.cu) has its own copy of
 * the step for the K3 shapes.
 * Invariants (k3k.h): state[slot][c][j] = x_{start-W+1+j}, oldest first; after the outputs the
 * slot holds the last W-1 raw inputs (from the old state when the sequence is shorter); a
 * sequence of length 0 keeps its state. Generic path: the outputs are computed by one kernel and
 * the states rewritten by a second one queued after it, so no thread reads a state another has
 * replaced; fast path: one kernel (above). */
#include <stdlib.h>

#include "cuda_common.cuh"
#include "mma_sm80.cuh" /* cp_async16 */

#define CONV_MAXW 8

__device__ __forceinline__ float silu_f(float a) { return a / (1.0f + expf(-a)); }

/* The last sequence s with cu[s] <= t (so empty sequences are skipped; for cu[0] <= t < cu[nseq]
 * it is the non-empty sequence holding t). */
__device__ __forceinline__ int conv_seq_of(const int32_t *cu, int nseq, int64_t t) {
  int lo = 0, hi = nseq - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__global__ void conv_prefill_kernel(dv x, dv w, const int32_t *cu, const int32_t *slots,
                                    int nseq, dv st, dv y, int64_t T, int64_t c_total,
                                    int width, int read_state, int act, const unsigned *bad) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= c_total || (bad && *bad)) return;
  const int64_t t_lo = cu[0], t_hi = cu[nseq]; /* rows outside every sequence: not written */
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) { /* T may exceed the grid's 65535 rows */
    if (t < t_lo || t >= t_hi) continue;
    const int lo = conv_seq_of(cu, nseq, t);
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
                                  int64_t c_total, int width, int read_state,
                                  const unsigned *bad) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int s = blockIdx.y;
  if (c >= c_total || (bad && *bad)) return;
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

/* Fast path: a block of CONV_TPB threads owns 8 * CONV_TPB channels (a thread 8 channels, one
 * 16-byte chunk of a row) and one contiguous range of tokens, the grid a few waves (ranges of
 * ~T / G tokens, G = CONV_WAVES x the resident blocks / channel tiles), so every block streams
 * about the same bytes and the block scheduler evens out their different rates. Each thread
 * streams its chunk of every row through its own ring of CONV_D shared-memory slots with
 * cp.async (D - U rows in flight per thread, independent of the registers, which hold the
 * weights and the W-1 window); no thread reads another's slot, so there is no barrier. */
#define CONV_TPB 128
#define CONV_D 16

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

/* The fast path's state update, done by the block that owns the sequence's first token right
 * after it read the old state there (conv_window at t = start): entry j of the new state is
 * x_{end-W+1+j}, or for a sequence shorter than W-1 the old entry j + (end - start) (or 0
 * without read_state). Entries are rewritten in increasing j and entry j reads old entry
 * j + len > j, so every old value is read before it is replaced; no other block reads this slot
 * (conv_bound), so the update needs no second kernel. */
template <int W>
__device__ __forceinline__ void conv_new_state(const uint16_t *x, int64_t ldx, int64_t c,
                                               int64_t start, int64_t end, const dv &st,
                                               int64_t slot, int read_state) {
  const int64_t base = slot * st.s[0] + c * 8 * st.s[1];
#pragma unroll
  for (int j = 0; j < W - 1; j++) {
    const int64_t p = end - (W - 1) + j;
    float v[8];
    if (p >= start) {
      unpack8(((const bf16x8 *)(x + p * ldx))[c], v);
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++)
        v[k] = read_state ? dv_ld(st, base + k * st.s[1] + (j + (end - start)) * st.s[2]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) dv_st(st, base + k * st.s[1] + j * st.s[2], v[k]);
  }
}

/* A token range boundary of the fast path: a boundary that falls inside the first W-1 tokens of
 * a sequence moves back to the sequence's start, so the only block whose windows reach into a
 * sequence's old state is the one that owns its first token (it also writes the new state).
 * Monotone in t, and both blocks that share a boundary compute the same value. */
__device__ __forceinline__ int64_t conv_bound(const int32_t *cu, int nseq, int64_t t, int W) {
  if (t <= cu[0] || t >= cu[nseq]) return t;
  const int64_t start = cu[conv_seq_of(cu, nseq, t)];
  return t - start < W - 1 ? start : t;
}

/* SiLU a / (1 + e^-a) on the MUFU unit directly: ex2.approx.ftz and rcp.approx.ftz (~2 ulp in
 * fp32 each, like __expf / __fdividef, far below the BF16 output rounding and the F32
 * tolerance 1e-4), without the denormal-range fix-ups the non-ftz intrinsics add, which were a
 * large part of the fast path's instructions per element. a < -87: e = inf (or 1 + e past
 * 2^126), the reciprocal flushes to 0 and the result is -0 (silu's limit; the old __fdividef
 * form gave the same). */
__device__ __forceinline__ float silu_fast(float a) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(a * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return a * r;
}

/* One token of 8 channels: y = act(Σ_{j<W-1} w[j]·win[j] + w[W-1]·x), then the window moves
 * on by x. Same summation order as the generic kernel and the reference. */
template <int W, bool YF32, bool ACT>
__device__ __forceinline__ void conv_token(const float (&wr)[8][W], float (&win)[W - 1][8],
                                           const uint4 &raw, char *yp) {
  float xt[8], o[8];
  unpack8(*reinterpret_cast<const bf16x8 *>(&raw), xt);
#pragma unroll
  for (int k = 0; k < 8; k++) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < W - 1; j++) acc += wr[k][j] * win[j][k];
    acc += wr[k][W - 1] * xt[k];
    o[k] = ACT ? silu_fast(acc) : acc;
  }
#pragma unroll
  for (int j = 0; j + 1 < W - 1; j++)
#pragma unroll
    for (int k = 0; k < 8; k++) win[j][k] = win[j + 1][k];
#pragma unroll
  for (int k = 0; k < 8; k++) win[W - 2][k] = xt[k];
  if (YF32) {
    float4 *yr = (float4 *)yp;
    yr[0] = make_float4(o[0], o[1], o[2], o[3]);
    yr[1] = make_float4(o[4], o[5], o[6], o[7]);
  } else {
    *(bf16x8 *)yp = pack8(o);
  }
}

/* Tokens per step of the stream loop: a step waits for, reads and refills CONV_U ring slots
 * (one commit group) and, when its tokens lie inside one sequence (all but a few steps),
 * computes them fully unrolled, so the window shifts become register renames and the loop,
 * the sequence test and the address arithmetic are paid once per CONV_U tokens. */
#define CONV_U 4
#define CONV_WAVES 4 /* default waves of token ranges (conv_waves) */

/* wf: the weights as F32 [C][W] contiguous with a 16-byte aligned base (loaded as float4), or
 * NULL (then w through dv). bad: the metadata check's device flag (nothing written when set),
 * or NULL. */
template <int W, bool YF32, bool ACT>
__global__ void __launch_bounds__(CONV_TPB, W <= 4 ? 4 : W <= 6 ? 3 : 2)
    conv_prefill_vec_kernel(const uint16_t *x, int64_t ldx, dv w, const float *wf,
                            const int32_t *cu, const int32_t *slots, int nseq, dv st, void *y,
                            int64_t ldy, int64_t c8, int64_t T, int G, int read_state,
                            const unsigned *bad) {
  constexpr int U = CONV_U, D = CONV_D;
  __shared__ uint4 ring[D][CONV_TPB];
  if (bad && *bad) return;
  const int64_t c = blockIdx.x * (int64_t)CONV_TPB + threadIdx.x;
  const int64_t tb = conv_bound(cu, nseq, T * blockIdx.y / G, W),
                te = conv_bound(cu, nseq, T * (blockIdx.y + 1) / G, W), n = te - tb;
  if (c >= c8 || n <= 0) return;
  /* The first D rows go out before anything else, so the weight loads, the sequence
   * search and the window below run under their latency. xr: the next row to issue. */
  const uint16_t *xr = x + tb * ldx + c * 8;
#pragma unroll
  for (int g = 0; g < (D / U); g++) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int r = g * U + u;
      cp_async16(&ring[r][threadIdx.x], r < n ? xr : x, r < n);
      xr += ldx;
    }
    cp_async_commit();
  }
  float wr[8][W];
  if (wf) {
    const float4 *wp = (const float4 *)(wf + c * 8 * W);
#pragma unroll
    for (int q = 0; q < 2 * W; q++) {
      const float4 v = wp[q];
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int r = 0; r < 4; r++) wr[(4 * q + r) / W][(4 * q + r) % W] = e[r];
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
      for (int j = 0; j < W; j++) wr[k][j] = dv_ld(w, (c * 8 + k) * w.s[0] + j * w.s[1]);
  }
  /* Rows before cu[0] or from cu[n] on belong to no sequence: not written (as the reference). */
  const int64_t t_lo = cu[0] > tb ? cu[0] : tb, t_hi = cu[nseq] < te ? cu[nseq] : te;
  int s = conv_seq_of(cu, nseq, t_lo);
  int64_t start = cu[s], next = s + 1 < nseq ? cu[s + 1] : INT64_MAX;
  float win[W - 1][8];
  if (t_lo < t_hi) {
    conv_window<W>(win, x, ldx, c, t_lo, start, st, slots[s], read_state);
    if (t_lo == start) conv_new_state<W>(x, ldx, c, start, cu[s + 1], st, slots[s], read_state);
  }
  const int64_t ldyb = ldy * (YF32 ? 4 : 2);
  char *yp = (char *)y + tb * ldyb + c * (YF32 ? 32 : 16);
  for (int64_t i0 = 0; i0 < n; i0 += U, yp += U * ldyb) {
    const int64_t t0 = tb + i0;
    const int sb = (int)(i0 & (D - 1));
    cp_async_wait<(D / U) - 1>(); /* this thread's rows i0 .. i0 + U - 1 have landed */
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; u++) raw[u] = ring[sb + u][threadIdx.x];
    if (t0 >= t_lo && t0 + U <= t_hi && t0 + U <= next) {
#pragma unroll
      for (int u = 0; u < U; u++) conv_token<W, YF32, ACT>(wr, win, raw[u], yp + u * ldyb);
    } else { /* a range edge or a sequence start inside the step: token by token */
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t t = t0 + u;
        if (t < t_lo || t >= t_hi) continue;
        if (t >= next) { /* a new sequence starts here (empty ones skipped): state window */
          while (s + 1 < nseq && cu[s + 1] <= t) s++;
          start = cu[s];
          next = s + 1 < nseq ? cu[s + 1] : INT64_MAX;
          conv_window<W>(win, x, ldx, c, t, start, st, slots[s], read_state);
          conv_new_state<W>(x, ldx, c, start, cu[s + 1], st, slots[s], read_state);
        }
        conv_token<W, YF32, ACT>(wr, win, raw[u], yp + u * ldyb);
      }
    }
    /* Refill the step's slots with rows i0 + D ... Issued after the stores of y, which
     * depend on the slots' values (the asm's memory clobber keeps the order), so the reads
     * have completed before the asynchronous writes can land. */
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t r = i0 + D + u;
      cp_async16(&ring[sb + u][threadIdx.x], r < n ? xr : x, r < n);
      xr += ldx;
    }
    cp_async_commit();
  }
  cp_async_wait<0>();
}

static bool al16c(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Blocks of the kernel that fit on one SM (occupancy API, asked once per instance). */
template <int W, bool YF32, bool ACT>
static int conv_blocks_per_sm() {
  static int cached;
  if (!cached) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &b, conv_prefill_vec_kernel<W, YF32, ACT>, CONV_TPB, 0) != cudaSuccess ||
        b < 1)
      b = 1;
    cached = b;
  }
  return cached;
}

/* Waves of token ranges (the grid is this many times the resident blocks): blocks stream at
 * different rates, and with one wave the kernel waited for the slowest (achieved occupancy 12.8
 * of 16 warps per SM under ncu); with trusted ids 4 waves measured 112.9-113.0 us, 3 114-117,
 * 6 115-116, 8 120-121, one wave 125-133 us (H200, 2026-12-03). K3PD_CONV_WAVES (measurement
 * only, read once): 1 .. 8. */
static int conv_waves(void) {
  static int v = 0;
  if (!v) {
    const char *e = getenv("K3PD_CONV_WAVES");
    v = e && *e >= '1' && *e <= '8' ? *e - '0' : CONV_WAVES;
  }
  return v;
}

template <int W, bool YF32, bool ACT>
static void launch_conv_vec_t(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t,
                              const k3k_conv_params_t *p, const unsigned *bad) {
  const k3k_tensor_t *x = t[0], *w = t[1], *y = t[5];
  int64_t T = x->shape[0], c8 = x->shape[1] / 8;
  int64_t nct = k3k_ceil_div(c8, CONV_TPB);
  /* G token ranges per channel tile (conv_waves() waves), at least 16 tokens each. */
  int64_t slots_total = (int64_t)conv_blocks_per_sm<W, YF32, ACT>() *
                        (cx->num_sms > 0 ? cx->num_sms : 132);
  int64_t G = conv_waves() * slots_total / nct, gmax = (T + 15) / 16;
  if (G > gmax) G = gmax;
  if (G > 65535) G = 65535;
  if (G < 1) G = 1;
  const float *wf = w->dtype == K3K_F32 && w->stride[1] == 1 && w->stride[0] == W && al16c(w->data)
                        ? (const float *)w->data
                        : NULL;
  conv_prefill_vec_kernel<W, YF32, ACT>
      <<<dim3((unsigned)nct, (unsigned)G), CONV_TPB, 0, cx->stream>>>(
          (const uint16_t *)x->data, x->stride[0], mkdv(w), wf, (const int32_t *)t[2]->data,
          (const int32_t *)t[3]->data, p->n_seqs, mkdv(t[4]), y->data, y->stride[0], c8, T,
          (int)G, p->read_state, bad);
}

template <int W>
static void launch_conv_vec(k3k_cuda_ctx *cx, const k3k_tensor_t *const *t,
                            const k3k_conv_params_t *p, const unsigned *bad) {
  const bool f32 = t[5]->dtype == K3K_F32;
  if (p->activation)
    f32 ? launch_conv_vec_t<W, true, true>(cx, t, p, bad)
        : launch_conv_vec_t<W, false, true>(cx, t, p, bad);
  else
    f32 ? launch_conv_vec_t<W, true, false>(cx, t, p, bad)
        : launch_conv_vec_t<W, false, false>(cx, t, p, bad);
}

int k3k_cuda_conv_prefill(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_conv_params_t *p = (const k3k_conv_params_t *)params;
  const k3k_tensor_t *x = t[0], *w = t[1], *cu = t[2], *sl = t[3], *st = t[4], *y = t[5];
  int64_t T = x->shape[0], C = x->shape[1];
  int width = (int)w->shape[1];
  if (p->n_seqs == 0 || C == 0) return 0;
  /* cu_seqlens and slots (range, uniqueness) are checked on the device; the kernels below
   * write nothing when the check's flag is set, and the one synchronisation (reading the flag
   * back for the return code) comes after them. */
  unsigned *bad = NULL;
  int rc = k3k_cuda_check_seqs_slots_begin(cx, t[2], t[3], p->n_seqs, T, t[4]->shape[0], &bad);
  if (rc) return rc;
  bool vec = x->dtype == K3K_BF16 && C % 8 == 0 && width >= 2 && width <= CONV_MAXW &&
             x->stride[1] == 1 && y->stride[1] == 1 && cu->stride[0] == 1 &&
             sl->stride[0] == 1 && al16c(x->data) && al16c(y->data) &&
             (x->stride[0] * 2) % 16 == 0 &&
             (y->stride[0] * (int64_t)k3k_dtype_size(y->dtype)) % 16 == 0;
  if (T > 0 && vec) {
    switch (width) {
      case 2: launch_conv_vec<2>(cx, t, p, bad); break;
      case 3: launch_conv_vec<3>(cx, t, p, bad); break;
      case 4: launch_conv_vec<4>(cx, t, p, bad); break;
      case 5: launch_conv_vec<5>(cx, t, p, bad); break;
      case 6: launch_conv_vec<6>(cx, t, p, bad); break;
      case 7: launch_conv_vec<7>(cx, t, p, bad); break;
      default: launch_conv_vec<8>(cx, t, p, bad); break;
    }
    K3K_LAUNCHED("conv_prefill");
  } else if (T > 0) {
    conv_prefill_kernel<<<dim3(k3k_ceil_div(C, 256), (unsigned)(T < 65535 ? T : 65535)), 256, 0,
                          cx->stream>>>(
        mkdv(x), mkdv(w), (const int32_t *)cu->data, (const int32_t *)sl->data, p->n_seqs,
        mkdv(st), mkdv(y), T, C, width, p->read_state, p->activation, bad);
    K3K_LAUNCHED("conv_prefill");
  }
  if (!(T > 0 && vec)) { /* the fast path rewrites the states itself (conv_new_state) */
    conv_state_kernel<<<dim3(k3k_ceil_div(C, 256), (unsigned)p->n_seqs), 256, 0, cx->stream>>>(
        mkdv(x), (const int32_t *)cu->data, (const int32_t *)sl->data, mkdv(st), C, width,
        p->read_state, bad);
    K3K_LAUNCHED("conv_state");
  }
  return k3k_cuda_check_end(cx, bad);
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
