/* Reference causal depthwise short convolution + SiLU (spec §3.2) for packed variable-length
 * sequences (CONV_PREFILL) and the single decode step (CONV_STEP). The conv state of a sequence
 * is the last W−1 RAW inputs (pre-conv), oldest first, in a state pool indexed by slot. Nothing
 * crosses a sequence boundary: inputs before a sequence's start come from its own state or are 0. */
#include <stdlib.h>

#include "core/k3k_internal.h"

static inline float act(const k3k_conv_params_t *p, float a) {
  return p->activation ? a * k3k_sigmoidf(a) : a;
}

/* CONV_PREFILL: x [T,C], w [C,W], cu [N+1], slots [N], state [S,C,W−1], y [T,C].
 *   y_t[c] = silu( Σ_{j<W} w[c][j]·x_{t−W+1+j}[c] ),  x_{τ<start} = state[c][τ−start+W−1]
 *   (or 0 without read_state); afterwards state[c][j] = x_{end−W+1+j}[c] (same rule). */
int k3k_cpu_conv_prefill(const void *params, const k3k_tensor_t *const *t) {
  const k3k_conv_params_t *p = params;
  const k3k_tensor_t *X = t[0], *Wt = t[1], *cu = t[2], *sl = t[3], *St = t[4], *Y = t[5];
  int64_t C = X->shape[1], W = Wt->shape[1];
  int rc;
  if ((rc = k3k_cpu_check_seqs(cu, p->n_seqs, X->shape[0], "cu_seqlens")) ||
      (rc = k3k_cpu_check_slots(sl, p->n_seqs, St->shape[0])))
    return rc;
  float *ns = malloc((size_t)(W - 1) * sizeof *ns);
  if (!ns) return K3_ENOMEM;
  for (int32_t i = 0; i < p->n_seqs; i++) {
    int64_t start = k3k_ldi(cu, i * cu->stride[0]), end = k3k_ldi(cu, (i + 1) * cu->stride[0]);
    int64_t s = k3k_ldi(sl, i * sl->stride[0]);
    if (end == start) continue;
    for (int64_t c = 0; c < C; c++) {
      int64_t sb = s * St->stride[0] + c * St->stride[1];
      /* raw input at absolute row tau (tau may precede start) */
#define XIN(tau)                                                                         \
  ((tau) >= start ? k3k_ld(X, (tau) * X->stride[0] + c)                                  \
                  : (p->read_state ? k3k_ld(St, sb + ((tau) - start + W - 1) * St->stride[2]) \
                                   : 0.0f))
      for (int64_t tk = start; tk < end; tk++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < W; j++) acc += k3k_ld(Wt, c * Wt->stride[0] + j) * XIN(tk - W + 1 + j);
        k3k_st(Y, tk * Y->stride[0] + c, act(p, acc));
      }
      for (int64_t j = 0; j < W - 1; j++) ns[j] = XIN(end - W + 1 + j);
#undef XIN
      for (int64_t j = 0; j < W - 1; j++) k3k_st(St, sb + j * St->stride[2], ns[j]);
    }
  }
  free(ns);
  return 0;
}

/* CONV_STEP: x [N,C], w [C,W], slots [N], state [S,C,W−1], y [N,C]:
 *   y = silu( Σ_{j<W−1} w[j]·s[j] + w[W−1]·x );  state ← [s[1..W−2], x]. */
int k3k_cpu_conv_step(const void *params, const k3k_tensor_t *const *t) {
  const k3k_conv_params_t *p = params;
  const k3k_tensor_t *X = t[0], *Wt = t[1], *sl = t[2], *St = t[3], *Y = t[4];
  int64_t C = X->shape[1], W = Wt->shape[1];
  int rc = k3k_cpu_check_slots(sl, p->n_seqs, St->shape[0]);
  if (rc) return rc;
  for (int32_t i = 0; i < p->n_seqs; i++) {
    int64_t s = k3k_ldi(sl, i * sl->stride[0]);
    for (int64_t c = 0; c < C; c++) {
      int64_t sb = s * St->stride[0] + c * St->stride[1];
      float x = k3k_ld(X, i * X->stride[0] + c), acc = 0.0f;
      for (int64_t j = 0; j < W - 1; j++) {
        float sv = p->read_state ? k3k_ld(St, sb + j * St->stride[2]) : 0.0f;
        acc += k3k_ld(Wt, c * Wt->stride[0] + j) * sv;
      }
      acc += k3k_ld(Wt, c * Wt->stride[0] + W - 1) * x;
      k3k_st(Y, i * Y->stride[0] + c, act(p, acc));
      for (int64_t j = 0; j + 1 < W - 1; j++) {
        float nx = p->read_state ? k3k_ld(St, sb + (j + 1) * St->stride[2]) : 0.0f;
        k3k_st(St, sb + j * St->stride[2], nx);
      }
      k3k_st(St, sb + (W - 2) * St->stride[2], x);
    }
  }
  return 0;
}
