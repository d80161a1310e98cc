/* Model runner lifecycle: options, init / free, accessors, roofline figures.
 * Weight binding is bind.c (views onto host weights, or one weights arena on device backends,
 * possibly shared with other processes: share.c); the state pools are state.c.
 * Not here: the forward pass (forward.c and the layer files) and state export (state.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "runner_internal.h"

void k3_runner_opts_default(k3_runner_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->precision = K3_RUNNER_FP32;
  o->backend = "cpu";
  o->threads = 1;
  o->page_tokens = 64;
  o->num_pages = 64;
  o->num_slots = 4;
  o->max_batch_seqs = 8;
  o->prefill_chunk_tokens = 256;
}

void rn_seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- lifecycle -------------------------------------------------------------------------- */

/* w != NULL: bind/upload w's tensors; w == NULL: generate cfg's weights on the device. */
static int init_common(const k3_weights_t *w, const k3_model_config_t *cfg, uint64_t seed,
                       int verify_kib, const k3_runner_t *src, const k3_runner_opts_t *opts,
                       k3_runner_t **out, char *err, size_t errlen) {
  if (!out) return K3_EINVAL;
  k3_runner_opts_t o;
  if (opts)
    o = *opts;
  else
    k3_runner_opts_default(&o);
  const char *be = o.backend ? o.backend : "cpu";
  if (strcmp(be, "cpu") && strcmp(be, "cpu-fast") && strcmp(be, "cuda")) {
    rn_seterr(err, errlen, "runner: unknown backend '%s' (expected cpu, cpu-fast or cuda)", be);
    return K3_ENOTSUP;
  }
  if (o.precision != K3_RUNNER_FP32 && o.precision != K3_RUNNER_BF16) {
    rn_seterr(err, errlen, "runner: bad precision %d (expected fp32 or bf16)", (int)o.precision);
    return K3_EINVAL;
  }
  if (o.page_tokens <= 0 || o.num_pages < 0 || o.num_slots < 0 || o.max_batch_seqs <= 0) {
    rn_seterr(err, errlen, "runner: page_tokens (%d) and max_batch_seqs (%d) must be > 0, "
              "num_pages (%d) and num_slots (%d) >= 0", o.page_tokens, o.max_batch_seqs,
              o.num_pages, o.num_slots);
    return K3_EINVAL;
  }
  if (!strcmp(be, "cuda") && o.precision != K3_RUNNER_BF16) {
    /* The CUDA GEMMs take activations of the weights' dtype (bf16): fp32 mode would need an
     * fp32 x bf16 GEMM the backend does not have. */
    rn_seterr(err, errlen, "runner: backend cuda runs precision bf16 only (fp32 asked)");
    return K3_ENOTSUP;
  }
  if (o.threads <= 0) o.threads = 1;
  if (o.prefill_chunk_tokens <= 0) o.prefill_chunk_tokens = 256;
  o.prefill_chunk_tokens = (o.prefill_chunk_tokens + 63) / 64 * 64;

  k3_runner_t *r = calloc(1, sizeof *r);
  if (!r) return K3_ENOMEM;
  r->cfg = w ? *k3_weights_config(w) : src ? src->cfg : *cfg;
  r->w = w;
  r->src = src;
  r->tmap = w ? k3_weights_tmap(w) : src ? src->tmap : NULL;
  snprintf(r->backend_name, sizeof r->backend_name, "%s", be);
  o.backend = r->backend_name;
  r->opts = o;
  r->n_kda = r->cfg.num_kda;
  r->n_mla = r->cfg.num_mla;
  r->bf16 = o.precision == K3_RUNNER_BF16;
  r->act = r->bf16 ? K3K_BF16 : K3K_F32;
  r->sdt = r->act;
  if (!strcmp(be, "cpu-fast") && o.threads > 0) k3k_cpu_fast_set_threads(o.threads);
  r->be = k3k_backend_get(be);
  int rc = 0;
  if (!r->be) {
    rn_seterr(err, errlen, "runner: backend '%s' is not available", be);
    rc = K3_ENOTSUP;
  }
  if (!rc) rc = rn_state_check_opts(r, err, errlen);
  uint64_t t0 = k3_now_ns();
  if (!rc && src && !r->be->host_memory) {
    rn_seterr(err, errlen, "runner: a copy of a device-generated runner needs a host backend");
    rc = K3_ENOTSUP;
  }
  if (!rc && !w && !src) {
    if (strcmp(be, "cuda")) {
      rn_seterr(err, errlen, "runner: device-generated weights need backend cuda (not %s)", be);
      rc = K3_ENOTSUP;
    } else {
      rc = rn_syn_begin(r, seed, verify_kib, err, errlen);
    }
  }
  /* the weights' identity for sharing: the loader's text, or the synthetic seed */
  char ident[128];
  const char *identity = o.weights_source;
  if (!identity && !w && !src) {
    snprintf(ident, sizeof ident, "synthetic seed=%llu", (unsigned long long)seed);
    identity = ident;
  }
  if (!rc && o.share_weights_dir && !identity) {
    rn_seterr(err, errlen, "runner: shared weights need opts.weights_source (what the weights are)");
    rc = K3_EINVAL;
  }
  if (!rc && o.share_weights_dir && r->be->host_memory) {
    rn_seterr(err, errlen, "runner: shared weights (%s) need a device backend, not %s", o.share_weights_dir, be);
    rc = K3_ENOTSUP;
  }
  if (!rc) rc = rn_bind_all(r, identity, err, errlen);
  if (!rc && !w && !src && !r->wa.imported) {
    uint64_t patched, verified;
    rn_syn_summary(r, &patched, &verified);
    fprintf(stderr, "runner: %.1f GiB of synthetic weights generated on the device in %.1f s "
            "(%llu values recomputed on the host, %.1f MiB compared with k3_synth_fill)\n",
            (double)r->tmap->total_bytes / (1 << 30), (double)(k3_now_ns() - t0) / 1e9,
            (unsigned long long)patched, (double)verified / (1 << 20));
  }
  if (!rc) rc = rn_state_init(r, err, errlen);
  if (!rc) rc = rn_experts_init(r, err, errlen);
  if (!rc) rc = rn_dev_init(r, err, errlen);
  if (!rc) rn_dev_kda_init(r);
  if (!rc) rc = rn_gd_init(r, err, errlen);
  /* the caller's strings need not outlive init (share.c keeps what it needs) */
  r->opts.share_weights_dir = NULL;
  r->opts.weights_source = NULL;
  if (rc) {
    if (rc == K3_ENOMEM && err && !err[0]) rn_seterr(err, errlen, "runner: out of memory");
    k3_runner_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

int k3_runner_init(const k3_weights_t *w, const k3_runner_opts_t *opts, k3_runner_t **out,
                   char *err, size_t errlen) {
  if (!w) return K3_EINVAL;
  return init_common(w, NULL, 0, 0, NULL, opts, out, err, errlen);
}

int k3_runner_init_synth(const k3_model_config_t *cfg, uint64_t seed, int verify_kib,
                         const k3_runner_opts_t *opts, k3_runner_t **out, char *err, size_t errlen) {
  if (!cfg) return K3_EINVAL;
  return init_common(NULL, cfg, seed, verify_kib, NULL, opts, out, err, errlen);
}

int k3_runner_init_copy(const k3_runner_t *src, const k3_runner_opts_t *opts, k3_runner_t **out,
                        char *err, size_t errlen) {
  if (!src || !src->syn) {
    rn_seterr(err, errlen, "runner: k3_runner_init_copy needs a runner made by k3_runner_init_synth");
    return K3_EINVAL;
  }
  return init_common(NULL, NULL, 0, 0, src, opts, out, err, errlen);
}

void k3_runner_free(k3_runner_t *r) {
  if (!r) return;
  if (r->be) rn_gd_free(r);
  rn_ws_destroy(r);
  rn_state_free(r);
  if (r->be) rn_dev_free(r);
  if (r->be) rn_experts_free(r);
  if (r->be) rn_free_weights(r);
  if (r->be) rn_syn_end(r);
  free(r);
}

void k3_runner_weights_arena(const k3_runner_t *r, void **base, size_t *bytes, uint64_t *layout_hash) {
  if (base) *base = r->wa.on ? r->wa.base : NULL;
  if (bytes) *bytes = r->wa.on ? r->wa.bytes : 0;
  if (layout_hash) *layout_hash = r->wl_hash;
}

int k3_runner_weights_shared(const k3_runner_t *r) { return !r->share ? 0 : r->wa.imported ? 2 : 1; }

const k3_model_config_t *k3_runner_config(const k3_runner_t *r) { return &r->cfg; }
const k3_runner_opts_t *k3_runner_opts(const k3_runner_t *r) { return &r->opts; }
struct k3k_backend *k3_runner_backend(const k3_runner_t *r) { return r->be; }
int64_t k3_runner_vocab(const k3_runner_t *r) { return r->cfg.vocab_size; }

void k3_runner_get_stats(const k3_runner_t *r, k3_runner_stats_t *out) { *out = r->stats; }

void k3_runner_set_graphs(k3_runner_t *r, bool on) {
  r->graphs_off = !on;
  if (!on) rn_gd_drop(r); /* re-enabling captures afresh */
}

/* ---- roofline figures ---------------------------------------------------------------------- */

double k3_runner_decode_bytes(const k3_runner_t *r, int batch) {
  const k3_model_config_t *c = &r->cfg;
  const k3_tmap_t *m = r->tmap;
  const double E = c->num_experts, k = c->top_k;
  const double used = E > 0 ? E * (1.0 - pow(1.0 - k / E, batch)) : 0;
  double b = 0;
  for (size_t i = 0; i < m->n; i++) {
    const k3_tmap_entry_t *e = &m->entries[i];
    if (e->role == K3_ROLE_EMBED)
      b += (double)e->nbytes / (double)c->vocab_size * batch;
    else if (e->expert >= 0)
      b += (double)e->nbytes * used / E;
    else
      b += (double)e->nbytes;
  }
  return b + 2.0 * batch * (double)r->man.kda_bytes_per_slot;
}

double k3_runner_prefill_flops(const k3_runner_t *r, int64_t T) {
  const k3_model_config_t *c = &r->cfg;
  const k3_tmap_t *m = r->tmap;
  double tok = 0, head = 0;
  for (size_t i = 0; i < m->n; i++) {
    const k3_tmap_entry_t *e = &m->entries[i];
    if (e->role == K3_ROLE_EMBED) continue;
    if (e->role == K3_ROLE_LM_HEAD)
      head += (double)e->params;
    else if (e->expert >= 0)
      tok += (double)e->params * c->top_k / c->num_experts;
    else
      tok += (double)e->params;
  }
  const double t = (double)T;
  double f = 2.0 * t * tok + 2.0 * head;
  f += (double)c->num_mla * t * (t + 1.0) * c->num_heads *
       (double)(c->mla_qk_head_dim + c->v_head_dim);
  f += (double)c->num_kda * t * c->kda_num_heads * 12.0 * c->kda_head_dim * c->kda_head_dim;
  return f;
}
