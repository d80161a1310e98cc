/* The local-prefill threshold from a cost model (localcost.h; formula in docs/design.md
 * "The local-prefill threshold"). Pure functions: no clock, no runner. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "k3pd/err.h"
#include "localcost.h"

typedef struct {
  const char *obj, *key;
  size_t off;
  int is_int; /* int64 (chunk_tokens) rather than double */
  double min;
} cost_field_t;

#define CF(o, k, f, i, m) {o, k, offsetof(dc_costs_t, f), i, m}
static const cost_field_t fields[] = {
    CF("prefill", "pass_fixed_ms", pass_fixed_ms, 0, 0),
    CF("prefill", "pass_per_seq_ms", pass_per_seq_ms, 0, 0),
    CF("prefill", "pass_per_token_ms", pass_per_token_ms, 0, 0),
    CF("prefill", "pass_per_kilo_token_context_ms", pass_per_kctx_ms, 0, 0),
    CF("decode", "step_fixed_ms", step_fixed_ms, 0, 0),
    CF("decode", "step_per_seq_ms", step_per_seq_ms, 0, 0),
    CF("decode", "step_per_kilo_token_context_ms", step_per_kctx_ms, 0, 0),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

int dc_costs_load(const char *path, dc_costs_t *c, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
    return K3_EINVAL;
  }
  int rc = K3_EINVAL;
  dc_costs_t t = *c;
  const char *schema = json_string_value(json_object_get(root, "schema"));
  if (!json_is_object(root) || !schema || strcmp(schema, "k3pd-profile/1") != 0) {
    snprintf(err, errlen, "%s: schema: want \"k3pd-profile/1\", got %s", path, schema ? schema : "none");
    goto out;
  }
  for (size_t i = 0; i < NFIELDS; i++) {
    const cost_field_t *f = &fields[i];
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
    if (!(x >= f->min) || !isfinite(x)) {
      snprintf(err, errlen, "%s: %s.%s: %g is below %g (costs must not be negative)", path, f->obj, f->key, x,
               f->min);
      goto out;
    }
    char *dst = (char *)&t + f->off;
    if (f->is_int) *(int64_t *)dst = (int64_t)x;
    else *(double *)dst = x;
  }
  const char *src = json_string_value(json_object_get(root, "source"));
  snprintf(t.source, sizeof t.source, "profile %s%s%s", path, src ? ": " : "", src ? src : "");
  *c = t;
  rc = 0;
out:
  json_decref(root);
  return rc;
}

double dc_costs_prefill_ms(const dc_costs_t *c, int64_t tokens) {
  int64_t chunk = c->chunk_tokens > 0 ? c->chunk_tokens : 256;
  double t = 0;
  for (int64_t done = 0; done < tokens; done += chunk) {
    int64_t take = tokens - done < chunk ? tokens - done : chunk;
    t += c->pass_fixed_ms + c->pass_per_seq_ms + c->pass_per_token_ms * (double)take +
         c->pass_per_kctx_ms * (double)take * (double)done / 1000.0;
  }
  return t;
}

double dc_costs_step_ms(const dc_costs_t *c, int batch, double ctx_tokens) {
  return c->step_fixed_ms + c->step_per_seq_ms * batch + c->step_per_kctx_ms * ctx_tokens / 1000.0;
}

double dc_costs_ref_step_ms(const dc_costs_t *c) {
  int64_t chunk = c->chunk_tokens > 0 ? c->chunk_tokens : 256;
  int b = c->step_batch > 0 ? c->step_batch : 1;
  return dc_costs_step_ms(c, b, (double)b * (double)chunk);
}

int64_t dc_local_max_derive(const dc_costs_t *c, double stall_steps, int64_t cap, char *err, size_t errlen) {
  double step = dc_costs_ref_step_ms(c);
  if (!(step > 0)) {
    snprintf(err, errlen, "decode.step_fixed_ms, decode.step_per_seq_ms: no decode step cost, so no stall budget");
    return K3_EINVAL;
  }
  if (!(c->pass_per_token_ms > 0 || c->pass_fixed_ms + c->pass_per_seq_ms > 0)) {
    snprintf(err, errlen, "prefill.pass_per_token_ms, prefill.pass_fixed_ms: no prefill cost");
    return K3_EINVAL;
  }
  if (!(stall_steps >= 0)) {
    snprintf(err, errlen, "stall steps: %g is negative", stall_steps);
    return K3_EINVAL;
  }
  double budget = stall_steps * step;
  /* T is nondecreasing (every cost >= 0): bisect for the last L with T(L) <= budget. */
  if (dc_costs_prefill_ms(c, cap) <= budget) return cap;
  int64_t lo = 0, hi = cap; /* T(lo) <= budget (T(0) = 0), T(hi) > budget */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (dc_costs_prefill_ms(c, mid) <= budget) lo = mid;
    else hi = mid;
  }
  return lo;
}
