/* k3pd-bench workload: length distributions, the deterministic per-request generator and the
 * text prompt file.
 *
 * Not here: sending anything. Request i's RNG is seeded from (workload seed, i) only, so any
 * request can be regenerated later (the monolithic replay does) and two runs with the same
 * flags send byte-identical requests. */
#include <ctype.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

uint64_t bn_rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double bn_rng_uniform(uint64_t *s) { return (double)(bn_rng_next(s) >> 11) * 0x1.0p-53; }

uint64_t bn_arrival_rng(uint64_t seed) { return seed ^ 0x5bd1e995u; }

double bn_arrival_gap_s(uint64_t *rng, double rate) {
  double u = bn_rng_uniform(rng);
  return -log(1.0 - u) / rate;
}

static uint64_t below(uint64_t *s, uint64_t n) { return n ? bn_rng_next(s) % n : 0; }

/* Parses a positive decimal uint32 that spans [p, end). */
static bool parse_u32(const char *p, const char *end, uint32_t *out) {
  if (p == end) return false;
  uint64_t v = 0;
  for (; p < end; p++) {
    if (*p < '0' || *p > '9') return false;
    v = v * 10 + (uint64_t)(*p - '0');
    if (v > UINT32_MAX) return false;
  }
  *out = (uint32_t)v;
  return v > 0;
}

int bn_dist_parse(const char *spec, const char *what, bn_dist_t *d, char *err, size_t errlen) {
  bn_dist_t t = {0};
  if (!spec || !*spec) {
    snprintf(err, errlen, "--%s: empty (want N, A..B or @FILE)", what);
    return K3_EINVAL;
  }
  if (spec[0] == '@') {
    char *buf = NULL;
    size_t len = 0;
    int rc = k3_read_file(spec + 1, &buf, &len);
    if (rc) {
      snprintf(err, errlen, "--%s: cannot read %s: %s", what, spec + 1, k3_strerror(rc));
      return rc;
    }
    size_t cap = 0;
    const char *p = buf, *end = buf + len;
    while (p < end) {
      while (p < end && isspace((unsigned char)*p)) p++;
      const char *s = p;
      while (p < end && !isspace((unsigned char)*p)) p++;
      if (s == p) break;
      uint32_t v;
      if (!parse_u32(s, p, &v)) {
        snprintf(err, errlen, "--%s: %s: \"%.*s\" is not a positive integer", what, spec + 1, (int)(p - s), s);
        free(t.values);
        free(buf);
        return K3_EINVAL;
      }
      if (t.n_values == cap) {
        cap = cap ? cap * 2 : 64;
        uint32_t *nv = realloc(t.values, cap * sizeof *nv);
        if (!nv) {
          free(t.values);
          free(buf);
          return K3_ENOMEM;
        }
        t.values = nv;
      }
      t.values[t.n_values++] = v;
    }
    free(buf);
    if (!t.n_values) {
      snprintf(err, errlen, "--%s: %s lists no lengths", what, spec + 1);
      return K3_EINVAL;
    }
    t.kind = BN_DIST_FILE;
    t.lo = t.hi = t.values[0];
    for (size_t i = 0; i < t.n_values; i++) {
      if (t.values[i] < t.lo) t.lo = t.values[i];
      if (t.values[i] > t.hi) t.hi = t.values[i];
    }
    *d = t;
    return 0;
  }
  const char *dots = strstr(spec, "..");
  const char *end = spec + strlen(spec);
  if (dots) {
    if (!parse_u32(spec, dots, &t.lo) || !parse_u32(dots + 2, end, &t.hi) || t.lo > t.hi) {
      snprintf(err, errlen, "--%s: \"%s\" is not a range A..B with 1 <= A <= B", what, spec);
      return K3_EINVAL;
    }
    t.kind = t.lo == t.hi ? BN_DIST_FIXED : BN_DIST_UNIFORM;
  } else {
    if (!parse_u32(spec, end, &t.lo)) {
      snprintf(err, errlen, "--%s: \"%s\" is not a positive integer, A..B or @FILE", what, spec);
      return K3_EINVAL;
    }
    t.hi = t.lo;
    t.kind = BN_DIST_FIXED;
  }
  *d = t;
  return 0;
}

void bn_dist_free(bn_dist_t *d) {
  free(d->values);
  d->values = NULL;
  d->n_values = 0;
}

uint32_t bn_dist_draw(const bn_dist_t *d, uint64_t *rng) {
  switch (d->kind) {
    case BN_DIST_UNIFORM: return d->lo + (uint32_t)below(rng, (uint64_t)d->hi - d->lo + 1);
    case BN_DIST_FILE: return d->values[below(rng, d->n_values)];
    default: return d->lo;
  }
}

uint32_t bn_dist_max(const bn_dist_t *d) { return d->hi; }

int bn_workload_load_texts(bn_workload_t *w, const char *path, char *err, size_t errlen) {
  char *buf = NULL;
  size_t len = 0;
  int rc = k3_read_file(path, &buf, &len);
  if (rc) {
    snprintf(err, errlen, "--prompt-file: cannot read %s: %s", path, k3_strerror(rc));
    return rc;
  }
  char **texts = NULL;
  size_t n = 0, cap = 0;
  char *p = buf, *end = buf + len;
  while (p < end) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    char *e = nl ? nl : end;
    size_t l = (size_t)(e - p);
    if (l && p[l - 1] == '\r') l--;
    if (l) {
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        char **nt = realloc(texts, cap * sizeof *nt);
        if (!nt) goto oom;
        texts = nt;
      }
      texts[n] = strndup(p, l);
      if (!texts[n]) goto oom;
      if (strlen(texts[n]) != l) {
        snprintf(err, errlen, "--prompt-file: %s: line %zu contains a NUL byte", path, n + 1);
        n++;
        rc = K3_EINVAL;
        goto fail;
      }
      n++;
    }
    p = nl ? nl + 1 : end;
  }
  free(buf);
  if (!n) {
    free(texts);
    snprintf(err, errlen, "--prompt-file: %s has no non-empty line", path);
    return K3_EINVAL;
  }
  w->texts = texts;
  w->n_texts = n;
  return 0;
oom:
  rc = K3_ENOMEM;
  snprintf(err, errlen, "--prompt-file: out of memory");
fail:
  for (size_t i = 0; i < n; i++) free(texts[i]);
  free(texts);
  free(buf);
  return rc;
}

/* Request `index`'s RNG after its two length draws (the prompt ids come next). */
static uint64_t spec_rng(const bn_workload_t *w, uint64_t index, uint32_t *plen, uint32_t *max_new) {
  uint64_t rng = w->seed ^ (index * 0xd1342543de82ef95ull + 0x632be59bd9b4e019ull);
  bn_rng_next(&rng);
  *plen = bn_dist_draw(&w->prompt_len, &rng);
  *max_new = bn_dist_draw(&w->output_len, &rng);
  return rng;
}

void bn_spec_lengths(const bn_workload_t *w, uint64_t index, uint32_t *prompt_len, uint32_t *max_new) {
  (void)spec_rng(w, index, prompt_len, max_new);
}

int bn_spec_make(const bn_workload_t *w, uint64_t index, bn_req_spec_t *s) {
  memset(s, 0, sizeof *s);
  uint32_t plen = 0;
  uint64_t rng = spec_rng(w, index, &plen, &s->max_new);
  s->index = index;
  s->seed = w->sample_seed + index;
  if (w->n_texts) {
    s->text = w->texts[index % w->n_texts];
    return 0;
  }
  /* the shared prefix (a chat's later turns carry it inside their history instead) */
  uint32_t pre = w->chat_turns && index % w->chat_turns ? 0 : w->shared_prefix_len;
  s->ids = malloc((size_t)(pre + plen ? pre + plen : 1) * sizeof *s->ids);
  if (!s->ids) return K3_ENOMEM;
  uint64_t prng = w->seed ^ 0x9e3779b97f4a7c15ull;
  bn_rng_next(&prng);
  for (uint32_t i = 0; i < pre; i++) s->ids[i] = (uint32_t)below(&prng, w->id_max);
  for (uint32_t i = 0; i < plen; i++) s->ids[pre + i] = (uint32_t)below(&rng, w->id_max);
  s->n_ids = pre + plen;
  return 0;
}

void bn_spec_free(bn_req_spec_t *s) {
  free(s->ids);
  s->ids = NULL;
}

void bn_workload_free(bn_workload_t *w) {
  bn_dist_free(&w->prompt_len);
  bn_dist_free(&w->output_len);
  for (size_t i = 0; i < w->n_texts; i++) free(w->texts[i]);
  free(w->texts);
  w->texts = NULL;
  w->n_texts = 0;
}

int bn_vec_push(bn_vec_t *v, double x) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 1024;
    double *nv = realloc(v->v, cap * sizeof *nv);
    if (!nv) return K3_ENOMEM;
    v->v = nv;
    v->cap = cap;
  }
  v->v[v->n++] = x;
  return 0;
}
