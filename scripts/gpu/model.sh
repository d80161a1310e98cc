#!/usr/bin/env bash
# The model runner on a CUDA host: write a real-shape 4-layer K3 checkpoint
# (tests/gpu/data/k3-medium-4l16e.json, 10.5 GiB) with k3pd-mkckpt, generate with
# `k3pd-generate --backend cuda`, then run the model parity suite k3k-gpu-model with --perf.
#
#   scripts/gpu/model.sh BIN LOGDIR [CKPT_DIR]
#
# BIN holds k3pd-mkckpt, k3pd-generate and k3k-gpu-model (built with -DK3PD_CUDA=ON
# -DK3PD_KERNELS_ONLY=ON; k3pd-mkckpt is not part of that configuration: build it in a normal
# CPU build) plus, when the host lacks them, libjansson.so.4 and libxxhash.so.0.
# CKPT_DIR defaults to /tmp/k3-medium-4l16e; an existing checkpoint there is reused.
# Logs: LOGDIR/mkckpt.log, LOGDIR/generate.log, LOGDIR/model.log.
# Exit status: that of k3k-gpu-model (0 all passed), or 1 when a step before it failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?usage: scripts/gpu/model.sh BIN LOGDIR [CKPT_DIR]}" && pwd)
logdir=${2:?usage: scripts/gpu/model.sh BIN LOGDIR [CKPT_DIR]}
ck=${3:-/tmp/k3-medium-4l16e}
mkdir -p "$logdir"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [ ! -f "$ck/config.json" ]; then
  timeout 600 "$bin/k3pd-mkckpt" --config "$root/tests/gpu/data/k3-medium-4l16e.json" --out "$ck" \
    > "$logdir/mkckpt.log" 2>&1 || { echo "k3pd-mkckpt failed: $logdir/mkckpt.log"; exit 1; }
fi
timeout 300 "$bin/k3pd-generate" --model "$ck" --backend cuda --precision bf16 \
  --prompt-ids "$(seq -s, 1000 1299)" --max-new-tokens 24 --ignore-eos > "$logdir/generate.log" 2>&1 \
  || { echo "k3pd-generate failed: $logdir/generate.log"; exit 1; }
tail -2 "$logdir/generate.log"
timeout 900 "$bin/k3k-gpu-model" --model "$ck" --perf > "$logdir/model.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL|PERF)|passed" "$logdir/model.log"
exit $rc
