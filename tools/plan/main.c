/* k3pd-plan: capacity planner for a k3pd cluster. Simulates the cluster (sim.c) with costs
 * measured from real workers (a k3pd-bench --profile file) and answers: how many prefill and
 * decode workers meet a p99 TTFT / p99 inter-token target at a traffic level (search.c), what
 * latencies a given cluster will see (--prefill N --decode M), how they grow with traffic
 * (--curve), the replica counts for a list of traffic levels (--replicas) and the HPA targets
 * that hold the planned operating point (--hpa). docs/plan.md.
 *
 * main.c parses flags, prints and writes JSON; every number comes from pl_sim_run. Exit
 * status: 0 answered (targets met, or a fixed cluster evaluated), 1 targets cannot be met
 * within --max-workers, 2 bad flags or profile. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/util.h"
#include "plan.h"

typedef struct {
  const pl_profile_t *p;
  pl_workload_t w;
  pl_targets_t t;
  int max_workers;
} plan_t;

static void print_result(const char *what, const pl_cluster_t *c, const pl_result_t *r) {
  printf("%s: %d prefill : %d decode\n", what, c->n_prefill, c->n_decode);
  printf("  requests %llu measured, %llu completed, %llu rejected%s\n", (unsigned long long)r->measured,
         (unsigned long long)r->completed, (unsigned long long)r->rejected,
         isinf(r->ttft_ms.p99) ? " (overloaded: queues grew without bound, simulation stopped)" : "");
  printf("  TTFT ms      p50 %9.2f  p90 %9.2f  p99 %9.2f  mean %9.2f\n", r->ttft_ms.p50, r->ttft_ms.p90,
         r->ttft_ms.p99, r->ttft_ms.mean);
  printf("  ITL ms       p50 %9.2f  p90 %9.2f  p99 %9.2f  mean %9.2f\n", r->itl_ms.p50, r->itl_ms.p90, r->itl_ms.p99,
         r->itl_ms.mean);
  printf("  e2e ms       p50 %9.2f  p99 %9.2f\n", r->e2e_ms.p50, r->e2e_ms.p99);
  printf("  per prefill worker: busy %.2f, queued prompt tokens (time avg) %.1f\n", r->pf_busy,
         r->pf_queued_tokens_avg);
  printf("  per decode worker: kv utilisation (time avg) %.3f, running %.2f, batch per step %.2f, pages %.1f, slots "
         "%.2f\n",
         r->dc_util_avg, r->dc_running_avg, r->dc_batch_avg, r->dc_pages_used_avg, r->dc_slots_used_avg);
}

static json_t *summ_json(const pl_summ_t *s) {
  json_t *o = json_object();
  json_object_set_new(o, "n", json_integer((json_int_t)s->n));
  const char *k[] = {"p50", "p90", "p99", "mean", "max"};
  double v[] = {s->p50, s->p90, s->p99, s->mean, s->max};
  for (int i = 0; i < 5; i++) json_object_set_new(o, k[i], isfinite(v[i]) ? json_real(v[i]) : json_null());
  return o;
}

static json_t *result_json(const pl_cluster_t *c, double rate, const pl_result_t *r) {
  json_t *o = json_object();
  json_object_set_new(o, "prefill", json_integer(c->n_prefill));
  json_object_set_new(o, "decode", json_integer(c->n_decode));
  json_object_set_new(o, "rate", json_real(rate));
  json_object_set_new(o, "measured", json_integer((json_int_t)r->measured));
  json_object_set_new(o, "completed", json_integer((json_int_t)r->completed));
  json_object_set_new(o, "rejected", json_integer((json_int_t)r->rejected));
  json_object_set_new(o, "ttft_ms", summ_json(&r->ttft_ms));
  json_object_set_new(o, "itl_ms", summ_json(&r->itl_ms));
  json_object_set_new(o, "e2e_ms", summ_json(&r->e2e_ms));
  json_object_set_new(o, "prefill_busy", json_real(r->pf_busy));
  json_object_set_new(o, "prefill_queued_prompt_tokens_avg", json_real(r->pf_queued_tokens_avg));
  json_object_set_new(o, "decode_kv_utilization_avg", json_real(r->dc_util_avg));
  json_object_set_new(o, "decode_running_avg", json_real(r->dc_running_avg));
  json_object_set_new(o, "decode_batch_avg", json_real(r->dc_batch_avg));
  return o;
}

static int sim_at(const plan_t *pl, const pl_cluster_t *c, double rate, pl_result_t *r, char *err, size_t errlen) {
  pl_workload_t w = pl->w;
  w.rate = rate;
  return pl_sim_run(pl->p, c, &w, NULL, NULL, NULL, r, err, errlen);
}

/* Latency vs traffic for one cluster. */
static int curve(const plan_t *pl, const pl_cluster_t *c, const char *spec, json_t *js, char *err, size_t errlen) {
  printf("\npredicted latency vs traffic, %d prefill : %d decode (rate x multiplier)\n", c->n_prefill, c->n_decode);
  printf("  %8s %9s | %9s %9s | %8s %8s | %7s | %6s %9s %6s\n", "req/s", "x", "TTFT p50", "TTFT p99", "ITL p50",
         "ITL p99", "reject", "pbusy", "q tok/w", "kvutil");
  const char *s = spec;
  json_t *arr = json_array();
  while (*s) {
    char *end = NULL;
    double m = strtod(s, &end);
    if (end == s || !(m > 0)) {
      snprintf(err, errlen, "--curve: bad multiplier at \"%s\"", s);
      json_decref(arr);
      return K3_EINVAL;
    }
    pl_result_t r;
    int rc = sim_at(pl, c, pl->w.rate * m, &r, err, errlen);
    if (rc) {
      json_decref(arr);
      return rc;
    }
    printf("  %8.2f %9.2f | %9.1f %9.1f | %8.2f %8.2f | %7.4f | %6.2f %9.1f %6.3f\n", pl->w.rate * m, m, r.ttft_ms.p50,
           r.ttft_ms.p99, r.itl_ms.p50, r.itl_ms.p99, r.measured ? (double)r.rejected / (double)r.measured : 0,
           r.pf_busy, r.pf_queued_tokens_avg, r.dc_util_avg);
    json_array_append_new(arr, result_json(c, pl->w.rate * m, &r));
    s = *end == ',' ? end + 1 : end;
  }
  if (js) json_object_set_new(js, "curve", arr);
  else json_decref(arr);
  return 0;
}

/* HPA targets: the per-worker signal levels at the planned operating point and at the highest
 * traffic the same cluster still serves within the targets (the SLO edge). */
static int hpa(const plan_t *pl, const pl_cluster_t *c, const pl_result_t *at, double margin, json_t *js, char *err,
               size_t errlen) {
  double lo = pl->w.rate, hi = pl->w.rate * 2;
  pl_result_t r_lo = *at, r;
  /* find a failing rate, then bisect (8 steps: the edge to ~0.5 % of the rate) */
  int rc = 0;
  for (int i = 0; i < 6; i++) {
    if ((rc = sim_at(pl, c, hi, &r, err, errlen))) return rc;
    if (!pl_meets(&r, &pl->t)) break;
    lo = hi;
    r_lo = r;
    hi *= 1.5;
  }
  for (int i = 0; i < 8; i++) {
    double mid = (lo + hi) / 2;
    if ((rc = sim_at(pl, c, mid, &r, err, errlen))) return rc;
    if (pl_meets(&r, &pl->t)) {
      lo = mid;
      r_lo = r;
    } else {
      hi = mid;
    }
  }
  printf("\nHPA targets (per-pod averages; deploy/k8s/base/hpa.yaml, docs/plan.md \"Autoscaling\")\n");
  printf("  %-44s %14s %14s\n", "", "planned", "SLO edge");
  printf("  %-44s %14.2f %14.2f\n", "traffic (req/s)", pl->w.rate, lo);
  printf("  %-44s %14.1f %14.1f\n", "k3pd_prefill_queued_prompt_tokens", at->pf_queued_tokens_avg,
         r_lo.pf_queued_tokens_avg);
  printf("  %-44s %14.3f %14.3f\n", "k3pd_decode_kv_utilization_ratio", at->dc_util_avg, r_lo.dc_util_avg);
  /* The HPA keeps the per-pod average at its target: aim at the edge level less a margin for
   * the minutes a new pod needs to load its weights, never below the planned level. */
  double pf_t = margin * r_lo.pf_queued_tokens_avg, dc_t = margin * r_lo.dc_util_avg;
  if (pf_t < at->pf_queued_tokens_avg) pf_t = at->pf_queued_tokens_avg;
  if (dc_t < at->dc_util_avg) dc_t = at->dc_util_avg;
  printf("  recommended targets (%.2f x SLO edge, at least planned): prefill averageValue %.0f, decode averageValue "
         "%.0fm\n",
         margin, ceil(pf_t > 1 ? pf_t : 1), ceil(dc_t * 1000 > 1 ? dc_t * 1000 : 1));
  if (js) {
    json_t *o = json_object();
    json_object_set_new(o, "planned_rate", json_real(pl->w.rate));
    json_object_set_new(o, "edge_rate", json_real(lo));
    json_object_set_new(o, "prefill_queued_prompt_tokens_planned", json_real(at->pf_queued_tokens_avg));
    json_object_set_new(o, "prefill_queued_prompt_tokens_edge", json_real(r_lo.pf_queued_tokens_avg));
    json_object_set_new(o, "decode_kv_utilization_planned", json_real(at->dc_util_avg));
    json_object_set_new(o, "decode_kv_utilization_edge", json_real(r_lo.dc_util_avg));
    json_object_set_new(o, "prefill_target", json_real(ceil(pf_t > 1 ? pf_t : 1)));
    json_object_set_new(o, "decode_target_milli", json_real(ceil(dc_t * 1000 > 1 ? dc_t * 1000 : 1)));
    json_object_set_new(js, "hpa", o);
  }
  return 0;
}

static int replicas(const plan_t *pl, const char *spec, json_t *js, char *err, size_t errlen) {
  printf("\nrecommended replicas by traffic (targets: TTFT p99 %g ms, ITL p99 %g ms)\n", pl->t.ttft_p99_ms,
         pl->t.itl_p99_ms);
  printf("  %9s | %7s %7s | %9s %9s | %9s %7s\n", "req/s", "prefill", "decode", "TTFT p99", "ITL p99", "q tok/w",
         "kvutil");
  json_t *arr = json_array();
  const char *s = spec;
  while (*s) {
    char *end = NULL;
    double rate = strtod(s, &end);
    if (end == s || !(rate > 0)) {
      snprintf(err, errlen, "--replicas: bad rate at \"%s\"", s);
      json_decref(arr);
      return K3_EINVAL;
    }
    pl_workload_t w = pl->w;
    w.rate = rate;
    pl_cluster_t c;
    pl_result_t r;
    int sims = 0;
    int rc = pl_search(pl->p, &w, &pl->t, pl->max_workers, &c, &r, &sims, err, errlen);
    if (rc == K3_ECAPACITY) {
      printf("  %9.2f | %s\n", rate, err);
      err[0] = 0;
    } else if (rc) {
      json_decref(arr);
      return rc;
    } else {
      printf("  %9.2f | %7d %7d | %9.1f %9.2f | %9.1f %7.3f\n", rate, c.n_prefill, c.n_decode, r.ttft_ms.p99,
             r.itl_ms.p99, r.pf_queued_tokens_avg, r.dc_util_avg);
      json_array_append_new(arr, result_json(&c, rate, &r));
    }
    s = *end == ',' ? end + 1 : end;
  }
  if (js) json_object_set_new(js, "replicas", arr);
  else json_decref(arr);
  return 0;
}

typedef struct {
  FILE *f;
  double overhead_ms;
} req_out_t;

/* --requests-out: one line per request as k3pd-bench --requests-out writes them (same index). */
static void on_request(void *ctx, const pl_trace_t *t) {
  req_out_t *o = ctx;
  bool ok = t->t_first_ms >= 0;
  fprintf(o->f, "{\"index\":%llu,\"ok\":%s,\"send_ms\":%.3f,\"ttft_ms\":%.3f,\"e2e_ms\":%.3f,\"prefill\":%d,"
          "\"decode\":%d}\n", (unsigned long long)t->index, ok ? "true" : "false", t->t_arrive_ms,
          ok ? t->t_first_ms - t->t_arrive_ms + o->overhead_ms : -1.0,
          ok ? t->t_end_ms - t->t_arrive_ms + o->overhead_ms : -1.0, t->prefill, t->decode);
}

int main(int argc, char **argv) {
  const char *requests_out = NULL;
  const char *profile = NULL, *prompt_len = "16", *output_len = "16", *curve_spec = NULL, *replicas_spec = NULL;
  const char *json_path = NULL, *pf_cost = "table";
  double rate = 0, duration = 120, warmup = -1, ttft = 0, itl = 0, max_reject = 0, prefix_hit = 0, overload_s = 30;
  int64_t requests = 0, seed = 1, first_index = 0, prefix_tokens = 0;
  int n_prefill = 0, n_decode = 0, max_workers = 1000, host_cores = 0;
  bool do_hpa = false;
  double hpa_margin = 0.8, heartbeat_ms = 500;
  pl_profile_t p;
  pl_profile_default(&p);
  /* profile overrides: -1 = keep the profile's value */
  int64_t o_chunk = -1, o_pf_tokens = -1, o_dc_pages = -1, o_pf_pages = -1, o_page = -1;
  int o_pf_batch = -1, o_dc_batch = -1, o_dc_slots = -1, o_pf_slots = -1;
  k3_flag_t flags[] = {
      {"profile", K3_FLAG_STR, &profile, "FILE", "cost profile written by k3pd-bench --profile (docs/plan.md)", true},
      {"rate", K3_FLAG_DOUBLE, &rate, "R", "Poisson arrivals per second", true},
      {"prompt-len", K3_FLAG_STR, &prompt_len, "SPEC", "prompt tokens: N, A..B (uniform) or @FILE (default 16)", false},
      {"output-len", K3_FLAG_STR, &output_len, "SPEC", "generated tokens: N, A..B or @FILE (default 16)", false},
      {"duration", K3_FLAG_DOUBLE, &duration, "S", "simulated seconds of arrivals (default 120)", false},
      {"requests", K3_FLAG_I64, &requests, "N", "simulate N arrivals instead of --duration", false},
      {"warmup", K3_FLAG_DOUBLE, &warmup, "S", "arrivals in the first S seconds are not measured (default: 10 % of "
       "--duration; 0 with --requests)", false},
      {"seed", K3_FLAG_I64, &seed, "S", "workload seed, as k3pd-bench --seed: same lengths and arrivals (default 1)",
       false},
      {"first-index", K3_FLAG_I64, &first_index, "N", "index of the first request (k3pd-bench --warmup N)", false},
      {"prefix-hit", K3_FLAG_DOUBLE, &prefix_hit, "F", "fraction of requests whose first --prefix-tokens are cached "
       "(prefill skips them)", false},
      {"prefix-tokens", K3_FLAG_I64, &prefix_tokens, "N", "cached prefix length of a hit", false},
      {"ttft-p99-ms", K3_FLAG_DOUBLE, &ttft, "MS", "target p99 time to first token (0 = none)", false},
      {"itl-p99-ms", K3_FLAG_DOUBLE, &itl, "MS", "target p99 inter-token latency (0 = none)", false},
      {"max-reject", K3_FLAG_DOUBLE, &max_reject, "F", "largest acceptable fraction of requests refused for lack "
       "of decode pages/slots (default 0)", false},
      {"overload-wait-s", K3_FLAG_DOUBLE, &overload_s, "S", "a simulation stops as overloaded once a queued prompt "
       "waited S seconds (default 30)", false},
      {"max-workers", K3_FLAG_INT, &max_workers, "N", "largest count per role the search tries (default 1000)", false},
      {"prefill", K3_FLAG_INT, &n_prefill, "N", "evaluate this many prefill workers (with --decode) instead of searching",
       false},
      {"decode", K3_FLAG_INT, &n_decode, "M", "evaluate this many decode workers (with --prefill)", false},
      {"host-cores", K3_FLAG_INT, &host_cores, "N", "with --prefill/--decode: all workers share one host of N cores "
       "(a local CPU cluster; default 0 = each worker owns its hardware)", false},
      {"curve", K3_FLAG_STR, &curve_spec, "LIST", "also print latency at these multiples of --rate, e.g. "
       "0.5,0.75,1,1.25", false},
      {"replicas", K3_FLAG_STR, &replicas_spec, "LIST", "recommended counts for each of these rates (req/s), "
       "e.g. 100,500,1000", false},
      {"hpa", K3_FLAG_BOOL, &do_hpa, NULL, "derive HPA targets (per-pod signal levels) for the chosen cluster", false},
      {"hpa-margin", K3_FLAG_DOUBLE, &hpa_margin, "F", "HPA targets = F x the per-pod signal at the SLO edge "
       "(default 0.8: headroom while new pods start)", false},
      {"json", K3_FLAG_STR, &json_path, "FILE", "write the answer as JSON", false},
      {"requests-out", K3_FLAG_STR, &requests_out, "FILE", "with --prefill/--decode: one JSON line per simulated "
       "request (index, send time, TTFT, end-to-end, workers), as k3pd-bench --requests-out", false},
      {"heartbeat-ms", K3_FLAG_DOUBLE, &heartbeat_ms, "MS", "the router's heartbeat interval: it balances prefill on "
       "the workers' queues as of their last heartbeat plus what it sent since (default 500, the router's; 0 = an "
       "exact view)", false},
      {"prefill-cost", K3_FLAG_STR, &pf_cost, "table|line", "price prefill passes by the profile's measured lone "
       "prompts (table, the default when it has two or more) or by its fitted line", false},
      {"prefill-chunk", K3_FLAG_I64, &o_chunk, "N", "override the profile's prefill --prefill-chunk", false},
      {"prefill-max-batch", K3_FLAG_INT, &o_pf_batch, "N", "override prefill --max-batch", false},
      {"prefill-max-batch-tokens", K3_FLAG_I64, &o_pf_tokens, "N", "override prefill --max-batch-tokens", false},
      {"prefill-num-pages", K3_FLAG_I64, &o_pf_pages, "N", "override prefill --num-pages", false},
      {"prefill-num-slots", K3_FLAG_INT, &o_pf_slots, "N", "override prefill --num-slots", false},
      {"decode-max-batch", K3_FLAG_INT, &o_dc_batch, "N", "override decode --max-batch", false},
      {"decode-num-pages", K3_FLAG_I64, &o_dc_pages, "N", "override decode --num-pages", false},
      {"decode-num-slots", K3_FLAG_INT, &o_dc_slots, "N", "override decode --num-slots", false},
      {"page-tokens", K3_FLAG_I64, &o_page, "N", "override --page-tokens (both roles)", false},
  };
  k3_flags_info_t info = {
      .prog = "k3pd-plan",
      .summary = "Capacity planner: a discrete-event simulation of a k3pd cluster (router pairing, fair chunked "
                 "prefill, handoff, continuous-batching decode, page and slot limits) driven by a cost profile "
                 "measured with k3pd-bench --profile. Prints the smallest prefill:decode counts that meet p99 TTFT "
                 "and inter-token targets at a traffic level, or the latencies of a given cluster, latency curves, "
                 "replica counts per traffic level and HPA targets. Deterministic: same flags, same numbers."};
  char err[512] = "";
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-plan: %s\n", err);
    return 2;
  }
#define BAD(...)                                 \
  do {                                           \
    fprintf(stderr, "k3pd-plan: " __VA_ARGS__);  \
    fputc('\n', stderr);                         \
    return 2;                                    \
  } while (0)
  if (!(rate > 0)) BAD("--rate: must be > 0 (got %g)", rate);
  if (requests < 0) BAD("--requests: must be >= 0");
  if (requests == 0 && !(duration > 0)) BAD("--duration: must be > 0");
  if ((n_prefill > 0) != (n_decode > 0) || n_prefill < 0 || n_decode < 0)
    BAD("--prefill and --decode: give both (>= 1) to evaluate a cluster, or neither to search");
  if (!(hpa_margin > 0 && hpa_margin <= 1)) BAD("--hpa-margin: must be in (0, 1]");
  if (!(overload_s > 0)) BAD("--overload-wait-s: must be > 0");
  if (max_workers < 1) BAD("--max-workers: must be >= 1");
  if (max_reject < 0 || max_reject > 1) BAD("--max-reject: must be in [0, 1]");
  if (prefix_hit < 0 || prefix_hit > 1) BAD("--prefix-hit: must be in [0, 1]");
  if (prefix_tokens < 0) BAD("--prefix-tokens: must be >= 0");
  if (n_prefill == 0 && ttft <= 0 && itl <= 0) BAD("--ttft-p99-ms / --itl-p99-ms: a search needs at least one target");
  if (pl_profile_load(profile, &p, err, sizeof err)) BAD("--profile: %s", err);
  if (strcmp(pf_cost, "table") && strcmp(pf_cost, "line")) BAD("--prefill-cost: want table or line");
  p.pf_tab_off = !strcmp(pf_cost, "line");
  if (!(heartbeat_ms >= 0)) BAD("--heartbeat-ms: must be >= 0");
  p.router_heartbeat_ms = heartbeat_ms;
#define OVR(flag, v, dst)                                  \
  do {                                                     \
    if ((v) != -1) {                                       \
      if ((v) < 1) BAD("--" flag ": must be >= 1");        \
      dst = (v);                                           \
    }                                                      \
  } while (0)
  OVR("prefill-chunk", o_chunk, p.pf.chunk_tokens);
  OVR("prefill-max-batch", o_pf_batch, p.pf.max_batch);
  OVR("prefill-max-batch-tokens", o_pf_tokens, p.pf.max_batch_tokens);
  OVR("prefill-num-pages", o_pf_pages, p.pf.num_pages);
  OVR("prefill-num-slots", o_pf_slots, p.pf.num_slots);
  OVR("decode-max-batch", o_dc_batch, p.dc.max_batch);
  OVR("decode-num-pages", o_dc_pages, p.dc.num_pages);
  OVR("decode-num-slots", o_dc_slots, p.dc.num_slots);
  if (o_page != -1) {
    if (o_page < 1) BAD("--page-tokens: must be >= 1");
    p.pf.page_tokens = p.dc.page_tokens = o_page;
  }
  plan_t pl = {.p = &p, .max_workers = max_workers};
  if (bn_dist_parse(prompt_len, "prompt-len", &pl.w.prompt_len, err, sizeof err)) BAD("%s", err);
  if (bn_dist_parse(output_len, "output-len", &pl.w.output_len, err, sizeof err)) BAD("%s", err);
  pl.w.rate = rate;
  pl.w.seed = (uint64_t)seed;
  pl.w.first_index = (uint64_t)first_index;
  pl.w.requests = (uint64_t)requests;
  pl.w.duration_s = requests ? 0 : duration;
  pl.w.warmup_s = warmup >= 0 ? warmup : (requests ? 0 : duration / 10);
  pl.w.prefix_hit = prefix_hit;
  pl.w.prefix_tokens = prefix_tokens;
  pl.w.overload_wait_s = overload_s;
  pl.t = (pl_targets_t){.ttft_p99_ms = ttft, .itl_p99_ms = itl, .max_reject = max_reject};

  printf("k3pd-plan: profile %s (%s)\n", profile, p.source[0] ? p.source : "no source");
  if (pl_prefill_uses_table(&p))
    printf("k3pd-plan: prefill priced by %d measured lone prompts (%g..%g tokens), %.3f ms shared per pass\n",
           p.pf_tab_n, p.pf_tab_tok[0], p.pf_tab_tok[p.pf_tab_n - 1], p.pf_shared_ms);
  printf("  workload: %g req/s, prompt %s, output %s, %s, seed %lld\n", rate, prompt_len, output_len,
         requests ? "fixed count" : "by duration", (long long)seed);
  printf("  prefill: chunk %lld, batch %d seqs / %lld tokens, %lld pages x %lld, %d slots; decode: batch %d, %lld "
         "pages x %lld, %d slots\n",
         (long long)p.pf.chunk_tokens, p.pf.max_batch, (long long)p.pf.max_batch_tokens, (long long)p.pf.num_pages,
         (long long)p.pf.page_tokens, p.pf.num_slots, p.dc.max_batch, (long long)p.dc.num_pages,
         (long long)p.dc.page_tokens, p.dc.num_slots);
  json_t *js = json_object();
  uint64_t t0 = k3_now_ns();
  int exit_code = 2;
  if (host_cores < 0) BAD("--host-cores: must be >= 0");
  pl_cluster_t c = {n_prefill, n_decode, host_cores};
  pl_result_t r;
  if (n_prefill > 0) {
    req_out_t ro = {requests_out ? fopen(requests_out, "w") : NULL, p.ttft_overhead_ms};
    if (requests_out && !ro.f) BAD("--requests-out: cannot write %s", requests_out);
    rc = pl_sim_run(&p, &c, &pl.w, NULL, ro.f ? on_request : NULL, &ro, &r, err, sizeof err);
    if (ro.f && fclose(ro.f) && !rc) BAD("--requests-out: write error on %s", requests_out);
    if (rc) goto fail;
    print_result("cluster", &c, &r);
    if (ttft > 0 || itl > 0) printf("  targets %s\n", pl_meets(&r, &pl.t) ? "met" : "NOT met");
    exit_code = 0;
  } else {
    int sims = 0;
    rc = pl_search(&p, &pl.w, &pl.t, max_workers, &c, &r, &sims, err, sizeof err);
    printf("  targets: TTFT p99 <= %g ms, ITL p99 <= %g ms, rejected <= %g (%d simulations)\n", ttft, itl,
           max_reject, sims);
    if (rc == K3_ECAPACITY) {
      printf("no cluster within --max-workers %d meets the targets: %s\n", max_workers, err);
      exit_code = 1;
      err[0] = 0;
      goto done;
    }
    if (rc) goto fail;
    print_result("smallest cluster meeting the targets", &c, &r);
    exit_code = 0;
  }
  json_object_set_new(js, "answer", result_json(&c, rate, &r));
  if (curve_spec && (rc = curve(&pl, &c, curve_spec, js, err, sizeof err))) goto fail;
  if (do_hpa && (rc = hpa(&pl, &c, &r, hpa_margin, js, err, sizeof err))) goto fail;
  if (replicas_spec && (rc = replicas(&pl, replicas_spec, js, err, sizeof err))) goto fail;
  goto done;
fail:
  fprintf(stderr, "k3pd-plan: %s\n", err);
  exit_code = 2;
done:;
  double wall = (double)(k3_now_ns() - t0) / 1e9;
  printf("\nwall time %.2f s\n", wall);
  json_object_set_new(js, "wall_s", json_real(wall));
  if (json_path && exit_code != 2 && json_dump_file(js, json_path, JSON_INDENT(1) | JSON_REAL_PRECISION(6))) {
    fprintf(stderr, "k3pd-plan: --json: cannot write %s\n", json_path);
    exit_code = 2;
  }
  json_decref(js);
  bn_dist_free(&pl.w.prompt_len);
  bn_dist_free(&pl.w.output_len);
  return exit_code;
}
