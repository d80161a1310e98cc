#!/usr/bin/env bash
# ctest driver for k3pd-bench against a real local cluster (scripts/bench/run.sh).
# usage: test_bench.sh SOURCE_DIR BUILD_DIR WORK_DIR MODE
#   greedy    8 requests, concurrency 4, mixed lengths, 1 warm-up: every greedy stream must equal
#             k3pd-generate's, and the JSON line must report 8 ok, no errors, real latencies
#   sampled   open loop (Poisson) with seeded top-k/top-p sampling: the streams must still equal
#             k3pd-generate's for the same seeds, and teacher-forced on them (--ids-out +
#             k3pd-generate --requests) every step agrees
#   prefix    chats and a shared system prompt with the prefix cache on and off: identical tokens,
#             hits only with it on
#   mismatch  the replay uses a checkpoint with different weights: k3pd-bench must exit 1 and
#             say "verification FAILED" (the check can fail)
set -euo pipefail
src=$1 build=$2 work=$3 mode=$4
rm -rf "$work"
mkdir -p "$work"
run=("$src/scripts/bench/run.sh" --build "$build" --logs "$work/logs")
json=$work/bench.json
fail() { echo "test_bench($mode): $*" >&2; for f in "$work"/logs/*.log; do echo "--- $f" >&2; tail -n 5 "$f" >&2; done; exit 1; }

case $mode in
  greedy)
    "${run[@]}" --prefill 1 --decode 1 --verify -- --requests 8 --concurrency 4 --warmup 1 \
      --prompt-len 1..12 --output-len 2..6 --json "$json" --label ctest-greedy || fail "k3pd-bench exited $?"
    python3 - "$json" <<'EOF' || fail "JSON line check failed"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r["tool"] == "k3pd-bench" and r["label"] == "ctest-greedy", r
assert r["sent"] == 8 and r["ok"] == 8 and r["errors"] == {}, r
assert r["config"]["greedy"] is True and r["config"]["concurrency"] == 4
for k in ("ttft_ms", "e2e_ms", "itl_ms", "router_overhead_us", "prefill_us"):
    s = r[k]
    assert s["n"] > 0 and s["p50"] is not None and s["p50"] <= s["p90"] <= s["p99"] <= s["max"], (k, s)
assert r["ttft_ms"]["p50"] > 0 and r["ttft_ms"]["p50"] <= r["e2e_ms"]["p50"] * 1.0001
assert r["output_tokens"] >= 8 * 2 and r["output_tokens_per_s"] > 0 and r["requests_per_s"] > 0
m = r["monolithic"]
assert m["runs"] == 8 and m["failures"] == 0 and m["verified"] == 8 and m["mismatches"] == 0, m
assert m["prefill_tokens_per_s"] > 0 and m["decode_tokens_per_s"] > 0, m
print("test_bench(greedy): JSON ok:", r["ok"], "requests, ttft p50 %.1f ms" % r["ttft_ms"]["p50"])
EOF
    ;;
  sampled)
    "${run[@]}" --verify -- --requests 4 --rate 20 --prompt-len 3..16 --output-len 5 \
      --temperature 0.9 --top-k 40 --top-p 0.95 --sample-seed 77 --ids-out "$work/ids.txt" \
      || fail "k3pd-bench exited $?"
    # the cluster's streams as teachers of k3pd-generate --requests (what scripts/gpu/cluster.sh
    # does on a GPU): on the CPU backend every step agrees
    [ "$(wc -l < "$work/ids.txt")" = 4 ] || fail "--ids-out wrote $(wc -l < "$work/ids.txt") lines, not 4"
    "$build/tools/generate/k3pd-generate" --model "$work/logs/ckpt-tiny" --requests "$work/ids.txt" \
      --temperature 0.9 --top-k 40 --top-p 0.95 > "$work/teacher.txt" 2>"$work/teacher.err" \
      || { cat "$work/teacher.err" >&2; fail "k3pd-generate --requests exited $?"; }
    grep -q "^requests: 4 teacher_forced 4 first_tokens_equal 4/4 divergences 0 " "$work/teacher.txt" \
      || { cat "$work/teacher.txt" >&2; fail "teacher-forced replay disagrees"; }
    ;;
  mismatch)
    "$build/tools/mkckpt/k3pd-mkckpt" --preset tiny --out "$work/other" --seed 2 >/dev/null
    set +e
    # The later --model wins: the cluster runs the seed-1 checkpoint, the replay the seed-2 one.
    "${run[@]}" --verify -- --requests 2 --concurrency 2 --prompt-len 8 --output-len 6 \
      --model "$work/other" 2>"$work/stderr"
    rc=$?
    set -e
    cat "$work/stderr" >&2
    [ $rc = 1 ] || fail "expected exit 1 on a mismatch, got $rc"
    grep -q "verification FAILED" "$work/stderr" || fail "no 'verification FAILED' message"
    ;;
  prefix)
    # Prefix-cache workloads, cache on (the default) and off (--prefix-cache off on the router:
    # no prompt reaches the decode worker's cache): every request's tokens must be identical
    # (--ids-out holds each sent prompt and its tokens), and with the cache on later chat turns
    # and the users after the first must reuse cached prefixes.
    for cache in on off; do
      "${run[@]}" --decode 1 --router-args "--prefix-cache $cache" --logs "$work/logs-$cache" -- \
        --chat-turns 3 --conversations 3 --concurrency 3 --prompt-len 20..60 --output-len 8 \
        --ids-out "$work/chat-$cache.txt" > "$work/chat-$cache.out" || fail "chat ($cache) exited $?"
      "${run[@]}" --decode 1 --router-args "--prefix-cache $cache" --logs "$work/logs2-$cache" -- \
        --requests 6 --concurrency 1 --shared-prefix-len 150 --prompt-len 5..20 --output-len 4 \
        --ids-out "$work/shared-$cache.txt" > "$work/shared-$cache.out" || fail "shared ($cache) exited $?"
    done
    cat "$work/chat-on.out" "$work/shared-on.out"
    for w in chat shared; do
      [ "$(wc -l < "$work/$w-on.txt")" -gt 0 ] || fail "$w: no requests completed"
      cmp -s <(sort "$work/$w-on.txt") <(sort "$work/$w-off.txt") || fail "$w: cache on and off differ"
    done
    grep -q "prefix cache: 0 of" "$work/chat-on.out" && fail "chat: no cache hit with the cache on"
    grep -q "prefix cache: 5 of 6 requests hit" "$work/shared-on.out" || fail "shared: not every later user hit"
    grep -q "prefix cache: 0 of" "$work/chat-off.out" || fail "chat: hits reported with the cache off"
    ;;
  *) echo "test_bench: unknown mode $mode" >&2; exit 2 ;;
esac
echo "test_bench($mode): ok"
