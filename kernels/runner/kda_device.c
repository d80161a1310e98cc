/* The KDA decode step of a layer in one launch on a "cuda" backend (the KDA_DECODE op).
 *
 * What it is for: a decode pass reads each sequence's 6.5 MB fp32 KDA state once per layer;
 * the op chain CONV_STEP x3 → L2NORM x2 → KDA_GATE → SIGMOID → KDA_STEP → GATED_RMSNORM is
 * nine launches per layer (108 per step on the medium preset, ~2-5 us each at batch 1). The
 * fused kernel does all of it in one pass over the state with the chain's rounding points
 * (bf16 conv outputs, fp32 q/k/g/beta, bf16 o before the gated norm): KDA_DECODE's CPU
 * reference IS that chain, and test_kernels --real (and k3k-gpu-check's kda_fused_decode)
 * compare the kernel with it.
 * What it is not: prefill (the chunked op), the 48B's softplus gate or bf16 conv weights (those
 * keep the op chain), or a check of ids: the decode pass's slots were validated on the host
 * (graph.c) and the kernel skips slots outside the pool.
 * Invariants: rn_dev_kda_init decides once, for every KDA layer at once, from the bound weight
 * and state tensors; the decision never changes for the runner's life, so eager steps and
 * graph replays run the same kernels. */
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda.h"
#include "k3pd/log.h"
#include "runner_internal.h"

static bool contiguous(const k3k_tensor_t *t, k3k_dtype_t dt, int ndim, int64_t d0, int64_t d1) {
  if (t->dtype != dt || t->ndim != ndim || !t->data) return false;
  if (t->shape[0] < d0 || (ndim == 2 && (t->shape[0] != d0 || t->shape[1] != d1))) return false;
  return ndim == 1 ? t->stride[0] == 1 : t->stride[1] == 1 && t->stride[0] == d1;
}

void rn_dev_kda_init(k3_runner_t *r) {
  const k3_model_config_t *c = &r->cfg;
  const char *env = getenv("K3PD_CUDA_KDA_FUSED");
  r->kda_fused = false;
  if (!k3k_cuda_ctx_of(r->be) || !r->bf16 || r->n_kda == 0 || (env && !strcmp(env, "0"))) return;
  const int64_t NH = c->kda_num_heads, P = c->kda_proj_dim;
  if (c->kda_gate != K3_KDA_GATE_LOWER_BOUND || c->kda_head_dim != 128 || c->conv_kernel != 4 ||
      P != NH * 128 || r->sdt != K3K_BF16)
    return;
  for (int l = 0, ki = 0; l < c->num_layers; l++) {
    const rn_layer_t *L = &r->layers[l];
    if (L->kind != K3_LAYER_KDA) continue;
    for (int j = 0; j < 3; j++)
      if (!contiguous(&L->conv[j], K3K_F32, 2, P, 4)) return;
    if (!contiguous(&L->a_log, K3K_F32, 1, NH, 0) || !contiguous(&L->dt_bias, K3K_F32, 1, P, 0) ||
        !contiguous(&L->o_norm, K3K_F32, 1, 128, 0))
      return;
    const k3k_tensor_t *S = &r->kda_S[ki];
    if (S->ndim != 4 || S->stride[0] != NH * 128 * 128 || S->stride[3] != 1) return;
    for (int j = 0; j < 3; j++) {
      const k3k_tensor_t *cs = &r->kda_conv[ki][j];
      if (cs->ndim != 3 || cs->stride[0] != P * 3 || cs->stride[1] != 3 || cs->stride[2] != 1) return;
    }
    ki++;
  }
  r->kda_fused = true;
  K3_INFO("runner: KDA decode fused (one launch per layer)");
}

/* The KDA_DECODE op (k3k.h) on the layer's projections: the fused kernel on the GPU; its
 * `supports` refusing these operands is an error here (rn_dev_kda_init chose the fused path for
 * the runner's life, and the workspace always gives the shapes it takes). */
int rn_dev_kda_decode(k3_runner_t *r, const rn_layer_t *L, int ki, const rn_pass_t *ps,
                      const k3k_tensor_t *lin, const k3k_tensor_t *graw, const k3k_tensor_t *braw,
                      const k3k_tensor_t *z, const k3k_tensor_t *on) {
  const k3_model_config_t *c = &r->cfg;
  const k3k_kda_decode_params_t p = {.n_seqs = ps->n_seq, .n_heads = (int32_t)c->kda_num_heads,
                                     .head_dim = 128, .gate_form = K3K_GATE_LOWER_BOUND,
                                     .lower_bound = (float)c->gate_lower_bound,
                                     .l2_eps = (float)c->eps_kda_l2, .rms_eps = (float)c->eps_norm,
                                     .scale = 0.0f}; /* KDA_STEP's default, 128^-0.5 */
  const k3k_tensor_t *t[18] = {&lin[0], &lin[1], &lin[2], graw, braw, z,
                               &L->conv[0], &L->conv[1], &L->conv[2],
                               &r->kda_conv[ki][0], &r->kda_conv[ki][1], &r->kda_conv[ki][2],
                               &L->a_log, &L->dt_bias, &L->o_norm, &ps->slots, &r->kda_S[ki], on};
  return k3k_kda_decode(r->be, &p, t);
}
