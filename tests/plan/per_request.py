#!/usr/bin/env python3
"""Request-by-request comparison of a validate.py run: k3pd-bench --requests-out (req-TAG.jsonl)
against k3pd-plan --requests-out (plan-req-TAG.jsonl), joined by request index (the same
workload: the same request at the same offset in both).

Per cell: requests joined; TTFT median of measured / predicted and of their ratio; the ratio by
prompt-length quartile (a cost shape that is wrong shows as a trend); the ratio at the measured
TTFT's top decile (what the tail adds beyond the prediction); end-to-end likewise.

usage: tests/plan/per_request.py OUT_DIR [TAG_SUBSTRING]
"""
import glob
import json
import os
import statistics as st
import sys


def load(path):
    return {r["index"]: r for r in (json.loads(x) for x in open(path) if x.strip())}


def med(v):
    return st.median(v) if v else float("nan")


def main():
    out = sys.argv[1]
    want = sys.argv[2] if len(sys.argv) > 2 else ""
    print("cell | n | TTFT meas/pred med | ratio med | ratio by prompt quartile | ratio top-10% meas | e2e ratio med")
    for bf in sorted(glob.glob(os.path.join(out, "req-*.jsonl"))):
        tag = os.path.basename(bf)[4:-6]
        pf = os.path.join(out, f"plan-req-{tag}.jsonl")
        if want not in tag or not os.path.exists(pf):
            continue
        b, p = load(bf), load(pf)
        rows = [(b[i], p[i]) for i in b if i in p and b[i]["ok"] and p[i]["ok"] and b[i]["ttft_ms"] > 0]
        if not rows:
            continue
        ratio = [q["ttft_ms"] / m["ttft_ms"] for m, q in rows]
        byp = sorted(rows, key=lambda r: r[0]["prompt"])
        k = len(byp) // 4 or 1
        quart = [med([q["ttft_ms"] / m["ttft_ms"] for m, q in byp[i * k:(i + 1) * k]]) for i in range(4)]
        bym = sorted(rows, key=lambda r: r[0]["ttft_ms"])
        top = bym[int(len(bym) * 0.9):]
        e2e = [q["e2e_ms"] / m["e2e_ms"] for m, q in rows if m["e2e_ms"] > 0]
        print(f"{tag} | {len(rows)} | {med([m['ttft_ms'] for m, _ in rows]):.1f}/{med([q['ttft_ms'] for _, q in rows]):.1f}"
              f" | {med(ratio):.2f} | {' '.join(f'{x:.2f}' for x in quart)} | "
              f"{med([q['ttft_ms'] / m['ttft_ms'] for m, q in top]):.2f} | {med(e2e):.2f}")


if __name__ == "__main__":
    sys.exit(main())
