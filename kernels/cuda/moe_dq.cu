/* Dequant-once prefill of the routed MXFP4 experts (interface and contract: moe_dq.h).
 *
 * Why: at an 8K-token prefill every active expert has hundreds of rows (K3: T·k/E ≈ 146 at
 * E = 896, top-16; the medium preset's 256 experts ≈ 512), so the expert GEMMs are compute
 * work. The grouped W4A16 kernel (mxfp4_wg.cu) dequantises each weight tile in registers for
 * every token tile (224 rows) it meets and was measured bound by that copy + dequant chain at
 * ×3.6-3.75 of the FLOP floor. Here each expert's bf16 weights are written once (bandwidth work:
 * 2 bytes per weight, ~16 µs for one expert's 3 matrices at 4 TB/s) and cuBLASLt runs the GEMMs
 * at its own rate; what it costs is one host round trip per call (the plan's offsets size the
 * GEMMs), the bf16 weight traffic and the scratch.
 *
 * Layout: core/moe_dq_plan.c orders the active experts by rows and cuts them into groups of up
 * to K3K_CU_MOE_DQ_GROUP experts of similar size; a group's experts sit in a padded row space at
 * one distance (the group's cap, a multiple of DQ_PAD), so ONE strided-batched cuBLASLt GEMM runs
 * the group (one expert of 512 rows gives 96 tiles of 128x256, under one wave of the 132 SMs;
 * four give ~3 waves). Padding rows hold whatever the scratch held: their GEMM outputs and
 * activations are computed and never read (a GEMM's output row depends only on its input row).
 *
 * Order of work on cx->stream, for one call:
 *   1. upload the per-expert padded bases; gather xs[pad(r)] = x[gather_tok[r]] for all T·k rows;
 *   2. gate/up, per group: dequantise [w1_e; w3_e] of its experts into one slot set ([2F][D]
 *      bf16 per expert, on the path's own stream, double-buffered so group j + 1 is dequantised
 *      while group j's GEMM runs), one batched GEMM gu = xs · slotᵀ (bf16 out: the reference's
 *      rounding of the gate/up GEMM outputs), the activation over the group's padded rows → hp;
 *   3. down, per group: dequantise w2_e ([D][F]), one batched GEMM yp = hp · slotᵀ (yp reuses
 *      xs's rows: xs is dead after step 2);
 *   4. y[r] = yp[pad(r)] for all T·k rows (plan order, what the combine reads).
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

#define DQ_PAD 32 /* padded rows per expert: multiples of 32 */
#define DQ_GROUP_BF16 32 /* experts per group in the bf16 mode */

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* Scratch: xs / yp [P][D], gu [P][2F], hp [P][F] (P = the most padded rows), the padded bases
 * [E] (int32), the bf16 mode's pointer arrays (9 per active expert), then the two slot sets. */
size_t k3k_cu_moe_dq_scratch_bytes(int64_t tk, int32_t E, int32_t F, int32_t D) {
  if (tk <= 0 || E <= 0 || F <= 0 || D <= 0) return 0;
  const int64_t P = k3k_moe_dq_pad_rows_max(tk, E, DQ_PAD);
  const size_t act = (size_t)(tk < E ? tk : E);
  return al256((size_t)P * D * 2) + al256((size_t)P * 2 * F * 2) + al256((size_t)P * F * 2) +
         al256((size_t)E * 4) + al256(9 * act * sizeof(void *)) +
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
  static int mode = -2; /* 0: off, 1: by rows (default), 2: always; read once */
  static int64_t rows = K3K_CU_MOE_DQ_ROWS_DEFAULT;
  if (mode == -2) {
    const char *m = getenv("K3PD_MOE_DQ"), *r = getenv("K3PD_MOE_DQ_ROWS");
    mode = m && *m == '0' ? 0 : m && *m == '2' ? 2 : 1;
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

/* grid (x: chunks of 8 codes, y: slot i, z: matrix 0 = s0 rows [0,N), 1 = s1 rows [N,2N)); a
 * chunk is 4 packed bytes + their scale byte in, 16 bytes of bf16 out, so a warp reads 128
 * contiguous bytes of codes and writes 512 contiguous bytes (every access coalesced; 32-bit
 * index math: one matrix of one expert has < 2^31 codes). Each thread takes DQ_UNROLL chunks one
 * grid-width apart and issues all their loads before the first store (loads in flight). */
#define DQ_UNROLL 4
__global__ void __launch_bounds__(256) dq_kernel(dq_kargs a) {
  const int i = blockIdx.y, e = a.ids[i];
  const mx_dset &s = blockIdx.z ? a.s1 : a.s0;
  const uint8_t *P = mx_packed(s, e), *S = mx_scale(s, e);
  uint16_t *out = a.dst + (int64_t)i * a.ld_slot + (int64_t)blockIdx.z * a.N * a.K;
  const uint32_t cpr = (uint32_t)a.K / 8, n = (uint32_t)a.N * cpr; /* chunks per row, in all */
  const uint32_t step = gridDim.x * blockDim.x;
  for (uint32_t g0 = blockIdx.x * blockDim.x + threadIdx.x; g0 < n; g0 += DQ_UNROLL * step) {
    uint32_t w[DQ_UNROLL] = {0}, sc[DQ_UNROLL] = {0};
#pragma unroll
    for (int u = 0; u < DQ_UNROLL; u++) {
      const uint32_t g = g0 + u * step, r = g / cpr, c = g - r * cpr; /* codes [8c, 8c + 8) */
      if (g < n) {
        w[u] = __ldg((const uint32_t *)(P + (int64_t)r * s.ldp + 4 * c));
        sc[u] = __ldg(S + (int64_t)r * s.lds + c / 4);
      }
    }
#pragma unroll
    for (int u = 0; u < DQ_UNROLL; u++) {
      const uint32_t g = g0 + u * step, r = g / cpr, c = g - r * cpr;
      if (g >= n) break;
      uint32_t o[4];
#pragma unroll
      for (int b = 0; b < 4; b++) {
        const uint32_t byte = (w[u] >> (8 * b)) & 0xFFu; /* codes 2b (low nibble), 2b + 1 (high) */
        o[b] = k3k_mx_bf16_bits(byte & 15u, sc[u]) | (k3k_mx_bf16_bits(byte >> 4, sc[u]) << 16);
      }
      *(uint4 *)(out + (int64_t)r * a.K + 8 * c) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

/* Moves W-wide bf16 rows between plan order and the padded layout, one block per plan row r:
 * e = the expert whose rows [off[e], off[e+1]) hold r (binary search over the plan's offsets),
 * pr = pbase[e] + r - off[e]. to_pad: dst[pr] = src[gt ? gt[r] : r] (ld_src elements apart);
 * else dst[r] = src[pr]. 16-byte vectors (W % 8 == 0, ld_src % 8 == 0, aligned). */
__global__ void __launch_bounds__(128) dq_pad_kernel(const uint16_t *src, int64_t ld_src,
                                                     const int32_t *gt, const int32_t *off,
                                                     const int32_t *pbase, int E, int W, int to_pad,
                                                     uint16_t *dst) {
  __shared__ int64_t s_from, s_to;
  const int64_t r = blockIdx.x;
  if (threadIdx.x == 0) {
    int lo = 0, hi = E; /* off[lo] <= r < off[hi] */
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (off[mid] <= r) lo = mid; else hi = mid;
    }
    const int64_t pr = (int64_t)pbase[lo] + (r - off[lo]);
    s_from = to_pad ? (gt ? (int64_t)gt[r] : r) * ld_src : pr * W;
    s_to = to_pad ? pr * W : r * W;
  }
  __syncthreads();
  const uint4 *from = (const uint4 *)(src + s_from);
  uint4 *to = (uint4 *)(dst + s_to);
  for (int v = threadIdx.x; v < W / 8; v += blockDim.x) to[v] = __ldg(from + v);
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
  const unsigned gx = grid_for((int64_t)N * (K / 8), 256 * DQ_UNROLL, 1u << 20);
  dq_kernel<<<dim3(gx, (unsigned)n, s1 ? 2u : 1u), 256, 0, st>>>(a);
  K3K_LAUNCHED("moe_dq_dequant");
  return 0;
}

/* One group's GEMMs, batched: y_i[cap][m] = x_i[cap][kk] · W_iᵀ for the group's n experts (all
 * row-major bf16; W_i slot_elems apart, x_i and y_i cap rows apart). */
static int group_gemm(k3k_cuda_ctx *cx, const uint16_t *w, int64_t slot_elems, int64_t m,
                      int64_t kk, const uint16_t *x, int64_t cap, int n, uint16_t *y) {
  return k3k_cuda_lt_gemm(cx, 1, 0, m, cap, kk, w, CUDA_R_16BF, kk, slot_elems, x, CUDA_R_16BF, kk,
                          cap * kk, y, CUDA_R_16BF, m, cap * m, n);
}

/* One group's GEMMs in the bf16 mode: gate and up of its n experts as 2n pointer-array
 * instances (m = F, ldc = 2F: gate into columns [0, F) of gu's rows, up into [F, 2F)), or down as
 * n instances; hp / dp: the group's 9n pointers on the host / device. Where cuBLASLt offers no
 * pointer-array algorithm, one GEMM per matrix from the host pointers (same products). */
static int bf16_group(k3k_cuda_ctx *cx, const void *const *hp, const void *const *dp, int n,
                      int phase, int64_t cap, int64_t F, int64_t D) {
  const int cnt = phase == 0 ? 2 * n : n, off = phase == 0 ? 0 : 6 * n;
  const int64_t m = phase == 0 ? F : D, kk = phase == 0 ? D : F, ldc = phase == 0 ? 2 * F : D;
  const void *const *A = dp + off, *const *B = A + cnt;
  void *const *C = (void *const *)(B + cnt);
  int rc = k3k_cuda_lt_gemm_ptrs(cx, 1, 0, m, cap, kk, A, CUDA_R_16BF, kk, B, CUDA_R_16BF, kk, C,
                                 CUDA_R_16BF, ldc, cnt);
  if (rc != K3_ENOTSUP) return rc;
  const void *const *Ah = hp + off, *const *Bh = Ah + cnt, *const *Ch = Bh + cnt;
  rc = 0;
  for (int i = 0; i < cnt && !rc; i++)
    rc = k3k_cuda_lt_gemm(cx, 1, 0, m, cap, kk, Ah[i], CUDA_R_16BF, kk, 0, Bh[i], CUDA_R_16BF, kk,
                          0, (void *)Ch[i], CUDA_R_16BF, ldc, 0, 1);
  return rc;
}

/* Members of the group that starts at schedule item g0 (a group's items are consecutive). */
static int group_len(const k3k_moe_dq_item *it, int32_t n_it, int32_t g0) {
  int n = 1;
  while (g0 + n < n_it && it[g0 + n].group == it[g0].group) n++;
  return n;
}

static unsigned pad_grid(int64_t tk) { return (unsigned)tk; } /* one block per plan row */

int k3k_cu_moe_dq_experts(k3k_cuda_ctx *cx, const k3k_cu_moe_dq_args *a) {
  if (!cx || !a || a->F <= 0 || a->D <= 0 || a->E <= 0 || a->T < 0 || a->k <= 0 ||
      a->F % 32 || a->D % 32 || a->ldx % 8 || ((uintptr_t)a->x & 15) || ((uintptr_t)a->h & 15) ||
      ((uintptr_t)a->y & 15) || ((uintptr_t)a->scratch & 15) || !a->gather_tok ||
      !a->expert_off || (a->act != K3K_CU_ACT_SITU && a->act != K3K_CU_ACT_SILU_MUL) ||
      (!a->w1_bf16 && (a->w1.ld_packed % 16 || a->w3.ld_packed % 16 || a->w2.ld_packed % 16)) ||
      (a->w1_bf16 && (!a->w3_bf16 || !a->w2_bf16)) || (int64_t)a->T * a->k > INT32_MAX)
    return K3_EINVAL;
  const bool bf = a->w1_bf16 != NULL; /* bf16 experts: no dequantisation, pointer arrays */
  const int64_t tk = (int64_t)a->T * a->k, F = a->F, D = a->D;
  const int E = a->E;
  const unsigned parts = a->parts ? a->parts : 3u;
  if (tk == 0) return 0;
  cudaStream_t st = cx->stream;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  K3K_CU(cudaStreamIsCapturing(st, &cs));
  if (cs != cudaStreamCaptureStatusNone) return K3_ENOTSUP;

  /* the plan's offsets on the host (the one synchronisation); the padded bases go back up */
  int32_t *hbuf = NULL;
  const size_t hp_off = al256((size_t)(2 * E + 1) * 4), n_ptr = 9 * (size_t)(tk < E ? tk : E);
  int rc = k3k_cuda_host_scratch(cx, hp_off + n_ptr * sizeof(void *), (void **)&hbuf);
  if (rc) return rc;
  int32_t *ho = hbuf, *hpb = hbuf + E + 1; /* pinned; nothing else uses it during this call */
  const void **hptr = (const void **)((char *)hbuf + hp_off); /* bf16 mode's pointer arrays */
  K3K_CU(cudaMemcpyAsync(ho, a->expert_off, (size_t)(E + 1) * 4, cudaMemcpyDeviceToHost, st));
  K3K_CU(cudaStreamSynchronize(st));
  if (ho[0] != 0 || ho[E] != tk) {
    K3_ERROR("moe_dq: plan offsets [0]=%d [E]=%d, want 0 and %lld", ho[0], ho[E], (long long)tk);
    return K3_EINVAL;
  }
  static int overlap = -1, group = K3K_CU_MOE_DQ_GROUP;
  if (overlap < 0) { /* measurement knobs, read once */
    const char *o = getenv("K3PD_MOE_DQ_OVERLAP"), *gs = getenv("K3PD_MOE_DQ_GROUP");
    overlap = !(o && *o == '0');
    if (gs && atoi(gs) >= 1 && atoi(gs) <= K3K_CU_MOE_DQ_GROUP) group = atoi(gs);
  }
  /* the schedule: groups of similar experts, padded bases (core/moe_dq_plan.h) */
  k3k_moe_dq_item *it = (k3k_moe_dq_item *)malloc((size_t)E * sizeof *it);
  if (!it) return K3_ENOMEM;
  int64_t prows = 0;
  /* bf16 experts need no slots, so a group is bounded only by the size rule (one launch for up
   * to DQ_GROUP_BF16 experts of similar size; the knob still caps it) */
  const int32_t gmax = bf && group == K3K_CU_MOE_DQ_GROUP ? DQ_GROUP_BF16 : group;
  const int32_t n_it = k3k_moe_dq_schedule(ho, E, gmax, DQ_PAD, it, &prows);
  if (n_it < 0) { /* offsets not non-decreasing: not a plan */
    free(it);
    K3_ERROR("moe_dq: plan offsets are not non-decreasing");
    return K3_EINVAL;
  }
  const int64_t P = k3k_moe_dq_pad_rows_max(tk, E, DQ_PAD); /* the scratch's padded rows */
  if (prows > P) { /* the schedule's own bound */
    free(it);
    K3_ERROR("moe_dq: %lld padded rows past the bound", (long long)prows);
    return K3_EINVAL;
  }
  for (int e = 0; e < E; e++) hpb[e] = 0;
  for (int32_t i = 0; i < n_it; i++) hpb[it[i].expert] = (int32_t)it[i].prow0;

  char *p = (char *)a->scratch;
  uint16_t *xs = (uint16_t *)p; /* [P][D]: gathered x (gate/up), then yp (down) */
  p += al256((size_t)P * D * 2);
  uint16_t *gu = (uint16_t *)p;
  p += al256((size_t)P * 2 * F * 2);
  uint16_t *hp = (uint16_t *)p;
  p += al256((size_t)P * F * 2);
  int32_t *pbase = (int32_t *)p;
  p += al256((size_t)E * 4);
  const void **dptr = (const void **)p; /* device copy of hptr */
  p += al256(n_ptr * sizeof(void *));
  const int64_t slot_elems = al256((size_t)2 * F * D * 2) / 2;
  uint16_t *set[2] = {(uint16_t *)p, (uint16_t *)p + K3K_CU_MOE_DQ_GROUP * slot_elems};
  dq_act_args aa = {a->act, 1, a->beta, a->beta_lin};

  /* bf16 mode: per group (in order) 9n pointers: gate/up A, B, C (2n each: gate of member i at
   * 2i, up at 2i + 1), then down A, B, C (n each) */
  if (bf)
    for (int32_t g0 = 0, q = 0; g0 < n_it;) {
      const int n = group_len(it, n_it, g0);
      const void **A = hptr + q, **B = A + 2 * n, **C = B + 2 * n, **Ad = C + 2 * n, **Bd = Ad + n,
                 **Cd = Bd + n;
      for (int i = 0; i < n; i++) {
        const int e = it[g0 + i].expert;
        const int64_t pr = it[g0 + i].prow0;
        A[2 * i] = a->w1_bf16[e];
        A[2 * i + 1] = a->w3_bf16[e];
        B[2 * i] = B[2 * i + 1] = xs + pr * D;
        C[2 * i] = gu + pr * 2 * F;
        C[2 * i + 1] = gu + pr * 2 * F + F;
        Ad[i] = a->w2_bf16[e];
        Bd[i] = hp + pr * F;
        Cd[i] = xs + pr * D;
      }
      q += 9 * n;
      g0 += n;
    }
  cudaError_t ce = cudaMemcpyAsync(pbase, hpb, (size_t)E * 4, cudaMemcpyHostToDevice, st);
  if (bf && ce == cudaSuccess)
    ce = cudaMemcpyAsync(dptr, hptr, (size_t)9 * n_it * sizeof(void *), cudaMemcpyHostToDevice, st);
  dq_lane *lane = NULL;
  if (ce == cudaSuccess && overlap && !bf) rc = lane_of(cx, &lane);
  cudaStream_t ds = lane ? lane->st : st; /* where the dequantisation runs */
  if (!rc && ce == cudaSuccess && (parts & 1)) {
    dq_pad_kernel<<<pad_grid(tk), 128, 0, st>>>(a->x, a->ldx, a->gather_tok, a->expert_off, pbase,
                                                  E, (int)D, 1, xs);
    ce = cudaGetLastError();
  }
  if (!rc && ce == cudaSuccess && !(parts & 1)) { /* down alone (timing): h from the caller */
    dq_pad_kernel<<<pad_grid(tk), 128, 0, st>>>(a->h, F, NULL, a->expert_off, pbase, E, (int)F, 1,
                                                  hp);
    ce = cudaGetLastError();
  }
  /* the lane starts after everything queued on st so far (earlier users of the scratch) */
  if (!rc && lane && ce == cudaSuccess && (ce = cudaEventRecord(lane->start, st)) == cudaSuccess)
    ce = cudaStreamWaitEvent(ds, lane->start, 0);
  int job = 0; /* groups in order over both phases; group j uses buffer set j % 2 */
  for (int phase = 0; phase < 2 && !rc && ce == cudaSuccess; phase++) {
    if (!(parts & (1u << phase))) continue;
    int32_t q = 0; /* bf16 mode: the group's first pointer */
    for (int32_t g0 = 0; g0 < n_it && !rc && ce == cudaSuccess; job++) {
      const int n = group_len(it, n_it, g0);
      int32_t ids[K3K_CU_MOE_DQ_GROUP]; /* the experts to dequantise (not the bf16 mode) */
      for (int i = 0; !bf && i < n; i++) ids[i] = it[g0 + i].expert; /* n <= the group knob */
      const int sidx = job & 1;
      uint16_t *slot = set[sidx];
      const int64_t cap = it[g0].cap, pr0 = it[g0].prow0;
      if (bf) {
        rc = bf16_group(cx, hptr + q, dptr + q, n, phase, cap, F, D);
        q += 9 * n;
      }
      if (!bf && lane && job >= 2) ce = cudaStreamWaitEvent(ds, lane->used[sidx], 0);
      if (!bf && ce == cudaSuccess)
        rc = phase == 0 ? k3k_cu_mx_dequant_experts(ds, &a->w1, &a->w3, ids, n, a->F, a->D, slot,
                                                    slot_elems)
                        : k3k_cu_mx_dequant_experts(ds, &a->w2, NULL, ids, n, a->D, a->F, slot,
                                                    slot_elems);
      if (!rc && lane && ce == cudaSuccess) ce = cudaEventRecord(lane->dq[sidx], ds);
      if (!rc && lane && ce == cudaSuccess) ce = cudaStreamWaitEvent(st, lane->dq[sidx], 0);
      if (!bf && !rc && ce == cudaSuccess)
        rc = phase == 0 ? group_gemm(cx, slot, slot_elems, 2 * F, D, xs + pr0 * D, cap, n,
                                     gu + pr0 * 2 * F)
                        : group_gemm(cx, slot, slot_elems, D, F, hp + pr0 * F, cap, n,
                                     xs + pr0 * D);
      if (!rc && ce == cudaSuccess && phase == 0) { /* the group's padded rows, contiguous */
        const int64_t r1 = pr0 + n * cap;
        dq_act_kernel<<<grid_for((r1 - pr0) * (F / 8), 256, 8192), 256, 0, st>>>(aa, gu, (int)F,
                                                                                  pr0, r1, hp);
        ce = cudaGetLastError();
      }
      if (!rc && lane && ce == cudaSuccess) ce = cudaEventRecord(lane->used[sidx], st);
      g0 += n;
    }
  }
  if (!rc && ce == cudaSuccess && (parts & 2)) { /* plan order for the combine */
    dq_pad_kernel<<<pad_grid(tk), 128, 0, st>>>(xs, D, NULL, a->expert_off, pbase, E, (int)D, 0,
                                                  a->y);
    ce = cudaGetLastError();
  }
  if (!rc && ce == cudaSuccess && !(parts & 2)) { /* gate/up alone (timing): h to the caller */
    dq_pad_kernel<<<pad_grid(tk), 128, 0, st>>>(hp, F, NULL, a->expert_off, pbase, E, (int)F, 0,
                                                  a->h);
    ce = cudaGetLastError();
  }
  free(it);
  if (ce != cudaSuccess) {
    K3_ERROR("moe_dq: %s", cudaGetErrorString(ce));
    return K3_EDEVICE;
  }
  return rc;
}
