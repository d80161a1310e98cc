#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, writes the tiny K3 checkpoint (weights +
# tokenizer), starts a local cluster (router + 1 prefill + 1 decode worker on loopback), sends a
# real chat request through it with k3pd-cli, prints the streamed text and a timing summary,
# checks the tokens equal the monolithic k3pd-generate run, and shuts the cluster down cleanly.
# The tiny model has random weights: the text is not meant to make sense, the plumbing is.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DK3PD_CUDA=OFF >/dev/null
cmake --build build -j"$(nproc)"
out=${K3PD_DEMO_DIR:-build/demo}
mkdir -p "$out"
model="$out/tiny-k3"
./build/tools/mkckpt/k3pd-mkckpt --preset tiny --out "$model" --seed 1 >"$out/mkckpt.log"
echo "== checkpoint: $model ($(grep -E '^(params|fingerprint)' "$out/mkckpt.log" | tr -s ' ' | paste -sd';' -))"

ready="$out/ready"
rm -f "$ready"
./build/tools/cli/k3pd-cli up --model "$model" --prefill 1 --decode 1 --port 0 --ready-file "$ready" \
  2>"$out/cluster.log" &
up_pid=$!
cleanup() { kill -INT "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  [ -s "$ready" ] && break
  kill -0 "$up_pid" 2>/dev/null || { echo "cluster failed to start:"; cat "$out/cluster.log"; exit 1; }
  sleep 0.1
done
[ -s "$ready" ] || { echo "cluster did not become ready in 60 s:"; cat "$out/cluster.log"; exit 1; }
router=$(cat "$ready")
echo "== cluster ready: router at $router (1 prefill + 1 decode worker; logs: $out/cluster.log)"
echo "== request: user says \"Hello! Tell me about Kimi.\" (greedy, 32 new tokens)"
echo "-- streamed reply:"
./build/tools/cli/k3pd-cli generate --router "$router" --user "Hello! Tell me about Kimi." --max-new-tokens 32 2>&1 \
  | tee "$out/reply.txt"
ids=$(grep '^ids:' "$out/reply.txt" | tail -1)
prompt=$(./build/tools/cli/k3pd-cli render --model "$model" --chat <(echo '[{"role":"user","content":"Hello! Tell me about Kimi."}]') | tr ' ' ',')
mono=$(./build/tools/generate/k3pd-generate --model "$model" --prompt-ids "$prompt" --max-new-tokens 32 \
  --backend cpu-fast 2>/dev/null | grep '^ids:' | tail -1)
if [ "$ids" = "$mono" ]; then
  echo "== disaggregated tokens equal the monolithic k3pd-generate run"
else
  echo "== MISMATCH: cluster $ids vs monolithic $mono"
  exit 1
fi
cleanup
trap - EXIT
echo "== cluster stopped cleanly"
