/* The runner's CUDA-only MoE set-up: the one-time check of every MXFP4 expert scale (the device
 * MOE_ROUTED path, kernels/cuda/moe_routed.cu, does not check per call) and the side lane that
 * ffn.c and mixers.c use for decode-shaped passes.
 *
 * What it is for: rn_dev_init at runner init on a "cuda" backend in bf16 precision with experts;
 * rn_dev_side_ok / rn_dev_side_gemms during passes.
 * What it is not: the MoE computation: the routed experts are the MOE_ROUTED op (k3k.h), its
 * expert tables built by experts.c for every backend.
 * Invariants: the side lane never changes results (the same ops on the same inputs); the scale
 * check synchronises once at init. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "runner_internal.h"

struct rn_dev {
  bool side; /* the side stream is ready (K3PD_CUDA_SIDE not 0): rn_dev_side_ok */
};

/* Checks every expert scale of the model for 0xFF on the device; one synchronisation. */
static int check_scales(k3_runner_t *r, char *err, size_t errlen) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(r->be);
  void *bad = NULL;
  int hbad = 0;
  int rc = r->be->alloc(r->be, sizeof(int), &bad);
  if (rc) return rc;
  rc = r->be->memset(r->be, bad, 0, sizeof(int));
  for (int l = 0; l < r->cfg.num_layers && !rc; l++) {
    const rn_layer_t *L = &r->layers[l];
    if (!L->moe) continue;
    const rn_expw_t *sets[3] = {L->w1, L->w3, L->w2};
    for (int j = 0; j < 3 && !rc; j++)
      for (int64_t e = 0; e < r->cfg.num_experts && !rc; e++) {
        if (!sets[j][e].mx) continue;
        const k3k_tensor_t *s = &sets[j][e].scale;
        rc = k3k_cu_mx_check(k3k_cuda_stream(cx), s->data, s->shape[0], s->shape[1], s->stride[0],
                             bad);
      }
  }
  if (!rc) rc = r->be->copy_to_host(r->be, &hbad, bad, sizeof(int));
  r->be->free(r->be, bad);
  if (!rc && hbad) {
    rn_seterr(err, errlen, "runner: an MXFP4 expert scale is 0xFF (E8M0 NaN) in the checkpoint");
    rc = K3_EFORMAT;
  }
  return rc;
}

void rn_dev_free(k3_runner_t *r) {
  free(r->dev);
  r->dev = NULL;
}

int rn_dev_init(k3_runner_t *r, char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  if (!k3k_cuda_ctx_of(r->be) || !r->bf16 || c->num_experts <= 0) return 0;
  struct rn_dev *d = calloc(1, sizeof *d);
  if (!d) return K3_ENOMEM;
  r->dev = d;
  const char *sv = getenv("K3PD_CUDA_SIDE");
  if (!sv || strcmp(sv, "0")) {
    int rc = k3k_backend_side(r->be, K3K_SIDE_INIT, 0);
    if (rc) K3_WARN("runner: no side stream (%s); the MoE block runs on one stream", k3_strerror(rc));
    d->side = rc == 0;
  }
  return c->experts_mxfp4 ? check_scales(r, err, errlen) : 0;
}

/* Decode-shaped passes only: at prefill sizes every GEMM of the block is compute-bound and
 * would only contend (not measured there). */
#define RN_SIDE_MAX_T 256

bool rn_dev_side_ok(const k3_runner_t *r, int64_t T) {
  return r->dev && r->dev->side && T <= RN_SIDE_MAX_T;
}

int rn_dev_side_gemms(k3_runner_t *r, int n, const k3k_tensor_t *const *x,
                      const k3k_tensor_t *const *w, const k3k_tensor_t *const *y) {
  int rc = rn_dev_side_begin(r);
  if (rc) return rc;
  for (int i = 0; i < n && !rc; i++) rc = k3k_gemm(r->be, x[i], w[i], y[i]);
  if (!rc) rc = rn_dev_side_mark(r, 1);
  int rc2 = rn_dev_side_end(r);
  return rc ? rc : rc2;
}
