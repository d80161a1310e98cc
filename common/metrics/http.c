/* HTTP endpoint for metrics and probes, on libmicrohttpd with its own polling thread.
 *
 * Why a separate thread and not the binary's libuv loop: a scrape must answer even while the
 * serving loop is busy (and liveness should be judged by gRPC health, which does run on the
 * loop). The HTTP thread only reads atomics (metric series, ready/live flags) and takes the
 * registry mutex while rendering, so it never touches loop-owned state.
 *
 * TLS (k3_metrics_http_start_tls, --metrics-tls): HTTPS with the process's cluster certificate;
 * with a CA, /metrics also requires a client certificate that verifies against it (checked per
 * request through the GnuTLS session libmicrohttpd exposes: libmicrohttpd requests the
 * certificate but does not verify it). /healthz and /readyz stay open: the kubelet's HTTPS
 * probes present no certificate.
 *
 * Not here: the gRPC health service (the binaries). */
#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/metrics.h"

#define CONTENT_TYPE_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CONNECTION_TIMEOUT_S 10u
#define CONNECTION_LIMIT 64u

struct k3_metrics_http {
  struct MHD_Daemon *daemon; /* owned; stopped in k3_metrics_http_stop */
  k3_metrics_t *reg;         /* borrowed; outlives the server */
  atomic_bool ready;
  atomic_bool live;
  int port; /* bound port */
  bool verify_client; /* /metrics needs a client certificate of the CA (TLS with a CA) */
};

/* 1 when the connection's TLS peer presented a certificate that verifies against the trust
 * list given to libmicrohttpd (MHD_OPTION_HTTPS_MEM_TRUST). */
static int client_verified(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  gnutls_session_t s = ci ? (gnutls_session_t)ci->tls_session : NULL;
  unsigned n = 0, status = 1;
  if (!s || !gnutls_certificate_get_peers(s, &n) || n == 0) return 0;
  return gnutls_certificate_verify_peers2(s, &status) == GNUTLS_E_SUCCESS && status == 0;
}

/* Queues a response and drops our reference (MHD keeps its own until it is sent). */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
  if (!r) {
    if (mode == MHD_RESPMEM_MUST_FREE) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  enum MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *text) {
  return reply(c, status, "text/plain; charset=utf-8", (void *)text, strlen(text),
               MHD_RESPMEM_PERSISTENT);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  k3_metrics_http_t *h = cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");
  if (strcmp(url, "/metrics") == 0) {
    if (h->verify_client && !client_verified(c))
      return reply_text(c, MHD_HTTP_FORBIDDEN, "a client certificate of the cluster CA is required\n");
    char *text;
    size_t len;
    if (k3_metrics_render(h->reg, &text, &len) != 0)
      return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return reply(c, MHD_HTTP_OK, CONTENT_TYPE_METRICS, text, len, MHD_RESPMEM_MUST_FREE);
  }
  if (strcmp(url, "/healthz") == 0) {
    bool live = atomic_load(&h->live);
    return reply_text(c, live ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                      live ? "ok\n" : "not live\n");
  }
  if (strcmp(url, "/readyz") == 0) {
    bool ready = atomic_load(&h->ready);
    return reply_text(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                      ready ? "ready\n" : "not ready\n");
  }
  return reply_text(c, MHD_HTTP_NOT_FOUND, "not found\n");
}

int k3_metrics_http_start(k3_metrics_t *m, const char *bind_host, int port, k3_metrics_http_t **out) {
  return k3_metrics_http_start_tls(m, bind_host, port, NULL, NULL, NULL, out);
}

int k3_metrics_http_start_tls(k3_metrics_t *m, const char *bind_host, int port, const char *cert_pem,
                              const char *key_pem, const char *ca_pem, k3_metrics_http_t **out) {
  if (port < 0 || port > 65535) {
    K3_ERROR("metrics: --metrics-port %d out of range 0..65535", port);
    return K3_EINVAL;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind_host && *bind_host && inet_pton(AF_INET, bind_host, &sa.sin_addr) != 1) {
    K3_ERROR("metrics: bind address '%s' is not a numeric IPv4 address", bind_host);
    return K3_EINVAL;
  }
  k3_metrics_http_t *h = calloc(1, sizeof *h);
  if (!h) return K3_ENOMEM;
  h->reg = m;
  atomic_init(&h->ready, false);
  atomic_init(&h->live, true);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
  struct MHD_OptionItem tls[4] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL},
                                  {MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
  if (cert_pem) {
    if (!key_pem || MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      K3_ERROR("metrics: TLS requested but %s", key_pem ? "this libmicrohttpd has no TLS" : "no key");
      free(h);
      return K3_ENOTSUP;
    }
    flags |= MHD_USE_TLS;
    tls[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)key_pem};
    tls[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)cert_pem};
    if (ca_pem) {
      tls[2] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, (void *)ca_pem};
      h->verify_client = true;
    }
  }
  h->daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, &sa,
                               MHD_OPTION_CONNECTION_TIMEOUT, CONNECTION_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
                               CONNECTION_LIMIT, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
  if (!h->daemon) {
    K3_ERROR("metrics: cannot listen on %s:%d (port in use or not permitted)",
             bind_host && *bind_host ? bind_host : "0.0.0.0", port);
    free(h);
    return K3_EUNAVAIL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : port;
  if (h->port == 0) {
    K3_ERROR("metrics: could not read back the bound port");
    MHD_stop_daemon(h->daemon);
    free(h);
    return K3_EUNAVAIL;
  }
  *out = h;
  return 0;
}

int k3_metrics_http_port(const k3_metrics_http_t *h) { return h->port; }

void k3_metrics_http_set_ready(k3_metrics_http_t *h, bool ready) { atomic_store(&h->ready, ready); }

void k3_metrics_http_set_live(k3_metrics_http_t *h, bool live) { atomic_store(&h->live, live); }

bool k3_metrics_http_ready(const k3_metrics_http_t *h) {
  return atomic_load((atomic_bool *)&h->ready);
}

void k3_metrics_http_stop(k3_metrics_http_t *h) {
  if (!h) return;
  MHD_stop_daemon(h->daemon);
  free(h);
}
