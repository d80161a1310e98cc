#!/usr/bin/env python3
"""Checks k3pd-plan against reality on the local CPU cluster (issue 22 item 4).

For each model preset: starts router + 1 prefill + 1 decode with worker metrics, measures the
cost profile (k3pd-bench --profile with the workers' /metrics), stops it; then for each
configuration (prefill x decode) starts a fresh cluster, runs k3pd-bench open-loop at each
arrival rate, runs k3pd-plan on the same workload (same seed: the same request lengths and
arrival times) and the same cluster, and writes a Markdown table of measured vs predicted
p50/p99 TTFT and inter-token latency with the relative error of each cell.

usage: tests/plan/validate.py [--build build] [--presets tiny,tiny-48b] [--configs 1x1,2x2]
                              [--rates 0.5,1,2] [--duration 40] [--out DIR]
       tests/plan/validate.py --replan --out DIR ... (re-predicts stored bench results: those of
                              scripts/gpu/cluster.sh's plan part too, named the same way)
Every process it starts is stopped (SIGTERM, then SIGKILL after 5 s) by pid, also on errors.
Every wait has a deadline. Results land in DIR (default a new /tmp/k3pd-plan-validate.*):
profile-PRESET.json, bench/plan JSON per cell, table.md.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Cluster:
    """Router + P prefill + D decode workers on loopback (what scripts/bench/run.sh starts)."""

    def __init__(self, build, model, n_prefill, n_decode, logs, metrics=False):
        self.procs = []
        self.logs = logs
        os.makedirs(logs, exist_ok=True)
        rport, cport = os.path.join(logs, "router.port"), os.path.join(logs, "router.cport")
        for f in (rport, cport):
            if os.path.exists(f):
                os.unlink(f)
        self._start("router", [f"{build}/router/k3pd-router", "--model", model, "--listen", "127.0.0.1:0",
                               "--port-file", rport, "--cluster-port-file", cport, "--drain-grace-ms", "2000"])
        self._wait(lambda: os.path.exists(rport) and os.path.getsize(rport) > 0, 30, "router port file")
        self.router = "127.0.0.1:" + open(rport).read().strip()
        cluster = "127.0.0.1:" + open(cport).read().strip()
        extra = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"] if metrics else []
        for i in range(n_prefill):
            self._start(f"prefill-{i+1}", [f"{build}/prefill_worker/k3pd-prefill", "--model", model, "--router",
                                           cluster, "--worker-id", f"prefill-{i+1}", "--drain-grace-ms", "2000"] + extra)
        for i in range(n_decode):
            self._start(f"decode-{i+1}", [f"{build}/decode_worker/k3pd-decode", "--model", model, "--router",
                                          cluster, "--worker-id", f"decode-{i+1}", "--drain-grace-ms", "2000"] + extra)
        want = n_prefill + n_decode
        self._wait(lambda: self._log("router").count("registered: ") >= want, 120, f"{want} workers registered")
        self.metrics = {"prefill": [], "decode": []}
        if metrics:
            for name, _ in self.procs[1:]:
                pat = re.compile(r"metrics on port (\d+)")
                self._wait(lambda: pat.search(self._log(name)), 30, f"{name} metrics port")
                port = pat.search(self._log(name)).group(1)
                self.metrics["prefill" if name.startswith("prefill") else "decode"].append(f"127.0.0.1:{port}")

    def _log(self, name):
        try:
            return open(os.path.join(self.logs, name + ".log"), errors="replace").read()
        except OSError:
            return ""

    def _start(self, name, argv):
        f = open(os.path.join(self.logs, name + ".log"), "w")
        self.procs.append((name, subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)))
        f.close()

    def _wait(self, cond, deadline_s, what):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if cond():
                return
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}; logs in {self.logs}")
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {deadline_s} s waiting for {what}; logs in {self.logs}")

    def stop(self):
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs = []


def run(argv, timeout, log):
    with open(log, "w") as f:
        r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    return r.returncode


def rel(pred, meas):
    if meas is None or pred is None or meas == 0:
        return None
    return (pred - meas) / meas


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--presets", default="tiny,tiny-48b")
    ap.add_argument("--configs", default="1x1,2x1,1x2,2x2,3x3")
    ap.add_argument("--rates", default="0.5,1,2", help="arrival rates, req/s")
    ap.add_argument("--duration", type=float, default=40, help="seconds of arrivals per cell")
    ap.add_argument("--prompt-len", default="16..128")
    ap.add_argument("--output-len", default="8..32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile-args", default="", help="extra k3pd-bench --profile flags")
    ap.add_argument("--host-cores", type=int, default=os.cpu_count(),
                    help="also predict with k3pd-plan --host-cores N (all workers share this host's cores); 0 = off")
    ap.add_argument("--profile-each", action="store_true",
                    help="measure a profile on each configuration's own cluster (its worker processes, metrics on) "
                    "and predict its cells with it, instead of one profile per preset from a separate 1x1")
    ap.add_argument("--replan", action="store_true",
                    help="do not run clusters: recompute the predictions for the bench results already in --out")
    ap.add_argument("--plan-args", default="", help="extra k3pd-plan flags (e.g. \"--prefill-cost line\")")
    ap.add_argument("--plan-bin", default=None, help="the k3pd-plan binary (default BUILD/tools/plan/k3pd-plan; "
                    "scripts/gpu/cluster.sh's plan part passes the bundle's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.replan and not a.out:
        ap.error("--replan needs --out")
    build = os.path.abspath(a.build)
    out = a.out or tempfile.mkdtemp(prefix="k3pd-plan-validate.")
    os.makedirs(out, exist_ok=True)
    print(f"validate: results in {out}", flush=True)
    rows = []
    if a.replan:
        for preset in a.presets.split(","):
            for cfg in a.configs.split(","):
                P, D = (int(x) for x in cfg.split("x"))
                prof = os.path.join(out, f"profile-{preset}-{cfg}.json")
                if not os.path.exists(prof):
                    prof = os.path.join(out, f"profile-{preset}.json")
                for rate in a.rates.split(","):
                    wl = ["--prompt-len", a.prompt_len, "--output-len", a.output_len, "--seed", str(a.seed)]
                    cell(a, build, out, prof, preset, cfg, P, D, rate, wl, rows)
        return finish(rows, out, a)
    for preset in a.presets.split(","):
        model = os.path.join(out, f"ckpt-{preset}")
        if not os.path.exists(os.path.join(model, "config.json")):
            if run([f"{build}/tools/mkckpt/k3pd-mkckpt", "--preset", preset, "--out", model, "--seed", "1"], 600,
                   os.path.join(out, f"mkckpt-{preset}.log")):
                raise RuntimeError(f"mkckpt {preset} failed")
        prof = os.path.join(out, f"profile-{preset}.json")
        if not a.profile_each and not os.path.exists(prof):
            c = Cluster(build, model, 1, 1, os.path.join(out, f"logs-{preset}-profile"), metrics=True)
            try:
                measure_profile(a, build, model, c, prof)
            finally:
                c.stop()
        for cfg in a.configs.split(","):
            P, D = (int(x) for x in cfg.split("x"))
            c = Cluster(build, model, P, D, os.path.join(out, f"logs-{preset}-{cfg}"), metrics=a.profile_each)
            try:
                if a.profile_each:
                    prof = os.path.join(out, f"profile-{preset}-{cfg}.json")
                    measure_profile(a, build, model, c, prof)
                for rate in a.rates.split(","):
                    tag = f"{preset}-{cfg}-r{rate}"
                    bj, pj = os.path.join(out, f"bench-{tag}.json"), os.path.join(out, f"plan-{tag}.json")
                    for f in (bj,):
                        if os.path.exists(f):
                            os.unlink(f)
                    wl = ["--prompt-len", a.prompt_len, "--output-len", a.output_len, "--seed", str(a.seed)]
                    rc = run([f"{build}/tools/bench/k3pd-bench", "--router", c.router, "--model", model, "--rate", rate,
                              "--duration", str(a.duration), "--json", bj, "--label", tag] + wl,
                             a.duration * 10 + 300, os.path.join(out, f"bench-{tag}.log"))
                    cell(a, build, out, prof, preset, cfg, P, D, rate, wl, rows)
            finally:
                c.stop()
    return finish(rows, out, a)


def measure_profile(a, build, model, c, prof):
    """k3pd-bench --profile on cluster c (started with metrics), written to prof."""
    log = prof[:-len(".json")] + ".log"
    argv = [f"{build}/tools/bench/k3pd-bench", "--router", c.router, "--model", model, "--profile", prof,
            "--profile-prefill-metrics", ",".join(c.metrics["prefill"]),
            "--profile-decode-metrics", ",".join(c.metrics["decode"])] + a.profile_args.split()
    rc = run(argv, 1800, log)
    if rc:
        raise RuntimeError(f"k3pd-bench --profile failed ({rc}); see {log}")
    print(open(log).read().strip().splitlines()[-1], flush=True)


def cell(a, build, out, prof, preset, cfg, P, D, rate, wl, rows):
    """Predicts one measured cell (own hardware, and on a shared host when --host-cores)."""
    tag = f"{preset}-{cfg}-r{rate}"
    bj = os.path.join(out, f"bench-{tag}.json")
    if not os.path.exists(bj):
        print(f"validate: {tag}: no bench result; skipped", flush=True)
        return
    b = json.loads(open(bj).read().strip().splitlines()[-1])
    row = {"preset": preset, "config": cfg, "rate": float(rate), "ok": b["ok"], "sent": b["sent"]}
    for variant, extra in (("", []), ("shared_", ["--host-cores", str(a.host_cores)] if a.host_cores else None)):
        if extra is None:
            continue
        pj = os.path.join(out, f"plan-{variant}{tag}.json")
        rc = run([a.plan_bin or f"{build}/tools/plan/k3pd-plan", "--profile", prof, "--rate", rate, "--duration", str(a.duration),
                  "--warmup", "0", "--prefill", str(P), "--decode", str(D), "--json", pj] + wl + extra
                 + a.plan_args.split(), 600,
                 os.path.join(out, f"plan-{variant}{tag}.log"))
        if rc:
            print(f"validate: {tag}: k3pd-plan {variant or 'own'} failed ({rc}); skipped", flush=True)
            return
        p = json.load(open(pj))["answer"]
        for m in ("ttft_ms", "itl_ms"):
            for q in ("p50", "p99"):
                row[f"{m}_{q}_meas"] = b[m][q]
                row[f"{variant}{m}_{q}_pred"] = p[m][q]
                row[f"{variant}{m}_{q}_err"] = rel(p[m][q], b[m][q])
    rows.append(row)
    print("validate: " + tag + " " + " ".join(
        f"{m}_{q}={row[f'{m}_{q}_meas']:.1f}/{row[f'{m}_{q}_pred']:.1f}"
        + (f"/{row[f'shared_{m}_{q}_pred']:.1f}" if f"shared_{m}_{q}_pred" in row else "")
        for m in ("ttft_ms", "itl_ms") for q in ("p50", "p99")), flush=True)


def finish(rows, out, a):
    json.dump(rows, open(os.path.join(out, "rows.json"), "w"), indent=1)
    path = os.path.join(out, "table.md")
    with open(path, "w") as f:
        write_table(rows, f, "", "each worker on its own hardware (k3pd-plan default)")
        if a.host_cores:
            write_table(rows, f, "shared_", f"all workers sharing {a.host_cores} cores, or GPUs, of one host (--host-cores {a.host_cores})")
    print(open(path).read())
    return 0


def write_table(rows, f, v, title):
    def cell(r, m, q):
        e = r.get(f"{v}{m}_{q}_err")
        if f"{v}{m}_{q}_pred" not in r:
            return "n/a"
        mark = "" if e is None else (" ✓" if abs(e) <= 0.2 else " ✗")
        es = "n/a" if e is None else f"{e*100:+.0f}%"
        return f"{r[f'{m}_{q}_meas']:.1f} / {r[f'{v}{m}_{q}_pred']:.1f} ({es}){mark}"
    f.write(f"Predictions with {title}; cells: measured / predicted ms (error).\n\n")
    f.write("| model | P x D | req/s | ok | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |\n")
    f.write("|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['preset']} | {r['config']} | {r['rate']:g} | {r['ok']}/{r['sent']} | "
                f"{cell(r, 'ttft_ms', 'p50')} | {cell(r, 'ttft_ms', 'p99')} | {cell(r, 'itl_ms', 'p50')} | "
                f"{cell(r, 'itl_ms', 'p99')} |\n")
    errs = [r[k] for r in rows for k in r if k.startswith(v + ("" if v else "")) and k.endswith("_err")
            and (v or not k.startswith("shared_")) and r[k] is not None]
    ok = sum(1 for e in errs if abs(e) <= 0.2)
    f.write(f"\n{ok} of {len(errs)} cells within 20 %.")
    per = []
    for m, q, name in (("ttft_ms", "p50", "TTFT p50"), ("ttft_ms", "p99", "TTFT p99"), ("itl_ms", "p50", "ITL p50"),
                       ("itl_ms", "p99", "ITL p99")):
        es = [r[f"{v}{m}_{q}_err"] for r in rows if r.get(f"{v}{m}_{q}_err") is not None]
        if es:
            per.append(f"{name} {sum(1 for e in es if abs(e) <= 0.2)}/{len(es)} (mean {sum(es) / len(es) * 100:+.0f} %)")
    f.write(" By metric: " + ", ".join(per) + ".\n\n")


if __name__ == "__main__":
    sys.exit(main())
