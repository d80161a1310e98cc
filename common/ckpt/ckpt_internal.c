/* Private helpers of k3_ckpt: view name index and error accumulation (see ckpt_internal.h). */
#include "ckpt_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"

static uint64_t name_hash(const char *s) { return k3_hash64(s, strlen(s), 0x6b33706463u); }

int ck_index_build(ck_index_t *ix, const k3_tensor_view_t *views, size_t n, size_t *dup_a,
                   size_t *dup_b) {
  if (n >= UINT32_MAX / 4) return K3_ENOMEM;
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  uint32_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return K3_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    size_t pos = (size_t)name_hash(views[i].name) & (cap - 1);
    while (slots[pos]) {
      size_t j = slots[pos] - 1;
      if (strcmp(views[j].name, views[i].name) == 0) {
        if (dup_a) *dup_a = j;
        if (dup_b) *dup_b = i;
        free(slots);
        return K3_EEXIST;
      }
      pos = (pos + 1) & (cap - 1);
    }
    slots[pos] = (uint32_t)(i + 1);
  }
  ix->slots = slots;
  ix->cap = cap;
  return 0;
}

int64_t ck_index_find(const ck_index_t *ix, const k3_tensor_view_t *views, const char *name) {
  if (!ix->slots || !name) return -1;
  size_t pos = (size_t)name_hash(name) & (ix->cap - 1);
  while (ix->slots[pos]) {
    size_t j = ix->slots[pos] - 1;
    if (strcmp(views[j].name, name) == 0) return (int64_t)j;
    pos = (pos + 1) & (ix->cap - 1);
  }
  return -1;
}

void ck_index_free(ck_index_t *ix) {
  free(ix->slots);
  ix->slots = NULL;
  ix->cap = 0;
}

void ck_errs_init(ck_errs_t *e, char *buf, size_t cap) {
  e->buf = cap ? buf : NULL;
  e->cap = cap;
  e->len = 0;
  e->count = 0;
  e->truncated = 0;
  if (e->buf) e->buf[0] = '\0';
}

void ck_errs_add(ck_errs_t *e, const char *fmt, ...) {
  e->count++;
  if (!e->buf || e->truncated) return;
  /* Keep 40 bytes in reserve for the "(N problems)" tail. */
  size_t reserve = 40;
  if (e->len + reserve >= e->cap) {
    e->truncated = 1;
    return;
  }
  size_t room = e->cap - reserve - e->len;
  char *p = e->buf + e->len;
  int w = 0;
  if (e->count > 1) w = snprintf(p, room, "; ");
  if (w < 0 || (size_t)w >= room) {
    e->buf[e->len] = '\0';
    e->truncated = 1;
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  int w2 = vsnprintf(p + w, room - (size_t)w, fmt, ap);
  va_end(ap);
  if (w2 < 0 || (size_t)(w + w2) >= room) {
    /* Partial problem text: cut it off cleanly. */
    e->len = strlen(e->buf);
    e->truncated = 1;
    return;
  }
  e->len += (size_t)(w + w2);
}

void ck_errs_finish(ck_errs_t *e) {
  if (!e->buf || e->count <= 1) return;
  size_t room = e->cap - e->len;
  snprintf(e->buf + e->len, room, "%s (%d problems)", e->truncated ? "; ..." : "", e->count);
  e->len = strlen(e->buf);
}

void ck_seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}
