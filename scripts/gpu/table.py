#!/usr/bin/env python3
"""Issue 19's table (docs/perf-gpu.md "Current figures") from one run of scripts/gpu/run.sh and
one of scripts/gpu/model.sh --medium.

    scripts/gpu/table.py RUNDIR [MODELDIR] [--check EXPECTED.md]

RUNDIR: run.sh's LOGDIR (perf.log from k3k-gpu-check --perf; moe-perf.log and moe-e256.log from
k3k-gpu-moe --perf). MODELDIR (default RUNDIR): model.sh's LOGDIR (medium.log, kl48b.log from
k3k-gpu-model --perf). Prints a markdown table: figure, now, floor, ratio (now / floor, as the
programs print it), goal, then the ceilings each program measured. A row whose log or line is
missing says "not measured" instead of a number. --check compares the output with a file and
exits 1 (printing both) when they differ: the ctest gpu_table_script runs it on fixture logs.
"""
import os
import re
import sys

# k3k-gpu-check and k3k-gpu-moe: "PERF <name> <t> us <GB/s> GB/s <TF> TFLOP/s  floor <f> us  x<r>"
OP = re.compile(r"^PERF (.+?)\s+([\d.]+) us\s+[\d.]+ GB/s\s+[\d.]+ TFLOP/s\s+floor\s+([\d.]+) us\s+x([\d.]+)")
PREFILL = re.compile(r"^PERF prefill (\d+) tokens \(one pass\): ([\d.]+) s = (\d+) tokens/s; FLOP floor "
                     r"([\d.]+) s .* = ([\d.]+)x")
DEC1 = re.compile(r"^PERF decode batch 1: eager [\d.]+ ms/step, graph ([\d.]+) ms/step .*weight-read "
                  r"floor ([\d.]+) ms .* graph ([\d.]+)x")
DECB = re.compile(r"^PERF decode batch (\d+): graph ([\d.]+) ms/step = (\d+) tokens/s .*floor ([\d.]+) ms "
                  r".* graph ([\d.]+)x floor")
# k3k-gpu-model's three lines: key, pattern, the type of each group
MODEL = (("prefill", PREFILL, (int, float, int, float, float)), ("dec1", DEC1, (float, float, float)),
         ("decb", DECB, (int, float, int, float, float)))
CEIL = re.compile(r"^(?:CEILING|PERF ceilings)[: ](.*)$")


def read(path):
    """The PERF and CEILING lines of a log: {"ops": {name: (t_us, floor_us, ratio)}, ...}."""
    out = {"ops": {}, "prefill": None, "dec1": None, "decb": None, "ceil": []}
    if not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = OP.match(line)
            if m:
                out["ops"].setdefault(m.group(1).strip(), (float(m.group(2)), float(m.group(3)), float(m.group(4))))
                continue
            for key, pat, types in MODEL:
                m = pat.match(line)
                if m:
                    out[key] = tuple(t(g) for t, g in zip(types, m.groups()))
                    break
            if m:
                continue
            m = CEIL.match(line)
            if m:
                out["ceil"].append(m.group(1).strip())
    return out


def us(v):
    return f"{v / 1000:.2f} ms" if v >= 10000 else f"{v:.1f} µs"


def sec(v):
    return f"{v:.3f} s" if v >= 1 else f"{v * 1000:.1f} ms"


def op(log, *names):
    """(now, floor, ratio) strings for one or more op rows joined by " / "."""
    got = [log["ops"].get(n) if log else None for n in names]
    if any(g is None for g in got):
        return None
    return (" / ".join(us(g[0]) for g in got), " / ".join(us(g[1]) for g in got),
            " / ".join(f"{g[2]:.2f}x" for g in got))


def main(argv):
    check = None
    if "--check" in argv:
        i = argv.index("--check")
        check = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if not argv:
        sys.exit(__doc__)
    run, model = argv[0], argv[1] if len(argv) > 1 else argv[0]
    perf = read(os.path.join(run, "perf.log"))
    moe = read(os.path.join(run, "moe-perf.log"))
    moe256 = read(os.path.join(run, "moe-e256.log"))
    med = read(os.path.join(model, "medium.log"))
    kl = read(os.path.join(model, "kl48b.log"))
    rows = []

    def add(figure, cells, goal=""):
        if cells is None:
            rows.append(f"| {figure} | not measured | | | {goal} |")
        else:
            rows.append(f"| {figure} | {cells[0]} | {cells[1]} | {cells[2]} | {goal} |")

    add("MLA absorbed decode, batch 64 x 8K context (incl. absorption) / attention kernel alone",
        op(perf, "mla_decode B=64 ctx=8192 (incl. absorption)", "mla_decode attention kernel alone"), "<= 1.20x")
    add("KDA chunked prefill, 8K tokens x 96 heads, 1 seq / 8 seqs",
        op(perf, "kda_chunk T=8192 NH=96 seqs=1", "kda_chunk T=8192 NH=96 seqs=8"), "<= 1.8x")
    add("conv prefill, T = 8192, C = 12288, 4 seqs: op / trusted ids",
        op(perf, "conv_prefill T=8192 C=12288 (4 seqs)", "conv_prefill same, trusted ids (no check/sync)"),
        "<= 1.3x")
    add("KDA fused decode step, batch 64 x 96 heads", op(perf, "kda_fused_decode B=64 NH=96"))
    add("MLA prefill, 8K tokens causal, 96 heads", op(perf, "mla_prefill T=8192 causal NH=96"))
    add("MoE block decode T = 1, E = 896 (router .. combine) / expert GEMMs",
        op(moe, "moe block T=1 (router..combine)", "moe expert GEMMs T=1 (gate/up+SiTU, down)"), "<= 1.3x")
    add("MoE block decode T = 16, E = 896 / expert GEMMs",
        op(moe, "moe block T=16 (router..combine)", "moe expert GEMMs T=16 (gate/up+SiTU, down)"), "<= 1.25x")
    add("MoE block decode T = 64, E = 256 (the medium preset's batch-64 layer) / expert GEMMs",
        op(moe256, "moe block T=64 (router..combine)", "moe expert GEMMs T=64 (gate/up+SiTU, down)"))
    add("MoE block prefill T = 8192, E = 896 / expert GEMMs",
        op(moe, "moe block T=8192 (router..combine)", "moe expert GEMMs T=8192 (gate/up+SiTU, down)"),
        "<= 1.8x")
    add("dense GEMMs at decode, M = 64: q_proj / o_proj / lm_head rows",
        op(perf, "gemm decode q_proj M=64 N=12288 K=7168", "gemm decode o_proj M=64 N=7168 K=12288",
           "lm_head rows M=64 N=163840 K=7168"))
    for name, log, goals in (("medium", med, ("<= 1.12x", "<= 1.25x", "<= 1.5x")),
                             ("Kimi-Linear-48B shapes (4 layers)", kl, ("<= 1.3x", "<= 1.4x", "<= 2x"))):
        d1 = log and log["dec1"]
        add(f"{name} decode step batch 1 (CUDA graph)",
            d1 and (f"{d1[0]:.3f} ms", f"{d1[1]:.3f} ms", f"{d1[2]:.2f}x"), goals[0])
        db = log and log["decb"]
        add(f"{name} decode step batch {db[0] if db else 'B'} (CUDA graph)",
            db and (f"{db[1]:.3f} ms = {db[2]} tok/s", f"{db[3]:.3f} ms", f"{db[4]:.2f}x"), goals[1])
        pf = log and log["prefill"]
        add(f"{name} prefill {pf[0] if pf else ''} tokens (one pass)".replace("  ", " "),
            pf and (f"{sec(pf[1])} = {pf[2]} tok/s", sec(pf[3]), f"{pf[4]:.2f}x"), goals[2])
    out = ["| figure | now | floor | ratio | goal |", "|---|---|---|---|---|"] + rows + [""]
    for label, log in (("k3k-gpu-check", perf), ("k3k-gpu-moe", moe), ("k3k-gpu-model medium", med),
                       ("k3k-gpu-model 48B", kl)):
        if log and log["ceil"]:
            out.append(f"Ceilings ({label}): " + "; ".join(log["ceil"]))
    text = "\n".join(out) + "\n"
    if check:
        with open(check) as f:
            want = f.read()
        if want != text:
            sys.stdout.write("table differs from " + check + ":\n" + text)
            return 1
        print(f"table matches {check} ({len(rows)} rows)")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
