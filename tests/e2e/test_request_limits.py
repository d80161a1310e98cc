#!/usr/bin/python3
"""Bounded request cost (issue 18 item 4), on a local tiny cluster driven from python3-grpcio.

Every verdict is a status, a message, a counter or a memory figure, never a duration:
  - the router's request size limit is derived from the context (8 MiB for the tiny model's 1M
    positions, logged at start) and a 50 MB text is refused by the transport (RESOURCE_EXHAUSTED)
    without reaching the router's code: nothing is tokenised, and (outside ASan, whose
    quarantine keeps freed memory) the router's RSS grows by less than the request's size;
  - with the limit raised to 64 MiB, a 50 MB text and a chat whose content is 50 MB are refused
    before any tokenisation (INVALID_ARGUMENT naming prompt / chat.messages: the text is longer
    than the context times the longest token), over gRPC and over HTTP (400 naming messages);
  - a text that passes that bound but has more tokens than the context: tokenisation stops at
    the context (INVALID_ARGUMENT "prompt: more than N tokens"), once, on the pool;
  - requests of normal size are served meanwhile, and the same tokens as before.
Usage: test_request_limits.py --bindir BUILD --gen PYSTUBS --workdir DIR
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3cluster import Cluster, load_stubs  # noqa: E402
from k3check import run as run_driver, check  # noqa: E402

WORKER_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "16"]
MB50 = 50_000_000


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as f:
        text = f.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + " "))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def asan(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return "libasan" in out


def run(cl, req, timeout=120):
    ids = []
    try:
        for ch in cl.generate_call()(req, timeout=timeout):
            ids += list(ch.token_ids)
        return "OK", ids, ""
    except grpc.RpcError as e:
        return e.code().name, ids, e.details() or ""


def start(args, stubs, model, name, router_extra):
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, name), 1, 1, worker_args=WORKER_ARGS, stubs=stubs,
                 decode_args=["--num-pages", "256"],  # 4096 tokens of context
                 router_args=["--metrics-port", "0", "--metrics-host", "127.0.0.1", "--http-port", "0",
                              "--http-host", "127.0.0.1"] + router_extra)
    cl.start()
    # big messages from this client
    cl.channel.close()
    cl.channel = grpc.insecure_channel("127.0.0.1:%d" % cl.port, options=[("grpc.max_send_message_length", 200 << 20)])
    return cl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    stubs = load_stubs(args.gen)
    c, g, _, _ = stubs
    model = os.path.join(args.workdir, "tiny")
    subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                    "--seed", "2"], check=True, capture_output=True, timeout=120)
    small = g.GenerateRequest(text="Hello there", sampling=c.SamplingParams(temperature=0),
                              stop=c.StopConditions(max_new_tokens=4, ignore_eos=True))
    big_text = g.GenerateRequest(text="hello world " * (MB50 // 12), stop=c.StopConditions(max_new_tokens=2))
    # ---- default limit: refused by the transport ----
    cl = start(args, stubs, model, "default", [])
    ok = False
    try:
        rport = int(re.search(r"metrics on port (\d+)", cl.router.text()).group(1))
        m = re.search(r"requests up to (\d+) bytes", cl.router.text())
        check(m and int(m.group(1)) == 8 << 20, "default request limit derived from the context: %s bytes" %
              (m.group(1) if m else "?"))
        code, ref, _ = run(cl, small)
        check(code == "OK" and len(ref) == 4, "a small text request is served")
        tok0 = metric(rport, "k3pd_router_tokenize_seconds_count")
        time.sleep(0.5)
        r0 = rss_kb(cl.router.p.pid)
        code, _, det = run(cl, big_text)
        check(code == "RESOURCE_EXHAUSTED", "50 MB text -> RESOURCE_EXHAUSTED from the transport (%s: %s)" %
              (code, det[:120]))
        time.sleep(1)
        r1 = rss_kb(cl.router.p.pid)
        check(metric(rport, "k3pd_router_tokenize_seconds_count") == tok0, "the 50 MB text was never tokenised")
        if asan(os.path.join(args.bindir, "router", "k3pd-router")):
            print("(ASan build: RSS not judged, its quarantine keeps freed memory) %.1f -> %.1f MB" % (r0 / 1024,
                                                                                                    r1 / 1024))
        else:
            check(r1 - r0 < MB50 // 1024, "router RSS grew by %.1f MB (< the request's 50 MB)" % ((r1 - r0) / 1024))
        code, ids, _ = run(cl, small)
        check(code == "OK" and ids == ref, "the same small request after it: the same tokens")
        ok = True
    finally:
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    check(all(v == 0 for v in codes.values()), "clean shutdown (%s)" % codes)
    # ---- limit raised: refused before tokenisation ----
    cl = start(args, stubs, model, "raised", ["--max-request-bytes", "64M", "--http-max-body-bytes", "64M"])
    ok = False
    try:
        rport = int(re.search(r"metrics on port (\d+)", cl.router.text()).group(1))
        hport = int(re.search(r"HTTP API \(OpenAI-compatible\) on port (\d+)", cl.router.text()).group(1))
        mtb = int(re.search(r"longest token (\d+) bytes", cl.router.text()).group(1))
        tok0 = metric(rport, "k3pd_router_tokenize_seconds_count")
        code, _, det = run(cl, big_text)
        check(code == "INVALID_ARGUMENT" and det.startswith("prompt: a text of") and "context limit of 4096" in det,
              "50 MB text under a 64 MiB limit -> INVALID_ARGUMENT naming prompt (%s)" % det[:160])
        chat = g.GenerateRequest(chat=g.ChatInput(messages=[g.ChatMessage(role=g.CHAT_ROLE_USER, content="x" * MB50)]),
                                 stop=c.StopConditions(max_new_tokens=2))
        code, _, det = run(cl, chat)
        check(code == "INVALID_ARGUMENT" and det.startswith("chat.messages:"),
              "50 MB chat content -> INVALID_ARGUMENT naming chat.messages (%s)" % det[:160])
        body = json.dumps({"messages": [{"role": "user", "content": "y" * MB50}], "max_tokens": 2}).encode()
        try:
            urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % hport, data=body,
                                                          headers={"Content-Type": "application/json"}), timeout=120)
            hst, hmsg = 200, ""
        except urllib.error.HTTPError as e:
            hst, hmsg = e.code, json.loads(e.read().decode())["error"]["message"]
        check(hst == 400 and hmsg.startswith("messages:"), "HTTP: 50 MB chat content -> 400 naming messages (%d %s)" %
              (hst, hmsg[:120]))
        check(metric(rport, "k3pd_router_tokenize_seconds_count") == tok0, "none of them was tokenised")
        # passes the byte bound (4094 tokens x the longest token) but has more tokens than fit
        rnd = random.Random(7)
        words = ["%c%c%c" % (rnd.randrange(97, 123), rnd.randrange(97, 123), rnd.randrange(97, 123))
                 for _ in range(4094 * mtb // 5)]
        text = " ".join(words)[:4094 * mtb]
        code, _, det = run(cl, g.GenerateRequest(text=text, stop=c.StopConditions(max_new_tokens=2)))
        check(code == "INVALID_ARGUMENT" and det.startswith("prompt: more than 4094 tokens"),
              "a %d-byte text over the context -> tokenisation stopped at the context (%s)" % (len(text), det[:120]))
        check(metric(rport, "k3pd_router_tokenize_seconds_count") == tok0 + 1, "... tokenised once, on the pool")
        code, ids, _ = run(cl, small)
        check(code == "OK" and ids == ref, "a small request afterwards: the same tokens")
        ok = True
    finally:
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    check(all(v == 0 for v in codes.values()), "clean shutdown (%s)" % codes)


if __name__ == "__main__":
    run_driver(main)
