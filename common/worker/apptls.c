/* Cluster-security flags of the three binaries (k3pd/apptls.h): parsing rules and turning them
 * into a k3_rpc_tls_t. Not here: what each binary serves on which port (their main.c). */
#include "k3pd/apptls.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/log.h"

void k3_app_tls_init(k3_app_tls_t *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->dev_dir_default, sizeof o->dev_dir_default, "/tmp/k3pd-tls-%u", (unsigned)geteuid());
  o->dev_dir = o->dev_dir_default;
  o->router_identity = K3_APP_ROUTER_IDENTITY;
}

size_t k3_app_tls_flags(k3_app_tls_t *o, k3_flag_t *out) {
  k3_flag_t f[K3_APP_TLS_NFLAGS] = {
      {"tls-cert", K3_FLAG_STR, &o->cert, "FILE", "this process's certificate (PEM; with --tls-key and --tls-ca: "
       "mutual TLS between router and workers with certificates from files, e.g. Kubernetes Secrets)", false},
      {"tls-key", K3_FLAG_STR, &o->key, "FILE", "the certificate's private key (PEM, unencrypted)", false},
      {"tls-ca", K3_FLAG_STR, &o->ca, "FILE", "the CA bundle that signs every router and worker certificate", false},
      {"tls-dev-dir", K3_FLAG_STR, &o->dev_dir, "DIR", "without --tls-cert: a throwaway development CA kept in DIR "
       "(created 0700; every process of this user that reads it can join the cluster)", false},
      {"insecure-cluster", K3_FLAG_BOOL, &o->insecure, NULL, "plaintext router<->worker traffic WITHOUT "
       "authentication (only behind something else that authenticates, e.g. a service mesh)", false},
      {"router-identity", K3_FLAG_STR, &o->router_identity, "NAME", "the name in the router's certificate (workers "
       "accept only it as the router and as the caller of their services)", false},
      {"health-listen", K3_FLAG_STR, &o->health_listen, "HOST:PORT", "extra plaintext port serving only "
       "grpc.health.v1 (Kubernetes gRPC probes cannot speak TLS); off when unset", false},
      {"metrics-tls", K3_FLAG_BOOL, &o->metrics_tls, NULL, "serve the metrics port over HTTPS with the cluster "
       "certificate; /metrics then needs a client certificate of the cluster CA", false},
  };
  memcpy(out, f, sizeof f);
  return K3_APP_TLS_NFLAGS;
}

bool k3_app_tls_files(const k3_app_tls_t *o) { return o->cert && *o->cert; }

int k3_app_tls_check(const k3_app_tls_t *o, char *err, size_t errlen) {
  int have = (o->cert && *o->cert) + (o->key && *o->key) + (o->ca && *o->ca);
  if (have != 0 && have != 3) {
    snprintf(err, errlen, "--tls-cert, --tls-key and --tls-ca: give all three or none");
    return K3_EINVAL;
  }
  if (o->insecure && have) {
    snprintf(err, errlen, "--insecure-cluster: cannot be combined with --tls-cert/--tls-key/--tls-ca");
    return K3_EINVAL;
  }
  if (o->insecure && o->metrics_tls) {
    snprintf(err, errlen, "--metrics-tls: needs the cluster credentials (not --insecure-cluster)");
    return K3_EINVAL;
  }
  if (!k3_rpc_tls_id_valid(o->router_identity)) {
    snprintf(err, errlen, "--router-identity \"%s\": not a certificate name ([A-Za-z0-9._-])",
             o->router_identity ? o->router_identity : "");
    return K3_EINVAL;
  }
  return 0;
}

int k3_app_tls_make(const k3_app_tls_t *o, const char *identity, k3_rpc_tls_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (o->insecure) {
    K3_WARN("--insecure-cluster: router<->worker traffic is plaintext and NOT authenticated: anyone who can reach "
            "the cluster port can register workers and anyone who can reach a worker can call it");
    return 0;
  }
  int rc;
  if (k3_app_tls_files(o)) {
    rc = k3_rpc_tls_load(o->cert, o->key, o->ca, out, err, errlen);
    if (rc) return rc;
    if (identity && !k3_rpc_tls_covers(*out, identity)) {
      const char *const *names;
      k3_rpc_tls_names(*out, &names);
      snprintf(err, errlen, "--tls-cert %s: its names (%s...) do not cover this process's identity \"%s\"", o->cert,
               names[0], identity);
      k3_rpc_tls_free(*out);
      *out = NULL;
      return K3_EINVAL;
    }
    K3_INFO("cluster TLS: certificate %s (%s), CA %s", o->cert, identity ? identity : "", o->ca);
    return 0;
  }
  rc = k3_rpc_tls_dev(o->dev_dir, identity, out, err, errlen);
  if (rc) return rc;
  K3_INFO("cluster TLS: development CA in %s, certificate issued for \"%s\" (production: --tls-cert/--tls-key/"
          "--tls-ca)", o->dev_dir, identity);
  return 0;
}

void k3_app_tls_dev_worker_id(const char *role, char *out, size_t cap) {
  char host[128] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  snprintf(out, cap, "%s-%s-%ld", role, host, (long)getpid());
  for (char *p = out; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.' && *p != '_') *p = '-';
}

int k3_app_tls_worker(const k3_app_tls_t *o, const char *role, const char *worker_id, k3_rpc_tls_t **tls, char *id,
                      size_t cap, char *err, size_t errlen) {
  *tls = NULL;
  id[0] = 0;
  if (worker_id && *worker_id) snprintf(id, cap, "%s", worker_id);
  if (o->insecure) return k3_app_tls_make(o, NULL, tls, err, errlen);
  if (id[0] && !k3_rpc_tls_id_valid(id)) {
    snprintf(err, errlen, "--worker-id \"%s\": with TLS the id is a certificate name (1..%d of [A-Za-z0-9._-])", id,
             K3_RPC_TLS_ID_MAX);
    return K3_EINVAL;
  }
  if (k3_app_tls_files(o)) {
    int rc = k3_app_tls_make(o, id[0] ? id : NULL, tls, err, errlen);
    if (rc || id[0]) return rc;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    if (k3_rpc_tls_default_id(*tls, host, id, cap)) {
      snprintf(err, errlen, "--tls-cert %s: no worker id can be derived from its names: give --worker-id", o->cert);
      k3_rpc_tls_free(*tls);
      *tls = NULL;
      return K3_EINVAL;
    }
    return 0;
  }
  if (!id[0]) k3_app_tls_dev_worker_id(role, id, cap);
  return k3_app_tls_make(o, id, tls, err, errlen);
}

int k3_app_tls_serve(k3_rpc_server_t *srv, const k3_app_tls_t *o, const k3_rpc_tls_t *tls, const char *listen,
                     int *port, char *err, size_t errlen) {
  int rc = 0, hport = 0;
  if (tls) rc = k3_rpc_server_require_peer(srv, &o->router_identity, 1);
  if (!rc) rc = k3_rpc_server_add_port(srv, listen, tls, tls != NULL, port);
  if (rc) {
    snprintf(err, errlen, "--listen %s: %s", listen, k3_strerror(rc));
    return rc;
  }
  if (o->health_listen && (rc = k3_rpc_server_add_port(srv, o->health_listen, NULL, 0, &hport))) {
    snprintf(err, errlen, "--health-listen %s: %s", o->health_listen, k3_strerror(rc));
    return rc;
  }
  if ((rc = k3_rpc_server_start(srv, NULL, NULL))) {
    snprintf(err, errlen, "--listen %s: %s", listen, k3_strerror(rc));
    return rc;
  }
  if (hport) K3_INFO("health-only port %d (plaintext, grpc.health.v1)", hport);
  return 0;
}
