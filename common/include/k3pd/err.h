/* k3pd error codes: one table, negative values, k3_strerror().
 *
 * Every function in the project that can fail returns int: 0 on success, a negative K3_E*
 * code on failure. Codes are grouped by blast radius (STYLE.md §Errors):
 *   request  - fails one request (bad input, capacity, cancel, deadline)
 *   peer     - drop the endpoint / reroute (transport, stale epoch, digest)
 *   process  - drain and exit (corrupt weights, device fault)
 * The X-macro below is the only place codes are defined. */
#ifndef K3PD_ERR_H
#define K3PD_ERR_H

#define K3_ERRNO_MAP(X)                                                         \
  /* request */                                                                  \
  X(EINVAL, 1, "invalid argument")                                               \
  X(ERANGE, 2, "value out of range")                                             \
  X(ENOENT, 3, "not found")                                                      \
  X(EEXIST, 4, "already exists")                                                 \
  X(ECAPACITY, 5, "resource exhausted")                                          \
  X(ECANCELED, 6, "cancelled")                                                   \
  X(ETIMEDOUT, 7, "deadline exceeded")                                           \
  X(ENOTSUP, 8, "not supported")                                                 \
  X(EUTF8, 9, "invalid UTF-8")                                                   \
  /* peer / transport */                                                         \
  X(EUNAVAIL, 20, "unavailable")                                                 \
  X(EPROTO, 21, "protocol error")                                                \
  X(ESTALE, 22, "stale epoch")                                                   \
  X(EDIGEST, 23, "digest mismatch")                                              \
  X(EFINGERPRINT, 24, "model fingerprint mismatch")                              \
  X(ETRANSPORT, 25, "transport error")                                           \
  X(ESHUTDOWN, 26, "shutting down")                                              \
  /* process */                                                                  \
  X(ENOMEM, 40, "out of memory")                                                 \
  X(EIO, 41, "I/O error")                                                        \
  X(EFORMAT, 42, "malformed file")                                               \
  X(ECONFIG, 43, "invalid model config")                                         \
  X(EDEVICE, 44, "device error")                                                 \
  X(EINTERNAL, 45, "internal error")                                             \
  /* non-errors used by asynchronous starts */                                   \
  X(EINPROGRESS, 60, "operation in progress")                                    \
  X(EAGAIN, 61, "try again")

enum {
#define K3_ERR_ENUM(name, val, msg) K3_##name = -(val),
  K3_ERRNO_MAP(K3_ERR_ENUM)
#undef K3_ERR_ENUM
  K3_OK = 0
};

/* Returns a static string for any value (unknown codes give "unknown error"). Never NULL. */
const char *k3_strerror(int err);
/* Returns the symbolic name, e.g. "K3_EINVAL" (static string, never NULL). */
const char *k3_errname(int err);

#endif
