/* Streaming safetensors writer: the header for all declared tensors is written first, then the
 * data is appended in declaration order, so the writer never holds more than one caller chunk.
 * Written to "<path>.tmp" and renamed on a complete close. Offsets are contiguous (no holes), as
 * the reference Rust reader requires; the header is padded with spaces to a multiple of 8. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "k3pd/err.h"
#include "k3pd/safetensors.h"

struct k3_st_writer {
  FILE *fp;
  char *path, *tmp;
  uint64_t declared, written;
};

uint64_t k3_st_decl_bytes(const k3_st_decl_t *d) {
  size_t es = k3_dtype_size(d->dtype);
  if (!es || d->ndim < 0 || d->ndim > K3_MAX_DIMS) return 0;
  uint64_t n = es;
  for (int i = 0; i < d->ndim; i++) {
    if (d->shape[i] < 0) return 0;
    uint64_t dim = (uint64_t)d->shape[i];
    if (dim && n > UINT64_MAX / dim) return 0;
    n *= dim;
  }
  return n;
}

void k3_st_writer_abort(k3_st_writer_t *w) {
  if (!w) return;
  if (w->fp) fclose(w->fp);
  if (w->tmp) unlink(w->tmp);
  free(w->path);
  free(w->tmp);
  free(w);
}

/* Builds the header JSON text (caller frees) with offsets in declaration order. */
static char *build_header(const k3_st_decl_t *decls, size_t n, const char *const *meta_kv,
                          size_t n_meta, uint64_t *total, char *err, size_t errlen) {
  json_t *root = json_object();
  if (!root) return NULL;
  if (n_meta) {
    json_t *m = json_object();
    for (size_t i = 0; i < n_meta; i++) json_object_set_new(m, meta_kv[2 * i], json_string(meta_kv[2 * i + 1]));
    json_object_set_new(root, "__metadata__", m);
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const k3_st_decl_t *d = &decls[i];
    uint64_t nb = k3_st_decl_bytes(d);
    int empty = 0;
    for (int j = 0; j < d->ndim; j++) empty |= d->shape[j] == 0;
    if (!d->name || !*d->name || strcmp(d->name, "__metadata__") == 0 || (!nb && !empty) ||
        k3_dtype_size(d->dtype) == 0) {
      ck_seterr(err, errlen, "tensor '%s': bad declaration", d->name ? d->name : "(null)");
      json_decref(root);
      return NULL;
    }
    if (json_object_get(root, d->name)) {
      ck_seterr(err, errlen, "tensor '%s': declared twice", d->name);
      json_decref(root);
      return NULL;
    }
    json_t *shape = json_array();
    for (int j = 0; j < d->ndim; j++) json_array_append_new(shape, json_integer((json_int_t)d->shape[j]));
    json_t *offs = json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + nb));
    json_object_set_new(root, d->name,
                        json_pack("{s:s,s:o,s:o}", "dtype", k3_dtype_name(d->dtype), "shape", shape,
                                  "data_offsets", offs));
    off += nb;
  }
  *total = off;
  char *txt = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return txt;
}

int k3_st_writer_open(const char *path, const k3_st_decl_t *decls, size_t n,
                      const char *const *meta_kv, size_t n_meta, k3_st_writer_t **out,
                      char *err, size_t errlen) {
  uint64_t total = 0;
  char *hdr = build_header(decls, n, meta_kv, n_meta, &total, err, errlen);
  if (!hdr) {
    if (err && errlen && !err[0]) ck_seterr(err, errlen, "%s: out of memory building header", path);
    return K3_EINVAL;
  }
  k3_st_writer_t *w = calloc(1, sizeof *w);
  size_t plen = strlen(path);
  if (w) {
    w->path = strdup(path);
    w->tmp = malloc(plen + 5);
  }
  if (!w || !w->path || !w->tmp) {
    free(hdr);
    k3_st_writer_abort(w);
    return K3_ENOMEM;
  }
  memcpy(w->tmp, path, plen);
  memcpy(w->tmp + plen, ".tmp", 5);
  w->declared = total;
  w->fp = fopen(w->tmp, "wb");
  if (!w->fp) {
    ck_seterr(err, errlen, "%s: %s", w->tmp, strerror(errno));
    free(hdr);
    free(w->tmp);
    w->tmp = NULL; /* nothing to unlink */
    k3_st_writer_abort(w);
    return K3_EIO;
  }
  setvbuf(w->fp, NULL, _IOFBF, 1 << 20);
  size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  int ok = fwrite(len8, 1, 8, w->fp) == 8 && fwrite(hdr, 1, hl, w->fp) == hl;
  for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', w->fp) != EOF;
  free(hdr);
  if (!ok) {
    ck_seterr(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
    k3_st_writer_abort(w);
    return K3_EIO;
  }
  *out = w;
  return 0;
}

int k3_st_writer_write(k3_st_writer_t *w, const void *data, size_t len, char *err, size_t errlen) {
  if (len > w->declared - w->written) {
    ck_seterr(err, errlen, "%s: %zu more bytes than declared", w->path,
              (size_t)(len - (w->declared - w->written)));
    return K3_EINVAL;
  }
  if (len && fwrite(data, 1, len, w->fp) != len) {
    ck_seterr(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
    return K3_EIO;
  }
  w->written += len;
  return 0;
}

int k3_st_writer_close(k3_st_writer_t *w, char *err, size_t errlen) {
  if (w->written != w->declared) {
    ck_seterr(err, errlen, "%s: %llu of %llu declared data bytes written", w->path,
              (unsigned long long)w->written, (unsigned long long)w->declared);
    k3_st_writer_abort(w);
    return K3_EINVAL;
  }
  int bad = fflush(w->fp) != 0 || ferror(w->fp);
  bad |= fclose(w->fp) != 0;
  w->fp = NULL;
  if (bad || rename(w->tmp, w->path) != 0) {
    ck_seterr(err, errlen, "%s: %s", w->path, strerror(errno));
    k3_st_writer_abort(w);
    return K3_EIO;
  }
  free(w->tmp);
  w->tmp = NULL;
  k3_st_writer_abort(w); /* frees the rest; nothing left to unlink */
  return 0;
}
