/* Tensor map planner: the ordered list of every checkpoint tensor for a config (spec §7,
 * 48B §7). Two passes over the same walk: the first counts entries and name bytes, the second
 * fills them, so the map is two allocations however large (the real K3 has 497,052 tensors). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "k3pd/err.h"
#include "k3pd/tmap.h"

typedef struct {
  const k3_model_config_t *c;
  k3_tmap_t *m;      /* NULL in the counting pass */
  size_t n;          /* entries so far */
  size_t arena_len;  /* name bytes so far */
  const char *layer_prefix; /* "model.layers.L." for the current layer */
  int layer, expert;
} plan_t;

static void emit(plan_t *p, k3_tensor_role_t role, k3_dtype_t dt, int ndim, const int64_t *shape,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void emit(plan_t *p, k3_tensor_role_t role, k3_dtype_t dt, int ndim, const int64_t *shape,
                 const char *fmt, ...) {
  char tail[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tail, sizeof tail, fmt, ap);
  va_end(ap);
  char name[256];
  int len = snprintf(name, sizeof name, "%s%s%s", p->c->tensor_prefix, p->layer_prefix, tail);
  if (p->m) {
    k3_tmap_entry_t *e = &p->m->entries[p->n];
    memset(e, 0, sizeof *e);
    char *dst = p->m->arena_ + p->arena_len;
    memcpy(dst, name, (size_t)len + 1);
    e->name = dst;
    e->short_name = dst + strlen(p->c->tensor_prefix);
    e->dtype = dt;
    e->ndim = ndim;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
      e->shape[i] = shape[i];
      numel *= (uint64_t)shape[i];
    }
    e->role = role;
    e->layer = p->layer;
    e->expert = p->expert;
    e->nbytes = numel * k3_dtype_size(dt);
    e->params = numel;
    if (role == K3_ROLE_EXPERT_PACKED) {
      e->logical_rows = shape[0];
      e->logical_cols = shape[1] * 2;
      e->params = numel * 2;
    } else if (role == K3_ROLE_EXPERT_SCALE) {
      e->logical_rows = shape[0];
      e->logical_cols = shape[1] * K3_MXFP4_GROUP;
      e->params = 0;
    }
    p->m->total_bytes += e->nbytes;
    p->m->total_params += e->params;
  }
  p->n++;
  p->arena_len += (size_t)len + 1;
}

#define S1(a) ((const int64_t[]){(a)})
#define S2(a, b) ((const int64_t[]){(a), (b)})
#define S3(a, b, c) ((const int64_t[]){(a), (b), (c)})
#define S4(a, b, c, d) ((const int64_t[]){(a), (b), (c), (d)})
#define BF K3_DT_BF16

/* An nn.Linear [out, in] expert weight: bf16, or MXFP4 packed + scale. */
static void expert_linear(plan_t *p, const char *w, int64_t out, int64_t in) {
  const k3_model_config_t *c = p->c;
  if (c->experts_mxfp4) {
    emit(p, K3_ROLE_EXPERT_PACKED, K3_DT_U8, 2, S2(out, in / 2), "block_sparse_moe.experts.%d.%s.weight_packed", p->expert, w);
    emit(p, K3_ROLE_EXPERT_SCALE, K3_DT_U8, 2, S2(out, in / K3_MXFP4_GROUP), "block_sparse_moe.experts.%d.%s.weight_scale", p->expert, w);
  } else {
    emit(p, K3_ROLE_EXPERT, BF, 2, S2(out, in), "block_sparse_moe.experts.%d.%s.weight", p->expert, w);
  }
}

static void plan_kda(plan_t *p) {
  const k3_model_config_t *c = p->c;
  int64_t H = c->hidden_size, P = c->kda_proj_dim, hd = c->kda_head_dim, nh = c->kda_num_heads;
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(P, H), "self_attn.q_proj.weight");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(P, H), "self_attn.k_proj.weight");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(P, H), "self_attn.v_proj.weight");
  emit(p, K3_ROLE_CONV, c->dt_conv, 3, S3(P, 1, c->conv_kernel), "self_attn.q_conv1d.weight");
  emit(p, K3_ROLE_CONV, c->dt_conv, 3, S3(P, 1, c->conv_kernel), "self_attn.k_conv1d.weight");
  emit(p, K3_ROLE_CONV, c->dt_conv, 3, S3(P, 1, c->conv_kernel), "self_attn.v_conv1d.weight");
  if (c->type == K3_MODEL_K3)
    emit(p, K3_ROLE_A_LOG, K3_DT_F32, 1, S1(c->a_log_len), "self_attn.A_log");
  else
    emit(p, K3_ROLE_A_LOG, K3_DT_F32, 4, S4(1, 1, nh, 1), "self_attn.A_log");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(hd, H), "self_attn.f_a_proj.weight");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(P, hd), "self_attn.f_b_proj.weight");
  emit(p, K3_ROLE_DT_BIAS, K3_DT_F32, 1, S1(P), "self_attn.dt_bias");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(nh, H), "self_attn.b_proj.weight");
  if (c->use_full_rank_gate) {
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(P, H), "self_attn.g_proj.weight");
  } else {
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(hd, H), "self_attn.g_a_proj.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(P, hd), "self_attn.g_b_proj.weight");
  }
  emit(p, K3_ROLE_NORM, c->dt_o_norm, 1, S1(hd), "self_attn.o_norm.weight");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(H, P), "self_attn.o_proj.weight");
}

static void plan_mla(plan_t *p) {
  const k3_model_config_t *c = p->c;
  int64_t H = c->hidden_size, nh = c->num_heads;
  if (c->q_lora_rank > 0) {
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(c->q_lora_rank, H), "self_attn.q_a_proj.weight");
    emit(p, K3_ROLE_NORM, BF, 1, S1(c->q_lora_rank), "self_attn.q_a_layernorm.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(nh * c->mla_qk_head_dim, c->q_lora_rank), "self_attn.q_b_proj.weight");
  } else {
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(nh * c->mla_qk_head_dim, H), "self_attn.q_proj.weight");
  }
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(c->mla_cache_dim, H), "self_attn.kv_a_proj_with_mqa.weight");
  emit(p, K3_ROLE_NORM, BF, 1, S1(c->kv_lora_rank), "self_attn.kv_a_layernorm.weight");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(nh * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank),
       "self_attn.kv_b_proj.weight");
  emit(p, K3_ROLE_LINEAR, BF, 2, S2(H, nh * c->v_head_dim), "self_attn.o_proj.weight");
  if (c->mla_use_output_gate)
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(nh * c->v_head_dim, H), "self_attn.g_proj.weight");
}

static void plan_ffn(plan_t *p, int l) {
  const k3_model_config_t *c = p->c;
  int64_t H = c->hidden_size;
  if (!c->layer_is_moe[l]) {
    int64_t I = c->intermediate_size;
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(I, H), "mlp.gate_proj.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(I, H), "mlp.up_proj.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(H, I), "mlp.down_proj.weight");
    return;
  }
  int64_t E = c->num_experts, F = c->moe_intermediate_size, D = c->expert_in_dim, S = c->shared_expert_width;
  emit(p, K3_ROLE_ROUTER, BF, 2, S2(E, H), "block_sparse_moe.gate.weight");
  emit(p, K3_ROLE_ROUTER_BIAS, c->dt_router_bias, 1, S1(E), "block_sparse_moe.gate.e_score_correction_bias");
  if (c->routed_expert_hidden_size > 0) {
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(D, H), "block_sparse_moe.routed_expert_down_proj.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(H, D), "block_sparse_moe.routed_expert_up_proj.weight");
    if (c->latent_moe_use_norm) emit(p, K3_ROLE_NORM, BF, 1, S1(D), "block_sparse_moe.routed_expert_norm.weight");
  }
  if (S > 0) {
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(S, H), "block_sparse_moe.shared_experts.gate_proj.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(S, H), "block_sparse_moe.shared_experts.up_proj.weight");
    emit(p, K3_ROLE_LINEAR, BF, 2, S2(H, S), "block_sparse_moe.shared_experts.down_proj.weight");
  }
  for (int x = 0; x < E; x++) {
    p->expert = x;
    expert_linear(p, "w1", F, D);
    expert_linear(p, "w2", D, F);
    expert_linear(p, "w3", F, D);
  }
  p->expert = -1;
}

static void walk(plan_t *p) {
  const k3_model_config_t *c = p->c;
  int64_t H = c->hidden_size, V = c->vocab_size;
  int res = c->attn_res_block_size > 0;
  p->layer = p->expert = -1;
  p->layer_prefix = "";
  emit(p, K3_ROLE_EMBED, BF, 2, S2(V, H), "model.embed_tokens.weight");
  for (int l = 0; l < c->num_layers; l++) {
    char lp[40];
    snprintf(lp, sizeof lp, "model.layers.%d.", l);
    p->layer_prefix = lp;
    p->layer = l;
    emit(p, K3_ROLE_NORM, BF, 1, S1(H), "input_layernorm.weight");
    emit(p, K3_ROLE_NORM, BF, 1, S1(H), "post_attention_layernorm.weight");
    if (res) {
      emit(p, K3_ROLE_NORM, BF, 1, S1(H), "self_attention_res_norm.weight");
      emit(p, K3_ROLE_ATTN_RES_PROJ, BF, 2, S2(1, H), "self_attention_res_proj.weight");
      emit(p, K3_ROLE_NORM, BF, 1, S1(H), "mlp_res_norm.weight");
      emit(p, K3_ROLE_ATTN_RES_PROJ, BF, 2, S2(1, H), "mlp_res_proj.weight");
    }
    if (c->layer_kind[l] == K3_LAYER_KDA)
      plan_kda(p);
    else
      plan_mla(p);
    plan_ffn(p, l);
  }
  p->layer = -1;
  p->layer_prefix = "";
  emit(p, K3_ROLE_NORM, BF, 1, S1(H), "model.norm.weight");
  if (res) {
    emit(p, K3_ROLE_NORM, BF, 1, S1(H), "model.output_attn_res_norm.weight");
    emit(p, K3_ROLE_ATTN_RES_PROJ, BF, 2, S2(1, H), "model.output_attn_res_proj.weight");
  }
  emit(p, K3_ROLE_LM_HEAD, BF, 2, S2(V, H), "lm_head.weight");
}

int k3_tmap_plan(const k3_model_config_t *cfg, k3_tmap_t *out, char *err, size_t errlen) {
  if (!cfg || cfg->num_layers < 1 || !cfg->tensor_prefix) {
    ck_seterr(err, errlen, "tmap: config was not parsed");
    return K3_ECONFIG;
  }
  if (cfg->experts_mxfp4 && (cfg->expert_in_dim % K3_MXFP4_GROUP || cfg->moe_intermediate_size % K3_MXFP4_GROUP)) {
    ck_seterr(err, errlen, "tmap: MXFP4 expert dims must be multiples of %d", K3_MXFP4_GROUP);
    return K3_ECONFIG;
  }
  plan_t p = {.c = cfg};
  walk(&p);
  k3_tmap_t m;
  memset(&m, 0, sizeof m);
  m.entries = malloc(p.n * sizeof *m.entries);
  m.arena_ = malloc(p.arena_len);
  if (!m.entries || !m.arena_) {
    free(m.entries);
    free(m.arena_);
    ck_seterr(err, errlen, "tmap: out of memory for %zu tensors", p.n);
    return K3_ENOMEM;
  }
  size_t want = p.n;
  p = (plan_t){.c = cfg, .m = &m};
  walk(&p);
  m.n = p.n;
  if (m.n != want) {
    k3_tmap_free(&m);
    ck_seterr(err, errlen, "tmap: internal error (pass mismatch)");
    return K3_EINTERNAL;
  }
  *out = m;
  return 0;
}

void k3_tmap_free(k3_tmap_t *m) {
  if (!m) return;
  free(m->entries);
  free(m->arena_);
  memset(m, 0, sizeof *m);
}

const k3_tmap_entry_t *k3_tmap_find(const k3_tmap_t *m, const char *full_name) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->entries[i].name, full_name) == 0) return &m->entries[i];
  return NULL;
}

const char *k3_tensor_role_name(k3_tensor_role_t r) {
  static const char *const names[K3_ROLE_COUNT] = {
      "embed", "lm_head", "norm", "attn_res_proj", "linear", "conv", "a_log", "dt_bias",
      "router", "router_bias", "expert", "expert_packed", "expert_scale"};
  return (unsigned)r < K3_ROLE_COUNT ? names[r] : "unknown";
}

static void fmt_shape(char *buf, size_t cap, k3_dtype_t dt, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(buf, cap, "%s [", k3_dtype_name(dt));
  for (int i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

int k3_tmap_check_view(const k3_model_config_t *cfg, const k3_tmap_entry_t *e,
                       const k3_tensor_view_t *v, char *why, size_t whylen) {
  int ok = v->dtype == e->dtype;
  if (ok && e->role == K3_ROLE_A_LOG && cfg->type == K3_MODEL_K3) {
    ok = v->ndim == 1 && v->shape[0] >= cfg->kda_num_heads;
  } else if (ok) {
    ok = v->ndim == e->ndim;
    for (int i = 0; ok && i < e->ndim; i++) ok = v->shape[i] == e->shape[i];
  }
  if (ok) return 0;
  char want[96], got[96];
  fmt_shape(want, sizeof want, e->dtype, e->ndim, e->shape);
  fmt_shape(got, sizeof got, v->dtype, v->ndim, v->shape);
  if (e->role == K3_ROLE_A_LOG && cfg->type == K3_MODEL_K3)
    ck_seterr(why, whylen, "expected F32 [n >= %d], found %s", cfg->kda_num_heads, got);
  else
    ck_seterr(why, whylen, "expected %s, found %s", want, got);
  return K3_EFORMAT;
}
