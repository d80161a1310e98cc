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
# Usage: scripts/bench/router_capacity.sh [BUILD_DIR] [OUT_DIR]   (BUILD_DIR: a build tree or an unpacked GPU bundle)
#   env: ROUTER_CPU (0), OTHER_CPUS (1), RATES ("100 200 400 800 1600"), STREAMS ("16 64 256 1024"),
#        DURATION (10), TOKEN_MS (50), NICE (0; e.g. -15 as root on a machine shared with other
#        work, so that their processes do not preempt the measured ones: every process started
#        here runs at that niceness)
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
  nice -n "$NICE" taskset -c "$ROUTER_CPU" "$ROUTER_BIN" --synthetic tiny --listen 127.0.0.1:0 --port-file "$d/r.port" \
    --cluster-port-file "$d/r.cport" --tls-dev-dir "$OUT/tls" --log-level warn >"$d/router.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 200); do [ -s "$d/r.port" ] && [ -s "$d/r.cport" ] && break; sleep 0.05; done
  local c=127.0.0.1:$(cat "$d/r.cport")
  nice -n "$NICE" taskset -c "$OTHER_CPUS" "$NULL_BIN" --role prefill --router "$c" --worker-id prefill-0 \
    --tls-dev-dir "$OUT/tls" >"$d/prefill.log" 2>&1 &
  PIDS+=($!)
  nice -n "$NICE" taskset -c "$OTHER_CPUS" "$NULL_BIN" --role decode --router "$c" --worker-id decode-0 \
    --token-interval-ms "$2" --tls-dev-dir "$OUT/tls" >"$d/decode.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 200); do
    grep -q "registered with" "$d/prefill.log" && grep -q "registered with" "$d/decode.log" && break
    sleep 0.05
  done
  grep -q "registered with" "$d/decode.log" || { echo "null workers did not register (see $d)" >&2; exit 1; }
  RPORT=$(cat "$d/r.port")
  RPID=${PIDS[0]}
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$RPID/stat"; } # utime + stime of the router

stop_cluster() { cleanup; PIDS=(); }

bench() {
  local c0 t0
  c0=$(cpu_ticks)
  t0=$(date +%s.%N)
  nice -n "$NICE" taskset -c "$OTHER_CPUS" "$BENCH_BIN" --router "127.0.0.1:$RPORT" --id-max 3000 \
    --json "$J" "$@" >"$OUT/last.txt" 2>&1
  CPU_S=$(echo "$(cpu_ticks) $c0 $(getconf CLK_TCK)" | awk '{print ($1 - $2) / $3}')
  WALL_S=$(echo "$(date +%s.%N) $t0" | awk '{print $1 - $2}')
}

row() { # LABEL: the last JSON line as a table row
  /usr/bin/python3 - "$J" "$1" "$CPU_S" "$WALL_S" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).readlines()[-1])
cpu, wall = float(sys.argv[3]), float(sys.argv[4])
f = lambda k, q, s=1.0: "%.2f" % (d[k][q] * s) if d[k].get("n") else "-"
err = sum(d["errors"].values()) if d["errors"] else 0
n = d["sent"] or 1
toks = d.get("output_tokens") or 1
print("%-14s %9.1f %6d %7s %7s %7s %7s %8s %8s %7s %7s %8.0f %8.1f %5.0f%%" % (sys.argv[2], d["requests_per_s"], err,
      f("ttft_ms", "p50"), f("ttft_ms", "p99"), f("e2e_ms", "p50"), f("e2e_ms", "p99"),
      f("router_overhead_us", "p50", 1e-3), f("router_overhead_us", "p99", 1e-3), f("itl_ms", "p50"),
      f("itl_ms", "p99"), cpu / n * 1e6, cpu / toks * 1e6, 100 * cpu / wall))
EOF
}

echo "router on CPU $ROUTER_CPU; null workers + k3pd-bench on CPU(s) $OTHER_CPUS; niceness $NICE; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(ms)           req/s     err  TTFT50  TTFT99   e2e50   e2e99  ovh50  ovh99    ITL50   ITL99  us/req  us/tok  cpu"
start_cluster rate 0
bench --requests 200 --concurrency 8 --prompt-len 16 --output-len 4 # warm-up (not shown)
for r in $RATES; do
  bench --rate "$r" --duration "$DURATION" --max-inflight 100000 --prompt-len 16 --output-len 4 --label "rate-$r"
  row "rate $r/s"
done
stop_cluster
start_cluster streams "$TOKEN_MS"
for c in $STREAMS; do
  bench --concurrency "$c" --duration "$DURATION" --prompt-len 16 --output-len 40 --timeout-ms 120000 --label "streams-$c"
  row "streams $c"
done
stop_cluster
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); JSON lines: $J"
