/* Chained hashes of token blocks, the keys of the decode worker's prefix cache and of the
 * router's cache-aware placement (docs/design.md "Prefix cache").
 *
 * Block k (k >= 1) is tokens [(k-1)*B, k*B) of a prompt; its hash h_k = XXH64(the block's ids as
 * little-endian uint32, seed h_{k-1}), h_0 = K3_PREFIX_HASH_SEED. So h_k names the whole prefix
 * [0, k*B), and two prompts share h_k exactly when (up to 2^-64 collisions) they share those
 * k*B tokens. Stable across machines and processes (worker and router compute the same keys). */
#ifndef K3PD_PREFIX_HASH_H
#define K3PD_PREFIX_HASH_H

#include <stddef.h>
#include <stdint.h>

#define K3_PREFIX_HASH_SEED 0x6b3370642d706678ULL

/* The hash of one block continuing `prev`. */
uint64_t k3_prefix_hash_block(uint64_t prev, const uint32_t *ids, size_t n);
/* Writes h_1..h_m of `ids` (m = min(n / block, cap) full blocks) into out[0..m); returns m.
 * block must be > 0 (0 returns 0). */
size_t k3_prefix_hashes(const uint32_t *ids, size_t n, uint32_t block, uint64_t *out, size_t cap);

#endif
