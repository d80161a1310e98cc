/* k3pd-generate --requests: many (teacher-forced) generations in one process; see requests.h. */
#include "requests.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"

static int parse_ids(const char *s, const char *end, int64_t vocab, int32_t **out, int *n, int line, const char *what,
                     char *err, size_t errlen) {
  int cap = 16, k = 0;
  int32_t *v = malloc((size_t)cap * sizeof *v);
  if (!v) return K3_ENOMEM;
  while (s < end) {
    while (s < end && (*s == ' ' || *s == ',')) s++;
    if (s >= end) break;
    char *e;
    errno = 0;
    long long x = strtoll(s, &e, 10);
    if (e == s || errno || x < 0 || x >= vocab) {
      snprintf(err, errlen, "--requests line %d: %s: bad token id near \"%.16s\" (vocabulary %lld)", line, what, s,
               (long long)vocab);
      free(v);
      return K3_EINVAL;
    }
    if (k == cap) {
      int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
      if (!nv) {
        free(v);
        return K3_ENOMEM;
      }
      v = nv;
    }
    v[k++] = (int32_t)x;
    s = e;
  }
  *out = v;
  *n = k;
  return 0;
}

void gen_reqs_free(gen_reqs_t *q) {
  for (int i = 0; q && i < q->n; i++) {
    free(q->v[i].prompt);
    free(q->v[i].teacher);
  }
  if (q) free(q->v);
}

int gen_reqs_load(const char *path, int default_max_new, uint64_t default_seed, int64_t vocab, gen_reqs_t *out,
                  char *err, size_t errlen) {
  char *text = NULL;
  size_t len = 0;
  if (k3_read_file(path, &text, &len)) {
    snprintf(err, errlen, "--requests: cannot read %s", path);
    return K3_EIO;
  }
  gen_reqs_t q = {0};
  int cap = 0, rc = 0, line = 0;
  for (char *p = text; *p && !rc;) {
    char *nl = strchr(p, '\n');
    char *end = nl ? nl : p + strlen(p);
    line++;
    if (end > p && end[-1] == '\r') end--;
    if (end > p && *p != '#') {
      char *f[4] = {p, NULL, NULL, NULL}, *fe[4] = {end, NULL, NULL, NULL};
      int nf = 1;
      for (char *c = p; c < end && nf < 4; c++)
        if (*c == '\t') {
          fe[nf - 1] = c;
          f[nf] = c + 1;
          fe[nf] = end;
          nf++;
        }
      if (q.n == cap) {
        gen_req_t *nv = realloc(q.v, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *nv);
        if (!nv) {
          rc = K3_ENOMEM;
          break;
        }
        q.v = nv;
      }
      gen_req_t *r = &q.v[q.n];
      memset(r, 0, sizeof *r);
      q.n++;
      rc = parse_ids(f[0], fe[0], vocab, &r->prompt, &r->n_prompt, line, "prompt tokens", err, errlen);
      if (!rc && r->n_prompt == 0) {
        snprintf(err, errlen, "--requests line %d: the prompt is empty", line);
        rc = K3_EINVAL;
      }
      if (!rc && nf > 1) rc = parse_ids(f[1], fe[1], vocab, &r->teacher, &r->n_teacher, line, "teacher tokens", err, errlen);
      r->max_new = r->n_teacher ? r->n_teacher : default_max_new;
      r->seed = default_seed;
      if (!rc && nf > 2 && fe[2] > f[2]) r->max_new = atoi(f[2]);
      if (!rc && nf > 3 && fe[3] > f[3]) r->seed = strtoull(f[3], NULL, 10);
      if (!rc && (r->max_new < 1 || (r->n_teacher && r->n_teacher < r->max_new))) {
        snprintf(err, errlen, "--requests line %d: max_new %d must be >= 1 and <= the teacher's %d tokens", line,
                 r->max_new, r->n_teacher);
        rc = K3_EINVAL;
      }
      if (!rc && r->n_prompt + r->max_new > q.max_total) q.max_total = r->n_prompt + r->max_new;
    }
    p = nl ? nl + 1 : end;
  }
  free(text);
  if (!rc && q.n == 0) {
    snprintf(err, errlen, "--requests: %s holds no request", path);
    rc = K3_EINVAL;
  }
  if (rc) {
    gen_reqs_free(&q);
    return rc;
  }
  *out = q;
  return 0;
}

int gen_reqs_run(k3_runner_t *r, const gen_reqs_t *q, const k3k_sample_cfg_t *sc0, double near_tie, int block_split,
                 bool (*stop)(const k3_runner_t *r, int32_t id)) {
  const int64_t V = k3_runner_vocab(r);
  const int cap_pages = k3_runner_pages_for(r, q->max_total) + 1;
  int32_t *pages = calloc((size_t)cap_pages, sizeof *pages), *ids = NULL;
  float *logits = malloc((size_t)V * sizeof(float));
  int maxn = 1;
  for (int i = 0; i < q->n; i++)
    if (q->v[i].max_new > maxn) maxn = q->v[i].max_new;
  ids = calloc((size_t)maxn, sizeof *ids);
  if (!pages || !logits || !ids) {
    fprintf(stderr, "k3pd-generate: out of memory\n");
    free(pages), free(logits), free(ids);
    return 1;
  }
  char err[1024];
  int rc = 0;
  long first_same = 0, div_all = 0, near_all = 0, taught = 0;
  for (int i = 0; i < q->n && !rc; i++) {
    const gen_req_t *g = &q->v[i];
    k3_seq_t seq = {.slot = -1, .pages = pages, .cap_pages = cap_pages};
    if (k3_runner_seq_reserve(r, &seq, (int64_t)g->n_prompt + g->max_new)) {
      fprintf(stderr, "k3pd-generate: request %d: cannot reserve state\n", i);
      rc = 1;
      break;
    }
    /* --block-split B: the prompt in two passes, [0, s) then [s, n) with s the last multiple of
     * B before n: what a cluster with the prefix cache on computes for a miss (the prefill
     * worker hands off at s, the decode worker computes the rest and checkpoints s) */
    const int s = block_split > 0 ? (g->n_prompt - 1) / block_split * block_split : 0;
    k3_prefill_item_t it[2] = {{&seq, g->prompt, s, NULL, false},
                               {&seq, g->prompt + s, g->n_prompt - s, logits, false}};
    if ((s > 0 && k3_runner_prefill(r, &it[0], 1, NULL, NULL, err, sizeof err)) ||
        k3_runner_prefill(r, &it[1], 1, NULL, NULL, err, sizeof err)) {
      fprintf(stderr, "k3pd-generate: request %d: prefill: %s\n", i, err);
      k3_runner_seq_release(r, &seq);
      rc = 1;
      break;
    }
    k3k_sample_cfg_t sc = *sc0;
    sc.seed = g->seed;
    int n = 0, divs = 0, nears = 0;
    bool first_ok = true;
    for (int step = 0; step < g->max_new; step++) {
      int32_t id;
      sc.step = (uint64_t)step;
      if (k3k_sample_row(logits, V, &sc, &id)) {
        fprintf(stderr, "k3pd-generate: request %d: sampling failed\n", i);
        rc = 1;
        break;
      }
      ids[n++] = id;
      int32_t feed = id;
      if (g->n_teacher) {
        int32_t t = g->teacher[step];
        if (t != id) {
          double gap = (double)logits[id] - (double)logits[t];
          double rel = fabs(gap) / fmax(fabs((double)logits[id]), 1.0);
          bool near = rel <= near_tie;
          divs++;
          nears += near;
          if (step == 0) first_ok = false;
          printf("req %d diverge step %d mono %d given %d gap %.5g rel %.3g %s\n", i, step, id, t, gap, rel,
                 near ? "near-tie" : "NOT-near-tie");
        }
        feed = t;
      } else if (stop && stop(r, id)) {
        break;
      }
      if (step + 1 == g->max_new) break;
      k3_decode_item_t d = {.seq = &seq, .token = feed, .logits = logits};
      if (k3_runner_decode_step(r, &d, 1, err, sizeof err)) {
        fprintf(stderr, "k3pd-generate: request %d: decode: %s\n", i, err);
        rc = 1;
        break;
      }
    }
    k3_runner_seq_release(r, &seq);
    printf("req %d ids:", i);
    for (int k = 0; k < n; k++) printf(" %d", ids[k]);
    printf("\n");
    if (g->n_teacher) {
      printf("req %d teacher: steps %d divergences %d near_ties %d first_token %s\n", i, n, divs, nears,
             first_ok ? "same" : "DIFFERENT");
      first_same += first_ok;
      taught++;
      div_all += divs;
      near_all += nears;
    }
    fflush(stdout);
  }
  if (!rc)
    printf("requests: %d teacher_forced %ld first_tokens_equal %ld/%ld divergences %ld near_ties %ld "
           "not_near_ties %ld\n", q->n, taught, first_same, taught, div_all, near_all, div_all - near_all);
  free(pages);
  free(logits);
  free(ids);
  return rc;
}
