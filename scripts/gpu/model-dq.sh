#!/usr/bin/env bash
# The model runner with the dequant-once MoE prefill path (kernels/cuda/moe_dq.h), with carried
# binaries, weights generated on the GPU:
#   1. parity on the real-shape 4-layer config with the path on and its row threshold lowered
#      to 8 (K3PD_MOE_DQ=1 K3PD_MOE_DQ_ROWS=8: every prefill of the check takes it, decode steps
#      keep the grouped kernel, so the graph-vs-eager check still compares like with like);
#   2. the medium preset's figures (k3k-gpu-model --perf: decode batch 1 graph, batch 64, 8K
#      prefill, ceilings measured in the run) with the path on by its row rule (K3PD_MOE_DQ=1);
#   3. with --baseline: the same with the path off (the default), same binary.
#
#   scripts/gpu/model-dq.sh BIN LOGDIR [--baseline]
#
# Logs: LOGDIR/model4l-dq.log, medium-dq.log (medium-base.log). Exit: 0 when all passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?usage: scripts/gpu/model-dq.sh BIN LOGDIR [--baseline]}" && pwd)
logdir=${2:?usage: scripts/gpu/model-dq.sh BIN LOGDIR [--baseline]}
base=${3:-}
mkdir -p "$logdir"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg=${K3_CFG4L:-$root/tests/gpu/data/k3-medium-4l16e.json}
status=0
step() { # name timeout_s command...
  local name=$1 t=$2
  shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$logdir/$name.log" 2>&1 || status=1
  echo "== $name ($((SECONDS - t0)) s): $(tail -1 "$logdir/$name.log")"
  grep -E "^(FAIL|PERF)|runner:" "$logdir/$name.log" | head -40
}
[ "$base" = --medium-only ] ||
  K3PD_MOE_DQ=1 K3PD_MOE_DQ_ROWS=8 step model4l-dq 110 "$bin/k3k-gpu-model" --synthetic-config "$cfg" \
    --device-synth --steps 8 --graph-steps 3
K3PD_MOE_DQ=1 step medium-dq 140 "$bin/k3k-gpu-model" --synthetic medium --device-synth --no-parity --perf \
  --graph-steps 3 --perf-steps 10
[ "$base" = --baseline ] &&
  K3PD_MOE_DQ=0 step medium-base 140 "$bin/k3k-gpu-model" --synthetic medium --device-synth \
    --no-parity --perf --graph-steps 3 --perf-steps 10
exit $status
