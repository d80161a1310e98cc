/* Per-sequence state manifest and its fingerprint (manifest.h; ARCHITECTURE.md §2). The byte
 * counts must reproduce spec §10.2 (K3: 449,372,160 B KDA + 27,648 B/token) and 48B §8.2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/manifest.h"
#include "k3pd/util.h"

const char *k3_region_kind_name(k3_region_kind_t k) {
  static const char *const n[] = {"mla_latent", "kda_state", "kda_conv_q", "kda_conv_k", "kda_conv_v"};
  return (unsigned)k < 5 ? n[k] : "unknown";
}

static void set_region(k3_region_t *r, const char *suffix, k3_region_kind_t kind, int layer, int kidx,
                       k3_dtype_t dt, int ndim, const int64_t *shape) {
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "L%d.%s", layer, suffix);
  r->kind = kind;
  r->layer = layer;
  r->kind_index = kidx;
  r->dtype = dt;
  r->ndim = ndim;
  uint64_t n = k3_dtype_size(dt);
  for (int i = 0; i < ndim; i++) {
    r->shape[i] = shape[i];
    n *= (uint64_t)shape[i];
  }
  r->bytes = n;
}

int k3_manifest_build(const k3_model_config_t *cfg, int page_tokens, k3_manifest_t *m) {
  if (!cfg || page_tokens < 1 || cfg->num_layers < 1) return K3_EINVAL;
  size_t n = (size_t)cfg->num_mla + 4 * (size_t)cfg->num_kda;
  k3_region_t *r = calloc(n ? n : 1, sizeof *r);
  if (!r) return K3_ENOMEM;
  k3_manifest_t out = {.regions = r, .n = n, .page_tokens = page_tokens};
  size_t k = 0;
  int64_t H = cfg->kda_num_heads, D = cfg->kda_head_dim, P = cfg->kda_proj_dim, W1 = cfg->conv_kernel - 1;
  for (int l = 0; l < cfg->num_layers; l++) {
    int ki = cfg->kind_index[l];
    if (cfg->layer_kind[l] == K3_LAYER_MLA) {
      set_region(&r[k++], "mla.latent", K3_REGION_MLA_LATENT, l, ki, K3_DT_BF16, 2,
                 (const int64_t[]){page_tokens, cfg->mla_cache_dim});
      out.mla_bytes_per_page += r[k - 1].bytes;
    } else {
      set_region(&r[k++], "kda.state", K3_REGION_KDA_STATE, l, ki, K3_DT_F32, 3, (const int64_t[]){H, D, D});
      set_region(&r[k++], "kda.conv_q", K3_REGION_KDA_CONV_Q, l, ki, K3_DT_BF16, 2, (const int64_t[]){P, W1});
      set_region(&r[k++], "kda.conv_k", K3_REGION_KDA_CONV_K, l, ki, K3_DT_BF16, 2, (const int64_t[]){P, W1});
      set_region(&r[k++], "kda.conv_v", K3_REGION_KDA_CONV_V, l, ki, K3_DT_BF16, 2, (const int64_t[]){P, W1});
      for (int j = 1; j <= 4; j++) out.kda_bytes_per_slot += r[k - j].bytes;
    }
  }
  out.mla_bytes_per_token = out.mla_bytes_per_page / (uint64_t)page_tokens;

  /* Canonical serialisation: version, config fields, page size, regions. */
  size_t cap = k3_model_config_canonical(cfg, NULL, 0) + 64 + n * 128;
  char *buf = malloc(cap);
  if (!buf) {
    free(r);
    return K3_ENOMEM;
  }
  size_t len = (size_t)snprintf(buf, cap, "k3pd-state-manifest-v1\n");
  len += k3_model_config_canonical(cfg, buf + len, cap - len);
  len += (size_t)snprintf(buf + len, cap - len, "page_tokens=%d\nlayout=kda_state:HVK\n", page_tokens);
  for (size_t i = 0; i < n && len < cap; i++) {
    len += (size_t)snprintf(buf + len, cap - len, "%s %s %d %s", r[i].name, k3_region_kind_name(r[i].kind),
                            r[i].layer, k3_dtype_name(r[i].dtype));
    for (int d = 0; d < r[i].ndim && len < cap; d++) len += (size_t)snprintf(buf + len, cap - len, " %lld", (long long)r[i].shape[d]);
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, " %llu\n", (unsigned long long)r[i].bytes);
  }
  if (len >= cap) { /* cannot happen with the bound above; never hash a truncated text */
    free(buf);
    free(r);
    return K3_EINTERNAL;
  }
  out.fingerprint = k3_hash64(buf, len, 0);
  free(buf);
  *m = out;
  return 0;
}

void k3_manifest_free(k3_manifest_t *m) {
  if (!m) return;
  free(m->regions);
  memset(m, 0, sizeof *m);
}

uint64_t k3_manifest_handoff_bytes(const k3_manifest_t *m, int64_t tokens) {
  if (tokens < 0) tokens = 0;
  uint64_t pages = ((uint64_t)tokens + (uint64_t)m->page_tokens - 1) / (uint64_t)m->page_tokens;
  return m->kda_bytes_per_slot + pages * m->mla_bytes_per_page;
}
