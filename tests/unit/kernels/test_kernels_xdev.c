/* k3k_xdev on the host backends (kernels/cpu/xdev.c): digests and copies of random segment
 * layouts against the definition (k3_digest_bytes of each region's concatenated stream), the
 * destination arena byte for byte (copies in place, guard bytes around every copy untouched),
 * notify exactly once before submit returns, and bad arguments refused with nothing done. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "k3k.h"
#include "k3k_xdev.h"
#include "k3pd/err.h"
#include "xdev_layouts.h"

static void count_notify(void *ud) { (*(int *)ud)++; }

/* Runs L on x over fresh arenas; checks digests, the dst arena and notify. */
static void run_layout(k3k_xdev_t *x, xl_layout *L, uint64_t seed) {
  uint8_t *src = malloc(L->src_bytes + 1), *dst = malloc(L->dst_bytes + 1);
  xl_fill_random(src, L->src_bytes, seed);
  xl_fill_guard(dst, L->dst_bytes);
  k3k_xseg_t *segs = xl_segs(L, src, dst);
  uint64_t *got = malloc((L->n_regions + 1) * 8), *want = malloc((L->n_regions + 1) * 8);
  int calls = 0;
  k3k_xjob_t *j = NULL;
  ck_assert_int_eq(k3k_xdev_submit(x, segs, L->first, L->n_regions, count_notify, &calls, &j), 0);
  ck_assert_int_eq(calls, 1); /* host jobs notify before submit returns */
  ck_assert_int_eq(k3k_xdev_poll(j, got), 1);
  ck_assert_int_eq(k3k_xdev_poll(j, got), 1); /* again: same answer */
  xl_reference(L, src, want);
  for (uint32_t r = 0; r < L->n_regions; r++)
    ck_assert_msg(got[r] == want[r], "%s: region %u of %u (%llu bytes): %016llx != %016llx", L->name,
                  r, L->n_regions, (unsigned long long)xl_region_bytes(L, r),
                  (unsigned long long)got[r], (unsigned long long)want[r]);
  uint64_t bad = xl_check_dst(L, src, dst);
  ck_assert_msg(bad == UINT64_MAX, "%s: dst arena differs at %llu", L->name, (unsigned long long)bad);
  k3k_xdev_job_free(j);
  ck_assert_int_eq(calls, 1);
  free(segs);
  free(got);
  free(want);
  free(src);
  free(dst);
}

START_TEST(test_open_and_device_queries) {
  static const char *names[] = {"cpu", "cpu-fast"};
  for (int i = 0; i < 2; i++) {
    k3k_backend_t *be = k3k_backend_get(names[i]);
    ck_assert_ptr_nonnull(be);
    k3k_xdev_t *x = NULL;
    ck_assert_int_eq(k3k_xdev_open(be, &x), 0);
    ck_assert(!k3k_xdev_on_device(x));
    uint8_t uuid[16];
    size_t fr, tot;
    ck_assert_int_eq(k3k_device_uuid(be, uuid), K3_ENOTSUP);
    ck_assert_int_eq(k3k_device_mem(be, &fr, &tot), K3_ENOTSUP);
    k3k_xdev_close(x);
  }
  k3k_xdev_t *x = NULL;
  ck_assert_int_eq(k3k_xdev_open(NULL, &x), K3_EINVAL);
  ck_assert_int_eq(k3k_xdev_open(k3k_backend_get("cpu"), NULL), K3_EINVAL);
  ck_assert(!k3k_xdev_on_device(NULL));
  k3k_xdev_close(NULL);   /* no-ops */
  k3k_xdev_job_free(NULL);
}
END_TEST

START_TEST(test_random_layouts) {
  k3k_xdev_t *x = NULL;
  ck_assert_int_eq(k3k_xdev_open(k3k_backend_get("cpu"), &x), 0);
  uint64_t rng = 12345;
  for (int round = 0; round < 400; round++) {
    xl_layout L;
    xl_random(&L, &rng, round % 3 != 0);
    run_layout(x, &L, 1000 + (uint64_t)round);
    xl_free(&L);
  }
  k3k_xdev_close(x);
}
END_TEST

/* The edge stream lengths, whole and cut into every 2-segment split around chunk edges; empty
 * regions and regions of 1..3 bytes between them; page layouts. */
START_TEST(test_edge_streams) {
  k3k_xdev_t *x = NULL;
  ck_assert_int_eq(k3k_xdev_open(k3k_backend_get("cpu-fast"), &x), 0);
  static const uint64_t lens[] = {240, 241, 4095, 4096, 4097, 8193};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    for (uint64_t cut = 0; cut <= lens[i]; cut += (cut < 20 || lens[i] - cut < 20) ? 1 : 997) {
      xl_layout L;
      xl_init(&L, "edge");
      xl_region(&L); /* empty */
      xl_region(&L);
      xl_seg_add(&L, cut, (unsigned)(cut % 16), true, (unsigned)(cut % 5));
      xl_seg_add(&L, 0, 0, true, 0);
      xl_seg_add(&L, lens[i] - cut, 3, cut & 1, 0);
      xl_region(&L); /* 3 bytes in 1-byte segments */
      for (int b = 0; b < 3; b++) xl_seg_add(&L, 1, (unsigned)b, true, (unsigned)b);
      xl_region(&L);
      xl_seg_add(&L, 2, 0, false, 0);
      run_layout(x, &L, lens[i] * 7 + cut);
      xl_free(&L);
    }
  }
  static const uint64_t pages[] = {2560, 18432, 73728};
  for (size_t i = 0; i < 3; i++) {
    xl_layout L;
    xl_pages(&L, 2, 9, pages[i], true);
    run_layout(x, &L, 5 + i);
    xl_free(&L);
  }
  k3k_xdev_close(x);
}
END_TEST

START_TEST(test_bad_arguments) {
  k3k_xdev_t *x = NULL;
  ck_assert_int_eq(k3k_xdev_open(k3k_backend_get("cpu"), &x), 0);
  uint8_t src[64], dst[64], before[64];
  memset(src, 1, sizeof src);
  for (int i = 0; i < 64; i++) dst[i] = before[i] = (uint8_t)(i * 5);
  k3k_xseg_t segs[3] = {{src, dst, 16}, {src + 16, dst + 16, 16}, {src + 32, dst + 32, 16}};
  uint32_t first_ok[3] = {0, 2, 3}, first_bad0[3] = {1, 2, 3}, first_dec[3] = {0, 3, 2};
  k3k_xjob_t *sentinel = (k3k_xjob_t *)(uintptr_t)0x1234, *j = sentinel;
  int calls = 0;
#define REFUSED(expr)                                                                  \
  do {                                                                                 \
    j = sentinel;                                                                      \
    ck_assert_int_eq((expr), K3_EINVAL);                                               \
    ck_assert_ptr_eq(j, sentinel);                                                     \
    ck_assert_int_eq(calls, 0);                                                        \
    ck_assert_int_eq(memcmp(dst, before, sizeof dst), 0);                              \
  } while (0)
  REFUSED(k3k_xdev_submit(NULL, segs, first_ok, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, segs, first_ok, 2, count_notify, &calls, NULL));
  REFUSED(k3k_xdev_submit(x, segs, NULL, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, segs, first_bad0, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, segs, first_dec, 2, count_notify, &calls, &j));
  REFUSED(k3k_xdev_submit(x, NULL, first_ok, 2, count_notify, &calls, &j));
  k3k_xseg_t bad[3];
  memcpy(bad, segs, sizeof bad);
  bad[2].src = NULL; /* no source */
  REFUSED(k3k_xdev_submit(x, bad, first_ok, 2, count_notify, &calls, &j));
  memcpy(bad, segs, sizeof bad);
  bad[1].dst = (uint8_t *)bad[1].src + 8; /* dst overlapping its src */
  REFUSED(k3k_xdev_submit(x, bad, first_ok, 2, count_notify, &calls, &j));
  memcpy(bad, segs, sizeof bad);
  bad[0].src = (const void *)(UINTPTR_MAX - 7); /* range wraps */
  REFUSED(k3k_xdev_submit(x, bad, first_ok, 2, count_notify, &calls, &j));
  memcpy(bad, segs, sizeof bad);
  bad[0].dst = (void *)(UINTPTR_MAX - 7);
  REFUSED(k3k_xdev_submit(x, bad, first_ok, 2, count_notify, &calls, &j));
  memcpy(bad, segs, sizeof bad);
  bad[0].len = (uint64_t)1 << 44; /* 2^32 chunks: over the job limit */
  bad[0].dst = NULL;
  bad[0].src = (const void *)(uintptr_t)4096;
  REFUSED(k3k_xdev_submit(x, bad, first_ok, 2, count_notify, &calls, &j));
#undef REFUSED
  /* the same arguments minus the mistakes work; zero regions and a NULL notify too */
  ck_assert_int_eq(k3k_xdev_submit(x, segs, first_ok, 2, count_notify, &calls, &j), 0);
  ck_assert_int_eq(calls, 1);
  uint64_t d[2];
  ck_assert_int_eq(k3k_xdev_poll(j, d), 1);
  ck_assert_int_eq(k3k_xdev_poll(j, NULL), 1); /* NULL digests: only "done" */
  k3k_xdev_job_free(j);
  ck_assert_int_eq(memcmp(dst, src, 48), 0);
  uint32_t zero = 0;
  ck_assert_int_eq(k3k_xdev_submit(x, NULL, &zero, 0, NULL, NULL, &j), 0);
  ck_assert_int_eq(k3k_xdev_poll(j, NULL), 1);
  k3k_xdev_job_free(j);
  k3k_xdev_close(x);
}
END_TEST

int main(void) {
  Suite *s = suite_create("kernels_xdev");
  TCase *tc = tcase_create("host");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_open_and_device_queries);
  tcase_add_test(tc, test_random_layouts);
  tcase_add_test(tc, test_edge_streams);
  tcase_add_test(tc, test_bad_arguments);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  k3k_backends_shutdown();
  return failed ? 1 : 0;
}
