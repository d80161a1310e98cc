"""Helpers of the HTTP API tests (tests/http/test_*.py): a tiny local cluster with the router's
OpenAI-compatible port on, reference results through the gRPC API, raw HTTP, /metrics.
Not a test by itself. Every wait is bounded."""
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client"))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from bb_common import WORKER_ARGS, metric, metrics_port, scrape  # noqa: E402,F401
from k3cluster import Cluster, load_stubs  # noqa: E402,F401

NUM_PAGES = 32      # decode pool: 32 pages x 16 tokens = 512 tokens of context
NUM_SLOTS = 16
MAX_NEW_LIMIT = 600  # router --max-new-tokens-limit (above the context: the context check answers)
PASSED = [0]
FAILED = []


def check(cond, what):
    if cond:
        PASSED[0] += 1
        print("ok -", what, flush=True)
    else:
        FAILED.append(what)
        print("NOT OK -", what, flush=True)


def make_model(bindir, workdir):
    model = os.path.join(workdir, "tiny")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                        "--seed", "11"], check=True, capture_output=True, timeout=120)
    return model


def start_cluster(args, name, router_extra=(), num_pages=NUM_PAGES):
    """Router (gRPC + HTTP on ephemeral ports) + 1 prefill + 1 decode; returns (cluster, http_port)."""
    stubs = load_stubs(args.gen)
    model = make_model(args.bindir, args.workdir)
    wd = os.path.join(args.workdir, name)
    os.makedirs(wd, exist_ok=True)
    pf = os.path.join(wd, "http.port")
    if os.path.exists(pf):
        os.unlink(pf)
    metr = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
    cl = Cluster(args.bindir, model, wd, 1, 1, worker_args=WORKER_ARGS + metr,
                 decode_args=["--num-pages", str(num_pages)], stubs=stubs,
                 router_args=["--max-new-tokens-limit", str(MAX_NEW_LIMIT), "--http-port", "0", "--http-host",
                              "127.0.0.1", "--http-port-file", pf] + metr + list(router_extra))
    cl.start()
    deadline = time.time() + 10
    while time.time() < deadline and not (os.path.exists(pf) and open(pf).read().strip()):
        time.sleep(0.05)
    return cl, int(open(pf).read().strip()), model


def raw_http(port, data, timeout=10, shut_wr=False, read=True):
    """Sends raw bytes on a fresh connection; returns what came back before the close or timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        if data:
            s.sendall(data)
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        if read:
            deadline = time.time() + timeout
            while time.time() < deadline:
                try:
                    b = s.recv(65536)
                except (socket.timeout, ConnectionResetError):
                    break
                if not b:
                    break
                out += b
    finally:
        s.close()
    return out


def status_of(resp):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", resp)
    return int(m.group(1)) if m else None


def wait_pool_free(cl, timeout=15):
    """True once the decode worker reports no page or slot held by a request (after its
    quarantine): every page free or held only by the prefix cache (state "cached", evictable)."""
    dport = metrics_port(cl.decodes()[0])
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, t = scrape(dport)
        held = sum(metric(t, m, 'state="%s"' % st) for m in ("k3pd_decode_kv_pages", "k3pd_decode_kda_slots")
                   for st in ("reserved", "used"))
        pages = metric(t, "k3pd_decode_kv_pages", 'state="free"') + metric(t, "k3pd_decode_kv_pages", 'state="cached"')
        slots = metric(t, "k3pd_decode_kda_slots", 'state="free"') + metric(t, "k3pd_decode_kda_slots", 'state="cached"')
        if held == 0 and pages == NUM_PAGES and slots >= NUM_SLOTS and metric(t, "k3pd_decode_running_sequences") == 0:
            return True
        time.sleep(0.1)
    return False


def router_accounting(port):
    """(started, finished, active) from the router's metrics on its HTTP port."""
    _, t = scrape(port)
    return (metric(t, "k3pd_router_requests_started_total"), metric(t, "k3pd_router_requests_total"),
            metric(t, "k3pd_router_active_streams"))


def finish(cl, t0, name):
    codes = cl.stop()
    check(all(v == 0 for v in codes.values()), "every process exited 0 on SIGTERM (%s)" % codes)
    if FAILED:
        cl.dump_logs()
    print("%s: %d passed, %d failed in %.1f s" % (name, PASSED[0], len(FAILED), time.time() - t0))
    for f in FAILED:
        print("FAILED:", f)
    sys.exit(1 if FAILED else 0)
