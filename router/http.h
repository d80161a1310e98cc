/* k3pd-router's HTTP front: the OpenAI-compatible API on its own port (--http-port).
 *
 *   http_server.c  libmicrohttpd driven by the router's libuv loop; connections, routing,
 *                  body limits, responses (plain and Server-Sent Events), disconnect and
 *                  deadline watch, metrics by route and status, drain/shutdown;
 *   oai_request.c  POST /v1/chat/completions and /v1/completions: JSON → the one request path
 *                  (intake.c), OpenAI field checks naming the field; GET /v1/models;
 *   oai_reply.c    the request's sink: OpenAI response objects and stream chunks, XTML output
 *                  parsed into reasoning / content / tool calls (xtml_out.c);
 *   jsonw.c        the small JSON writer both use.
 *
 * Threads: none of our own. libmicrohttpd runs in "external polling" mode on the loop thread
 * (its epoll fd is a uv_poll handle), so every callback here runs on the loop and touches
 * loop-owned request state directly (STYLE.md: only uv_async_send crosses into the loop, and
 * nothing here needs to). Why not MHD's own thread: a token would cross threads twice per
 * chunk (a queue + wakeup each way), and the request state would need locks or copies.
 *
 * One HTTP request is an rt_hreq_t; it lives until libmicrohttpd is done with the request
 * AND the generation (rt_req_t) it started has ended (refcounted, see http_server.c). */
#ifndef K3PD_ROUTER_HTTP_H
#define K3PD_ROUTER_HTTP_H

#include <stdbool.h>
#include <stdint.h>

#include "k3pd/rpc.h"
#include "k3pd/tokenizer.h"
#include "rt.h"

struct k3_rpc_tls;
typedef struct rt_http rt_http_t;
typedef struct rt_hreq rt_hreq_t;
struct rt_req;

typedef struct {
  const char *host;          /* numeric IPv4 to bind; NULL/"" = all interfaces */
  int port;                  /* 0 = ephemeral */
  uint64_t max_body_bytes;   /* larger request bodies get 413 */
  unsigned max_connections;  /* concurrent connections (more are refused at accept) */
  unsigned idle_timeout_s;   /* a connection silent this long while sending its request or
                                between keep-alive requests is closed */
  uint32_t request_timeout_ms; /* deadline of a generation request (504 when it passes) */
  const struct k3_rpc_tls *tls; /* serve HTTPS with this certificate (NULL: plain HTTP) */
} rt_http_opts_t;

typedef enum {
  RT_ROUTE_CHAT = 0,
  RT_ROUTE_COMPLETIONS,
  RT_ROUTE_MODELS,
  RT_ROUTE_OPS,
  RT_ROUTE_OTHER,
} rt_route_t;

/* Binds and starts serving on rt->loop. Returns 0, K3_EINVAL (bad host/port) or K3_EUNAVAIL
 * (cannot bind). */
int rt_http_start(rt_router_t *rt, const rt_http_opts_t *opts, rt_http_t **out);
int rt_http_port(const rt_http_t *h);
/* Shutdown: generations still running fail with 503 (their streams get an error event),
 * responses in progress get up to 2 s to be written, then every connection is closed, the
 * handles are closed, h is freed and done(arg) runs on the loop. */
void rt_http_shutdown(rt_http_t *h, void (*done)(void *), void *arg);

/* ---- used by oai_*.c on one request (loop thread) ---- */

rt_router_t *rt_hreq_router(const rt_hreq_t *r);
const char *rt_hreq_header(const rt_hreq_t *r, const char *name); /* request header or NULL */
uint64_t rt_hreq_arrival_ns(const rt_hreq_t *r);
uint32_t rt_hreq_timeout_ms(const rt_hreq_t *r);
const char *rt_http_fingerprint(const rt_hreq_t *r); /* system_fingerprint of this router */
int64_t rt_http_started_unix(const rt_hreq_t *r);    /* when the router started (s) */

/* The generation this request drives (NULL when none): the server cancels it when the client
 * goes away or the deadline passes. The front clears it when the sink detaches. */
void rt_hreq_set_gen(rt_hreq_t *r, struct rt_req *q);
/* Per-request state of the front (freed with the request by free_fn). */
void rt_hreq_set_front(rt_hreq_t *r, void *p, void (*free_fn)(void *));
/* A reference that keeps the request (and the front's state) alive across asynchronous work
 * that is not a generation yet (the prompt on the tokenisation pool); release drops it. */
void rt_hreq_hold(rt_hreq_t *r);
void rt_hreq_release(rt_hreq_t *r);
/* The request continues asynchronously: once the handler returns, the connection waits for a
 * reply or the stream's start (watching for the client going away and the deadline). */
void rt_hreq_wait(rt_hreq_t *r);

/* One complete response; takes ownership of body (malloc'd, may be NULL when len is 0). */
void rt_hreq_reply(rt_hreq_t *r, unsigned status, const char *ctype, char *body, size_t len);
/* An OpenAI error object {"error": {"message", "type", "param", "code"}}; param and code may
 * be NULL (JSON null). */
void rt_hreq_error(rt_hreq_t *r, unsigned status, const char *type, const char *param, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Server-Sent Events: 200 text/event-stream, then bytes as they come, then the end. */
void rt_hreq_stream_begin(rt_hreq_t *r);
void rt_hreq_stream_write(rt_hreq_t *r, const char *s, size_t n);
void rt_hreq_stream_end(rt_hreq_t *r);
/* True once the client is gone (writes are dropped). */
bool rt_hreq_gone(const rt_hreq_t *r);

/* oai_request.c: the route handlers (the body is complete and is JSON by content type). */
void rt_oai_chat(rt_hreq_t *r, const char *body, size_t len);
void rt_oai_completions(rt_hreq_t *r, const char *body, size_t len);
void rt_oai_models(rt_hreq_t *r, const char *id); /* id NULL: the list */

/* HTTP status, OpenAI error type and code for a request-path status. */
unsigned rt_http_status_of(k3_rpc_code_t code, const char **type, const char **ecode);

#endif
