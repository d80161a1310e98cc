#!/usr/bin/python3
"""Chaos soak (issue 18 item 5): steady mixed load on a local cluster of 2 routers x 2 prefill x
2 decode workers (`k3pd-cli up --routers 2`, loopback, CPU backend; every worker registered with
both routers, the requests spread over both) while a driver SIGKILLs a random worker every few
seconds and `k3pd-cli up` restarts it.

Verdict (counts and equalities only, never a duration, so a slow machine only sends fewer
requests):
  - every request either completed with the tokens k3pd-generate gives for it, or ended with a
    documented retryable outcome: UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED, or a
    final chunk FINISH_REASON_ERROR whose tokens are a prefix of k3pd-generate's; the count of
    each is printed;
  - after the chaos stops and every worker is back: each request template completes once more
    with identical tokens; nothing is leaked: no page, slot or reservation on either decode
    worker, no queued or running prompt on either prefill worker, requests started == finished
    and no stream open on either router, each router's file descriptors back at their baseline;
  - each router's RSS is flat: the largest sample of the last third of the soak is within 25 %
    + 16 MiB of the largest of the first third (ASan's quarantine is capped for the processes);
  - `k3pd-cli up` exits 0 on SIGINT (every process, the router included, exited cleanly: under
    ASan that includes LeakSanitizer's report).
Usage: test_chaos.py --bindir BUILD --gen PYSTUBS --workdir DIR [--seconds S] [--clients N] [--seed N]
       (K3PD_CHAOS_SECONDS overrides the default of 300 s: longer soaks outside CI)
"""
import argparse
import concurrent.futures as cf
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import grpc

# UCX below 1.14 (Debian 12 ships 1.13.1, built with assertions) aborts a process when a TCP
# endpoint fails while a wireup REP message is still pending on it: a decode worker answering a
# prefill worker's wireup request just as the driver SIGKILLs that prefill worker
# (`ucp_request.c:684 Assertion ... got REP message`; removed upstream in openucx/ucx PR 8175,
# UCX 1.14). Such a worker died of the driver's kill of its peer inside the library, and k3pd-cli
# restarts it like a killed one; the soak counts it (one per aborted process) and says so. Any
# other death still fails the restart check, and with UCX >= 1.14 none is tolerated.
UCX_ABORT = re.compile(r"ucp_request\.c:\d+\s+Assertion\b.*\bgot [A-Z_]+ message")
UCX_PID = re.compile(r"\[[^\]\s:]*:(\d+):\d+:\d+\]")  # UCX's [host:pid:thread:tid] prefix


def ucx_below_1_14():
    try:
        v = subprocess.run(["pkg-config", "--modversion", "ucx"], capture_output=True, text=True,
                           timeout=10).stdout.strip().split(".")
        return len(v) >= 2 and (int(v[0]), int(v[1])) < (1, 14)
    except (OSError, subprocess.SubprocessError, ValueError):
        return False  # unknown version: nothing tolerated


def ucx_wireup_aborts(text):
    """Processes (distinct pids) that aborted in UCX < 1.14's wireup purge assertion."""
    if not ucx_below_1_14():
        return 0
    pids = set()
    for n, line in enumerate(text.splitlines()):
        if UCX_ABORT.search(line):
            m = UCX_PID.search(line)
            pids.add(m.group(1) if m else "line %d" % (n + 1))
    if pids:
        print("chaos: %d worker(s) aborted in UCX's wireup assertion (openucx/ucx PR 8175, fixed in "
              "1.14): pid %s" % (len(pids), ", ".join(sorted(pids))), flush=True)
    return len(pids)


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3cluster import load_stubs  # noqa: E402
from k3check import run as run_driver, check, wait_until as _wait_until, scrape, msum  # noqa: E402


def wait_until(pred, timeout, what):
    return _wait_until(pred, timeout, what, tolerate=(OSError, grpc.RpcError, ValueError, KeyError), poll=0.1)


GEN_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "64"]
RETRYABLE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}


def templates(seed):
    rnd = random.Random(seed)
    out = []
    for i, plen in enumerate([3, 9, 17, 40, 70, 130, 200, 330, 5, 24, 90, 260]):
        # a few long completions, so kills often land mid-stream (resumption)
        max_new = 120 if i % 4 == 1 else rnd.choice([4, 8, 16, 24, 40])
        out.append(dict(prompt=[rnd.randrange(1, 3800) for _ in range(plen)], max_new=max_new,
                        temperature=0.0 if i % 3 else 0.8, seed=rnd.randrange(1 << 40)))
    return out


def monolithic(bindir, model, r):
    argv = [os.path.join(bindir, "tools", "generate", "k3pd-generate"), "--model", model, "--prompt-ids",
            ",".join(map(str, r["prompt"])), "--max-new-tokens", str(r["max_new"]), "--ignore-eos",
            "--seed", str(r["seed"])] + GEN_ARGS
    if r["temperature"] > 0:
        argv += ["--temperature", repr(r["temperature"]), "--top-k", "40"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError("k3pd-generate failed: %s" % out.stderr[-2000:])
    return [int(x) for x in [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][-1][4:].split()]


_CREDS = []
ARGS = argparse.Namespace(workdir=".", bindir=".")


def router_creds():
    """Channel credentials with the router identity from k3pd-cli up's development CA (the
    workers' ports take only mutual TLS with that identity)."""
    if not _CREDS:
        ca_dir = "/tmp/k3pd-tls-%d" % os.geteuid()
        prefix = os.path.join(ARGS.workdir, "client-k3pd-router")
        subprocess.run([os.path.join(ARGS.bindir, "tools", "cli", "k3pd-cli"), "certs", "--dir", ca_dir, "--name",
                        "k3pd-router", "--out", prefix], check=True, capture_output=True, timeout=30)
        rd = lambda f: open(f, "rb").read()  # noqa: E731
        _CREDS.append(grpc.ssl_channel_credentials(root_certificates=rd(os.path.join(ca_dir, "ca.crt")),
                                                   private_key=rd(prefix + ".key"),
                                                   certificate_chain=rd(prefix + ".crt")))
    return _CREDS[0]


class Up:
    """k3pd-cli up and what its log says about each process."""

    def __init__(self, bindir, model, workdir):
        self.log_path = os.path.join(workdir, "cluster.log")
        self.ready = os.path.join(workdir, "ready")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        env = dict(os.environ)
        # ASan keeps freed memory in a quarantine of up to 256 MiB: cap it, or RSS says nothing
        env["ASAN_OPTIONS"] = ":".join(x for x in [env.get("ASAN_OPTIONS", ""), "quarantine_size_mb=16"] if x)
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([os.path.join(bindir, "tools", "cli", "k3pd-cli"), "up", "--model", model,
                                   "--routers", "2",
                                   "--prefill", "2", "--decode", "2", "--port", "0", "--ready-file", self.ready,
                                   "--metrics", "--restart-backoff-ms", "300", "--restart-backoff-max-ms", "3000",
                                   "--backend", "cpu-fast", "--threads", "1", "--precision", "fp32",
                                   "--page-tokens", "64", "--num-pages", "256", "--num-slots", "8",
                                   "--stop-timeout-ms", "60000"],
                                  stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.routers = wait_until(lambda: open(self.ready).read().split(), 300, "the cluster to be ready")

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def last(self, name, pattern):
        """The last match of pattern in the log lines of process `name`."""
        got = None
        for ln in self.text().splitlines():
            if ln.startswith("[%-9s]" % name):
                m = re.search(pattern, ln)
                if m:
                    got = m.group(1)
        return got

    def _children(self, exe):
        """(start time, pid) of the live children of k3pd-cli up whose program ends with exe."""
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.p.pid:
                    continue
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if f.read().split(b"\0")[0].endswith(exe):
                        out.append((_start_time(int(d)), int(d)))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def metrics_port(self, name):
        v = self.last(name, r"metrics on port (\d+)")
        return int(v) if v else None

    def addr(self, name):
        return self.last(name, r"advertised ([0-9.]+:\d+)")

    def pid(self, name):
        """Pid of the live child process running --worker-id name, or of router-i (the routers
        are started one after the other: router-i is the i-th k3pd-router child by start time)."""
        if name.startswith("router"):
            rs = sorted(self._children(b"k3pd-router"))
            i = int(name.split("-")[1])
            return rs[i][1] if i < len(rs) else None
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.p.pid:
                    continue
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if name.encode() in argv and b"--worker-id" in argv:
                return int(d)
        return None


def _start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def proc_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def proc_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("K3PD_CHAOS_SECONDS", "300")))
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--seed", type=int, default=18)
    args = ap.parse_args()
    ARGS.workdir, ARGS.bindir = args.workdir, args.bindir
    os.makedirs(args.workdir, exist_ok=True)
    stubs = load_stubs(args.gen)
    c, g, d, _ = stubs
    model = os.path.join(args.workdir, "tiny")
    subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                    "--seed", "11"], check=True, capture_output=True, timeout=120)
    tpl = templates(args.seed)
    t0 = time.time()
    with cf.ThreadPoolExecutor(max_workers=2) as ex:
        mono = list(ex.map(lambda r: monolithic(args.bindir, model, r), tpl))
    print("monolithic references for %d templates: %.1f s" % (len(tpl), time.time() - t0), flush=True)

    up = Up(args.bindir, model, args.workdir)
    ok = False
    counts = {}
    bad = []
    lock = threading.Lock()
    stop_load = threading.Event()
    workers = ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    rnames = ["router-0", "router-1"]
    try:
        check(len(up.routers) == 2, "k3pd-cli up --routers 2 started two routers (%s)" % up.routers)
        channels = [grpc.insecure_channel(a) for a in up.routers]
        gens = [ch.unary_stream("/k3pd.v1.Generation/Generate", request_serializer=g.GenerateRequest.SerializeToString,
                                response_deserializer=g.GenerateResponse.FromString) for ch in channels]
        rports = [wait_until(lambda: up.metrics_port(n), 30, "%s's metrics port" % n) for n in rnames]
        router_pids = [up.pid(n) for n in rnames]
        check(all(router_pids) and len(set(router_pids)) == 2, "two router processes (%s)" % router_pids)
        sent = [0, 0]

        def registered():
            for rport in rports:
                t = scrape(rport)
                if not (msum(t, "k3pd_router_registered_workers", 'role="prefill"') == 2 and
                        msum(t, "k3pd_router_registered_workers", 'role="decode"') == 2):
                    return False
            return True

        def run_one(i, r, via=None):
            """One request, through router `via` (default: the two in turn: load spread over both)."""
            with lock:
                k = via if via is not None else sent[0] % 2
                sent[0] += 1
                sent[1] += k
            gen = gens[k]
            samp = c.SamplingParams(temperature=r["temperature"], seed=r["seed"],
                                    top_k=40 if r["temperature"] > 0 else 0)
            req = g.GenerateRequest(token_ids=g.TokenIds(ids=r["prompt"]), sampling=samp,
                                    stop=c.StopConditions(max_new_tokens=r["max_new"], ignore_eos=True))
            ids, final = [], None
            try:
                for ch in gen(req, timeout=120):
                    ids += list(ch.token_ids)
                    if ch.finish_reason:
                        final = ch.finish_reason
            except grpc.RpcError as e:
                code = e.code().name
                if code in RETRYABLE and ids == mono[i][:len(ids)]:
                    return code
                return "BAD %s (%s) after %d tokens" % (code, e.details(), len(ids))
            if final == c.FINISH_REASON_ERROR:
                return "FINISH_REASON_ERROR" if ids == mono[i][:len(ids)] else "BAD error chunk, tokens differ"
            if final == c.FINISH_REASON_LENGTH and ids == mono[i]:
                return "OK"
            return "BAD finish %s, %d tokens, identical %s" % (final, len(ids), ids == mono[i])

        def client(k):
            rnd = random.Random(args.seed * 100 + k)
            while not stop_load.is_set():
                i = rnd.randrange(len(tpl))
                out = run_one(i, tpl[i])
                with lock:
                    counts[out] = counts.get(out, 0) + 1
                    if out.startswith("BAD"):
                        bad.append("template %d: %s" % (i, out))

        # warm-up (every worker used once) and the baselines
        for i in range(len(tpl)):
            for k in range(2):
                check(run_one(i, tpl[i], via=k) == "OK", "warm-up: template %d through router %d equals "
                      "k3pd-generate" % (i, k))
        wait_until(registered, 60, "all four workers registered with both routers")
        fd0 = [proc_fds(p) for p in router_pids]
        rss = [[], []]
        clients = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in clients:
            t.start()
        rnd = random.Random(args.seed)
        kills = 0
        t_end = time.time() + args.seconds
        next_kill = time.time() + rnd.uniform(3, 6)
        while time.time() < t_end:
            for k in range(2):
                rss[k].append(proc_rss_kb(router_pids[k]))
            if time.time() >= next_kill:
                next_kill = time.time() + rnd.uniform(3, 6)
                try:
                    up_now = registered()
                except OSError:
                    up_now = False
                if up_now:  # kill only while every worker is up: one role never loses both
                    name = rnd.choice(workers)
                    pid = up.pid(name)
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                        kills += 1
                        print("chaos: SIGKILL %s (pid %d) at %.0f s" % (name, pid, args.seconds - (t_end - time.time())),
                              flush=True)
            time.sleep(0.5)
        stop_load.set()
        for t in clients:
            t.join(timeout=300)
        print("chaos: %d kills in %.0f s; outcomes: %s; %d requests via router 1 of %d" %
              (kills, args.seconds, counts, sent[1], sent[0]), flush=True)
        for b in bad[:20]:
            print("BAD", b)
        check(kills >= 1, "the driver killed workers (%d kills)" % kills)
        check(not bad, "every request completed identical to k3pd-generate or ended retryably (%s)" % counts)
        check(counts.get("OK", 0) > 0, "requests completed during the chaos (%d)" % counts.get("OK", 0))
        # ---- after the chaos ----
        wait_until(registered, 120, "every worker back and registered")
        text = up.text()
        restarts = len(re.findall(r"k3pd-cli up: restarting", text))
        known = ucx_wireup_aborts(text)
        check(restarts == kills + known,
              "k3pd-cli up restarted every killed worker (%d restarts: %d kills + %d workers aborted by "
              "UCX < 1.14's wireup assertion)" % (restarts, kills, known))
        check(0 < sent[1] < sent[0], "the load was spread over both routers (%d of %d via router 1)" %
              (sent[1], sent[0]))
        for i in range(len(tpl)):
            for k in range(2):
                check(run_one(i, tpl[i], via=k) == "OK", "after the chaos: template %d through router %d equals "
                      "k3pd-generate" % (i, k))

        def decode_idle(name):
            with grpc.secure_channel(up.addr(name), router_creds(),
                                     options=[("grpc.ssl_target_name_override", name)]) as ch:
                st = ch.unary_unary("/k3pd.v1.Decode/Stats", request_serializer=d.StatsRequest.SerializeToString,
                                    response_deserializer=d.StatsResponse.FromString)(d.StatsRequest(), timeout=5)
            return st.used_kv_pages == 0 and st.used_kda_slots == 0 and st.reservations == 0 and st.running_seqs == 0

        for name in ("decode-0", "decode-1"):
            wait_until(lambda: decode_idle(name), 60, "%s to have no page, slot or reservation in use" % name)
            check(True, "%s: no page, slot or reservation leaked" % name)
        for name in ("prefill-0", "prefill-1"):
            port = up.metrics_port(name)
            wait_until(lambda: msum(scrape(port), "k3pd_prefill_queued_prompt_tokens") == 0 and
                       msum(scrape(port), "k3pd_prefill_running_requests") == 0, 30, "%s idle" % name)
            check(True, "%s: no queued or running prompt left" % name)

        for k, rport in enumerate(rports):
            def router_settled():
                t = scrape(rport)
                return (msum(t, "k3pd_router_requests_started_total") == msum(t, "k3pd_router_requests_total") and
                        msum(t, "k3pd_router_active_streams") == 0)

            wait_until(router_settled, 30, "router %d: requests started == finished, no stream open" % k)
            t = scrape(rport)
            check(True, "router %d: %d requests started == finished, no stream open (%d restarts, %d workers lost)" %
                  (k, msum(t, "k3pd_router_requests_started_total"), msum(t, "k3pd_router_request_restarts_total"),
                   msum(t, "k3pd_router_workers_lost_total")))
            # file descriptors: channels to dead workers are dropped (give gRPC a moment to close them)
            pid = router_pids[k]
            fd_end = wait_until(lambda: (lambda n: n if n <= fd0[k] else None)(proc_fds(pid)), 30,
                                "router %d's descriptors back at %d (now %d)" % (k, fd0[k], proc_fds(pid)))
            check(fd_end <= fd0[k], "router %d file descriptors: %d at the start, %d at the end" % (k, fd0[k], fd_end))
            third = max(1, len(rss[k]) // 3)
            first, last = max(rss[k][:third]), max(rss[k][-third:])
            check(last <= first * 1.25 + 16 * 1024, "router %d RSS flat: %.1f MiB max in the first third, %.1f MiB in "
                  "the last" % (k, first / 1024, last / 1024))
        for ch in channels:
            ch.close()
        ok = True
    finally:
        stop_load.set()
        up.p.send_signal(signal.SIGINT)
        try:
            rc = up.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.p.kill()
            rc = "killed"
        up.log.close()
        if not ok:
            print(up.text()[-20000:])
    check(rc == 0, "k3pd-cli up stopped cleanly (exit %s)" % rc)


if __name__ == "__main__":
    run_driver(main)
