/* k3_msgq / k3_inbox: FIFO order, many producers, wait deadline, inbox delivery on the loop. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>

#include "k3pd/msgq.h"
#include "k3pd/util.h"

typedef struct {
  k3_msg_t link;
  int producer, seq;
} item_t;

START_TEST(test_fifo_and_wait) {
  k3_msgq_t q;
  ck_assert_int_eq(k3_msgq_init(&q), 0);
  uint64_t t0 = k3_now_ns();
  ck_assert(!k3_msgq_wait(&q, 50));
  uint64_t waited_ms = (k3_now_ns() - t0) / 1000000;
  ck_assert_uint_ge(waited_ms, 45);
  ck_assert_uint_lt(waited_ms, 2000);
  item_t it[5];
  for (int i = 0; i < 5; i++) {
    it[i].seq = i;
    k3_msgq_push(&q, &it[i].link);
  }
  ck_assert_uint_eq(k3_msgq_len(&q), 5);
  ck_assert(k3_msgq_wait(&q, 0));
  k3_msg_t *m = k3_msgq_take_all(&q);
  for (int i = 0; i < 5; i++, m = m->next) ck_assert_int_eq(((item_t *)m)->seq, i);
  ck_assert_ptr_null(m);
  ck_assert_ptr_null(k3_msgq_take_all(&q));
  k3_msgq_close(&q);
  ck_assert(!k3_msgq_wait(&q, -1)); /* closed: returns at once */
  k3_msgq_destroy(&q);
}
END_TEST

#define PRODUCERS 4
#define PER 2000

typedef struct {
  k3_inbox_t *in;
  int id;
} prod_t;

static void *producer(void *arg) {
  prod_t *p = arg;
  for (int i = 0; i < PER; i++) {
    item_t *it = malloc(sizeof *it);
    it->producer = p->id;
    it->seq = i;
    k3_inbox_post(p->in, &it->link);
  }
  return NULL;
}

typedef struct {
  int next[PRODUCERS];
  int total;
  bool order_ok;
  k3_inbox_t *in;
} sink_t;

static void on_msg(k3_msg_t *m, void *ud) {
  sink_t *s = ud;
  item_t *it = (item_t *)m;
  if (it->seq != s->next[it->producer]) s->order_ok = false;
  s->next[it->producer] = it->seq + 1;
  free(it);
  s->total++;
}

START_TEST(test_inbox_many_producers) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  k3_inbox_t in;
  sink_t s = {.order_ok = true, .in = &in};
  ck_assert_int_eq(k3_inbox_init(&loop, &in, on_msg, &s), 0);
  pthread_t th[PRODUCERS];
  prod_t pr[PRODUCERS];
  for (int i = 0; i < PRODUCERS; i++) {
    pr[i] = (prod_t){&in, i};
    pthread_create(&th[i], NULL, producer, &pr[i]);
  }
  uint64_t deadline = k3_now_ns() + 20ull * 1000000000ull;
  while (s.total < PRODUCERS * PER && k3_now_ns() < deadline) uv_run(&loop, UV_RUN_ONCE);
  /* producers must be joined before the inbox closes (see msgq.h) */
  for (int i = 0; i < PRODUCERS; i++) pthread_join(th[i], NULL);
  k3_inbox_close(&in, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  ck_assert_int_eq(s.total, PRODUCERS * PER);
  ck_assert(s.order_ok);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("msgq");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_fifo_and_wait);
  tcase_add_test(tc, test_inbox_many_producers);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
