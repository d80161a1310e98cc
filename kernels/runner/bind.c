/* Weight binding of the model runner: every tensor of the config's plan becomes a k3k view.
 * Host backends: views onto the k3_weights_t memory (zero copy), or for a host copy of a device
 * runner (k3_runner_init_copy) allocations of their own. Device backends: ONE weights arena per
 * runner (docs/model-runner.md "Memory"), filled by device generation or uploads, or imported
 * read-only from another process (share.c) and then not written at all.
 * Not here: the runner's lifecycle and options (runner.c), the state pools (state.c).
 * Invariant: bind order is the same for the same config on every process, so the layout (and
 * its hash) is too; the fill pass checks every tensor lands at its planned offset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "k3pd/err.h"
#include "runner_internal.h"

/* ---- weight binding --------------------------------------------------------------------
 * Host backends: every tensor is a k3k view onto the k3_weights_t memory (zero copy), or for a
 * host copy of a device runner (r->src) its own allocation filled from the source.
 * Device backends: every tensor lives in the weights arena at a bump offset in bind order
 * (256-byte aligned). Binding runs twice there: a PLAN pass (b->plan) that only looks the
 * tensors up, checks them and records the layout (r->wl, r->wl_hash, the arena size), then,
 * once the arena exists (be->alloc, or share.c's shared allocation), the FILL pass that binds
 * each tensor at its offset and generates (rn_syn_tensor) or uploads its bytes there; with
 * weights imported from another process the fill pass binds without writing anything. */

typedef struct {
  k3_runner_t *r;
  char *err;
  size_t errlen;
  int rc;
  bool plan;    /* device backends: first pass, layout only */
  size_t off;   /* next free byte of the weights arena */
  int idx;      /* tensors bound so far in this pass */
} binder_t;

#define RN_WALIGN 256 /* weights arena alignment of every tensor */

static k3k_dtype_t map_dtype(k3_dtype_t d) {
  switch (d) {
    case K3_DT_F32: return K3K_F32;
    case K3_DT_BF16: return K3K_BF16;
    case K3_DT_U8: return K3K_U8;
    default: return (k3k_dtype_t)-1;
  }
}

/* Room for one more entry in r->uploads (the bound tensors' device addresses). */
static int uploads_reserve(k3_runner_t *r) {
  if (r->n_uploads < r->cap_uploads) return 0;
  int cap = r->cap_uploads ? 2 * r->cap_uploads : 256;
  void **p = realloc(r->uploads, (size_t)cap * sizeof *p);
  if (!p) return K3_ENOMEM;
  r->uploads = p;
  r->cap_uploads = cap;
  return 0;
}

/* A bound tensor must have a k3k dtype and rows*cols elements (rows alone when cols is 0; any
 * count when both are 0, and then *rows becomes it). Sets b->rc/err and returns it on mismatch. */
static int check_elems(binder_t *b, const char *name, int64_t n, k3_dtype_t dtype, int64_t cols, int64_t *rows,
                       k3k_dtype_t *dt) {
  int64_t want = cols ? *rows * cols : *rows;
  *dt = map_dtype(dtype);
  if ((int)*dt < 0 || (want && n != want)) {
    rn_seterr(b->err, b->errlen, "runner: tensor %s has %lld elements of %s, expected %lld", name, (long long)n,
              k3_dtype_name(dtype), (long long)want);
    b->rc = K3_EFORMAT;
    return b->rc;
  }
  if (!want) *rows = n;
  return 0;
}

/* Records one tensor of the weights arena's layout (plan pass). */
static int wl_add(k3_runner_t *r, const char *name, k3_dtype_t dtype, int ndim, const int64_t *shape,
                  uint64_t bytes, uint64_t off) {
  if (r->n_wl == r->cap_wl) {
    int cap = r->cap_wl ? 2 * r->cap_wl : 256;
    rn_wl_t *p = realloc(r->wl, (size_t)cap * sizeof *p);
    if (!p) return K3_ENOMEM;
    r->wl = p;
    r->cap_wl = cap;
  }
  rn_wl_t *e = &r->wl[r->n_wl];
  memset(e, 0, sizeof *e);
  if (!(e->name = strdup(name))) return K3_ENOMEM;
  e->dtype = (int)dtype;
  e->ndim = ndim > 4 ? 4 : ndim;
  for (int i = 0; i < e->ndim; i++) e->shape[i] = shape[i];
  e->bytes = bytes;
  e->off = off;
  r->n_wl++;
  return 0;
}

/* XXH3-64 of the layout: a version tag, then per tensor "name\0" and dtype, ndim, shape[4],
 * bytes, offset as little-endian u64. */
static uint64_t wl_hash(const k3_runner_t *r) {
  XXH3_state_t *st = XXH3_createState();
  if (!st) return 0;
  XXH3_64bits_reset(st);
  static const char tag[] = "k3 weights layout v1";
  XXH3_64bits_update(st, tag, sizeof tag);
  for (int i = 0; i < r->n_wl; i++) {
    const rn_wl_t *e = &r->wl[i];
    uint64_t v[8] = {(uint64_t)e->dtype, (uint64_t)e->ndim, (uint64_t)e->shape[0], (uint64_t)e->shape[1],
                     (uint64_t)e->shape[2], (uint64_t)e->shape[3], e->bytes, e->off};
    uint8_t le[64];
    for (int k = 0; k < 64; k++) le[k] = (uint8_t)(v[k / 8] >> (8 * (k % 8)));
    XXH3_64bits_update(st, e->name, strlen(e->name) + 1);
    XXH3_64bits_update(st, le, sizeof le);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

/* Tensor `name` (without prefix) as a contiguous [rows, cols] view (cols 0: 1-D of rows
 * elements; rows*cols must equal the stored element count). */
static k3k_tensor_t view(binder_t *b, const char *name, int64_t rows, int64_t cols) {
  k3k_tensor_t t;
  memset(&t, 0, sizeof t);
  if (b->rc) return t;
  k3_runner_t *r = b->r;
  k3k_backend_t *be = r->be;
  /* look the tensor up: in the plan (device generation, or a copy of such a runner) or in w */
  const k3_tmap_entry_t *e = NULL;
  const k3_tensor_view_t *v = NULL;
  int ndim;
  const int64_t *shape;
  k3_dtype_t dtype;
  uint64_t nbytes;
  if (r->syn || r->src) {
    e = rn_syn_find(r->src ? r->src : r, name);
    if (!e) {
      rn_seterr(b->err, b->errlen, "runner: tensor %s is not in the plan of this config", name);
      b->rc = K3_ENOENT;
      return t;
    }
    ndim = e->ndim, shape = e->shape, dtype = e->dtype, nbytes = e->nbytes;
  } else {
    v = k3_weights_get(r->w, name);
    if (!v) {
      rn_seterr(b->err, b->errlen, "runner: tensor %s is missing", name);
      b->rc = K3_ENOENT;
      return t;
    }
    ndim = v->ndim, shape = v->shape, dtype = v->dtype, nbytes = v->nbytes;
  }
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  k3k_dtype_t dt;
  if (check_elems(b, name, n, dtype, cols, &rows, &dt)) return t;
  void *data = NULL;
  if (r->wa.on) { /* device backend: the tensor's slot of the weights arena */
    size_t off = (b->off + RN_WALIGN - 1) / RN_WALIGN * RN_WALIGN;
    b->off = off + (size_t)nbytes;
    if (b->plan) {
      if ((b->rc = wl_add(r, name, dtype, ndim, shape, nbytes, off))) return t;
    } else {
      if (b->idx >= r->n_wl || r->wl[b->idx].off != off || strcmp(r->wl[b->idx].name, name)) {
        rn_seterr(b->err, b->errlen, "runner: tensor %s bound out of plan order", name);
        b->rc = K3_EINTERNAL;
        return t;
      }
      data = (char *)r->wa.base + off;
      if ((b->rc = uploads_reserve(r))) return t;
      if (r->wa.imported) {
        /* another process's weights: already there, read-only */
      } else if (r->syn) {
        if ((b->rc = rn_syn_tensor(r, name, &e, data, b->err, b->errlen))) return t;
      } else if (nbytes && (b->rc = be->copy_from_host(be, data, v->data, nbytes))) {
        rn_seterr(b->err, b->errlen, "runner: cannot upload tensor %s to backend %s", name, be->name);
        return t;
      }
      r->uploads[r->n_uploads++] = data;
    }
    b->idx++;
  } else if (r->src) { /* a host copy of a device-generated runner: bind order = source's */
    const k3_runner_t *src = r->src;
    if ((b->rc = uploads_reserve(r))) return t;
    if (r->n_uploads >= src->n_uploads) {
      rn_seterr(b->err, b->errlen, "runner: tensor %s not found in the source runner", name);
      b->rc = K3_ENOENT;
      return t;
    }
    if ((b->rc = be->alloc(be, nbytes ? nbytes : 64, &data))) return t;
    b->rc = src->be->copy_to_host(src->be, data, src->uploads[r->n_uploads], nbytes);
    if (b->rc) {
      be->free(be, data);
      rn_seterr(b->err, b->errlen, "runner: cannot copy tensor %s from the source runner", name);
      return t;
    }
    r->uploads[r->n_uploads++] = data;
  } else {
    data = (void *)v->data; /* host backend: zero copy */
  }
  return cols ? k3k_tensor_2d(be, dt, data, rows, cols) : k3k_tensor_1d(be, dt, data, rows);
}

static int bind_layer(binder_t *b, int l) {
  k3_runner_t *r = b->r;
  const k3_model_config_t *c = &r->cfg;
  rn_layer_t *L = &r->layers[l];
  char n[256];
  const int64_t H = c->hidden_size;
#define NM(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
  L->kind = c->layer_kind[l];
  L->moe = c->layer_is_moe[l];
  L->boundary = c->attn_res_block_size > 0 && c->attn_res_boundary[l];
  L->in_ln = view(b, NM("model.layers.%d.input_layernorm.weight", l), H, 0);
  L->post_ln = view(b, NM("model.layers.%d.post_attention_layernorm.weight", l), H, 0);
  if (c->attn_res_block_size > 0) {
    L->sa_res_norm = view(b, NM("model.layers.%d.self_attention_res_norm.weight", l), H, 0);
    L->sa_res_proj = view(b, NM("model.layers.%d.self_attention_res_proj.weight", l), H, 0);
    L->mlp_res_norm = view(b, NM("model.layers.%d.mlp_res_norm.weight", l), H, 0);
    L->mlp_res_proj = view(b, NM("model.layers.%d.mlp_res_proj.weight", l), H, 0);
  }
  const char *sa = "self_attn";
  if (L->kind == K3_LAYER_KDA) {
    const int64_t P = c->kda_proj_dim, NH = c->kda_num_heads, DK = c->kda_head_dim;
    const int64_t W = c->conv_kernel, R = DK; /* f/g low rank = head_dim */
    L->q = view(b, NM("model.layers.%d.%s.q_proj.weight", l, sa), P, H);
    L->k = view(b, NM("model.layers.%d.%s.k_proj.weight", l, sa), P, H);
    L->v = view(b, NM("model.layers.%d.%s.v_proj.weight", l, sa), P, H);
    L->fa = view(b, NM("model.layers.%d.%s.f_a_proj.weight", l, sa), R, H);
    L->fb = view(b, NM("model.layers.%d.%s.f_b_proj.weight", l, sa), P, R);
    L->b = view(b, NM("model.layers.%d.%s.b_proj.weight", l, sa), NH, H);
    if (c->use_full_rank_gate) {
      L->g = view(b, NM("model.layers.%d.%s.g_proj.weight", l, sa), P, H);
    } else {
      L->ga = view(b, NM("model.layers.%d.%s.g_a_proj.weight", l, sa), R, H);
      L->gb = view(b, NM("model.layers.%d.%s.g_b_proj.weight", l, sa), P, R);
    }
    L->o = view(b, NM("model.layers.%d.%s.o_proj.weight", l, sa), H, P);
    static const char *cv[3] = {"q", "k", "v"};
    for (int j = 0; j < 3; j++)
      L->conv[j] = view(b, NM("model.layers.%d.%s.%s_conv1d.weight", l, sa, cv[j]), P, W);
    L->a_log = view(b, NM("model.layers.%d.%s.A_log", l, sa), 0, 0);
    L->dt_bias = view(b, NM("model.layers.%d.%s.dt_bias", l, sa), P, 0);
    L->o_norm = view(b, NM("model.layers.%d.%s.o_norm.weight", l, sa), DK, 0);
  } else {
    const int64_t NH = c->num_heads, DQK = c->mla_qk_head_dim, DV = c->v_head_dim;
    const int64_t CL = c->kv_lora_rank, CD = c->mla_cache_dim;
    if (c->q_lora_rank > 0) {
      L->qa = view(b, NM("model.layers.%d.%s.q_a_proj.weight", l, sa), c->q_lora_rank, H);
      L->qa_ln = view(b, NM("model.layers.%d.%s.q_a_layernorm.weight", l, sa), c->q_lora_rank, 0);
      L->qb = view(b, NM("model.layers.%d.%s.q_b_proj.weight", l, sa), NH * DQK, c->q_lora_rank);
    } else {
      L->qp = view(b, NM("model.layers.%d.%s.q_proj.weight", l, sa), NH * DQK, H);
    }
    L->kva = view(b, NM("model.layers.%d.%s.kv_a_proj_with_mqa.weight", l, sa), CD, H);
    L->kva_ln = view(b, NM("model.layers.%d.%s.kv_a_layernorm.weight", l, sa), CL, 0);
    L->kvb = view(b, NM("model.layers.%d.%s.kv_b_proj.weight", l, sa),
                     NH * (c->qk_nope_head_dim + DV), CL);
    L->mo = view(b, NM("model.layers.%d.%s.o_proj.weight", l, sa), H, NH * DV);
    if (c->mla_use_output_gate)
      L->mg = view(b, NM("model.layers.%d.%s.g_proj.weight", l, sa), NH * DV, H);
  }
  if (!L->moe) {
    const int64_t F = c->intermediate_size;
    L->d_gate = view(b, NM("model.layers.%d.mlp.gate_proj.weight", l), F, H);
    L->d_up = view(b, NM("model.layers.%d.mlp.up_proj.weight", l), F, H);
    L->d_down = view(b, NM("model.layers.%d.mlp.down_proj.weight", l), H, F);
  } else {
    const int64_t E = c->num_experts, F = c->moe_intermediate_size, D = c->expert_in_dim;
    const int64_t S = c->shared_expert_width;
    const char *m = "block_sparse_moe";
    L->router = view(b, NM("model.layers.%d.%s.gate.weight", l, m), E, H);
    L->router_bias = view(b, NM("model.layers.%d.%s.gate.e_score_correction_bias", l, m), E, 0);
    if (c->routed_expert_hidden_size > 0) {
      L->lat_down = view(b, NM("model.layers.%d.%s.routed_expert_down_proj.weight", l, m), D, H);
      L->lat_up = view(b, NM("model.layers.%d.%s.routed_expert_up_proj.weight", l, m), H, D);
      if (c->latent_moe_use_norm)
        L->lat_norm = view(b, NM("model.layers.%d.%s.routed_expert_norm.weight", l, m), D, 0);
    }
    if (S > 0) {
      L->sh_gate = view(b, NM("model.layers.%d.%s.shared_experts.gate_proj.weight", l, m), S, H);
      L->sh_up = view(b, NM("model.layers.%d.%s.shared_experts.up_proj.weight", l, m), S, H);
      L->sh_down = view(b, NM("model.layers.%d.%s.shared_experts.down_proj.weight", l, m), H, S);
    }
    L->w1 = calloc((size_t)E, sizeof(rn_expw_t));
    L->w3 = calloc((size_t)E, sizeof(rn_expw_t));
    L->w2 = calloc((size_t)E, sizeof(rn_expw_t));
    if (!L->w1 || !L->w3 || !L->w2) return b->rc = K3_ENOMEM;
    for (int e = 0; e < E && !b->rc; e++) {
      if (c->experts_mxfp4) {
        static const char *wn[3] = {"w1", "w3", "w2"};
        rn_expw_t *dst[3] = {&L->w1[e], &L->w3[e], &L->w2[e]};
        for (int j = 0; j < 3; j++) {
          int64_t rows = j < 2 ? F : D, cols = j < 2 ? D : F;
          dst[j]->mx = true;
          dst[j]->packed = view(b, NM("model.layers.%d.%s.experts.%d.%s.weight_packed", l, m, e, wn[j]),
                                rows, cols / 2);
          dst[j]->scale = view(b, NM("model.layers.%d.%s.experts.%d.%s.weight_scale", l, m, e, wn[j]),
                               rows, cols / K3_MXFP4_GROUP);
        }
      } else {
        L->w1[e].w = view(b, NM("model.layers.%d.%s.experts.%d.w1.weight", l, m, e), F, D);
        L->w3[e].w = view(b, NM("model.layers.%d.%s.experts.%d.w3.weight", l, m, e), F, D);
        L->w2[e].w = view(b, NM("model.layers.%d.%s.experts.%d.w2.weight", l, m, e), D, F);
      }
    }
  }
#undef NM
  return b->rc;
}

static void free_layers(k3_runner_t *r) {
  if (r->layers) {
    for (int l = 0; l < r->cfg.num_layers; l++) {
      free(r->layers[l].w1);
      free(r->layers[l].w3);
      free(r->layers[l].w2);
    }
  }
  free(r->layers);
  r->layers = NULL;
}

void rn_free_weights(k3_runner_t *r) {
  if (r->uploads_owned)
    for (int i = 0; i < r->n_uploads; i++) r->be->free(r->be, r->uploads[i]);
  free(r->uploads);
  r->uploads = NULL;
  r->n_uploads = 0;
  rn_share_free(r); /* shared weights: server, fds, mapping, lock */
  if (r->wa.be_owned && r->wa.base) r->be->free(r->be, r->wa.base);
  memset(&r->wa, 0, sizeof r->wa);
  for (int i = 0; i < r->n_wl; i++) free(r->wl[i].name);
  free(r->wl);
  r->wl = NULL;
  r->n_wl = r->cap_wl = 0;
  free_layers(r);
}

/* One binding pass over every tensor of the model (see the top of this section). */
static int bind_pass(k3_runner_t *r, bool plan, size_t *arena_bytes, char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  binder_t b = {r, err, errlen, 0, plan, 0, 0};
  free_layers(r);
  r->layers = calloc((size_t)c->num_layers, sizeof(rn_layer_t));
  if (!r->layers) return K3_ENOMEM;
  r->embed = view(&b, "model.embed_tokens.weight", c->vocab_size, c->hidden_size);
  r->lm_head = view(&b, "lm_head.weight", c->vocab_size, c->hidden_size);
  r->final_norm = view(&b, "model.norm.weight", c->hidden_size, 0);
  if (c->attn_res_block_size > 0) {
    r->out_res_norm = view(&b, "model.output_attn_res_norm.weight", c->hidden_size, 0);
    r->out_res_proj = view(&b, "model.output_attn_res_proj.weight", c->hidden_size, 0);
  }
  for (int l = 0; l < c->num_layers && !b.rc; l++) bind_layer(&b, l);
  if (arena_bytes) *arena_bytes = b.off;
  return b.rc;
}

int rn_bind_all(k3_runner_t *r, const char *identity, char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  int rc;
  r->uploads_owned = r->src != NULL && r->be->host_memory;
  r->wa.on = !r->be->host_memory;
  if (r->wa.on) {
    size_t bytes = 0;
    if ((rc = bind_pass(r, true, &bytes, err, errlen))) return rc;
    r->wa.bytes = bytes ? bytes : RN_WALIGN;
    r->wl_hash = wl_hash(r);
    if (r->opts.share_weights_dir) {
      rc = rn_share_begin(r, identity, err, errlen);
    } else {
      rc = r->be->alloc(r->be, r->wa.bytes, &r->wa.base);
      r->wa.be_owned = !rc;
      if (rc)
        rn_seterr(err, errlen, "runner: no device memory for the weights (%.2f GiB in one allocation)",
                  (double)r->wa.bytes / (1 << 30));
    }
    if (rc) return rc;
  }
  if ((rc = bind_pass(r, false, NULL, err, errlen))) return rc;
  for (int l = 0; l < c->num_layers; l++) {
    const rn_layer_t *L = &r->layers[l];
    if (L->kind == K3_LAYER_KDA && c->kda_gate == K3_KDA_GATE_LOWER_BOUND) {
      char n[128];
      snprintf(n, sizeof n, "model.layers.%d.self_attn.A_log", l);
      int64_t len = -1;
      if (r->syn || r->src) {
        const k3_tmap_entry_t *e = rn_syn_find(r->src ? r->src : r, n);
        if (e) len = e->shape[0];
      } else {
        const k3_tensor_view_t *v = k3_weights_get(r->w, n);
        if (v) len = k3_tensor_numel(v);
      }
      if (len < c->kda_num_heads) {
        rn_seterr(err, errlen, "runner: %s shorter than num_heads (%d)", n, c->kda_num_heads);
        return K3_EFORMAT;
      }
    }
  }
  /* shared weights: the arena is complete; serve it and let the next process in */
  if (r->share && (rc = rn_share_publish(r, err, errlen))) return rc;
  return 0;
}

