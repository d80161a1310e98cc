#!/usr/bin/env bash
# k3pd-plan against k3pd-bench on a quiet many-core host's CPU (issue 22 item 4; docs/perf-cluster.md
# "Planner vs measurement"), in one run of ~5.5 minutes on 16 cores:
#   both models (tiny, tiny-48b) x configurations 1x1,2x1,1x2,2x2,3x3 x three rates per prefill +
#   decode pair (2, 3.5, 5 req/s; PxD runs at rate x min(P,D)), 100 requests per cell, prompts
#   16..64, outputs 8..32, each configuration profiled on its own worker processes first
#   (--profile-each), several clusters at once on disjoint CPUs (one CPU per worker, one for the
#   router and k3pd-bench, every process pinned with taskset; hyperthread siblings never split
#   between clusters). The CPU backend ("cpu", the reference: one thread per worker); a GPU is not used.
#
#   scripts/gpu/plan_cpu.sh BUNDLE OUTDIR [--validate PY] [--overlay BINDIR]
#
# BUNDLE: scripts/gpu/pack.sh's tarball (or its unpacked directory): bin/ and lib/. --overlay copies
# BINDIR's programs over the bundle's bin/ (e.g. a k3pd-plan / k3pd-bench built with RPATH
# $ORIGIN/../lib); --validate runs another copy of tests/plan/validate.py. Writes into OUTDIR:
# host.txt (lscpu, load before and after), validate.log, table.md, jobs.json (each cluster's
# CPUs and times), rows.json, results.tar.xz (profiles, bench and plan JSON, per-request lines
# of both, logs). Exit 0 when the table was written.
# Environment (function checks on small machines only): PLAN_PRESETS, PLAN_CONFIGS, PLAN_REQUESTS,
# PLAN_EXTRA (more validate.py flags, e.g. "--cpus-reuse 3").
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=${1:?usage: scripts/gpu/plan_cpu.sh BUNDLE OUTDIR [--validate PY] [--overlay BINDIR]}
out=${2:?usage: scripts/gpu/plan_cpu.sh BUNDLE OUTDIR [--validate PY] [--overlay BINDIR]}
shift 2
validate=$root/tests/plan/validate.py overlay=
while [ $# -gt 0 ]; do
  case $1 in
    --validate) validate=$2; shift 2 ;;
    --overlay) overlay=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$SECONDS
w=$(mktemp -d /tmp/k3pd-plan-cpu.XXXXXX)
trap 'rm -rf "$w"' EXIT
if [ -d "$bundle" ]; then cp -a "$bundle" "$w/k"; else
  mkdir -p "$w/k"
  tar -xJf "$bundle" -C "$w/k" || { echo "unpacking $bundle failed" | tee "$out/validate.log"; exit 1; }
fi
[ -n "$overlay" ] && cp "$overlay"/* "$w/k/bin/"
export LD_LIBRARY_PATH=$w/k/lib:${LD_LIBRARY_PATH:-}
{
  echo "bundle: $(head -1 "$w/k/VERSION" 2>/dev/null); overlay: ${overlay:-none} $(cat "$overlay/../VERSION" 2>/dev/null)"
  echo "date: $(date -u +%FT%TZ); nproc $(nproc); load before: $(cat /proc/loadavg)"
  lscpu 2>&1
  echo "--- thread siblings:"; cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | tr '\n' ' '; echo
  free -m 2>&1
  echo "--- python: $(/usr/bin/python3 --version 2>&1); taskset: $(command -v taskset)"
  for b in k3pd-plan k3pd-bench k3pd-router k3pd-prefill k3pd-decode k3pd-mkckpt; do
    echo "$b: $(ldd "$w/k/bin/$b" 2>&1 | grep -c 'not found') libraries missing"; done
} > "$out/host.txt" 2>&1
v=$w/v
mkdir -p "$v"
# its own process group (setsid), so that whatever it leaves behind is stopped below
# shellcheck disable=SC2086
setsid timeout -k 10 560 /usr/bin/python3 "$validate" --bin "$w/k/bin" --presets "${PLAN_PRESETS:-tiny,tiny-48b}" \
  --configs "${PLAN_CONFIGS:-1x1,2x1,1x2,2x2,3x3}" --rates 2,3.5,5 --rates-per-pair --requests "${PLAN_REQUESTS:-100}" \
  --prompt-len 16..64 --output-len 8..32 --profile-each --cpus auto --budget-s 330 ${PLAN_EXTRA:-} \
  --profile-batches 1,2,4 --profile-args "--profile-prompts 16,32,48,64 --profile-repeats 3 --profile-output 32" \
  --out "$v" > "$out/validate.log" 2>&1 &
vpid=$!
wait $vpid
rc=$?
kill -TERM -- -$vpid 2>/dev/null && sleep 3 && kill -KILL -- -$vpid 2>/dev/null
echo "validate.py exit $rc after $((SECONDS - t0)) s; load after: $(cat /proc/loadavg)" | tee -a "$out/host.txt"
cp "$v/table.md" "$v/jobs.json" "$v/rows.json" "$out/" 2>/dev/null
(cd "$v" && tar --exclude='ckpt-*' -cJf "$out/results.tar.xz" .)
tail -25 "$out/validate.log"
[ $rc = 0 ] && [ -s "$out/table.md" ]
