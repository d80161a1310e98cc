/* CUDA: validation of device-resident metadata (slot ids, cu_seqlens, page tables) before an op
 * writes anything.
 *
 * What it is for: k3k.h lets metadata tensors live on the device, so the host cannot check them
 * without a copy. Ops whose kernels would index state pools or pages with these ids call one of
 * these first; each launches one small kernel, copies a result word back and synchronises the
 * stream once, then returns K3_ERANGE (id out of range, cu_seqlens not monotone or past T) or
 * K3_EINVAL (duplicate slot: two sequences would race on one state) exactly like the CPU
 * reference (kernels/cpu/cpu_backend.c k3k_cpu_check_slots / k3k_cpu_check_seqs), so "on error
 * nothing changed" holds on the GPU too.
 * k3k_cuda_check_seqs_slots_begin/_end split a check from its synchronisation: the op queues
 * its kernels between the two, gated on the device flag, so its one synchronisation comes after
 * the work instead of a GPU-idle round trip before it (CONV_PREFILL; two checks, one sync).
 * What it is not: free. One synchronisation per call (~10-20 µs of latency), paid by every op
 * that calls it (KDA_CHUNK, CONV_PREFILL, CONV_STEP, KDA_STEP, MLA_DECODE, GET_ROWS). The raw fused
 * decode entry (k3k_cu_kda_decode) does not call it; it skips out-of-range slots in the kernel.
 * Trusted ids: a caller that builds the metadata itself and validated it on the host (the
 * model runner) turns ctx->trusted_ids on for its pass (k3k_cuda_set_trusted_ids); every check
 * here then returns 0 without a launch or a synchronisation, so the decode step has no host
 * round trip and can be captured in a CUDA graph. Everyone else (tests, the parity suite's
 * bad-id cases, any other caller) leaves it off and gets the checks.
 * Invariants: uses ctx scratch (bitmap for uniqueness); never writes the checked tensors. */
#include "cuda_common.cuh"

/* result bits: 1 = out of range, 2 = duplicate, 4 = not monotone / past total */
__global__ void ids_check_kernel(dv ids, int64_t n, int64_t limit, int allow_neg,
                                 unsigned *bitmap, unsigned *res) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int32_t s = dv_ldi(ids, i * ids.s[0]);
    if (s < 0 && allow_neg) continue;
    if (s < 0 || s >= limit) {
      atomicOr(res, 1u);
      continue;
    }
    if (bitmap) {
      unsigned bit = 1u << (s & 31), old = atomicOr(bitmap + (s >> 5), bit);
      if (old & bit) atomicOr(res, 2u);
    }
  }
}

__global__ void seqs_check_kernel(dv cu, int64_t n, int64_t total, unsigned *res) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i <= n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int32_t c = dv_ldi(cu, i * cu.s[0]);
    bool bad = i == 0 ? c < 0 : c < dv_ldi(cu, (i - 1) * cu.s[0]);
    if (i == n && c > total) bad = true;
    if (bad) atomicOr(res, 4u);
  }
}

/* Both checks of a sequence op in one launch: cu [n+1] (bit 4) and slots [n] (bits 1, 2). */
__global__ void seqs_slots_check_kernel(dv cu, dv ids, int64_t n, int64_t total, int64_t limit,
                                        unsigned *bitmap, unsigned *res) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i <= n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int32_t c = dv_ldi(cu, i * cu.s[0]);
    bool bad = i == 0 ? c < 0 : c < dv_ldi(cu, (i - 1) * cu.s[0]);
    if (i == n && c > total) bad = true;
    if (bad) atomicOr(res, 4u);
    if (i == n) continue;
    int32_t s = dv_ldi(ids, i * ids.s[0]);
    if (s < 0 || s >= limit) {
      atomicOr(res, 1u);
      continue;
    }
    unsigned bit = 1u << (s & 31), old = atomicOr(bitmap + (s >> 5), bit);
    if (old & bit) atomicOr(res, 2u);
  }
}

/* Page-table entries actually used by sequence b (pages 0 .. ceil(len/ps)-1) must be in [0,P);
 * every len must be in [0, max_pages*ps]. */
__global__ void pages_check_kernel(dv pt, dv lens, int64_t n, int64_t max_pages, int64_t ps,
                                   int64_t n_pages, unsigned *res) {
  int64_t b = blockIdx.x;
  if (b >= n) return;
  int32_t len = dv_ldi(lens, b * lens.s[0]);
  if (len < 0 || len > max_pages * ps) {
    if (threadIdx.x == 0) atomicOr(res, 1u);
    return;
  }
  int64_t used = (len + ps - 1) / ps;
  for (int64_t j = threadIdx.x; j < used; j += blockDim.x) {
    int32_t p = dv_ldi(pt, b * pt.s[0] + j * pt.s[1]);
    if (p < 0 || p >= n_pages) atomicOr(res, 1u);
  }
}

/* Scratch layout: [result word | bitmap]. Reads the result back (one synchronisation). */
/* The context's pinned host word for check results (allocated once): a device-to-host copy
 * into pageable memory is staged and synchronous, one more round trip per checked call. */
static int host_word(k3k_cuda_ctx *cx) {
  if (!cx->check_host) {
    void *p = NULL;
    K3K_CU(cudaMallocHost(&p, 64));
    cx->check_host = (unsigned *)p;
  }
  return 0;
}

static int finish(k3k_cuda_ctx *cx, unsigned *res) {
  int rc = host_word(cx);
  if (rc) return rc;
  K3K_CU(cudaMemcpyAsync(cx->check_host, res, sizeof(unsigned), cudaMemcpyDeviceToHost,
                         cx->stream));
  K3K_CU(cudaStreamSynchronize(cx->stream));
  const unsigned host = *cx->check_host;
  if (host & 5u) return K3_ERANGE;
  if (host & 2u) return K3_EINVAL;
  return 0;
}

int k3k_cuda_set_trusted_ids(k3k_cuda_ctx *cx, int on) {
  int old = cx->trusted_ids;
  cx->trusted_ids = on ? 1 : 0;
  return old;
}

int k3k_cuda_check_ids(k3k_cuda_ctx *cx, const k3k_tensor_t *ids, int64_t n, int64_t limit,
                       int unique, int allow_neg) {
  if (n <= 0 || cx->trusted_ids) return 0;
  size_t words = unique ? (size_t)(limit + 31) / 32 : 0;
  void *sc;
  int rc = k3k_cuda_scratch(cx, (1 + words) * sizeof(unsigned), &sc);
  if (rc) return rc;
  unsigned *res = (unsigned *)sc;
  K3K_CU(cudaMemsetAsync(res, 0, (1 + words) * sizeof(unsigned), cx->stream));
  unsigned blocks = k3k_ceil_div((size_t)n, 256);
  ids_check_kernel<<<blocks > 1024 ? 1024 : blocks, 256, 0, cx->stream>>>(
      mkdv(ids), n, limit, allow_neg, unique ? res + 1 : NULL, res);
  K3K_LAUNCHED("ids_check");
  return finish(cx, res);
}

int k3k_cuda_check_seqs(k3k_cuda_ctx *cx, const k3k_tensor_t *cu, int64_t n, int64_t total) {
  if (cx->trusted_ids) return 0;
  void *sc;
  int rc = k3k_cuda_scratch(cx, sizeof(unsigned), &sc);
  if (rc) return rc;
  unsigned *res = (unsigned *)sc;
  K3K_CU(cudaMemsetAsync(res, 0, sizeof(unsigned), cx->stream));
  unsigned blocks = k3k_ceil_div((size_t)n + 1, 256);
  seqs_check_kernel<<<blocks > 1024 ? 1024 : blocks, 256, 0, cx->stream>>>(mkdv(cu), n, total,
                                                                           res);
  K3K_LAUNCHED("seqs_check");
  return finish(cx, res);
}

int k3k_cuda_check_seqs_slots_begin(k3k_cuda_ctx *cx, const k3k_tensor_t *cu,
                                    const k3k_tensor_t *slots, int64_t n, int64_t total,
                                    int64_t n_slots, unsigned **flag) {
  *flag = NULL;
  if (cx->trusted_ids) return 0;
  size_t words = (size_t)(n_slots + 31) / 32;
  void *sc;
  int rc = k3k_cuda_scratch(cx, (1 + words) * sizeof(unsigned), &sc);
  if (rc) return rc;
  unsigned *res = (unsigned *)sc;
  K3K_CU(cudaMemsetAsync(res, 0, (1 + words) * sizeof(unsigned), cx->stream));
  unsigned blocks = k3k_ceil_div((size_t)n + 1, 256);
  seqs_slots_check_kernel<<<blocks > 1024 ? 1024 : blocks, 256, 0, cx->stream>>>(
      mkdv(cu), mkdv(slots), n, total, n_slots, res + 1, res);
  K3K_LAUNCHED("seqs_slots_check");
  *flag = res;
  return 0;
}

int k3k_cuda_check_end(k3k_cuda_ctx *cx, unsigned *flag) { return flag ? finish(cx, flag) : 0; }

int k3k_cuda_check_pages_begin(k3k_cuda_ctx *cx, const k3k_tensor_t *pt,
                               const k3k_tensor_t *lens, int64_t n, int64_t page_size,
                               int64_t n_pages, unsigned *res, bool *queued) {
  *queued = false;
  if (n <= 0 || cx->trusted_ids) return 0;
  int rc = host_word(cx);
  if (rc) return rc;
  if (!cx->check_ev) K3K_CU(cudaEventCreateWithFlags(&cx->check_ev, cudaEventDisableTiming));
  K3K_CU(cudaMemsetAsync(res, 0, sizeof(unsigned), cx->stream));
  pages_check_kernel<<<(unsigned)n, 128, 0, cx->stream>>>(mkdv(pt), mkdv(lens), n, pt->shape[1],
                                                         page_size, n_pages, res);
  K3K_LAUNCHED("pages_check");
  K3K_CU(cudaMemcpyAsync(cx->check_host, res, sizeof(unsigned), cudaMemcpyDeviceToHost,
                         cx->stream));
  K3K_CU(cudaEventRecord(cx->check_ev, cx->stream));
  *queued = true;
  return 0;
}

int k3k_cuda_check_pages_end(k3k_cuda_ctx *cx, bool queued) {
  if (!queued) return 0;
  K3K_CU(cudaEventSynchronize(cx->check_ev));
  return *cx->check_host & 5u ? K3_ERANGE : 0;
}

int k3k_cuda_check_pages(k3k_cuda_ctx *cx, const k3k_tensor_t *pt, const k3k_tensor_t *lens,
                         int64_t n, int64_t page_size, int64_t n_pages) {
  if (n <= 0 || cx->trusted_ids) return 0;
  void *sc;
  int rc = k3k_cuda_scratch(cx, sizeof(unsigned), &sc);
  if (rc) return rc;
  unsigned *res = (unsigned *)sc;
  K3K_CU(cudaMemsetAsync(res, 0, sizeof(unsigned), cx->stream));
  pages_check_kernel<<<(unsigned)n, 128, 0, cx->stream>>>(mkdv(pt), mkdv(lens), n, pt->shape[1],
                                                         page_size, n_pages, res);
  K3K_LAUNCHED("pages_check");
  return finish(cx, res);
}
