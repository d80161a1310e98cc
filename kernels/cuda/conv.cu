/* CUDA: CONV_PREFILL and CONV_STEP, the KDA causal depthwise short conv (+ SiLU), spec §3.2.
 *
 * What it is for: packed ragged sequences (cu_seqlens) with a per-sequence state slot, and the
 * one-token decode update. One thread per (token, channel); W (kernel width) <= 8.
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
                                    int nseq, dv st, dv y, int64_t c_total, int width,
                                    int read_state, int act) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t t = blockIdx.y;
  if (c >= c_total) return;
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
  if (T > 0) {
    conv_prefill_kernel<<<dim3(k3k_ceil_div(C, 256), (unsigned)T), 256, 0, cx->stream>>>(
        mkdv(x), mkdv(w), (const int32_t *)cu->data, (const int32_t *)sl->data, p->n_seqs,
        mkdv(st), mkdv(y), C, width, p->read_state, p->activation);
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
