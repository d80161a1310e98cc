/* The device-side view of one grouped MXFP4 expert GEMM (k3k_cu_moe_gemm_args, moe_ops.h), shared
 * by its four kernels: mxfp4_tc.cu (mma.sync prefill, cp.async decode), mxfp4_dec.cu (register
 * streaming decode), mxfp4_wg.cu (wgmma prefill) and moe_generic.cu (any shape).
 *   - mx_dset: one weight set (packed codes + scales, per-expert pointer tables or base + stride)
 *     as a kernel parameter, with mx_packed / mx_scale for expert e's first row;
 *   - mx_fill_args: the host copy of the call's fields into a kernel's argument struct (any
 *     struct with the member names below; a kernel adds its own members beside them);
 *   - mx_act / mx_store_y: the epilogue every kernel applies: SiTU (spec §5.1) or silu·up of the
 *     fused gate/up pair, rounded to bf16 first in bf16 mode (round_inner), then a bf16 or fp32
 *     store.
 * What it is not: a kernel or a tiling; each file keeps its own. Header-only, inline. */
#ifndef K3K_CUDA_MXFP4_ARGS_CUH
#define K3K_CUDA_MXFP4_ARGS_CUH

#include "cuda_common.cuh"
#include "moe_ops.h"

struct mx_dset {
  const uint8_t *const *ptab, *const *stab; /* per-expert pointers, or NULL: base + e * stride */
  const uint8_t *pbase, *sbase;
  int64_t pes, ses, ldp, lds; /* expert strides and row pitches, bytes */
};

static inline mx_dset mx_dset_of(const k3k_cu_mx_set *s) {
  mx_dset m;
  m.ptab = s->packed_tab;
  m.stab = s->scale_tab;
  m.pbase = s->packed_base;
  m.sbase = s->scale_base;
  m.pes = s->estride_packed;
  m.ses = s->estride_scale;
  m.ldp = s->ld_packed;
  m.lds = s->ld_scale;
  return m;
}

__device__ __forceinline__ const uint8_t *mx_packed(const mx_dset &m, int e) {
  return m.ptab ? m.ptab[e] : m.pbase + (int64_t)e * m.pes;
}
__device__ __forceinline__ const uint8_t *mx_scale(const mx_dset &m, int e) {
  return m.stab ? m.stab[e] : m.sbase + (int64_t)e * m.ses;
}

/* The arguments of the mma.sync and wgmma kernels (mxfp4_tc.cu, mxfp4_wg.cu) as they are; the
 * decode and generic kernels add members of their own beside the same names. */
struct mx_kargs {
  mx_dset w, up;
  int act, round_inner;
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

/* G has members w, up (mx_dset), act, round_inner, beta, beta_lin, N, K, x, ldx, x_gather, y,
 * ldy, y_f32, expert_off, active, single_rows. The up set is the gate set when not fused. */
template <class G> static inline void mx_fill_args(G *g, const k3k_cu_moe_gemm_args *a) {
  const bool fused = a->act != K3K_CU_ACT_NONE;
  g->w = mx_dset_of(&a->w);
  g->up = mx_dset_of(fused ? &a->up : &a->w);
  g->act = a->act;
  g->round_inner = a->round_inner;
  g->beta = a->beta;
  g->beta_lin = a->beta_lin;
  g->N = a->N;
  g->K = a->K;
  g->x = a->x;
  g->ldx = a->ldx;
  g->x_gather = a->x_gather;
  g->y = a->y;
  g->ldy = a->ldy;
  g->y_f32 = a->y_f32;
  g->expert_off = a->expert_off;
  g->active = a->active;
  g->single_rows = a->single_rows;
}

/* The fused gate/up epilogue: SiTU(g, u) = β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin), else
 * silu(g)·u; g and u rounded to bf16 first when round_inner. */
template <class G> __device__ __forceinline__ float mx_act(const G &a, float g, float u) {
  if (a.round_inner) {
    g = round_bf(g);
    u = round_bf(u);
  }
  if (a.act == K3K_CU_ACT_SITU)
    return a.beta * tanhf(g / a.beta) * (1.0f / (1.0f + expf(-g))) * (a.beta_lin * tanhf(u / a.beta_lin));
  return g * (1.0f / (1.0f + expf(-g))) * u;
}

template <class G>
__device__ __forceinline__ void mx_store_y(const G &a, int64_t row, int n, float v) {
  int64_t off = row * a.ldy + n;
  if (a.y_f32)
    ((float *)a.y)[off] = v;
  else
    ((uint16_t *)a.y)[off] = f2bf(v);
}

/* The grid row `slot`'s expert and its grouped rows [rb, re) (a single matrix: all rows); false
 * when the block has nothing to do (it returns whole: no barrier is skipped unevenly). */
template <class G>
__device__ __forceinline__ bool mx_expert_rows(const G &a, int slot, int &e, int &rb, int &re) {
  if (a.expert_off) {
    if (slot >= a.active[0]) return false;
    e = a.active[1 + slot];
    rb = a.expert_off[e];
    re = a.expert_off[e + 1];
  } else {
    e = 0;
    rb = 0;
    re = a.single_rows;
  }
  return rb < re;
}

/* Stores a pair of m16n8 accumulator fragments: c[m][2h + j] is (row g + 8h of half m, token
 * t0 + j); gate/up (FUSED): half 0 = gate, half 1 = up of rows row0 + g + 8h, through mx_act;
 * otherwise half m is rows row0 + 16m.. (stored when valid[m]). Tokens from re on are skipped. */
template <bool FUSED, class G>
__device__ __forceinline__ void mx_store_frags(const G &a, const float (&c)[2][4], int t0, int re,
                                               int row0, int g, const bool (&valid)[2]) {
#pragma unroll
  for (int j = 0; j < 2; j++) {
    const int t = t0 + j;
    if (t >= re) continue;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      if (FUSED) {
        mx_store_y(a, t, row0 + g + 8 * h, mx_act(a, c[0][2 * h + j], c[1][2 * h + j]));
      } else {
#pragma unroll
        for (int m = 0; m < 2; m++)
          if (valid[m]) mx_store_y(a, t, row0 + 16 * m + g + 8 * h, c[m][2 * h + j]);
      }
    }
  }
}

#endif
