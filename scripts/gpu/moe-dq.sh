#!/usr/bin/env bash
# The dequant-once MoE prefill path (kernels/cuda/moe_dq.h) on a GPU host, with carried
# binaries: parity, the crossover against the grouped W4A16 kernel, the medium preset's expert
# count, and the path's two measurement knobs. One process per step (the knobs are read once).
#
#   scripts/gpu/moe-dq.sh BIN LOGDIR [--full]
#
# --full: also the whole k3k-gpu-moe suite (grouped kernels, decode variants, 48B experts).
# BIN holds k3k-gpu-moe (built with -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON).
# Logs: LOGDIR/moe-dq-parity.log, moe-perf-e896.log, moe-perf-e256.log, moe-dq-serial.log,
# moe-dq-g1.log, moe-parity.log. Exit status: 0 when every step passed, else 1.
set -uo pipefail
bin=$(cd "${1:?usage: scripts/gpu/moe-dq.sh BIN LOGDIR}" && pwd)
logdir=${2:?usage: scripts/gpu/moe-dq.sh BIN LOGDIR [--full]}
full=${3:-}
mkdir -p "$logdir"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
moe=$bin/k3k-gpu-moe
status=0
step() { # name timeout_s command...
  local name=$1 t=$2
  shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$logdir/$name.log" 2>&1 || status=1
  echo "== $name ($((SECONDS - t0)) s): $(tail -1 "$logdir/$name.log")"
  grep -E "^(FAIL|PERF)" "$logdir/$name.log" | grep -vE "router|decode variant" | head -60
}
# 1. the new path's cases (exact dequantisation, whole blocks vs the reference chain)
K3PD_CUDA_SYNC=1 step moe-dq-parity 60 "$moe" --dq-only
# 2. crossover at K3's shapes (E = 896, top-16): grouped kernel vs dequant-once, same data
step moe-perf-e896 100 "$moe" --no-parity --perf-t 1,16,256,512,1024,2048,4096,8192
# 3. the medium preset's expert count (256, top-16)
step moe-perf-e256 50 "$moe" --no-parity --perf-e 256 --perf-t 256,512,1024,2048,8192
# 4. knobs at 8K: dequantisation on the main stream (no overlap); one expert per group
K3PD_MOE_PERF_DQ_ONLY=1 K3PD_MOE_DQ_OVERLAP=0 step moe-dq-serial 30 "$moe" --no-parity --perf-t 8192
K3PD_MOE_PERF_DQ_ONLY=1 K3PD_MOE_DQ_GROUP=1 step moe-dq-g1 30 "$moe" --no-parity --perf-t 8192
# 5. the whole MoE suite (grouped kernels, decode variants, 48B bf16 experts, the new cases)
[ "$full" = --full ] && K3PD_CUDA_SYNC=1 step moe-parity 240 "$moe"
exit $status
