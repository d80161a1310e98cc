/* Private helpers shared by the k3_ckpt sources: a name -> index hash table over tensor views
 * (open addressing, xxhash64 of the name) and an error accumulator that collects many problems
 * into one bounded message ("report all problems at once"). Not a public API. */
#ifndef K3PD_CKPT_INTERNAL_H
#define K3PD_CKPT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/safetensors.h"

/* Hash index over an array of views (by view->name). Slots hold index+1 (0 = empty). */
typedef struct {
  uint32_t *slots;
  size_t cap; /* power of two, >= 2n */
} ck_index_t;

/* Builds the index. Returns 0, K3_ENOMEM, or K3_EEXIST when two views share a name (then
 * *dup_a / *dup_b receive their indices and the index is freed). */
int ck_index_build(ck_index_t *ix, const k3_tensor_view_t *views, size_t n, size_t *dup_a,
                   size_t *dup_b);
/* Index of the view named `name`, or -1. */
int64_t ck_index_find(const ck_index_t *ix, const k3_tensor_view_t *views, const char *name);
void ck_index_free(ck_index_t *ix);

/* Error accumulator over a caller buffer: problems are joined with "; " and the total count is
 * kept even when the text no longer fits (then "... (N problems)" ends the message). */
typedef struct {
  char *buf;
  size_t cap;
  size_t len;
  int count;
  int truncated;
} ck_errs_t;

void ck_errs_init(ck_errs_t *e, char *buf, size_t cap);
void ck_errs_add(ck_errs_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends the "(N problems)" tail when more than one problem was recorded. */
void ck_errs_finish(ck_errs_t *e);

/* snprintf into err (NULL/0 allowed), always terminated. */
void ck_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
