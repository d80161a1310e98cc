#!/usr/bin/env bash
# plan_scale: k3pd-plan at the scale operators plan for. Evaluates 100 prefill + 100 decode
# workers at 2000 req/s for 180 simulated seconds (~360k requests), then searches the smallest
# counts for p99 targets at that traffic. Prints the wall times (the ctest log keeps them); the
# verdict is on the answers only (every request served; a search answer found), never on speed.
# usage: test_scale.sh K3PD_PLAN PROFILE
set -euo pipefail
plan=$1 profile=$2
out=$(mktemp -d /tmp/plan-scale.XXXXXX)
trap 'rm -rf "$out"' EXIT
common=(--profile "$profile" --rate 2000 --prompt-len 256..1024 --output-len 32..256 --duration 180)
"$plan" "${common[@]}" --prefill 100 --decode 100 --json "$out/fixed.json" | tee "$out/fixed.txt"
grep -q "rejected" "$out/fixed.txt"
python3 - "$out/fixed.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["answer"]
assert a["measured"] > 300000, a["measured"]
assert a["completed"] == a["measured"], (a["completed"], a["measured"])
print("plan_scale: fixed 200 workers: %d requests, wall %.2f s" % (a["measured"], json.load(open(sys.argv[1]))["wall_s"]))
PY
"$plan" "${common[@]}" --ttft-p99-ms 200 --itl-p99-ms 25 --json "$out/search.json" | tee "$out/search.txt"
grep -q "smallest cluster meeting the targets" "$out/search.txt"
python3 - "$out/search.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); a = j["answer"]
assert a["ttft_ms"]["p99"] <= 200 and a["itl_ms"]["p99"] <= 25, a
print("plan_scale: search answer %d:%d, wall %.2f s" % (a["prefill"], a["decode"], j["wall_s"]))
PY
