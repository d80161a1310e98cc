/* Weights: a validated set of named views over either an opened checkpoint directory (mmap)
 * or synthetic tensors generated in memory. One view per tmap entry, looked up through a hash
 * index by full name. Validation reports every problem at once (weights.h). Synthetic tensors
 * are filled by k3_synth_fill_many (N threads, same bytes for any N). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "k3pd/err.h"
#include "k3pd/synth.h"
#include "k3pd/weights.h"

struct k3_weights {
  k3_model_config_t cfg;
  k3_tmap_t map;
  k3_tensor_view_t *views; /* one per map entry, same order; names point into map */
  ck_index_t ix;
  k3_st_t *st;             /* checkpoint (open_dir) or NULL */
  uint8_t *mem;            /* synthetic storage or NULL */
};

void k3_weights_free(k3_weights_t *w) {
  if (!w) return;
  ck_index_free(&w->ix);
  free(w->views);
  k3_tmap_free(&w->map);
  k3_st_close(w->st);
  free(w->mem);
  free(w);
}

/* Allocates w with a plan and an index over (still empty) views named after the plan. */
static int weights_new(const k3_model_config_t *cfg, k3_weights_t **out, char *err, size_t errlen) {
  k3_weights_t *w = calloc(1, sizeof *w);
  if (!w) return K3_ENOMEM;
  w->cfg = *cfg;
  int rc = k3_tmap_plan(&w->cfg, &w->map, err, errlen);
  if (rc) {
    free(w);
    return rc;
  }
  w->views = calloc(w->map.n ? w->map.n : 1, sizeof *w->views);
  if (!w->views) {
    k3_weights_free(w);
    return K3_ENOMEM;
  }
  for (size_t i = 0; i < w->map.n; i++) {
    const k3_tmap_entry_t *e = &w->map.entries[i];
    k3_tensor_view_t *v = &w->views[i];
    v->name = e->name;
    v->dtype = e->dtype;
    v->ndim = e->ndim;
    int64_t stride = 1;
    for (int d = e->ndim - 1; d >= 0; d--) {
      v->shape[d] = e->shape[d];
      v->strides[d] = stride;
      stride *= e->shape[d];
    }
    v->nbytes = (size_t)e->nbytes;
  }
  size_t a, b;
  rc = ck_index_build(&w->ix, w->views, w->map.n, &a, &b);
  if (rc) {
    ck_seterr(err, errlen, "weights: plan has duplicate tensor '%s'", rc == K3_EEXIST ? w->views[b].name : "?");
    k3_weights_free(w);
    return rc == K3_EEXIST ? K3_EINTERNAL : rc;
  }
  *out = w;
  return 0;
}

static int ignored_extra(const k3_model_config_t *cfg, const char *name) {
  size_t pl = strlen(cfg->tensor_prefix);
  if (pl && strncmp(name, cfg->tensor_prefix, pl) == 0) name += pl;
  return strncmp(name, "vision_tower.", 13) == 0 || strncmp(name, "mm_projector.", 13) == 0;
}

int k3_weights_open_dir(const char *dir, k3_model_config_t *cfg_out, k3_weights_t **out, char *err,
                        size_t errlen) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path) {
    ck_seterr(err, errlen, "%s: path too long", dir);
    return K3_EINVAL;
  }
  k3_model_config_t cfg;
  int rc = k3_model_config_load(path, &cfg, err, errlen);
  if (rc) return rc;
  k3_weights_t *w = NULL;
  if ((rc = weights_new(&cfg, &w, err, errlen))) return rc;
  if ((rc = k3_st_open(dir, &w->st, err, errlen))) {
    k3_weights_free(w);
    return rc;
  }
  ck_errs_t e;
  char tmp[8192];
  ck_errs_init(&e, tmp, sizeof tmp);
  for (size_t i = 0; i < w->map.n; i++) {
    const k3_tmap_entry_t *ent = &w->map.entries[i];
    const k3_tensor_view_t *v = k3_st_find(w->st, ent->name);
    char why[256];
    if (!v) {
      ck_errs_add(&e, "missing tensor '%s'", ent->name);
    } else if (k3_tmap_check_view(&w->cfg, ent, v, why, sizeof why)) {
      ck_errs_add(&e, "tensor '%s' in %s: %s", ent->name, k3_st_file_of(w->st, ent->name), why);
    } else {
      w->views[i] = *v;
      w->views[i].name = ent->name;
    }
  }
  for (size_t i = 0; i < k3_st_count(w->st); i++) {
    const k3_tensor_view_t *v = k3_st_at(w->st, i);
    if (ck_index_find(&w->ix, w->views, v->name) < 0 && !ignored_extra(&w->cfg, v->name))
      ck_errs_add(&e, "unexpected tensor '%s' in %s", v->name, k3_st_file_of(w->st, v->name));
  }
  if (e.count) {
    ck_errs_finish(&e);
    ck_seterr(err, errlen, "%s: %s", dir, tmp);
    k3_weights_free(w);
    return K3_EFORMAT;
  }
  if (cfg_out) *cfg_out = w->cfg;
  *out = w;
  return 0;
}

int k3_weights_synth_opts(const k3_model_config_t *cfg, uint64_t seed, const k3_weights_synth_opts_t *opts,
                          k3_weights_t **out, char *err, size_t errlen) {
  k3_weights_synth_opts_t o = opts ? *opts : (k3_weights_synth_opts_t){0};
  if (o.threads < 0) {
    ck_seterr(err, errlen, "weights: synth threads must be >= 0 (0 = online CPUs), got %d", o.threads);
    return K3_EINVAL;
  }
  k3_weights_t *w = NULL;
  int rc = weights_new(cfg, &w, err, errlen);
  if (rc) return rc;
  /* One allocation; every tensor starts on a 64-byte boundary. */
  uint64_t total = 0;
  for (size_t i = 0; i < w->map.n; i++) total += (w->map.entries[i].nbytes + 63) & ~(uint64_t)63;
  uint8_t **dst = calloc(w->map.n ? w->map.n : 1, sizeof *dst);
  if (!dst || total > SIZE_MAX || !(w->mem = aligned_alloc(64, total ? (size_t)total : 64))) {
    ck_seterr(err, errlen, "weights: cannot allocate %llu bytes for synthetic weights", (unsigned long long)total);
    free(dst);
    k3_weights_free(w);
    return K3_ENOMEM;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < w->map.n; i++) {
    dst[i] = w->mem + off;
    w->views[i].data = dst[i];
    off += (w->map.entries[i].nbytes + 63) & ~(uint64_t)63;
  }
  size_t bad = 0;
  rc = k3_synth_fill_many(&w->cfg, w->map.entries, w->map.n, seed, dst, o.threads, o.progress, &bad);
  free(dst);
  if (rc) {
    if (rc == K3_ENOMEM) ck_seterr(err, errlen, "weights: out of memory planning the synthetic fill");
    else ck_seterr(err, errlen, "weights: cannot synthesise '%s': %s", w->map.entries[bad].name, k3_strerror(rc));
    k3_weights_free(w);
    return rc;
  }
  *out = w;
  return 0;
}

int k3_weights_synth(const k3_model_config_t *cfg, uint64_t seed, k3_weights_t **out, char *err,
                     size_t errlen) {
  k3_weights_synth_opts_t o = {.threads = 1};
  return k3_weights_synth_opts(cfg, seed, &o, out, err, errlen);
}

const k3_tensor_view_t *k3_weights_get_full(const k3_weights_t *w, const char *full_name) {
  int64_t i = ck_index_find(&w->ix, w->views, full_name);
  return i < 0 ? NULL : &w->views[i];
}

const k3_tensor_view_t *k3_weights_get(const k3_weights_t *w, const char *name) {
  char full[512];
  if (!name || snprintf(full, sizeof full, "%s%s", w->cfg.tensor_prefix, name) >= (int)sizeof full) return NULL;
  return k3_weights_get_full(w, full);
}

const k3_model_config_t *k3_weights_config(const k3_weights_t *w) { return &w->cfg; }
const k3_tmap_t *k3_weights_tmap(const k3_weights_t *w) { return &w->map; }
