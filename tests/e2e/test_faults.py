#!/usr/bin/python3
"""Cluster behaviour under bad input, cancellation, overload, churn and drain (issues 6 and 7).

Driven from Debian's python3-grpcio (an off-the-shelf client). Checks, each with bounded waits:
  - malformed requests get INVALID_ARGUMENT with a message naming the field;
  - client cancel mid-stream and deadline expiry free every page and slot (decode Stats);
  - overload gets RESOURCE_EXHAUSTED and the cluster serves again once capacity frees;
  - a prefill worker killed mid-prefill: the router re-issues the prefill to another worker
    (new epoch) and the request still returns the monolithic tokens;
  - workers joining while requests run are used; a draining decode worker finishes its streams
    and gets no new requests; health goes NOT_SERVING → SERVING → NOT_SERVING;
  - /metrics of all three binaries: requests started = finished, pages back to zero.
Usage: test_faults.py --bindir BUILD --gen PYSTUBS --workdir DIR
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


def req(stubs, prompt=None, text=None, max_new=8, ignore_eos=True, temperature=0.0, seed=1, model=""):
    c, g, _, _ = stubs
    kw = {}
    if prompt is not None:
        kw["token_ids"] = g.TokenIds(ids=prompt)
    if text is not None:
        kw["text"] = text
    return g.GenerateRequest(sampling=c.SamplingParams(temperature=temperature, seed=seed),
                             stop=c.StopConditions(max_new_tokens=max_new, ignore_eos=ignore_eos), model=model, **kw)


def expect_status(call, request, code, field, timeout=30):
    try:
        for _ in call(request, timeout=timeout):
            pass
    except grpc.RpcError as e:
        ok = e.code() == code and field in (e.details() or "")
        check(ok, "%s naming %r (got %s: %s)" % (code.name, field, e.code().name, e.details()))
        return
    raise AssertionError("expected %s for %r, the call succeeded" % (code.name, field))


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        return r.read().decode()


def metric_sum(text, name):
    tot = 0.0
    for ln in text.splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            tot += float(ln.rsplit(" ", 1)[1])
    return tot


def metrics_port(p):
    m = re.search(r"metrics on port (\d+)", p.text())
    return int(m.group(1)) if m else None


def stats_idle(cl, p):
    st = cl.decode_stats(p)
    return st.used_kv_pages == 0 and st.used_kda_slots == 0 and st.reservations == 0 and st.running_seqs == 0


def monolithic(bindir, model, prompt, max_new):
    out = subprocess.run([os.path.join(bindir, "tools", "generate", "k3pd-generate"), "--model", model, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-new-tokens", str(max_new), "--ignore-eos"] + WORKER_ARGS,
                         capture_output=True, text=True, timeout=600)
    return [int(x) for x in [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][-1][4:].split()]


def test_bad_input_cancel_deadline(args, stubs, model):
    c, g, _, _ = stubs
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, "bad"), 1, 1, worker_args=WORKER_ARGS, stubs=stubs,
                 decode_args=["--num-pages", "64"], router_args=["--max-new-tokens-limit", "512"])
    ok = False
    try:
        cl.start()
        gen = cl.generate_call()
        IA = grpc.StatusCode.INVALID_ARGUMENT
        expect_status(gen, req(stubs, text=""), IA, "text")
        expect_status(gen, g.GenerateRequest(stop=c.StopConditions(max_new_tokens=4)), IA, "input")
        expect_status(gen, g.GenerateRequest(token_ids=g.TokenIds(ids=[]), stop=c.StopConditions(max_new_tokens=4)),
                      IA, "token_ids")
        expect_status(gen, req(stubs, prompt=[1, 2], max_new=0), IA, "stop.max_new_tokens")
        expect_status(gen, req(stubs, prompt=[1, 2], max_new=10 ** 6), IA, "stop.max_new_tokens")
        expect_status(gen, req(stubs, prompt=[1, 2], model="no-such-model"), IA, "model")
        expect_status(gen, req(stubs, prompt=[99999]), IA, "token_ids.ids[0]")
        expect_status(gen, req(stubs, prompt=[1] * 1020, max_new=100), IA, "prompt")  # 64 pages x 16 = 1024
        bad = g.GenerateRequest(text="x", sampling=c.SamplingParams(temperature=-1),
                                stop=c.StopConditions(max_new_tokens=2))
        expect_status(gen, bad, IA, "sampling.temperature")
        # invalid UTF-8 in the text field (raw wire bytes: protobuf clients refuse to build it)
        raw = bytes([0x0a, 3, ord("a"), 0xff, ord("b"), 0x2a, 2, 0x08, 4])
        rawgen = cl.channel.unary_stream("/k3pd.v1.Generation/Generate", request_serializer=lambda b: b,
                                         response_deserializer=g.GenerateResponse.FromString)
        expect_status(rawgen, raw, IA, "text")
        # a valid request still works after all that
        ids = []
        for ch in gen(req(stubs, text="Hello there", max_new=4), timeout=60):
            ids += list(ch.token_ids)
        check(len(ids) == 4, "a valid text request is served after the bad ones (%d tokens)" % len(ids))
        # client cancel mid-stream frees everything
        it = gen(req(stubs, prompt=list(range(1, 40)), max_new=400), timeout=120)
        got = 0
        for ch in it:
            got += len(ch.token_ids)
            if got >= 3:
                it.cancel()
                break
        wait_until(lambda: stats_idle(cl, cl.decodes()[0]), 20, "pages and slots freed after a client cancel")
        check(True, "client cancel mid-stream freed every page and slot")
        # deadline expiry frees everything
        try:
            for _ in gen(req(stubs, prompt=list(range(1, 40)), max_new=400), timeout=0.5):
                pass
            raise AssertionError("the 0.5 s deadline did not fire")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expiry reported (%s)" % e.code().name)
        wait_until(lambda: stats_idle(cl, cl.decodes()[0]), 20, "pages and slots freed after a deadline")
        check(True, "deadline expiry freed every page and slot")
        ok = True
    finally:
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    check(all(v == 0 for v in codes.values()), "clean shutdown (%s)" % codes)


# With the prefix cache on (the default) the prefill worker gets a 600-token prompt up to its last
# 64-token block boundary (576 tokens) and the decode worker computes the rest (docs/design.md
# "Prefix cache"): the fault cases below then also cover a re-issued split prefill.
QUEUED_600 = "queued %d prompt tokens" % ((600 - 1) // 64 * 64)


def test_overload(args, stubs, model):
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, "overload"), 1, 1, worker_args=WORKER_ARGS,
                 stubs=stubs, decode_args=["--num-slots", "2"])
    ok = False
    try:
        cl.start()
        gen = cl.generate_call()
        results = []

        def one(i):
            try:
                n = 0
                for ch in gen(req(stubs, prompt=[5 + i, 6, 7], max_new=60, seed=i), timeout=120):
                    n += len(ch.token_ids)
                return ("ok", n)
            except grpc.RpcError as e:
                return (e.code().name, e.details())

        with cf.ThreadPoolExecutor(max_workers=6) as ex:
            results = list(ex.map(one, range(6)))
        codes = [r[0] for r in results]
        check("RESOURCE_EXHAUSTED" in codes and "ok" in codes,
              "overload: some requests served, the rest RESOURCE_EXHAUSTED (%s)" % codes)
        check(all(r[0] in ("ok", "RESOURCE_EXHAUSTED") for r in results), "overload: no other errors")
        wait_until(lambda: stats_idle(cl, cl.decodes()[0]), 20, "capacity back after overload")
        n = sum(len(ch.token_ids) for ch in gen(req(stubs, prompt=[9, 9], max_new=5), timeout=60))
        check(n == 5, "served again once capacity freed")
        ok = True
    finally:
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    check(all(v == 0 for v in codes.values()), "clean shutdown (%s)" % codes)


def test_churn_drain_metrics(args, stubs, model):
    c, g, _, h = stubs
    cl = Cluster(args.bindir, model, os.path.join(args.workdir, "churn"), 0, 0, worker_args=WORKER_ARGS + [
        "--metrics-port", "0", "--metrics-host", "127.0.0.1"], stubs=stubs, prefill_args=["--drain-grace-ms", "0"],
        router_args=["--metrics-port", "0", "--metrics-host", "127.0.0.1"])
    ok = False
    try:
        cl.start_router()
        cl.channel = grpc.insecure_channel("127.0.0.1:%d" % cl.port)
        gen = cl.generate_call()
        # no workers yet: UNAVAILABLE
        expect_status(gen, req(stubs, prompt=[1, 2, 3]), grpc.StatusCode.UNAVAILABLE, "no decode worker")
        # a worker that cannot reach its router is alive but not ready
        saved = cl.port
        cl.port = 1  # nothing listens there
        lost = cl.start_worker("decode", 9, wait=False)
        cl.port = saved
        lost_addr = wait_until(lambda: cl.worker_addr(lost), 30, "decode-9 address")
        time.sleep(0.5)
        check(cl.health(lost_addr) == h.HealthCheckResponse.NOT_SERVING and
              cl.health(lost_addr, "liveness") == h.HealthCheckResponse.SERVING,
              "health: a worker not registered with a router is live but NOT_SERVING")
        lost.p.send_signal(signal.SIGTERM)
        check(lost.p.wait(timeout=30) == 0, "an unregistered worker still exits 0 on SIGTERM")
        cl.procs.remove(lost)
        lost.log.close()
        # a worker is NOT_SERVING until registered, SERVING after
        p0 = cl.start_worker("prefill", 0, wait=False)
        addr = wait_until(lambda: cl.worker_addr(p0), 30, "prefill-0 address")
        cl.wait_registered(p0)
        wait_until(lambda: cl.health(addr) == h.HealthCheckResponse.SERVING, 10, "prefill-0 SERVING")
        check(True, "health: prefill worker SERVING once registered")
        check(cl.health(addr, "liveness") == h.HealthCheckResponse.SERVING, "health: liveness SERVING")
        d0 = cl.start_worker("decode", 0)
        # a request whose prefill worker is killed mid-prefill is re-issued to another one
        p1 = cl.start_worker("prefill", 1)
        prompt = [(i * 37) % 3800 for i in range(600)]
        mono = monolithic(args.bindir, model, prompt, 6)
        holder = {}

        def long_req():
            try:
                holder["ids"] = [t for ch in gen(req(stubs, prompt=prompt, max_new=6), timeout=300)
                                 for t in ch.token_ids]
            except grpc.RpcError as e:
                holder["err"] = "%s: %s" % (e.code().name, e.details())

        th = threading.Thread(target=long_req)
        th.start()
        victim = wait_until(lambda: next((p for p in (p0, p1) if QUEUED_600 in p.text()), None), 30,
                            "the 600-token prefill to be queued")
        time.sleep(0.3)
        victim.p.send_signal(signal.SIGKILL)
        th.join(timeout=300)
        check("ids" in holder and holder["ids"] == mono,
              "prefill worker killed mid-prefill: request re-issued and tokens equal monolithic (%s)" %
              holder.get("err", "ok"))
        check("re-issuing" in cl.router.text(), "router logged the prefill re-issue")
        # SIGTERM (drain with no grace) of the prefill worker running a prompt: re-issued too
        survivor = p1 if victim is p0 else p0
        p2 = cl.start_worker("prefill", 2)
        prompt2 = [(i * 53 + 7) % 3800 for i in range(600)]
        mono2 = monolithic(args.bindir, model, prompt2, 5)
        holder.clear()

        def long_req2():
            try:
                holder["ids"] = [t for ch in gen(req(stubs, prompt=prompt2, max_new=5), timeout=300)
                                 for t in ch.token_ids]
            except grpc.RpcError as e:
                holder["err"] = "%s: %s" % (e.code().name, e.details())

        before_q = {p.name: p.text().count(QUEUED_600) for p in (survivor, p2)}
        th = threading.Thread(target=long_req2)
        th.start()
        victim2 = wait_until(lambda: next((p for p in (survivor, p2)
                                           if p.text().count(QUEUED_600) > before_q[p.name]), None),
                             30, "the second 600-token prefill to be queued")
        time.sleep(0.3)
        victim2.p.send_signal(signal.SIGTERM)
        th.join(timeout=300)
        check("ids" in holder and holder["ids"] == mono2,
              "prefill worker drained (SIGTERM, no grace) mid-prefill: re-issued, tokens equal monolithic (%s)" %
              holder.get("err", "ok"))
        check(victim2.p.wait(timeout=60) == 0, "the drained prefill worker exited 0")
        cl.procs.remove(victim2)
        victim2.log.close()
        # a decode worker joins while requests run; both get used
        d1 = cl.start_worker("decode", 1)
        with cf.ThreadPoolExecutor(max_workers=8) as ex:
            outs = list(ex.map(lambda i: sum(len(ch.token_ids) for ch in gen(req(stubs, prompt=[3, 4, i], max_new=12,
                                                                                   seed=i), timeout=120)), range(8)))
        check(all(n == 12 for n in outs), "8 concurrent requests served with a joined decode worker")
        adm = [cl.decode_stats(p).admitted for p in (d0, d1)]
        check(adm[1] > 0, "the joined decode worker took requests (admitted %s)" % adm)
        # drain decode-0 while it streams: its stream finishes, new requests go to decode-1
        d0_addr = cl.worker_addr(d0)
        streams = {}

        def stream_on(i):
            streams[i] = sum(len(ch.token_ids) for ch in gen(req(stubs, prompt=[7, i], max_new=150, seed=i),
                                                               timeout=300))

        ths = [threading.Thread(target=stream_on, args=(i,)) for i in range(2)]
        for t in ths:
            t.start()
        wait_until(lambda: cl.decode_stats(d0).running_seqs > 0, 30, "a stream running on decode-0")
        before = cl.decode_stats(d0).admitted
        d0.p.send_signal(signal.SIGTERM)
        wait_until(lambda: cl.health(d0_addr) != h.HealthCheckResponse.SERVING, 10, "decode-0 NOT_SERVING")
        check(True, "health: a draining decode worker reports NOT_SERVING")
        time.sleep(0.6)  # one heartbeat carries "draining" to the router
        outs = [sum(len(ch.token_ids) for ch in gen(req(stubs, prompt=[8, i], max_new=4, seed=i), timeout=120))
                for i in range(3)]
        check(all(n == 4 for n in outs), "new requests served while decode-0 drains")
        for t in ths:
            t.join(timeout=300)
        check(all(streams.get(i) == 150 for i in range(2)), "streams on the draining worker finished (%s)" % streams)
        rc = d0.p.wait(timeout=60)
        check(rc == 0, "drained decode worker exited 0")
        check(cl.decode_stats(d1).admitted > 0 and before > 0, "both decode workers served (decode-0 %d before drain)" % before)
        # metrics: counters consistent, pages back to zero
        time.sleep(0.6)
        rt_text = scrape(metrics_port(cl.router))
        started = metric_sum(rt_text, "k3pd_router_requests_started_total")
        finished = metric_sum(rt_text, "k3pd_router_requests_total")
        check(started > 0 and started == finished, "router metrics: started %d == finished %d" % (started, finished))
        d_text = scrape(metrics_port(d1))
        used = [ln for ln in d_text.splitlines() if ln.startswith('k3pd_decode_kv_pages{state="used"}')]
        check(used and float(used[0].split()[-1]) == 0, "decode metrics: used pages back to 0 (%s)" % used)
        check(metric_sum(d_text, "k3pd_decode_generated_tokens_total") > 0, "decode metrics: tokens counted")
        live = [p for p in cl.prefills() if p.alive()]
        hb = sum(metric_sum(scrape(metrics_port(p)), "k3pd_prefill_handoff_bytes_total") for p in live)
        check(live and hb > 0, "prefill metrics: handoff bytes counted (%d live prefill workers)" % len(live))
        ok = True
    finally:
        codes = cl.stop()
        if not ok:
            cl.dump_logs()
    bad = {k: v for k, v in codes.items() if v not in (0, -9)}
    check(not bad, "remaining processes exited 0 (%s)" % codes)


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
                    "--seed", "3"], check=True, capture_output=True, timeout=120)
    test_bad_input_cancel_deadline(args, stubs, model)
    test_overload(args, stubs, model)
    test_churn_drain_metrics(args, stubs, model)


if __name__ == "__main__":
    run_driver(main)
