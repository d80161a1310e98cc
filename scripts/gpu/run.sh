#!/usr/bin/env bash
# One command for a GPU host with only CUDA installed: build (or use carried binaries), run the
# op test on the device (tiny and real shapes), the CUDA-internals checks, the MoE suite and the
# perf suite, write logs to LOGDIR and issue 19's table (with scripts/gpu/model.sh's logs when
# they are in LOGDIR too) to LOGDIR/table.md.
#
#   scripts/gpu/run.sh LOGDIR [--bin DIR] [--quick] [--no-perf] [--part parity|perf]
#
#   --bin DIR   use prebuilt test_kernels, k3k-gpu-check and k3k-gpu-moe from DIR (built
#               elsewhere with -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON; they need only
#               libcublasLt.so.13 and libc, plus libjansson/libxxhash where the host lacks them)
#               instead of building here; DIR must hold all three.
#   --quick     test_kernels --real --quick (T in {1, 65}, fewer big cases) and
#               k3k-gpu-check --quick.
#   --no-perf   skip the perf table.
#   --part P    only the parity runs (P = parity) or only the perf runs and the table (P = perf),
#               for hosts that limit one command's time (the full run took 212 s on an H200
#               with --bin, parity 194 s of it): two commands into the same LOGDIR are the same run.
# Building here needs cmake, nvcc, pkg-config, and the dev packages of jansson and xxhash (the
# kernels-only configuration still configures k3_base/k3_ckpt); without them use --bin.
# Parity, each op synchronised (K3PD_CUDA_SYNC=1) so a device fault names its op:
#   LOGDIR/ops-tiny.log    `test_kernels`: every op at the tiny shapes on every backend, the
#                          device judged against "cpu" by the one tolerance model (CI's cases)
#   LOGDIR/ops-real.log    `test_kernels --real --require-device`: every op at the real K3
#                          shapes, the device against cpu-fast; fails on a refused case or an op
#                          of k3k_ops.def no case ran on the device
#   LOGDIR/internals.log   `k3k-gpu-check`: the CUDA backend's internals the op API cannot reach
#   LOGDIR/moe.log         `k3k-gpu-moe`: router, plan, MXFP4 expert GEMMs (every decode variant
#                          byte for byte against variant 0), combine, the MoE block against cpu
# and LOGDIR/perf.log (k3k-gpu-check --perf), LOGDIR/moe-perf.log (k3k-gpu-moe --perf at T = 1,
# 16, 8192, E = 896), LOGDIR/moe-e256.log (T = 64, E = 256), LOGDIR/table.md
# (scripts/gpu/table.py), LOGDIR/build.log, LOGDIR/nvidia-smi.txt.
# Exit status: 0 when all four parity runs passed (and perf ran), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
usage="usage: scripts/gpu/run.sh LOGDIR [--bin DIR] [--quick] [--no-perf] [--part parity|perf]"
logdir=${1:?$usage}
shift
bin="" quick="" perf=1 parity=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --no-perf) perf=0; shift ;;
    --part)
      case "${2:-}" in
        parity) perf=0 ;;
        perf) parity=0 ;;
        *) echo "--part takes parity or perf, not '${2:-}'" >&2; exit 2 ;;
      esac
      shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$logdir"
export PATH=$PATH:/usr/local/cuda/bin
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
nvidia-smi > "$logdir/nvidia-smi.txt" 2>&1 || true
if [ -z "$bin" ]; then
  bdir=build-gpu
  if ! { cmake -S . -B "$bdir" -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$bdir" -j"$(nproc)" --target k3k-gpu-check k3k-gpu-moe test_kernels &&
    mkdir -p "$bdir/bin" && cp "$bdir/tests/gpu/k3k-gpu-check" "$bdir/tests/gpu/k3k-gpu-moe" \
      "$bdir/tests/kernels/test_kernels" "$bdir/bin/"; } \
    > "$logdir/build.log" 2>&1; then
    echo "build failed; see $logdir/build.log" >&2
    tail -20 "$logdir/build.log" >&2
    exit 1
  fi
  bin=$bdir/bin
fi
exe=$bin/k3k-gpu-check ops=$bin/test_kernels moe=$bin/k3k-gpu-moe
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$bin
for x in "$exe" "$ops" "$moe"; do
  [ -x "$x" ] || { echo "no executable $x" >&2; exit 1; }
done
status=0 t0=$(date +%s)
# run NAME LOG TIMEOUT CMD...: one parity run, its FAIL lines and its last line on stdout, with
# the seconds since the start.
run() {
  local name=$1 log=$2 limit=$3
  shift 3
  K3PD_CUDA_SYNC=1 timeout "$limit" "$@" > "$log" 2>&1 || status=1
  grep -E "^FAIL" "$log" | head -20
  echo "$name ($(( $(date +%s) - t0 )) s): $(tail -1 "$log")"
}
if [ "$parity" = 1 ]; then
  run "test_kernels" "$logdir/ops-tiny.log" 300 env K3PD_FAST_MIN_WORK=0 "$ops"
  if [ -n "$quick" ]; then
    run "test_kernels --real --quick" "$logdir/ops-real.log" 600 "$ops" --real --quick --require-device
  else
    run "test_kernels --real" "$logdir/ops-real.log" 1500 "$ops" --real --require-device
  fi
  run "k3k-gpu-check" "$logdir/internals.log" 900 "$exe" $quick
  run "k3k-gpu-moe" "$logdir/moe.log" 600 "$moe"
fi
if [ "$perf" = 1 ]; then
  timeout 600 "$exe" --perf --no-parity > "$logdir/perf.log" 2>&1 || status=1
  grep -E "^(CEILING|PERF|FAIL)" "$logdir/perf.log"
  timeout 300 "$moe" --perf --no-parity --perf-t 1,16,8192 > "$logdir/moe-perf.log" 2>&1 || status=1
  timeout 120 "$moe" --perf --no-parity --perf-e 256 --perf-t 64 > "$logdir/moe-e256.log" 2>&1 || status=1
  grep -E "^PERF (moe|ceilings)" "$logdir/moe-perf.log" "$logdir/moe-e256.log"
  if command -v python3 > /dev/null; then
    python3 scripts/gpu/table.py "$logdir" > "$logdir/table.md" 2>&1 || status=1
    cat "$logdir/table.md"
  fi
  echo "perf done ($(( $(date +%s) - t0 )) s)"
fi
exit $status
