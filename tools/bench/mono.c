/* k3pd-bench monolithic replay: runs every complete measured request again through
 * k3pd-generate (one process per request, sequentially, after the cluster run so the two never
 * compete for the CPU), collects its own prefill/decode timings, and optionally checks that the
 * token ids are identical to what the cluster streamed.
 *
 * Not here: anything about the cluster. k3pd-generate's contract (tools/generate/main.c): the
 * last stdout line is "ids: <generated ids>", and stderr carries one summary line
 * "... prefill N tokens in X s (...); decode M steps in Y s (...)".
 *
 * Every child has a deadline (SIGKILL after timeout_ms); output is read through pipes with
 * poll() so neither pipe can fill up and block the child. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"

extern char **environ;

typedef struct {
  char *data;
  size_t len, cap;
} buf_t;

static int buf_add(buf_t *b, const char *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *nd = realloc(b->data, cap);
    if (!nd) return K3_ENOMEM;
    b->data = nd;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return 0;
}

/* Runs argv, capturing stdout and stderr; *status is the wait status. Returns 0, K3_ETIMEDOUT
 * (child killed), or another K3_E* when it could not be started. */
static int run_child(char *const argv[], uint32_t timeout_ms, buf_t *out, buf_t *errb, int *status) {
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC)) return K3_EIO;
  if (pipe2(pe, O_CLOEXEC)) {
    close(po[0]);
    close(po[1]);
    return K3_EIO;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, po[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(po[1]);
  close(pe[1]);
  if (rc) {
    close(po[0]);
    close(pe[0]);
    return rc == ENOENT ? K3_ENOENT : K3_EIO;
  }
  uint64_t deadline = k3_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
  int open_fds = 2, result = 0;
  char chunk[4096];
  while (open_fds) {
    uint64_t now = k3_now_ns();
    if (now >= deadline) {
      kill(pid, SIGKILL);
      result = K3_ETIMEDOUT;
      break;
    }
    int n = poll(fds, 2, (int)((deadline - now) / 1000000 + 1));
    if (n < 0 && errno != EINTR) {
      kill(pid, SIGKILL);
      result = K3_EIO;
      break;
    }
    for (int i = 0; i < 2 && n > 0; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = read(fds[i].fd, chunk, sizeof chunk);
      if (r > 0) {
        if (buf_add(i ? errb : out, chunk, (size_t)r)) {
          kill(pid, SIGKILL);
          result = K3_ENOMEM;
          open_fds = 0;
          break;
        }
      } else if (r == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (fds[i].fd >= 0) close(fds[i].fd);
  while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

/* Parses the last "ids:" line of stdout into a malloc'd array. */
static int parse_ids(const char *out, uint32_t **ids, size_t *n) {
  const char *line = NULL;
  for (const char *p = out; (p = strstr(p, "ids:")) != NULL; p++)
    if (p == out || p[-1] == '\n') line = p;
  if (!line) return K3_EFORMAT;
  size_t cap = 64, k = 0;
  uint32_t *v = malloc(cap * sizeof *v);
  if (!v) return K3_ENOMEM;
  const char *p = line + 4;
  for (;;) {
    while (*p == ' ' || *p == '\t') p++;
    if (*p < '0' || *p > '9') break;
    char *end;
    unsigned long x = strtoul(p, &end, 10);
    if (k == cap) {
      uint32_t *nv = realloc(v, (cap *= 2) * sizeof *nv);
      if (!nv) {
        free(v);
        return K3_ENOMEM;
      }
      v = nv;
    }
    v[k++] = (uint32_t)x;
    p = end;
  }
  *ids = v;
  *n = k;
  return 0;
}

/* "prefill N tokens in X s (...); decode M steps in Y s" from k3pd-generate's stderr. */
static int parse_summary(const char *err, bn_mono_t *m) {
  const char *p = strstr(err, "prefill ");
  while (p) {
    unsigned long long nt = 0, ns = 0;
    double ps = 0, ds = 0;
    const char *d = strstr(p, "decode ");
    if (sscanf(p, "prefill %llu tokens in %lf s", &nt, &ps) == 2 && d &&
        sscanf(d, "decode %llu steps in %lf s", &ns, &ds) == 2) {
      m->prompt_tokens += nt;
      m->prefill_ns += (uint64_t)(ps * 1e9);
      m->decode_steps += ns;
      m->decode_ns += (uint64_t)(ds * 1e9);
      return 0;
    }
    p = strstr(p + 1, "prefill ");
  }
  return K3_EFORMAT;
}

static char *join_ids(const uint32_t *ids, size_t n) {
  char *s = malloc(n * 11 + 1);
  if (!s) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) o += (size_t)sprintf(s + o, i ? ",%u" : "%u", ids[i]);
  s[o] = 0;
  return s;
}

/* Writes "[a b c ...]" (at most 12 ids) into out. */
static void show_ids(char *out, size_t cap, const uint32_t *ids, size_t n) {
  size_t o = (size_t)snprintf(out, cap, "[");
  for (size_t i = 0; i < n && i < 12 && o < cap; i++) o += (size_t)snprintf(out + o, cap - o, i ? " %u" : "%u", ids[i]);
  if (o < cap) snprintf(out + o, cap - o, "%s]", n > 12 ? " ..." : "");
}

int bn_mono_run(const bn_mono_opts_t *o, const bn_workload_t *w, const bn_run_t *run, bool verify,
                bn_tokenize_fn tokenize, void *tok_ctx, bn_mono_t *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  for (size_t i = 0; i < run->n_res; i++) {
    const bn_result_t *x = &run->res[i];
    if (!x->complete) continue;
    bn_req_spec_t s;
    int rc = bn_spec_make(w, x->index, &s);
    if (rc) return rc;
    if (s.text) {
      if (!tokenize) {
        snprintf(err, errlen, "text prompts need --model to be tokenised for k3pd-generate");
        return K3_EINVAL;
      }
      rc = tokenize(tok_ctx, s.text, &s.ids, &s.n_ids, err, errlen);
      if (rc) return rc;
    }
    char *ids_arg = join_ids(s.ids, s.n_ids);
    bn_spec_free(&s);
    if (!ids_arg) return K3_ENOMEM;
    char max_new[16], temp[32], top_p[32], top_k[16], seed[32];
    snprintf(max_new, sizeof max_new, "%u", s.max_new);
    snprintf(temp, sizeof temp, "%.9g", w->temperature);
    snprintf(top_p, sizeof top_p, "%.9g", w->top_p);
    snprintf(top_k, sizeof top_k, "%d", w->top_k);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s.seed);
    char *argv[] = {(char *)o->generate, "--model", (char *)o->model, "--prompt-ids", ids_arg,
                    "--max-new-tokens", max_new, "--temperature", temp, "--top-p", top_p, "--top-k", top_k,
                    "--seed", seed, "--backend", (char *)o->backend, "--precision", (char *)o->precision,
                    w->ignore_eos ? "--ignore-eos" : NULL, NULL};
    buf_t out = {0}, eb = {0};
    int status = 0;
    uint64_t t0 = k3_now_ns();
    rc = run_child(argv, o->timeout_ms, &out, &eb, &status);
    m->wall_ns += k3_now_ns() - t0;
    free(ids_arg);
    m->runs++;
    if (rc == K3_ENOENT || (rc && rc != K3_ETIMEDOUT)) {
      snprintf(err, errlen, "cannot run %s: %s", o->generate, k3_strerror(rc));
      free(out.data);
      free(eb.data);
      return rc;
    }
    uint32_t *ids = NULL;
    size_t n_ids = 0;
    bool good = rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && out.data &&
                parse_ids(out.data, &ids, &n_ids) == 0 && eb.data && parse_summary(eb.data, m) == 0;
    if (!good) {
      m->failures++;
      const char *tail = eb.data ? eb.data : "";
      if (eb.len > 300) tail = eb.data + eb.len - 300;
      K3_WARN("k3pd-bench: k3pd-generate for request %llu %s; stderr tail: %s", (unsigned long long)x->index,
              rc == K3_ETIMEDOUT ? "timed out" : "failed or printed no ids/summary", tail);
    } else {
      m->completion_tokens += n_ids;
    }
    if (verify) {
      m->checked++;
      bool same = good && x->ids && n_ids == x->n_tokens && memcmp(ids, x->ids, n_ids * sizeof *ids) == 0;
      if (good && !x->ids && n_ids == 0 && x->n_tokens == 0) same = true;
      if (!same) {
        if (!m->mismatches) {
          char a[200], b[200];
          show_ids(a, sizeof a, x->ids, x->n_tokens);
          show_ids(b, sizeof b, ids, n_ids);
          snprintf(m->first_mismatch, sizeof m->first_mismatch,
                   "request %llu: cluster %u tokens %s, k3pd-generate %s%zu tokens %s", (unsigned long long)x->index,
                   x->n_tokens, a, good ? "" : "(failed) ", n_ids, b);
        }
        m->mismatches++;
      }
    }
    free(ids);
    free(out.data);
    free(eb.data);
  }
  return 0;
}
