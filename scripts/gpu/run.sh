#!/usr/bin/env bash
# One command for a GPU host with only CUDA installed: build (or use carried binaries), run the
# GPU parity suite and the perf suite, write logs to LOGDIR.
#
#   scripts/gpu/run.sh LOGDIR [--bin DIR] [--quick] [--no-perf]
#
#   --bin DIR   use a prebuilt k3k-gpu-check from DIR (built elsewhere with
#               -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON; it needs only libcublasLt.so.13 and libc)
#               instead of building here.
#   --quick     parity at the tiny shapes only.
#   --no-perf   skip the perf table.
# Building here needs cmake, nvcc, pkg-config, and the dev packages of jansson and xxhash (the
# kernels-only configuration still configures k3_base/k3_ckpt); without them use --bin.
# Logs: LOGDIR/parity.log, LOGDIR/ops-real.log (test_kernels --real, when BIN has it),
# LOGDIR/perf.log, LOGDIR/build.log, LOGDIR/nvidia-smi.txt.
# Exit status: 0 when parity passed (and perf ran), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
logdir=${1:?usage: scripts/gpu/run.sh LOGDIR [--bin DIR] [--quick] [--no-perf]}
shift
bin="" quick="" perf=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    --no-perf) perf=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$logdir"
export PATH=$PATH:/usr/local/cuda/bin
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
nvidia-smi > "$logdir/nvidia-smi.txt" 2>&1 || true
if [ -z "$bin" ]; then
  bdir=build-gpu
  { cmake -S . -B "$bdir" -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$bdir" -j"$(nproc)" --target k3k-gpu-check; } > "$logdir/build.log" 2>&1
  if [ $? -ne 0 ]; then
    echo "build failed; see $logdir/build.log" >&2
    tail -20 "$logdir/build.log" >&2
    exit 1
  fi
  bin=$bdir/tests/gpu
fi
exe=$bin/k3k-gpu-check
[ -x "$exe" ] || { echo "no executable $exe" >&2; exit 1; }
status=0
# Parity: each op synchronised (K3PD_CUDA_SYNC=1) so a device fault names its op.
K3PD_CUDA_SYNC=1 timeout 900 "$exe" $quick > "$logdir/parity.log" 2>&1 || status=1
grep -E "^FAIL" "$logdir/parity.log" | head -40
tail -1 "$logdir/parity.log"
# The op test (tests/kernels): the fused ops at the real K3 shapes, cuda against the CPU
# reference, one tolerance model (docs/kernels.md); present in a pack.sh bundle's bin/.
if [ -x "$bin/test_kernels" ]; then
  K3PD_CUDA_SYNC=1 timeout 300 "$bin/test_kernels" --real --require-device > "$logdir/ops-real.log" 2>&1 || status=1
  grep -E "^FAIL" "$logdir/ops-real.log" | head -20
  echo "test_kernels --real: $(grep -E "passed" "$logdir/ops-real.log" | tail -1)"
fi
if [ "$perf" = 1 ]; then
  timeout 600 "$exe" --perf --no-parity > "$logdir/perf.log" 2>&1 || status=1
  grep -E "^(CEILING|PERF|FAIL)" "$logdir/perf.log"
fi
exit $status
