/* The checkpoint tensor map: the complete, ordered list of tensors a config's checkpoint holds,
 * with exact names (incl. the "language_model." prefix for K3, none for the 48B), dtypes, shapes
 * and roles (spec k3-model.md §7, kimi-linear-48b.md §7). It is the single source of truth for
 * the writer (k3pd-mkckpt), the loader's validation (weights.h), the synthetic generator
 * (synth.h) and the medium dry run. Nothing else spells tensor names.
 *
 * Order: embed_tokens, then per layer (norms, attention-residual params, mixer, FFN/MoE with
 * experts last), then model.norm, the output attention-residual params and lm_head.
 *
 * A_log: K3 stores [128] with the first num_heads entries used (the real checkpoint: 96 of
 * 128; tiny: 4 of 128). The plan says [a_log_len] = [max(128, num_heads)]; the loader accepts
 * any 1-D length >= num_heads (spec §11.1: the real writer's pad rule is unknowable). The 48B
 * form is [1,1,H,1], exact. */
#ifndef K3PD_TMAP_H
#define K3PD_TMAP_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/model_config.h"
#include "k3pd/safetensors.h"

typedef enum {
  K3_ROLE_EMBED = 0,      /* embed_tokens */
  K3_ROLE_LM_HEAD,
  K3_ROLE_NORM,           /* any RMSNorm gain (incl. o_norm, q_a/kv_a layernorm, routed_expert_norm) */
  K3_ROLE_ATTN_RES_PROJ,  /* *_res_proj [1, H] */
  K3_ROLE_LINEAR,         /* a bf16 nn.Linear weight [out, in] */
  K3_ROLE_CONV,           /* {q,k,v}_conv1d.weight [P, 1, W] */
  K3_ROLE_A_LOG,
  K3_ROLE_DT_BIAS,
  K3_ROLE_ROUTER,         /* block_sparse_moe.gate.weight */
  K3_ROLE_ROUTER_BIAS,    /* gate.e_score_correction_bias */
  K3_ROLE_EXPERT,         /* bf16 routed-expert weight (48B) */
  K3_ROLE_EXPERT_PACKED,  /* MXFP4 codes [N, K/2] u8 */
  K3_ROLE_EXPERT_SCALE,   /* E8M0 scales [N, K/32] u8 */
  K3_ROLE_COUNT
} k3_tensor_role_t;

typedef struct {
  const char *name;       /* full checkpoint name, e.g. "language_model.model.layers.3.self_attn.q_a_proj.weight" */
  const char *short_name; /* name without the config's tensor prefix (points into name) */
  k3_dtype_t dtype;
  int ndim;
  int64_t shape[K3_MAX_DIMS];
  k3_tensor_role_t role;
  int layer;              /* 0-based layer, -1 for global tensors */
  int expert;             /* routed expert index, -1 otherwise */
  int64_t logical_rows, logical_cols; /* MXFP4 entries: the dequantized [N, K]; else 0 */
  uint64_t nbytes;
  uint64_t params;        /* logical parameters (an MXFP4 weight counts N*K once, on its packed entry) */
} k3_tmap_entry_t;

typedef struct {
  k3_tmap_entry_t *entries; /* owned; names live in an arena owned by the map */
  size_t n;
  uint64_t total_bytes;
  uint64_t total_params;
  char *arena_;             /* private */
} k3_tmap_t;

/* Plans every tensor of cfg's checkpoint. On success *out owns its memory (k3_tmap_free).
 * Returns 0, K3_ENOMEM, or K3_ECONFIG (a config the map cannot express). */
int k3_tmap_plan(const k3_model_config_t *cfg, k3_tmap_t *out, char *err, size_t errlen);
void k3_tmap_free(k3_tmap_t *m);

/* Lookup by full name (linear search; use weights.h for O(1) lookups); NULL when absent. */
const k3_tmap_entry_t *k3_tmap_find(const k3_tmap_t *m, const char *full_name);

/* "linear", "norm", ... (static). */
const char *k3_tensor_role_name(k3_tensor_role_t r);

/* Returns 0 when `v` satisfies entry `e` (same dtype and shape, except the K3 A_log rule above:
 * 1-D, length >= num_heads), else K3_EFORMAT with the reason (expected vs found) in why. */
int k3_tmap_check_view(const k3_model_config_t *cfg, const k3_tmap_entry_t *e,
                       const k3_tensor_view_t *v, char *why, size_t whylen);

#endif
