#!/usr/bin/env bash
# A router without a tokenizer (--synthetic PRESET: the config only, as GPU clusters on synthetic
# real-vocabulary models run it): token-id requests are served and equal k3pd-generate
# teacher-forced on them (k3pd-bench --ids-out + k3pd-generate --requests); a chat request is
# refused with INVALID_ARGUMENT naming the field; every process stops with status 0.
# usage: test_tokenonly.sh BUILD_DIR WORK_DIR
set -uo pipefail
build=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
pids=()
fail() { echo "test_tokenonly: $*" >&2; for f in "$work"/*.log; do echo "--- $f" >&2; tail -n 5 "$f" >&2; done; kill -KILL "${pids[@]}" 2>/dev/null; exit 1; }
"$build/router/k3pd-router" --synthetic tiny --listen 127.0.0.1:0 --port-file "$work/port" --cluster-port-file \
  "$work/cport" --tls-dev-dir "$work/tls" --drain-grace-ms 1000 > "$work/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || fail "the router did not start"
r=127.0.0.1:$(cat "$work/port")
# workers register on the cluster port (mutual TLS, development CA; default worker ids)
w=(--synthetic tiny --backend cpu-fast --router "127.0.0.1:$(cat "$work/cport")" --tls-dev-dir "$work/tls"
   --drain-grace-ms 1000)
"$build/prefill_worker/k3pd-prefill" "${w[@]}" > "$work/prefill.log" 2>&1 &
pids+=($!)
"$build/decode_worker/k3pd-decode" "${w[@]}" > "$work/decode.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do
  [ "$(cat "$work"/prefill.log "$work"/decode.log | grep -c 'registered with router')" = 2 ] && break
  sleep 0.05
done
grep -q "serving token-id requests only" "$work/router.log" || fail "the router did not say it is token-only"
"$build/tools/bench/k3pd-bench" --router "$r" --requests 4 --concurrency 2 --prompt-len 3..40 --output-len 4..9 \
  --id-max 4000 --ids-out "$work/ids.txt" > "$work/bench.log" 2>&1 || fail "k3pd-bench failed"
"$build/tools/generate/k3pd-generate" --synthetic tiny --backend cpu-fast --requests "$work/ids.txt" \
  > "$work/teacher.txt" 2> "$work/teacher.log" || fail "k3pd-generate --requests failed"
grep -q "^requests: 4 teacher_forced 4 first_tokens_equal 4/4 divergences 0 " "$work/teacher.txt" \
  || fail "the cluster's tokens differ from k3pd-generate: $(tail -1 "$work/teacher.txt")"
out=$("$build/tools/cli/k3pd-cli" generate --router "$r" --user "hello" 2>&1)
echo "$out" | grep -q "INVALID_ARGUMENT: chat.messages: this router has no tokenizer" || fail "chat request: $out"
kill -TERM "${pids[@]}"
for p in "${pids[@]}"; do wait "$p" || fail "process $p exited with $?"; done
echo "test_tokenonly: ok"
