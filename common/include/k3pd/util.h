/* Small shared helpers: clocks, hashing, bf16 conversion, checked allocation, file reads. */
#ifndef K3PD_UTIL_H
#define K3PD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). */
uint64_t k3_now_ns(void);
/* Wall clock, milliseconds since the Unix epoch. */
int64_t k3_wall_ms(void);

/* xxHash64 of a byte range (libxxhash); stable across machines. */
uint64_t k3_hash64(const void *data, size_t len, uint64_t seed);

/* bf16 <-> fp32. Conversion to bf16 is round-to-nearest-even; NaN stays NaN (quiet). */
static inline float k3_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t k3_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
/* Rounds an fp32 value to the nearest bf16 and back (the "store as bf16" rounding point). */
static inline float k3_round_bf16(float f) { return k3_bf16_to_f32(k3_f32_to_bf16(f)); }

/* fp16 -> fp32 (IEEE half). */
float k3_f16_to_f32(uint16_t h);
uint16_t k3_f32_to_f16(float f);

/* Reads a whole file into a malloc'd, NUL-terminated buffer (caller frees). Returns 0,
 * K3_ENOENT or K3_EIO. */
int k3_read_file(const char *path, char **out, size_t *len);
/* Writes a buffer to path atomically (temp file + rename). */
int k3_write_file(const char *path, const void *data, size_t len);

/* snprintf into a fixed buffer, always NUL-terminated; returns the buffer. */
char *k3_fmt(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
