/* k3pd-router: API keys of the public API (gRPC Generate and the OpenAI HTTP API alike).
 *
 * What it is for: with --api-keys FILE, every public request must carry
 * `authorization: Bearer KEY` (gRPC metadata) / `Authorization: Bearer KEY` (HTTP) with a key
 * from the file; each key has a request-rate limit (token bucket: `rate` requests per second,
 * bursts of `burst`) and a limit on its requests in flight (`concurrency`). Refusals:
 * missing or unknown key → UNAUTHENTICATED / HTTP 401; a limit reached → RESOURCE_EXHAUSTED /
 * HTTP 429. Health endpoints stay open (probes carry no keys).
 *
 * Key file: one key per line, `NAME KEY [rate=R] [burst=B] [concurrency=C]`; blank lines and
 * lines starting with '#' are skipped. NAME (letters, digits, '.', '_', '-', up to 64) appears in
 * logs, never the key. KEY is 16..512 printable ASCII characters without spaces. Per-key values
 * override the router's --api-key-rate / --api-key-burst / --api-key-concurrency (0 = no limit).
 *
 * Comparison: only SHA-256 digests of the keys are kept; a presented key is hashed and compared
 * with every digest in constant time (CRYPTO_memcmp, no early exit), so neither the content nor
 * the position of a key leaks through timing.
 *
 * Loop thread only (the router's): admission and release change the per-key counters. */
#ifndef K3PD_ROUTER_AUTH_H
#define K3PD_ROUTER_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/rpc.h"

typedef struct rt_auth rt_auth_t;
typedef struct rt_key rt_key_t;

typedef struct {
  double rate;          /* requests per second per key; 0 = unlimited */
  double burst;         /* bucket size; 0 = max(1, rate) */
  uint32_t concurrency; /* requests in flight per key; 0 = unlimited */
} rt_auth_limits_t;

/* Reads the key file. Returns 0, or K3_ENOENT/K3_EIO/K3_EINVAL with a message naming the file
 * and line (K3_EINVAL also for a file without keys or a key listed twice). */
int rt_auth_load(const char *path, const rt_auth_limits_t *defaults, rt_auth_t **out, char *err, size_t errlen);
void rt_auth_free(rt_auth_t *a);
size_t rt_auth_count(const rt_auth_t *a);

/* Admits one request carrying `authorization` (the header/metadata value, may be NULL) at
 * now_ns. On success returns K3_RPC_OK and a ticket in *key (release it exactly once with
 * rt_auth_release when the request ends). Otherwise returns UNAUTHENTICATED or
 * RESOURCE_EXHAUSTED with *reason (K3PD_AUTH_*) and a message starting with "authorization: ";
 * nothing is held. */
k3_rpc_code_t rt_auth_admit(rt_auth_t *a, const char *authorization, uint64_t now_ns, rt_key_t **key,
                            const char **reason, char *msg, size_t cap);
/* Ends a request admitted with `key` (NULL is a no-op). */
void rt_auth_release(rt_key_t *key);
/* The key's NAME (for logs). */
const char *rt_auth_key_name(const rt_key_t *key);

#endif
