/* Kimi-Linear-48B chat rendering to ids: the K2-style template (spec kimi-linear-48b.md §9)
 *   [<|im_system|>tool_declare<|im_middle|>{tools JSON, compact}<|im_end|>]
 *   [<|im_system|>system<|im_middle|>{default system prompt}<|im_end|>]  (first msg not system)
 *   <|im_user|>|<|im_assistant|>|<|im_system|> {name or role} <|im_middle|> {body} <|im_end|>
 *   generation prompt: <|im_assistant|>assistant<|im_middle|>
 * Assistant tool calls: content, then <|tool_calls_section_begin|> { <|tool_call_begin|> id
 * <|tool_call_argument_begin|> arguments <|tool_call_end|> } <|tool_calls_section_end|>;
 * tool results: "## Return of {tool_call_id}\n{content}". Markers are ids; the text between
 * two markers is one segment (HF encodes the rendered template, whose markers split the text
 * the same way; only caller text that spells a marker differs: here it stays plain text).
 * The 48B Instruct model has no reasoning channel: opts->thinking is ignored.
 * Not here: K3 XTML (chat_xtml.c). */
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"
#include "k3pd/err.h"

/* The default system prompt of the 48B template ([EXL3] default_chat_prompt, inferred). */
#define KL_DEFAULT_SYSTEM "You are a helpful assistant provided by Moonshot-AI."

static int turn_head(k3_chat_seg_t *sg, int32_t marker, const char *name) {
  int rc = k3_chat_special(sg, marker);
  if (!rc) rc = k3_chat_text(sg, name, strlen(name));
  return rc ? rc : k3_chat_special(sg, K3_TOK_ID_IM_MIDDLE);
}

static int render_calls(k3_chat_seg_t *sg, const json_t *calls, const char *where) {
  int rc = k3_chat_special(sg, K3_TOK_ID_TOOL_CALLS_BEGIN);
  for (size_t i = 0; i < json_array_size(calls) && !rc; i++) {
    const json_t *call = json_array_get(calls, i);
    const json_t *fn = json_object_get(call, "function");
    if (!fn) fn = call;
    const char *id = json_string_value(json_object_get(call, "id"));
    char idbuf[300];
    if (!id) { /* K2 call ids are functions.NAME:INDEX (0-based per turn) */
      const char *name = json_string_value(json_object_get(fn, "name"));
      if (!name) {
        CHAT_ERR(sg, "%s.tool_calls[%zu]: neither id nor function.name", where, i);
        return K3_EINVAL;
      }
      snprintf(idbuf, sizeof idbuf, "functions.%s:%zu", name, i);
      id = idbuf;
    }
    rc = k3_chat_special(sg, K3_TOK_ID_TOOL_CALL_BEGIN);
    if (!rc) rc = k3_chat_text(sg, id, strlen(id));
    if (!rc) rc = k3_chat_special(sg, K3_TOK_ID_TOOL_CALL_ARG);
    json_t *args = json_object_get(fn, "arguments");
    if (!rc && json_is_string(args)) {
      rc = k3_chat_text(sg, json_string_value(args), json_string_length(args));
    } else if (!rc && args) {
      k3_tok_str_t s = {0}; /* jinja tojson: json.dumps with default separators */
      rc = k3_chat_json_dumps(args, false, false, &s);
      if (!rc) rc = k3_chat_text(sg, s.data, s.len);
      free(s.data);
    }
    if (!rc) rc = k3_chat_special(sg, K3_TOK_ID_TOOL_CALL_END);
  }
  return rc ? rc : k3_chat_special(sg, K3_TOK_ID_TOOL_CALLS_END);
}

int k3_chat_render_im(k3_chat_seg_t *sg, const json_t *messages, const k3_chat_opts_t *o) {
  int rc = 0;
  if (o->tools && json_array_size(o->tools) > 0) {
    k3_tok_str_t s = {0};
    rc = turn_head(sg, K3_TOK_ID_IM_SYSTEM, "tool_declare");
    if (!rc) rc = k3_chat_json_dumps(o->tools, true, false, &s);
    if (!rc) rc = k3_chat_text(sg, s.data, s.len);
    free(s.data);
    if (!rc) rc = k3_chat_special(sg, K3_TOK_ID_IM_END);
    if (rc) return rc;
  }
  for (size_t i = 0; i < json_array_size(messages) && !rc; i++) {
    json_t *m = json_array_get(messages, i);
    char where[48];
    snprintf(where, sizeof where, "messages[%zu]", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) {
      CHAT_ERR(sg, "%s.role: missing or not a string", where);
      return K3_EINVAL;
    }
    bool user = strcmp(role, "user") == 0, asst = strcmp(role, "assistant") == 0;
    bool tool = strcmp(role, "tool") == 0, sys = strcmp(role, "system") == 0;
    if (!user && !asst && !tool && !sys) {
      CHAT_ERR(sg, "%s.role: unknown role \"%s\" (system, user, assistant, tool)", where, role);
      return K3_EINVAL;
    }
    if (i == 0 && !sys) {
      rc = turn_head(sg, K3_TOK_ID_IM_SYSTEM, "system");
      if (!rc) rc = k3_chat_text(sg, KL_DEFAULT_SYSTEM, strlen(KL_DEFAULT_SYSTEM));
      if (!rc) rc = k3_chat_special(sg, K3_TOK_ID_IM_END);
      if (rc) return rc;
    }
    json_t *name = json_object_get(m, "name");
    const char *rname = json_is_string(name) && json_string_length(name) ? json_string_value(name) : role;
    rc = turn_head(sg, user ? K3_TOK_ID_IM_USER : asst ? K3_TOK_ID_IM_ASSISTANT : K3_TOK_ID_IM_SYSTEM, rname);
    k3_tok_str_t s = {0};
    json_t *calls = json_object_get(m, "tool_calls");
    if (!rc && asst && json_array_size(calls) > 0) {
      rc = k3_chat_content_text(json_object_get(m, "content"), where, &s, sg->err, sg->errlen);
      if (!rc) rc = k3_chat_text(sg, s.data, s.len);
      if (!rc) rc = render_calls(sg, calls, where);
    } else if (!rc && tool) {
      const char *id = json_string_value(json_object_get(m, "tool_call_id"));
      rc = k3_tok_str_append(&s, "## Return of ", 13);
      if (!rc) rc = k3_tok_str_append(&s, id ? id : "None", strlen(id ? id : "None"));
      if (!rc) rc = k3_tok_str_append(&s, "\n", 1);
      if (!rc) rc = k3_chat_content_text(json_object_get(m, "content"), where, &s, sg->err, sg->errlen);
      if (!rc) rc = k3_chat_text(sg, s.data, s.len);
    } else if (!rc) {
      rc = k3_chat_content_text(json_object_get(m, "content"), where, &s, sg->err, sg->errlen);
      if (!rc) rc = k3_chat_text(sg, s.data, s.len);
    }
    free(s.data);
    if (!rc) rc = k3_chat_special(sg, K3_TOK_ID_IM_END);
  }
  if (rc || !o->add_generation_prompt) return rc;
  return turn_head(sg, K3_TOK_ID_IM_ASSISTANT, "assistant");
}
