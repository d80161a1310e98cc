/* MXFP4 (OCP microscaling FP4, compressed-tensors "mxfp4-pack-quantized") codec, spec §6.
 *
 * A weight W [N, K] is stored as weight_packed [N, K/2] u8 and weight_scale [N, K/32] u8.
 * Byte packed[n][j] holds element k=2j in its LOW nibble and k=2j+1 in its HIGH nibble.
 * A nibble is an E2M1 code (bit 3 = sign): 0..7 = +0,.5,1,1.5,2,3,4,6; 8..15 the negatives.
 * A scale byte e is E8M0: 2^(e-127). Bytes 0x00 and 0xFF are rejected (0xFF is NaN in the OCP
 * spec; batchgen rejects both when expanding to bf16) and never produced by the quantizer.
 * W[n][k] = E2M1(code) * 2^(scale[n][k/32] - 127); exact in fp32 and bf16 for scales 1..254
 * except that |W| >= 2^128 (scale 254 with |code value| >= 2) overflows to +-inf, as in bf16.
 * The quantizer never produces such a scale from finite inputs (its maximum is 252).
 *
 * Quantizer (spec §11.1, used by the synthetic generator): per 32-group,
 * e = 127 + floor(log2(amax)) - 2 clamped to [1, 254]; codes = nearest E2M1 of w / 2^(e-127),
 * magnitudes clamped to 6, ties to the code with an even mantissa bit; a group with amax == 0
 * gets e = 127 and all-zero codes; a non-finite value is rejected; a value that rounds to
 * zero is stored as +0 (code 0). Pure functions; no state. */
#ifndef K3PD_MXFP4_H
#define K3PD_MXFP4_H

#include <stddef.h>
#include <stdint.h>

/* The 16 E2M1 values by code. */
extern const float k3_e2m1_table[16];

/* 2^(e-127) as fp32 (e = 0 gives 2^-127, a subnormal; callers reject 0x00/0xFF first). */
float k3_e8m0_to_f32(uint8_t e);

/* Nearest E2M1 code for x (|x| clamped to 6; NaN is the caller's problem and maps to 0). */
uint8_t k3_e2m1_encode(float x);

/* Dequantizes one row: packed[K/2], scales[K/32] -> out[K] fp32. K must be a positive multiple
 * of 32. Returns 0, K3_EINVAL (bad K) or K3_EFORMAT when a scale byte is 0x00/0xFF (the index
 * of the first bad group goes to *bad_group if not NULL; out is then partially written). */
int k3_mxfp4_dequant_row(const uint8_t *packed, const uint8_t *scales, int64_t K, float *out,
                         int64_t *bad_group);

/* Quantizes one group of 32 values: writes 16 packed bytes, returns the scale byte (1..254).
 * Returns 0 (never a valid scale) when a value is not finite. */
uint8_t k3_mxfp4_quantize_group(const float w[32], uint8_t packed[16]);

/* Quantizes one row w[K] (K a positive multiple of 32) into packed[K/2], scales[K/32].
 * Returns 0, K3_EINVAL (bad K) or K3_ERANGE (non-finite input). */
int k3_mxfp4_quantize_row(const float *w, int64_t K, uint8_t *packed, uint8_t *scales);

/* Scans scale bytes for 0x00/0xFF; returns 0 or K3_EFORMAT (index of the first bad byte in
 * *bad_index if not NULL). */
int k3_mxfp4_check_scales(const uint8_t *scales, size_t n, size_t *bad_index);

#endif
