#!/usr/bin/python3
"""Prefix cache exactness (issue 21, docs/design.md "Prefix cache"): cache on == cache off, bit for bit.

The same workloads run through two local clusters built the same way (router + 1 prefill worker
with --prefill-chunk 64, decode workers with 16-token pages): one with the prefix cache on (the
default), one with it off (--prefix-cache off on the router and the decode workers). Every
request's token ids must be identical, for fp32 and for bf16.
Phase 1, one decode worker (placement cannot separate a prompt from its cached prefix, so the
hit checks do not depend on timing):
  - one multi-turn conversation alone: turns 2..4 must reuse their cached prefix;
  - a shared system prompt: 203 tokens (not a block multiple) + a per-user message, 1 user
    alone then 11 at once: at least 6 of them must reuse the system prompt's checkpoint;
  - long-suffix hits (docs/design.md "Long-suffix hits"): a 256-token cached prefix + 744 new
    tokens (over the 512-token local threshold): the prefill worker receives the cached state
    from the decode worker (PrepareResume + Export) and computes only the suffix; then two such
    prompts at once, the second of which has its received state corrupted in flight by a test
    hook (K3PD_TEST_CORRUPT_RESUME=2): the digests refuse it, Export fails, and the request falls
    back to computing from token 0 — with the same tokens.
Phase 2, decode-1 joins with a cache budget smaller than one entry:
  - 3 concurrent 4-turn chats (turn n+1 = turn n's prompt + its reply + a new message), during
    which decode-0 is killed and restarted (it lost its cache; it comes back with the small
    budget too): requests in flight move, the router's view of its cache goes with it;
  - adversarial: strict prefixes of a cached prompt (ending before, on and after a block
    boundary), prompts that diverge from a cached one between checkpoints, the same prompt twice
    at once (racing to create one entry); with both budgets below one entry, entries the router
    still advertises are evicted (misses it did not expect) and eviction is certain.
The cache-on decode workers take their local-prefill threshold from a cost profile
(--cost-profile: 0.125 ms per prefill token, 4 ms decode steps, 16 steps of stall = 64 ms ->
exactly 512 tokens, checked in their start-up log), so which path a request takes never depends
on this machine's speed. Before the clusters: a profile with a negative cost is refused naming the
field, without a profile the worker measures its costs and logs the derived threshold, and a
probe that cannot run (a pool too small for it) leaves the worker serving with 512, logged.
Also: the decode workers computed suffixes locally, no page or slot stays held by a request
afterwards (only by the cache, reported separately), the cache-off cluster reports nothing
cached, and SIGTERM stops every process with status 0.

Usage: test_prefix_cache.py --bindir BUILD --gen PYSTUBS --workdir DIR [--precisions fp32,bf16]
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3check import wait_until  # noqa: E402
from k3cluster import Cluster, load_stubs  # noqa: E402

VOCAB_SAFE = 3800  # below the tiny vocabulary's special / stop ids


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok -", what, flush=True)


def gen(cl, stubs, prompt, max_new, seed, temperature, timeout=120):
    c, g, _, _ = stubs
    samp = c.SamplingParams(temperature=temperature, top_p=1.0, top_k=0, seed=seed)
    req = g.GenerateRequest(token_ids=g.TokenIds(ids=prompt), sampling=samp,
                            stop=c.StopConditions(max_new_tokens=max_new, ignore_eos=True))
    ids, final = [], None
    for chunk in cl.generate_call()(req, timeout=timeout):
        ids += list(chunk.token_ids)
        if chunk.finish_reason:
            final = chunk
    return ids, final


class Workload:
    """Deterministic prompts; turn prompts depend on the replies, so they are built while running
    (the two clusters must reply identically for the prompts to match: that is the test)."""

    def __init__(self, seed):
        self.rnd = random.Random(seed)
        r = self.rnd
        self.chats = [[r.randrange(VOCAB_SAFE) for _ in range(r.choice([90, 130, 200]))] for _ in range(3)]
        self.chat_msgs = [[[r.randrange(VOCAB_SAFE) for _ in range(r.randrange(5, 40))] for _ in range(4)]
                          for _ in range(3)]
        self.system = [r.randrange(VOCAB_SAFE) for _ in range(203)]
        self.users = [[r.randrange(VOCAB_SAFE) for _ in range(r.randrange(8, 30))] for _ in range(12)]
        self.base = [r.randrange(VOCAB_SAFE) for _ in range(200)]
        self.tail = [r.randrange(VOCAB_SAFE) for _ in range(80)]
        self.solo = [r.randrange(VOCAB_SAFE) for _ in range(150)]
        self.long_base = [r.randrange(VOCAB_SAFE) for _ in range(300)]
        self.long_tail = [r.randrange(VOCAB_SAFE) for _ in range(744)]


def run_workloads(cl, stubs, wl, label, restart_cb, add_decode1):
    """Returns {name: ids} for every request, and the final chunks."""
    out, finals = {}, {}

    def one(name, prompt, max_new, seed, temp):
        ids, final = gen(cl, stubs, prompt, max_new, seed, temp)
        out[name] = ids
        finals[name] = final
        return ids

    # Phase 1, one decode worker (decode-0, default budget): placement cannot split a prefix from
    # its entry, so the hit checks below do not depend on timing.
    # (d) one conversation alone: every later turn must reuse its cached prefix
    prompt = list(wl.solo)
    for t in range(4):
        prompt = prompt + wl.chat_msgs[0][t]
        prompt = prompt + one("solo.turn%d" % t, prompt, 12, 77, 0.0)
    # (b) shared system prompt: one user alone, then eleven at once
    one("user0", wl.system + wl.users[0], 6, 7, 0.0)
    with cf.ThreadPoolExecutor(max_workers=11) as ex:
        list(ex.map(lambda i: one("user%d" % i, wl.system + wl.users[i], 6, 7 + i, 0.0 if i % 3 else 1.1),
                    range(1, 12)))
    # (e) long-suffix hit (docs/design.md "Long-suffix hits"): a cached prefix of 256 tokens and a
    # suffix of 744 > the 512-token local threshold: the prefill worker receives the cached state
    # (PrepareResume + Export) and computes only [256, 960); then the same prompt with another
    # ending, racing a copy of itself (two exports of one entry at once)
    one("long.base", wl.long_base, 5, 11, 0.0)  # cached at 256 (its last block boundary)
    one("long.ext", wl.long_base[:256] + wl.long_tail, 6, 12, 0.0)
    with cf.ThreadPoolExecutor(max_workers=2) as ex:
        list(ex.map(lambda i: one("long.race%d" % i, wl.long_base[:256] + wl.long_tail[::-1], 4, 13 + i, 0.0),
                    range(2)))
    # Phase 2, decode-1 joins with a tiny cache budget: placement now also depends on load and on
    # reports that go stale (entries decode-1 evicted), decode-0 is killed mid-chat: only
    # exactness (and that hits happened at all) is asserted from here on.
    add_decode1()
    # (a) multi-turn chats, conversations concurrently, turns in order
    def chat(k):
        prompt = list(wl.chats[k])
        for t in range(4):
            prompt = prompt + wl.chat_msgs[k][t]
            reply = one("chat%d.turn%d" % (k, t), prompt, 12, 1000 + k, 0.0 if k % 2 == 0 else 0.9)
            prompt = prompt + reply
            if t == 1 and k == 0:
                restart_cb()  # a decode worker restarts and loses its cache between turns
    with cf.ThreadPoolExecutor(max_workers=3) as ex:
        list(ex.map(chat, range(3)))
    # (c) adversarial
    one("base", wl.base, 5, 3, 0.0)  # cached at 192 (and 128 is not a checkpoint)
    for n in (150, 128, 129, 64, 65, 192, 193, 199):  # strict prefixes of a cached prompt
        one("prefix%d" % n, wl.base[:n], 5, 3, 0.0)
    one("diverge170", wl.base[:170] + wl.tail, 5, 3, 0.0)  # shares 2 blocks: between checkpoints
    one("diverge170b", wl.base[:170] + wl.tail[:40], 5, 4, 0.0)
    one("extend", wl.base + wl.tail, 5, 5, 0.0)
    with cf.ThreadPoolExecutor(max_workers=2) as ex:  # two requests racing to create one entry
        list(ex.map(lambda i: one("race%d" % i, wl.tail + wl.base, 5, 9, 0.0), range(2)))
    return out, finals


PROFILE = {"schema": "k3pd-profile/1", "source": "e2e_prefix_cache: chosen to give 512 tokens",
           "prefill": {"pass_fixed_ms": 0, "pass_per_seq_ms": 0, "pass_per_token_ms": 0.125},
           "decode": {"step_fixed_ms": 4, "step_per_seq_ms": 0}}


def write_profile(workdir, name, prof):
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        json.dump(prof, f)
    return path


def check_threshold_startup(args, model):
    """--local-prefill-max-tokens unset: derived from a profile (exact) or a start-up probe (logged)."""
    exe = os.path.join(args.bindir, "decode_worker", "k3pd-decode")
    base = [exe, "--model", model, "--router", "127.0.0.1:1", "--insecure-cluster", "--listen", "127.0.0.1:0"]
    bad = dict(PROFILE, prefill={"pass_per_token_ms": -0.5})
    r = subprocess.run(base + ["--cost-profile", write_profile(args.workdir, "bad-profile.json", bad)],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "prefill.pass_per_token_ms" in r.stderr,
          "a cost profile with a negative cost is refused naming the field (status %d: %s)" %
          (r.returncode, r.stderr.strip()[-160:]))
    for what, extra, want in (("the profile", ["--cost-profile", write_profile(args.workdir, "profile.json", PROFILE)],
                               "local-prefill threshold 512 tokens"),
                              ("a start-up probe", [], "measured at start-up"),
                              ("the fallback when the probe cannot run (4 pages of 16 tokens)",
                               ["--num-pages", "4", "--page-tokens", "16"], "threshold 512 tokens (fallback)")):
        log_path = os.path.join(args.workdir, "threshold.log")
        with open(log_path, "w") as log:
            p = subprocess.Popen(base + extra, stdout=log, stderr=subprocess.STDOUT)
        try:
            # "serving on" comes after the signal handlers are installed: SIGTERM is a clean stop then
            wait_until(lambda: any("serving on" in ln for ln in open(log_path)), 120, "the decode worker serving")
            line = next((ln for ln in open(log_path) if "local-prefill threshold" in ln), "(no threshold line)")
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=60)
        check(want in line and rc == 0, "threshold derived from %s and logged: %s (exit %d)" %
              (what, line.strip().split("k3pd-decode: ", 1)[-1], rc))


def start_cluster(args, stubs, model, wdir, prec, cache_on):
    wargs = ["--backend", "cpu-fast", "--threads", "1", "--precision", prec, "--page-tokens", "16",
             "--num-pages", "256", "--num-slots", "16"]
    off = [] if cache_on else ["--prefix-cache", "off"]
    # the threshold from a fixed profile (512 tokens), never from this machine's speed
    dargs = ["--cost-profile", os.path.join(args.workdir, "profile.json")] if cache_on else off
    # 16 slots make one running sequence 1/16 of a worker: the default placement weight (4096
    # tokens for a full worker) would outweigh these short prompts' cached prefixes
    rargs = ["--cache-route-load-tokens", "256"] if cache_on else off
    cl = Cluster(args.bindir, model, wdir, n_prefill=1, n_decode=2, worker_args=wargs,
                 prefill_args=["--prefill-chunk", "64"], decode_args=dargs, router_args=rargs, stubs=stubs)
    cl.start_router()
    # the second long-suffix resume's received state is corrupted before verification (test hook):
    # the digest check must refuse it and the request fall back to computing from token 0
    penv = {"K3PD_TEST_CORRUPT_RESUME": "2"} if cache_on else None
    ws = [cl.start_worker("prefill", 0, wait=False, env=penv), cl.start_worker("decode", 0, wait=False)]
    for w in ws:
        cl.wait_registered(w)
    cl.channel = cl.public_channel()
    import grpc
    grpc.channel_ready_future(cl.channel).result(timeout=10)
    return cl


def add_decode1(cl, cache_on):
    # decode-1's cache holds about two entries (tiny model: a few KiB each), so it evicts entries
    # the router still advertises
    cl.start_worker("decode", 1, extra=["--prefix-cache-bytes", "40000"] if cache_on else [])


def restart_decode0(cl):
    p = [q for q in cl.decodes() if q.name == "decode-0"][0]
    p.p.send_signal(signal.SIGKILL)
    p.p.wait(timeout=10)
    cl.procs.remove(p)
    p.log.close()
    os.rename(p.log_path, p.log_path + ".killed")
    # it comes back with the tiny budget too: from here on every entry either worker creates
    # pushes an older one out (the eviction check below does not depend on placement)
    w = cl.start_worker("decode", 0, extra=["--prefix-cache-bytes", "40000"])
    return w


def run_precision(args, stubs, prec):
    model = os.path.join(args.workdir, "tiny")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out",
                        model, "--seed", "7"], check=True, capture_output=True, timeout=120)
    results = {}
    for cache_on in (True, False):
        label = "%s cache %s" % (prec, "on" if cache_on else "off")
        wl = Workload(seed=21)
        cl = start_cluster(args, stubs, model, os.path.join(args.workdir, "%s-%s" % (prec, "on" if cache_on else "off")),
                           prec, cache_on)
        ok = False
        try:
            t0 = time.time()
            restarted = []
            ids, finals = run_workloads(cl, stubs, wl, label,
                                        lambda: restarted.append(restart_decode0(cl)) if cache_on else None,
                                        lambda: add_decode1(cl, cache_on))
            print("%s: %d requests in %.1f s" % (label, len(ids), time.time() - t0), flush=True)
            results[cache_on] = (ids, finals)
            time.sleep(0.5)
            stats = [cl.decode_stats(p) for p in cl.decodes()]
            if cache_on:
                for p in cl.decodes():
                    with open(p.log_path) as f:
                        check("local-prefill threshold 512 tokens" in f.read(),
                              "%s: %s derived its 512-token threshold from the profile" % (label, p.name))
            for p, st in zip(cl.decodes(), stats):
                check(st.used_kv_pages == 0 and st.used_kda_slots == 0 and st.running_seqs == 0 and
                      st.reservations == 0,
                      "%s: %s holds no request pages/slots (cache: %d pages, %d slots, %d entries)" %
                      (label, p.name, st.cache_kv_pages, st.cache_kda_slots, st.cache_entries))
            if cache_on:
                hits = sum(s.cache_hits for s in stats)
                hit_tok = sum(s.cache_hit_tokens for s in stats)
                local = sum(s.local_prefill_tokens for s in stats)
                evict = sum(s.cache_evictions for s in stats)
                print("%s: hits %d, misses %d, hit tokens %d, local prefill tokens %d, evictions %d" %
                      (label, hits, sum(s.cache_misses for s in stats), hit_tok, local, evict), flush=True)
                # (counters of the decode workers alive now: decode-0's first process is gone)
                n_hit = sum(1 for f in finals.values() if f.usage.cached_prompt_tokens > 0)
                check(n_hit >= 9 and local > 0, "%s: %d requests reused a cached prefix; the decode workers computed "
                      "suffixes" % (label, n_hit))
                check(evict > 0, "%s: cache entries were evicted (phase 2: both decode workers' budgets hold "
                                 "less than one entry)" % label)
                check(len(restarted) == 1, "%s: decode-0 was killed and restarted mid-chat" % label)
                for n in sorted(ids):
                    print("  %s: %d prompt tokens, %d cached" % (n, finals[n].usage.prompt_tokens,
                                                                finals[n].usage.cached_prompt_tokens))
                later = [n for n in ids if n.startswith("chat") and not n.endswith("turn0")]
                cached = [n for n in later if finals[n].usage.cached_prompt_tokens > 0]
                # concurrent chats: not all (one conversation's worker is killed, another may sit on
                # decode-1's tiny cache); the lone conversation below must hit every turn
                print("%s: %d of %d concurrent chat turns >= 2 reused a cached prefix" % (label, len(cached), len(later)))
                solo = ["solo.turn%d" % t for t in range(1, 4)]
                check(all(finals[n].usage.cached_prompt_tokens >= 128 for n in solo),
                      "%s: the lone conversation's turns 2..4 reused their cached prefix (%s tokens)" %
                      (label, [finals[n].usage.cached_prompt_tokens for n in solo]))
                longs = ["long.ext", "long.race0", "long.race1"]
                check(all(finals[n].usage.cached_prompt_tokens == 256 for n in longs),
                      "%s: the long-suffix prompts hit the 256-token prefix (%s)" %
                      (label, [finals[n].usage.cached_prompt_tokens for n in longs]))
                plog = open([p for p in cl.procs if p.name == "prefill-0"][0].log_path).read()
                dlogs = "".join(open(os.path.join(cl.workdir, f)).read() for f in os.listdir(cl.workdir)
                                if f.startswith("decode-"))
                n_res = plog.count("resuming at 256 of 960 prompt tokens from the received state")
                n_fb = plog.count("prepared resume not used")
                n_bad = dlogs.count("export of the cached state failed")
                check(n_res == 2 and n_fb == 1 and "TEST: corrupted" in plog and n_bad == 1,
                      "%s: long-suffix hits resumed on the prefill worker from the exported state (%d), the one "
                      "whose state was corrupted in flight was refused by its digests (%d failed export) and fell "
                      "back to token 0 (%d)" % (label, n_res, n_bad, n_fb))
                users = [n for n in ids if n.startswith("user") and finals[n].usage.cached_prompt_tokens >= 192]
                check(len(users) >= 6, "%s: %d of 12 users reused the shared system prompt" % (label, len(users)))
            else:
                check(all(f.usage.cached_prompt_tokens == 0 for f in finals.values()),
                      "%s: nothing reported cached" % label)
            ok = True
        finally:
            codes = cl.stop()
            if not ok:
                cl.dump_logs()
        check(all(v == 0 for v in codes.values()), "%s: every process exited 0 on SIGTERM (%s)" % (label, codes))
    on, off = results[True][0], results[False][0]
    check(sorted(on) == sorted(off), "%s: both clusters ran the same %d requests" % (prec, len(on)))
    mism = [n for n in sorted(on) if on[n] != off[n]]
    for n in mism:
        print("MISMATCH %s: cache on %s != cache off %s" % (n, on[n], off[n]))
    check(not mism, "%s: all %d requests' tokens are identical with the cache on and off" % (prec, len(on)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--precisions", default="fp32,bf16")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    stubs = load_stubs(args.gen)
    model = os.path.join(args.workdir, "tiny")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(args.bindir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out",
                        model, "--seed", "7"], check=True, capture_output=True, timeout=120)
    check_threshold_startup(args, model)
    for prec in args.precisions.split(","):
        run_precision(args, stubs, prec)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e)
        print("0 passed, 1 failed")
        sys.exit(1)
