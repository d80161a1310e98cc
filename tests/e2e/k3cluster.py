"""Local k3pd cluster for tests: router + N prefill + M decode workers on loopback.

Every process gets its own log file in the work dir; every wait is bounded; stop() sends
SIGTERM, waits, then SIGKILLs stragglers, and reports exit codes so tests can assert a clean
shutdown. Used by the e2e tests (driven from Debian's python3-grpcio, an off-the-shelf client).

Security (docs/operations.md "Security"): the router's public port (self.port) is plaintext; the
workers register on its cluster port (self.cport) and serve their own port with mutual TLS, all
with certificates from a development CA in <workdir>/tls (--tls-dev-dir). Calls this harness
makes to a worker (health, Decode/Stats) present a certificate issued for the router's identity
(k3pd-cli certs) and expect the worker's id in the worker's certificate."""
import os
import re
import signal
import subprocess
import sys
import time

import grpc


def load_stubs(gen):
    if gen not in sys.path:
        sys.path.insert(0, gen)
    from k3pd.v1 import common_pb2, decode_pb2, generation_pb2  # noqa: E402
    import importlib.util
    path = os.path.join(gen, "grpc", "health", "v1", "health_pb2.py")
    spec = importlib.util.spec_from_file_location("k3pd_health_pb2", path)
    health_pb2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(health_pb2)
    return common_pb2, generation_pb2, decode_pb2, health_pb2


class Proc:
    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def alive(self):
        return self.p.poll() is None


class Cluster:
    def __init__(self, bindir, model, workdir, n_prefill=1, n_decode=1, worker_args=(), decode_args=(),
                 prefill_args=(), router_args=(), stubs=None):
        self.bindir = bindir
        self.model = model
        self.workdir = workdir
        self.n_prefill = n_prefill
        self.n_decode = n_decode
        self.worker_args = list(worker_args)
        self.decode_args = list(decode_args)
        self.prefill_args = list(prefill_args)
        self.router_args = list(router_args)
        self.procs = []
        self.router = None
        self.port = None
        self.stubs = stubs
        self.channel = None
        self.cport = None
        self.router_port = None  # the router's real public port (tests may point self.port elsewhere)
        self.tls_dir = os.path.join(workdir, "tls")
        self._client_creds = None
        self.public_creds = None  # grpc channel credentials when the router's public port has TLS
        os.makedirs(workdir, exist_ok=True)

    def _bin(self, name):
        sub = {"k3pd-router": "router", "k3pd-prefill": "prefill_worker", "k3pd-decode": "decode_worker"}[name]
        return os.path.join(self.bindir, sub, name)

    def start_router(self, timeout=20):
        pf = os.path.join(self.workdir, "router.port")
        cpf = os.path.join(self.workdir, "router.cport")
        for f in (pf, cpf):
            if os.path.exists(f):
                os.unlink(f)
        argv = [self._bin("k3pd-router"), "--model", self.model, "--listen", "127.0.0.1:0", "--port-file", pf,
                "--cluster-port-file", cpf, "--tls-dev-dir", self.tls_dir,
                "--heartbeat-ms", "200", "--heartbeat-timeout-ms", "1500"] + self.router_args
        self.router = Proc("router", argv, os.path.join(self.workdir, "router.log"))
        self.procs.append(self.router)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(pf) and open(pf).read().strip():
                self.port = self.router_port = int(open(pf).read().strip())
                self.cport = int(open(cpf).read().strip())
                return
            if not self.router.alive():
                raise RuntimeError("router exited:\n" + self.router.text())
            time.sleep(0.05)
        raise RuntimeError("router did not start within %ss" % timeout)

    def router_target(self):
        """Where workers register: the router's cluster port (a test that points self.port
        somewhere else, e.g. at a closed port, gets that port instead)."""
        return "127.0.0.1:%d" % (self.cport if self.port == self.router_port else self.port)

    def start_worker(self, role, idx, extra=(), wait=True, timeout=60, env=None):
        name = "k3pd-%s" % role
        argv = [self._bin(name), "--model", self.model, "--router", self.router_target(),
                "--tls-dev-dir", self.tls_dir,
                "--listen", "127.0.0.1:0", "--worker-id", "%s-%d" % (role, idx)] + self.worker_args
        argv += self.decode_args if role == "decode" else self.prefill_args
        argv += list(extra)
        if role == "decode" and not any(a in argv for a in ("--local-prefill-max-tokens", "--cost-profile")):
            # the threshold a decode worker derives by default (a start-up probe, docs/design.md "The
            # local-prefill threshold") depends on this machine's speed: the drivers pin the old
            # default so which path a request takes does not (test_prefix_cache checks the probe)
            argv += ["--local-prefill-max-tokens", "512"]
        p = Proc("%s-%d" % (role, idx), argv, os.path.join(self.workdir, "%s-%d.log" % (role, idx)),
                 env=dict(os.environ, **env) if env else None)
        self.procs.append(p)
        if wait:
            self.wait_registered(p, timeout)
        return p

    def wait_registered(self, p, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if "registered with router" in p.text():
                return
            if not p.alive():
                raise RuntimeError("%s exited:\n%s" % (p.name, p.text()))
            time.sleep(0.05)
        raise RuntimeError("%s did not register within %ss:\n%s" % (p.name, timeout, p.text()))

    def start(self):
        self.start_router()
        ws = [self.start_worker("prefill", i, wait=False) for i in range(self.n_prefill)]
        ws += [self.start_worker("decode", i, wait=False) for i in range(self.n_decode)]
        for w in ws:
            self.wait_registered(w)
        self.channel = self.public_channel()
        grpc.channel_ready_future(self.channel).result(timeout=10)
        return self

    def public_channel(self):
        addr = "127.0.0.1:%d" % self.port
        return grpc.secure_channel(addr, self.public_creds) if self.public_creds else grpc.insecure_channel(addr)

    def worker_addr(self, p):
        m = re.search(r"advertised ([0-9.]+:[0-9]+)", p.text())
        return m.group(1) if m else None

    def generate_call(self):
        _, g, _, _ = self.stubs
        return self.channel.unary_stream("/k3pd.v1.Generation/Generate",
                                         request_serializer=g.GenerateRequest.SerializeToString,
                                         response_deserializer=g.GenerateResponse.FromString)

    def client_creds(self, name="k3pd-router"):
        """grpc channel credentials with a development certificate for `name` (cached)."""
        if self._client_creds is None or self._client_creds[0] != name:
            prefix = os.path.join(self.workdir, "client-" + name)
            subprocess.run([os.path.join(self.bindir, "tools", "cli", "k3pd-cli"), "certs", "--dir", self.tls_dir,
                            "--name", name, "--out", prefix], check=True, capture_output=True, timeout=30)
            rd = lambda f: open(f, "rb").read()  # noqa: E731
            self._client_creds = (name, grpc.ssl_channel_credentials(
                root_certificates=rd(os.path.join(self.tls_dir, "ca.crt")), private_key=rd(prefix + ".key"),
                certificate_chain=rd(prefix + ".crt")))
        return self._client_creds[1]

    def worker_channel(self, p):
        """A mutual-TLS channel to worker process p (its certificate must carry its id, p.name)."""
        return grpc.secure_channel(self.worker_addr(p), self.client_creds(),
                                   options=[("grpc.ssl_target_name_override", p.name)])

    def decode_stats(self, p, timeout=5):
        _, _, d, _ = self.stubs
        with self.worker_channel(p) as ch:
            stats = ch.unary_unary("/k3pd.v1.Decode/Stats", request_serializer=d.StatsRequest.SerializeToString,
                                   response_deserializer=d.StatsResponse.FromString)
            return stats(d.StatsRequest(), timeout=timeout)

    def channel_to(self, addr):
        """The router's public port is plaintext; a worker's port needs the cluster certificate."""
        for p in self.procs:
            if p is not self.router and self.worker_addr(p) == addr:
                return self.worker_channel(p)
        if self.public_creds and addr == "127.0.0.1:%d" % self.port:
            return self.public_channel()
        return grpc.insecure_channel(addr)

    def health(self, addr, service="", timeout=3):
        _, _, _, h = self.stubs
        with self.channel_to(addr) as ch:
            check = ch.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=h.HealthCheckRequest.SerializeToString,
                                   response_deserializer=h.HealthCheckResponse.FromString)
            return check(h.HealthCheckRequest(service=service), timeout=timeout).status

    def decodes(self):
        return [p for p in self.procs if p.name.startswith("decode")]

    def prefills(self):
        return [p for p in self.procs if p.name.startswith("prefill")]

    def stop(self, timeout=20):
        """SIGTERM workers then the router; returns {name: exit code}."""
        codes = {}
        if self.channel:
            self.channel.close()
            self.channel = None
        order = [p for p in self.procs if p is not self.router] + ([self.router] if self.router else [])
        for p in order:
            if p.alive():
                p.p.send_signal(signal.SIGTERM)
        deadline = time.time() + timeout
        for p in order:
            try:
                codes[p.name] = p.p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.p.kill()
                codes[p.name] = "killed"
            p.log.close()
        self.procs = []
        return codes

    def dump_logs(self):
        for f in sorted(os.listdir(self.workdir)):
            if f.endswith(".log"):
                print("==== %s" % f)
                print(open(os.path.join(self.workdir, f), errors="replace").read()[-4000:])
