/* k3_chat: renders an OpenAI-style conversation straight to token ids.
 *
 * K3 (model_type kimi_k3) uses XTML (spec k3-model.md §9.3), rendered exactly like the
 * vLLM-derived port of encoding_k3.py build_chat_segments: a list of segments, each encoded
 * INDEPENDENTLY (BPE never merges across segment borders), structural markers (<|open|>,
 * <|close|>, <|sep|>, <|end_of_msg|>) emitted as ids, caller text encoded with specials
 * disallowed. Kimi-Linear-48B (kimi_linear) uses the K2 format <|im_system|>/<|im_user|>/
 * <|im_assistant|> NAME <|im_middle|> BODY <|im_end|>, markers as ids, the text between two
 * markers encoded as one segment (as HF's template string would be).
 * What it is not: a parser of model output, or a string renderer: nothing here produces a
 * string to be re-encoded (that path lets caller text forge control tokens).
 *
 * Input: `messages` is a JSON array of {role, content, [name], [reasoning_content],
 * [tool_calls], [tool_call_id]}; roles system|user|assistant|tool; content a string, null or
 * an array of {"type":"text","text":...} parts (image parts are refused: no multimodal).
 * Errors name the message index and field (e.g. "messages[2].role: unknown role
 * \"developer\""). On error, out is restored to its length on entry. */
#ifndef K3PD_CHAT_H
#define K3PD_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "k3pd/tokenizer.h"

typedef struct {
  bool thinking;               /* K3: render history reasoning in <think>, open the think
                                  channel in the generation prompt (default true). Ignored by
                                  the 48B format, which has no reasoning channel. */
  bool add_generation_prompt;  /* default true */
  const char *thinking_effort; /* K3: "low" | "high" | "max" (default "max", the HF default of
                                  spec §9.3) adds the thinking-effort system message when
                                  thinking; NULL: no such message; else K3_EINVAL */
  const json_t *tools;         /* NULL or a JSON array of OpenAI tool declarations */
  const char *tool_choice;     /* K3: NULL | "auto" | "required" | "none" */
  const json_t *response_format; /* K3: NULL or {"type":"json_object"} |
                                    {"type":"json_schema","json_schema":{"schema":{...}}} */
  size_t max_ids;              /* > 0: give up with K3_ERANGE once the rendering holds more ids
                                  ("messages: more than N tokens"; bounds a prompt that cannot
                                  fit a context); 0 = no limit */
} k3_chat_opts_t;

/* thinking=true, add_generation_prompt=true, thinking_effort="max" (HF parity, spec §9.3),
 * everything else NULL. */
void k3_chat_opts_default(k3_chat_opts_t *opts);

/* Renders messages (borrowed) and APPENDS the ids to out. */
int k3_chat_render(const k3_tok_t *tok, const json_t *messages, const k3_chat_opts_t *opts,
                   k3_tok_ids_t *out, char *err, size_t errlen);

/* Parses text as either a messages array or an object {"messages": [...], "tools": [...],
 * "tool_choice": ..., "response_format": ..., "thinking_effort": ...}; object fields override
 * the matching opts fields (opts may be NULL for the defaults). Then renders as above. */
int k3_chat_render_json(const k3_tok_t *tok, const char *text, size_t len,
                        const k3_chat_opts_t *opts, k3_tok_ids_t *out, char *err, size_t errlen);

/* Appends the Python json.dumps form of v (ensure_ascii=False; compact → separators (",",
 * ":") else (", ", ": "); sort_keys → keys in code-point order; floats as Python repr) to
 * out. Exposed because tool declarations must be byte-identical to the Python renderer. */
int k3_chat_json_dumps(const json_t *v, bool compact, bool sort_keys, k3_tok_str_t *out);

#endif
