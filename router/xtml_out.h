/* Incremental parser of K3's assistant output (XTML, spec k3-model.md §9.3), for the OpenAI
 * front: it splits the generated text into the reasoning (think channel), the content
 * (response channel) and structured tool calls, while the text streams in.
 *
 * The model continues the generation prompt `<|open|>message role="assistant"<|sep|>` +
 * `<|open|>think<|sep|>` (thinking on) or `<|open|>response<|sep|>` (thinking off) with
 *   REASONING <|close|>think<|sep|> <|open|>response<|sep|> CONTENT <|close|>response<|sep|>
 *   [<|open|>tools<|sep|> {<|open|>call tool="NAME" index="i"<|sep|>
 *        {<|open|>argument key="K" type="T"<|sep|> VALUE <|close|>argument<|sep|>}
 *      | <|open|>json type="object"<|sep|> RAW <|close|>json<|sep|>
 *    <|close|>call<|sep|>} <|close|>tools<|sep|>]
 *   <|close|>message<|sep|>
 * The markers <|open|>, <|close|>, <|sep|> are not "special" tokens in K3's tokenizer (the
 * detokeniser writes their names), so the parser works on the text: a marker name is a marker
 * wherever it appears, as in every text-based reasoning/tool parser.
 *
 * Events (emit callback, in output order; s is only valid during the call):
 *   RT_XO_REASONING  text of the think channel
 *   RT_XO_CONTENT    text of the response channel, and anything that does not parse
 *   RT_XO_CALL_BEGIN a tool call starts; s = the tool's name (attribute unescaped)
 *   RT_XO_CALL_ARGS  the next piece of the call's arguments as JSON text: the argument
 *                    elements become one JSON object, `{"K": VALUE, ...}`, string values
 *                    escaped as they stream, other types checked as JSON when their element
 *                    closes (invalid JSON becomes a JSON string: the arguments stay valid
 *                    JSON whatever the model wrote); a json element is passed through raw
 *   RT_XO_CALL_END   the call's element closed (arguments complete)
 *
 * Robustness (the contract the OpenAI front relies on): no input is an error. A tag that is
 * unknown, unexpected where it stands, unterminated, or longer than RT_XO_MAX_TAG bytes is
 * emitted verbatim as text of the current channel (content, or reasoning inside think), so
 * malformed output degrades to plain content and no text is lost. Tolerated shortcuts: a
 * channel opened without closing the previous one, text after </think> without <response>
 * (content), a call/tools/message close that also closes what is open inside it. Whitespace
 * between structural elements is dropped. What a call that never closes (length cut) has
 * emitted stays as it is: its arguments are then truncated JSON, as OpenAI's are.
 *
 * Feeding the same text in any split gives the same events up to how text pieces are cut.
 * Not thread-safe; one parser per response. */
#ifndef K3PD_ROUTER_XTML_OUT_H
#define K3PD_ROUTER_XTML_OUT_H

#include <stdbool.h>
#include <stddef.h>

#include "k3pd/tokenizer.h"

#define RT_XO_MAX_TAG 512 /* bytes of a tag's name and attributes */

typedef enum {
  RT_XO_REASONING = 0,
  RT_XO_CONTENT = 1,
  RT_XO_CALL_BEGIN = 2,
  RT_XO_CALL_ARGS = 3,
  RT_XO_CALL_END = 4,
} rt_xo_kind_t;

typedef void (*rt_xo_emit_fn)(void *ctx, rt_xo_kind_t kind, const char *s, size_t n);

typedef struct {
  int state;            /* grammar position (xtml_out.c) */
  bool in_tag;          /* between <|open|>/<|close|> and <|sep|> */
  bool tag_close;       /* the tag being read started with <|close|> */
  bool arg_string;      /* the open argument is a string (escaped as it streams) */
  bool call_has_json;   /* the open call had a json element */
  int n_args;           /* argument elements emitted in the open call */
  size_t n_calls;       /* tool calls begun so far */
  k3_tok_str_t pend;    /* input not yet consumed: a possible marker prefix (< 9 bytes) */
  k3_tok_str_t tag;     /* the tag's text after its marker */
  k3_tok_str_t ws;      /* whitespace held between structural elements */
  k3_tok_str_t val;     /* buffered non-string argument value or json element */
  rt_xo_emit_fn emit;
  void *ctx;
} rt_xtml_t;

/* thinking: the prompt opened the think channel (else the response channel). */
void rt_xtml_init(rt_xtml_t *p, bool thinking, rt_xo_emit_fn emit, void *ctx);
/* Parses more text. Returns 0 or K3_ENOMEM (the parser is then unusable). */
int rt_xtml_feed(rt_xtml_t *p, const char *s, size_t n);
/* End of the text: emits what was held back (a partial marker or tag as text of the current
 * channel, a buffered argument value as it is). Returns 0 or K3_ENOMEM. */
int rt_xtml_finish(rt_xtml_t *p);
void rt_xtml_free(rt_xtml_t *p);
/* Tool calls begun so far. */
static inline size_t rt_xtml_calls(const rt_xtml_t *p) { return p->n_calls; }

#endif
