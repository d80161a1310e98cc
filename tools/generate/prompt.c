/* Prompt input of k3pd-generate (see prompt.h): ids, text through k3_tok, or a chat file
 * rendered by k3_chat. The tokenizer is optional at build time (K3PD_HAVE_TOK). */
#include "prompt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/util.h"

#ifdef K3PD_HAVE_TOK
#include "k3pd/chat.h"
#include "k3pd/tokenizer.h"
#endif

int gen_prompt_have_tokenizer(void) {
#ifdef K3PD_HAVE_TOK
  return 1;
#else
  return 0;
#endif
}

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

#ifdef K3PD_HAVE_TOK
/* Text or chat → ids through the tokenizer of src->tok_dir (model type from its config.json,
 * as the router loads it). */
static int encode(const gen_prompt_src_t *src, const k3_model_config_t *cfg, k3_tok_ids_t *out,
                  char *err, size_t errlen) {
  char terr[512] = "";
  k3_tok_t *tok = NULL;
  int rc = k3_tok_load(src->tok_dir, NULL, &tok, terr, sizeof terr);
  if (rc) {
    seterr(err, errlen, "tokenizer of %s: %s", src->tok_dir, terr);
    return rc;
  }
  if (k3_tok_vocab_size(tok) > cfg->vocab_size) {
    seterr(err, errlen, "tokenizer of %s has %d ids but the model's vocabulary is %lld",
           src->tok_dir, k3_tok_vocab_size(tok), (long long)cfg->vocab_size);
    k3_tok_free(tok);
    return K3_EINVAL;
  }
  if (src->text) {
    rc = k3_tok_encode(tok, src->text, strlen(src->text), 0, out, terr, sizeof terr);
    if (rc) seterr(err, errlen, "--prompt: %s", terr);
  } else {
    char *buf = NULL;
    size_t len = 0;
    rc = k3_read_file(src->chat_file, &buf, &len);
    if (rc) {
      seterr(err, errlen, "--chat %s: cannot read: %s", src->chat_file, k3_strerror(rc));
    } else {
      k3_chat_opts_t o;
      k3_chat_opts_default(&o); /* the router's options: thinking on, generation prompt */
      rc = k3_chat_render_json(tok, buf, len, &o, out, terr, sizeof terr);
      if (rc) seterr(err, errlen, "--chat %s: %s", src->chat_file, terr);
    }
    free(buf);
  }
  k3_tok_free(tok);
  return rc;
}
#endif

int gen_prompt_build(const gen_prompt_src_t *src, const k3_model_config_t *cfg, int32_t **ids,
                     size_t *n, char *err, size_t errlen) {
  int given = !!src->ids + !!src->text + !!src->chat_file;
  if (given != 1) {
    seterr(err, errlen, "give exactly one of --prompt-ids, --prompt or --chat");
    return K3_EINVAL;
  }
  int32_t *v = NULL;
  size_t nv = 0;
  int rc = 0;
  if (src->ids) {
    char perr[256] = "";
    rc = k3_parse_int_list(src->ids, &v, &nv, perr, sizeof perr);
    if (rc) {
      seterr(err, errlen, "--prompt-ids: %s", perr);
      return rc;
    }
  } else {
#ifdef K3PD_HAVE_TOK
    if (!src->tok_dir) {
      seterr(err, errlen, "%s needs a tokenizer: use --model DIR or --tokenizer DIR",
             src->text ? "--prompt" : "--chat");
      return K3_EINVAL;
    }
    k3_tok_ids_t out = {0};
    rc = encode(src, cfg, &out, err, errlen);
    if (rc) {
      free(out.ids);
      return rc;
    }
    v = out.ids;
    nv = out.n;
#else
    seterr(err, errlen,
           "%s needs the tokenizer, which this build does not include (K3PD_KERNELS_ONLY); "
           "pass token ids with --prompt-ids",
           src->text ? "--prompt" : "--chat");
    return K3_ENOTSUP;
#endif
  }
  if (nv == 0) {
    free(v);
    seterr(err, errlen, "%s: the prompt is empty",
           src->ids ? "--prompt-ids" : src->text ? "--prompt" : "--chat");
    return K3_EINVAL;
  }
  for (size_t i = 0; i < nv; i++)
    if (v[i] < 0 || v[i] >= cfg->vocab_size) {
      seterr(err, errlen, "prompt id %zu = %d is outside the vocabulary [0, %lld)", i, v[i],
             (long long)cfg->vocab_size);
      free(v);
      return K3_EINVAL;
    }
  *ids = v;
  *n = nv;
  return 0;
}
