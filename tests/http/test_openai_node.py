#!/usr/bin/python3
"""The OpenAI-compatible HTTP API driven by the official OpenAI client library for Node.

1. Installs the pinned `openai` package (tests/http/node/package-lock.json) with `npm ci` into
   the build tree; if npm cannot do that (no registry), the test FAILS.
2. Starts a tiny cluster (router with --http-port, 1 prefill, 1 decode worker).
3. Computes reference results through the gRPC API (python3-grpcio): greedy chat with thinking
   off and on, a text and a token-id completion, seeded sampling, a stop string, logprobs.
4. Runs openai_client.mjs, which makes the same requests through the OpenAI client (whole and
   streamed) and asserts the same tokens, plus response shapes, usage, errors, 429 on a full
   decode pool and a client that aborts a stream.
5. Checks through /metrics that the aborted request was cancelled in the cluster (every page
   and KDA slot free, counted as 499 and cancelled), the router's accounting balances, and
   every process exits 0 on SIGTERM.

Usage: test_openai_node.py --bindir BUILD --gen PYSTUBS --workdir DIR --nodedir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_common import (HERE, MAX_NEW_LIMIT, check, finish, metric, router_accounting, scrape,  # noqa: E402
                         start_cluster, wait_pool_free)

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
TEXT = "The quick brown fox jumps over the lazy dog."
IDS = [17, 250, 3001, 42]


def install_openai(nodedir):
    node = shutil.which("node")
    npm = shutil.which("npm")
    if not node or not npm:
        print("FATAL: node/npm not found (scripts/deps.sh installs nodejs and npm)", flush=True)
        sys.exit(1)
    ver = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if int(ver.lstrip("v").split(".")[0]) < 18:
        print("FATAL: node %s is too old (the pinned openai package needs 18+)" % ver, flush=True)
        sys.exit(1)
    os.makedirs(nodedir, exist_ok=True)
    for f in ("package.json", "package-lock.json"):
        shutil.copy(os.path.join(HERE, "node", f), os.path.join(nodedir, f))
    t0 = time.time()
    r = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=nodedir, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0 or not os.path.exists(os.path.join(nodedir, "node_modules", "openai", "package.json")):
        print("FATAL: npm ci of the pinned openai package failed (is the npm registry reachable?):\n%s\n%s" %
              (r.stdout[-3000:], r.stderr[-3000:]), flush=True)
        sys.exit(1)
    v = json.load(open(os.path.join(nodedir, "node_modules", "openai", "package.json")))["version"]
    print("node %s, openai %s installed in %.1f s" % (ver, v, time.time() - t0), flush=True)
    return node


def gen(cl, g, c, what, **kw):
    req = g.GenerateRequest(**kw)
    chunks = list(cl.generate_call()(req, timeout=60))
    fin = chunks[-1]
    return {"ids": [t for ch in chunks for t in ch.token_ids], "text": "".join(ch.text for ch in chunks),
            "prompt_tokens": fin.usage.prompt_tokens,
            "logprobs": [lp.logprob for ch in chunks for lp in ch.logprobs], "finish": fin.finish_reason}


def references(cl):
    c, g = cl.stubs[0], cl.stubs[1]
    msgs = [g.ChatMessage(role=g.CHAT_ROLE_SYSTEM, content=CHAT[0]["content"]),
            g.ChatMessage(role=g.CHAT_ROLE_USER, content=CHAT[1]["content"])]
    greedy = c.SamplingParams(temperature=0.0)

    def stop(n, strs=()):
        return c.StopConditions(max_new_tokens=n, ignore_eos=True, stop_strings=list(strs))

    cases = {
        "chat_off": gen(cl, g, c, "chat_off", chat=g.ChatInput(messages=msgs, add_generation_prompt=True,
                                                                thinking_off=True),
                        sampling=greedy, stop=stop(12), return_logprobs=True),
        "chat_on": gen(cl, g, c, "chat_on", chat=g.ChatInput(messages=msgs, add_generation_prompt=True),
                       sampling=greedy, stop=stop(10)),
        "chat_low": gen(cl, g, c, "chat_low", chat=g.ChatInput(messages=msgs, add_generation_prompt=True,
                                                                thinking_effort="low"),
                        sampling=greedy, stop=stop(2)),
        "comp_text": gen(cl, g, c, "comp_text", text=TEXT, sampling=greedy, stop=stop(10), return_logprobs=True),
        "comp_ids": gen(cl, g, c, "comp_ids", token_ids=g.TokenIds(ids=IDS), sampling=greedy, stop=stop(6)),
    }
    cases["comp_ids"]["prompt"] = IDS
    seed = 4242
    cases["sampled"] = gen(cl, g, c, "sampled", text=TEXT, stop=stop(10),
                           sampling=c.SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=seed))
    cases["sampled"]["seed"] = seed
    # a stop string taken from the greedy output (3 characters well inside it)
    long = gen(cl, g, c, "long", text=TEXT, sampling=greedy, stop=stop(24))["text"]
    at = next((k for k in range(4, len(long) - 3) if "\ufffd" not in long[k:k + 3] and long[k:k + 3].strip()), None)
    if at is None:
        raise RuntimeError("no usable stop string in %r" % long)
    s = long[at:at + 3]
    cases["stop"] = gen(cl, g, c, "stop", text=TEXT, sampling=greedy, stop=stop(24, [s]))
    cases["stop"]["stop"] = s
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--nodedir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    node = install_openai(args.nodedir)
    cl, port, _ = start_cluster(args, "cluster")
    try:
        cases = references(cl)
        refs = {"model": "tiny", "chat": CHAT, "text": TEXT, "cases": cases, "max_new_limit": MAX_NEW_LIMIT,
                "capacity_max_tokens": 400}
        rp = os.path.join(args.workdir, "refs.json")
        json.dump(refs, open(rp, "w"))
        print("cluster + gRPC references ready in %.1f s" % (time.time() - t0), flush=True)
        env = dict(os.environ, K3PD_NODE_DIR=args.nodedir)
        r = subprocess.run([node, os.path.join(HERE, "openai_client.mjs"), "http://127.0.0.1:%d" % port, rp], env=env,
                           capture_output=True, text=True, timeout=600)
        sys.stdout.write(r.stdout)
        sys.stdout.write(r.stderr[-4000:])
        check(r.returncode == 0, "the OpenAI client library's checks passed (exit %d)" % r.returncode)
        # the aborted stream was cancelled in the cluster
        check(wait_pool_free(cl), "after the aborted stream every decode page and KDA slot is free again (/metrics)")
        _, t = scrape(port)
        check(metric(t, "k3pd_router_http_requests_total", 'route="completions",code="499"') >= 1,
              "the aborted stream is counted as 499 on route completions")
        check(metric(t, "k3pd_router_http_requests_total", 'route="completions",code="429"') >= 1 and
              metric(t, "k3pd_router_http_requests_total", 'route="chat_completions",code="200"') >= 5 and
              metric(t, "k3pd_router_http_requests_total", 'route="models",code="404"') >= 1,
              "k3pd_router_http_requests_total counts by route and code")
        check(metric(t, "k3pd_router_requests_total", 'status="cancelled"') >= 1,
              "the aborted stream is a cancelled request in k3pd_router_requests_total")
        started, done, active = router_accounting(port)
        check(started == done and active == 0, "router accounting balances: started %d == finished %d, %d active" %
              (started, done, active))
    finally:
        finish(cl, t0, "openai-node")


if __name__ == "__main__":
    main()
