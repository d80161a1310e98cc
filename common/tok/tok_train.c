/* The tiny test/demo vocabulary: standard byte-level BPE training on the committed corpus
 * (corpus.txt, compiled into the library), written as tiktoken.model +
 * tokenizer_config.json. Used by k3pd-mkckpt for the tiny presets and by the unit tests.
 *
 * Training: split the corpus with the K3 regex; count each distinct piece; start every
 * piece as its bytes; repeat: count adjacent pairs weighted by piece count, take the most
 * frequent (ties: the smaller left id, then the smaller right id), give the concatenation
 * the next rank (or reuse the existing rank when another merge order already built those
 * bytes) and replace the pair everywhere. Deterministic by construction.
 * Not here: encoding with the result (tok_load.c / tok_bpe.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "tok_internal.h"

#define ERR(...) (err ? (void)snprintf(err, errlen, __VA_ARGS__) : (void)0)

typedef struct {
  size_t off, len;
} span_t;

typedef struct {
  span_t *v;
  size_t n, cap;
} spans_t;

static int collect(void *ctx, const char *s, size_t off, size_t len) {
  spans_t *sp = ctx;
  if (sp->n == sp->cap) {
    size_t cap = sp->cap ? sp->cap * 2 : 1024;
    span_t *p = realloc(sp->v, cap * sizeof *p);
    if (!p) return K3_ENOMEM;
    sp->v = p;
    sp->cap = cap;
  }
  sp->v[sp->n++] = (span_t){off, len};
  return 0;
}

static int span_cmp(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  size_t l = x->len < y->len ? x->len : y->len;
  int c = memcmp(k3_tok_corpus + x->off, k3_tok_corpus + y->off, l);
  if (c) return c;
  return x->len < y->len ? -1 : x->len > y->len;
}

typedef struct {
  int32_t *sym; /* current symbols (token ids) */
  size_t n;
  int64_t count;
} word_t;

typedef struct {
  uint8_t *bytes;
  size_t bytes_cap;
  uint32_t *off; /* [ntok+1] */
  int32_t ntok, cap;
} vocab_t;

static int32_t vocab_find(const vocab_t *v, const uint8_t *p, size_t len) {
  for (int32_t i = 0; i < v->ntok; i++)
    if (v->off[i + 1] - v->off[i] == len && memcmp(v->bytes + v->off[i], p, len) == 0) return i;
  return -1;
}

/* Learns merges until the vocabulary has n_ranks tokens. */
static int train(int32_t n_ranks, vocab_t *v, char *err, size_t errlen) {
  k3_tok_splitter_t sp;
  int rc = k3_tok_splitter_init(&sp, err, errlen);
  if (rc) return rc;
  spans_t spans = {0};
  rc = k3_tok_split(&sp, (const char *)k3_tok_corpus, k3_tok_corpus_len, true, collect, &spans);
  k3_tok_splitter_free(&sp);
  word_t *w = NULL;
  size_t nw = 0, total = 0;
  int64_t *pc = NULL;
  if (rc) goto out;
  qsort(spans.v, spans.n, sizeof *spans.v, span_cmp);
  w = calloc(spans.n ? spans.n : 1, sizeof *w);
  v->cap = n_ranks;
  v->off = calloc((size_t)n_ranks + 1, sizeof *v->off);
  v->bytes_cap = k3_tok_corpus_len * 4 + 256;
  v->bytes = malloc(v->bytes_cap);
  /* Pair counts in a dense n_ranks x n_ranks table would be 64 MiB at 4096; the symbols
   * present are few, so use a hash keyed by the pair. */
  size_t hcap = 1;
  while (hcap < k3_tok_corpus_len * 4) hcap *= 2;
  pc = malloc(hcap * 2 * sizeof *pc);
  if (!w || !v->off || !v->bytes || !pc) {
    rc = K3_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < spans.n; i++) {
    if (nw && span_cmp(&spans.v[i], &spans.v[i - 1]) == 0) {
      w[nw - 1].count++;
      continue;
    }
    word_t *x = &w[nw++];
    x->n = spans.v[i].len;
    x->count = 1;
    x->sym = malloc(x->n * sizeof *x->sym);
    if (!x->sym) {
      rc = K3_ENOMEM;
      goto out;
    }
    for (size_t k = 0; k < x->n; k++) x->sym[k] = k3_tok_corpus[spans.v[i].off + k];
    total += x->n;
  }
  for (int b = 0; b < 256; b++) {
    v->bytes[b] = (uint8_t)b;
    v->off[b + 1] = (uint32_t)b + 1;
  }
  v->ntok = 256;
  while (v->ntok < n_ranks) {
    /* pc holds (key, count) pairs; key = left * 2^32 + right + 1 (0 = empty). */
    memset(pc, 0, hcap * 2 * sizeof *pc);
    int64_t best = 0, bestkey = 0;
    for (size_t i = 0; i < nw; i++) {
      for (size_t k = 0; k + 1 < w[i].n; k++) {
        int64_t key = ((int64_t)w[i].sym[k] << 32) + w[i].sym[k + 1] + 1;
        size_t h = (size_t)k3_hash64(&key, sizeof key, 0) & (hcap - 1);
        while (pc[2 * h] && pc[2 * h] != key) h = (h + 1) & (hcap - 1);
        pc[2 * h] = key;
        int64_t c = pc[2 * h + 1] += w[i].count;
        if (c > best || (c == best && key < bestkey)) best = c, bestkey = key;
      }
    }
    if (best == 0) {
      ERR("vocab_size %d: the corpus supports at most %d ranks, i.e. vocab_size <= %d",
          n_ranks + 256, v->ntok, v->ntok + 256);
      rc = K3_ERANGE;
      goto out;
    }
    int32_t a = (int32_t)((bestkey - 1) >> 32), b = (int32_t)((bestkey - 1) & 0xffffffff);
    uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
    if (v->off[v->ntok] + la + lb > v->bytes_cap) {
      uint8_t *nb = realloc(v->bytes, v->bytes_cap * 2);
      if (!nb) {
        rc = K3_ENOMEM;
        goto out;
      }
      v->bytes = nb;
      v->bytes_cap *= 2;
    }
    uint8_t *dst = v->bytes + v->off[v->ntok];
    memcpy(dst, v->bytes + v->off[a], la);
    memcpy(dst + la, v->bytes + v->off[b], lb);
    int32_t id = vocab_find(v, dst, la + lb);
    if (id < 0) {
      id = v->ntok++;
      v->off[id + 1] = v->off[id] + la + lb;
    }
    for (size_t i = 0; i < nw; i++) {
      size_t o = 0;
      for (size_t k = 0; k < w[i].n; k++) {
        if (k + 1 < w[i].n && w[i].sym[k] == a && w[i].sym[k + 1] == b) {
          w[i].sym[o++] = id;
          k++;
        } else {
          w[i].sym[o++] = w[i].sym[k];
        }
      }
      w[i].n = o;
    }
  }
out:
  for (size_t i = 0; i < nw; i++) free(w[i].sym);
  free(w);
  free(spans.v);
  free(pc);
  return rc;
}

static void b64_encode(const uint8_t *p, size_t n, char *out) {
  static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                 (i + 2 < n ? p[i + 2] : 0);
    out[o++] = t[w >> 18 & 63];
    out[o++] = t[w >> 12 & 63];
    out[o++] = i + 1 < n ? t[w >> 6 & 63] : '=';
    out[o++] = i + 2 < n ? t[w & 63] : '=';
  }
  out[o] = '\0';
}

int k3_tok_write_model_files(const char *dir, const char *model_type, int vocab_size, char *err,
                             size_t errlen) {
  k3_tok_model_t model;
  if (k3_tok_parse_model_type(model_type, &model)) {
    ERR("model_type \"%s\": expected kimi_k3 or kimi_linear", model_type ? model_type : "(null)");
    return K3_EINVAL;
  }
  if (vocab_size < 512 || vocab_size > K3_TOK_REAL_VOCAB) {
    ERR("vocab_size %d: must be in [512, %d]", vocab_size, K3_TOK_REAL_VOCAB);
    return K3_ERANGE;
  }
  int32_t n_ranks = vocab_size - K3_TOK_NUM_SPECIAL;
  vocab_t v = {0};
  k3_tok_str_t file = {0};
  json_t *cfg = NULL;
  char *js = NULL;
  int rc = train(n_ranks, &v, err, errlen);
  if (rc) goto out;
  for (int32_t r = 0; r < v.ntok && rc == 0; r++) {
    uint32_t l = v.off[r + 1] - v.off[r];
    char line[4 * 256 + 32];
    char *b64 = l * 4 / 3 + 8 < 1024 ? line : malloc(l * 4 / 3 + 8);
    if (!b64) {
      rc = K3_ENOMEM;
      break;
    }
    b64_encode(v.bytes + v.off[r], l, b64);
    char num[24];
    snprintf(num, sizeof num, " %d\n", r);
    rc = k3_tok_str_append(&file, b64, strlen(b64));
    if (!rc) rc = k3_tok_str_append(&file, num, strlen(num));
    if (b64 != line) free(b64);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/tiktoken.model", dir);
  if (!rc && (rc = k3_write_file(path, file.data, file.len))) {
    ERR("%s: cannot write: %s", path, k3_strerror(rc));
    goto out;
  }
  /* tokenizer_config.json: the model's table mapped to n_ranks + k. */
  k3_tok_t tmp = {.model = model};
  tmp.ranks.n = n_ranks;
  if (!rc) rc = k3_tok_specials_init(&tmp);
  cfg = json_object();
  json_t *added = json_object();
  json_object_set_new(cfg, "added_tokens_decoder", added);
  for (int k = 0; k < K3_TOK_NUM_SPECIAL && !rc; k++) {
    char key[24];
    snprintf(key, sizeof key, "%d", n_ranks + k);
    json_object_set_new(added, key,
                        json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content",
                                  tmp.special_name[k], "lstrip", 0, "normalized", 0, "rstrip", 0,
                                  "single_word", 0, "special", tmp.special_flag[k]));
  }
  for (int k = 0; k < K3_TOK_NUM_SPECIAL; k++) free(tmp.special_name[k]);
  if (rc) goto out;
  json_object_set_new(cfg, "bos_token", json_string("[BOS]"));
  json_object_set_new(cfg, "eos_token", json_string("[EOS]"));
  json_object_set_new(cfg, "pad_token", json_string("[PAD]"));
  json_object_set_new(cfg, "unk_token", json_string("[UNK]"));
  json_object_set_new(cfg, "model_max_length", json_integer(1048576));
  json_object_set_new(cfg, "tokenizer_class", json_string("TikTokenTokenizer"));
  js = json_dumps(cfg, JSON_INDENT(2));
  if (!js) {
    rc = K3_ENOMEM;
    goto out;
  }
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  size_t jl = strlen(js);
  js[jl] = '\n'; /* replace the NUL: write exactly jl+1 bytes */
  if ((rc = k3_write_file(path, js, jl + 1))) ERR("%s: cannot write: %s", path, k3_strerror(rc));
out:
  free(v.bytes);
  free(v.off);
  free(file.data);
  free(js);
  json_decref(cfg);
  return rc;
}
