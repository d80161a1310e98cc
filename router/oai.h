/* The OpenAI front's per-request state, shared by oai_request.c (which fills it from the request
 * body) and oai_reply.c (the rt_sink_t that turns the generation's output into OpenAI objects).
 * Loop thread only; owned by the HTTP request (rt_hreq_set_front) and freed with it. */
#ifndef K3PD_ROUTER_OAI_H
#define K3PD_ROUTER_OAI_H

#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "jsonw.h"
#include "req.h"
#include "xtml_out.h"

typedef struct {
  char id[40];           /* call_<hex> */
  k3_tok_str_t name;     /* non-streaming only */
  k3_tok_str_t args;     /* non-streaming only */
} rt_oai_call_t;

typedef struct rt_oai {
  rt_hreq_t *hr;
  rt_router_t *rt;
  bool chat;             /* /v1/chat/completions (else /v1/completions) */
  bool stream, include_usage, want_logprobs, thinking;
  bool want_ids;         /* extension return_token_ids: choices[].token_ids */
  const char *max_field; /* the field the client used for the length limit, for errors */
  char id[160];          /* chatcmpl-<request id> | cmpl-<request id> */
  char model[256];
  int64_t created;       /* unix seconds at arrival */
  bool started;          /* stream: headers and the first chunk are out */
  rt_xtml_t xo;          /* chat: the output parser */
  int pend_kind;         /* stream: kind of the delta text being coalesced (-1: none) */
  k3_tok_str_t pend;
  k3_tok_str_t content, reasoning; /* non-streaming chat; completions text (content) */
  rt_oai_call_t *calls;  /* tool calls begun */
  size_t n_calls, cap_calls;
  rt_jw_t lp;            /* logprob entries not yet sent: chat objects, completions tokens */
  rt_jw_t lp_vals, lp_offs; /* completions: token_logprobs, text_offset */
  size_t n_lp;
  rt_jw_t ids;           /* token ids not yet sent (want_ids) */
  size_t n_ids;
  uint64_t text_chars;   /* completions: code points of the completion so far (text_offset) */
} rt_oai_t;

/* oai_reply.c */
extern const rt_sink_t rt_oai_sink;
void rt_oai_free(void *o);
/* Sets up the chat output parser (o->thinking decides the first channel). */
void rt_oai_init_parser(rt_oai_t *o);
/* Answers an error of the request path (before the stream starts) with the HTTP status and the
 * OpenAI names of the field: "stop.max_new_tokens: ..." becomes param "max_tokens". */
void rt_oai_fail(rt_oai_t *o, k3_rpc_code_t code, const char *msg);

#endif
