/* Clocks, hashing, half-precision conversion and whole-file I/O. */
#include "k3pd/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "k3pd/err.h"

uint64_t k3_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t k3_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t k3_hash64(const void *data, size_t len, uint64_t seed) { return XXH64(data, len, seed); }

float k3_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = ldexpf((float)man, -24); /* subnormal (or zero) */
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = ldexpf((float)(man | 0x400u), (int)exp - 25);
  }
  return sign ? -v : v;
}

uint16_t k3_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  float a = fabsf(f);
  if (isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u; /* rounds to inf */
  if (a < ldexpf(1.0f, -24 - 1)) return sign; /* below half the smallest subnormal */
  int e;
  frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
  int exp16 = e - 1 + 15;
  if (exp16 <= 0) { /* subnormal: value = man * 2^-24 */
    float m = nearbyintf(ldexpf(a, 24));
    return sign | (uint16_t)m;
  }
  float m = nearbyintf(ldexpf(a, 10 - (e - 1))); /* in [1024, 2048] */
  uint32_t mi = (uint32_t)m;
  if (mi == 2048) {
    mi = 1024;
    exp16++;
  }
  if (exp16 >= 31) return sign | 0x7c00u;
  return sign | (uint16_t)(exp16 << 10) | (uint16_t)(mi & 0x3ffu);
}

int k3_read_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno == ENOENT ? K3_ENOENT : K3_EIO;
  char *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 65536 + 1 > cap) {
      size_t nc = cap ? cap * 2 : 65536 * 2;
      char *nb = realloc(buf, nc);
      if (!nb) {
        free(buf);
        fclose(f);
        return K3_ENOMEM;
      }
      buf = nb;
      cap = nc;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return K3_EIO;
  }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return 0;
}

int k3_write_file(const char *path, const void *data, size_t len) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) return K3_EINVAL;
  FILE *f = fopen(tmp, "wb");
  if (!f) return K3_EIO;
  int ok = fwrite(data, 1, len, f) == len;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return K3_EIO;
  }
  return 0;
}

char *k3_fmt(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  return buf;
}
