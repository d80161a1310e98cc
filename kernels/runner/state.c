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
 * State arena: every pool tensor (per KDA layer S + conv q/k/v, per MLA layer the page pool)
 * sits at its own 256-byte-aligned offset of ONE allocation (docs/gpu-cluster.md §2): the
 * backend's, the caller's (opts.state.alloc, host backends: e.g. UCX-allocated memory a
 * same-host sender maps) or a k3k_vmm allocation (opts.state.vmm, cuda: exportable). Each
 * tensor keeps the layout [num_slots|num_pages, ...], so no kernel sees a difference.
 * Export/import copy through the backend (copy_to_host / copy_from_host), so they work the
 * same for host and device pools. Region bytes: KDA = per slot; MLA = n_pages(len) pages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_xdev.h"
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

#define RN_SALIGN 256 /* state arena alignment of every pool tensor */

int rn_state_check_opts(const k3_runner_t *r, char *err, size_t errlen) {
  const k3_runner_arena_opts_t *a = &r->opts.state;
  if (a->alloc && a->vmm) {
    rn_seterr(err, errlen, "runner: state arena: give a caller allocator or vmm, not both");
    return K3_EINVAL;
  }
  if ((a->alloc != NULL) != (a->free != NULL)) {
    rn_seterr(err, errlen, "runner: state arena: a caller allocator needs both alloc and free");
    return K3_EINVAL;
  }
  if (a->alloc && !r->be->host_memory) {
    rn_seterr(err, errlen, "runner: state arena: a caller allocator is for host backends (backend %s: use vmm)",
              r->backend_name);
    return K3_EINVAL;
  }
  if (a->vmm && r->be->host_memory) {
    rn_seterr(err, errlen, "runner: state arena: vmm needs backend cuda (not %s)", r->backend_name);
    return K3_ENOTSUP;
  }
  return 0;
}

/* Allocates the state arena (r->sa) of `bytes` from where opts.state says, and zeroes it. On
 * error r->sa holds whatever must still be handed back (rn_state_free does). */
static int arena_alloc(k3_runner_t *r, size_t bytes, char *err, size_t errlen) {
  const k3_runner_arena_opts_t *a = &r->opts.state;
  void *p = NULL;
  int rc = 0;
  if (a->alloc) {
    p = a->alloc(a->ud, bytes);
    if (!p) {
      rn_seterr(err, errlen, "runner: state arena: the caller's allocator failed (%zu bytes)", bytes);
      return K3_ENOMEM;
    }
    r->sa.user = true;
    r->sa.base = p;
    if ((uintptr_t)p % RN_SALIGN) {
      rn_seterr(err, errlen, "runner: state arena: the caller's allocator returned memory not aligned to %d bytes",
                RN_SALIGN);
      return K3_EINVAL;
    }
  } else if (a->vmm) {
    if ((rc = k3k_vmm_alloc(r->be, bytes, &r->sa.vmm))) {
      rn_seterr(err, errlen, "runner: state arena: no shareable (VMM) device memory of %zu bytes: %s (the log "
                "says why)", bytes, k3_strerror(rc));
      return rc;
    }
    p = k3k_vmm_ptr(r->sa.vmm);
  } else {
    /* host backends align to 64 bytes only: take 256 more and align the base up */
    if ((rc = r->be->alloc(r->be, bytes + RN_SALIGN, &r->sa.raw))) {
      rn_seterr(err, errlen, "runner: no memory for the state pools (%zu bytes in one allocation)", bytes);
      return rc;
    }
    p = (void *)(((uintptr_t)r->sa.raw + RN_SALIGN - 1) / RN_SALIGN * RN_SALIGN);
  }
  r->sa.base = p;
  r->sa.bytes = bytes;
  return r->be->memset(r->be, p, 0, bytes);
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
  /* every pool tensor at its own 256-byte-aligned offset of one arena, in the order KDA layers
   * (S, conv q, k, v) then MLA layers; each keeps its [num_slots|num_pages, ...] layout */
  const int64_t NH = c->kda_num_heads, DK = c->kda_head_dim, P = c->kda_proj_dim;
  const int n_t = 4 * r->n_kda + r->n_mla;
  struct {
    k3k_tensor_t *t;
    k3k_dtype_t dt;
    int ndim;
    int64_t shape[4];
    size_t off;
  } *pl = calloc((size_t)n_t + 1, sizeof *pl);
  if (!pl) return K3_ENOMEM;
  int k = 0;
  for (int i = 0; i < r->n_kda; i++) {
    pl[k].t = &r->kda_S[i], pl[k].dt = K3K_F32, pl[k].ndim = 4;
    pl[k].shape[0] = o->num_slots, pl[k].shape[1] = NH, pl[k].shape[2] = DK, pl[k].shape[3] = DK;
    k++;
    for (int j = 0; j < 3; j++, k++) {
      pl[k].t = &r->kda_conv[i][j], pl[k].dt = r->sdt, pl[k].ndim = 3;
      pl[k].shape[0] = o->num_slots, pl[k].shape[1] = P, pl[k].shape[2] = c->conv_kernel - 1;
    }
  }
  for (int i = 0; i < r->n_mla; i++, k++) {
    pl[k].t = &r->mla_cache[i], pl[k].dt = r->sdt, pl[k].ndim = 3;
    pl[k].shape[0] = o->num_pages, pl[k].shape[1] = o->page_tokens, pl[k].shape[2] = c->mla_cache_dim;
  }
  size_t total = 0;
  for (k = 0; k < n_t; k++) {
    int64_t n = 1;
    for (int d = 0; d < pl[k].ndim; d++) n *= pl[k].shape[d];
    pl[k].off = (total + RN_SALIGN - 1) / RN_SALIGN * RN_SALIGN;
    total = pl[k].off + (size_t)n * k3k_dtype_size(pl[k].dt);
  }
  total = (total + RN_SALIGN - 1) / RN_SALIGN * RN_SALIGN;
  if ((rc = arena_alloc(r, total ? total : RN_SALIGN, err, errlen))) {
    free(pl);
    return rc;
  }
  for (k = 0; k < n_t; k++)
    *pl[k].t = k3k_tensor_make(r->be, pl[k].dt, (char *)r->sa.base + pl[k].off, pl[k].ndim, pl[k].shape);
  free(pl);
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
  /* one arena holds every pool tensor: hand it back to where it came from */
  if (r->sa.user && r->sa.base)
    r->opts.state.free(r->opts.state.ud, r->sa.base);
  else if (r->sa.vmm)
    k3k_vmm_free(r->sa.vmm);
  else if (r->sa.raw && r->be)
    r->be->free(r->be, r->sa.raw);
  memset(&r->sa, 0, sizeof r->sa);
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

void k3_runner_state_arena(const k3_runner_t *r, void **base, size_t *bytes) {
  if (base) *base = r->sa.base;
  if (bytes) *bytes = r->sa.bytes;
}

struct k3k_vmm *k3_runner_state_vmm(const k3_runner_t *r) { return r->sa.vmm; }

int k3_runner_pool_mem(const k3_runner_t *r, int i, void **base, size_t *stride_bytes,
                       size_t *count) {
  if (i < 0 || (size_t)i >= r->man.n) return K3_EINVAL;
  if (base) *base = r->regmem[i].base;
  if (stride_bytes) *stride_bytes = r->regmem[i].stride;
  if (count) *count = r->regmem[i].count;
  return 0;
}
