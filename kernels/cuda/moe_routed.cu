/* The CUDA entry of MOE_ROUTED (k3k.h): the routed experts of a MoE block without a host round
 * trip at decode sizes. Router + device plan in one launch (k3k_cu_moe_route_plan), then either
 * the grouped expert GEMMs (gate+up with the activation fused, then down: W4A16 MXFP4 for K3,
 * moe_ops.h; bf16 for the 48B, moe_bf16.h) or, for prefill-sized batches, the batched path of
 * moe_dq.h (dequant-once for MXFP4, pointer-array cuBLASLt batches for bf16), and the unchecked
 * fp32 combine.
 *
 * What it is for: the model runner's MoE block on a "cuda" backend (kernels/runner/ffn.c calls
 * k3k_moe_routed); before issue 19's item 4 this code was the runner's ffn_device.c calling the
 * kernels directly. Same kernels, same arguments, same choice of path.
 * What it is not: the chain. Shapes the device kernels do not take are refused in
 * k3k_cuda_moe_routed_ok (cuda_supports) and the caller runs the chain of ops (ROUTER,
 * per-expert GEMMs, MOE_COMBINE) instead; the CPU reference is that chain (cpu/fused.c).
 * Invariants: the same rounding points as the chain (bf16 gate/up outputs before the
 * activation, bf16 expert outputs, one fp32 combine); results differ only by accumulation order
 * inside the GEMMs. Expert scales are not checked per call (k3k.h). Nothing synchronises at
 * decode sizes (capture-safe); the batched prefill path synchronises once per call for the
 * plan's offsets and is never taken while the stream is captured (the grouped kernels run
 * then, nothing of the batched path queued). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda_ops.h"
#include "k3pd/err.h"

namespace {

constexpr size_t ALIGN = 256;

size_t up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* K3PD_MOE_BF16_BATCHED=0 keeps bf16 experts above the grouped kernel's 16 rows per expert off
 * the batched path (the op is then refused there and the caller runs the chain); read once. */
bool bf16_batched_env() {
  static int env = -1;
  if (env < 0) {
    const char *e = getenv("K3PD_MOE_BF16_BATCHED");
    env = !(e && *e == '0');
  }
  return env != 0;
}

struct shape {
  int32_t T, K, E, F, D;
  bool bf16; /* dense bf16 experts (48B), else MXFP4 */
};

shape shape_of(const k3k_moe_routed_params_t *p, const k3k_tensor_t *const *t) {
  shape s;
  s.T = (int32_t)t[0]->shape[0];
  s.E = (int32_t)t[0]->shape[1];
  s.K = p->router.top_k;
  s.F = p->F;
  s.D = (int32_t)t[2]->shape[1];
  s.bf16 = p->wdtype != K3K_U8;
  return s;
}

/* The batched path (moe_dq.h) for this batch: bf16 experts above the grouped W16A16 kernel's 16
 * rows per expert, MXFP4 experts from K3K_CU_MOE_DQ_ROWS_DEFAULT rows (k3k_cu_moe_dq_wanted). */
bool batched(const shape &s) {
  return s.bf16 ? !k3k_cu_moe_bf16_wanted(s.T, s.K, s.E) : k3k_cu_moe_dq_wanted(s.T, s.K, s.E);
}

/* The workspace, carved in this order from a 256-byte aligned base. */
struct carve {
  size_t off, act, gt, ri, plan, ha, yr, dq, total;
};

carve carve_of(const shape &s) {
  const size_t tk = (size_t)s.T * (size_t)s.K;
  carve c;
  c.off = 0;
  c.act = c.off + up((size_t)(s.E + 1) * 4);
  c.gt = c.act + up((size_t)(s.E + 1) * 4);
  c.ri = c.gt + up(tk * 4);
  c.plan = c.ri + up(tk * 4);
  c.ha = c.plan + up(k3k_cu_moe_plan_scratch(s.T, s.E));
  c.yr = c.ha + up(tk * (size_t)s.F * 2);
  c.dq = c.yr + up(tk * (size_t)s.D * 2);
  c.total = c.dq + (batched(s) ? up(k3k_cu_moe_dq_scratch_bytes((int64_t)tk, s.E, s.F, s.D)) : 0);
  return c;
}

bool contiguous_rows(const k3k_tensor_t *t) {
  return t->stride[1] == 1 && t->stride[0] % 8 == 0 && ((uintptr_t)t->data & 15) == 0;
}

k3k_cu_mx_set mx_set(const void *tab, int j, int64_t E, int64_t cols) {
  k3k_cu_mx_set s;
  memset(&s, 0, sizeof s);
  const uint8_t *const *t = (const uint8_t *const *)tab;
  s.packed_tab = t + (2 * j) * E;
  s.scale_tab = t + (2 * j + 1) * E;
  s.ld_packed = cols / 2;
  s.ld_scale = cols / 32;
  return s;
}

bool capturing(cudaStream_t st) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(st, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone;
}

/* The batched path; K3_ENOTSUP with nothing queued while the stream is captured. */
int run_batched(k3k_cuda_ctx *cx, const k3k_moe_routed_params_t *p, const k3k_tensor_t *const *t,
                const shape &s, char *ws, const carve &c) {
  if (capturing(cx->stream)) return K3_ENOTSUP;
  k3k_cu_moe_dq_args d;
  memset(&d, 0, sizeof d);
  const void *tab = t[3]->data;
  const void **h = NULL;
  if (s.bf16) { /* the pointer-array batches take host arrays of the experts' device pointers */
    const size_t bytes = (size_t)(3 * s.E) * sizeof *h;
    if (!(h = (const void **)malloc(bytes))) return K3_ENOMEM;
    if (cudaMemcpyAsync(h, tab, bytes, cudaMemcpyDeviceToHost, cx->stream) != cudaSuccess ||
        cudaStreamSynchronize(cx->stream) != cudaSuccess) {
      free(h);
      return K3_EDEVICE;
    }
    d.w1_bf16 = h;
    d.w3_bf16 = h + s.E;
    d.w2_bf16 = h + 2 * s.E;
  } else {
    d.w1 = mx_set(tab, 0, s.E, s.D);
    d.w3 = mx_set(tab, 1, s.E, s.D);
    d.w2 = mx_set(tab, 2, s.E, s.F);
  }
  d.act = p->act ? K3K_CU_ACT_SILU_MUL : K3K_CU_ACT_SITU;
  d.beta = p->situ.beta;
  d.beta_lin = p->situ.beta_lin;
  d.F = s.F;
  d.D = s.D;
  d.E = s.E;
  d.T = s.T;
  d.k = s.K;
  d.x = (const uint16_t *)t[2]->data;
  d.ldx = t[2]->stride[0];
  d.gather_tok = (const int32_t *)(ws + c.gt);
  d.expert_off = (const int32_t *)(ws + c.off);
  d.h = (uint16_t *)(ws + c.ha);
  d.y = (uint16_t *)(ws + c.yr);
  d.scratch = ws + c.dq;
  const int rc = k3k_cu_moe_dq_experts(cx, &d);
  free(h);
  return rc;
}

} // namespace

size_t k3k_cuda_moe_routed_ws(const void *params, const k3k_tensor_t *const *t) {
  return carve_of(shape_of((const k3k_moe_routed_params_t *)params, t)).total + ALIGN;
}

bool k3k_cuda_moe_routed_ok(const void *params, const k3k_tensor_t *const *t) {
  const k3k_moe_routed_params_t *p = (const k3k_moe_routed_params_t *)params;
  const shape s = shape_of(p, t);
  if (t[2]->dtype != K3K_BF16 || !contiguous_rows(t[2]) || t[6]->stride[1] != 1) return false;
  if (s.E > 8192 || !t[7]) return false;
  if (s.bf16) /* the grouped bf16 kernel (moe_bf16.h): SiLU-gated, 16-byte rows */
    return p->wdtype == K3K_BF16 && p->act == 1 && s.F % 8 == 0 && s.D % 8 == 0 &&
           s.F <= 24576 && s.D <= 24576 &&
           (k3k_cu_moe_bf16_wanted(s.T, s.K, s.E) ||
            (bf16_batched_env() && s.F % 32 == 0 && s.D % 32 == 0));
  return true; /* MXFP4: D, F % 32 (validated); K % 128 / N % 16 or the generic kernel */
}

int k3k_cuda_moe_routed(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_moe_routed_params_t *p = (const k3k_moe_routed_params_t *)params;
  const shape s = shape_of(p, t);
  if (s.T == 0) return 0;
  cudaStream_t st = cx->stream;
  const carve c = carve_of(s);
  char *ws = (char *)(((uintptr_t)t[7]->data + ALIGN - 1) / ALIGN * ALIGN);
  int32_t *off = (int32_t *)(ws + c.off), *act = (int32_t *)(ws + c.act);
  int32_t *gt = (int32_t *)(ws + c.gt), *ri = (int32_t *)(ws + c.ri);
  int rc = k3k_cu_moe_route_plan(st, &p->router, t[0], t[1], t[4], t[5], off, gt, ri, act,
                                 ws + c.plan);
  if (rc) return rc;
  /* x may come from the side lane: the route/plan launch above overlapped its production */
  if (p->x_mark && (rc = k3k_cuda_side_wait(cx, p->x_mark))) return rc;
  const int64_t TK = (int64_t)s.T * s.K;
  k3k_tensor_t yr = k3k_tensor_2d(t[6]->backend, K3K_BF16, ws + c.yr, TK, s.D);
  k3k_tensor_t rt = k3k_tensor_2d(t[6]->backend, K3K_I32, ri, s.T, s.K);
  if (batched(s)) {
    rc = run_batched(cx, p, t, s, ws, c);
    if (!rc) return k3k_cu_moe_combine_raw(st, &yr, &rt, t[5], t[6], NULL);
    if (rc != K3_ENOTSUP) return rc; /* captured: the grouped kernels below */
  }
  const int32_t maxa = TK < s.E ? (int32_t)TK : s.E;
  const uint16_t *x = (const uint16_t *)t[2]->data;
  uint16_t *ha = (uint16_t *)(ws + c.ha);
  if (s.bf16) { /* gate/up with SiLU fused, then down (moe_bf16.h) */
    rc = k3k_cu_moe_bf16_experts(st, (const uint16_t *const *)t[3]->data, s.E, s.F, s.D, x,
                                 t[2]->stride[0], gt, off, act, maxa, ha,
                                 (uint16_t *)yr.data);
    return rc ? rc : k3k_cu_moe_combine_raw(st, &yr, &rt, t[5], t[6], NULL);
  }
  k3k_cu_moe_gemm_args a;
  memset(&a, 0, sizeof a);
  a.w = mx_set(t[3]->data, 0, s.E, s.D);
  a.up = mx_set(t[3]->data, 1, s.E, s.D);
  a.act = p->act ? K3K_CU_ACT_SILU_MUL : K3K_CU_ACT_SITU;
  a.round_inner = 1; /* the chain stores the gate/up GEMM outputs bf16 */
  a.beta = p->situ.beta;
  a.beta_lin = p->situ.beta_lin;
  a.N = s.F;
  a.K = s.D;
  a.x = x;
  a.ldx = t[2]->stride[0];
  a.x_gather = gt;
  a.y = ha;
  a.ldy = s.F;
  a.expert_off = off;
  a.active = act;
  a.max_active = maxa;
  a.rows_hint = (int32_t)(TK / maxa);
  if ((rc = k3k_cu_moe_gemm_any(st, &a))) return rc;
  memset(&a.up, 0, sizeof a.up);
  a.w = mx_set(t[3]->data, 2, s.E, s.F);
  a.act = K3K_CU_ACT_NONE;
  a.round_inner = 0;
  a.N = s.D;
  a.K = s.F;
  a.x = ha;
  a.ldx = s.F;
  a.x_gather = NULL;
  a.y = yr.data;
  a.ldy = s.D;
  if ((rc = k3k_cu_moe_gemm_any(st, &a))) return rc;
  return k3k_cu_moe_combine_raw(st, &yr, &rt, t[5], t[6], NULL);
}
