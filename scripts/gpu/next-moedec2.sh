#!/usr/bin/env bash
# Validation and timing of the MXFP4 decode variants 3-8 of kernels/cuda/mxfp4_dec.cu (per-warp
# cp.async ring, PDL), prepared without a device in session 5 (docs/perf-gpu-moe.md, "Session 5
# ... prepared, not measured"). One device call, at most ~150 s.
#
#   scripts/gpu/next-moedec2.sh BIN LOGDIR
#
# BIN: the directory holding k3k-gpu-moe built from this branch (cmake -S . -B build-gpu
#      -DK3PD_CUDA=ON -DK3PD_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release; cmake --build build-gpu
#      --target k3k-gpu-moe), e.g. build-gpu/tests/gpu or a carried copy.
# Steps:
#   1. parity, K3PD_CUDA_SYNC=1: only the decode-variant cases (--dec-variants-only) for variants
#      0 and 3-8: each re-runs the 7 decode cases against the CPU reference, and variants 3-8 are
#      also compared bit for bit with variant 0 (7 MXFP4_GEMM op cases incl. unaligned scale
#      rows, 3 whole MoE blocks incl. the PDL pass route/plan → gate/up → down → combine).
#   2. perf, E = 896 top-16 real shapes at T = 1 and 16: the default table, then each variant of
#      K3PD_MXDEC_PERF on the same data in the same process (gate/up, down, both, whole block,
#      whole block back-to-back); 10x: the same kernel without the math (streaming only).
#      K3PD_LOG_LEVEL=debug prints each ring kernel's blocks per SM at its first launch.
# Logs: LOGDIR/parity-dec.log, LOGDIR/perf-dec.log. Exit status 0 when parity passed and perf ran.
set -uo pipefail
bin=${1:?usage: scripts/gpu/next-moedec2.sh BIN LOGDIR}
logdir=${2:?usage: scripts/gpu/next-moedec2.sh BIN LOGDIR}
exe=$bin/k3k-gpu-moe
[ -x "$exe" ] || { echo "no executable $exe" >&2; exit 1; }
mkdir -p "$logdir"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
status=0
t0=$(date +%s)
K3PD_CUDA_SYNC=1 K3PD_MXDEC_TEST=0,3,4,5,6,7,8 timeout 90 "$exe" --dec-variants-only \
  > "$logdir/parity-dec.log" 2>&1 || status=1
grep -E "^FAIL|first difference" "$logdir/parity-dec.log" | head -40
tail -1 "$logdir/parity-dec.log"
t1=$(date +%s)
K3PD_LOG_LEVEL=debug K3PD_MXDEC_PERF=0,3,4,5,6,7,8,100,103,106 timeout 55 "$exe" --no-parity \
  --perf-t 1,16 > "$logdir/perf-dec.log" 2>&1 || status=1
grep -E "^PERF|ring kernel|FAIL" "$logdir/perf-dec.log"
t2=$(date +%s)
echo "parity $((t1 - t0)) s, perf $((t2 - t1)) s, exit $status"
exit $status
