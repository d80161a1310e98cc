/* Synthetic weights generated directly in device memory for a "cuda" runner
 * (k3_runner_init_synth): the bytes k3_synth_fill (and so k3pd-mkckpt) produces, without a host
 * copy of the model.
 *
 * What it is for: the medium preset is 91.6 GB, more than the GPU host's disk, and takes ~20 min
 * to generate on its 16 cores (MXFP4 masters: two Box-Muller normals each, generated once for
 * the packed codes and again for the scales). On the GPU (kernels/cuda/synth_gpu.cu) it takes
 * seconds. Per tensor: generate on the device into its slot of the runner's weights arena, patch the few "uncertain" elements
 * (values within 256 double ulps of a float rounding midpoint, where the device's log/cos may
 * round differently from glibc's) with k3_synth_fill on the host, optionally compare slices with
 * the host generator, bind.
 * What it is not: a weights object. The runner owns the device memory (the weights arena) and the
 * plan (k3_tmap_plan); there is no host copy, so a CPU reference cannot share these weights.
 * Invariants: after rn_syn_tensor returns 0 the tensor's device bytes equal k3_synth_fill's for
 * the same (config, entry, seed); a verification mismatch is K3_EINTERNAL naming the tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda.h"
#include "k3pd/err.h"
#include "k3pd/synth.h"
#include "k3pd/util.h"
#include "runner_internal.h"

#define SYN_CAP (1u << 20) /* uncertain elements/groups one tensor may have (~1 in 2^20 expected) */

struct rn_syn {
  k3_tmap_t tmap;
  uint64_t seed;
  int verify_kib;     /* bytes compared per tensor with the host generator: 0 none, < 0 all */
  size_t *idx;        /* open-addressing index of short names -> entry + 1 (0 empty) */
  size_t idx_cap;
  uint64_t *d_flags;  /* device [SYN_CAP] + one unsigned counter after it */
  unsigned *d_n;
  uint64_t *h_flags;
  uint64_t done, next_report, patched, verified;
  uint8_t *hbuf, *dbuf; /* host staging for patches and verification */
  size_t hbuf_cap;
};

static size_t hslot(const char *s, size_t cap) { return (size_t)(k3_hash64(s, strlen(s), 7) & (cap - 1)); }

const k3_tmap_entry_t *rn_syn_find(const k3_runner_t *r, const char *short_name) {
  const struct rn_syn *y = r->syn;
  for (size_t i = hslot(short_name, y->idx_cap);; i = (i + 1) & (y->idx_cap - 1)) {
    if (!y->idx[i]) return NULL;
    const k3_tmap_entry_t *e = &y->tmap.entries[y->idx[i] - 1];
    if (!strcmp(e->short_name, short_name)) return e;
  }
}

void rn_syn_end(k3_runner_t *r) {
  struct rn_syn *y = r->syn;
  if (!y) return;
  if (y->d_flags) r->be->free(r->be, y->d_flags);
  free(y->idx);
  free(y->h_flags);
  free(y->hbuf);
  free(y->dbuf);
  k3_tmap_free(&y->tmap);
  free(y);
  r->syn = NULL;
}

int rn_syn_begin(k3_runner_t *r, uint64_t seed, int verify_kib, char *err, size_t errlen) {
  struct rn_syn *y = calloc(1, sizeof *y);
  if (!y) return K3_ENOMEM;
  r->syn = y;
  y->seed = seed;
  y->verify_kib = verify_kib;
  int rc = k3_tmap_plan(&r->cfg, &y->tmap, err, errlen);
  if (rc) return rc;
  y->idx_cap = 64;
  while (y->idx_cap < 2 * y->tmap.n) y->idx_cap *= 2;
  y->idx = calloc(y->idx_cap, sizeof *y->idx);
  y->h_flags = malloc(SYN_CAP * sizeof *y->h_flags);
  y->hbuf_cap = (size_t)1 << 20;
  y->hbuf = malloc(y->hbuf_cap);
  y->dbuf = malloc(y->hbuf_cap);
  if (!y->idx || !y->h_flags || !y->hbuf || !y->dbuf) return K3_ENOMEM;
  for (size_t n = 0; n < y->tmap.n; n++) {
    size_t i = hslot(y->tmap.entries[n].short_name, y->idx_cap);
    while (y->idx[i]) i = (i + 1) & (y->idx_cap - 1);
    y->idx[i] = n + 1;
  }
  void *d = NULL;
  if ((rc = r->be->alloc(r->be, SYN_CAP * sizeof(uint64_t) + 64, &d))) return rc;
  y->d_flags = d;
  y->d_n = (unsigned *)((char *)d + SYN_CAP * sizeof(uint64_t));
  y->next_report = (uint64_t)8 << 30;
  r->tmap = &y->tmap;
  return 0;
}

/* The plain generator parameters of a non-MXFP4 entry (synth.c role_value). */
static int plain_params(const k3_runner_t *r, const k3_tmap_entry_t *e, uint64_t seed,
                        k3k_cu_synth_plain *p) {
  memset(p, 0, sizeof *p);
  if (e->dtype != K3_DT_BF16 && e->dtype != K3_DT_F32) return K3_EINVAL;
  p->f32 = e->dtype == K3_DT_F32;
  p->key = k3_synth_key(e->name, seed);
  p->kind = K3K_SYN_NORMAL;
  switch (e->role) {
    case K3_ROLE_NORM: p->a = 0.1, p->b = 1.0, p->has_b = 1; break;
    case K3_ROLE_CONV: p->a = 0.3; break;
    case K3_ROLE_ROUTER_BIAS: p->a = 0.01; break;
    case K3_ROLE_A_LOG:
      p->kind = K3K_SYN_LOG_UNIFORM;
      p->n_valid = r->cfg.kda_num_heads;
      break;
    case K3_ROLE_DT_BIAS:
      p->kind = K3K_SYN_AFFINE_UNIFORM;
      p->a = 5.0;
      p->b = r->cfg.type == K3_MODEL_K3 ? -7.0 : -4.0;
      break;
    default: p->a = 0.02; break;
  }
  return 0;
}

static int64_t numel(const k3_tmap_entry_t *e) {
  int64_t n = 1;
  for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
  return n;
}

/* Compares bytes [off, off+len) of the device tensor with k3_synth_fill. */
static int verify_range(k3_runner_t *r, const k3_tmap_entry_t *e, const uint8_t *dev, uint64_t off,
                        size_t len, char *err, size_t errlen) {
  struct rn_syn *y = r->syn;
  while (len > 0) {
    size_t n = len < y->hbuf_cap ? len : y->hbuf_cap;
    int rc = k3_synth_fill(&r->cfg, e, y->seed, off, n, y->hbuf);
    if (!rc) rc = r->be->copy_to_host(r->be, y->dbuf, dev + off, n);
    if (rc) return rc;
    if (memcmp(y->hbuf, y->dbuf, n)) {
      size_t at = 0;
      while (y->hbuf[at] == y->dbuf[at]) at++;
      rn_seterr(err, errlen, "runner: device-generated %s differs from k3_synth_fill at byte %llu "
                "(0x%02x vs 0x%02x)", e->name, (unsigned long long)(off + at), y->dbuf[at], y->hbuf[at]);
      return K3_EINTERNAL;
    }
    y->verified += n;
    off += n;
    len -= n;
  }
  return 0;
}

int rn_syn_tensor(k3_runner_t *r, const char *short_name, const k3_tmap_entry_t **e_out,
                  void *dev, char *err, size_t errlen) {
  struct rn_syn *y = r->syn;
  k3k_backend_t *be = r->be;
  cudaStream_t st = k3k_cuda_stream(k3k_cuda_ctx_of(be));
  const k3_tmap_entry_t *e = rn_syn_find(r, short_name);
  if (!e) {
    rn_seterr(err, errlen, "runner: tensor %s is not in the plan of this config", short_name);
    return K3_ENOENT;
  }
  int rc = 0;
  const bool mx = e->role == K3_ROLE_EXPERT_PACKED || e->role == K3_ROLE_EXPERT_SCALE;
  const bool scale = e->role == K3_ROLE_EXPERT_SCALE;
  if (!rc) rc = be->memset(be, y->d_n, 0, sizeof(unsigned));
  if (!rc && mx) {
    char base[256];
    size_t n = strlen(e->name), sl = scale ? 6 : 7; /* "_scale" / "_packed" */
    if (n >= sizeof base || n < sl) {
      rc = K3_EINVAL;
    } else {
      memcpy(base, e->name, n - sl);
      base[n - sl] = 0;
      rc = k3k_cu_synth_mx_fill(st, k3_synth_key(base, y->seed), e->logical_rows, e->logical_cols,
                                scale, dev, y->d_flags, y->d_n, SYN_CAP);
    }
  } else if (!rc) {
    k3k_cu_synth_plain p;
    rc = plain_params(r, e, y->seed, &p);
    if (!rc) rc = k3k_cu_synth_plain_fill(st, &p, dev, numel(e), y->d_flags, y->d_n, SYN_CAP);
  }
  /* patch the uncertain values with the host generator */
  unsigned nf = 0;
  if (!rc) rc = be->copy_to_host(be, &nf, y->d_n, sizeof nf);
  if (!rc && nf > SYN_CAP) rc = K3_EINTERNAL;
  if (!rc && nf) rc = be->copy_to_host(be, y->h_flags, y->d_flags, (size_t)nf * sizeof(uint64_t));
  const size_t unit = mx ? (scale ? 1 : 16) : (e->dtype == K3_DT_F32 ? 4 : 2);
  for (unsigned i = 0; i < nf && !rc; i++) {
    uint64_t off = y->h_flags[i] * unit;
    rc = k3_synth_fill(&r->cfg, e, y->seed, off, unit, y->hbuf);
    if (!rc) rc = be->copy_from_host(be, (uint8_t *)dev + off, y->hbuf, unit);
  }
  y->patched += nf;
  if (!rc && y->verify_kib) {
    uint64_t want = y->verify_kib < 0 ? e->nbytes : (uint64_t)y->verify_kib << 10;
    if (want >= e->nbytes) {
      rc = verify_range(r, e, dev, 0, e->nbytes, err, errlen);
    } else {
      /* the first slice and one at a name-dependent offset (aligned to the element/group) */
      uint64_t mid = k3_hash64(e->name, strlen(e->name), 1) % (e->nbytes - want + 1);
      mid -= mid % 16; /* element-aligned for every dtype */
      rc = verify_range(r, e, dev, 0, (size_t)want, err, errlen);
      if (!rc) rc = verify_range(r, e, dev, mid, (size_t)want, err, errlen);
    }
  }
  if (rc) {
    if (err && !err[0])
      rn_seterr(err, errlen, "runner: device generation of %s failed: %s%s", e->name, k3_strerror(rc),
                nf > SYN_CAP ? " (too many uncertain values)" : "");
    return rc;
  }
  y->done += e->nbytes;
  if (y->done >= y->next_report) {
    fprintf(stderr, "runner: generated %.1f / %.1f GiB on the device (%llu values patched from the host)\n",
            (double)y->done / (1 << 30), (double)y->tmap.total_bytes / (1 << 30),
            (unsigned long long)y->patched);
    y->next_report += (uint64_t)8 << 30;
  }
  *e_out = e;
  return 0;
}

void rn_syn_summary(const k3_runner_t *r, uint64_t *patched, uint64_t *verified) {
  *patched = r->syn ? r->syn->patched : 0;
  *verified = r->syn ? r->syn->verified : 0;
}
