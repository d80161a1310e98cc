/* libFuzzer harness for k3_tok: arbitrary bytes are encoded (ill-formed UTF-8 replaced),
 * decoded, streamed through the detokeniser, and parsed + rendered as a chat conversation.
 * Invariants checked: decode(encode(x)) == sanitize(x); the streamed text equals it too; no
 * crash, leak or sanitizer report on any input. The tiny vocabulary is written once into a
 * temporary directory, in LLVMFuzzerInitialize: training it takes seconds on a loaded machine, and
 * libFuzzer's per-input timeout must not count it (it once did: a timeout "finding" under load). Built and run by run_fuzz.sh (clang -fsanitize=fuzzer,address). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/chat.h"
#include "k3pd/detok.h"
#include "k3pd/tokenizer.h"

static k3_tok_t *tok;

static void init(void) {
  char dir[] = "/tmp/k3tok-fuzz-XXXXXX", err[256];
  if (!mkdtemp(dir) || k3_tok_write_model_files(dir, "kimi_k3", 4096, err, sizeof err) ||
      k3_tok_load(dir, "kimi_k3", &tok, err, sizeof err)) {
    fprintf(stderr, "fuzz init: %s\n", err);
    abort();
  }
  char p[64];
  snprintf(p, sizeof p, "%s/tiktoken.model", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
  unlink(p);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  init();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  k3_tok_str_t clean = {0}, dec = {0}, stream = {0};
  k3_tok_ids_t ids = {0};
  if (k3_tok_utf8_sanitize((const char *)data, size, &clean)) abort();
  if (k3_tok_encode(tok, (const char *)data, size, K3_TOK_ENC_REPLACE_INVALID, &ids, NULL, 0)) abort();
  if (k3_tok_decode(tok, ids.ids, ids.n, 0, &dec, NULL, 0)) abort();
  if (dec.len != clean.len || memcmp(dec.data, clean.data, clean.len)) abort();
  const char *stops[] = {"\n\n", "END"};
  k3_detok_opts_t o = {.stop_ids = NULL, .stop_strs = stops, .n_stop_strs = size % 2 ? 2 : 0};
  k3_detok_t *d;
  if (k3_detok_init(tok, &o, &d)) abort();
  for (size_t i = 0; i < ids.n; i++) k3_detok_feed(d, ids.ids[i], &stream);
  /* also feed raw bytes as single-byte ids: arbitrary splits of ill-formed sequences */
  for (size_t i = 0; i < size && i < 64; i++) k3_detok_feed(d, data[i], &stream);
  k3_detok_finish(d, &stream);
  if (o.n_stop_strs == 0 && (stream.len < clean.len || memcmp(stream.data, clean.data, clean.len))) abort();
  k3_detok_free(d);
  k3_tok_ids_t chat = {0};
  k3_chat_render_json(tok, (const char *)data, size, NULL, &chat, NULL, 0);
  free(chat.ids);
  free(clean.data);
  free(dec.data);
  free(stream.data);
  free(ids.ids);
  return 0;
}
