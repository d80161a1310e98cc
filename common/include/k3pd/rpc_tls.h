/* k3_rpc TLS: the credentials of one process and the identity rules of the cluster.
 *
 * What it is for: every k3pd process holds one k3_rpc_tls_t for the cluster (its certificate,
 * its private key and the CA that signs every other member). The router serves the Cluster
 * service with it and dials the workers with it; a worker serves Prefill/Decode with it and
 * dials the router with it. Both directions are mutual TLS: each side presents its certificate
 * and verifies the other's against the CA. The public port of the router may have its own
 * (server-only) k3_rpc_tls_t. docs/operations.md "Security" has the threat model.
 *
 * Identities: a certificate's identity names are its DNS subject alternative names, or its
 * common name when it has none. A name covers an id when they are equal ignoring ASCII case,
 * or when the name is "*.SUFFIX" and the id is "LABEL.SUFFIX" with one label (RFC 6125 wildcard,
 * the rule gRPC itself uses to check a server's name). Worker ids must be covered by the worker's
 * certificate (k3_rpc_tls_id_valid: letters, digits, '-', '_' and '.', no ':').
 *
 * Where credentials come from:
 *  - k3_rpc_tls_load: PEM files (Kubernetes Secrets mounted as files);
 *  - k3_rpc_tls_dev: a throwaway development CA kept in a private directory (created 0700,
 *    refused when another user owns it or others can read it): the first process creates the
 *    CA, every process then issues itself a fresh certificate for its identity (kept in memory).
 *    Any process of the same user that can read the directory can join: the trust boundary of
 *    a local cluster is the Unix user, never the network.
 *
 * Threads: these functions block on file I/O (and k3_rpc_tls_dev on the directory lock, at
 * most 10 s): call them at start-up, before the loop runs. A k3_rpc_tls_t is immutable after
 * creation and may be shared by any number of servers and clients that it outlives. */
#ifndef K3PD_RPC_TLS_H
#define K3PD_RPC_TLS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct k3_rpc_tls k3_rpc_tls_t;

#define K3_RPC_TLS_MAX_NAMES 16
#define K3_RPC_TLS_ID_MAX 127

/* Loads a certificate chain (cert_file: the leaf first), its private key and the CA bundle that
 * signs the peers (ca_file; NULL for a server-only credential such as the public port's).
 * Checks that the key matches the certificate and, when ca_file is given, that the certificate
 * is valid now and signed by that CA. Returns 0, K3_ENOENT / K3_EIO (a file), K3_EINVAL (bad PEM,
 * key mismatch, not signed by the CA, expired) or K3_ENOMEM, with a message naming the file. */
int k3_rpc_tls_load(const char *cert_file, const char *key_file, const char *ca_file, k3_rpc_tls_t **out,
                    char *err, size_t errlen);

/* Development credentials: makes sure DIR holds a development CA (ca.crt + ca.key, created
 * under DIR/ca.lock by the first process), then issues a certificate for `identity` (DNS names:
 * identity and localhost; IP 127.0.0.1 and ::1), valid for a year, signed by that CA. DIR is
 * created with mode 0700 when missing. Returns 0, K3_EINVAL (identity invalid, DIR unsafe),
 * K3_EIO, K3_ETIMEDOUT (the lock was held for 10 s) or K3_ENOMEM, message naming DIR. */
int k3_rpc_tls_dev(const char *dir, const char *identity, k3_rpc_tls_t **out, char *err, size_t errlen);

/* Issues PREFIX.crt and PREFIX.key (mode 0600) for `identity` from the development CA in DIR
 * (created as above when missing). For tools and tests: k3pd-cli certs. */
int k3_rpc_tls_dev_issue(const char *dir, const char *identity, const char *prefix, char *err, size_t errlen);

void k3_rpc_tls_free(k3_rpc_tls_t *t);

/* PEM texts (NUL-terminated, owned by t). ca is NULL for a server-only credential. */
const char *k3_rpc_tls_cert_pem(const k3_rpc_tls_t *t);
const char *k3_rpc_tls_key_pem(const k3_rpc_tls_t *t);
const char *k3_rpc_tls_ca_pem(const k3_rpc_tls_t *t);
/* The identity names of t's certificate (DNS SANs, else the CN), in certificate order; the
 * array and strings are owned by t. Returns the count (>= 1 for a loaded credential). */
size_t k3_rpc_tls_names(const k3_rpc_tls_t *t, const char *const **names);
/* 1 when one of t's identity names covers id. */
int k3_rpc_tls_covers(const k3_rpc_tls_t *t, const char *id);

/* 1 when `name` (an identity name of a certificate) covers `id` (see above), else 0. */
int k3_rpc_tls_name_covers(const char *name, const char *id);
/* 1 when id can be a certificate identity: 1..K3_RPC_TLS_ID_MAX bytes of [A-Za-z0-9._-], not
 * starting or ending with '.' or '-'. */
int k3_rpc_tls_id_valid(const char *id);

/* A worker id for a process with credential t when none was given: t's first identity name,
 * with a leading "*." replaced by "HOST." (the pod's hostname: one wildcard certificate per
 * pool, a distinct id per pod). Writes into out; returns 0 or K3_EINVAL when no valid id can be
 * made. */
int k3_rpc_tls_default_id(const k3_rpc_tls_t *t, const char *host, char *out, size_t cap);

#endif
