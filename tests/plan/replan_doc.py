#!/usr/bin/env python3
"""Re-predicts the measured cells recorded in docs/perf-cluster.md ("Appendix: planner vs
measurement history", session 9)
with the current k3pd-plan and the recorded profiles (tools/plan/testdata/cpu-PRESET.json).

This is an offline re-evaluation on the SAME data the model changes were studied on, not a
fresh validation: it shows what a model change does to the recorded comparison. It writes the
recorded measurements as k3pd-bench JSON (the fields validate.py reads) and runs
tests/plan/validate.py --replan on them.

usage: tests/plan/replan_doc.py [--build build] [--out DIR] [-- extra validate.py flags]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# how each recorded table was measured (docs/perf-cluster.md): seconds of arrivals per cell
RUNS = {"tiny": 20, "tiny-48b": 15}
CELL = re.compile(r"^\| (tiny(?:-48b)?) \| (\dx\d) \| ([\d.]+) \| (\d+)/(\d+) \|(.*)\|\s*$")


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    build = args[args.index("--build") + 1] if "--build" in args else os.path.join(ROOT, "build")
    out = args[args.index("--out") + 1] if "--out" in args else tempfile.mkdtemp(prefix="k3pd-replan-doc.")
    doc = open(os.path.join(ROOT, "docs", "perf-cluster.md")).read()
    sec = doc[doc.index("### Session 9 (2026-12-02): one profile per model"):]
    sec = sec[:sec.index("A re-run of tiny")]  # the two recorded tables only
    cells = {}
    for line in sec.splitlines():
        m = CELL.match(line)
        if not m:
            continue
        preset, cfg, rate, ok, sent, rest = m.groups()
        meas = [float(c.strip().split(" / ")[0]) for c in rest.split("|")]
        cells.setdefault(preset, []).append((cfg, rate, int(ok), int(sent), meas))
    rc = 0
    for preset, rows in cells.items():
        d = os.path.join(out, preset)
        os.makedirs(d, exist_ok=True)
        prof = os.path.join(d, f"profile-{preset}.json")
        with open(os.path.join(ROOT, "tools", "plan", "testdata", f"cpu-{preset}.json")) as f:
            open(prof, "w").write(f.read())
        for cfg, rate, ok, sent, (t50, t99, i50, i99) in rows:
            b = {"ok": ok, "sent": sent, "ttft_ms": {"p50": t50, "p99": t99}, "itl_ms": {"p50": i50, "p99": i99}}
            json.dump(b, open(os.path.join(d, f"bench-{preset}-{cfg}-r{rate}.json"), "w"))
        cfgs = ",".join(dict.fromkeys(r[0] for r in rows))
        rates = ",".join(dict.fromkeys(r[1] for r in rows))
        rc |= subprocess.call([sys.executable, os.path.join(ROOT, "tests", "plan", "validate.py"), "--replan",
                               "--build", build, "--out", d, "--presets", preset, "--configs", cfgs, "--rates",
                               rates, "--prompt-len", "16..64", "--output-len", "8..32", "--duration",
                               str(RUNS[preset]), "--host-cores", "0"] + extra)
    return rc


if __name__ == "__main__":
    sys.exit(main())
