/* Streaming detokenisation (see k3pd/detok.h for the contract).
 *
 * Two buffers: `raw` holds the bytes of a UTF-8 sequence that is still incomplete (at most
 * 3 bytes); `hold` holds decoded, well-formed text that is not yet final because it could
 * be the start of a stop string. Each feed appends the id's bytes to raw, moves every
 * complete (or definitely ill-formed → U+FFFD) sequence into hold, looks for a stop string
 * in hold, and releases all of hold except the longest suffix that is a proper prefix of a
 * stop string. Stop strings are well-formed UTF-8, so that suffix always starts on a
 * character boundary. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/detok.h"
#include "k3pd/err.h"
#include "tok_internal.h"
#include "tok_utf8.h"

struct k3_detok {
  const k3_tok_t *tok;
  int32_t *stop_ids;
  size_t n_stop_ids;
  char **stop_strs;
  size_t *stop_lens;
  size_t n_stop_strs;
  bool skip_special;
  k3_detok_state_t state;
  int stop_index;
  uint8_t raw[8];
  size_t raw_len;
  k3_tok_str_t hold;
};

int k3_detok_init(const k3_tok_t *tok, const k3_detok_opts_t *opts, k3_detok_t **out) {
  k3_detok_t *d = calloc(1, sizeof *d);
  if (!d) return K3_ENOMEM;
  d->tok = tok;
  d->stop_index = -1;
  int32_t def[2];
  const int32_t *ids = def;
  size_t nids = (size_t)k3_tok_stop_ids(tok, def);
  if (opts && opts->stop_ids) ids = opts->stop_ids, nids = opts->n_stop_ids;
  d->stop_ids = malloc((nids ? nids : 1) * sizeof *d->stop_ids);
  size_t ns = opts && opts->stop_strs ? opts->n_stop_strs : 0;
  d->stop_strs = calloc(ns ? ns : 1, sizeof *d->stop_strs);
  d->stop_lens = calloc(ns ? ns : 1, sizeof *d->stop_lens);
  if (!d->stop_ids || !d->stop_strs || !d->stop_lens) goto nomem;
  memcpy(d->stop_ids, ids, nids * sizeof *ids);
  d->n_stop_ids = nids;
  for (size_t i = 0; i < ns; i++) {
    const char *s = opts->stop_strs[i];
    size_t l = s ? strlen(s) : 0;
    if (l == 0 || k3_tok_utf8_valid_prefix(s, l) != l) {
      d->n_stop_strs = i;
      k3_detok_free(d);
      return K3_EINVAL;
    }
    if (!(d->stop_strs[i] = strdup(s))) {
      d->n_stop_strs = i;
      goto nomem;
    }
    d->stop_lens[i] = l;
  }
  d->n_stop_strs = ns;
  d->skip_special = opts && opts->skip_special;
  *out = d;
  return 0;
nomem:
  k3_detok_free(d);
  return K3_ENOMEM;
}

void k3_detok_free(k3_detok_t *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_stop_strs; i++) free(d->stop_strs[i]);
  free(d->stop_strs);
  free(d->stop_lens);
  free(d->stop_ids);
  free(d->hold.data);
  free(d);
}

k3_detok_state_t k3_detok_state(const k3_detok_t *d) { return d->state; }
int k3_detok_stop_index(const k3_detok_t *d) { return d->stop_index; }

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Moves complete / ill-formed sequences of raw ++ b[0..n) into hold; keeps an incomplete
 * tail in raw. */
static int absorb(k3_detok_t *d, const uint8_t *b, size_t n) {
  /* Work on raw ++ b without copying b when raw is empty. */
  uint8_t small[16];
  const uint8_t *s = b;
  size_t len = n;
  if (d->raw_len) {
    size_t take = n < sizeof small - d->raw_len ? n : sizeof small - d->raw_len;
    memcpy(small, d->raw, d->raw_len);
    memcpy(small + d->raw_len, b, take);
    size_t l = d->raw_len + take, used;
    d->raw_len = 0;
    /* Resolve the pending sequence within the first few bytes, then continue on b. */
    k3_utf8_status_t st = k3_tok_utf8_check(small, l, &used);
    if (st == K3_UTF8_TRUNCATED) {
      memcpy(d->raw, small, l);
      d->raw_len = l;
      return 0;
    }
    int rc = st == K3_UTF8_OK ? k3_tok_str_append(&d->hold, small, used)
                              : k3_tok_str_append(&d->hold, fffd, 3);
    if (rc) return rc;
    /* `used` bytes of small were consumed; those beyond the old raw came from b. */
    size_t from_b = used > l - take ? used - (l - take) : 0;
    s = b + from_b;
    len = n - from_b;
  }
  size_t i = 0, run = 0;
  while (i < len) {
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    size_t m;
    k3_utf8_status_t st = k3_tok_utf8_check(s + i, len - i, &m);
    if (st == K3_UTF8_OK) {
      i += m;
      continue;
    }
    int rc = k3_tok_str_append(&d->hold, s + run, i - run);
    if (rc) return rc;
    if (st == K3_UTF8_TRUNCATED) {
      memcpy(d->raw, s + i, len - i);
      d->raw_len = len - i;
      return 0;
    }
    if ((rc = k3_tok_str_append(&d->hold, fffd, 3))) return rc;
    i += m;
    run = i;
  }
  return k3_tok_str_append(&d->hold, s + run, len - run);
}

/* Emits hold[0..n) and keeps the rest. */
static int release(k3_detok_t *d, size_t n, k3_tok_str_t *out) {
  int rc = k3_tok_str_append(out, d->hold.data, n);
  if (rc) return rc;
  memmove(d->hold.data, d->hold.data + n, d->hold.len - n);
  d->hold.len -= n;
  d->hold.data[d->hold.len] = '\0';
  return 0;
}

static int scan_stops(k3_detok_t *d, k3_tok_str_t *out) {
  if (d->n_stop_strs == 0) return release(d, d->hold.len, out);
  size_t best_pos = SIZE_MAX;
  int best = -1;
  for (size_t i = 0; i < d->n_stop_strs; i++) {
    const char *p = memmem(d->hold.data, d->hold.len, d->stop_strs[i], d->stop_lens[i]);
    if (p && (size_t)(p - d->hold.data) < best_pos) best_pos = (size_t)(p - d->hold.data), best = (int)i;
  }
  if (best >= 0) {
    int rc = k3_tok_str_append(out, d->hold.data, best_pos);
    d->hold.len = 0;
    d->state = K3_DETOK_STOP_STR;
    d->stop_index = best;
    return rc;
  }
  size_t keep = 0;
  for (size_t i = 0; i < d->n_stop_strs; i++) {
    size_t l = d->stop_lens[i] - 1;
    if (l > d->hold.len) l = d->hold.len;
    for (; l > keep; l--)
      if (memcmp(d->hold.data + d->hold.len - l, d->stop_strs[i], l) == 0) break;
    if (l > keep) keep = l;
  }
  return release(d, d->hold.len - keep, out);
}

/* Flushes everything held: an incomplete tail becomes one U+FFFD. */
static int flush_all(k3_detok_t *d, k3_tok_str_t *out) {
  int rc = 0;
  if (d->raw_len) {
    rc = k3_tok_str_append(&d->hold, fffd, 3);
    d->raw_len = 0;
  }
  if (!rc && d->hold.len) rc = release(d, d->hold.len, out);
  if (!rc && !out->data) rc = k3_tok_str_append(out, "", 0);
  return rc;
}

int k3_detok_feed(k3_detok_t *d, int32_t id, k3_tok_str_t *out) {
  if (d->state != K3_DETOK_RUNNING) return d->state;
  const uint8_t *b;
  size_t n;
  if (k3_tok_id_bytes(d->tok, id, &b, &n)) return K3_ERANGE;
  for (size_t i = 0; i < d->n_stop_ids; i++) {
    if (d->stop_ids[i] == id) {
      int rc = flush_all(d, out);
      if (rc) return rc;
      d->state = K3_DETOK_STOP_ID;
      d->stop_index = (int)i;
      return d->state;
    }
  }
  if (d->skip_special && k3_tok_is_skippable(d->tok, id)) return d->state;
  int rc = absorb(d, b, n);
  if (!rc) rc = scan_stops(d, out);
  return rc ? rc : (int)d->state;
}

int k3_detok_finish(k3_detok_t *d, k3_tok_str_t *out) {
  if (d->state != K3_DETOK_RUNNING) return d->state;
  /* A stop string can not be completed any more: what is held is plain text. */
  int rc = flush_all(d, out);
  if (rc) return rc;
  d->state = K3_DETOK_FINISHED;
  return d->state;
}
