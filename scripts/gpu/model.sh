#!/usr/bin/env bash
# The model runner on a CUDA host, weights generated on the GPU (k3_runner_init_synth: the bytes
# k3pd-mkckpt would write, no checkpoint on disk):
#   1. k3k-gpu-model on the real-shape 4-layer config (tests/gpu/data/k3-medium-4l16e.json):
#      64 KiB of every tensor compared with the host generator, parity vs cpu-fast over a host
#      copy (64 teacher-forced steps), CUDA-graph vs eager decode, --perf;
#   2. k3pd-generate --device cuda on the same config;
#   3. the Kimi-Linear-48B shapes cut to 4 layers (tests/gpu/data/kl48b-4l.json): parity + perf,
#      and the tiny presets (tiny, tiny-48b) with 64 teacher-forced steps;
#   4. with --medium: the full medium preset (91.6 GB): k3k-gpu-model --perf (no parity: the CPU
#      reference of the medium preset needs ~5 min, run it alone with --steps 4) and
#      k3pd-generate --synthetic medium --device cuda --perf --perf-batch 64 on an 8K prompt;
#   5. with --profile (after --medium): the medium preset's prefill / decode batch 1 / decode
#      batch 64 under ncu, summarised per kernel by scripts/gpu/ncu_sum.py.
#
#   scripts/gpu/model.sh BIN LOGDIR [--medium [--profile]] [--medium-only]
#
# --medium-only runs step 4 (and 5) alone: for hosts that limit one command's time, steps 1-3
# (94 s on an H200, step 4 70 s; session 17) and 4-5 as two commands into one LOGDIR are one run.
#
# BIN holds k3pd-generate and k3k-gpu-model (built with -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON)
# plus, when the host lacks them, libjansson.so.4 and libxxhash.so.0.
# Logs: LOGDIR/model4l.log, gen4l.log, kl48b.log, tiny.log, tiny-48b.log (and medium.log, genmed.log, ncu.csv, ncu.txt).
# scripts/gpu/table.py LOGDIR turns them (with scripts/gpu/run.sh's logs in the same LOGDIR) into
# issue 19's table.
# Exit status: 0 when every step passed, else 1.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage="usage: scripts/gpu/model.sh BIN LOGDIR [--medium [--profile]] [--medium-only]"
bin=$(cd "${1:?$usage}" && pwd) || exit 2
logdir=${2:?$usage}
shift 2
medium="" profile="" small=1
while [ $# -gt 0 ]; do
  case "$1" in
    --medium) medium=--medium ;;
    --profile) profile=--profile ;;
    --medium-only) medium=--medium small=0 ;;
    *) echo "unknown option $1; $usage" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$logdir"
t0=$(date +%s)
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg=$root/tests/gpu/data/k3-medium-4l16e.json
status=0
if [ "$small" = 1 ]; then
  timeout 400 "$bin/k3k-gpu-model" --synthetic-config "$cfg" --device-synth --verify-synth 64 \
    --steps 64 --perf > "$logdir/model4l.log" 2>&1 || status=1
  grep -E "^(PASS|FAIL|PERF)|passed" "$logdir/model4l.log"
  timeout 200 "$bin/k3pd-generate" --synthetic-config "$cfg" --device cuda --perf \
    --prompt-ids "$(seq -s, 1000 1299)" --max-new-tokens 32 --ignore-eos > "$logdir/gen4l.log" 2>&1 \
    || { echo "k3pd-generate failed: $logdir/gen4l.log"; status=1; }
  grep "k3pd-generate:" "$logdir/gen4l.log" | tail -3
  timeout 200 "$bin/k3k-gpu-model" --synthetic-config "$root/tests/gpu/data/kl48b-4l.json" --device-synth \
    --verify-synth 4 --steps 16 --perf --perf-prefill 4096 > "$logdir/kl48b.log" 2>&1 || status=1
  grep -E "^(PASS|FAIL|PERF)|passed" "$logdir/kl48b.log"
  # the tiny presets on the generic-shape KDA/MLA/MoE kernels (docs/perf-gpu-model.md "The tiny
  # presets on the GPU"; tiny's --tol as its ctest k3k_gpu_model_tiny)
  for p in tiny tiny-48b; do
    t=; [ $p = tiny ] && t="--tol 6e-2"
    timeout 120 "$bin/k3k-gpu-model" --synthetic $p --device-synth --verify-synth -1 --steps 64 $t \
      > "$logdir/$p.log" 2>&1 || status=1
    grep -E "^FAIL|passed" "$logdir/$p.log"
  done
  echo "small configs done ($(( $(date +%s) - t0 )) s)"
fi
if [ "$medium" = "--medium" ]; then
  timeout 300 "$bin/k3k-gpu-model" --synthetic medium --device-synth --verify-synth 1 --perf \
    --no-parity --graph-steps 4 > "$logdir/medium.log" 2>&1 || status=1
  grep -E "^(PASS|FAIL|PERF)|passed|runner:" "$logdir/medium.log"
  # issue 9's three figures from k3pd-generate itself: an 8K prompt (prefill vs its FLOP floor,
  # timed on a second pass), decode batch 1 and batch 64 (vs their weight-read floors)
  timeout 200 "$bin/k3pd-generate" --synthetic medium --device cuda --perf --perf-batch 64 --prefill-chunk 8192 \
    --prompt-ids "$(seq -s, 1000 9191)" --max-new-tokens 32 --ignore-eos > "$logdir/genmed.log" 2>&1 \
    || { echo "k3pd-generate (medium) failed: $logdir/genmed.log"; status=1; }
  grep "k3pd-generate:" "$logdir/genmed.log" | tail -4
  if [ "$profile" = "--profile" ]; then
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    timeout 300 "$ncu" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
      --csv "$bin/k3k-gpu-model" --synthetic medium --device-synth --no-parity --perf --profile \
      --graph-steps 3 --perf-steps 2 > "$logdir/ncu.csv" 2> "$logdir/ncu.err" || status=1
    python3 "$root/scripts/gpu/ncu_sum.py" "$logdir/ncu.csv" --grid --top 40 > "$logdir/ncu.txt" 2>&1
    head -50 "$logdir/ncu.txt"
  fi
  echo "medium done ($(( $(date +%s) - t0 )) s)"
fi
exit $status
