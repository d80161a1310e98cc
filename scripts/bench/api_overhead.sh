#!/usr/bin/env bash
# What the OpenAI-compatible HTTP API adds over gRPC Generate, on one local cluster, in one run
# (docs/perf.md "HTTP API"): starts `k3pd-cli up` with the router's HTTP port on (ephemeral
# ports, logs in one directory), waits until every worker registered, runs k3pd-api-bench
# against both APIs and stops the cluster (by pid, via a trap).
#
# usage: scripts/bench/api_overhead.sh [--build DIR] [--logs DIR] [-- k3pd-api-bench flags...]
# The exit status is k3pd-api-bench's (2 when the cluster did not come up).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
logs=
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "api_overhead.sh: unknown option $1 (k3pd-api-bench flags go after --)" >&2; exit 2 ;;
  esac
done
case $build in /*) ;; *) build=$PWD/$build ;; esac
[ -n "$logs" ] || logs=$(mktemp -d /tmp/k3pd-api-bench.XXXXXX)
mkdir -p "$logs"
"$build/tools/mkckpt/k3pd-mkckpt" --preset tiny --out "$logs/tiny" --seed 1 >/dev/null
# a free port for the HTTP API (the router's gRPC port comes from the ready file)
hport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$build/tools/cli/k3pd-cli" up --model "$logs/tiny" --port 0 --http-port "$hport" --bindir "$build" \
  --ready-file "$logs/ready" >"$logs/cluster.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null || true; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -s "$logs/ready" ] && break
  kill -0 $up 2>/dev/null || { echo "api_overhead.sh: the cluster did not start; see $logs/cluster.log" >&2; exit 2; }
  sleep 0.1
done
[ -s "$logs/ready" ] || { echo "api_overhead.sh: no cluster after 60 s; see $logs/cluster.log" >&2; exit 2; }
echo "cluster: gRPC $(cat "$logs/ready"), HTTP 127.0.0.1:$hport; logs in $logs; load: $(cut -d' ' -f1-3 /proc/loadavg)"
rpid=$(pgrep -P $up -x k3pd-router || true) # the router this script's k3pd-cli started
"$build/tools/bench/k3pd-api-bench" --router "$(cat "$logs/ready")" --http "127.0.0.1:$hport" ${rpid:+--router-pid $rpid} "$@"
