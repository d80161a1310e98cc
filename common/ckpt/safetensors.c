/* safetensors reader: mmap'd files, sharded directories through model.safetensors.index.json,
 * zero-copy views. All validation happens at open (see safetensors.h for the list), so views
 * are always in bounds. JSON is parsed with jansson (duplicate keys rejected by jansson itself).
 * Not here: the writer (st_writer.c) and model-level validation (weights.c). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "k3pd/err.h"
#include "k3pd/safetensors.h"

typedef struct {
  char *label;      /* path or label, owned */
  void *map;        /* mmap base, NULL for open_mem */
  size_t map_len;
} st_file_t;

struct k3_st {
  st_file_t *files;
  size_t nfiles;
  k3_tensor_view_t *views;
  uint32_t *view_file; /* file index per view */
  size_t n, cap;
  ck_index_t ix;
  char **meta;         /* key, value, key, value ... (owned) */
  size_t nmeta;
  uint64_t total_bytes;
};

static const struct {
  const char *name;
  k3_dtype_t dt;
  size_t size;
} kDtypes[] = {
    {"BOOL", K3_DT_BOOL, 1}, {"U8", K3_DT_U8, 1},    {"I8", K3_DT_I8, 1},
    {"I16", K3_DT_I16, 2},   {"I32", K3_DT_I32, 4},  {"I64", K3_DT_I64, 8},
    {"F16", K3_DT_F16, 2},   {"BF16", K3_DT_BF16, 2}, {"F32", K3_DT_F32, 4},
    {"F64", K3_DT_F64, 8},
};

const char *k3_dtype_name(k3_dtype_t dt) {
  for (size_t i = 0; i < sizeof kDtypes / sizeof kDtypes[0]; i++)
    if (kDtypes[i].dt == dt) return kDtypes[i].name;
  return "INVALID";
}

k3_dtype_t k3_dtype_parse(const char *s) {
  for (size_t i = 0; s && i < sizeof kDtypes / sizeof kDtypes[0]; i++)
    if (strcmp(kDtypes[i].name, s) == 0) return kDtypes[i].dt;
  return K3_DT_INVALID;
}

size_t k3_dtype_size(k3_dtype_t dt) {
  for (size_t i = 0; i < sizeof kDtypes / sizeof kDtypes[0]; i++)
    if (kDtypes[i].dt == dt) return kDtypes[i].size;
  return 0;
}

int64_t k3_tensor_numel(const k3_tensor_view_t *v) {
  int64_t n = 1;
  for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
  return n;
}

void k3_st_close(k3_st_t *st) {
  if (!st) return;
  for (size_t i = 0; i < st->nfiles; i++) {
    if (st->files[i].map) munmap(st->files[i].map, st->files[i].map_len);
    free(st->files[i].label);
  }
  for (size_t i = 0; i < st->n; i++) free((char *)st->views[i].name);
  for (size_t i = 0; i < 2 * st->nmeta; i++) free(st->meta[i]);
  free(st->meta);
  free(st->files);
  free(st->views);
  free(st->view_file);
  ck_index_free(&st->ix);
  free(st);
}

static int add_meta(k3_st_t *st, const char *k, const char *v) {
  char **nm = realloc(st->meta, (st->nmeta + 1) * 2 * sizeof *nm);
  if (!nm) return K3_ENOMEM;
  st->meta = nm;
  nm[2 * st->nmeta] = strdup(k);
  nm[2 * st->nmeta + 1] = strdup(v);
  st->nmeta++;
  if (!nm[2 * st->nmeta - 2] || !nm[2 * st->nmeta - 1]) return K3_ENOMEM;
  return 0;
}

typedef struct {
  uint64_t begin, end;
  size_t view;
} span_t;

static int cmp_span(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Parses one tensor entry of a header into *v (name not set). */
static int parse_entry(const char *label, const char *name, json_t *val, const uint8_t *data,
                       uint64_t data_len, k3_tensor_view_t *v, uint64_t *begin, uint64_t *end,
                       char *err, size_t errlen) {
  if (!json_is_object(val)) {
    ck_seterr(err, errlen, "%s: tensor '%s': header entry is not an object", label, name);
    return K3_EFORMAT;
  }
  const char *key;
  json_t *x;
  json_object_foreach(val, key, x) {
    if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
      ck_seterr(err, errlen, "%s: tensor '%s': unexpected key '%s'", label, name, key);
      return K3_EFORMAT;
    }
  }
  json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
         *jo = json_object_get(val, "data_offsets");
  if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo)) {
    ck_seterr(err, errlen, "%s: tensor '%s': needs string 'dtype', array 'shape' and array 'data_offsets'",
              label, name);
    return K3_EFORMAT;
  }
  v->dtype = k3_dtype_parse(json_string_value(jd));
  if (v->dtype == K3_DT_INVALID) {
    ck_seterr(err, errlen, "%s: tensor '%s': unsupported dtype '%s'", label, name, json_string_value(jd));
    return K3_EFORMAT;
  }
  size_t nd = json_array_size(js);
  if (nd > K3_MAX_DIMS) {
    ck_seterr(err, errlen, "%s: tensor '%s': %zu dims (max %d)", label, name, nd, K3_MAX_DIMS);
    return K3_EFORMAT;
  }
  v->ndim = (int)nd;
  uint64_t numel = 1;
  for (size_t i = 0; i < nd; i++) {
    json_t *d = json_array_get(js, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0) {
      ck_seterr(err, errlen, "%s: tensor '%s': shape[%zu] is not a non-negative integer", label, name, i);
      return K3_EFORMAT;
    }
    uint64_t dim = (uint64_t)json_integer_value(d);
    if (dim && numel > UINT64_MAX / dim) {
      ck_seterr(err, errlen, "%s: tensor '%s': shape overflows", label, name);
      return K3_EFORMAT;
    }
    numel *= dim;
    v->shape[i] = (int64_t)dim;
  }
  int64_t stride = 1;
  for (int i = v->ndim - 1; i >= 0; i--) {
    v->strides[i] = stride;
    stride *= v->shape[i] ? v->shape[i] : 1;
  }
  if (json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
      !json_is_integer(json_array_get(jo, 1)) || json_integer_value(json_array_get(jo, 0)) < 0 ||
      json_integer_value(json_array_get(jo, 1)) < 0) {
    ck_seterr(err, errlen, "%s: tensor '%s': data_offsets must be two non-negative integers", label, name);
    return K3_EFORMAT;
  }
  *begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
  *end = (uint64_t)json_integer_value(json_array_get(jo, 1));
  if (*begin > *end || *end > data_len) {
    ck_seterr(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data area %llu bytes)",
              label, name, (unsigned long long)*begin, (unsigned long long)*end,
              (unsigned long long)data_len);
    return K3_EFORMAT;
  }
  size_t es = k3_dtype_size(v->dtype);
  if (numel > UINT64_MAX / es || numel * es != *end - *begin) {
    ck_seterr(err, errlen, "%s: tensor '%s': %s shape needs %llu bytes but data_offsets span %llu",
              label, name, k3_dtype_name(v->dtype),
              numel > UINT64_MAX / es ? 0ull : (unsigned long long)(numel * es),
              (unsigned long long)(*end - *begin));
    return K3_EFORMAT;
  }
  v->data = data + *begin;
  v->nbytes = (size_t)(*end - *begin);
  return 0;
}

/* Parses one file image and appends its tensors to st. On error st may hold a partial file:
 * the caller closes st. */
static int parse_image(k3_st_t *st, size_t file_idx, const uint8_t *buf, size_t len, char *err,
                       size_t errlen) {
  const char *label = st->files[file_idx].label;
  if (len < 8) {
    ck_seterr(err, errlen, "%s: truncated header (file is %zu bytes, needs at least 8)", label, len);
    return K3_EFORMAT;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
  if (hlen > len - 8) {
    ck_seterr(err, errlen, "%s: header length %llu beyond file size %zu", label,
              (unsigned long long)hlen, len);
    return K3_EFORMAT;
  }
  json_error_t jerr;
  json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    ck_seterr(err, errlen, "%s: bad JSON header: %s (at byte %d)", label, jerr.text, jerr.position);
    return K3_EFORMAT;
  }
  int rc = 0;
  span_t *spans = NULL;
  if (!json_is_object(root)) {
    ck_seterr(err, errlen, "%s: JSON header is not an object", label);
    rc = K3_EFORMAT;
    goto out;
  }
  const uint8_t *data = buf + 8 + hlen;
  uint64_t data_len = len - 8 - hlen;
  size_t first = st->n, ntens = json_object_size(root);
  if (st->n + ntens > st->cap) {
    size_t nc = st->cap ? st->cap : 64;
    while (nc < st->n + ntens) nc *= 2;
    k3_tensor_view_t *nv = realloc(st->views, nc * sizeof *nv);
    if (nv) st->views = nv;
    uint32_t *nf = realloc(st->view_file, nc * sizeof *nf);
    if (nf) st->view_file = nf;
    if (!nv || !nf) {
      rc = K3_ENOMEM;
      goto out;
    }
    st->cap = nc;
  }
  spans = malloc((ntens ? ntens : 1) * sizeof *spans);
  if (!spans) {
    rc = K3_ENOMEM;
    goto out;
  }
  size_t ns = 0;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(val)) {
        ck_seterr(err, errlen, "%s: __metadata__ is not an object", label);
        rc = K3_EFORMAT;
        goto out;
      }
      const char *mk;
      json_t *mv;
      json_object_foreach(val, mk, mv) {
        if (!json_is_string(mv)) {
          ck_seterr(err, errlen, "%s: __metadata__ value '%s' is not a string", label, mk);
          rc = K3_EFORMAT;
          goto out;
        }
        if (file_idx == 0 && (rc = add_meta(st, mk, json_string_value(mv)))) goto out;
      }
      continue;
    }
    k3_tensor_view_t v;
    memset(&v, 0, sizeof v);
    uint64_t b, e;
    if ((rc = parse_entry(label, key, val, data, data_len, &v, &b, &e, err, errlen))) goto out;
    v.name = strdup(key);
    if (!v.name) {
      rc = K3_ENOMEM;
      goto out;
    }
    st->views[st->n] = v;
    st->view_file[st->n] = (uint32_t)file_idx;
    spans[ns++] = (span_t){b, e, st->n};
    st->n++;
    st->total_bytes += e - b;
  }
  /* Overlap check: sort by begin; zero-length tensors never overlap anything. */
  qsort(spans, ns, sizeof *spans, cmp_span);
  uint64_t hi = 0;
  size_t hi_view = 0;
  int have = 0;
  for (size_t i = 0; i < ns; i++) {
    if (spans[i].begin == spans[i].end) continue;
    if (have && spans[i].begin < hi) {
      ck_seterr(err, errlen, "%s: tensor '%s' overlaps tensor '%s' (data_offsets)", label,
                st->views[spans[i].view].name, st->views[hi_view].name);
      rc = K3_EFORMAT;
      goto out;
    }
    if (spans[i].end > hi) {
      hi = spans[i].end;
      hi_view = spans[i].view;
      have = 1;
    }
  }
  (void)first;
out:
  free(spans);
  json_decref(root);
  return rc;
}

static int add_file(k3_st_t *st, const char *label, void *map, size_t map_len) {
  st_file_t *nf = realloc(st->files, (st->nfiles + 1) * sizeof *nf);
  if (!nf) return K3_ENOMEM;
  st->files = nf;
  nf[st->nfiles].label = strdup(label);
  nf[st->nfiles].map = map;
  nf[st->nfiles].map_len = map_len;
  if (!nf[st->nfiles].label) return K3_ENOMEM;
  st->nfiles++;
  return 0;
}

/* mmaps path and parses it into st as a new file. */
static int open_one(k3_st_t *st, const char *path, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int rc = errno == ENOENT ? K3_ENOENT : K3_EIO;
    ck_seterr(err, errlen, "%s: %s", path, strerror(errno));
    return rc;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    ck_seterr(err, errlen, "%s: not a regular file", path);
    return K3_EIO;
  }
  size_t len = (size_t)sb.st_size;
  void *map = NULL;
  if (len > 0) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      ck_seterr(err, errlen, "%s: mmap: %s", path, strerror(errno));
      return K3_EIO;
    }
  }
  close(fd);
  int rc = add_file(st, path, map, len);
  if (rc) {
    if (map) munmap(map, len);
    return rc;
  }
  return parse_image(st, st->nfiles - 1, map, len, err, errlen);
}

static int finish_index(k3_st_t *st, char *err, size_t errlen) {
  size_t a, b;
  int rc = ck_index_build(&st->ix, st->views, st->n, &a, &b);
  if (rc == K3_EEXIST) {
    ck_seterr(err, errlen, "duplicate tensor '%s' in %s and %s", st->views[b].name,
              st->files[st->view_file[a]].label, st->files[st->view_file[b]].label);
    return K3_EFORMAT;
  }
  return rc;
}

int k3_st_open_mem(const void *data, size_t len, const char *label, k3_st_t **out, char *err,
                   size_t errlen) {
  k3_st_t *st = calloc(1, sizeof *st);
  if (!st) return K3_ENOMEM;
  int rc = add_file(st, label ? label : "<memory>", NULL, 0);
  if (!rc) rc = parse_image(st, 0, data, len, err, errlen);
  if (!rc) rc = finish_index(st, err, errlen);
  if (rc) {
    k3_st_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

/* Opens a sharded checkpoint through its index file. */
static int open_index(k3_st_t *st, const char *dir, const char *index_path, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    ck_seterr(err, errlen, "%s: bad JSON: %s (line %d)", index_path, jerr.text, jerr.line);
    return K3_EFORMAT;
  }
  int rc = 0;
  char path[PATH_MAX];
  json_t *wm = json_object_get(root, "weight_map"), *md = json_object_get(root, "metadata");
  if (!json_is_object(wm) || (md && !json_is_object(md))) {
    ck_seterr(err, errlen, "%s: needs an object 'weight_map' (and optional object 'metadata')", index_path);
    rc = K3_EFORMAT;
    goto out;
  }
  const char *key;
  json_t *val;
  if (md) {
    json_object_foreach(md, key, val) {
      char num[32];
      if (json_is_string(val)) {
        rc = add_meta(st, key, json_string_value(val));
      } else if (json_is_integer(val)) {
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(val));
        rc = add_meta(st, key, num);
      }
      if (rc) goto out;
    }
  }
  /* Shards in order of first appearance in the weight map. */
  json_t *opened = json_object();
  if (!opened) {
    rc = K3_ENOMEM;
    goto out;
  }
  json_object_foreach(wm, key, val) {
    if (!json_is_string(val)) {
      ck_seterr(err, errlen, "%s: weight_map['%s'] is not a string", index_path, key);
      rc = K3_EFORMAT;
      break;
    }
    const char *shard = json_string_value(val);
    if (json_object_get(opened, shard)) continue;
    if (!*shard || strchr(shard, '/') || strcmp(shard, "..") == 0 || strcmp(shard, ".") == 0) {
      ck_seterr(err, errlen, "%s: tensor '%s': bad shard file name '%s'", index_path, key, shard);
      rc = K3_EFORMAT;
      break;
    }
    if (snprintf(path, sizeof path, "%s/%s", dir, shard) >= (int)sizeof path) {
      ck_seterr(err, errlen, "%s: shard path too long", index_path);
      rc = K3_EINVAL;
      break;
    }
    if (access(path, F_OK) != 0) {
      ck_seterr(err, errlen, "%s: missing shard %s (listed for tensor '%s')", index_path, path, key);
      rc = K3_EFORMAT;
      break;
    }
    if ((rc = open_one(st, path, err, errlen))) break;
    json_object_set_new(opened, shard, json_integer((json_int_t)st->nfiles - 1));
  }
  if (!rc) rc = finish_index(st, err, errlen);
  if (!rc) {
    /* Every index entry must be in its shard; every shard tensor must be in the index. */
    json_object_foreach(wm, key, val) {
      int64_t i = ck_index_find(&st->ix, st->views, key);
      json_int_t want = json_integer_value(json_object_get(opened, json_string_value(val)));
      if (i < 0 || st->view_file[i] != (uint32_t)want) {
        ck_seterr(err, errlen, "%s: tensor '%s' listed for shard %s is missing from it", index_path,
                  key, json_string_value(val));
        rc = K3_EFORMAT;
        break;
      }
    }
  }
  if (!rc && json_object_size(wm) != st->n) {
    for (size_t i = 0; i < st->n; i++) {
      if (!json_object_get(wm, st->views[i].name)) {
        ck_seterr(err, errlen, "%s: tensor '%s' is not listed in %s", st->files[st->view_file[i]].label,
                  st->views[i].name, index_path);
        rc = K3_EFORMAT;
        break;
      }
    }
  }
  if (!rc) {
    const char *ts = k3_st_metadata(st, "total_size");
    if (ts && strtoull(ts, NULL, 10) != st->total_bytes) {
      ck_seterr(err, errlen, "%s: metadata.total_size %s but the shards hold %llu tensor bytes",
                index_path, ts, (unsigned long long)st->total_bytes);
      rc = K3_EFORMAT;
    }
  }
  json_decref(opened);
out:
  json_decref(root);
  return rc;
}

int k3_st_open(const char *path, k3_st_t **out, char *err, size_t errlen) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    ck_seterr(err, errlen, "%s: %s", path, strerror(errno));
    return errno == ENOENT ? K3_ENOENT : K3_EIO;
  }
  k3_st_t *st = calloc(1, sizeof *st);
  if (!st) return K3_ENOMEM;
  int rc;
  if (S_ISDIR(sb.st_mode)) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
    if (access(p, F_OK) == 0) {
      rc = open_index(st, path, p, err, errlen);
    } else {
      snprintf(p, sizeof p, "%s/model.safetensors", path);
      if (access(p, F_OK) == 0) {
        rc = open_one(st, p, err, errlen);
        if (!rc) rc = finish_index(st, err, errlen);
      } else {
        ck_seterr(err, errlen, "%s: neither model.safetensors.index.json nor model.safetensors", path);
        rc = K3_ENOENT;
      }
    }
  } else {
    rc = open_one(st, path, err, errlen);
    if (!rc) rc = finish_index(st, err, errlen);
  }
  if (rc) {
    k3_st_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

size_t k3_st_count(const k3_st_t *st) { return st->n; }

const k3_tensor_view_t *k3_st_at(const k3_st_t *st, size_t i) { return i < st->n ? &st->views[i] : NULL; }

const k3_tensor_view_t *k3_st_find(const k3_st_t *st, const char *name) {
  int64_t i = ck_index_find(&st->ix, st->views, name);
  return i < 0 ? NULL : &st->views[i];
}

const char *k3_st_file_of(const k3_st_t *st, const char *name) {
  int64_t i = ck_index_find(&st->ix, st->views, name);
  return i < 0 ? NULL : st->files[st->view_file[i]].label;
}

const char *k3_st_metadata(const k3_st_t *st, const char *key) {
  for (size_t i = 0; i < st->nmeta; i++)
    if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
  return NULL;
}

uint64_t k3_st_total_bytes(const k3_st_t *st) { return st->total_bytes; }
