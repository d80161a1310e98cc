#!/usr/bin/env bash
# The model runner on a CUDA host, weights generated on the GPU (k3_runner_init_synth: the bytes
# k3pd-mkckpt would write, no checkpoint on disk):
#   1. k3k-gpu-model on the real-shape 4-layer config (tests/gpu/data/k3-medium-4l16e.json):
#      64 KiB of every tensor compared with the host generator, parity vs cpu-fast over a host
#      copy (64 teacher-forced steps), CUDA-graph vs eager decode, --perf;
#   2. k3pd-generate --device cuda on the same config;
#   3. with --medium: the full medium preset (91.6 GB): k3k-gpu-model --perf + parity (8 steps)
#      and k3pd-generate --synthetic medium --device cuda --perf.
#
#   scripts/gpu/model.sh BIN LOGDIR [--medium]
#
# BIN holds k3pd-generate and k3k-gpu-model (built with -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON)
# plus, when the host lacks them, libjansson.so.4 and libxxhash.so.0.
# Logs: LOGDIR/model4l.log, gen4l.log (and medium.log, genmed.log).
# Exit status: 0 when every step passed, else 1.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?usage: scripts/gpu/model.sh BIN LOGDIR [--medium]}" && pwd)
logdir=${2:?usage: scripts/gpu/model.sh BIN LOGDIR [--medium]}
medium=${3:-}
mkdir -p "$logdir"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg=$root/tests/gpu/data/k3-medium-4l16e.json
status=0
timeout 400 "$bin/k3k-gpu-model" --synthetic-config "$cfg" --device-synth --verify-synth 64 \
  --steps 64 --perf > "$logdir/model4l.log" 2>&1 || status=1
grep -E "^(PASS|FAIL|PERF)|passed" "$logdir/model4l.log"
timeout 200 "$bin/k3pd-generate" --synthetic-config "$cfg" --device cuda --perf \
  --prompt-ids "$(seq -s, 1000 1299)" --max-new-tokens 32 --ignore-eos > "$logdir/gen4l.log" 2>&1 \
  || { echo "k3pd-generate failed: $logdir/gen4l.log"; status=1; }
grep "k3pd-generate:" "$logdir/gen4l.log" | tail -3
if [ "$medium" = "--medium" ]; then
  timeout 540 "$bin/k3k-gpu-model" --synthetic medium --device-synth --verify-synth 1 --perf \
    --steps 8 --graph-steps 8 --no-ref-split > "$logdir/medium.log" 2>&1 || status=1
  grep -E "^(PASS|FAIL|PERF)|passed|runner:" "$logdir/medium.log"
  timeout 200 "$bin/k3pd-generate" --synthetic medium --device cuda --perf \
    --prompt-ids "$(seq -s, 1000 1299)" --max-new-tokens 32 --ignore-eos > "$logdir/genmed.log" 2>&1 \
    || { echo "k3pd-generate (medium) failed: $logdir/genmed.log"; status=1; }
  grep "k3pd-generate:" "$logdir/genmed.log" | tail -3
fi
exit $status
