/* Dequant-once prefill of the routed MXFP4 experts (interface and contract: moe_dq.h).
 *
 * Why: at an 8K-token prefill every active expert has hundreds of rows (K3: T·k/E ≈ 146 at
 * E = 896, top-16; the medium preset's 256 experts ≈ 512), so the expert GEMMs are compute
 * work. The grouped W4A16 kernel (mxfp4_wg.cu) dequantises each weight tile in registers for
 * every token tile (224 rows) it meets and was measured bound by that copy + dequant chain at
 * ×3.6-3.75 of the FLOP floor. Here each expert's bf16 weights are written once (bandwidth work:
 * 2 bytes per weight, ~7 µs for one expert's 3 matrices at 4 TB/s) and cuBLASLt runs the
 * per-expert GEMMs at its own rate; what it costs is one host round trip per call (the plan's
 * offsets size the GEMMs) and the scratch.
 *
 * Order of work on the stream, for one call (plan rows: the grouped order of the device plan):
 *   1. gather: xs[r] = x[gather_tok[r]] for all T·k rows;
 *   2. gate/up, per group of K3K_CU_MOE_DQ_GROUP active experts: dequantise [w1_e; w3_e] into
 *      the group's slots ([2F][D] bf16 each), one GEMM per expert gu[rows_e] = xs[rows_e] · slotᵀ
 *      (bf16 out: the reference's rounding of the gate/up GEMM outputs), then the activation over
 *      the group's rows into h;
 *   3. down, per group: dequantise w2_e into the slots ([D][F]), y[rows_e] = h[rows_e] · slotᵀ.
 * GEMM row counts are rounded up to a multiple of 16 (so cuBLASLt sees a few shapes and its
 * algorithm cache stays small) but never past the last plan row: the extra rows belong to the
 * next expert(s), are computed from whatever is there and overwritten by that expert's own GEMM
 * later on the same stream (a GEMM's output row depends only on its input row). The schedule
 * (groups, GEMM rows) is core/moe_dq_plan.c's, whose invariants test_kernels checks.
 * Inside the group loop stream/event errors are collected in one cudaError_t instead of
 * K3K_CU's early return, so the schedule array is freed on every path. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/moe_dq_plan.h"
#include "core/mxfp4_bf16.h"
#include "cuda_common.cuh"
#include "moe_dq.h"
#include "mxfp4_args.cuh"

#define DQ_PAD 16

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

size_t k3k_cu_moe_dq_scratch_bytes(int64_t tk, int32_t F, int32_t D) {
  if (tk <= 0 || F <= 0 || D <= 0) return 0;
  return al256((size_t)tk * D * 2) + al256((size_t)tk * 2 * F * 2) +
         (size_t)2 * K3K_CU_MOE_DQ_GROUP * al256((size_t)2 * F * D * 2);
}

/* The path's own stream: dequantisation of group j + 1 overlaps the GEMMs of group j. */
typedef struct {
  cudaStream_t st;
  cudaEvent_t start, dq[2], used[2]; /* dq[s]: set s dequantised; used[s]: its GEMMs done */
} dq_lane;

void k3k_cu_moe_dq_release(k3k_cuda_ctx *cx) {
  dq_lane *l = (dq_lane *)cx->moe_dq;
  if (!l) return;
  if (l->st) cudaStreamDestroy(l->st);
  cudaEvent_t *ev[5] = {&l->start, &l->dq[0], &l->dq[1], &l->used[0], &l->used[1]};
  for (int i = 0; i < 5; i++)
    if (*ev[i]) cudaEventDestroy(*ev[i]);
  free(l);
  cx->moe_dq = NULL;
}

static int lane_of(k3k_cuda_ctx *cx, dq_lane **out) {
  if (!cx->moe_dq) {
    dq_lane *l = (dq_lane *)calloc(1, sizeof *l);
    if (!l) return K3_ENOMEM;
    cx->moe_dq = l;
    cudaEvent_t *ev[5] = {&l->start, &l->dq[0], &l->dq[1], &l->used[0], &l->used[1]};
    bool ok = cudaStreamCreateWithFlags(&l->st, cudaStreamNonBlocking) == cudaSuccess;
    for (int i = 0; i < 5 && ok; i++)
      ok = cudaEventCreateWithFlags(ev[i], cudaEventDisableTiming) == cudaSuccess;
    if (!ok) {
      K3_ERROR("moe_dq: stream/event creation failed: %s", cudaGetErrorString(cudaGetLastError()));
      k3k_cu_moe_dq_release(cx);
      return K3_EDEVICE;
    }
  }
  *out = (dq_lane *)cx->moe_dq;
  return 0;
}

bool k3k_cu_moe_dq_wanted(int64_t T, int32_t k, int32_t E) {
  static int mode = -2; /* 0: off (default until measured), 1: by rows, 2: always; read once */
  static int64_t rows = K3K_CU_MOE_DQ_ROWS_DEFAULT;
  if (mode == -2) {
    const char *m = getenv("K3PD_MOE_DQ"), *r = getenv("K3PD_MOE_DQ_ROWS");
    mode = m && *m == '1' ? 1 : m && *m == '2' ? 2 : 0;
    if (r && atoll(r) > 0) rows = atoll(r);
  }
  if (mode == 0 || T <= 0 || k <= 0 || E <= 0) return false;
  if (mode == 2) return true;
  const int64_t tk = T * k, act = tk < E ? tk : E;
  return tk >= rows * act;
}

/* ---- kernels ---- */

struct dq_kargs {
  mx_dset s0, s1;
  int ids[K3K_CU_MOE_DQ_GROUP];
  int N, K;
  int64_t ld_slot; /* elements between two slots' first weights (>= rows · K) */
  uint16_t *dst;
};

/* grid (x: chunks of 8 codes, y: slot i, z: matrix 0 = s0 rows [0,N), 1 = s1 rows [N,2N)); each
 * thread 8 codes at a time: 4 packed bytes + their scale byte in, 16 bytes of bf16 out, so a
 * warp reads 128 contiguous bytes of codes and writes 512 contiguous bytes (every access
 * coalesced; 32-bit index math: one matrix of one expert has < 2^31 codes). */
__global__ void __launch_bounds__(256) dq_kernel(dq_kargs a) {
  const int i = blockIdx.y, e = a.ids[i];
  const mx_dset &s = blockIdx.z ? a.s1 : a.s0;
  const uint8_t *P = mx_packed(s, e), *S = mx_scale(s, e);
  uint16_t *out = a.dst + (int64_t)i * a.ld_slot + (int64_t)blockIdx.z * a.N * a.K;
  const uint32_t cpr = (uint32_t)a.K / 8, n = (uint32_t)a.N * cpr; /* chunks per row, in all */
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < n; g += gridDim.x * blockDim.x) {
    const uint32_t r = g / cpr, c = g - r * cpr; /* row, chunk: codes [8c, 8c + 8) */
    const uint32_t w = __ldg((const uint32_t *)(P + (int64_t)r * s.ldp + 4 * c));
    const uint32_t sc = __ldg(S + (int64_t)r * s.lds + c / 4);
    uint32_t o[4];
#pragma unroll
    for (int b = 0; b < 4; b++) {
      const uint32_t byte = (w >> (8 * b)) & 0xFFu; /* codes 2b (low nibble), 2b + 1 (high) */
      o[b] = k3k_mx_bf16_bits(byte & 15u, sc) | (k3k_mx_bf16_bits(byte >> 4, sc) << 16);
    }
    *(uint4 *)(out + (int64_t)r * a.K + 8 * c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/* xs[r][0..D) = x[gt[r]][0..D), 16-byte vectors (D % 8 == 0, ldx % 8 == 0, aligned). */
__global__ void dq_gather_kernel(const uint16_t *x, int64_t ldx, const int32_t *gt, int64_t n,
                                 int D, uint16_t *xs) {
  const int vpr = D / 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * vpr;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / vpr, v = i % vpr;
    ((uint4 *)(xs + r * D))[v] = __ldg((const uint4 *)(x + gt[r] * ldx) + v);
  }
}

struct dq_act_args {
  int act, round_inner;
  float beta, beta_lin;
};
/* h[r][f] = act(gu[r][f], gu[r][F + f]) for rows [r0, r1): the bf16 gate/up GEMM outputs in,
 * the grouped kernels' epilogue (mx_act, SiTU or silu·up) in fp32, one bf16 rounding. Each
 * thread 8 features (16-byte loads and store; F % 8 == 0). */
__global__ void dq_act_kernel(dq_act_args a, const uint16_t *gu, int F, int64_t r0, int64_t r1,
                              uint16_t *h) {
  const int vpr = F / 8;
  const int64_t n = (r1 - r0) * vpr;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = r0 + i / vpr, v = i % vpr;
    const uint4 gq = __ldg((const uint4 *)(gu + r * 2 * F) + v);
    const uint4 uq = __ldg((const uint4 *)(gu + r * 2 * F + F) + v);
    const uint32_t gw[4] = {gq.x, gq.y, gq.z, gq.w}, uw[4] = {uq.x, uq.y, uq.z, uq.w};
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float lo = mx_act(a, __uint_as_float(gw[j] << 16), __uint_as_float(uw[j] << 16));
      const float hi = mx_act(a, __uint_as_float(gw[j] & 0xFFFF0000u), __uint_as_float(uw[j] & 0xFFFF0000u));
      o[j] = (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
    }
    ((uint4 *)(h + r * F))[v] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/* ---- host side ---- */

static unsigned grid_for(int64_t work, int64_t per_block, unsigned cap) {
  int64_t g = (work + per_block - 1) / per_block;
  return g < 1 ? 1 : g > cap ? cap : (unsigned)g;
}

int k3k_cu_mx_dequant_experts(cudaStream_t st, const k3k_cu_mx_set *s0, const k3k_cu_mx_set *s1,
                              const int32_t *ids, int n, int32_t N, int32_t K, uint16_t *dst,
                              int64_t ld_slot) {
  if (n <= 0) return 0;
  const int64_t rows = s1 ? 2 * (int64_t)N : N;
  if (ld_slot == 0) ld_slot = rows * K;
  if (n > K3K_CU_MOE_DQ_GROUP || N <= 0 || K <= 0 || K % 32 || !s0 || !dst ||
      ((uintptr_t)dst & 15) || ld_slot < rows * K || ld_slot % 8 || (int64_t)N * K / 8 > INT32_MAX ||
      s0->ld_packed % 4 || (s1 && s1->ld_packed % 4))
    return K3_EINVAL;
  dq_kargs a;
  memset(&a, 0, sizeof a);
  a.s0 = mx_dset_of(s0);
  a.s1 = mx_dset_of(s1 ? s1 : s0);
  for (int i = 0; i < n; i++) a.ids[i] = ids[i];
  a.N = N;
  a.K = K;
  a.ld_slot = ld_slot;
  a.dst = dst;
  const unsigned gx = grid_for((int64_t)N * (K / 8), 256 * 4, 1024);
  dq_kernel<<<dim3(gx, (unsigned)n, s1 ? 2u : 1u), 256, 0, st>>>(a);
  K3K_LAUNCHED("moe_dq_dequant");
  return 0;
}

/* The per-expert GEMM y[rows][m] = x[rows][kk] · W[m][kk]ᵀ (all row-major bf16). */
static int expert_gemm(k3k_cuda_ctx *cx, const uint16_t *w, int64_t m, int64_t kk,
                       const uint16_t *x, int64_t rows, uint16_t *y) {
  return k3k_cuda_lt_gemm(cx, 1, 0, m, rows, kk, w, CUDA_R_16BF, kk, 0, x, CUDA_R_16BF, kk, 0, y,
                          CUDA_R_16BF, m, 0, 1);
}

int k3k_cu_moe_dq_experts(k3k_cuda_ctx *cx, const k3k_cu_moe_dq_args *a) {
  if (!cx || !a || a->F <= 0 || a->D <= 0 || a->E <= 0 || a->T < 0 || a->k <= 0 ||
      a->F % 32 || a->D % 32 || a->ldx % 8 || ((uintptr_t)a->x & 15) || ((uintptr_t)a->h & 15) ||
      ((uintptr_t)a->y & 15) || ((uintptr_t)a->scratch & 15) || !a->gather_tok ||
      !a->expert_off || (a->act != K3K_CU_ACT_SITU && a->act != K3K_CU_ACT_SILU_MUL) ||
      a->w1.ld_packed % 16 || a->w3.ld_packed % 16 || a->w2.ld_packed % 16)
    return K3_EINVAL;
  const int64_t tk = (int64_t)a->T * a->k, F = a->F, D = a->D;
  const unsigned parts = a->parts ? a->parts : 3u;
  if (tk == 0) return 0;
  cudaStream_t st = cx->stream;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  K3K_CU(cudaStreamIsCapturing(st, &cs));
  if (cs != cudaStreamCaptureStatusNone) return K3_ENOTSUP;

  /* the plan's offsets on the host: the one synchronisation */
  int32_t *off = NULL;
  int rc = k3k_cuda_host_scratch(cx, (size_t)(a->E + 1) * 4, (void **)&off);
  if (rc) return rc;
  K3K_CU(cudaMemcpyAsync(off, a->expert_off, (size_t)(a->E + 1) * 4, cudaMemcpyDeviceToHost, st));
  K3K_CU(cudaStreamSynchronize(st));
  const int32_t *ho = off; /* pinned host scratch; nothing else uses it during this call */
  if (ho[0] != 0 || ho[a->E] != tk) {
    K3_ERROR("moe_dq: plan offsets [0]=%d [E]=%d, want 0 and %lld", ho[0], ho[a->E], (long long)tk);
    return K3_EINVAL;
  }
  static int overlap = -1, group = K3K_CU_MOE_DQ_GROUP;
  if (overlap < 0) { /* measurement knobs, read once */
    const char *o = getenv("K3PD_MOE_DQ_OVERLAP"), *gs = getenv("K3PD_MOE_DQ_GROUP");
    overlap = !(o && *o == '0');
    if (gs && atoi(gs) >= 1 && atoi(gs) <= K3K_CU_MOE_DQ_GROUP) group = atoi(gs);
  }
  dq_lane *lane = NULL;
  if (overlap && (rc = lane_of(cx, &lane))) return rc;
  cudaStream_t ds = lane ? lane->st : st; /* where the dequantisation runs */

  char *p = (char *)a->scratch;
  uint16_t *xs = (uint16_t *)p;
  p += al256((size_t)tk * D * 2);
  uint16_t *gu = (uint16_t *)p;
  p += al256((size_t)tk * 2 * F * 2);
  const int64_t slot_elems = al256((size_t)2 * F * D * 2) / 2;
  uint16_t *set[2] = {(uint16_t *)p, (uint16_t *)p + K3K_CU_MOE_DQ_GROUP * slot_elems};
  dq_act_args aa = {a->act, 1, a->beta, a->beta_lin};

  if (parts & 1) {
    dq_gather_kernel<<<grid_for(tk * (D / 8), 256, 8192), 256, 0, st>>>(a->x, a->ldx,
                                                                         a->gather_tok, tk,
                                                                         (int)D, xs);
    K3K_LAUNCHED("moe_dq_gather");
  }
  /* the lane starts after everything queued on st so far (earlier users of the scratch) */
  if (lane) {
    K3K_CU(cudaEventRecord(lane->start, st));
    K3K_CU(cudaStreamWaitEvent(ds, lane->start, 0));
  }
  /* the schedule: active experts in order, groups, GEMM rows (core/moe_dq_plan.h) */
  k3k_moe_dq_item *it = (k3k_moe_dq_item *)malloc((size_t)a->E * sizeof *it);
  if (!it) return K3_ENOMEM;
  const int32_t n_it = k3k_moe_dq_schedule(ho, a->E, group, DQ_PAD, it);
  if (n_it < 0) { /* offsets not non-decreasing: not a plan */
    free(it);
    K3_ERROR("moe_dq: plan offsets are not non-decreasing");
    return K3_EINVAL;
  }
  cudaError_t ce = cudaSuccess; /* first failed stream/event call; the loop stops there */
  int job = 0; /* groups in order over both phases; group j uses buffer set j % 2 */
  for (int phase = 0; phase < 2 && !rc && ce == cudaSuccess; phase++) {
    if (!(parts & (1u << phase))) continue;
    for (int32_t g0 = 0; g0 < n_it && !rc && ce == cudaSuccess; job++) {
      int32_t ids[K3K_CU_MOE_DQ_GROUP];
      int n = 0;
      while (g0 + n < n_it && it[g0 + n].group == it[g0].group) {
        ids[n] = it[g0 + n].expert;
        n++;
      }
      const int sidx = job & 1;
      uint16_t *slot = set[sidx];
      if (lane && job >= 2) ce = cudaStreamWaitEvent(ds, lane->used[sidx], 0);
      if (ce == cudaSuccess)
        rc = phase == 0 ? k3k_cu_mx_dequant_experts(ds, &a->w1, &a->w3, ids, n, a->F, a->D, slot,
                                                    slot_elems)
                        : k3k_cu_mx_dequant_experts(ds, &a->w2, NULL, ids, n, a->D, a->F, slot,
                                                    slot_elems);
      if (!rc && lane && ce == cudaSuccess) ce = cudaEventRecord(lane->dq[sidx], ds);
      if (!rc && lane && ce == cudaSuccess) ce = cudaStreamWaitEvent(st, lane->dq[sidx], 0);
      for (int i = 0; i < n && !rc && ce == cudaSuccess; i++) {
        const k3k_moe_dq_item *x = &it[g0 + i];
        const int64_t b = x->row0;
        const uint16_t *w = slot + i * slot_elems;
        rc = phase == 0 ? expert_gemm(cx, w, 2 * F, D, xs + b * D, x->gemm_rows, gu + b * 2 * F)
                        : expert_gemm(cx, w, D, F, a->h + b * F, x->gemm_rows, a->y + b * D);
      }
      if (!rc && ce == cudaSuccess && phase == 0) { /* the group's rows are contiguous */
        const int64_t r0 = it[g0].row0, r1 = it[g0 + n - 1].row0 + it[g0 + n - 1].rows;
        dq_act_kernel<<<grid_for((r1 - r0) * (F / 8), 256, 8192), 256, 0, st>>>(aa, gu, (int)F, r0,
                                                                                 r1, a->h);
        ce = cudaGetLastError();
      }
      if (!rc && lane && ce == cudaSuccess) ce = cudaEventRecord(lane->used[sidx], st);
      g0 += n;
    }
  }
  free(it);
  if (ce != cudaSuccess) {
    K3_ERROR("moe_dq: %s", cudaGetErrorString(ce));
    return K3_EDEVICE;
  }
  return rc;
}
