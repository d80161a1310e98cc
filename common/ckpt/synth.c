/* Counter-based synthetic weights (see synth.h for the distributions). Every element is a pure
 * function of (name, seed, index); MXFP4 tensors are derived per 32-group from bf16 masters of
 * the logical weight, so a packed byte or a scale byte can be produced without its neighbours
 * outside its group. */
#include <math.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/mxfp4.h"
#include "k3pd/synth.h"
#include "k3pd/util.h"

uint64_t k3_synth_key(const char *name, uint64_t seed) { return k3_hash64(name, strlen(name), seed); }

uint64_t k3_synth_u64(uint64_t key, uint64_t ctr) {
  uint64_t z = key + (ctr + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double k3_synth_uniform(uint64_t key, uint64_t ctr) {
  return ((double)(k3_synth_u64(key, ctr) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double k3_synth_normal(uint64_t key, uint64_t idx) {
  double u1 = k3_synth_uniform(key, 2 * idx), u2 = k3_synth_uniform(key, 2 * idx + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Key of the logical master weight of an MXFP4 entry: "...w1.weight_packed" -> "...w1.weight". */
static uint64_t master_key(const k3_tmap_entry_t *e, uint64_t seed) {
  char buf[256];
  size_t n = strlen(e->name);
  const char *suffix = e->role == K3_ROLE_EXPERT_PACKED ? "_packed" : "_scale";
  size_t sl = strlen(suffix);
  if (n >= sizeof buf || n < sl) return k3_synth_key(e->name, seed);
  memcpy(buf, e->name, n - sl);
  buf[n - sl] = '\0';
  return k3_synth_key(buf, seed);
}

static double role_value(const k3_model_config_t *cfg, const k3_tmap_entry_t *e, uint64_t key, uint64_t idx) {
  switch (e->role) {
    case K3_ROLE_NORM: return 1.0 + 0.1 * k3_synth_normal(key, idx);
    case K3_ROLE_CONV: return 0.3 * k3_synth_normal(key, idx);
    case K3_ROLE_ROUTER_BIAS: return 0.01 * k3_synth_normal(key, idx);
    case K3_ROLE_A_LOG:
      return idx < (uint64_t)cfg->kda_num_heads ? log(1.0 + 15.0 * k3_synth_uniform(key, idx)) : 0.0;
    case K3_ROLE_DT_BIAS:
      return cfg->type == K3_MODEL_K3 ? -7.0 + 5.0 * k3_synth_uniform(key, idx)
                                      : -4.0 + 5.0 * k3_synth_uniform(key, idx);
    default: return 0.02 * k3_synth_normal(key, idx); /* linears, embed, lm_head, router, experts */
  }
}

float k3_synth_value(const k3_model_config_t *cfg, const k3_tmap_entry_t *e, uint64_t seed, uint64_t idx) {
  if (e->role == K3_ROLE_EXPERT_PACKED || e->role == K3_ROLE_EXPERT_SCALE)
    return k3_round_bf16((float)(0.02 * k3_synth_normal(master_key(e, seed), idx)));
  return (float)role_value(cfg, e, k3_synth_key(e->name, seed), idx);
}

/* Quantizes group g of row n of the logical [N, K] master: 16 packed bytes + scale byte. */
static uint8_t mx_group(uint64_t mkey, int64_t K, int64_t n, int64_t g, uint8_t packed[16]) {
  float w[32];
  uint64_t base = (uint64_t)n * (uint64_t)K + (uint64_t)g * 32;
  for (int i = 0; i < 32; i++) w[i] = k3_round_bf16((float)(0.02 * k3_synth_normal(mkey, base + (uint64_t)i)));
  return k3_mxfp4_quantize_group(w, packed);
}

int k3_synth_fill(const k3_model_config_t *cfg, const k3_tmap_entry_t *e, uint64_t seed,
                  uint64_t byte_begin, size_t nbytes, void *dst) {
  if (byte_begin > e->nbytes || nbytes > e->nbytes - byte_begin) return K3_EINVAL;
  uint8_t *out = dst;
  if (e->role == K3_ROLE_EXPERT_PACKED || e->role == K3_ROLE_EXPERT_SCALE) {
    uint64_t mkey = master_key(e, seed);
    int64_t K = e->logical_cols;
    int packed_role = e->role == K3_ROLE_EXPERT_PACKED;
    uint64_t per_group = packed_role ? 16 : 1; /* storage bytes one group yields */
    uint64_t b = byte_begin, end = byte_begin + nbytes;
    uint64_t groups_per_row = (uint64_t)K / 32;
    while (b < end) {
      uint64_t gi = b / per_group; /* global group index = row * groups_per_row + g */
      uint8_t packed[16];
      uint8_t s = mx_group(mkey, K, (int64_t)(gi / groups_per_row), (int64_t)(gi % groups_per_row), packed);
      if (packed_role) {
        uint64_t off = b - gi * 16, take = 16 - off;
        if (take > end - b) take = end - b;
        memcpy(out + (b - byte_begin), packed + off, take);
        b += take;
      } else {
        out[b - byte_begin] = s;
        b++;
      }
    }
    return 0;
  }
  size_t es = k3_dtype_size(e->dtype);
  if ((e->dtype != K3_DT_BF16 && e->dtype != K3_DT_F32) || byte_begin % es || nbytes % es) return K3_EINVAL;
  uint64_t key = k3_synth_key(e->name, seed), i0 = byte_begin / es;
  for (size_t i = 0; i < nbytes / es; i++) {
    float v = (float)role_value(cfg, e, key, i0 + i);
    if (e->dtype == K3_DT_BF16) {
      uint16_t h = k3_f32_to_bf16(v);
      memcpy(out + 2 * i, &h, 2);
    } else {
      memcpy(out + 4 * i, &v, 4);
    }
  }
  return 0;
}
