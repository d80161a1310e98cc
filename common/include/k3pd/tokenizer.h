/* k3_tok: the Kimi tiktoken BPE tokenizer (K3 and Kimi-Linear-48B), byte-exact to tiktoken.
 *
 * What it is: loading `tiktoken.model` (`base64(bytes) rank` per line, dense ranks 0..n-1,
 * all 256 single bytes present) and `tokenizer_config.json` from a model directory; encoding
 * caller text to ids with the K3 pre-tokenizer regex (PCRE2, UTF+UCP+JIT) and byte-level
 * merge-by-rank BPE; decoding ids to bytes; the special-token table of the model type.
 * What it is not: chat rendering (chat.h) or streaming detokenisation (detok.h).
 *
 * Id layout: BPE ranks are ids 0..n_ranks-1; the 256 special ids follow at
 * n_ranks..n_ranks+255 (real checkpoints: n_ranks 163,584, specials 163584..163839; the tiny
 * presets: n_ranks 3,840, specials 3840..4095). Special tokens are named by their REAL id
 * 163584+k, so k3_tok_special_id(tok, 163586) is `<|end_of_msg|>` in every vocabulary size.
 *
 * Invariants: a loaded k3_tok_t is immutable and may be used from any number of threads at
 * once (every encode call owns its own PCRE2 match data and JIT stack). Caller text is always
 * encoded with special tokens DISALLOWED: `<|end_of_msg|>` typed by a user encodes to plain
 * BPE ids, never to the control id. Structural markers are emitted as ids by chat.h.
 * Errors: functions return 0 or a negative K3_E* code and write a message naming the file,
 * line or field into err (when err is not NULL); on error the outputs are unchanged except
 * that appended ids/bytes may have been added to a k3_tok_ids_t/k3_tok_str_t and then
 * truncated back (the length is restored). */
#ifndef K3PD_TOKENIZER_H
#define K3PD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define K3_TOK_NUM_SPECIAL 256
#define K3_TOK_REAL_SPECIAL_BASE 163584 /* first special id of the real 163,840 vocabulary */
#define K3_TOK_REAL_VOCAB 163840

/* Real special ids (map into a vocabulary with k3_tok_special_id()). */
#define K3_TOK_ID_BOS 163584        /* [BOS]: declared, never prepended */
#define K3_TOK_ID_EOS 163585        /* [EOS]: stop id */
#define K3_TOK_ID_END_OF_MSG 163586 /* K3 <|end_of_msg|>, 48B <|im_end|>: stop id */
#define K3_TOK_ID_OPEN 163587       /* K3 <|open|>,  48B <|im_user|> */
#define K3_TOK_ID_CLOSE 163588      /* K3 <|close|>, 48B <|im_assistant|> */
#define K3_TOK_ID_SEP 163589        /* K3 <|sep|>,   48B unnamed */
#define K3_TOK_ID_IM_END 163586       /* 48B <|im_end|> (same slot as K3 <|end_of_msg|>) */
#define K3_TOK_ID_IM_USER 163587      /* 48B <|im_user|> */
#define K3_TOK_ID_IM_ASSISTANT 163588 /* 48B <|im_assistant|> */
#define K3_TOK_ID_IM_SYSTEM 163594  /* 48B <|im_system|> */
#define K3_TOK_ID_IM_MIDDLE 163601  /* 48B <|im_middle|> */
#define K3_TOK_ID_TOOL_CALLS_BEGIN 163595 /* 48B <|tool_calls_section_begin|> */
#define K3_TOK_ID_TOOL_CALLS_END 163596   /* 48B <|tool_calls_section_end|> */
#define K3_TOK_ID_TOOL_CALL_BEGIN 163597  /* 48B <|tool_call_begin|> */
#define K3_TOK_ID_TOOL_CALL_ARG 163598    /* 48B <|tool_call_argument_begin|> */
#define K3_TOK_ID_TOOL_CALL_END 163599    /* 48B <|tool_call_end|> */
#define K3_TOK_ID_PAD 163839              /* [PAD] */

typedef enum {
  K3_TOK_MODEL_K3 = 0,          /* model_type "kimi_k3": XTML chat, <|open|>/<|close|>/<|sep|> */
  K3_TOK_MODEL_KIMI_LINEAR = 1, /* model_type "kimi_linear" (48B): K2-style <|im_*|> chat */
} k3_tok_model_t;

typedef struct k3_tok k3_tok_t;

/* A growable id array. Zero-initialise; appended to by encode/render; free(ids) when done. */
typedef struct {
  int32_t *ids;
  size_t n, cap;
} k3_tok_ids_t;

/* A growable byte string, always NUL-terminated after a successful append (data may contain
 * NUL bytes before len). Zero-initialise; free(data) when done. */
typedef struct {
  char *data;
  size_t len, cap;
} k3_tok_str_t;

/* Loads DIR/tiktoken.model and DIR/tokenizer_config.json. model_type is "kimi_k3",
 * "kimi_linear" or NULL: NULL reads DIR/config.json "model_type" and, when there is none,
 * infers the type from the names at 163586..163591 in tokenizer_config.json. Every entry of
 * added_tokens_decoder must equal the built-in table of that model type (content and
 * "special"), at the id n_ranks+k: a 48B table found next to a K3 model (or vice versa) is
 * refused with K3_ECONFIG, never mixed. *out is owned by the caller (k3_tok_free). */
int k3_tok_load(const char *dir, const char *model_type, k3_tok_t **out, char *err, size_t errlen);
void k3_tok_free(k3_tok_t *tok);

k3_tok_model_t k3_tok_model(const k3_tok_t *tok);
int32_t k3_tok_n_ranks(const k3_tok_t *tok);    /* BPE ids 0..n_ranks-1 */
int32_t k3_tok_vocab_size(const k3_tok_t *tok); /* n_ranks + 256 */

/* Maps a real special id (163584..163839) to this vocabulary's id; -1 when out of range. */
int32_t k3_tok_special_id(const k3_tok_t *tok, int32_t real_id);
/* The id whose special name is `name` (e.g. "<|sep|>"), or K3_ENOENT. Unnamed ids are
 * found under "<|reserved_token_N|>" with N their id in this vocabulary. */
int32_t k3_tok_special_by_name(const k3_tok_t *tok, const char *name);
/* True when id is one of the 256 special ids. */
bool k3_tok_is_special(const k3_tok_t *tok, int32_t id);
/* True when id is special AND marked "special": true (K3 <|open|>/<|close|>/<|sep|> are not:
 * a skip-special decode must keep them). */
bool k3_tok_is_skippable(const k3_tok_t *tok, int32_t id);
/* Writes the model's stop ids (both [EOS] and <|end_of_msg|>/<|im_end|>, mapped into this
 * vocabulary) into out[0..1]; returns the count (2). */
int k3_tok_stop_ids(const k3_tok_t *tok, int32_t out[2]);

/* The bytes of one id (BPE bytes, or the special token's name). Pointer valid while tok is. */
int k3_tok_id_bytes(const k3_tok_t *tok, int32_t id, const uint8_t **bytes, size_t *len);

/* Encode flags. */
#define K3_TOK_ENC_REPLACE_INVALID 1u /* replace ill-formed UTF-8 with U+FFFD (one per maximal
                                         subpart, as Python's errors="replace") instead of
                                         failing with K3_EUTF8 */

/* Encodes text[0..len) (specials disallowed) and APPENDS the ids to out. Text is cut into
 * ≤ 400,000-code-point pieces, each cut so no run of > 25,000 consecutive whitespace
 * (Python str.isspace) or non-whitespace code points remains, then split by the regex and
 * BPE-merged. Ill-formed UTF-8 fails with K3_EUTF8 naming the byte offset unless
 * K3_TOK_ENC_REPLACE_INVALID. */
int k3_tok_encode(const k3_tok_t *tok, const char *text, size_t len, unsigned flags,
                  k3_tok_ids_t *out, char *err, size_t errlen);

/* k3_tok_encode that gives up once more than max_ids ids were appended (0 = no limit):
 * K3_ERANGE, "text: more than N tokens", out restored. The check runs after every piece, so the
 * work and the ids held stay within max_ids plus one piece (a text that cannot fit a context
 * costs no more than the context). */
int k3_tok_encode_max(const k3_tok_t *tok, const char *text, size_t len, unsigned flags, size_t max_ids,
                      k3_tok_ids_t *out, char *err, size_t errlen);

/* Bytes of the longest BPE token: encoded text (specials disallowed) never has fewer than
 * len / k3_tok_max_token_bytes ids, so a text longer than context x this cannot fit. */
size_t k3_tok_max_token_bytes(const k3_tok_t *tok);

/* Decode flags. */
#define K3_TOK_DEC_SKIP_SPECIAL 1u /* omit ids for which k3_tok_is_skippable() */

/* Appends the bytes of ids to out (raw bytes: may be ill-formed UTF-8 if the ids split a
 * character; use detok.h for text). An id outside the vocabulary fails with K3_ERANGE. */
int k3_tok_decode(const k3_tok_t *tok, const int32_t *ids, size_t n, unsigned flags,
                  k3_tok_str_t *out, char *err, size_t errlen);

/* Appends ids/bytes to the growable arrays; K3_ENOMEM on allocation failure. */
int k3_tok_ids_push(k3_tok_ids_t *v, int32_t id);
int k3_tok_str_append(k3_tok_str_t *s, const void *data, size_t len);

/* Writes a tiny byte-level tokenizer into dir (which must exist): tiktoken.model with the 256
 * single bytes (rank = byte value) and vocab_size-512 merges learned by standard BPE
 * training on the corpus committed in common/tok/corpus.txt (split by the K3 regex; ties of
 * pair counts broken by the smaller (left rank, right rank)), and tokenizer_config.json with
 * model_type's ("kimi_k3" | "kimi_linear") special table at ids vocab_size-256+k.
 * Deterministic: the same arguments always give byte-identical files. vocab_size must be in
 * [512, 256 + max merges of the corpus] (K3_ERANGE otherwise; 4096 fits). */
int k3_tok_write_model_files(const char *dir, const char *model_type, int vocab_size, char *err,
                             size_t errlen);

#endif
