/* CUDA: KDA_CHUNK, the chunked KDA prefill of spec §3.8 (WY/UT form, chunk 64): the op entry
 * and the chunk table.
 *
 * What it is for: prefill of the 69 KDA layers. The op runs as three launches (kda_chunk.cuh):
 * the chunk table (here), a fully parallel intra-chunk kernel over (chunk, head) that writes one
 * record per (chunk, head) (kda_chunk_intra.cu), and a sequential state pass over (head,
 * sequence) on wgmma that carries the fp32 state through a sequence's chunks and writes the
 * output (kda_chunk_state_wg.cu).
 * What it is not: the decode step (kda.cu) or a general Dk/Dv kernel: Dk = Dv = 128, chunk 64.
 * Numerics vs the all-fp32 reference: q, k, v, e^G factors, T, Vn, Aqk and S enter the tensor
 * cores as bf16 (relative 2^-9 each, fp32 accumulate), so the fp32 state and the output agree
 * to ~1e-3 relative (docs/perf-gpu.md states the tolerance used and why).
 * Invariants: cu_seqlens and slots are checked on the device before any write (check.cu), so
 * bad ids return K3_ERANGE / K3_EINVAL with nothing changed; sequences of length 0 keep their
 * state. Scratch: ((T+63)/64 + N) * NH records of 64.5 KB (kda_chunk.cuh) + the chunk table. */
#include "kda_chunk.cuh"

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

int k3k_cuda_kda_chunk_fast(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  int rc;
  if (p->n_seqs == 0) return 0;
  if ((rc = k3k_cuda_check_seqs(cx, t[5], p->n_seqs, t[0]->shape[0])) ||
      (rc = k3k_cuda_check_ids(cx, t[6], p->n_seqs, t[7]->shape[0], 1, 0)))
    return rc;
  /* Chunk slots: sum_i ceil(len_i / 64) <= ceil(T / 64) + N. Heads in groups of hg so the
   * records stay within ~1 GiB (one group for 8K tokens x 96 heads: 0.82 GB). */
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
    if ((rc = kc_state_wg_launch(a, cx->stream))) return rc;
  }
  return 0;
}
