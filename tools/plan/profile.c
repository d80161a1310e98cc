/* k3pd-plan cost profile: the JSON file k3pd-bench --profile writes (schema "k3pd-profile/1",
 * docs/plan.md) and the cost functions the simulation calls.
 *
 * Not here: fitting (tools/bench/profile.c measures and fits; this file only reads and writes).
 * Every cost function is linear in its inputs and clamped at 0, so a noisy fit can never make
 * time run backwards in the simulation. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "k3pd/err.h"
#include "plan.h"

void pl_profile_default(pl_profile_t *p) {
  memset(p, 0, sizeof *p);
  /* the binaries' defaults (kernels/runner/load.c, prefill_worker/main.c) */
  p->pf = (pl_prefill_cfg_t){.chunk_tokens = 256, .max_batch = 16, .max_batch_tokens = 4096, .num_pages = 1024,
                             .page_tokens = 64, .num_slots = 8};
  p->dc = (pl_decode_cfg_t){.max_batch = 16, .num_pages = 1024, .page_tokens = 64, .num_slots = 16};
}

double pl_prefill_pass_ms(const pl_profile_t *p, int seqs, int64_t tokens, double tok_ctx_sum) {
  double t = p->pf_fixed_ms + p->pf_per_seq_ms * seqs + p->pf_per_token_ms * (double)tokens +
             p->pf_per_kctx_ms * tok_ctx_sum / 1000.0;
  return t > 0 ? t : 0;
}

double pl_decode_step_ms(const pl_profile_t *p, int batch, double ctx_sum) {
  double t = p->dc_fixed_ms + p->dc_per_seq_ms * batch + p->dc_per_kctx_ms * ctx_sum / 1000.0;
  return t > 0 ? t : 0;
}

double pl_handoff_ms(const pl_profile_t *p, int64_t prompt_tokens) {
  double t = p->ho_latency_ms;
  if (p->ho_bandwidth_bytes_per_s > 0) {
    double bytes = p->ho_bytes_fixed + p->ho_bytes_per_token * (double)prompt_tokens;
    t += bytes / p->ho_bandwidth_bytes_per_s * 1000.0;
  }
  return t > 0 ? t : 0;
}

/* ---- JSON ---- */

typedef struct {
  const char *obj, *key;
  int kind; /* 0 double, 1 int64, 2 int */
  size_t off;
  double min; /* smallest valid value */
} field_t;

#define D(o, k, f, m) {o, k, 0, offsetof(pl_profile_t, f), m}
#define I64(o, k, f, m) {o, k, 1, offsetof(pl_profile_t, f), m}
#define INT(o, k, f, m) {o, k, 2, offsetof(pl_profile_t, f), m}
static const field_t fields[] = {
    D("prefill", "pass_fixed_ms", pf_fixed_ms, -1e9),
    D("prefill", "pass_per_seq_ms", pf_per_seq_ms, -1e9),
    D("prefill", "pass_per_token_ms", pf_per_token_ms, -1e9),
    D("prefill", "pass_per_kilo_token_context_ms", pf_per_kctx_ms, -1e9),
    D("prefill", "pass_cv", pf_cv, 0),
    I64("prefill", "chunk_tokens", pf.chunk_tokens, 1),
    INT("prefill", "max_batch", pf.max_batch, 1),
    I64("prefill", "max_batch_tokens", pf.max_batch_tokens, 1),
    I64("prefill", "num_pages", pf.num_pages, 1),
    I64("prefill", "page_tokens", pf.page_tokens, 1),
    INT("prefill", "num_slots", pf.num_slots, 1),
    D("decode", "step_fixed_ms", dc_fixed_ms, -1e9),
    D("decode", "step_per_seq_ms", dc_per_seq_ms, -1e9),
    D("decode", "step_per_kilo_token_context_ms", dc_per_kctx_ms, -1e9),
    D("decode", "step_cv", dc_cv, 0),
    INT("decode", "max_batch", dc.max_batch, 1),
    I64("decode", "num_pages", dc.num_pages, 1),
    I64("decode", "page_tokens", dc.page_tokens, 1),
    INT("decode", "num_slots", dc.num_slots, 1),
    D("handoff", "bytes_fixed", ho_bytes_fixed, 0),
    D("handoff", "bytes_per_token", ho_bytes_per_token, 0),
    D("handoff", "latency_ms", ho_latency_ms, 0),
    D("handoff", "bandwidth_bytes_per_s", ho_bandwidth_bytes_per_s, 0),
    D("overhead", "ttft_ms", ttft_overhead_ms, 0),
    D("overhead", "itl_ms", itl_overhead_ms, 0),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

int pl_profile_load(const char *path, pl_profile_t *p, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
    return K3_EINVAL;
  }
  int rc = K3_EINVAL;
  pl_profile_t t = *p;
  const char *schema = json_string_value(json_object_get(root, "schema"));
  if (!json_is_object(root) || !schema || strcmp(schema, "k3pd-profile/1") != 0) {
    snprintf(err, errlen, "%s: schema: want \"k3pd-profile/1\", got %s", path, schema ? schema : "none");
    goto out;
  }
  for (size_t i = 0; i < NFIELDS; i++) {
    const field_t *f = &fields[i];
    json_t *o = json_object_get(root, f->obj);
    if (o && !json_is_object(o)) {
      snprintf(err, errlen, "%s: %s: want an object", path, f->obj);
      goto out;
    }
    json_t *v = o ? json_object_get(o, f->key) : NULL;
    if (!v) continue;
    if (!json_is_number(v)) {
      snprintf(err, errlen, "%s: %s.%s: want a number", path, f->obj, f->key);
      goto out;
    }
    double x = json_number_value(v);
    if (x < f->min || x != x) {
      snprintf(err, errlen, "%s: %s.%s: %g is below %g", path, f->obj, f->key, x, f->min);
      goto out;
    }
    char *dst = (char *)&t + f->off;
    if (f->kind == 0) *(double *)dst = x;
    else if (f->kind == 1) *(int64_t *)dst = (int64_t)x;
    else *(int *)dst = (int)x;
  }
  const char *src = json_string_value(json_object_get(root, "source"));
  if (src) snprintf(t.source, sizeof t.source, "%s", src);
  *p = t;
  rc = 0;
out:
  json_decref(root);
  return rc;
}

int pl_profile_save(const char *path, const pl_profile_t *p, void *fit_json, char *err, size_t errlen) {
  json_t *root = json_object();
  if (!root) return K3_ENOMEM;
  json_object_set_new(root, "schema", json_string("k3pd-profile/1"));
  json_object_set_new(root, "source", json_string(p->source));
  for (size_t i = 0; i < NFIELDS; i++) {
    const field_t *f = &fields[i];
    json_t *o = json_object_get(root, f->obj);
    if (!o) {
      o = json_object();
      json_object_set_new(root, f->obj, o);
    }
    const char *src = (const char *)p + f->off;
    json_t *v = f->kind == 0   ? json_real(*(const double *)src)
                : f->kind == 1 ? json_integer((json_int_t) * (const int64_t *)src)
                               : json_integer(*(const int *)src);
    json_object_set_new(o, f->key, v);
  }
  if (fit_json) json_object_set(root, "fit", (json_t *)fit_json);
  int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
  json_decref(root);
  if (rc) {
    snprintf(err, errlen, "cannot write %s", path);
    return K3_EIO;
  }
  return 0;
}
