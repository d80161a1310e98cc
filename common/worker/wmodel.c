/* Model loading for worker processes; see k3pd/wmodel.h. */
#include "k3pd/wmodel.h"

#include <stdio.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"

void k3_wmodel_opts_default(k3_wmodel_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->seed_weights = 1;
  o->precision = "fp32";
  o->backend = "cpu";
  o->threads = 1;
  o->page_tokens = 16;
  o->num_pages = 1024;
  o->num_slots = 16;
  o->max_batch = 16;
  o->prefill_chunk = 256;
}

void k3_wmodel_flags(k3_wmodel_opts_t *o, k3_flag_t *f) {
  k3_flag_t t[K3_WMODEL_NFLAGS] = {
      {"model", K3_FLAG_STR, &o->model_dir, "DIR", "checkpoint directory (config.json + safetensors)", false},
      {"synthetic", K3_FLAG_STR, &o->synthetic, "PRESET", "generate the preset's weights in memory instead of --model",
       false},
      {"seed-weights", K3_FLAG_I64, &o->seed_weights, "N", "seed of --synthetic weights (as k3pd-mkckpt --seed)", false},
      {"precision", K3_FLAG_STR, &o->precision, "fp32|bf16", "numeric mode (must match across the cluster)", false},
      {"backend", K3_FLAG_STR, &o->backend, "NAME", "kernel backend: cpu, cpu-fast or cuda", false},
      {"threads", K3_FLAG_INT, &o->threads, "N", "backend worker threads (cpu-fast)", false},
      {"page-tokens", K3_FLAG_INT, &o->page_tokens, "N", "tokens per MLA latent page (must match across the cluster)",
       false},
      {"num-pages", K3_FLAG_INT, &o->num_pages, "N", "MLA latent page pool size", false},
      {"num-slots", K3_FLAG_INT, &o->num_slots, "N", "KDA state slots (max live sequences)", false},
      {"max-batch", K3_FLAG_INT, &o->max_batch, "N", "most sequences per forward pass", false},
      {"prefill-chunk", K3_FLAG_INT, &o->prefill_chunk, "N", "prompt tokens per sequence per forward pass", false},
  };
  memcpy(f, t, sizeof t);
}

int k3_wmodel_load(const k3_wmodel_opts_t *o, k3_weights_t **wout, k3_runner_t **rout, char *err, size_t errlen) {
  if ((o->model_dir == NULL) == (o->synthetic == NULL)) {
    snprintf(err, errlen, "exactly one of --model DIR or --synthetic PRESET is required");
    return K3_EINVAL;
  }
  k3_runner_opts_t ro;
  k3_runner_opts_default(&ro);
  if (strcmp(o->precision, "fp32") == 0) {
    ro.precision = K3_RUNNER_FP32;
  } else if (strcmp(o->precision, "bf16") == 0) {
    ro.precision = K3_RUNNER_BF16;
  } else {
    snprintf(err, errlen, "--precision: expected fp32 or bf16, got \"%s\"", o->precision);
    return K3_EINVAL;
  }
  ro.backend = o->backend;
  ro.threads = o->threads;
  ro.page_tokens = o->page_tokens;
  ro.num_pages = o->num_pages;
  ro.num_slots = o->num_slots;
  ro.max_batch_seqs = o->max_batch;
  ro.prefill_chunk_tokens = o->prefill_chunk;
  k3_weights_t *w = NULL;
  k3_model_config_t cfg;
  uint64_t t0 = k3_now_ns();
  int rc;
  if (o->model_dir) {
    rc = k3_weights_open_dir(o->model_dir, &cfg, &w, err, errlen);
  } else {
    const char *json = k3_model_config_preset(o->synthetic);
    if (!json) {
      snprintf(err, errlen, "--synthetic: unknown preset \"%s\" (known: %s)", o->synthetic,
               k3_model_config_preset_names());
      return K3_EINVAL;
    }
    rc = k3_model_config_parse(json, strlen(json), &cfg, err, errlen);
    if (!rc) rc = k3_weights_synth_opts(&cfg, (uint64_t)o->seed_weights, NULL, &w, err, errlen); /* all CPUs */
  }
  if (rc) return rc;
  k3_runner_t *r = NULL;
  rc = k3_runner_init(w, &ro, &r, err, errlen);
  if (rc) {
    k3_weights_free(w);
    return rc;
  }
  K3_INFO("model %s loaded (%s, %s, backend %s) in %.1f ms; fingerprint %016llx",
          o->model_dir ? o->model_dir : o->synthetic, k3_model_type_name(cfg.type), o->precision, o->backend,
          (double)(k3_now_ns() - t0) / 1e6, (unsigned long long)k3_runner_fingerprint(r));
  *wout = w;
  *rout = r;
  return 0;
}
