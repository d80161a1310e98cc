/* MXFP4 codec (spec §6 decoding, §11.1 quantizer): E2M1 table, E8M0 scales, nibble order
 * low = element 2j. See mxfp4.h for the exact rules (ties, zero groups, rejected scale bytes). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/err.h"
#include "k3pd/mxfp4.h"

const float k3_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float k3_e8m0_to_f32(uint8_t e) { return e == 0xFF ? NAN : ldexpf(1.0f, (int)e - 127); }

uint8_t k3_e2m1_encode(float x) {
  float mag = fabsf(x);
  if (!(mag == mag)) return 0; /* NaN */
  uint8_t best = 0;
  float bestd = INFINITY;
  for (uint8_t c = 0; c < 8; c++) {
    float d = fabsf(mag - k3_e2m1_table[c]);
    /* Strictly closer wins; on an exact tie prefer the even code (mantissa bit 0). */
    if (d < bestd || (d == bestd && (c & 1) == 0)) {
      best = c;
      bestd = d;
    }
  }
  if (mag > 6.0f) best = 7;
  if (x < 0 && best != 0) best |= 8;
  return best;
}

uint8_t k3_mxfp4_quantize_group(const float w[32], uint8_t packed[16]) {
  float amax = 0.0f;
  for (int i = 0; i < 32; i++) {
    if (!isfinite(w[i])) return 0;
    float a = fabsf(w[i]);
    if (a > amax) amax = a;
  }
  int e = 127;
  if (amax > 0.0f) {
    int ex;
    frexpf(amax, &ex);        /* amax = m * 2^ex, m in [0.5, 1) => floor(log2 amax) = ex - 1 */
    e = 127 + (ex - 1) - 2;
    if (e < 1) e = 1;
    if (e > 254) e = 254;
  }
  float inv = ldexpf(1.0f, 127 - e); /* exact power of two */
  for (int j = 0; j < 16; j++) {
    uint8_t lo = amax > 0.0f ? k3_e2m1_encode(w[2 * j] * inv) : 0;
    uint8_t hi = amax > 0.0f ? k3_e2m1_encode(w[2 * j + 1] * inv) : 0;
    packed[j] = (uint8_t)(lo | (hi << 4));
  }
  return (uint8_t)e;
}

int k3_mxfp4_quantize_row(const float *w, int64_t K, uint8_t *packed, uint8_t *scales) {
  if (K <= 0 || K % 32) return K3_EINVAL;
  for (int64_t g = 0; g < K / 32; g++) {
    uint8_t s = k3_mxfp4_quantize_group(w + g * 32, packed + g * 16);
    if (!s) return K3_ERANGE;
    scales[g] = s;
  }
  return 0;
}

int k3_mxfp4_dequant_row(const uint8_t *packed, const uint8_t *scales, int64_t K, float *out,
                         int64_t *bad_group) {
  if (K <= 0 || K % 32) return K3_EINVAL;
  for (int64_t g = 0; g < K / 32; g++) {
    uint8_t s = scales[g];
    if (s == 0x00 || s == 0xFF) {
      if (bad_group) *bad_group = g;
      return K3_EFORMAT;
    }
    float scale = ldexpf(1.0f, (int)s - 127);
    for (int j = 0; j < 16; j++) {
      uint8_t b = packed[g * 16 + j];
      out[g * 32 + 2 * j] = k3_e2m1_table[b & 0x0F] * scale;
      out[g * 32 + 2 * j + 1] = k3_e2m1_table[b >> 4] * scale;
    }
  }
  return 0;
}

int k3_mxfp4_check_scales(const uint8_t *scales, size_t n, size_t *bad_index) {
  for (size_t i = 0; i < n; i++) {
    if (scales[i] == 0x00 || scales[i] == 0xFF) {
      if (bad_index) *bad_index = i;
      return K3_EFORMAT;
    }
  }
  return 0;
}
