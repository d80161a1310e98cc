/* k3pd-cli tokenizer subcommands: tokenize, detokenize, render, mkvocab.
 * Thin wrappers over k3pd/tokenizer.h and k3pd/chat.h for debugging; errors go to stderr
 * with exit status 1 (2 for bad flags). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "k3pd/chat.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/tokenizer.h"
#include "k3pd/util.h"

/* Parses flags; returns -1 to continue, else the exit status. */
static int parse(const char *prog, const char *summary, const k3_flag_t *f, size_t n, int argc,
                 char **argv) {
  char err[256];
  k3_flags_info_t info = {prog, summary, NULL};
  int rc = k3_flags_parse(&info, f, n, argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "%s: %s\n", prog, err);
    return 2;
  }
  return -1;
}

static k3_tok_t *load(const char *prog, const char *dir, const char *type) {
  char err[512];
  k3_tok_t *tok = NULL;
  int rc = k3_tok_load(dir, type && *type ? type : NULL, &tok, err, sizeof err);
  if (rc) fprintf(stderr, "%s: %s (%s)\n", prog, err, k3_errname(rc));
  return tok;
}

static void print_ids(const k3_tok_ids_t *ids) {
  for (size_t i = 0; i < ids->n; i++) printf(i ? " %d" : "%d", ids->ids[i]);
  printf("\n");
}

static int cmd_tokenize(int argc, char **argv) {
  const char *model = NULL, *text = NULL, *type = NULL;
  bool replace = false;
  k3_flag_t f[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "model directory (tiktoken.model + tokenizer_config.json)", true},
      {"text", K3_FLAG_STR, &text, "STR", "text to encode (specials are NOT recognised)", true},
      {"model-type", K3_FLAG_STR, &type, "TYPE", "kimi_k3 | kimi_linear (default: from DIR/config.json)", false},
      {"replace-invalid", K3_FLAG_BOOL, &replace, NULL, "replace ill-formed UTF-8 with U+FFFD instead of failing", false},
  };
  int st = parse("k3pd-cli tokenize", "Prints the ids of --text, separated by spaces.", f, 4, argc, argv);
  if (st >= 0) return st;
  k3_tok_t *tok = load("tokenize", model, type);
  if (!tok) return 1;
  char err[256];
  k3_tok_ids_t ids = {0};
  int rc = k3_tok_encode(tok, text, strlen(text), replace ? K3_TOK_ENC_REPLACE_INVALID : 0, &ids, err, sizeof err);
  if (rc) fprintf(stderr, "tokenize: %s\n", err);
  else print_ids(&ids);
  free(ids.ids);
  k3_tok_free(tok);
  return rc ? 1 : 0;
}

static int cmd_detokenize(int argc, char **argv) {
  const char *model = NULL, *list = NULL, *type = NULL;
  bool skip = false;
  k3_flag_t f[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "model directory", true},
      {"ids", K3_FLAG_STR, &list, "LIST", "comma-separated ids, e.g. 1,2,3", true},
      {"model-type", K3_FLAG_STR, &type, "TYPE", "kimi_k3 | kimi_linear (default: from DIR/config.json)", false},
      {"skip-special", K3_FLAG_BOOL, &skip, NULL, "omit special tokens (K3 <|open|>/<|close|>/<|sep|> are kept)", false},
  };
  int st = parse("k3pd-cli detokenize", "Prints the text of --ids (raw bytes, then a newline).", f, 4, argc, argv);
  if (st >= 0) return st;
  char err[256];
  int32_t *v = NULL;
  size_t n = 0;
  if (k3_parse_int_list(list, &v, &n, err, sizeof err)) {
    fprintf(stderr, "detokenize: --ids: %s\n", err);
    return 2;
  }
  k3_tok_t *tok = load("detokenize", model, type);
  if (!tok) {
    free(v);
    return 1;
  }
  k3_tok_str_t s = {0};
  int rc = k3_tok_decode(tok, v, n, skip ? K3_TOK_DEC_SKIP_SPECIAL : 0, &s, err, sizeof err);
  if (rc) fprintf(stderr, "detokenize: %s\n", err);
  else {
    fwrite(s.data, 1, s.len, stdout);
    printf("\n");
  }
  free(s.data);
  free(v);
  k3_tok_free(tok);
  return rc ? 1 : 0;
}

static int cmd_render(int argc, char **argv) {
  const char *model = NULL, *chat = NULL, *type = NULL, *effort = NULL;
  bool no_thinking = false, no_gen = false;
  k3_flag_t f[] = {
      {"model", K3_FLAG_STR, &model, "DIR", "model directory", true},
      {"chat", K3_FLAG_STR, &chat, "FILE", "JSON messages array, or {\"messages\":[...],\"tools\":[...],...}", true},
      {"model-type", K3_FLAG_STR, &type, "TYPE", "kimi_k3 | kimi_linear (default: from DIR/config.json)", false},
      {"no-thinking", K3_FLAG_BOOL, &no_thinking, NULL, "K3: thinking off (response generation prompt)", false},
      {"no-generation-prompt", K3_FLAG_BOOL, &no_gen, NULL, "do not append the assistant generation prompt", false},
      {"thinking-effort", K3_FLAG_STR, &effort, "E", "K3: low | high | max (default, as HF) | none", false},
  };
  int st = parse("k3pd-cli render", "Prints the ids of a rendered conversation (K3 XTML or 48B format).", f, 6, argc, argv);
  if (st >= 0) return st;
  char *buf = NULL;
  size_t len = 0;
  int rc = k3_read_file(chat, &buf, &len);
  if (rc) {
    fprintf(stderr, "render: %s: cannot read: %s\n", chat, k3_strerror(rc));
    return 1;
  }
  k3_tok_t *tok = load("render", model, type);
  if (!tok) {
    free(buf);
    return 1;
  }
  k3_chat_opts_t o;
  k3_chat_opts_default(&o);
  o.thinking = !no_thinking;
  o.add_generation_prompt = !no_gen;
  if (effort) o.thinking_effort = strcmp(effort, "none") ? effort : NULL;
  char err[512];
  k3_tok_ids_t ids = {0};
  rc = k3_chat_render_json(tok, buf, len, &o, &ids, err, sizeof err);
  if (rc) fprintf(stderr, "render: %s: %s\n", chat, err);
  else print_ids(&ids);
  free(ids.ids);
  free(buf);
  k3_tok_free(tok);
  return rc ? 1 : 0;
}

static int cmd_mkvocab(int argc, char **argv) {
  const char *out = NULL, *type = "kimi_k3";
  int vocab = 4096;
  k3_flag_t f[] = {
      {"out", K3_FLAG_STR, &out, "DIR", "existing directory to write tiktoken.model + tokenizer_config.json into", true},
      {"model-type", K3_FLAG_STR, &type, "TYPE", "kimi_k3 | kimi_linear", false},
      {"vocab-size", K3_FLAG_INT, &vocab, "N", "total ids including the 256 specials", false},
  };
  int st = parse("k3pd-cli mkvocab", "Writes the tiny byte-level test vocabulary (deterministic).", f, 3, argc, argv);
  if (st >= 0) return st;
  char err[512];
  int rc = k3_tok_write_model_files(out, type, vocab, err, sizeof err);
  if (rc) fprintf(stderr, "mkvocab: %s\n", err);
  return rc ? 1 : 0;
}

const k3_cli_cmd_t cli_tok_cmds[] = {
    {"tokenize", "encode text to ids (specials disallowed)", cmd_tokenize},
    {"detokenize", "decode ids to text", cmd_detokenize},
    {"render", "render a chat conversation to ids", cmd_render},
    {"mkvocab", "write the tiny test vocabulary into a directory", cmd_mkvocab},
};
const size_t cli_tok_ncmds = sizeof cli_tok_cmds / sizeof cli_tok_cmds[0];
