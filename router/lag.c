/* k3pd-router: how late its event loop runs (k3pd_router_loop_lag_seconds).
 *
 * Everything the router does for every request runs on one loop thread, so any handler that
 * takes long (the 50 MB text was tokenised there for 5 s) delays every other stream.
 * A repeating timer measures how much later than due it fires: the lag of that turn of the
 * loop. It costs 50 wake-ups a second and is the direct check that no request blocks the loop
 * (docs/perf-cluster.md, "Bounded request cost"). Loop thread only. */
#include "rt.h"

#include "k3pd/util.h"

#define LAG_PERIOD_MS 20

static void on_tick(uv_timer_t *t) {
  rt_router_t *rt = t->data;
  uint64_t now = k3_now_ns();
  uint64_t due = rt->lag_last_ns + (uint64_t)LAG_PERIOD_MS * 1000000u;
  double lag = now > due ? (double)(now - due) / 1e9 : 0;
  rt->lag_last_ns = now;
  k3_histogram_observe(k3_metric_default(rt->m.loop_lag_seconds), lag);
}

void rt_lag_start(rt_router_t *rt) {
  uv_timer_init(rt->loop, &rt->lag_timer);
  rt->lag_timer.data = rt;
  rt->lag_last_ns = k3_now_ns();
  uv_timer_start(&rt->lag_timer, on_tick, LAG_PERIOD_MS, LAG_PERIOD_MS);
}

void rt_lag_stop(rt_router_t *rt) { uv_close((uv_handle_t *)&rt->lag_timer, NULL); }
