/* k3pd-plan internals: the cost profile (profile.c), the discrete-event simulation of a
 * cluster (sim.c), the searches over worker counts (search.c) and main.c's wiring.
 *
 * Not a library: private to the k3pd-plan binary and its tests. Everything is single-threaded
 * and deterministic: a simulation is a pure function of (profile, cluster, workload, seed), so
 * the same flags print the same numbers on any machine, fast or slow.
 *
 * Units: simulated time is in milliseconds (double); token counts are int64. */
#ifndef K3PD_PLAN_H
#define K3PD_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench.h" /* bn_dist_t: the same length distributions and RNG as k3pd-bench */

/* ---- cost profile (profile.c; schema in docs/plan.md) ---- */

enum { PL_TAB_MAX = 16 }; /* lone-prompt points of a profile */
enum { PL_Q_MAX = 32 };   /* points of the decode step's measured spread */
enum { PL_WMAX = 64 };    /* workers of a role whose speed a profile records */

/* One prefill worker's scheduler settings, as its flags set them (prefill_worker/main.c). */
typedef struct {
  int64_t chunk_tokens;     /* --prefill-chunk (rounded up to 64 by the runner) */
  int max_batch;            /* --max-batch (the engine caps it at 64) */
  int64_t max_batch_tokens; /* --max-batch-tokens */
  int64_t num_pages;        /* --num-pages: local pages for prompts being prefilled */
  int64_t page_tokens;      /* --page-tokens */
  int num_slots;            /* --num-slots (prefill default 8) */
} pl_prefill_cfg_t;

/* One decode worker's settings (decode_worker/main.c). */
typedef struct {
  int max_batch;       /* --max-batch: sequences per step, round-robin beyond */
  int64_t num_pages;   /* --num-pages */
  int64_t page_tokens; /* --page-tokens */
  int num_slots;       /* --num-slots: sequences held (running or reserved) */
} pl_decode_cfg_t;

typedef struct {
  /* prefill pass (one runner call) in ms: fixed + per_seq * seqs + per_token * tokens
   *   + per_token_ctx * Σ(take_i * context_before_i) / 1000 */
  double pf_fixed_ms, pf_per_seq_ms, pf_per_token_ms, pf_per_kctx_ms;
  /* The measured lone-prompt passes instead of the line (the CPU backend's cost per token falls
   * with the rows of a pass, so no line fits 16..256 tokens): a prompt of tab_tok[i] tokens
   * alone in one pass took tab_ms[i] (ascending tokens). With tab_n >= 2 (and !tab_off) a pass
   * of takes t_1..t_k costs shared + Σ_i (lone(t_i) - shared) + tab_kctx * Σ t_i * ctx_i / 1000,
   * lone() linear between the points, from (0, shared) to the first, and at the last point's
   * cost per token beyond it; shared = the pass's cost that its prompts share (the batched
   * phase of the profile measures it). */
  int pf_tab_n;
  double pf_tab_tok[PL_TAB_MAX], pf_tab_ms[PL_TAB_MAX];
  double pf_shared_ms, pf_tab_kctx_ms;
  bool pf_tab_off; /* k3pd-plan --prefill-cost line */
  /* decode step in ms: fixed + per_seq * batch + per_kctx * Σ context_i / 1000 */
  double dc_fixed_ms, dc_per_seq_ms, dc_per_kctx_ms;
  /* handoff: state bytes of a prompt = bytes_fixed + bytes_per_token * tokens; what is left
   * after the last pass = latency_ms + bytes / bandwidth (0 bandwidth = no size term) */
  double ho_bytes_fixed, ho_bytes_per_token, ho_latency_ms, ho_bandwidth_bytes_per_s;
  /* run-to-run variability: each pass / step takes its cost x exp(sigma Z), Z standard normal,
   * sigma = sqrt(ln(1 + cv^2)) (the median stays the cost; 0 = deterministic costs) */
  double pf_cv, dc_cv;
  /* The decode step's spread as measured, instead of the lognormal of dc_cv: with q_n >= 2 each
   * step takes its cost x R(U), U uniform, R the inverse of the measured distribution of the
   * inter-token gaps at batch 1 divided by their mean (points (q_p[i], q_r[i]), q_p ascending
   * from 0 to 1, linear between them), so batch-1 gaps come out with the measured shape and the
   * mean step stays the fitted one. */
  int dc_q_n;
  double dc_q_p[PL_Q_MAX], dc_q_r[PL_Q_MAX];
  /* Each worker's speed in the profiled cluster (prefill.worker_speed, decode.worker_speed: cost
   * multipliers by worker index; the router's tie order is the workers' ids, the simulation's
   * their indices). Prefill: against worker 0, which the table measured; decode: against the
   * fit, mean 1. Applied only to a simulated cluster of exactly that many workers of the role
   * (the cluster that was profiled): other sizes take 1. */
  int pf_speed_n, dc_speed_n;
  double pf_speed[PL_WMAX], dc_speed[PL_WMAX];
  /* fixed latency a request sees outside the workers' compute (router, hops, relay) */
  double ttft_overhead_ms, itl_overhead_ms;
  /* the router's view of prefill load (router/registry.c rt_choose_prefill): each worker's
   * queued prompt tokens as of its last heartbeat, plus what the router sent it since (cleared
   * by the heartbeat, less each Prefill that returned). 0 = an exact view (k3pd-plan sets the
   * router's default, 500 ms, unless --heartbeat-ms says otherwise). */
  double router_heartbeat_ms;
  pl_prefill_cfg_t pf;
  pl_decode_cfg_t dc;
  char source[256]; /* free text: where the figures came from */
} pl_profile_t;

/* Defaults: the workers' default flags and zero costs (a profile file sets the costs). */
void pl_profile_default(pl_profile_t *p);
/* Reads a profile JSON file (schema "k3pd-profile/1"). Errors name the field. Fields not in
 * the file keep their values in *p. */
int pl_profile_load(const char *path, pl_profile_t *p, char *err, size_t errlen);
/* Writes *p as a profile JSON file (fit details, when given, are stored under "fit"). */
int pl_profile_save(const char *path, const pl_profile_t *p, void *fit_json, char *err, size_t errlen);

double pl_prefill_pass_ms(const pl_profile_t *p, int seqs, int64_t tokens, double tok_ctx_sum);
/* The same with each prompt's take (what the table needs); takes may be NULL with the line. */
double pl_prefill_pass_takes_ms(const pl_profile_t *p, int seqs, const int64_t *takes, int64_t tokens,
                                double tok_ctx_sum);
/* A prompt of n tokens alone in one pass by the table (table in use only). */
double pl_prefill_lone_ms(const pl_profile_t *p, double n);
bool pl_prefill_uses_table(const pl_profile_t *p);
/* Fits the table from the profile's prefill measurements: rows of (passes, prompts, tokens,
 * Σ take*ctx / 1000, measured ms), as k3pd-bench --profile records them under fit.points
 * (kind "prefill_pass_sum"): lone single-pass prompts give the points, the batched phase the
 * shared cost, lone multi-pass prompts the context term. Leaves tab_n 0 with < 2 points. */
void pl_profile_fit_table(pl_profile_t *p, const double (*rows)[5], int n);
double pl_decode_step_ms(const pl_profile_t *p, int batch, double ctx_sum);
/* R(u) of the measured step spread (dc_q_n >= 2), u in [0, 1]. */
double pl_decode_spread(const pl_profile_t *p, double u);
/* Fills dc_q_* from inter-token gaps measured at batch 1 (sorts them); leaves dc_q_n 0 with
 * fewer than 20 gaps. */
void pl_profile_fit_spread(pl_profile_t *p, double *gaps, size_t n);
double pl_handoff_ms(const pl_profile_t *p, int64_t prompt_tokens);

/* ---- workload ---- */

typedef struct {
  bn_dist_t prompt_len, output_len; /* borrowed */
  double rate;              /* Poisson arrivals per second (> 0) */
  uint64_t seed;            /* as k3pd-bench --seed: same lengths and arrival times */
  uint64_t first_index;     /* index of the first request (k3pd-bench: --warmup) */
  uint64_t requests;        /* > 0: this many arrivals */
  double duration_s;        /* else: arrivals during this many seconds */
  double warmup_s;          /* requests arriving before this are not measured */
  double prefix_hit;        /* fraction of requests whose first prefix_tokens are cached */
  int64_t prefix_tokens;
  double overload_wait_s;   /* stop (overloaded) once a queued prompt waited this long (0 = 30) */
  double stop_ttft_ms;      /* > 0 (searches): stop as overloaded once more than 1 % of the expected
                               measured requests had a TTFT above this (their p99 is then above it) */
} pl_workload_t;

/* ---- results ---- */

/* Samples kept for percentiles: all of them up to cap, then a deterministic reservoir. */
typedef struct {
  double *v;
  size_t n, cap;
  uint64_t seen, rng;
} pl_samples_t;

typedef struct {
  double p50, p90, p99, mean, max;
  size_t n;
} pl_summ_t;

typedef struct {
  uint64_t arrived, measured, completed, rejected;
  pl_summ_t ttft_ms, itl_ms, e2e_ms;
  double sim_end_ms;
  /* time averages over the measured window, per worker (the HPA signals) */
  double pf_queued_tokens_avg;                        /* k3pd_prefill_queued_prompt_tokens */
  double pf_busy;                                     /* fraction of time in a pass */
  double dc_util_avg;                                  /* k3pd_decode_kv_utilization_ratio */
  double dc_running_avg, dc_batch_avg;
  double dc_pages_used_avg, dc_slots_used_avg;
  uint64_t events;
} pl_result_t;

typedef struct {
  int n_prefill, n_decode;
  int host_cores; /* > 0: every worker runs on one host of this many cores (the CPU test cluster);
                     work starting while k workers are busy takes max(1, k / host_cores) longer.
                     0: each worker owns its hardware (production). */
} pl_cluster_t;

/* Per-request trace hook (tests): called when a request finishes or is rejected. */
typedef struct {
  uint64_t index;
  double t_arrive_ms, t_first_ms, t_end_ms; /* t_first/t_end < 0 when rejected */
  int prefill, decode;                      /* worker indices, -1 when rejected */
} pl_trace_t;
typedef void (*pl_trace_fn)(void *ctx, const pl_trace_t *t);

typedef struct {
  /* explicit requests instead of the workload's generator (tests): arrays of n */
  const double *arrive_ms;
  const int64_t *prompt;
  const int64_t *output;
  size_t n;
} pl_fixed_reqs_t;

/* Runs one simulation. `fixed` may be NULL (then the workload generates the requests).
 * Returns 0, K3_EINVAL (bad cluster or profile; err names the field) or K3_ENOMEM. */
int pl_sim_run(const pl_profile_t *p, const pl_cluster_t *c, const pl_workload_t *w, const pl_fixed_reqs_t *fixed,
               pl_trace_fn trace, void *trace_ctx, pl_result_t *out, char *err, size_t errlen);

/* Samples (sim.c). */
int pl_samples_init(pl_samples_t *s, size_t cap, uint64_t seed);
void pl_samples_add(pl_samples_t *s, double x);
void pl_samples_free(pl_samples_t *s);
pl_summ_t pl_samples_summary(pl_samples_t *s); /* sorts s->v */

/* ---- search (search.c) ---- */

typedef struct {
  double ttft_p99_ms, itl_p99_ms; /* targets; <= 0 = no target */
  double max_reject;              /* largest acceptable rejected fraction (default 0) */
} pl_targets_t;

/* True when r meets t. */
bool pl_meets(const pl_result_t *r, const pl_targets_t *t);

/* Finds the smallest (prefill, decode) counts, each in [1, max_workers], for which the
 * simulation meets the targets: decode first (with prefill generous), then prefill, then a
 * joint check. *sims counts the simulations run. K3_ECAPACITY when max_workers cannot meet
 * them. */
int pl_search(const pl_profile_t *p, const pl_workload_t *w, const pl_targets_t *t, int max_workers, pl_cluster_t *best,
              pl_result_t *best_res, int *sims, char *err, size_t errlen);

#endif
