/* The per-sequence state manifest (ARCHITECTURE.md §2 "State manifest"): every region of decode
 * state a prefill hands to a decode worker, with dtype, shape and bytes, and the fingerprint
 * both sides exchange at registration (workers with different fingerprints are never paired).
 *
 * Regions, in layer order:
 *   MLA layer: "L{l}.mla.latent"  bf16 [page_tokens, kv_lora_rank + qk_rope_head_dim] per PAGE
 *              (576 values = 1152 B per token for K3/48B: c_n then k_rot).
 *   KDA layer: "L{l}.kda.state"   fp32 [H, V, K] per SLOT, V-first (S_mem[h][v][k] = S[h][k][v],
 *              the K3 reference layout; k3pd uses it for the 48B too, whose hub reference is
 *              K-first: transpose at any foreign boundary);
 *              "L{l}.kda.conv_q|conv_k|conv_v" bf16 [P, W-1] per SLOT: the last W-1 raw
 *              (post-projection, pre-conv) inputs, oldest first.
 * fingerprint = xxhash64 (seed 0) of a canonical text serialisation: a version line, every
 * architecture field of the config (k3_model_config_canonical), page_tokens, then one line per
 * region. Any change to the model, the layout or the page size changes it. */
#ifndef K3PD_MANIFEST_H
#define K3PD_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/model_config.h"
#include "k3pd/safetensors.h"

typedef enum {
  K3_REGION_MLA_LATENT = 0, /* per page */
  K3_REGION_KDA_STATE,      /* per slot */
  K3_REGION_KDA_CONV_Q,
  K3_REGION_KDA_CONV_K,
  K3_REGION_KDA_CONV_V,
} k3_region_kind_t;

typedef struct {
  char name[32];            /* "L3.mla.latent", "L0.kda.state", ... */
  k3_region_kind_t kind;
  int layer;                /* 0-based model layer */
  int kind_index;           /* cfg->kind_index[layer] */
  k3_dtype_t dtype;
  int ndim;
  int64_t shape[4];
  uint64_t bytes;           /* per slot (KDA) or per page (MLA) */
} k3_region_t;

typedef struct {
  k3_region_t *regions;     /* owned */
  size_t n;
  int page_tokens;
  uint64_t kda_bytes_per_slot;   /* sum over KDA regions (spec §10.2: 449,372,160 for K3) */
  uint64_t mla_bytes_per_page;   /* sum over MLA regions of one page */
  uint64_t mla_bytes_per_token;  /* 27,648 for K3 */
  uint64_t fingerprint;
} k3_manifest_t;

/* Builds the manifest. page_tokens >= 1. Returns 0, K3_EINVAL or K3_ENOMEM; on error *m is
 * untouched. Free with k3_manifest_free. */
int k3_manifest_build(const k3_model_config_t *cfg, int page_tokens, k3_manifest_t *m);
void k3_manifest_free(k3_manifest_t *m);

/* Bytes a sequence of `tokens` tokens hands off (KDA slot + ceil(tokens/page) pages). */
uint64_t k3_manifest_handoff_bytes(const k3_manifest_t *m, int64_t tokens);

/* "mla_latent", "kda_state", "kda_conv_q", ... (static). */
const char *k3_region_kind_name(k3_region_kind_t k);

#endif
