/* The one model loader (k3_load.h): flags, their checks, the config, and the load itself.
 *
 * What it is for: k3pd-prefill, k3pd-decode and k3pd-generate read the same flags through the
 * same table and defaults and get the same model (so the same state manifest and fingerprint)
 * from the same flags. It replaces the workers' wmodel.c and k3pd-generate's own loading code.
 * What it is not: the runner (k3_runner.h does the binding, arenas and sharing) or a program's
 * flag policy (programs set per-role pool defaults before parsing).
 * Device choice: the CUDA backend opens the device named by K3PD_CUDA_DEVICE when it is first
 * created; --gpu is the flag for it, so k3_load_check makes the two agree (an explicit --gpu that
 * contradicts the environment is an error) and exports the result. Before the runner is built
 * for --backend cuda the device is probed with the CUDA runtime so a host without a usable GPU
 * fails with CUDA's own reason and the device named, not with "backend not available".
 * Weights identity (shared weights): "synthetic seed=N", or for a checkpoint an XXH3 of every
 * *.safetensors file's name, size and header (never its path: two containers may mount one
 * checkpoint at different places); share.c adds the config's canonical text. */
#include "k3_load.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"

#ifdef K3_RUNNER_CUDA
#include <cuda_runtime.h>
#endif

void k3_load_opts_default(k3_load_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->seed_weights = 1;
  o->precision = NULL; /* bf16 on cuda, fp32 elsewhere */
  o->backend = "cpu";
  o->gpu = -1;
  o->threads = 1;
  o->page_tokens = 64;
  o->num_pages = 1024;
  o->num_slots = 16;
  o->max_batch = 16;
  o->prefill_chunk = 256;
  o->share_wait_ms = 600000;
}

size_t k3_load_flags(k3_load_opts_t *o, k3_flag_t *out) {
  const bool al = o->device_alias;
  if (al) o->backend = NULL; /* --backend is then only an alias: unset unless given */
  k3_flag_t t[] = {
      {"model", K3_FLAG_STR, &o->model_dir, "DIR", "checkpoint directory (config.json + safetensors)", false},
      {"synthetic", K3_FLAG_STR, &o->synthetic, "PRESET",
       "use synthetic weights of a preset (tiny, tiny-48b, medium, ...) instead of --model", false},
      {"synthetic-config", K3_FLAG_STR, &o->synthetic_config, "FILE",
       "use synthetic weights of the config.json in FILE instead of --model", false},
      {"seed-weights", K3_FLAG_I64, &o->seed_weights, "N", "seed of the synthetic weights (as k3pd-mkckpt --seed)",
       false},
      {"precision", K3_FLAG_STR, &o->precision, "fp32|bf16",
       "numeric mode, must match across the cluster (default: bf16 on cuda, else fp32)", false},
      {al ? "device" : "backend", K3_FLAG_STR, al ? &o->device : &o->backend, "NAME",
       al ? "where the model runs: cpu (reference), cpu-fast or cuda (bf16 only) (default cpu)"
          : "where the model runs: cpu (reference), cpu-fast or cuda (bf16 only)", false},
      {"gpu", K3_FLAG_INT, &o->gpu, "N", "CUDA device index for --backend cuda (default: K3PD_CUDA_DEVICE, else 0)",
       false},
      {"threads", K3_FLAG_INT, &o->threads, "N", "worker threads of the cpu-fast backend", false},
      {"page-tokens", K3_FLAG_INT, &o->page_tokens, "N", "tokens per MLA latent page (must match across the cluster)",
       false},
      {"num-pages", K3_FLAG_INT, &o->num_pages, "N", "MLA latent page pool size", false},
      {"num-slots", K3_FLAG_INT, &o->num_slots, "N", "KDA state slots (most live sequences)", false},
      {"max-batch", K3_FLAG_INT, &o->max_batch, "N", "most sequences per forward pass", false},
      {"prefill-chunk", K3_FLAG_INT, &o->prefill_chunk, "N",
       "prompt tokens per sequence per forward pass, rounded up to a multiple of 64", false},
      {"host-synth", K3_FLAG_BOOL, &o->host_synth, NULL,
       "with --backend cuda: generate synthetic weights on the CPUs and upload them (default: on the GPU, same bytes)",
       false},
      {"verify-synth", K3_FLAG_INT, &o->verify_synth, "KIB",
       "GPU-generated weights: compare two KIB-KiB slices of every tensor with the host generator (-1: all)", false},
      {"share-weights", K3_FLAG_STR, &o->share_weights, "DIR",
       "cuda: share one read-only copy of the weights with the other processes on this GPU through DIR (created "
       "0700; must be private to the service user)", false},
      {"share-wait-ms", K3_FLAG_INT, &o->share_wait_ms, "MS",
       "with --share-weights: longest wait for another process that is loading the weights", false},
  };
  size_t n = sizeof t / sizeof t[0];
  memcpy(out, t, sizeof t);
  if (al) out[n++] = (k3_flag_t){"backend", K3_FLAG_STR, &o->backend, "NAME", "alias of --device", false};
  return n;
}

int k3_load_check(k3_load_opts_t *o, char *err, size_t errlen) {
  const char *bf = o->device_alias ? "--device" : "--backend";
  if (o->device_alias) {
    /* k3pd-generate: --device is the name, --backend the older alias (both unset: cpu) */
    if (o->device && o->backend && strcmp(o->device, o->backend)) {
      snprintf(err, errlen, "--device %s and --backend %s disagree (--backend is an alias of --device: give one)",
               o->device, o->backend);
      return K3_EINVAL;
    }
    o->backend = o->device ? o->device : o->backend ? o->backend : "cpu";
    o->device = o->backend;
  }
  if (!o->backend || (strcmp(o->backend, "cpu") && strcmp(o->backend, "cpu-fast") && strcmp(o->backend, "cuda"))) {
    snprintf(err, errlen, "unknown %s '%s' (expected cpu, cpu-fast or cuda)", bf, o->backend ? o->backend : "");
    return K3_EINVAL;
  }
  const bool cuda = !strcmp(o->backend, "cuda");
  if (!o->precision) o->precision = cuda ? "bf16" : "fp32";
  if (strcmp(o->precision, "fp32") && strcmp(o->precision, "bf16")) {
    snprintf(err, errlen, "--precision must be fp32 or bf16, not '%s'", o->precision);
    return K3_EINVAL;
  }
  if (cuda && strcmp(o->precision, "bf16")) {
    snprintf(err, errlen, "--precision fp32: %s cuda runs bf16 only", bf);
    return K3_EINVAL;
  }
  if ((o->model_dir != NULL) + (o->synthetic != NULL) + (o->synthetic_config != NULL) != 1) {
    snprintf(err, errlen, "give exactly one of --model DIR, --synthetic PRESET or --synthetic-config FILE");
    return K3_EINVAL;
  }
  struct {
    const char *name;
    long v, lo, hi;
  } r[] = {
      {"--threads", o->threads, 1, 256},          {"--page-tokens", o->page_tokens, 1, 1 << 20},
      {"--num-pages", o->num_pages, 0, 1 << 30},  {"--num-slots", o->num_slots, 0, 1 << 20},
      {"--max-batch", o->max_batch, 0, 1 << 20},  {"--prefill-chunk", o->prefill_chunk, 1, 1 << 20},
      {"--share-wait-ms", o->share_wait_ms, 1, 1L << 30},
  };
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
    if (r[i].v < r[i].lo || r[i].v > r[i].hi) {
      snprintf(err, errlen, "%s %ld..%ld expected, got %ld", r[i].name, r[i].lo, r[i].hi, r[i].v);
      return K3_EINVAL;
    }
  if (o->seed_weights < 0) {
    snprintf(err, errlen, "--seed-weights must be >= 0, got %lld", (long long)o->seed_weights);
    return K3_EINVAL;
  }
  if (o->host_synth && !cuda) {
    snprintf(err, errlen, "--host-synth is for %s cuda (other backends always generate on the CPUs)", bf);
    return K3_EINVAL;
  }
  if (o->host_synth && o->model_dir) {
    snprintf(err, errlen, "--host-synth needs --synthetic or --synthetic-config, not --model");
    return K3_EINVAL;
  }
  if (o->share_weights && !cuda) {
    snprintf(err, errlen, "--share-weights needs %s cuda (host backends read the checkpoint's mapping, which the "
             "page cache already shares)", bf);
    return K3_EINVAL;
  }
  if (o->share_weights && !o->share_weights[0]) {
    snprintf(err, errlen, "--share-weights: empty directory name");
    return K3_EINVAL;
  }
  /* --gpu and K3PD_CUDA_DEVICE name one device */
  const char *env = getenv("K3PD_CUDA_DEVICE");
  int env_dev = -1;
  if (env && *env) {
    char *end = NULL;
    long v = strtol(env, &end, 10);
    if (*end || v < 0 || v > 1024) {
      snprintf(err, errlen, "K3PD_CUDA_DEVICE='%s' is not a device index", env);
      return K3_EINVAL;
    }
    env_dev = (int)v;
  }
  if (o->gpu >= 0 && env_dev >= 0 && o->gpu != env_dev) {
    snprintf(err, errlen, "--gpu %d disagrees with K3PD_CUDA_DEVICE=%d (give one)", o->gpu, env_dev);
    return K3_EINVAL;
  }
  if (o->gpu < 0) o->gpu = env_dev >= 0 ? env_dev : 0;
  if (o->gpu > 1024) {
    snprintf(err, errlen, "--gpu %d is not a device index", o->gpu);
    return K3_EINVAL;
  }
  if (cuda) {
    char v[16];
    snprintf(v, sizeof v, "%d", o->gpu);
    setenv("K3PD_CUDA_DEVICE", v, 1); /* read by the CUDA backend when it is created */
  }
  return 0;
}

const char *k3_load_model_name(const k3_load_opts_t *o) {
  return o->model_dir ? o->model_dir : o->synthetic ? o->synthetic : o->synthetic_config;
}

int k3_load_config(const k3_load_opts_t *o, k3_model_config_t *cfg, char *err, size_t errlen) {
  if (o->synthetic_config) return k3_model_config_load(o->synthetic_config, cfg, err, errlen);
  if (o->synthetic) {
    const char *json = k3_model_config_preset(o->synthetic);
    if (!json) {
      snprintf(err, errlen, "--synthetic: unknown preset '%s' (known: %s)", o->synthetic,
               k3_model_config_preset_names());
      return K3_EINVAL;
    }
    return k3_model_config_parse(json, strlen(json), cfg, err, errlen);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", o->model_dir);
  return k3_model_config_load(path, cfg, err, errlen);
}

/* ---- weights identity of a checkpoint --------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* XXH3 over every *.safetensors file (sorted by name): name, size, header length and header. */
static int ckpt_identity(const char *dir, char *out, size_t cap) {
  DIR *d = opendir(dir);
  if (!d) return K3_EIO;
  char **names = NULL;
  size_t n = 0, ncap = 0;
  int rc = 0;
  struct dirent *de;
  while (!rc && (de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (l < 13 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
    if (n == ncap) {
      char **p = realloc(names, (ncap = ncap ? 2 * ncap : 16) * sizeof *p);
      if (!p) {
        rc = K3_ENOMEM;
        break;
      }
      names = p;
    }
    if (!(names[n] = strdup(de->d_name)))
      rc = K3_ENOMEM;
    else
      n++;
  }
  closedir(d);
  XXH3_state_t *st = XXH3_createState();
  if (!st && !rc) rc = K3_ENOMEM;
  if (!rc) {
    qsort(names, n, sizeof *names, cmp_str);
    XXH3_64bits_reset(st);
  }
  uint64_t total = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    uint8_t len8[8];
    if (fd < 0 || fstat(fd, &sb) || pread(fd, len8, 8, 0) != 8) {
      rc = K3_EIO;
    } else {
      uint64_t hl = 0;
      for (int k = 0; k < 8; k++) hl |= (uint64_t)len8[k] << (8 * k);
      char *h = hl <= (100u << 20) && hl + 8 <= (uint64_t)sb.st_size ? malloc(hl + 1) : NULL;
      if (!h || pread(fd, h, hl, 8) != (ssize_t)hl) {
        rc = K3_EFORMAT;
      } else {
        uint64_t sz = (uint64_t)sb.st_size;
        XXH3_64bits_update(st, names[i], strlen(names[i]) + 1);
        XXH3_64bits_update(st, &sz, sizeof sz);
        XXH3_64bits_update(st, len8, 8);
        XXH3_64bits_update(st, h, hl);
        total += sz;
      }
      free(h);
    }
    if (fd >= 0) close(fd);
  }
  if (!rc)
    snprintf(out, cap, "checkpoint safetensors=%016llx files=%zu bytes=%llu",
             (unsigned long long)XXH3_64bits_digest(st), n, (unsigned long long)total);
  XXH3_freeState(st);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

/* ---- the load ------------------------------------------------------------------------- */

/* --backend cuda: is device `dev` usable? K3_EDEVICE with CUDA's reason otherwise. */
static int probe_cuda(const k3_load_opts_t *o, char *err, size_t errlen) {
  const char *bf = o->device_alias ? "--device" : "--backend";
#ifdef K3_RUNNER_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && o->gpu >= n) {
    snprintf(err, errlen, "%s cuda: CUDA device %d is not usable: this host has %d CUDA device(s)", bf, o->gpu, n);
    return K3_EDEVICE;
  }
  if (e == cudaSuccess) e = cudaSetDevice(o->gpu);
  if (e == cudaSuccess) e = cudaFree(NULL); /* creates the context: a broken device fails here */
  if (e != cudaSuccess) {
    snprintf(err, errlen, "%s cuda: CUDA device %d is not usable: %s", bf, o->gpu, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return K3_EDEVICE;
  }
  return 0;
#else
  snprintf(err, errlen, "%s cuda: CUDA device %d is not usable: this build has no CUDA backend (K3PD_CUDA=OFF)", bf,
           o->gpu);
  return K3_ENOTSUP;
#endif
}

int k3_load_model(const k3_load_opts_t *o, k3_weights_t **wout, k3_runner_t **rout, char *err, size_t errlen) {
  const bool cuda = !strcmp(o->backend, "cuda");
  const bool synth = o->synthetic || o->synthetic_config;
  const bool dev_synth = synth && cuda && !o->host_synth;
  k3_runner_opts_t ro;
  k3_runner_opts_default(&ro);
  ro.precision = !strcmp(o->precision, "bf16") ? K3_RUNNER_BF16 : K3_RUNNER_FP32;
  ro.backend = o->backend;
  ro.threads = o->threads;
  ro.page_tokens = o->page_tokens;
  ro.num_pages = o->num_pages;
  ro.num_slots = o->num_slots;
  ro.max_batch_seqs = o->max_batch > 0 ? o->max_batch : 1;
  ro.prefill_chunk_tokens = o->prefill_chunk;
  ro.state = o->state;
  ro.share_weights_dir = o->share_weights;
  ro.share_wait_ms = o->share_wait_ms;
  int rc = 0;
  if (cuda && (rc = probe_cuda(o, err, errlen))) return rc;
  uint64_t t0 = k3_now_ns();
  k3_model_config_t cfg;
  k3_weights_t *w = NULL;
  char source[160];
  snprintf(source, sizeof source, "synthetic seed=%llu", (unsigned long long)o->seed_weights);
  if (o->model_dir) {
    rc = k3_weights_open_dir(o->model_dir, &cfg, &w, err, errlen);
    if (!rc && o->share_weights && (rc = ckpt_identity(o->model_dir, source, sizeof source)))
      snprintf(err, errlen, "--model %s: cannot read the safetensors headers for --share-weights: %s", o->model_dir,
               k3_strerror(rc));
  } else if (!(rc = k3_load_config(o, &cfg, err, errlen)) && !dev_synth) {
    k3_weights_synth_opts_t so = {.threads = 0, .progress = !o->quiet}; /* every CPU */
    rc = k3_weights_synth_opts(&cfg, (uint64_t)o->seed_weights, &so, &w, err, errlen);
  }
  if (rc) {
    k3_weights_free(w);
    return rc;
  }
  ro.weights_source = source;
  k3_runner_t *r = NULL;
  rc = dev_synth ? k3_runner_init_synth(&cfg, (uint64_t)o->seed_weights, o->verify_synth, &ro, &r, err, errlen)
                 : k3_runner_init(w, &ro, &r, err, errlen);
  if (rc) {
    k3_weights_free(w);
    return rc;
  }
  static const char *shared[] = {"", ", weights shared (made here)", ", weights shared (imported)"};
  K3_INFO("model %s loaded (%s, %s, backend %s%s) in %.1f ms; fingerprint %016llx", k3_load_model_name(o),
          k3_model_type_name(cfg.type), o->precision, o->backend, shared[k3_runner_weights_shared(r)],
          (double)(k3_now_ns() - t0) / 1e6, (unsigned long long)k3_runner_fingerprint(r));
  *wout = w;
  *rout = r;
  return 0;
}
