/* The entry points of k3_chat, the segment helpers shared by both chat formats, and a
 * json.dumps that matches Python byte for byte (tool declarations and tool-call arguments
 * are rendered by Python's json module in the reference renderers; jansson's own dump
 * differs in float formatting and in \u escapes, which would change the ids).
 * Not here: the formats themselves (chat_xtml.c, chat_im.c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"
#include "k3pd/err.h"

void k3_chat_opts_default(k3_chat_opts_t *opts) {
  memset(opts, 0, sizeof *opts);
  opts->thinking = true;
  opts->add_generation_prompt = true;
  opts->thinking_effort = "max"; /* spec §9.3: the HF default is thinking=True, effort "max" */
}

int k3_chat_text(k3_chat_seg_t *sg, const char *text, size_t len) {
  if (len == 0) return 0;
  if (sg->max_n == SIZE_MAX) return k3_tok_encode(sg->tok, text, len, 0, sg->out, sg->err, sg->errlen);
  if (sg->out->n >= sg->max_n) return K3_ERANGE;
  return k3_tok_encode_max(sg->tok, text, len, 0, sg->max_n - sg->out->n, sg->out, sg->err, sg->errlen);
}

int k3_chat_special(k3_chat_seg_t *sg, int32_t real_id) {
  return k3_tok_ids_push(sg->out, k3_tok_special_id(sg->tok, real_id));
}

json_t *k3_chat_deep_sort(const json_t *v) {
  if (json_is_object(v)) {
    size_t n = json_object_size(v), i = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    json_t *o = json_object();
    if (!keys || !o) {
      free(keys);
      json_decref(o);
      return NULL;
    }
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) keys[i++] = k;
    /* strcmp on UTF-8 orders by code point, as Python's sorted() on str does. */
    qsort(keys, n, sizeof *keys, (int (*)(const void *, const void *))strcmp);
    for (i = 0; i < n; i++) {
      json_t *c = k3_chat_deep_sort(json_object_get(v, keys[i]));
      if (!c || json_object_set_new(o, keys[i], c)) {
        free(keys);
        json_decref(o);
        return NULL;
      }
    }
    free(keys);
    return o;
  }
  if (json_is_array(v)) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < json_array_size(v); i++) {
      json_t *c = k3_chat_deep_sort(json_array_get(v, i));
      if (!c || json_array_append_new(a, c)) {
        json_decref(a);
        return NULL;
      }
    }
    return a;
  }
  return json_incref((json_t *)v);
}

static int keycmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Python repr(float): the shortest digits that round-trip, fixed notation for decimal
 * exponents -5 < e < 16, else d.ddde±XX. */
static int dump_real(double d, k3_tok_str_t *out) {
  char buf[64], tmp[40];
  if (isnan(d)) return k3_tok_str_append(out, "NaN", 3);
  if (isinf(d)) return d > 0 ? k3_tok_str_append(out, "Infinity", 8)
                             : k3_tok_str_append(out, "-Infinity", 9);
  int prec;
  for (prec = 1; prec < 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
    if (strtod(tmp, NULL) == d) break;
  }
  snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
  const char *p = tmp;
  size_t o = 0;
  if (*p == '-') buf[o++] = *p++;
  char digits[24];
  size_t nd = 0;
  for (; *p && *p != 'e'; p++)
    if (*p != '.') digits[nd++] = *p;
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  int exp = atoi(p + 1);
  if (exp >= -5 + 1 && exp < 16) {
    if (exp < 0) {
      buf[o++] = '0';
      buf[o++] = '.';
      for (int k = -1; k > exp; k--) buf[o++] = '0';
      for (size_t k = 0; k < nd; k++) buf[o++] = digits[k];
    } else {
      for (int k = 0; k <= exp; k++) buf[o++] = (size_t)k < nd ? digits[k] : '0';
      buf[o++] = '.';
      if ((size_t)exp + 1 < nd) {
        for (size_t k = (size_t)exp + 1; k < nd; k++) buf[o++] = digits[k];
      } else {
        buf[o++] = '0';
      }
    }
    buf[o] = '\0';
  } else {
    buf[o++] = digits[0];
    if (nd > 1) {
      buf[o++] = '.';
      for (size_t k = 1; k < nd; k++) buf[o++] = digits[k];
    }
    snprintf(buf + o, sizeof buf - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  }
  return k3_tok_str_append(out, buf, strlen(buf));
}

static int dump_string(const char *s, size_t n, k3_tok_str_t *out) {
  int rc = k3_tok_str_append(out, "\"", 1);
  size_t run = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    const char *e = NULL;
    if (c == '"') e = "\\\"";
    else if (c == '\\') e = "\\\\";
    else if (c == '\n') e = "\\n";
    else if (c == '\r') e = "\\r";
    else if (c == '\t') e = "\\t";
    else if (c == '\b') e = "\\b";
    else if (c == '\f') e = "\\f";
    else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c); /* Python writes lower-case hex */
      e = esc;
    }
    if (!e) continue;
    rc = k3_tok_str_append(out, s + run, i - run);
    if (!rc) rc = k3_tok_str_append(out, e, strlen(e));
    run = i + 1;
  }
  if (!rc) rc = k3_tok_str_append(out, s + run, n - run);
  if (!rc) rc = k3_tok_str_append(out, "\"", 1);
  return rc;
}

int k3_chat_json_dumps(const json_t *v, bool compact, bool sort_keys, k3_tok_str_t *out) {
  const char *isep = compact ? "," : ", ", *ksep = compact ? ":" : ": ";
  char num[32];
  int rc = 0;
  switch (json_typeof(v)) {
  case JSON_NULL: return k3_tok_str_append(out, "null", 4);
  case JSON_TRUE: return k3_tok_str_append(out, "true", 4);
  case JSON_FALSE: return k3_tok_str_append(out, "false", 5);
  case JSON_INTEGER:
    snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    return k3_tok_str_append(out, num, strlen(num));
  case JSON_REAL: return dump_real(json_real_value(v), out);
  case JSON_STRING: return dump_string(json_string_value(v), json_string_length(v), out);
  case JSON_ARRAY:
    rc = k3_tok_str_append(out, "[", 1);
    for (size_t i = 0; i < json_array_size(v) && !rc; i++) {
      if (i) rc = k3_tok_str_append(out, isep, strlen(isep));
      if (!rc) rc = k3_chat_json_dumps(json_array_get(v, i), compact, sort_keys, out);
    }
    return rc ? rc : k3_tok_str_append(out, "]", 1);
  case JSON_OBJECT: {
    size_t n = json_object_size(v), i = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys) return K3_ENOMEM;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) keys[i++] = k;
    if (sort_keys) qsort(keys, n, sizeof *keys, keycmp);
    rc = k3_tok_str_append(out, "{", 1);
    for (i = 0; i < n && !rc; i++) {
      if (i) rc = k3_tok_str_append(out, isep, strlen(isep));
      if (!rc) rc = dump_string(keys[i], strlen(keys[i]), out);
      if (!rc) rc = k3_tok_str_append(out, ksep, strlen(ksep));
      if (!rc) rc = k3_chat_json_dumps(json_object_get(v, keys[i]), compact, sort_keys, out);
    }
    free(keys);
    return rc ? rc : k3_tok_str_append(out, "}", 1);
  }
  }
  return K3_EINVAL;
}

int k3_chat_content_text(const json_t *content, const char *where, k3_tok_str_t *out,
                         char *err, size_t errlen) {
  if (!content || json_is_null(content)) return k3_tok_str_append(out, "", 0);
  if (json_is_string(content))
    return k3_tok_str_append(out, json_string_value(content), json_string_length(content));
  if (!json_is_array(content)) {
    if (err) snprintf(err, errlen, "%s.content: expected a string, null or an array of parts", where);
    return K3_EINVAL;
  }
  for (size_t i = 0; i < json_array_size(content); i++) {
    json_t *part = json_array_get(content, i);
    const char *type = json_string_value(json_object_get(part, "type"));
    json_t *text = json_object_get(part, "text");
    if (type && (strcmp(type, "image") == 0 || strcmp(type, "image_url") == 0)) {
      if (err) snprintf(err, errlen, "%s.content[%zu]: image parts are not supported (text only)", where, i);
      return K3_ENOTSUP;
    }
    if (!json_is_string(text)) {
      if (err) snprintf(err, errlen, "%s.content[%zu].text: expected a string", where, i);
      return K3_EINVAL;
    }
    int rc = k3_tok_str_append(out, json_string_value(text), json_string_length(text));
    if (rc) return rc;
  }
  return k3_tok_str_append(out, "", 0);
}

int k3_chat_render(const k3_tok_t *tok, const json_t *messages, const k3_chat_opts_t *opts,
                   k3_tok_ids_t *out, char *err, size_t errlen) {
  k3_chat_opts_t def;
  if (!opts) {
    k3_chat_opts_default(&def);
    opts = &def;
  }
  if (!json_is_array(messages)) {
    if (err) snprintf(err, errlen, "messages: expected an array");
    return K3_EINVAL;
  }
  if (opts->tools && !json_is_array(opts->tools)) {
    if (err) snprintf(err, errlen, "tools: expected an array");
    return K3_EINVAL;
  }
  size_t n0 = out->n;
  k3_chat_seg_t sg = {tok, out, err, errlen, opts->max_ids ? n0 + opts->max_ids : SIZE_MAX};
  int rc = k3_tok_model(tok) == K3_TOK_MODEL_K3 ? k3_chat_render_xtml(&sg, messages, opts)
                                                : k3_chat_render_im(&sg, messages, opts);
  if (rc == 0 && out->n > sg.max_n) rc = K3_ERANGE; /* markers alone went over */
  if (rc == K3_ERANGE && err) snprintf(err, errlen, "messages: more than %zu tokens", opts->max_ids);
  if (rc) out->n = n0;
  return rc;
}

int k3_chat_render_json(const k3_tok_t *tok, const char *text, size_t len,
                        const k3_chat_opts_t *opts, k3_tok_ids_t *out, char *err,
                        size_t errlen) {
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &je);
  if (!root) {
    if (err) snprintf(err, errlen, "chat JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    return K3_EINVAL;
  }
  k3_chat_opts_t o;
  if (opts) o = *opts;
  else k3_chat_opts_default(&o);
  json_t *messages = root;
  int rc = 0;
  if (json_is_object(root)) {
    messages = json_object_get(root, "messages");
    json_t *v;
    if ((v = json_object_get(root, "tools")) && !json_is_null(v)) o.tools = v;
    if ((v = json_object_get(root, "tool_choice")) && json_is_string(v)) o.tool_choice = json_string_value(v);
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) o.response_format = v;
    if ((v = json_object_get(root, "thinking_effort")) && json_is_string(v)) o.thinking_effort = json_string_value(v);
    else if (v && json_is_null(v)) o.thinking_effort = NULL; /* explicit null: no effort message */
    if ((v = json_object_get(root, "thinking")) && json_is_boolean(v)) o.thinking = json_is_true(v);
    if (!messages) {
      if (err) snprintf(err, errlen, "chat JSON: object without \"messages\"");
      rc = K3_EINVAL;
    }
  }
  if (!rc) rc = k3_chat_render(tok, messages, &o, out, err, errlen);
  json_decref(root);
  return rc;
}
