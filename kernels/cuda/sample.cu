/* CUDA: SAMPLE (greedy / temperature / top-k / top-p with per-request seeds).
 *
 * What it is for: k3k.h defines the sampled token as a pure function of (logits row, config,
 * seed, step), identical on every backend. Greedy rows are an argmax on the device (lowest index
 * on ties, exactly the reference rule) and only 4 bytes per row come back. Rows that draw copy
 * their logits (fp32, 640 KiB per row at V = 163,840) to pinned host memory and run the
 * reference k3k_sample_row(), so the sort, the top-p prefix and the fp32 running sums are the
 * reference's own code: bit-identical by construction.
 * What it is not: a device sort. At decode batch 64 the copy is ~42 MB (~1 ms over PCIe); a
 * device top-k/top-p with the same total order is the next step if sampling shows in profiles.
 * Synchronises the stream (the host needs the logits). */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* One block per row: argmax with the lowest index on ties. NaN logits never win (the reference's
 * strict ">" comparison does the same). */
__global__ void argmax_kernel(dv logits, int64_t v, int32_t *out) {
  __shared__ float bv[32];
  __shared__ int32_t bi[32];
  int64_t r = blockIdx.x;
  float best = -INFINITY;
  int32_t idx = -1;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    float x = dv_ld(logits, r * logits.s[0] + j * logits.s[1]);
    if (x > best || idx < 0) {
      if (idx < 0 || x > best) {
        best = x;
        idx = (int32_t)j;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ob = __shfl_xor_sync(0xffffffffu, best, o);
    int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (oi >= 0 && (idx < 0 || ob > best || (ob == best && oi < idx))) {
      best = ob;
      idx = oi;
    }
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
    bv[w] = best;
    bi[w] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < (int)(blockDim.x >> 5); i++)
      if (bi[i] >= 0 && (idx < 0 || bv[i] > best || (bv[i] == best && bi[i] < idx))) {
        best = bv[i];
        idx = bi[i];
      }
    out[r] = idx < 0 ? 0 : idx;
  }
}

/* Row r of logits as fp32, contiguous, into dst (device). */
__global__ void row_to_f32_kernel(dv logits, int64_t r, int64_t v, float *dst) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < v;
       j += (int64_t)gridDim.x * blockDim.x)
    dst[j] = dv_ld(logits, r * logits.s[0] + j * logits.s[1]);
}

static bool is_greedy(const k3k_sample_cfg_t *c) { return c->temperature <= 0.0f || c->top_k == 1; }

int k3k_cuda_sample(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_sample_params_t *p = (const k3k_sample_params_t *)params;
  const k3k_tensor_t *lg = t[0], *ids = t[1];
  int64_t N = lg->shape[0], V = lg->shape[1];
  if (N == 0) return 0;
  int n_draw = 0;
  for (int64_t r = 0; r < N; r++) n_draw += !is_greedy(&p->rows[r]);
  size_t row_bytes = (size_t)V * sizeof(float);
  char *dev;
  int rc = k3k_cuda_scratch(cx, N * sizeof(int32_t) + 256 + (size_t)n_draw * row_bytes,
                            (void **)&dev);
  if (rc) return rc;
  int32_t *d_greedy = (int32_t *)dev;
  float *d_rows = (float *)(dev + ((N * sizeof(int32_t) + 255) & ~(size_t)255));
  char *host;
  rc = k3k_cuda_host_scratch(cx, N * sizeof(int32_t) * 2 + 256 + (size_t)n_draw * row_bytes,
                             (void **)&host);
  if (rc) return rc;
  int32_t *h_ids = (int32_t *)host;
  float *h_rows = (float *)(host + ((N * sizeof(int32_t) * 2 + 255) & ~(size_t)255));

  argmax_kernel<<<(unsigned)N, 1024, 0, cx->stream>>>(mkdv(lg), V, d_greedy);
  K3K_LAUNCHED("argmax");
  int k = 0;
  for (int64_t r = 0; r < N; r++) {
    if (is_greedy(&p->rows[r])) continue;
    row_to_f32_kernel<<<160, 256, 0, cx->stream>>>(mkdv(lg), r, V, d_rows + (size_t)k * V);
    K3K_LAUNCHED("row_to_f32");
    k++;
  }
  K3K_CU(cudaMemcpyAsync(h_ids, d_greedy, N * sizeof(int32_t), cudaMemcpyDeviceToHost,
                         cx->stream));
  if (n_draw)
    K3K_CU(cudaMemcpyAsync(h_rows, d_rows, (size_t)n_draw * row_bytes, cudaMemcpyDeviceToHost,
                           cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  k = 0;
  for (int64_t r = 0; r < N; r++) {
    if (is_greedy(&p->rows[r])) continue;
    rc = k3k_sample_row(h_rows + (size_t)k * V, V, &p->rows[r], &h_ids[r]);
    if (rc) return rc;
    k++;
  }
  /* ids may be strided: write each through a 2-D copy (width 4 bytes, pitch = stride). */
  K3K_CU(cudaMemcpy2DAsync(ids->data, ids->stride[0] * sizeof(int32_t), h_ids, sizeof(int32_t),
                           sizeof(int32_t), N, cudaMemcpyHostToDevice, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream)); /* h_ids is reused by the next call */
  return 0;
}
