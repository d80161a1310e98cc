/* k3_detok: streaming detokenisation with stop conditions.
 *
 * Feed ids one at a time as the model samples them; each call appends to `out` only text
 * that is final: complete UTF-8, and not possibly the start of a stop string.
 *  - A multi-byte character split across tokens is held back until it completes.
 *  - Ill-formed bytes (a byte that can never start or continue a valid sequence, or a
 *    sequence cut short by a non-continuation byte) become U+FFFD, one per maximal subpart
 *    (Python's bytes.decode("utf-8", "replace")); k3_detok_finish turns a trailing partial
 *    sequence into U+FFFD.
 *  - Stop ids: the id's own text is never emitted; held-back text is flushed; the stream is
 *    then stopped.
 *  - Stop strings (matched on the decoded text, across any token boundaries): text before
 *    the first occurrence is emitted, the stop string and anything after it are not; while
 *    running, the longest suffix that could still start a stop string is held back.
 * What it is not: thread-safe (one detokeniser per sequence, used by one thread).
 * Ownership: the detokeniser borrows tok (which must outlive it) and copies the options. */
#ifndef K3PD_DETOK_H
#define K3PD_DETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/tokenizer.h"

typedef struct {
  const int32_t *stop_ids;   /* NULL: the tokenizer's stop ids (k3_tok_stop_ids) */
  size_t n_stop_ids;         /* with stop_ids non-NULL; 0 ids = never stop on an id */
  const char *const *stop_strs; /* NUL-terminated, non-empty; may be NULL */
  size_t n_stop_strs;
  bool skip_special; /* omit k3_tok_is_skippable ids from the text */
} k3_detok_opts_t;

typedef enum {
  K3_DETOK_RUNNING = 0,
  K3_DETOK_STOP_ID = 1,  /* stopped on a stop id */
  K3_DETOK_STOP_STR = 2, /* stopped on a stop string */
  K3_DETOK_FINISHED = 3, /* k3_detok_finish was called */
} k3_detok_state_t;

typedef struct k3_detok k3_detok_t;

/* opts may be NULL (tokenizer stop ids, no stop strings, keep specials). *out owned by the
 * caller (k3_detok_free). K3_EINVAL for an empty stop string. */
int k3_detok_init(const k3_tok_t *tok, const k3_detok_opts_t *opts, k3_detok_t **out);
void k3_detok_free(k3_detok_t *d);

/* Feeds one id; appends final text to out. Returns the state after the id (>= 0), or a
 * negative K3_E* (K3_ERANGE for an id outside the vocabulary: nothing changed). Feeding
 * after a stop returns the stop state and appends nothing. */
int k3_detok_feed(k3_detok_t *d, int32_t id, k3_tok_str_t *out);

/* End of stream without a stop: appends everything held back (partial UTF-8 → U+FFFD, a
 * pending stop-string prefix as text). Returns the state (K3_DETOK_FINISHED, or the stop
 * state if already stopped, in which case nothing is appended). */
int k3_detok_finish(k3_detok_t *d, k3_tok_str_t *out);

k3_detok_state_t k3_detok_state(const k3_detok_t *d);
/* After a stop: the index into stop_ids/stop_strs (or the tokenizer stop id list) that
 * matched; -1 while running. */
int k3_detok_stop_index(const k3_detok_t *d);

/* Replaces ill-formed UTF-8 in src[0..len) with U+FFFD (maximal subparts) and appends to out.
 * Used by encode (K3_TOK_ENC_REPLACE_INVALID) and the detokeniser; exposed for tests. */
int k3_tok_utf8_sanitize(const char *src, size_t len, k3_tok_str_t *out);
/* Length of the longest valid UTF-8 prefix of s[0..len) (== len when all valid). */
size_t k3_tok_utf8_valid_prefix(const char *s, size_t len);

#endif
