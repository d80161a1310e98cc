"""Independent reference of the K3 tokenizer and XTML chat format, written from the spec only.

What it is for: an outside check of common/tok (C). Everything here was written from
/work/shared/spec/k3-model.md §9 (9.1 BPE, 9.2 special tokens, 9.3 XTML chat format);
common/tok/*.c was deliberately NOT read. docs/tokenizer.md was used only for where the
files are and their format (tiktoken.model lines, tokenizer_config.json added_tokens_decoder,
specials at n_ranks + k in a vocabulary with fewer ranks than the real 163,584).

What it is not: fast, or a full OpenAI-request renderer. It renders the message kinds §9.3
defines unambiguously (system/user/assistant turns with optional name and reasoning, the
generation prompt, thinking on/off) and the skeleton of tool calls / tool results (scalar
arguments; the index base, type names and value text are not in §9.3 and follow the C).
Internal system messages (tool-declare, thinking-effort, ...) are left out: §9.3 names them
but does not give their text (see docs/tokenizer.md "Independent check").

Needs the `regex` module (Debian python3-regex): Python's `re` has no \\p{..} classes and no
class intersection (`&&`). With VERSION1 the §9.1 pattern compiles verbatim; `regex` reads
\\p{Han} as the Script property (not Script_Extensions) and \\s as Unicode White_Space, the
same as the Rust regex crate under tiktoken (which §9.1 names for the lookahead semantics).

Invariants: decode(encode(t)) == t.encode("utf-8") for every str t; ids < n_ranks are BPE
ranks, ids n_ranks..n_ranks+255 are the 256 reserved specials in §9.2 order.
"""

import base64
import heapq
import json
import os

import regex

# §9.1, verbatim (one alternative per line there; joined with nothing in between).
PAT_STR = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
SPLIT_RE = regex.compile(PAT_STR, regex.VERSION1)

# §9.1: "text is cut into <= 400,000-char pieces and runs of > 25,000 consecutive whitespace or
# non-whitespace chars are split" ([BG-K25TOK] encode, Python: chars are code points and
# "whitespace" is str.isspace).
MAX_CHUNK_CHARS = 400_000
MAX_RUN_CHARS = 25_000

# §9.2: real id - 163584 = k; the named ones (all others are <|reserved_token_{id}|>).
REAL_SPECIAL_BASE = 163584
SPEC_NAMED = {
    0: ("[BOS]", True), 1: ("[EOS]", True), 2: ("<|end_of_msg|>", True),
    3: ("<|open|>", False), 4: ("<|close|>", False), 5: ("<|sep|>", False),
    6: ("[start_header_id]", True), 7: ("[end_header_id]", True), 9: ("[EOT]", True),
    18: ("<|media_begin|>", True), 19: ("<|media_content|>", True),
    20: ("<|media_end|>", True), 21: ("<|media_pad|>", True),
    65: ("<osagent_mode>", True), 254: ("[UNK]", True), 255: ("[PAD]", True),
}
N_SPECIALS = 256


class RefTokError(Exception):
    pass


def split_pieces(text):
    """§9.1 pre-tokenisation of one regex subject (no special handling)."""
    return [m.group(0) for m in SPLIT_RE.finditer(text)]


def cut_long_runs(text):
    """§9.1 chunking before the regex: <= 400,000 chars, runs of one class <= 25,000."""
    out = []
    for c0 in range(0, len(text), MAX_CHUNK_CHARS):
        chunk = text[c0:c0 + MAX_CHUNK_CHARS]
        start = 0
        run = 0
        prev_space = None
        for i, ch in enumerate(chunk):
            sp = ch.isspace()
            if prev_space is None or sp == prev_space:
                run += 1
            else:
                run = 1
            prev_space = sp
            if run > MAX_RUN_CHARS:
                out.append(chunk[start:i])
                start = i
                run = 1
        out.append(chunk[start:])
    return [p for p in out if p] if text else []


class RefTok:
    def __init__(self, model_dir):
        self.ranks = {}  # bytes -> rank
        path = os.path.join(model_dir, "tiktoken.model")
        with open(path, "rb") as f:
            for ln, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                b64, rank = line.split()
                tok = base64.b64decode(b64, validate=True)
                if tok in self.ranks:
                    raise RefTokError(f"{path}:{ln}: duplicate token bytes")
                self.ranks[tok] = int(rank)
        self.n_ranks = len(self.ranks)
        self.id_bytes = [b""] * self.n_ranks
        for tok, r in self.ranks.items():
            if not 0 <= r < self.n_ranks or self.id_bytes[r]:
                raise RefTokError(f"{path}: ranks are not dense 0..n-1 (rank {r})")
            self.id_bytes[r] = tok
        for b in range(256):
            if bytes([b]) not in self.ranks:
                raise RefTokError(f"{path}: single byte {b} has no rank")
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        dec = cfg["added_tokens_decoder"]
        self.special_name = {}   # id -> content
        self.special_flag = {}   # id -> "special"
        for k in range(N_SPECIALS):
            sid = self.n_ranks + k
            ent = dec.get(str(sid))
            if ent is None:
                raise RefTokError(f"tokenizer_config.json: no entry for id {sid}")
            name, flag = ent["content"], bool(ent["special"])
            if k in SPEC_NAMED:
                if (name, flag) != SPEC_NAMED[k]:
                    raise RefTokError(f"id {sid}: {name!r}/{flag} but spec §9.2 says "
                                      f"{SPEC_NAMED[k]!r} for real id {REAL_SPECIAL_BASE + k}")
            elif name != f"<|reserved_token_{sid}|>":
                raise RefTokError(f"id {sid}: unnamed id named {name!r}")
            self.special_name[sid] = name
            self.special_flag[sid] = flag
        self.special_id = {v: k for k, v in self.special_name.items()}

    def sid(self, name):
        return self.special_id[name]

    # ---- BPE (§9.1: tiktoken byte-pair merge over the ranks) -------------------------------
    def bpe(self, piece):
        """tiktoken BPE (§9.1): a piece that is itself a token is that one token (even when no
        chain of merges reaches it); otherwise start from single bytes and merge the
        lowest-rank adjacent pair (leftmost on ties) until no adjacent pair is a token."""
        if piece in self.ranks:
            return [self.ranks[piece]]
        n = len(piece)
        # parts are [start, next_start); a linked list over part starts plus a lazy heap
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap = []

        def push(i):
            j = nxt[i]
            if j >= n:
                return
            k = nxt[j]
            r = self.ranks.get(piece[i:k])
            if r is not None:
                heapq.heappush(heap, (r, i, k))

        for i in range(n - 1):
            push(i)
        while heap:
            r, i, k = heapq.heappop(heap)
            if not alive[i]:
                continue
            j = nxt[i]
            if j >= n or nxt[j] != k:
                continue  # stale: a neighbour changed since this pair was pushed
            alive[j] = False
            nxt[i] = k
            if k < n:
                prv[k] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        out = []
        i = 0
        while i < n:
            out.append(self.ranks[piece[i:nxt[i]]])
            i = nxt[i]
        return out

    def bpe_quadratic(self, piece):
        """Straight transcription of the merge rule (slow); used to check bpe()."""
        if piece in self.ranks:  # tiktoken: a piece that is a token is that token
            return [self.ranks[piece]]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ranks[p] for p in parts]

    def _encode_ordinary(self, text, out):
        for piece in split_pieces(text):
            out.extend(self.bpe(piece.encode("utf-8")))

    def encode(self, text, allow_special=False):
        """Caller text: specials disallowed means their names are plain text (§9.3)."""
        out = []
        for sub in cut_long_runs(text):
            if not allow_special:
                self._encode_ordinary(sub, out)
                continue
            pos = 0
            while pos < len(sub):
                best = None
                for name, sid in self.special_id.items():
                    at = sub.find(name, pos)
                    if at >= 0 and (best is None or at < best[0]
                                    or (at == best[0] and len(name) > len(best[1]))):
                        best = (at, name, sid)
                if best is None:
                    self._encode_ordinary(sub[pos:], out)
                    break
                self._encode_ordinary(sub[pos:best[0]], out)
                out.append(best[2])
                pos = best[0] + len(best[1])
        return out

    def decode(self, ids, skip_special=False):
        """§9.1 "Decode = concatenate token bytes"; specials give their names."""
        out = bytearray()
        for i in ids:
            if 0 <= i < self.n_ranks:
                out += self.id_bytes[i]
            elif self.n_ranks <= i < self.n_ranks + N_SPECIALS:
                if not (skip_special and self.special_flag[i]):
                    out += self.special_name[i].encode("utf-8")
            else:
                raise RefTokError(f"id {i} out of range")
        return bytes(out)

    # ---- §9.3 XTML -----------------------------------------------------------------------
    def _open(self, out, tag, attrs=()):
        out.append(self.sid("<|open|>"))
        out.extend(self.encode(tag))
        for key, value in attrs:
            v = value.replace("&", "&amp;").replace('"', "&quot;")
            out.extend(self.encode(f' {key}="{v}"'))
        out.append(self.sid("<|sep|>"))

    def _close(self, out, tag):
        out.append(self.sid("<|close|>"))
        out.extend(self.encode(tag))
        out.append(self.sid("<|sep|>"))

    def _tool_calls(self, out, tool_calls, calls):
        """§9.3 skeleton: open(tools) {open(call, tool=NAME, index=i) {open(argument, key=K,
        type=T) V close(argument)} close(call)} close(tools). The spec does not say where i
        starts, how T is named or how a non-string V is written: here i counts from 1, T is
        string|number|boolean and V is the string itself or its JSON text (scalars only) --
        the C's choices, so only the skeleton is independent."""
        if not tool_calls:
            return
        self._open(out, "tools")
        for i, tc in enumerate(tool_calls, 1):
            fn = tc["function"]
            args = fn["arguments"]
            args = json.loads(args) if isinstance(args, str) else args
            calls[tc["id"]] = (fn["name"], i)
            self._open(out, "call", [("tool", fn["name"]), ("index", str(i))])
            for key, v in args.items():
                if isinstance(v, str):
                    typ, text = "string", v
                elif isinstance(v, bool):
                    typ, text = "boolean", json.dumps(v)
                elif isinstance(v, (int, float)):
                    typ, text = "number", json.dumps(v)
                else:
                    raise RefTokError(f"argument {key!r}: only scalar arguments are covered")
                self._open(out, "argument", [("key", key), ("type", typ)])
                out.extend(self.encode(text))
                self._close(out, "argument")
            self._close(out, "call")
        self._close(out, "tools")

    def render_chat(self, messages, thinking=True, add_generation_prompt=True):
        """messages: OpenAI-style [{"role": system|user|assistant|tool, "content", optional
        "name", "reasoning_content", "tool_calls" (scalar arguments), "tool_call_id"}]; tool
        results must follow their calls in call order (no reordering here)."""
        out = []
        calls = {}  # tool_call_id -> (tool name, index) for the tool results
        for m in messages:
            role = m["role"]
            content = m.get("content") or ""
            if role in ("user", "system"):
                attrs = [("role", role)]
                if m.get("name") is not None:
                    attrs.append(("name", m["name"]))
                self._open(out, "message", attrs)
                out.extend(self.encode(content))
                self._close(out, "message")
            elif role == "assistant":
                self._open(out, "message", [("role", "assistant")])
                if thinking:
                    self._open(out, "think")
                    out.extend(self.encode(m.get("reasoning_content") or ""))
                    self._close(out, "think")
                self._open(out, "response")
                out.extend(self.encode(content))
                self._close(out, "response")
                self._tool_calls(out, m.get("tool_calls") or [], calls)
                self._close(out, "message")
            elif role == "tool":
                name, index = calls[m["tool_call_id"]]
                self._open(out, "message", [("role", "tool"), ("tool", name),
                                            ("index", str(index))])
                out.extend(self.encode(content))
                self._close(out, "message")
            else:
                raise RefTokError(f"role {role!r} not covered by the reference")
            out.append(self.sid("<|end_of_msg|>"))
        if add_generation_prompt:
            self._open(out, "message", [("role", "assistant")])
            self._open(out, "think" if thinking else "response")
        return out
