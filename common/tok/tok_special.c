/* The special-token tables of K3 and Kimi-Linear-48B (spec k3-model.md §9.2,
 * kimi-linear-48b.md §9), by offset k from the first special id (real id 163584 + k).
 * The two tables differ at k = 2..7; keeping both here, next to each other, is what lets
 * the loader refuse a tokenizer_config.json of the other model instead of mixing them. */
#include <string.h>

#include "k3pd/err.h"
#include "tok_internal.h"

static const k3_tok_special_def_t k3_table[] = {
    {0, "[BOS]", true},           {1, "[EOS]", true},
    {2, "<|end_of_msg|>", true},  {3, "<|open|>", false},
    {4, "<|close|>", false},      {5, "<|sep|>", false},
    {6, "[start_header_id]", true}, {7, "[end_header_id]", true},
    {9, "[EOT]", true},           {18, "<|media_begin|>", true},
    {19, "<|media_content|>", true}, {20, "<|media_end|>", true},
    {21, "<|media_pad|>", true},  {65, "<osagent_mode>", true},
    {254, "[UNK]", true},         {255, "[PAD]", true},
};

static const k3_tok_special_def_t kl_table[] = {
    {0, "[BOS]", true},
    {1, "[EOS]", true},
    {2, "<|im_end|>", true},
    {3, "<|im_user|>", true},
    {4, "<|im_assistant|>", true},
    {6, "<|start_header_id|>", true},
    {7, "<|end_header_id|>", true},
    {9, "[EOT]", true},
    {10, "<|im_system|>", true},
    {11, "<|tool_calls_section_begin|>", true},
    {12, "<|tool_calls_section_end|>", true},
    {13, "<|tool_call_begin|>", true},
    {14, "<|tool_call_argument_begin|>", true},
    {15, "<|tool_call_end|>", true},
    {17, "<|im_middle|>", true},
    {254, "[UNK]", true},
    {255, "[PAD]", true},
};

const k3_tok_special_def_t *k3_tok_special_table(k3_tok_model_t model, size_t *n) {
  if (model == K3_TOK_MODEL_K3) {
    *n = sizeof k3_table / sizeof k3_table[0];
    return k3_table;
  }
  *n = sizeof kl_table / sizeof kl_table[0];
  return kl_table;
}

int k3_tok_parse_model_type(const char *s, k3_tok_model_t *out) {
  if (s && strcmp(s, "kimi_k3") == 0) {
    *out = K3_TOK_MODEL_K3;
    return 0;
  }
  if (s && strcmp(s, "kimi_linear") == 0) {
    *out = K3_TOK_MODEL_KIMI_LINEAR;
    return 0;
  }
  return K3_EINVAL;
}
