/* k3k-gpu-model: model parity of the runner on the "cuda" backend against the CPU reference
 * ("cpu-fast", bit-identical to "cpu"), both in bf16 precision over the SAME weights, plus
 * (--perf) decode step time at batch 1 against its weight-read floor and prefill tokens/s.
 *
 * Checks (each prints PASS/FAIL with its figures; the last line is "N passed, N failed"):
 *   1. prefill of two sequences in one call (9 and 70 tokens: crosses the KDA chunk of 64 and
 *      an MLA page): relative L2 error of the last-position logits, and per layer the state
 *      the prefill left (every manifest region: KDA S, conv q/k/v, MLA latent pages);
 *   2. teacher-forced decode: both runners fed the reference's greedy tokens for --steps
 *      steps: logit error per step, and top-1 agreement wherever the reference's top-1 margin
 *      exceeds twice the observed max abs error (there agreement is implied by the error
 *      bound, so a disagreement is a bug in the argmax path, not noise);
 *   3. on the GPU alone: prefill(T) vs prefill(T-k) + k decode steps (last logits), against
 *      the same figure of the CPU reference (the model's own sensitivity to rounding order).
 * Tolerances: bf16 rounding points make both backends round at the same places, but the GEMM
 * accumulation orders differ, so stored bf16 values differ by an ulp here and there; through
 * random synthetic weights that noise reaches a few 1e-2 relative at the logits. Worse, where
 * the router's k-th and (k+1)-th expert scores nearly tie, that noise flips the expert choice
 * of a token (the choice is identical on identical inputs: k3k-gpu-moe), which changes that
 * token's output by a whole expert. So the logit checks are on the median over positions/steps
 * (a systematic error moves every position) plus a bound on the outliers (a wrong layer gives
 * errors of order 1 everywhere). Both are judged against a control (control() below): each
 * backend's own prefill of the same tokens in calls of 16, an equally valid computation; the
 * bounds grow to 2x the larger of the two controls where the model amplifies noise that much
 * (deep configs, and the 48B's top-8 of 256 routing where the 8th and 9th scores nearly tie).
 *   4. (gpu_model_perf.c) CUDA-graph decode replay bit-identical to eager decode, batch 1 and 3.
 * --perf (gpu_model_perf.c): decode batch 1 eager/graph vs the weight-read floor, batch-64
 * decode tokens/s, 8K prefill vs its FLOP floor, with the ceilings measured in the same run.
 * What it is not: an op test (k3k-gpu-check) or a MoE kernel test (k3k-gpu-moe).
 * Weights: --model DIR (a k3pd-mkckpt checkpoint, fast: mmap), or synthetic in memory with
 * k3_weights_synth_opts on every CPU (the generator and seed k3pd-mkckpt uses): --synthetic
 * PRESET (e.g. medium: 91.6 GB, more than the GPU host's disk) or --synthetic-config FILE
 * (--config is its older alias). The weights are held once in host memory: the cuda runner
 * uploads them, the cpu-fast reference reads them in place. --device-synth generates them on
 * the GPU instead (k3_runner_init_synth, the same bytes: --verify-synth KIB compares slices with
 * the host generator) and gives the cpu-fast reference a host copy (k3_runner_init_copy): the
 * only way to run the medium preset within one device call (host generation: ~20 min).
 * Exit: 0 all passed, 1 a check failed, 2 usage/setup error, 77 no CUDA device. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_model.h"
#include "gpu_runner_util.h"
#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/tmap.h"
#include "k3pd/util.h"

static int g_pass, g_fail;
static int g_ctl_chunk = 16; /* --control-chunk: the model's own sensitivity (0: off) */
static double g_ctl_lg;      /* the control's logits figure (bounds the split check too) */

void gm_check(bool ok, const char *name, const char *fmt, double a, double b) {
  printf("%s %s: ", ok ? "PASS" : "FAIL", name);
  printf(fmt, a, b);
  printf("\n");
  fflush(stdout);
  ok ? g_pass++ : g_fail++;
}

/* Relative L2 error of a against the reference b, and max abs difference. */
static double rel_err(const float *a, const float *b, int64_t n, double *maxabs) {
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
    if (fabs(d) > mx || d != d) mx = d != d ? INFINITY : fabs(d);
  }
  if (maxabs) *maxabs = mx;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median and maximum of n values (sorts v). */
static double median_max(double *v, int n, double *mx) {
  qsort(v, (size_t)n, sizeof *v, cmp_dbl);
  *mx = v[n - 1];
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int argmax(const float *x, int64_t n, double *margin) {
  int64_t b = 0, s = -1;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  for (int64_t i = 0; i < n; i++)
    if (i != b && (s < 0 || x[i] > x[s])) s = i;
  if (margin) *margin = s < 0 ? INFINITY : (double)x[b] - x[s];
  return (int)b;
}

static int new_runner(const k3_weights_t *w, const char *be, int threads, k3_runner_t **r) {
  return grunner_new(w, be, threads, 160, "k3k-gpu-model", r);
}

static int prefill(k3_runner_t *r, gseq_t *q, const int32_t *tok, int64_t n, float *logits) {
  char err[512] = "";
  int rc = k3_runner_seq_reserve(r, &q->s, q->s.len + n + 16);
  k3_prefill_item_t it = {&q->s, tok, n, logits, false};
  if (!rc) rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err);
  if (rc) fprintf(stderr, "prefill: %s (%s)\n", err, k3_strerror(rc));
  return rc;
}

static int decode(k3_runner_t *r, gseq_t *q, int32_t tok, float *logits) {
  char err[512] = "";
  k3_decode_item_t d = {.seq = &q->s, .token = tok, .logits = logits};
  int rc = k3_runner_decode_step(r, &d, 1, err, sizeof err);
  if (rc) fprintf(stderr, "decode: %s (%s)\n", err, k3_strerror(rc));
  return rc;
}

/* Region i of a sequence as floats (F32 or BF16 state). */
static float *region_f32(const k3_runner_t *r, const k3_seq_t *s, int i, int64_t *n) {
  const k3_region_t *g = &k3_runner_manifest(r)->regions[i];
  uint64_t bytes = k3_runner_region_bytes(r, i, s->len);
  void *raw = malloc(bytes);
  size_t es = g->dtype == K3_DT_F32 ? 4 : 2;
  float *f = malloc(bytes / es * sizeof(float));
  if (!raw || !f || k3_runner_export_region(r, s, i, raw, bytes)) {
    free(raw);
    free(f);
    return NULL;
  }
  *n = (int64_t)(bytes / es);
  for (int64_t j = 0; j < *n; j++)
    f[j] = es == 4 ? ((float *)raw)[j] : k3_bf16_to_f32(((uint16_t *)raw)[j]);
  free(raw);
  return f;
}

/* The model's own sensitivity (the "control"): each backend prefills seq 1's tokens again in
 * calls of g_ctl_chunk tokens (an equally valid computation: the KDA state crosses the call
 * boundaries in fp32, so only summation orders change and bf16 roundings flip here and there)
 * and compares what it leaves with its own one-call prefill: per manifest region ctl_ref[i]
 * (reference) and ctl_gpu[i], and the reference's logits of every position against its
 * one-call ones seq_ref [len][V] (ctl_pos[len]; *ctl_lg = the last position's), and the GPU's
 * the same way against its own one-call logits seq_gpu (ctl_gpos[len]). Through
 * random synthetic weights a deep model amplifies any such difference layer by layer (the
 * medium preset: 2e-7 at layer 0 becomes 0.5 at layer 14 on the reference itself), so the GPU's
 * deviation is judged against this envelope: growth at the model's own rate is noise, a jump
 * at one layer is a bug. Returns 0 or the first failing runner code. */
static int control(k3_runner_t *ref, k3_runner_t *gpu, gseq_t *qr, gseq_t *qg, const int32_t *tok,
                   int64_t len, const float *seq_ref, const float *seq_gpu, double *ctl_ref,
                   double *ctl_gpu, double *ctl_lg, double *ctl_pos, double *ctl_gpos) {
  k3_runner_t *rs[2] = {ref, gpu};
  gseq_t *whole[2] = {&qr[1], &qg[1]}, qc[2];
  const k3_manifest_t *man = k3_runner_manifest(ref);
  const int64_t V = k3_runner_vocab(ref);
  /* each backend's logits of every position, prefilled in calls */
  float *lg = malloc((size_t)(len * V) * 4), *lgg = malloc((size_t)(len * V) * 4);
  int rc = lg && lgg ? 0 : K3_ENOMEM;
  char err[512] = "";
  for (int b = 0; b < 2; b++) {
    gseq_init(&qc[b]);
    for (int64_t off = 0; off < len && !rc; off += g_ctl_chunk) {
      int64_t n = off + g_ctl_chunk < len ? g_ctl_chunk : len - off;
      rc = k3_runner_seq_reserve(rs[b], &qc[b].s, off + n + 16);
      k3_prefill_item_t it = {&qc[b].s, tok + off, n, (b ? lgg : lg) + off * V, true};
      if (!rc) rc = k3_runner_prefill(rs[b], &it, 1, NULL, NULL, err, sizeof err);
      if (rc) fprintf(stderr, "control prefill: %s (%s)\n", err, k3_strerror(rc));
    }
  }
  /* per position: the reference's chunked logits vs its one-call logits (positions before the
   * first call boundary are the same computation, so 0) */
  for (int64_t t = 0; t < len && !rc; t++) {
    ctl_pos[t] = rel_err(lg + t * V, seq_ref + t * V, V, NULL);
    ctl_gpos[t] = rel_err(lgg + t * V, seq_gpu + t * V, V, NULL);
  }
  if (!rc) *ctl_lg = ctl_pos[len - 1];
  for (size_t i = 0; i < man->n && !rc; i++) {
    for (int b = 0; b < 2; b++) {
      int64_t na = 0, nb = 0;
      float *a = region_f32(rs[b], &qc[b].s, (int)i, &na);
      float *w = region_f32(rs[b], &whole[b]->s, (int)i, &nb);
      (b ? ctl_gpu : ctl_ref)[i] = a && w && na == nb ? rel_err(a, w, na, NULL) : NAN;
      free(a);
      free(w);
    }
  }
  for (int b = 0; b < 2; b++) k3_runner_seq_release(rs[b], &qc[b].s);
  free(lg);
  free(lgg);
  return rc;
}

/* 1 + 2: CUDA vs CPU reference. */
static void parity(k3_runner_t *ref, k3_runner_t *gpu, int steps, double tol) {
  const int64_t V = k3_runner_vocab(ref);
  const int64_t len[2] = {9, 70};
  int32_t tok[2][70];
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int s = 0; s < 2; s++)
    for (int64_t t = 0; t < len[s]; t++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      tok[s][t] = (int32_t)((x >> 33) % (uint64_t)(V - 1024));
    }
  /* every position's logits: a per-position distribution separates a systematic error (all
   * positions off) from the isolated tokens whose expert choice flips (below) */
  const int64_t NP = len[0] + len[1];
  float *lr = malloc((size_t)(NP * V) * 4), *lg = malloc((size_t)(NP * V) * 4);
  double *pe = malloc((size_t)NP * sizeof *pe);
  gseq_t qr[2], qg[2];
  k3_runner_t *rs[2] = {ref, gpu};
  gseq_t *qs[2] = {qr, qg};
  float *ls[2] = {lr, lg};
  char err[512];
  double *ctl_ref = NULL, *ctl_gpu = NULL, ctl_lg = 0;
  int rc = lr && lg && pe ? 0 : K3_ENOMEM;
  for (int b = 0; b < 2 && !rc; b++) {
    k3_prefill_item_t it[2];
    for (int s = 0; s < 2 && !rc; s++) {
      gseq_init(&qs[b][s]);
      rc = k3_runner_seq_reserve(rs[b], &qs[b][s].s, len[s] + steps + 8);
      it[s] = (k3_prefill_item_t){&qs[b][s].s, tok[s], len[s], ls[b] + (s ? len[0] : 0) * V, true};
    }
    uint64_t t0 = k3_now_ns();
    if (!rc) rc = k3_runner_prefill(rs[b], it, 2, NULL, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "prefill (%s): %s (%s)\n", b ? "cuda" : "ref", err, k3_strerror(rc));
    else printf("prefill 2 sequences (%s): %.3f s\n", b ? "cuda" : "ref", (double)(k3_now_ns() - t0) / 1e9);
  }
  if (rc) {
    gm_check(false, "prefill ran on both backends", "rc %g %g", (double)rc, 0.0);
    goto out;
  }
  /* the control (see control()): bounds become max(tolerance, 2x the model's own figure) */
  const k3_manifest_t *man = k3_runner_manifest(ref);
  ctl_ref = calloc(man->n, sizeof(double));
  ctl_gpu = calloc(man->n, sizeof(double));
  if (!ctl_ref || !ctl_gpu) rc = K3_ENOMEM;
  double ctl_pos[70], ctl_gpos[70];
  if (!rc && g_ctl_chunk > 0) {
    rc = control(ref, gpu, qr, qg, tok[1], len[1], lr + len[0] * V, lg + len[0] * V, ctl_ref,
                 ctl_gpu, &ctl_lg, ctl_pos, ctl_gpos);
    printf("  control: the reference's prefill in calls of %d tokens vs one call: last logits rel "
           "err %.3e%s\n", g_ctl_chunk, ctl_lg, rc ? " (FAILED to run)" : "");
    gm_check(rc == 0, "control ran (prefill in calls on both backends)", "rc %g %g", rc, 0);
    if (rc) goto out;
  }
  /* The control over every position past its first call (seq 1's positions n0..69), on each
   * backend: its median, max and the share of positions a routing flip throws far off. The
   * GPU's own figure is its noise with its own numerics (bf16 tensor-core operands in the KDA
   * chunk: 1e-3 at layer 0 where the reference's re-chunking moves 1e-7); a systematic GPU error
   * would sit in both of the GPU's prefills, so it shows against the reference, not in that
   * figure. Bounds: median max(tol, 2x the larger control median, 2x the last-position control),
   * outliers (above 4x that bound) at most max(10 %, 2x the larger control share), every
   * position below max(0.5, 2x the larger control max). */
  double cmed = 0, cmax = 0, gmed = 0, gmax = 0;
  const int n0 = g_ctl_chunk, nc = g_ctl_chunk > 0 && g_ctl_chunk < len[1] ? (int)len[1] - n0 : 0;
  double cv[70], gv[70];
  if (nc > 0) {
    memcpy(cv, ctl_pos + n0, (size_t)nc * sizeof *cv);
    memcpy(gv, ctl_gpos + n0, (size_t)nc * sizeof *gv);
    cmed = median_max(cv, nc, &cmax);
    gmed = median_max(gv, nc, &gmax);
  }
  const double ltol = fmax(fmax(tol, 2 * ctl_lg), 2 * fmax(cmed, gmed));
  int cbig = 0, gbig = 0;
  for (int t = 0; t < nc; t++) {
    cbig += !(cv[t] <= 4 * ltol);
    gbig += !(gv[t] <= 4 * ltol);
  }
  const double share = nc > 0 ? fmax(0.1, 2.0 * (cbig > gbig ? cbig : gbig) / nc) : 0.1;
  const double pbound = fmax(0.5, 2 * fmax(ctl_lg, fmax(cmax, gmax)));
  for (int s = 0; s < 2; s++) {
    int64_t last = (s ? NP : len[0]) - 1;
    double mx, e = rel_err(lg + last * V, lr + last * V, V, &mx);
    printf("  last position of seq %d (%lld tokens): rel err %.3e max abs %.3e\n", s,
           (long long)len[s], e, mx);
  }
  int big = 0;
  for (int64_t t = 0; t < NP; t++) {
    pe[t] = rel_err(lg + t * V, lr + t * V, V, NULL);
    big += !(pe[t] <= 4 * ltol);
  }
  if (nc > 0) {
    double ev[70], emax;
    int ebig = 0;
    for (int t = 0; t < nc; t++) {
      ev[t] = pe[len[0] + n0 + t];
      ebig += !(ev[t] <= 4 * ltol);
    }
    double emed = median_max(ev, nc, &emax);
    printf("  logits of seq 1's positions %d..%lld (median, above 4x bound %.1e, max): control "
           "reference vs itself %.3e, %d, %.3e; control GPU vs itself %.3e, %d, %.3e; GPU vs "
           "reference %.3e, %d, %.3e\n", n0, (long long)len[1] - 1, 4 * ltol, cmed, cbig, cmax,
           gmed, gbig, gmax, emed, ebig, emax);
  }
  double pmax, pmed = median_max(pe, (int)NP, &pmax);
  printf("  prefill positions: %d of %lld above 4x the logit bound %.1e; p90 %.3e\n", big,
         (long long)NP, ltol, pe[(int)(0.9 * (double)(NP - 1))]);
  gm_check(pmed <= ltol, "prefill logits, median over 79 positions (bound max(tol, 2x control))",
           "rel err %.3e (bound %.3e)", pmed, ltol);
  gm_check(big <= share * (double)NP && pmax < pbound,
           "prefill logits, outliers (<= max(10%, 2x control share) above 4x bound, all < max(0.5, 2x control max))",
           "%g positions, max %.3e", (double)big, pmax);
  /* per layer: the state the prefill left (seq 1: 70 tokens, two pages, chunk + tail), each
   * region against max(2 tol, 2x the reference's own control figure for that region) */
  double worst = 0, worst_ratio = 0;
  for (size_t i = 0; i < man->n; i++) {
    int64_t na = 0, nb = 0;
    float *a = region_f32(gpu, &qg[1].s, (int)i, &na), *b = region_f32(ref, &qr[1].s, (int)i, &nb);
    if (!a || !b || na != nb) {
      gm_check(false, man->regions[i].name, "export failed (%g vs %g elements)", (double)na, (double)nb);
    } else {
      double mx, e = rel_err(a, b, na, &mx), bound = fmax(2 * tol, 2 * ctl_ref[i]);
      if (g_ctl_chunk > 0)
        printf("  state %-16s rel err %.3e max abs %.3e | control: ref %.3e, gpu %.3e\n",
               man->regions[i].name, e, mx, ctl_ref[i], ctl_gpu[i]);
      else
        printf("  state %-16s rel err %.3e max abs %.3e\n", man->regions[i].name, e, mx);
      if (e > worst || e != e) worst = e != e ? INFINITY : e;
      if (!(e / bound <= worst_ratio)) worst_ratio = e != e || bound != bound ? INFINITY : e / bound;
    }
    free(a);
    free(b);
  }
  gm_check(worst_ratio <= 1, "per-layer state after prefill, every region <= max(2 tol, 2x control)",
           "worst rel err %.3e, worst err/bound %.3f", worst, worst_ratio);
  /* 2: teacher-forced decode of seq 0 (its last prefill row is the first reference) */
  memcpy(lr, lr + (len[0] - 1) * V, (size_t)V * 4);
  int agree = 0, checked = 0, done = 0;
  for (int st = 0; st < steps; st++) {
    int32_t next = argmax(lr, V, NULL);
    if ((rc = decode(ref, &qr[0], next, lr)) || (rc = decode(gpu, &qg[0], next, lg))) break;
    double mx, margin, e = rel_err(lg, lr, V, &mx);
    int tr = argmax(lr, V, &margin), tg = argmax(lg, V, NULL);
    bool decisive = margin > 2 * mx;
    printf("  decode step %2d: token %6d rel err %.3e max abs %.3e top1 ref %6d gpu %6d "
           "margin %.3e%s\n", st, next, e, mx, tr, tg, margin, decisive ? "" : " (not decisive)");
    pe[done++] = e;
    if (decisive) {
      checked++;
      agree += tr == tg;
    }
  }
  double smax = INFINITY, smed = done ? median_max(pe, done, &smax) : INFINITY;
  gm_check(!rc && smed <= ltol, "teacher-forced decode logits, median over steps (bound max(tol, 2x control))",
           "rel err %.3e (max %.3e)", smed, smax);
  gm_check(!rc && smax < pbound, "teacher-forced decode logits, every step < max(0.5, 2x control max)",
           "max %.3e (%g steps)", smax, (double)done);
  gm_check(!rc && agree == checked, "top-1 agreement on decisive steps", "%g of %g", (double)agree, (double)checked);
  g_ctl_lg = ctl_lg;
out:
  free(ctl_ref);
  free(ctl_gpu);
  for (int s = 0; s < 2; s++) {
    k3_runner_seq_release(ref, &qr[s].s);
    k3_runner_seq_release(gpu, &qg[s].s);
  }
  free(lr);
  free(lg);
  free(pe);
}

/* 3: prefill(T) vs prefill(T-k) + k decode steps, on the GPU. */
static double split_err(k3_runner_t *gpu, int64_t T, int k) {
  const int64_t V = k3_runner_vocab(gpu);
  int32_t *tok = malloc((size_t)T * 4);
  float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
  gseq_t a, b;
  gseq_init(&a);
  gseq_init(&b);
  for (int64_t t = 0; t < T; t++) tok[t] = (int32_t)((t * 7919 + 13) % (V - 1024));
  int rc = prefill(gpu, &a, tok, T, la);
  if (!rc) rc = prefill(gpu, &b, tok, T - k, lb);
  for (int i = 0; i < k && !rc; i++) rc = decode(gpu, &b, tok[T - k + i], lb);
  double mx = 0, e = rc ? INFINITY : rel_err(lb, la, V, &mx);
  printf("  %s prefill(%lld) vs prefill(%lld)+%d decode: rel err %.3e max abs %.3e\n",
         k3_runner_opts(gpu)->backend, (long long)T, (long long)(T - k), k, e, mx);
  k3_runner_seq_release(gpu, &a.s);
  k3_runner_seq_release(gpu, &b.s);
  free(tok);
  free(la);
  free(lb);
  return e;
}

int main(int argc, char **argv) {
  const char *model = NULL, *config = NULL, *preset = NULL, *sconfig = NULL;
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), steps = 16, decode_steps = 20, batch = 64;
  int seed = 1, graph_steps = 12;
  int64_t ptok = 8192;
  bool do_perf = false, no_parity = false, no_ref_split = false, dev_synth = false;
  int verify_kib = 0;
  double tol = 3e-2;
  k3_flag_t flags[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "checkpoint directory (k3pd-mkckpt --config ...)", false},
      {"synthetic", K3_FLAG_STR, &preset, "PRESET", "synthetic weights of a preset (e.g. medium) generated in memory on every CPU", false},
      {"synthetic-config", K3_FLAG_STR, &sconfig, "FILE", "synthetic weights of a config.json, in memory", false},
      {"config", K3_FLAG_STR, &config, "FILE", "alias of --synthetic-config", false},
      {"seed-weights", K3_FLAG_INT, &seed, "N", "seed of the synthetic weights (default 1, as k3pd-mkckpt)", false},
      {"device-synth", K3_FLAG_BOOL, &dev_synth, NULL, "generate the synthetic weights on the GPU (k3_runner_init_synth: seconds); the CPU reference then gets a host copy of them (k3_runner_init_copy)", false},
      {"verify-synth", K3_FLAG_INT, &verify_kib, "KIB", "with --device-synth: compare two KIB-KiB slices of every tensor with the host generator (-1: every byte)", false},
      {"threads", K3_FLAG_INT, &threads, "N", "threads of the cpu-fast reference and the generator (default: CPUs)", false},
      {"steps", K3_FLAG_INT, &steps, "N", "teacher-forced decode steps (default 16)", false},
      {"tol", K3_FLAG_DOUBLE, &tol, "X", "relative L2 error bound (default 3e-2)", false},
      {"no-parity", K3_FLAG_BOOL, &no_parity, NULL, "skip the CPU reference (graph check and perf only)", false},
      {"no-ref-split", K3_FLAG_BOOL, &no_ref_split, NULL, "skip the CPU reference's own prefill-vs-decode figure (the GPU's is then bounded by 2x --tol)", false},
      {"graph-steps", K3_FLAG_INT, &graph_steps, "N", "decode steps of the graph-vs-eager check (default 12)", false},
      {"control-chunk", K3_FLAG_INT, &g_ctl_chunk, "N", "the control: each backend's prefill in calls of N tokens vs its one-call prefill, the model's own sensitivity; bounds become max(tolerance, 2x it) (default 16; 0: off)", false},
      {"perf", K3_FLAG_BOOL, &do_perf, NULL, "also print the perf figures with their ceilings", false},
      {"perf-steps", K3_FLAG_INT, &decode_steps, "N", "timed decode steps (default 20, at most 50)", false},
      {"perf-batch", K3_FLAG_INT, &batch, "N", "sequences of the batched decode figure (default 64)", false},
      {"perf-prefill", K3_FLAG_I64, &ptok, "N", "prompt tokens of the prefill figure (default 8192)", false},
      {"profile", K3_FLAG_BOOL, &gm_profile, NULL, "with --perf: one prefill, one batch-1 and one batch-B decode step inside cudaProfilerStart/Stop regions (ncu --profile-from-start off; scripts/gpu/ncu_sum.py)", false},
  };
  k3_flags_info_t info = {"k3k-gpu-model", "Model parity of the CUDA runner vs cpu-fast (bf16), CUDA-graph decode check, perf.", NULL};
  char err[512] = "";
  setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut by a timeout keeps every finished line */
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (config && !sconfig) sconfig = config;
  if (rc || (model != NULL) + (preset != NULL) + (sconfig != NULL) != 1 || (dev_synth && model) || steps < 1 ||
      decode_steps < 1 || g_ctl_chunk < 0 || batch < 1 || ptok < 64 || graph_steps < 3 || threads < 1) {
    fprintf(stderr, "k3k-gpu-model: %s\n", rc ? err : "give exactly one of --model DIR, --synthetic "
            "PRESET or --synthetic-config FILE (and counts >= 1, --graph-steps >= 3, --perf-prefill >= 64)");
    return 2;
  }
  if (!k3k_backend_get("cuda")) {
    printf("SKIP: no usable CUDA device\n");
    return 77;
  }
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  uint64_t t0 = k3_now_ns();
  if (model) {
    rc = k3_weights_open_dir(model, &cfg, &w, err, sizeof err);
  } else {
    if (preset) {
      const char *json = k3_model_config_preset(preset);
      rc = json ? k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err) : K3_EINVAL;
      if (!json) snprintf(err, sizeof err, "unknown preset '%s' (known: %s)", preset, k3_model_config_preset_names());
    } else {
      rc = k3_model_config_load(sconfig, &cfg, err, sizeof err);
    }
    /* the same generator and seed as k3pd-mkckpt: every tensor in host memory once; the cuda
     * runner uploads from it, the cpu-fast reference reads it in place */
    k3_weights_synth_opts_t so = {.threads = threads, .progress = true};
    if (!rc && !dev_synth) rc = k3_weights_synth_opts(&cfg, (uint64_t)seed, &so, &w, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "k3k-gpu-model: weights: %s (%s)\n", err, k3_strerror(rc));
    return 2;
  }
  if (w)
    printf("weights: %d layers, %d experts top-%d, vocab %lld, %.1f GB (%.1f s)\n", cfg.num_layers,
           cfg.num_experts, cfg.top_k, (long long)cfg.vocab_size,
           (double)k3_weights_tmap(w)->total_bytes / 1e9, (double)(k3_now_ns() - t0) / 1e9);
  k3_runner_t *ref = NULL, *gpu = NULL;
  t0 = k3_now_ns();
  /* cuda: slots for the perf batch + 1 (and the graph check's 2x3), pages for an 8K prompt and
   * the batch, one prefill pass for the whole prompt */
  int pages = 160;
  if (do_perf) pages += (int)((ptok + 63) / 64) + batch * 6 + 8;
  const int chunk = do_perf && ptok > 512 ? (int)ptok : 512, mb = batch > 8 ? batch : 8;
  if (dev_synth) {
    k3_runner_opts_t o;
    grunner_opts(&o, "cuda", 1, pages, batch + 8, mb, chunk);
    rc = k3_runner_init_synth(&cfg, (uint64_t)seed, verify_kib, &o, &gpu, err, sizeof err);
    gm_check(rc == 0, "weights generated on the device (sampled slices == k3_synth_fill)",
             "rc %g, %g KiB per slice", rc, verify_kib);
    if (rc) {
      fprintf(stderr, "k3k-gpu-model: %s (%s)\n", err, k3_strerror(rc));
      printf("%d passed, %d failed\n", g_pass, g_fail);
      return 1;
    }
  } else if (grunner_new_ex(w, "cuda", 1, pages, batch + 8, mb, chunk, "k3k-gpu-model", &gpu)) {
    k3_weights_free(w);
    return 2;
  }
  printf("cuda runner ready (%.1f s: weight %s)\n", (double)(k3_now_ns() - t0) / 1e9,
         dev_synth ? "generation on the device" : "upload");
  fflush(stdout);
  /* GPU-only parts first (cheap), the CPU reference last (slow on the medium preset) */
  gm_graph_check(gpu, 1, graph_steps);
  gm_graph_check(gpu, 3, graph_steps);
  if (do_perf) gm_perf(gpu, decode_steps, batch, ptok);
  if (!no_parity) {
    t0 = k3_now_ns();
    if (dev_synth) {
      k3_runner_opts_t o;
      grunner_opts(&o, "cpu-fast", threads, 160, 4, 8, 512); /* default slots and batch */
      rc = k3_runner_init_copy(gpu, &o, &ref, err, sizeof err);
      if (rc) fprintf(stderr, "k3k-gpu-model: cpu-fast copy: %s (%s)\n", err, k3_strerror(rc));
      else printf("cpu-fast reference over a host copy of the device weights (%.1f s)\n",
                  (double)(k3_now_ns() - t0) / 1e9);
    }
    if (dev_synth ? rc != 0 : new_runner(w, "cpu-fast", threads, &ref) != 0) {
      k3_runner_free(gpu);
      k3_weights_free(w);
      return 2;
    }
    parity(ref, gpu, steps, tol);
    printf("parity vs the reference done (%.1f s)\n", (double)(k3_now_ns() - t0) / 1e9);
    double ecpu = no_ref_split ? 0 : split_err(ref, 100, 4);
    k3_runner_free(ref);
    double egpu = split_err(gpu, 100, 4);
    const double sb = 2 * fmax(fmax(tol, ecpu), g_ctl_lg);
    gm_check(egpu <= sb, "gpu prefill(100) vs prefill(96)+4 decode (bound 2x max(tol, cpu figure, control))",
             no_ref_split ? "rel err %.3e (cpu reference figure skipped; bound %.3e)"
                          : "rel err %.3e (bound %.3e)", egpu, sb);
  }
  k3_runner_free(gpu);
  k3_weights_free(w);
  k3k_backends_shutdown();
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
