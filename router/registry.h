/* Router worker registry and pairing policy (pure bookkeeping: no I/O, no clocks of its own).
 *
 * Workers register themselves through the Cluster service and heartbeat with their load; the
 * router holds no static worker list. This module keeps the table, expires workers that miss
 * heartbeats, and chooses the (decode, prefill) pair for a request:
 *   1. decode first: among ACTIVE decode workers with the request's model fingerprint and
 *      enough free KV pages (ceil((prompt + max_new) / page_tokens)) and a free KDA slot,
 *      pick the one with the lowest utilisation after admission (max of page and slot use),
 *      ties broken by fewer running sequences, then by id;
 *   2. then prefill: among ACTIVE prefill workers with the same fingerprint, the one with the
 *      fewest queued prompt tokens (including what this router has sent it and not yet seen
 *      acknowledged), ties by id.
 * A decode worker's used pages/slots are max(reported, in-flight), where in-flight counts the
 * reservations this router placed there and has not yet seen end. Heartbeats do not reset it:
 * a heartbeat generated while Reserve calls were on the wire would under-count them and a burst
 * would overrun the worker (seen in the e2e test). With one router the in-flight count is exact;
 * with several, the reported load covers the other routers' share. Prefill queues use the
 * reported queue plus what was sent since the last heartbeat ("pending"), a balancing hint only.
 *
 * Errors: K3_EUNAVAIL when a role has no eligible worker at all (→ gRPC UNAVAILABLE),
 * K3_ECAPACITY when decode workers exist but none can take the request (→ RESOURCE_EXHAUSTED).
 * Not thread-safe: owned by the router's loop thread. */
#ifndef K3PD_ROUTER_REGISTRY_H
#define K3PD_ROUTER_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { RT_ROLE_PREFILL = 1, RT_ROLE_DECODE = 2 } rt_role_t;
typedef enum { RT_WORKER_ACTIVE = 0, RT_WORKER_DRAINING = 1 } rt_worker_state_t;

#define RT_ID_MAX 128
#define RT_ADDR_MAX 256
#define RT_CACHE_KEYS_MAX 512

typedef struct {
  char id[RT_ID_MAX];       /* unique worker id (pod name or host:port) */
  rt_role_t role;
  char address[RT_ADDR_MAX]; /* gRPC address the router dials, HOST:PORT */
  uint64_t fingerprint;     /* model state-manifest fingerprint */
  /* capacity (decode: pages/slots; prefill: max batch tokens) */
  int64_t kv_pages_total;
  int32_t page_tokens;
  int32_t kda_slots_total;
  int32_t max_batch;
  int64_t max_context;      /* decode: longest prompt + completion a sequence may reach (0 = unknown) */
  /* load as last reported */
  int64_t kv_pages_used;
  int32_t kda_slots_used;
  int32_t running;
  int64_t queued_prompt_tokens;
  bool draining;
} rt_worker_info_t;

typedef struct {
  rt_worker_info_t info;
  rt_worker_state_t state;
  int64_t last_seen_ms;
  /* router-side accounting */
  int64_t inflight_pages;        /* decode: pages of this router's live requests placed here */
  int32_t inflight_slots;        /* decode: their KDA slots */
  int64_t pending_prompt_tokens; /* prefill: prompt tokens sent since the last heartbeat */
  uint32_t generation;  /* bumps on every fresh registration of the id (registry.c) */
  uint32_t incarnation; /* bumps when a new process takes the id; in-flight counts belong to one */
  uint64_t reg_epoch;   /* registration epoch handed to the worker (random, never 0): Heartbeat and
                           Deregister must carry it (cluster_svc.c) */
  char identity[RT_ID_MAX]; /* certificate identity that registered it ("" without TLS; logs) */
  /* decode prefix cache as last reported (heartbeats): chained block hashes of its cached
   * prefixes (k3pd/prefix_hash.h), sorted ascending for lookups; block size in tokens */
  uint64_t cache_keys[RT_CACHE_KEYS_MAX];
  uint32_t n_cache_keys;
  uint32_t cache_block;
} rt_worker_t;

typedef struct {
  rt_worker_t *workers; /* owned array */
  size_t n, cap;
} rt_registry_t;

void rt_registry_init(rt_registry_t *r);
void rt_registry_free(rt_registry_t *r);

/* Registers or refreshes a worker (Register and Heartbeat both land here). Validates the info
 * (non-empty id and address, sane capacities); on error returns K3_EINVAL with a message naming
 * the field in err and changes nothing. *is_new is set when the id was not known. A heartbeat
 * replaces the reported load and clears the pending counters (the report now includes them). */
int rt_registry_upsert(rt_registry_t *r, const rt_worker_info_t *info, int64_t now_ms, bool *is_new, char *err,
                       size_t errlen);
/* Removes a worker; returns 0 or K3_ENOENT. */
int rt_registry_remove(rt_registry_t *r, const char *id);
/* Drops every worker whose last heartbeat is older than timeout_ms; returns how many. */
size_t rt_registry_expire(rt_registry_t *r, int64_t now_ms, int64_t timeout_ms);
rt_worker_t *rt_registry_find(rt_registry_t *r, const char *id);
size_t rt_registry_count(const rt_registry_t *r, rt_role_t role, bool active_only);

/* Largest max_context among ACTIVE decode workers with the fingerprint (0 = any); 0 if none
 * report one. */
int64_t rt_max_context(const rt_registry_t *r, uint64_t fingerprint);

/* Pages a request needs on a decode worker with the given page size. */
int64_t rt_pages_needed(int64_t prompt_tokens, int64_t max_new_tokens, int32_t page_tokens);

/* Chooses a decode worker for the request (fingerprint 0 = any). Returns its index in
 * r->workers via *out, or K3_EUNAVAIL / K3_ECAPACITY. Does not change the registry. */
int rt_choose_decode(const rt_registry_t *r, int64_t prompt_tokens, int64_t max_new_tokens, uint64_t fingerprint,
                     size_t *out);
/* Like rt_choose_decode but counting only this router's in-flight reservations (ignoring the
 * reported load, which may be a heartbeat behind). Used when the reports say "full": the decode
 * worker's Reserve is the final judge, so a stale report never turns away a request that fits. */
int rt_choose_decode_optimistic(const rt_registry_t *r, int64_t prompt_tokens, int64_t max_new_tokens,
                                uint64_t fingerprint, size_t *out);
/* Either of the two above (use_reports false = optimistic), skipping the decode workers whose
 * ids are in `exclude` (a request restarted after a decode worker failed it). K3_EUNAVAIL when
 * no other eligible decode worker exists. */
int rt_choose_decode_except(const rt_registry_t *r, int64_t prompt_tokens, int64_t max_new_tokens,
                            uint64_t fingerprint, bool use_reports, const char *const *exclude, size_t n_exclude,
                            size_t *out);
/* Cache-aware placement (docs/design.md "Prefix cache"): like rt_choose_decode_except, but among
 * the eligible decode workers the one with the lowest cost = (prompt tokens not cached there)
 * + load_tokens x (utilisation after admission), ties as before. "Cached there" is the longest
 * prefix of `ids` whose chained block hash the worker last reported (at most n - 1 tokens: the
 * last one is always computed); *cached (may be NULL) gets it for the chosen worker. The
 * reports may be stale: the decode worker's own lookup decides what is really reused. ids NULL
 * = no cache scoring (cost = utilisation only, as rt_choose_decode_except). */
int rt_choose_decode_cached(const rt_registry_t *r, const uint32_t *ids, int64_t prompt_tokens, int64_t max_new_tokens,
                            uint64_t fingerprint, bool use_reports, const char *const *exclude, size_t n_exclude,
                            double load_tokens, size_t *out, int64_t *cached);
/* Replaces the worker's reported cache summary (keys are copied and sorted; at most
 * RT_CACHE_KEYS_MAX kept). */
void rt_worker_set_cache(rt_worker_t *w, const uint64_t *keys, size_t n, uint32_t block);
/* Tokens of ids[0..n) the worker's reported cache holds (a multiple of its block, <= n - 1). */
int64_t rt_worker_cached_tokens(const rt_worker_t *w, const uint32_t *ids, size_t n);

/* Chooses a prefill worker with the fingerprint (0 = any), skipping ids in `exclude` (for
 * retries after a prefill failed). Returns 0 and the index, or K3_EUNAVAIL. */
int rt_choose_prefill(const rt_registry_t *r, uint64_t fingerprint, const char *const *exclude, size_t n_exclude,
                      size_t *out);

/* Router-side accounting: decode reservations placed here (until the request ends) and prefill
 * tokens sent since the last heartbeat. Subtraction clamps at zero. */
void rt_worker_add_inflight(rt_worker_t *w, int64_t pages, int32_t slots);
void rt_worker_sub_inflight(rt_worker_t *w, int64_t pages, int32_t slots);
void rt_worker_add_pending(rt_worker_t *w, int64_t prompt_tokens);
void rt_worker_sub_pending(rt_worker_t *w, int64_t prompt_tokens);

#endif
