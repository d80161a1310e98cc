/* k3pd-cli up: runs a local cluster in the foreground — one router (or --routers R) plus N
 * prefill and M decode workers on loopback — with every process's log lines prefixed by its name
 * on stderr. Every worker registers with every router (--router "A,B,...").
 * It prints "cluster ready: router at HOST:PORT ..." once every worker registered with every
 * router (and writes --ready-file: the routers' public addresses, one a line), and on Ctrl-C /
 * SIGTERM stops the workers, then the routers, with SIGTERM
 * (each drains), SIGKILLs whatever is still running after --stop-timeout-ms, and exits 0 when
 * every process exited 0.
 * A worker that dies on its own is restarted with the same arguments (same worker id, a new
 * port) after a backoff that doubles from --restart-backoff-ms up to --restart-backoff-max-ms
 * and starts over once the new process registered; the router moves the dead worker's
 * requests meanwhile. --max-restarts bounds the restarts per worker (then the cluster stops,
 * exit 1). With one router, the router dying stops the cluster (exit 1): clients and workers
 * hold its address. With several, a router that dies is restarted like a worker, at the same
 * public and cluster ports (the workers re-register with it; clients of the others never notice). 
 * Binaries are looked up in --bindir, next to k3pd-cli, in the build tree, then on PATH. */
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "cli.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/util.h"

#define UP_MAX_PROCS 34
#define UP_MAX_ARGS 40

typedef struct up_proc {
  struct up_state *st;
  char name[32];
  char *argv[UP_MAX_ARGS]; /* owned copies, NULL-terminated: a restart reuses them */
  uv_process_t proc;
  uv_pipe_t out;
  uv_timer_t restart_timer;
  char line[4096];
  size_t line_len;
  bool running, registered, is_router;
  int reg_lines;             /* "registered with router" lines of this process's first run */
  bool proc_open, out_open;  /* handles not yet closed (a restart waits for both) */
  bool counted;              /* counted once in n_registered */
  int restarts;
  uint64_t backoff_ms;
  int64_t exit_status;
  int term_signal;
} up_proc_t;

typedef struct up_state {
  uv_loop_t *loop;
  up_proc_t procs[UP_MAX_PROCS];
  int n;
  int n_workers, n_registered, n_routers;
  bool ready, stopping, closed;
  bool routers_termed; /* SIGTERM went to the routers: once (a second one makes a router exit at once, status 1) */
  int failed;
  const char *ready_file;
  char router_addr[64 * 8]; /* the routers' public addresses, ", "-separated */
  uv_signal_t sigint, sigterm;
  uv_timer_t kill_timer, router_timer;
  int64_t stop_timeout_ms;
  int64_t backoff0_ms, backoff_max_ms; /* restart backoff: first and largest */
  int max_restarts;                    /* per worker; < 0 = no limit */
} up_state_t;

static void stop_all(up_state_t *s);
static int spawn_proc(up_state_t *s, up_proc_t *p);

static void on_proc_closed(uv_handle_t *h) { ((up_proc_t *)h->data)->proc_open = false; }

static void on_out_closed(uv_handle_t *h) { ((up_proc_t *)h->data)->out_open = false; }

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static void emit_line(up_proc_t *p) {
  p->line[p->line_len] = 0;
  fprintf(stderr, "[%-9s] %s\n", p->name, p->line);
  up_state_t *s = p->st;
  if (p->is_router && !p->registered && strstr(p->line, "serving model")) {
    p->registered = true; /* up: a restarted router starts its backoff over */
    p->backoff_ms = (uint64_t)s->backoff0_ms;
    if (p->restarts) fprintf(stderr, "k3pd-cli up: %s is back (restart %d)\n", p->name, p->restarts);
  }
  if (!p->is_router && strstr(p->line, "registered with router")) p->reg_lines++;
  /* ready (the first time) once registered with every router */
  if (!p->registered && !p->is_router && p->reg_lines >= (p->counted ? 1 : s->n_routers)) {
    p->registered = true;
    p->backoff_ms = (uint64_t)s->backoff0_ms; /* it came up: the next failure restarts quickly again */
    if (p->restarts) fprintf(stderr, "k3pd-cli up: %s is back (restart %d)\n", p->name, p->restarts);
    if (p->counted) {
      p->line_len = 0;
      return;
    }
    p->counted = true;
    if (++s->n_registered == s->n_workers && !s->ready) {
      s->ready = true;
      fprintf(stderr, "cluster ready: router%s at %s (%d workers registered%s)\n", s->n_routers > 1 ? "s" : "",
              s->router_addr, s->n_workers, s->n_routers > 1 ? " with every router" : "");
      if (s->ready_file) {
        char buf[sizeof s->router_addr + 8];
        size_t n = 0;
        for (const char *c = s->router_addr; *c && n + 2 < sizeof buf; c++) {
          if (c[0] == ',' && c[1] == ' ') {
            buf[n++] = '\n';
            c++;
          } else {
            buf[n++] = *c;
          }
        }
        buf[n++] = '\n';
        if (k3_write_file(s->ready_file, buf, n)) fprintf(stderr, "k3pd-cli up: cannot write --ready-file\n");
      }
    }
  }
  p->line_len = 0;
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  up_proc_t *p = stream->data;
  if (nread > 0) {
    for (ssize_t i = 0; i < nread; i++) {
      char c = buf->base[i];
      if (c == '\n' || p->line_len == sizeof p->line - 1) {
        emit_line(p);
        if (c == '\n') continue;
      }
      p->line[p->line_len++] = c;
    }
  } else if (nread < 0) {
    if (p->line_len) emit_line(p);
    uv_close((uv_handle_t *)stream, on_out_closed);
  }
  free(buf->base);
}

static bool all_exited(up_state_t *s) {
  for (int i = 0; i < s->n; i++)
    if (s->procs[i].running) return false;
  return true;
}

/* Every handle is closed when the last process is gone (restart timers included). */
static void close_all(up_state_t *s) {
  if (s->closed) return;
  s->closed = true;
  uv_close((uv_handle_t *)&s->sigint, NULL);
  uv_close((uv_handle_t *)&s->sigterm, NULL);
  uv_close((uv_handle_t *)&s->kill_timer, NULL);
  uv_close((uv_handle_t *)&s->router_timer, NULL);
  for (int i = 0; i < s->n; i++) uv_close((uv_handle_t *)&s->procs[i].restart_timer, NULL);
}

static void on_restart_timer(uv_timer_t *t) {
  up_proc_t *p = t->data;
  up_state_t *s = p->st;
  if (s->stopping) return;
  if (p->proc_open || p->out_open) { /* the old handles are still closing */
    uv_timer_start(&p->restart_timer, on_restart_timer, 20, 0);
    return;
  }
  p->restarts++;
  p->registered = false;
  p->reg_lines = 0;
  fprintf(stderr, "k3pd-cli up: restarting %s (restart %d)\n", p->name, p->restarts);
  if (spawn_proc(s, p)) {
    s->failed = 1;
    stop_all(s);
  }
}

/* A worker died on its own: restart it after its backoff (doubling, capped). */
static void schedule_restart(up_state_t *s, up_proc_t *p) {
  if (s->max_restarts >= 0 && p->restarts >= s->max_restarts) {
    fprintf(stderr, "k3pd-cli up: %s died %d times: giving up (--max-restarts)\n", p->name, p->restarts + 1);
    s->failed = 1;
    stop_all(s);
    return;
  }
  uint64_t wait = p->backoff_ms;
  fprintf(stderr, "k3pd-cli up: %s will be restarted in %llu ms\n", p->name, (unsigned long long)wait);
  p->backoff_ms = p->backoff_ms * 2 > (uint64_t)s->backoff_max_ms ? (uint64_t)s->backoff_max_ms : p->backoff_ms * 2;
  uv_timer_start(&p->restart_timer, on_restart_timer, wait, 0);
}

static void on_exit_cb(uv_process_t *h, int64_t status, int term_signal) {
  up_proc_t *p = h->data;
  up_state_t *s = p->st;
  p->running = false;
  p->exit_status = status;
  p->term_signal = term_signal;
  uv_close((uv_handle_t *)h, on_proc_closed);
  if (status != 0 || term_signal || !s->stopping) {
    fprintf(stderr, "k3pd-cli up: %s exited with status %lld%s%s\n", p->name, (long long)status,
            term_signal ? ", signal " : "", term_signal ? strsignal(term_signal) : "");
    if (!s->stopping && (!p->is_router || s->n_routers > 1)) {
      schedule_restart(s, p);
    } else if (!s->stopping) {
      s->failed = 1;
      stop_all(s);
    } else if (term_signal != SIGKILL) {
      s->failed = 1;
    }
  }
  if (s->stopping && !s->routers_termed) {
    /* workers gone: now the routers (once: with several, the first router's exit lands here too) */
    bool workers_left = false;
    for (int i = 0; i < s->n; i++) workers_left |= s->procs[i].running && !s->procs[i].is_router;
    if (!workers_left) {
      s->routers_termed = true;
      for (int i = 0; i < s->n; i++)
        if (s->procs[i].running && s->procs[i].is_router) uv_process_kill(&s->procs[i].proc, SIGTERM);
    }
  }
  if (all_exited(s) && s->stopping) close_all(s);
}

static void on_kill_timer(uv_timer_t *t) {
  up_state_t *s = t->data;
  for (int i = 0; i < s->n; i++) {
    if (s->procs[i].running) {
      fprintf(stderr, "k3pd-cli up: %s did not stop in time: SIGKILL\n", s->procs[i].name);
      s->failed = 1;
      uv_process_kill(&s->procs[i].proc, SIGKILL);
    }
  }
}

static void stop_all(up_state_t *s) {
  if (s->stopping) return;
  s->stopping = true;
  fprintf(stderr, "k3pd-cli up: stopping the cluster\n");
  for (int i = 0; i < s->n; i++) uv_timer_stop(&s->procs[i].restart_timer);
  bool workers = false;
  for (int i = 0; i < s->n; i++) {
    if (s->procs[i].running && !s->procs[i].is_router) {
      uv_process_kill(&s->procs[i].proc, SIGTERM);
      workers = true;
    }
  }
  if (!workers) {
    s->routers_termed = true;
    for (int i = 0; i < s->n; i++)
      if (s->procs[i].running) uv_process_kill(&s->procs[i].proc, SIGTERM);
  }
  uv_timer_start(&s->kill_timer, on_kill_timer, (uint64_t)s->stop_timeout_ms, 0);
  if (all_exited(s)) close_all(s); /* nothing was running (every worker between restarts) */
}

static void on_signal(uv_signal_t *h, int signum) {
  up_state_t *s = h->data;
  (void)signum;
  if (s->stopping) {
    on_kill_timer(&s->kill_timer);
    return;
  }
  stop_all(s);
}

/* Starts p->argv in p's slot (a first start or a restart). */
static int spawn_proc(up_state_t *s, up_proc_t *p) {
  /* One pipe carries both stdout and stderr of the child (its log lines). */
  uv_file fds[2];
  int prc = uv_pipe(fds, 0, 0);
  if (prc) {
    fprintf(stderr, "k3pd-cli up: pipe: %s\n", uv_strerror(prc));
    return K3_EIO;
  }
  uv_stdio_container_t io[3];
  io[0].flags = UV_IGNORE;
  io[1].flags = UV_INHERIT_FD;
  io[1].data.fd = fds[1];
  io[2].flags = UV_INHERIT_FD;
  io[2].data.fd = fds[1];
  uv_process_options_t o;
  memset(&o, 0, sizeof o);
  o.file = p->argv[0];
  o.args = p->argv;
  o.exit_cb = on_exit_cb;
  o.stdio = io;
  o.stdio_count = 3;
  p->proc.data = p;
  int rc = uv_spawn(s->loop, &p->proc, &o);
  close(fds[1]);
  if (rc) {
    fprintf(stderr, "k3pd-cli up: cannot start %s (%s): %s\n", p->name, p->argv[0], uv_strerror(rc));
    close(fds[0]);
    /* a failed uv_spawn still initialised the handle: it is closed like any other */
    p->proc_open = true;
    uv_close((uv_handle_t *)&p->proc, on_proc_closed);
    return K3_EIO;
  }
  uv_pipe_init(s->loop, &p->out, 0);
  p->out.data = p;
  uv_pipe_open(&p->out, fds[0]);
  p->proc_open = p->out_open = true;
  p->running = true;
  p->line_len = 0;
  uv_read_start((uv_stream_t *)&p->out, alloc_cb, read_cb);
  return 0;
}

static int spawn(up_state_t *s, const char *name, bool is_router, char **argv) {
  if (s->n == UP_MAX_PROCS) return K3_ECAPACITY;
  up_proc_t *p = &s->procs[s->n];
  memset(p, 0, sizeof *p);
  p->st = s;
  p->is_router = is_router;
  p->backoff_ms = (uint64_t)s->backoff0_ms;
  snprintf(p->name, sizeof p->name, "%s", name);
  for (int i = 0; argv[i]; i++) {
    if (i == UP_MAX_ARGS - 1 || !(p->argv[i] = strdup(argv[i]))) {
      for (int k = 0; k < i; k++) free(p->argv[k]);
      memset(p->argv, 0, sizeof p->argv);
      return K3_ENOMEM;
    }
  }
  uv_timer_init(s->loop, &p->restart_timer);
  p->restart_timer.data = p;
  s->n++;
  int rc = spawn_proc(s, p);
  return rc;
}

/* Finds a k3pd binary: --bindir, next to k3pd-cli, the build tree (../../<dir>/), PATH. */
static int find_bin(const char *bindir, const char *self, const char *name, const char *subdir, char *out, size_t cap) {
  char exe[PATH_MAX];
  if (bindir) {
    snprintf(out, cap, "%s/%s", bindir, name);
    if (access(out, X_OK) == 0) return 0;
    snprintf(out, cap, "%s/%s/%s", bindir, subdir, name);
    if (access(out, X_OK) == 0) return 0;
    return K3_ENOENT;
  }
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *dir = dirname(exe);
    snprintf(out, cap, "%s/%s", dir, name);
    if (access(out, X_OK) == 0) return 0;
    snprintf(out, cap, "%s/../../%s/%s", dir, subdir, name);
    if (access(out, X_OK) == 0) return 0;
  }
  (void)self;
  const char *path = getenv("PATH");
  if (path) {
    char *copy = strdup(path), *save = NULL;
    for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
      snprintf(out, cap, "%s/%s", d, name);
      if (access(out, X_OK) == 0) {
        free(copy);
        return 0;
      }
    }
    free(copy);
  }
  return K3_ENOENT;
}

static void on_router_timer(uv_timer_t *t) {
  up_state_t *s = t->data;
  if (!s->ready && !s->stopping) {
    fprintf(stderr, "k3pd-cli up: workers did not register within the start-up timeout\n");
    s->failed = 1;
    stop_all(s);
  }
}

static int run_up(int argc, char **argv) {
  const char *model = NULL, *bindir = NULL, *ready_file = NULL, *backend = "cpu-fast", *precision = "fp32";
  const char *host = "127.0.0.1";
  int n_prefill = 1, n_decode = 1, n_routers = 1, port = 50051, threads = 1, page_tokens = 64, num_pages = 1024, num_slots = 16;
  int http_port = -1;
  int64_t stop_timeout_ms = 30000, start_timeout_ms = 120000, backoff0_ms = 500, backoff_max_ms = 10000;
  int max_restarts = -1;
  bool metrics = false;
  k3_flag_t flags[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "model directory (checkpoint + tokenizer)", true},
      {"prefill", K3_FLAG_INT, &n_prefill, "N", "prefill workers", false},
      {"decode", K3_FLAG_INT, &n_decode, "M", "decode workers", false},
      {"routers", K3_FLAG_INT, &n_routers, "R", "routers (1..8); every worker registers with all of them, and a "
       "router that dies is restarted at its ports when R > 1", false},
      {"port", K3_FLAG_INT, &port, "P", "router port on 127.0.0.1 (0 = ephemeral); router i of --routers listens "
       "on P + 2i, its cluster port on P + 2i + 1", false},
      {"http-port", K3_FLAG_INT, &http_port, "P", "the router's OpenAI-compatible HTTP API on 127.0.0.1:P (0 = "
       "ephemeral, -1 = off, the default)", false},
      {"backend", K3_FLAG_STR, &backend, "NAME", "kernel backend of the workers (cpu, cpu-fast, cuda)", false},
      {"precision", K3_FLAG_STR, &precision, "fp32|bf16", "numeric mode of the workers", false},
      {"threads", K3_FLAG_INT, &threads, "N", "backend threads per worker", false},
      {"page-tokens", K3_FLAG_INT, &page_tokens, "N", "MLA page size (the workers' default)", false},
      {"num-pages", K3_FLAG_INT, &num_pages, "N", "KV pages per worker", false},
      {"num-slots", K3_FLAG_INT, &num_slots, "N", "KDA slots per worker", false},
      {"metrics", K3_FLAG_BOOL, &metrics, NULL, "every process serves /metrics on an ephemeral port of 127.0.0.1 "
       "(each logs \"metrics on port N\")", false},
      {"bindir", K3_FLAG_STR, &bindir, "DIR", "where k3pd-router/-prefill/-decode are", false},
      {"ready-file", K3_FLAG_STR, &ready_file, "FILE", "write the router address here once every worker registered",
       false},
      {"start-timeout-ms", K3_FLAG_I64, &start_timeout_ms, "MS", "give up if the workers have not registered by then",
       false},
      {"stop-timeout-ms", K3_FLAG_I64, &stop_timeout_ms, "MS", "SIGKILL processes still running this long after "
       "Ctrl-C", false},
      {"restart-backoff-ms", K3_FLAG_I64, &backoff0_ms, "MS", "a worker that dies is restarted after this long, "
       "doubling per death up to --restart-backoff-max-ms (back to this once it registered again)", false},
      {"restart-backoff-max-ms", K3_FLAG_I64, &backoff_max_ms, "MS", "longest wait before a restart", false},
      {"max-restarts", K3_FLAG_INT, &max_restarts, "N", "restarts per worker before the cluster stops (-1 = no "
       "limit, the default; 0 = a dying worker stops the cluster)", false},
  };
  k3_flags_info_t info = {"k3pd-cli up",
                          "Runs a local k3pd cluster (router + prefill + decode workers on 127.0.0.1) in the "
                          "foreground; Ctrl-C stops it cleanly.",
                          NULL};
  char err[512];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-cli up: %s\n", err);
    return 2;
  }
  if (backoff0_ms < 1 || backoff_max_ms < backoff0_ms) {
    fprintf(stderr, "k3pd-cli up: need 1 <= --restart-backoff-ms <= --restart-backoff-max-ms\n");
    return 2;
  }
  if (n_routers < 1 || n_routers > 8 || n_prefill < 1 || n_decode < 1 ||
      n_prefill + n_decode > UP_MAX_PROCS - n_routers || port < 0 || port > 65535 - 2 * n_routers ||
      http_port < -1 || http_port > 65535 - n_routers) {
    fprintf(stderr, "k3pd-cli up: need 1 <= --routers <= 8, 1 <= --prefill, --decode (at most %d processes in all) "
            "and 0 <= --port <= 65535 - 2 x routers\n", UP_MAX_PROCS);
    return 2;
  }
  char router_bin[PATH_MAX], prefill_bin[PATH_MAX], decode_bin[PATH_MAX];
  if (find_bin(bindir, argv[0], "k3pd-router", "router", router_bin, sizeof router_bin) ||
      find_bin(bindir, argv[0], "k3pd-prefill", "prefill_worker", prefill_bin, sizeof prefill_bin) ||
      find_bin(bindir, argv[0], "k3pd-decode", "decode_worker", decode_bin, sizeof decode_bin)) {
    fprintf(stderr, "k3pd-cli up: cannot find k3pd-router/-prefill/-decode (use --bindir)\n");
    return 2;
  }
  static up_state_t s;
  memset(&s, 0, sizeof s);
  uv_loop_t loop;
  uv_loop_init(&loop);
  s.loop = &loop;
  s.ready_file = ready_file;
  s.stop_timeout_ms = stop_timeout_ms;
  s.backoff0_ms = backoff0_ms;
  s.backoff_max_ms = backoff_max_ms;
  s.max_restarts = max_restarts;
  s.n_workers = n_prefill + n_decode;
  uv_signal_init(&loop, &s.sigint);
  uv_signal_init(&loop, &s.sigterm);
  uv_timer_init(&loop, &s.kill_timer);
  uv_timer_init(&loop, &s.router_timer);
  s.sigint.data = s.sigterm.data = s.kill_timer.data = s.router_timer.data = &s;
  uv_signal_start(&s.sigint, on_signal, SIGINT);
  uv_signal_start(&s.sigterm, on_signal, SIGTERM);
  s.n_routers = n_routers;
  char cluster_list[80 * 8] = "";
  bool started = true;
  for (int ri = 0; ri < n_routers && started; ri++) {
    char listen[80], clisten[80], portfile[] = "/tmp/k3pd-up-port-XXXXXX", cportfile[] = "/tmp/k3pd-up-cport-XXXXXX";
    int pfd = mkstemp(portfile), cfd = mkstemp(cportfile);
    if (pfd < 0 || cfd < 0) {
      fprintf(stderr, "k3pd-cli up: cannot create a temporary file\n");
      return 1;
    }
    close(pfd);
    close(cfd);
    snprintf(listen, sizeof listen, "%s:%d", host, port ? port + 2 * ri : 0);
    snprintf(clisten, sizeof clisten, "%s:%d", host, port ? port + 2 * ri + 1 : 0);
    char hport[16], rname[32];
    snprintf(hport, sizeof hport, "%d", http_port > 0 ? http_port + ri : http_port);
    snprintf(rname, sizeof rname, n_routers > 1 ? "router-%d" : "router", ri);
    /* workers register on the router's cluster port (mutual TLS with the development CA) */
    char *rargv[] = {router_bin, "--model", (char *)model, "--listen", listen, "--cluster-listen", clisten,
                     "--port-file", portfile, "--cluster-port-file", cportfile, "--http-port", hport,
                     "--http-host", (char *)host, metrics ? "--metrics-port" : NULL, "0", "--metrics-host",
                     (char *)host, NULL};
    int idx = s.n;
    if (spawn(&s, rname, true, rargv)) return 1;
    up_proc_t *rp = &s.procs[idx];
    /* wait for the router's ports (bounded) */
    uint64_t deadline = k3_now_ns() + 20ull * 1000000000ull;
    int rport = 0, cport = 0;
    while ((!rport || !cport) && k3_now_ns() < deadline && rp->running) {
      uv_run(&loop, UV_RUN_NOWAIT);
      char *txt = NULL;
      if (!rport && k3_read_file(portfile, &txt, NULL) == 0) rport = atoi(txt);
      free(txt);
      txt = NULL;
      if (!cport && k3_read_file(cportfile, &txt, NULL) == 0) cport = atoi(txt);
      free(txt);
      if (!rport || !cport) usleep(20000);
    }
    unlink(portfile);
    unlink(cportfile);
    if (!rport || !cport) {
      fprintf(stderr, "k3pd-cli up: %s did not start\n", rname);
      started = false;
      break;
    }
    /* a restart (several routers) comes back at the same ports: the workers hold them */
    snprintf(listen, sizeof listen, "%s:%d", host, rport);
    snprintf(clisten, sizeof clisten, "%s:%d", host, cport);
    free(rp->argv[4]);
    free(rp->argv[6]);
    rp->argv[4] = strdup(listen);
    rp->argv[6] = strdup(clisten);
    if (!rp->argv[4] || !rp->argv[6]) return 1;
    size_t ul = strlen(s.router_addr), cl = strlen(cluster_list);
    snprintf(s.router_addr + ul, sizeof s.router_addr - ul, "%s%s", ul ? ", " : "", listen);
    snprintf(cluster_list + cl, sizeof cluster_list - cl, "%s%s", cl ? "," : "", clisten);
  }
  if (!started) {
    stop_all(&s);
  } else {
    char th[16], pt[16], np[16], ns[16];
    snprintf(th, sizeof th, "%d", threads);
    snprintf(pt, sizeof pt, "%d", page_tokens);
    snprintf(np, sizeof np, "%d", num_pages);
    snprintf(ns, sizeof ns, "%d", num_slots);
    for (int i = 0; i < n_prefill + n_decode && !s.stopping; i++) {
      bool pre = i < n_prefill;
      char name[32], id[48];
      snprintf(name, sizeof name, "%s-%d", pre ? "prefill" : "decode", pre ? i : i - n_prefill);
      snprintf(id, sizeof id, "%s", name);
      char *wargv[] = {pre ? prefill_bin : decode_bin, "--model", (char *)model, "--router", cluster_list,
                       "--listen", "127.0.0.1:0", "--worker-id", id, "--backend", (char *)backend,
                       "--precision", (char *)precision, "--threads", th, "--page-tokens", pt, "--num-pages", np,
                       "--num-slots", ns, metrics ? "--metrics-port" : NULL, "0", "--metrics-host", (char *)host,
                       NULL};
      if (spawn(&s, name, false, wargv)) {
        s.failed = 1;
        stop_all(&s);
      }
    }
    uv_timer_start(&s.router_timer, on_router_timer, (uint64_t)start_timeout_ms, 0);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  for (int i = 0; i < s.n; i++)
    for (int k = 0; s.procs[i].argv[k]; k++) free(s.procs[i].argv[k]);
  fprintf(stderr, "k3pd-cli up: cluster stopped%s\n", s.failed ? " (with errors)" : "");
  return s.failed ? 1 : 0;
}

const k3_cli_cmd_t cli_up_cmds[] = {
    {"up", "run a local cluster (router + prefill + decode) in the foreground", run_up},
};
const size_t cli_up_ncmds = sizeof cli_up_cmds / sizeof cli_up_cmds[0];
