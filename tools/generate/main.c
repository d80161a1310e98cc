/* k3pd-generate: single-process (monolithic) generation from a checkpoint or a synthetic
 * preset, through the model runner. It is the reference the disaggregated cluster must match.
 *
 * Output: one "token <i> <id>" line per generated token on stdout as it is produced, then the
 * final stdout line "ids: <ids separated by spaces>"; a timing summary on stderr. Stop ids:
 * k3_model_config_stop_ids — the config's eos_token_id plus the tokenizer's [EOS] and
 * <|end_of_msg|>/<|im_end|> specials mapped into the vocabulary (the router uses the same
 * rule); --ignore-eos disables stopping.
 * --hold keeps the process (its model and any shared weights) alive after the run until stdin
 * ends, generating again for every line read (scripts/gpu/share.sh).
 * Greedy unless --temperature > 0. The prompt is token ids, text or a chat file (prompt.c: the
 * same tokenizer path as the router). The timing summary gives wall time and the process CPU
 * time of each phase (the CPU figure stays meaningful on a loaded machine).
 * Model flags: the one loader's (k3_load.h: --model / --synthetic / --synthetic-config,
 * --seed-weights, --precision, --gpu, --page-tokens, --share-weights, ...), the same flags and
 * defaults as the workers'. Device: --device NAME (cpu, cpu-fast, cuda; --backend is the older
 * alias). cuda runs bf16 only, so --precision defaults to bf16 there (fp32 elsewhere). Pool
 * sizes default to what the prompt needs (--num-pages/--num-slots/--max-batch 0). --perf adds the model's
 * figures with their ceilings measured in the same run (perf.h): the decode step at batch 1
 * against its weight-read floor (k3_runner_decode_bytes / the backend's measured copy
 * bandwidth), a second prefill of the prompt against its FLOP floor (k3_runner_prefill_flops /
 * the measured bf16 GEMM rate), and with --perf-batch B decode tokens/s at batch B. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3_load.h"
#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/util.h"
#include "k3pd/weights.h"
#include "logits_file.h"
#include "perf.h"
#include "prompt.h"
#include "requests.h"

typedef struct {
  k3_load_opts_t lo; /* the model: the loader's flags */
  const char *prompt_ids, *prompt, *chat, *tokenizer, *logits_out, *requests;
  int max_new, top_k, perf_batch, block_split;
  double temperature, top_p, near_tie;
  int64_t seed;
  bool ignore_eos, all_logits, perf, hold;
} gen_args_t;

/* The model's default stop ids (k3_model_config_stop_ids: the same rule the router uses). */
static bool is_stop(const k3_model_config_t *c, int32_t id) {
  int32_t ids[3];
  int n = k3_model_config_stop_ids(c, ids);
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

static bool stop_id(const k3_runner_t *r, int32_t id) { return is_stop(k3_runner_config(r), id); }

/* --requests FILE: one model load, every request of the file (requests.h). */
static int run_requests(const gen_args_t *a) {
  char err[1024] = "";
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  k3_load_opts_t lo = a->lo;
  int rc = k3_load_config(&lo, &cfg, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-generate: cannot load the model: %s (%s)\n", err, k3_strerror(rc));
    return 1;
  }
  gen_reqs_t q;
  if ((rc = gen_reqs_load(a->requests, a->max_new, (uint64_t)a->seed, cfg.vocab_size, &q, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: %s\n", err);
    return 2;
  }
  if (!lo.num_slots) lo.num_slots = 1;
  if (!lo.max_batch) lo.max_batch = 1;
  if (!lo.num_pages) lo.num_pages = (int)((q.max_total + lo.page_tokens - 1) / lo.page_tokens) + 2;
  k3_runner_t *r = NULL;
  if ((rc = k3_load_model(&lo, &w, &r, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: %s (%s)\n", err, k3_strerror(rc));
    gen_reqs_free(&q);
    return 1;
  }
  k3k_sample_cfg_t sc = {.temperature = (float)a->temperature, .top_k = a->top_k, .top_p = (float)a->top_p};
  rc = gen_reqs_run(r, &q, &sc, a->near_tie, a->block_split, a->ignore_eos ? NULL : stop_id);
  k3_runner_free(r);
  k3_weights_free(w);
  gen_reqs_free(&q);
  return rc;
}

/* CPU time of the whole process (all threads), ns. */
static uint64_t cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts)) return 0;
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
static double median_of(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* --hold: the same generation again into `seq` (released first), printing only its "ids:"
 * line. Returns 0 or 1 (message printed). */
static int generate_again(k3_runner_t *r, const gen_args_t *a, const int32_t *prompt, size_t n_prompt,
                          int64_t total, k3_seq_t *seq, float *logits, int32_t *out_ids) {
  char err[1024];
  const int64_t V = k3_runner_vocab(r);
  k3_runner_seq_release(r, seq);
  int rc = k3_runner_seq_reserve(r, seq, total);
  k3_prefill_item_t it = {seq, prompt, (int64_t)n_prompt, logits, false};
  if (rc || (rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: again: %s\n", rc == K3_ECAPACITY ? "cannot reserve state" : err);
    return 1;
  }
  k3k_sample_cfg_t sc = {.temperature = (float)a->temperature, .top_k = a->top_k,
                         .top_p = (float)a->top_p, .seed = (uint64_t)a->seed};
  int n = 0;
  for (int step = 0; step < a->max_new; step++) {
    int32_t id;
    sc.step = (uint64_t)step;
    if (k3k_sample_row(logits, V, &sc, &id)) return 1;
    out_ids[n++] = id;
    if ((!a->ignore_eos && is_stop(k3_runner_config(r), id)) || step + 1 == a->max_new) break;
    k3_decode_item_t d = {.seq = seq, .token = id, .logits = logits};
    if (k3_runner_decode_step(r, &d, 1, err, sizeof err)) {
      fprintf(stderr, "k3pd-generate: again: decode: %s\n", err);
      return 1;
    }
  }
  printf("ids:");
  for (int i = 0; i < n; i++) printf(" %d", out_ids[i]);
  printf("\n");
  fflush(stdout);
  return 0;
}

static int run(const gen_args_t *a) {
  char err[1024] = "";
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  k3_load_opts_t lo = a->lo;
  int rc = k3_load_config(&lo, &cfg, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-generate: cannot load the model: %s (%s)\n", err, k3_strerror(rc));
    return 1;
  }
  /* the prompt before loading or synthesising weights: a bad prompt fails fast */
  int32_t *prompt = NULL;
  size_t n_prompt = 0;
  gen_prompt_src_t ps = {a->prompt_ids, a->prompt, a->chat, a->tokenizer ? a->tokenizer : lo.model_dir};
  if ((rc = gen_prompt_build(&ps, &cfg, &prompt, &n_prompt, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: %s\n", err);
    return 2;
  }
  /* pools: what this prompt needs unless given (--num-pages/--num-slots/--max-batch 0) */
  int64_t total = (int64_t)n_prompt + a->max_new;
  const int64_t pt = lo.page_tokens;
  if (!lo.num_slots) lo.num_slots = 1 + (a->perf ? 1 + a->perf_batch : 0); /* perf.h's sequences */
  if (!lo.max_batch) lo.max_batch = a->perf && a->perf_batch > 1 ? a->perf_batch : 1;
  if (!lo.num_pages) {
    lo.num_pages = (int)((total + pt - 1) / pt) + 1;
    if (a->perf) { /* the second prefill and the batch figure's sequences (perf.h) */
      lo.num_pages += (int)(((int64_t)n_prompt + 1 + pt - 1) / pt) + 2;
      lo.num_pages += a->perf_batch * (int)((gen_perf_batch_prompt((int64_t)n_prompt) + 18 + pt - 1) / pt + 2);
    }
  }
  k3_runner_t *r = NULL;
  uint64_t ts = k3_now_ns();
  if ((rc = k3_load_model(&lo, &w, &r, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: %s (%s)\n", err, k3_strerror(rc));
    free(prompt);
    return 1;
  }
  const k3_runner_opts_t o = *k3_runner_opts(r);
  fprintf(stderr, "k3pd-generate: runner ready on %s (%.1f s)\n", o.backend, (double)(k3_now_ns() - ts) / 1e9);
  const int64_t V = k3_runner_vocab(r);
  int32_t *pages = calloc((size_t)o.num_pages, sizeof *pages);
  int32_t *out_ids = calloc((size_t)(a->max_new > 0 ? a->max_new : 1), sizeof *out_ids);
  double *step_s = calloc((size_t)(a->max_new > 0 ? a->max_new : 1), sizeof *step_s);
  int64_t lrows = a->all_logits ? (int64_t)n_prompt : 1;
  float *logits = malloc((size_t)(lrows * V) * sizeof(float));
  k3_seq_t seq = {.slot = -1, .pages = pages, .cap_pages = o.num_pages};
  lf_t lf = {0};
  int n_out = 0;
  uint64_t t0 = 0, t1 = 0, t2 = 0, c0 = 0, c1 = 0, c2 = 0;
  if (!pages || !out_ids || !step_s || !logits) {
    rc = 1;
    goto done_r;
  }
  if ((rc = k3_runner_seq_reserve(r, &seq, total))) {
    fprintf(stderr, "k3pd-generate: cannot reserve state: %s\n", k3_strerror(rc));
    rc = 1;
    goto done_r;
  }
  if (a->logits_out && lf_open(&lf, a->logits_out, (uint64_t)V)) {
    fprintf(stderr, "k3pd-generate: cannot write %s\n", a->logits_out);
    rc = 1;
    goto done_r;
  }
  k3k_sample_cfg_t sc = {.temperature = (float)a->temperature, .top_k = a->top_k,
                         .top_p = (float)a->top_p, .seed = (uint64_t)a->seed};
  t0 = k3_now_ns();
  c0 = cpu_ns();
  k3_prefill_item_t it = {&seq, prompt, (int64_t)n_prompt, logits, a->all_logits};
  if ((rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: prefill: %s\n", err);
    rc = 1;
    goto done_r;
  }
  t1 = k3_now_ns();
  c1 = cpu_ns();
  const float *last = logits + (lrows - 1) * V;
  if (lf.fp && lf_write_rows(&lf, logits, (uint64_t)lrows)) rc = 1;
  for (int step = 0; step < a->max_new && !rc; step++) {
    int32_t id;
    sc.step = (uint64_t)step;
    if ((rc = k3k_sample_row(last, V, &sc, &id))) {
      fprintf(stderr, "k3pd-generate: sampling failed: %s\n", k3_strerror(rc));
      rc = 1;
      break;
    }
    out_ids[n_out++] = id;
    printf("token %d %d\n", step, id);
    fflush(stdout);
    if ((!a->ignore_eos && is_stop(k3_runner_config(r), id)) || step + 1 == a->max_new) break;
    k3_decode_item_t d = {.seq = &seq, .token = id, .logits = logits};
    uint64_t ts = k3_now_ns();
    if ((rc = k3_runner_decode_step(r, &d, 1, err, sizeof err))) {
      fprintf(stderr, "k3pd-generate: decode: %s\n", err);
      rc = 1;
      break;
    }
    step_s[step] = (double)(k3_now_ns() - ts) / 1e9;
    last = logits;
    if (lf.fp && lf_write_rows(&lf, logits, 1)) rc = 1;
  }
  t2 = k3_now_ns();
  c2 = cpu_ns();
  if (lf.fp && lf_close(&lf)) {
    fprintf(stderr, "k3pd-generate: cannot write %s\n", a->logits_out);
    rc = 1;
  }
  if (!rc) {
    double pf = (double)(t1 - t0) / 1e9, dc = (double)(t2 - t1) / 1e9;
    int steps = n_out > 0 ? n_out - 1 : 0;
    fprintf(stderr,
            "k3pd-generate: %s %s %s: prefill %zu tokens in %.3f s (%.1f tokens/s); decode %d "
            "steps in %.3f s (%.1f tokens/s); cpu time prefill %.3f s, decode %.3f s\n",
            k3_model_type_name(cfg.type), lo.precision, o.backend ? o.backend : "cpu", n_prompt, pf,
            pf > 0 ? (double)n_prompt / pf : 0.0, steps, dc, dc > 0 ? steps / dc : 0.0,
            (double)(c1 - c0) / 1e9, (double)(c2 - c1) / 1e9);
    gen_ceilings_t ceil = {0};
    if (a->perf && gen_perf_ceilings(o.backend, &ceil))
      fprintf(stderr, "k3pd-generate: perf: a ceiling could not be measured on %s\n", o.backend);
    if (a->perf && steps > 0) {
      double bytes = k3_runner_decode_bytes(r, 1), bw = ceil.copy_bw;
      /* the mean includes first-use costs (graph capture, workspace growth); the median of the
       * runner's step times is the steady state a serving loop sees */
      double step = median_of(step_s, steps), fl = bw > 0 ? bytes / bw : 0;
      k3_runner_stats_t st;
      k3_runner_get_stats(r, &st);
      fprintf(stderr,
              "k3pd-generate: perf: decode batch 1 %.3f ms/step (median of %d runner steps; mean "
              "%.3f ms with sampling and first-use costs) vs weight-read floor %.3f ms (%.3f "
              "GB/token / %.0f GB/s copy) = %.2fx; graphs: %llu replays, %llu captures, %llu "
              "eager steps\n",
              step * 1e3, steps, dc / steps * 1e3, fl * 1e3, bytes / 1e9, bw / 1e9,
              fl > 0 ? step / fl : 0.0,
              (unsigned long long)st.graph_replays, (unsigned long long)st.graph_captures,
              (unsigned long long)st.eager_steps);
    }
    if (a->perf && gen_perf_prefill(r, prompt, (int64_t)n_prompt, &ceil)) rc = 1;
    if (a->perf && a->perf_batch > 0 && !rc &&
        gen_perf_batch(r, prompt, (int64_t)n_prompt, a->perf_batch, 10, &ceil))
      rc = 1;
    printf("ids:");
    for (int i = 0; i < n_out; i++) printf(" %d", out_ids[i]);
    printf("\n");
    fflush(stdout);
  }
  /* --hold: keep the model (and shared weights) until stdin ends; every line read runs the
   * same generation again */
  char line[256];
  while (!rc && a->hold && fgets(line, sizeof line, stdin))
    rc = generate_again(r, a, prompt, n_prompt, total, &seq, logits, out_ids);
done_r:
  if (lf.fp) lf_close(&lf);
  k3_runner_seq_release(r, &seq);
  free(pages);
  free(out_ids);
  free(step_s);
  free(logits);
  k3_runner_free(r);
  free(prompt);
  k3_weights_free(w);
  return rc;
}

int main(int argc, char **argv) {
  gen_args_t a = {.max_new = 16, .temperature = 0.0, .top_p = 1.0, .seed = 0, .near_tie = 0.02};
  k3_load_opts_default(&a.lo);
  a.lo.device_alias = true; /* --device NAME, --backend its alias */
  a.lo.num_pages = a.lo.num_slots = a.lo.max_batch = 0; /* what the prompt needs */
  k3_flag_t own[] = {
      {"prompt-ids", K3_FLAG_STR, &a.prompt_ids, "IDS", "prompt as comma-separated token ids", false},
      {"prompt", K3_FLAG_STR, &a.prompt, "TEXT", "raw prompt text, encoded by the tokenizer (specials disallowed)", false},
      {"chat", K3_FLAG_STR, &a.chat, "FILE", "JSON conversation (messages array or {\"messages\":[...],...}), rendered with the chat template as the router does", false},
      {"tokenizer", K3_FLAG_STR, &a.tokenizer, "DIR", "directory with tiktoken.model + tokenizer_config.json (default: --model DIR)", false},
      {"max-new-tokens", K3_FLAG_INT, &a.max_new, "N", "tokens to generate (default 16)", false},
      {"temperature", K3_FLAG_DOUBLE, &a.temperature, "T", "sampling temperature; 0 or unset = greedy", false},
      {"top-p", K3_FLAG_DOUBLE, &a.top_p, "P", "nucleus sampling mass (default 1 = off)", false},
      {"top-k", K3_FLAG_INT, &a.top_k, "K", "keep the K most likely tokens (default 0 = off)", false},
      {"seed", K3_FLAG_I64, &a.seed, "S", "sampling seed (default 0)", false},
      {"ignore-eos", K3_FLAG_BOOL, &a.ignore_eos, NULL, "do not stop on the model's stop ids", false},
      {"logits-out", K3_FLAG_STR, &a.logits_out, "FILE", "write float32 logits of every computed position (format: docs/model-runner.md)", false},
      {"all-logits", K3_FLAG_BOOL, &a.all_logits, NULL, "with --logits-out: also every prompt position", false},
      {"perf", K3_FLAG_BOOL, &a.perf, NULL, "also print the decode step time against its weight-read floor and a second prefill of the prompt against its FLOP floor (ceilings measured in the same run)", false},
      {"hold", K3_FLAG_BOOL, &a.hold, NULL, "after generating, keep the model loaded (and --share-weights served) until stdin ends; each line read generates again (prints another 'ids:' line)", false},
      {"requests", K3_FLAG_STR, &a.requests, "FILE", "run every request of FILE in this process (one model load), optionally teacher-forced on another engine's tokens: lines PROMPT_IDS[<TAB>TEACHER_IDS[<TAB>MAX_NEW[<TAB>SEED]]]; prints per-request ids and every divergence with its logit gap (tools/generate/requests.h)", false},
      {"near-tie", K3_FLAG_DOUBLE, &a.near_tie, "REL", "with --requests: a divergence whose logit gap is at most REL of the top logit is a near tie (default 0.02)", false},
      {"block-split", K3_FLAG_INT, &a.block_split, "B", "with --requests: prefill each prompt in two passes split at its last multiple of B before the end, as a cluster with the prefix cache on computes a miss (B = the decode worker's cache block, 64 by default; docs/gpu-cluster.md); default 0: one pass", false},
      {"perf-batch", K3_FLAG_INT, &a.perf_batch, "B", "with --perf: also decode tokens/s at batch B (B sequences prefilled with the prompt's first <= 128 tokens, 10 timed steps) against its weight-read floor (default 0: off)", false},
  };
  k3_flag_t flags[K3_LOAD_NFLAGS + sizeof own / sizeof own[0]];
  size_t nflags = k3_load_flags(&a.lo, flags);
  memcpy(flags + nflags, own, sizeof own);
  nflags += sizeof own / sizeof own[0];
  k3_flags_info_t info = {"k3pd-generate",
                          "Monolithic generation through the model runner; final stdout line: "
                          "'ids: <generated ids>'.",
                          NULL};
  char err[512];
  int rc = k3_flags_parse(&info, flags, nflags, argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (!rc) rc = k3_load_check(&a.lo, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-generate: %s\n", err);
    return 2;
  }
  if (!!a.prompt_ids + !!a.prompt + !!a.chat + !!a.requests != 1) {
    fprintf(stderr, "k3pd-generate: give exactly one of --prompt-ids, --prompt, --chat or --requests\n");
    return 2;
  }
  if (a.requests && (a.perf || a.hold || a.logits_out)) {
    fprintf(stderr, "k3pd-generate: --requests does not combine with --perf, --hold or --logits-out\n");
    return 2;
  }
  if (a.block_split < 0 || (a.block_split && !a.requests)) {
    fprintf(stderr, "k3pd-generate: --block-split must be >= 0 and goes with --requests\n");
    return 2;
  }
  if (!(a.near_tie >= 0)) {
    fprintf(stderr, "k3pd-generate: --near-tie must be >= 0\n");
    return 2;
  }
  if ((a.prompt || a.chat) && !gen_prompt_have_tokenizer()) {
    fprintf(stderr, "k3pd-generate: %s needs the tokenizer, which this build does not include "
                    "(K3PD_KERNELS_ONLY); pass token ids with --prompt-ids\n",
            a.prompt ? "--prompt" : "--chat");
    return 2;
  }
  if (a.max_new < 0) {
    fprintf(stderr, "k3pd-generate: --max-new-tokens must be >= 0\n");
    return 2;
  }
  if (a.perf_batch < 0 || a.perf_batch > 4096 || (a.perf_batch > 0 && !a.perf)) {
    fprintf(stderr, "k3pd-generate: --perf-batch must be 0..4096 and needs --perf\n");
    return 2;
  }
  if (a.all_logits && !a.logits_out) {
    fprintf(stderr, "k3pd-generate: --all-logits needs --logits-out FILE\n");
    return 2;
  }
  rc = a.requests ? run_requests(&a) : run(&a);
  k3k_backends_shutdown();
  return rc;
}
