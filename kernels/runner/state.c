/* Decode-state pools, the precision-adjusted state manifest, and export/import of one
 * sequence's state region by region.
 *
 * Manifest: built by ckpt's k3_manifest_build (which describes the bf16 production layout).
 * In fp32 mode the MLA latents and the KDA conv states are stored fp32 (storing them bf16
 * would round values the fp32 forward keeps exact, and prefill(T) would stop matching
 * prefill(T-k) + k decode steps), so the runner rewrites those regions' dtype/bytes and
 * re-derives the fingerprint: xxhash64 of "k3_runner state v1", the precision, ckpt's
 * fingerprint and one line per adjusted region. It is re-derived in bf16 mode too, so the
 * precision is always part of it.
 * Export/import copy through the backend (copy_to_host / copy_from_host), so they work the
 * same for host and device pools. Region bytes: KDA = per slot; MLA = n_pages(len) pages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "runner_internal.h"

static int adjust_manifest(k3_runner_t *r) {
  k3_manifest_t *m = &r->man;
  size_t cap = 256 + m->n * 160, len = 0;
  char *buf = malloc(cap);
  if (!buf) return K3_ENOMEM;
  len += (size_t)snprintf(buf + len, cap - len, "k3_runner state v1\nprecision=%s\nbase=%016llx\n",
                          r->bf16 ? "bf16" : "fp32", (unsigned long long)m->fingerprint);
  m->kda_bytes_per_slot = 0;
  m->mla_bytes_per_page = 0;
  for (size_t i = 0; i < m->n; i++) {
    k3_region_t *g = &m->regions[i];
    if (g->kind != K3_REGION_KDA_STATE) {
      uint64_t numel = g->bytes / k3_dtype_size(g->dtype);
      g->dtype = r->bf16 ? K3_DT_BF16 : K3_DT_F32;
      g->bytes = numel * k3_dtype_size(g->dtype);
    }
    if (g->kind == K3_REGION_MLA_LATENT)
      m->mla_bytes_per_page += g->bytes;
    else
      m->kda_bytes_per_slot += g->bytes;
    len += (size_t)snprintf(buf + len, cap - len, "%s %s %d %lld %lld %lld %llu\n", g->name,
                            k3_dtype_name(g->dtype), g->ndim, (long long)g->shape[0],
                            (long long)g->shape[1], (long long)(g->ndim > 2 ? g->shape[2] : 0),
                            (unsigned long long)g->bytes);
  }
  m->mla_bytes_per_token = m->page_tokens ? m->mla_bytes_per_page / (uint64_t)m->page_tokens : 0;
  m->fingerprint = k3_hash64(buf, len, 0);
  free(buf);
  return 0;
}

static int pool_tensor(k3_runner_t *r, k3k_dtype_t dt, int ndim, const int64_t *shape,
                       k3k_tensor_t *t) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  size_t bytes = (size_t)n * k3k_dtype_size(dt);
  void *p = NULL;
  if (r->be->alloc(r->be, bytes ? bytes : 64, &p)) return K3_ENOMEM;
  r->be->memset(r->be, p, 0, bytes);
  *t = k3k_tensor_make(r->be, dt, p, ndim, shape);
  return 0;
}

int rn_state_init(k3_runner_t *r, char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  const k3_runner_opts_t *o = &r->opts;
  int rc = k3_manifest_build(c, o->page_tokens, &r->man);
  if (rc) {
    rn_seterr(err, errlen, "runner: cannot build the state manifest (%s)", k3_strerror(rc));
    return rc;
  }
  if ((rc = adjust_manifest(r))) return rc;
  r->slot_used = calloc((size_t)o->num_slots + 1, 1);
  r->page_used = calloc((size_t)o->num_pages + 1, 1);
  r->kda_S = calloc((size_t)r->n_kda + 1, sizeof *r->kda_S);
  r->kda_conv = calloc((size_t)r->n_kda + 1, sizeof *r->kda_conv);
  r->mla_cache = calloc((size_t)r->n_mla + 1, sizeof *r->mla_cache);
  r->regmem = calloc(r->man.n + 1, sizeof *r->regmem);
  if (!r->slot_used || !r->page_used || !r->kda_S || !r->kda_conv || !r->mla_cache || !r->regmem)
    return K3_ENOMEM;
  r->free_slots = o->num_slots;
  r->free_pages = o->num_pages;
  const int64_t NH = c->kda_num_heads, DK = c->kda_head_dim, P = c->kda_proj_dim;
  for (int i = 0; i < r->n_kda; i++) {
    int64_t s_shape[4] = {o->num_slots, NH, DK, DK};
    int64_t c_shape[3] = {o->num_slots, P, c->conv_kernel - 1};
    if (pool_tensor(r, K3K_F32, 4, s_shape, &r->kda_S[i])) return K3_ENOMEM;
    for (int j = 0; j < 3; j++)
      if (pool_tensor(r, r->sdt, 3, c_shape, &r->kda_conv[i][j])) return K3_ENOMEM;
  }
  for (int i = 0; i < r->n_mla; i++) {
    int64_t shape[3] = {o->num_pages, o->page_tokens, c->mla_cache_dim};
    if (pool_tensor(r, r->sdt, 3, shape, &r->mla_cache[i])) return K3_ENOMEM;
  }
  for (size_t i = 0; i < r->man.n; i++) {
    const k3_region_t *g = &r->man.regions[i];
    const k3k_tensor_t *t;
    int ki = g->kind_index;
    switch (g->kind) {
      case K3_REGION_MLA_LATENT: t = &r->mla_cache[ki]; break;
      case K3_REGION_KDA_STATE: t = &r->kda_S[ki]; break;
      case K3_REGION_KDA_CONV_Q: t = &r->kda_conv[ki][0]; break;
      case K3_REGION_KDA_CONV_K: t = &r->kda_conv[ki][1]; break;
      default: t = &r->kda_conv[ki][2]; break;
    }
    r->regmem[i].base = t->data;
    r->regmem[i].stride = (size_t)t->stride[0] * k3k_dtype_size(t->dtype);
    r->regmem[i].count = (size_t)t->shape[0];
    if (r->regmem[i].stride != g->bytes) {
      rn_seterr(err, errlen, "runner: manifest region %s is %llu bytes, pool stride %zu", g->name,
                (unsigned long long)g->bytes, r->regmem[i].stride);
      return K3_EINTERNAL;
    }
  }
  return 0;
}

void rn_state_free(k3_runner_t *r) {
  if (r->be) {
    for (int i = 0; r->kda_S && i < r->n_kda; i++) {
      if (r->kda_S[i].data) r->be->free(r->be, r->kda_S[i].data);
      for (int j = 0; j < 3; j++)
        if (r->kda_conv[i][j].data) r->be->free(r->be, r->kda_conv[i][j].data);
    }
    for (int i = 0; r->mla_cache && i < r->n_mla; i++)
      if (r->mla_cache[i].data) r->be->free(r->be, r->mla_cache[i].data);
  }
  free(r->kda_S);
  free(r->kda_conv);
  free(r->mla_cache);
  free(r->slot_used);
  free(r->page_used);
  free(r->regmem);
  if (r->man.regions) k3_manifest_free(&r->man);
}

const k3_manifest_t *k3_runner_manifest(const k3_runner_t *r) { return &r->man; }
uint64_t k3_runner_fingerprint(const k3_runner_t *r) { return r->man.fingerprint; }

uint64_t k3_runner_region_bytes(const k3_runner_t *r, int i, int64_t len) {
  if (i < 0 || (size_t)i >= r->man.n) return 0;
  const k3_region_t *g = &r->man.regions[i];
  if (g->kind == K3_REGION_MLA_LATENT) return (uint64_t)k3_runner_pages_for(r, len) * g->bytes;
  return g->bytes;
}

/* Validates (region, sequence) for export/import. */
static int check_seq(const k3_runner_t *r, const k3_seq_t *seq, int i) {
  if (!seq || i < 0 || (size_t)i >= r->man.n || seq->len < 0) return K3_EINVAL;
  const k3_region_t *g = &r->man.regions[i];
  if (g->kind == K3_REGION_MLA_LATENT) {
    int np = k3_runner_pages_for(r, seq->len);
    if (seq->n_pages < np || (np > 0 && !seq->pages)) return K3_EINVAL;
    for (int p = 0; p < np; p++)
      if (seq->pages[p] < 0 || seq->pages[p] >= r->opts.num_pages || !r->page_used[seq->pages[p]])
        return K3_EINVAL;
  } else if (seq->slot < 0 || seq->slot >= r->opts.num_slots || !r->slot_used[seq->slot]) {
    return K3_EINVAL;
  }
  return 0;
}

int k3_runner_export_region(const k3_runner_t *r, const k3_seq_t *seq, int i, void *dst,
                            size_t cap) {
  int rc = check_seq(r, seq, i);
  if (rc) return rc;
  uint64_t need = k3_runner_region_bytes(r, i, seq->len);
  if (cap < need || (need && !dst)) return K3_ERANGE;
  const k3_region_t *g = &r->man.regions[i];
  k3k_backend_t *be = r->be;
  const char *base = r->regmem[i].base;
  size_t stride = r->regmem[i].stride;
  if (g->kind == K3_REGION_MLA_LATENT) {
    int np = k3_runner_pages_for(r, seq->len);
    for (int p = 0; p < np; p++)
      if ((rc = be->copy_to_host(be, (char *)dst + (size_t)p * g->bytes,
                                 base + (size_t)seq->pages[p] * stride, g->bytes)))
        return rc;
    return 0;
  }
  return be->copy_to_host(be, dst, base + (size_t)seq->slot * stride, g->bytes);
}

int k3_runner_import_region(k3_runner_t *r, k3_seq_t *seq, int i, const void *src, size_t len) {
  int rc = check_seq(r, seq, i);
  if (rc) return rc;
  uint64_t need = k3_runner_region_bytes(r, i, seq->len);
  if (len != need || (need && !src)) return K3_ERANGE;
  const k3_region_t *g = &r->man.regions[i];
  k3k_backend_t *be = r->be;
  char *base = r->regmem[i].base;
  size_t stride = r->regmem[i].stride;
  if (g->kind == K3_REGION_MLA_LATENT) {
    int np = k3_runner_pages_for(r, seq->len);
    for (int p = 0; p < np; p++)
      if ((rc = be->copy_from_host(be, base + (size_t)seq->pages[p] * stride,
                                   (const char *)src + (size_t)p * g->bytes, g->bytes)))
        return rc;
    return 0;
  }
  return be->copy_from_host(be, base + (size_t)seq->slot * stride, src, g->bytes);
}

int k3_runner_pool_mem(const k3_runner_t *r, int i, void **base, size_t *stride_bytes,
                       size_t *count) {
  if (i < 0 || (size_t)i >= r->man.n) return K3_EINVAL;
  if (base) *base = r->regmem[i].base;
  if (stride_bytes) *stride_bytes = r->regmem[i].stride;
  if (count) *count = r->regmem[i].count;
  return 0;
}
