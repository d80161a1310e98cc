#!/usr/bin/env python3
"""Checks k3pd-plan against reality on the local CPU cluster (issue 22 item 4).

For each model preset and configuration (prefill x decode) it starts a cluster (router + P
prefill + D decode workers), measures the cost profile (k3pd-bench --profile with the workers'
/metrics: with --profile-each on that very cluster, else once per preset on a separate 1x1),
runs k3pd-bench open-loop at each arrival rate, then predicts every cell with k3pd-plan on the
same workload (same seed: the same request lengths and arrival times) and the same cluster, and
writes a Markdown table of measured vs predicted p50/p99 TTFT and inter-token latency with the
relative error of each cell.

Several clusters at once (--cpus): each cluster gets CPUs of its own, no CPU shared with another
cluster running at the same time: one CPU per worker process and one for the router and the
client (k3pd-bench) together, every process pinned (taskset). With hyperthreads, a cluster takes
whole physical cores (both siblings), so clusters never share a core. Clusters are started
longest first while CPUs are free; predictions run after the last measurement.

usage: tests/plan/validate.py [--build build | --bin DIR] [--presets tiny,tiny-48b] [--configs 1x1,2x2]
                              [--rates 0.5,1,2 [--rates-per-pair]] [--duration 40 | --requests N]
                              [--profile-each] [--cpus auto|LIST] [--out DIR]
       tests/plan/validate.py --replan --out DIR ... (re-predicts stored bench results: those of
                              scripts/gpu/cluster.sh's plan part too, named the same way)
Every process it starts is stopped (SIGTERM, then SIGKILL after 5 s) by pid, also on errors.
Every wait has a deadline. Results land in DIR (default a new /tmp/k3pd-plan-validate.*):
profile-PRESET[-PxD].json, bench/plan JSON per cell, jobs.json (CPUs and times of each cluster),
rows.json, table.md.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import shutil
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


LIVE = set()  # clusters running now: stopped by on_term too


def on_term(signum, frame):
    """SIGTERM (e.g. timeout): stop every cluster's processes before exiting."""
    for c in list(LIVE):
        for _, p in c.procs:
            if p.poll() is None:
                p.kill()
    print(f"validate: signal {signum}: clusters stopped", flush=True)
    os._exit(128 + signum)


class Cluster:
    """Router + P prefill + D decode workers on loopback (what scripts/bench/run.sh starts)."""

    def __init__(self, bins, model, n_prefill, n_decode, logs, metrics=False, cpus=None, worker_args=()):
        """cpus: None (unpinned) or a list of n_prefill + n_decode + 1 CPU ids: the first for the router
        (and the client the caller pins there), then one per worker."""
        self.procs = []
        self.logs = logs
        self.cpus = cpus
        LIVE.add(self)
        os.makedirs(logs, exist_ok=True)
        rport, cport = os.path.join(logs, "router.port"), os.path.join(logs, "router.cport")
        for f in (rport, cport):
            if os.path.exists(f):
                os.unlink(f)
        self._start("router", [bins("k3pd-router"), "--model", model, "--listen", "127.0.0.1:0",
                               "--port-file", rport, "--cluster-port-file", cport, "--drain-grace-ms", "2000"],
                    cpu=cpus[0] if cpus else None)
        self._wait(lambda: os.path.exists(rport) and os.path.getsize(rport) > 0, 30, "router port file")
        self.router = "127.0.0.1:" + open(rport).read().strip()
        self.model = model
        cluster = "127.0.0.1:" + open(cport).read().strip()
        extra = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"] if metrics else []
        for i in range(n_prefill):
            self._start(f"prefill-{i+1}", [bins("k3pd-prefill"), "--model", model, "--router", cluster,
                                           "--worker-id", f"prefill-{i+1}", "--drain-grace-ms", "2000"] + extra
                        + list(worker_args), cpu=cpus[1 + i] if cpus else None)
        for i in range(n_decode):
            self._start(f"decode-{i+1}", [bins("k3pd-decode"), "--model", model, "--router", cluster,
                                          "--worker-id", f"decode-{i+1}", "--drain-grace-ms", "2000"] + extra
                        + list(worker_args), cpu=cpus[1 + n_prefill + i] if cpus else None)
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

    def _start(self, name, argv, cpu=None):
        f = open(os.path.join(self.logs, name + ".log"), "w")
        self.procs.append((name, subprocess.Popen(pinned(argv, cpu), stdout=f, stderr=subprocess.STDOUT)))
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
        LIVE.discard(self)


def pinned(argv, cpu):
    """argv run on CPU cpu only (taskset; None = not pinned)."""
    if cpu is None:
        return argv
    if not shutil.which("taskset"):
        raise RuntimeError("--cpus needs taskset (util-linux)")
    return ["taskset", "-c", str(cpu)] + argv


def run(argv, timeout, log, cpu=None):
    with open(log, "w") as f:
        r = subprocess.run(pinned(argv, cpu), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    return r.returncode


def cpu_units(spec):
    """The CPUs to use, grouped into units that never go to two clusters at once: physical cores
    (hyperthread siblings together) as the kernel reports them; spec 'auto' = this process's
    affinity, else a list like 0-15 or 0,2,4."""
    if spec == "auto":
        cpus = sorted(os.sched_getaffinity(0))
    else:
        cpus = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus += list(range(int(lo), int(hi or lo) + 1))
    units, seen = [], set()
    for c in cpus:
        if c in seen:
            continue
        sib = [c]
        try:
            txt = open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read().strip()
            for part in txt.split(","):
                lo, _, hi = part.partition("-")
                sib += [x for x in range(int(lo), int(hi or lo) + 1) if x != c and x in cpus]
        except OSError:
            pass
        sib = sorted(set(sib) - seen)
        seen.update(sib)
        units.append(sib)
    return units


class CpuPool:
    """Hands out whole units (cpu_units) to clusters; a cluster waits until enough are free."""

    def __init__(self, units):
        self.free = list(units)
        self.cv = threading.Condition()

    def fits(self, n):
        return sum(len(u) for u in self.free) >= n

    def take(self, n):
        got = []
        while sum(len(u) for u in got) < n:
            got.append(self.free.pop(0))
        return got

    def give(self, units):
        with self.cv:
            self.free += units
            self.free.sort()
            self.cv.notify_all()


def rel(pred, meas):
    if meas is None or pred is None or meas == 0:
        return None
    return (pred - meas) / meas


BUILD_DIRS = {"k3pd-router": "router", "k3pd-prefill": "prefill_worker", "k3pd-decode": "decode_worker",
              "k3pd-bench": "tools/bench", "k3pd-plan": "tools/plan", "k3pd-mkckpt": "tools/mkckpt"}


def binaries(a):
    """name -> path: a directory of binaries (--bin, a packed bundle's bin/) or a build tree."""
    if a.bin:
        d = os.path.abspath(a.bin)
        return lambda name: os.path.join(d, name)
    build = os.path.abspath(a.build)
    return lambda name: os.path.join(build, BUILD_DIRS[name], name)


def cell_rates(a, P, D):
    """The arrival rates of configuration PxD: --rates, times min(P, D) with --rates-per-pair."""
    k = min(P, D) if a.rates_per_pair else 1
    return [f"{float(r) * k:g}" for r in a.rates.split(",")]


def workload(a):
    return ["--prompt-len", a.prompt_len, "--output-len", a.output_len, "--seed", str(a.seed)]


def span(a):
    """k3pd-bench / k3pd-plan flags saying how long a cell is: a request count or seconds."""
    return ["--requests", str(a.requests)] if a.requests else ["--duration", str(a.duration)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--bin", default=None, help="a directory holding k3pd-router, k3pd-prefill, k3pd-decode, "
                    "k3pd-bench, k3pd-plan, k3pd-mkckpt (a packed bundle's bin/) instead of --build's tree")
    ap.add_argument("--presets", default="tiny,tiny-48b")
    ap.add_argument("--configs", default="1x1,2x1,1x2,2x2,3x3")
    ap.add_argument("--rates", default="0.5,1,2", help="arrival rates, req/s")
    ap.add_argument("--rates-per-pair", action="store_true",
                    help="the rates are per prefill + decode pair: configuration PxD runs at rate x min(P, D)")
    ap.add_argument("--duration", type=float, default=40, help="seconds of arrivals per cell")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per cell instead of --duration (every cell's p99 then rests on as many)")
    ap.add_argument("--prompt-len", default="16..128")
    ap.add_argument("--output-len", default="8..32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile-args", default="", help="extra k3pd-bench --profile flags")
    ap.add_argument("--profile-batches", default=None,
                    help="decode batches per decode worker the profile measures (with --profile-each: a PxD "
                    "cluster's profile runs concurrency 1 and b x D for each b > 1, so every decode worker sees "
                    "batches up to b, not b / D)")
    ap.add_argument("--worker-args", default="", help="extra flags for every worker (e.g. \"--backend cpu-fast "
                    "--threads 1\")")
    ap.add_argument("--host-cores", type=int, default=None,
                    help="also predict with k3pd-plan --host-cores N (all workers share this host's cores); 0 = off "
                    "(default: this host's CPU count, 0 with --cpus: each worker then has a CPU of its own)")
    ap.add_argument("--profile-each", action="store_true",
                    help="measure a profile on each configuration's own cluster (its worker processes, metrics on) "
                    "and predict its cells with it, instead of one profile per preset from a separate 1x1")
    ap.add_argument("--cpus", default=None,
                    help="run clusters concurrently, each pinned to CPUs of its own (auto = every CPU this process "
                    "may use, or a list: 0-15)")
    ap.add_argument("--cpus-reuse", type=int, default=1,
                    help="hand each CPU unit out this many times at once (function checks on a small machine only: "
                    "clusters then share CPUs)")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="with --cpus: a cluster that would end later than this many seconds after the start "
                    "(by the estimate of the first clusters) is skipped and said so (0 = none)")
    ap.add_argument("--replan", action="store_true",
                    help="do not run clusters: recompute the predictions for the bench results already in --out")
    ap.add_argument("--plan-args", default="", help="extra k3pd-plan flags (e.g. \"--prefill-cost line\")")
    ap.add_argument("--plan-bin", default=None, help="the k3pd-plan binary (default: the one of --bin / --build; "
                    "scripts/gpu/cluster.sh's plan part passes the bundle's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    if a.replan and not a.out:
        ap.error("--replan needs --out")
    if a.host_cores is None:
        a.host_cores = 0 if a.cpus else os.cpu_count()
    bins = binaries(a)
    a.plan_bin = a.plan_bin or bins("k3pd-plan")
    out = a.out or tempfile.mkdtemp(prefix="k3pd-plan-validate.")
    os.makedirs(out, exist_ok=True)
    print(f"validate: results in {out}", flush=True)
    cfgs = [(preset, cfg) for preset in a.presets.split(",") for cfg in a.configs.split(",")]
    if not a.replan:
        measure_all(a, bins, out, cfgs)
    rows = []
    for preset, cfg in cfgs:
        P, D = (int(x) for x in cfg.split("x"))
        prof = os.path.join(out, f"profile-{preset}-{cfg}.json")
        if not os.path.exists(prof):
            prof = os.path.join(out, f"profile-{preset}.json")
        for rate in cell_rates(a, P, D):
            cell(a, out, prof, preset, cfg, P, D, rate, rows)
    return finish(rows, out, a)


def measure_all(a, bins, out, cfgs):
    """Checkpoints, the per-preset profiles (without --profile-each), then every configuration's
    cluster: one after the other, or concurrently on disjoint CPUs (--cpus)."""
    for preset in a.presets.split(","):
        model = os.path.join(out, f"ckpt-{preset}")
        if not os.path.exists(os.path.join(model, "config.json")):
            if run([bins("k3pd-mkckpt"), "--preset", preset, "--out", model, "--seed", "1"], 600,
                   os.path.join(out, f"mkckpt-{preset}.log")):
                raise RuntimeError(f"mkckpt {preset} failed")
    units = cpu_units(a.cpus) if a.cpus else None
    if not a.profile_each:  # one profile per preset on a 1x1 (pinned like a 1x1 cell when --cpus)
        for preset in a.presets.split(","):
            prof = os.path.join(out, f"profile-{preset}.json")
            if os.path.exists(prof):
                continue
            cpus = [c for u in units for c in u][:3] if units else None
            c = Cluster(bins, os.path.join(out, f"ckpt-{preset}"), 1, 1, os.path.join(out, f"logs-{preset}-profile"),
                        metrics=True, cpus=cpus, worker_args=a.worker_args.split())
            try:
                measure_profile(a, bins, c, prof)
            finally:
                c.stop()
    jobs_log = []
    if not units:
        for preset, cfg in cfgs:
            jobs_log.append(measure_config(a, bins, out, preset, cfg, None))
    else:
        # longest first: a cluster's time grows with its cells' total requests / rate
        def est(job):
            P, D = (int(x) for x in job[1].split("x"))
            return sum(cell_seconds(a, float(r)) for r in cell_rates(a, P, D))
        pending = sorted(cfgs, key=lambda j: (-est(j), -sum(int(x) for x in j[1].split("x"))))
        units = [list(u) for u in units for _ in range(max(1, a.cpus_reuse))]
        pool = CpuPool(units)
        threads, errors, t0 = [], [], time.monotonic()
        total = sum(len(u) for u in units)
        print(f"validate: {total} CPUs in {len(units)} units: {units}", flush=True)

        def worker(preset, cfg, got):
            try:
                cpus = [c for u in got for c in u]
                jobs_log.append(measure_config(a, bins, out, preset, cfg, cpus, t0))
            except Exception as e:  # noqa: BLE001 (reported, the others go on)
                errors.append(f"{preset} {cfg}: {e}")
                print(f"validate: {preset} {cfg} FAILED: {e}", flush=True)
            finally:
                pool.give(got)

        with pool.cv:
            while pending:
                job = next((j for j in pending if pool.fits(need_cpus(j[1]))), None)
                if job is None:
                    if all(need_cpus(j[1]) > total for j in pending):
                        for j in pending:
                            errors.append(f"{j[0]} {j[1]}: needs {need_cpus(j[1])} CPUs, {total} given")
                        break
                    pool.cv.wait(timeout=1)
                    continue
                pending.remove(job)
                elapsed = time.monotonic() - t0
                if a.budget_s and elapsed + est(job) + 40 > a.budget_s:
                    msg = f"{job[0]} {job[1]}: skipped (it would end past --budget-s {a.budget_s:g} s)"
                    errors.append(msg)
                    print("validate: " + msg, flush=True)
                    continue
                got = pool.take(need_cpus(job[1]))
                th = threading.Thread(target=worker, args=(job[0], job[1], got))
                th.start()
                threads.append(th)
        for th in threads:
            th.join()
        for e in errors:
            print("validate: " + e, flush=True)
    json.dump(jobs_log, open(os.path.join(out, "jobs.json"), "w"), indent=1)


def need_cpus(cfg):
    P, D = (int(x) for x in cfg.split("x"))
    return P + D + 1  # one per worker, one for the router and the client


def cell_seconds(a, rate):
    return a.requests / rate if a.requests else a.duration


def measure_config(a, bins, out, preset, cfg, cpus, t0=None):
    """One configuration's cluster: its profile (--profile-each), then its cells. Returns the log entry."""
    P, D = (int(x) for x in cfg.split("x"))
    model = os.path.join(out, f"ckpt-{preset}")
    t_start = time.monotonic()
    entry = {"preset": preset, "config": cfg, "cpus": cpus, "router_and_client_cpu": cpus[0] if cpus else None,
             "prefill_cpus": cpus[1:1 + P] if cpus else None, "decode_cpus": cpus[1 + P:1 + P + D] if cpus else None,
             "start_s": round(t_start - t0, 1) if t0 else None}
    print(f"validate: {preset} {cfg} starting" + (f" on CPUs {cpus}" if cpus else ""), flush=True)
    c = Cluster(bins, model, P, D, os.path.join(out, f"logs-{preset}-{cfg}"), metrics=a.profile_each,
                cpus=cpus, worker_args=a.worker_args.split())
    front = cpus[0] if cpus else None
    try:
        if a.profile_each:
            t = time.monotonic()
            measure_profile(a, bins, c, os.path.join(out, f"profile-{preset}-{cfg}.json"), cpu=front, n_decode=D)
            entry["profile_s"] = round(time.monotonic() - t, 1)
        for rate in cell_rates(a, P, D):
            tag = f"{preset}-{cfg}-r{rate}"
            bj = os.path.join(out, f"bench-{tag}.json")
            if os.path.exists(bj):
                os.unlink(bj)
            t = time.monotonic()
            rc = run([bins("k3pd-bench"), "--router", c.router, "--model", model, "--rate", rate, "--json", bj,
                      "--label", tag, "--timeout-ms", "60000",
                      "--requests-out", os.path.join(out, f"req-{tag}.jsonl")] + span(a) + workload(a),
                     cell_seconds(a, float(rate)) * 10 + 300, os.path.join(out, f"bench-{tag}.log"), cpu=front)
            entry[f"cell_r{rate}_s"] = round(time.monotonic() - t, 1)
            print(f"validate: {tag}: measured ({rc}) in {entry[f'cell_r{rate}_s']} s", flush=True)
    finally:
        c.stop()
        entry["end_s"] = round(time.monotonic() - t0, 1) if t0 else None
    return entry


def measure_profile(a, bins, c, prof, cpu=None, n_decode=1):
    """k3pd-bench --profile on cluster c (started with metrics), written to prof."""
    log = prof[:-len(".json")] + ".log"
    argv = [bins("k3pd-bench"), "--router", c.router, "--model", c.model, "--profile", prof,
            "--profile-prefill-metrics", ",".join(c.metrics["prefill"]),
            "--profile-decode-metrics", ",".join(c.metrics["decode"])] + a.profile_args.split()
    if a.profile_batches:  # the router spreads concurrent requests over the decode workers
        bs = [int(b) for b in a.profile_batches.split(",")]
        argv += ["--profile-batches", ",".join(str(b if b == 1 else b * n_decode) for b in bs)]
    rc = run(argv, 1800, log, cpu=cpu)
    if rc:
        raise RuntimeError(f"k3pd-bench --profile failed ({rc}); see {log}")
    print(open(log).read().strip().splitlines()[-1], flush=True)


def cell(a, out, prof, preset, cfg, P, D, rate, rows):
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
        rc = run([a.plan_bin, "--profile", prof, "--rate", rate, "--warmup", "0", "--prefill", str(P), "--decode",
                  str(D), "--json", pj] + (["--requests-out", os.path.join(out, f"plan-req-{tag}.jsonl")] if not variant
                                             else []) + span(a) + workload(a) + extra + a.plan_args.split(), 600,
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
