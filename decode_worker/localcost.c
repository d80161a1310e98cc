/* The local-prefill threshold from a cost model (localcost.h; formula in docs/design.md
 * "The local-prefill threshold"). Pure functions: no clock, no runner. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/profile_read.h"
#include "localcost.h"

/* the numbers of a k3pd-profile/1 file this model takes (a cost must not be negative) */
static const k3_pf_field_t fields[] = {
    {"prefill", "pass_fixed_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, pass_fixed_ms), 0},
    {"prefill", "pass_per_seq_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, pass_per_seq_ms), 0},
    {"prefill", "pass_per_token_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, pass_per_token_ms), 0},
    {"prefill", "pass_per_kilo_token_context_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, pass_per_kctx_ms), 0},
    {"decode", "step_fixed_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, step_fixed_ms), 0},
    {"decode", "step_per_seq_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, step_per_seq_ms), 0},
    {"decode", "step_per_kilo_token_context_ms", K3_PF_DOUBLE, offsetof(dc_costs_t, step_per_kctx_ms), 0},
};
#define NFIELDS (sizeof fields / sizeof fields[0])

int dc_costs_load(const char *path, dc_costs_t *c, char *err, size_t errlen) {
  void *doc = k3_profile_open(path, err, errlen);
  if (!doc) return K3_EINVAL;
  dc_costs_t t = *c;
  int rc = k3_profile_read_fields(doc, path, fields, NFIELDS, &t, err, errlen);
  if (!rc) {
    const char *src = k3_profile_source(doc);
    snprintf(t.source, sizeof t.source, "profile %s%s%s", path, src ? ": " : "", src ? src : "");
    *c = t;
  }
  k3_profile_close(doc);
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
