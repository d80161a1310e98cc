/* Loading a k3_tok from a model directory, and the encode/decode entry points.
 *
 * Files: DIR/tiktoken.model (`base64(bytes) rank` per line; blank lines skipped as tiktoken's
 * load_tiktoken_bpe does; ranks dense 0..n-1 in any order), DIR/tokenizer_config.json
 * (added_tokens_decoder, checked against the built-in table of the model type), and
 * optionally DIR/config.json (model_type, when the caller does not name it).
 * Not here: the BPE itself (tok_bpe.c), splitting (tok_split.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/detok.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "tok_internal.h"

#define ERR(...) (err ? (void)snprintf(err, errlen, __VA_ARGS__) : (void)0)

static int b64val(uint8_t c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Standard base64 with padding; returns decoded length or -1. dst has room for 3*len/4. */
static long b64_decode(const uint8_t *s, size_t len, uint8_t *dst) {
  if (len == 0 || len % 4) return -1;
  size_t o = 0;
  for (size_t i = 0; i < len; i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      if (s[i + k] == '=' && i + 4 == len && k >= 2) {
        v[k] = 0;
        pad++;
      } else {
        if (pad) return -1; /* data after padding */
        v[k] = b64val(s[i + k]);
        if (v[k] < 0) return -1;
      }
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    dst[o++] = (uint8_t)(w >> 16);
    if (pad < 2) dst[o++] = (uint8_t)(w >> 8);
    if (pad < 1) dst[o++] = (uint8_t)w;
  }
  return (long)o;
}

static int parse_tiktoken(const char *path, const char *buf, size_t len, k3_tok_ranks_t *r,
                          char *err, size_t errlen) {
  size_t nlines = 0;
  for (size_t i = 0; i < len; i++) nlines += buf[i] == '\n';
  nlines++;
  uint8_t *tmp = malloc(len + 1), *bytes = NULL;
  uint32_t *toff = malloc((nlines + 1) * sizeof *toff), *off = NULL;
  int32_t *pos = malloc(nlines * sizeof *pos), *rank_of = malloc(nlines * sizeof *rank_of);
  int rc = K3_ENOMEM;
  if (!tmp || !toff || !pos || !rank_of) goto fail;
  for (size_t i = 0; i < nlines; i++) pos[i] = -1;
  int32_t n = 0;
  size_t tlen = 0, lineno = 0;
  for (size_t i = 0; i < len;) {
    size_t e = i;
    while (e < len && buf[e] != '\n') e++;
    lineno++;
    size_t le = e;
    if (le > i && buf[le - 1] == '\r') le--;
    if (le > i) {
      const uint8_t *ln = (const uint8_t *)buf + i;
      size_t sp = 0;
      while (sp < le - i && ln[sp] != ' ') sp++;
      char *endp = NULL;
      long rank = -1;
      if (sp < le - i) {
        char num[24];
        size_t nl = le - i - sp - 1;
        if (nl > 0 && nl < sizeof num) {
          memcpy(num, ln + sp + 1, nl);
          num[nl] = '\0';
          rank = strtol(num, &endp, 10);
          if (*endp || num[0] < '0' || num[0] > '9') rank = -1;
        }
      }
      long dl = sp ? b64_decode(ln, sp, tmp + tlen) : -1;
      if (rank < 0 || dl <= 0) {
        ERR("%s:%zu: expected `base64(bytes) rank`", path, lineno);
        rc = K3_EFORMAT;
        goto fail;
      }
      if ((size_t)rank >= nlines || pos[rank] >= 0) {
        ERR("%s:%zu: rank %ld %s", path, lineno, rank,
            (size_t)rank >= nlines ? "exceeds the number of lines (ranks must be dense)"
                                   : "appears twice");
        rc = K3_EFORMAT;
        goto fail;
      }
      toff[n] = (uint32_t)tlen;
      rank_of[n] = (int32_t)rank;
      pos[rank] = n;
      tlen += (size_t)dl;
      n++;
    }
    i = e + 1;
  }
  toff[n] = (uint32_t)tlen;
  for (int32_t k = 0; k < n; k++) {
    if (pos[k] < 0) {
      ERR("%s: rank %d is missing (ranks must be dense 0..%d)", path, k, n - 1);
      rc = K3_EFORMAT;
      goto fail;
    }
  }
  bytes = malloc(tlen ? tlen : 1);
  off = malloc(((size_t)n + 1) * sizeof *off);
  if (!bytes || !off) goto fail;
  size_t o = 0;
  for (int32_t k = 0; k < n; k++) {
    int32_t j = pos[k];
    uint32_t l = toff[j + 1] - toff[j];
    off[k] = (uint32_t)o;
    memcpy(bytes + o, tmp + toff[j], l);
    o += l;
  }
  off[n] = (uint32_t)o;
  free(tmp);
  free(toff);
  free(pos);
  free(rank_of);
  char sub[256];
  rc = k3_tok_ranks_build(r, n, bytes, off, sub, sizeof sub);
  if (rc) ERR("%s: %s", path, sub);
  return rc;
fail:
  free(tmp);
  free(toff);
  free(pos);
  free(rank_of);
  free(bytes);
  free(off);
  return rc;
}

int k3_tok_specials_init(k3_tok_t *tok) {
  int32_t base = tok->ranks.n;
  for (int k = 0; k < K3_TOK_NUM_SPECIAL; k++) {
    char name[48];
    snprintf(name, sizeof name, "<|reserved_token_%d|>", base + k);
    tok->special_name[k] = strdup(name);
    tok->special_flag[k] = true;
  }
  size_t n;
  const k3_tok_special_def_t *t = k3_tok_special_table(tok->model, &n);
  for (size_t i = 0; i < n; i++) {
    free(tok->special_name[t[i].k]);
    tok->special_name[t[i].k] = strdup(t[i].name);
    tok->special_flag[t[i].k] = t[i].special;
  }
  for (int k = 0; k < K3_TOK_NUM_SPECIAL; k++) {
    if (!tok->special_name[k]) return K3_ENOMEM;
    tok->special_len[k] = strlen(tok->special_name[k]);
  }
  return 0;
}

/* Model type from DIR/config.json, or from the names in added_tokens_decoder. */
static int detect_model(const char *dir, json_t *added, int32_t base, k3_tok_model_t *out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *cfg = json_load_file(path, 0, NULL);
  if (cfg) {
    int rc = k3_tok_parse_model_type(json_string_value(json_object_get(cfg, "model_type")), out);
    json_decref(cfg);
    if (rc == 0) return 0;
  }
  char key[24];
  snprintf(key, sizeof key, "%d", base + 2);
  const char *c = json_string_value(json_object_get(json_object_get(added, key), "content"));
  if (c && strcmp(c, "<|end_of_msg|>") == 0) *out = K3_TOK_MODEL_K3;
  else if (c && strcmp(c, "<|im_end|>") == 0) *out = K3_TOK_MODEL_KIMI_LINEAR;
  else return K3_ECONFIG;
  return 0;
}

static int check_config(k3_tok_t *tok, const char *path, json_t *added, char *err,
                        size_t errlen) {
  const char *key;
  json_t *v;
  int32_t base = tok->ranks.n;
  json_object_foreach(added, key, v) {
    char *endp;
    long id = strtol(key, &endp, 10);
    if (*endp || id < base || id >= base + K3_TOK_NUM_SPECIAL) {
      ERR("%s: added_tokens_decoder[\"%s\"]: id outside the special range %d..%d", path, key,
          base, base + K3_TOK_NUM_SPECIAL - 1);
      return K3_ECONFIG;
    }
    int k = (int)(id - base);
    const char *content = json_string_value(json_object_get(v, "content"));
    json_t *sp = json_object_get(v, "special");
    if (!content || strcmp(content, tok->special_name[k]) != 0) {
      ERR("%s: added_tokens_decoder[\"%s\"].content is \"%s\" but the %s table has \"%s\" "
          "(wrong tokenizer_config.json for this model?)",
          path, key, content ? content : "(missing)",
          tok->model == K3_TOK_MODEL_K3 ? "kimi_k3" : "kimi_linear", tok->special_name[k]);
      return K3_ECONFIG;
    }
    if (sp && json_is_boolean(sp) && json_is_true(sp) != tok->special_flag[k]) {
      ERR("%s: added_tokens_decoder[\"%s\"].special disagrees with the built-in table", path,
          key);
      return K3_ECONFIG;
    }
  }
  return 0;
}

int k3_tok_load(const char *dir, const char *model_type, k3_tok_t **out, char *err,
                size_t errlen) {
  char path[4096];
  char *buf = NULL;
  size_t len = 0;
  json_t *cfg = NULL;
  k3_tok_t *tok = calloc(1, sizeof *tok);
  if (!tok) return K3_ENOMEM;
  snprintf(path, sizeof path, "%s/tiktoken.model", dir);
  int rc = k3_read_file(path, &buf, &len);
  if (rc) {
    ERR("%s: cannot read: %s", path, k3_strerror(rc));
    goto fail;
  }
  if ((rc = parse_tiktoken(path, buf, len, &tok->ranks, err, errlen))) goto fail;
  free(buf);
  buf = NULL;

  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  json_error_t je;
  cfg = json_load_file(path, 0, &je);
  if (!cfg) {
    ERR("%s: %s (line %d)", path, je.text, je.line);
    rc = K3_ECONFIG;
    goto fail;
  }
  json_t *added = json_object_get(cfg, "added_tokens_decoder");
  if (added && !json_is_object(added)) {
    ERR("%s: added_tokens_decoder is not an object", path);
    rc = K3_ECONFIG;
    goto fail;
  }
  if (model_type) {
    if (k3_tok_parse_model_type(model_type, &tok->model)) {
      ERR("model type \"%s\": expected kimi_k3 or kimi_linear", model_type);
      rc = K3_EINVAL;
      goto fail;
    }
  } else if (detect_model(dir, added, tok->ranks.n, &tok->model)) {
    ERR("%s: cannot tell the model type (no config.json model_type, and id %d is neither "
        "<|end_of_msg|> nor <|im_end|>)", path, tok->ranks.n + 2);
    rc = K3_ECONFIG;
    goto fail;
  }
  if ((rc = k3_tok_specials_init(tok))) goto fail;
  if (added && (rc = check_config(tok, path, added, err, errlen))) goto fail;
  if ((rc = k3_tok_splitter_init(&tok->split, err, errlen))) goto fail;
  json_decref(cfg);
  *out = tok;
  return 0;
fail:
  free(buf);
  json_decref(cfg);
  k3_tok_free(tok);
  return rc;
}

void k3_tok_free(k3_tok_t *tok) {
  if (!tok) return;
  k3_tok_ranks_free(&tok->ranks);
  k3_tok_splitter_free(&tok->split);
  for (int k = 0; k < K3_TOK_NUM_SPECIAL; k++) free(tok->special_name[k]);
  free(tok);
}

k3_tok_model_t k3_tok_model(const k3_tok_t *tok) { return tok->model; }
int32_t k3_tok_n_ranks(const k3_tok_t *tok) { return tok->ranks.n; }
int32_t k3_tok_vocab_size(const k3_tok_t *tok) { return tok->ranks.n + K3_TOK_NUM_SPECIAL; }

int32_t k3_tok_special_id(const k3_tok_t *tok, int32_t real_id) {
  int32_t k = real_id - K3_TOK_REAL_SPECIAL_BASE;
  if (k < 0 || k >= K3_TOK_NUM_SPECIAL) return -1;
  return tok->ranks.n + k;
}

int32_t k3_tok_special_by_name(const k3_tok_t *tok, const char *name) {
  for (int k = 0; k < K3_TOK_NUM_SPECIAL; k++)
    if (strcmp(tok->special_name[k], name) == 0) return tok->ranks.n + k;
  return K3_ENOENT;
}

bool k3_tok_is_special(const k3_tok_t *tok, int32_t id) {
  return id >= tok->ranks.n && id < tok->ranks.n + K3_TOK_NUM_SPECIAL;
}

bool k3_tok_is_skippable(const k3_tok_t *tok, int32_t id) {
  return k3_tok_is_special(tok, id) && tok->special_flag[id - tok->ranks.n];
}

int k3_tok_stop_ids(const k3_tok_t *tok, int32_t out[2]) {
  out[0] = k3_tok_special_id(tok, K3_TOK_ID_EOS);
  out[1] = k3_tok_special_id(tok, K3_TOK_ID_END_OF_MSG);
  return 2;
}

int k3_tok_id_bytes(const k3_tok_t *tok, int32_t id, const uint8_t **bytes, size_t *len) {
  if (id >= 0 && id < tok->ranks.n) {
    *bytes = tok->ranks.bytes + tok->ranks.off[id];
    *len = tok->ranks.off[id + 1] - tok->ranks.off[id];
    return 0;
  }
  if (k3_tok_is_special(tok, id)) {
    *bytes = (const uint8_t *)tok->special_name[id - tok->ranks.n];
    *len = tok->special_len[id - tok->ranks.n];
    return 0;
  }
  return K3_ERANGE;
}

typedef struct {
  const k3_tok_t *tok;
  k3_tok_ids_t *out;
  size_t max_n; /* out->n may not pass this (SIZE_MAX = no limit) */
} enc_ctx_t;

static int enc_piece(void *ctx, const char *s, size_t off, size_t len) {
  enc_ctx_t *c = ctx;
  int rc = k3_tok_bpe(&c->tok->ranks, (const uint8_t *)s + off, len, c->out);
  return !rc && c->out->n > c->max_n ? K3_ERANGE : rc;
}

size_t k3_tok_max_token_bytes(const k3_tok_t *tok) {
  size_t m = 0;
  for (int32_t i = 0; i < tok->ranks.n; i++) {
    size_t l = tok->ranks.off[i + 1] - tok->ranks.off[i];
    if (l > m) m = l;
  }
  return m;
}

static int encode_max(const k3_tok_t *tok, const char *text, size_t len, unsigned flags, bool use_fast_path,
                      size_t max_ids, k3_tok_ids_t *out, char *err, size_t errlen) {
  size_t n0 = out->n;
  k3_tok_str_t clean = {0};
  size_t valid = k3_tok_utf8_valid_prefix(text, len);
  if (valid != len) {
    if (!(flags & K3_TOK_ENC_REPLACE_INVALID)) {
      ERR("text: ill-formed UTF-8 at byte %zu", valid);
      return K3_EUTF8;
    }
    int rc = k3_tok_utf8_sanitize(text, len, &clean);
    if (rc) {
      free(clean.data);
      return rc;
    }
    text = clean.data;
    len = clean.len;
  }
  enc_ctx_t c = {tok, out, max_ids ? n0 + max_ids : SIZE_MAX};
  int rc = k3_tok_split(&tok->split, text, len, use_fast_path, enc_piece, &c);
  free(clean.data);
  if (rc) {
    out->n = n0;
    if (rc == K3_ERANGE)
      ERR("text: more than %zu tokens", max_ids);
    else
      ERR("text: encoding failed: %s", k3_strerror(rc));
  }
  return rc;
}

int k3_tok_encode_ex(const k3_tok_t *tok, const char *text, size_t len, unsigned flags,
                     bool use_fast_path, k3_tok_ids_t *out, char *err, size_t errlen) {
  return encode_max(tok, text, len, flags, use_fast_path, 0, out, err, errlen);
}

int k3_tok_encode_max(const k3_tok_t *tok, const char *text, size_t len, unsigned flags, size_t max_ids,
                      k3_tok_ids_t *out, char *err, size_t errlen) {
  return encode_max(tok, text, len, flags, true, max_ids, out, err, errlen);
}

int k3_tok_encode(const k3_tok_t *tok, const char *text, size_t len, unsigned flags,
                  k3_tok_ids_t *out, char *err, size_t errlen) {
  return k3_tok_encode_ex(tok, text, len, flags, true, out, err, errlen);
}

int k3_tok_decode(const k3_tok_t *tok, const int32_t *ids, size_t n, unsigned flags,
                  k3_tok_str_t *out, char *err, size_t errlen) {
  size_t l0 = out->len;
  for (size_t i = 0; i < n; i++) {
    const uint8_t *b;
    size_t bl;
    if (k3_tok_id_bytes(tok, ids[i], &b, &bl)) {
      ERR("ids[%zu] = %d: outside the vocabulary 0..%d", i, ids[i], k3_tok_vocab_size(tok) - 1);
      out->len = l0;
      if (out->data) out->data[l0] = '\0';
      return K3_ERANGE;
    }
    if ((flags & K3_TOK_DEC_SKIP_SPECIAL) && k3_tok_is_skippable(tok, ids[i])) continue;
    int rc = k3_tok_str_append(out, b, bl);
    if (rc) return rc;
  }
  if (!out->data) return k3_tok_str_append(out, "", 0);
  return 0;
}
