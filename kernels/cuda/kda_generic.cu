/* CUDA: KDA_CHUNK and KDA_STEP at any head size (generic.h), the correctness path for shapes the
 * fast kernels (kda.cu, kda_chunk*.cu: Dk = Dv = 128) do not take.
 *
 * What it is for: the tiny presets (4 heads x 32) and the op tests' odd sizes on the GPU.
 * Both kernels are the CPU reference (kernels/cpu/kda.c) step for step:
 *   KDA_CHUNK: one block per (sequence, head) item (grid-strided over items), the chunks of the
 *   sequence in order; inside a chunk the phases of k3k_cpu_kda_chunk_seq (load + cumulative
 *   gate, e^G and e^{G_last-G}, L and Aqk, forward substitution for (I+L)^-1 row by row, T = X
 *   diag(beta), W and U, Vn, O, state update), one thread per output element with the
 *   reference's summation order, a barrier between phases. The per-item work arrays live in
 *   device scratch (k3k_cpu_kda_chunk_scratch_floats' layout), the state is updated in place.
 *   KDA_STEP: one block per (head, sequence), one thread per value row of the V-first state.
 * What it is not: fast (no tensor cores, the state is read by rows per thread); real shapes go
 * to the fast kernels (the op entries of generic.h).
 * Invariants: cu_seqlens and slots are checked on the device first (check.cu) with the CPU
 * backend's codes, so a rejected call changes nothing; a sequence of length 0 keeps its state
 * even when read_state = 0 (as the reference). All math fp32; o's dtype is the only rounding. */
#include "cuda_common.cuh"
#include "generic.h"

#define KG_THREADS 256

struct kg_args {
  dv q, k, v, g, beta, o;
  const int32_t *cu, *slots;
  int64_t cu_s, sl_s;
  float *state;
  int64_t st_slot;
  int n_seqs, nh, dk, dvv, ch, read_state;
  float scale;
  float *scr;
  int64_t scr_per; /* floats of scratch per block */
};

/* floats of per-item scratch: q, k, G, W, e^G, e^{G_last-G}: CH x Dk; v, U, Vn: CH x Dv; L, X,
 * Aqk: CH x CH; beta: CH (kernels/cpu/kda.c k3k_cpu_kda_chunk_scratch_floats). */
static int64_t kg_floats(int64_t ch, int64_t dk, int64_t dv) {
  return 6 * ch * dk + 3 * ch * dv + 3 * ch * ch + ch;
}

__global__ void __launch_bounds__(KG_THREADS) kda_gen_chunk_kernel(kg_args a) {
  const int tid = threadIdx.x, bs = blockDim.x;
  const int64_t Dk = a.dk, Dv = a.dvv, CH = a.ch;
  float *q = a.scr + (int64_t)blockIdx.x * a.scr_per, *k = q + CH * Dk, *G = k + CH * Dk;
  float *Wm = G + CH * Dk, *eG = Wm + CH * Dk, *eGl = eG + CH * Dk, *v = eGl + CH * Dk;
  float *U = v + CH * Dv, *Vn = U + CH * Dv, *L = Vn + CH * Dv, *X = L + CH * CH, *A = X + CH * CH;
  float *beta = A + CH * CH;
  for (int64_t item = blockIdx.x; item < (int64_t)a.n_seqs * a.nh; item += gridDim.x) {
    const int64_t i = item / a.nh, h = item % a.nh;
    const int64_t start = a.cu[i * a.cu_s], end = a.cu[(i + 1) * a.cu_s];
    if (end == start) continue; /* the same for every thread of the block */
    float *S = a.state + (int64_t)a.slots[i * a.sl_s] * a.st_slot + h * Dv * Dk; /* S[e*Dk+d] */
    if (!a.read_state)
      for (int64_t x = tid; x < Dv * Dk; x += bs) S[x] = 0.0f;
    for (int64_t cs = start; cs < end; cs += CH) {
      const int64_t n = end - cs < CH ? end - cs : CH;
      __syncthreads(); /* the previous chunk's state update and scratch reads are done */
      for (int64_t d = tid; d < Dk; d += bs) {
        float run = 0.0f;
        for (int64_t r = 0; r < n; r++) {
          const int64_t row = cs + r, c = h * Dk + d;
          q[r * Dk + d] = dv_ld(a.q, row * a.q.s[0] + c * a.q.s[1]) * a.scale;
          k[r * Dk + d] = dv_ld(a.k, row * a.k.s[0] + c * a.k.s[1]);
          const float gg = dv_ld(a.g, row * a.g.s[0] + c * a.g.s[1]);
          run = r ? run + gg : gg;
          G[r * Dk + d] = run;
        }
      }
      for (int64_t x = tid; x < n * Dv; x += bs) {
        const int64_t r = x / Dv, e = x % Dv;
        v[x] = dv_ld(a.v, (cs + r) * a.v.s[0] + (h * Dv + e) * a.v.s[1]);
      }
      for (int64_t r = tid; r < n; r += bs)
        beta[r] = dv_ld(a.beta, (cs + r) * a.beta.s[0] + h * a.beta.s[1]);
      __syncthreads();
      for (int64_t x = tid; x < n * Dk; x += bs) {
        const int64_t d = x % Dk;
        eG[x] = expf(G[x]);
        eGl[x] = expf(G[(n - 1) * Dk + d] - G[x]);
      }
      /* L (strictly lower, times beta_r) and Aqk (lower with the diagonal) */
      for (int64_t x = tid; x < n * n; x += bs) {
        const int64_t r = x / n, s = x % n;
        if (s > r) continue;
        float lk = 0.0f, aq = 0.0f;
        for (int64_t d = 0; d < Dk; d++) {
          const float e = expf(G[r * Dk + d] - G[s * Dk + d]);
          lk += k[r * Dk + d] * k[s * Dk + d] * e;
          aq += q[r * Dk + d] * k[s * Dk + d] * e;
        }
        L[r * CH + s] = s < r ? beta[r] * lk : 0.0f;
        A[r * CH + s] = aq;
      }
      __syncthreads();
      /* X = (I + L)^-1 by forward substitution, one row per step (row r reads rows < r) */
      for (int64_t r = 0; r < n; r++) {
        for (int64_t s = tid; s <= r; s += bs) {
          if (s == r) {
            X[r * CH + r] = 1.0f;
          } else {
            float acc = 0.0f;
            for (int64_t m = s; m < r; m++) acc += L[r * CH + m] * X[m * CH + s];
            X[r * CH + s] = -acc;
          }
        }
        __syncthreads();
      }
      for (int64_t x = tid; x < n * n; x += bs) { /* T = X diag(beta), kept in X */
        const int64_t r = x / n, s = x % n;
        if (s <= r) X[r * CH + s] *= beta[s];
      }
      __syncthreads();
      for (int64_t x = tid; x < n * Dk; x += bs) { /* W = T (e^G . k) */
        const int64_t r = x / Dk, d = x % Dk;
        float acc = 0.0f;
        for (int64_t s = 0; s <= r; s++) acc += X[r * CH + s] * eG[s * Dk + d] * k[s * Dk + d];
        Wm[x] = acc;
      }
      for (int64_t x = tid; x < n * Dv; x += bs) { /* U = T v */
        const int64_t r = x / Dv, e = x % Dv;
        float acc = 0.0f;
        for (int64_t s = 0; s <= r; s++) acc += X[r * CH + s] * v[s * Dv + e];
        U[x] = acc;
      }
      __syncthreads();
      for (int64_t x = tid; x < n * Dv; x += bs) { /* Vn = U - W S */
        const int64_t r = x / Dv, e = x % Dv;
        float acc = 0.0f;
        for (int64_t d = 0; d < Dk; d++) acc += Wm[r * Dk + d] * S[e * Dk + d];
        Vn[x] = U[x] - acc;
      }
      __syncthreads();
      for (int64_t x = tid; x < n * Dv; x += bs) { /* O = (q . e^G) S + Aqk Vn */
        const int64_t r = x / Dv, e = x % Dv;
        float acc = 0.0f;
        for (int64_t d = 0; d < Dk; d++) acc += q[r * Dk + d] * eG[r * Dk + d] * S[e * Dk + d];
        for (int64_t s = 0; s <= r; s++) acc += A[r * CH + s] * Vn[s * Dv + e];
        dv_st(a.o, (cs + r) * a.o.s[0] + (h * Dv + e) * a.o.s[1], acc);
      }
      __syncthreads(); /* every read of the old S is done */
      for (int64_t x = tid; x < Dv * Dk; x += bs) { /* S = diag(e^{G_last}) S + (e^{G_last-G} . k)^T Vn */
        const int64_t e = x / Dk, d = x % Dk;
        float acc = eG[(n - 1) * Dk + d] * S[x];
        for (int64_t r = 0; r < n; r++) acc += eGl[r * Dk + d] * k[r * Dk + d] * Vn[r * Dv + e];
        S[x] = acc;
      }
    }
    __syncthreads(); /* the next item reuses the scratch */
  }
}

/* ---- KDA_STEP: grid (NH, N); shared e^g, k, q*scale of the head ---- */
__global__ void __launch_bounds__(128)
    kda_gen_step_kernel(dv q, dv k, dv v, dv g, dv beta, const int32_t *slots, int64_t sl_s,
                        float *state, int64_t st_slot, dv o, int dk, int dvv, float scale,
                        int read_state) {
  extern __shared__ float ksm[];
  float *eg = ksm, *kk = ksm + dk, *qs = ksm + 2 * dk;
  const int64_t h = blockIdx.x, i = blockIdx.y;
  for (int d = threadIdx.x; d < dk; d += blockDim.x) {
    const int64_t c = h * dk + d;
    eg[d] = expf(dv_ld(g, i * g.s[0] + c * g.s[1]));
    kk[d] = dv_ld(k, i * k.s[0] + c * k.s[1]);
    qs[d] = dv_ld(q, i * q.s[0] + c * q.s[1]) * scale;
  }
  const float b = dv_ld(beta, i * beta.s[0] + h * beta.s[1]);
  __syncthreads();
  float *S = state + (int64_t)slots[i * sl_s] * st_slot + h * (int64_t)dvv * dk;
  for (int e = threadIdx.x; e < dvv; e += blockDim.x) {
    float *Se = S + (int64_t)e * dk; /* row v = e: S[k][e] for all k */
    float dot = 0.0f;
    for (int d = 0; d < dk; d++) {
      const float s = (read_state ? Se[d] : 0.0f) * eg[d];
      Se[d] = s;
      dot += s * kk[d];
    }
    const float u = dv_ld(v, i * v.s[0] + (h * dvv + e) * v.s[1]) - dot;
    float acc = 0.0f;
    for (int d = 0; d < dk; d++) {
      const float s = Se[d] + b * kk[d] * u;
      Se[d] = s;
      acc += s * qs[d];
    }
    dv_st(o, i * o.s[0] + (h * dvv + e) * o.s[1], acc);
  }
}

/* ---- op entries ---- */
static int64_t dk_of(const k3k_kda_params_t *p, const k3k_tensor_t *const *t) {
  return t[0]->shape[1] / p->n_heads;
}
static int64_t dv_of(const k3k_kda_params_t *p, const k3k_tensor_t *const *t) {
  return t[2]->shape[1] / p->n_heads;
}

bool k3k_cuda_gen_kda_step_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  /* grid (NH, N); 3 x Dk floats of shared memory */
  return p->n_seqs <= 65535 && dk_of(p, t) <= 4096 && dv_of(p, t) >= 1;
}

int k3k_cuda_gen_kda_step(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  if (p->n_seqs == 0) return 0;
  int rc = k3k_cuda_check_ids(cx, t[5], p->n_seqs, t[6]->shape[0], 1, 0);
  if (rc) return rc;
  const int dk = (int)dk_of(p, t), dvv = (int)dv_of(p, t);
  const float scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)dk);
  kda_gen_step_kernel<<<dim3((unsigned)p->n_heads, (unsigned)p->n_seqs), 128,
                        3 * (size_t)dk * sizeof(float), cx->stream>>>(
      mkdv(t[0]), mkdv(t[1]), mkdv(t[2]), mkdv(t[3]), mkdv(t[4]), (const int32_t *)t[5]->data,
      t[5]->stride[0], (float *)t[6]->data, t[6]->stride[0], mkdv(t[7]), dk, dvv, scale,
      p->read_state);
  K3K_LAUNCHED("kda_step_generic");
  return 0;
}

/* Scratch budget of the chunk kernel: items beyond what fits run in later grid-stride rounds. */
#define KG_SCRATCH_BUDGET ((int64_t)256 << 20)

bool k3k_cuda_gen_kda_chunk_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  const int64_t ch = p->chunk ? p->chunk : 64;
  /* one block's scratch must fit the budget */
  return kg_floats(ch, dk_of(p, t), dv_of(p, t)) * 4 <= KG_SCRATCH_BUDGET &&
         t[0]->shape[0] < INT32_MAX;
}

int k3k_cuda_gen_kda_chunk(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  int rc;
  if (p->n_seqs == 0) return 0;
  if ((rc = k3k_cuda_check_seqs(cx, t[5], p->n_seqs, t[0]->shape[0])) ||
      (rc = k3k_cuda_check_ids(cx, t[6], p->n_seqs, t[7]->shape[0], 1, 0)))
    return rc;
  kg_args a;
  a.dk = (int)dk_of(p, t), a.dvv = (int)dv_of(p, t), a.ch = p->chunk ? p->chunk : 64;
  a.scr_per = (kg_floats(a.ch, a.dk, a.dvv) + 63) & ~(int64_t)63; /* 256-byte aligned blocks */
  const int64_t items = (int64_t)p->n_seqs * p->n_heads;
  int64_t blocks = KG_SCRATCH_BUDGET / (a.scr_per * 4);
  const int64_t most = 4 * (int64_t)(cx->num_sms > 0 ? cx->num_sms : 132);
  if (blocks > most) blocks = most;
  if (blocks > items) blocks = items;
  if (blocks < 1) blocks = 1;
  void *sc;
  if ((rc = k3k_cuda_scratch(cx, (size_t)(blocks * a.scr_per) * sizeof(float), &sc))) return rc;
  a.q = mkdv(t[0]), a.k = mkdv(t[1]), a.v = mkdv(t[2]), a.g = mkdv(t[3]), a.beta = mkdv(t[4]);
  a.o = mkdv(t[8]);
  a.cu = (const int32_t *)t[5]->data, a.cu_s = t[5]->stride[0];
  a.slots = (const int32_t *)t[6]->data, a.sl_s = t[6]->stride[0];
  a.state = (float *)t[7]->data, a.st_slot = t[7]->stride[0];
  a.n_seqs = p->n_seqs, a.nh = p->n_heads, a.read_state = p->read_state;
  a.scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)a.dk);
  a.scr = (float *)sc;
  kda_gen_chunk_kernel<<<(unsigned)blocks, KG_THREADS, 0, cx->stream>>>(a);
  K3K_LAUNCHED("kda_chunk_generic");
  return 0;
}

/* ---- dispatch: the fast kernels where they take the operands ---- */
bool k3k_cuda_kda_step_any_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  return (k3k_cuda_kda_step_ok(params, t) && p->n_seqs <= 65535) ||
         k3k_cuda_gen_kda_step_ok(params, t);
}
int k3k_cuda_kda_step(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return k3k_cuda_kda_step_ok(params, t) ? k3k_cuda_kda_step_fast(cx, params, t)
                                         : k3k_cuda_gen_kda_step(cx, params, t);
}
bool k3k_cuda_kda_chunk_any_ok(const void *params, const k3k_tensor_t *const *t) {
  return k3k_cuda_kda_chunk_ok(params, t) || k3k_cuda_gen_kda_chunk_ok(params, t);
}
int k3k_cuda_kda_chunk(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return k3k_cuda_kda_chunk_ok(params, t) ? k3k_cuda_kda_chunk_fast(cx, params, t)
                                          : k3k_cuda_gen_kda_chunk(cx, params, t);
}
