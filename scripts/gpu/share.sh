#!/usr/bin/env bash
# Shared weights on one GPU (--share-weights DIR, docs/gpu-cluster.md §4). First, when BIN has
# it, k3k-gpu-vmm (tests/gpu/gpu_vmm.c: VMM in one process, the VMM state arena). Then end to
# end with k3pd-generate on the real-shape 4-layer config (tests/gpu/data/k3-medium-4l16e.json,
# bf16, weights generated on the GPU):
#   a. A generates the weights into a VMM allocation, serves them, generates ids, and stays up
#      (--hold: the process lives until its stdin closes; each line generates again);
#   b. B, same flags: imports A's weights read-only (its log says "imported", and it never says
#      "generated on the device"), generates the SAME ids;
#   c. A is killed with SIGKILL while B holds the weights: B generates again, same ids; C, a
#      fresh process, imports from the survivor B (A's dead socket is removed), same ids;
#   d. D asks for --seed-weights 2: refused (exit 1) with a message naming both identities;
#   e. device memory (nvidia-smi memory.used) before, after A, after A+B: B must add only its
#      own pools, workspace and CUDA context, less than half of the weights.
# Finally B exits and no socket is left in DIR.
#
#   scripts/gpu/share.sh BIN LOGDIR
#
# BIN holds k3pd-generate (built with -DK3PD_CUDA=ON, e.g. -DK3PD_KERNELS_ONLY=ON), optionally
# k3k-gpu-vmm, and, when the host lacks them, libjansson.so.4 and libxxhash.so.0.
# GPU: $GPU (default 0).
# Run it alone on the GPU (the memory figures read the whole device). Takes about a minute.
# Output: one PASS/FAIL line per check, the memory figures, and "share: N passed, M failed".
# Logs: LOGDIR/vmm.log, LOGDIR/{a,b,c,d}.{out,err}. Exit status 0 when every check passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?usage: scripts/gpu/share.sh BIN LOGDIR}" && pwd)
logdir=${2:?usage: scripts/gpu/share.sh BIN LOGDIR}
mkdir -p "$logdir"
logdir=$(cd "$logdir" && pwd)
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
gpu=${GPU:-0}
cfg=$root/tests/gpu/data/k3-medium-4l16e.json
dir=$(mktemp -d /tmp/k3share.XXXXXX) # 0700, private to this user
gen=("$bin/k3pd-generate" --synthetic-config "$cfg" --device cuda --gpu "$gpu" --share-weights "$dir"
     --share-wait-ms 120000 --prompt-ids "$(seq -s, 1000 1063)" --max-new-tokens 16 --ignore-eos)
pass=0 failed=0 pa="" pb=""
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu" | tr -d ' '; }
nids() { grep -c '^ids:' "$1" 2>/dev/null || true; }
ids() { grep '^ids:' "$1" | sed -n "${2}p"; }
# wait_ids FILE N SECONDS [PID]: until FILE has N "ids:" lines (fails early when PID exits)
wait_ids() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    [ "$(nids "$1")" -ge "$2" ] && return 0
    [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && return 1
    sleep 0.1
  done
  return 1
}
cleanup() {
  exec 7>&- 8>&- 2>/dev/null
  [ -n "$pa" ] && kill -9 "$pa" 2>/dev/null
  [ -n "$pb" ] && kill -9 "$pb" 2>/dev/null
  rm -rf "$dir" "$logdir/a.in" "$logdir/b.in"
}
trap cleanup EXIT
rm -f "$logdir/a.in" "$logdir/b.in"
mkfifo "$logdir/a.in" "$logdir/b.in"

# 0. in one process first (when BIN has it): VMM alloc/export/import, a VMM state arena, shared
#    weights between two runners (tests/gpu/gpu_vmm.c)
if [ -x "$bin/k3k-gpu-vmm" ]; then
  K3PD_CUDA_DEVICE=$gpu timeout 300 "$bin/k3k-gpu-vmm" > "$logdir/vmm.log" 2>&1
  st=$?
  grep -E "^(PASS|FAIL)" "$logdir/vmm.log" | sed 's/^/  k3k-gpu-vmm /'
  check "k3k-gpu-vmm (exit $st)" test $st -eq 0
fi

m0=$(mem)
# a. A makes the weights and holds them
"${gen[@]}" --hold < "$logdir/a.in" > "$logdir/a.out" 2> "$logdir/a.err" &
pa=$!
exec 7> "$logdir/a.in"
check "A generated ids" wait_ids "$logdir/a.out" 1 120 "$pa"
check "A made the weights on the GPU and serves them" \
  grep -q "generated on the device" "$logdir/a.err"
grep -q "serving .* (made here)" "$logdir/a.err" || bad "A's log lacks 'serving ... (made here)'"
m1=$(mem)
wgib=$(sed -n 's/.*shared weights: serving \([0-9.]*\) GiB.*/\1/p' "$logdir/a.err" | head -1)

# b. B imports them
"${gen[@]}" --hold < "$logdir/b.in" > "$logdir/b.out" 2> "$logdir/b.err" &
pb=$!
exec 8> "$logdir/b.in"
check "B generated ids" wait_ids "$logdir/b.out" 1 120 "$pb"
m2=$(mem)
check "B imported the weights" grep -q "shared weights: imported" "$logdir/b.err"
check "B generated nothing" bash -c "! grep -q 'generated on the device' '$logdir/b.err'"
ida=$(ids "$logdir/a.out" 1)
check "A and B give the same ids ($ida)" test -n "$ida" -a "$ida" = "$(ids "$logdir/b.out" 1)"

# c. A dies; B keeps its mapping and generates again; C imports from B
kill -9 "$pa"
wait "$pa" 2>/dev/null
pa=""
exec 7>&-
echo again >&8
check "B generates after A's SIGKILL" wait_ids "$logdir/b.out" 2 60 "$pb"
check "B's ids unchanged after A's death" test "$ida" = "$(ids "$logdir/b.out" 2)"
timeout 120 "${gen[@]}" > "$logdir/c.out" 2> "$logdir/c.err"
check "C (fresh) ran" test $? -eq 0
check "C imported from the survivor" grep -q "shared weights: imported" "$logdir/c.err"
check "C removed A's dead socket" grep -q "removing the stale socket" "$logdir/c.err"
check "C gives the same ids" test "$ida" = "$(ids "$logdir/c.out" 1)"

# d. other weights in the same directory are refused, naming both identities
timeout 120 "${gen[@]}" --seed-weights 2 > "$logdir/d.out" 2> "$logdir/d.err"
check "D (--seed-weights 2) exits 1" test $? -eq 1
check "D's error names both identities" \
  bash -c "grep -q 'shares other weights' '$logdir/d.err' && grep -q 'seed=1' '$logdir/d.err' && grep -q 'seed=2' '$logdir/d.err'"
grep -m1 'shares other weights' "$logdir/d.err"

# B exits cleanly and takes its socket with it
exec 8>&-
wait "$pb"
check "B exited cleanly" test $? -eq 0
pb=""
check "no socket left in DIR" bash -c "! ls '$dir'/*.sock >/dev/null 2>&1"

# e. memory
echo "memory.used MiB: before $m0, after A $m1 (+$((m1 - m0))), after A+B $m2 (B added $((m2 - m1))); weights ${wgib:-?} GiB"
if [ -n "$wgib" ]; then
  wmib=$(awk -v g="$wgib" 'BEGIN { printf "%d", g * 1024 }')
  check "B added less than half the weights ($((m2 - m1)) MiB < $((wmib / 2)) MiB)" test $((m2 - m1)) -lt $((wmib / 2))
else
  bad "no weights size in A's log"
fi
echo "share: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
