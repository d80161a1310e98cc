"""Compare k3pd-cli (common/tok, C) with the independent Python reference ref_tok.py.

What it is for: the ctest `tokref_check`. It writes the tiny model with k3pd-mkckpt, derives a
second "detector" vocabulary from it, and for every corpus string asserts identical encode
ids (C side: tokref_batch, the public k3_tok API in one process, for everything; k3pd-cli
tokenize/detokenize/render, one process per request, for a subset), decode round trips both ways (C ids decoded by the reference, reference ids decoded by C),
raw byte-level decodes (pieces that are not UTF-8 on their own, specials, --skip-special), and
identical XTML chat renderings (thinking on/off, generation prompt on/off).
What it is not: a test of the reference alone, or of tool calls / internal system messages
(§9.3 leaves their attribute values unspecified).

The detector vocabulary: the tiny vocabulary (3,840 ranks, trained on English/Chinese/code)
merges little outside its corpus, so a wrong split would often give the same ids (single
bytes either way). The detector adds, at shuffled ranks, every 1..4-character substring of the
short corpus strings (plus the byte prefixes of their characters so BPE can reach them), so
pieces merge whole and any difference in where the regex cuts shows up as different ids; the
shuffled ranks exercise the merge order. Its 256 specials follow at n_ranks + k.

Exit 0 when everything agrees; 1 with one line per difference (input, C ids, reference ids).
Usage: check_tokref.py --bindir BUILD --batch TOKREF_BATCH [--workdir DIR] [--jobs N]
"""

import argparse
import base64
import concurrent.futures as cf
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corpus  # noqa: E402

try:
    import ref_tok  # noqa: E402
except ImportError as e:  # the `regex` module: Debian python3-regex
    print(f"check_tokref: {e}: install python3-regex (apt-get install -y python3-regex)",
          file=sys.stderr)
    sys.exit(2)

CLI_TIMEOUT_S = 60
MAX_SHOWN = 30  # differences printed in full; the rest are counted


class Checker:
    def __init__(self, cli, jobs):
        self.cli = cli
        self.jobs = jobs
        self.failures = []
        self.checks = 0

    def run_cli(self, args):
        argv = [self.cli.encode()] + [a if isinstance(a, bytes) else a.encode("utf-8")
                                      for a in args]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=CLI_TIMEOUT_S)
        return p.returncode, p.stdout, p.stderr

    def cli_ids(self, args):
        rc, out, err = self.run_cli(args)
        if rc != 0:
            return None, err.decode("utf-8", "replace").strip()
        return [int(x) for x in out.split()], None

    def fail(self, what, inp, ours, ref):
        shown = inp if len(repr(inp)) <= 160 else repr(inp)[:120] + f"... ({len(inp)} chars)"
        line = f"{what}: input={shown!r}\n    C   = {short(ours)}\n    ref = {short(ref)}"
        self.failures.append(line)

    def expect(self, cond, *fail_args):
        self.checks += 1
        if not cond:
            self.fail(*fail_args)

    def pmap(self, fn, items):
        with cf.ThreadPoolExecutor(max_workers=self.jobs) as ex:
            return list(ex.map(fn, items))


def short(v):
    s = repr(v)
    return s if len(s) <= 400 else s[:380] + f"... (len {len(v)})"


def make_detector_vocab(base_dir, out_dir, texts, seed=99):
    """Tiny ranks + shuffled 1..4-char substrings of the short texts (see module comment)."""
    with open(os.path.join(base_dir, "tiktoken.model"), "rb") as f:
        lines = [ln.split() for ln in f.read().splitlines() if ln.strip()]
    toks = [None] * len(lines)
    for b64, r in lines:
        toks[int(r)] = base64.b64decode(b64)
    have = set(toks)
    extra = []

    def add(b):
        if b not in have:
            have.add(b)
            extra.append(b)

    for t in texts:
        if len(t) > 200:
            continue
        for i, ch in enumerate(t):
            cb = ch.encode("utf-8")
            for j in range(2, len(cb)):
                add(cb[:j])
            for L in range(1, 5):
                if i + L <= len(t):
                    add(t[i:i + L].encode("utf-8"))
    # Merges only reach a token through two present halves; with shuffled ranks some tokens
    # are unreachable by merging and are found only as a whole piece (tiktoken's whole-piece
    # lookup), which is kept on purpose. Ranks: a length bias plus noise, so longer strings
    # mostly follow shorter ones but both merge orders occur between neighbours.
    rnd = random.Random(seed)
    rnd.shuffle(extra)
    extra.sort(key=lambda b: len(b) + rnd.random() * 6)
    toks += extra
    return _write_vocab(base_dir, out_dir, toks)


class Batch:
    """All requests of one kind through tokref_batch (one process, public k3_tok API)."""

    def __init__(self, exe, model, workdir):
        self.exe, self.model, self.workdir = exe, model, workdir

    def run(self, reqs):
        path = os.path.join(self.workdir, "requests.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in reqs:
                f.write(json.dumps(r, ensure_ascii=True) + "\n")
        p = subprocess.run([self.exe, self.model, path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=CLI_TIMEOUT_S * 4)
        lines = p.stdout.decode("ascii").splitlines()
        if p.returncode != 0 or len(lines) != len(reqs):
            raise RuntimeError(f"tokref_batch failed (rc {p.returncode}, {len(lines)} of "
                               f"{len(reqs)} results): {p.stderr.decode(errors='replace')}")
        return [(ln[3:], None) if ln.startswith("ok") else (None, ln[4:]) for ln in lines]

    def encode(self, items):
        """items: (bytes, replace_invalid) -> [(ids | None, err)]."""
        res = self.run([{"op": "encode", "hex": b.hex(), "replace_invalid": rep}
                        for b, rep in items])
        return [(None, e) if v is None else ([int(x) for x in v.split()], None) for v, e in res]

    def decode(self, items):
        """items: (ids, skip_special) -> [(bytes | None, err)]."""
        res = self.run([{"op": "decode", "ids": ids, "skip_special": sk} for ids, sk in items])
        return [(None, e) if v is None else (bytes.fromhex(v.strip()), None) for v, e in res]

    def render(self, items):
        """items: (conversation, thinking, gen) -> [(ids | None, err)]."""
        res = self.run([{"op": "render", "chat": json.dumps(c, ensure_ascii=False),
                         "thinking": th, "gen": g} for c, th, g in items])
        return [(None, e) if v is None else ([int(x) for x in v.split()], None) for v, e in res]


class Cli:
    """The same requests through k3pd-cli, one process each (the user-facing path)."""

    def __init__(self, ck, model, workdir):
        self.ck, self.model, self.workdir = ck, model, workdir

    def encode(self, items):
        def one(it):
            b, rep = it
            args = ["tokenize", "--model", self.model, "--text", b]
            return self.ck.cli_ids(args + (["--replace-invalid"] if rep else []))
        return self.ck.pmap(one, items)

    def decode(self, items):
        def one(it):
            ids, sk = it
            args = ["detokenize", "--model", self.model, "--ids", ",".join(map(str, ids))]
            rc, out, err = self.ck.run_cli(args + (["--skip-special"] if sk else []))
            if rc != 0 or not out.endswith(b"\n"):
                return None, f"rc={rc} {err.decode(errors='replace').strip()}"
            return out[:-1], None
        return self.ck.pmap(one, items)

    def render(self, items):
        def one(ix):
            i, (conv, th, g) = ix
            path = os.path.join(self.workdir, f"chat{i}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(conv, f, ensure_ascii=False)
            # --thinking-effort none: the reference renders no internal system messages (their
            # text is not in spec §9.3); the default effort message is checked in test_tok_chat
            args = ["render", "--model", self.model, "--chat", path, "--thinking-effort", "none"]
            args += ([] if th else ["--no-thinking"]) + ([] if g else ["--no-generation-prompt"])
            return self.ck.cli_ids(args)
        return self.ck.pmap(one, list(enumerate(items)))


def _write_vocab(base_dir, out_dir, toks):
    """tiktoken.model with toks at ranks 0.., then the specials after them; returns the rank count."""
    with open(os.path.join(out_dir, "tiktoken.model"), "wb") as f:
        for r, b in enumerate(toks):
            f.write(base64.b64encode(b) + b" " + str(r).encode() + b"\n")
    _write_specials(base_dir, out_dir, len(toks))
    return len(toks)


def make_pairs_vocab(base_dir, out_dir):
    """The 256 bytes plus every byte pair (rank 256 + 256*a + b): BPE then pairs bytes up
    inside each piece in an order fixed by the ranks, so a piece boundary in a different place
    almost always changes the ids. Used for the code-point sweep."""
    toks = [bytes([b]) for b in range(256)] + [bytes([a, b]) for a in range(256)
                                                for b in range(256)]
    return _write_vocab(base_dir, out_dir, toks)


def _write_specials(base_dir, out_dir, n):
    """tokenizer_config.json of base_dir with its 256 specials moved to n..n+255."""
    with open(os.path.join(base_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    old = cfg["added_tokens_decoder"]
    old_base = min(int(k) for k in old)
    new = {}
    for k in range(256):
        e = dict(old[str(old_base + k)])
        if e["content"].startswith("<|reserved_token_"):
            e["content"] = f"<|reserved_token_{n + k}|>"
        new[str(n + k)] = e
    cfg["added_tokens_decoder"] = new
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"model_type": "kimi_k3"}, f)


# Contexts around a code point c that reach every regex branch: letter runs with case, Han
# neighbours, digits, the optional leading non-letter, contractions, punctuation with
# trailing newlines, whitespace runs before a non-space.
SWEEP_CTX = "a{c}b {c}{c}x 1{c}2 中{c}中 A{c}'s {c}!\n{c}  {c} \t{c}\r\n{c}Ab{c}"
# The same without Han (all below U+0CF3) for code points below U+0CF3: k3_tok matches such
# subjects with its plain PCRE2 pattern (no Unicode 15 additions can occur there).
SWEEP_CTX_LOW = SWEEP_CTX.replace("中", "ж")
LOW_CP_END = 0xCF3


def newer_than_python_tables(cp):
    """True for code points unassigned in Python's unicodedata (Unicode 14.0 in 3.11, the
    version of PCRE2 10.42's tables) but assigned in the `regex` module's newer tables
    (Unicode 15: Kawi, CJK Ext H, ...). PCRE2 10.42 alone classifies them as unassigned, the
    reference (and the Rust regex crate under the real tiktoken) as letters/digits/marks;
    k3_tok adds them to its classes from common/tok/tok_uni15.h."""
    c = chr(cp)
    return unicodedata.category(c) == "Cn" and not ref_tok.regex.match(r"\p{Cn}", c)


def check_sweep(ck, ref, be, stride, label, newer_only=False):
    """newer_only=False: every stride-th code point (the newer ones included, now that
    tok_uni15.h corrects them); True: exactly the code points newer_than_python_tables()."""
    cps = [cp for cp in range(0, 0x110000, 1 if newer_only else stride)
           if not 0xD800 <= cp <= 0xDFFF and (not newer_only or newer_than_python_tables(cp))]
    if newer_only and not cps:  # a Python whose tables caught up: the selection is void
        ck.expect(False, f"[{label}] no code point is newer than this Python's unicodedata "
                  f"{unicodedata.unidata_version}: the Unicode-version sweep selects nothing",
                  "", "", "")
    cases = [(cp, SWEEP_CTX.replace("{c}", chr(cp))) for cp in cps]
    cases += [(cp, SWEEP_CTX_LOW.replace("{c}", chr(cp))) for cp in cps if cp < LOW_CP_END]
    got = be.encode([(t.encode("utf-8"), False) for _, t in cases])
    for (cp, t), (ids, err) in zip(cases, got):
        want = ref.encode(t)
        ck.expect(ids == want, f"[{label}] code point U+{cp:04X} in context", t,
                  ids if err is None else err, want)


def check_text(ck, ref, be, texts, label):
    got = be.encode([(t.encode("utf-8"), False) for t in texts])
    for t, (ids, err) in zip(texts, got):
        want = ref.encode(t)
        ck.expect(ids == want, f"[{label}] encode", t, ids if err is None else err, want)
        if ids is not None:
            try:
                back = ref.decode(ids)
            except ref_tok.RefTokError as e:
                back = str(e)
            ck.expect(back == t.encode("utf-8"), f"[{label}] ref.decode(C ids)", t, back,
                      t.encode("utf-8"))


def check_bpe_self(ck, ref, texts, label):
    """The heap BPE of the reference against the literal merge rule (reference-only sanity)."""
    for t in texts:
        if len(t) > 300:
            continue
        for piece in ref_tok.split_pieces(t):
            b = piece.encode("utf-8")
            ck.expect(ref.bpe(b) == ref.bpe_quadratic(b), f"[{label}] ref heap vs quadratic BPE",
                      piece, ref.bpe(b), ref.bpe_quadratic(b))


def decode_cases(ref, texts, rnd, n_random):
    """Reference ids of the texts (C decode = round trip) and raw id lists (byte level)."""
    cases = [(ref.encode(t), False) for t in texts if t and len(t) <= 2000]
    n = ref.n_ranks
    sp = [ref.sid(x) for x in ("<|open|>", "<|sep|>", "<|end_of_msg|>", "[BOS]", "[EOS]",
                               "[PAD]", "<osagent_mode>")] + [n + 8, n + 200]
    # byte-level tokens that are not UTF-8 on their own (continuation/lead bytes, multi-byte
    # tokens cut mid-character), mixed with specials
    non_utf8 = [i for i in range(n) if not _is_utf8(ref.id_bytes[i])]
    for _ in range(n_random):
        ids = [rnd.choice(non_utf8) if rnd.random() < 0.6 else rnd.randrange(n)
               for _ in range(rnd.randint(1, 12))]
        if rnd.random() < 0.5:
            ids.insert(rnd.randrange(len(ids) + 1), rnd.choice(sp))
        cases.append((ids, rnd.random() < 0.4))
    cases.append(([ref.sid("<|open|>"), 0xE4, 0xB8, 0xAD, ref.sid("<|sep|>"), 0xFF], False))
    cases.append((sp, True))
    cases.append((sp, False))
    return cases


def check_decode(ck, ref, be, cases, label):
    for (ids, skip), (got, err) in zip(cases, be.decode(cases)):
        want = ref.decode(ids, skip_special=skip)
        ck.expect(got == want, f"[{label}] C decode{' --skip-special' if skip else ''}", ids,
                  got if err is None else err, want)


def _is_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def check_invalid(ck, ref, be, label):
    """Ill-formed UTF-8 (outside §9, which takes str): refused, or U+FFFD per maximal subpart
    (Python errors="replace", as docs/tokenizer.md promises) with replace_invalid."""
    bs = corpus.INVALID_UTF8
    for b, (ids, err) in zip(bs, be.encode([(b, False) for b in bs])):
        ck.expect(ids is None, f"[{label}] ill-formed UTF-8 must be refused", b, ids, "error")
    for b, (ids, err) in zip(bs, be.encode([(b, True) for b in bs])):
        want = ref.encode(b.decode("utf-8", errors="replace"))
        ck.expect(ids == want, f"[{label}] replace_invalid (= Python errors='replace')", b,
                  ids if err is None else err, want)


def chat_cases():
    return [(conv, th, g) for conv in corpus.CHATS for th in (True, False) for g in (True, False)]


def check_chat(ck, ref, be, cases, label):
    for (conv, thinking, gen), (ids, err) in zip(cases, be.render(cases)):
        want = ref.render_chat(conv, thinking=thinking, add_generation_prompt=gen)
        what = f"[{label}] chat thinking={thinking} gen_prompt={gen}"
        ck.expect(ids == want, what, conv, ids if err is None else err, want)
        if ids is not None and ids != want:  # both renderings as text, for the report
            ck.failures.append("    C   text: " + repr(ref.decode(ids)) +
                               "\n    ref text: " + repr(ref.decode(want)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--workdir")
    ap.add_argument("--batch", required=True, help="path of the tokref_batch executable")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--sweep-stride", type=int, default=61,
                    help="code-point sweep step (1 = all 1.1 M code points, ~minutes)")
    ap.add_argument("--unicode-newer", action="store_true",
                    help="only sweep the code points assigned after Python's unicodedata "
                         "version (PCRE2 10.42's tables are Unicode 14; k3_tok corrects them with "
                         "tok_uni15.h; ctest tokref_unicode)")
    a = ap.parse_args()
    cli = os.path.join(a.bindir, "tools", "cli", "k3pd-cli")
    mkckpt = os.path.join(a.bindir, "tools", "mkckpt", "k3pd-mkckpt")
    for p in (cli, mkckpt, a.batch):
        if not os.access(p, os.X_OK):
            print(f"check_tokref: {p} missing (build it first)", file=sys.stderr)
            return 2
    t0 = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="tokref_", dir=a.workdir)
    work = tmp.name
    tiny = os.path.join(work, "tiny")
    subprocess.run([mkckpt, "--preset", "tiny", "--out", tiny, "--threads", "1"], check=True,
                   stdout=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S)
    texts = corpus.text_corpus()
    det = os.path.join(work, "detector")
    os.mkdir(det)
    n_det = make_detector_vocab(tiny, det, texts)

    pairs = os.path.join(work, "pairs")
    os.mkdir(pairs)
    make_pairs_vocab(tiny, pairs)

    ck = Checker(cli, a.jobs)
    rnd = random.Random(7)
    for label, model in () if a.unicode_newer else (("tiny", tiny), ("detector", det)):
        ref = ref_tok.RefTok(model)
        batch = Batch(a.batch, model, work)
        check_bpe_self(ck, ref, texts, label)
        check_text(ck, ref, batch, texts + corpus.HUGE, label)
        check_chat(ck, ref, batch, chat_cases(), label)
        check_decode(ck, ref, batch, decode_cases(ref, texts, rnd, 300), label)
        check_invalid(ck, ref, batch, label)
        if label == "tiny":  # k3pd-cli itself on a subset (one process per request)
            cli_be = Cli(ck, model, work)
            check_text(ck, ref, cli_be, texts[::6] + corpus.LONG, label + "/cli")
            check_chat(ck, ref, cli_be, chat_cases()[::2], label + "/cli")
            check_decode(ck, ref, cli_be, decode_cases(ref, texts[::40], rnd, 12), label + "/cli")
            check_invalid(ck, ref, cli_be, label + "/cli")
    pref = ref_tok.RefTok(pairs)
    check_sweep(ck, pref, Batch(a.batch, pairs, work), a.sweep_stride, "pairs",
                newer_only=a.unicode_newer)
    dt = time.time() - t0
    if a.unicode_newer:
        what = (f"code points assigned after Unicode {unicodedata.unidata_version} (tables of "
                f"Python's unicodedata and PCRE2 10.42), in context, byte-pair vocabulary")
    else:
        what = (f"{len(texts) + len(corpus.HUGE)} texts, {len(corpus.CHATS)} chats x 4 options, "
                f"vocabularies tiny (3840 ranks) and detector ({n_det} ranks), code-point sweep "
                f"(stride {a.sweep_stride}, byte-pair vocabulary)")
    print(f"check_tokref: {what}: {ck.checks} checks, {len(ck.failures)} differences, "
          f"{dt:.1f} s")
    for f in ck.failures[:MAX_SHOWN]:
        print(f)
    if len(ck.failures) > MAX_SHOWN:
        print(f"... and {len(ck.failures) - MAX_SHOWN} more")
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
