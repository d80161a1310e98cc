/* k3_rpc server, the peer side of mutual TLS: listening ports with their credentials, the
 * server-wide peer rule (k3_rpc_server_require_peer) and the caller's identity per call (API in
 * k3pd/rpc.h, credentials in k3pd/rpc_tls.h). Not here: the call machinery (server.c).
 *
 * A call's identity is what gRPC verified during the handshake: the DNS SANs of the client
 * certificate, else its CN, read from the call's auth context once and cached on the call.
 * gRPC marks only a verified certificate as authenticated, so a plaintext call, or a TLS call
 * without a client certificate, has no identity. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_tls.h"
#include "rpc_server_internal.h"

/* ---- the peer's identity (mutual TLS) ---- */

static void peer_add(k3_rpc_call_t *c, const grpc_auth_property *p) {
  if (!p->value || p->value_length == 0 || memchr(p->value, 0, p->value_length)) return;
  char **np = realloc(c->peer, (c->n_peer + 1) * sizeof *np);
  if (!np) return;
  c->peer = np;
  char *v = malloc(p->value_length + 1);
  if (!v) return;
  memcpy(v, p->value, p->value_length);
  v[p->value_length] = 0;
  c->peer[c->n_peer++] = v;
}

/* Reads the identity names of a verified client certificate once per call: its DNS SANs
 * ("peer_dns"), else its common name. A plaintext call or a TLS call without a client
 * certificate has none (gRPC marks only verified certificates as authenticated). */
static void load_peer(k3_rpc_call_t *c) {
  if (c->peer_loaded) return;
  c->peer_loaded = 1;
  grpc_auth_context *ctx = c->call ? grpc_call_auth_context(c->call) : NULL;
  if (!ctx) return;
  if (grpc_auth_context_peer_is_authenticated(ctx)) {
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, GRPC_PEER_DNS_PROPERTY_NAME);
    for (const grpc_auth_property *p; (p = grpc_auth_property_iterator_next(&it)) != NULL;) peer_add(c, p);
    if (c->n_peer == 0) {
      it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
      const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
      if (p) peer_add(c, p);
    }
  }
  grpc_auth_context_release(ctx);
}

size_t k3_rpc_call_peer_names(const k3_rpc_call_t *cc, const char *const **names) {
  k3_rpc_call_t *c = (k3_rpc_call_t *)cc; /* caches; logically const */
  load_peer(c);
  *names = (const char *const *)c->peer;
  return c->n_peer;
}

int k3_rpc_call_peer_covers(const k3_rpc_call_t *c, const char *id) {
  const char *const *names;
  size_t n = k3_rpc_call_peer_names(c, &names);
  for (size_t i = 0; i < n; i++)
    if (k3_rpc_tls_name_covers(names[i], id)) return 1;
  return 0;
}

/* The server's peer rule for a non-open method: 0 = allowed, else the call was finished with
 * UNAUTHENTICATED (no verified client certificate) or PERMISSION_DENIED (another identity). */
int rpc_check_peer(k3_rpc_call_t *c) {
  k3_rpc_server_t *srv = c->srv;
  if (!srv->peer_required || c->method->open) return 0;
  const char *const *names;
  size_t n = k3_rpc_call_peer_names(c, &names);
  if (n == 0) {
    k3_rpc_call_finishf(c, K3_RPC_UNAUTHENTICATED, "peer: %s needs a client certificate of the cluster "
                        "(mutual TLS)", c->method->path);
    return 1;
  }
  if (srv->n_peer_allowed == 0) return 0;
  for (size_t k = 0; k < srv->n_peer_allowed; k++)
    if (k3_rpc_call_peer_covers(c, srv->peer_allowed[k])) return 0;
  k3_rpc_call_finishf(c, K3_RPC_PERMISSION_DENIED, "peer: certificate \"%.128s\" may not call %s (only \"%.128s\")",
                      names[0], c->method->path, srv->peer_allowed[0]);
  return 1;
}

int k3_rpc_server_require_peer(k3_rpc_server_t *srv, const char *const *names, size_t n) {
  if (srv->started || srv->shutting_down || (n && !names)) return K3_EINVAL;
  char **copy = n ? calloc(n, sizeof *copy) : NULL;
  if (n && !copy) return K3_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (!(copy[i] = strdup(names[i]))) {
      for (size_t k = 0; k < i; k++) free(copy[k]);
      free(copy);
      return K3_ENOMEM;
    }
  }
  for (size_t i = 0; i < srv->n_peer_allowed; i++) free(srv->peer_allowed[i]);
  free(srv->peer_allowed);
  srv->peer_allowed = copy;
  srv->n_peer_allowed = n;
  srv->peer_required = 1;
  return 0;
}

int k3_rpc_server_add_port(k3_rpc_server_t *srv, const char *addr, const k3_rpc_tls_t *tls, int mutual,
                           int *port_out) {
  if (srv->started || srv->shutting_down || !addr || !*addr || (mutual && (!tls || !k3_rpc_tls_ca_pem(tls))))
    return K3_EINVAL;
  grpc_server_credentials *creds;
  if (tls) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = k3_rpc_tls_key_pem(tls), .cert_chain = k3_rpc_tls_cert_pem(tls)};
    creds = grpc_ssl_server_credentials_create_ex(
        mutual ? k3_rpc_tls_ca_pem(tls) : NULL, &pair, 1,
        mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  if (!creds) return K3_ENOMEM;
  int port = grpc_server_add_http2_port(srv->server, addr, creds);
  grpc_server_credentials_release(creds);
  if (port <= 0) {
    K3_ERROR("rpc: cannot bind %s", addr);
    return K3_EIO;
  }
  srv->n_ports++;
  if (port_out) *port_out = port;
  K3_INFO("rpc: port %s (port %d): %s", addr, port, !tls ? "plaintext" : mutual ? "mutual TLS" : "TLS");
  return 0;
}
