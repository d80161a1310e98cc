/* The one model loader: from flags to a running k3_runner_t, for every program that runs the
 * model (k3pd-prefill, k3pd-decode, k3pd-generate), so the same flags mean the same model and
 * the same state layout everywhere (ARCHITECTURE.md §1: "never a second loader").
 *
 * What it is for: one flag table (k3_load_flags) with one default set (k3_load_opts_default),
 * the checks of those flags with messages naming the flag (k3_load_check), the model's config
 * before any weight exists (k3_load_config: k3pd-generate builds its prompt first), and the
 * load itself (k3_load_model): a checkpoint directory (--model), or synthetic weights of a
 * preset (--synthetic) or config file (--synthetic-config) with --seed-weights, generated on
 * the GPU for --backend cuda (k3_runner_init_synth) unless --host-synth, on every CPU
 * otherwise; optionally one read-only copy of the weights shared with the other processes on
 * the GPU (--share-weights DIR, docs/gpu-cluster.md §4).
 * What it is not: a scheduler or a worker. Pool sizes are flags, but their per-role defaults
 * belong to the program: it sets them in the options BEFORE parsing (the prefill worker fewer
 * slots, k3pd-generate 0 = "what the prompt needs", filled in before k3_load_model). Where the
 * state arena's memory comes from (opts.state: a caller allocator, or VMM) is set by the
 * program, never by a flag.
 *
 * Flags (the table, K3PD_<NAME> environment fallbacks as for every flag):
 *   --model DIR | --synthetic PRESET | --synthetic-config FILE   exactly one
 *   --seed-weights N (1)  --precision fp32|bf16 (bf16 on cuda, fp32 elsewhere)
 *   --backend cpu|cpu-fast|cuda (cpu) [--device: k3pd-generate's name for it, opts.device_alias]
 *   --gpu N (CUDA device; default K3PD_CUDA_DEVICE, else 0; the two must agree when both set)
 *   --threads N (1)  --page-tokens N (64)  --num-pages N (1024)  --num-slots N (16)
 *   --max-batch N (16)  --prefill-chunk N (256)  --host-synth  --verify-synth KIB (0)
 *   --share-weights DIR  --share-wait-ms MS (600000)
 * Threads: start-up only (single thread; k3_load_check may set K3PD_CUDA_DEVICE). */
#ifndef K3_LOAD_H
#define K3_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3_runner.h"
#include "k3pd/flags.h"
#include "k3pd/model_config.h"
#include "k3pd/weights.h"

typedef struct {
  /* ---- flags (strings point into argv or the environment) ---- */
  const char *model_dir;        /* --model DIR */
  const char *synthetic;        /* --synthetic PRESET */
  const char *synthetic_config; /* --synthetic-config FILE */
  int64_t seed_weights;         /* --seed-weights N */
  const char *precision;        /* --precision; NULL = bf16 on cuda, fp32 elsewhere (k3_load_check) */
  const char *backend;          /* --backend */
  const char *device;           /* --device (only with device_alias): same as --backend */
  int gpu;                      /* --gpu; < 0 = K3PD_CUDA_DEVICE, else 0 (k3_load_check) */
  int threads;                  /* --threads */
  int page_tokens;              /* --page-tokens */
  int num_pages, num_slots;     /* --num-pages, --num-slots: >= 0; 0 may mean "the program's choice" */
  int max_batch;                /* --max-batch (0: the program's choice, >= 1 by k3_load_model) */
  int prefill_chunk;            /* --prefill-chunk: 1..1048576 */
  bool host_synth;              /* --host-synth: cuda + synthetic: generate on the CPUs, upload */
  int verify_synth;             /* --verify-synth KIB: GPU-generated weights vs the host generator */
  const char *share_weights;    /* --share-weights DIR */
  int share_wait_ms;            /* --share-wait-ms */
  /* ---- set by the program, not flags ---- */
  bool device_alias;            /* k3pd-generate: --device NAME is the flag, --backend its alias */
  k3_runner_arena_opts_t state; /* the state arena's memory (k3_runner.h); zero = the backend's */
  bool quiet;                   /* no progress lines on stderr (host synthesis) */
} k3_load_opts_t;

/* The one default set (see the list above). */
void k3_load_opts_default(k3_load_opts_t *o);

/* Writes the loader's flag entries into out (room for K3_LOAD_NFLAGS) and returns how many
 * (one more with device_alias, which also clears o->backend: the alias has no default). `o`
 * must outlive parsing; set device_alias and the per-role defaults first. */
#define K3_LOAD_NFLAGS 18
size_t k3_load_flags(k3_load_opts_t *o, k3_flag_t *out);

/* After parsing: resolves --device/--backend, the precision default and --gpu (exporting it as
 * K3PD_CUDA_DEVICE, which the CUDA backend reads), and checks every loader flag. K3_EINVAL with
 * a message naming the flag. Call once, before k3_load_config / k3_load_model. */
int k3_load_check(k3_load_opts_t *o, char *err, size_t errlen);

/* The model's config (config.json of --model, the preset, or --synthetic-config's file),
 * without loading any weight. K3_EINVAL (unknown preset, named), K3_ENOENT/K3_EIO/K3_ECONFIG. */
int k3_load_config(const k3_load_opts_t *o, k3_model_config_t *cfg, char *err, size_t errlen);

/* The name the model was given by (--model's directory, the preset or the config file). */
const char *k3_load_model_name(const k3_load_opts_t *o);

/* Loads the weights and builds the runner. With --backend cuda the device is probed first: an
 * unusable one is K3_EDEVICE with "--backend cuda: CUDA device N is not usable: <CUDA's
 * reason>". *w is NULL when the weights were generated on the GPU or imported from another
 * process (shared weights). Caller frees k3_runner_free(*r) then k3_weights_free(*w). On error
 * nothing is left allocated and *w, *r are untouched. */
int k3_load_model(const k3_load_opts_t *o, k3_weights_t **w, k3_runner_t **r, char *err, size_t errlen);

#endif
