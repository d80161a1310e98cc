#!/usr/bin/python3
"""Security of a local cluster, from an attacker's side (issue 18: item 1 and item 5's security
cases). Every attack the issue describes is replayed against router + 1 prefill + 1 decode worker on
loopback, driven by Debian's python3-grpcio; each case asserts the refusal AND that the real
workers keep serving. Before the fixes every one of these calls was accepted.

 - the Cluster service is not on the public port (UNIMPLEMENTED there);
 - on the cluster port (mutual TLS): no TLS, TLS without a client certificate and a certificate of
   another CA never get past the handshake (UNAVAILABLE), for RegisterWorker, Heartbeat and
   DeregisterWorker alike; a cluster certificate of another identity cannot act for a worker id
   (PERMISSION_DENIED): no hijack by id; the same identity without the registration's (random)
   epoch cannot replace (ALREADY_EXISTS) or deregister (FAILED_PRECONDITION) it, and a heartbeat
   with another epoch leaves it alone; fingerprint 0, another fingerprint, unbounded capacities,
   a context larger than the pool and another worker's address are refused; the whole register /
   replace / heartbeat / deregister lifecycle works with the right identity and epoch;
 - the issue's flood (deregistrations every 100 ms) while clients send requests: all served;
 - worker ports: nobody but the router's identity may call Prefill/Decode; the plaintext
   health-only ports serve health and nothing else; --metrics-tls keeps /metrics for cluster
   certificates;
 - public API: TLS (a plaintext client cannot talk to it), API keys (missing, malformed and
   unknown keys UNAUTHENTICATED; per-key rate and concurrency limits RESOURCE_EXHAUSTED), the HTTP
   API (401 in the OpenAI error shape, 429, health open, /metrics behind the key);
 - the refusals are counted in the router's metrics; every Generate status received is one
   docs/protocol.md lists; every process exits 0 on SIGTERM.

No verdict depends on the machine's speed: the concurrency case holds a request in flight by
stopping the prefill worker (SIGSTOP) instead of racing two requests, the rate case uses a rate so
low that no refill can happen during the test, and every wait is bounded.

Usage: test_security.py --bindir BUILD --gen PYSTUBS --workdir DIR
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from k3cluster import Cluster, load_stubs  # noqa: E402

WORKER_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "16"]
KEY_A = "alice-" + "a" * 26   # concurrency=1
KEY_B = "bob-" + "b" * 28     # rate 0.001/s, burst 2: two requests, then refused for the rest of the test
KEY_C = "carol-" + "c" * 26   # no limits: the test's ordinary client
DOCUMENTED = {"CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED",
              "UNAUTHENTICATED", "INTERNAL", "UNAVAILABLE"}
PASSED = [0]
FAILED = []
OBSERVED = set()


def check(cond, what):
    if cond:
        PASSED[0] += 1
        print("ok -", what, flush=True)
    else:
        FAILED.append(what)
        print("NOT OK -", what, flush=True)


def rd(path):
    with open(path, "rb") as f:
        return f.read()


class Sec:
    def __init__(self, args, cl, stubs, cp):
        self.args, self.cl, self.cp = args, cl, cp
        self.c, self.g, self.d, self.h = stubs
        self.cli = os.path.join(args.bindir, "tools", "cli", "k3pd-cli")
        self.other_ca = os.path.join(args.workdir, "other-ca")

    # ---- credentials ----
    def creds(self, name, ca_dir=None, trust_dir=None):
        """Channel credentials holding a certificate for `name` issued by the CA in ca_dir (default:
        the cluster's development CA), trusting the CA in trust_dir (default: the cluster's)."""
        ca_dir = ca_dir or self.cl.tls_dir
        trust_dir = trust_dir or self.cl.tls_dir
        prefix = os.path.join(self.args.workdir, "cert-%s-%s" % (os.path.basename(ca_dir), name))
        if not os.path.exists(prefix + ".crt"):
            subprocess.run([self.cli, "certs", "--dir", ca_dir, "--name", name, "--out", prefix], check=True,
                           capture_output=True, timeout=30)
        return grpc.ssl_channel_credentials(root_certificates=rd(os.path.join(trust_dir, "ca.crt")),
                                            private_key=rd(prefix + ".key"), certificate_chain=rd(prefix + ".crt"))

    def live_worker(self, name):
        """A process that answers the router like a live worker named `name`: grpc.health.v1
        Check/Watch SERVING over mutual TLS with a certificate for `name`. The router watches every
        registered worker's health and drops one whose address does not answer at once, so a
        registration meant to stay alive needs this. Returns (address, stop function)."""
        self.creds(name)  # issues the certificate
        prefix = os.path.join(self.args.workdir, "cert-%s-%s" % (os.path.basename(self.cl.tls_dir), name))
        h = self.h
        stop = threading.Event()

        def check_(req, ctx):
            return h.HealthCheckResponse(status=h.HealthCheckResponse.SERVING)

        def watch(req, ctx):
            yield h.HealthCheckResponse(status=h.HealthCheckResponse.SERVING)
            stop.wait(120)

        srv = grpc.server(cf.ThreadPoolExecutor(max_workers=4))
        srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(check_, request_deserializer=h.HealthCheckRequest.FromString,
                                                         response_serializer=h.HealthCheckResponse.SerializeToString),
            "Watch": grpc.unary_stream_rpc_method_handler(watch, request_deserializer=h.HealthCheckRequest.FromString,
                                                          response_serializer=h.HealthCheckResponse.SerializeToString)
        }),))
        port = srv.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
            [(rd(prefix + ".key"), rd(prefix + ".crt"))], root_certificates=rd(os.path.join(self.cl.tls_dir, "ca.crt")),
            require_client_auth=True))
        srv.start()

        def stop_fn():
            stop.set()
            srv.stop(0)
        return "127.0.0.1:%d" % port, stop_fn

    def no_cert(self):
        return grpc.ssl_channel_credentials(root_certificates=rd(os.path.join(self.cl.tls_dir, "ca.crt")))

    def chan(self, addr, creds, peer):
        if creds is None:
            return grpc.insecure_channel(addr)
        return grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", peer)])

    # ---- calls ----
    def unary(self, addr, creds, peer, path, req, resp_cls):
        """(response, None) or (None, RpcError)."""
        with self.chan(addr, creds, peer) as ch:
            m = ch.unary_unary(path, request_serializer=type(req).SerializeToString,
                               response_deserializer=resp_cls.FromString)
            try:
                return m(req, timeout=10), None
            except grpc.RpcError as e:
                return None, e

    def cluster(self, creds, method, req, addr=None):
        cp = self.cp
        resp = {"RegisterWorker": cp.RegisterResponse, "Heartbeat": cp.HeartbeatResponse,
                "DeregisterWorker": cp.DeregisterResponse}[method]
        return self.unary(addr or "127.0.0.1:%d" % self.cl.cport, creds, "k3pd-router", "/k3pd.v1.Cluster/" + method,
                          req, resp)

    def expect(self, res, code, what, prefix=None):
        r, e = res
        got = "OK" if e is None else e.code().name
        det = "" if e is None else (e.details() or "")
        ok = e is not None and e.code() == code and (prefix is None or det.startswith(prefix))
        check(ok, "%s -> %s%s (got %s: %s)" % (what, code.name, " naming %s" % prefix if prefix else "", got, det[:160]))
        return r

    def generate(self, key=KEY_C, max_new=4, timeout=60, prompt=(17, 250, 3001, 42, 7), channel=None):
        g, c = self.g, self.c
        ch = channel or self.cl.channel
        call = ch.unary_stream("/k3pd.v1.Generation/Generate", request_serializer=g.GenerateRequest.SerializeToString,
                               response_deserializer=g.GenerateResponse.FromString)
        req = g.GenerateRequest(token_ids=g.TokenIds(ids=list(prompt)), sampling=c.SamplingParams(temperature=0.0),
                                stop=c.StopConditions(max_new_tokens=max_new, ignore_eos=True))
        md = [("authorization", key)] if key and key.startswith(("Basic", "bearer", "Bearer")) else \
            ([("authorization", "Bearer " + key)] if key else None)
        try:
            chunks = list(call(req, timeout=timeout, metadata=md))
            return sum(len(x.token_ids) for x in chunks), None
        except grpc.RpcError as e:
            OBSERVED.add(e.code().name)
            return None, e

    def served(self, n, what):
        bad = []
        for _ in range(n):
            got, e = self.generate()
            if e is not None or got != 4:
                bad.append(e.code().name + ": " + (e.details() or "")[:80] if e else "%s tokens" % got)
        check(not bad, "%s: %d of %d requests served (%s)" % (what, n - len(bad), n, bad[:3]))

    def register_req(self, wid, role=1, fp=None, addr="127.0.0.1:9", pages=64, ctx=None, replaces=0):
        cp = self.cp
        cap = cp.WorkerCapacity(kv_pages=pages, page_tokens=16, kda_slots=4, max_batch=8,
                                max_context_tokens=pages * 16 if ctx is None else ctx)
        return cp.RegisterRequest(role=role, worker_id=wid, grpc_address=addr, ucx_worker_address=b"fake-ucx-address",
                                  capacity=cap, load=cp.WorkerLoad(), protocol_version=1, model_name="tiny",
                                  model_fingerprint=self.fp if fp is None else fp, replaces_epoch=replaces)


def router_metric(sec, name, labels):
    req = urllib.request.Request("https://127.0.0.1:%d/metrics" % sec.http_port,
                                 headers={"Authorization": "Bearer " + KEY_C})
    with urllib.request.urlopen(req, timeout=10, context=sec.https) as r:
        text = r.read().decode()
    tot = 0.0
    for ln in text.splitlines():
        m = re.match(r"([a-zA-Z0-9_:]+)(\{[^}]*\})? (\S+)$", ln)
        if m and m.group(1) == name and labels in (m.group(2) or ""):
            tot += float(m.group(3))
    return tot


def test_public_port(sec):
    cp = sec.cp
    for method, req in (("RegisterWorker", sec.register_req("decode-0", role=2, fp=0, pages=10 ** 6)),
                        ("Heartbeat", cp.HeartbeatRequest(worker_id="decode-0", load=cp.WorkerLoad())),
                        ("DeregisterWorker", cp.DeregisterRequest(worker_id="decode-0"))):
        with sec.cl.public_channel() as ch:
            m = ch.unary_unary("/k3pd.v1.Cluster/" + method, request_serializer=type(req).SerializeToString,
                               response_deserializer=lambda b: b)
            try:
                m(req, timeout=10)
                check(False, "Cluster/%s on the public port refused" % method)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.UNIMPLEMENTED,
                      "Cluster/%s on the public port -> UNIMPLEMENTED (%s)" % (method, e.code().name))
    # a plaintext client cannot talk to the TLS public port
    with grpc.insecure_channel("127.0.0.1:%d" % sec.cl.port) as ch:
        n, e = sec.generate(channel=ch, timeout=10)
        check(e is not None and e.code() == grpc.StatusCode.UNAVAILABLE,
              "public port with TLS: a plaintext client gets UNAVAILABLE (%s)" % (e.code().name if e else "served"))


def test_anonymous(sec):
    cp = sec.cp
    fake = sec.register_req("decode-0", role=2, fp=0, pages=10 ** 6, ctx=2 ** 24, addr="127.0.0.1:1")
    calls = (("RegisterWorker", fake),
             ("Heartbeat", cp.HeartbeatRequest(worker_id="decode-0", registration_epoch=1, load=cp.WorkerLoad())),
             ("DeregisterWorker", cp.DeregisterRequest(worker_id="decode-0")))
    kinds = (("no TLS", None), ("TLS without a client certificate", sec.no_cert()),
             ("a certificate of another CA", sec.creds("decode-0", ca_dir=sec.other_ca)))
    for kind, creds in kinds:
        for method, req in calls:
            sec.expect(sec.cluster(creds, method, req), grpc.StatusCode.UNAVAILABLE,
                       "cluster port, %s: %s (the issue's anonymous %s)" % (kind, method, method))
    sec.served(8, "after the anonymous calls")
    # a 20,000-token prompt is still beyond every real worker's context (no fake worker claims one)
    n, e = sec.generate(prompt=[5] * 20000, timeout=30)
    check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "context" in (e.details() or ""),
          "a 20,000-token prompt -> INVALID_ARGUMENT naming the context (%s)" % (e.code().name if e else "served"))


def test_identity_and_epochs(sec):
    cp = sec.cp
    evil, dec0 = sec.creds("evil"), sec.creds("decode-0")
    PD, AE, FP = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION
    # another identity of the cluster cannot act for decode-0 (hijack by id, deregister, heartbeat)
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("decode-0", role=2, addr="127.0.0.1:2")), PD,
               "certificate 'evil' registers id decode-0 at another address", "worker_id")
    sec.expect(sec.cluster(evil, "Heartbeat", cp.HeartbeatRequest(worker_id="decode-0", load=cp.WorkerLoad(),
                                                                    draining=True)), PD,
               "certificate 'evil' heartbeats decode-0 as draining", "worker_id")
    sec.expect(sec.cluster(evil, "DeregisterWorker", cp.DeregisterRequest(worker_id="decode-0")), PD,
               "certificate 'evil' deregisters decode-0", "worker_id")
    sec.expect(sec.cluster(evil, "DeregisterWorker", cp.DeregisterRequest(worker_id="prefill-0")), PD,
               "certificate 'evil' deregisters prefill-0", "worker_id")
    # decode-0's own identity (a second process with its key) without the live registration's epoch
    sec.expect(sec.cluster(dec0, "RegisterWorker", sec.register_req("decode-0", role=2, addr="127.0.0.1:3")), AE,
               "identity decode-0 re-registers decode-0 at another address without its epoch", "worker_id")
    sec.expect(sec.cluster(dec0, "RegisterWorker", sec.register_req("decode-0", role=2, addr="127.0.0.1:3",
                                                                    replaces=random.getrandbits(64) | 1)), AE,
               "identity decode-0 re-registers decode-0 with a guessed epoch", "worker_id")
    sec.expect(sec.cluster(dec0, "DeregisterWorker", cp.DeregisterRequest(worker_id="decode-0")), FP,
               "identity decode-0 deregisters decode-0 without an epoch", "registration_epoch")
    sec.expect(sec.cluster(dec0, "DeregisterWorker", cp.DeregisterRequest(
        worker_id="decode-0", registration_epoch=random.getrandbits(64) | 1)), FP,
        "identity decode-0 deregisters decode-0 with a guessed epoch", "registration_epoch")
    r, e = sec.cluster(dec0, "Heartbeat", cp.HeartbeatRequest(worker_id="decode-0", registration_epoch=12345,
                                                                load=cp.WorkerLoad(), draining=True))
    check(e is None and r.reregister, "a heartbeat of decode-0 with another epoch is told to re-register and changes "
          "nothing (%s)" % (e.code().name if e else "reregister=%s" % r.reregister))
    sec.served(8, "after the hijack attempts")
    # model and capacity rules (a certificate of the cluster, its own id)
    IA = grpc.StatusCode.INVALID_ARGUMENT
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("evil", role=2, fp=0)), IA,
               "fingerprint 0", "model_fingerprint")
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("evil", role=2, fp=sec.fp ^ 1)), FP,
               "another model fingerprint", "model_fingerprint")
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("evil", role=2, pages=2 ** 24 + 1)), IA,
               "a claimed pool beyond the bounds", "capacity.kv_pages")
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("evil", role=2, ctx=64 * 16 + 1)), IA,
               "a claimed context larger than the pool", "capacity.max_context_tokens")
    dec_addr = sec.cl.worker_addr(sec.cl.decodes()[0])
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("evil", role=2, addr=dec_addr)), AE,
               "another worker's grpc_address", "grpc_address")
    bad_id = sec.creds("decode-x")
    sec.expect(sec.cluster(bad_id, "RegisterWorker", sec.register_req("decode:x", role=1)), IA,
               "a worker id that is not a certificate name", "worker_id")


def test_lifecycle(sec):
    """The legitimate path, with a spare prefill identity whose address answers health checks but
    serves no Prefill (no traffic runs now)."""
    cp = sec.cp
    spare, evil = sec.creds("spare-0"), sec.creds("evil")
    addr, stop_spare = sec.live_worker("spare-0")
    try:
        lifecycle(sec, cp, spare, evil, addr)
    finally:
        stop_spare()


def lifecycle(sec, cp, spare, evil, addr):
    r, e = sec.cluster(spare, "RegisterWorker", sec.register_req("spare-0", addr=addr))
    check(e is None and r.registration_epoch != 0, "spare-0 registers with its own certificate (%s)" %
          (e.code().name + ": " + e.details() if e else "epoch set"))
    if e is not None:
        return
    e1 = r.registration_epoch
    sec.expect(sec.cluster(spare, "RegisterWorker", sec.register_req("spare-0", addr=addr, replaces=e1 ^ 2)),
               grpc.StatusCode.ALREADY_EXISTS, "spare-0 replaced with a wrong epoch", "worker_id")
    sec.expect(sec.cluster(evil, "RegisterWorker", sec.register_req("spare-0", addr=addr, replaces=e1)),
               grpc.StatusCode.PERMISSION_DENIED, "spare-0 replaced by another identity holding its epoch",
               "worker_id")
    r, e = sec.cluster(spare, "RegisterWorker", sec.register_req("spare-0", addr=addr, replaces=e1))
    check(e is None and r.registration_epoch not in (0, e1), "spare-0 replaces its own registration with its epoch "
          "(%s)" % (e.code().name if e else "new epoch"))
    if e is not None:
        return
    e2 = r.registration_epoch
    r1, _ = sec.cluster(spare, "Heartbeat", cp.HeartbeatRequest(worker_id="spare-0", registration_epoch=e1,
                                                                  load=cp.WorkerLoad()))
    r2, _ = sec.cluster(spare, "Heartbeat", cp.HeartbeatRequest(worker_id="spare-0", registration_epoch=e2,
                                                                  load=cp.WorkerLoad()))
    check(r1 is not None and r1.reregister and r2 is not None and not r2.reregister,
          "heartbeats: the old epoch re-registers, the live one is accepted")
    sec.expect(sec.cluster(spare, "DeregisterWorker", cp.DeregisterRequest(worker_id="spare-0", registration_epoch=e1)),
               grpc.StatusCode.FAILED_PRECONDITION, "spare-0 deregistered with its old epoch", "registration_epoch")
    r, e = sec.cluster(spare, "DeregisterWorker", cp.DeregisterRequest(worker_id="spare-0", registration_epoch=e2))
    check(e is None and r.found, "spare-0 deregisters with its identity and live epoch")


def test_flood(sec):
    """The issue's attack: deregistrations every 100 ms (anonymous, another identity, the worker's own
    identity with guessed epochs, a re-registration at another address) while clients send requests."""
    cp = sec.cp
    stop = threading.Event()
    sent = [0]
    kinds = [None, sec.no_cert(), sec.creds("evil"), sec.creds("decode-0"), sec.creds("prefill-0")]

    def flood():
        while not stop.is_set():
            for creds in kinds:
                for wid in ("decode-0", "prefill-0"):
                    sec.cluster(creds, "DeregisterWorker", cp.DeregisterRequest(
                        worker_id=wid, registration_epoch=random.getrandbits(64), reason="flood"))
                    sent[0] += 1
            sec.cluster(kinds[3], "RegisterWorker", sec.register_req("decode-0", role=2, addr="127.0.0.1:4"))
            stop.wait(0.1)

    th = threading.Thread(target=flood)
    th.start()
    try:
        sec.served(20, "20 requests while deregistrations flood the cluster port every 100 ms")
    finally:
        stop.set()
        th.join(timeout=30)
    check(sent[0] >= 10, "the flood sent %d deregistrations" % sent[0])
    check(router_metric(sec, "k3pd_router_registered_workers", "") == 2, "both real workers still registered")


def test_worker_ports(sec):
    cl, d, cp = sec.cl, sec.d, sec.cp
    dp, pp = cl.decodes()[0], cl.prefills()[0]
    daddr, paddr = cl.worker_addr(dp), cl.worker_addr(pp)
    from k3pd.v1 import prefill_pb2 as pb
    stats = lambda creds: sec.unary(daddr, creds, "decode-0", "/k3pd.v1.Decode/Stats", d.StatsRequest(),  # noqa: E731
                                    d.StatsResponse)
    reserve = d.ReserveRequest(request_id="attack", n_prompt_tokens=10, max_new_tokens=10, lease_ms=100000)
    for kind, creds in (("no TLS", None), ("TLS without a client certificate", sec.no_cert()),
                        ("a certificate of another CA", sec.creds("k3pd-router", ca_dir=sec.other_ca))):
        sec.expect(sec.unary(daddr, creds, "decode-0", "/k3pd.v1.Decode/Reserve", reserve, d.Reservation),
                   grpc.StatusCode.UNAVAILABLE, "decode worker port, %s: Reserve" % kind)
    for who in ("evil", "prefill-0", "decode-0"):
        sec.expect(sec.unary(daddr, sec.creds(who), "decode-0", "/k3pd.v1.Decode/Reserve", reserve, d.Reservation),
                   grpc.StatusCode.PERMISSION_DENIED, "decode worker port, certificate '%s': Reserve" % who, "peer")
    sec.expect(sec.unary(paddr, sec.creds("evil"), "prefill-0", "/k3pd.v1.Prefill/Abort",
                         pb.AbortRequest(request_id="x"), pb.AbortResponse),
               grpc.StatusCode.PERMISSION_DENIED, "prefill worker port, certificate 'evil': Abort", "peer")
    r, e = stats(sec.creds("k3pd-router"))
    check(e is None and r.total_kv_pages > 0, "the router's identity may call the decode worker (Stats)")
    # a worker that is not who the caller expects is refused by the caller (the router dials worker ids)
    r, e = sec.unary(daddr, sec.creds("k3pd-router"), "prefill-0", "/k3pd.v1.Decode/Stats", d.StatsRequest(),
                     d.StatsResponse)
    check(e is not None and e.code() == grpc.StatusCode.UNAVAILABLE,
          "dialing decode-0's address expecting prefill-0: the certificate does not match (%s)" %
          (e.code().name if e else "OK"))
    # plaintext health-only ports: health yes, nothing else
    h = sec.h
    for name, p in (("decode-0", dp), ("router", cl.router)):
        m = re.search(r"health-only port (\d+)", p.text())
        if not m:
            check(False, "%s logs its health-only port" % name)
            continue
        haddr = "127.0.0.1:%s" % m.group(1)
        r, e = sec.unary(haddr, None, None, "/grpc.health.v1.Health/Check", h.HealthCheckRequest(service=""),
                         h.HealthCheckResponse)
        check(e is None and r.status == h.HealthCheckResponse.SERVING, "%s health-only port: Check SERVING" % name)
        if name == "router":
            res = sec.unary(haddr, None, None, "/k3pd.v1.Cluster/RegisterWorker", sec.register_req("decode-0", role=2),
                            cp.RegisterResponse)
        else:
            res = sec.unary(haddr, None, None, "/k3pd.v1.Decode/Stats", d.StatsRequest(), d.StatsResponse)
        sec.expect(res, grpc.StatusCode.UNAUTHENTICATED, "%s health-only port: a service call" % name, "peer")


def test_metrics_tls(sec):
    """The decode worker runs --metrics-tls: HTTPS with its certificate; /metrics needs a client
    certificate of the cluster CA, the probes' endpoints stay open."""
    m = re.search(r"metrics on port (\d+)", sec.cl.decodes()[0].text())
    if not m:
        check(False, "decode-0 logs its metrics port")
        return
    ca = os.path.join(sec.cl.tls_dir, "ca.crt")
    sec.creds("k3pd-router")  # writes the certificate files
    prefix = os.path.join(sec.args.workdir, "cert-%s-k3pd-router" % os.path.basename(sec.cl.tls_dir))

    def get(path, with_cert):
        ctx = ssl.create_default_context(cafile=ca)
        if with_cert:
            ctx.load_cert_chain(prefix + ".crt", prefix + ".key")
        try:
            with urllib.request.urlopen("https://127.0.0.1:%s%s" % (m.group(1), path), timeout=10, context=ctx) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    check(get("/healthz", False) == 200, "metrics over HTTPS: /healthz without a client certificate: 200")
    check(get("/metrics", False) == 403, "metrics over HTTPS: /metrics without a client certificate: 403")
    check(get("/metrics", True) == 200, "metrics over HTTPS: /metrics with a cluster certificate: 200")
    try:
        urllib.request.urlopen("http://127.0.0.1:%s/metrics" % m.group(1), timeout=5)
        check(False, "metrics over HTTPS: plain HTTP refused")
    except (urllib.error.URLError, ConnectionError, OSError):
        check(True, "metrics over HTTPS: plain HTTP refused")


def test_api_keys(sec):
    UN, RE = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED
    for key, what in ((None, "no key"), ("wrong-" + "x" * 30, "an unknown key"), ("Basic " + KEY_C, "a Basic key"),
                      ("bearer", "an empty bearer")):
        n, e = sec.generate(key=key)
        check(e is not None and e.code() == UN and (e.details() or "").startswith("authorization"),
              "Generate with %s -> UNAUTHENTICATED naming authorization (%s)" % (what, e.code().name if e else "served"))
    n, e = sec.generate(key=KEY_C)
    check(e is None and n == 4, "Generate with a valid key is served")
    # bob: burst 2 at 0.001/s: the third request within the test is over the rate
    res = [sec.generate(key=KEY_B) for _ in range(3)]
    check(res[0][1] is None and res[1][1] is None and res[2][1] is not None and res[2][1].code() == RE and
          "rate" in (res[2][1].details() or ""),
          "per-key rate limit: 2 served, the 3rd RESOURCE_EXHAUSTED naming the rate (%s)" %
          [(e.code().name if e else "ok") for _, e in res])
    # alice: one request in flight at a time. Hold one by stopping the prefill worker, send a second,
    # then let the first finish. Exactly one of the two is refused, whichever reached the router first.
    pf = sec.cl.prefills()[0].p
    pf.send_signal(signal.SIGSTOP)
    try:
        with cf.ThreadPoolExecutor(max_workers=2) as ex:
            first = ex.submit(sec.generate, KEY_A, 4, 60)
            time.sleep(0.3)
            second = ex.submit(sec.generate, KEY_A, 4, 60)
            # the refused one ends at once; the admitted one waits for the stopped prefill worker
            cf.wait([first, second], timeout=30, return_when=cf.FIRST_COMPLETED)
            pf.send_signal(signal.SIGCONT)
            r1, r2 = first.result(timeout=90), second.result(timeout=90)
    finally:
        pf.send_signal(signal.SIGCONT)
    outcomes = sorted([("ok" if e is None else e.code().name, "concurrency" in (e.details() or "") if e else False)
                       for _, e in (r1, r2)])
    # a stop longer than the heartbeat timeout (a loaded machine) drops the worker: it re-registers
    deadline = time.time() + 30
    while time.time() < deadline and router_metric(sec, "k3pd_router_registered_workers", "") != 2:
        time.sleep(0.1)
    check(outcomes == [("RESOURCE_EXHAUSTED", True), ("ok", False)],
          "per-key concurrency limit 1: of two requests in flight one is served, the other RESOURCE_EXHAUSTED "
          "naming the limit (%s)" % outcomes)


def http(sec, path, key=None, body=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request("https://127.0.0.1:%d%s" % (sec.http_port, path), headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=30, context=sec.https) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_http(sec):
    body = {"prompt": [17, 250, 3001], "max_tokens": 3, "temperature": 0}
    for key, what in ((None, "no key"), ("wrong-" + "x" * 30, "an unknown key")):
        st, hd, raw = http(sec, "/v1/completions", key, body)
        try:
            err = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            err = {}
        check(st == 401 and err.get("code") == "invalid_api_key" and err.get("type") == "invalid_request_error" and
              "param" in err and err.get("message", "").startswith("authorization") and
              hd.get("WWW-Authenticate") == "Bearer",
              "HTTP /v1/completions with %s -> 401 in the OpenAI error shape (%s %s)" % (what, st, raw[:120]))
    st, _, raw = http(sec, "/v1/completions", KEY_C, body)
    check(st == 200 and len(json.loads(raw)["choices"][0]["text"]) >= 0, "HTTP with a valid key: 200 (%s)" % st)
    st, _, _ = http(sec, "/v1/models")
    check(st == 401, "HTTP /v1/models without a key: 401 (%s)" % st)
    st, _, _ = http(sec, "/healthz")
    check(st == 200, "HTTP /healthz stays open (%s)" % st)
    st, _, _ = http(sec, "/metrics")
    check(st == 401, "HTTP /metrics without a key: 401 (%s)" % st)
    st, _, raw = http(sec, "/v1/completions", KEY_B, body)  # bob is over his rate
    check(st == 429 and json.loads(raw)["error"]["type"] == "rate_limit_error",
          "HTTP with a key over its rate: 429 rate_limit_error (%s)" % st)


def test_metrics(sec):
    for reason in ("missing_key", "unknown_key", "rate_limited", "concurrency_limited"):
        check(router_metric(sec, "k3pd_router_auth_failures_total", 'reason="%s"' % reason) > 0,
              "k3pd_router_auth_failures_total{reason=%s} counted" % reason)
    for reason in ("identity", "epoch", "model", "invalid"):
        check(router_metric(sec, "k3pd_router_cluster_refusals_total", 'reason="%s"' % reason) > 0,
              "k3pd_router_cluster_refusals_total{reason=%s} counted" % reason)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    stubs = load_stubs(args.gen)
    from k3pd.v1 import cluster_pb2 as cp
    t0 = time.time()
    model = os.path.join(args.workdir, "tiny")
    subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                    "--seed", "1"], check=True, capture_output=True, timeout=120)
    cli = os.path.join(args.bindir, "tools", "cli", "k3pd-cli")
    # the public port's certificate comes from its own CA (clients trust that one only)
    pub_ca = os.path.join(args.workdir, "public-ca")
    pub = os.path.join(args.workdir, "public")
    subprocess.run([cli, "certs", "--dir", pub_ca, "--name", "localhost", "--out", pub], check=True,
                   capture_output=True, timeout=30)
    keys = os.path.join(args.workdir, "api-keys")
    with open(keys, "w") as f:
        f.write("# name key [limits]\nalice %s concurrency=1\nbob %s rate=0.001 burst=2\ncarol %s\n" %
                (KEY_A, KEY_B, KEY_C))
    hpf = os.path.join(args.workdir, "http.port")
    if os.path.exists(hpf):
        os.unlink(hpf)
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, "cluster"), 1, 1, stubs=stubs,
                 worker_args=WORKER_ARGS + ["--health-listen", "127.0.0.1:0"],
                 decode_args=["--metrics-tls", "--metrics-port", "0", "--metrics-host", "127.0.0.1"],
                 router_args=["--api-keys", keys, "--public-tls-cert", pub + ".crt", "--public-tls-key", pub + ".key",
                              "--health-listen", "127.0.0.1:0", "--http-port", "0", "--http-host", "127.0.0.1",
                              "--http-port-file", hpf])
    cl.public_creds = grpc.ssl_channel_credentials(root_certificates=rd(os.path.join(pub_ca, "ca.crt")))
    codes = {}
    try:
        cl.start()
        sec = Sec(args, cl, stubs, cp)
        sec.http_port = int(open(hpf).read().strip())
        sec.https = ssl.create_default_context(cafile=os.path.join(pub_ca, "ca.crt"))
        m = re.search(r"cluster model fingerprint ([0-9a-f]+)", cl.router.text())
        sec.fp = int(m.group(1), 16) if m else 1
        print("cluster ready in %.1f s (public %d TLS, cluster %d mTLS, http %d)" %
              (time.time() - t0, cl.port, cl.cport, sec.http_port), flush=True)
        sec.served(8, "baseline")
        for fn in (test_public_port, test_anonymous, test_identity_and_epochs, test_lifecycle, test_flood,
                   test_worker_ports, test_metrics_tls, test_api_keys, test_http, test_metrics):
            t1 = time.time()
            fn(sec)
            print("# %s: %.1f s" % (fn.__name__, time.time() - t1), flush=True)
        sec.served(4, "at the end")
    finally:
        codes = cl.stop()
        if FAILED:
            cl.dump_logs()
    check(all(v == 0 for v in codes.values()), "every process exited 0 on SIGTERM (%s)" % codes)
    check(OBSERVED <= DOCUMENTED, "every Generate status seen is documented (%s)" % sorted(OBSERVED))
    print("security: %d passed, %d failed in %.1f s" % (PASSED[0], len(FAILED), time.time() - t0))
    for f in FAILED:
        print("FAILED:", f)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
