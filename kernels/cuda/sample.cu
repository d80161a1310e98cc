/* CUDA: SAMPLE (greedy / temperature / top-k / top-p with per-request seeds).
 *
 * What it is for: k3k.h defines the sampled token as a pure function of (logits row, config,
 * seed, step), identical on every backend. Greedy rows are an argmax on the device (NaN counts
 * as -inf, -0 equals +0, lowest index on ties: exactly the reference rule), split over several
 * blocks per row (about 8 blocks per SM in all) whose (value, index) keys a second small kernel
 * reduces; a batch of greedy rows writes the ids on the device and does not synchronise. Rows
 * that draw copy
 * their logits (fp32, 640 KiB per row at V = 163,840) to pinned host memory and run the
 * reference k3k_sample_row(), so the sort, the top-p prefix and the fp32 running sums are the
 * reference's own code: bit-identical by construction.
 * What it is not: a device sort. At decode batch 64 the copy is ~42 MB (~1 ms over PCIe); a
 * device top-k/top-p with the same total order is the next step if sampling shows in profiles.
 * Synchronises the stream when some row draws (the host needs the logits). */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* Argmax as a max over 64-bit keys: the high word orders the cleaned value (NaN -> -inf,
 * -0 -> +0) as an unsigned integer, the low word is ~index so equal values prefer the lower
 * index. Every real key is > 0 (the key of -inf at the last index is 0x007FFFFF...). */
__device__ __forceinline__ uint64_t am_key(float x, int64_t i) {
  if (x != x) x = -INFINITY;
  if (x == 0.0f) x = 0.0f;
  uint32_t u = __float_as_uint(x);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((uint64_t)u << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)i);
}
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t ok = __shfl_xor_sync(0xffffffffu, k, o);
    k = ok > k ? ok : k;
  }
  return k;
}

/* Pass 1: block (part, r) reduces columns [part*chunk, (part+1)*chunk) of row r to one key.
 * VEC: contiguous F32 row, 16-byte aligned, chunk % 4 == 0 (float4 loads, 8 in flight). */
template <bool VEC>
__global__ void __launch_bounds__(256)
    argmax_part_kernel(dv logits, int64_t v, int64_t chunk, uint64_t *part_keys) {
  __shared__ uint64_t wk[8];
  int64_t r = blockIdx.y, c0 = blockIdx.x * chunk, c1 = c0 + chunk < v ? c0 + chunk : v;
  uint64_t best = 0;
  if (VEC) {
    const float *row = (const float *)logits.p + r * logits.s[0];
    int64_t n4 = (c1 - c0) / 4;
    const float4 *p4 = (const float4 *)(row + c0);
    int64_t i = threadIdx.x;
    for (; i + 7 * 256 < n4; i += 8 * 256) {
      float4 q[8];
#pragma unroll
      for (int u = 0; u < 8; u++) q[u] = p4[i + u * 256];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        int64_t b = c0 + 4 * (i + u * 256);
        uint64_t k = am_key(q[u].x, b);
        uint64_t k1 = am_key(q[u].y, b + 1), k2 = am_key(q[u].z, b + 2), k3 = am_key(q[u].w, b + 3);
        k = k1 > k ? k1 : k;
        k = k2 > k ? k2 : k;
        k = k3 > k ? k3 : k;
        best = k > best ? k : best;
      }
    }
    for (; i < n4; i += 256) {
      float4 q = p4[i];
      int64_t b = c0 + 4 * i;
      uint64_t k = am_key(q.x, b), k1 = am_key(q.y, b + 1), k2 = am_key(q.z, b + 2),
               k3 = am_key(q.w, b + 3);
      k = k1 > k ? k1 : k;
      k = k2 > k ? k2 : k;
      k = k3 > k ? k3 : k;
      best = k > best ? k : best;
    }
    for (int64_t j = c0 + 4 * n4 + threadIdx.x; j < c1; j += 256) { /* tail of the last part */
      uint64_t k = am_key(row[j], j);
      best = k > best ? k : best;
    }
  } else {
    for (int64_t j = c0 + threadIdx.x; j < c1; j += 256) {
      uint64_t k = am_key(dv_ld(logits, r * logits.s[0] + j * logits.s[1]), j);
      best = k > best ? k : best;
    }
  }
  best = warp_max_u64(best);
  if ((threadIdx.x & 31) == 0) wk[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    uint64_t k = threadIdx.x < 8 ? wk[threadIdx.x] : 0;
    k = warp_max_u64(k);
    if (threadIdx.x == 0) part_keys[r * gridDim.x + blockIdx.x] = k;
  }
}

/* Pass 2: one warp per row reduces its parts' keys and writes the id (stride in elements). */
__global__ void argmax_final_kernel(const uint64_t *part_keys, int nparts, int64_t n,
                                    int32_t *ids, int64_t ld) {
  int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (r >= n) return; /* whole warps leave together */
  uint64_t k = 0;
  for (int i = lane; i < nparts; i += 32) {
    uint64_t q = part_keys[r * nparts + i];
    k = q > k ? q : k;
  }
  k = warp_max_u64(k);
  if (lane == 0) ids[r * ld] = k ? (int32_t)(0xFFFFFFFFu - (uint32_t)k) : 0;
}

/* Greedy ids of all N rows into ids[r * ld] (device), no synchronisation. */
static int argmax_rows(k3k_cuda_ctx *cx, const k3k_tensor_t *lg, int32_t *ids, int64_t ld,
                       uint64_t *part_keys, int nparts, int64_t chunk) {
  int64_t N = lg->shape[0], V = lg->shape[1];
  bool vec = lg->dtype == K3K_F32 && lg->stride[1] == 1 && lg->stride[0] % 4 == 0 &&
             ((uintptr_t)lg->data & 15) == 0 && chunk % 4 == 0;
  dim3 grid((unsigned)nparts, (unsigned)N);
  if (vec)
    argmax_part_kernel<true><<<grid, 256, 0, cx->stream>>>(mkdv(lg), V, chunk, part_keys);
  else
    argmax_part_kernel<false><<<grid, 256, 0, cx->stream>>>(mkdv(lg), V, chunk, part_keys);
  K3K_LAUNCHED("argmax_part");
  argmax_final_kernel<<<k3k_ceil_div(N, 8), 256, 0, cx->stream>>>(part_keys, nparts, N, ids, ld);
  K3K_LAUNCHED("argmax_final");
  return 0;
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
  /* Parts per row: about 8 blocks per SM over the batch, each part >= 2048 columns. */
  int64_t nparts = (8 * (int64_t)cx->num_sms + N - 1) / N;
  int64_t maxp = (V + 2047) / 2048;
  if (nparts > maxp) nparts = maxp;
  if (nparts < 1) nparts = 1;
  int64_t chunk = ((V + nparts - 1) / nparts + 3) & ~(int64_t)3;
  nparts = (V + chunk - 1) / chunk;
  size_t row_bytes = (size_t)V * sizeof(float);
  size_t keys_bytes = ((size_t)(N * nparts) * sizeof(uint64_t) + 255) & ~(size_t)255;
  size_t ids_bytes = (N * sizeof(int32_t) + 255) & ~(size_t)255;
  char *dev;
  int rc = k3k_cuda_scratch(cx, keys_bytes + ids_bytes + (size_t)n_draw * row_bytes,
                            (void **)&dev);
  if (rc) return rc;
  uint64_t *d_keys = (uint64_t *)dev;
  int32_t *d_greedy = (int32_t *)(dev + keys_bytes);
  float *d_rows = (float *)(dev + keys_bytes + ids_bytes);
  if (n_draw == 0) /* all greedy: ids written on the device, nothing comes back */
    return argmax_rows(cx, lg, (int32_t *)ids->data, ids->stride[0], d_keys, (int)nparts, chunk);

  char *host;
  rc = k3k_cuda_host_scratch(cx, N * sizeof(int32_t) * 2 + 256 + (size_t)n_draw * row_bytes,
                             (void **)&host);
  if (rc) return rc;
  int32_t *h_ids = (int32_t *)host;
  float *h_rows = (float *)(host + ((N * sizeof(int32_t) * 2 + 255) & ~(size_t)255));
  if ((rc = argmax_rows(cx, lg, d_greedy, 1, d_keys, (int)nparts, chunk))) return rc;
  int k = 0;
  for (int64_t r = 0; r < N; r++) {
    if (is_greedy(&p->rows[r])) continue;
    row_to_f32_kernel<<<160, 256, 0, cx->stream>>>(mkdv(lg), r, V, d_rows + (size_t)k * V);
    K3K_LAUNCHED("row_to_f32");
    k++;
  }
  K3K_CU(cudaMemcpyAsync(h_ids, d_greedy, N * sizeof(int32_t), cudaMemcpyDeviceToHost,
                         cx->stream));
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
