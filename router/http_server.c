/* k3pd-router's HTTP server: libmicrohttpd (MHD) in external-polling mode on the router's libuv
 * loop, the request lifecycle, routing and limits, metrics, start and shutdown. Replies, streams
 * and the client watch are in http_reply.c; the OpenAI semantics in oai_*.c; see http.h for the
 * layout and why MHD runs on the loop thread.
 *
 * Driving MHD from libuv: MHD_USE_EPOLL gives one epoll fd for the listen socket and every
 * connection; a uv_poll on it runs MHD_run when something is ready, a uv_timer follows
 * MHD_get_timeout, and a uv_idle "kick" runs MHD on the next loop turn after a connection is
 * resumed or when MHD has work pending (timeout 0).
 *
 * Request lifecycle (one rt_hreq_t per HTTP request, MHD's per-request pointer):
 *   first call      route, method, content type and declared size checked; a verdict is kept
 *                   as the pending reply (only an oversized body announced with Expect:
 *                   100-continue is answered at once: MHD closes a connection answered early);
 *   body calls      the body accumulates up to --http-max-body-bytes, the rest is discarded;
 *   last call       the route handler runs; it replies at once or calls rt_hreq_wait: the
 *                   connection is then suspended until the reply (or the stream's start) is
 *                   ready, with a uv_poll on the socket for a client that goes away (MHD does
 *                   not see a suspended connection close) and a deadline timer;
 *   streaming       a callback response reads the bytes the sink wrote; with nothing to send it
 *                   suspends the connection, the next write resumes it;
 *   completed       MHD's notify-completed callback: a generation still running is cancelled
 *                   (the client went away), the metrics count the request once.
 * The rt_hreq_t is freed when MHD is done with the request and with the stream response
 * (refcount); the generation is detached before that (its sink clears r->gen).
 * Invariants: MHD_resume_connection only on a connection we suspended (r->suspended); no
 * connection is suspended when MHD_stop_daemon runs. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "auth.h"
#include "http_int.h"
#include "k3pd/err.h"
#include "k3pd/rpc_tls.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "req.h"

static const unsigned CODES[K3PD_HTTP_NCODES] = {200, 400, 401, 404, 405, 409, 413, 415, 429, 499, 500, 503, 504};
#define CODE_500 10 /* index of 500 in CODES */

/* ---- MHD on the loop ---- */

static void run_mhd(rt_http_t *h);

static void on_kick(uv_idle_t *i) {
  uv_idle_stop(i);
  run_mhd(i->data);
}

void rt_http_kick(rt_http_t *h) {
  if (h->d) uv_idle_start(&h->kick, on_kick);
}

static void on_mhd_timer(uv_timer_t *t) { run_mhd(t->data); }

static void on_mhd_poll(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  run_mhd(p->data);
}

static void run_mhd(rt_http_t *h) {
  if (!h->d) return;
  uint64_t t0 = k3_now_ns();
  h->handler_ns = 0;
  MHD_run(h->d);
  /* libmicrohttpd's own work: the route handlers (timed in the request path) excluded */
  uint64_t dt = k3_now_ns() - t0;
  if (h->io) k3_counter_add(h->io, (double)(dt > h->handler_ns ? dt - h->handler_ns : 0) / 1e9);
  MHD_UNSIGNED_LONG_LONG t;
  if (MHD_get_timeout(h->d, &t) == MHD_YES) {
    if (t == 0) uv_idle_start(&h->kick, on_kick);
    else uv_timer_start(&h->timer, on_mhd_timer, t, 0);
  } else {
    uv_timer_stop(&h->timer);
  }
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  if (k3_log_get_level() < K3_LOG_DEBUG) return; /* malformed requests are the client's problem */
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
  K3_DEBUG("http: %s", msg);
}

/* ---- request objects ---- */

static void count(rt_http_t *h, rt_route_t route, unsigned status) {
  for (int i = 0; i < K3PD_HTTP_NCODES; i++)
    if (CODES[i] == status) {
      if (h->count[route][i]) k3_counter_inc(h->count[route][i]);
      return;
    }
  if (h->count[route][CODE_500]) k3_counter_inc(h->count[route][CODE_500]); /* anything else counts as 500 */
}

/* ---- routing ---- */

static bool json_ctype(const char *ct) {
  if (!ct) return true; /* none given: the body is read as JSON */
  while (*ct == ' ' || *ct == '\t') ct++;
  size_t n = strcspn(ct, ";");
  while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
  if (n == 16 && strncasecmp(ct, "application/json", 16) == 0) return true;
  return n > 5 && strncasecmp(ct + n - 5, "+json", 5) == 0 && memchr(ct, '/', n);
}

static enum MHD_Result serve_ops(rt_hreq_t *r, const char *url) {
  rt_router_t *rt = r->h->rt;
  bool ready = !rt->draining && !r->h->closing;
  if (strcmp(url, "/healthz") == 0) return rt_hreq_queue_text(r, 200, "ok\n");
  if (strcmp(url, "/readyz") == 0 || strcmp(url, "/health") == 0)
    return rt_hreq_queue_text(r, ready ? 200 : 503, ready ? "ready\n" : "not ready\n");
  char *text;
  size_t len;
  if (k3_metrics_render(rt->mreg, &text, &len)) return rt_hreq_queue_text(r, 500, "out of memory\n");
  return rt_hreq_queue(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
}

/* The first call (headers complete). Answers only an oversized body announced with
 * Expect: 100-continue (the client waits before sending it); every other verdict is kept as the
 * pending reply and sent after the body was read (discarded), because libmicrohttpd closes the
 * connection of a response queued before the body. */
static enum MHD_Result first_call(rt_hreq_t *r, const char *url, const char *method) {
  bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
  if (strcmp(url, "/v1/chat/completions") == 0) r->route = RT_ROUTE_CHAT;
  else if (strcmp(url, "/v1/completions") == 0) r->route = RT_ROUTE_COMPLETIONS;
  else if (strcmp(url, "/v1/models") == 0 || (strncmp(url, "/v1/models/", 11) == 0 && url[11])) r->route = RT_ROUTE_MODELS;
  else if (!strcmp(url, "/healthz") || !strcmp(url, "/readyz") || !strcmp(url, "/health") || !strcmp(url, "/metrics"))
    r->route = RT_ROUTE_OPS;
  else {
    r->route = RT_ROUTE_OTHER;
    rt_hreq_error(r, 404, "invalid_request_error", NULL, "not_found",
                  "no such endpoint: %.200s %.200s (this server has POST /v1/chat/completions, POST /v1/completions, "
                  "GET /v1/models)", method, url);
    return MHD_YES;
  }
  bool wants_post = r->route == RT_ROUTE_CHAT || r->route == RT_ROUTE_COMPLETIONS;
  if (wants_post ? !post : !get) {
    r->allow = wants_post ? "POST" : "GET, HEAD";
    rt_hreq_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                  "method %.32s is not allowed on %.200s (use %s)", method, url, wants_post ? "POST" : "GET");
    return MHD_YES;
  }
  /* API keys (auth.h): every route but the health endpoints, before anything else is decided */
  rt_router_t *rt = r->h->rt;
  if (rt->auth && (r->route != RT_ROUTE_OPS || strcmp(url, "/metrics") == 0)) {
    const char *reason;
    char msg[256];
    k3_rpc_code_t c = rt_auth_admit(rt->auth, MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                                          MHD_HTTP_HEADER_AUTHORIZATION),
                                    k3_now_ns(), &r->auth_key, &reason, msg, sizeof msg);
    if (c != K3_RPC_OK) {
      if (rt->m.auth_failures_total) k3_metric_inc(rt->m.auth_failures_total, &reason);
      if (c == K3_RPC_UNAUTHENTICATED)
        rt_hreq_error(r, 401, "invalid_request_error", NULL, "invalid_api_key", "%s", msg);
      else
        rt_hreq_error(r, 429, "rate_limit_error", NULL, "rate_limit_exceeded", "%s", msg);
      return MHD_YES;
    }
  }
  if (!wants_post) return MHD_YES;
  if (r->h->closing || r->h->rt->draining) {
    rt_hreq_error(r, 503, "service_unavailable_error", NULL, "draining",
                  "the router is draining (shutting down); retry on another replica");
    return MHD_YES;
  }
  const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!json_ctype(ct)) {
    rt_hreq_error(r, 415, "invalid_request_error", NULL, "unsupported_media_type",
                  "Content-Type must be application/json, got \"%.100s\"", ct);
    return MHD_YES;
  }
  const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl) {
    char *end;
    unsigned long long n = strtoull(cl, &end, 10);
    if (end != cl && n > r->h->o.max_body_bytes) {
      r->too_large = true;
      const char *ex = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
      /* A client waiting for 100-continue has not sent the body: answer now. Otherwise read
       * (and drop) it first, so the client is reading when we answer, not writing into a
       * closed socket; past DISCARD_LIMIT_BYTES we answer anyway. */
      if ((ex && strcasecmp(ex, "100-continue") == 0) || n > r->h->o.max_body_bytes + DISCARD_LIMIT_BYTES)
        return rt_hreq_queue_error(r, 413, "invalid_request_error", NULL, "request_too_large", NULL,
                           "request body of %llu bytes exceeds the limit of %llu bytes (--http-max-body-bytes)", n,
                           (unsigned long long)r->h->o.max_body_bytes);
    }
  }
  return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *up, size_t *up_size, void **con_cls) {
  (void)version;
  rt_http_t *h = cls;
  rt_hreq_t *r = *con_cls;
  if (!r) {
    r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->h = h;
    r->conn = c;
    r->refs = 1;
    r->t_arrive = k3_now_ns();
    r->next = h->live;
    if (h->live) h->live->prev = r;
    h->live = r;
    h->n_live++;
    *con_cls = r;
    return first_call(r, url, method);
  }
  if (*up_size) {
    if (r->phase == P_READ && !r->have_reply) {
      r->body_seen += *up_size;
      if (r->body_seen > h->o.max_body_bytes) {
        r->too_large = true;
        r->body.len = 0;
      } else if (k3_tok_str_append(&r->body, up, *up_size)) {
        *up_size = 0;
        return MHD_NO; /* out of memory: drop the connection */
      }
      if (r->body_seen > h->o.max_body_bytes + DISCARD_LIMIT_BYTES) {
        *up_size = 0;
        return rt_hreq_queue_error(r, 413, "invalid_request_error", NULL, "request_too_large", NULL,
                           "request body exceeds the limit of %llu bytes (--http-max-body-bytes)",
                           (unsigned long long)h->o.max_body_bytes);
      }
    }
    *up_size = 0;
    return MHD_YES;
  }
  if (r->phase == P_READ) {
    r->phase = P_RUN;
    r->t_arrive = k3_now_ns(); /* the request is complete: the router's work starts here */
    if (r->have_reply) return rt_hreq_flush(r); /* decided at the first call */
    uint64_t t0 = k3_now_ns();
    if (r->too_large)
      return rt_hreq_queue_error(r, 413, "invalid_request_error", NULL, "request_too_large", NULL,
                         "request body of %llu bytes exceeds the limit of %llu bytes (--http-max-body-bytes)",
                         (unsigned long long)r->body_seen, (unsigned long long)h->o.max_body_bytes);
    switch (r->route) {
      case RT_ROUTE_OPS: return serve_ops(r, url);
      case RT_ROUTE_MODELS: rt_oai_models(r, url[10] == '/' ? url + 11 : NULL); break;
      case RT_ROUTE_CHAT: rt_oai_chat(r, r->body.data ? r->body.data : "", r->body.len); break;
      default: rt_oai_completions(r, r->body.data ? r->body.data : "", r->body.len);
    }
    h->handler_ns += k3_now_ns() - t0;
    free(r->body.data);
    memset(&r->body, 0, sizeof r->body);
  }
  return rt_hreq_flush(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  rt_hreq_t *r = *con_cls;
  if (!r) return;
  *con_cls = NULL;
  r->mhd_done = true;
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN) r->gone = true;
  bool cut = r->gone || (r->phase == P_STREAM && !r->out_end) || r->status == 0;
  count(r->h, r->route, cut ? (toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN && !r->status ? 503 : 499) : r->status);
  if (r->gen) rt_req_cancel(r->gen, K3_RPC_CANCELLED, "client disconnected");
  rt_hreq_watch_stop(r);
  r->suspended = false;
  rt_hreq_unref(r);
}

/* ---- start / shutdown ---- */

int rt_http_start(rt_router_t *rt, const rt_http_opts_t *o, rt_http_t **out) {
  if (o->port < 0 || o->port > 65535) {
    K3_ERROR("--http-port %d out of range 0..65535", o->port);
    return K3_EINVAL;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)o->port);
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (o->host && *o->host && inet_pton(AF_INET, o->host, &sa.sin_addr) != 1) {
    K3_ERROR("--http-host '%s' is not a numeric IPv4 address", o->host);
    return K3_EINVAL;
  }
  rt_http_t *h = calloc(1, sizeof *h);
  if (!h) return K3_ENOMEM;
  h->rt = rt;
  h->o = *o;
  h->started_unix = k3_wall_ms() / 1000;
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  /* HTTPS with the public certificate (libmicrohttpd's GnuTLS); the same PEMs as the gRPC port */
  struct MHD_OptionItem tls_opts[3] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
  if (o->tls) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      K3_ERROR("http: --public-tls-cert: this libmicrohttpd was built without TLS");
      free(h);
      return K3_ENOTSUP;
    }
    flags |= MHD_USE_TLS;
    tls_opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)k3_rpc_tls_key_pem(o->tls)};
    tls_opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)k3_rpc_tls_cert_pem(o->tls)};
  }
  h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_access, h, MHD_OPTION_SOCK_ADDR, &sa,
                          MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                          o->max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                          MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_EXTERNAL_LOGGER,
                          on_mhd_log, h, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
  if (!h->d) {
    K3_ERROR("http: cannot listen on %s:%d (port in use or not permitted)", o->host && *o->host ? o->host : "0.0.0.0",
             o->port);
    free(h);
    return K3_EUNAVAIL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : o->port;
  di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
  if (!di || h->port == 0 || uv_poll_init(rt->loop, &h->poll, di->epoll_fd)) {
    K3_ERROR("http: libmicrohttpd started without an epoll fd or bound port");
    MHD_stop_daemon(h->d);
    free(h);
    return K3_EUNAVAIL;
  }
  uv_timer_init(rt->loop, &h->timer);
  uv_timer_init(rt->loop, &h->drain);
  uv_idle_init(rt->loop, &h->kick);
  h->poll.data = h->timer.data = h->drain.data = h->kick.data = h;
  uv_poll_start(&h->poll, UV_READABLE, on_mhd_poll);
  /* system_fingerprint: what produced the tokens (this build and the served model) */
  char fp_src[512];
  int n = snprintf(fp_src, sizeof fp_src, "%s|%s|%d|%lld", K3PD_VERSION, rt->model_name, (int)rt->cfg.type,
                   (long long)rt->cfg.vocab_size);
  snprintf(h->fingerprint, sizeof h->fingerprint, "fp_%012llx",
           (unsigned long long)(k3_hash64(fp_src, (size_t)n, 0x6b3370) & 0xffffffffffffULL));
  static const char *const routes[5] = {K3PD_HTTP_ROUTE_CHAT, K3PD_HTTP_ROUTE_COMPLETIONS, K3PD_HTTP_ROUTE_MODELS,
                                        K3PD_HTTP_ROUTE_OPS, K3PD_HTTP_ROUTE_OTHER};
  static const char *const codes[K3PD_HTTP_NCODES] = {K3PD_HTTP_CODES};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < K3PD_HTTP_NCODES; b++) {
      const char *lv[2] = {routes[a], codes[b]};
      if (rt->m.http_requests_total) k3_metric_series(rt->m.http_requests_total, lv, &h->count[a][b]);
    }
  if (rt->m.http_io_seconds_total) h->io = k3_metric_default(rt->m.http_io_seconds_total);
  run_mhd(h);
  *out = h;
  return 0;
}

int rt_http_port(const rt_http_t *h) { return h->port; }

static void on_handle_closed(uv_handle_t *hd) {
  rt_http_t *h = hd->data;
  if (--h->open_handles > 0) return;
  void (*done)(void *) = h->done;
  void *arg = h->done_arg;
  free(h);
  if (done) done(arg);
}

static void finish_shutdown(rt_http_t *h) {
  uv_timer_stop(&h->drain);
  for (rt_hreq_t *r = h->live; r; r = r->next) {
    rt_hreq_watch_stop(r);
    if (r->suspended) { /* MHD_stop_daemon must not find a suspended connection */
      r->suspended = false;
      r->gone = true;
      MHD_resume_connection(r->conn);
    }
  }
  h->open_handles = 4;
  uv_close((uv_handle_t *)&h->poll, on_handle_closed); /* stops watching the epoll fd now */
  uv_close((uv_handle_t *)&h->timer, on_handle_closed);
  uv_close((uv_handle_t *)&h->drain, on_handle_closed);
  uv_close((uv_handle_t *)&h->kick, on_handle_closed);
  struct MHD_Daemon *d = h->d;
  h->d = NULL;
  MHD_stop_daemon(d); /* closes the connections; their completed callbacks free the requests */
}

static void on_drain_tick(uv_timer_t *t) {
  rt_http_t *h = t->data;
  bool busy = false;
  for (rt_hreq_t *r = h->live; r && !busy; r = r->next) busy = !r->mhd_done;
  if (!busy || k3_now_ns() >= h->drain_until_ns) finish_shutdown(h);
}

void rt_http_shutdown(rt_http_t *h, void (*done)(void *), void *arg) {
  h->closing = true;
  h->done = done;
  h->done_arg = arg;
  for (rt_hreq_t *r = h->live; r; r = r->next)
    if (r->gen) rt_req_cancel(r->gen, K3_RPC_UNAVAILABLE, "router shutting down");
  MHD_socket ls = MHD_quiesce_daemon(h->d);
  if (ls != MHD_INVALID_SOCKET) close(ls);
  rt_http_kick(h);
  h->drain_until_ns = k3_now_ns() + (uint64_t)SHUTDOWN_FLUSH_MS * 1000000;
  uv_timer_start(&h->drain, on_drain_tick, 10, 20);
}
