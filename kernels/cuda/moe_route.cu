/* Router + MoE plan in one launch for decode-sized batches (k3k_cu_moe_route_plan).
 *
 * What it is for: at decode the MoE block's routing used to be 4 launches (ROUTER op, plan
 * count, single-block scan, assign) and cost 35-41 µs, mostly launch ramps and serial
 * single-thread steps. Here one block of 512 threads does everything for T·k <= 4096:
 *   1. router, one warp per token: all E logits of the token are loaded at once (one round
 *      trip); each lane keeps its E/32 biased scores in registers (s goes to shared memory for
 *      the weights) and a sorted cache of its 4 best; k rounds of a warp arg-max over the
 *      cache heads (ties to the lower index, like the reference); the winner's lane pops its
 *      head and rescans its registers only when its cache ran dry (candidates worse than the
 *      last one taken: all better ones are gone, so no taken flags). Weights are summed and
 *      renormalised by lane 0 in selection order (same float operations as kernels/cpu/moe.c).
 *   1'. for few tokens of few experts (T <= 4, T·E² <= 2^16: decode at batch 1 up to E = 256)
 *      the warp form's k serial arg-max rounds (~18 µs at E = 256, k = 16) are replaced by
 *      ranks: the block computes each candidate's rank (the number of candidates before it in
 *      the reference order: a higher biased score, or the same at a lower index; NaN scores
 *      rank last), the first k ranks are the same choices in the same order, and one thread
 *      sums/renormalises as above.
 *   2. plan, a stable counting sort of the T·k (token, choice) pairs by expert, identical to
 *      k3k_moe_plan (by expert, then token, then choice): each warp owns a contiguous segment
 *      of pairs and ranks them per expert with __match_any_sync (a pair's rank = same-expert
 *      pairs before it in the segment); per expert the 16 segment counts become bases, then
 *      two block scans over E give expert_off and the active list; each pair's row =
 *      expert_off[e] + segment base + rank.
 * What it is not: the grouped (n_groups > 1) router, batches above 32 tokens (measured: the
 * block's serial token rounds then cost more than the multi-block ROUTER kernel), E > 1024,
 * k > 32, logits other than F32 with unit column stride, strided bias: those take the ROUTER
 * kernel + k3k_cu_moe_plan (same results, 4 launches).
 * Invariants: outputs equal the ROUTER op's and k3k_cu_moe_plan's for the same inputs (both
 * router forms give bit-identical ids and weights); no atomics decide any order; nothing
 * synchronises. Launched with PDL (pdl.cuh): waits for the logits, then lets the next kernel
 * be scheduled. */
#include "cuda_common.cuh"
#include "moe_ops.h"
#include "pdl.cuh"

#define RP_THREADS 512
#define RP_WARPS 16
#define RP_MAXE 1024 /* E/32 scores per lane in registers */
#define RP_MAXPAIRS 4096
#define RP_MAX_TOKENS 32 /* above: the 4-launch form is faster (k3k_cu_moe_route_plan) */
#define RP_CACHE 4 /* candidates per lane kept sorted between rescans */

namespace {

__device__ __forceinline__ bool rp_better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

struct rp_args {
  const float *lg;
  int64_t ld_lg;
  const void *bias; /* [E], unit stride */
  int bias_bf16;
  int32_t *idx;
  int64_t ld_idx;
  float *wt;
  int64_t ld_w;
  int T, E, k, renorm, biased;
  int rank_mode, rank_tpc; /* 1: the block ranks the candidates (few tokens); threads per one */
  float scaling;
  int32_t *expert_off, *gather_tok, *row_idx, *active;
};

/* Dynamic shared memory: svs [warps][E] f32 (s), sidx [T*k] i32, rank [T*k] u16,
 * cnt [warps][E] u16, soff [E] i32. */
__global__ void __launch_bounds__(RP_THREADS, 1) route_plan_kernel(rp_args a) {
  extern __shared__ __align__(16) unsigned char rsm[];
  __shared__ int tmp[32];
  __shared__ float wbuf[RP_WARPS][32]; /* each warp's chosen weights, selection order */
  const int P = a.T * a.k, E = a.E, k = a.k;
  float *svs = reinterpret_cast<float *>(rsm);
  int32_t *sidx = reinterpret_cast<int32_t *>(svs + RP_WARPS * E);
  uint16_t *rank = reinterpret_cast<uint16_t *>(sidx + P);
  uint16_t *cnt = rank + ((P + 1) & ~1);
  int *soff = reinterpret_cast<int *>(cnt + ((RP_WARPS * E + 1) & ~1)); /* [E] expert_off */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  pdl_wait(); /* the logits are the previous kernel's output (read with plain loads: an
               * __ldg is an invariant load the compiler may hoist above the wait) */
  pdl_trigger();
  for (int i = threadIdx.x; i < RP_WARPS * E; i += RP_THREADS) cnt[i] = 0;

  if (a.rank_mode) { /* 1'. router by ranks, the whole block per token (few tokens) */
    float *ssv = svs, *ssc = svs + E, *skey = svs + 2 * E; /* s, s + bias, ranking key */
    const int tpc = a.rank_tpc, part = threadIdx.x & (tpc - 1), per = RP_THREADS / tpc;
    for (int t = 0; t < a.T; t++) {
      const float *lrow = a.lg + (int64_t)t * a.ld_lg;
      for (int e = threadIdx.x; e < E; e += RP_THREADS) {
        const float l = lrow[e];
        const float b = a.bias_bf16 ? bf2f(((const uint16_t *)a.bias)[e])
                                    : ((const float *)a.bias)[e];
        const float sj = 1.0f / (1.0f + expf(-l)); /* s, as the reference */
        const float v = sj + b;
        ssv[e] = sj;
        ssc[e] = v;
        skey[e] = v != v ? -INFINITY : v; /* NaN ranks last (a total order) */
      }
      __syncthreads();
      /* rank of e = candidates before it in the reference order (higher score, or the same
       * score at a lower index); the tpc threads of a candidate split j and add their counts */
      for (int c0 = 0; c0 < E; c0 += per) {
        const int e = c0 + threadIdx.x / tpc;
        int r = 0;
        if (e < E) {
          const float v = skey[e];
          for (int j = part; j < E; j += tpc) {
            const float u = skey[j];
            r += (u > v) || (u == v && j < e);
          }
        }
        for (int o = tpc >> 1; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
        if (e < E && part == 0 && r < k) {
          wbuf[0][r] = a.biased ? ssc[e] : ssv[e];
          a.idx[(int64_t)t * a.ld_idx + r] = e;
          sidx[t * k + r] = e;
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) { /* the reference's sum and second pass, same order and operations */
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) wsum += wbuf[0][j];
        for (int j = 0; j < k; j++) {
          float w = wbuf[0][j];
          if (a.renorm) w = w / (wsum + 1e-20f);
          a.wt[(int64_t)t * a.ld_w + j] = w * a.scaling;
        }
      }
      __syncthreads(); /* wbuf and the score arrays are rewritten by the next token */
    }
  }

  /* 1. router: warp per token. Every load of a token is issued before any use (one round
   * trip), and the winner's lane, which holds its scores, writes the choice. */
  for (int t = a.rank_mode ? a.T : warp; t < a.T; t += RP_WARPS) {
    const float *lrow = a.lg + (int64_t)t * a.ld_lg;
    float *sv = svs + warp * E; /* s of this token, for the weights */
    float lv[RP_MAXE / 32], bv_[RP_MAXE / 32];
#pragma unroll
    for (int j = 0; j < RP_MAXE / 32; j++) lv[j] = lane + 32 * j < E ? lrow[lane + 32 * j] : 0.0f;
    if (a.bias_bf16) {
#pragma unroll
      for (int j = 0; j < RP_MAXE / 32; j++)
        bv_[j] = lane + 32 * j < E ? bf2f(((const uint16_t *)a.bias)[lane + 32 * j]) : 0.0f;
    } else {
#pragma unroll
      for (int j = 0; j < RP_MAXE / 32; j++)
        bv_[j] = lane + 32 * j < E ? ((const float *)a.bias)[lane + 32 * j] : 0.0f;
    }
    float sc[RP_MAXE / 32];
#pragma unroll
    for (int j = 0; j < RP_MAXE / 32; j++) {
      const int e = lane + 32 * j;
      sc[j] = 0.0f;
      if (e < E) {
        const float sj = 1.0f / (1.0f + expf(-lv[j])); /* s, as the reference */
        sc[j] = sj + bv_[j];
        sv[e] = sj;
      }
    }
    /* The lane's RP_CACHE best candidates worse than (tv, ti) in the reference order (all
     * better ones were taken already), best first; ci = -1 pads. */
    float cv[RP_CACHE];
    int ci[RP_CACHE];
    bool more = true; /* the lane may hold candidates beyond its cache */
    auto refill = [&](float tv, int ti) {
#pragma unroll
      for (int c = 0; c < RP_CACHE; c++) {
        cv[c] = 0.0f;
        ci[c] = -1;
      }
      int n = 0;
#pragma unroll
      for (int j = 0; j < RP_MAXE / 32; j++) {
        const int e = lane + 32 * j;
        const float v = sc[j];
        const bool cand = e < E && (ti < 0 || rp_better(tv, ti, v, e));
        n += cand;
        if (cand && rp_better(v, e, cv[RP_CACHE - 1], ci[RP_CACHE - 1])) {
          cv[RP_CACHE - 1] = v;
          ci[RP_CACHE - 1] = e;
#pragma unroll
          for (int c = RP_CACHE - 1; c > 0; c--)
            if (rp_better(cv[c], ci[c], cv[c - 1], ci[c - 1])) {
              const float tvv = cv[c];
              const int tii = ci[c];
              cv[c] = cv[c - 1];
              ci[c] = ci[c - 1];
              cv[c - 1] = tvv;
              ci[c - 1] = tii;
            }
        }
      }
      more = n > RP_CACHE;
    };
    refill(0.0f, -1);
    for (int j = 0; j < k; j++) {
      float v = cv[0];
      int i = ci[0];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (rp_better(ov, oi, v, i)) {
          v = ov;
          i = oi;
        }
      }
      if ((i & 31) == lane) { /* the winner's lane records it and drops it from its cache */
        wbuf[warp][j] = a.biased ? v : sv[i];
        a.idx[(int64_t)t * a.ld_idx + j] = i;
        sidx[t * k + j] = i;
#pragma unroll
        for (int c = 0; c < RP_CACHE - 1; c++) {
          cv[c] = cv[c + 1];
          ci[c] = ci[c + 1];
        }
        ci[RP_CACHE - 1] = -1;
        if (ci[0] < 0 && more) refill(v, i);
      }
      __syncwarp();
    }
    __syncwarp();
    if (lane == 0) { /* the reference's sum and second pass, same order and operations */
      float wsum = 0.0f;
      for (int j = 0; j < k; j++) wsum += wbuf[warp][j];
      for (int j = 0; j < k; j++) {
        float w = wbuf[warp][j];
        if (a.renorm) w = w / (wsum + 1e-20f);
        a.wt[(int64_t)t * a.ld_w + j] = w * a.scaling;
      }
    }
    __syncwarp();
  }
  __syncthreads();

  /* 2a. per-segment ranks and counts: warp w owns pairs [p0, p1) */
  const int p0 = (int)((int64_t)warp * P / RP_WARPS), p1 = (int)((int64_t)(warp + 1) * P / RP_WARPS);
  uint16_t *mycnt = cnt + warp * E;
  for (int pb = p0; pb < p1; pb += 32) {
    const int p = pb + lane;
    const bool in = p < p1;
    const unsigned mask = __ballot_sync(0xffffffffu, in);
    if (in) {
      const int e = sidx[p];
      const unsigned peers = __match_any_sync(mask, e);
      const int leader = __ffs(peers) - 1;
      const int before = __popc(peers & ((1u << lane) - 1u));
      int base = 0;
      if (lane == leader) base = mycnt[e];
      base = __shfl_sync(peers, base, leader);
      rank[p] = (uint16_t)(base + before);
      __syncwarp(peers);
      if (lane == leader) mycnt[e] = (uint16_t)(base + __popc(peers));
    }
    __syncwarp();
  }
  __syncthreads();

  /* 2b. per expert: segment bases, totals, expert_off and the active list */
  int run_rows = 0, run_act = 0;
  for (int e0 = 0; e0 < E; e0 += RP_THREADS) { /* E <= 1024: at most two passes */
    const int e = e0 + threadIdx.x;
    int tot = 0;
    if (e < E)
      for (int w = 0; w < RP_WARPS; w++) {
        const int c = cnt[w * E + e]; /* segment w's count → its base */
        cnt[w * E + e] = (uint16_t)tot;
        tot += c;
      }
    int sum_rows, sum_act;
    const int off = block_excl_scan_w<RP_WARPS>(tot, tmp, &sum_rows);
    const int act = block_excl_scan_w<RP_WARPS>(tot > 0, tmp, &sum_act);
    if (e < E) {
      soff[e] = run_rows + off;
      a.expert_off[e] = run_rows + off;
      if (tot > 0) a.active[1 + run_act + act] = e;
    }
    run_rows += sum_rows;
    run_act += sum_act;
  }
  if (threadIdx.x == 0) {
    a.expert_off[E] = run_rows;
    a.active[0] = run_act;
  }
  __syncthreads(); /* soff and the segment bases are visible */

  /* 2c. rows: expert_off[e] + segment base + rank */
  for (int p = p0 + lane; p < p1; p += 32) {
    const int e = sidx[p];
    const int r = soff[e] + cnt[warp * E + e] + rank[p];
    a.gather_tok[r] = p / k;
    a.row_idx[p] = r;
  }
}

} // namespace

int k3k_cu_moe_route_plan(cudaStream_t st, const k3k_router_params_t *p, const k3k_tensor_t *lg,
                          const k3k_tensor_t *bias, const k3k_tensor_t *idx, const k3k_tensor_t *wt,
                          int32_t *expert_off, int32_t *gather_tok, int32_t *row_idx,
                          int32_t *active, void *scratch) {
  const int64_t T = lg->shape[0], E = lg->shape[1], k = p->top_k;
  if (E <= 0 || E > 8192 || k <= 0 || k > E || T < 0 || T > INT32_MAX / 256 ||
      idx->shape[0] != T || idx->shape[1] != k || wt->shape[0] != T || wt->shape[1] != k ||
      idx->stride[1] != 1 || wt->stride[1] != 1 || bias->shape[0] != E ||
      idx->dtype != K3K_I32 || wt->dtype != K3K_F32 || p->n_groups < 1 || p->n_groups > 256 ||
      E % p->n_groups || p->topk_group < 1 || p->topk_group > p->n_groups || k > 256 ||
      k > (int64_t)p->topk_group * (E / p->n_groups))
    return K3_EINVAL;
  /* Above RP_MAX_TOKENS the single block's serial token rounds cost more than the multi-block
   * ROUTER kernel + 3-launch plan (H200, E = 256, k = 16, session 12: one launch 14 / 21 / 39 /
   * 70 / 131 us at T = 1 / 16 / 32 / 64 / 128 against 27 / 32 / 37 / 49 / 69 us). */
  if (p->n_groups > 1 || T > RP_MAX_TOKENS || T * k > RP_MAXPAIRS || E > RP_MAXE || k > 32 || lg->dtype != K3K_F32 ||
      lg->stride[1] != 1 || bias->stride[0] != 1 || (bias->dtype != K3K_F32 && bias->dtype != K3K_BF16)) {
    const k3k_tensor_t *t4[4] = {lg, bias, idx, wt};
    int rc = k3k_cu_router_launch(st, p, t4);
    if (rc) return rc;
    return k3k_cu_moe_plan(st, (const int32_t *)idx->data, (int32_t)T, (int32_t)k, (int32_t)E,
                           expert_off, gather_tok, row_idx, active, NULL, scratch);
  }
  if (T == 0) { /* an empty plan, like k3k_cu_moe_plan's */
    return k3k_cu_moe_plan(st, (const int32_t *)idx->data, 0, (int32_t)k, (int32_t)E,
                           expert_off, gather_tok, row_idx, active, NULL, scratch);
  }
  rp_args a;
  a.lg = (const float *)lg->data;
  a.ld_lg = lg->stride[0];
  a.bias = bias->data;
  a.bias_bf16 = bias->dtype == K3K_BF16;
  a.idx = (int32_t *)idx->data;
  a.ld_idx = idx->stride[0];
  a.wt = (float *)wt->data;
  a.ld_w = wt->stride[0];
  a.T = (int)T;
  a.E = (int)E;
  a.k = (int)k;
  a.renorm = p->renormalize;
  a.biased = p->use_biased_weights;
  a.scaling = p->scaling;
  /* The rank form handles one token at a time with the whole block and T·E²/512 comparisons
   * per thread; the warp form runs 16 tokens at once but each through k serial arg-max rounds.
   * Measured route + plan (k3k-gpu-moe --perf, H200, 2026-12-03, k = 16): E = 256, T = 1: rank
   * 14.0 µs (warp ~19); T = 4: rank 35.6 µs (worse than the warp form's ~19-22 µs); E = 896,
   * T = 1: rank 89.3 µs (2026-12-02) vs warp 22.4 µs. So the rank form only where T·E² <= 2^16:
   * one token at up to 256 experts (decode at batch 1 of the medium preset), T <= 4 always
   * (the block takes the tokens one after another). */
  a.rank_mode = T <= 4 && T * E * E <= (1 << 16);
  a.rank_tpc = 1;
  while (a.rank_tpc < 32 && E * a.rank_tpc * 2 <= RP_THREADS) a.rank_tpc *= 2;
  a.expert_off = expert_off;
  a.gather_tok = gather_tok;
  a.row_idx = row_idx;
  a.active = active;
  const int P = (int)(T * k);
  const size_t smem = (size_t)RP_WARPS * E * 4 + (size_t)P * 4 + (size_t)((P + 1) & ~1) * 2 +
                      (size_t)((RP_WARPS * E + 1) & ~1) * 2 + (size_t)E * 4;
  static bool lim;
  if (!lim) {
    K3K_CU(cudaFuncSetAttribute(route_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(RP_WARPS * RP_MAXE * 4 + RP_MAXPAIRS * 6 + RP_WARPS * RP_MAXE * 2 + 4 +
                                      RP_MAXE * 4)));
    lim = true;
  }
  K3K_CU(pdl_launch(route_plan_kernel, dim3(1), dim3(RP_THREADS), smem, st, a));
  K3K_LAUNCHED("moe_route_plan");
  return 0;
}
