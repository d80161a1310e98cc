/* Model weights as a set of named tensor views, from either an opened checkpoint directory
 * (mmap'd, sharded, zero copy) or synthetic generation in memory (the same generator
 * k3pd-mkckpt writes to disk, synth.h), so tests can compare the two bit for bit.
 *
 * Opening validates EVERYTHING before use: config.json strictly (model_config.h), every
 * safetensors file (safetensors.h), and then presence, dtype and shape of every tensor of the
 * plan (tmap.h). All problems are reported at once in one message (missing tensors, wrong
 * shapes/dtypes, unexpected tensors; `vision_tower.*` / `mm_projector.*` are ignored).
 * Not validated at open: MXFP4 scale bytes (85 GB in the real model); the dequantizer rejects
 * 0x00/0xFF when it meets them (mxfp4.h).
 *
 * Thread safety: a k3_weights_t is immutable after open; any number of threads may call
 * k3_weights_get concurrently. */
#ifndef K3PD_WEIGHTS_H
#define K3PD_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/model_config.h"
#include "k3pd/safetensors.h"
#include "k3pd/tmap.h"

typedef struct k3_weights k3_weights_t;

/* Opens a checkpoint directory (config.json + model.safetensors.index.json + shards, or a single
 * model.safetensors). On success fills *cfg (if not NULL) and *out (caller frees with
 * k3_weights_free). Errors: K3_ENOENT, K3_EIO, K3_EFORMAT, K3_ECONFIG with a message listing
 * every problem (truncated to errlen; the first problems come first). On error *out is untouched. */
int k3_weights_open_dir(const char *dir, k3_model_config_t *cfg, k3_weights_t **out, char *err,
                        size_t errlen);

/* Generates every planned tensor in memory with synth.h (deterministic in (cfg, seed)).
 * Memory: the full checkpoint size (use for tiny presets). Single-threaded: the calling thread
 * only (k3_weights_synth_opts for N threads, same bytes). Returns 0, K3_ENOMEM, K3_ECONFIG. */
int k3_weights_synth(const k3_model_config_t *cfg, uint64_t seed, k3_weights_t **out, char *err,
                     size_t errlen);

/* Options of k3_weights_synth_opts. Zero-initialise, then set what you need. */
#define K3_WEIGHTS_SYNTH_MAX_THREADS 64 /* == K3_SYNTH_MAX_THREADS (synth.h) */
typedef struct {
  int threads;    /* workers; 0 = online CPUs, capped at K3_WEIGHTS_SYNTH_MAX_THREADS; 1 = the
                     calling thread only. Larger values are capped. Negative: K3_EINVAL. */
  bool progress;  /* print "k3_weights_synth: X / Y GiB (Z%)" lines to stderr roughly every GiB
                     (only for checkpoints of at least 1 GiB) */
} k3_weights_synth_opts_t;

/* k3_weights_synth with `opts->threads` workers (opts NULL = all defaults). The tensors are
 * split into slices (large tensors into several, so even a few huge tensors parallelise) that
 * the workers take from a shared counter; every slice is filled by k3_synth_fill, so the bytes
 * are identical to k3_weights_synth and to k3pd-mkckpt's files for ANY thread count. The
 * calling thread works too and joins every worker before returning (no thread outlives the
 * call). If a thread cannot be started the remaining workers (at least the caller) do its
 * share. Returns 0, K3_EINVAL, K3_ENOMEM, K3_ECONFIG; on error *out is untouched. */
int k3_weights_synth_opts(const k3_model_config_t *cfg, uint64_t seed, const k3_weights_synth_opts_t *opts,
                          k3_weights_t **out, char *err, size_t errlen);

void k3_weights_free(k3_weights_t *w);

/* Looks up a tensor by its name WITHOUT the config's prefix, e.g.
 * "model.layers.3.self_attn.q_a_proj.weight" (the "language_model." prefix is added for K3).
 * Returns NULL when the plan has no such tensor. The view lives as long as w. */
const k3_tensor_view_t *k3_weights_get(const k3_weights_t *w, const char *name);
/* Same, by full checkpoint name. */
const k3_tensor_view_t *k3_weights_get_full(const k3_weights_t *w, const char *full_name);

/* The config and plan the weights were validated against (owned by w). */
const k3_model_config_t *k3_weights_config(const k3_weights_t *w);
const k3_tmap_t *k3_weights_tmap(const k3_weights_t *w);

#endif
