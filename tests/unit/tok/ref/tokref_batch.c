/* tokref_batch: batch front end of k3_tok for the independent check (check_tokref.py).
 *
 * What it is for: running thousands of encode/decode/render requests through the public
 * k3_tok API in ONE process, so the comparison with the Python reference stays under the
 * 30 s test budget under ASan (one k3pd-cli process per string costs ~10-50 ms to start).
 * check_tokref.py also runs k3pd-cli itself on a subset, so the CLI path is covered too.
 * What it is not: a general tool; it has no flags besides its two paths.
 *
 * Usage: tokref_batch MODEL_DIR REQUESTS.jsonl  (results on stdout, one line per request)
 * Requests (one JSON object per line):
 *   {"op":"encode","hex":"<text bytes as hex>","replace_invalid":false}
 *   {"op":"decode","ids":[1,2,3],"skip_special":false}
 *   {"op":"render","chat":"<JSON text of the conversation>","thinking":true,"gen":true}
 * Results: "ok <ids separated by spaces>" (encode/render), "ok <hex bytes>" (decode), or
 * "err <message>" (the request failed; the line has no newline inside).
 * Exit status: 0 when every request line was well-formed (whatever the results), 2 on usage
 * or I/O errors or a malformed request line (named by line number). */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/chat.h"
#include "k3pd/tokenizer.h"

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes hex into a fresh buffer (*out, caller frees); -1 on odd length or a bad digit. */
static int unhex(const char *hex, char **out, size_t *len) {
  size_t n = strlen(hex);
  if (n % 2) return -1;
  char *b = malloc(n / 2 + 1);
  if (!b) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hexval((unsigned char)hex[2 * i]), lo = hexval((unsigned char)hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      free(b);
      return -1;
    }
    b[i] = (char)(hi * 16 + lo);
  }
  b[n / 2] = '\0';
  *out = b;
  *len = n / 2;
  return 0;
}

static void print_ids(const k3_tok_ids_t *ids) {
  fputs("ok", stdout);
  for (size_t i = 0; i < ids->n; i++) printf(" %d", (int)ids->ids[i]);
  fputc('\n', stdout);
}

/* The error text on one line (a newline inside would desynchronise the result stream). */
static void print_err(const char *err) {
  fputs("err ", stdout);
  for (const char *p = err; *p; p++) fputc(*p == '\n' || *p == '\r' ? ' ' : *p, stdout);
  fputc('\n', stdout);
}

static int do_encode(const k3_tok_t *tok, json_t *req) {
  const char *hex = json_string_value(json_object_get(req, "hex"));
  if (!hex) return -1;
  char *text;
  size_t len;
  if (unhex(hex, &text, &len)) return -1;
  unsigned flags =
      json_is_true(json_object_get(req, "replace_invalid")) ? K3_TOK_ENC_REPLACE_INVALID : 0;
  k3_tok_ids_t ids = {0};
  char err[512] = "";
  if (k3_tok_encode(tok, text, len, flags, &ids, err, sizeof err)) print_err(err);
  else print_ids(&ids);
  free(ids.ids);
  free(text);
  return 0;
}

static int do_decode(const k3_tok_t *tok, json_t *req) {
  json_t *arr = json_object_get(req, "ids");
  if (!json_is_array(arr)) return -1;
  size_t n = json_array_size(arr);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) return -1;
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v)) {
      free(ids);
      return -1;
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  unsigned flags =
      json_is_true(json_object_get(req, "skip_special")) ? K3_TOK_DEC_SKIP_SPECIAL : 0;
  k3_tok_str_t s = {0};
  char err[512] = "";
  if (k3_tok_decode(tok, ids, n, flags, &s, err, sizeof err)) {
    print_err(err);
  } else {
    fputs("ok ", stdout);
    for (size_t i = 0; i < s.len; i++) printf("%02x", (unsigned char)s.data[i]);
    fputc('\n', stdout);
  }
  free(s.data);
  free(ids);
  return 0;
}

static int do_render(const k3_tok_t *tok, json_t *req) {
  const char *chat = json_string_value(json_object_get(req, "chat"));
  if (!chat) return -1;
  k3_chat_opts_t o;
  k3_chat_opts_default(&o);
  o.thinking = !json_is_false(json_object_get(req, "thinking"));
  o.add_generation_prompt = !json_is_false(json_object_get(req, "gen"));
  o.thinking_effort = NULL; /* the reference renders no internal system messages (their text is
                               not in spec §9.3), so neither side adds the default effort one */
  k3_tok_ids_t ids = {0};
  char err[512] = "";
  if (k3_chat_render_json(tok, chat, strlen(chat), &o, &ids, err, sizeof err)) print_err(err);
  else print_ids(&ids);
  free(ids.ids);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: tokref_batch MODEL_DIR REQUESTS.jsonl\n");
    return 2;
  }
  k3_tok_t *tok = NULL;
  char err[512] = "";
  if (k3_tok_load(argv[1], NULL, &tok, err, sizeof err)) {
    fprintf(stderr, "tokref_batch: %s\n", err);
    return 2;
  }
  FILE *f = fopen(argv[2], "r");
  if (!f) {
    fprintf(stderr, "tokref_batch: %s: %s\n", argv[2], strerror(errno));
    k3_tok_free(tok);
    return 2;
  }
  char *line = NULL;
  size_t cap = 0;
  long lineno = 0;
  int rc = 0;
  while (getline(&line, &cap, f) >= 0) {
    lineno++;
    json_error_t je;
    json_t *req = json_loads(line, 0, &je);
    const char *op = req ? json_string_value(json_object_get(req, "op")) : NULL;
    int bad = -1;
    if (op && !strcmp(op, "encode")) bad = do_encode(tok, req);
    else if (op && !strcmp(op, "decode")) bad = do_decode(tok, req);
    else if (op && !strcmp(op, "render")) bad = do_render(tok, req);
    json_decref(req);
    if (bad) {
      fprintf(stderr, "tokref_batch: %s:%ld: malformed request\n", argv[2], lineno);
      rc = 2;
      break;
    }
  }
  free(line);
  fclose(f);
  k3_tok_free(tok);
  if (fflush(stdout)) rc = 2;
  return rc;
}
