/* k3pd-mkckpt: writes a checkpoint in exactly the real layout (config.json, sharded
 * safetensors + model.safetensors.index.json, "language_model." prefixes for K3, fp32 where the
 * spec says fp32, MXFP4 experts) with deterministic synthetic weights, from a preset or a config
 * file; --dry-run plans names/shapes/bytes without writing. Flags and wiring only; the writing
 * is in write.c. Does not write tokenizer files (the tokenizer tool does). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/log.h"
#include "k3pd/manifest.h"
#include "k3pd/model_config.h"
#include "k3pd/tmap.h"
#include "k3pd/util.h"
#include "mkckpt.h"
#ifdef K3PD_HAVE_TOK
#include "k3pd/tokenizer.h"
#endif

static void print_summary(const k3_model_config_t *cfg, const k3_tmap_t *map, size_t nshards,
                          const k3_manifest_t *man, const char *out, bool dry) {
  k3_model_config_print(cfg, stdout);
  printf("tensors         %zu\n", map->n);
  printf("params          %" PRIu64 " (%.3f B)\n", map->total_params, (double)map->total_params / 1e9);
  printf("bytes           %" PRIu64 " (%.2f GiB)\n", map->total_bytes, (double)map->total_bytes / 1073741824.0);
  printf("shards          %zu\n", nshards);
  printf("state/sequence  %" PRIu64 " B KDA slot + %" PRIu64 " B/token MLA (page %d tokens = %" PRIu64 " B)\n",
         man->kda_bytes_per_slot, man->mla_bytes_per_token, man->page_tokens, man->mla_bytes_per_page);
  printf("fingerprint     %016" PRIx64 "\n", man->fingerprint);
  printf("%s %s\n", dry ? "dry run, nothing written; would write" : "written", out ? out : "(no --out)");
}

int main(int argc, char **argv) {
  const char *preset = NULL, *out = NULL, *config = NULL;
  int64_t seed = 0, shard_size = (int64_t)4 << 30;
  int page_tokens = 64, threads = 0;
  bool dry = false, list = false;
  k3_flag_t flags[] = {
      {"preset", K3_FLAG_STR, &preset, "NAME", "tiny | tiny-48b | medium", false},
      {"config", K3_FLAG_STR, &config, "FILE", "use this config.json instead of a preset (copied verbatim)", false},
      {"out", K3_FLAG_STR, &out, "DIR", "output directory (created if missing)", false},
      {"seed", K3_FLAG_I64, &seed, "N", "synthetic weight seed (default 0)", false},
      {"shard-size", K3_FLAG_I64, &shard_size, "BYTES", "max bytes per shard, K/M/G suffixes (default 4G)", false},
      {"page-tokens", K3_FLAG_INT, &page_tokens, "N", "MLA page size for the printed state manifest (default 64)", false},
      {"threads", K3_FLAG_INT, &threads, "N", "generator threads (default: online CPUs)", false},
      {"dry-run", K3_FLAG_BOOL, &dry, NULL, "plan names/shapes/bytes, write nothing", false},
      {"list", K3_FLAG_BOOL, &list, NULL, "print every planned tensor (name dtype shape bytes shard)", false},
  };
  k3_flags_info_t info = {"k3pd-mkckpt",
                          "k3pd-mkckpt: write a real-layout checkpoint (config.json + sharded safetensors + index) "
                          "with deterministic synthetic weights from a preset or a config file.",
                          NULL};
  char err[8192];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-mkckpt: %s\n", err);
    return 2;
  }
  k3_log_set_component("k3pd-mkckpt");
  if (!!preset == !!config) {
    fprintf(stderr, "k3pd-mkckpt: give exactly one of --preset (%s) or --config FILE\n", k3_model_config_preset_names());
    return 2;
  }
  if (!out && !dry) {
    fprintf(stderr, "k3pd-mkckpt: --out DIR is required (or use --dry-run)\n");
    return 2;
  }
  if (shard_size < 1 || page_tokens < 1) {
    fprintf(stderr, "k3pd-mkckpt: --shard-size and --page-tokens must be >= 1\n");
    return 2;
  }
  char *text = NULL;
  if (config) {
    size_t len;
    if ((rc = k3_read_file(config, &text, &len))) {
      fprintf(stderr, "k3pd-mkckpt: --config %s: %s\n", config, k3_strerror(rc));
      return 1;
    }
  } else {
    const char *p = k3_model_config_preset(preset);
    if (!p) {
      fprintf(stderr, "k3pd-mkckpt: unknown --preset '%s' (known: %s)\n", preset, k3_model_config_preset_names());
      return 2;
    }
    text = strdup(p);
  }
  k3_model_config_t cfg;
  k3_tmap_t map = {0};
  k3_manifest_t man = {0};
  mk_shard_t *shards = NULL;
  size_t nshards = 0;
  int status = 1;
  if ((rc = k3_model_config_parse(text, strlen(text), &cfg, err, sizeof err))) {
    fprintf(stderr, "k3pd-mkckpt: %s%s%s\n", config ? config : "", config ? ": " : "", err);
    goto out;
  }
  if ((rc = k3_tmap_plan(&cfg, &map, err, sizeof err)) || (rc = k3_manifest_build(&cfg, page_tokens, &man)) ||
      (rc = mk_plan_shards(&map, (uint64_t)shard_size, &shards, &nshards))) {
    fprintf(stderr, "k3pd-mkckpt: %s\n", rc == K3_ENOMEM ? "out of memory" : err);
    goto out;
  }
  if (list) {
    for (size_t s = 0; s < nshards; s++) {
      char sn[64];
      mk_shard_name(sn, sizeof sn, s, nshards);
      for (size_t i = shards[s].first; i < shards[s].first + shards[s].count; i++) {
        const k3_tmap_entry_t *e = &map.entries[i];
        printf("%s %s [", e->name, k3_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) printf("%s%" PRId64, d ? "," : "", e->shape[d]);
        printf("] %" PRIu64 " %s\n", e->nbytes, sn);
      }
    }
  }
  if (!dry) {
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    bool progress = map.total_bytes > ((uint64_t)1 << 30);
    if ((rc = mk_write_checkpoint(out, text, &cfg, &map, shards, nshards, (uint64_t)seed, threads, progress, err,
                                  sizeof err))) {
      fprintf(stderr, "k3pd-mkckpt: %s\n", err);
      goto out;
    }
#ifdef K3PD_HAVE_TOK
    /* The tokenizer file set next to the weights: a byte-level BPE vocabulary learned from the
     * built-in corpus, filling the preset's vocab (the top 256 ids are the model type's special
     * tokens). A real-size vocabulary (163,840) cannot be learned from the small corpus: then the
     * real tiktoken.model must be copied in by hand. */
    rc = k3_tok_write_model_files(out, k3_model_type_name(cfg.type), (int)cfg.vocab_size, err, sizeof err);
    if (rc == K3_ERANGE) {
      printf("tokenizer       not written: vocab %" PRId64 " is too large for the built-in corpus (%s)\n",
             cfg.vocab_size, err);
    } else if (rc) {
      fprintf(stderr, "k3pd-mkckpt: writing tokenizer files: %s\n", err);
      goto out;
    } else {
      printf("tokenizer       tiktoken.model + tokenizer_config.json (%" PRId64 " ids)\n", cfg.vocab_size);
    }
#endif
  }
  print_summary(&cfg, &map, nshards, &man, out, dry);
  status = 0;
out:
  free(shards);
  k3_manifest_free(&man);
  k3_tmap_free(&map);
  free(text);
  return status;
}
