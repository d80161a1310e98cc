#!/usr/bin/env bash
# Prefix-cache figures (docs/perf-cluster.md "Prefix cache"): the issue-21 workloads through a
# local cluster (scripts/bench/run.sh: router + 1 prefill + 1 decode), each with the cache on
# (the default) and off (the router's --prefix-cache off: no prompt reaches a decode worker's
# cache), then checks that both runs produced the same tokens for every request (--ids-out).
#   (a) chats: --conversations C x --chat-turns 8, C at a time; the first turn is a
#       --chat-system-token system prompt (the same in every conversation: one application) and
#       a message, every message --chat-msg tokens, replies --chat-out tokens
#   (b) --users users sharing a --system-len-token system prompt plus their own 16..64 tokens
#   (c) agents: --agents conversations x --agent-turns turns whose every new message is a long
#       tool transcript (--agent-msg tokens, above the decode worker's local-prefill threshold),
#       so each later turn is a long-suffix hit: the prefill worker receives the cached state
#       and computes only the new part (docs/design.md "Long-suffix hits")
#
# usage: scripts/bench/prefix_cache.sh [--build DIR] [--out DIR] [--worker-args STR]
#          [--conversations C] [--chat-system N] [--chat-msg SPEC] [--chat-out N] [--users U] [--system-len N]
#          [--agents C] [--agent-turns T] [--agent-msg SPEC] [--concurrency N] [--only chat|shared|agent]
# Prints the k3pd-bench tables; exit 1 when the tokens differ or a run failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build out= wargs="--backend cpu-fast --threads 1" conv=4 chat_sys=1024 chat_msg=32..96 chat_out=32 users=64
system_len=2048 conc=4 only= agents=4 agent_turns=4 agent_msg=512..768
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --worker-args) wargs=$2; shift 2 ;;
    --conversations) conv=$2; shift 2 ;;
    --chat-msg) chat_msg=$2; shift 2 ;;
    --chat-system) chat_sys=$2; shift 2 ;;
    --chat-out) chat_out=$2; shift 2 ;;
    --users) users=$2; shift 2 ;;
    --system-len) system_len=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --agents) agents=$2; shift 2 ;;
    --agent-turns) agent_turns=$2; shift 2 ;;
    --agent-msg) agent_msg=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "prefix_cache.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/k3pd-prefix.XXXXXX)
mkdir -p "$out"
run=("$root/scripts/bench/run.sh" --build "$build" --worker-args "$wargs")
rc=0
for cache in on off; do
  if [ -z "$only" ] || [ "$only" = chat ]; then
    "${run[@]}" --router-args "--prefix-cache $cache" --logs "$out/chat-$cache-logs" -- \
      --label "chat-cache-$cache" --chat-turns 8 --conversations "$conv" --concurrency "$conc" \
      --shared-prefix-len "$chat_sys" \
      --prompt-len "$chat_msg" --output-len "$chat_out" --timeout-ms 600000 \
      --ids-out "$out/chat-$cache.ids" --json "$out/results.jsonl" | tee "$out/chat-$cache.txt" || rc=1
  fi
  if [ -z "$only" ] || [ "$only" = agent ]; then
    "${run[@]}" --router-args "--prefix-cache $cache" --logs "$out/agent-$cache-logs" -- \
      --label "agent-cache-$cache" --chat-turns "$agent_turns" --conversations "$agents" --concurrency "$conc" \
      --shared-prefix-len "$chat_sys" \
      --prompt-len "$agent_msg" --output-len "$chat_out" --timeout-ms 600000 \
      --ids-out "$out/agent-$cache.ids" --json "$out/results.jsonl" | tee "$out/agent-$cache.txt" || rc=1
  fi
  if [ -z "$only" ] || [ "$only" = shared ]; then
    "${run[@]}" --router-args "--prefix-cache $cache" --logs "$out/shared-$cache-logs" -- \
      --label "shared-cache-$cache" --requests "$users" --concurrency "$conc" --shared-prefix-len "$system_len" \
      --prompt-len 16..64 --output-len 16 --timeout-ms 600000 \
      --ids-out "$out/shared-$cache.ids" --json "$out/results.jsonl" | tee "$out/shared-$cache.txt" || rc=1
  fi
done
for w in chat agent shared; do
  [ -f "$out/$w-on.ids" ] || continue
  if cmp -s <(sort "$out/$w-on.ids") <(sort "$out/$w-off.ids"); then
    echo "$w: $(wc -l < "$out/$w-on.ids") requests, tokens identical with the cache on and off"
  else
    echo "$w: TOKENS DIFFER between cache on and off"
    rc=1
  fi
done
echo "results in $out"
exit $rc
