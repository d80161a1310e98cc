/* k3_rpc: a small C layer over gRPC core (1.51) + protobuf-c, driven by a libuv loop.
 * This header: status codes shared by server and client, and the SERVER side.
 * The client side is in rpc_client.h; request validation in rpc_validate.h.
 *
 * Threading (the one rule): every k3_rpc_* function is called on the thread that runs the
 * uv loop the object was created on, and every callback runs on that thread. Internally a
 * drain thread blocks in grpc_completion_queue_next() and posts completions to the loop
 * through a locked queue + uv_async_send; after dispatching, the loop thread also polls the
 * completion queue without blocking (C-STACK.md §3 "pattern A + hybrid", P7), which keeps
 * back-to-back streaming near the plain-CQ rate. Nothing here blocks the loop.
 *
 * Ports are plaintext, TLS (server certificate only) or mutual TLS (both sides present a
 * certificate signed by the cluster CA; credentials in rpc_tls.h). A server may require every
 * call of a non-health method to come from a verified client certificate, optionally of given
 * identities (k3_rpc_server_require_peer); handlers read the peer's identity with
 * k3_rpc_call_peer_names. Not here: client-streaming / bidi methods (the protocol has none).
 *
 * Server call lifetime (refcounted; the handler holds one reference):
 *   call arrives -> request unpacked -> handler(call, req, user)
 *   the handler (now or later, from any callback on the loop) calls exactly ONE of
 *     k3_rpc_call_reply()   unary: message + OK
 *     k3_rpc_call_finish()  any kind: status (+ message text); for streams after the writes
 *   which releases the handler's reference. A handler that never finishes leaks the call and
 *   stalls server shutdown until the grace period cancels it (and even then its memory).
 *   Cancellation (client cancel, deadline, peer gone, server cancel-all) fires the cancel
 *   callback once; afterwards writes fail with K3_ECANCELED and finish only drops the ref. */
#ifndef K3PD_RPC_H
#define K3PD_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

/* gRPC status codes (same numeric values as grpc_status_code, so they go on the wire as is). */
typedef enum {
  K3_RPC_OK = 0,
  K3_RPC_CANCELLED = 1,
  K3_RPC_UNKNOWN = 2,
  K3_RPC_INVALID_ARGUMENT = 3,
  K3_RPC_DEADLINE_EXCEEDED = 4,
  K3_RPC_NOT_FOUND = 5,
  K3_RPC_ALREADY_EXISTS = 6,
  K3_RPC_PERMISSION_DENIED = 7,
  K3_RPC_RESOURCE_EXHAUSTED = 8,
  K3_RPC_FAILED_PRECONDITION = 9,
  K3_RPC_ABORTED = 10,
  K3_RPC_OUT_OF_RANGE = 11,
  K3_RPC_UNIMPLEMENTED = 12,
  K3_RPC_INTERNAL = 13,
  K3_RPC_UNAVAILABLE = 14,
  K3_RPC_DATA_LOSS = 15,
  K3_RPC_UNAUTHENTICATED = 16,
} k3_rpc_code_t;

/* "OK", "INVALID_ARGUMENT", ... (static string; "UNKNOWN_CODE" for out-of-range values). */
const char *k3_rpc_code_name(int code);
/* Maps a negative K3_E* code to the status a client should see (K3_EINVAL -> INVALID_ARGUMENT,
 * K3_ECAPACITY -> RESOURCE_EXHAUSTED, K3_EUNAVAIL -> UNAVAILABLE, K3_ESTALE ->
 * FAILED_PRECONDITION, ...; unknown -> INTERNAL; 0 -> OK). */
k3_rpc_code_t k3_rpc_code_from_err(int err);
/* The reverse, for clients that turn a status into a K3_E* return value (OK -> 0). */
int k3_rpc_err_from_code(int code);

/* Default message size limit in both directions when options leave it 0 (P5: gRPC's own
 * default receive limit is 4 MiB; reservation descriptors and long prompts can exceed it). */
#define K3_RPC_DEFAULT_MAX_MSG_BYTES (64 * 1024 * 1024)

/* ------------------------------------------------------------------------------------------ */
/* Server                                                                                     */

typedef struct k3_rpc_server k3_rpc_server_t;
typedef struct k3_rpc_call k3_rpc_call_t;

typedef enum { K3_RPC_UNARY = 0, K3_RPC_SERVER_STREAM = 1 } k3_rpc_kind_t;

/* Called on the loop thread for every call of a registered method. `req` is the unpacked
 * request, owned by the call: valid until the handler calls reply/finish (do not free it).
 * The handler must eventually call k3_rpc_call_reply() or k3_rpc_call_finish() exactly once. */
typedef void (*k3_rpc_handler_fn)(k3_rpc_call_t *call, const ProtobufCMessage *req, void *user);

/* Called at most once, on the loop thread, when the call ends abnormally before the handler
 * finished it: client cancel, deadline, transport failure, or server cancel-all at shutdown.
 * The handler should stop work and call k3_rpc_call_finish() (its status is then ignored). */
typedef void (*k3_rpc_cancel_fn)(k3_rpc_call_t *call, void *arg);

typedef struct {
  uint32_t max_msg_bytes;    /* receive + send limit; 0 = K3_RPC_DEFAULT_MAX_MSG_BYTES */
  uint32_t grace_ms;         /* shutdown: in-flight calls get this long before cancel-all;
                                0 = 5000 */
  uint32_t calls_per_method; /* outstanding request_registered_call per method; 0 = 8 */
} k3_rpc_server_opts_t;

/* Creates a server on `loop` (opts may be NULL). Calls grpc_init() (balanced in close).
 * *out is owned by the caller and released by k3_rpc_server_shutdown() (which also balances
 * grpc_init). On error nothing is returned in *out and no callback runs. The built-in
 * grpc.health.v1.Health service is registered; the overall status ("") starts NOT_SERVING. */
int k3_rpc_server_init(uv_loop_t *loop, const k3_rpc_server_opts_t *opts, k3_rpc_server_t **out);

/* Registers `path` ("/k3pd.v1.Decode/Reserve") before start. `req_desc` is the request type
 * (e.g. &k3pd__v1__reserve_request__descriptor). Returns K3_EEXIST for a duplicate path,
 * K3_EINVAL after start or for a path not starting with '/'. */
int k3_rpc_server_add_method(k3_rpc_server_t *srv, const char *path, k3_rpc_kind_t kind,
                             const ProtobufCMessageDescriptor *req_desc, k3_rpc_handler_fn fn,
                             void *user);

struct k3_rpc_tls;

/* Binds `addr` ("127.0.0.1:0", "0.0.0.0:50051") before start; *port_out (may be NULL) receives
 * the bound port. tls NULL: plaintext. tls given: TLS with its certificate; with `mutual`, every
 * client must present a certificate signed by tls's CA (the handshake fails otherwise). tls must
 * outlive the call. Returns 0, K3_EIO (cannot bind), K3_EINVAL (after start; mutual without a CA)
 * or K3_ENOMEM. A server may have several ports; every registered method is served on each. */
int k3_rpc_server_add_port(k3_rpc_server_t *srv, const char *addr, const struct k3_rpc_tls *tls, int mutual,
                           int *port_out);

/* Before start: every call of a method other than grpc.health.v1.Health must come from a
 * verified client certificate (else UNAUTHENTICATED, "peer: ... needs a client certificate"),
 * and, when n > 0, one whose identity covers one of names[0..n) (else PERMISSION_DENIED). The
 * names are copied. Health stays open so plaintext probe ports can share the server. */
int k3_rpc_server_require_peer(k3_rpc_server_t *srv, const char *const *names, size_t n);

/* Starts serving. With addr: binds it as a plaintext port first (*port_out, may be NULL, gets
 * the bound port; K3_EIO when it cannot be bound). With addr NULL: serves the ports added with
 * k3_rpc_server_add_port (K3_EINVAL when there are none). Can be called once. */
int k3_rpc_server_start(k3_rpc_server_t *srv, const char *addr, int *port_out);

/* Health (grpc.health.v1): status per service name; "" is the whole server. Watchers are told
 * of every change. Services never set are unknown (Check: NOT_FOUND; Watch: SERVICE_UNKNOWN). */
typedef enum { K3_RPC_HEALTH_SERVING = 1, K3_RPC_HEALTH_NOT_SERVING = 2 } k3_rpc_health_t;
int k3_rpc_server_set_health(k3_rpc_server_t *srv, const char *service, k3_rpc_health_t st);

/* Graceful shutdown (C-STACK.md §3): every health status -> NOT_SERVING, watchers finished,
 * no new calls; in-flight calls may complete for opts.grace_ms, then all are cancelled (their
 * cancel callbacks fire). When every call is gone the server, completion queue and drain thread
 * are destroyed, srv is freed, and then `done` runs on the loop (may be NULL).
 * Calling it before start is fine. Calling it twice is a programmer error. */
typedef void (*k3_rpc_server_done_fn)(void *arg);
void k3_rpc_server_shutdown(k3_rpc_server_t *srv, k3_rpc_server_done_fn done, void *arg);

/* Number of server calls alive (handler not finished or batches in flight). For tests. */
size_t k3_rpc_server_live_calls(const k3_rpc_server_t *srv);

/* ---- per-call API (loop thread only; `call` valid until the handler's reply/finish) ---- */

/* Unary success: packs `resp` (the caller keeps ownership of it and may free it as soon as
 * this returns) and sends it with status OK. Releases the handler's reference. Returns 0,
 * K3_ENOMEM (the client gets INTERNAL), or
 * K3_ECANCELED when the call was already cancelled (the reference is released either way). */
int k3_rpc_call_reply(k3_rpc_call_t *call, const ProtobufCMessage *resp);

/* Server stream: packs `msg` now (the caller keeps ownership) and queues it; exactly one
 * SEND_MESSAGE is outstanding per call (P6), so messages go out in order as sends complete.
 * Never uses GRPC_WRITE_BUFFER_HINT (P4). Returns 0, K3_ECANCELED once the call is cancelled
 * or the peer is gone, K3_EINVAL after finish or on a unary call. */
int k3_rpc_call_write(k3_rpc_call_t *call, const ProtobufCMessage *msg);

/* Ends the call with `code` and `details` (copied; may be NULL). For streams the status is
 * sent after every queued message. Releases the handler's reference; `call` must not be used
 * afterwards. Use K3_RPC_INVALID_ARGUMENT with a message naming the field for bad input. */
void k3_rpc_call_finish(k3_rpc_call_t *call, k3_rpc_code_t code, const char *details);
/* printf-style details. */
void k3_rpc_call_finishf(k3_rpc_call_t *call, k3_rpc_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void k3_rpc_call_set_cancel_cb(k3_rpc_call_t *call, k3_rpc_cancel_fn fn, void *arg);
int k3_rpc_call_is_cancelled(const k3_rpc_call_t *call);
/* Milliseconds until the client's deadline (<= 0: already past); INT64_MAX when none. */
int64_t k3_rpc_call_deadline_left_ms(const k3_rpc_call_t *call);
/* Value of request metadata `key` (lower case, e.g. "x-request-id") as a NUL-terminated copy
 * owned by the call, or NULL. An "x-request-id" is echoed back in the initial metadata. */
const char *k3_rpc_call_metadata(const k3_rpc_call_t *call, const char *key);
const char *k3_rpc_call_method(const k3_rpc_call_t *call);
/* Identity names of the call's verified client certificate (its DNS SANs, else its CN); the
 * array and strings are owned by the call. Returns the count; 0 for a plaintext call or a TLS
 * call without a verified client certificate. */
size_t k3_rpc_call_peer_names(const k3_rpc_call_t *call, const char *const **names);
/* 1 when one of those names covers `id` (k3_rpc_tls_name_covers), else 0. */
int k3_rpc_call_peer_covers(const k3_rpc_call_t *call, const char *id);
/* Messages queued but not yet handed to gRPC (for stream backpressure decisions). */
size_t k3_rpc_call_queued(const k3_rpc_call_t *call);
/* Opaque pointer for the handler's own per-call state (never touched by the library). */
void k3_rpc_call_set_user(k3_rpc_call_t *call, void *p);
void *k3_rpc_call_get_user(const k3_rpc_call_t *call);

#endif
