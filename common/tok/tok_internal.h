/* Private structures of k3_tok, shared by the files of common/tok/ and by its unit tests.
 * Not a public API: the router and workers use k3pd/tokenizer.h, chat.h and detok.h. */
#ifndef K3_TOK_INTERNAL_H
#define K3_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3pd/tokenizer.h"
#include "tok_uni15.h"

/* The pieces of the K3 split regex (spec §9.1) in PCRE2 syntax. Rust-regex semantics that
 * PCRE2 spells differently:
 *  - `[A && [^\p{Han}]]` (class intersection) becomes `(?:(?!\p{sc:Han})[A])`: one code
 *    point that is in A and not Han. Equivalence is checked over every code point by the
 *    unit tests.
 *  - `\p{Han}` in the Rust regex crate is the Script property; a bare script name in PCRE2
 *    >= 10.40 means Script_Extensions (which adds e.g. U+3001 、 and U+30FC ー), so `sc:`
 *    is spelled out.
 *  - Rust `\s` is Unicode White_Space. PCRE2's UCP `\s` (Z + HT LF VT FF CR, plus U+180E)
 *    differs at U+0085 and U+180E, so the White_Space set is listed explicitly.
 *  - Every `\p{X}` sits inside a character class followed by a string of extra ranges
 *    (possibly empty): the Unicode 15.0 corrections of tok_uni15.h when the runtime PCRE2's
 *    tables are older (k3_tok_splitter_init picks), nothing otherwise. The extra ranges of
 *    a class are the union of the additions of the properties in it (HAN_, UP_ = Lu Lt Lm
 *    Lo M, LO_ = Ll Lm Lo M, LN_ = L N, N_); the letter classes sit behind (?!Han), so their
 *    unions leave the Han additions out. The `_X` macros take those strings; the plain
 *    names are the uncorrected classes. */
#define K3_RE_HAN_X(HAN_) "[\\p{sc:Han}" HAN_ "]"
#define K3_RE_UPPERISH_X(HAN_, UP_) \
  "(?:(?!" K3_RE_HAN_X(HAN_) ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" UP_ "])"
#define K3_RE_LOWERISH_X(HAN_, LO_) \
  "(?:(?!" K3_RE_HAN_X(HAN_) ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" LO_ "])"
#define K3_RE_WS_CHARS \
  "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define K3_RE_SPACE "[" K3_RE_WS_CHARS "]"
#define K3_RE_NONSPACE "[^" K3_RE_WS_CHARS "]"
#define K3_RE_PREFIX_X(LN_) "[^\\r\\n\\p{L}\\p{N}" LN_ "]"
#define K3_RE_CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define K3_RE_PATTERN_X(HAN_, UP_, LO_, LN_, N_)                                                \
  K3_RE_HAN_X(HAN_) "+"                                                                         \
  "|" K3_RE_PREFIX_X(LN_) "?" K3_RE_UPPERISH_X(HAN_, UP_) "*" K3_RE_LOWERISH_X(HAN_, LO_) "+"   \
      K3_RE_CONTRACTION "?"                                                                     \
  "|" K3_RE_PREFIX_X(LN_) "?" K3_RE_UPPERISH_X(HAN_, UP_) "+" K3_RE_LOWERISH_X(HAN_, LO_) "*"   \
      K3_RE_CONTRACTION "?"                                                                     \
  "|[\\p{N}" N_ "]{1,3}"                                                                        \
  "| ?[^" K3_RE_WS_CHARS "\\p{L}\\p{N}" LN_ "]+[\\r\\n]*"                                       \
  "|" K3_RE_SPACE "*[\\r\\n]+"                                                                  \
  "|" K3_RE_SPACE "+(?!" K3_RE_NONSPACE ")"                                                     \
  "|" K3_RE_SPACE "+"

/* The classes and the pattern as PCRE2's own tables define them. */
#define K3_RE_HAN K3_RE_HAN_X("")
#define K3_RE_UPPERISH K3_RE_UPPERISH_X("", "")
#define K3_RE_LOWERISH K3_RE_LOWERISH_X("", "")
#define K3_RE_PREFIX K3_RE_PREFIX_X("")
#define K3_RE_PATTERN K3_RE_PATTERN_X("", "", "", "", "")
/* The same with the Unicode 15.0 corrections of tok_uni15.h (PCRE2 tables < 15.0.0). */
#define K3_RE_HAN_U15 K3_RE_HAN_X(K3_UNI15_ADD_HAN)
#define K3_RE_UPPERISH_U15 K3_RE_UPPERISH_X(K3_UNI15_ADD_HAN, K3_UNI15_ADD_UPPERISH)
#define K3_RE_LOWERISH_U15 K3_RE_LOWERISH_X(K3_UNI15_ADD_HAN, K3_UNI15_ADD_LOWERISH)
#define K3_RE_PREFIX_U15 K3_RE_PREFIX_X(K3_UNI15_ADD_LN)
#define K3_RE_PATTERN_U15                                                                \
  K3_RE_PATTERN_X(K3_UNI15_ADD_HAN, K3_UNI15_ADD_UPPERISH, K3_UNI15_ADD_LOWERISH,         \
                  K3_UNI15_ADD_LN, K3_UNI15_ADD_N)

#define K3_TOK_MAX_ENCODE_CHARS 400000 /* tokenization_kimi.py TIKTOKEN_MAX_ENCODE_CHARS */
#define K3_TOK_MAX_RUN_CHARS 25000     /* tokenization_kimi.py MAX_NO_WHITESPACES_CHARS */

/* The compiled split regex. Immutable once built; shared by threads. */
typedef struct {
  pcre2_code *re;     /* the split regex (K3_RE_PATTERN_U15 when uni15, else K3_RE_PATTERN) */
  pcre2_code *re_low; /* uni15 only: K3_RE_PATTERN, for subjects whose code points are all
                       * < K3_UNI15_MIN_CP (same pieces, no range compares); else NULL */
  bool jit;           /* JIT compile succeeded (it can be unavailable on exotic hosts) */
  bool uni15;         /* the runtime PCRE2's tables are older than Unicode 15.0 */
} k3_tok_splitter_t;

/* Compiles the split regex: K3_RE_PATTERN_U15 when the runtime PCRE2's Unicode tables
 * (PCRE2_CONFIG_UNICODE_VERSION) are older than K3_UNI15_VERSION, else K3_RE_PATTERN. */
int k3_tok_splitter_init(k3_tok_splitter_t *sp, char *err, size_t errlen);
/* Compares dotted version strings numerically ("14.0.0" < "15.0.0" < "15.1.0"): <0, 0, >0.
 * A missing component counts as 0. */
int k3_tok_version_cmp(const char *a, const char *b);
void k3_tok_splitter_free(k3_tok_splitter_t *sp);

/* Called once per pre-tokenized piece s[off..off+len) of the original text. */
typedef int (*k3_tok_piece_fn)(void *ctx, const char *s, size_t off, size_t len);

/* Splits valid UTF-8 text[0..len) exactly as tokenization_kimi.py + tiktoken do: 400,000
 * code-point chunks, then runs of > 25,000 whitespace/non-whitespace code points cut, then
 * the regex (or its ASCII fast path) on each sub-string. Stops at the first callback error.
 * use_fast_path=false forces PCRE2 (for the equivalence tests). */
int k3_tok_split(const k3_tok_splitter_t *sp, const char *text, size_t len, bool use_fast_path,
                 k3_tok_piece_fn fn, void *ctx);

/* Python str.isspace() for one code point (used by the 25,000-run rule). */
bool k3_tok_py_isspace(uint32_t cp);
/* Decodes one code point from VALID UTF-8 at s; returns its byte length. */
size_t k3_tok_utf8_next(const uint8_t *s, uint32_t *cp);

/* The rank table: bytes → rank (open addressing on xxhash64) and rank → bytes. */
typedef struct {
  int32_t n;       /* ranks 0..n-1 */
  uint8_t *bytes;  /* all token bytes, rank order */
  uint32_t *off;   /* [n+1] offsets into bytes */
  uint32_t *slots; /* rank+1, 0 = empty; size mask+1 */
  uint32_t mask;
  int32_t byte_rank[256];
} k3_tok_ranks_t;

/* Builds the table from n byte strings given as (bytes, off) (takes ownership of both
 * arrays, also on error). Duplicate byte strings or a missing single byte → K3_EFORMAT. */
int k3_tok_ranks_build(k3_tok_ranks_t *r, int32_t n, uint8_t *bytes, uint32_t *off, char *err,
                       size_t errlen);
void k3_tok_ranks_free(k3_tok_ranks_t *r);
/* Rank of p[0..len) or -1. */
int32_t k3_tok_ranks_get(const k3_tok_ranks_t *r, const uint8_t *p, size_t len);

/* Byte-pair merge of one piece, appending ranks to out (tiktoken byte_pair_encode: whole
 * piece lookup first, then merge the lowest-rank adjacent pair, leftmost on ties). The two
 * implementations give identical results; k3_tok_bpe picks by length. */
int k3_tok_bpe(const k3_tok_ranks_t *r, const uint8_t *p, size_t len, k3_tok_ids_t *out);
int k3_tok_bpe_quadratic(const k3_tok_ranks_t *r, const uint8_t *p, size_t len,
                         k3_tok_ids_t *out);
int k3_tok_bpe_heap(const k3_tok_ranks_t *r, const uint8_t *p, size_t len, k3_tok_ids_t *out);

/* The built-in special-token tables, by real id offset k = id - 163584. */
typedef struct {
  int k;
  const char *name;
  bool special;
} k3_tok_special_def_t;
/* Returns the named entries of a model type (count in *n). */
const k3_tok_special_def_t *k3_tok_special_table(k3_tok_model_t model, size_t *n);
/* Parses "kimi_k3" / "kimi_linear"; K3_EINVAL otherwise. */
int k3_tok_parse_model_type(const char *s, k3_tok_model_t *out);

struct k3_tok {
  k3_tok_model_t model;
  k3_tok_ranks_t ranks;
  k3_tok_splitter_t split;
  char *special_name[K3_TOK_NUM_SPECIAL]; /* owned, NUL-terminated */
  size_t special_len[K3_TOK_NUM_SPECIAL];
  bool special_flag[K3_TOK_NUM_SPECIAL];
};

/* Fills tok->special_* with the built-in table of tok->model at base n_ranks. */
int k3_tok_specials_init(k3_tok_t *tok);

/* Encodes with an explicit fast-path switch (tests); same contract as k3_tok_encode. */
int k3_tok_encode_ex(const k3_tok_t *tok, const char *text, size_t len, unsigned flags,
                     bool use_fast_path, k3_tok_ids_t *out, char *err, size_t errlen);

/* The committed training corpus (generated into the build tree from corpus.txt). */
extern const unsigned char k3_tok_corpus[];
extern const size_t k3_tok_corpus_len;

#endif
