/* k3_rpc client side: unary and server-streaming calls over cached channels, driven by a uv
 * loop. Threading and status codes: see rpc.h (everything on the loop thread, callbacks too).
 *
 * Ownership:
 *  - The request message passed to a call is packed before the function returns: the caller
 *    keeps it and may free it at once.
 *  - Response messages handed to callbacks belong to the library and are freed when the
 *    callback returns (copy what you need, or re-pack it).
 *  - Status `details` strings are valid only during the callback.
 *  - A k3_rpc_ccall_t handle is valid from the start function until its final callback
 *    (unary `done` / stream `on_done`) returns. Cancelling it is allowed until then.
 *  - "If a start function returns an error, no callback is ever called for that call."
 *
 * Every call has a deadline (opts.timeout_ms, or the client's default). Channels are created on
 * first use per target and reused by later calls; they carry the raised message size limits
 * (P5). Unreachable targets fail fast with UNAVAILABLE (no wait-for-ready); so does a TLS
 * handshake that fails (wrong CA, wrong peer identity, no client certificate). */
#ifndef K3PD_RPC_CLIENT_H
#define K3PD_RPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

#include "k3pd/rpc.h"

typedef struct k3_rpc_client k3_rpc_client_t;
typedef struct k3_rpc_ccall k3_rpc_ccall_t;

struct k3_rpc_tls;

typedef struct {
  uint32_t max_msg_bytes;       /* send + receive limit; 0 = K3_RPC_DEFAULT_MAX_MSG_BYTES */
  uint32_t default_timeout_ms;  /* for calls whose opts.timeout_ms is 0; 0 = 30000 */
  /* Mutual TLS (NULL: plaintext channels): every channel presents tls's certificate and
   * accepts only a server certificate signed by tls's CA whose identity covers the expected
   * peer name: peer_name_fn(peer_name_ud, target) when it returns non-NULL, else peer_name,
   * else the target's host. tls must outlive the client. peer_name_fn runs on the loop when a
   * channel is created (channels are cached per target: forget a target whose expected name
   * changed). peer_name must outlive the client too. */
  const struct k3_rpc_tls *tls;
  const char *peer_name;
  const char *(*peer_name_fn)(void *ud, const char *target);
  void *peer_name_ud;
} k3_rpc_client_opts_t;

typedef struct {
  uint32_t timeout_ms;     /* deadline from now; 0 = the client's default */
  const char *request_id;  /* sent as x-request-id metadata when non-NULL (copied) */
} k3_rpc_call_opts_t;

/* Status of a finished client call; valid only during the callback. */
typedef struct {
  k3_rpc_code_t code;
  const char *details;  /* never NULL ("" when empty) */
} k3_rpc_status_t;

/* Unary completion: `resp` is non-NULL only when st->code == K3_RPC_OK (library-owned, freed
 * after return). A response that cannot be unpacked is reported as INTERNAL. */
typedef void (*k3_rpc_unary_cb)(void *arg, const k3_rpc_status_t *st, const ProtobufCMessage *resp);
/* One streamed message (library-owned, freed after return). */
typedef void (*k3_rpc_msg_cb)(void *arg, const ProtobufCMessage *msg);
/* Final status of a stream, called exactly once; the handle dies after it returns. */
typedef void (*k3_rpc_done_cb)(void *arg, const k3_rpc_status_t *st);

/* Creates a client on `loop` (opts may be NULL). Calls grpc_init() (balanced in close). */
int k3_rpc_client_init(uv_loop_t *loop, const k3_rpc_client_opts_t *opts, k3_rpc_client_t **out);

/* Cancels every call in flight (their final callbacks run with CANCELLED), waits for them,
 * destroys channels, the completion queue and its drain thread, then runs `done` on the loop
 * (may be NULL) and frees cli. Starting calls after this is a programmer error. */
void k3_rpc_client_close(k3_rpc_client_t *cli, void (*done)(void *arg), void *arg);

/* Unary call of `method` ("/k3pd.v1.Decode/Reserve") on `target` ("127.0.0.1:5000").
 * `resp_desc` is the response type. `out` (may be NULL) receives a handle for cancellation.
 * Returns 0 (cb will run exactly once) or K3_EINVAL / K3_ENOMEM / K3_ESHUTDOWN (cb never runs). */
int k3_rpc_unary(k3_rpc_client_t *cli, const char *target, const char *method,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 const k3_rpc_call_opts_t *opts, k3_rpc_unary_cb cb, void *arg,
                 k3_rpc_ccall_t **out);

/* Server-streaming call: on_msg for every message in order, then on_done once. One receive is
 * outstanding at a time, so a slow callback slows the sender (HTTP/2 flow control). */
int k3_rpc_stream(k3_rpc_client_t *cli, const char *target, const char *method,
                  const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                  const k3_rpc_call_opts_t *opts, k3_rpc_msg_cb on_msg, k3_rpc_done_cb on_done,
                  void *arg, k3_rpc_ccall_t **out);

/* Cancels a call in flight: the server sees the cancellation, no further on_msg runs, and the
 * final callback reports CANCELLED (unless the status had already arrived). Idempotent. */
void k3_rpc_ccall_cancel(k3_rpc_ccall_t *c);

/* Drops the cached channel for `target` (e.g. a worker left): the next call makes a new one.
 * Calls in flight on it finish normally; the old channel is destroyed after the last of them.
 * Returns 0 or K3_ENOENT. */
int k3_rpc_client_forget(k3_rpc_client_t *cli, const char *target);

/* Calls in flight (for tests and shutdown logic). */
size_t k3_rpc_client_live_calls(const k3_rpc_client_t *cli);

#endif
