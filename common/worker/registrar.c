/* A worker's registrations with every router it is given (k3pd/registrar.h): one link
 * (reglink.c) per router address, from the --router list and from periodic DNS resolution of
 * its dns:NAME:PORT entries.
 *
 * Why one independent link per router rather than one registration "with the cluster": each
 * router keeps its own registry and hands out its own epochs (router/cluster_svc.c), and the
 * decode worker's Reserve is the only shared truth, so routers need not know about each other.
 * A router that is down only costs its own link retries.
 *
 * Lifetimes: links live in r->links; a link being stopped (its address left the DNS answer and
 * its registration lapsed, or the registrar stops) is unlinked at once and counted in
 * r->pending until its done callback. A resolution in flight holds its entry (req_live) and is
 * counted too. The registrar is freed when stopping and pending reaches 0 with the timer closed.
 * Loop thread only. */
#include "k3pd/registrar.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/netaddr.h"
#include "reglink.h"

#define ADDR_MAX 300

typedef struct link_ent {
  struct link_ent *next;
  struct k3_registrar *r;
  reg_link_t *l;
  char addr[ADDR_MAX];
  int from;  /* index of the entry it came from */
  bool seen; /* in the last successful answer of its entry (plain entries: always) */
} link_ent_t;

typedef struct {
  char text[ADDR_MAX];  /* as given */
  bool dns;
  char host[256];
  char port[12];
  uv_getaddrinfo_t req;
  bool req_live;
  int last_err;         /* last resolution result logged (0 = ok) */
  struct k3_registrar *r;
} entry_t;

struct k3_registrar {
  uv_loop_t *loop;
  k3_rpc_client_t *cli;
  k3_registrar_opts_t o; /* strings point at the copies below */
  char *worker_id, *grpc_address, *model_name;
  uint8_t *ucx_address;
  entry_t *entries;
  int n_entries;
  bool any_dns;
  link_ent_t *links;
  uv_timer_t timer; /* re-resolution */
  bool timer_open;
  bool stopping, deregister, draining;
  int pending;      /* links stopping + resolutions in flight */
  void (*done)(void *arg);
  void *done_arg;
};

static void resolve_all(k3_registrar_t *r);

/* ---- the router list ---- */

/* Parses one entry. Returns 0 or K3_EINVAL with err naming the entry. */
static int parse_entry(const char *text, const char *what, entry_t *e, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  if (strlen(text) >= sizeof e->text) {
    snprintf(err, errlen, "%s: entry \"%.40s...\" is too long", what, text);
    return K3_EINVAL;
  }
  snprintf(e->text, sizeof e->text, "%s", text);
  const char *a = text;
  if (strncmp(a, "dns:", 4) == 0) {
    e->dns = true;
    a += 4;
  }
  int port;
  char perr[160];
  if (k3_addr_split(a, "x", e->host, sizeof e->host, &port, perr, sizeof perr) || !e->host[0] || port < 1) {
    snprintf(err, errlen, "%s: entry \"%s\": expected HOST:PORT or dns:NAME:PORT with a port in 1..65535", what,
             text);
    return K3_EINVAL;
  }
  snprintf(e->port, sizeof e->port, "%d", port);
  return 0;
}

/* Splits the list into entries (*out owned by the caller). */
static int parse_list(const char *list, const char *what, entry_t **out, int *n, char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  if (!list || !*list) {
    snprintf(err, errlen, "%s: no router given", what);
    return K3_EINVAL;
  }
  char *copy = strdup(list);
  entry_t *es = calloc(K3_REGISTRAR_MAX_ROUTERS, sizeof *es);
  if (!copy || !es) {
    free(copy);
    free(es);
    snprintf(err, errlen, "%s: out of memory", what);
    return K3_ENOMEM;
  }
  int k = 0, rc = 0;
  char *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ') t++;
    if (!*t) continue;
    if (k == K3_REGISTRAR_MAX_ROUTERS) {
      snprintf(err, errlen, "%s: more than %d entries", what, K3_REGISTRAR_MAX_ROUTERS);
      rc = K3_EINVAL;
      break;
    }
    rc = parse_entry(t, what, &es[k], err, errlen);
    if (!rc) k++;
  }
  free(copy);
  if (!rc && k == 0) {
    snprintf(err, errlen, "%s: no router given", what);
    rc = K3_EINVAL;
  }
  if (rc) {
    free(es);
    return rc;
  }
  *out = es;
  *n = k;
  return 0;
}

int k3_registrar_check(const char *routers, const char *what, char *err, size_t errlen) {
  entry_t *es;
  int n;
  int rc = parse_list(routers, what, &es, &n, err, errlen);
  free(es);
  return rc;
}

/* ---- links ---- */

static void maybe_free(k3_registrar_t *r) {
  if (!r->stopping || r->pending || r->timer_open || r->links) return;
  void (*done)(void *) = r->done;
  void *arg = r->done_arg;
  free(r->entries);
  free(r->worker_id);
  free(r->grpc_address);
  free(r->model_name);
  free(r->ucx_address);
  free(r);
  if (done) done(arg);
}

static void on_link_stopped(void *arg) {
  k3_registrar_t *r = arg;
  r->pending--;
  maybe_free(r);
}

static link_ent_t *find_link(k3_registrar_t *r, const char *addr) {
  for (link_ent_t *e = r->links; e; e = e->next)
    if (strcmp(e->addr, addr) == 0) return e;
  return NULL;
}

static void add_link(k3_registrar_t *r, const char *addr, int from) {
  link_ent_t *e = find_link(r, addr);
  if (e) {
    e->seen = true;
    return;
  }
  int n = 0;
  for (link_ent_t *x = r->links; x; x = x->next) n++;
  if (n >= K3_REGISTRAR_MAX_ROUTERS) {
    K3_WARN("router %s ignored: already %d routers", addr, n);
    return;
  }
  e = calloc(1, sizeof *e);
  if (!e || reg_link_start(r->loop, r->cli, &r->o, addr, &e->l)) {
    free(e);
    K3_WARN("router %s: cannot start its registration (out of memory); retried at the next resolution", addr);
    return;
  }
  e->r = r;
  e->from = from;
  e->seen = true;
  snprintf(e->addr, sizeof e->addr, "%s", addr);
  if (r->draining) reg_link_set_draining(e->l, true);
  e->next = r->links;
  r->links = e;
  if (r->entries[from].dns) K3_INFO("router %s (from %s) added", addr, r->entries[from].text);
}

static void stop_link(k3_registrar_t *r, link_ent_t *e, bool deregister) {
  for (link_ent_t **pp = &r->links; *pp; pp = &(*pp)->next) {
    if (*pp == e) {
      *pp = e->next;
      break;
    }
  }
  r->pending++;
  reg_link_stop(e->l, deregister, on_link_stopped, r);
  free(e);
}

/* ---- DNS ---- */

/* The answer's addresses as HOST:PORT strings (IPv4 when there are any, else IPv6: a dual-stack
 * answer names each router twice). Returns how many (at most cap). */
static int answer_addrs(const struct addrinfo *res, const char *port, char (*out)[ADDR_MAX], int cap) {
  int n = 0;
  bool have4 = false;
  for (const struct addrinfo *a = res; a; a = a->ai_next) have4 |= a->ai_family == AF_INET;
  for (const struct addrinfo *a = res; a && n < cap; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN];
    if (a->ai_family == AF_INET && have4) {
      inet_ntop(AF_INET, &((const struct sockaddr_in *)a->ai_addr)->sin_addr, ip, sizeof ip);
      snprintf(out[n], ADDR_MAX, "%s:%s", ip, port);
    } else if (a->ai_family == AF_INET6 && !have4) {
      inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr, ip, sizeof ip);
      snprintf(out[n], ADDR_MAX, "[%s]:%s", ip, port);
    } else {
      continue;
    }
    bool dup = false;
    for (int i = 0; i < n && !dup; i++) dup = strcmp(out[i], out[n]) == 0;
    if (!dup) n++;
  }
  return n;
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  entry_t *en = req->data;
  k3_registrar_t *r = en->r;
  int from = (int)(en - r->entries);
  en->req_live = false;
  r->pending--;
  if (r->stopping) {
    uv_freeaddrinfo(res);
    maybe_free(r);
    return;
  }
  if (status) {
    if (status != en->last_err)
      K3_WARN("--router %s: resolving %s failed: %s (keeping the %s routers; retried every %u ms)", en->text,
              en->host, uv_strerror(status), "known", r->o.resolve_ms);
    en->last_err = status;
    uv_freeaddrinfo(res);
    return;
  }
  char (*addrs)[ADDR_MAX] = malloc(K3_REGISTRAR_MAX_ROUTERS * sizeof *addrs);
  int n = addrs ? answer_addrs(res, en->port, addrs, K3_REGISTRAR_MAX_ROUTERS) : 0;
  uv_freeaddrinfo(res);
  if (!addrs) return; /* out of memory: nothing changes until the next resolution */
  if (en->last_err || n == 0) K3_INFO("--router %s: %d router address%s", en->text, n, n == 1 ? "" : "es");
  en->last_err = 0;
  for (link_ent_t *e = r->links; e; e = e->next)
    if (e->from == from) e->seen = false;
  for (int i = 0; i < n; i++) add_link(r, addrs[i], from);
  /* Gone from the answer: dropped once not registered (a live router that left the Service,
   * e.g. draining, keeps its heartbeats until it exits or forgets us). */
  for (link_ent_t *e = r->links, *next; e; e = next) {
    next = e->next;
    if (e->from == from && !e->seen && !reg_link_registered(e->l)) {
      K3_INFO("router %s left %s and does not hold our registration: dropped", e->addr, en->text);
      stop_link(r, e, false);
    }
  }
  free(addrs);
}

static void resolve_all(k3_registrar_t *r) {
  for (int i = 0; i < r->n_entries; i++) {
    entry_t *en = &r->entries[i];
    if (!en->dns || en->req_live) continue;
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    en->req.data = en;
    if (uv_getaddrinfo(r->loop, &en->req, on_resolved, en->host, en->port, &hints) == 0) {
      en->req_live = true;
      r->pending++;
    }
  }
}

static void on_timer(uv_timer_t *t) { resolve_all(t->data); }

static void on_timer_closed(uv_handle_t *h) {
  k3_registrar_t *r = h->data;
  r->timer_open = false;
  maybe_free(r);
}

/* ---- API ---- */

int k3_registrar_start(uv_loop_t *loop, k3_rpc_client_t *cli, const k3_registrar_opts_t *o, k3_registrar_t **out) {
  char err[400];
  if (!o->worker_id || !*o->worker_id || !o->grpc_address || !*o->grpc_address) return K3_EINVAL;
  k3_registrar_t *r = calloc(1, sizeof *r);
  if (!r) return K3_ENOMEM;
  int rc = parse_list(o->router, "--router", &r->entries, &r->n_entries, err, sizeof err);
  if (rc) {
    K3_ERROR("%s", err);
    free(r);
    return rc;
  }
  r->loop = loop;
  r->cli = cli;
  r->o = *o;
  r->o.router = NULL;
  r->o.resolve_ms = o->resolve_ms ? o->resolve_ms : 5000;
  r->worker_id = strdup(o->worker_id);
  r->grpc_address = strdup(o->grpc_address);
  r->model_name = strdup(o->model_name ? o->model_name : "");
  if (o->ucx_address_len) {
    r->ucx_address = malloc(o->ucx_address_len);
    if (r->ucx_address) memcpy(r->ucx_address, o->ucx_address, o->ucx_address_len);
  }
  if (!r->worker_id || !r->grpc_address || !r->model_name || (o->ucx_address_len && !r->ucx_address)) {
    free(r->entries);
    free(r->worker_id);
    free(r->grpc_address);
    free(r->model_name);
    free(r->ucx_address);
    free(r);
    return K3_ENOMEM;
  }
  r->o.worker_id = r->worker_id;
  r->o.grpc_address = r->grpc_address;
  r->o.model_name = r->model_name;
  r->o.ucx_address = r->ucx_address;
  for (int i = 0; i < r->n_entries; i++) {
    r->entries[i].r = r;
    r->any_dns |= r->entries[i].dns;
    if (!r->entries[i].dns) add_link(r, r->entries[i].text, i);
  }
  if (r->any_dns) {
    uv_timer_init(loop, &r->timer);
    r->timer.data = r;
    r->timer_open = true;
    resolve_all(r);
    uv_timer_start(&r->timer, on_timer, r->o.resolve_ms, r->o.resolve_ms);
  }
  *out = r;
  return 0;
}

bool k3_registrar_registered(const k3_registrar_t *r) {
  for (const link_ent_t *e = r->links; e; e = e->next)
    if (reg_link_registered(e->l)) return true;
  return false;
}

void k3_registrar_count(const k3_registrar_t *r, int *n_routers, int *n_registered) {
  int n = 0, k = 0;
  for (const link_ent_t *e = r->links; e; e = e->next) {
    n++;
    k += reg_link_registered(e->l);
  }
  *n_routers = n;
  *n_registered = k;
}

void k3_registrar_kick(k3_registrar_t *r) {
  if (r->stopping) return;
  for (link_ent_t *e = r->links; e; e = e->next) reg_link_kick(e->l);
}

void k3_registrar_set_draining(k3_registrar_t *r, bool draining) {
  if (r->stopping) return;
  r->draining = draining;
  for (link_ent_t *e = r->links; e; e = e->next) reg_link_set_draining(e->l, draining);
}

void k3_registrar_stop(k3_registrar_t *r, bool deregister, void (*done)(void *arg), void *arg) {
  r->stopping = true;
  r->done = done;
  r->done_arg = arg;
  for (int i = 0; i < r->n_entries; i++)
    if (r->entries[i].req_live) uv_cancel((uv_req_t *)&r->entries[i].req); /* its callback still runs */
  if (r->timer_open) uv_close((uv_handle_t *)&r->timer, on_timer_closed);
  while (r->links) stop_link(r, r->links, deregister);
  maybe_free(r);
}
