/* safetensors reader (mmap, zero copy, single file or sharded directory) and streaming writer.
 *
 * File format (huggingface safetensors): 8-byte little-endian header length N, N bytes of JSON
 * `{"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *   "__metadata__": {"k": "v"}}`, then the data area; offsets are relative to the data area.
 *
 * Reader: every check is done at open time, so a view handed out is always in bounds:
 *   header length beyond the file, truncated header, bad JSON, unknown dtype, shape/byte-size
 *   mismatch, offsets out of range or overlapping, duplicate names (also across shards),
 *   a missing shard, a tensor listed in the index but absent from its shard, or a tensor in a
 *   shard that the index does not list. Errors name the file and the tensor. Bad input never
 *   crashes the reader (it is fuzzed: tests/fuzz/).
 * Not here: what tensors a model needs (tmap.h / weights.h) and dtype conversion.
 *
 * Writer: streaming. The caller declares every tensor (name, dtype, shape) up front, the header
 * is written immediately, then the data is appended in declaration order in chunks of any size,
 * so a 90 GB checkpoint never sits in memory. The file is written to "<path>.tmp" and renamed on
 * a successful close, so a crashed writer never leaves a valid-looking file. */
#ifndef K3PD_SAFETENSORS_H
#define K3PD_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define K3_MAX_DIMS 8

typedef enum {
  K3_DT_INVALID = 0,
  K3_DT_BOOL,
  K3_DT_U8,
  K3_DT_I8,
  K3_DT_I16,
  K3_DT_I32,
  K3_DT_I64,
  K3_DT_F16,
  K3_DT_BF16,
  K3_DT_F32,
  K3_DT_F64,
} k3_dtype_t;

/* "BF16", "F32", ... (safetensors spelling); "INVALID" for unknown values. Static string. */
const char *k3_dtype_name(k3_dtype_t dt);
/* Parses the safetensors spelling; returns K3_DT_INVALID when unknown. */
k3_dtype_t k3_dtype_parse(const char *s);
/* Bytes per element (0 for K3_DT_INVALID). */
size_t k3_dtype_size(k3_dtype_t dt);

/* A zero-copy view of one tensor. Row-major and contiguous as stored; strides are in ELEMENTS
 * (strides[ndim-1] == 1). `name` and `data` point into memory owned by the object that returned
 * the view (the reader's mmap, or a k3_weights_t) and stay valid until that object is closed.
 * ndim == 0 is a scalar (one element). */
typedef struct {
  const char *name;
  k3_dtype_t dtype;
  int ndim;
  int64_t shape[K3_MAX_DIMS];
  int64_t strides[K3_MAX_DIMS];
  const void *data;
  size_t nbytes;
} k3_tensor_view_t;

/* Number of elements of a view (product of the shape; 1 for a scalar). */
int64_t k3_tensor_numel(const k3_tensor_view_t *v);

/* ---- reader ---------------------------------------------------------------------------- */

typedef struct k3_st k3_st_t; /* an opened file or checkpoint; owns the mmaps */

/* Opens `path`: a .safetensors file, or a directory holding either
 * model.safetensors.index.json (+ the shards it lists) or a single model.safetensors.
 * On success *out is owned by the caller (k3_st_close). On error returns K3_ENOENT, K3_EIO or
 * K3_EFORMAT, writes a message naming the file (and tensor) into err, and *out is untouched. */
int k3_st_open(const char *path, k3_st_t **out, char *err, size_t errlen);

/* Parses a safetensors image held in memory (not copied: `data` must outlive the object).
 * `label` names it in errors. Same checks as k3_st_open. Used by tests and the fuzzer. */
int k3_st_open_mem(const void *data, size_t len, const char *label, k3_st_t **out, char *err,
                   size_t errlen);

void k3_st_close(k3_st_t *st);

/* Tensors in file order (shard by shard). i < k3_st_count(). Pointer valid until close. */
size_t k3_st_count(const k3_st_t *st);
const k3_tensor_view_t *k3_st_at(const k3_st_t *st, size_t i);
/* Lookup by exact name; NULL when absent. O(1). */
const k3_tensor_view_t *k3_st_find(const k3_st_t *st, const char *name);
/* The file (path or label) a tensor came from; NULL when the name is absent. */
const char *k3_st_file_of(const k3_st_t *st, const char *name);
/* A string from the first file's "__metadata__" (or the index "metadata", numbers rendered in
 * decimal); NULL when absent. Valid until close. */
const char *k3_st_metadata(const k3_st_t *st, const char *key);
/* Sum of all tensor data bytes. */
uint64_t k3_st_total_bytes(const k3_st_t *st);

/* ---- writer ---------------------------------------------------------------------------- */

typedef struct {
  const char *name; /* copied by k3_st_writer_open */
  k3_dtype_t dtype;
  int ndim;
  int64_t shape[K3_MAX_DIMS];
} k3_st_decl_t;

typedef struct k3_st_writer k3_st_writer_t;

/* Creates "<path>.tmp", writes the header for the n declared tensors (data offsets assigned in
 * declaration order, header padded with spaces to a multiple of 8) and the optional
 * __metadata__ pairs (meta_kv = {key0, val0, key1, val1, ...}, n_meta pairs; may be NULL).
 * Errors: K3_EINVAL (bad declaration, duplicate name), K3_EIO. On error nothing is left on disk. */
int k3_st_writer_open(const char *path, const k3_st_decl_t *decls, size_t n,
                      const char *const *meta_kv, size_t n_meta, k3_st_writer_t **out,
                      char *err, size_t errlen);
/* Appends data bytes; tensors are consumed in declaration order and a chunk may span tensors.
 * Writing more than declared is K3_EINVAL. */
int k3_st_writer_write(k3_st_writer_t *w, const void *data, size_t len, char *err, size_t errlen);
/* Checks that exactly the declared bytes were written, flushes, renames "<path>.tmp" to path and
 * frees w (also on error; then the temp file is removed). */
int k3_st_writer_close(k3_st_writer_t *w, char *err, size_t errlen);
/* Discards the temp file and frees w. NULL is allowed. */
void k3_st_writer_abort(k3_st_writer_t *w);

/* Data bytes a declaration occupies (0 on overflow or a bad declaration). */
uint64_t k3_st_decl_bytes(const k3_st_decl_t *d);

#endif
