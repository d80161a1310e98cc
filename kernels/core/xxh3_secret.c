/* The XXH3 default secret and primes, taken from the installed xxhash.h instead of a copy in
 * our sources: this file is the only one that compiles xxHash's implementation inline
 * (XXH_INLINE_ALL makes it static and namespaced here, so nothing clashes with libxxhash).
 * It also checks, at compile time, that the primes xxh3_warp.h writes out are xxHash's. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

#include "core/xxh3_warp.h"

_Static_assert(sizeof(XXH3_kSecret) == 192, "XXH3 default secret is 192 bytes");
_Static_assert(XW_P32_1 == XXH_PRIME32_1 && XW_P32_2 == XXH_PRIME32_2 && XW_P32_3 == XXH_PRIME32_3,
               "XXH3 32-bit primes");
_Static_assert(XW_P64_1 == XXH_PRIME64_1 && XW_P64_2 == XXH_PRIME64_2 && XW_P64_3 == XXH_PRIME64_3 &&
                   XW_P64_4 == XXH_PRIME64_4 && XW_P64_5 == XXH_PRIME64_5,
               "XXH3 64-bit primes");
_Static_assert(XXH_VERSION_NUMBER >= 800, "XXH3's output is stable from xxHash 0.8.0");

void k3k_xxh3_secret(uint8_t out[192]) { memcpy(out, XXH3_kSecret, sizeof XXH3_kSecret); }
