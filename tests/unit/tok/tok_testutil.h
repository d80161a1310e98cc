/* Helpers shared by the k3_tok unit tests: temporary model directories with the tiny trained
 * vocabulary or a hand-written one whose ids can be written down in the tests. */
#ifndef K3_TOK_TESTUTIL_H
#define K3_TOK_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/tokenizer.h"

/* Creates a fresh directory under $TMPDIR (or /tmp); returns a malloc'd path. */
char *tt_mkdtemp(void);
/* Removes the files a test wrote (tiktoken.model, tokenizer_config.json, config.json). */
void tt_rmdir(char *dir);
/* Writes base64(bytes) lines for 256 single bytes (rank = byte) followed by words[0..n)
 * (rank 256 + i), an empty added_tokens_decoder, and config.json with model_type. */
void tt_write_hand_vocab(const char *dir, const char *model_type, const char *const *words, size_t n);
/* Loads dir with the given type; aborts the test on failure. */
k3_tok_t *tt_load(const char *dir, const char *model_type);
/* The tiny trained vocabulary (vocab 4096) of a model type, in a new directory. */
char *tt_tiny_dir(const char *model_type);
/* Base64 of p[0..n) into out (room for 4*(n+2)/3+1). */
void tt_b64(const uint8_t *p, size_t n, char *out);
/* Encodes NUL-terminated s, aborting on error. Caller frees .ids. */
k3_tok_ids_t tt_enc(const k3_tok_t *tok, const char *s);

#endif
