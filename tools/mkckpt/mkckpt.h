/* k3pd-mkckpt internals: shard planning and checkpoint writing (write.c), used by main.c. */
#ifndef K3PD_MKCKPT_H
#define K3PD_MKCKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/model_config.h"
#include "k3pd/tmap.h"

typedef struct {
  size_t first, count; /* range of tmap entries */
  uint64_t bytes;
} mk_shard_t;

/* Splits the plan into shards of at most shard_bytes (a tensor larger than that gets a shard of
 * its own). *shards is malloc'd (caller frees). Returns 0 or K3_ENOMEM. */
int mk_plan_shards(const k3_tmap_t *map, uint64_t shard_bytes, mk_shard_t **shards, size_t *n);

/* "model-00001-of-00003.safetensors" into buf. */
void mk_shard_name(char *buf, size_t cap, size_t i, size_t n);

/* Writes config_text as config.json, every shard and model.safetensors.index.json into dir
 * (created if missing). Progress goes to stderr when `progress`. Returns 0 or a K3_E* code with
 * a message in err. Files are written atomically (temp + rename). */
int mk_write_checkpoint(const char *dir, const char *config_text, const k3_model_config_t *cfg,
                        const k3_tmap_t *map, const mk_shard_t *shards, size_t nshards, uint64_t seed,
                        int threads, bool progress, char *err, size_t errlen);

#endif
