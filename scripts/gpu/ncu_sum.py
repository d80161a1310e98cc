#!/usr/bin/env python3
"""Per-kernel time table of a `k3k-gpu-model --perf --profile` run under ncu.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
        k3k-gpu-model ... --perf --profile > prof.csv
    scripts/gpu/ncu_sum.py prof.csv [--top N] [--grid]

The program opens each profiled region (prefill, decode batch 1, decode batch B) with a
one-element fill_random launch; this script splits the kernel list at those markers and prints,
per region, the kernels grouped by name: count, total time, share of the region. ncu serialises
kernels and times each alone, so the region total is the sum of kernel times without launch gaps
or overlap (the graph replay's step time minus this sum is roughly the gap/overhead share).
--grid keys the table by kernel name and grid size (tells the GEMM shapes apart).
"""
import csv
import re
import sys
from collections import OrderedDict

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
        "second": 1e6, "s": 1e6}
REGIONS = ["prefill", "decode batch 1", "decode batch B"]


def short(name):
    """Kernel name without template arguments and parameter list."""
    name = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    return name.split(" ")[-1] or name


def read(path, grid):
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's log lines start with ==PROF==
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        val = float(r["Metric Value"].replace(",", ""))
        name = short(r["Kernel Name"])
        if grid and "fill_random" not in name:
            name += " " + r.get("Grid Size", "").replace(" ", "")
        rows.append((name, val * UNIT.get(r["Metric Unit"], 1.0)))
    return rows


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    rows = read(sys.argv[1], "--grid" in sys.argv)
    regions, cur = [], None
    for name, us in rows:
        if "fill_random" in name:
            cur = []
            regions.append(cur)
            continue
        if cur is not None:
            cur.append((name, us))
    if not regions:
        sys.exit("ncu_sum: no region markers (fill_random launches) in %s" % sys.argv[1])
    for i, reg in enumerate(regions):
        title = REGIONS[i] if i < len(REGIONS) else "region %d" % i
        total = sum(us for _, us in reg)
        agg = OrderedDict()
        for name, us in reg:
            c, t = agg.get(name, (0, 0.0))
            agg[name] = (c + 1, t + us)
        print("== %s: %d kernels, %.1f us of kernel time" % (title, len(reg), total))
        print("%-60s %6s %11s %6s %9s" % ("kernel", "count", "total us", "share", "us each"))
        for name, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
            print("%-60s %6d %11.1f %5.1f%% %9.1f" % (name[:60], c, t, 100 * t / total, t / c))
        print()


if __name__ == "__main__":
    main()
