/* k3pd-router per-request stage trace, for finding where the router's share of a request's
 * latency goes (docs/perf-cluster.md "Router capacity"). Off unless K3PD_ROUTER_TRACE names a
 * file: then every request that launched writes one line when it is freed:
 *   <worker-side id> <arrive ns> <ns from arrival to each later stage, rt_tr_stage_t order>
 * with -1 for a stage not reached. The stamps are CLOCK_MONOTONIC (k3_now_ns), the clock the
 * null worker's trace uses too (tools/nullworker, K3PD_NULL_TRACE), so the two join by id into
 * one-way hops on one machine. scripts/bench/router_trace.py summarises them.
 * Not here: anything the request path reads. Tracing costs one clock read per stage and a
 * buffered line per request (written from the loop; the buffer is flushed at exit). */
#include <stdio.h>
#include <stdlib.h>

#include "k3pd/log.h"
#include "req.h"

void rt_trace_open(rt_router_t *rt) {
  const char *path = getenv("K3PD_ROUTER_TRACE");
  if (!path || !*path) return;
  rt->trace = fopen(path, "w");
  if (!rt->trace) {
    K3_WARN("K3PD_ROUTER_TRACE=%s: cannot open it; tracing is off", path);
    return;
  }
  setvbuf(rt->trace, NULL, _IOFBF, 1 << 16);
  fprintf(rt->trace, "# k3pd-router trace/1: id arrive_ns then ns after arrival of: launch reserve_out "
                     "reserve_in prefill_out attach_out prefill_in first_out attach_in last_in end attach_done\n");
  K3_WARN("K3PD_ROUTER_TRACE: writing a stage trace of every request to %s", path);
}

void rt_trace_close(rt_router_t *rt) {
  if (!rt->trace) return;
  fclose(rt->trace);
  rt->trace = NULL;
}

void rt_trace_write(rt_req_t *q) {
  FILE *f = q->rt->trace;
  if (!f || !q->tr[RT_TR_ARRIVE] || !q->tr[RT_TR_LAUNCH]) return;
  uint64_t t0 = q->tr[RT_TR_ARRIVE];
  fprintf(f, "%s %llu", q->wid[0] ? q->wid : q->id, (unsigned long long)t0);
  for (int i = 1; i < RT_TR_N; i++) {
    if (q->tr[i])
      fprintf(f, " %lld", (long long)(q->tr[i] - t0));
    else
      fputs(" -1", f);
  }
  fputc('\n', f);
}
