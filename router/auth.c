/* API keys of the public API: file parsing, constant-time lookup, per-key rate and concurrency
 * limits (contracts in auth.h). Not here: where the check runs (generate.c for gRPC,
 * http_server.c for HTTP) or how a refusal is worded on each wire. */
#include "auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "k3pd/err.h"
#include "k3pd/metrics_k3pd.h"
#include "k3pd/util.h"

#define KEY_MIN 16
#define KEY_MAX 512
#define NAME_MAX_LEN 64

struct rt_key {
  char name[NAME_MAX_LEN + 1];
  unsigned char digest[SHA256_DIGEST_LENGTH];
  double rate, burst;   /* limits (rate 0 = none) */
  uint32_t concurrency; /* 0 = none */
  double tokens;        /* token bucket level */
  uint64_t refill_ns;   /* when tokens was last brought up to date (0 = never: full) */
  uint32_t inflight;
};

struct rt_auth {
  rt_key_t *keys;
  size_t n;
};

void rt_auth_free(rt_auth_t *a) {
  if (!a) return;
  if (a->keys) OPENSSL_cleanse(a->keys, a->n * sizeof *a->keys);
  free(a->keys);
  free(a);
}

size_t rt_auth_count(const rt_auth_t *a) { return a->n; }
const char *rt_auth_key_name(const rt_key_t *key) { return key->name; }

static int parse_num(const char *v, double max, double *out) {
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end || !(x >= 0) || x > max) return -1;
  *out = x;
  return 0;
}

/* One line: NAME KEY [opt=value...]; the line is modified in place. */
static int parse_line(char *line, const rt_auth_limits_t *d, rt_key_t *k, char *why, size_t cap) {
  char *save = NULL, *name = strtok_r(line, " \t", &save), *key = strtok_r(NULL, " \t", &save);
  if (!name || !key) {
    snprintf(why, cap, "expected NAME KEY [rate=R] [burst=B] [concurrency=C]");
    return -1;
  }
  size_t nl = strlen(name), kl = strlen(key);
  if (nl > NAME_MAX_LEN) {
    snprintf(why, cap, "name longer than %d characters", NAME_MAX_LEN);
    return -1;
  }
  for (size_t i = 0; i < nl; i++)
    if (!isalnum((unsigned char)name[i]) && !strchr("._-", name[i])) {
      snprintf(why, cap, "name \"%s\": only letters, digits, '.', '_' and '-'", name);
      return -1;
    }
  if (kl < KEY_MIN || kl > KEY_MAX) {
    snprintf(why, cap, "key of \"%s\": must be %d..%d characters (got %zu)", name, KEY_MIN, KEY_MAX, kl);
    return -1;
  }
  for (size_t i = 0; i < kl; i++)
    if (key[i] < 0x21 || key[i] > 0x7e) {
      snprintf(why, cap, "key of \"%s\": only printable ASCII without spaces", name);
      return -1;
    }
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "%s", name);
  SHA256((const unsigned char *)key, kl, k->digest);
  OPENSSL_cleanse(key, kl);
  k->rate = d->rate;
  k->burst = d->burst;
  k->concurrency = d->concurrency;
  for (char *opt; (opt = strtok_r(NULL, " \t", &save)) != NULL;) {
    char *eq = strchr(opt, '=');
    double v;
    if (!eq || parse_num(eq + 1, 1e9, &v)) {
      snprintf(why, cap, "option \"%.64s\" of \"%s\": expected rate=R, burst=B or concurrency=C (numbers >= 0)", opt,
               name);
      return -1;
    }
    *eq = 0;
    if (!strcmp(opt, "rate")) k->rate = v;
    else if (!strcmp(opt, "burst")) k->burst = v;
    else if (!strcmp(opt, "concurrency") && v == (double)(uint32_t)v) k->concurrency = (uint32_t)v;
    else {
      snprintf(why, cap, "option \"%s\" of \"%s\": unknown or not a whole number", opt, name);
      return -1;
    }
  }
  if (k->rate > 0 && k->burst < 1) k->burst = k->rate < 1 ? 1 : k->rate;
  k->tokens = k->burst;
  return 0;
}

int rt_auth_load(const char *path, const rt_auth_limits_t *defaults, rt_auth_t **out, char *err, size_t errlen) {
  char *text;
  size_t len;
  int rc = k3_read_file(path, &text, &len);
  if (rc) {
    snprintf(err, errlen, "--api-keys %s: %s", path, rc == K3_ENOENT ? "no such file" : "cannot read it");
    return rc;
  }
  rt_auth_t *a = calloc(1, sizeof *a);
  if (!a) {
    free(text);
    return K3_ENOMEM;
  }
  size_t cap = 0, lineno = 0;
  rc = 0;
  for (char *line = text, *next; line && !rc; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    lineno++;
    size_t l = strlen(line);
    while (l && (line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t')) line[--l] = 0;
    while (*line == ' ' || *line == '\t') line++;
    if (!*line || *line == '#') continue;
    if (a->n == cap) {
      cap = cap ? cap * 2 : 8;
      rt_key_t *nk = realloc(a->keys, cap * sizeof *nk);
      if (!nk) {
        rc = K3_ENOMEM;
        break;
      }
      a->keys = nk;
    }
    char why[256];
    if (parse_line(line, defaults, &a->keys[a->n], why, sizeof why)) {
      snprintf(err, errlen, "--api-keys %s: line %zu: %s", path, lineno, why);
      rc = K3_EINVAL;
      break;
    }
    for (size_t i = 0; i < a->n && !rc; i++)
      if (!memcmp(a->keys[i].digest, a->keys[a->n].digest, SHA256_DIGEST_LENGTH) ||
          !strcmp(a->keys[i].name, a->keys[a->n].name)) {
        snprintf(err, errlen, "--api-keys %s: \"%s\" repeats the name or the key of \"%s\"", path, a->keys[a->n].name,
                 a->keys[i].name);
        rc = K3_EINVAL;
      }
    a->n++;
  }
  OPENSSL_cleanse(text, len);
  free(text);
  if (!rc && a->n == 0) {
    snprintf(err, errlen, "--api-keys %s: no keys in it (every public request would be refused)", path);
    rc = K3_EINVAL;
  }
  if (rc) {
    rt_auth_free(a);
    return rc;
  }
  *out = a;
  return 0;
}

/* "Bearer KEY" (scheme case-insensitive, one or more spaces) → KEY, or NULL. */
static const char *bearer(const char *v, size_t *len) {
  if (!v || strncasecmp(v, "Bearer", 6) != 0 || (v[6] != ' ' && v[6] != '\t')) return NULL;
  v += 6;
  while (*v == ' ' || *v == '\t') v++;
  size_t n = strlen(v);
  while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
  if (n == 0 || n > KEY_MAX) return NULL;
  *len = n;
  return v;
}

k3_rpc_code_t rt_auth_admit(rt_auth_t *a, const char *authorization, uint64_t now_ns, rt_key_t **key,
                            const char **reason, char *msg, size_t cap) {
  *key = NULL;
  size_t len = 0;
  const char *k = bearer(authorization, &len);
  if (!k) {
    *reason = K3PD_AUTH_MISSING_KEY;
    snprintf(msg, cap, "authorization: %s (expected \"Bearer <API key>\")",
             authorization ? "not a bearer API key" : "missing: this endpoint needs an API key");
    return K3_RPC_UNAUTHENTICATED;
  }
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256((const unsigned char *)k, len, d);
  /* Every digest is compared, whatever matched before: the time does not depend on which key
   * (if any) matched. */
  size_t hit = (size_t)-1;
  for (size_t i = 0; i < a->n; i++) {
    size_t eq = (size_t)(CRYPTO_memcmp(d, a->keys[i].digest, sizeof d) == 0);
    hit = eq ? i : hit;
  }
  OPENSSL_cleanse(d, sizeof d);
  if (hit == (size_t)-1) {
    *reason = K3PD_AUTH_UNKNOWN_KEY;
    snprintf(msg, cap, "authorization: unknown API key");
    return K3_RPC_UNAUTHENTICATED;
  }
  rt_key_t *kk = &a->keys[hit];
  if (kk->concurrency && kk->inflight >= kk->concurrency) {
    *reason = K3PD_AUTH_CONCURRENCY_LIMITED;
    snprintf(msg, cap, "authorization: API key \"%s\" reached its concurrency limit of %u requests in flight "
             "(retry when one ended)", kk->name, kk->concurrency);
    return K3_RPC_RESOURCE_EXHAUSTED;
  }
  if (kk->rate > 0) {
    if (kk->refill_ns && now_ns > kk->refill_ns) {
      kk->tokens += (double)(now_ns - kk->refill_ns) / 1e9 * kk->rate;
      if (kk->tokens > kk->burst) kk->tokens = kk->burst;
    }
    kk->refill_ns = now_ns;
    if (kk->tokens < 1.0) {
      *reason = K3PD_AUTH_RATE_LIMITED;
      snprintf(msg, cap, "authorization: API key \"%s\" exceeded its request rate of %g/s (burst %g; retry in %.0f ms)",
               kk->name, kk->rate, kk->burst, (1.0 - kk->tokens) / kk->rate * 1e3 + 1);
      return K3_RPC_RESOURCE_EXHAUSTED;
    }
    kk->tokens -= 1.0;
  }
  kk->inflight++;
  *key = kk;
  return K3_RPC_OK;
}

void rt_auth_release(rt_key_t *key) {
  if (key && key->inflight) key->inflight--;
}
