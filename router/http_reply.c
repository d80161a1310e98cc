/* k3pd-router's HTTP server, one request's output: the replies and streams the OpenAI front
 * writes (rt_hreq_* in http.h), queueing them to libmicrohttpd, the stream reader that suspends
 * an idle connection, and the watch (socket disconnect poll + deadline timer) that cancels the
 * generation of a client that went away. Lifecycle and invariants: http_server.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "http_int.h"
#include "jsonw.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "req.h"

void rt_hreq_unref(rt_hreq_t *r) {
  if (--r->refs > 0) return;
  rt_http_t *h = r->h;
  if (r->prev) r->prev->next = r->next;
  else h->live = r->next;
  if (r->next) r->next->prev = r->prev;
  h->n_live--;
  rt_hreq_watch_stop(r);
  rt_auth_release(r->auth_key);
  if (r->front_free) r->front_free(r->front);
  free(r->body.data);
  free(r->rbody);
  free(r->out.data);
  free(r);
}

void rt_hreq_resume(rt_hreq_t *r) {
  if (!r->suspended) return;
  r->suspended = false;
  MHD_resume_connection(r->conn);
  rt_http_kick(r->h);
}

/* ---- the client's socket and the deadline ---- */

static void watch_closed(uv_handle_t *hd) {
  hwatch_t *w = hd->data;
  if (--w->open == 0) free(w);
}

void rt_hreq_watch_stop(rt_hreq_t *r) {
  hwatch_t *w = r->watch;
  if (!w) return;
  r->watch = NULL;
  w->r = NULL;
  if (w->poll_on) uv_close((uv_handle_t *)&w->poll, watch_closed);
  else w->open--;
  uv_close((uv_handle_t *)&w->timer, watch_closed);
}

static void client_gone(rt_hreq_t *r, k3_rpc_code_t code, const char *why) {
  if (code == K3_RPC_CANCELLED) r->gone = true;
  rt_hreq_watch_stop(r);
  if (r->gen) rt_req_cancel(r->gen, code, "%s", why);
  rt_hreq_resume(r); /* let MHD find the closed socket (or send the error) */
}

static void on_watch_poll(uv_poll_t *p, int status, int events) {
  hwatch_t *w = p->data;
  if (!w->r) return;
  if (status < 0 || (events & UV_DISCONNECT)) client_gone(w->r, K3_RPC_CANCELLED, "client disconnected");
}

static void on_watch_timer(uv_timer_t *t) {
  hwatch_t *w = t->data;
  if (!w->r) return;
  char why[96];
  snprintf(why, sizeof why, "deadline exceeded (--http-timeout-ms %u)", w->r->h->o.request_timeout_ms);
  client_gone(w->r, K3_RPC_DEADLINE_EXCEEDED, why);
}

static void watch_start(rt_hreq_t *r) {
  if (r->watch || r->mhd_done) return;
  hwatch_t *w = calloc(1, sizeof *w);
  if (!w) return; /* no watch: the request still ends by its worker-call deadlines */
  rt_http_t *h = r->h;
  w->r = r;
  w->open = 2;
  uv_timer_init(h->rt->loop, &w->timer);
  w->timer.data = w;
  uint64_t elapsed_ms = (k3_now_ns() - r->t_arrive) / 1000000;
  uint64_t left = h->o.request_timeout_ms > elapsed_ms ? h->o.request_timeout_ms - elapsed_ms : 1;
  uv_timer_start(&w->timer, on_watch_timer, left, 0);
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci && uv_poll_init(h->rt->loop, &w->poll, ci->connect_fd) == 0) {
    w->poll.data = w;
    w->poll_on = true;
    uv_poll_start(&w->poll, UV_DISCONNECT, on_watch_poll);
  }
  r->watch = w;
}

/* ---- the API for oai_*.c ---- */

rt_router_t *rt_hreq_router(const rt_hreq_t *r) { return r->h->rt; }
void rt_hreq_hold(rt_hreq_t *r) { r->refs++; }

void rt_hreq_release(rt_hreq_t *r) { rt_hreq_unref(r); }

uint64_t rt_hreq_arrival_ns(const rt_hreq_t *r) { return r->t_arrive; }
uint32_t rt_hreq_timeout_ms(const rt_hreq_t *r) { return r->h->o.request_timeout_ms; }
const char *rt_http_fingerprint(const rt_hreq_t *r) { return r->h->fingerprint; }
int64_t rt_http_started_unix(const rt_hreq_t *r) { return r->h->started_unix; }
bool rt_hreq_gone(const rt_hreq_t *r) { return r->gone || r->mhd_done; }

const char *rt_hreq_header(const rt_hreq_t *r, const char *name) {
  return r->mhd_done ? NULL : MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

void rt_hreq_set_gen(rt_hreq_t *r, struct rt_req *q) {
  r->gen = q;
  if (q) snprintf(r->rid, sizeof r->rid, "%s", q->id);
  else rt_hreq_watch_stop(r); /* nothing left to cancel */
}

void rt_hreq_set_front(rt_hreq_t *r, void *p, void (*free_fn)(void *)) {
  r->front = p;
  r->front_free = free_fn;
}

void rt_hreq_wait(rt_hreq_t *r) {
  r->waiting = true;
  watch_start(r);
}

void rt_hreq_reply(rt_hreq_t *r, unsigned status, const char *ctype, char *body, size_t len) {
  if (r->mhd_done || r->have_reply || r->phase >= P_REPLIED) {
    free(body);
    return;
  }
  r->have_reply = true;
  r->status = status;
  r->ctype = ctype;
  r->rbody = body;
  r->rlen = len;
  rt_hreq_resume(r);
}

void rt_hreq_error(rt_hreq_t *r, unsigned status, const char *type, const char *param, const char *code,
                   const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rt_jw_t w = {{0}, 0};
  rt_jw_raw(&w, "{\"error\":{\"message\":");
  rt_jw_strz(&w, msg);
  rt_jw_raw(&w, ",\"type\":");
  rt_jw_strz(&w, type);
  rt_jw_raw(&w, ",\"param\":");
  rt_jw_strz(&w, param);
  rt_jw_raw(&w, ",\"code\":");
  rt_jw_strz(&w, code);
  rt_jw_raw(&w, "}}\n");
  if (w.err) {
    free(w.s.data);
    rt_hreq_reply(r, 500, "text/plain; charset=utf-8", NULL, 0);
    return;
  }
  rt_hreq_reply(r, status, "application/json", w.s.data, w.s.len);
}

void rt_hreq_stream_begin(rt_hreq_t *r) {
  if (r->mhd_done || r->have_reply || r->phase >= P_REPLIED) return;
  r->stream_start = true;
  r->status = 200;
  rt_hreq_resume(r);
}

void rt_hreq_stream_write(rt_hreq_t *r, const char *s, size_t n) {
  if (rt_hreq_gone(r) || r->out_end) return;
  if (k3_tok_str_append(&r->out, s, n)) {
    r->out_end = true; /* out of memory: end the stream rather than lose bytes silently */
    K3_WARN("http: request %s: out of memory buffering the stream; ending it", r->rid);
  }
  if (r->phase == P_STREAM) rt_hreq_resume(r);
}

void rt_hreq_stream_end(rt_hreq_t *r) {
  r->out_end = true;
  if (r->phase == P_STREAM) rt_hreq_resume(r);
}

/* ---- responses ---- */

enum MHD_Result rt_hreq_queue(rt_hreq_t *r, unsigned status, const char *ctype, char *body, size_t len,
                             const char *allow) {
  struct MHD_Response *res = MHD_create_response_from_buffer(len, len ? body : (void *)"",
                                                             len ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!res) {
    free(body);
    return MHD_NO;
  }
  if (!len) free(body);
  if (ctype) MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  if (allow) MHD_add_response_header(res, MHD_HTTP_HEADER_ALLOW, allow);
  if (r->rid[0]) MHD_add_response_header(res, "X-Request-Id", r->rid);
  if (status == 429 || status == 503) MHD_add_response_header(res, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  if (status == 401) MHD_add_response_header(res, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  if (r->too_large) MHD_add_response_header(res, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(r->conn, status, res);
  MHD_destroy_response(res);
  r->status = status;
  r->phase = P_REPLIED;
  return ret;
}

enum MHD_Result rt_hreq_queue_text(rt_hreq_t *r, unsigned status, const char *text) {
  char *b = strdup(text);
  return rt_hreq_queue(r, status, "text/plain; charset=utf-8", b, b ? strlen(b) : 0, NULL);
}

enum MHD_Result rt_hreq_queue_error(rt_hreq_t *r, unsigned status, const char *type, const char *param,
                                   const char *code, const char *allow, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rt_hreq_error(r, status, type, param, code, "%s", msg);
  if (!r->have_reply) return MHD_NO;
  r->have_reply = false;
  char *b = r->rbody;
  r->rbody = NULL;
  return rt_hreq_queue(r, r->status, r->ctype, b, r->rlen, allow);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  rt_hreq_t *r = cls;
  if (r->gone) return MHD_CONTENT_READER_END_WITH_ERROR;
  size_t avail = r->out.len - r->out_off;
  if (avail) {
    size_t n = avail < max ? avail : max;
    memcpy(buf, r->out.data + r->out_off, n);
    r->out_off += n;
    if (r->out_off == r->out.len) r->out.len = r->out_off = 0;
    return (ssize_t)n;
  }
  if (r->out_end) return MHD_CONTENT_READER_END_OF_STREAM;
  MHD_suspend_connection(r->conn); /* the next write resumes it */
  r->suspended = true;
  return 0;
}

static void stream_free(void *cls) { rt_hreq_unref(cls); }

static enum MHD_Result queue_stream(rt_hreq_t *r) {
  struct MHD_Response *res =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK_BYTES, stream_read, r, stream_free);
  if (!res) return MHD_NO;
  r->refs++;
  MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(res, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(res, "X-Accel-Buffering", "no");
  if (r->rid[0]) MHD_add_response_header(res, "X-Request-Id", r->rid);
  enum MHD_Result ret = MHD_queue_response(r->conn, 200, res);
  MHD_destroy_response(res);
  r->status = 200;
  r->phase = P_STREAM;
  return ret;
}

/* After the route handler (or a resume): send what is ready, or wait for it. */
enum MHD_Result rt_hreq_flush(rt_hreq_t *r) {
  if (r->have_reply) {
    r->have_reply = false;
    char *b = r->rbody;
    r->rbody = NULL;
    return rt_hreq_queue(r, r->status, r->ctype, b, r->rlen, r->allow);
  }
  if (r->stream_start) {
    r->stream_start = false;
    return queue_stream(r);
  }
  if (r->waiting && !r->gone) {
    MHD_suspend_connection(r->conn);
    r->suspended = true;
    return MHD_YES;
  }
  return rt_hreq_queue_error(r, r->gone ? 499 : 500, "server_error", NULL, "internal_error", NULL,
                     "the request ended without a response");
}
