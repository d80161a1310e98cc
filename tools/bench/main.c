/* k3pd-bench: load generator for a k3pd cluster (k3pd.v1.Generation/Generate), with an
 * optional monolithic replay through k3pd-generate for comparison and bit-exact verification.
 *
 * main.c parses flags and wires workload.c (what to send), load.c (sending it), mono.c (the
 * replay) and report.c (the table and the JSON line). See docs/perf-cluster.md.
 *
 * Exit status: 0 = every measured request ok (and, with --verify-monolithic, identical to
 * k3pd-generate); 1 = some request failed or differed; 2 = bad flags or setup failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/log.h"
#include "k3pd/model_config.h"
#include "k3pd/tokenizer.h"

static int tokenize_cb(void *ctx, const char *text, uint32_t **ids, size_t *n, char *err, size_t errlen) {
  k3_tok_ids_t v = {0};
  int rc = k3_tok_encode(ctx, text, strlen(text), 0, &v, err, errlen);
  if (rc) {
    free(v.ids);
    return rc;
  }
  *ids = (uint32_t *)v.ids; /* ids are non-negative: same bits */
  *n = v.n;
  return 0;
}

int main(int argc, char **argv) {
  const char *router = NULL, *prompt_len = "16", *output_len = "16", *prompt_file = NULL, *json_path = NULL;
  const char *generate = NULL, *model = NULL, *backend = "cpu", *precision = "fp32", *label = NULL;
  const char *log_level = "warn", *ids_out = NULL, *mono_perf = NULL, *requests_out = NULL;
  int concurrency = 4, max_inflight = 1024, top_k = 0, id_max = 0, timeout_ms = 60000, mono_timeout_ms = 120000;
  int chat_turns = 0, shared_prefix = 0, conversations = 0;
  int64_t requests = 0, warmup = 0, seed = 1, sample_seed = 0;
  double rate = 0, duration = 0, temperature = 0, top_p = 1;
  bool verify = false, ignore_eos = true;
  bn_profile_opts_t po = {.prompts = "16,64,128,256", .batches = "1,2,4,8", .repeats = 4, .decode_output = 32,
                          .chunk = 256, .warmup = 1};
  int64_t pchunk = 256;
  k3_flag_t flags[] = {
      {"router", K3_FLAG_STR, &router, "HOST:PORT", "the router's public address", true},
      {"concurrency", K3_FLAG_INT, &concurrency, "N", "closed loop: requests kept in flight (default 4)", false},
      {"rate", K3_FLAG_DOUBLE, &rate, "R", "open loop: Poisson arrivals at R requests/s (overrides --concurrency)", false},
      {"max-inflight", K3_FLAG_INT, &max_inflight, "N", "open loop: arrivals beyond N in flight are dropped (default 1024)", false},
      {"requests", K3_FLAG_I64, &requests, "N", "measured requests (default 32 unless --duration)", false},
      {"duration", K3_FLAG_DOUBLE, &duration, "S", "send measured requests for S seconds instead of a count", false},
      {"warmup", K3_FLAG_I64, &warmup, "N", "requests sent first and not measured (default 0)", false},
      {"prompt-len", K3_FLAG_STR, &prompt_len, "SPEC", "prompt tokens: N, A..B (uniform) or @FILE (default 16)", false},
      {"output-len", K3_FLAG_STR, &output_len, "SPEC", "max_new_tokens: N, A..B or @FILE (default 16)", false},
      {"prompt-file", K3_FLAG_STR, &prompt_file, "FILE", "text prompts, one per line (instead of random token ids)", false},
      {"id-max", K3_FLAG_INT, &id_max, "N", "random prompt ids are drawn from [0, N) (default: the tokenizer's BPE ids with --model, else 256)", false},
      {"seed", K3_FLAG_I64, &seed, "S", "workload seed: prompt ids and lengths (default 1)", false},
      {"temperature", K3_FLAG_DOUBLE, &temperature, "T", "sampling temperature; 0 = greedy (default 0)", false},
      {"top-p", K3_FLAG_DOUBLE, &top_p, "P", "nucleus mass (default 1 = off)", false},
      {"top-k", K3_FLAG_INT, &top_k, "K", "top-k (default 0 = off)", false},
      {"sample-seed", K3_FLAG_I64, &sample_seed, "S", "request i samples with seed S+i (default 0)", false},
      {"ignore-eos", K3_FLAG_BOOL, &ignore_eos, NULL, "generate exactly the output length (default true; --ignore-eos=false stops at EOS)", false},
      {"timeout-ms", K3_FLAG_INT, &timeout_ms, "MS", "per-request deadline (default 60000)", false},
      {"json", K3_FLAG_STR, &json_path, "FILE", "append the results as one JSON line to FILE", false},
      {"label", K3_FLAG_STR, &label, "NAME", "name of this run in the table and the JSON line", false},
      {"compare-monolithic", K3_FLAG_STR, &generate, "PATH", "replay the measured requests through this k3pd-generate (needs --model)", false},
      {"verify-monolithic", K3_FLAG_BOOL, &verify, NULL, "with --compare-monolithic: fail unless every request's ids equal k3pd-generate's", false},
      {"model", K3_FLAG_STR, &model, "DIR", "checkpoint directory (the cluster's): for the replay, tokenizing text, --id-max", false},
      {"mono-backend", K3_FLAG_STR, &backend, "NAME", "k3pd-generate --backend (default cpu, as the workers)", false},
      {"mono-precision", K3_FLAG_STR, &precision, "P", "k3pd-generate --precision (default fp32)", false},
      {"mono-timeout-ms", K3_FLAG_INT, &mono_timeout_ms, "MS", "deadline of one k3pd-generate run (default 120000)", false},
      {"mono-perf", K3_FLAG_STR, &mono_perf, "FILE", "print TTFT and inter-token latency next to their monolithic twins read from a saved `k3pd-generate --perf [--perf-batch B]` output (prefill; decode step at batch 1 or B = --concurrency)", false},
      {"ids-out", K3_FLAG_STR, &ids_out, "FILE", "write each completed request's prompt and generated ids as k3pd-generate --requests lines (the cluster's tokens as the monolithic run's teacher)", false},
      {"shared-prefix-len", K3_FLAG_INT, &shared_prefix, "N", "every prompt (a chat's first turn) starts with the same N random ids, then its own --prompt-len draw: a shared system prompt (default 0)", false},
      {"chat-turns", K3_FLAG_INT, &chat_turns, "T", "multi-turn chats: turn t > 1 sends the previous turn's prompt + its reply + a new --prompt-len draw; --conversations of them, --concurrency at a time, turns in order (default 0 = independent requests)", false},
      {"conversations", K3_FLAG_INT, &conversations, "C", "with --chat-turns: number of conversations (requests = C x T; default 8)", false},
      {"requests-out", K3_FLAG_STR, &requests_out, "FILE", "write one JSON line per measured request (send time, "
       "lengths, TTFT, end-to-end, longest inter-token gap, Timings)", false},
      {"profile", K3_FLAG_STR, &po.out, "FILE", "measure the cluster's costs in phases and write the k3pd-plan cost "
       "profile to FILE instead of a load run (docs/plan.md)", false},
      {"profile-prefill-metrics", K3_FLAG_STR, &po.prefill_metrics, "LIST", "HOST:PORT,... of the prefill workers' "
       "/metrics: fit from the workers' own pass times and handoff bytes (else from request timings)", false},
      {"profile-decode-metrics", K3_FLAG_STR, &po.decode_metrics, "LIST", "HOST:PORT,... of the decode workers' "
       "/metrics: fit from step times and batch sizes", false},
      {"profile-prompts", K3_FLAG_STR, &po.prompts, "LIST", "prompt lengths of the prefill phase (default "
       "16,64,128,256; the first and last also drive the decode phase)", false},
      {"profile-batches", K3_FLAG_STR, &po.batches, "LIST", "concurrencies of the decode phase (default 1,2,4,8)",
       false},
      {"profile-repeats", K3_FLAG_INT, &po.repeats, "N", "requests per prefill point; decode points send N x "
       "concurrency (default 4)", false},
      {"profile-output", K3_FLAG_INT, &po.decode_output, "N", "output tokens per decode-phase request (default 32)",
       false},
      {"profile-chunk", K3_FLAG_I64, &pchunk, "N", "the prefill workers' --prefill-chunk (default 256)", false},
      {"profile-warmup", K3_FLAG_INT, &po.warmup, "N", "unmeasured rounds of each point before measuring it: a "
       "request per prefill point, concurrency x N per decode point (default 1; CUDA loads a shape's kernels on "
       "its first call)", false},
      {"log-level", K3_FLAG_STR, &log_level, "LEVEL", "error|warn|info|debug (default warn)", false},
  };
  k3_flags_info_t info = {.prog = "k3pd-bench",
                          .summary = "Load generator for a k3pd cluster: closed-loop concurrency or open-loop Poisson "
                                     "rate, prompt/output length distributions, greedy or sampled; reports TTFT, "
                                     "inter-token and end-to-end latency percentiles, tokens/s, errors by status and "
                                     "the router's added latency. Optionally replays the requests through "
                                     "k3pd-generate to compare speed and verify identical tokens."};
  char err[512];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-bench: %s\n", err);
    return 2;
  }
  k3_log_level_t lvl;
  if (k3_log_parse_level(log_level, &lvl)) {
    fprintf(stderr, "k3pd-bench: --log-level: unknown level \"%s\"\n", log_level);
    return 2;
  }
  k3_log_set_level(lvl);
#define BAD(...)                           \
  do {                                     \
    fprintf(stderr, "k3pd-bench: " __VA_ARGS__); \
    fputc('\n', stderr);                   \
    return 2;                              \
  } while (0)
  if (rate < 0) BAD("--rate: must be >= 0");
  if (rate == 0 && concurrency < 1) BAD("--concurrency: must be >= 1");
  if (max_inflight < 1) BAD("--max-inflight: must be >= 1");
  if (duration < 0 || requests < 0 || warmup < 0) BAD("--duration, --requests and --warmup must be >= 0");
  if (duration > 0 && requests > 0) BAD("--duration and --requests are exclusive");
  if (duration == 0 && requests == 0) requests = 32;
  if (temperature < 0 || temperature > 100) BAD("--temperature: must be in [0, 100]");
  if (!(top_p > 0 && top_p <= 1)) BAD("--top-p: must be in (0, 1]");
  if (top_k < 0) BAD("--top-k: must be >= 0");
  if (timeout_ms < 1 || mono_timeout_ms < 1) BAD("--timeout-ms / --mono-timeout-ms: must be >= 1");
  if (verify && !generate) BAD("--verify-monolithic needs --compare-monolithic PATH");
  if (generate && !model) BAD("--compare-monolithic needs --model DIR");
  if (id_max < 0) BAD("--id-max: must be >= 1");
  if (ids_out && prompt_file) BAD("--ids-out needs token-id prompts (not --prompt-file)");
  if (chat_turns < 0 || shared_prefix < 0 || conversations < 0)
    BAD("--chat-turns, --shared-prefix-len and --conversations must be >= 0");
  if ((chat_turns || shared_prefix) && prompt_file) BAD("--chat-turns / --shared-prefix-len need token-id prompts");
  if (chat_turns) {
    if (rate > 0 || duration > 0 || warmup > 0)
      BAD("--chat-turns: closed loop only (no --rate, --duration or --warmup)");
    if (generate) BAD("--chat-turns: no --compare-monolithic (prompts depend on replies); compare --ids-out files");
    if (!conversations) conversations = 8;
    requests = (int64_t)conversations * chat_turns;
  }

  bn_workload_t w = {.seed = (uint64_t)seed, .temperature = temperature, .top_p = top_p, .top_k = top_k,
                     .sample_seed = (uint64_t)sample_seed, .ignore_eos = ignore_eos,
                     .shared_prefix_len = (uint32_t)shared_prefix, .chat_turns = (uint32_t)chat_turns};
  k3_tok_t *tok = NULL;
  int exit_code = 2;
  bn_run_t run = {0};
  bn_mono_t mono;
  bool have_mono = false;
  bn_monoperf_t mperf;
  if (bn_dist_parse(prompt_len, "prompt-len", &w.prompt_len, err, sizeof err) ||
      bn_dist_parse(output_len, "output-len", &w.output_len, err, sizeof err))
    goto fail;
  if (prompt_file && bn_workload_load_texts(&w, prompt_file, err, sizeof err)) goto fail;
  if (mono_perf && bn_monoperf_load(mono_perf, &mperf, err, sizeof err)) goto fail;
  if (model) {
    char path[4096];
    k3_model_config_t cfg;
    snprintf(path, sizeof path, "%s/config.json", model);
    if (k3_model_config_load(path, &cfg, err, sizeof err)) goto fail;
    if (k3_tok_load(model, NULL, &tok, err, sizeof err)) goto fail;
    int32_t n_ranks = k3_tok_n_ranks(tok);
    if (!id_max) id_max = n_ranks < cfg.vocab_size ? n_ranks : (int)cfg.vocab_size;
    if (id_max > cfg.vocab_size) {
      snprintf(err, sizeof err, "--id-max: %d exceeds the model's vocabulary (%lld)", id_max,
               (long long)cfg.vocab_size);
      goto fail;
    }
  }
  w.id_max = id_max ? (uint32_t)id_max : 256;

  if (po.out) {
    if (po.repeats < 1 || po.decode_output < 2 || pchunk < 1 || po.warmup < 0)
      BAD("--profile-repeats >= 1, --profile-output >= 2, --profile-chunk >= 1 and --profile-warmup >= 0 are "
          "required");
    po.router = router;
    po.chunk = pchunk;
    po.timeout_ms = (uint32_t)timeout_ms;
    if (bn_profile_run(&w, &po, err, sizeof err)) goto fail;
    exit_code = 0;
    goto out;
  }
  bn_load_opts_t lo = {.router = router, .concurrency = concurrency, .rate = rate, .max_inflight = max_inflight,
                       .requests = (uint64_t)requests, .duration_s = duration, .warmup = (uint64_t)warmup,
                       .timeout_ms = (uint32_t)timeout_ms, .keep_ids = verify || ids_out || chat_turns};
  if (bn_load_run(&w, &lo, &run, err, sizeof err)) goto fail;
  if (generate) {
    bn_mono_opts_t mo = {.generate = generate, .model = model, .backend = backend, .precision = precision,
                         .timeout_ms = (uint32_t)mono_timeout_ms};
    if (bn_mono_run(&mo, &w, &run, verify, tok ? tokenize_cb : NULL, tok, &mono, err, sizeof err)) goto fail;
    have_mono = true;
  }
  bn_report_in_t in = {.w = &w, .load = &lo, .label = label, .prompt_len_spec = prompt_len,
                       .output_len_spec = output_len, .mono = have_mono ? &mono : NULL, .verified = verify,
                       .mono_perf = mono_perf ? &mperf : NULL};
  bn_report_print(&in, &run);
  bn_report_prefix(&in, &run);
  if (json_path && bn_report_json(&in, &run, json_path, err, sizeof err)) goto fail;
  if (ids_out && bn_report_ids(&w, &run, ids_out, err, sizeof err)) goto fail;
  if (requests_out && bn_report_requests(&run, requests_out, err, sizeof err)) goto fail;
  size_t ok = 0;
  for (size_t i = 0; i < run.n_res; i++) ok += run.res[i].complete;
  exit_code = ok == run.n_res && run.dropped == 0 && run.n_res > 0 ? 0 : 1;
  if (exit_code) fprintf(stderr, "k3pd-bench: %zu of %zu requests did not complete\n", run.n_res - ok, run.n_res);
  if (have_mono && mono.failures) {
    fprintf(stderr, "k3pd-bench: %llu k3pd-generate runs failed\n", (unsigned long long)mono.failures);
    exit_code = 1;
  }
  if (verify && (mono.mismatches || mono.checked != run.n_res)) {
    fprintf(stderr, "k3pd-bench: verification FAILED: %llu of %zu requests differ or were not checked%s%s\n",
            (unsigned long long)(run.n_res - (mono.checked - mono.mismatches)), run.n_res,
            mono.mismatches ? "; first: " : "", mono.mismatches ? mono.first_mismatch : "");
    exit_code = 1;
  }
  goto out;
fail:
  fprintf(stderr, "k3pd-bench: %s\n", err);
out:
  bn_run_free(&run);
  k3_tok_free(tok);
  bn_workload_free(&w);
  return exit_code;
}
