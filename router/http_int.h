/* Private to the HTTP server files (http_server.c, http_reply.c): the request and server
 * objects and the functions they share. See http_server.c for the lifecycle. Loop thread only. */
#ifndef K3PD_ROUTER_HTTP_INT_H
#define K3PD_ROUTER_HTTP_INT_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "k3pd/metrics.h"
#include "k3pd/metrics_k3pd.h"

#define STREAM_BLOCK_BYTES (16 * 1024)
#define DISCARD_LIMIT_BYTES ((uint64_t)64 << 20) /* bytes past the limit we read to answer 413 */
#define SHUTDOWN_FLUSH_MS 2000

enum { P_READ = 0, P_RUN, P_REPLIED, P_STREAM }; /* reading the body, handling, answered, streaming */

typedef struct hwatch {
  uv_poll_t poll;   /* the client's socket: UV_DISCONNECT */
  uv_timer_t timer; /* the request's deadline */
  int open;         /* handles not yet closed */
  bool poll_on;
  rt_hreq_t *r;     /* NULL once stopped */
} hwatch_t;

struct rt_hreq {
  rt_http_t *h;
  struct MHD_Connection *conn;
  rt_hreq_t *prev, *next; /* h->live */
  int refs;               /* MHD's request + the stream response */
  rt_route_t route;
  int phase;
  bool suspended, mhd_done, gone, waiting;
  uint64_t t_arrive;
  k3_tok_str_t body;
  uint64_t body_seen;     /* bytes received, kept or not */
  bool too_large;
  /* the reply, until it is queued */
  bool have_reply;
  unsigned status;        /* last status queued (0 = none) */
  char *rbody;
  size_t rlen;
  const char *ctype;
  const char *allow;      /* Allow header of a 405 */
  bool stream_start;
  /* the stream */
  k3_tok_str_t out;
  size_t out_off;
  bool out_end;
  struct rt_req *gen;
  char rid[130];
  void *front;
  void (*front_free)(void *);
  hwatch_t *watch;
  struct rt_key *auth_key; /* the API key's ticket (auth.h), released when the request is freed */
};

struct rt_http {
  rt_router_t *rt;
  struct MHD_Daemon *d;
  uv_poll_t poll;
  uv_timer_t timer, drain;
  uv_idle_t kick;
  rt_http_opts_t o;
  int port;
  int64_t started_unix;
  char fingerprint[40];
  rt_hreq_t *live;
  size_t n_live;
  bool closing;
  uint64_t drain_until_ns;
  int open_handles;
  void (*done)(void *);
  void *done_arg;
  k3_mseries_t *count[5][K3PD_HTTP_NCODES]; /* k3pd_router_http_requests_total{route,code} */
  k3_mseries_t *io;           /* k3pd_router_http_io_seconds_total */
  uint64_t handler_ns;        /* time in route handlers during the current MHD_run */
};

/* http_server.c */
void rt_http_kick(rt_http_t *h); /* run libmicrohttpd on the next loop turn */

/* http_reply.c */
void rt_hreq_unref(rt_hreq_t *r);
void rt_hreq_resume(rt_hreq_t *r);     /* only when r->suspended */
void rt_hreq_watch_stop(rt_hreq_t *r); /* the disconnect poll and the deadline timer */
/* Queue a response now (inside the access handler); takes body (malloc'd). */
enum MHD_Result rt_hreq_queue(rt_hreq_t *r, unsigned status, const char *ctype, char *body, size_t len,
                              const char *allow);
enum MHD_Result rt_hreq_queue_text(rt_hreq_t *r, unsigned status, const char *text);
enum MHD_Result rt_hreq_queue_error(rt_hreq_t *r, unsigned status, const char *type, const char *param,
                                    const char *code, const char *allow, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* After the route handler or a resume: queue what is ready, or suspend until it is. */
enum MHD_Result rt_hreq_flush(rt_hreq_t *r);

#endif
