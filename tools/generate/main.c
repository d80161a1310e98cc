/* k3pd-generate: single-process (monolithic) generation from a checkpoint or a synthetic
 * preset, through the model runner. It is the reference the disaggregated cluster must match.
 *
 * Output: one "token <i> <id>" line per generated token on stdout as it is produced, then the
 * final stdout line "ids: <ids separated by spaces>"; a timing summary on stderr. Stop ids:
 * k3_model_config_stop_ids — the config's eos_token_id plus the tokenizer's [EOS] and
 * <|end_of_msg|>/<|im_end|> specials mapped into the vocabulary (the router uses the same
 * rule); --ignore-eos disables stopping.
 * Greedy unless --temperature > 0. The prompt is token ids, text or a chat file (prompt.c: the
 * same tokenizer path as the router). The timing summary gives wall time and the process CPU
 * time of each phase (the CPU figure stays meaningful on a loaded machine).
 * Device: --device NAME (cpu, cpu-fast, cuda; --backend is the older alias). cuda runs bf16
 * only, so --precision defaults to bf16 there (fp32 elsewhere). --perf adds the model's
 * figures with their ceilings measured in the same run (perf.h): the decode step at batch 1
 * against its weight-read floor (k3_runner_decode_bytes / the backend's measured copy
 * bandwidth), a second prefill of the prompt against its FLOP floor (k3_runner_prefill_flops /
 * the measured bf16 GEMM rate), and with --perf-batch B decode tokens/s at batch B. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/util.h"
#include "k3pd/weights.h"
#include "logits_file.h"
#include "perf.h"
#include "prompt.h"

typedef struct {
  const char *model, *prompt_ids, *prompt, *chat, *tokenizer, *precision, *backend, *logits_out;
  const char *device;
  const char *synthetic, *synthetic_config;
  int max_new, top_k, threads, page_tokens, seed_weights, verify_synth, perf_batch, prefill_chunk;
  double temperature, top_p;
  int64_t seed;
  bool ignore_eos, all_logits, perf, host_synth;
} gen_args_t;

/* The model's default stop ids (k3_model_config_stop_ids: the same rule the router uses). */
static bool is_stop(const k3_model_config_t *c, int32_t id) {
  int32_t ids[3];
  int n = k3_model_config_stop_ids(c, ids);
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
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

static int run(const gen_args_t *a) {
  char err[1024] = "";
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  int rc;
  if (a->synthetic_config) {
    /* a config.json of real per-layer shapes with fewer layers/experts (tests/gpu/data/) */
    rc = k3_model_config_load(a->synthetic_config, &cfg, err, sizeof err);
  } else if (a->synthetic) {
    const char *json = k3_model_config_preset(a->synthetic);
    if (!json) {
      fprintf(stderr, "k3pd-generate: unknown --synthetic preset '%s' (known: %s)\n", a->synthetic,
              k3_model_config_preset_names());
      return 2;
    }
    rc = k3_model_config_parse(json, strlen(json), &cfg, err, sizeof err);
  } else {
    rc = k3_weights_open_dir(a->model, &cfg, &w, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "k3pd-generate: cannot load the model: %s (%s)\n", err, k3_strerror(rc));
    return 1;
  }
  /* the prompt before synthesising weights: a bad prompt fails fast */
  int32_t *prompt = NULL;
  size_t n_prompt = 0;
  gen_prompt_src_t ps = {a->prompt_ids, a->prompt, a->chat, a->tokenizer ? a->tokenizer : a->model};
  if ((rc = gen_prompt_build(&ps, &cfg, &prompt, &n_prompt, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: %s\n", err);
    k3_weights_free(w);
    return 2;
  }
  /* synthetic weights: on the GPU for cuda (k3_runner_init_synth: the same bytes in seconds, no
   * host copy), else on every CPU (k3_weights_synth_opts) */
  const bool synth = a->synthetic || a->synthetic_config;
  const bool dev_synth = synth && !strcmp(a->backend, "cuda") && !a->host_synth;
  k3_weights_synth_opts_t so = {.threads = 0, .progress = true}; /* every CPU; GiB lines */
  uint64_t ts = k3_now_ns();
  if (synth && !dev_synth && (rc = k3_weights_synth_opts(&cfg, (uint64_t)a->seed_weights, &so, &w, err, sizeof err))) {
    fprintf(stderr, "k3pd-generate: cannot synthesise weights: %s (%s)\n", err, k3_strerror(rc));
    free(prompt);
    return 1;
  }
  if (synth && !dev_synth)
    fprintf(stderr, "k3pd-generate: synthetic weights ready (%.1f s)\n", (double)(k3_now_ns() - ts) / 1e9);
  k3_runner_opts_t o;
  k3_runner_opts_default(&o);
  if (!strcmp(a->precision, "bf16"))
    o.precision = K3_RUNNER_BF16;
  else if (strcmp(a->precision, "fp32")) {
    fprintf(stderr, "k3pd-generate: --precision must be fp32 or bf16, not '%s'\n", a->precision);
    rc = 2;
    goto done_w;
  }
  o.backend = a->backend;
  o.threads = a->threads;
  o.page_tokens = a->page_tokens;
  o.prefill_chunk_tokens = a->prefill_chunk;
  o.num_slots = 1;
  o.max_batch_seqs = 1;
  int64_t total = (int64_t)n_prompt + a->max_new;
  const int64_t pt = a->page_tokens > 0 ? a->page_tokens : 1;
  o.num_pages = (int)((total + pt - 1) / pt) + 1;
  if (a->perf) { /* the second prefill and the batch figure's sequences (perf.h) */
    o.num_slots += 1 + a->perf_batch;
    o.max_batch_seqs = a->perf_batch > 1 ? a->perf_batch : 1;
    o.num_pages += (int)(((int64_t)n_prompt + 1 + pt - 1) / pt) + 2;
    o.num_pages += a->perf_batch * (int)((gen_perf_batch_prompt((int64_t)n_prompt) + 18 + pt - 1) / pt + 2);
  }
  k3_runner_t *r = NULL;
  ts = k3_now_ns();
  rc = dev_synth ? k3_runner_init_synth(&cfg, (uint64_t)a->seed_weights, a->verify_synth, &o, &r,
                                        err, sizeof err)
                 : k3_runner_init(w, &o, &r, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-generate: %s (%s)\n", err, k3_strerror(rc));
    rc = 1;
    goto done_w;
  }
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
    k3_decode_item_t d = {&seq, id, logits};
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
            k3_model_type_name(cfg.type), a->precision, o.backend ? o.backend : "cpu", n_prompt, pf,
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
  }
done_r:
  if (lf.fp) lf_close(&lf);
  k3_runner_seq_release(r, &seq);
  free(pages);
  free(out_ids);
  free(step_s);
  free(logits);
  k3_runner_free(r);
done_w:
  free(prompt);
  k3_weights_free(w);
  return rc;
}

int main(int argc, char **argv) {
  gen_args_t a = {.max_new = 16, .threads = 1,
                  .page_tokens = 64, .prefill_chunk = 256, .seed_weights = 1, .temperature = 0.0, .top_p = 1.0,
                  .seed = 0};
  k3_flag_t flags[] = {
      {"model", K3_FLAG_STR, &a.model, "DIR", "checkpoint directory (config.json + safetensors)", false},
      {"synthetic", K3_FLAG_STR, &a.synthetic, "PRESET", "use in-memory synthetic weights of a preset (tiny, tiny-48b, ...) instead of --model", false},
      {"synthetic-config", K3_FLAG_STR, &a.synthetic_config, "FILE", "use in-memory synthetic weights of the config.json in FILE instead of --model", false},
      {"seed-weights", K3_FLAG_INT, &a.seed_weights, "N", "seed of the synthetic weights (default 1)", false},
      {"host-synth", K3_FLAG_BOOL, &a.host_synth, NULL, "with --device cuda: generate synthetic weights on the CPUs and upload them (default: on the GPU, same bytes)", false},
      {"verify-synth", K3_FLAG_INT, &a.verify_synth, "KIB", "GPU-generated weights: compare two KIB-KiB slices of every tensor with the host generator (-1: all)", false},
      {"prompt-ids", K3_FLAG_STR, &a.prompt_ids, "IDS", "prompt as comma-separated token ids", false},
      {"prompt", K3_FLAG_STR, &a.prompt, "TEXT", "raw prompt text, encoded by the tokenizer (specials disallowed)", false},
      {"chat", K3_FLAG_STR, &a.chat, "FILE", "JSON conversation (messages array or {\"messages\":[...],...}), rendered with the chat template as the router does", false},
      {"tokenizer", K3_FLAG_STR, &a.tokenizer, "DIR", "directory with tiktoken.model + tokenizer_config.json (default: --model DIR)", false},
      {"max-new-tokens", K3_FLAG_INT, &a.max_new, "N", "tokens to generate (default 16)", false},
      {"temperature", K3_FLAG_DOUBLE, &a.temperature, "T", "sampling temperature; 0 or unset = greedy", false},
      {"top-p", K3_FLAG_DOUBLE, &a.top_p, "P", "nucleus sampling mass (default 1 = off)", false},
      {"top-k", K3_FLAG_INT, &a.top_k, "K", "keep the K most likely tokens (default 0 = off)", false},
      {"seed", K3_FLAG_I64, &a.seed, "S", "sampling seed (default 0)", false},
      {"precision", K3_FLAG_STR, &a.precision, "fp32|bf16", "numeric mode (default bf16 on cuda, else fp32)", false},
      {"device", K3_FLAG_STR, &a.device, "NAME", "where the model runs: cpu (reference), cpu-fast or cuda (bf16 only) (default cpu)", false},
      {"backend", K3_FLAG_STR, &a.backend, "NAME", "alias of --device", false},
      {"threads", K3_FLAG_INT, &a.threads, "N", "threads of the cpu-fast backend (default 1)", false},
      {"page-tokens", K3_FLAG_INT, &a.page_tokens, "N", "tokens per MLA cache page (default 64)", false},
      {"prefill-chunk", K3_FLAG_INT, &a.prefill_chunk, "N", "prompt tokens per forward pass, rounded up to a multiple of 64 (default 256, as the workers' --prefill-chunk)", false},
      {"ignore-eos", K3_FLAG_BOOL, &a.ignore_eos, NULL, "do not stop on the model's stop ids", false},
      {"logits-out", K3_FLAG_STR, &a.logits_out, "FILE", "write float32 logits of every computed position (format: docs/model-runner.md)", false},
      {"all-logits", K3_FLAG_BOOL, &a.all_logits, NULL, "with --logits-out: also every prompt position", false},
      {"perf", K3_FLAG_BOOL, &a.perf, NULL, "also print the decode step time against its weight-read floor and a second prefill of the prompt against its FLOP floor (ceilings measured in the same run)", false},
      {"perf-batch", K3_FLAG_INT, &a.perf_batch, "B", "with --perf: also decode tokens/s at batch B (B sequences prefilled with the prompt's first <= 128 tokens, 10 timed steps) against its weight-read floor (default 0: off)", false},
  };
  k3_flags_info_t info = {"k3pd-generate",
                          "Monolithic generation through the model runner; final stdout line: "
                          "'ids: <generated ids>'.",
                          NULL};
  char err[256];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-generate: %s\n", err);
    return 2;
  }
  if (a.device && a.backend && strcmp(a.device, a.backend)) {
    fprintf(stderr, "k3pd-generate: --device %s and --backend %s disagree (--backend is an alias of "
                    "--device: give one)\n", a.device, a.backend);
    return 2;
  }
  if (!a.device) a.device = a.backend ? a.backend : "cpu";
  a.backend = a.device;
  if (strcmp(a.device, "cpu") && strcmp(a.device, "cpu-fast") && strcmp(a.device, "cuda")) {
    fprintf(stderr, "k3pd-generate: unknown --device '%s' (expected cpu, cpu-fast or cuda)\n",
            a.device);
    return 2;
  }
  if (!a.precision) a.precision = strcmp(a.device, "cuda") ? "fp32" : "bf16";
  if (!!a.prompt_ids + !!a.prompt + !!a.chat != 1) {
    fprintf(stderr, "k3pd-generate: give exactly one of --prompt-ids, --prompt or --chat\n");
    return 2;
  }
  if ((a.prompt || a.chat) && !gen_prompt_have_tokenizer()) {
    fprintf(stderr, "k3pd-generate: %s needs the tokenizer, which this build does not include "
                    "(K3PD_KERNELS_ONLY); pass token ids with --prompt-ids\n",
            a.prompt ? "--prompt" : "--chat");
    return 2;
  }
  if ((a.model != NULL) + (a.synthetic != NULL) + (a.synthetic_config != NULL) != 1) {
    fprintf(stderr, "k3pd-generate: give exactly one of --model DIR, --synthetic PRESET or "
                    "--synthetic-config FILE\n");
    return 2;
  }
  if (a.max_new < 0 || a.page_tokens <= 0 || a.threads <= 0 || a.prefill_chunk <= 0 ||
      a.prefill_chunk > (1 << 20)) {
    fprintf(stderr, "k3pd-generate: --max-new-tokens must be >= 0, --page-tokens and --threads > 0, "
                    "--prefill-chunk 1..1048576\n");
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
  rc = run(&a);
  k3k_backends_shutdown();
  return rc;
}
