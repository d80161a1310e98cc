#!/usr/bin/python3
"""Worker death without lost requests (issue 18 item 2), on a local tiny cluster.

Driven from Debian's python3-grpcio. Every verdict is a count or an equality, never a duration:
  1. SIGKILL of a decode worker while 8 streams run: every stream still completes with the
     tokens k3pd-generate gives (the router resumes it on the other decode worker: the replayed
     tokens are checked and skipped), no stream fails, the router drops the dead worker at once
     (k3pd_router_workers_lost_total) and 40 requests sent right after all succeed;
  2. a decode worker that refuses every Reserve (a fake one, registered through the Cluster
     service and sorting first, so the router tries it first): every request is retried on the
     real decode worker and succeeds;
  3. every status the router returned is one docs/protocol.md documents; afterwards nothing is
     left reserved on the surviving decode worker and every remaining process exits 0.
Usage: test_worker_death.py --bindir BUILD --gen PYSTUBS --workdir DIR
"""
import argparse
import concurrent.futures as cf
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3cluster import Cluster, load_stubs  # noqa: E402
from k3check import run as run_driver, check, wait_until  # noqa: E402

WORKER_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "16"]
DOCUMENTED = {"OK", "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
              "INTERNAL", "ALREADY_EXISTS"}


def monolithic(bindir, model, r):
    argv = [os.path.join(bindir, "tools", "generate", "k3pd-generate"), "--model", model, "--prompt-ids",
            ",".join(map(str, r["prompt"])), "--max-new-tokens", str(r["max_new"]), "--ignore-eos",
            "--seed", str(r["seed"])] + WORKER_ARGS
    if r["temperature"] > 0:
        argv += ["--temperature", repr(r["temperature"]), "--top-k", "50"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError("k3pd-generate failed: %s" % out.stderr[-2000:])
    return [int(x) for x in [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][-1][4:].split()]


def request(stubs, r):
    c, g, _, _ = stubs
    samp = c.SamplingParams(temperature=r["temperature"], seed=r["seed"], top_k=50 if r["temperature"] > 0 else 0)
    return g.GenerateRequest(token_ids=g.TokenIds(ids=r["prompt"]), sampling=samp,
                             stop=c.StopConditions(max_new_tokens=r["max_new"], ignore_eos=True))


def metrics_port(p):
    m = re.search(r"metrics on port (\d+)", p.text())
    return int(m.group(1)) if m else None


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as f:
        text = f.read().decode()
    tot = 0.0
    for ln in text.splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            tot += float(ln.rsplit(" ", 1)[1])
    return tot


class Stream:
    """One Generate stream consumed on its own thread."""

    def __init__(self, cl, stubs, r):
        self.ids, self.final, self.err = [], None, None
        self.call = cl.generate_call()
        self.th = threading.Thread(target=self.run, args=(stubs, r))
        self.th.start()

    def run(self, stubs, r):
        try:
            for ch in self.call(request(stubs, r), timeout=600):
                self.ids += list(ch.token_ids)
                if ch.finish_reason:
                    self.final = ch
        except grpc.RpcError as e:
            self.err = e.code().name


# ---- a decode worker that refuses every Reserve ----

class FakeDecode:
    """Registers as a decode worker with the real workers' fingerprint and answers Reserve with
    UNAVAILABLE (and Watch like a live process), heartbeating until stopped."""

    def __init__(self, stubs, cl, fingerprint):
        import grpc as _g
        c, g, d, h = stubs
        from k3pd.v1 import cluster_pb2  # noqa: E402
        self.reserves = 0
        self.stop_ev = threading.Event()

        def reserve(req, ctx):
            self.reserves += 1
            ctx.abort(_g.StatusCode.UNAVAILABLE, "fake decode worker refuses every reservation")

        def watch(req, ctx):
            yield h.HealthCheckResponse(status=h.HealthCheckResponse.SERVING)
            self.stop_ev.wait(120)

        handlers = {
            "Reserve": _g.unary_unary_rpc_method_handler(reserve, request_deserializer=d.ReserveRequest.FromString,
                                                         response_serializer=d.Reservation.SerializeToString)}
        self.server = _g.server(cf.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((_g.method_handlers_generic_handler("k3pd.v1.Decode", handlers),
                                              _g.method_handlers_generic_handler("grpc.health.v1.Health", {
                                                  "Watch": _g.unary_stream_rpc_method_handler(
                                                      watch, request_deserializer=h.HealthCheckRequest.FromString,
                                                      response_serializer=h.HealthCheckResponse.SerializeToString)})))
        # the cluster's rules: a certificate for its id from the development CA, mutual TLS both
        # ways (the router calls it with the router identity; it registers on the cluster port)
        prefix = os.path.join(cl.workdir, "cert-decode-0-fake")
        subprocess.run([os.path.join(cl.bindir, "tools", "cli", "k3pd-cli"), "certs", "--dir", cl.tls_dir,
                        "--name", "decode-0-fake", "--out", prefix], check=True, capture_output=True, timeout=30)
        rd = lambda f: open(f, "rb").read()  # noqa: E731
        ca, key, crt = rd(os.path.join(cl.tls_dir, "ca.crt")), rd(prefix + ".key"), rd(prefix + ".crt")
        self.port = self.server.add_secure_port("127.0.0.1:0", _g.ssl_server_credentials(
            [(key, crt)], root_certificates=ca, require_client_auth=True))
        self.server.start()
        self.ch = _g.secure_channel("127.0.0.1:%d" % cl.cport,
                                    _g.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                                               certificate_chain=crt),
                                    options=[("grpc.ssl_target_name_override", "k3pd-router")])
        reg = self.ch.unary_unary("/k3pd.v1.Cluster/RegisterWorker",
                                  request_serializer=cluster_pb2.RegisterRequest.SerializeToString,
                                  response_deserializer=cluster_pb2.RegisterResponse.FromString)
        self.hb = self.ch.unary_unary("/k3pd.v1.Cluster/Heartbeat",
                                      request_serializer=cluster_pb2.HeartbeatRequest.SerializeToString,
                                      response_deserializer=cluster_pb2.HeartbeatResponse.FromString)
        cap = cluster_pb2.WorkerCapacity(kv_pages=100000, page_tokens=16, kda_slots=1000, max_batch=16,
                                         max_context_tokens=16384)
        self.rr = cluster_pb2.RegisterRequest(role=c.ROLE_DECODE, worker_id="decode-0-fake",
                                              grpc_address="127.0.0.1:%d" % self.port, ucx_worker_address=b"x",
                                              capacity=cap, load=cluster_pb2.WorkerLoad(),
                                              model_fingerprint=fingerprint, protocol_version=1)
        self.epoch = reg(self.rr, timeout=10).registration_epoch
        self.cluster_pb2 = cluster_pb2
        self.reg = reg
        self.th = threading.Thread(target=self.beat)
        self.th.start()

    def beat(self):
        while not self.stop_ev.wait(0.15):
            try:
                r = self.hb(self.cluster_pb2.HeartbeatRequest(worker_id="decode-0-fake", registration_epoch=self.epoch,
                                                              load=self.cluster_pb2.WorkerLoad()), timeout=5)
                if r.reregister:
                    self.epoch = self.reg(self.rr, timeout=10).registration_epoch
            except grpc.RpcError:
                pass

    def stop(self):
        self.stop_ev.set()
        self.th.join(timeout=10)
        self.ch.close()
        self.server.stop(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    stubs = load_stubs(args.gen)
    model = os.path.join(args.workdir, "tiny")
    subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                    "--seed", "5"], check=True, capture_output=True, timeout=120)
    reqs = [dict(prompt=[(i * 131 + k * 7) % 3800 + 1 for k in range(10 + 13 * i)], max_new=300,
                 temperature=0.0 if i % 2 == 0 else 0.9, seed=1000 + i) for i in range(8)]
    t0 = time.time()
    with cf.ThreadPoolExecutor(max_workers=2) as ex:
        mono = list(ex.map(lambda r: monolithic(args.bindir, model, r), reqs))
    print("monolithic references: %.1f s" % (time.time() - t0), flush=True)
    metrics = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, "cluster"), 1, 2, worker_args=WORKER_ARGS,
                 stubs=stubs, router_args=metrics + ["--heartbeat-timeout-ms", "30000"])
    ok = False
    fake = None
    statuses = {}
    try:
        cl.start()
        rport = metrics_port(cl.router)
        # ---- 1. SIGKILL a decode worker under 8 running streams ----
        streams = [Stream(cl, stubs, r) for r in reqs]
        wait_until(lambda: all(len(s.ids) >= 3 or s.final or s.err for s in streams), 300,
                   "every stream to have streamed tokens")
        running = {p.name: cl.decode_stats(p).running_seqs for p in cl.decodes()}
        victim = max(cl.decodes(), key=lambda p: running[p.name])
        check(running[victim.name] > 0, "streams are running on %s when it is killed (%s)" % (victim.name, running))
        victim.p.send_signal(signal.SIGKILL)
        victim.p.wait(timeout=30)
        # the router drops it at once: no heartbeat timeout (30 s here) is waited for
        wait_until(lambda: metric(rport, "k3pd_router_workers_lost_total") >= 1, 10, "the router to drop the worker")
        check("lost: its health watch ended" in cl.router.text(), "router log: the dead decode worker was dropped")
        # 40 new requests right away: none may fail
        short = dict(prompt=[5, 6, 7], max_new=4, temperature=0.0, seed=1)

        def one(i):
            try:
                n = sum(len(ch.token_ids) for ch in cl.generate_call()(request(stubs, dict(short, seed=i)),
                                                                      timeout=300))
                return "OK" if n == 4 else "SHORT"
            except grpc.RpcError as e:
                return e.code().name

        with cf.ThreadPoolExecutor(max_workers=8) as ex:
            new = list(ex.map(one, range(40)))
        for s in new:
            statuses[s] = statuses.get(s, 0) + 1
        check(new.count("OK") == 40, "40 requests after the kill all succeed (%s)" % statuses)
        for s in streams:
            s.th.join(timeout=600)
        errs = [s.err for s in streams if s.err]
        for s in streams:
            k = s.err or "OK"
            statuses[k] = statuses.get(k, 0) + 1
        check(not errs, "no stream failed (%s)" % errs)
        same = [s.ids == m for s, m in zip(streams, mono)]
        check(all(same), "all 8 streams equal k3pd-generate's tokens (%d of 8; the killed worker's ones resumed)" %
              sum(same))
        check(all(s.final and s.final.finish_reason == stubs[0].FINISH_REASON_LENGTH for s in streams),
              "every stream ended with FINISH_REASON_LENGTH and usage")
        restarts = metric(rport, "k3pd_router_request_restarts_total")
        check(restarts >= 1, "the router resumed the killed worker's streams elsewhere (%d restarts)" % restarts)
        check("replayed, checked and skipped" in cl.router.text(), "router log: replayed tokens checked and skipped")
        # ---- 2. a decode worker that refuses every Reserve ----
        fp = re.search(r"worker decode-\d registered: decode at \S+, fingerprint ([0-9a-f]+)", cl.router.text())
        fake = FakeDecode(stubs, cl, int(fp.group(1), 16))
        wait_until(lambda: "decode-0-fake registered" in cl.router.text(), 10, "the fake decode worker to register")
        with cf.ThreadPoolExecutor(max_workers=4) as ex:
            new = list(ex.map(one, range(100, 112)))
        for s in new:
            statuses[s] = statuses.get(s, 0) + 1
        check(fake.reserves >= 1, "the router tried the refusing decode worker (%d Reserve calls)" % fake.reserves)
        check(new.count("OK") == 12, "12 requests all succeed on the other decode worker after the refusal (%s)" % new)
        fake.stop()
        fake = None
        check(set(statuses) <= DOCUMENTED, "every status returned is documented (%s)" % statuses)
        survivor = [p for p in cl.decodes() if p is not victim][0]
        wait_until(lambda: (lambda st: st.used_kv_pages == 0 and st.used_kda_slots == 0 and st.reservations == 0
                            and st.running_seqs == 0)(cl.decode_stats(survivor)), 30,
                   "the surviving decode worker to be idle")
        check(True, "nothing left reserved on %s" % survivor.name)
        print("statuses: %s" % statuses)
        ok = True
    finally:
        if fake:
            fake.stop()
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    bad = {k: v for k, v in codes.items() if v not in (0, -9)}
    check(not bad, "remaining processes exited 0 (%s)" % codes)


if __name__ == "__main__":
    run_driver(main)
