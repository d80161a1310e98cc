#!/bin/bash
# Router capacity (docs/perf-cluster.md "Router capacity"): what one router sustains on one core
# when the workers cost nothing. The router runs pinned to ROUTER_CPU; two k3pd-null-worker
# processes (BENCHMARK ONLY: prefill + decode with no model, fixed token ids) and k3pd-bench run
# pinned to OTHER_CPUS. Mutual TLS between router and workers, as in production.
#   part A, requests/s: open-loop Poisson arrivals at each rate of RATES for DURATION s, prompt 16
#           ids, 4 output tokens sent at once (each request = intake, Reserve, Prefill, Attach);
#   part B, concurrent streams: closed loop with C streams in flight for each C of STREAMS, 40
#           tokens per stream paced at TOKEN_MS (a decode step), for DURATION s.
# Prints one table line per step and appends the k3pd-bench JSON lines to OUT/capacity.jsonl.
# Next to the latencies it prints the router's CPU time per request and per relayed token and its
# CPU use over the step (from /proc/PID/stat): those hold on a busy machine where percentiles
# of latency mostly measure the other processes.
# With TRACE=1 the router and the null workers also write their per-request stage traces
# (K3PD_ROUTER_TRACE, K3PD_NULL_TRACE: same clock, joined by request id) and, per step, a table of
# where a request's time goes is printed (trace.txt): the router's own stages (intake, starting
# each call, relaying the first token) and the one-way hops to and from each worker (gRPC, TLS,
# the kernel and the completion-queue threads of both ends). `cs/req` is the router's context
# switches per request (all its threads): each is a thread hop of the completion-queue bridge.
# Usage: scripts/bench/router_capacity.sh [BUILD_DIR] [OUT_DIR]   (BUILD_DIR: a build tree or an unpacked GPU bundle)
#   env: ROUTER_CPU (0), OTHER_CPUS (1), RATES ("100 200 400 800 1600"), STREAMS ("16 64 256 1024";
#        "none" = skip part B), DURATION (10), TOKEN_MS (50), TRACE (0), NICE (0; e.g. -15 as root
#        on a machine shared with other work, so that their processes do not preempt the measured
#        ones: every process started here runs at that niceness)
set -u
B=$(cd "${1:-build}" && pwd)
OUT=${2:-$(mktemp -d /tmp/k3pd-capacity-XXXXXX)}
ROUTER_CPU=${ROUTER_CPU:-0}
OTHER_CPUS=${OTHER_CPUS:-1}
RATES=${RATES:-"100 200 400 800 1600"}
STREAMS=${STREAMS:-"16 64 256 1024"}
DURATION=${DURATION:-10}
TOKEN_MS=${TOKEN_MS:-50}
NICE=${NICE:-0}
TRACE=${TRACE:-0}
[ "$STREAMS" = none ] && STREAMS=""
mkdir -p "$OUT"
J=$OUT/capacity.jsonl
# BUILD_DIR: a CMake build tree, or an unpacked scripts/gpu/pack.sh bundle (binaries in bin/)
ROUTER_BIN=$B/router/k3pd-router NULL_BIN=$B/tools/nullworker/k3pd-null-worker BENCH_BIN=$B/tools/bench/k3pd-bench
[ -x "$B/bin/k3pd-router" ] && ROUTER_BIN=$B/bin/k3pd-router NULL_BIN=$B/bin/k3pd-null-worker BENCH_BIN=$B/bin/k3pd-bench
for b in "$ROUTER_BIN" "$NULL_BIN" "$BENCH_BIN"; do
  [ -x "$b" ] || { echo "router_capacity.sh: $b missing (build it first)" >&2; exit 2; }
done
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

# start_cluster TAG TOKEN_INTERVAL_MS: router + null prefill + null decode; sets RPORT
start_cluster() {
  local d=$OUT/$1
  mkdir -p "$d"
  rm -f "$d"/r.port "$d"/r.cport
  local tr=() trp=() trd=()
  if [ "$TRACE" = 1 ]; then
    tr=(env K3PD_ROUTER_TRACE="$d/router.trace") trp=(env K3PD_NULL_TRACE="$d/prefill.trace")
    trd=(env K3PD_NULL_TRACE="$d/decode.trace")
    : >"$d/steps"
  fi
  "${tr[@]}" nice -n "$NICE" taskset -c "$ROUTER_CPU" "$ROUTER_BIN" --synthetic tiny --listen 127.0.0.1:0 --port-file "$d/r.port" \
    --cluster-port-file "$d/r.cport" --tls-dev-dir "$OUT/tls" --log-level warn >"$d/router.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 200); do [ -s "$d/r.port" ] && [ -s "$d/r.cport" ] && break; sleep 0.05; done
  local c=127.0.0.1:$(cat "$d/r.cport")
  "${trp[@]}" nice -n "$NICE" taskset -c "$OTHER_CPUS" "$NULL_BIN" --role prefill --router "$c" --worker-id prefill-0 \
    --tls-dev-dir "$OUT/tls" >"$d/prefill.log" 2>&1 &
  PIDS+=($!)
  "${trd[@]}" nice -n "$NICE" taskset -c "$OTHER_CPUS" "$NULL_BIN" --role decode --router "$c" --worker-id decode-0 \
    --token-interval-ms "$2" --tls-dev-dir "$OUT/tls" >"$d/decode.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 200); do
    grep -q "registered with" "$d/prefill.log" && grep -q "registered with" "$d/decode.log" && break
    sleep 0.05
  done
  grep -q "registered with" "$d/decode.log" || { echo "null workers did not register (see $d)" >&2; exit 1; }
  RPORT=$(cat "$d/r.port")
  RPID=${PIDS[0]}
  CDIR=$d
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$RPID/stat"; } # utime + stime of the router
# context switches (voluntary + not) of all the router's threads
ctx_switches() { cat /proc/"$RPID"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {print n + 0}'; }
mono_ns() { /usr/bin/python3 -c 'import time; print(time.monotonic_ns())'; }

stop_cluster() { cleanup; PIDS=(); }

bench() { # LABEL, then k3pd-bench's arguments
  local c0 t0 s0 m0 label=$1
  shift
  [ "$TRACE" = 1 ] && m0=$(mono_ns)
  c0=$(cpu_ticks)
  s0=$(ctx_switches)
  t0=$(date +%s.%N)
  nice -n "$NICE" taskset -c "$OTHER_CPUS" "$BENCH_BIN" --router "127.0.0.1:$RPORT" --id-max 3000 \
    --json "$J" "$@" >"$OUT/last.txt" 2>&1
  CPU_S=$(echo "$(cpu_ticks) $c0 $(getconf CLK_TCK)" | awk '{print ($1 - $2) / $3}')
  WALL_S=$(echo "$(date +%s.%N) $t0" | awk '{print $1 - $2}')
  CS=$(($(ctx_switches) - s0))
  [ "$TRACE" = 1 ] && echo "$label $m0 $(mono_ns)" >>"$CDIR/steps"
  return 0
}

row() { # LABEL: the last JSON line as a table row
  /usr/bin/python3 - "$J" "$1" "$CPU_S" "$WALL_S" "$CS" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).readlines()[-1])
cpu, wall, cs = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
f = lambda k, q, s=1.0: "%.2f" % (d[k][q] * s) if d[k].get("n") else "-"
err = sum(d["errors"].values()) if d["errors"] else 0
n = d["sent"] or 1
toks = d.get("output_tokens") or 1
print("%-14s %9.1f %6d %7s %7s %7s %7s %8s %8s %7s %7s %8.0f %8.1f %5.0f%% %6.1f" % (sys.argv[2], d["requests_per_s"], err,
      f("ttft_ms", "p50"), f("ttft_ms", "p99"), f("e2e_ms", "p50"), f("e2e_ms", "p99"),
      f("router_overhead_us", "p50", 1e-3), f("router_overhead_us", "p99", 1e-3), f("itl_ms", "p50"),
      f("itl_ms", "p99"), cpu / n * 1e6, cpu / toks * 1e6, 100 * cpu / wall, cs / n))
EOF
}

# trace_report DIR: where the time of each step's requests went (TRACE=1), appended to trace.txt
trace_report() {
  [ "$TRACE" = 1 ] && [ -s "$1/router.trace" ] || return 0 # (a router without the trace writes none)
  /usr/bin/python3 - "$1" <<'EOF' | tee -a "$OUT/trace.txt"
import sys
d = sys.argv[1]
names = ("launch reserve_out reserve_in prefill_out attach_out prefill_in first_out attach_in last_in end "
         "attach_done").split()
reqs = []
for l in open(d + "/router.trace"):
    if l.startswith("#"):
        continue
    f = l.split()
    a = int(f[1])
    st = {"arrive": a}
    for n, v in zip(names, f[2:]):
        st[n] = a + int(v) if int(v) >= 0 else None
    reqs.append((f[0], st))
w = {}
for fn in ("decode.trace", "prefill.trace"):
    try:
        for l in open(d + "/" + fn):
            m, i, a, b = l.split()
            w[(m, i)] = (int(a), int(b))
    except OSError:
        pass
rows = [("intake (arrival -> placement)", "arrive", "launch"), ("place + start Reserve", "launch", "reserve_out"),
        ("Reserve: hop to D", "reserve_out", "R0"), ("Reserve: D's handler", "R0", "R1"),
        ("Reserve: hop back", "R1", "reserve_in"), ("Reserve answered -> Prefill out", "reserve_in", "prefill_out"),
        ("Reserve answered -> Attach out", "reserve_in", "attach_out"), ("Prefill: hop to P", "prefill_out", "P0"),
        ("Prefill: hop back", "P1", "prefill_in"), ("first token in -> out", "tok_in", "first_out"),
        ("Attach: hop to D", "attach_out", "A0"), ("Attach: last token hop back", "A1", "last_in"),
        ("last token in -> request end", "last_in", "end"), ("router TTFT (arrival -> first out)", "arrive", "first_out"),
        ("router e2e (arrival -> end)", "arrive", "end")]
def pct(v, q):
    return v[min(len(v) - 1, int(q / 100.0 * (len(v) - 1) + 0.5))]
for step in open(d + "/steps"):
    label, t0, t1 = step.split()
    if label == "warmup":
        continue
    t0, t1 = int(t0), int(t1)
    sel = [(i, s) for i, s in reqs if t0 <= s["arrive"] <= t1]
    print("trace of step %s: %d requests; where the time goes (us)" % (label, len(sel)))
    print("  %-40s %8s %8s %8s %8s" % ("stage", "p50", "p90", "p99", "mean"))
    for name, a, b in rows:
        v = []
        for i, s in sel:
            t = dict(s)
            for m in "RPA":
                if (m, i) in w:
                    t[m + "0"], t[m + "1"] = w[(m, i)]
            ins = [x for x in (s["prefill_in"], s["attach_in"]) if x]
            t["tok_in"] = min(ins) if ins else None
            if t.get(a) is not None and t.get(b) is not None:
                v.append((t[b] - t[a]) / 1e3)
        if not v:
            continue
        v.sort()
        print("  %-40s %8.1f %8.1f %8.1f %8.1f" % (name, pct(v, 50), pct(v, 90), pct(v, 99), sum(v) / len(v)))
EOF
}

echo "router on CPU $ROUTER_CPU; null workers + k3pd-bench on CPU(s) $OTHER_CPUS; niceness $NICE; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(ms)           req/s     err  TTFT50  TTFT99   e2e50   e2e99  ovh50  ovh99    ITL50   ITL99  us/req  us/tok  cpu  cs/req"
start_cluster rate 0
bench warmup --requests 200 --concurrency 8 --prompt-len 16 --output-len 4 # warm-up (not shown)
for r in $RATES; do
  bench "rate-$r" --rate "$r" --duration "$DURATION" --max-inflight 100000 --prompt-len 16 --output-len 4 --label "rate-$r"
  row "rate $r/s"
done
stop_cluster
trace_report "$OUT/rate"
if [ -n "$STREAMS" ]; then
  start_cluster streams "$TOKEN_MS"
  for c in $STREAMS; do
    bench "streams-$c" --concurrency "$c" --duration "$DURATION" --prompt-len 16 --output-len 40 --timeout-ms 120000 \
      --label "streams-$c"
    row "streams $c"
  done
  stop_cluster
  trace_report "$OUT/streams"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); JSON lines: $J"
