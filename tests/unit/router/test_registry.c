/* Router registry + pairing policy: registration validation, heartbeat expiry, decode-first
 * choice by utilisation, capacity vs availability errors, prefill choice by queue, pending. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/prefix_hash.h"
#include "registry.h"

static rt_worker_info_t dec(const char *id, int64_t pages, int64_t used, int slots, int slots_used) {
  rt_worker_info_t w;
  memset(&w, 0, sizeof w);
  snprintf(w.id, sizeof w.id, "%s", id);
  w.role = RT_ROLE_DECODE;
  snprintf(w.address, sizeof w.address, "127.0.0.1:%d", 5000 + (int)strlen(id));
  w.fingerprint = 42;
  w.kv_pages_total = pages;
  w.kv_pages_used = used;
  w.page_tokens = 16;
  w.kda_slots_total = slots;
  w.kda_slots_used = slots_used;
  return w;
}

static rt_worker_info_t pre(const char *id, int64_t queued) {
  rt_worker_info_t w;
  memset(&w, 0, sizeof w);
  snprintf(w.id, sizeof w.id, "%s", id);
  w.role = RT_ROLE_PREFILL;
  snprintf(w.address, sizeof w.address, "127.0.0.1:6%03d", (int)queued % 1000);
  w.fingerprint = 42;
  w.queued_prompt_tokens = queued;
  return w;
}

/* Chained block hashes: a hash names the whole prefix; cache-aware placement scores the longest
 * reported prefix against load, leaves at least the last token uncached, and a stale or
 * restarted worker's summary is replaced. */
START_TEST(test_prefix_hash_and_cached_choice) {
  uint32_t a[300], b[300];
  for (int i = 0; i < 300; i++) a[i] = b[i] = (uint32_t)(i * 7 + 3);
  b[100] = 9999; /* b shares the first block (64 tokens) with a, not the second */
  uint64_t ha[4], hb[4];
  ck_assert_uint_eq(k3_prefix_hashes(a, 300, 64, ha, 4), 4);
  ck_assert_uint_eq(k3_prefix_hashes(b, 300, 64, hb, 4), 4);
  ck_assert(ha[0] == hb[0] && ha[1] != hb[1] && ha[2] != hb[2]);
  ck_assert_uint_eq(k3_prefix_hashes(a, 300, 64, ha, 2), 2); /* capped */
  ck_assert_uint_eq(k3_prefix_hashes(a, 300, 0, ha, 4), 0);
  ck_assert(k3_prefix_hash_block(K3_PREFIX_HASH_SEED, a, 64) == ha[0]);
  k3_prefix_hashes(a, 300, 64, ha, 4);

  rt_registry_t r;
  rt_registry_init(&r);
  char err[128];
  bool is_new;
  rt_worker_info_t w1 = dec("d1", 100, 0, 8, 0), w2 = dec("d2", 100, 0, 8, 0);
  ck_assert_int_eq(rt_registry_upsert(&r, &w1, 0, &is_new, err, sizeof err), 0);
  ck_assert_int_eq(rt_registry_upsert(&r, &w2, 0, &is_new, err, sizeof err), 0);
  /* d2 reports a's first three blocks (192 tokens) */
  rt_worker_set_cache(rt_registry_find(&r, "d2"), ha, 3, 64);
  ck_assert_int_eq(rt_worker_cached_tokens(rt_registry_find(&r, "d2"), a, 300), 192);
  ck_assert_int_eq(rt_worker_cached_tokens(rt_registry_find(&r, "d2"), b, 300), 64);
  ck_assert_int_eq(rt_worker_cached_tokens(rt_registry_find(&r, "d2"), a, 192), 128); /* last token computed */
  ck_assert_int_eq(rt_worker_cached_tokens(rt_registry_find(&r, "d1"), a, 300), 0);
  size_t out;
  int64_t cached = -1;
  ck_assert_int_eq(rt_choose_decode_cached(&r, a, 300, 10, 42, true, NULL, 0, 4096, &out, &cached), 0);
  ck_assert_str_eq(r.workers[out].info.id, "d2");
  ck_assert_int_eq(cached, 192);
  /* without cache scoring: the old choice (equal load: by id) */
  ck_assert_int_eq(rt_choose_decode_cached(&r, NULL, 300, 10, 42, true, NULL, 0, 4096, &out, &cached), 0);
  ck_assert_str_eq(r.workers[out].info.id, "d1");
  ck_assert_int_eq(cached, 0);
  /* load outweighs the cache: d2 at 7 of 8 slots costs 108 + 4096 x 1 > 300 + 4096 x 1/8 */
  w2.kda_slots_used = 7;
  ck_assert_int_eq(rt_registry_upsert(&r, &w2, 0, &is_new, err, sizeof err), 0);
  ck_assert_int_eq(rt_choose_decode_cached(&r, a, 300, 10, 42, true, NULL, 0, 4096, &out, &cached), 0);
  ck_assert_str_eq(r.workers[out].info.id, "d1");
  /* ... unless load weighs little */
  ck_assert_int_eq(rt_choose_decode_cached(&r, a, 300, 10, 42, true, NULL, 0, 64, &out, &cached), 0);
  ck_assert_str_eq(r.workers[out].info.id, "d2");
  /* excluded workers are skipped even with the best prefix */
  const char *ex[1] = {"d2"};
  ck_assert_int_eq(rt_choose_decode_cached(&r, a, 300, 10, 42, true, ex, 1, 64, &out, &cached), 0);
  ck_assert_str_eq(r.workers[out].info.id, "d1");
  ck_assert_int_eq(cached, 0);
  /* a worker that restarted (new address: a new process) has nothing cached any more */
  snprintf(w2.address, sizeof w2.address, "127.0.0.1:7777");
  ck_assert_int_eq(rt_registry_upsert(&r, &w2, 0, &is_new, err, sizeof err), 0);
  ck_assert(is_new);
  ck_assert_int_eq(rt_worker_cached_tokens(rt_registry_find(&r, "d2"), a, 300), 0);
  rt_registry_free(&r);
}
END_TEST

START_TEST(test_validation) {
  rt_registry_t r;
  rt_registry_init(&r);
  char err[128];
  bool is_new;
  rt_worker_info_t w = dec("d1", 100, 0, 4, 0);
  w.page_tokens = 0;
  ck_assert_int_eq(rt_registry_upsert(&r, &w, 0, &is_new, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "page_tokens"));
  w = dec("d1", 100, 101, 4, 0);
  ck_assert_int_eq(rt_registry_upsert(&r, &w, 0, &is_new, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "kv_pages_used"));
  w = dec("", 100, 0, 4, 0);
  ck_assert_int_eq(rt_registry_upsert(&r, &w, 0, &is_new, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "worker_id"));
  w = dec("d1", 100, 0, 4, 0);
  strcpy(w.address, "nocolon");
  ck_assert_int_eq(rt_registry_upsert(&r, &w, 0, &is_new, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "address"));
  ck_assert_int_eq(r.n, 0);
  rt_registry_free(&r);
}
END_TEST

START_TEST(test_choose_and_expire) {
  rt_registry_t r;
  rt_registry_init(&r);
  char err[128];
  bool is_new = false;
  size_t idx;
  ck_assert_int_eq(rt_choose_decode(&r, 10, 10, 42, &idx), K3_EUNAVAIL);
  rt_worker_info_t a = dec("dA", 100, 50, 4, 1), b = dec("dB", 100, 10, 4, 1);
  ck_assert_int_eq(rt_registry_upsert(&r, &a, 1000, &is_new, err, sizeof err), 0);
  ck_assert(is_new);
  ck_assert_int_eq(rt_registry_upsert(&r, &b, 1000, &is_new, err, sizeof err), 0);
  ck_assert_int_eq(rt_choose_decode(&r, 10, 22, 42, &idx), 0); /* 2 pages */
  ck_assert_str_eq(r.workers[idx].info.id, "dB");
  /* wrong fingerprint: nobody */
  ck_assert_int_eq(rt_choose_decode(&r, 10, 22, 7, &idx), K3_EUNAVAIL);
  /* too big for anyone: capacity */
  ck_assert_int_eq(rt_choose_decode(&r, 16 * 95, 0, 42, &idx), K3_ECAPACITY);
  /* in-flight accounting shifts the choice: dB has 55 pages of our requests in flight (more
   * than its report of 10) → 56% used vs dA 51% */
  rt_worker_add_inflight(rt_registry_find(&r, "dB"), 55, 1);
  ck_assert_int_eq(rt_choose_decode(&r, 1, 0, 42, &idx), 0);
  ck_assert_str_eq(r.workers[idx].info.id, "dA");
  /* a heartbeat that does not yet include them must not reset the in-flight count */
  b.kv_pages_used = 12;
  ck_assert_int_eq(rt_registry_upsert(&r, &b, 2000, &is_new, err, sizeof err), 0);
  ck_assert(!is_new);
  ck_assert_int_eq(rt_registry_find(&r, "dB")->inflight_pages, 55);
  ck_assert_int_eq(rt_choose_decode(&r, 1, 0, 42, &idx), 0);
  ck_assert_str_eq(r.workers[idx].info.id, "dA");
  /* requests end: back to the reported load */
  rt_worker_sub_inflight(rt_registry_find(&r, "dB"), 55, 1);
  ck_assert_int_eq(rt_choose_decode(&r, 1, 0, 42, &idx), 0);
  ck_assert_str_eq(r.workers[idx].info.id, "dB");
  /* in-flight slots alone can exhaust a worker */
  rt_worker_add_inflight(rt_registry_find(&r, "dA"), 0, 4);
  rt_worker_add_inflight(rt_registry_find(&r, "dB"), 0, 4);
  ck_assert_int_eq(rt_choose_decode(&r, 1, 1, 42, &idx), K3_ECAPACITY);
  rt_worker_sub_inflight(rt_registry_find(&r, "dA"), 0, 9); /* clamps at 0 */
  rt_worker_sub_inflight(rt_registry_find(&r, "dB"), 0, 4);
  ck_assert_int_eq(rt_registry_find(&r, "dA")->inflight_slots, 0);
  /* slots exhausted on both */
  a.kda_slots_used = 4;
  b.kda_slots_used = 4;
  rt_registry_upsert(&r, &a, 2000, &is_new, err, sizeof err);
  rt_registry_upsert(&r, &b, 2000, &is_new, err, sizeof err);
  ck_assert_int_eq(rt_choose_decode(&r, 1, 1, 42, &idx), K3_ECAPACITY);
  /* the reports may be a heartbeat behind: optimistically, only our in-flight count matters */
  ck_assert_int_eq(rt_choose_decode_optimistic(&r, 1, 1, 42, &idx), 0);
  /* expiry: dA last seen at 2000, dB refreshed at 5000 */
  rt_registry_upsert(&r, &b, 5000, &is_new, err, sizeof err);
  ck_assert_uint_eq(rt_registry_expire(&r, 6500, 3000), 1);
  ck_assert_ptr_null(rt_registry_find(&r, "dA"));
  ck_assert_ptr_nonnull(rt_registry_find(&r, "dB"));
  ck_assert_int_eq(rt_registry_remove(&r, "dB"), 0);
  ck_assert_int_eq(rt_registry_remove(&r, "dB"), K3_ENOENT);
  rt_registry_free(&r);
}
END_TEST

START_TEST(test_prefill_choice_and_draining) {
  rt_registry_t r;
  rt_registry_init(&r);
  char err[128];
  bool is_new;
  size_t idx;
  rt_worker_info_t p1 = pre("p1", 500), p2 = pre("p2", 100), p3 = pre("p3", 0);
  p3.draining = true;
  rt_registry_upsert(&r, &p1, 0, &is_new, err, sizeof err);
  rt_registry_upsert(&r, &p2, 0, &is_new, err, sizeof err);
  rt_registry_upsert(&r, &p3, 0, &is_new, err, sizeof err);
  ck_assert_uint_eq(rt_registry_count(&r, RT_ROLE_PREFILL, true), 2);
  ck_assert_int_eq(rt_choose_prefill(&r, 42, NULL, 0, &idx), 0);
  ck_assert_str_eq(r.workers[idx].info.id, "p2");
  const char *ex[] = {"p2"};
  ck_assert_int_eq(rt_choose_prefill(&r, 42, ex, 1, &idx), 0);
  ck_assert_str_eq(r.workers[idx].info.id, "p1");
  rt_worker_add_pending(rt_registry_find(&r, "p2"), 1000);
  ck_assert_int_eq(rt_choose_prefill(&r, 42, NULL, 0, &idx), 0);
  ck_assert_str_eq(r.workers[idx].info.id, "p1");
  rt_worker_sub_pending(rt_registry_find(&r, "p2"), 5000); /* clamps at 0 */
  ck_assert_int_eq(rt_registry_find(&r, "p2")->pending_prompt_tokens, 0);
  const char *ex2[] = {"p1", "p2"};
  ck_assert_int_eq(rt_choose_prefill(&r, 42, ex2, 2, &idx), K3_EUNAVAIL);
  ck_assert_int_eq(rt_pages_needed(17, 0, 16), 2);
  ck_assert_int_eq(rt_pages_needed(16, 0, 16), 1);
  rt_registry_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("router_registry");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_validation);
  tcase_add_test(tc, test_prefix_hash_and_cached_choice);
  tcase_add_test(tc, test_choose_and_expire);
  tcase_add_test(tc, test_prefill_choice_and_draining);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
