#!/usr/bin/python3
"""Malformed HTTP and JSON thrown at the router's HTTP port; the router must keep serving.

Against a tiny cluster whose router runs with a 1 MiB body limit and a 2 s idle timeout:
garbage and half-finished request lines, oversized headers, bad and conflicting framing
(Content-Length/Transfer-Encoding), truncated bodies (closed and left hanging), bodies of
megabytes (declared, undeclared, chunked, with Expect: 100-continue), every prefix of a valid
request, random byte flips, deep nesting, wrong types for every field, invalid UTF-8 and
escapes, wrong content types and methods, pipelining, many idle connections at once, a client
that half-closes. Each answer must be a well-formed HTTP response with an expected status
(JSON errors in the OpenAI shape) or a closed connection; afterwards the router still answers
a normal request with the same tokens as before, nothing is left reserved on the decode worker,
its accounting balances, and every process exits 0 on SIGTERM.

Usage: test_http_fuzz.py --bindir BUILD --gen PYSTUBS --workdir DIR
"""
import argparse
import json
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_common import (check, finish, raw_http, router_accounting, start_cluster, status_of,  # noqa: E402
                         wait_pool_free)

LIMIT = 1 << 20
GOOD = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4, "temperature": 0,
        "ignore_eos": True, "reasoning_effort": "none", "return_token_ids": True}


def post(path, body, ctype="application/json", extra=b"", http="HTTP/1.1", close=True):
    if isinstance(body, str):
        body = body.encode()
    head = ("POST %s %s\r\nHost: x\r\n" % (path, http)).encode()
    if ctype is not None:
        head += b"Content-Type: " + ctype.encode() + b"\r\n"
    if close:
        head += b"Connection: close\r\n"
    return head + extra + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def body_of(resp):
    return resp.partition(b"\r\n\r\n")[2]


def is_oai_error(resp, status):
    if status_of(resp) != status:
        return False
    try:
        e = json.loads(body_of(resp))["error"]
        return set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str)
    except (ValueError, KeyError, TypeError):
        return False


def good_tokens(port):
    r = raw_http(port, post("/v1/chat/completions", json.dumps(GOOD)), timeout=60)
    if status_of(r) != 200:
        return None
    return json.loads(body_of(r))["choices"][0]["token_ids"]


def test_http_level(port):
    st = {}
    cases = {
        "garbage": b"\x00\x01\x02 hello \xff\xfe\r\n\r\n",
        "no version": b"GET /v1/models\r\n\r\n",
        "bad version": b"GET /v1/models HTTP/9.9\r\n\r\n",
        "lowercase method": b"get /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        "space in path": b"GET /v1/mod els HTTP/1.1\r\nHost: x\r\n\r\n",
        "header without colon": b"GET /v1/models HTTP/1.1\r\nHost x\r\n\r\n",
        "huge header": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n",
        "10k headers": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(10000)) +
                       b"\r\n",
        "negative length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
        "overflow length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "length and chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "bad chunk size": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "HTTP/1.1 without Host": b"GET /v1/models HTTP/1.1\r\n\r\n",
        "absolute-form": b"GET http://x/v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "query string": b"GET /v1/models?x=1&y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "OPTIONS": b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "PUT": b"PUT /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "GET on POST route": b"GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "HEAD models": b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "unknown path": b"GET /v2/whatever/../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "NUL in path": b"GET /v1/mo\x00dels HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    for name, data in cases.items():
        st[name] = status_of(raw_http(port, data, timeout=5))
    ok = all(s is None or 200 <= s < 600 for s in st.values())
    check(ok, "malformed request lines/headers/framing get an HTTP status or a closed connection (%s)" % st)
    check(st["huge header"] in (None, 413, 431, 400) and st["10k headers"] in (None, 413, 431, 400),
          "oversized headers are refused (%s, %s)" % (st["huge header"], st["10k headers"]))
    check(st["OPTIONS"] == 405 and st["PUT"] == 405 and st["GET on POST route"] == 405 and st["HEAD models"] == 200 and
          st["unknown path"] == 404 and st["query string"] == 200,
          "methods and paths: 405 / 405 / 405, HEAD 200, unknown 404, query string ignored")
    r = raw_http(port, b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check(b"\r\nAllow: POST\r\n" in r and is_oai_error(r, 405), "405 names the allowed method and has an error object")


def test_content_types(port):
    body = json.dumps(GOOD)
    res = {ct: status_of(raw_http(port, post("/v1/chat/completions", body, ct))) for ct in
           ("text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "application/xml")}
    check(all(s == 415 for s in res.values()), "wrong content types -> 415 (%s)" % res)
    ok = {ct: status_of(raw_http(port, post("/v1/chat/completions", body, ct), timeout=60)) for ct in
          (None, "application/json", "Application/JSON; charset=utf-8", "application/vnd.api+json")}
    check(all(s == 200 for s in ok.values()), "JSON content types (or none) are served (%s)" % ok)


def test_truncated(port):
    # declared 1000 bytes, sent 10, closed
    s = raw_http(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"prompt\":", shut_wr=True, timeout=5)
    check(s in (b"",) or status_of(s) in (400, 408), "a body cut short by the client's close: no answer or 400")
    # declared 1000 bytes, sent 10, the socket left open: closed by the idle timeout (2 s)
    t0 = time.time()
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
    got = b""
    try:
        while True:
            b = sock.recv(4096)
            if not b:
                break
            got += b
    except (socket.timeout, ConnectionResetError):
        pass
    sock.close()
    dt = time.time() - t0
    check(dt < 10, "a hanging half-sent body is dropped by the idle timeout (%.1f s, %r)" % (dt, got[:40]))


def test_big_bodies(port):
    big = json.dumps({"prompt": "a" * (3 * LIMIT), "max_tokens": 1}).encode()
    r = raw_http(port, post("/v1/completions", big), timeout=30)
    check(is_oai_error(r, 413) and b"--http-max-body-bytes" in body_of(r), "a 3 MiB body over a 1 MiB limit -> 413")
    r = raw_http(port, post("/v1/completions", big, extra=b"Expect: 100-continue\r\n"), timeout=30)
    check(is_oai_error(r, 413), "a declared oversized body with Expect: 100-continue -> 413 before it is sent")
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 65536]), big[i:i + 65536]) for i in range(0, len(big), 65536))
    r = raw_http(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks + b"0\r\n\r\n", timeout=30)
    check(is_oai_error(r, 413), "a chunked oversized body -> 413")
    near = json.dumps({"prompt": "ab " * (LIMIT // 3 - 20), "max_tokens": 1}).encode()
    r = raw_http(port, post("/v1/completions", near), timeout=60)
    e = json.loads(body_of(r))["error"] if status_of(r) == 400 else {}
    check(len(near) <= LIMIT and e.get("code") == "context_length_exceeded",
          "a body just under the limit (%d bytes, ~350k tokens) is read, tokenised and refused for context" % len(near))


def test_json(port, rng):
    good = json.dumps(GOOD)
    bad_status = set()
    for n in range(0, len(good)):
        r = raw_http(port, post("/v1/chat/completions", good[:n]))
        if not is_oai_error(r, 400):
            bad_status.add(status_of(r))
    check(not bad_status, "every proper prefix of a valid request -> 400 with an error object (%s)" % bad_status)
    odd = set()
    for _ in range(300):
        b = bytearray(good.encode())
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        r = raw_http(port, post("/v1/chat/completions", bytes(b)), timeout=60)
        s = status_of(r)
        if s not in (200, 400, 404, 429) or (s != 200 and not is_oai_error(r, s)):
            odd.add((s, bytes(b)[:60]))
    # (429: a flip that removes max_tokens asks for the whole context, which the pool may not
    # have free again yet)
    check(not odd, "300 byte-flipped requests -> 200, 400, 404 or 429 with error objects (%s)" % list(odd)[:3])
    samples = {
        "deep nesting": "[" * 100000 + "]" * 100000,
        "deep object": '{"a":' * 50000 + "1" + "}" * 50000,
        "null": "null", "number": "12", "string": '"hi"', "BOM": "\ufeff" + good, "NaN": '{"messages":NaN}',
        "huge int": '{"messages":[{"role":"user","content":"x"}],"max_tokens":1' + "0" * 40 + "}",
        "lone surrogate": '{"messages":[{"role":"user","content":"\\ud800"}]}',
        "NUL escape": '{"messages":[{"role":"user","content":"a\\u0000b"}]}',
        "invalid UTF-8": b'{"messages":[{"role":"user","content":"\xc3\x28\xff"}]}',
        "overlong UTF-8": b'{"messages":[{"role":"user","content":"\xc0\xaf"}]}',
        "trailing garbage": good + "xyz", "two objects": good + good, "empty": "",
        "duplicate keys": '{"max_tokens":2,"max_tokens":3,"messages":[{"role":"user","content":"x"}],"ignore_eos":true}',
    }
    res = {}
    for name, body in samples.items():
        r = raw_http(port, post("/v1/chat/completions", body), timeout=60)
        res[name] = status_of(r)
        if name != "duplicate keys" and not is_oai_error(r, 400):
            check(False, "malformed JSON %s -> 400 with an error object (got %s: %r)" % (name, res[name], r[:200]))
    check(res["duplicate keys"] == 200 and all(v == 400 for k, v in res.items() if k != "duplicate keys"),
          "malformed JSON bodies -> 400, duplicate keys accepted (last wins, as JSON parsers do) (%s)" % res)
    # every field with a wrong type
    wrong = {"model": 1, "messages": "hi", "max_tokens": "4", "max_completion_tokens": 1.5, "temperature": [],
             "top_p": {}, "top_k": "x", "seed": 1.5, "stop": 5, "n": "1", "stream": "yes", "logprobs": 1,
             "top_logprobs": -1, "tools": {}, "tool_choice": 5, "response_format": "json", "reasoning_effort": 3,
             "chat_template_kwargs": [], "stream_options": 1, "ignore_eos": "no", "stop_token_ids": [99999999],
             "return_token_ids": 0, "logit_bias": {"1": 5}, "frequency_penalty": 1, "functions": []}
    missed = []
    for k, v in wrong.items():
        body = dict(GOOD, **{k: v})
        if k == "stream_options":
            body["stream"] = True
        r = raw_http(port, post("/v1/chat/completions", json.dumps(body)), timeout=60)
        ok = status_of(r) in (400, 404) and is_oai_error(r, status_of(r))
        if ok:
            e = json.loads(body_of(r))["error"]
            ok = (e["param"] or "").split(".")[0].split("[")[0] == k and e["message"].startswith(e["param"])
        if not ok:
            missed.append((k, status_of(r), body_of(r)[:120]))
    check(not missed, "each of %d fields with a wrong type or value -> 400 naming it (%s)" % (len(wrong), missed[:3]))
    long_model = raw_http(port, post("/v1/chat/completions", json.dumps(dict(GOOD, model="m" * 500000))), timeout=30)
    check(is_oai_error(long_model, 404), "a 500 kB model name -> 404")
    many = {"messages": [{"role": "user", "content": "x"}] * 20000, "max_tokens": 1}
    r = raw_http(port, post("/v1/chat/completions", json.dumps(many)), timeout=60)
    check(is_oai_error(r, 400), "20,000 messages (over the context) -> 400")


def test_connections(port):
    # pipelining: libmicrohttpd answers the first request with Connection: close and closes,
    # which HTTP/1.1 allows (the client resends the rest on a new connection)
    two = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    r = raw_http(port, two)
    n = r.count(b"HTTP/1.1 200")
    check(n == 2 or (n == 1 and b"\r\nConnection: close\r\n" in r),
          "two pipelined requests: both answered, or the first with Connection: close (%d answered)" % n)
    # keep-alive: three generations on one connection
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    got = 0
    for _ in range(3):
        sock.sendall(post("/v1/chat/completions", json.dumps(GOOD), close=False))
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += sock.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
        while len(rest) < n:
            rest += sock.recv(65536)
        got += status_of(head) == 200
    sock.close()
    check(got == 3, "keep-alive: three requests on one connection")
    # 40 connections that send half a request and wait, while a normal request is served
    idle = []
    for i in range(40):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        idle.append(s)
    t0 = time.time()
    tok = good_tokens(port)
    check(tok is not None and time.time() - t0 < 30, "served while 40 connections hang half-sent")
    for s in idle:
        s.close()
    # a client that half-closes after its request counts as gone (its request is cancelled)
    r = raw_http(port, post("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 300, "ignore_eos": True})),
                 shut_wr=True, timeout=30)
    check(status_of(r) in (None, 200, 499), "a half-closing client: the request ends (got %s)" % status_of(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    cl, port, _ = start_cluster(args, "cluster", router_extra=["--http-max-body-bytes", str(LIMIT),
                                                               "--http-idle-timeout-s", "2"])
    rng = random.Random(20261201)
    try:
        before = good_tokens(port)
        check(before is not None and len(before) == 4, "a normal request is served (%s)" % before)
        for fn in (test_http_level, test_content_types, test_truncated, test_big_bodies, test_connections):
            t1 = time.time()
            fn(port)
            print("# %s: %.1f s" % (fn.__name__, time.time() - t1), flush=True)
        t1 = time.time()
        test_json(port, rng)
        print("# test_json: %.1f s" % (time.time() - t1), flush=True)
        check(all(p.alive() for p in cl.procs), "router and workers are still running")
        check(good_tokens(port) == before, "after the fuzzing the router serves the same tokens for the same request")
        check(wait_pool_free(cl), "nothing is left reserved or running on the decode worker (/metrics)")
        started, done, active = router_accounting(port)
        check(started == done and active == 0, "router accounting balances: started %d == finished %d, %d active" %
              (started, done, active))
    finally:
        finish(cl, t0, "http-fuzz")


if __name__ == "__main__":
    main()
