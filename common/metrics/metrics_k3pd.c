/* The k3pd metric catalogue: one table row per metric (role, name, help, type, label,
 * preset label values, buckets, and where the family pointer goes in the role's struct).
 *
 * This table is the source of truth for docs/metrics.md (a unit test checks the doc lists
 * every name) and for the prometheus-adapter rules in deploy/ (which use the two names in
 * K3PD_M_*). Changing a name here is an API change for dashboards and HPAs.
 *
 * Not here: updating the metrics (the binaries do that through the returned structs). */
#include <stddef.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/metrics_k3pd.h"

const double K3PD_TTFT_BUCKETS[K3PD_TTFT_BUCKETS_N] = {
    0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60, 120};
const double K3PD_TOKEN_BUCKETS[K3PD_TOKEN_BUCKETS_N] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5};
const double K3PD_OVERHEAD_BUCKETS[K3PD_OVERHEAD_BUCKETS_N] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
    0.005, 0.01, 0.025, 0.05, 0.1, 0.5};

const double K3PD_PASS_BUCKETS[K3PD_PASS_BUCKETS_N] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256};

static const char *const STATUS_VALUES[] = {
    K3PD_STATUS_OK,          K3PD_STATUS_CANCELLED,          K3PD_STATUS_INVALID_ARGUMENT,
    K3PD_STATUS_DEADLINE_EXCEEDED, K3PD_STATUS_RESOURCE_EXHAUSTED, K3PD_STATUS_UNAVAILABLE,
    K3PD_STATUS_INTERNAL};
static const char *const ROLE_VALUES[] = {K3PD_ROLE_PREFILL, K3PD_ROLE_DECODE};
static const char *const REGION_VALUES[] = {K3PD_REGION_MLA_PAGES, K3PD_REGION_KDA_STATE};
static const char *const PATH_VALUES[] = {K3PD_PATH_HOST, K3PD_PATH_STAGED, K3PD_PATH_CUDA_IPC,
                                            K3PD_PATH_UCX_CUDA};
static const char *const POOL_VALUES[] = {K3PD_POOL_RESERVED, K3PD_POOL_USED, K3PD_POOL_FREE, K3PD_POOL_CACHED};
static const char *const LOOKUP_VALUES[] = {"hit", "miss"};
static const char *const RESUME_VALUES[] = {"received", "fallback"};
static const char *const EXPORT_VALUES[] = {"ok", "failed"};
static const char *const STEP_KIND_VALUES[] = {"eager", "captured", "replayed"};
static const char *const REJECT_VALUES[] = {K3PD_REJECT_STALE_EPOCH, K3PD_REJECT_DIGEST_MISMATCH,
                                            K3PD_REJECT_FINGERPRINT_MISMATCH,
                                            K3PD_REJECT_UNKNOWN_REQUEST};
static const char *const FAIL_VALUES[] = {K3PD_HANDOFF_FAIL_TRANSPORT, K3PD_HANDOFF_FAIL_TIMEOUT,
                                          K3PD_HANDOFF_FAIL_REJECTED};
static const char *const HTTP_ROUTE_VALUES[] = {K3PD_HTTP_ROUTE_CHAT, K3PD_HTTP_ROUTE_COMPLETIONS,
                                                K3PD_HTTP_ROUTE_MODELS, K3PD_HTTP_ROUTE_OPS,
                                                K3PD_HTTP_ROUTE_OTHER};
static const char *const HTTP_CODE_VALUES[] = {K3PD_HTTP_CODES};
static const char *const AUTH_VALUES[] = {K3PD_AUTH_MISSING_KEY, K3PD_AUTH_UNKNOWN_KEY, K3PD_AUTH_RATE_LIMITED,
                                          K3PD_AUTH_CONCURRENCY_LIMITED};
static const char *const REFUSAL_VALUES[] = {K3PD_REFUSAL_IDENTITY, K3PD_REFUSAL_EPOCH, K3PD_REFUSAL_MODEL,
                                             K3PD_REFUSAL_INVALID};
#define N(a) (sizeof(a) / sizeof((a)[0]))

enum { R_ALL, R_ROUTER, R_PREFILL, R_DECODE };
static const char *const ROLE_NAMES[] = {"all", "router", "prefill", "decode"};

typedef struct {
  int role;
  const char *name;
  k3_metric_type_t type;
  const char *label;          /* NULL: unlabelled */
  const char *const *presets; /* values of label */
  size_t npresets;
  const double *buckets; /* histograms; NULL: K3_METRIC_LATENCY_BUCKETS */
  size_t nbuckets;
  size_t offset; /* of the k3_metric_t * in the role struct */
  const char *help;
} row_t;

/* Families with a second label (its presets are crossed with the first label's). */
typedef struct {
  const char *name;
  const char *label2;
  const char *const *presets2;
  size_t npresets2;
} row2_t;

#define C K3_METRIC_COUNTER
#define G K3_METRIC_GAUGE
#define H K3_METRIC_HISTOGRAM
#define RT(f) offsetof(k3_router_metrics_t, f)
#define PF(f) offsetof(k3_prefill_metrics_t, f)
#define DC(f) offsetof(k3_decode_metrics_t, f)
#define L(name, arr) name, arr, N(arr)
#define NOL NULL, NULL, 0
#define B(arr) arr, N(arr)
#define NOB NULL, 0

static const row_t ROWS[] = {
    {R_ALL, "k3pd_build_info", G, NOL, NOB, 0,
     "Constant 1, labelled with the process role and k3pd version."},
    /* router */
    {R_ROUTER, "k3pd_router_requests_started_total", C, NOL, NOB, RT(requests_started_total),
     "Generate requests accepted by the router."},
    {R_ROUTER, "k3pd_router_requests_total", C, L("status", STATUS_VALUES), NOB,
     RT(requests_total), "Generate requests finished, by final status."},
    {R_ROUTER, "k3pd_router_prompt_tokens_total", C, NOL, NOB, RT(prompt_tokens_total),
     "Prompt tokens of accepted requests."},
    {R_ROUTER, "k3pd_router_generation_tokens_total", C, NOL, NOB, RT(generation_tokens_total),
     "Tokens streamed to clients."},
    {R_ROUTER, "k3pd_router_time_to_first_token_seconds", H, NOL, B(K3PD_TTFT_BUCKETS),
     RT(ttft_seconds), "Time from request arrival to the first token sent to the client."},
    {R_ROUTER, "k3pd_router_inter_token_latency_seconds", H, NOL, B(K3PD_TOKEN_BUCKETS),
     RT(itl_seconds), "Time between consecutive tokens sent to the client."},
    {R_ROUTER, "k3pd_router_e2e_request_latency_seconds", H, NOL, B(K3PD_TTFT_BUCKETS),
     RT(e2e_seconds), "Time from request arrival to its final status."},
    {R_ROUTER, "k3pd_router_queue_time_seconds", H, NOL, B(K3PD_TTFT_BUCKETS), RT(queue_seconds),
     "Time from request arrival until its prefill is dispatched to a worker."},
    {R_ROUTER, "k3pd_router_added_latency_seconds", H, NOL, B(K3PD_OVERHEAD_BUCKETS),
     RT(added_latency_seconds),
     "Router processing time per request (parsing, scheduling, relaying), excluding workers."},
    {R_ROUTER, "k3pd_router_active_streams", G, NOL, NOB, RT(active_streams),
     "Client streams currently open."},
    {R_ROUTER, "k3pd_router_registered_workers", G, L("role", ROLE_VALUES), NOB,
     RT(registered_workers), "Workers registered and ready, by role."},
    {R_ROUTER, "k3pd_router_prefill_retries_total", C, NOL, NOB, RT(prefill_retries_total),
     "Prefills re-dispatched to another worker after a worker failed or drained."},
    {R_ROUTER, "k3pd_router_request_restarts_total", C, NOL, NOB, RT(request_restarts_total),
     "Requests run again on other workers after a worker failed them (streams resumed when tokens were sent)."},
    {R_ROUTER, "k3pd_router_workers_lost_total", C, L("role", ROLE_VALUES), NOB, RT(workers_lost_total),
     "Workers dropped as soon as their connection broke (health watch), before any heartbeat timeout."},
    {R_ROUTER, "k3pd_router_tokenize_seconds", H, NOL, NOB, RT(tokenize_seconds),
     "Time a text or chat prompt spent on the router's tokenisation pool (queued + encoding), off the loop."},
    {R_ROUTER, "k3pd_router_loop_lag_seconds", H, NOL, B(K3PD_OVERHEAD_BUCKETS), RT(loop_lag_seconds),
     "How late the router's event loop runs: a 20 ms timer's delay past its due time, every tick."},
    {R_ROUTER, "k3pd_router_http_requests_total", C, L("route", HTTP_ROUTE_VALUES), NOB, RT(http_requests_total),
     "HTTP API requests answered, by route and HTTP status code."},
    {R_ROUTER, "k3pd_router_http_io_seconds_total", C, NOL, NOB, RT(http_io_seconds_total),
     "Time the router's loop spent inside libmicrohttpd (reading and parsing HTTP, writing responses)."},
    {R_ROUTER, "k3pd_router_auth_failures_total", C, L("reason", AUTH_VALUES), NOB, RT(auth_failures_total),
     "Public requests (gRPC and HTTP) refused by the API-key check, by reason."},
    {R_ROUTER, "k3pd_router_cluster_refusals_total", C, L("reason", REFUSAL_VALUES), NOB, RT(cluster_refusals_total),
     "Cluster calls (RegisterWorker, Heartbeat, DeregisterWorker) refused, by reason."},
    /* prefill */
    {R_PREFILL, K3PD_M_PREFILL_QUEUED_PROMPT_TOKENS, G, NOL, NOB, PF(queued_prompt_tokens),
     "Prompt tokens of prompts whose prefill has not finished (the prefill autoscaling signal)."},
    {R_PREFILL, "k3pd_prefill_queued_requests", G, NOL, NOB, PF(queued_requests),
     "Requests waiting for a prefill batch."},
    {R_PREFILL, "k3pd_prefill_running_requests", G, NOL, NOB, PF(running_requests),
     "Sequences in the prefill batch now running."},
    {R_PREFILL, "k3pd_prefill_tokens_total", C, NOL, NOB, PF(tokens_total),
     "Prompt tokens prefilled."},
    {R_PREFILL, "k3pd_prefill_forward_seconds", H, NOL, NOB, PF(forward_seconds),
     "Duration of one batched prefill forward pass."},
    {R_PREFILL, "k3pd_prefill_passes_total", C, NOL, NOB, PF(passes_total),
     "Prefill forward passes (each takes at most one chunk of every prompt in it)."},
    {R_PREFILL, "k3pd_prefill_first_token_passes", H, NOL, B(K3PD_PASS_BUCKETS), PF(first_token_passes),
     "Forward passes a prompt's wait for its first token overlapped (the one running at arrival and its own "
     "last one included)."},
    {R_PREFILL, "k3pd_prefill_resume_total", C, L("outcome", RESUME_VALUES), NOB, PF(resume_total),
     "Long-suffix resumes: received = the decode worker's cached state arrived and only the suffix was computed; "
     "fallback = the prompt was computed from token 0."},
    {R_PREFILL, "k3pd_prefill_resume_tokens_total", C, NOL, NOB, PF(resume_tokens_total),
     "Prompt tokens not recomputed because their state was received from a decode worker's cache."},
    {R_PREFILL, "k3pd_prefill_requests_total", C, L("status", STATUS_VALUES), NOB,
     PF(requests_total), "Prefill requests finished, by final status."},
    {R_PREFILL, "k3pd_prefill_handoff_bytes_total", C, L("region", REGION_VALUES), NOB,
     PF(handoff_bytes_total), "Bytes of sequence state handed off to decode, by region kind."},
    {R_PREFILL, "k3pd_prefill_handoff_seconds", H, L("region", REGION_VALUES), NOB,
     PF(handoff_seconds), "Duration of one handoff transfer, by region kind."},
    {R_PREFILL, "k3pd_prefill_handoff_failures_total", C, L("reason", FAIL_VALUES), NOB,
     PF(handoff_failures_total), "Handoffs that failed, by reason."},
    {R_PREFILL, "k3pd_prefill_transfer_path", G, L("path", PATH_VALUES), NOB, PF(transfer_path),
     "1 for the transfer path in use (host, staged through pinned memory, CUDA direct)."},
    /* decode */
    {R_DECODE, "k3pd_decode_kv_pages", G, L("state", POOL_VALUES), NOB, DC(kv_pages),
     "MLA KV pages by state (reserved for a pending handoff, used, free, cached: held only by the prefix cache)."},
    {R_DECODE, "k3pd_decode_kda_slots", G, L("state", POOL_VALUES), NOB, DC(kda_slots),
     "KDA recurrent-state slots by state (reserved, used, free, cached: prefix-cache checkpoints)."},
    {R_DECODE, K3PD_M_DECODE_KV_UTILIZATION_RATIO, G, NOL, NOB, DC(kv_utilization_ratio),
     "Non-free fraction of the scarcer pool, max(pages, slots), 0..1 (the decode autoscaling signal)."},
    {R_DECODE, "k3pd_decode_running_sequences", G, NOL, NOB, DC(running_sequences),
     "Sequences in the decode batch."},
    {R_DECODE, "k3pd_decode_step_seconds", H, NOL, B(K3PD_TOKEN_BUCKETS), DC(step_seconds),
     "Duration of one batched decode step."},
    {R_DECODE, "k3pd_decode_generated_tokens_total", C, NOL, NOB, DC(generated_tokens_total),
     "Tokens generated."},
    {R_DECODE, "k3pd_decode_reservation_wait_seconds", H, NOL, NOB, DC(reservation_wait_seconds),
     "Time from reserving pages/slots for a handoff to accepting its DONE."},
    {R_DECODE, "k3pd_decode_lease_expiries_total", C, NOL, NOB, DC(lease_expiries_total),
     "Reservations released because their lease expired before a DONE arrived."},
    {R_DECODE, "k3pd_decode_rejected_dones_total", C, L("reason", REJECT_VALUES), NOB,
     DC(rejected_dones_total), "Handoff DONE messages rejected, by reason."},
    {R_DECODE, "k3pd_decode_requests_total", C, L("status", STATUS_VALUES), NOB,
     DC(requests_total), "Decode requests finished, by final status."},
    {R_DECODE, "k3pd_decode_cache_lookups_total", C, L("result", LOOKUP_VALUES), NOB, DC(cache_lookups_total),
     "Prefix-cache lookups at Reserve, by result (hit: a KDA checkpoint matched a prefix of the prompt)."},
    {R_DECODE, "k3pd_decode_cache_hit_tokens_total", C, NOL, NOB, DC(cache_hit_tokens_total),
     "Prompt tokens not recomputed because a cached prefix held their state."},
    {R_DECODE, "k3pd_decode_cache_evictions_total", C, NOL, NOB, DC(cache_evictions_total),
     "Prefix-cache entries evicted (LRU, for the byte budget or to admit a request)."},
    {R_DECODE, "k3pd_decode_cache_entries", G, NOL, NOB, DC(cache_entries),
     "Prefix-cache entries (each a KDA checkpoint plus references to its MLA pages)."},
    {R_DECODE, "k3pd_decode_local_prefill_tokens_total", C, NOL, NOB, DC(local_prefill_tokens_total),
     "Prompt tokens this decode worker computed itself (cache-hit suffixes and the tails after a handoff)."},
    {R_DECODE, "k3pd_decode_cache_exports_total", C, L("outcome", EXPORT_VALUES), NOB, DC(cache_exports_total),
     "Cached prefix states sent to a prefill worker for a long-suffix resume (Decode.Export), by outcome."},
    {R_DECODE, "k3pd_decode_steps_total", C, L("kind", STEP_KIND_VALUES), NOB, DC(steps_total),
     "Decode steps by how they ran on a CUDA backend: eager (op by op), captured (a CUDA graph captured and "
     "launched: the workspace or the key was new) or replayed; host backends count every step as eager."},
    {R_DECODE, "k3pd_decode_local_prefill_seconds", H, NOL, NOB, DC(local_prefill_seconds),
     "Time the engine spent computing the prompt suffixes admitted in one loop turn (prefix-cache hits and "
     "the tails after a handoff), during which no decode step runs."},
};

static const row2_t SECOND_LABELS[] = {
    {"k3pd_router_http_requests_total", L("code", HTTP_CODE_VALUES)},
};

static const row2_t *second_label(const char *name) {
  for (size_t i = 0; i < N(SECOND_LABELS); i++)
    if (strcmp(SECOND_LABELS[i].name, name) == 0) return &SECOND_LABELS[i];
  return NULL;
}

static int register_role(k3_metrics_t *m, int role, const char *version, void *out,
                         k3_metric_t **build_info) {
  for (size_t i = 0; i < N(ROWS); i++) {
    const row_t *r = &ROWS[i];
    if (r->role != role && r->role != R_ALL) continue;
    k3_metric_desc_t d = {.name = r->name, .help = r->help, .type = r->type,
                          .buckets = r->buckets, .nbuckets = r->nbuckets};
    static const char *const build_labels[] = {"role", "version"};
    const row2_t *r2 = r->label ? second_label(r->name) : NULL;
    const char *names[2] = {r->label, r2 ? r2->label2 : NULL};
    const char *pairs[2 * K3_METRIC_MAX_SERIES]; /* copied by k3_metrics_register */
    if (r->role == R_ALL) {
      d.label_names = build_labels;
      d.nlabels = 2;
    } else if (r2) {
      /* every (first, second) pair, so each series renders from the first scrape */
      if (r->npresets * r2->npresets2 > K3_METRIC_MAX_SERIES) return K3_ECAPACITY;
      for (size_t a = 0; a < r->npresets; a++)
        for (size_t b = 0; b < r2->npresets2; b++) {
          pairs[2 * (a * r2->npresets2 + b)] = r->presets[a];
          pairs[2 * (a * r2->npresets2 + b) + 1] = r2->presets2[b];
        }
      d.label_names = names;
      d.nlabels = 2;
      d.presets = pairs;
      d.npresets = r->npresets * r2->npresets2;
    } else if (r->label) {
      d.label_names = &r->label;
      d.nlabels = 1;
      d.presets = r->presets;
      d.npresets = r->npresets;
    }
    k3_metric_t *f;
    int rc = k3_metrics_register(m, &d, &f);
    if (rc) return rc;
    if (r->role == R_ALL) {
      const char *lv[] = {ROLE_NAMES[role], version ? version : "unknown"};
      if ((rc = k3_metric_set(f, lv, 1.0))) return rc;
      *build_info = f;
    } else {
      memcpy((char *)out + r->offset, &f, sizeof f);
    }
  }
  return 0;
}

int k3_router_metrics_register(k3_metrics_t *m, const char *version, k3_router_metrics_t *out) {
  memset(out, 0, sizeof *out);
  return register_role(m, R_ROUTER, version, out, &out->build_info);
}

int k3_prefill_metrics_register(k3_metrics_t *m, const char *version, k3_prefill_metrics_t *out) {
  memset(out, 0, sizeof *out);
  int rc = register_role(m, R_PREFILL, version, out, &out->build_info);
  if (!rc) rc = k3_prefill_metrics_set_path(out, K3PD_PATH_HOST);
  return rc;
}

int k3_decode_metrics_register(k3_metrics_t *m, const char *version, k3_decode_metrics_t *out) {
  memset(out, 0, sizeof *out);
  return register_role(m, R_DECODE, version, out, &out->build_info);
}

static double frac(long busy, long total) { return total > 0 ? (double)busy / (double)total : 0; }

void k3_decode_metrics_set_pools_cached(k3_decode_metrics_t *dm, long pr, long pu, long pf, long pc, long sr,
                                        long su, long sf, long sc) {
  const char *st[4] = {K3PD_POOL_RESERVED, K3PD_POOL_USED, K3PD_POOL_FREE, K3PD_POOL_CACHED};
  long pages[4] = {pr, pu, pf, pc}, slots[4] = {sr, su, sf, sc};
  for (int i = 0; i < 4; i++) {
    k3_metric_set(dm->kv_pages, &st[i], (double)pages[i]);
    k3_metric_set(dm->kda_slots, &st[i], (double)slots[i]);
  }
  double a = frac(pr + pu, pr + pu + pf + pc), b = frac(sr + su, sr + su + sf + sc);
  k3_gauge_set(k3_metric_default(dm->kv_utilization_ratio), a > b ? a : b);
}

void k3_decode_metrics_set_pools(k3_decode_metrics_t *dm, long pr, long pu, long pf, long sr,
                                 long su, long sf) {
  /* Presets exist for every state, so these lookups never allocate or fail. */
  const char *st[3] = {K3PD_POOL_RESERVED, K3PD_POOL_USED, K3PD_POOL_FREE};
  long pages[3] = {pr, pu, pf}, slots[3] = {sr, su, sf};
  for (int i = 0; i < 3; i++) {
    k3_metric_set(dm->kv_pages, &st[i], (double)pages[i]);
    k3_metric_set(dm->kda_slots, &st[i], (double)slots[i]);
  }
  double a = frac(pr + pu, pr + pu + pf), b = frac(sr + su, sr + su + sf);
  k3_gauge_set(k3_metric_default(dm->kv_utilization_ratio), a > b ? a : b);
}

int k3_prefill_metrics_set_path(k3_prefill_metrics_t *pm, const char *path) {
  size_t hit = N(PATH_VALUES);
  for (size_t i = 0; i < N(PATH_VALUES); i++)
    if (path && strcmp(path, PATH_VALUES[i]) == 0) hit = i;
  if (hit == N(PATH_VALUES)) return K3_EINVAL;
  for (size_t i = 0; i < N(PATH_VALUES); i++) {
    int rc = k3_metric_set(pm->transfer_path, &PATH_VALUES[i], i == hit ? 1.0 : 0.0);
    if (rc) return rc;
  }
  return 0;
}

size_t k3pd_metrics_catalog(size_t i, const char **name, k3_metric_type_t *type,
                            const char **help, const char **role) {
  if (i < N(ROWS)) {
    *name = ROWS[i].name;
    *type = ROWS[i].type;
    *help = ROWS[i].help;
    *role = ROLE_NAMES[ROWS[i].role];
  }
  return N(ROWS);
}
