#!/usr/bin/env bash
# Handoff bandwidth on the GPU host, every stage timed (issue 17 items 2 and 6): the host path's
# loops and transfers (shm) and the cuda-ipc path of the 8K-token K3 state, each beside its
# copy baseline, with variants side by side so one run answers "which loop / which setting".
#
#   scripts/gpu/xfer-perf.sh BUNDLE LOGDIR [BUDGET_S] [PROFILE]
#
# PROFILE all (default): the runs below. PROFILE pull: the device handoff only, cuda-pull against
# cuda-ipc (docs/perf-gpu-cluster.md "Handoff bandwidth"); single transfers (--repeat) and streams
# (--stream N with --inflight K at once, after an untimed batch of K):
#   parity          k3k-gpu-xdev (the device digest/copy jobs against the K3 digest reference)
#   pull, push      auto path (cuda-pull, producer digests) / --path cuda-ipc: --repeat 5 (a copy
#                   baseline before each), a stream of 32 with 4 in flight, --check (request 0 read
#                   back bit for bit; a source changed after its digest must be rejected on pull)
#   pull-once, push-once  --baseline once (no copy in the sender's context right before a transfer)
#   pull-trace, pull-trace160  K3PD_XFER_TRACE=1 timeline of both processes (one pull job; jobs of
#                   160 MiB)
#   pull-inflight1/2/8    streams with 1, 2, 8 transfers in flight
#   pull-job96/128/160    K3PD_XFER_PULL_JOB_MIB (pull jobs of ~N MiB queued back to back), one
#                   transfer and a stream
#   pull-sender     --digests sender (the sender hashes its sources at layer_ready), with a stream
#   pull-overlap    layers signalled 1 ms apart: done how long after the last layer's signal
# BUNDLE may also be a directory with bin/ and lib/ (a carry of those two programs).
#
# BUNDLE: scripts/gpu/pack.sh's tarball (or its unpacked directory). Runs, in order, each with a
# timeout, skipping what no longer fits BUDGET_S (default 128):
#   ipc             cuda-ipc, the 8K-token K3 state, --repeat 5 (the figures)
#   ipc-trace       the same with K3PD_XFER_TRACE=1: every protocol step and device job of both
#                   processes stamped on one clock (xfer-trace lines in ipc-trace.log)
#   host-loops      k3pd-xfer-bench --cpu-loops: memcpy, every hash and hash+copy loop, one thread
#   host            --manifest k3 --tokens 1024 --repeat 5 --tls shm (default loops: fused4 copy,
#                   pf hash); host-old: the loops before issue 17's fix (legacy copy, lib hash);
#                   host-hashlib / host-hash4: other receiver hash loops; host-copypf: fused4-pf
#   ipc-sender      --verify sender (two HBM passes, measurement mode)
#   ipc-nospin      K3PD_XFER_SPIN=0 (job completions seen through the notify only)
#   xdev-perf       k3k-gpu-xdev --perf (the kernels alone vs read and cudaMemcpy ceilings)
#   nsys            nsys profile of one cuda-ipc run (LOGDIR/ipc.nsys-rep + a CUDA API/GPU summary)
# Output: LOGDIR/<run>.log, a summary of RESULT lines in LOGDIR/summary.txt.
set -uo pipefail
bundle=${1:?usage: scripts/gpu/xfer-perf.sh BUNDLE LOGDIR [BUDGET_S]}
logdir=${2:?usage: scripts/gpu/xfer-perf.sh BUNDLE LOGDIR [BUDGET_S]}
budget=${3:-128}
profile=${4:-all}
mkdir -p "$logdir"
logdir=$(cd "$logdir" && pwd)
work=$(mktemp -d /tmp/k3pd-xperf.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -d "$bundle" ]; then k=$(cd "$bundle" && pwd); else k=$work/k; mkdir -p "$k"; tar -xJf "$bundle" -C "$k"; fi
B=$k/bin
[ -x "$B/k3pd-xfer-bench" ] || B=$k
export PATH=$B:$PATH:/usr/local/cuda/bin
export LD_LIBRARY_PATH=$k/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
# run NAME TIMEOUT CMD...: runs CMD if TIMEOUT still fits the budget, logs, keeps RESULT lines
run() {
  local name=$1 to=$2
  shift 2
  if [ "$(left)" -lt "$to" ]; then echo "skip $name: $(left) s left" | tee -a "$logdir/summary.txt"; return; fi
  local s; s=$(date +%s%N)
  timeout "$to" stdbuf -oL -eL "$@" > "$logdir/$name.log" 2>&1 # line-buffered: a killed run keeps its output
  local rc=$? e; e=$(date +%s%N)
  printf '%-14s rc=%d %5.1fs %s\n' "$name" $rc "$(awk -v a="$s" -v b="$e" 'BEGIN { print (b - a) / 1e9 }')" \
    "$(grep -E '^RESULT|^summary|^stream|^ceiling|^FAIL|^PASS check|passed, ' "$logdir/$name.log" | tr '\n' ' ')" | tee -a "$logdir/summary.txt"
}
{ nproc; lscpu | grep -E 'Model name|L3|NUMA node\(s\)'; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; \
  uptime; head -1 "$k/VERSION" 2>/dev/null; } > "$logdir/host.txt" 2>&1
HOST="--manifest k3 --tokens 1024 --repeat 5 --tls shm"
IPC="--device cuda --manifest k3 --tokens 8192 --path cuda-ipc --layout arena --repeat 5 --tls default"
if [ "$profile" = pull ]; then
  PULL="--device cuda --manifest k3 --tokens 8192 --layout arena --tls default"
  run parity 60 k3k-gpu-xdev
  # shellcheck disable=SC2086
  run pull 30 k3pd-xfer-bench $PULL --repeat 5 --stream 32 --inflight 4 --check
  # shellcheck disable=SC2086
  run push 30 k3pd-xfer-bench $PULL --path cuda-ipc --repeat 5 --stream 32 --inflight 4 --check
  # shellcheck disable=SC2086
  run pull-once 20 k3pd-xfer-bench $PULL --repeat 5 --baseline once
  # shellcheck disable=SC2086
  run push-once 20 k3pd-xfer-bench $PULL --path cuda-ipc --repeat 5 --baseline once
  # shellcheck disable=SC2086
  run pull-job160 20 env K3PD_XFER_PULL_JOB_MIB=160 k3pd-xfer-bench $PULL --repeat 5 --baseline once --stream 32 --inflight 4
  # shellcheck disable=SC2086
  run pull-job128 20 env K3PD_XFER_PULL_JOB_MIB=128 k3pd-xfer-bench $PULL --repeat 5 --baseline once --stream 32 --inflight 4
  # shellcheck disable=SC2086
  run pull-trace 20 env K3PD_XFER_TRACE=1 k3pd-xfer-bench $PULL --repeat 3 --baseline once
  # shellcheck disable=SC2086
  run pull-trace160 20 env K3PD_XFER_TRACE=1 K3PD_XFER_PULL_JOB_MIB=160 k3pd-xfer-bench $PULL --repeat 3 --baseline once
  # shellcheck disable=SC2086
  run pull-inflight1 20 k3pd-xfer-bench $PULL --repeat 1 --stream 16 --inflight 1
  # shellcheck disable=SC2086
  run pull-inflight2 20 k3pd-xfer-bench $PULL --repeat 1 --stream 32 --inflight 2
  # shellcheck disable=SC2086
  run pull-inflight8 25 k3pd-xfer-bench $PULL --repeat 1 --stream 32 --inflight 8
  # shellcheck disable=SC2086
  run pull-job96 20 env K3PD_XFER_PULL_JOB_MIB=96 k3pd-xfer-bench $PULL --repeat 5 --baseline once --stream 32 --inflight 4
  # shellcheck disable=SC2086
  run pull-sender 20 k3pd-xfer-bench $PULL --digests sender --repeat 5 --stream 16 --inflight 4
  # shellcheck disable=SC2086
  run pull-overlap 20 k3pd-xfer-bench $PULL --repeat 3 --layer-delay-us 1000
  echo "total $(($(date +%s) - t0)) s" | tee -a "$logdir/summary.txt"
  exit 0
fi
# shellcheck disable=SC2086
run ipc 30 k3pd-xfer-bench $IPC
# shellcheck disable=SC2086
run ipc-trace 30 env K3PD_XFER_TRACE=1 k3pd-xfer-bench $IPC
run host-loops 25 k3pd-xfer-bench --manifest k3 --tokens 1024 --cpu-loops
# shellcheck disable=SC2086
run host 25 k3pd-xfer-bench $HOST
# shellcheck disable=SC2086
run host-old 25 env K3PD_DIGEST_COPY=legacy K3PD_DIGEST_HASH=lib k3pd-xfer-bench $HOST
# shellcheck disable=SC2086
run host-hashlib 25 env K3PD_DIGEST_HASH=lib k3pd-xfer-bench $HOST
# shellcheck disable=SC2086
run host-hash4 25 env K3PD_DIGEST_HASH=fused4 k3pd-xfer-bench $HOST
# shellcheck disable=SC2086
run ipc-sender 30 k3pd-xfer-bench $IPC --verify sender
# shellcheck disable=SC2086
run ipc-nospin 30 env K3PD_XFER_SPIN=0 k3pd-xfer-bench $IPC
# shellcheck disable=SC2086
run host-copypf 25 env K3PD_DIGEST_COPY=fused4-pf k3pd-xfer-bench $HOST
run xdev-perf 40 k3k-gpu-xdev --perf
if command -v nsys > /dev/null; then
  # shellcheck disable=SC2086
  run nsys 45 nsys profile --trace=cuda --sample=none --cpuctxsw=none --force-overwrite true -o "$logdir/ipc" \
    k3pd-xfer-bench ${IPC/--repeat 5/--repeat 2}
  [ -f "$logdir/ipc.nsys-rep" ] && [ "$(left)" -gt 12 ] && \
    timeout 12 nsys stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_trace --format csv "$logdir/ipc.nsys-rep" \
      > "$logdir/nsys-stats.txt" 2>&1
fi
echo "total $(($(date +%s) - t0)) s" | tee -a "$logdir/summary.txt"
