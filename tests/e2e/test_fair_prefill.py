#!/usr/bin/python3
"""Fair prefill (issue 18 item 3): a short prompt's time to first token does not grow with other
users' long prompts.

One prefill worker (runner chunk C = 256 tokens), eight prompts of 2,000 tokens sent at once (CI: 768
tokens in 128-token chunks, the same structure at a third of the compute),
then, once the worker is computing them, an 8-token prompt. The verdict counts forward passes,
never time: the prefill worker logs, per prompt, how many passes its wait for the first token
overlapped (the pass running at its arrival included). The short prompt's must be <= 2: the pass
in progress and its own. The long prompts keep their tokens (each equals k3pd-generate), and
every pass took at most one chunk of each prompt: the long prompts needed >= ceil(2000/256) = 8
passes (ceil(L / C)). The measured pass time and the short prompt's TTFT are printed (docs/perf-cluster.md).
Usage: test_fair_prefill.py --bindir BUILD --gen PYSTUBS --workdir DIR [--long-tokens N] [--long N] [--chunk C]
"""
import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3cluster import Cluster, load_stubs  # noqa: E402
from k3check import run as run_driver, check, wait_until, scrape, msum  # noqa: E402


WORKER_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "16"]


def monolithic(bindir, model, prompt):
    out = subprocess.run([os.path.join(bindir, "tools", "generate", "k3pd-generate"), "--model", model, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-new-tokens", "2", "--ignore-eos"] + WORKER_ARGS,
                         capture_output=True, text=True, timeout=900)
    return [int(x) for x in [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][-1][4:].split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--long", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=256, help="the prefill worker's --prefill-chunk (a multiple of 64)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    stubs = load_stubs(args.gen)
    c, g, _, _ = stubs
    model = os.path.join(args.workdir, "tiny")
    subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                    "--seed", "4"], check=True, capture_output=True, timeout=120)
    longs = [[(i * 389 + k * 17) % 3800 + 1 for k in range(args.long_tokens)] for i in range(args.long)]
    short = [11, 12, 13, 14, 15, 16, 17, 18]
    with cf.ThreadPoolExecutor(max_workers=2) as ex:
        mono = list(ex.map(lambda p: monolithic(args.bindir, model, p), longs[:2] + [short]))
    # The prefix cache off: this test counts the prefill worker's passes over whole prompts (with
    # the cache on the decode worker computes each prompt's last partial block itself)
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, "cluster"), 1, 1, worker_args=WORKER_ARGS, stubs=stubs,
                 decode_args=["--num-pages", "2048"], router_args=["--prefix-cache", "off"],
                 prefill_args=["--metrics-port", "0", "--metrics-host", "127.0.0.1", "--prefill-chunk", str(args.chunk)])
    ok = False
    try:
        cl.start()
        pf = cl.prefills()[0]
        pport = int(re.search(r"metrics on port (\d+)", pf.text()).group(1))
        gen = cl.generate_call()

        def one(prompt):
            t0 = time.time()
            ids, ttft = [], None
            for ch in gen(g.GenerateRequest(token_ids=g.TokenIds(ids=prompt), sampling=c.SamplingParams(temperature=0),
                                            stop=c.StopConditions(max_new_tokens=2, ignore_eos=True)), timeout=900):
                if ch.token_ids and ttft is None:
                    ttft = time.time() - t0
                ids += list(ch.token_ids)
            return ids, ttft

        res = {}
        ths = []
        for i, p in enumerate(longs):
            th = threading.Thread(target=lambda i=i, p=p: res.__setitem__(i, one(p)))
            th.start()
            ths.append(th)
        # the long prompts are being computed: at least one pass done and none finished
        wait_until(lambda: msum(scrape(pport), "k3pd_prefill_passes_total") >= 1, 300, "the first pass")
        passes_at = msum(scrape(pport), "k3pd_prefill_passes_total")
        check("first token after" not in pf.text(), "the long prompts are mid-way (%d passes run) when the short one "
                                                    "is sent" % passes_at)
        sids, sttft = one(short)
        m = re.search(r"prefill 8 tokens in [0-9.]+ ms \(first token after (\d+) passes\)", pf.text())
        check(m is not None, "the prefill worker logged the short prompt's passes")
        spanned = int(m.group(1))
        for th in ths:
            th.join(timeout=900)
        t = scrape(pport)
        n_pass = msum(t, "k3pd_prefill_passes_total")
        fsum, fcnt = msum(t, "k3pd_prefill_forward_seconds_sum"), msum(t, "k3pd_prefill_forward_seconds_count")
        long_passes = [int(x) for x in re.findall(r"prefill %d tokens in [0-9.]+ ms \(first token after (\d+) passes\)"
                                                  % args.long_tokens, pf.text())]
        print("fair prefill: %d passes in all, mean pass %.1f ms; the 8-token prompt waited %d passes, TTFT %.0f ms; "
              "long prompts' first tokens after %s passes" % (n_pass, 1000 * fsum / max(fcnt, 1), spanned,
                                                               1000 * sttft, sorted(long_passes)), flush=True)
        check(spanned <= 2, "the 8-token prompt's first token came within 2 passes of its arrival (%d)" % spanned)
        need = -(-args.long_tokens // args.chunk)
        check(len(long_passes) == args.long and min(long_passes) >= need,
              "every long prompt took >= %d passes (one chunk per pass): %s" % (need, sorted(long_passes)))
        check(sids == mono[2], "the short prompt's tokens equal k3pd-generate's")
        check(res[0][0] == mono[0] and res[1][0] == mono[1], "long prompts split across passes keep their tokens")
        check(all(len(res[i][0]) == 2 for i in range(args.long)), "every long prompt was served")
        ok = True
    finally:
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    check(all(v == 0 for v in codes.values()), "clean shutdown (%s)" % codes)


if __name__ == "__main__":
    run_driver(main)
