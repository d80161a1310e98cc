#!/usr/bin/env bash
# Starts a local k3pd cluster on loopback (router + N prefill + M decode, ephemeral ports, logs in
# one directory), waits until every worker registered, runs k3pd-bench against it and shuts the
# cluster down (every process it started is killed on exit, by pid, via a trap).
#
# usage: scripts/bench/run.sh [options] [-- k3pd-bench flags...]
#   --build DIR         build directory with the binaries (default: build)
#   --model DIR         checkpoint; default: a tiny preset written into the log directory
#   --preset NAME       preset for that default checkpoint (default: tiny)
#   --prefill N         prefill workers (default 1)
#   --decode M          decode workers (default 1)
#   --logs DIR          log directory (default: a new mktemp -d; kept, path printed)
#   --worker-args STR   extra flags for every worker (e.g. "--backend cpu-fast --threads 1")
#   --router-args STR   extra flags for the router
#   --verify            add --compare-monolithic <build>/tools/generate/k3pd-generate --verify-monolithic
#   --compare           add --compare-monolithic <build>/tools/generate/k3pd-generate
# The exit status is k3pd-bench's (2 when the cluster did not come up).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
model=
preset=tiny
n_prefill=1
n_decode=1
logs=
worker_args=
router_args=
mono=
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --prefill) n_prefill=$2; shift 2 ;;
    --decode) n_decode=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --worker-args) worker_args=$2; shift 2 ;;
    --router-args) router_args=$2; shift 2 ;;
    --verify) mono=verify; shift ;;
    --compare) mono=compare; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (k3pd-bench flags go after --)" >&2; exit 2 ;;
  esac
done
case $n_prefill$n_decode in *[!0-9]*) echo "run.sh: --prefill/--decode need numbers" >&2; exit 2 ;; esac
[ "$n_prefill" -ge 1 ] && [ "$n_decode" -ge 1 ] || { echo "run.sh: need at least 1 prefill and 1 decode" >&2; exit 2; }
case $build in /*) ;; *) build=$PWD/$build ;; esac
for b in router/k3pd-router prefill_worker/k3pd-prefill decode_worker/k3pd-decode tools/bench/k3pd-bench; do
  [ -x "$build/$b" ] || { echo "run.sh: $build/$b is missing (build first)" >&2; exit 2; }
done
[ -n "$logs" ] || logs=$(mktemp -d /tmp/k3pd-bench.XXXXXX)
mkdir -p "$logs"

pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # Give them up to 5 s to drain, then SIGKILL what is left.
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "$model" ]; then
  model=$logs/ckpt-$preset
  "$build/tools/mkckpt/k3pd-mkckpt" --preset "$preset" --out "$model" --seed 1 >"$logs/mkckpt.log" 2>&1
fi

# Router on an ephemeral port; the port file appears once it serves.
# shellcheck disable=SC2086
"$build/router/k3pd-router" --model "$model" --listen 127.0.0.1:0 --port-file "$logs/router.port" \
  --cluster-port-file "$logs/router.cport" --drain-grace-ms 2000 $router_args >"$logs/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$logs/router.port" ] && break; kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
[ -s "$logs/router.port" ] || { echo "run.sh: router did not start; see $logs/router.log" >&2; tail -5 "$logs/router.log" >&2; exit 2; }
router=127.0.0.1:$(cat "$logs/router.port")
cluster=127.0.0.1:$(cat "$logs/router.cport") # workers register on the cluster port (mutual TLS, dev CA)

for i in $(seq "$n_prefill"); do
  # shellcheck disable=SC2086
  "$build/prefill_worker/k3pd-prefill" --model "$model" --router "$cluster" --worker-id "prefill-$i" \
    --drain-grace-ms 2000 $worker_args >"$logs/prefill-$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq "$n_decode"); do
  # shellcheck disable=SC2086
  "$build/decode_worker/k3pd-decode" --model "$model" --router "$cluster" --worker-id "decode-$i" \
    --drain-grace-ms 2000 $worker_args >"$logs/decode-$i.log" 2>&1 &
  pids+=($!)
done

# Wait (up to 60 s: model load under a busy machine) until every worker has registered.
want=$((n_prefill + n_decode))
for _ in $(seq 600); do
  got=$(grep -c "registered: " "$logs/router.log" || true)
  [ "$got" -ge "$want" ] && break
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null || { echo "run.sh: a cluster process (pid $p) exited; logs in $logs" >&2; tail -n 3 "$logs"/*.log >&2; exit 2; }
  done
  sleep 0.1
done
[ "$got" -ge "$want" ] || { echo "run.sh: only $got of $want workers registered; logs in $logs" >&2; exit 2; }
echo "run.sh: cluster up at $router ($n_prefill prefill, $n_decode decode, model $model); logs in $logs"

extra=()
case $mono in
  verify) extra=(--compare-monolithic "$build/tools/generate/k3pd-generate" --verify-monolithic) ;;
  compare) extra=(--compare-monolithic "$build/tools/generate/k3pd-generate") ;;
esac
set +e
"$build/tools/bench/k3pd-bench" --router "$router" --model "$model" "${extra[@]}" "$@"
rc=$?
set -e
exit $rc
