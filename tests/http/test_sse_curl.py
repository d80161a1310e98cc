#!/usr/bin/python3
"""Server-Sent Events from the router's HTTP API as curl -N reads them, checked byte for byte.

For streamed chat and text completions (with and without stream_options.include_usage, HTTP/1.1
chunked and HTTP/1.0 close-delimited) the body must be exactly a sequence of events
`data: <compact JSON>\\n\\n` ending with `data: [DONE]\\n\\n`: no \\r, no other SSE fields,
nothing after [DONE]; each JSON payload is the compact serialisation of itself (so no stray
whitespace or duplicate keys), the chunk objects have the documented fields in the documented
places, and the streamed text equals the non-streaming response for the same request. The
headers are text/event-stream, no-cache and chunked (HTTP/1.1). An invalid streaming request is
an ordinary JSON error response, not a stream.

Usage: test_sse_curl.py --bindir BUILD --gen PYSTUBS --workdir DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_common import check, finish, start_cluster  # noqa: E402

CHAT = [{"role": "user", "content": "Tell me a story."}]
EVENT = re.compile(rb"data: ([^\r\n]+)\n\n")


def curl(port, path, body, extra=()):
    """(status line, headers dict (lower-case names), raw body bytes) as curl -N saw them."""
    argv = ["curl", "-sS", "-N", "-i", "--max-time", "60", "-H", "Content-Type: application/json",
            "--data-binary", json.dumps(body)] + list(extra) + ["http://127.0.0.1:%d%s" % (port, path)]
    out = subprocess.run(argv, capture_output=True, timeout=90).stdout
    head, _, raw = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        hdrs[k.strip().lower().decode()] = v.strip().decode()
    return lines[0].decode(), hdrs, raw


def parse_events(raw, what):
    """Checks the framing of the whole body; returns the JSON payloads (without [DONE])."""
    pos, payloads = 0, []
    while pos < len(raw):
        m = EVENT.match(raw, pos)
        if not m:
            check(False, "%s: bytes %d.. are not a `data: ...\\n\\n` event: %r" % (what, pos, raw[pos:pos + 80]))
            return None
        payloads.append(m.group(1))
        pos = m.end()
    check(len(payloads) >= 3 and payloads[-1] == b"[DONE]" and raw.endswith(b"data: [DONE]\n\n") and b"\r" not in raw,
          "%s: the body is %d `data: ...\\n\\n` events ending with `data: [DONE]\\n\\n`, nothing else, no \\r" %
          (what, len(payloads)))
    objs = []
    for p in payloads[:-1]:
        o = json.loads(p.decode("utf-8"))
        if json.dumps(o, separators=(",", ":"), ensure_ascii=False).encode() != p:
            check(False, "%s: payload is not compact JSON: %r" % (what, p[:200]))
            return None
        objs.append(o)
    check(True, "%s: every payload is compact UTF-8 JSON on one line" % what)
    return objs


def check_chat_stream(objs, what, usage):
    keys = ["id", "object", "created", "model", "system_fingerprint", "choices"] + (["usage"] if usage else [])
    body = objs[:-1] if usage else objs
    ok = all(list(o.keys()) == keys and o["object"] == "chat.completion.chunk" and o["id"] == objs[0]["id"] and
             o["created"] == objs[0]["created"] and len(o["choices"]) == 1 and
             list(o["choices"][0].keys()) == ["index", "delta", "logprobs", "finish_reason"] for o in body)
    check(ok, "%s: chunk keys in order %s, choices[{index, delta, logprobs, finish_reason}]" % (what, keys))
    check(all(o["choices"][0]["finish_reason"] is None for o in body[:-1]) and
          body[-1]["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls") and body[-1]["choices"][0]["delta"] == {},
          "%s: finish_reason null until the last choice chunk (delta {})" % what)
    check(body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""},
          "%s: the first delta is {role: assistant, content: \"\"}" % what)
    if usage:
        u = objs[-1]
        check(list(u.keys()) == keys and u["choices"] == [] and all(o["usage"] is None for o in body) and
              set(u["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"} and
              set(u["usage"]["prompt_tokens_details"]) == {"cached_tokens"},
              "%s: a usage chunk with choices [] last, \"usage\": null in the others" % what)
    return "".join(o["choices"][0]["delta"].get("content", "") or "" for o in body), \
        "".join(o["choices"][0]["delta"].get("reasoning_content", "") or "" for o in body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    if not shutil.which("curl"):
        print("FATAL: curl not found (scripts/deps.sh installs it)")
        sys.exit(1)
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    cl, port, _ = start_cluster(args, "cluster")
    try:
        for usage in (False, True):
            for thinking in ("none", "low"):
                req = {"messages": CHAT, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                       "reasoning_effort": thinking}
                what = "chat stream (thinking %s, include_usage %s)" % ("off" if thinking == "none" else "on", usage)
                sreq = dict(req, stream=True)
                if usage:
                    sreq["stream_options"] = {"include_usage": True}
                st, h, raw = curl(port, "/v1/chat/completions", sreq)
                check(st == "HTTP/1.1 200 OK" and h.get("content-type") == "text/event-stream; charset=utf-8" and
                      h.get("cache-control") == "no-cache" and h.get("transfer-encoding") == "chunked" and
                      "content-length" not in h and h.get("x-request-id"),
                      "%s: 200, text/event-stream, no-cache, chunked, X-Request-Id (%s %s)" % (what, st, h))
                objs = parse_events(raw, what)
                if objs is None:
                    continue
                content, reasoning = check_chat_stream(objs, what, usage)
                _, _, whole = curl(port, "/v1/chat/completions", req)
                msg = json.loads(whole)["choices"][0]["message"]
                check(content == (msg["content"] or "") and reasoning == (msg["reasoning_content"] or ""),
                      "%s: deltas == the non-streaming message" % what)
        # text completions, HTTP/1.1 and HTTP/1.0
        req = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        _, _, whole = curl(port, "/v1/completions", req)
        text = json.loads(whole)["choices"][0]["text"]
        for http10 in (False, True):
            what = "completions stream over HTTP/1.%d" % (0 if http10 else 1)
            st, h, raw = curl(port, "/v1/completions", dict(req, stream=True), ["--http1.0"] if http10 else [])
            check(st.endswith("200 OK") and ("transfer-encoding" not in h if http10 else
                                             h.get("transfer-encoding") == "chunked"),
                  "%s: 200, %s" % (what, "close-delimited" if http10 else "chunked"))
            objs = parse_events(raw, what)
            if objs is None:
                continue
            check(all(list(o.keys()) == ["id", "object", "created", "model", "system_fingerprint", "choices"] and
                      o["object"] == "text_completion" and
                      list(o["choices"][0].keys()) == ["text", "index", "logprobs", "finish_reason"] for o in objs),
                  "%s: text_completion chunks with choices[{text, index, logprobs, finish_reason}]" % what)
            check("".join(o["choices"][0]["text"] for o in objs) == text and objs[-1]["choices"][0]["finish_reason"] ==
                  "length" and all(o["choices"][0]["finish_reason"] is None for o in objs[:-1]),
                  "%s: the streamed text == the non-streaming text, finish_reason on the last chunk" % what)
        # the raw chunked framing: hex size CRLF data CRLF ... 0 CRLF CRLF
        out = subprocess.run(["curl", "-sS", "-N", "--raw", "--max-time", "60", "-H", "Content-Type: application/json",
                              "--data-binary", json.dumps(dict(req, stream=True)),
                              "http://127.0.0.1:%d/v1/completions" % port], capture_output=True, timeout=90).stdout
        pos, body, ok = 0, b"", True
        while ok:
            m = re.match(rb"([0-9a-fA-F]+)\r\n", out[pos:])
            ok = bool(m)
            if not ok:
                break
            n = int(m.group(1), 16)
            pos += m.end()
            if n == 0:
                ok = out[pos:] == b"\r\n"
                break
            body += out[pos:pos + n]
            ok = out[pos + n:pos + n + 2] == b"\r\n"
            pos += n + 2
        check(ok and body.endswith(b"data: [DONE]\n\n") and EVENT.match(body),
              "HTTP/1.1 chunked framing of a stream is exact (size CRLF data CRLF ... 0 CRLF CRLF)")
        # errors before a stream starts are plain JSON responses
        st, h, raw = curl(port, "/v1/chat/completions", {"messages": CHAT, "stream": True, "max_tokens": 0})
        err = json.loads(raw)
        check(st.startswith("HTTP/1.1 400") and h.get("content-type") == "application/json" and
              err["error"]["param"] == "max_tokens" and set(err["error"]) == {"message", "type", "param", "code"},
              "a bad streaming request is a 400 JSON error object, not a stream (%s)" % raw[:120])
    finally:
        finish(cl, t0, "sse-curl")


if __name__ == "__main__":
    main()
