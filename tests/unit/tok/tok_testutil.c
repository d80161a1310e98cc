/* See tok_testutil.h. */
#include "tok_testutil.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/util.h"

char *tt_mkdtemp(void) {
  const char *t = getenv("TMPDIR");
  char *p = malloc(4096);
  snprintf(p, 4096, "%s/k3tok-XXXXXX", t && *t ? t : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(p));
  return p;
}

void tt_rmdir(char *dir) {
  const char *names[] = {"tiktoken.model", "tokenizer_config.json", "config.json"};
  char path[4200];
  for (size_t i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
  free(dir);
}

void tt_b64(const uint8_t *p, size_t n, char *out) {
  static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out[o++] = t[w >> 18 & 63];
    out[o++] = t[w >> 12 & 63];
    out[o++] = i + 1 < n ? t[w >> 6 & 63] : '=';
    out[o++] = i + 2 < n ? t[w & 63] : '=';
  }
  out[o] = '\0';
}

void tt_write_hand_vocab(const char *dir, const char *model_type, const char *const *words, size_t n) {
  char path[4200], b64[256];
  snprintf(path, sizeof path, "%s/tiktoken.model", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    tt_b64(&c, 1, b64);
    fprintf(f, "%s %d\n", b64, b);
  }
  for (size_t i = 0; i < n; i++) {
    tt_b64((const uint8_t *)words[i], strlen(words[i]), b64);
    fprintf(f, "%s %zu\n", b64, 256 + i);
  }
  fclose(f);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  const char *cfg = "{\"added_tokens_decoder\": {}}\n";
  ck_assert_int_eq(k3_write_file(path, cfg, strlen(cfg)), 0);
  snprintf(path, sizeof path, "%s/config.json", dir);
  char js[128];
  snprintf(js, sizeof js, "{\"model_type\": \"%s\"}\n", model_type);
  ck_assert_int_eq(k3_write_file(path, js, strlen(js)), 0);
}

k3_tok_t *tt_load(const char *dir, const char *model_type) {
  char err[512] = "";
  k3_tok_t *tok = NULL;
  int rc = k3_tok_load(dir, model_type, &tok, err, sizeof err);
  ck_assert_msg(rc == 0, "load %s: %s", dir, err);
  return tok;
}

char *tt_tiny_dir(const char *model_type) {
  char *d = tt_mkdtemp(), err[256] = "";
  int rc = k3_tok_write_model_files(d, model_type, 4096, err, sizeof err);
  ck_assert_msg(rc == 0, "write_model_files: %s", err);
  return d;
}

k3_tok_ids_t tt_enc(const k3_tok_t *tok, const char *s) {
  k3_tok_ids_t v = {0};
  char err[256] = "";
  int rc = k3_tok_encode(tok, s, strlen(s), 0, &v, err, sizeof err);
  ck_assert_msg(rc == 0, "encode: %s", err);
  return v;
}
