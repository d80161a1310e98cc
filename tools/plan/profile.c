/* k3pd-plan cost profile: the JSON file k3pd-bench --profile writes (schema "k3pd-profile/1",
 * docs/plan.md) and the cost functions the simulation calls.
 *
 * Not here: measuring (tools/bench/profile.c). Here: reading, writing, the cost functions and the
 * prefill table's fit (pl_profile_fit_table), which the reader also applies to a file that holds
 * only the measured points (written before the table existed). Every cost function is clamped at
 * 0, so a noisy fit can never make time run backwards in the simulation. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "k3pd/err.h"
#include "k3pd/profile_read.h"
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

bool pl_prefill_uses_table(const pl_profile_t *p) { return p->pf_tab_n >= 2 && !p->pf_tab_off; }

double pl_prefill_lone_ms(const pl_profile_t *p, double n) {
  const double *x = p->pf_tab_tok, *y = p->pf_tab_ms;
  int k = p->pf_tab_n;
  if (n <= x[0]) return p->pf_shared_ms + (y[0] - p->pf_shared_ms) * n / x[0];
  if (n >= x[k - 1]) return y[k - 1] * n / x[k - 1];
  int i = 1;
  while (x[i] < n) i++;
  return y[i - 1] + (y[i] - y[i - 1]) * (n - x[i - 1]) / (x[i] - x[i - 1]);
}

double pl_prefill_pass_takes_ms(const pl_profile_t *p, int seqs, const int64_t *takes, int64_t tokens,
                                double tok_ctx_sum) {
  if (!pl_prefill_uses_table(p) || !takes) return pl_prefill_pass_ms(p, seqs, tokens, tok_ctx_sum);
  double t = p->pf_shared_ms + p->pf_tab_kctx_ms * tok_ctx_sum / 1000.0;
  for (int i = 0; i < seqs; i++) t += pl_prefill_lone_ms(p, (double)takes[i]) - p->pf_shared_ms;
  return t > 0 ? t : 0;
}

void pl_profile_fit_table(pl_profile_t *p, const double (*rows)[5], int n) {
  p->pf_tab_n = 0;
  /* 1. points: lone prompts in one pass, ascending, equal lengths averaged */
  for (int i = 0; i < n; i++) {
    if (rows[i][0] != 1 || rows[i][1] != 1 || !(rows[i][2] > 0) || !(rows[i][4] > 0)) continue;
    int j = 0;
    while (j < p->pf_tab_n && p->pf_tab_tok[j] < rows[i][2]) j++;
    if (j < p->pf_tab_n && p->pf_tab_tok[j] == rows[i][2]) {
      p->pf_tab_ms[j] = (p->pf_tab_ms[j] + rows[i][4]) / 2; /* a repeated length (rare): the mean */
      continue;
    }
    if (p->pf_tab_n == PL_TAB_MAX) continue;
    memmove(p->pf_tab_tok + j + 1, p->pf_tab_tok + j, (size_t)(p->pf_tab_n - j) * sizeof(double));
    memmove(p->pf_tab_ms + j + 1, p->pf_tab_ms + j, (size_t)(p->pf_tab_n - j) * sizeof(double));
    p->pf_tab_tok[j] = rows[i][2];
    p->pf_tab_ms[j] = rows[i][4];
    p->pf_tab_n++;
  }
  if (p->pf_tab_n < 2) {
    p->pf_tab_n = 0;
    return;
  }
  double ymin = p->pf_tab_ms[0];
  for (int j = 1; j < p->pf_tab_n; j++) ymin = ymin < p->pf_tab_ms[j] ? ymin : p->pf_tab_ms[j];
  /* 2. shared: a pass of k prompts of Ls tokens took y/passes = shared + k (lone(Ls) - shared) */
  double shared = p->pf_fixed_ms, sw = 0, ss = 0;
  for (int i = 0; i < n; i++) {
    double passes = rows[i][0], k = passes > 0 ? rows[i][1] / passes : 0;
    if (!(k > 1.01) || rows[i][3] != 0) continue;
    double Ls = rows[i][2] / rows[i][1];
    if (Ls < p->pf_tab_tok[0] || Ls > p->pf_tab_tok[p->pf_tab_n - 1]) continue; /* outside the points */
    p->pf_shared_ms = 0;
    ss += (k * pl_prefill_lone_ms(p, Ls) - rows[i][4] / passes) / (k - 1) * passes;
    sw += passes;
  }
  if (sw > 0) shared = ss / sw;
  p->pf_shared_ms = shared < 0 ? 0 : shared > ymin ? ymin : shared;
  /* 3. context: lone prompts over several passes; the residual after the table, through 0 */
  double num = 0, den = 0;
  const double C = (double)((p->pf.chunk_tokens + 63) / 64 * 64);
  for (int i = 0; i < n; i++) {
    if (!(rows[i][0] > 1) || rows[i][1] != rows[i][0] || !(rows[i][3] > 0)) continue;
    double pred = 0;
    for (double done = 0; done < rows[i][2]; done += C) {
      double take = rows[i][2] - done < C ? rows[i][2] - done : C;
      pred += pl_prefill_lone_ms(p, take);
    }
    num += (rows[i][4] - pred) * rows[i][3];
    den += rows[i][3] * rows[i][3];
  }
  p->pf_tab_kctx_ms = den > 0 && num > 0 ? num / den : 0;
}

double pl_decode_spread(const pl_profile_t *p, double u) {
  int n = p->dc_q_n;
  if (n < 2) return 1;
  if (u <= p->dc_q_p[0]) return p->dc_q_r[0];
  for (int i = 1; i < n; i++)
    if (u <= p->dc_q_p[i]) {
      double w = p->dc_q_p[i] - p->dc_q_p[i - 1];
      double f = w > 0 ? (u - p->dc_q_p[i - 1]) / w : 1;
      return p->dc_q_r[i - 1] + f * (p->dc_q_r[i] - p->dc_q_r[i - 1]);
    }
  return p->dc_q_r[n - 1];
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void pl_profile_fit_spread(pl_profile_t *p, double *gaps, size_t n) {
  static const double q[] = {0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 1};
  p->dc_q_n = 0;
  if (n < 20) return;
  qsort(gaps, n, sizeof *gaps, cmp_dbl);
  double mean = 0;
  for (size_t i = 0; i < n; i++) mean += gaps[i];
  mean /= (double)n;
  if (!(mean > 0)) return;
  for (size_t k = 0; k < sizeof q / sizeof q[0]; k++) {
    double pos = q[k] * (double)(n - 1); /* bn_percentile's interpolation */
    size_t i = (size_t)pos;
    double v = i + 1 < n ? gaps[i] + (gaps[i + 1] - gaps[i]) * (pos - (double)i) : gaps[n - 1];
    p->dc_q_p[p->dc_q_n] = q[k];
    p->dc_q_r[p->dc_q_n++] = v / mean;
  }
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

/* the numbers of a profile, read by the shared reader (k3pd/profile_read.h) and written below */
typedef k3_pf_field_t field_t;

#define D(o, k, f, m) {o, k, K3_PF_DOUBLE, offsetof(pl_profile_t, f), m}
#define I64(o, k, f, m) {o, k, K3_PF_I64, offsetof(pl_profile_t, f), m}
#define INT(o, k, f, m) {o, k, K3_PF_INT, offsetof(pl_profile_t, f), m}
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

/* The prefill table: prefill.lone_pass_ms ([[tokens, ms], ...]) with pass_shared_ms and
 * lone_per_kilo_token_context_ms when the file has them, else fitted from fit.points (files
 * written before the table existed hold the same measurements there). */
static int fit_table_from_points(json_t *root, pl_profile_t *t);

static int load_table(json_t *root, pl_profile_t *t, const char *path, char *err, size_t errlen) {
  json_t *pf = json_object_get(root, "prefill");
  json_t *tab = json_is_object(pf) ? json_object_get(pf, "lone_pass_ms") : NULL;
  if (tab) {
    size_t i;
    json_t *pt;
    if (!json_is_array(tab) || json_array_size(tab) > PL_TAB_MAX) {
      snprintf(err, errlen, "%s: prefill.lone_pass_ms: want an array of up to %d [tokens, ms] pairs", path,
               PL_TAB_MAX);
      return K3_EINVAL;
    }
    t->pf_tab_n = 0;
    json_array_foreach(tab, i, pt) {
      double x = json_number_value(json_array_get(pt, 0)), y = json_number_value(json_array_get(pt, 1));
      if (!json_is_array(pt) || json_array_size(pt) != 2 || !(x > 0) || !(y >= 0) ||
          (i > 0 && !(x > t->pf_tab_tok[i - 1]))) {
        snprintf(err, errlen, "%s: prefill.lone_pass_ms[%zu]: want [tokens > 0, ms >= 0], tokens ascending", path, i);
        return K3_EINVAL;
      }
      t->pf_tab_tok[i] = x;
      t->pf_tab_ms[i] = y;
      t->pf_tab_n++;
    }
    json_t *v = json_object_get(pf, "pass_shared_ms"), *k = json_object_get(pf, "lone_per_kilo_token_context_ms");
    t->pf_shared_ms = json_is_number(v) ? json_number_value(v) : 0;
    t->pf_tab_kctx_ms = json_is_number(k) ? json_number_value(k) : 0;
    if (t->pf_shared_ms < 0 || t->pf_tab_kctx_ms < 0) {
      snprintf(err, errlen, "%s: prefill.pass_shared_ms and lone_per_kilo_token_context_ms must be >= 0", path);
      return K3_EINVAL;
    }
    if (t->pf_tab_n < 2) t->pf_tab_n = 0;
    return 0;
  }
  return fit_table_from_points(root, t);
}

/* decode.step_spread ([[q, ratio], ...], q ascending from 0 to 1): optional. */
static int load_spread(json_t *root, pl_profile_t *t, const char *path, char *err, size_t errlen) {
  json_t *dc = json_object_get(root, "decode");
  json_t *tab = json_is_object(dc) ? json_object_get(dc, "step_spread") : NULL;
  t->dc_q_n = 0;
  if (!tab) return 0;
  size_t i;
  json_t *pt;
  if (!json_is_array(tab) || json_array_size(tab) > PL_Q_MAX) {
    snprintf(err, errlen, "%s: decode.step_spread: want an array of up to %d [q, ratio] pairs", path, PL_Q_MAX);
    return K3_EINVAL;
  }
  json_array_foreach(tab, i, pt) {
    double x = json_number_value(json_array_get(pt, 0)), y = json_number_value(json_array_get(pt, 1));
    if (!json_is_array(pt) || json_array_size(pt) != 2 || !(x >= 0 && x <= 1) || !(y >= 0) ||
        (i > 0 && !(x > t->dc_q_p[i - 1] && y >= t->dc_q_r[i - 1]))) {
      snprintf(err, errlen, "%s: decode.step_spread[%zu]: want [0 <= q <= 1, ratio >= 0], both ascending", path, i);
      return K3_EINVAL;
    }
    t->dc_q_p[i] = x;
    t->dc_q_r[i] = y;
    t->dc_q_n++;
  }
  if (t->dc_q_n < 2) t->dc_q_n = 0;
  return 0;
}

/* prefill.worker_speed / decode.worker_speed ([f0, f1, ...], each > 0): optional. */
static int load_speeds(json_t *root, pl_profile_t *t, const char *path, char *err, size_t errlen) {
  static const char *const role[2] = {"prefill", "decode"};
  for (int r = 0; r < 2; r++) {
    int *n = r ? &t->dc_speed_n : &t->pf_speed_n;
    double *v = r ? t->dc_speed : t->pf_speed;
    json_t *a = json_object_get(json_object_get(root, role[r]), "worker_speed");
    *n = 0;
    if (!a) continue;
    size_t i;
    json_t *x;
    if (!json_is_array(a) || json_array_size(a) > PL_WMAX) {
      snprintf(err, errlen, "%s: %s.worker_speed: want an array of up to %d numbers", path, role[r], PL_WMAX);
      return K3_EINVAL;
    }
    json_array_foreach(a, i, x) {
      double f = json_number_value(x);
      if (!json_is_number(x) || !(f > 0 && f < 100)) {
        snprintf(err, errlen, "%s: %s.worker_speed[%zu]: want a number in (0, 100)", path, role[r], i);
        return K3_EINVAL;
      }
      v[(*n)++] = f;
    }
  }
  return 0;
}

static int fit_table_from_points(json_t *root, pl_profile_t *t) {
  json_t *pts = json_object_get(json_object_get(root, "fit"), "points");
  double rows[64][5];
  int n = 0;
  size_t i;
  json_t *pt;
  if (!json_is_array(pts)) return 0;
  json_array_foreach(pts, i, pt) {
    const char *kind = json_string_value(json_object_get(pt, "kind"));
    json_t *x = json_object_get(pt, "x");
    if (!kind || strcmp(kind, "prefill_pass_sum") || json_array_size(x) != 4 || n == 64) continue;
    for (int j = 0; j < 4; j++) rows[n][j] = json_number_value(json_array_get(x, (size_t)j));
    rows[n][4] = json_number_value(json_object_get(pt, "y_ms"));
    n++;
  }
  pl_profile_fit_table(t, (const double (*)[5])rows, n);
  return 0;
}

int pl_profile_load(const char *path, pl_profile_t *p, char *err, size_t errlen) {
  void *doc = k3_profile_open(path, err, errlen);
  if (!doc) return K3_EINVAL;
  pl_profile_t t = *p;
  int rc = k3_profile_read_fields(doc, path, fields, NFIELDS, &t, err, errlen);
  if (!rc) rc = load_table((json_t *)doc, &t, path, err, errlen);
  if (!rc) rc = load_spread((json_t *)doc, &t, path, err, errlen);
  if (!rc) rc = load_speeds((json_t *)doc, &t, path, err, errlen);
  if (!rc) {
    const char *src = k3_profile_source(doc);
    if (src) snprintf(t.source, sizeof t.source, "%s", src);
    *p = t;
  }
  k3_profile_close(doc);
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
    json_t *v = f->kind == K3_PF_DOUBLE ? json_real(*(const double *)src)
                : f->kind == K3_PF_I64 ? json_integer((json_int_t) * (const int64_t *)src)
                               : json_integer(*(const int *)src);
    json_object_set_new(o, f->key, v);
  }
  if (p->pf_tab_n >= 2) {
    json_t *pf = json_object_get(root, "prefill"), *tab = json_array();
    for (int i = 0; i < p->pf_tab_n; i++) json_array_append_new(tab, json_pack("[f,f]", p->pf_tab_tok[i], p->pf_tab_ms[i]));
    json_object_set_new(pf, "lone_pass_ms", tab);
    json_object_set_new(pf, "pass_shared_ms", json_real(p->pf_shared_ms));
    json_object_set_new(pf, "lone_per_kilo_token_context_ms", json_real(p->pf_tab_kctx_ms));
  }
  if (p->dc_q_n >= 2) {
    json_t *tab = json_array();
    for (int i = 0; i < p->dc_q_n; i++) json_array_append_new(tab, json_pack("[f,f]", p->dc_q_p[i], p->dc_q_r[i]));
    json_object_set_new(json_object_get(root, "decode"), "step_spread", tab);
  }
  for (int r = 0; r < 2; r++) {
    int n = r ? p->dc_speed_n : p->pf_speed_n;
    const double *v = r ? p->dc_speed : p->pf_speed;
    if (n < 1) continue;
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    json_object_set_new(json_object_get(root, r ? "decode" : "prefill"), "worker_speed", a);
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
