/* k3pd-generate's prompt input: token ids (--prompt-ids), raw text (--prompt) or a chat
 * conversation (--chat FILE.json), turned into the prompt ids the runner prefills.
 * Text and chat go through the model directory's tokenizer (k3_tok) exactly as the router
 * does it, so the monolithic path takes the same input as the cluster: text is encoded with
 * special tokens disallowed (k3_tok_encode, flags 0), chat is rendered to ids with the default
 * chat options (k3_chat_render_json: thinking on, generation prompt appended).
 * Builds without the tokenizer (K3PD_KERNELS_ONLY, no K3PD_HAVE_TOK) accept only ids and
 * refuse text/chat with a clear error. */
#ifndef K3PD_GENERATE_PROMPT_H
#define K3PD_GENERATE_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "k3pd/model_config.h"

typedef struct {
  const char *ids;       /* "1,2,3" or NULL */
  const char *text;      /* raw prompt text or NULL */
  const char *chat_file; /* JSON file (messages array or {"messages": ...}) or NULL */
  const char *tok_dir;   /* directory holding tiktoken.model + tokenizer_config.json */
} gen_prompt_src_t;

/* True when this build can encode text (the tokenizer library was linked). */
int gen_prompt_have_tokenizer(void);

/* Builds the prompt from exactly one source of src. On success *ids (malloc'd, caller frees)
 * holds *n >= 1 ids, each < cfg->vocab_size. Errors: K3_EINVAL (no/empty/bad input, an id
 * outside the vocabulary, a tokenizer larger than the model's vocabulary), K3_ENOTSUP (text or
 * chat without the tokenizer), or the tokenizer's / file reader's code; err names the flag or
 * file. On error *ids and *n are unchanged. */
int gen_prompt_build(const gen_prompt_src_t *src, const k3_model_config_t *cfg, int32_t **ids,
                     size_t *n, char *err, size_t errlen);

#endif
