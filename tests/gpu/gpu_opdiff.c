/* k3k-gpu-opdiff: where the model runner's device pass departs from the CPU reference, op by op.
 *
 * What it is for: the precision study of docs/perf-gpu-model.md. Two runners over the SAME
 * weights in bf16 precision: the reference ("cpu-fast", bit-identical to "cpu") and the studied
 * backend (--backend, default "cuda"). The studied runner's backend carries the op shadow
 * (opdiff_shadow.h), and the program runs a list of experiments, each the same workload:
 *   a. prefill of two sequences in one call (9 + 70 tokens, all logits): relative L2 error of
 *      every position's logits against the reference (median, p90, max) and of the state each
 *      layer left (70-token sequence);
 *   b. prefill(100) and prefill(96) + 4 decode steps: the backend's own split difference, and
 *      each against the reference's same computation.
 * Experiment "observe" checks every k3k op against the reference from identical inputs (the
 * device op's inputs) and prints each call of workload a (tagged with its layer) and of the
 * first decode step, plus per-op summaries: the LOCAL error of each op at these shapes. The
 * "fix ..." experiments replace the outputs of a set of ops by the reference's, so the pass
 * continues from reference values after them; "fix all but X" leaves only X (and the device
 * MoE experts, which are not k3k ops) to differ, so its end-to-end error is X's contribution.
 * What it is not: a pass/fail suite (k3k-gpu-model is): it prints figures and exits 0 unless a
 * step failed to run. With --backend cpu it runs without a device and every figure against the
 * reference must be exactly 0: `--preset tiny --backend cpu --expect-zero` is the ctest of the
 * shadow itself (copies, pool rows, fix write-back).
 * Weights: --model DIR (a k3pd-mkckpt checkpoint) or --preset NAME (synthesised in memory; for
 * the small presets).
 * Exit: 0 done, 1 a run or the shadow failed (or --expect-zero saw a nonzero figure), 2
 * usage/setup, 77 backend unavailable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "csv.h"
#include "gpu_runner_util.h"
#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/model_config.h"
#include "k3pd/util.h"
#include "opdiff_shadow.h"

#define M(op) OD_MASK(K3K_OP_##op)
#define F_KDA (M(KDA_CHUNK) | M(KDA_STEP))
#define F_MLA (M(MLA_PREFILL) | M(MLA_DECODE))
#define F_NORM (M(RMSNORM) | M(GATED_RMSNORM) | M(L2NORM) | M(ATTN_RES_MIX))
#define F_REST (OD_ALL & ~(F_KDA | F_MLA | F_NORM | M(GEMM) | M(ROUTER)))

typedef struct {
  const char *name;
  uint64_t fix;
} exp_t;

static const exp_t k_exps[] = {
    {"observe", 0},
    {"fix-all", OD_ALL},
    {"all-but-kda", OD_ALL & ~F_KDA},
    {"all-but-gemm", OD_ALL & ~M(GEMM)},
    {"all-but-mla", OD_ALL & ~F_MLA},
    {"all-but-router", OD_ALL & ~M(ROUTER)},
    {"fix-kda", F_KDA},
    {"fix-kda-router", F_KDA | M(ROUTER)},
    {"fix-router", M(ROUTER)},
    {"all-but-norms", OD_ALL & ~F_NORM},
    {"all-but-rest", OD_ALL & ~F_REST},
};
#define N_EXPS (int)(sizeof k_exps / sizeof k_exps[0])

static double rel_err(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d != d ? INFINITY : d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int new_runner(const k3_weights_t *w, const char *be, int threads, k3_runner_t **r) {
  return grunner_new(w, be, threads, 64, "k3k-gpu-opdiff", r);
}

/* Layer tags for the shadow's call lines: ops before layer l's callback belong to layer l. */
static int on_layer(int layer, void *ctx) {
  int nl = *(const int *)ctx;
  char tag[32];
  if (layer + 1 < nl) snprintf(tag, sizeof tag, "prefill L%d", layer + 1);
  else snprintf(tag, sizeof tag, "prefill head");
  od_shadow_tag(tag);
  return 0;
}

/* The workload's results on one runner. */
typedef struct {
  float *pos;    /* [79][V] prefill logits, all positions */
  float **state; /* [n_regions] state of the 70-token sequence */
  int64_t *state_n;
  float *full, *split; /* last logits of prefill(100) and prefill(96)+4 */
} res_t;

/* Largest figure against the reference seen so far (for --expect-zero). */
static double g_worst;

static void worst(double e) {
  if (e > g_worst || e != e) g_worst = e != e ? INFINITY : e;
}

static const int64_t k_len[2] = {9, 70};
#define NP 79
#define SPLIT_T 100
#define SPLIT_K 4

static int run_workload(k3_runner_t *r, res_t *o, bool observe) {
  const int64_t V = k3_runner_vocab(r);
  const int nl = k3_runner_config(r)->num_layers;
  int32_t tok[2][70], stok[SPLIT_T];
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int s = 0; s < 2; s++)
    for (int64_t t = 0; t < k_len[s]; t++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      tok[s][t] = (int32_t)((x >> 33) % (uint64_t)(V - 16));
    }
  for (int t = 0; t < SPLIT_T; t++) stok[t] = (int32_t)((t * 7919 + 13) % (V - 16));
  gseq_t q[4];
  for (int i = 0; i < 4; i++) gseq_init(&q[i]);
  char err[512] = "";
  int rc = 0;
  k3_prefill_item_t it[2];
  for (int s = 0; s < 2 && !rc; s++) {
    rc = k3_runner_seq_reserve(r, &q[s].s, k_len[s] + 8);
    it[s] = (k3_prefill_item_t){&q[s].s, tok[s], k_len[s], o->pos + (s ? k_len[0] : 0) * V, true};
  }
  od_shadow_tag("prefill L0");
  od_shadow_reset();
  if (!rc) rc = k3_runner_prefill(r, it, 2, on_layer, (void *)&nl, err, sizeof err);
  if (observe) {
    od_shadow_print_summary("prefill of 9 + 70 tokens");
    od_shadow_set(OD_ALL, 0, false);
  }
  const k3_manifest_t *man = k3_runner_manifest(r);
  for (size_t i = 0; i < man->n && !rc; i++) {
    uint64_t bytes = k3_runner_region_bytes(r, (int)i, q[1].s.len);
    size_t es = man->regions[i].dtype == K3_DT_F32 ? 4 : 2;
    void *raw = malloc(bytes);
    o->state_n[i] = (int64_t)(bytes / es);
    o->state[i] = malloc((size_t)o->state_n[i] * sizeof(float));
    if (!raw || !o->state[i]) rc = K3_ENOMEM;
    if (!rc) rc = k3_runner_export_region(r, &q[1].s, (int)i, raw, bytes);
    for (int64_t j = 0; j < o->state_n[i] && !rc; j++)
      o->state[i][j] = es == 4 ? ((float *)raw)[j] : k3_bf16_to_f32(((uint16_t *)raw)[j]);
    free(raw);
  }
  /* split: prefill(100) vs prefill(96) + 4 decode steps */
  if (!rc) rc = k3_runner_seq_reserve(r, &q[2].s, SPLIT_T + 8);
  if (!rc) rc = k3_runner_seq_reserve(r, &q[3].s, SPLIT_T + 8);
  od_shadow_tag("split prefill");
  k3_prefill_item_t a = {&q[2].s, stok, SPLIT_T, o->full, false};
  k3_prefill_item_t b = {&q[3].s, stok, SPLIT_T - SPLIT_K, o->split, false};
  if (!rc) rc = k3_runner_prefill(r, &a, 1, NULL, NULL, err, sizeof err);
  if (!rc) rc = k3_runner_prefill(r, &b, 1, NULL, NULL, err, sizeof err);
  if (observe) od_shadow_reset();
  for (int i = 0; i < SPLIT_K && !rc; i++) {
    if (observe) od_shadow_set(OD_ALL, 0, i == 0);
    od_shadow_tag("decode");
    k3_decode_item_t d = {.seq = &q[3].s, .token = stok[SPLIT_T - SPLIT_K + i], .logits = o->split};
    rc = k3_runner_decode_step(r, &d, 1, err, sizeof err);
  }
  if (observe) od_shadow_print_summary("4 decode steps");
  if (rc) fprintf(stderr, "k3k-gpu-opdiff: workload: %s (%s)\n", err, k3_strerror(rc));
  for (int i = 0; i < 4; i++) k3_runner_seq_release(r, &q[i].s);
  return rc;
}

static int res_alloc(res_t *o, int64_t V, size_t nreg) {
  memset(o, 0, sizeof *o);
  o->pos = malloc((size_t)(NP * V) * 4);
  o->full = malloc((size_t)V * 4);
  o->split = malloc((size_t)V * 4);
  o->state = calloc(nreg, sizeof *o->state);
  o->state_n = calloc(nreg, sizeof *o->state_n);
  return o->pos && o->full && o->split && o->state && o->state_n ? 0 : K3_ENOMEM;
}

static void res_free(res_t *o, size_t nreg) {
  for (size_t i = 0; o->state && i < nreg; i++) free(o->state[i]);
  free(o->state);
  free(o->state_n);
  free(o->pos);
  free(o->full);
  free(o->split);
}

static void report(const char *name, const res_t *g, const res_t *c, int64_t V,
                   const k3_manifest_t *man) {
  double pe[NP];
  for (int t = 0; t < NP; t++) {
    pe[t] = rel_err(g->pos + t * V, c->pos + t * V, V);
    worst(pe[t]);
  }
  double last70 = pe[NP - 1], last9 = pe[k_len[0] - 1];
  qsort(pe, NP, sizeof *pe, cmp_dbl);
  printf("RESULT %-16s prefill logits median %.3e p90 %.3e max %.3e (last 9: %.3e, last 70: %.3e)\n",
         name, pe[NP / 2], pe[(int)(0.9 * (NP - 1))], pe[NP - 1], last9, last70);
  printf("RESULT %-16s state", name);
  for (size_t i = 0; i < man->n; i++) {
    if (!g->state[i] || !c->state[i] || g->state_n[i] != c->state_n[i]) continue;
    double e = rel_err(g->state[i], c->state[i], g->state_n[i]);
    worst(e);
    printf(" %s %.2e", man->regions[i].name, e);
  }
  printf("\n");
  double ef = rel_err(g->full, c->full, V), es = rel_err(g->split, c->split, V);
  worst(ef);
  worst(es);
  printf("RESULT %-16s split: own %.3e; prefill(100) vs ref %.3e; prefill(96)+4 vs ref %.3e\n", name,
         rel_err(g->split, g->full, V), ef, es);
  fflush(stdout);
}

int main(int argc, char **argv) {
  const char *model = NULL, *preset = NULL, *sconfig = NULL, *backend = "cuda", *exps = NULL;
  bool dev_synth = false;
  bool expect_zero = false;
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  double budget = 0;
  k3_flag_t flags[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "checkpoint directory (k3pd-mkckpt)", false},
      {"preset", K3_FLAG_STR, &preset, "NAME", "synthetic weights of a built-in config (small ones)", false},
      {"synthetic-config", K3_FLAG_STR, &sconfig, "FILE", "synthetic weights of a config.json, generated in memory on every CPU", false},
      {"device-synth", K3_FLAG_BOOL, &dev_synth, NULL, "with --synthetic-config: generate the weights on the GPU (k3_runner_init_synth) and give cpu-fast a host copy (seconds instead of minutes)", false},
      {"expect-zero", K3_FLAG_BOOL, &expect_zero, NULL, "fail unless every figure vs the reference is 0", false},
      {"backend", K3_FLAG_STR, &backend, "NAME", "studied backend (default cuda; cpu = self-test)", false},
      {"threads", K3_FLAG_INT, &threads, "N", "threads of the cpu-fast reference (default: CPUs)", false},
      {"exps", K3_FLAG_STR, &exps, "LIST", "comma-separated experiments (default: all, in order)", false},
      {"budget-s", K3_FLAG_DOUBLE, &budget, "S", "start no experiment after S seconds (0: no limit)", false},
  };
  k3_flags_info_t info = {"k3k-gpu-opdiff", "Op-by-op precision study of a runner backend vs cpu-fast.", NULL};
  char err[512] = "";
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc || (model != NULL) + (preset != NULL) + (sconfig != NULL) != 1 || (dev_synth && !sconfig)) {
    fprintf(stderr, "k3k-gpu-opdiff: %s\n",
            rc ? err : "give exactly one of --model DIR, --preset NAME or --synthetic-config FILE");
    return 2;
  }
  k3k_backend_t *be = k3k_backend_get(backend), *ref = k3k_backend_get("cpu-fast");
  if (!be || !ref) {
    printf("SKIP: backend %s unavailable\n", backend);
    return 77;
  }
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  uint64_t t0 = k3_now_ns();
  if (model) {
    rc = k3_weights_open_dir(model, &cfg, &w, err, sizeof err);
  } else if (sconfig) {
    k3_weights_synth_opts_t so = {.threads = threads, .progress = true};
    rc = k3_model_config_load(sconfig, &cfg, err, sizeof err);
    if (!rc && !dev_synth) rc = k3_weights_synth_opts(&cfg, 1, &so, &w, err, sizeof err);
  } else {
    const char *json = k3_model_config_preset(preset);
    rc = json ? k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err) : K3_EINVAL;
    if (!json) snprintf(err, sizeof err, "unknown preset '%s' (known: %s)", preset,
                        k3_model_config_preset_names());
    if (!rc) rc = k3_weights_synth_opts(&cfg, 1, NULL, &w, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "k3k-gpu-opdiff: weights: %s (%s)\n", err, k3_strerror(rc));
    return 2;
  }
  k3_runner_t *cr = NULL, *gr = NULL;
  if (dev_synth) { /* same options as new_runner: 64 pages, 4 slots, batch 4, 512-token chunks */
    k3_runner_opts_t o;
    grunner_opts(&o, backend, threads, 64, 4, 4, 512);
    rc = k3_runner_init_synth(&cfg, 1, 0, &o, &gr, err, sizeof err);
    if (!rc) {
      k3_runner_set_graphs(gr, false);
      grunner_opts(&o, "cpu-fast", threads, 64, 4, 4, 512);
      rc = k3_runner_init_copy(gr, &o, &cr, err, sizeof err);
    }
    if (rc) {
      fprintf(stderr, "k3k-gpu-opdiff: device-synth runners: %s (%s)\n", err, k3_strerror(rc));
      k3_runner_free(gr);
      return 2;
    }
  } else if (new_runner(w, "cpu-fast", threads, &cr) || new_runner(w, backend, threads, &gr)) {
    k3_runner_free(cr);
    k3_weights_free(w);
    return 2;
  }
  const int64_t V = k3_runner_vocab(cr);
  const k3_manifest_t *man = k3_runner_manifest(cr);
  res_t c, g;
  rc = res_alloc(&c, V, man->n);
  if (!rc) rc = res_alloc(&g, V, man->n);
  if (!rc) rc = run_workload(cr, &c, false);
  printf("reference workload done (%.1f s since start)\n", (double)(k3_now_ns() - t0) / 1e9);
  if (!rc) {
    printf("RESULT %-16s split: own %.3e\n", "cpu-reference", rel_err(c.split, c.full, V));
    rc = od_shadow_install(be, ref, 0, 0, false);
  }
  for (int i = 0; i < N_EXPS && !rc; i++) {
    const exp_t *e = &k_exps[i];
    if (exps && !csv_has(exps, e->name)) continue;
    double el = (double)(k3_now_ns() - t0) / 1e9;
    if (budget > 0 && el > budget) {
      printf("budget: %.0f s elapsed, experiment %s and later not run\n", el, e->name);
      break;
    }
    bool obs = e->fix == 0;
    od_shadow_set(obs ? OD_ALL : e->fix, e->fix, obs);
    uint64_t t1 = k3_now_ns();
    printf("== experiment %s (fix mask 0x%llx)\n", e->name, (unsigned long long)e->fix);
    fflush(stdout);
    for (size_t j = 0; j < man->n; j++) {
      free(g.state[j]);
      g.state[j] = NULL;
    }
    rc = run_workload(gr, &g, obs);
    if (!rc && (rc = od_shadow_error())) fprintf(stderr, "shadow error: %s\n", k3_strerror(rc));
    if (!rc) report(e->name, &g, &c, V, man);
    for (int op = 0; op < K3K_OP_COUNT && !rc; op++) worst(od_shadow_stats()[op].max_rel);
    printf("   (%.1f s)\n", (double)(k3_now_ns() - t1) / 1e9);
  }
  od_shadow_remove();
  res_free(&c, man->n);
  res_free(&g, man->n);
  k3_runner_free(cr); /* first: with --device-synth it was copied from gr and shares its plan */
  k3_runner_free(gr);
  k3_weights_free(w);
  k3k_backends_shutdown();
  if (!rc && expect_zero) {
    printf("%s: largest figure against the reference %.3e\n", g_worst == 0 ? "PASS" : "FAIL", g_worst);
    if (g_worst != 0) rc = 1;
  }
  return rc ? 1 : 0;
}
