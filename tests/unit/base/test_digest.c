/* Unit tests for the K3 chunked-XXH3 digest (k3pd/digest.h): the definition recomputed here
 * from libxxhash directly, piecewise feeding at random splits, the fused copy, edge lengths. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "k3pd/digest.h"
#include "k3pd/err.h"

static uint64_t rng(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The definition, written out: XXH3 of every 4096-byte chunk, XXH3 of their LE concatenation. */
static uint64_t by_definition(const uint8_t *p, size_t n) {
  size_t nc = (n + 4095) / 4096;
  uint8_t *le = malloc(nc * 8 + 1);
  for (size_t i = 0; i < nc; i++) {
    size_t len = n - i * 4096 < 4096 ? n - i * 4096 : 4096;
    uint64_t h = XXH3_64bits(p + i * 4096, len);
    for (int k = 0; k < 8; k++) le[8 * i + k] = (uint8_t)(h >> (8 * k));
  }
  uint64_t h = XXH3_64bits(le, nc * 8);
  free(le);
  return h;
}

static uint8_t *random_bytes(size_t n, uint64_t seed) {
  uint8_t *b = malloc(n + 1);
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rng(&s);
  return b;
}

START_TEST(test_definition_lengths) {
  static const size_t lens[] = {0, 1, 3, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4095, 4096,
                                4097, 8192, 18432, 65536 + 77, 300000};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    uint8_t *b = random_bytes(lens[i], 7 + i);
    uint64_t want = by_definition(b, lens[i]);
    ck_assert_uint_eq(k3_digest_bytes(b, lens[i]), want);
    /* chunk + combine route (the GPU's: chunk digests on the device, combine on the host) */
    size_t nc = k3_digest_nchunks(lens[i]);
    uint64_t *c = malloc(nc * 8 + 8);
    for (size_t j = 0; j < nc; j++) {
      size_t len = lens[i] - j * 4096 < 4096 ? lens[i] - j * 4096 : 4096;
      c[j] = k3_digest_chunk(b + j * 4096, len);
    }
    ck_assert_uint_eq(k3_digest_combine(c, nc), want);
    free(c);
    free(b);
  }
  ck_assert_uint_eq(k3_digest_bytes(NULL, 0), XXH3_64bits(NULL, 0));
}
END_TEST

START_TEST(test_pieces_and_copy) {
  uint64_t s = 99;
  for (int round = 0; round < 40; round++) {
    size_t n = (size_t)(rng(&s) % 70000);
    uint8_t *b = random_bytes(n, 1000 + (uint64_t)round);
    uint8_t *dst = malloc(n + 64);
    memset(dst, 0xA5, n + 64);
    uint64_t want = by_definition(b, n);
    k3_digest_t d, e;
    ck_assert_int_eq(k3_digest_init(&d), 0);
    ck_assert_int_eq(k3_digest_init(&e), 0);
    size_t off = 0;
    while (off < n) { /* random piece sizes, some chunk-aligned, some odd */
      size_t piece = (rng(&s) & 1) ? 4096 * (1 + rng(&s) % 3) : 1 + rng(&s) % 9000;
      if (piece > n - off) piece = n - off;
      k3_digest_update(&d, b + off, piece);
      k3_digest_copy(&e, dst + 3 + off, b + off, piece); /* misaligned destination */
      off += piece;
    }
    ck_assert_uint_eq(k3_digest_final(&d), want);
    ck_assert_uint_eq(k3_digest_final(&e), want);
    ck_assert_int_eq(memcmp(dst + 3, b, n), 0);
    ck_assert_uint_eq(dst[0], 0xA5);
    ck_assert_uint_eq(dst[n + 3], 0xA5);
    k3_digest_reset(&d); /* reuse */
    k3_digest_update(&d, b, n);
    ck_assert_uint_eq(k3_digest_final(&d), want);
    k3_digest_free(&d);
    k3_digest_free(&e);
    free(b);
    free(dst);
  }
}
END_TEST

/* Every hash+copy loop (k3_digest_copy_impl_set) against the separate hash + memcpy: random
 * lengths, source and destination alignments (0..63: both the streaming-store path for
 * 32-byte aligned destinations and the normal-store one), random piece sizes, guard bytes. */
START_TEST(test_copy_loops) {
  static const char *const impls[] = {"legacy", "fused", "fused4", "fused4-st", "fused4-pf"};
  const char *def = k3_digest_copy_impl();
  ck_assert_int_eq(k3_digest_copy_impl_set("nope"), K3_EINVAL);
  int ran = 0;
  for (int i = 0; i < 5; i++) {
    if (k3_digest_copy_impl_set(impls[i]) != 0) continue; /* not usable on this CPU */
    ck_assert_str_eq(k3_digest_copy_impl(), impls[i]);
    ran++;
    uint64_t s = 1234 + (uint64_t)i;
    for (int round = 0; round < 30; round++) {
      size_t n = round < 3 ? (size_t)(round + 1) * 4 * 4096 : (size_t)(rng(&s) % 90000);
      size_t so = round < 3 ? 0 : (size_t)(rng(&s) % 64), dof = (rng(&s) & 1) ? 0 : (size_t)(rng(&s) % 64);
      uint8_t *sb = random_bytes(n + 64, 77 + (uint64_t)round), *src = sb + so;
      uint8_t *db = aligned_alloc(64, (n + 192 + 63) & ~(size_t)63), *dst = db + 64 + dof;
      memset(db, 0x5A, n + 192);
      k3_digest_t e;
      ck_assert_int_eq(k3_digest_init(&e), 0);
      for (size_t off = 0; off < n;) {
        size_t piece = (rng(&s) % 3) ? 4096 * (1 + rng(&s) % 9) : 1 + rng(&s) % 20000;
        if (piece > n - off) piece = n - off;
        k3_digest_copy(&e, dst + off, src + off, piece);
        off += piece;
      }
      ck_assert_uint_eq(k3_digest_final(&e), by_definition(src, n));
      ck_assert_int_eq(memcmp(dst, src, n), 0);
      ck_assert_uint_eq(dst[-1], 0x5A);
      ck_assert_uint_eq(dst[n], 0x5A);
      k3_digest_free(&e);
      free(sb);
      free(db);
    }
  }
  ck_assert_int_ge(ran, 1); /* legacy is usable everywhere */
  ck_assert_int_eq(k3_digest_copy_impl_set(def), 0);
  /* Every hash-only loop of k3_digest_update, piecewise at random alignments. */
  static const char *const hashes[] = {"lib", "pf", "fused4"};
  const char *hdef = k3_digest_hash_impl();
  ck_assert_int_eq(k3_digest_hash_impl_set("nope"), K3_EINVAL);
  for (int i = 0; i < 3; i++) {
    if (k3_digest_hash_impl_set(hashes[i]) != 0) continue;
    uint64_t s = 777 + (uint64_t)i;
    for (int round = 0; round < 30; round++) {
      size_t n = (size_t)(rng(&s) % 120000), so = (size_t)(rng(&s) % 64);
      uint8_t *sb = random_bytes(n + 64, 99 + (uint64_t)round);
      k3_digest_t e;
      ck_assert_int_eq(k3_digest_init(&e), 0);
      for (size_t off = 0; off < n;) {
        size_t piece = (rng(&s) % 3) ? 4096 * (1 + rng(&s) % 9) : 1 + rng(&s) % 20000;
        if (piece > n - off) piece = n - off;
        k3_digest_update(&e, sb + so + off, piece);
        off += piece;
      }
      ck_assert_uint_eq(k3_digest_final(&e), by_definition(sb + so, n));
      k3_digest_free(&e);
      free(sb);
    }
  }
  ck_assert_int_eq(k3_digest_hash_impl_set(hdef), 0);
}
END_TEST

START_TEST(test_sensitivity) {
  size_t n = 3 * 4096 + 100;
  uint8_t *b = random_bytes(n, 5);
  uint64_t h0 = k3_digest_bytes(b, n);
  for (size_t i = 0; i < n; i += 997) { /* any single flipped bit changes it */
    b[i] ^= 0x10;
    ck_assert_uint_ne(k3_digest_bytes(b, n), h0);
    b[i] ^= 0x10;
  }
  ck_assert_uint_ne(k3_digest_bytes(b, n - 1), h0); /* and the length */
  memset(b, 0, n); /* a zeroed state differs from the real one */
  ck_assert_uint_ne(k3_digest_bytes(b, n), h0);
  free(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("digest");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_definition_lengths);
  tcase_add_test(tc, test_pieces_and_copy);
  tcase_add_test(tc, test_copy_loops);
  tcase_add_test(tc, test_sensitivity);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
