/* K3 XTML rendering to ids (spec k3-model.md §9.3), mirroring build_chat_segments of the
 * vLLM-derived encoding_k3.py port segment for segment:
 *   open(tag, attrs) = <|open|> "tag" { ' key="value"' } <|sep|>   (each attr its own segment)
 *   close(tag)       = <|close|> "tag" <|sep|>
 * Attribute values escape & → &amp; and " → &quot;. Tool declarations use the system
 * message form `role="system" type="tool-declare"`. Differences from the Python, on
 * purpose: unknown roles and image parts are errors (Python silently drops / needs a
 * multimodal path), and arguments must be a JSON object or a string (as in Python).
 * Not here: the 48B format (chat_im.c). */
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"
#include "k3pd/err.h"
#include "tok_internal.h"

typedef struct {
  const char *key;
  const char *val; /* NUL-terminated */
} attr_t;

static int escape_attr(const char *v, k3_tok_str_t *s) {
  int rc = 0;
  for (const char *p = v; *p && !rc; p++) {
    if (*p == '&') rc = k3_tok_str_append(s, "&amp;", 5);
    else if (*p == '"') rc = k3_tok_str_append(s, "&quot;", 6);
    else rc = k3_tok_str_append(s, p, 1);
  }
  return rc;
}

static int open_tag(k3_chat_seg_t *sg, const char *tag, const attr_t *attrs, size_t n) {
  int rc = k3_chat_special(sg, K3_TOK_ID_OPEN);
  if (!rc) rc = k3_chat_text(sg, tag, strlen(tag));
  for (size_t i = 0; i < n && !rc; i++) {
    k3_tok_str_t s = {0};
    rc = k3_tok_str_append(&s, " ", 1);
    if (!rc) rc = k3_tok_str_append(&s, attrs[i].key, strlen(attrs[i].key));
    if (!rc) rc = k3_tok_str_append(&s, "=\"", 2);
    if (!rc) rc = escape_attr(attrs[i].val, &s);
    if (!rc) rc = k3_tok_str_append(&s, "\"", 1);
    if (!rc) rc = k3_chat_text(sg, s.data, s.len);
    free(s.data);
  }
  return rc ? rc : k3_chat_special(sg, K3_TOK_ID_SEP);
}

static int close_tag(k3_chat_seg_t *sg, const char *tag) {
  int rc = k3_chat_special(sg, K3_TOK_ID_CLOSE);
  if (!rc) rc = k3_chat_text(sg, tag, strlen(tag));
  return rc ? rc : k3_chat_special(sg, K3_TOK_ID_SEP);
}

static int close_message(k3_chat_seg_t *sg) {
  int rc = close_tag(sg, "message");
  return rc ? rc : k3_chat_special(sg, K3_TOK_ID_END_OF_MSG);
}

static int internal_system(k3_chat_seg_t *sg, const char *type, const char *body, size_t len) {
  attr_t a[2] = {{"role", "system"}, {"type", type}};
  int rc = open_tag(sg, "message", a, 2);
  if (!rc) rc = k3_chat_text(sg, body, len);
  return rc ? rc : close_message(sg);
}

static int tool_declare(k3_chat_seg_t *sg, const json_t *tools, bool dynamic) {
  json_t *sorted = k3_chat_deep_sort(tools);
  k3_tok_str_t s = {0};
  const char *head = dynamic ? "## New Tools Available\n"
                               "The system dynamically extends the toolset via lazy-loading.\n"
                               "You have access to all existing and extended tools.\n"
                               "Here are the specs for the extended tools.\n\n```json\n"
                             : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
  int rc = sorted ? k3_tok_str_append(&s, head, strlen(head)) : K3_ENOMEM;
  if (!rc) rc = k3_chat_json_dumps(sorted, true, true, &s);
  if (!rc) rc = k3_tok_str_append(&s, "\n```", 4);
  if (!rc) rc = internal_system(sg, "tool-declare", s.data, s.len);
  free(s.data);
  json_decref(sorted);
  return rc;
}

/* Message content as one text segment (empty content → no segment). */
static int content(k3_chat_seg_t *sg, const json_t *c, const char *where) {
  k3_tok_str_t s = {0};
  int rc = k3_chat_content_text(c, where, &s, sg->err, sg->errlen);
  if (!rc) rc = k3_chat_text(sg, s.data, s.len);
  free(s.data);
  return rc;
}

static bool py_blank(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += k3_tok_utf8_next((const uint8_t *)s + i, &cp);
    if (!k3_tok_py_isspace(cp)) return false;
  }
  return true;
}

static const char *xtml_type(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_TRUE: case JSON_FALSE: return "boolean";
  case JSON_NULL: return "null";
  case JSON_INTEGER: case JSON_REAL: return "number";
  case JSON_STRING: return "string";
  case JSON_OBJECT: return "object";
  default: return "array";
  }
}

static int render_call(k3_chat_seg_t *sg, const json_t *call, size_t index, const char *where) {
  const json_t *fn = json_object_get(call, "function");
  if (!fn) fn = call;
  const char *name = json_string_value(json_object_get(fn, "name"));
  if (!name) {
    CHAT_ERR(sg, "%s.function.name: missing or not a string", where);
    return K3_EINVAL;
  }
  char idx[24];
  snprintf(idx, sizeof idx, "%zu", index);
  attr_t a[2] = {{"tool", name}, {"index", idx}};
  int rc = open_tag(sg, "call", a, 2);
  json_t *args = json_object_get(fn, "arguments"), *parsed = NULL;
  const char *block = NULL;
  size_t block_len = 0;
  if (!rc && json_is_string(args)) {
    const char *s = json_string_value(args);
    size_t n = json_string_length(args);
    if (!py_blank(s, n)) {
      parsed = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
      if (!parsed) {
        block = s, block_len = n; /* not JSON: rendered raw in a json element */
      } else if (!json_is_object(parsed)) {
        CHAT_ERR(sg, "%s.function.arguments: must be a JSON object", where);
        rc = K3_EINVAL;
      }
    }
    args = parsed;
  } else if (!rc && args && !json_is_null(args) && !json_is_object(args)) {
    CHAT_ERR(sg, "%s.function.arguments: must be an object or a JSON object string", where);
    rc = K3_EINVAL;
  }
  if (!rc && block) {
    attr_t t = {"type", "object"};
    rc = open_tag(sg, "json", &t, 1);
    if (!rc) rc = k3_chat_text(sg, block, block_len);
    if (!rc) rc = close_tag(sg, "json");
  } else if (!rc && json_is_object(args)) {
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
      attr_t t[2] = {{"key", key}, {"type", xtml_type(v)}};
      if ((rc = open_tag(sg, "argument", t, 2))) break;
      if (json_is_string(v)) {
        rc = k3_chat_text(sg, json_string_value(v), json_string_length(v));
      } else {
        k3_tok_str_t s = {0};
        rc = k3_chat_json_dumps(v, false, false, &s);
        if (!rc) rc = k3_chat_text(sg, s.data, s.len);
        free(s.data);
      }
      if (!rc) rc = close_tag(sg, "argument");
      if (rc) break;
    }
  }
  json_decref(parsed);
  return rc ? rc : close_tag(sg, "call");
}

static int render_assistant(k3_chat_seg_t *sg, const json_t *m, bool thinking, const char *where) {
  attr_t role = {"role", "assistant"};
  int rc = open_tag(sg, "message", &role, 1);
  if (!rc && thinking) {
    rc = open_tag(sg, "think", NULL, 0);
    json_t *r = json_object_get(m, "reasoning_content");
    if (!json_is_string(r) || json_string_length(r) == 0) r = json_object_get(m, "reasoning");
    if (!rc && r && !json_is_null(r)) {
      if (!json_is_string(r)) {
        CHAT_ERR(sg, "%s.reasoning_content: expected a string", where);
        return K3_EINVAL;
      }
      if (!py_blank(json_string_value(r), json_string_length(r)))
        rc = k3_chat_text(sg, json_string_value(r), json_string_length(r));
    }
    if (!rc) rc = close_tag(sg, "think");
  }
  if (!rc) rc = open_tag(sg, "response", NULL, 0);
  if (!rc) rc = content(sg, json_object_get(m, "content"), where);
  if (!rc) rc = close_tag(sg, "response");
  json_t *calls = json_object_get(m, "tool_calls");
  if (!rc && json_array_size(calls) > 0) {
    rc = open_tag(sg, "tools", NULL, 0);
    for (size_t i = 0; i < json_array_size(calls) && !rc; i++) {
      char w[96];
      snprintf(w, sizeof w, "%s.tool_calls[%zu]", where, i);
      rc = render_call(sg, json_array_get(calls, i), i + 1, w);
    }
    if (!rc) rc = close_tag(sg, "tools");
  }
  return rc ? rc : close_message(sg);
}

static const char *call_name(const json_t *call) {
  const json_t *fn = json_object_get(call, "function");
  return json_string_value(json_object_get(fn ? fn : call, "name"));
}

/* normalize_xtml_tool_result_messages: a run of tool messages whose ids all resolve to
 * calls of the last assistant message is reordered by call position and named after the
 * call; a run with any unresolved id is left as it is. Returns a new array. */
static json_t *normalize_tool_results(const json_t *messages) {
  json_t *out = json_array();
  const json_t *last_calls = NULL;
  size_t n = json_array_size(messages);
  for (size_t i = 0; i < n && out;) {
    json_t *m = json_array_get(messages, i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || strcmp(role, "tool") != 0) {
      if (role && strcmp(role, "assistant") == 0) last_calls = json_object_get(m, "tool_calls");
      json_array_append(out, m);
      i++;
      continue;
    }
    size_t j = i;
    bool unresolved = false;
    while (j < n && (role = json_string_value(json_object_get(json_array_get(messages, j), "role"))) &&
           strcmp(role, "tool") == 0)
      j++;
    size_t *pos = calloc(j - i, sizeof *pos);
    for (size_t k = i; k < j && pos; k++) {
      json_t *t = json_array_get(messages, k);
      json_t *id = json_object_get(t, "tool_call_id");
      if (!id) id = json_object_get(t, "id");
      pos[k - i] = 0;
      /* the first call with this id wins (setdefault) */
      for (size_t c = 0; id && c < json_array_size(last_calls); c++) {
        json_t *cid = json_object_get(json_array_get(last_calls, c), "id");
        if (cid && json_equal(cid, id)) {
          pos[k - i] = c + 1;
          break;
        }
      }
      if (!pos[k - i]) unresolved = true;
    }
    for (size_t step = 0; step < j - i && pos; step++) {
      size_t k = i + step;
      if (!unresolved) { /* stable selection by position */
        size_t best = SIZE_MAX;
        for (size_t q = 0; q < j - i; q++)
          if (pos[q] && (best == SIZE_MAX || pos[q] < pos[best])) best = q;
        k = i + best;
        json_t *t = json_copy(json_array_get(messages, k));
        const char *nm = call_name(json_array_get(last_calls, pos[best] - 1));
        if (t && nm) {
          json_object_set_new(t, "tool", json_string(nm));
          if (json_object_get(t, "name")) json_object_set_new(t, "name", json_string(nm));
        }
        pos[best] = 0;
        json_array_append_new(out, t);
      } else {
        json_array_append(out, json_array_get(messages, k));
      }
    }
    free(pos);
    i = j;
  }
  return out;
}

int k3_chat_render_xtml(k3_chat_seg_t *sg, const json_t *messages, const k3_chat_opts_t *o) {
  int rc = 0;
  if (o->tools && json_array_size(o->tools) > 0 && (rc = tool_declare(sg, o->tools, false))) return rc;
  const char *effort = o->thinking_effort;
  if (o->thinking && effort) {
    if (strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max")) {
      CHAT_ERR(sg, "thinking_effort \"%s\": supported values are high, low, max", effort);
      return K3_EINVAL;
    }
    char body[512];
    int n = snprintf(body, sizeof body,
                     "`thinking_effort` guides on how much to think in your thinking channel (not "
                     "including the response channel), supported values include `low`, `medium`, "
                     "`high`, and `max`.\nNow the system is invoked with `thinking_effort=%s`.",
                     effort);
    if ((rc = internal_system(sg, "thinking-effort", body, (size_t)n))) return rc;
  }
  json_t *msgs = normalize_tool_results(messages);
  if (!msgs) return K3_ENOMEM;
  const json_t *prior_calls = NULL;
  size_t tool_index = 0;
  for (size_t i = 0; i < json_array_size(msgs) && !rc; i++) {
    json_t *m = json_array_get(msgs, i);
    char where[48];
    snprintf(where, sizeof where, "messages[%zu]", i);
    if (!json_is_object(m)) continue; /* as the Python: non-dict entries are skipped */
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) {
      CHAT_ERR(sg, "%s.role: missing or not a string", where);
      rc = K3_EINVAL;
    } else if (strcmp(role, "system") == 0 && json_is_array(json_object_get(m, "tools")) &&
               json_array_size(json_object_get(m, "tools")) > 0) {
      rc = tool_declare(sg, json_object_get(m, "tools"), true);
    } else if (strcmp(role, "user") == 0 || strcmp(role, "system") == 0) {
      attr_t a[2] = {{"role", role}, {"name", NULL}};
      json_t *name = json_object_get(m, "name");
      size_t na = 1;
      if (json_is_string(name) && json_string_length(name) > 0) a[na++].val = json_string_value(name);
      rc = open_tag(sg, "message", a, na);
      if (!rc) rc = content(sg, json_object_get(m, "content"), where);
      if (!rc) rc = close_message(sg);
    } else if (strcmp(role, "assistant") == 0) {
      prior_calls = json_object_get(m, "tool_calls");
      tool_index = 0;
      rc = render_assistant(sg, m, o->thinking, where);
    } else if (strcmp(role, "tool") == 0) {
      tool_index++;
      json_t *t = json_object_get(m, "tool");
      const char *name = t ? json_string_value(t) : json_string_value(json_object_get(m, "name"));
      if (!name && !t && tool_index <= json_array_size(prior_calls))
        name = call_name(json_array_get(prior_calls, tool_index - 1));
      if (!name) {
        CHAT_ERR(sg, "%s: tool message has no resolvable tool name", where);
        rc = K3_EINVAL;
        break;
      }
      char idx[24];
      snprintf(idx, sizeof idx, "%zu", tool_index);
      attr_t a[3] = {{"role", "tool"}, {"tool", name}, {"index", idx}};
      rc = open_tag(sg, "message", a, 3);
      if (!rc) rc = content(sg, json_object_get(m, "content"), where);
      if (!rc) rc = close_message(sg);
    } else {
      CHAT_ERR(sg, "%s.role: unknown role \"%s\" (system, user, assistant, tool)", where, role);
      rc = K3_EINVAL;
    }
  }
  json_decref(msgs);
  if (rc) return rc;
  const char *tc = o->tool_choice;
  if (tc && (strcmp(tc, "required") == 0 || strcmp(tc, "none") == 0)) {
    char body[160];
    int n = snprintf(body, sizeof body,
                     "The system is invoked with `tool_choice=%s`.\nYou MUST %s in the next message.",
                     tc, strcmp(tc, "required") == 0 ? "call tools" : "NOT call any tools");
    if ((rc = internal_system(sg, "tool-choice", body, (size_t)n))) return rc;
  }
  const json_t *rf = o->response_format;
  const char *rtype = json_is_string(rf) ? json_string_value(rf)
                                         : json_string_value(json_object_get(rf, "type"));
  static const char rf_head[] =
      "Your response must be raw JSON data without markdown code blocks (```json) or any "
      "additional formatting.";
  if (rtype && strcmp(rtype, "json_object") == 0) {
    k3_tok_str_t s = {0};
    rc = k3_tok_str_append(&s, "The system is invoked with `response_format=json_object`.\n", 58);
    if (!rc) rc = k3_tok_str_append(&s, rf_head, sizeof rf_head - 1);
    if (!rc) rc = internal_system(sg, "response-format", s.data, s.len);
    free(s.data);
  } else if (rtype && strcmp(rtype, "json_schema") == 0) {
    json_t *js = json_object_get(rf, "json_schema"), *schema = NULL;
    if (js) {
      schema = json_object_get(js, "schema");
      if (!schema) schema = json_object_get(js, "json_schema");
      if (!schema) schema = js;
    }
    json_t *sorted = schema ? k3_chat_deep_sort(schema) : json_null();
    k3_tok_str_t s = {0};
    rc = k3_tok_str_append(&s, "The system is invoked with `response_format=json_schema`.\n", 58);
    if (!rc) rc = k3_tok_str_append(&s, rf_head, sizeof rf_head - 1);
    if (!rc) rc = k3_tok_str_append(&s, "\nThe JSON data must match the following schema:\n```json\n", 56);
    if (!rc) rc = k3_chat_json_dumps(sorted, true, true, &s);
    if (!rc) rc = k3_tok_str_append(&s, "\n```", 4);
    if (!rc) rc = internal_system(sg, "response-format", s.data, s.len);
    free(s.data);
    json_decref(sorted);
  }
  if (rc || !o->add_generation_prompt) return rc;
  attr_t role = {"role", "assistant"};
  rc = open_tag(sg, "message", &role, 1);
  return rc ? rc : open_tag(sg, o->thinking ? "think" : "response", NULL, 0);
}
