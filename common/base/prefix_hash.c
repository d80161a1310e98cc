/* Chained token-block hashes (prefix_hash.h). */
#include "k3pd/prefix_hash.h"

#include "k3pd/util.h"

uint64_t k3_prefix_hash_block(uint64_t prev, const uint32_t *ids, size_t n) {
  /* Hash the ids as little-endian bytes, 64 at a time, whatever the host's byte order. */
  uint8_t buf[256];
  uint64_t h = prev;
  for (size_t i = 0; i < n;) {
    size_t k = 0;
    for (; i < n && k < sizeof buf; i++, k += 4) {
      uint32_t v = ids[i];
      buf[k] = (uint8_t)v;
      buf[k + 1] = (uint8_t)(v >> 8);
      buf[k + 2] = (uint8_t)(v >> 16);
      buf[k + 3] = (uint8_t)(v >> 24);
    }
    h = k3_hash64(buf, k, h);
  }
  return h;
}

size_t k3_prefix_hashes(const uint32_t *ids, size_t n, uint32_t block, uint64_t *out, size_t cap) {
  if (!block) return 0;
  size_t m = n / block;
  if (m > cap) m = cap;
  uint64_t h = K3_PREFIX_HASH_SEED;
  for (size_t k = 0; k < m; k++) {
    h = k3_prefix_hash_block(h, ids + k * block, block);
    out[k] = h;
  }
  return m;
}
