/* k3pd-bench --profile: measures a running cluster and writes the cost profile k3pd-plan
 * simulates with (schema "k3pd-profile/1", docs/plan.md "Profile").
 *
 * Phases, each a closed-loop run through the normal load generator (load.c), each point after
 * --profile-warmup unmeasured rounds of its own shape (warm()):
 *   1. prefill, concurrency 1, one output token, for each --profile-prompts length L
 *      (--profile-repeats requests each): a prompt alone, ceil(L / chunk) passes;
 *   2. prefill batched: concurrency 4, short prompts (<= one chunk), one output token: passes
 *      holding several prompts, which separates the per-pass from the per-prompt cost;
 *   3. decode, for each --profile-batches concurrency c and a short and a long prompt:
 *      c * repeats requests of --profile-output tokens.
 * With worker metrics (--profile-prefill-metrics / --profile-decode-metrics HOST:PORT lists,
 * workers started with --metrics-port) each phase is bracketed by scrapes and the fits use the
 * workers' own clocks: k3pd_prefill_forward_seconds (pass time and count),
 * k3pd_prefill_handoff_bytes_total, k3pd_decode_step_seconds and
 * k3pd_decode_generated_tokens_total (steps and mean batch). Without them the fits use the
 * requests' Timings (prefill = the router's Prefill RPC, which also holds the handoff) and the
 * time per output token at concurrency c as the step time at batch c.
 *
 * Fitted (bn_fit_lsq, non-negative):
 *   prefill pass ms = fixed + per_seq * seqs + per_token * tokens + per_kctx * Σ(take * ctx)/1000
 *   and the table k3pd-plan prefers (pl_profile_fit_table: the lone single-pass prompts as
 *   measured, the shared per-pass cost from phase 2, the context term from multi-pass prompts)
 *   decode step ms  = fixed + per_seq * batch + per_kctx * Σ ctx / 1000
 *   handoff bytes   = bytes_fixed + bytes_per_token * L
 *   with metrics, at concurrency 1: TTFT - compute = overhead + bytes / bandwidth (the time a
 *     request spends outside the prefill passes: router, hops, the handoff's tail, relay);
 *   without: TTFT overhead = mean(TTFT - Prefill RPC) and no bandwidth term.
 * (The router's Prefill RPC interval, Timings.prefill_us, is not used with metrics: on the loaded
 * development machine it was at times shorter than the worker's own compute — 0 ms for some
 * requests, a mean of 209 ms against 302 ms of forward passes for others — cause not traced.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench.h"
#include "k3pd/err.h"
#include "plan.h"

enum { M_FWD_SUM, M_FWD_COUNT, M_HO_BYTES, M_STEP_SUM, M_STEP_COUNT, M_GEN, M_PF_REQ, M_N };
static const char *const m_names[M_N] = {"k3pd_prefill_forward_seconds_sum", "k3pd_prefill_forward_seconds_count",
                                         "k3pd_prefill_handoff_bytes_total", "k3pd_decode_step_seconds_sum",
                                         "k3pd_decode_step_seconds_count", "k3pd_decode_generated_tokens_total",
                                         "k3pd_prefill_requests_total"};

/* Each address of a comma-separated list scraped on its own: v[k][metric] for address k. */
static int scrape_each(const char *list, double (*v)[M_N], int max, int *n, char *err, size_t errlen) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", list);
  *n = 0;
  for (char *save = NULL, *a = strtok_r(buf, ",", &save); a && *n < max; a = strtok_r(NULL, ",", &save)) {
    char *text = NULL;
    int rc = bn_scrape(a, &text, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < M_N; i++) v[*n][i] = bn_metric_sum(text, m_names[i]);
    free(text);
    (*n)++;
  }
  return 0;
}

typedef struct {
  double v[M_N];
  bool pf, dc; /* which roles were scraped */
} snap_t;

/* Sums the metrics over every address of a comma-separated list. */
static int scrape_list(const char *list, snap_t *s, char *err, size_t errlen) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
    char *text = NULL;
    int rc = bn_scrape(a, &text, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < M_N; i++) s->v[i] += bn_metric_sum(text, m_names[i]);
    free(text);
  }
  return 0;
}

static int snap(const bn_profile_opts_t *o, snap_t *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (o->prefill_metrics) {
    int rc = scrape_list(o->prefill_metrics, s, err, errlen);
    if (rc) return rc;
    s->pf = true;
  }
  if (o->decode_metrics) {
    int rc = scrape_list(o->decode_metrics, s, err, errlen);
    if (rc) return rc;
    s->dc = true;
  }
  return 0;
}

typedef struct {
  size_t ok;
  double prefill_ms, ttft_ms, tpot_ms; /* means over ok requests (tpot: median) */
  double ttft_var;                     /* variance of TTFT over ok requests */
  double itl_cv;                       /* coefficient of variation of the inter-token gaps */
} phase_t;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Runs `n` requests of fixed prompt length L and output N at concurrency c. */
static bn_vec_t *g_gaps; /* when set, phase() appends the run's inter-token gaps here */

static int phase(const bn_workload_t *w0, const bn_profile_opts_t *o, uint32_t L, uint32_t N, int c, uint64_t n,
                 uint64_t seed, phase_t *ph, char *err, size_t errlen) {
  bn_workload_t w = *w0;
  w.prompt_len = (bn_dist_t){.kind = BN_DIST_FIXED, .lo = L, .hi = L};
  w.output_len = (bn_dist_t){.kind = BN_DIST_FIXED, .lo = N, .hi = N};
  w.texts = NULL;
  w.n_texts = 0;
  w.seed = seed;
  w.ignore_eos = true;
  bn_load_opts_t lo = {.router = o->router, .concurrency = c, .requests = n, .timeout_ms = o->timeout_ms,
                       .max_inflight = 1024};
  bn_run_t run;
  int rc = bn_load_run(&w, &lo, &run, err, errlen);
  if (rc) return rc;
  memset(ph, 0, sizeof *ph);
  double *tp = calloc(run.n_res ? run.n_res : 1, sizeof *tp);
  size_t ntp = 0;
  for (size_t i = 0; i < run.n_res; i++) {
    const bn_result_t *r = &run.res[i];
    if (!r->complete || !r->t_first) continue;
    ph->ok++;
    ph->prefill_ms += (double)r->prefill_us / 1000.0;
    ph->ttft_ms += (double)(r->t_first - r->t_start) / 1e6;
    if (tp && r->n_tokens > 1) tp[ntp++] = (double)(r->t_end - r->t_first) / 1e6 / (double)(r->n_tokens - 1);
  }
  if (ph->ok) {
    ph->prefill_ms /= (double)ph->ok;
    ph->ttft_ms /= (double)ph->ok;
  }
  if (ntp) {
    qsort(tp, ntp, sizeof *tp, cmp_d);
    ph->tpot_ms = tp[ntp / 2];
  }
  for (size_t i = 0; ph->ok > 1 && i < run.n_res; i++) {
    const bn_result_t *r = &run.res[i];
    if (!r->complete || !r->t_first) continue;
    double d = (double)(r->t_first - r->t_start) / 1e6 - ph->ttft_ms;
    ph->ttft_var += d * d / (double)(ph->ok - 1);
  }
  for (size_t i = 0; g_gaps && i < run.itl_ms.n; i++)
    if (bn_vec_push(g_gaps, run.itl_ms.v[i])) rc = K3_ENOMEM;
  if (run.itl_ms.n > 1) {
    double m = 0, v = 0;
    for (size_t i = 0; i < run.itl_ms.n; i++) m += run.itl_ms.v[i];
    m /= (double)run.itl_ms.n;
    for (size_t i = 0; i < run.itl_ms.n; i++) v += (run.itl_ms.v[i] - m) * (run.itl_ms.v[i] - m);
    v /= (double)(run.itl_ms.n - 1);
    ph->itl_cv = m > 0 ? sqrt(v) / m : 0;
  }
  free(tp);
  size_t bad = run.n_res - ph->ok;
  bn_run_free(&run);
  if (bad) {
    snprintf(err, errlen, "profile phase (prompt %u, output %u, concurrency %d): %zu of %llu requests failed", L, N,
             c, bad, (unsigned long long)n);
    return K3_EUNAVAIL;
  }
  return rc;
}

/* The point's shape once more, unmeasured, before its measured run (o->warmup rounds): on CUDA
 * the first call of a shape loads its kernels lazily and sizes workspaces, which on the H200
 * made a lone 64-token prompt cost 65 ms where a warm one costs ~6 ms. */
static int warm(const bn_workload_t *w, const bn_profile_opts_t *o, uint32_t L, uint32_t N, int c, uint64_t seed,
                char *err, size_t errlen) {
  phase_t ph;
  return o->warmup > 0 ? phase(w, o, L, N, c, (uint64_t)c * (uint64_t)o->warmup, seed ^ 0x5bd1e995u, &ph, err, errlen)
                       : 0;
}

/* Σ over a lone prompt's chunks of take * (tokens before it), and its pass count. */
static double chunk_ctx(int64_t L, int64_t C, int *passes) {
  double s = 0;
  int k = 0;
  for (int64_t done = 0; done < L; done += C, k++) {
    int64_t take = L - done < C ? L - done : C;
    s += (double)take * (double)done;
  }
  *passes = k;
  return s;
}

static int parse_list(const char *s, const char *what, int *v, int max, int *n, char *err, size_t errlen) {
  *n = 0;
  while (*s) {
    char *end = NULL;
    long x = strtol(s, &end, 10);
    if (end == s || x < 1 || x > 1000000 || *n == max) {
      snprintf(err, errlen, "--%s: want up to %d positive integers separated by commas, at \"%s\"", what, max, s);
      return K3_EINVAL;
    }
    v[(*n)++] = (int)x;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') {
      snprintf(err, errlen, "--%s: unexpected \"%s\"", what, end);
      return K3_EINVAL;
    }
  }
  if (!*n) {
    snprintf(err, errlen, "--%s: empty", what);
    return K3_EINVAL;
  }
  return 0;
}

static json_t *point(const char *kind, const double *x, int k, double y, double fit) {
  json_t *o = json_object();
  json_object_set_new(o, "kind", json_string(kind));
  json_t *a = json_array();
  for (int j = 0; j < k; j++) json_array_append_new(a, json_real(x[j]));
  json_object_set_new(o, "x", a);
  json_object_set_new(o, "y_ms", json_real(y));
  json_object_set_new(o, "fit_ms", json_real(fit));
  return o;
}

static double dot(const double *x, const double *b, int k) {
  double s = 0;
  for (int j = 0; j < k; j++) s += x[j] * b[j];
  return s;
}

int bn_profile_run(const bn_workload_t *w, const bn_profile_opts_t *o, char *err, size_t errlen) {
  int Ls[16], Bs[16], nL = 0, nB = 0;
  int rc = parse_list(o->prompts, "profile-prompts", Ls, 16, &nL, err, errlen);
  if (!rc) rc = parse_list(o->batches, "profile-batches", Bs, 16, &nB, err, errlen);
  if (rc) return rc;
  if (nL < 2) {
    snprintf(err, errlen, "--profile-prompts: need at least two lengths to fit a slope");
    return K3_EINVAL;
  }
  const int64_t C = (o->chunk + 63) / 64 * 64;
  const int R = o->repeats;
  /* rows: prefill (fixed, per_seq, per_token, per_kctx), handoff bytes (1, L), tail (1, bytes) */
  double Xp[64 * 4], yp[64], Xb[16 * 2], yb[16], Xt[16 * 2], yt[16], Xd[64 * 3], yd[64];
  int np = 0, nb = 0, nt = 0, nd = 0;
  double over_sum = 0, cv2_sum = 0, itl_cv = -1;
  int over_n = 0;
  json_t *pts = json_array();
  snap_t a, b;
  uint64_t seed = w->seed;
  fprintf(stderr, "k3pd-bench --profile: %s worker metrics\n",
          o->prefill_metrics || o->decode_metrics ? "with" : "without");
  /* 1. prompts alone */
  for (int i = 0; i < nL && !rc; i++) {
    phase_t ph;
    if ((rc = warm(w, o, (uint32_t)Ls[i], 1, 1, seed, err, errlen)) || (rc = snap(o, &a, err, errlen)) ||
        (rc = phase(w, o, (uint32_t)Ls[i], 1, 1, (uint64_t)R, seed++, &ph, err, errlen)) ||
        (rc = snap(o, &b, err, errlen)))
      break;
    int passes = 0;
    double ctx = chunk_ctx(Ls[i], C, &passes);
    double compute = a.pf ? (b.v[M_FWD_SUM] - a.v[M_FWD_SUM]) * 1000.0 / R : ph.prefill_ms;
    double *x = &Xp[np * 4];
    x[0] = passes;
    x[1] = passes; /* one prompt per pass */
    x[2] = Ls[i];
    x[3] = ctx / 1000.0;
    yp[np++] = compute;
    over_sum += ph.ttft_ms - ph.prefill_ms;
    over_n++;
    if (ph.ttft_ms > 0) cv2_sum += ph.ttft_var / (ph.ttft_ms * ph.ttft_ms);
    if (a.pf) {
      double bytes = (b.v[M_HO_BYTES] - a.v[M_HO_BYTES]) / R;
      Xb[nb * 2] = 1;
      Xb[nb * 2 + 1] = Ls[i];
      yb[nb++] = bytes;
      Xt[nt * 2] = 1;
      Xt[nt * 2 + 1] = bytes;
      yt[nt++] = ph.ttft_ms - compute;
    }
    fprintf(stderr, "  prefill L=%d: compute %.2f ms/request (%d passes), Prefill RPC %.2f ms, TTFT %.2f ms\n", Ls[i],
            compute, passes, ph.prefill_ms, ph.ttft_ms);
  }
  /* 2. batched short prompts (with metrics only: the pass count is needed) */
  if (!rc && o->prefill_metrics) {
    int Ls_short = Ls[0] < C ? Ls[0] : (int)C;
    int n = 4 * R;
    phase_t ph;
    if (!(rc = warm(w, o, (uint32_t)Ls_short, 1, 4, seed, err, errlen)) && !(rc = snap(o, &a, err, errlen)) &&
        !(rc = phase(w, o, (uint32_t)Ls_short, 1, 4, (uint64_t)n, seed++, &ph, err, errlen)) &&
        !(rc = snap(o, &b, err, errlen))) {
      double passes = b.v[M_FWD_COUNT] - a.v[M_FWD_COUNT];
      double *x = &Xp[np * 4];
      x[0] = passes;
      x[1] = n;
      x[2] = (double)n * Ls_short;
      x[3] = 0;
      yp[np++] = (b.v[M_FWD_SUM] - a.v[M_FWD_SUM]) * 1000.0;
      fprintf(stderr, "  prefill batched: %d prompts of %d in %.0f passes, %.2f ms\n", n, Ls_short, passes,
              yp[np - 1]);
    }
  }
  /* 3. decode */
  int dl[2] = {Ls[0], Ls[nL - 1]};
  bn_vec_t gaps1 = {0};
  for (int i = 0; i < nB && !rc; i++)
    for (int j = 0; j < 2 && !rc; j++) {
      int c = Bs[i], N = o->decode_output;
      phase_t ph;
      if ((rc = warm(w, o, (uint32_t)dl[j], (uint32_t)N, c, seed, err, errlen)) || (rc = snap(o, &a, err, errlen)))
        break;
      g_gaps = c == 1 ? &gaps1 : NULL; /* batch 1: the step's own spread (pl_profile_fit_spread) */
      rc = phase(w, o, (uint32_t)dl[j], (uint32_t)N, c, (uint64_t)(R * c), seed++, &ph, err, errlen);
      g_gaps = NULL;
      if (rc || (rc = snap(o, &b, err, errlen))) break;
      double step, batch;
      if (a.dc) {
        double steps = b.v[M_STEP_COUNT] - a.v[M_STEP_COUNT];
        step = steps > 0 ? (b.v[M_STEP_SUM] - a.v[M_STEP_SUM]) * 1000.0 / steps : 0;
        batch = steps > 0 ? (b.v[M_GEN] - a.v[M_GEN] - (double)R * c) / steps : c;
      } else {
        step = ph.tpot_ms;
        batch = c;
      }
      double *x = &Xd[nd * 3];
      x[0] = 1;
      x[1] = batch;
      x[2] = batch * (dl[j] + N / 2.0) / 1000.0;
      yd[nd++] = step;
      if (c == 1 && j == 0) itl_cv = ph.itl_cv; /* batch 1, short prompt: the step's own spread */
      fprintf(stderr, "  decode c=%d L=%d: step %.3f ms at mean batch %.2f (TPOT p50 %.3f ms)\n", c, dl[j], step,
              batch, ph.tpot_ms);
    }
  /* 4. each worker's speed (several workers of a role): as many requests at once as workers, so
   * the router gives each one its own; per worker, the prefill compute per prompt and the decode
   * step time at its mean batch, against worker 0 (prefill: the table is worker 0's) or the
   * fit (decode: phase 3 spread over every worker). */
  double pf_speed[PL_WMAX], dc_speed[PL_WMAX];
  int n_pf = 0, n_dc = 0;
  double va[PL_WMAX][M_N], vb[PL_WMAX][M_N];
  int na = 0, nb2 = 0;
  if (!rc && o->prefill_metrics && strchr(o->prefill_metrics, ',')) {
    phase_t ph;
    int L = Ls[nL - 1] < C ? Ls[nL - 1] : (int)C, P = 0;
    if (!(rc = scrape_each(o->prefill_metrics, va, PL_WMAX, &na, err, errlen))) {
      P = na;
      if (!(rc = phase(w, o, (uint32_t)L, 1, P, (uint64_t)(2 * R * P), seed++, &ph, err, errlen)))
        rc = scrape_each(o->prefill_metrics, vb, PL_WMAX, &nb2, err, errlen);
    }
    for (int k = 0; !rc && k < na && k < nb2; k++) {
      double req = vb[k][M_PF_REQ] - va[k][M_PF_REQ], ms = (vb[k][M_FWD_SUM] - va[k][M_FWD_SUM]) * 1000.0;
      pf_speed[n_pf++] = req > 0 && ms > 0 ? ms / req : 0;
    }
    double ref = n_pf ? pf_speed[0] : 0;
    fprintf(stderr, "  prefill per worker (L=%d, %d at once):", L, P);
    for (int k = 0; k < n_pf; k++) {
      fprintf(stderr, " %.2f ms", pf_speed[k]);
      pf_speed[k] = ref > 0 && pf_speed[k] > 0 ? pf_speed[k] / ref : 1;
    }
    fputc('\n', stderr);
  }
  double dc_ms[PL_WMAX], dc_b[PL_WMAX];
  if (!rc && o->decode_metrics && strchr(o->decode_metrics, ',')) {
    phase_t ph;
    int D = 0, N = o->decode_output;
    if (!(rc = scrape_each(o->decode_metrics, va, PL_WMAX, &na, err, errlen))) {
      D = na;
      if (!(rc = phase(w, o, (uint32_t)Ls[0], (uint32_t)N, D, (uint64_t)(R * D), seed++, &ph, err, errlen)))
        rc = scrape_each(o->decode_metrics, vb, PL_WMAX, &nb2, err, errlen);
    }
    for (int k = 0; !rc && k < na && k < nb2; k++) {
      double steps = vb[k][M_STEP_COUNT] - va[k][M_STEP_COUNT];
      dc_ms[n_dc] = steps > 0 ? (vb[k][M_STEP_SUM] - va[k][M_STEP_SUM]) * 1000.0 / steps : 0;
      dc_b[n_dc++] = steps > 0 ? (vb[k][M_GEN] - va[k][M_GEN] - (double)R) / steps : 0; /* less first tokens */
    }
  }
  if (rc) {
    free(gaps1.v);
    json_decref(pts);
    return rc;
  }
  pl_profile_t p;
  pl_profile_default(&p);
  pl_profile_fit_spread(&p, gaps1.v, gaps1.n);
  free(gaps1.v);
  p.pf.chunk_tokens = C;
  bool nn4[4] = {true, true, true, true};
  double bp[4], bd[3], bbytes[2] = {0, 0}, btail[2] = {0, 0};
  if (bn_fit_lsq(Xp, yp, np, 4, nn4, bp) || bn_fit_lsq(Xd, yd, nd, 3, nn4, bd)) {
    snprintf(err, errlen, "profile: the measurements do not determine the costs (all zero?)");
    json_decref(pts);
    return K3_EINVAL;
  }
  p.pf_fixed_ms = bp[0];
  p.pf_per_seq_ms = bp[1];
  p.pf_per_token_ms = bp[2];
  p.pf_per_kctx_ms = bp[3];
  { /* the lone prompts as measured (k3pd-plan prices passes by them, docs/plan.md) */
    double rows[64][5];
    for (int i = 0; i < np; i++) {
      memcpy(rows[i], &Xp[i * 4], 4 * sizeof(double));
      rows[i][4] = yp[i];
    }
    pl_profile_fit_table(&p, (const double (*)[5])rows, np);
  }
  p.dc_fixed_ms = bd[0];
  p.dc_per_seq_ms = bd[1];
  p.dc_per_kctx_ms = bd[2];
  p.pf_speed_n = n_pf;
  memcpy(p.pf_speed, pf_speed, (size_t)n_pf * sizeof *pf_speed);
  if (n_dc) { /* measured / fitted at each worker's batch, then scaled to a mean of 1 */
    double sum = 0;
    fprintf(stderr, "  decode per worker (%d at once):", n_dc);
    for (int k = 0; k < n_dc; k++) {
      double b = dc_b[k] > 0 ? dc_b[k] : 1;
      double fit = pl_decode_step_ms(&p, (int)(b + 0.5) > 0 ? (int)(b + 0.5) : 1, b * (Ls[0] + o->decode_output / 2.0));
      fprintf(stderr, " %.3f ms at batch %.2f", dc_ms[k], b);
      dc_speed[k] = dc_ms[k] > 0 && fit > 0 ? dc_ms[k] / fit : 1;
      sum += dc_speed[k];
    }
    fputc('\n', stderr);
    for (int k = 0; k < n_dc; k++) dc_speed[k] /= sum / n_dc;
    p.dc_speed_n = n_dc;
    memcpy(p.dc_speed, dc_speed, (size_t)n_dc * sizeof *dc_speed);
  }
  /* Variability: the spread of TTFT of one prompt alone (pooled over the lengths) and of the
   * inter-token gaps at batch 1. It holds everything that makes a pass or a step slower than
   * its fitted cost (other processes, the engine's admission work between steps, relay). */
  p.pf_cv = over_n ? sqrt(cv2_sum / over_n) : 0;
  p.dc_cv = itl_cv > 0 ? itl_cv : 0;
  for (int i = 0; i < np; i++) json_array_append_new(pts, point("prefill_pass_sum", &Xp[i * 4], 4, yp[i], dot(&Xp[i * 4], bp, 4)));
  for (int i = 0; i < nd; i++) json_array_append_new(pts, point("decode_step", &Xd[i * 3], 3, yd[i], dot(&Xd[i * 3], bd, 3)));
  if (nb >= 2 && !bn_fit_lsq(Xb, yb, nb, 2, nn4, bbytes)) {
    p.ho_bytes_fixed = bbytes[0];
    p.ho_bytes_per_token = bbytes[1];
  }
  p.ttft_overhead_ms = over_n && over_sum > 0 ? over_sum / over_n : 0;
  if (nt >= 1 && !bn_fit_lsq(Xt, yt, nt, 2, nn4, btail)) {
    p.ttft_overhead_ms = btail[0];
    p.ho_latency_ms = 0;
    p.ho_bandwidth_bytes_per_s = btail[1] > 1e-12 ? 1000.0 / btail[1] : 0;
    for (int i = 0; i < nt; i++) json_array_append_new(pts,  point("ttft_minus_compute", &Xt[i * 2], 2, yt[i], dot(&Xt[i * 2], btail, 2)));
  }
  snprintf(p.source, sizeof p.source, "k3pd-bench --profile against %s (%s worker metrics), prompts %s, batches %s",
           o->router, o->prefill_metrics || o->decode_metrics ? "with" : "without", o->prompts, o->batches);
  json_t *fit = json_object();
  json_object_set_new(fit, "points", pts);
  json_object_set_new(fit, "note", json_string("x: regressors in the order of the fitted coefficients; y_ms "
                                               "measured, fit_ms predicted"));
  rc = pl_profile_save(o->out, &p, fit, err, errlen);
  json_decref(fit);
  if (!rc)
    fprintf(stderr,
            "k3pd-bench --profile: wrote %s: prefill pass %.3f + %.3f/seq + %.4f/token + %.4f/ktok-ctx ms; decode "
            "step %.3f + %.4f/seq + %.5f/ktok-ctx ms; handoff %.0f + %.1f/token bytes, tail %.3f ms + bytes at %.3g "
            "B/s; TTFT overhead %.2f ms; cv prefill %.3f decode %.3f\n",
            o->out, p.pf_fixed_ms, p.pf_per_seq_ms, p.pf_per_token_ms, p.pf_per_kctx_ms, p.dc_fixed_ms,
            p.dc_per_seq_ms, p.dc_per_kctx_ms, p.ho_bytes_fixed, p.ho_bytes_per_token, p.ho_latency_ms,
            p.ho_bandwidth_bytes_per_s, p.ttft_overhead_ms, p.pf_cv, p.dc_cv);
  if (!rc && p.dc_q_n >= 2)
    fprintf(stderr, "k3pd-bench --profile: decode step spread from %zu gaps at batch 1 (/ mean): p50 %.2f p90 %.2f "
            "p99 %.2f max %.2f\n", gaps1.n, pl_decode_spread(&p, 0.5), pl_decode_spread(&p, 0.9),
            pl_decode_spread(&p, 0.99), pl_decode_spread(&p, 1));
  if (!rc && p.pf_tab_n >= 2)
    fprintf(stderr, "k3pd-bench --profile: prefill table of %d lone prompts, %.3f ms shared per pass, %.5f/ktok-ctx ms\n",
            p.pf_tab_n, p.pf_shared_ms, p.pf_tab_kctx_ms);
  return rc;
}
