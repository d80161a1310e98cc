/* k3pd-mkckpt writer: config.json, sharded safetensors and the index, in the real layout.
 * Tensor data is generated chunk by chunk with synth.h (in parallel over `threads` workers,
 * each filling an element-aligned slice) and streamed through the safetensors writer, so memory
 * use is a few chunks however large the checkpoint. Not here: flags and the summary (main.c). */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "k3pd/err.h"
#include "k3pd/safetensors.h"
#include "k3pd/synth.h"
#include "k3pd/util.h"
#include "mkckpt.h"

#define CHUNK_BYTES ((size_t)64 << 20)

int mk_plan_shards(const k3_tmap_t *map, uint64_t shard_bytes, mk_shard_t **shards, size_t *n) {
  mk_shard_t *s = NULL;
  size_t ns = 0, cap = 0;
  for (size_t i = 0; i < map->n; i++) {
    uint64_t b = map->entries[i].nbytes;
    if (ns == 0 || (s[ns - 1].count > 0 && s[ns - 1].bytes + b > shard_bytes)) {
      if (ns == cap) {
        cap = cap ? 2 * cap : 16;
        mk_shard_t *ns_ = realloc(s, cap * sizeof *s);
        if (!ns_) {
          free(s);
          return K3_ENOMEM;
        }
        s = ns_;
      }
      s[ns++] = (mk_shard_t){i, 0, 0};
    }
    s[ns - 1].count++;
    s[ns - 1].bytes += b;
  }
  *shards = s;
  *n = ns;
  return 0;
}

void mk_shard_name(char *buf, size_t cap, size_t i, size_t n) {
  snprintf(buf, cap, "model-%05zu-of-%05zu.safetensors", i + 1, n);
}

typedef struct {
  const k3_model_config_t *cfg;
  const k3_tmap_entry_t *e;
  uint64_t seed, begin;
  size_t len;
  uint8_t *dst;
  int rc;
} fill_job_t;

static void *fill_worker(void *arg) {
  fill_job_t *j = arg;
  j->rc = k3_synth_fill(j->cfg, j->e, j->seed, j->begin, j->len, j->dst);
  return NULL;
}

/* Fills [begin, begin+len) of e into dst using up to `threads` workers on 64-byte-aligned cuts
 * (a multiple of every element size, so each slice stays element-aligned). */
static int fill_parallel(const k3_model_config_t *cfg, const k3_tmap_entry_t *e, uint64_t seed,
                         uint64_t begin, size_t len, uint8_t *dst, int threads) {
  if (threads < 2 || len < ((size_t)1 << 20)) return k3_synth_fill(cfg, e, seed, begin, len, dst);
  if (threads > 64) threads = 64;
  fill_job_t jobs[64];
  pthread_t tid[64];
  size_t per = (len / (size_t)threads + 63) & ~(size_t)63, off = 0;
  int nj = 0;
  while (off < len) {
    size_t l = per < len - off ? per : len - off;
    jobs[nj] = (fill_job_t){cfg, e, seed, begin + off, l, dst + off, 0};
    if (pthread_create(&tid[nj], NULL, fill_worker, &jobs[nj]) != 0) fill_worker(&jobs[nj]), tid[nj] = 0;
    nj++;
    off += l;
  }
  int rc = 0;
  for (int i = 0; i < nj; i++) {
    if (tid[i]) pthread_join(tid[i], NULL);
    if (jobs[i].rc) rc = jobs[i].rc;
  }
  return rc;
}

static int write_shard(const char *path, const k3_model_config_t *cfg, const k3_tmap_t *map,
                       const mk_shard_t *sh, uint64_t seed, int threads, uint8_t *buf,
                       uint64_t *done, uint64_t total, bool progress, char *err, size_t errlen) {
  k3_st_decl_t *d = calloc(sh->count ? sh->count : 1, sizeof *d);
  if (!d) return K3_ENOMEM;
  for (size_t i = 0; i < sh->count; i++) {
    const k3_tmap_entry_t *e = &map->entries[sh->first + i];
    d[i].name = e->name;
    d[i].dtype = e->dtype;
    d[i].ndim = e->ndim;
    memcpy(d[i].shape, e->shape, sizeof d[i].shape);
  }
  static const char *const meta[] = {"format", "pt"};
  k3_st_writer_t *w = NULL;
  int rc = k3_st_writer_open(path, d, sh->count, meta, 1, &w, err, errlen);
  free(d);
  if (rc) return rc;
  uint64_t next_report = *done + ((uint64_t)1 << 30);
  for (size_t i = 0; i < sh->count && !rc; i++) {
    const k3_tmap_entry_t *e = &map->entries[sh->first + i];
    for (uint64_t off = 0; off < e->nbytes && !rc; off += CHUNK_BYTES) {
      size_t len = e->nbytes - off < CHUNK_BYTES ? (size_t)(e->nbytes - off) : CHUNK_BYTES;
      rc = fill_parallel(cfg, e, seed, off, len, buf, threads);
      if (rc) {
        snprintf(err, errlen, "%s: cannot synthesise '%s'", path, e->name);
        break;
      }
      rc = k3_st_writer_write(w, buf, len, err, errlen);
      *done += len;
      if (progress && *done >= next_report) {
        fprintf(stderr, "k3pd-mkckpt: %.1f / %.1f GiB (%.0f%%)\n", (double)*done / 1073741824.0,
                (double)total / 1073741824.0, 100.0 * (double)*done / (double)total);
        next_report = *done + ((uint64_t)1 << 30);
      }
    }
  }
  if (rc) {
    k3_st_writer_abort(w);
    return rc;
  }
  return k3_st_writer_close(w, err, errlen);
}

int mk_write_checkpoint(const char *dir, const char *config_text, const k3_model_config_t *cfg,
                        const k3_tmap_t *map, const mk_shard_t *shards, size_t nshards, uint64_t seed,
                        int threads, bool progress, char *err, size_t errlen) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "%s: %s", dir, strerror(errno));
    return K3_EIO;
  }
  char path[4096], name[64];
  snprintf(path, sizeof path, "%s/config.json", dir);
  int rc = k3_write_file(path, config_text, strlen(config_text));
  if (rc) {
    snprintf(err, errlen, "%s: %s", path, k3_strerror(rc));
    return rc;
  }
  uint8_t *buf = malloc(CHUNK_BYTES);
  json_t *wm = json_object();
  if (!buf || !wm) {
    free(buf);
    json_decref(wm);
    return K3_ENOMEM;
  }
  uint64_t done = 0;
  for (size_t s = 0; s < nshards && !rc; s++) {
    mk_shard_name(name, sizeof name, s, nshards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (progress) fprintf(stderr, "k3pd-mkckpt: writing %s (%zu tensors, %.2f GiB)\n", name, shards[s].count,
                          (double)shards[s].bytes / 1073741824.0);
    rc = write_shard(path, cfg, map, &shards[s], seed, threads, buf, &done, map->total_bytes, progress, err, errlen);
    for (size_t i = 0; i < shards[s].count && !rc; i++)
      json_object_set_new(wm, map->entries[shards[s].first + i].name, json_string(name));
  }
  free(buf);
  if (!rc) {
    json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)map->total_bytes,
                            "weight_map", wm);
    char *txt = idx ? json_dumps(idx, JSON_INDENT(2)) : NULL;
    json_decref(idx);
    if (!txt) return K3_ENOMEM;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t tl = strlen(txt);
    char *withnl = realloc(txt, tl + 2);
    if (withnl) {
      txt = withnl;
      txt[tl++] = '\n';
      txt[tl] = '\0';
    }
    rc = k3_write_file(path, txt, tl);
    free(txt);
    if (rc) snprintf(err, errlen, "%s: %s", path, k3_strerror(rc));
  } else {
    json_decref(wm);
  }
  return rc;
}
