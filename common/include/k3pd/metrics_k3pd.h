/* Every k3pd metric, declared once: names, help, types, labels, buckets, and one register
 * function per role that creates them in a registry so the binaries only update them.
 *
 * The table in metrics_k3pd.c is the single source of truth; docs/metrics.md lists the same
 * metrics and a unit test checks that every name here appears there (and in no other
 * spelling). Prometheus conventions: prefix "k3pd_<role>_", base units in the name
 * ("_seconds", "_bytes"), "_total" on counters, label values lower_snake_case.
 *
 * Label values are fixed sets (the presets below); the binaries must use exactly these
 * strings so series render from the first scrape and dashboards can rely on them.
 *
 * Not here: the HTTP server (metrics.h), health/drain logic (the binaries). */
#ifndef K3PD_METRICS_K3PD_H
#define K3PD_METRICS_K3PD_H

#include "k3pd/metrics.h"

/* ---- label values (use these strings exactly) ---- */
/* status: final gRPC-style outcome of a request */
#define K3PD_STATUS_OK "ok"
#define K3PD_STATUS_CANCELLED "cancelled"
#define K3PD_STATUS_INVALID_ARGUMENT "invalid_argument"
#define K3PD_STATUS_DEADLINE_EXCEEDED "deadline_exceeded"
#define K3PD_STATUS_RESOURCE_EXHAUSTED "resource_exhausted"
#define K3PD_STATUS_UNAVAILABLE "unavailable"
#define K3PD_STATUS_INTERNAL "internal"
/* role of a registered worker */
#define K3PD_ROLE_PREFILL "prefill"
#define K3PD_ROLE_DECODE "decode"
/* region kind of handed-off state */
#define K3PD_REGION_MLA_PAGES "mla_pages"
#define K3PD_REGION_KDA_STATE "kda_state"
/* transfer path chosen by the prefill worker's transport (k3_xfer_path_t: the names of
 * k3_xfer_path_name with '_' for '-') */
#define K3PD_PATH_HOST "host"
#define K3PD_PATH_STAGED "staged"
#define K3PD_PATH_CUDA_IPC "cuda_ipc"
#define K3PD_PATH_UCX_CUDA "ucx_cuda"
/* pool state of KV pages / KDA slots on a decode worker */
#define K3PD_POOL_RESERVED "reserved" /* held for a handoff whose data has not landed */
#define K3PD_POOL_USED "used"         /* holding a live sequence's state */
#define K3PD_POOL_FREE "free"
#define K3PD_POOL_CACHED "cached"     /* held only by the prefix cache (evictable on demand) */
/* reason a decode worker rejected a handoff DONE */
#define K3PD_REJECT_STALE_EPOCH "stale_epoch"
#define K3PD_REJECT_DIGEST_MISMATCH "digest_mismatch"
#define K3PD_REJECT_FINGERPRINT_MISMATCH "fingerprint_mismatch"
#define K3PD_REJECT_UNKNOWN_REQUEST "unknown_request"
/* reason a prefill handoff failed */
#define K3PD_HANDOFF_FAIL_TRANSPORT "transport"
#define K3PD_HANDOFF_FAIL_TIMEOUT "timeout"
#define K3PD_HANDOFF_FAIL_REJECTED "rejected"
/* k3pd_router_auth_failures_total{reason}: public requests refused by the API-key check */
#define K3PD_AUTH_MISSING_KEY "missing_key"           /* no (or a malformed) bearer key */
#define K3PD_AUTH_UNKNOWN_KEY "unknown_key"           /* a key that is not in --api-keys */
#define K3PD_AUTH_RATE_LIMITED "rate_limited"         /* the key's request rate was exceeded */
#define K3PD_AUTH_CONCURRENCY_LIMITED "concurrency_limited" /* the key's requests in flight */
/* k3pd_router_cluster_refusals_total{reason}: Cluster calls refused on the cluster port */
#define K3PD_REFUSAL_IDENTITY "identity" /* certificate does not cover the worker_id */
#define K3PD_REFUSAL_EPOCH "epoch"       /* wrong registration epoch; id held by a live worker */
#define K3PD_REFUSAL_MODEL "model"       /* model fingerprint differs from the cluster's */
#define K3PD_REFUSAL_INVALID "invalid"   /* malformed request, capacity out of bounds, address taken */
/* route of an HTTP request to the router's OpenAI-compatible port (code: the HTTP status) */
#define K3PD_HTTP_ROUTE_CHAT "chat_completions" /* POST /v1/chat/completions */
#define K3PD_HTTP_ROUTE_COMPLETIONS "completions" /* POST /v1/completions */
#define K3PD_HTTP_ROUTE_MODELS "models"         /* GET /v1/models[/ID] */
#define K3PD_HTTP_ROUTE_OPS "ops"               /* /healthz /readyz /health /metrics */
#define K3PD_HTTP_ROUTE_OTHER "other"           /* anything else (404, 405) */
/* HTTP status codes the router answers with ("499": the client went away before a response) */
#define K3PD_HTTP_CODES \
  "200", "400", "401", "404", "405", "409", "413", "415", "429", "499", "500", "503", "504"
#define K3PD_HTTP_NCODES 13

/* ---- metric names used outside C (HPA rules, alerts, e2e tests) ---- */
#define K3PD_M_PREFILL_QUEUED_PROMPT_TOKENS "k3pd_prefill_queued_prompt_tokens"
#define K3PD_M_DECODE_KV_UTILIZATION_RATIO "k3pd_decode_kv_utilization_ratio"

/* Histogram bounds (seconds). */
#define K3PD_TTFT_BUCKETS_N 16
extern const double K3PD_TTFT_BUCKETS[K3PD_TTFT_BUCKETS_N];       /* 10 ms .. 120 s */
#define K3PD_TOKEN_BUCKETS_N 15
extern const double K3PD_TOKEN_BUCKETS[K3PD_TOKEN_BUCKETS_N];     /* 0.5 ms .. 2.5 s */
#define K3PD_OVERHEAD_BUCKETS_N 14
extern const double K3PD_OVERHEAD_BUCKETS[K3PD_OVERHEAD_BUCKETS_N]; /* 10 us .. 0.5 s */
#define K3PD_PASS_BUCKETS_N 12
extern const double K3PD_PASS_BUCKETS[K3PD_PASS_BUCKETS_N];       /* 1 .. 256 passes (counts) */

/* Every process: k3pd_build_info{role,version} = 1 (registered by each role function). */

typedef struct {
  k3_metric_t *build_info;              /* gauge {role,version} */
  k3_metric_t *requests_started_total;  /* counter */
  k3_metric_t *requests_total;          /* counter {status}: finished requests */
  k3_metric_t *prompt_tokens_total;     /* counter */
  k3_metric_t *generation_tokens_total; /* counter */
  k3_metric_t *ttft_seconds;            /* histogram: request arrival -> first token sent */
  k3_metric_t *itl_seconds;             /* histogram: gap between consecutive tokens sent */
  k3_metric_t *e2e_seconds;             /* histogram: arrival -> final status */
  k3_metric_t *queue_seconds;           /* histogram: arrival -> prefill dispatched */
  k3_metric_t *added_latency_seconds;   /* histogram: router's own processing per request */
  k3_metric_t *active_streams;          /* gauge */
  k3_metric_t *registered_workers;      /* gauge {role} */
  k3_metric_t *prefill_retries_total;   /* counter: prefills re-dispatched to another worker */
  k3_metric_t *request_restarts_total;  /* counter: requests moved to other workers (new attempt) */
  k3_metric_t *workers_lost_total;      /* counter {role}: workers dropped as dead before their timeout */
  k3_metric_t *tokenize_seconds;        /* histogram: a prompt's time on the tokenisation pool (queue + work) */
  k3_metric_t *loop_lag_seconds;        /* histogram: how late a 20 ms timer of the router's loop fires */
  k3_metric_t *http_requests_total;     /* counter {route, code}: HTTP API requests answered */
  k3_metric_t *http_io_seconds_total;   /* counter: loop time in libmicrohttpd (HTTP parsing, writes) */
  k3_metric_t *auth_failures_total;     /* counter {reason}: public requests refused by API-key checks */
  k3_metric_t *cluster_refusals_total;  /* counter {reason}: Cluster calls refused (identity, epoch, ...) */
} k3_router_metrics_t;

typedef struct {
  k3_metric_t *build_info;
  k3_metric_t *queued_prompt_tokens;   /* gauge: prompt tokens waiting (not yet in a batch) */
  k3_metric_t *queued_requests;        /* gauge */
  k3_metric_t *running_requests;       /* gauge: sequences in the running prefill batch */
  k3_metric_t *tokens_total;           /* counter: prompt tokens prefilled */
  k3_metric_t *forward_seconds;        /* histogram: one batched prefill forward */
  k3_metric_t *passes_total;           /* counter: forward passes (each at most one chunk per prompt) */
  k3_metric_t *first_token_passes;     /* histogram: passes a prompt's wait for its first token spanned */
  k3_metric_t *requests_total;         /* counter {status} */
  k3_metric_t *handoff_bytes_total;    /* counter {region} */
  k3_metric_t *handoff_seconds;        /* histogram {region}: put posted -> completed */
  k3_metric_t *handoff_failures_total; /* counter {reason} */
  k3_metric_t *transfer_path;          /* gauge {path}: 1 for the path in use, 0 otherwise */
  k3_metric_t *resume_total;           /* counter {outcome}: long-suffix resumes (received / fallback) */
  k3_metric_t *resume_tokens_total;    /* counter: prompt tokens not recomputed thanks to received state */
} k3_prefill_metrics_t;

typedef struct {
  k3_metric_t *build_info;
  k3_metric_t *kv_pages;               /* gauge {state}: reserved/used/free MLA pages */
  k3_metric_t *kda_slots;              /* gauge {state}: reserved/used/free KDA state slots */
  k3_metric_t *kv_utilization_ratio;   /* gauge: max(page, slot) non-free fraction, 0..1 */
  k3_metric_t *running_sequences;      /* gauge */
  k3_metric_t *step_seconds;           /* histogram: one batched decode step */
  k3_metric_t *steps_total;            /* counter {kind}: eager / captured / replayed (CUDA graphs) */
  k3_metric_t *local_prefill_seconds;  /* histogram: one engine turn's local prompt suffixes (prefix cache) */
  k3_metric_t *generated_tokens_total; /* counter */
  k3_metric_t *reservation_wait_seconds; /* histogram: reserve -> DONE accepted */
  k3_metric_t *lease_expiries_total;   /* counter: reservations dropped because no DONE came */
  k3_metric_t *rejected_dones_total;   /* counter {reason} */
  k3_metric_t *requests_total;         /* counter {status} */
  k3_metric_t *cache_lookups_total;    /* counter {result}: prefix-cache lookups, hit / miss */
  k3_metric_t *cache_hit_tokens_total; /* counter: prompt tokens not recomputed thanks to hits */
  k3_metric_t *cache_evictions_total;  /* counter: cache entries evicted */
  k3_metric_t *cache_entries;          /* gauge: cache entries (KDA checkpoints) */
  k3_metric_t *local_prefill_tokens_total; /* counter: prompt tokens computed by this decode worker */
  k3_metric_t *cache_exports_total;    /* counter {outcome}: cached states sent to prefill workers (Export) */
} k3_decode_metrics_t;

/* Register every metric of a role into m (which should be empty of k3pd_ names) and fill
 * *out. version is the build_info label (e.g. K3PD_VERSION). Returns 0 or the first error of
 * k3_metrics_register (the registry may then hold some of the role's families; callers
 * treat any error as fatal at start-up). */
int k3_router_metrics_register(k3_metrics_t *m, const char *version, k3_router_metrics_t *out);
int k3_prefill_metrics_register(k3_metrics_t *m, const char *version, k3_prefill_metrics_t *out);
int k3_decode_metrics_register(k3_metrics_t *m, const char *version, k3_decode_metrics_t *out);

/* Sets kv_pages{state}, kda_slots{state} and kv_utilization_ratio together from pool counts,
 * so the ratio the HPA reads always agrees with the gauges. A pool with total 0 counts as
 * utilisation 0. The prefix cache's pages and slots (state "cached") are evictable on demand,
 * so the ratio counts them as free. */
void k3_decode_metrics_set_pools(k3_decode_metrics_t *dm, long pages_reserved, long pages_used,
                                 long pages_free, long slots_reserved, long slots_used,
                                 long slots_free);
void k3_decode_metrics_set_pools_cached(k3_decode_metrics_t *dm, long pages_reserved, long pages_used,
                                        long pages_free, long pages_cached, long slots_reserved,
                                        long slots_used, long slots_free, long slots_cached);

/* Sets transfer_path{path} to 1 for path (one of K3PD_PATH_*) and 0 for the others.
 * Returns K3_EINVAL for an unknown path (nothing changed). */
int k3_prefill_metrics_set_path(k3_prefill_metrics_t *pm, const char *path);

/* Iterates over every metric name/type/help of all roles (docs and tests): returns the
 * number of entries and, when i < count, fills *name, *type, *help and *role for entry i.
 * Shared metrics (build_info) are listed once with role "all". */
size_t k3pd_metrics_catalog(size_t i, const char **name, k3_metric_type_t *type,
                            const char **help, const char **role);

#endif
