/* The cluster-security flags shared by k3pd-router, k3pd-prefill and k3pd-decode, and how a
 * binary turns them into credentials (docs/operations.md "Security").
 *
 *   --tls-cert FILE --tls-key FILE --tls-ca FILE   this process's certificate, key, and the CA
 *                        of the cluster (Kubernetes Secrets mounted as files); all three or none
 *   --tls-dev-dir DIR    without files: a throwaway development CA kept in DIR (default
 *                        /tmp/k3pd-tls-<uid>, private to the user); each process issues itself a
 *                        certificate for its identity. Local clusters and tests work unchanged
 *                        and still run mutual TLS.
 *   --insecure-cluster   plaintext cluster traffic without identities (only behind something
 *                        else that authenticates, e.g. a service mesh); logged as a warning
 *   --router-identity N  the name the router's certificate carries (default k3pd-router): the
 *                        router issues/checks its own certificate for it, workers accept only
 *                        that name from the router and from callers of their services
 *   --health-listen H:P  an extra plaintext port that serves only grpc.health.v1 (Kubernetes
 *                        gRPC probes cannot speak TLS); off by default
 * Each flag is also K3PD_<NAME> in the environment (flags.h). */
#ifndef K3PD_APPTLS_H
#define K3PD_APPTLS_H

#include <stdbool.h>
#include <stddef.h>

#include "k3pd/flags.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_tls.h"

#define K3_APP_TLS_NFLAGS 8
#define K3_APP_ROUTER_IDENTITY "k3pd-router"

typedef struct {
  const char *cert, *key, *ca;  /* --tls-cert/--tls-key/--tls-ca */
  const char *dev_dir;          /* --tls-dev-dir */
  const char *router_identity;  /* --router-identity */
  const char *health_listen;    /* --health-listen (NULL = none) */
  bool insecure;                /* --insecure-cluster */
  bool metrics_tls;             /* --metrics-tls */
  char dev_dir_default[64];     /* /tmp/k3pd-tls-<uid> */
} k3_app_tls_t;

/* Defaults (the dev directory of this user). */
void k3_app_tls_init(k3_app_tls_t *o);
/* Appends the K3_APP_TLS_NFLAGS flag rows to out; returns how many. */
size_t k3_app_tls_flags(k3_app_tls_t *o, k3_flag_t *out);
/* After parsing: checks the combination (all three files or none; --insecure-cluster with no
 * other TLS flag; a valid --router-identity). Returns 0 or K3_EINVAL with a message. */
int k3_app_tls_check(const k3_app_tls_t *o, char *err, size_t errlen);
/* True when the credentials come from files (then the identity comes from the certificate). */
bool k3_app_tls_files(const k3_app_tls_t *o);

/* Makes this process's credentials: NULL in *out with --insecure-cluster (a warning is
 * logged); from the files, checking that the certificate covers `identity` when it is not NULL;
 * or from the development CA, issued for `identity` (required then). Returns 0 or an error
 * with a message naming the flag. */
int k3_app_tls_make(const k3_app_tls_t *o, const char *identity, k3_rpc_tls_t **out, char *err, size_t errlen);

/* Worker start-up, before its server binds: the credentials (*tls; NULL with
 * --insecure-cluster) and the worker id (id): --worker-id when given, else from the certificate
 * (files; a wildcard name gets this host's name) or k3_app_tls_dev_worker_id (development CA).
 * With --insecure-cluster and no --worker-id, id is "" (the binary derives one from its
 * advertised address after binding). With TLS the id must be a certificate name covered by the
 * certificate. Returns 0 or K3_E* with a message naming the flag. */
int k3_app_tls_worker(const k3_app_tls_t *o, const char *role, const char *worker_id, k3_rpc_tls_t **tls, char *id,
                      size_t cap, char *err, size_t errlen);
/* Binds a worker's server: `listen` with mutual TLS (plaintext without tls), the optional
 * --health-listen port (plaintext, health only), and with TLS requires every non-health call to
 * come from the router's identity. *port gets the bound --listen port. Then starts it. */
int k3_app_tls_serve(k3_rpc_server_t *srv, const k3_app_tls_t *o, const k3_rpc_tls_t *tls, const char *listen,
                     int *port, char *err, size_t errlen);

/* A default worker id for the development CA when --worker-id is not given:
 * "<role>-<hostname>-<pid>" reduced to certificate-name characters (the advertised address is
 * not known before the TLS port is bound). */
void k3_app_tls_dev_worker_id(const char *role, char *out, size_t cap);

#endif
