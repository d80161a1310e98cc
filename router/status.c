/* The statuses the public API answers with (docs/protocol.md "Generate: statuses").
 *
 * Worker calls fail with whatever their server or transport says: FAILED_PRECONDITION (stale
 * epoch, fingerprint), DATA_LOSS (digest), NOT_FOUND, PERMISSION_DENIED (a certificate problem
 * between router and worker), or UNKNOWN (a transport failure without a status, e.g. "Channel
 * Destroyed"). Passing those through made the router answer codes its protocol does not list,
 * so every request failure is funnelled through rt_status_public (req.c rt_req_fail): a client
 * sees only documented codes, and the message keeps the worker's original status for the logs. */
#include <stdio.h>
#include <string.h>

#include "rt.h"

k3_rpc_code_t rt_status_public(k3_rpc_code_t code, char *msg, size_t cap) {
  k3_rpc_code_t out;
  switch (code) {
    case K3_RPC_OK:
    case K3_RPC_CANCELLED:
    case K3_RPC_INVALID_ARGUMENT:
    case K3_RPC_DEADLINE_EXCEEDED:
    case K3_RPC_ALREADY_EXISTS:
    case K3_RPC_RESOURCE_EXHAUSTED:
    case K3_RPC_INTERNAL:
    case K3_RPC_UNAVAILABLE:
      return code;
    case K3_RPC_UNIMPLEMENTED: /* a worker that does not speak this protocol: a deployment bug */
    case K3_RPC_OUT_OF_RANGE:
      out = K3_RPC_INTERNAL;
      break;
    default: /* UNKNOWN, ABORTED, FAILED_PRECONDITION, DATA_LOSS, NOT_FOUND, PERMISSION_DENIED,
                UNAUTHENTICATED, out-of-range values: the cluster could not serve it now; retry */
      out = K3_RPC_UNAVAILABLE;
  }
  if (msg && cap) {
    size_t n = strnlen(msg, cap);
    if (n + 1 < cap) snprintf(msg + n, cap - n, " [worker status %s]", k3_rpc_code_name((int)code));
  }
  return out;
}
