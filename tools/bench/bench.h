/* k3pd-bench internals: the workload description, per-request records and the pieces that
 * main.c wires together (workload.c, load.c, report.c, mono.c).
 *
 * Not a library: private to the k3pd-bench binary. Everything runs on one thread (the uv loop
 * of load.c while requests fly; plain code before and after).
 *
 * Invariants:
 *  - Request i of a run is a pure function of (workload, i): its prompt, output length and
 *    sampling seed come from a per-index RNG, so the monolithic comparison replays exactly
 *    what the cluster was sent, whatever order requests completed in.
 *  - Times are k3_now_ns() (monotonic) in ns; durations reported in µs or ms as named. */
#ifndef K3PD_BENCH_H
#define K3PD_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- length distributions (workload.c) ---- */

typedef enum { BN_DIST_FIXED = 0, BN_DIST_UNIFORM, BN_DIST_FILE } bn_dist_kind_t;

typedef struct {
  bn_dist_kind_t kind;
  uint32_t lo, hi;   /* FIXED: lo == hi; UNIFORM: inclusive range */
  uint32_t *values;  /* FILE: the lengths listed in the file (owned; bn_dist_free) */
  size_t n_values;
} bn_dist_t;

/* Parses "N", "A..B" (inclusive, 1 <= A <= B) or "@FILE" (whitespace-separated positive
 * integers; a draw picks one uniformly). `what` names the flag in errors. On error *d is
 * untouched and err names the flag and the problem. */
int bn_dist_parse(const char *spec, const char *what, bn_dist_t *d, char *err, size_t errlen);
void bn_dist_free(bn_dist_t *d);
/* Draws one length with the RNG state *rng (splitmix64). */
uint32_t bn_dist_draw(const bn_dist_t *d, uint64_t *rng);
/* Largest value the distribution can produce. */
uint32_t bn_dist_max(const bn_dist_t *d);

uint64_t bn_rng_next(uint64_t *state);     /* splitmix64 */
double bn_rng_uniform(uint64_t *state);    /* [0, 1) */
/* The open loop's arrival process (load.c; k3pd-plan replays it): the RNG state for a workload
 * seed, and the next exponential gap in seconds at `rate` requests/s. */
uint64_t bn_arrival_rng(uint64_t seed);
double bn_arrival_gap_s(uint64_t *rng, double rate);

/* ---- workload ---- */

typedef struct {
  bn_dist_t prompt_len, output_len;
  uint64_t seed;         /* workload seed: prompt ids, lengths */
  uint32_t id_max;       /* random prompt ids are drawn from [0, id_max) */
  char **texts;          /* text mode: prompts (owned), request i uses texts[i % n_texts] */
  size_t n_texts;
  /* sampling, as sent to the router and to k3pd-generate */
  double temperature;    /* 0 = greedy */
  double top_p;          /* 1 = off */
  int top_k;             /* 0 = off */
  uint64_t sample_seed;  /* request i uses sample_seed + i */
  bool ignore_eos;
  /* prefix-cache workloads (docs/perf-cluster.md "Prefix cache"):
   * shared_prefix_len > 0: every prompt (a chat's first turn) starts with the same
   *   shared_prefix_len ids (a shared system prompt), then its own prompt_len draw;
   * chat_turns > 0: request index = conversation * chat_turns + turn; turn t > 0 sends the
   *   conversation's previous prompt + its reply + a new prompt_len draw (a chat whose next
   *   turn starts with all of the previous one), so a conversation's turns run one at a time
   *   (closed loop: --concurrency conversations at once). */
  uint32_t shared_prefix_len;
  uint32_t chat_turns;
} bn_workload_t;

/* One request, generated from the workload. */
typedef struct {
  uint64_t index;
  uint32_t *ids;      /* token-id mode: prompt (owned); NULL in text mode */
  size_t n_ids;
  const char *text;   /* text mode: borrowed from the workload */
  uint32_t max_new;
  uint64_t seed;
} bn_req_spec_t;

/* Reads a prompt file: one prompt per non-empty line (a trailing '\r' is dropped). */
int bn_workload_load_texts(bn_workload_t *w, const char *path, char *err, size_t errlen);
/* Fills *s for request `index` (deterministic). Returns 0 or K3_ENOMEM. */
int bn_spec_make(const bn_workload_t *w, uint64_t index, bn_req_spec_t *s);
/* Request `index`'s prompt length and max_new_tokens alone (what bn_spec_make draws; text
 * mode: the prompt length is drawn but unused). k3pd-plan replays workloads with it. */
void bn_spec_lengths(const bn_workload_t *w, uint64_t index, uint32_t *prompt_len, uint32_t *max_new);
void bn_spec_free(bn_req_spec_t *s);
void bn_workload_free(bn_workload_t *w);

/* ---- results of one request (load.c fills, report.c reads) ---- */

typedef struct {
  uint64_t index;
  int code;                   /* gRPC status; -1 = never started (start error) */
  bool complete;              /* OK status and a final chunk with a finish reason */
  int finish_reason;
  uint64_t t_start, t_first, t_end; /* ns; t_first 0 when no token arrived */
  uint32_t n_tokens;          /* tokens received */
  double gap_max_ms;          /* the longest inter-token gap (as the ITL samples count it) */
  double gap1_ms;             /* the first one: first token (the Prefill reply's) -> the next */
  uint32_t prompt_tokens;     /* usage.prompt_tokens from the final chunk */
  uint32_t cached_tokens;     /* usage.cached_prompt_tokens: from the decode worker's prefix cache */
  uint32_t *prompt;           /* chat: the prompt sent (owned; its ids depend on earlier replies) */
  size_t n_prompt;
  uint32_t *ids;              /* generated ids (owned) when the run keeps them */
  /* final chunk's Timings (µs; 0 = not measured) */
  uint64_t queue_us, prefill_us, handoff_us, first_token_us, decode_us, total_us;
  bool have_timings;
} bn_result_t;

/* A growable vector of doubles (ITL samples). */
typedef struct {
  double *v;
  size_t n, cap;
} bn_vec_t;
int bn_vec_push(bn_vec_t *v, double x);

/* ---- load generation (load.c) ---- */

typedef struct {
  const char *router;      /* HOST:PORT */
  int concurrency;         /* closed loop: requests kept in flight */
  double rate;             /* > 0: open loop, Poisson arrivals at this many requests/s */
  int max_inflight;        /* open loop: arrivals beyond this many in flight are dropped as errors */
  uint64_t requests;       /* measured requests (0 when duration_s is used) */
  double duration_s;       /* > 0: send measured requests for this long */
  uint64_t warmup;         /* requests sent (closed loop) before measuring; not recorded */
  uint32_t timeout_ms;     /* per-request gRPC deadline */
  bool keep_ids;           /* store generated ids in results (verification) */
} bn_load_opts_t;

typedef struct {
  bn_result_t *res;        /* measured requests, in index order (owned) */
  size_t n_res;
  bn_vec_t itl_ms;         /* inter-token gaps of measured requests, one sample per token */
  uint64_t t_begin, t_end; /* measured phase: first send .. last completion (ns) */
  uint64_t dropped;        /* open loop arrivals refused because max_inflight was reached */
} bn_run_t;

/* Runs warm-up then the measured phase against opts->router. Blocks until every request
 * finished (each has its own deadline). Returns 0, or a negative K3_E* code when the client
 * could not be set up (err says why); request failures are recorded in run, not returned. */
int bn_load_run(const bn_workload_t *w, const bn_load_opts_t *o, bn_run_t *run, char *err, size_t errlen);
void bn_run_free(bn_run_t *run);

/* ---- monolithic comparison (mono.c) ---- */

typedef struct {
  const char *generate;    /* path of k3pd-generate */
  const char *model;       /* checkpoint dir */
  const char *backend;     /* --backend for k3pd-generate */
  const char *precision;   /* --precision */
  uint32_t timeout_ms;     /* per process */
} bn_mono_opts_t;

typedef struct {
  uint64_t runs, failures;             /* processes run; ones that failed or were unparsable */
  uint64_t prompt_tokens, prefill_ns;  /* summed from k3pd-generate's stderr summary */
  uint64_t decode_steps, decode_ns;
  uint64_t wall_ns;                    /* summed process wall time (includes model load) */
  uint64_t completion_tokens;
  uint64_t checked, mismatches;        /* verification: requests compared / differing */
  char first_mismatch[512];            /* description of the first mismatch */
} bn_mono_t;

/* Replays every complete measured request of `run` through k3pd-generate, sequentially,
 * accumulating its own timings into *m; when `verify`, compares the generated ids with the
 * cluster's (run must have been made with keep_ids). `prompt_ids` maps text prompts to ids
 * (NULL in token-id mode). Returns 0, or a negative K3_E* code when k3pd-generate could not be
 * run at all (err says why). */
typedef int (*bn_tokenize_fn)(void *ctx, const char *text, uint32_t **ids, size_t *n, char *err, size_t errlen);
int bn_mono_run(const bn_mono_opts_t *o, const bn_workload_t *w, const bn_run_t *run, bool verify,
                bn_tokenize_fn tokenize, void *tok_ctx, bn_mono_t *m, char *err, size_t errlen);

/* ---- the monolithic twin from k3pd-generate --perf (monoperf.c) ---- */

typedef struct {
  long long prefill_tokens; /* the prompt of its "perf: prefill" line */
  double prefill_ms;        /* its second-pass prefill time; 0 = absent */
  double step_ms[2];        /* decode step at batch 1 and at batch `batch`; 0 = absent */
  int batch;                /* the --perf-batch figure's batch (0 = absent) */
} bn_monoperf_t;

/* Reads the perf lines of a saved `k3pd-generate --perf` output. Returns 0, K3_EIO, K3_EINVAL
 * (no figure in it; err names the file). */
int bn_monoperf_load(const char *path, bn_monoperf_t *m, char *err, size_t errlen);
/* The decode step of the batch equal to `concurrency` (1, or the --perf-batch B figure): its ms,
 * with *batch set; 0 and *batch 0 when the file has no such figure. */
double bn_monoperf_step(const bn_monoperf_t *m, int concurrency, int *batch);

/* ---- report (report.c) ---- */

typedef struct {
  const bn_workload_t *w;
  const bn_load_opts_t *load;
  const char *label;
  const char *prompt_len_spec, *output_len_spec;
  const bn_mono_t *mono;   /* NULL when not run */
  const bn_monoperf_t *mono_perf; /* NULL without --mono-perf */
  bool verified;
} bn_report_in_t;

/* Prefix-cache lines of the table (hit rate, cached and computed prompt tokens, TTFT of first
 * vs later chat turns); nothing when no request reported a cached prefix and the workload is
 * not a prefix workload. */
void bn_report_prefix(const bn_report_in_t *in, const bn_run_t *run);
/* Prints the human table to stdout. */
void bn_report_print(const bn_report_in_t *in, const bn_run_t *run);
/* Appends one compact JSON line to path. Returns 0 or a negative K3_E* code. */
int bn_report_json(const bn_report_in_t *in, const bn_run_t *run, const char *path, char *err, size_t errlen);
/* Writes every complete measured request (token-id mode) as a k3pd-generate --requests line:
 * prompt ids TAB generated ids TAB their count TAB sampling seed (the cluster's tokens become
 * the monolithic run's teacher, tools/generate/requests.h). Returns 0 or K3_EIO. */
int bn_report_ids(const bn_workload_t *w, const bn_run_t *run, const char *path, char *err, size_t errlen);
/* --requests-out: one JSON object per measured request and line (index, send time from the
 * measured phase's start, lengths, TTFT, end-to-end, longest inter-token gap, the Timings), for
 * comparing a run request by request (tests/plan/validate.py keeps them). */
int bn_report_requests(const bn_run_t *run, const char *path, char *err, size_t errlen);
/* p-th percentile (0..100) of v[0..n) by linear interpolation; sorts v. NAN when n == 0. */
double bn_percentile(double *v, size_t n, double p);

/* ---- worker metrics (scrape.c) ---- */

/* GETs http://addr/metrics (HOST:PORT, plain HTTP, 5 s deadline per socket operation). On
 * success *text is the whole answer (malloc'd, NUL-terminated; the caller frees). */
int bn_scrape(const char *addr, char **text, char *err, size_t errlen);
/* Sum of every series of metric `name` (exact name: "x_sum" is not "x") in a scraped text. */
double bn_metric_sum(const char *text, const char *name);

/* ---- least squares (fit.c) ---- */

/* Fits y ~ X b over n rows of k <= 6 columns (row-major X), with b >= 0 where nonneg[j]
 * (columns whose coefficient would go negative are dropped one at a time, most negative first,
 * and the rest refitted). Columns that are all zero get 0. Returns 0, or K3_EINVAL when no
 * column is left. */
int bn_fit_lsq(const double *X, const double *y, int n, int k, const bool *nonneg, double *b);

/* ---- cost profile for k3pd-plan (profile.c; schema in docs/plan.md) ---- */

typedef struct {
  const char *router;
  const char *out;             /* profile JSON path */
  const char *prefill_metrics; /* comma-separated HOST:PORT of prefill /metrics (NULL = none) */
  const char *decode_metrics;  /* same for decode workers */
  const char *prompts;         /* prefill phase prompt lengths, comma-separated */
  const char *batches;         /* decode phase concurrencies, comma-separated */
  int repeats;                 /* requests per prefill point; decode points send repeats * c */
  int decode_output;           /* output tokens of the decode phase's requests */
  int64_t chunk;               /* the prefill workers' --prefill-chunk */
  int warmup;                  /* unmeasured rounds of each point before it is measured (CUDA: the
                                  first call of a shape loads its kernels) */
  uint32_t timeout_ms;
} bn_profile_opts_t;

/* Measures the running cluster in phases (prefill at concurrency 1 per prompt length, batched
 * short prompts, decode at each concurrency with a short and a long prompt), fits the costs and
 * writes the profile. Returns 0 or a negative K3_E* code (err says why). */
int bn_profile_run(const bn_workload_t *w, const bn_profile_opts_t *o, char *err, size_t errlen);

#endif
