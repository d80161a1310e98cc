/* MoE plumbing on CUDA: the device-side MoE plan (k3k_moe_plan on the GPU) and MOE_COMBINE.
 *
 * What it is for: running a MoE block with no host round trip. The plan groups the router's
 * (token, choice) pairs by expert exactly like k3k_moe_plan (by expert, then token, then
 * choice), so grouped-row numbers equal the host plan's and results do not depend on who
 * planned. The combine is the fp32 weighted sum of spec §5.4 with one rounding.
 * What it is not: the expert GEMMs (mxfp4.cu) or the router (router.cu).
 * Plan algorithm (deterministic, no atomics on the order): tokens are cut into chunks of
 * PLAN_CHUNK; pass 1 counts rows per (chunk, expert); pass 2 (one block) turns the counts into
 * expert_off, per-(chunk, expert) bases and the active-expert list; pass 3 walks each chunk's
 * (token, choice) pairs in order, 32 at a time, and hands out rows. Combine: one block per
 * token, 16-byte loads when rows and y are contiguous BF16 with D % 8 == 0; that fast kernel issues all of a thread's row loads
 * before the first use and is launched with PDL (pdl.cuh). */
#include "cuda_common.cuh"
#include "pdl.cuh"
#include "moe_ops.h"

#define PLAN_CHUNK 128

size_t k3k_cu_moe_plan_scratch(int32_t T, int32_t E) {
  size_t nch = ((size_t)T + PLAN_CHUNK - 1) / PLAN_CHUNK;
  return (nch ? nch : 1) * (size_t)E * sizeof(int32_t);
}

__global__ void plan_count(const int32_t *idx, int T, int k, int E, int32_t *cnt, int *bad) {
  extern __shared__ int32_t c[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) c[e] = 0;
  __syncthreads();
  int t0 = blockIdx.x * PLAN_CHUNK, t1 = min(T, t0 + PLAN_CHUNK);
  for (int p = t0 * k + threadIdx.x; p < t1 * k; p += blockDim.x) {
    int e = idx[p];
    if (e < 0 || e >= E) {
      if (bad) *bad = 1;
      continue;
    }
    atomicAdd(&c[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[(size_t)blockIdx.x * E + e] = c[e];
}

/* One block of 1024: per expert, chunk bases (in place over cnt) and totals; then expert_off
 * and the active list by two block scans over E. */
__global__ void __launch_bounds__(1024)
    plan_scan(int32_t *cnt, int nch, int E, int32_t *expert_off, int32_t *active) {
  __shared__ int tmp[32];
  int run_rows = 0, run_act = 0;
  for (int e0 = 0; e0 < E; e0 += 1024) {
    int e = e0 + threadIdx.x, tot = 0;
    if (e < E)
      for (int c = 0; c < nch; c++) {
        int v = cnt[(size_t)c * E + e];
        cnt[(size_t)c * E + e] = tot; /* exclusive within the expert */
        tot += v;
      }
    int sum_rows, sum_act;
    int off = block_excl_scan_w<32>(tot, tmp, &sum_rows);
    int a = block_excl_scan_w<32>(tot > 0, tmp, &sum_act);
    if (e < E) {
      expert_off[e] = run_rows + off;
      for (int c = 0; c < nch; c++) cnt[(size_t)c * E + e] += run_rows + off;
      if (tot > 0) active[1 + run_act + a] = e;
    }
    run_rows += sum_rows;
    run_act += sum_act;
  }
  if (threadIdx.x == 0) {
    expert_off[E] = run_rows;
    active[0] = run_act;
  }
}

/* Per chunk, warp 0 walks the chunk's (token, choice) pairs in flat order p = t·k + i, which is
 * the plan's order within an expert, 32 at a time: a pair's row is pos[e] + the number of pairs
 * of the same expert on lower lanes, and the highest such pair moves pos[e] on. The lanes of one
 * expert find each other by one ballot per bit of the expert id (ceil(log2 E) ballots: a fixed
 * cost; __match_any_sync iterates over the distinct values and made this kernel 14.8 µs at
 * T = 64, k = 16, E = 256 under ncu, and a lane comparing itself with the 32 staged ids 24.8 µs).
 * The pairs are staged in shared memory by the whole block first (PLAN_STAGE at a time), so the
 * walk never waits on a global load. Deterministic for any ids, repeated experts in one token
 * included. (Before session 17: one token per step, a shared atomic per choice and the ids read
 * from global memory on the way.) */
#define PLAN_STAGE 2048
__global__ void plan_assign(const int32_t *idx, int T, int k, int E, const int32_t *base,
                            int32_t *gather_tok, int32_t *row_idx) {
  extern __shared__ int32_t pos[]; /* [E], then the staged ids [PLAN_STAGE] */
  int32_t *sid = pos + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) pos[e] = base[(size_t)blockIdx.x * E + e];
  const int t0 = blockIdx.x * PLAN_CHUNK;
  const int n_all = (min(T, t0 + PLAN_CHUNK) - t0) * k; /* pairs of this chunk (< 2^21) */
  const int32_t *cidx = idx + (int64_t)t0 * k;
  int32_t *cri = row_idx + (int64_t)t0 * k;
  const int lane = threadIdx.x & 31, nbits = E > 1 ? 32 - __clz(E - 1) : 0;
  for (int s0 = 0; s0 < n_all; s0 += PLAN_STAGE) {
    const int n = min(PLAN_STAGE, n_all - s0);
    __syncthreads(); /* pos written / the previous stage walked */
    for (int j = threadIdx.x; j < n; j += blockDim.x) sid[j] = cidx[s0 + j];
    __syncthreads();
    if (threadIdx.x >= 32) continue;
    for (int j0 = 0; j0 < n; j0 += 32) {
      const int j = j0 + lane;
      const int e = j < n ? sid[j] : -1;
      const bool ok = e >= 0 && e < E;
      unsigned peers = __ballot_sync(0xffffffffu, ok); /* then: same id on every bit */
      for (int bit = 0; bit < nbits; bit++) {
        const bool on = (e >> bit) & 1;
        const unsigned m = __ballot_sync(0xffffffffu, on);
        peers &= on ? m : ~m;
      }
      int r = -1;
      if (ok) {
        r = pos[e] + __popc(peers & ((1u << lane) - 1u));
        gather_tok[r] = t0 + (s0 + j) / k;
      }
      __syncwarp();
      if (ok && (peers >> lane) == 1u) pos[e] = r + 1; /* the highest lane of its expert */
      __syncwarp();
      if (j < n) cri[s0 + j] = r;
    }
  }
}

int k3k_cu_moe_plan(cudaStream_t st, const int32_t *idx, int32_t T, int32_t k, int32_t E,
                    int32_t *expert_off, int32_t *gather_tok, int32_t *row_idx, int32_t *active,
                    int *bad, void *scratch) {
  if (E <= 0 || E > 8192 || k <= 0 || T < 0) return K3_EINVAL;
  int nch = (int)((T + PLAN_CHUNK - 1) / PLAN_CHUNK);
  int32_t *cnt = (int32_t *)scratch;
  size_t smem = (size_t)E * 4;
  if (nch > 0) {
    plan_count<<<nch, 256, smem, st>>>(idx, T, k, E, cnt, bad);
    K3K_LAUNCHED("moe_plan_count");
  }
  plan_scan<<<1, 1024, 0, st>>>(cnt, nch, E, expert_off, active);
  K3K_LAUNCHED("moe_plan_scan");
  if (nch > 0) {
    const size_t smem_a = smem + PLAN_STAGE * sizeof(int32_t); /* <= 40 KB at E = 8192 */
    plan_assign<<<nch, 256, smem_a, st>>>(idx, T, k, E, cnt, gather_tok, row_idx);
    K3K_LAUNCHED("moe_plan_assign");
  }
  return 0;
}

/* ---- MOE_COMBINE ---- */
__global__ void combine_kernel(dv rows, int64_t nrows, const int32_t *ri, int64_t ld_ri,
                               const float *w, int64_t ld_w, int k, dv y, int64_t D, int *bad) {
  int64_t t = blockIdx.y;
  for (int64_t d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; d < D;
       d += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < k; i++) {
      int r = ri[t * ld_ri + i];
      if (r < 0 || r >= nrows) {
        if (r != -1 && bad) *bad = 1;
        continue;
      }
      acc += w[t * ld_w + i] * dv_ld(rows, r * rows.s[0] + d * rows.s[1]);
    }
    dv_st(y, t * y.s[0] + d * y.s[1], acc);
  }
}

/* A thread's k (<= CB at a time) rows are all requested before the first is used: the
 * indices and weights in one round trip, then the rows in one (it used to be k dependent
 * round trips: ~9.5 µs at k = 16). Accumulation order unchanged (i = 0..k-1). */
#define COMBINE_CB 16
__global__ void __launch_bounds__(128)
    combine_vec_kernel(const bf16x8 *rows, int64_t ld8, int64_t nrows, const int32_t *ri,
                       int64_t ld_ri, const float *w, int64_t ld_w, int k, bf16x8 *y,
                       int64_t ldy8, int64_t D8, int *bad) {
  pdl_wait(); /* launched with PDL (pdl.cuh): rows, ri and w are earlier kernels' outputs */
  pdl_trigger();
  int64_t t = blockIdx.y;
  for (int64_t d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; d < D8;
       d += (int64_t)gridDim.x * blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i0 = 0; i0 < k; i0 += COMBINE_CB) {
      int r[COMBINE_CB];
      float wi[COMBINE_CB];
      bf16x8 v[COMBINE_CB];
#pragma unroll
      for (int j = 0; j < COMBINE_CB; j++) {
        r[j] = i0 + j < k ? ri[t * ld_ri + i0 + j] : -1;
        wi[j] = i0 + j < k ? w[t * ld_w + i0 + j] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < COMBINE_CB; j++)
        if (r[j] >= 0 && r[j] < nrows) v[j] = rows[r[j] * ld8 + d];
#pragma unroll
      for (int j = 0; j < COMBINE_CB; j++) {
        if (i0 + j >= k) break;
        if (r[j] < 0 || r[j] >= nrows) {
          if (r[j] != -1 && bad) *bad = 1;
          continue;
        }
        float f[8];
        unpack8(v[j], f);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] += wi[j] * f[e];
      }
    }
    y[t * ldy8 + d] = pack8(acc);
  }
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int k3k_cu_moe_combine_raw(cudaStream_t st, const k3k_tensor_t *rows, const k3k_tensor_t *ri,
                           const k3k_tensor_t *w, const k3k_tensor_t *y, int *bad) {
  int64_t T = ri->shape[0], k = ri->shape[1], D = rows->shape[1], R = rows->shape[0];
  if (T == 0 || D == 0) return 0;
  if (T > 65535 * 64) return K3_EINVAL;
  if (ri->stride[1] != 1 || w->stride[1] != 1) return K3_EINVAL;
  bool vec = rows->dtype == K3K_BF16 && y->dtype == K3K_BF16 && rows->stride[1] == 1 &&
             y->stride[1] == 1 && D % 8 == 0 && rows->stride[0] % 8 == 0 &&
             y->stride[0] % 8 == 0 && al16(rows->data) && al16(y->data);
  int64_t work = vec ? D / 8 : D;
  unsigned gx = k3k_ceil_div((size_t)work, 128);
  /* rows of y in grid.y (<= 65535), split in launches beyond that */
  for (int64_t t0 = 0; t0 < T; t0 += 65535) {
    int64_t nt = T - t0 < 65535 ? T - t0 : 65535;
    dim3 grid(gx, (unsigned)nt);
    const int32_t *rip = (const int32_t *)ri->data + t0 * ri->stride[0];
    const float *wp = (const float *)w->data + t0 * w->stride[0];
    if (vec) {
      K3K_CU(pdl_launch(combine_vec_kernel, grid, dim3(128), 0, st, (const bf16x8 *)rows->data,
                        rows->stride[0] / 8, R, rip, ri->stride[0], wp, w->stride[0], (int)k,
                        (bf16x8 *)((uint16_t *)y->data + t0 * y->stride[0]), y->stride[0] / 8,
                        D / 8, bad));
    } else {
      dv yv = mkdv(y);
      yv.p += t0 * y->stride[0] * (int64_t)k3k_dtype_size(y->dtype);
      combine_kernel<<<grid, 128, 0, st>>>(mkdv(rows), R, rip, ri->stride[0], wp, w->stride[0],
                                           (int)k, yv, D, bad);
    }
    K3K_LAUNCHED("moe_combine");
  }
  return 0;
}

int k3k_cuda_moe_combine(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  if (t[1]->shape[0] == 0 || t[0]->shape[1] == 0) return 0;
  /* "A failing op writes nothing" (k3k.h): validate every row index (−1 = skip) before the
   * combine kernel touches y. One view over the whole [T,k] table when it is contiguous, else
   * one per token row. */
  const k3k_tensor_t *ri = t[1];
  int64_t T = ri->shape[0], K = ri->shape[1], Rx = t[0]->shape[0];
  int crc = 0;
  if (ri->stride[1] == 1 && ri->stride[0] == K) {
    k3k_tensor_t flat = *ri;
    flat.ndim = 1;
    flat.shape[0] = T * K;
    flat.stride[0] = 1;
    crc = k3k_cuda_check_ids(cx, &flat, T * K, Rx, 0, 1);
  } else {
    for (int64_t r = 0; r < T && !crc; r++) {
      k3k_tensor_t row = *ri;
      row.ndim = 1;
      row.data = (char *)ri->data + (size_t)(r * ri->stride[0]) * sizeof(int32_t);
      row.shape[0] = K;
      row.stride[0] = ri->stride[1];
      crc = k3k_cuda_check_ids(cx, &row, K, Rx, 0, 1);
    }
  }
  if (crc) return crc;
  void *flag;
  int rc = k3k_cuda_scratch(cx, sizeof(int), &flag);
  if (rc) return rc;
  K3K_CU(cudaMemsetAsync(flag, 0, sizeof(int), cx->stream));
  rc = k3k_cu_moe_combine_raw(cx->stream, t[0], t[1], t[2], t[3], (int *)flag);
  if (rc) return rc == K3_EINVAL ? K3_EDEVICE : rc;
  int bad = 0;
  K3K_CU(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  return bad ? K3_ERANGE : 0;
}
