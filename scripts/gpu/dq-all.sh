#!/usr/bin/env bash
# Issue 19 in one device call (carried binaries; a deadline shared by all steps, the most
# important first): the CUDA op tests (the op tables now come from k3k_ops.def), the
# dequant-once MoE path's parity, its crossover against the grouped W4A16 kernel at K3's and the
# medium preset's expert counts, the runner's parity with the path taken by every prefill, and
# the medium preset's figures with and without the path.
#
#   scripts/gpu/dq-all.sh BIN LOGDIR [DEADLINE_S]   (default 280)
#
# BIN: k3k-gpu-moe, k3k-gpu-model, test_kernels (+ libjansson.so.4, libxxhash.so.0).
set -uo pipefail
bin=$(cd "${1:?usage: scripts/gpu/dq-all.sh BIN LOGDIR [DEADLINE_S]}" && pwd)
logdir=${2:?usage: scripts/gpu/dq-all.sh BIN LOGDIR [DEADLINE_S]}
deadline=${3:-280}
mkdir -p "$logdir"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg=${K3_CFG4L:-tests/gpu/data/k3-medium-4l16e.json}
status=0
step() { # name timeout_s command...
  local name=$1 t=$2 left=$((deadline - SECONDS))
  shift 2
  [ "$left" -lt 10 ] && { echo "== $name: skipped (deadline)"; return; }
  [ "$t" -gt "$left" ] && t=$left
  local t0=$SECONDS
  timeout "$t" "$@" > "$logdir/$name.log" 2>&1 || status=1
  echo "== $name ($((SECONDS - t0)) s): $(tail -1 "$logdir/$name.log")"
  grep -E "^(FAIL|PERF)|runner:" "$logdir/$name.log" | grep -vE "router|variant|back-to-back" | head -40
}
K3PD_CUDA_SYNC=1 step test_kernels 60 "$bin/test_kernels"
K3PD_CUDA_SYNC=1 step moe-dq-parity 60 "$bin/k3k-gpu-moe" --dq-only
step moe-e896 90 "$bin/k3k-gpu-moe" --no-parity --perf-t ${DQ_E896_T:-2048,8192,16384}
step moe-e256 90 "$bin/k3k-gpu-moe" --no-parity --perf-e 256 --perf-t ${DQ_E256_T:-2048,4096,6144,8192,16384}
K3PD_MOE_DQ_GROUP=1 step moe-e256-g1 40 "$bin/k3k-gpu-moe" --no-parity --perf-e 256 --perf-t 8192
K3PD_MOE_DQ=1 K3PD_MOE_DQ_ROWS=8 step model4l-dq 90 "$bin/k3k-gpu-model" --synthetic-config "$cfg" --device-synth \
  --steps 8 --graph-steps 3
step medium-dq 120 "$bin/k3k-gpu-model" --synthetic medium --device-synth --no-parity --perf \
  --graph-steps 3 --perf-steps 10
K3PD_MOE_DQ=0 step medium-base 120 "$bin/k3k-gpu-model" --synthetic medium --device-synth \
  --no-parity --perf --graph-steps 3 --perf-steps 10
exit $status
