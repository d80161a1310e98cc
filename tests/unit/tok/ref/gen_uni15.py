#!/usr/bin/python3
"""Generates common/tok/tok_uni15.h: the Unicode 15.0 corrections of PCRE2's property tables
for the classes of the K3 split regex (spec k3-model.md §9.1).

Why: PCRE2 10.42 (Debian 12) carries Unicode 14 tables, so code points first assigned in
Unicode 15.0 (Kawi, Kaktovik numerals, CJK Ext H, ...) are unassigned there and split unlike
the real tokenizer (tiktoken, Rust regex: Unicode 15 tables). The split pattern
(common/tok/tok_internal.h, picked in tok_split.c) has the ranges printed here inside every
\\p{X} class when the runtime PCRE2 reports a Unicode version below 15.0.0.

How: for every property the pattern uses, the set of code points is taken once from the
`regex` module (Debian python3-regex 2022.10.31, Unicode 15.0 tables: the reference the
independent check ref_tok.py uses) and once from the installed libpcre2-8 itself (through
ctypes, the same flags as k3_tok: UTF + UCP), and the differences are printed as C string
fragments for a PCRE2 character class, per property and as the coalesced unions the
pattern's classes need. If PCRE2 has a code point in a class that Unicode 15.0 does not,
the generator stops with an error instead: the pattern can only add (none for 10.42).

Run (from the repository root, after a PCRE2 or python3-regex upgrade):
    /usr/bin/python3 tests/unit/tok/ref/gen_uni15.py > common/tok/tok_uni15.h
--check compares against the committed header instead of printing (exit 1 on a difference).
"""

import argparse
import ctypes
import ctypes.util
import importlib.metadata
import sys

import regex

# (C macro suffix, PCRE2 spelling, regex-module spelling). Han is the Script property in both
# (k3_tok spells sc:Han because a bare script name means Script_Extensions in PCRE2 >= 10.40).
PROPS = [
    ("L", r"\p{L}", r"\p{L}"),
    ("N", r"\p{N}", r"\p{N}"),
    ("LU", r"\p{Lu}", r"\p{Lu}"),
    ("LT", r"\p{Lt}", r"\p{Lt}"),
    ("LM", r"\p{Lm}", r"\p{Lm}"),
    ("LO", r"\p{Lo}", r"\p{Lo}"),
    ("LL", r"\p{Ll}", r"\p{Ll}"),
    ("M", r"\p{M}", r"\p{M}"),
    ("HAN", r"\p{sc:Han}", r"\p{Script=Han}"),
]

PCRE2_UTF = 0x00080000
PCRE2_UCP = 0x00020000
PCRE2_CONFIG_UNICODE_VERSION = 10
PCRE2_ERROR_NOMATCH = -1


class Pcre2:
    """The few libpcre2-8 entry points needed to list a property's members."""

    def __init__(self):
        name = ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0"
        self.lib = lib = ctypes.CDLL(name)
        lib.pcre2_compile_8.restype = ctypes.c_void_p
        lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
                                        ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
        lib.pcre2_match_data_create_from_pattern_8.restype = ctypes.c_void_p
        lib.pcre2_match_data_create_from_pattern_8.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.pcre2_match_8.restype = ctypes.c_int
        lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                      ctypes.c_void_p]
        lib.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
        lib.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
        lib.pcre2_code_free_8.argtypes = [ctypes.c_void_p]
        lib.pcre2_match_data_free_8.argtypes = [ctypes.c_void_p]
        lib.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
        buf = ctypes.create_string_buffer(64)
        lib.pcre2_config_8(PCRE2_CONFIG_UNICODE_VERSION, buf)
        self.unicode_version = buf.value.decode()
        vbuf = ctypes.create_string_buffer(64)
        lib.pcre2_config_8(11, vbuf)  # PCRE2_CONFIG_VERSION
        self.version = vbuf.value.decode()

    def members(self, prop, subject, offsets):
        """Code points of `subject` (all scalar values, UTF-8) that match `prop`."""
        ec, eo = ctypes.c_int(), ctypes.c_size_t()
        pat = (prop + "+").encode()
        code = self.lib.pcre2_compile_8(pat, len(pat), PCRE2_UTF | PCRE2_UCP,
                                        ctypes.byref(ec), ctypes.byref(eo), None)
        if not code:
            sys.exit(f"gen_uni15: PCRE2 cannot compile {prop!r} (error {ec.value})")
        md = self.lib.pcre2_match_data_create_from_pattern_8(code, None)
        out, start, n = set(), 0, len(subject)
        try:
            while start < n:
                rc = self.lib.pcre2_match_8(code, subject, n, start, 0, md, None)
                if rc == PCRE2_ERROR_NOMATCH:
                    break
                if rc < 0:
                    sys.exit(f"gen_uni15: pcre2_match error {rc} for {prop!r}")
                ov = self.lib.pcre2_get_ovector_pointer_8(md)
                b, e = ov[0], ov[1]
                # offsets maps a byte offset to the code point starting there, else None
                out.update(cp for cp in offsets[b:e] if cp is not None)
                start = e
        finally:
            self.lib.pcre2_match_data_free_8(md)
            self.lib.pcre2_code_free_8(code)
        return out


def all_scalars():
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    text = "".join(map(chr, cps))
    subject = text.encode("utf-8")
    offsets = [None] * len(subject)  # byte offset -> code point starting there (else None)
    pos = 0
    for cp in cps:
        offsets[pos] = cp
        pos += len(chr(cp).encode("utf-8"))
    return cps, text, subject, offsets


def regex_members(prop, cps, text):
    out = set()
    for m in regex.finditer(prop + "+", text, regex.VERSION1):
        out.update(cps[m.start():m.end()])
    return out


def ranges(cps):
    out = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def c_fragment(rs):
    """Ranges as a C string literal for use inside a PCRE2 class, wrapped at ~90 columns."""
    items = [f"\\\\x{{{a:X}}}" + (f"-\\\\x{{{b:X}}}" if b != a else "") for a, b in rs]
    lines, cur = [], ""
    for it in items:
        if len(cur) + len(it) > 80:
            lines.append(cur)
            cur = ""
        cur += it
    if cur:
        lines.append(cur)
    if not lines:
        return '""'
    if len(lines) == 1:
        return f'"{lines[0]}"'
    return "\\\n  " + " \\\n  ".join(f'"{ln}"' for ln in lines)


def generate():
    pc = Pcre2()
    cps, text, subject, offsets = all_scalars()
    body, removed_any, added = [], False, {}
    for name, pspell, rspell in PROPS:
        uni15 = regex_members(rspell, cps, text)
        old = pc.members(pspell, subject, offsets)
        add, rem = ranges(uni15 - old), ranges(old - uni15)
        n_add = len(uni15 - old)
        added[name] = uni15 - old
        removed_any |= bool(rem)
        body.append(f"/* {pspell}: {n_add} code points in {len(add)} ranges added"
                    f"{'' if not rem else f'; {len(old - uni15)} REMOVED'} */\n"
                    f"#define K3_UNI15_ADD_{name} {c_fragment(add)}\n")
        if rem:
            body.append(f"#define K3_UNI15_REMOVED_{name} {c_fragment(rem)}\n")
    # The unions the pattern's classes need, coalesced: fewer ranges = fewer compares per code
    # point in the JIT-compiled class. The letter classes sit behind (?!Han), so the Han
    # additions are left out of them.
    a = added
    for name, what, cpset in [
            ("UPPERISH", "Lu Lt Lm Lo M, minus Han",
             (a["LU"] | a["LT"] | a["LM"] | a["LO"] | a["M"]) - a["HAN"]),
            ("LOWERISH", "Ll Lm Lo M, minus Han",
             (a["LL"] | a["LM"] | a["LO"] | a["M"]) - a["HAN"]),
            ("LN", "L N", a["L"] | a["N"])]:
        rs = ranges(cpset)
        body.append(f"/* union {what}: {len(cpset)} code points in {len(rs)} ranges */\n"
                    f"#define K3_UNI15_ADD_{name} {c_fragment(rs)}\n")
    low = min((min(v) for v in added.values() if v), default=0x110000)
    body.append("/* The lowest added code point: a subject with only smaller code points splits\n"
                " * the same without the additions (tok_split.c then uses the faster plain\n"
                " * pattern). */\n"
                f"#define K3_UNI15_MIN_CP 0x{low:X}\n")
    try:
        regex_version = importlib.metadata.version("regex")
    except importlib.metadata.PackageNotFoundError:
        regex_version = regex.__version__
    head = f"""/* Generated by tests/unit/tok/ref/gen_uni15.py. Do not edit; regenerate with
 *   /usr/bin/python3 tests/unit/tok/ref/gen_uni15.py > common/tok/tok_uni15.h
 *
 * Unicode 15.0 corrections of PCRE2's property tables for the classes of the K3 split
 * regex (spec k3-model.md §9.1). Generated against PCRE2 {pc.version}, whose tables are
 * Unicode {pc.unicode_version}; the real tokenizer (tiktoken, Rust regex) and the independent
 * reference (python3-regex {regex_version}) use Unicode 15.0, so without this the code points
 * first assigned in Unicode 15.0 (Kawi, Kaktovik numerals, CJK Ext H, ...) split differently.
 * K3_UNI15_ADD_<P> lists, in PCRE2 class syntax, the code points in \\p{{P}} under Unicode
 * 15.0 (python3-regex) but not under this PCRE2 (libpcre2-8 queried with UTF+UCP). No code
 * point is in a PCRE2 class but outside its Unicode 15.0 one (the generator refuses
 * otherwise: the rewrite can only add). The pattern (tok_internal.h) puts, inside the class
 * of every \\p{{P}}, the union of the additions of the properties in that class
 * (K3_UNI15_ADD_UPPERISH / _LOWERISH / _LN / _N / _HAN), when the runtime PCRE2 reports
 * Unicode tables older than K3_UNI15_VERSION; a newer PCRE2 is used as it is. */
#ifndef K3_TOK_UNI15_H
#define K3_TOK_UNI15_H

/* Tables at or above this version need no correction. */
#define K3_UNI15_VERSION "{K3_UNI15_VERSION}"
/* The PCRE2 Unicode version the ranges below were computed against. */
#define K3_UNI15_BASE_VERSION "{pc.unicode_version}"

"""
    if removed_any:
        sys.exit("gen_uni15: PCRE2 has code points that Unicode 15.0 removed from a class; "
                 "the add-only rewrite in tok_split.c cannot express that")
    return head + "\n".join(body) + "\n#endif\n"


K3_UNI15_VERSION = "15.0.0"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="HEADER", help="compare with this file instead")
    a = ap.parse_args()
    out = generate()
    if a.check:
        with open(a.check, encoding="utf-8") as f:
            if f.read() != out:
                print(f"gen_uni15: {a.check} differs from the generated ranges", file=sys.stderr)
                return 1
        print(f"gen_uni15: {a.check} is current")
        return 0
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
