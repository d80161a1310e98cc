/* CUDA: KDA_GATE, KDA_STEP (recurrent decode step) and the fused KDA decode step.
 *
 * What it is for: spec §3.4-§3.7 and §3.9 on the GPU. KDA_STEP and the fused step share one
 * design: a block per (head, sequence), a warp per group of value rows of the V-first fp32 state
 * S[v][k] (one 512-byte row = 32 lanes x float4), and each row is read once, decayed, used for
 * u = v - S^T k and o = S'^T q, updated and written once. The state pass is the whole cost
 * (64 KiB in and 64 KiB out per (sequence, head)), so the kernels stream it with evict-first
 * loads/stores and keep four rows in flight per warp.
 * The fused step also does the conv update, L2 norms, gate, beta and the gated RMSNorm, so a
 * decode token of a KDA layer costs one launch after the projections; that launch uses PDL
 * (pdl.cuh: it waits for the projections before any access).
 * What it is not: the chunked prefill (kda_chunk.cu).
 * Layouts: state [slot][NH][DV=128][DK=128] fp32 (spec §3.6, V-first); conv states
 * [slot][C][3] bf16, oldest first. */
#include "cuda_common.cuh"
#include "pdl.cuh"

__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

/* ---- KDA_GATE (spec §3.4; 48B softplus form too) ---- */
__global__ void kda_gate_kernel(dv graw, dv alog, dv dtb, dv g, int64_t rows, int p, int dh,
                                int form, float lower_bound) {
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y)
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < p; c += gridDim.x * blockDim.x) {
      float a = expf(dv_ld(alog, (int64_t)(c / dh) * alog.s[0]));
      float x = dv_ld(graw, t * graw.s[0] + c * graw.s[1]) + dv_ld(dtb, c * dtb.s[0]);
      float out;
      if (form == K3K_GATE_LOWER_BOUND) {
        out = lower_bound * sigmoidf_acc(a * x);
      } else {
        float sp = x > 20.0f ? x : log1pf(expf(x));
        out = -a * sp;
      }
      dv_st(g, t * g.s[0] + c * g.s[1], out);
    }
}

/* Fast path: BF16 g_raw rows and F32 g rows with inner stride 1 and 16-byte aligned rows, F32
 * dt_bias contiguous and aligned, Dh % 8 == 0 (8 channels of one head per thread). Same fp32
 * math as kda_gate_kernel; each thread keeps its dt_bias and exp(A_log) across two rows per
 * step and issues both rows' loads first. */
template <int FORM>
__global__ void __launch_bounds__(256)
    kda_gate_vec_kernel(const uint16_t *graw, int64_t ldg, dv alog, const float *dtb, float *g,
                        int64_t ldo, int64_t rows, int64_t c8, int dh, float lower_bound) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= c8) return;
  float a = expf(dv_ld(alog, (c * 8 / dh) * alog.s[0]));
  float4 b0 = ((const float4 *)dtb)[2 * c], b1 = ((const float4 *)dtb)[2 * c + 1];
  float bias[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  for (int64_t r0 = (int64_t)blockIdx.y * 2; r0 < rows; r0 += (int64_t)gridDim.y * 2) {
    int nr = r0 + 1 < rows ? 2 : 1;
    bf16x8 v[2];
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (i < nr) v[i] = ((const bf16x8 *)(graw + (r0 + i) * ldg))[c];
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (i < nr) {
        float f[8];
        unpack8(v[i], f);
#pragma unroll
        for (int j = 0; j < 8; j++) {
          float x = f[j] + bias[j];
          if (FORM == K3K_GATE_LOWER_BOUND) {
            f[j] = lower_bound * sigmoidf_acc(a * x);
          } else {
            float sp = x > 20.0f ? x : log1pf(expf(x));
            f[j] = -a * sp;
          }
        }
        float4 *o = (float4 *)(g + (r0 + i) * ldo) + 2 * c;
        o[0] = make_float4(f[0], f[1], f[2], f[3]);
        o[1] = make_float4(f[4], f[5], f[6], f[7]);
      }
  }
}

static bool al16g(const void *p) { return ((uintptr_t)p & 15) == 0; }

int k3k_cuda_kda_gate(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_gate_params_t *p = (const k3k_kda_gate_params_t *)params;
  int64_t rows = t[0]->shape[0], P = t[0]->shape[1];
  if (rows * P == 0) return 0;
  const k3k_tensor_t *gr = t[0], *dtb = t[2], *g = t[3];
  bool vec = gr->dtype == K3K_BF16 && g->dtype == K3K_F32 && dtb->dtype == K3K_F32 &&
             p->head_dim % 8 == 0 && P % 8 == 0 && gr->stride[1] == 1 && g->stride[1] == 1 &&
             dtb->stride[0] == 1 && gr->stride[0] % 8 == 0 && g->stride[0] % 4 == 0 &&
             al16g(gr->data) && al16g(g->data) && al16g(dtb->data);
  if (vec) {
    int64_t c8 = P / 8, gy = (rows + 1) / 2;
    dim3 grid(k3k_ceil_div(c8, 256), (unsigned)(gy > 65535 ? 65535 : gy));
    if (p->form == K3K_GATE_LOWER_BOUND)
      kda_gate_vec_kernel<K3K_GATE_LOWER_BOUND><<<grid, 256, 0, cx->stream>>>(
          (const uint16_t *)gr->data, gr->stride[0], mkdv(t[1]), (const float *)dtb->data,
          (float *)g->data, g->stride[0], rows, c8, p->head_dim, p->lower_bound);
    else
      kda_gate_vec_kernel<K3K_GATE_SOFTPLUS><<<grid, 256, 0, cx->stream>>>(
          (const uint16_t *)gr->data, gr->stride[0], mkdv(t[1]), (const float *)dtb->data,
          (float *)g->data, g->stride[0], rows, c8, p->head_dim, p->lower_bound);
    K3K_LAUNCHED("kda_gate");
    return 0;
  }
  unsigned gx = k3k_ceil_div(P, 256), gy = (unsigned)(rows > 65535 ? 65535 : rows);
  kda_gate_kernel<<<dim3(gx > 1024 ? 1024 : gx, gy), 256, 0, cx->stream>>>(
      mkdv(t[0]), mkdv(t[1]), mkdv(t[2]), mkdv(t[3]), rows, (int)P, p->head_dim, (int)p->form,
      p->lower_bound);
  K3K_LAUNCHED("kda_gate");
  return 0;
}

/* The state pass shared by KDA_STEP and the fused step. Inputs in shared memory: q (scaled),
 * k, v, exp(g) for this head; beta. Writes o[v] (fp32) to os. `S` points at this (slot, head);
 * read_state = 0 treats the incoming state as zero (and still writes the new one). */
__device__ __forceinline__ void kda_state_pass(float *S, const float *qs, const float *ks,
                                               const float *vs, const float *egs, float beta,
                                               float *os, int read_state) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  float kr[4], qr[4], er[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    kr[j] = ks[lane * 4 + j];
    qr[j] = qs[lane * 4 + j];
    er[j] = egs[lane * 4 + j];
  }
  float kq = warp_sum(kr[0] * qr[0] + kr[1] * qr[1] + kr[2] * qr[2] + kr[3] * qr[3]);
  /* Warp wid owns value rows wid*16 .. wid*16+15 (8 warps), four rows in flight. */
#pragma unroll 1
  for (int r0 = wid * 16; r0 < wid * 16 + 16; r0 += 4) {
    float4 s4[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
      s4[i] = read_state ? __ldcs((const float4 *)(S + (size_t)(r0 + i) * 128) + lane)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float sd[4] = {s4[i].x * er[0], s4[i].y * er[1], s4[i].z * er[2], s4[i].w * er[3]};
      float d1 = sd[0] * kr[0] + sd[1] * kr[1] + sd[2] * kr[2] + sd[3] * kr[3];
      float d2 = sd[0] * qr[0] + sd[1] * qr[1] + sd[2] * qr[2] + sd[3] * qr[3];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        d1 += __shfl_xor_sync(0xffffffffu, d1, o);
        d2 += __shfl_xor_sync(0xffffffffu, d2, o);
      }
      float bu = beta * (vs[r0 + i] - d1);
      __stcs((float4 *)(S + (size_t)(r0 + i) * 128) + lane,
             make_float4(sd[0] + bu * kr[0], sd[1] + bu * kr[1], sd[2] + bu * kr[2],
                         sd[3] + bu * kr[3]));
      if (lane == 0) os[r0 + i] = d2 + bu * kq;
    }
  }
}

/* ---- KDA_STEP: grid (NH, N), 256 threads; Dk = Dv = 128 (k3k_cuda_kda_step_ok). ---- */
__global__ void __launch_bounds__(256)
    kda_step_kernel(dv q, dv k, dv v, dv g, dv beta, const int32_t *slots, float *state,
                    int64_t st_slot, dv o, float scale, int read_state) {
  __shared__ float qs[128], ks[128], vs[128], egs[128], os[128];
  const int h = blockIdx.x, n = blockIdx.y, tid = threadIdx.x;
  const int64_t nh = gridDim.x;
  if (tid < 128) {
    int64_t c = (int64_t)h * 128 + tid;
    qs[tid] = dv_ld(q, n * q.s[0] + c * q.s[1]) * scale;
    ks[tid] = dv_ld(k, n * k.s[0] + c * k.s[1]);
    vs[tid] = dv_ld(v, n * v.s[0] + c * v.s[1]);
    egs[tid] = expf(dv_ld(g, n * g.s[0] + c * g.s[1]));
  }
  float bt = dv_ld(beta, n * beta.s[0] + h * beta.s[1]);
  __syncthreads();
  float *S = state + slots[n] * st_slot + (int64_t)h * 128 * 128;
  (void)nh;
  kda_state_pass(S, qs, ks, vs, egs, bt, os, read_state);
  __syncthreads();
  if (tid < 128) dv_st(o, n * o.s[0] + ((int64_t)h * 128 + tid) * o.s[1], os[tid]);
}

bool k3k_cuda_kda_step_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  const k3k_tensor_t *st = t[6];
  /* Dk = Dv = 128 and a contiguous [S,NH,128,128] fp32 state with 16-byte aligned rows. */
  return st->ndim == 4 && st->shape[2] == 128 && st->shape[3] == 128 &&
         st->stride[3] == 1 && st->stride[2] == 128 && st->stride[1] == 128 * 128 &&
         st->stride[0] % 4 == 0 && ((uintptr_t)st->data & 15) == 0 &&
         t[0]->shape[1] == (int64_t)p->n_heads * 128;
}

int k3k_cuda_kda_step_fast(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_kda_params_t *p = (const k3k_kda_params_t *)params;
  if (p->n_seqs == 0) return 0;
  int rc = k3k_cuda_check_ids(cx, t[5], p->n_seqs, t[6]->shape[0], 1, 0);
  if (rc) return rc;
  float scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf(128.0f);
  kda_step_kernel<<<dim3(p->n_heads, p->n_seqs), 256, 0, cx->stream>>>(
      mkdv(t[0]), mkdv(t[1]), mkdv(t[2]), mkdv(t[3]), mkdv(t[4]), (const int32_t *)t[5]->data,
      (float *)t[6]->data, t[6]->stride[0], mkdv(t[7]), scale, p->read_state);
  K3K_LAUNCHED("kda_step");
  return 0;
}

/* ---- fused decode step: grid (NH, B), 256 threads; DK = DV = 128 fixed. ---- */
__device__ __forceinline__ float conv_step(const uint16_t *xlin, uint16_t *sp, const float *w) {
  uint16_t s0 = sp[0], s1 = sp[1], s2 = sp[2], xb = *xlin;
  float4 wc = *(const float4 *)w;
  float acc = wc.x * bf2f(s0) + wc.y * bf2f(s1) + wc.z * bf2f(s2) + wc.w * bf2f(xb);
  sp[0] = s1;
  sp[1] = s2;
  sp[2] = xb;
  return round_bf(silu(acc));
}

__global__ void __launch_bounds__(256) kda_decode_kernel(k3k_cu_kda_decode_args a) {
  __shared__ float qs[128], ks[128], egs[128], vs[128], os[128], red[2][4];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int nh = gridDim.x;
  const size_t P = (size_t)nh * 128;
  pdl_wait(); /* launched with PDL (pdl.cuh): every input may be the previous kernel's */
  pdl_trigger();
  const int slot = a.slots[b];
  /* Out-of-range slots are skipped (nothing outside the pools is touched); callers of this raw
   * entry validate ids with k3k_cuda_check_ids when they come from outside. */
  if (a.n_slots > 0 && (slot < 0 || slot >= a.n_slots)) return;
  const size_t bi = (size_t)b * a.ld_b + h;
  float beta = sigmoidf_acc(a.b_raw_bf16 ? bf2f(((const uint16_t *)a.b_raw)[bi])
                                         : ((const float *)a.b_raw)[bi]);
  if (tid < 128) {
    size_t c = (size_t)h * 128 + tid;
    size_t cs = ((size_t)slot * P + c) * 3;
    float qv = conv_step(a.q + (size_t)b * a.ld_qkv + c, a.conv_q + cs, a.wq + c * 4);
    float kv = conv_step(a.k + (size_t)b * a.ld_qkv + c, a.conv_k + cs, a.wk + c * 4);
    float vv = conv_step(a.v + (size_t)b * a.ld_qkv + c, a.conv_v + cs, a.wv + c * 4);
    float gr = bf2f(a.g_raw[(size_t)b * a.ld_g + c]) + a.dt_bias[c];
    float g = a.lower_bound * sigmoidf_acc(expf(a.a_log[h]) * gr);
    float sq = warp_sum(qv * qv), sk = warp_sum(kv * kv);
    if (lane == 0) {
      red[0][wid] = sq;
      red[1][wid] = sk;
    }
    qs[tid] = qv;
    ks[tid] = kv;
    vs[tid] = vv;
    egs[tid] = expf(g);
  }
  __syncthreads();
  if (tid < 128) {
    float nq = red[0][0] + red[0][1] + red[0][2] + red[0][3];
    float nk = red[1][0] + red[1][1] + red[1][2] + red[1][3];
    qs[tid] *= a.q_scale / sqrtf(nq + a.l2_eps);
    ks[tid] *= 1.0f / sqrtf(nk + a.l2_eps);
  }
  __syncthreads();
  float *S = a.state + ((size_t)slot * nh + h) * 128 * 128;
  kda_state_pass(S, qs, ks, vs, egs, beta, os, 1);
  __syncthreads();
  if (wid == 0) { /* gated RMSNorm of this head's output (spec §3.7); o rounds to bf16 first */
    float of[4], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      of[j] = round_bf(os[lane * 4 + j]);
      ss += of[j] * of[j];
    }
    ss = warp_sum(ss);
    float rstd = 1.0f / sqrtf(ss / 128.0f + a.rms_eps);
    size_t c0 = (size_t)h * 128 + lane * 4;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float zf = bf2f(a.z[(size_t)b * a.ld_z + c0 + j]);
      a.out[(size_t)b * a.ld_out + c0 + j] =
          f2bf(of[j] * rstd * a.o_norm_w[lane * 4 + j] * sigmoidf_acc(zf));
    }
  }
}

int k3k_cu_kda_decode(cudaStream_t st, const k3k_cu_kda_decode_args *a) {
  if (a->batch == 0) return 0;
  K3K_CU(pdl_launch(kda_decode_kernel, dim3(a->heads, a->batch), dim3(256), 0, st, *a));
  K3K_LAUNCHED("kda_decode");
  return 0;
}
