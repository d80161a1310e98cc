/* Private helpers shared by the chat renderers (chat_xtml.c, chat_im.c, chat_json.c). */
#ifndef K3_CHAT_INTERNAL_H
#define K3_CHAT_INTERNAL_H

#include <jansson.h>
#include <stdio.h>

#include "k3pd/chat.h"

/* A renderer's output: ids appended to out; the first error message is kept in err. */
typedef struct {
  const k3_tok_t *tok;
  k3_tok_ids_t *out;
  char *err;
  size_t errlen;
  size_t max_n; /* out->n may not pass this: K3_ERANGE (SIZE_MAX = no limit) */
} k3_chat_seg_t;

#define CHAT_ERR(sg, ...) ((sg)->err ? (void)snprintf((sg)->err, (sg)->errlen, __VA_ARGS__) : (void)0)

/* Encodes caller text as one independent segment (specials disallowed); empty → nothing. */
int k3_chat_text(k3_chat_seg_t *sg, const char *text, size_t len);
/* Appends the special id with real id real_id, mapped into the vocabulary. */
int k3_chat_special(k3_chat_seg_t *sg, int32_t real_id);
/* Returns a new reference: v with object keys sorted recursively (Python _deep_sort). */
json_t *k3_chat_deep_sort(const json_t *v);
/* Message content (string | null | [{"type":"text","text":...}]) concatenated into *out
 * (malloc'd, caller frees). Image parts are refused with K3_ENOTSUP. */
int k3_chat_content_text(const json_t *content, const char *where, k3_tok_str_t *out,
                         char *err, size_t errlen);

int k3_chat_render_xtml(k3_chat_seg_t *sg, const json_t *messages, const k3_chat_opts_t *o);
int k3_chat_render_im(k3_chat_seg_t *sg, const json_t *messages, const k3_chat_opts_t *o);

#endif
