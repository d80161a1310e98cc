"""Helpers of the client audit (blackbox.py): the cluster/request wrapper, result checks,
reference tokens from k3pd-generate, /metrics parsing. Not a test by itself.

Every helper is bounded in time (gRPC deadlines, subprocess timeouts, wait_idle's limit)."""
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import time
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from k3cluster import Cluster, load_stubs  # noqa: E402

WORKER_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "16"]
NUM_PAGES = 16            # decode pool: 16 pages x 16 tokens = 256 tokens of context per worker
MAX_NEW_LIMIT = 128       # router --max-new-tokens-limit
VOCAB = 4096              # tiny preset
IA = grpc.StatusCode.INVALID_ARGUMENT
PASSED = [0]
FAILED = []
# Statuses docs/protocol.md lists for Generate ("Generate: statuses"); every status a call of the
# audit receives is recorded in OBSERVED and checked against this set at the end.
DOCUMENTED_GENERATE_CODES = {"CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "ALREADY_EXISTS",
                             "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "INTERNAL", "UNAVAILABLE"}
OBSERVED = set()
XFAIL = []  # known issues outside router/ (docs/protocol.md "Known limitations"): reported, not failed


def check(cond, what):
    if cond:
        PASSED[0] += 1
        print("ok -", what, flush=True)
    else:
        FAILED.append(what)
        print("NOT OK -", what, flush=True)


class Env:
    def __init__(self, args, stubs, cl, model):
        self.args = args
        self.c, self.g, self.d, self.h = stubs
        self.cl = cl
        self.model = model
        self.gen = cl.generate_call()
        self.raw = cl.channel.unary_stream("/k3pd.v1.Generation/Generate", request_serializer=lambda b: b,
                                           response_deserializer=self.g.GenerateResponse.FromString)

    def req(self, ids=None, text=None, chat=None, max_new=6, ignore_eos=True, sampling=None, **kw):
        c, g = self.c, self.g
        inp = {}
        if ids is not None:
            inp["token_ids"] = g.TokenIds(ids=ids)
        if text is not None:
            inp["text"] = text
        if chat is not None:
            inp["chat"] = chat
        if sampling is None:
            sampling = c.SamplingParams(temperature=0.0)
        return g.GenerateRequest(sampling=sampling, stop=c.StopConditions(max_new_tokens=max_new, ignore_eos=ignore_eos),
                                 **inp, **kw)

    def run(self, request, timeout=60, metadata=None, raw=False):
        """Returns (chunks, None) or (None, RpcError)."""
        call = self.raw if raw else self.gen
        try:
            return list(call(request, timeout=timeout, metadata=metadata)), None
        except grpc.RpcError as e:
            OBSERVED.add(e.code().name)
            return None, e

    def ok(self, request, what, **kw):
        chunks, err = self.run(request, **kw)
        if err is not None:
            check(False, "%s (got %s: %s)" % (what, err.code().name, err.details()))
            return None
        return chunks

    def expect(self, request, code, field, what, raw=False, timeout=60):
        chunks, err = self.run(request, raw=raw, timeout=timeout)
        if err is None:
            check(False, "%s: expected %s naming %r, the call succeeded (%d chunks)" % (what, code.name, field,
                                                                                       len(chunks)))
            return
        det = err.details() or ""
        check(err.code() == code and det.startswith(field),
              "%s -> %s naming %r (got %s: %s)" % (what, code.name, field, err.code().name, det))


def ids_of(chunks):
    return [t for ch in chunks for t in ch.token_ids]


def text_of(chunks):
    return "".join(ch.text for ch in chunks)


def final_of(chunks):
    return chunks[-1] if chunks else None


def monolithic(env, extra, max_new, ignore_eos=True, seed=None, temperature=None, top_k=None, top_p=None):
    argv = [os.path.join(env.args.bindir, "tools", "generate", "k3pd-generate"), "--model", env.model,
            "--max-new-tokens", str(max_new)] + WORKER_ARGS + list(extra)
    if ignore_eos:
        argv.append("--ignore-eos")
    if seed is not None:
        argv += ["--seed", str(seed)]
    if temperature:
        argv += ["--temperature", repr(temperature)]
    if top_k is not None:
        argv += ["--top-k", str(top_k)]
    if top_p is not None:
        argv += ["--top-p", repr(top_p)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError("k3pd-generate %s failed: %s" % (argv, out.stderr[-2000:]))
    last = [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][-1]
    return [int(x) for x in last[4:].split()]


def scrape(port, path="/metrics"):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
        return r.status, r.read().decode()


def metric(text, name, labels=None):
    tot = 0.0
    for ln in text.splitlines():
        if ln.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", ln)
        if not m or m.group(1) != name:
            continue
        if labels and labels not in (m.group(2) or ""):
            continue
        tot += float(m.group(3))
    return tot


def metrics_port(p):
    m = re.search(r"metrics on port (\d+)", p.text())
    return int(m.group(1)) if m else None


PROMPT = [17, 250, 3001, 42, 7, 999, 1234, 5]
TEXT = "The quick brown fox jumps over the lazy dog."
SPECIAL_TEXT = "[BOS] hi [EOS]<|im_end|>"  # special-token names in text are ordinary text
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
SAMPLED = dict(temperature=0.8, top_k=20, top_p=0.9, seed=123456789)


def references(env, chat_file):
    """k3pd-generate outputs for the deterministic cases, computed in parallel."""
    jobs = {
        "greedy": ([ "--prompt-ids", ",".join(map(str, PROMPT))], 12, {}),
        "text": (["--prompt", TEXT], 8, {}),
        "special": (["--prompt", SPECIAL_TEXT], 4, {}),
        "chat": (["--chat", chat_file], 8, {}),
        "sampled": (["--prompt-ids", ",".join(map(str, PROMPT))], 10, SAMPLED),
        "temp1": (["--prompt-ids", ",".join(map(str, PROMPT))], 10, dict(temperature=1.0, seed=77)),
        "long": (["--prompt-ids", ",".join(str((i * 31) % 3800) for i in range(120))], 4, {}),
    }
    with cf.ThreadPoolExecutor(max_workers=2) as ex:
        futs = {k: ex.submit(monolithic, env, a, n, **kw) for k, (a, n, kw) in jobs.items()}
        return {k: f.result() for k, f in futs.items()}


def check_chunks(env, chunks, what, n_prompt, want_rid=None):
    """The documented per-chunk invariants of GenerateResponse."""
    c = env.c
    fin = final_of(chunks)
    okc = all(ch.finish_reason == c.FINISH_REASON_UNSPECIFIED for ch in chunks[:-1]) and fin.finish_reason != 0
    okc = okc and all(not ch.HasField("usage") and not ch.HasField("timings") for ch in chunks[:-1])
    okc = okc and fin.usage.completion_tokens == len(ids_of(chunks)) and fin.usage.prompt_tokens == n_prompt
    okc = okc and fin.timings.total_us > 0 and fin.timings.first_token_us <= fin.timings.total_us
    okc = okc and chunks[0].request_id != "" and fin.request_id == chunks[0].request_id
    if want_rid is not None:
        okc = okc and fin.request_id == want_rid
    check(okc, "%s: chunk invariants (finish on last only, usage %d/%d, timings, request_id %r)" %
          (what, fin.usage.prompt_tokens, fin.usage.completion_tokens, fin.request_id))


def g_req_nosampling(env, ids, max_new):
    return env.g.GenerateRequest(token_ids=env.g.TokenIds(ids=ids),
                                 stop=env.c.StopConditions(max_new_tokens=max_new, ignore_eos=True))


def wait_idle(env, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = env.cl.decode_stats(env.cl.decodes()[0])
        if st.used_kv_pages == 0 and st.used_kda_slots == 0 and st.reservations == 0 and st.running_seqs == 0:
            time.sleep(0.5)  # one heartbeat carries the freed capacity to the router
            return True
        time.sleep(0.05)
    return False
