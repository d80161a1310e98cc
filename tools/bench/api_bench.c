/* k3pd-api-bench: what the OpenAI-compatible HTTP front adds to a request, measured against the
 * gRPC API on the same cluster in one run (docs/perf.md, "HTTP API overhead").
 *
 * One client process, one request at a time, so the two APIs see the same idle cluster:
 *  - gRPC: /k3pd.v1.Generation/Generate through k3_rpc's C client (a uv loop run until the
 *    call ends);
 *  - HTTP: POST /v1/completions on one keep-alive connection from a blocking socket
 *    (TCP_NODELAY), the body parsed only as far as needed (Content-Length or chunked framing,
 *    SSE events, the "token_ids" of return_token_ids).
 * Both send the same prompt ids, greedy, ignore_eos, so both generate the same tokens (checked).
 * Requests go in blocks of --block per API, the APIs alternating block by block (slow drift of
 * the shared VM hits both).
 *
 * With --router-pid the router's CPU time over each block (every thread, and the loop thread
 * alone, from /proc schedstat: immune to the preemption that inflates wall-clock figures on a
 * shared machine) gives what each API costs the router per request and per streamed token. The
 * HTTP front runs entirely on the loop thread; gRPC's framing runs on gRPC core's threads.
 *
 * Figures, per API: request latency with 1 generated token (send → last byte), TTFT and the mean
 * inter-token gap of streams of --stream-tokens tokens, router CPU per request and per token;
 * then the HTTP − gRPC differences (of the medians, and the median of block-paired differences).
 * Exit status: 0 = every request succeeded with equal tokens; 1 = a failure or a mismatch;
 * 2 = bad flags. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <uv.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/log.h"
#include "k3pd/rpc_client.h"
#include "k3pd/util.h"
#include "k3pd/v1/generation.pb-c.h"

#define MAX_TOK 4096

typedef struct {
  uint64_t t0, t_first, t_last, t_end;
  uint32_t ids[MAX_TOK];
  size_t n;
  int ok;
} run_t;

typedef struct {
  double *v;
  size_t n, cap;
} vec_t;

static void vpush(vec_t *x, double d) {
  if (x->n == x->cap) {
    x->cap = x->cap ? 2 * x->cap : 64;
    x->v = realloc(x->v, x->cap * sizeof *x->v);
    if (!x->v) abort();
  }
  x->v[x->n++] = d;
}

static int dcmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(vec_t *x, double p) {
  if (!x->n) return 0;
  qsort(x->v, x->n, sizeof *x->v, dcmp);
  size_t i = (size_t)(p * (double)(x->n - 1) + 0.5);
  return x->v[i];
}

/* ---- gRPC ---- */

typedef struct {
  uv_loop_t loop;
  k3_rpc_client_t *cli;
  const char *target;
  run_t *r;
  bool done;
} grpc_t;

static void g_msg(void *arg, const ProtobufCMessage *m) {
  grpc_t *g = arg;
  const K3pd__V1__GenerateResponse *x = (const K3pd__V1__GenerateResponse *)m;
  if (!x->n_token_ids) return;
  uint64_t now = k3_now_ns();
  if (!g->r->t_first) g->r->t_first = now;
  g->r->t_last = now;
  for (size_t i = 0; i < x->n_token_ids && g->r->n < MAX_TOK; i++) g->r->ids[g->r->n++] = x->token_ids[i];
}

static void g_done(void *arg, const k3_rpc_status_t *st) {
  grpc_t *g = arg;
  g->r->t_end = k3_now_ns();
  g->r->ok = st->code == K3_RPC_OK;
  if (!g->r->ok) fprintf(stderr, "k3pd-api-bench: gRPC: %s: %s\n", k3_rpc_code_name(st->code), st->details);
  g->done = true;
}

static void grpc_run(grpc_t *g, const uint32_t *prompt, size_t n_prompt, uint32_t max_new, run_t *r) {
  memset(r, 0, sizeof *r);
  K3pd__V1__GenerateRequest q = K3PD__V1__GENERATE_REQUEST__INIT;
  K3pd__V1__TokenIds ti = K3PD__V1__TOKEN_IDS__INIT;
  K3pd__V1__SamplingParams sp = K3PD__V1__SAMPLING_PARAMS__INIT;
  K3pd__V1__StopConditions sc = K3PD__V1__STOP_CONDITIONS__INIT;
  ti.ids = (uint32_t *)prompt;
  ti.n_ids = n_prompt;
  q.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
  q.token_ids = &ti;
  sp.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
  sp.temperature = 0;
  q.sampling = &sp;
  sc.max_new_tokens = max_new;
  sc.ignore_eos = true;
  q.stop = &sc;
  g->r = r;
  g->done = false;
  k3_rpc_call_opts_t o = {.timeout_ms = 60000};
  r->t0 = k3_now_ns();
  if (k3_rpc_stream(g->cli, g->target, "/k3pd.v1.Generation/Generate", &q.base, &k3pd__v1__generate_response__descriptor,
                    &o, g_msg, g_done, g, NULL)) {
    r->ok = 0;
    return;
  }
  while (!g->done) uv_run(&g->loop, UV_RUN_ONCE);
}

/* ---- HTTP/1.1 on a blocking keep-alive socket ---- */

typedef struct {
  char host[256];
  int port, fd;
  char *buf; /* received, not yet consumed */
  size_t len, cap;
} http_t;

static int h_connect(http_t *h) {
  if (h->fd >= 0) return 0;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
  char port[16];
  snprintf(port, sizeof port, "%d", h->port);
  if (getaddrinfo(h->host, port, &hints, &ai)) return -1;
  h->fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct timeval tv = {.tv_sec = 60};
  setsockopt(h->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int rc = connect(h->fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc) {
    close(h->fd);
    h->fd = -1;
  }
  h->len = 0;
  return rc;
}

/* Reads more bytes; returns the count (0 = closed, < 0 = error/timeout). */
static ssize_t h_fill(http_t *h) {
  if (h->cap - h->len < 65536) {
    h->cap = h->cap ? 2 * h->cap : 1 << 17;
    h->buf = realloc(h->buf, h->cap);
    if (!h->buf) abort();
  }
  ssize_t n = recv(h->fd, h->buf + h->len, h->cap - h->len - 1, 0);
  if (n > 0) h->len += (size_t)n;
  h->buf[h->len] = 0;
  return n;
}

static void h_consume(http_t *h, size_t n) {
  memmove(h->buf, h->buf + n, h->len - n + 1); /* with the terminating NUL */
  h->len -= n;
}

/* Appends the ids of every "token_ids":[...] in s[0..n) to r; returns how many. */
static size_t take_ids(const char *s, size_t n, run_t *r) {
  size_t got = 0;
  const char *end = s + n, *p = s;
  while ((p = memmem(p, (size_t)(end - p), "\"token_ids\":[", 13))) {
    p += 13;
    while (p < end && *p != ']') {
      char *e;
      unsigned long v = strtoul(p, &e, 10);
      if (e == p) break;
      if (r->n < MAX_TOK) r->ids[r->n++] = (uint32_t)v;
      got++;
      p = e;
      if (p < end && *p == ',') p++;
    }
  }
  return got;
}

/* One POST /v1/completions; stream: SSE events are timed as they arrive. */
static int http_run(http_t *h, const uint32_t *prompt, size_t n_prompt, uint32_t max_new, bool stream, run_t *r) {
  memset(r, 0, sizeof *r);
  char body[8192], req[9000];
  size_t bl = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
  for (size_t i = 0; i < n_prompt; i++) bl += (size_t)snprintf(body + bl, sizeof body - bl, i ? ",%u" : "%u", prompt[i]);
  bl += (size_t)snprintf(body + bl, sizeof body - bl,
                         "],\"max_tokens\":%u,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true%s}", max_new,
                         stream ? ",\"stream\":true" : "");
  int rl = snprintf(req, sizeof req,
                    "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n%s",
                    h->host, bl, body);
  if (h_connect(h)) return -1;
  r->t0 = k3_now_ns();
  if (send(h->fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) goto broken;
  char *he;
  while (!(he = strstr(h->buf ? h->buf : "", "\r\n\r\n")))
    if (h_fill(h) <= 0) goto broken;
  if (strncmp(h->buf, "HTTP/1.1 200", 12) != 0) {
    fprintf(stderr, "k3pd-api-bench: HTTP: %.200s\n", h->buf);
    goto broken;
  }
  bool chunked = strcasestr(h->buf, "transfer-encoding: chunked") != NULL;
  const char *cl = strcasestr(h->buf, "content-length:");
  size_t clen = cl && cl < he ? strtoul(cl + 15, NULL, 10) : 0;
  h_consume(h, (size_t)(he + 4 - h->buf));
  if (!chunked) {
    while (h->len < clen)
      if (h_fill(h) <= 0) goto broken;
    r->t_end = k3_now_ns();
    take_ids(h->buf, clen, r);
    r->t_first = r->t_last = r->t_end;
    h_consume(h, clen);
    r->ok = 1;
    return 0;
  }
  /* chunked SSE: decode chunks into `ev`, cut events at "\n\n" as they complete */
  char *ev = NULL;
  size_t evl = 0, evc = 0;
  for (;;) {
    char *crlf;
    while (!(crlf = strstr(h->buf ? h->buf : "", "\r\n")))
      if (h_fill(h) <= 0) goto broken_ev;
    size_t n = strtoul(h->buf, NULL, 16);
    size_t hdr = (size_t)(crlf + 2 - h->buf);
    while (h->len < hdr + n + 2)
      if (h_fill(h) <= 0) goto broken_ev;
    if (n == 0) {
      h_consume(h, hdr + 2);
      break;
    }
    if (evl + n + 1 > evc) {
      evc = 2 * (evl + n + 1);
      ev = realloc(ev, evc);
      if (!ev) abort();
    }
    memcpy(ev + evl, h->buf + hdr, n);
    evl += n;
    ev[evl] = 0;
    h_consume(h, hdr + n + 2);
    uint64_t now = k3_now_ns();
    char *cut;
    while ((cut = strstr(ev, "\n\n"))) {
      size_t k = (size_t)(cut + 2 - ev);
      if (take_ids(ev, k, r)) {
        if (!r->t_first) r->t_first = now;
        r->t_last = now;
      }
      memmove(ev, ev + k, evl - k + 1);
      evl -= k;
    }
  }
  free(ev);
  r->t_end = k3_now_ns();
  r->ok = 1;
  return 0;
broken_ev:
  free(ev);
broken:
  close(h->fd);
  h->fd = -1;
  return -1;
}

/* CPU time (ns) the router process's threads have run, from /proc/PID/task/TID/schedstat
 * (nanosecond resolution, unlike the 10 ms ticks of /proc/PID/stat); 0 when unavailable. */
static uint64_t router_cpu_ns(int pid, bool loop_only) {
  if (pid <= 0) return 0;
  if (loop_only) { /* the main thread runs the uv loop: the HTTP server, intake, relay */
    char f[64];
    snprintf(f, sizeof f, "/proc/%d/task/%d/schedstat", pid, pid);
    FILE *fp = fopen(f, "r");
    unsigned long long ns = 0;
    if (fp && fscanf(fp, "%llu", &ns) != 1) ns = 0;
    if (fp) fclose(fp);
    return ns;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  uint64_t sum = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char f[384];
    snprintf(f, sizeof f, "/proc/%d/task/%.255s/schedstat", pid, e->d_name);
    FILE *fp = fopen(f, "r");
    unsigned long long ns;
    if (fp && fscanf(fp, "%llu", &ns) == 1) sum += ns;
    if (fp) fclose(fp);
  }
  closedir(d);
  return sum;
}

static bool same(const run_t *a, const run_t *b) {
  return a->n == b->n && memcmp(a->ids, b->ids, a->n * sizeof a->ids[0]) == 0;
}

typedef struct {
  vec_t lat, ttft, gap;
  uint64_t cpu1_ns, cpun_ns;   /* router CPU (all threads) over the 1-token blocks / the stream blocks */
  uint64_t loop1_ns, loopn_ns; /* the same, the loop thread only */
  uint64_t n1, nn;             /* requests in them */
} stats_t;

int main(int argc, char **argv) {
  const char *router = NULL, *http_addr = NULL, *prompt_s = "17,250,3001,42,7,999,1234,5", *json_path = NULL;
  int rounds = 20, block = 10, stream_tokens = 64, warmup = 10, router_pid = 0;
  k3_flag_t flags[] = {
      {"router", K3_FLAG_STR, &router, "HOST:PORT", "the router's gRPC address", true},
      {"http", K3_FLAG_STR, &http_addr, "HOST:PORT", "the router's HTTP API address (--http-port)", true},
      {"rounds", K3_FLAG_INT, &rounds, "N", "rounds; each sends one block per API and kind (default 20)", false},
      {"block", K3_FLAG_INT, &block, "N", "requests per block (default 10)", false},
      {"stream-tokens", K3_FLAG_INT, &stream_tokens, "N", "tokens of each streamed request (default 64)", false},
      {"warmup", K3_FLAG_INT, &warmup, "N", "unmeasured requests per API first (default 10)", false},
      {"prompt-ids", K3_FLAG_STR, &prompt_s, "IDS", "prompt token ids (default 8 fixed ids)", false},
      {"json", K3_FLAG_STR, &json_path, "FILE", "append the figures as one JSON line", false},
      {"router-pid", K3_FLAG_INT, &router_pid, "PID", "the router's pid: report its CPU time (all threads) per request "
       "and per token for each API", false},
  };
  k3_flags_info_t info = {"k3pd-api-bench",
                          "Measures what the OpenAI-compatible HTTP API adds per request and per streamed token "
                          "compared with gRPC Generate on the same cluster (sequential, blocks alternating).",
                          NULL};
  char err[512];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  int32_t *pid32 = NULL;
  size_t n_prompt = 0;
  if (!rc) rc = k3_parse_int_list(prompt_s, &pid32, &n_prompt, err, sizeof err);
  const char *colon = http_addr ? strrchr(http_addr, ':') : NULL;
  if (rc || !colon || rounds < 1 || block < 1 || stream_tokens < 2 || stream_tokens > MAX_TOK || n_prompt == 0) {
    fprintf(stderr, "k3pd-api-bench: %s\n", rc ? err : "need --http HOST:PORT, --rounds/--block >= 1, "
                                                      "2 <= --stream-tokens <= 4096, a prompt");
    return 2;
  }
  uint32_t *prompt = malloc(n_prompt * sizeof *prompt);
  for (size_t i = 0; i < n_prompt; i++) prompt[i] = (uint32_t)pid32[i];
  free(pid32);
  k3_log_set_level(K3_LOG_WARN);
  http_t h = {.fd = -1};
  snprintf(h.host, sizeof h.host, "%.*s", (int)(colon - http_addr), http_addr);
  h.port = atoi(colon + 1);
  grpc_t g = {.target = router};
  uv_loop_init(&g.loop);
  if (k3_rpc_client_init(&g.loop, NULL, &g.cli)) return 2;
  run_t *a = malloc(sizeof *a), *b = malloc(sizeof *b), *ref1 = calloc(1, sizeof *ref1), *refn = calloc(1, sizeof *refn);
  int failed = 0;
  /* warm-up, and the reference tokens both APIs must produce */
  for (int i = 0; i < warmup; i++) {
    grpc_run(&g, prompt, n_prompt, 1, ref1);
    grpc_run(&g, prompt, n_prompt, (uint32_t)stream_tokens, refn);
    failed |= http_run(&h, prompt, n_prompt, 1, false, a) || !a->ok || !same(a, ref1);
    failed |= http_run(&h, prompt, n_prompt, (uint32_t)stream_tokens, true, b) || !b->ok || !same(b, refn);
  }
  if (failed || !ref1->ok || !refn->ok || refn->n != (size_t)stream_tokens) {
    fprintf(stderr, "k3pd-api-bench: warm-up failed or the APIs disagree (gRPC %zu tokens)\n", refn->n);
    return 1;
  }
  stats_t st[2];
  memset(st, 0, sizeof st);
  vec_t d_lat = {0}, d_gap = {0};
  for (int round = 0; round < rounds; round++) {
    double blk_lat[2] = {0}, blk_gap[2] = {0};
    /* the API order alternates by round */
    for (int k = 0; k < 2; k++) {
      int api = (round + k) % 2; /* 0 = gRPC, 1 = HTTP */
      stats_t *s = &st[api];
      /* one block of 1-token requests */
      vec_t tmp = {0};
      uint64_t cpu0 = router_cpu_ns(router_pid, false), loop0 = router_cpu_ns(router_pid, true);
      for (int i = 0; i < block; i++) {
        int e = api ? http_run(&h, prompt, n_prompt, 1, false, a) : (grpc_run(&g, prompt, n_prompt, 1, a), 0);
        if (e || !a->ok || !same(a, ref1)) {
          fprintf(stderr, "k3pd-api-bench: %s 1-token request failed or differs (%zu tokens)\n", api ? "HTTP" : "gRPC",
                  a->n);
          failed = 1;
        }
        double us = (double)(a->t_end - a->t0) / 1e3;
        vpush(&s->lat, us);
        vpush(&tmp, us);
      }
      s->cpu1_ns += router_cpu_ns(router_pid, false) - cpu0;
      s->loop1_ns += router_cpu_ns(router_pid, true) - loop0;
      s->n1 += (uint64_t)block;
      blk_lat[api] = pct(&tmp, 0.5);
      free(tmp.v);
      /* one block of streams */
      vec_t tg = {0};
      cpu0 = router_cpu_ns(router_pid, false);
      loop0 = router_cpu_ns(router_pid, true);
      for (int i = 0; i < block; i++) {
        int e = api ? http_run(&h, prompt, n_prompt, (uint32_t)stream_tokens, true, a)
                    : (grpc_run(&g, prompt, n_prompt, (uint32_t)stream_tokens, a), 0);
        if (e || !a->ok || !same(a, refn)) {
          fprintf(stderr, "k3pd-api-bench: %s stream failed or differs (%zu tokens)\n", api ? "HTTP" : "gRPC", a->n);
          failed = 1;
        }
        vpush(&s->ttft, (double)(a->t_first - a->t0) / 1e3);
        double gap = (double)(a->t_last - a->t_first) / 1e3 / (double)(stream_tokens - 1);
        vpush(&s->gap, gap);
        vpush(&tg, gap);
      }
      s->cpun_ns += router_cpu_ns(router_pid, false) - cpu0;
      s->loopn_ns += router_cpu_ns(router_pid, true) - loop0;
      s->nn += (uint64_t)block;
      blk_gap[api] = pct(&tg, 0.5);
      free(tg.v);
    }
    vpush(&d_lat, blk_lat[1] - blk_lat[0]);
    vpush(&d_gap, blk_gap[1] - blk_gap[0]);
  }
  const char *name[2] = {"gRPC Generate", "HTTP /v1/completions"};
  double v[2][9];
  for (int api = 0; api < 2; api++) {
    stats_t *s = &st[api];
    double n1 = s->n1 ? (double)s->n1 : 1, nn = s->nn ? (double)s->nn : 1, extra = (double)(stream_tokens - 1);
    v[api][0] = pct(&s->lat, 0.5);
    v[api][1] = pct(&s->lat, 0.9);
    v[api][2] = pct(&s->ttft, 0.5);
    v[api][3] = pct(&s->gap, 0.5);
    /* router CPU (means): per 1-token request, and per extra token of a stream */
    v[api][4] = (double)s->cpu1_ns / n1 / 1e3;
    v[api][5] = ((double)s->cpun_ns / nn / 1e3 - v[api][4]) / extra;
    v[api][6] = (double)s->loop1_ns / n1 / 1e3;
    v[api][7] = ((double)s->loopn_ns / nn / 1e3 - v[api][6]) / extra;
  }
  double dl = pct(&d_lat, 0.5), dg = pct(&d_gap, 0.5);
  printf("k3pd-api-bench: %d rounds x %d requests per API and kind, prompt %zu tokens, streams of %d tokens, "
         "equal tokens on both APIs: %s\n",
         rounds, block, n_prompt, stream_tokens, failed ? "NO" : "yes");
  printf("%-46s %14s %21s %12s\n", "figure (µs)", name[0], name[1], "HTTP - gRPC");
  static const char *rows[] = {"request, 1 token, send -> last byte, p50", "request, 1 token, p90",
                               "TTFT of a 64-token stream, p50", "inter-token gap of a stream, p50",
                               "router CPU per request, all threads", "router CPU per extra token, all threads",
                               "router CPU per request, loop thread", "router CPU per extra token, loop thread"};
  int nrows = router_pid > 0 ? 8 : 4;
  for (int i = 0; i < nrows; i++)
    printf("%-46s %14.1f %21.1f %+12.1f\n", rows[i], v[0][i], v[1][i], v[1][i] - v[0][i]);
  printf("%-46s %14s %21s %+12.1f\n", "block-paired median difference, request", "", "", dl);
  printf("%-46s %14s %21s %+12.1f\n", "block-paired median difference, token gap", "", "", dg);
  if (json_path) {
    FILE *f = fopen(json_path, "a");
    if (f) {
      fprintf(f,
              "{\"bench\":\"api\",\"rounds\":%d,\"block\":%d,\"stream_tokens\":%d,\"equal_tokens\":%s,"
              "\"paired_req_us\":%.1f,\"paired_tok_us\":%.2f",
              rounds, block, stream_tokens, failed ? "false" : "true", dl, dg);
      for (int api = 0; api < 2; api++)
        fprintf(f,
                ",\"%s\":{\"req_p50_us\":%.1f,\"req_p90_us\":%.1f,\"ttft_p50_us\":%.1f,\"itl_p50_us\":%.2f,"
                "\"cpu_req_us\":%.1f,\"cpu_tok_us\":%.2f,\"loop_req_us\":%.1f,\"loop_tok_us\":%.2f}",
                api ? "http" : "grpc", v[api][0], v[api][1], v[api][2], v[api][3], v[api][4], v[api][5], v[api][6],
                v[api][7]);
      fprintf(f, "}\n");
      fclose(f);
    }
  }
  k3_rpc_client_close(g.cli, NULL, NULL);
  uv_run(&g.loop, UV_RUN_DEFAULT);
  uv_loop_close(&g.loop);
  return failed ? 1 : 0;
}
