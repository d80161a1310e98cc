/* CUDA: KDA_CHUNK, the chunked KDA prefill of spec §3.8 (WY/UT form, chunk 64): the op entry,
 * the chunk table and the sequential state pass.
 *
 * What it is for: prefill of the 69 KDA layers. The op is split (kda_chunk.cuh) into a fully
 * parallel intra-chunk kernel over (chunk, head) (kda_chunk_intra.cu) and, here, a thin
 * sequential pass that carries the fp32 state through a sequence's chunks. The recurrence
 * separates over value columns (Vn[:,v], O[:,v] and S[v][:] only involve column v), so one
 * block owns 32 value columns of one head: 4 blocks per head, 384 blocks for 96 heads, three
 * resident per SM (71 KB shared memory each), i.e. one wave for an 8K sequence. Per chunk:
 *   Vn = U - W S            (S as bf16 operand, fp32 accumulate; Vn -> bf16)
 *   O  = (q e^G) S + Aqk Vn (-> o)
 *   S  = e^{G_last} S + (k e^{G_last-G})^T Vn   (fp32 accumulators held in registers)
 * Operands stream in by cp.async into an XOR-swizzled single buffer, staggered so the next
 * chunk's W, q e^G arrive while this chunk's O and S update run, and its Aqk, k e^{Gl-G} while
 * the next Vn runs.
 * What it is not: the decode step (kda.cu) or a general Dk/Dv kernel: Dk = Dv = 128, chunk 64.
 * Numerics vs the all-fp32 reference: q, k, v, e^G factors, T, W, U, Vn, Aqk and S enter the
 * tensor cores as bf16 (relative 2^-9 each, fp32 accumulate), so the fp32 state and the output
 * agree to ~1e-3 relative (docs/perf-gpu.md states the tolerance used and why).
 * Invariants: cu_seqlens and slots are checked on the device before any write (check.cu), so
 * bad ids return K3_ERANGE / K3_EINVAL with nothing changed; sequences of length 0 keep their
 * state. Scratch: ((T+63)/64 + N) * NH records of 74 KB (kda_chunk.cuh) + the chunk table. */
#include "kda_chunk.cuh"

/* State-pass shared memory (bytes), for VS value columns per block. */
#define KB_W 0     /* W  bf16 [64][128] swizzled */
#define KB_Q 16384 /* q e^G */
#define KB_K 32768 /* k e^{Gl-G} */
#define KB_A 49152 /* Aqk bf16 [64][64] swizzled */
#define KB_S 57344 /* S slice bf16 [VS][128] swizzled */
template <int VS>
struct kb_lay {
  static constexpr int VP = VS + 8;                  /* Vn pitch: conflict-free ldmatrix.trans */
  static constexpr int V = KB_S + VS * 256;          /* Vn bf16 [64][VP] */
  static constexpr int E = V + 64 * VP * 2;          /* e^{G_last} fp32 [128] */
  static constexpr int SMEM = E + 512;
};

/* cfirst[i] = sum_{j<i} ceil(len_j / 64); one block. */
__global__ void kc_table_kernel(const int32_t *cu, int64_t cu_s, int n, int32_t *cf) {
  __shared__ int part[1024];
  const int t = threadIdx.x, per = (n + 1023) / 1024, b = min(n, t * per), e = min(n, b + per);
  int s = 0;
  for (int i = b; i < e; i++) s += (cu[(i + 1) * cu_s] - cu[i * cu_s] + KC_C - 1) / KC_C;
  part[t] = s;
  __syncthreads();
  for (int off = 1; off < 1024; off <<= 1) {
    int v = t >= off ? part[t - off] : 0;
    __syncthreads();
    part[t] += v;
    __syncthreads();
  }
  int run = t ? part[t - 1] : 0;
  if (t == 0) cf[0] = 0;
  for (int i = b; i < e; i++) {
    run += (cu[(i + 1) * cu_s] - cu[i * cu_s] + KC_C - 1) / KC_C;
    cf[i + 1] = run;
  }
}

__device__ __forceinline__ void kb_load_early(unsigned char *sm, const unsigned char *rec) {
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) {
    const unsigned off = kc_swz(i >> 4, (i & 15) * 8, 16);
    cp_async16(sm + KB_W + off, rec + KC_REC_W + i * 16, true);
    cp_async16(sm + KB_Q + off, rec + KC_REC_Q + i * 16, true);
  }
}
__device__ __forceinline__ void kb_load_late(unsigned char *sm, const unsigned char *rec, int e_off) {
  for (int i = threadIdx.x; i < 1024; i += blockDim.x)
    cp_async16(sm + KB_K + kc_swz(i >> 4, (i & 15) * 8, 16), rec + KC_REC_K + i * 16, true);
  for (int i = threadIdx.x; i < 512; i += blockDim.x)
    cp_async16(sm + KB_A + kc_swz(i >> 3, (i & 7) * 8, 8), rec + KC_REC_A + i * 16, true);
  if (threadIdx.x < 32) cp_async16(sm + e_off + threadIdx.x * 16, rec + KC_REC_E + threadIdx.x * 16, true);
}

/* VS value columns per block, NW warps. Output tiles (Vn, O: 64 x VS): warp w owns rows
 * 16*(w%4) and NT 8-wide value tiles starting at v = (w/4)*VS/(NW/4). State tiles (VS x 128):
 * warp w owns value rows 16*(w%(VS/16)) and SNT 8-wide key tiles starting at
 * k = (w/(VS/16))*128/KG. */
template <int VS, int NW, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) kc_state_kernel(kc_args a) {
  typedef kb_lay<VS> L;
  constexpr int NG = NW / 4, NT = VS / 8 / NG, SMT = VS / 16, KG = NW / SMT, SNT = 16 / KG;
  static_assert(NW % 4 == 0 && NT % 2 == 0 && NW % SMT == 0 && SNT % 2 == 0, "tiling");
  extern __shared__ __align__(16) unsigned char sm[];
  const kc_bf *sV = (const kc_bf *)(sm + L::V);
  const float *sE = (const float *)(sm + L::E);
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int mi = lane >> 3;
  const int v0 = blockIdx.x * VS, h = a.h0 + blockIdx.y, seq = blockIdx.z;
  const int start = a.cu[seq * a.cu_s], end = a.cu[(seq + 1) * a.cu_s];
  if (end <= start) return; /* length 0 keeps its state */
  const int c0 = a.cfirst[seq], c1 = a.cfirst[seq + 1];
  float *Sg = a.state + a.slots[seq * a.sl_s] * a.st_slot + ((int64_t)h * KC_D + v0) * KC_D;
  const int64_t ocol = (int64_t)h * KC_D + v0;
  const int mt = w & 3, nb = (w >> 2) * (VS / NG); /* output tile */

  /* State slice in registers as mma accumulators: S[j][q] is (v = mv + g + 8(q>>1),
   * k = kb + 8j + 2t4 + (q&1)). */
  const int mv = (w % SMT) * 16, kb = (w / SMT) * (128 / KG);
  float S[SNT][4];
#pragma unroll
  for (int j = 0; j < SNT; j++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int v = mv + g + hh * 8, k = kb + j * 8 + 2 * t4;
      float2 x = a.read_state ? *(const float2 *)(Sg + (int64_t)v * KC_D + k) : make_float2(0.0f, 0.0f);
      S[j][2 * hh] = x.x, S[j][2 * hh + 1] = x.y;
      *(uint32_t *)(sm + KB_S + kc_swz(v, k, 16)) = pack_bf2(x.x, x.y);
    }

  const unsigned char *rec = a.rec + ((size_t)c0 * a.hg + blockIdx.y) * KC_REC;
  kb_load_early(sm, rec);
  cp_async_commit();
  kb_load_late(sm, rec, L::E);
  cp_async_commit();
  uint32_t Ur[NT][2]; /* U (bf16 pairs) at this lane's Vn fragment positions */
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      Ur[j][hh] = *(const uint32_t *)(rec + KC_REC_U + ((16 * mt + g + 8 * hh) * KC_D + v0 + nb + 8 * j + 2 * t4) * 2);

  for (int c = c0; c < c1; c++) {
    const int cs = start + (c - c0) * KC_C, n = min(KC_C, end - cs);
    const unsigned char *nrec = a.rec + ((size_t)(c + 1) * a.hg + blockIdx.y) * KC_REC;
    cp_async_wait<1>();
    __syncthreads(); /* W, q e^G of chunk c landed; S (bf16) of the previous chunk written */

    /* Vn = U - W S and Qs = (q e^G) S: rows 16mt.., NT value tiles from nb, K = 128. */
    float P[NT][4], Qs[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int q2 = 0; q2 < 4; q2++) P[j][q2] = Qs[j][q2] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      uint32_t aw[4], aq[4];
      const unsigned ao = kc_swz(16 * mt + (lane & 15), ks * 16 + (lane >> 4) * 8, 16);
      ldsm_x4(aw, sm + KB_W + ao);
      ldsm_x4(aq, sm + KB_Q + ao);
#pragma unroll
      for (int jj = 0; jj < NT / 2; jj++) {
        uint32_t b[4];
        ldsm_x4(b, sm + KB_S + kc_swz(nb + jj * 16 + (lane & 7) + (mi >> 1) * 8, ks * 16 + (mi & 1) * 8, 16));
        mma_bf16(P[2 * jj], aw, b[0], b[1]);
        mma_bf16(P[2 * jj + 1], aw, b[2], b[3]);
        mma_bf16(Qs[2 * jj], aq, b[0], b[1]);
        mma_bf16(Qs[2 * jj + 1], aq, b[2], b[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const uint32_t u = Ur[j][hh];
        const float u0 = __uint_as_float(u << 16), u1 = __uint_as_float(u & 0xffff0000u);
        *(uint32_t *)(sm + L::V + ((16 * mt + g + 8 * hh) * L::VP + nb + 8 * j + 2 * t4) * 2) =
            pack_bf2(u0 - P[j][2 * hh], u1 - P[j][2 * hh + 1]);
      }
    cp_async_wait<0>();
    __syncthreads(); /* Vn complete; Aqk, k e^{Gl-G}, e^{Gl} landed; W, q e^G, S bf16 free */
    if (c + 1 < c1) {
      kb_load_early(sm, nrec);
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
          Ur[j][hh] = *(const uint32_t *)(nrec + KC_REC_U + ((16 * mt + g + 8 * hh) * KC_D + v0 + nb + 8 * j + 2 * t4) * 2);
    }
    cp_async_commit();

    /* O = Qs + Aqk Vn (Aqk lower-triangular: k-steps <= mt). */
    for (int ks = 0; ks <= mt; ks++) {
      uint32_t aa[4];
      ldsm_x4(aa, sm + KB_A + kc_swz(16 * mt + (lane & 15), ks * 16 + (lane >> 4) * 8, 8));
      const kc_bf *vb = sV + (ks * 16 + (lane & 7) + (mi & 1) * 8) * L::VP + nb + (mi >> 1) * 8;
#pragma unroll
      for (int jj = 0; jj < NT / 2; jj++) {
        uint32_t b[4];
        ldsm_x4_trans(b, vb + jj * 16);
        mma_bf16(Qs[2 * jj], aa, b[0], b[1]);
        mma_bf16(Qs[2 * jj + 1], aa, b[2], b[3]);
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int r = 16 * mt + g + 8 * hh;
      if (r >= n) continue;
      const int64_t row = (int64_t)(cs + r);
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int64_t col = ocol + nb + 8 * j + 2 * t4;
        if (a.vo)
          *(uint32_t *)((uint16_t *)a.o.p + row * a.o.s[0] + col) = pack_bf2(Qs[j][2 * hh], Qs[j][2 * hh + 1]);
        else {
          dv_st(a.o, row * a.o.s[0] + col * a.o.s[1], Qs[j][2 * hh]);
          dv_st(a.o, row * a.o.s[0] + (col + 1) * a.o.s[1], Qs[j][2 * hh + 1]);
        }
      }
    }

    /* S = e^{Gl} S + Vn^T (k e^{Gl-G}): M = value rows, N = key columns, K = 64 chunk rows. */
#pragma unroll
    for (int j = 0; j < SNT; j++) {
      const float2 e = *(const float2 *)(sE + kb + 8 * j + 2 * t4);
      S[j][0] *= e.x, S[j][1] *= e.y, S[j][2] *= e.x, S[j][3] *= e.y;
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
      uint32_t av[4];
      ldsm_x4_trans(av, sV + (ks * 16 + (lane & 7) + (mi >> 1) * 8) * L::VP + mv + (mi & 1) * 8);
#pragma unroll
      for (int jj = 0; jj < SNT / 2; jj++) {
        uint32_t b[4];
        ldsm_x4_trans(b, sm + KB_K + kc_swz(ks * 16 + (lane & 7) + (mi & 1) * 8, kb + jj * 16 + (mi >> 1) * 8, 16));
        mma_bf16(S[2 * jj], av, b[0], b[1]);
        mma_bf16(S[2 * jj + 1], av, b[2], b[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < SNT; j++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
        *(uint32_t *)(sm + KB_S + kc_swz(mv + g + 8 * hh, kb + 8 * j + 2 * t4, 16)) =
            pack_bf2(S[j][2 * hh], S[j][2 * hh + 1]);
    __syncthreads(); /* Aqk, k e^{Gl-G}, e^{Gl}, Vn free */
    if (c + 1 < c1) kb_load_late(sm, nrec, L::E);
    cp_async_commit();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < SNT; j++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      *(float2 *)(Sg + (int64_t)(mv + g + 8 * hh) * KC_D + kb + 8 * j + 2 * t4) =
          make_float2(S[j][2 * hh], S[j][2 * hh + 1]);
}

/* Launches the state pass with VS value columns per block (128 / VS blocks per head). */
template <int VS, int NW, int MINB>
static int kc_state_launch(const kc_args &a, cudaStream_t st) {
  static bool attr_set = false; /* per process: the attribute belongs to the kernel */
  if (!attr_set) {
    K3K_CU(cudaFuncSetAttribute(kc_state_kernel<VS, NW, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kb_lay<VS>::SMEM));
    attr_set = true;
  }
  kc_state_kernel<VS, NW, MINB><<<dim3(128 / VS, a.hg, a.n_seqs), NW * 32, kb_lay<VS>::SMEM, st>>>(a);
  K3K_LAUNCHED("kda_chunk state");
  return 0;
}

bool k3k_cuda_kda_chunk_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  const k3k_tensor_t *st = t[7];
  return (p->chunk == 0 || p->chunk == 64) && t[0]->shape[1] == (int64_t)p->n_heads * 128 &&
         t[2]->shape[1] == (int64_t)p->n_heads * 128 && st->ndim == 4 && st->shape[2] == 128 &&
         st->shape[3] == 128 && st->stride[3] == 1 && st->stride[2] == 128 &&
         st->stride[1] == 128 * 128 && p->n_heads <= 65535 && p->n_seqs <= 65535 &&
         t[0]->shape[0] < INT32_MAX;
}

/* Rows contiguous and 16-byte aligned, so 8 consecutive channels are one or two vector loads. */
static int kc_vec(const k3k_tensor_t *t) {
  const int64_t es = t->dtype == K3K_F32 ? 4 : 2;
  return t->ndim == 2 && t->stride[1] == 1 && (t->stride[0] * es) % 16 == 0 &&
         ((uintptr_t)t->data & 15) == 0 && (t->dtype == K3K_F32 || t->dtype == K3K_BF16);
}

int k3k_cuda_kda_chunk(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  int rc;
  if (p->n_seqs == 0) return 0;
  if ((rc = k3k_cuda_check_seqs(cx, t[5], p->n_seqs, t[0]->shape[0])) ||
      (rc = k3k_cuda_check_ids(cx, t[6], p->n_seqs, t[7]->shape[0], 1, 0)))
    return rc;
  /* Chunk slots: sum_i ceil(len_i / 64) <= ceil(T / 64) + N. Heads in groups of hg so the
   * records stay within ~1 GiB (one group for 8K tokens x 96 heads: 0.92 GB). */
  const int64_t slots = (t[0]->shape[0] + KC_C - 1) / KC_C + p->n_seqs;
  const int64_t per_head = slots * KC_REC;
  const int hg = (int)(per_head >= (1ll << 30) ? 1 : (1ll << 30) / per_head < p->n_heads ? (1ll << 30) / per_head : p->n_heads);
  const size_t rec_bytes = (size_t)slots * hg * KC_REC;
  void *sc;
  if ((rc = k3k_cuda_scratch(cx, rec_bytes + (size_t)(p->n_seqs + 1) * sizeof(int32_t), &sc))) return rc;
  kc_args a;
  a.q = mkdv(t[0]), a.k = mkdv(t[1]), a.v = mkdv(t[2]), a.g = mkdv(t[3]), a.beta = mkdv(t[4]);
  a.o = mkdv(t[8]);
  a.vq = kc_vec(t[0]), a.vk = kc_vec(t[1]), a.vv = kc_vec(t[2]), a.vg = kc_vec(t[3]);
  a.vo = kc_vec(t[8]) && t[8]->dtype == K3K_BF16;
  a.cu = (const int32_t *)t[5]->data, a.cu_s = t[5]->stride[0];
  a.slots = (const int32_t *)t[6]->data, a.sl_s = t[6]->stride[0];
  a.rec = (unsigned char *)sc;
  a.cfirst = (const int32_t *)((unsigned char *)sc + rec_bytes);
  a.state = (float *)t[7]->data, a.st_slot = t[7]->stride[0];
  a.n_seqs = p->n_seqs, a.n_heads = p->n_heads;
  a.scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf(128.0f);
  a.read_state = p->read_state;
  kc_table_kernel<<<1, 1024, 0, cx->stream>>>(a.cu, a.cu_s, p->n_seqs, (int32_t *)a.cfirst);
  K3K_LAUNCHED("kda_chunk table");
  for (int h0 = 0; h0 < p->n_heads; h0 += hg) {
    a.h0 = h0, a.hg = min(hg, p->n_heads - h0);
    if ((rc = kc_intra_launch(a, (int)slots, cx->stream))) return rc;
    /* 32 value columns x 4 warps, three blocks per SM: measured best of (VS, warps) in
     * {(32,4), (64,8), (128,8), (128,16)} (docs/perf-gpu.md). */
    if ((rc = kc_state_launch<32, 4, 3>(a, cx->stream))) return rc;
  }
  return 0;
}
