/* Incremental XTML output parser (contract in xtml_out.h). Two layers:
 *  - the lexer (feed) cuts the text into plain text and tags. A tag is <|open|> or <|close|>,
 *    then up to RT_XO_MAX_TAG bytes of "name key="value" ...", then <|sep|>. Input that could
 *    still be the start of a marker is held in `pend` until the next feed decides it.
 *  - the grammar (on_text, on_tag) knows where the model is in the assistant message and turns
 *    text and tags into events; whatever it does not expect is emitted verbatim (raw) as text
 *    of the current channel.
 * Arguments are assembled into JSON here (not by the caller) so that every front sees the same
 * arguments for the same text, streamed or not. */
#include <jansson.h>
#include <string.h>

#include "k3pd/err.h"
#include "xtml_out.h"

enum {
  S_THINK = 0,       /* inside the think channel */
  S_AFTER_THINK,     /* </think> seen, nothing opened yet */
  S_RESPONSE,        /* inside the response channel */
  S_AFTER_RESPONSE,  /* </response> seen */
  S_TOOLS,           /* inside <tools>, between calls */
  S_CALL,            /* inside <call>, between arguments */
  S_ARG,             /* inside <argument> */
  S_JSON,            /* inside <json> */
  S_AFTER_TOOLS,     /* </tools> seen */
  S_END,             /* </message> seen: anything else is content */
};

static const char M_OPEN[] = "<|open|>", M_CLOSE[] = "<|close|>", M_SEP[] = "<|sep|>";

void rt_xtml_init(rt_xtml_t *p, bool thinking, rt_xo_emit_fn emit, void *ctx) {
  memset(p, 0, sizeof *p);
  p->state = thinking ? S_THINK : S_RESPONSE;
  p->emit = emit;
  p->ctx = ctx;
}

void rt_xtml_free(rt_xtml_t *p) {
  free(p->pend.data);
  free(p->tag.data);
  free(p->ws.data);
  free(p->val.data);
  memset(&p->pend, 0, sizeof p->pend);
  memset(&p->tag, 0, sizeof p->tag);
  memset(&p->ws, 0, sizeof p->ws);
  memset(&p->val, 0, sizeof p->val);
}

static void emit(rt_xtml_t *p, rt_xo_kind_t k, const char *s, size_t n) {
  if (n || k == RT_XO_CALL_BEGIN || k == RT_XO_CALL_END) p->emit(p->ctx, k, s, n);
}

static bool all_space(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\n' && s[i] != '\r' && s[i] != '\t') return false;
  return true;
}

/* A JSON string's inside (no quotes) for s[0..n): the text is complete UTF-8 (detokeniser). */
static int json_escape(k3_tok_str_t *out, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t run = 0;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[6];
    size_t el = 2;
    if (c == '"' || c == '\\') e[0] = '\\', e[1] = (char)c;
    else if (c == '\n') e[0] = '\\', e[1] = 'n';
    else if (c == '\r') e[0] = '\\', e[1] = 'r';
    else if (c == '\t') e[0] = '\\', e[1] = 't';
    else if (c < 0x20) {
      memcpy(e, "\\u00", 4);
      e[4] = hex[c >> 4];
      e[5] = hex[c & 15];
      el = 6;
    } else continue;
    rc = k3_tok_str_append(out, s + run, i - run);
    if (!rc) rc = k3_tok_str_append(out, e, el);
    run = i + 1;
  }
  return rc ? rc : k3_tok_str_append(out, s + run, n - run);
}

static int emit_escaped(rt_xtml_t *p, const char *s, size_t n) {
  k3_tok_str_t t = {0};
  int rc = json_escape(&t, s, n);
  if (!rc) emit(p, RT_XO_CALL_ARGS, t.data, t.len);
  free(t.data);
  return rc;
}

/* ---- grammar ---- */

/* Text in a structural position: whitespace waits (dropped before the next tag), anything
 * else is content. */
static int structural_text(rt_xtml_t *p, const char *s, size_t n) {
  if (all_space(s, n)) return k3_tok_str_append(&p->ws, s, n);
  if (p->state == S_AFTER_THINK) p->state = S_RESPONSE; /* a response without its tag */
  emit(p, RT_XO_CONTENT, p->ws.data, p->ws.len);
  p->ws.len = 0;
  emit(p, RT_XO_CONTENT, s, n);
  return 0;
}

static int on_text(rt_xtml_t *p, const char *s, size_t n) {
  if (n == 0) return 0;
  switch (p->state) {
    case S_THINK: emit(p, RT_XO_REASONING, s, n); return 0;
    case S_RESPONSE: emit(p, RT_XO_CONTENT, s, n); return 0;
    case S_ARG:
      if (p->arg_string) return emit_escaped(p, s, n);
      return k3_tok_str_append(&p->val, s, n);
    case S_JSON: return k3_tok_str_append(&p->val, s, n);
    case S_END: emit(p, RT_XO_CONTENT, s, n); return 0;
    default: return structural_text(p, s, n);
  }
}

/* The verbatim text of the tag being read (marker, header and, when closed, <|sep|>). */
static int raw_tag(rt_xtml_t *p, bool with_sep) {
  k3_tok_str_t r = {0};
  const char *m = p->tag_close ? M_CLOSE : M_OPEN;
  int rc = k3_tok_str_append(&r, m, strlen(m));
  if (!rc) rc = k3_tok_str_append(&r, p->tag.data ? p->tag.data : "", p->tag.len);
  if (!rc && with_sep) rc = k3_tok_str_append(&r, M_SEP, sizeof M_SEP - 1);
  if (!rc) rc = on_text(p, r.data, r.len);
  free(r.data);
  return rc;
}

/* Parses "name k="v" k2="v2"" in the tag buffer; fills name (NUL-terminated copy) and the
 * value of `want` (unescaped &amp; &quot;), each at most cap bytes. Returns false if the
 * header does not have that shape. */
static bool tag_attr(const char *h, size_t n, const char *want, char *val, size_t cap, bool *found) {
  size_t i = 0;
  *found = false;
  while (i < n && h[i] != ' ') i++;
  while (i < n) {
    if (h[i] != ' ') return false;
    i++;
    size_t k0 = i;
    while (i < n && h[i] != '=' && h[i] != ' ') i++;
    if (i + 1 >= n || h[i] != '=' || h[i + 1] != '"' || i == k0) return false;
    size_t klen = i - k0;
    i += 2;
    size_t v0 = i;
    while (i < n && h[i] != '"') i++;
    if (i >= n) return false;
    if (want && klen == strlen(want) && memcmp(h + k0, want, klen) == 0) {
      size_t o = 0;
      for (size_t j = v0; j < i; j++) {
        char c = h[j];
        if (c == '&' && i - j >= 5 && memcmp(h + j, "&amp;", 5) == 0) j += 4;
        else if (c == '&' && i - j >= 6 && memcmp(h + j, "&quot;", 6) == 0) c = '"', j += 5;
        if (o + 1 >= cap) return false;
        val[o++] = c;
      }
      val[o] = 0;
      *found = true;
    }
    i++;
  }
  return true;
}

static bool tag_is(const rt_xtml_t *p, const char *name) {
  size_t nl = strlen(name);
  const char *h = p->tag.data ? p->tag.data : "";
  return p->tag.len >= nl && memcmp(h, name, nl) == 0 && (p->tag.len == nl || h[nl] == ' ');
}

static int close_arg(rt_xtml_t *p) {
  int rc = 0;
  if (p->arg_string) {
    emit(p, RT_XO_CALL_ARGS, "\"", 1);
  } else {
    /* a number/boolean/null/object/array as the model wrote it, if that is JSON */
    const char *v = p->val.data ? p->val.data : "";
    size_t a = 0, b = p->val.len;
    while (a < b && all_space(v + a, 1)) a++;
    while (b > a && all_space(v + b - 1, 1)) b--;
    json_t *j = b > a ? json_loadb(v + a, b - a, JSON_DECODE_ANY, NULL) : NULL;
    if (j) {
      emit(p, RT_XO_CALL_ARGS, v + a, b - a);
      json_decref(j);
    } else {
      emit(p, RT_XO_CALL_ARGS, "\"", 1);
      rc = emit_escaped(p, v, p->val.len);
      emit(p, RT_XO_CALL_ARGS, "\"", 1);
    }
  }
  p->val.len = 0;
  p->state = S_CALL;
  return rc;
}

static void close_json(rt_xtml_t *p) {
  emit(p, RT_XO_CALL_ARGS, p->val.data, p->val.len);
  p->val.len = 0;
  p->call_has_json = true;
  p->state = S_CALL;
}

static void close_call(rt_xtml_t *p) {
  if (p->n_args > 0) emit(p, RT_XO_CALL_ARGS, "}", 1);
  else if (!p->call_has_json) emit(p, RT_XO_CALL_ARGS, "{}", 2);
  emit(p, RT_XO_CALL_END, "", 0);
  p->state = S_TOOLS;
}

static int open_arg(rt_xtml_t *p) {
  char key[RT_XO_MAX_TAG + 1], type[64];
  bool has_key, has_type;
  if (!tag_attr(p->tag.data, p->tag.len, "key", key, sizeof key, &has_key) || !has_key) return raw_tag(p, true);
  if (!tag_attr(p->tag.data, p->tag.len, "type", type, sizeof type, &has_type)) has_type = false;
  k3_tok_str_t t = {0};
  int rc = k3_tok_str_append(&t, p->n_args ? ", \"" : "{\"", p->n_args ? 3 : 2);
  if (!rc) rc = json_escape(&t, key, strlen(key));
  if (!rc) rc = k3_tok_str_append(&t, "\": ", 3);
  p->arg_string = !has_type || strcmp(type, "string") == 0;
  if (!rc && p->arg_string) rc = k3_tok_str_append(&t, "\"", 1);
  if (!rc) emit(p, RT_XO_CALL_ARGS, t.data, t.len);
  free(t.data);
  p->n_args++;
  p->state = S_ARG;
  return rc;
}

static int on_tag(rt_xtml_t *p) {
  bool cl = p->tag_close;
  int st = p->state;
  /* Elements that close what is open inside them. */
  if (cl && (st == S_ARG || st == S_JSON) &&
      (tag_is(p, "argument") || tag_is(p, "json") || tag_is(p, "call") || tag_is(p, "tools") ||
       tag_is(p, "message"))) {
    if (st == S_ARG && !tag_is(p, "json")) {
      int rc = close_arg(p);
      if (rc) return rc;
      if (tag_is(p, "argument")) return 0;
    } else if (st == S_JSON && !tag_is(p, "argument")) {
      close_json(p);
      if (tag_is(p, "json")) return 0;
    } else {
      return raw_tag(p, true);
    }
    st = p->state; /* S_CALL now */
  }
  if (cl && st == S_CALL && (tag_is(p, "call") || tag_is(p, "tools") || tag_is(p, "message"))) {
    close_call(p);
    if (tag_is(p, "call")) goto done;
    st = p->state; /* S_TOOLS */
  }
  if (cl && tag_is(p, "message") && st != S_ARG && st != S_JSON && st != S_END) {
    p->state = S_END;
    goto done;
  }
  switch (st) {
    case S_THINK:
      if (cl && tag_is(p, "think")) p->state = S_AFTER_THINK;
      else if (!cl && tag_is(p, "response")) p->state = S_RESPONSE;
      else if (!cl && tag_is(p, "tools")) p->state = S_TOOLS;
      else return raw_tag(p, true);
      goto done;
    case S_AFTER_THINK:
    case S_RESPONSE:
    case S_AFTER_RESPONSE:
    case S_AFTER_TOOLS:
      if (!cl && tag_is(p, "response") && st == S_AFTER_THINK) p->state = S_RESPONSE;
      else if (cl && tag_is(p, "response") && st == S_RESPONSE) p->state = S_AFTER_RESPONSE;
      else if (!cl && tag_is(p, "tools")) p->state = S_TOOLS;
      else return raw_tag(p, true);
      goto done;
    case S_TOOLS:
      if (!cl && tag_is(p, "call")) {
        char name[RT_XO_MAX_TAG + 1];
        bool has;
        if (!tag_attr(p->tag.data, p->tag.len, "tool", name, sizeof name, &has) || !has || !name[0])
          return raw_tag(p, true);
        p->n_calls++;
        p->n_args = 0;
        p->call_has_json = false;
        p->state = S_CALL;
        emit(p, RT_XO_CALL_BEGIN, name, strlen(name));
      } else if (cl && tag_is(p, "tools")) {
        p->state = S_AFTER_TOOLS;
      } else {
        return raw_tag(p, true);
      }
      goto done;
    case S_CALL:
      if (!cl && tag_is(p, "argument")) return open_arg(p);
      if (!cl && tag_is(p, "json")) {
        p->state = S_JSON;
        goto done;
      }
      return raw_tag(p, true);
    default: /* inside a value, or after the message: the tag is text */
      return raw_tag(p, true);
  }
done:
  p->ws.len = 0; /* whitespace between elements is not content */
  return 0;
}

/* ---- lexer ---- */

/* 1 if s[0..n) is a proper prefix of a marker, 2 if it starts with a whole marker (*which
 * set), 0 otherwise. */
static int marker_at(const char *s, size_t n, const char **which) {
  static const char *const ms[] = {M_OPEN, M_CLOSE, M_SEP};
  int r = 0;
  for (int i = 0; i < 3; i++) {
    size_t ml = strlen(ms[i]);
    if (n >= ml && memcmp(s, ms[i], ml) == 0) {
      *which = ms[i];
      return 2;
    }
    if (n < ml && memcmp(s, ms[i], n) == 0) r = 1;
  }
  return r;
}

/* Consumes s[0..n); returns the number of bytes left unconsumed at the end (a possible marker
 * prefix) or a negative error. */
static long lex(rt_xtml_t *p, const char *s, size_t n, bool final) {
  size_t i = 0;
  while (i < n) {
    const char *lt = memchr(s + i, '<', n - i);
    size_t upto = lt ? (size_t)(lt - s) : n;
    if (upto > i) { /* plain bytes */
      int rc;
      if (p->in_tag) {
        rc = k3_tok_str_append(&p->tag, s + i, upto - i);
        if (!rc && p->tag.len > RT_XO_MAX_TAG) { /* too long for a tag: it was text */
          p->in_tag = false;
          rc = raw_tag(p, false);
          p->tag.len = 0;
        }
      } else {
        rc = on_text(p, s + i, upto - i);
      }
      if (rc) return rc;
      i = upto;
      continue;
    }
    const char *which = NULL;
    int m = marker_at(s + i, n - i, &which);
    if (m == 1 && !final) return (long)(n - i); /* wait for more */
    if (m != 2) { /* a literal '<' */
      int rc = p->in_tag ? k3_tok_str_append(&p->tag, "<", 1) : on_text(p, "<", 1);
      if (rc) return rc;
      i++;
      continue;
    }
    size_t ml = strlen(which);
    int rc = 0;
    if (which == M_SEP) {
      if (p->in_tag) {
        p->in_tag = false;
        rc = on_tag(p);
        p->tag.len = 0;
      } else {
        rc = on_text(p, M_SEP, ml); /* a stray separator is text */
      }
    } else {
      if (p->in_tag) { /* a marker inside a tag: the tag so far was text */
        p->in_tag = false;
        rc = raw_tag(p, false);
        p->tag.len = 0;
      }
      p->in_tag = true;
      p->tag_close = which == M_CLOSE;
    }
    if (rc) return rc;
    i += ml;
  }
  return 0;
}

int rt_xtml_feed(rt_xtml_t *p, const char *s, size_t n) {
  if (p->pend.len) { /* a held marker prefix: decide it with the new bytes */
    int rc = k3_tok_str_append(&p->pend, s, n);
    if (rc) return rc;
    k3_tok_str_t in = p->pend;
    memset(&p->pend, 0, sizeof p->pend);
    long left = lex(p, in.data, in.len, false);
    if (left > 0) rc = k3_tok_str_append(&p->pend, in.data + in.len - (size_t)left, (size_t)left);
    free(in.data);
    return left < 0 ? (int)left : rc;
  }
  long left = lex(p, s, n, false);
  if (left < 0) return (int)left;
  return left ? k3_tok_str_append(&p->pend, s + n - (size_t)left, (size_t)left) : 0;
}

int rt_xtml_finish(rt_xtml_t *p) {
  int rc = 0;
  if (p->pend.len) {
    k3_tok_str_t in = p->pend;
    memset(&p->pend, 0, sizeof p->pend);
    long left = lex(p, in.data, in.len, true);
    free(in.data);
    if (left < 0) return (int)left;
  }
  if (p->in_tag) {
    p->in_tag = false;
    rc = raw_tag(p, false);
    p->tag.len = 0;
  }
  if (!rc && (p->state == S_ARG || p->state == S_JSON) && p->val.len) {
    emit(p, RT_XO_CALL_ARGS, p->val.data, p->val.len); /* cut short: as the model wrote it */
    p->val.len = 0;
  }
  return rc;
}
