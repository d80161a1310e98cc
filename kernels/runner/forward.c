/* The forward pass over a packed batch (rn_forward) and the public prefill / decode_step entry
 * points: validation, per-round chunking of long prompts, logits routing, the layer callback.
 *
 * Residual forms: K3 Block Attention Residuals (spec §2.3: depth mix of block snapshots before
 * each sub-layer, prefix sum P reset at block boundaries) and the 48B plain pre-norm residual.
 * Chunking: a prefill call is split in rounds; round k feeds tokens [k*C, (k+1)*C) of every
 * sequence that still has some (C = prefill_chunk_tokens, a multiple of the KDA chunk 64), each
 * round continuing from the state the previous one left. The layer callback fires only in the
 * last round, when every sequence's state of that layer is final.
 * Decode on a "cuda" runner goes through graph.c (prebuilt metadata, CUDA graphs); prefill and
 * the other backends through rn_forward. Every pass runs with the backend's id checks off
 * (rn_trust): the entry points below validate tokens, slots and pages on the host first. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "runner_internal.h"

/* ---- forward ---------------------------------------------------------------------------- */

#define TRY(x)       \
  do {               \
    rc = (x);        \
    if (rc) goto out; \
  } while (0)

/* P += a (a may be NULL), h = ATTN_RES_MIX(sv, P) (sv may be NULL: the norm reads P), then
 * xn = RMSNORM: the residual glue between two sub-layers. `fuse`: the RES_MIX_NORM op (one
 * launch on the GPU, the same chain by definition) when the backend takes these operands and
 * K3PD_CUDA_RESNORM is not "0" (read once: eager and captured steps agree); else the chain. */
static int res_norm(k3_runner_t *r, bool fuse, const k3k_tensor_t *a, const k3k_tensor_t *P,
                    const k3k_tensor_t *sv, const k3k_tensor_t *wn, const k3k_tensor_t *wp,
                    const k3k_attn_res_params_t *mp, const k3k_tensor_t *h,
                    const k3k_tensor_t *lnw, const k3k_rmsnorm_params_t *np,
                    const k3k_tensor_t *xn) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("K3PD_CUDA_RESNORM");
    on = !(e && !strcmp(e, "0"));
  }
  if (fuse && on) {
    const k3k_res_mix_norm_params_t p = {.eps_mix = mp->eps, .eps = np->eps,
                                         .bf16_inner = np->bf16_inner};
    const k3k_tensor_t *t[8] = {a, P, sv, sv ? wn : NULL, sv ? wp : NULL, sv ? h : NULL, lnw, xn};
    if (k3k_supports(r->be, K3K_OP_RES_MIX_NORM, &p, t, 8))
      return k3k_run(r->be, K3K_OP_RES_MIX_NORM, &p, t, 8);
  }
  int rc = a ? k3k_add(r->be, P, a, P) : 0;
  if (!rc && sv) rc = k3k_attn_res_mix(r->be, mp, sv, P, wn, wp, h);
  return rc ? rc : k3k_rmsnorm(r->be, np, sv ? h : P, lnw, xn);
}

int rn_forward_enqueue(k3_runner_t *r, rn_ws_t *ws, rn_pass_t *ps, const int32_t *rows, int64_t nw,
                       k3_layer_done_fn cb, void *cb_ctx, bool fire_cb, k3k_tensor_t *lg,
                       char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  k3k_backend_t *be = r->be;
  const int64_t T = ps->n_tok, H = c->hidden_size, V = c->vocab_size;
  const k3k_dtype_t A = r->act;
  const bool ares = c->attn_res_block_size > 0;
  const size_t es = k3k_dtype_size(A);
  int rc = 0;
  k3k_tensor_t ids = ps->dev ? ps->ids : rn_i32(ws, ps->tok, T);
  k3k_tensor_t P = rn_buf(ws, A, T, H), h = rn_buf(ws, A, T, H), xn = rn_buf(ws, A, T, H);
  k3k_tensor_t a = rn_buf(ws, A, T, H);
  int nb_max = ares ? c->num_attn_res_boundaries : 0, nb = 0;
  void *snap_mem = rn_ws_alloc(ws, (size_t)(nb_max > 0 ? nb_max : 1) * (size_t)(T * H) * es);
  if ((rc = ws->rc)) goto out;
  int64_t sshape[3] = {nb_max, T, H};
  k3k_tensor_t snaps = k3k_tensor_make(be, A, snap_mem, 3, sshape);
  k3k_rmsnorm_params_t np = {.eps = (float)c->eps_norm, .bf16_inner = r->bf16};
  k3k_attn_res_params_t mp = {.eps = (float)c->eps_norm};

  if (ps->dev)
    TRY(rn_dev_gather(r, &r->embed, &ids, &P));
  else
    TRY(k3k_get_rows(be, &r->embed, &ids, &P));
  /* device decode: each sub-layer's output is added to P inside the next one-launch residual
   * glue (res_norm) instead of by its own ADD; `pend` is the output not yet added */
  const bool fuse = ps->dev && !(fire_cb && cb);
  const k3k_tensor_t *pend = NULL;
  for (int l = 0; l < c->num_layers; l++) {
    const rn_layer_t *L = &r->layers[l];
    const int ki = c->kind_index[l];
    bool reset = false;
    /* h = Mix(B, P_in); at a boundary B gets P_in and P restarts from the mixer output */
    k3k_tensor_t sv = ares ? k3k_tensor_slice(&snaps, 0, 0, nb) : P;
    TRY(res_norm(r, fuse, pend, &P, ares && nb > 0 ? &sv : NULL, &L->sa_res_norm,
                 &L->sa_res_proj, &mp, &h, &L->in_ln, &np, &xn));
    pend = NULL;
    if (ares && L->boundary) {
      k3k_tensor_t dst = k3k_tensor_2d(be, A, (char *)snap_mem + (size_t)nb * (size_t)(T * H) * es, T, H);
      TRY(k3k_copy(be, &P, &dst));
      nb++;
      reset = true;
    }
    /* the mixer's and the FFN's temporaries die when they return (their output is `a`) */
    rn_ws_mark_t mk = rn_ws_mark(ws);
    if (L->kind == K3_LAYER_KDA)
      TRY(rn_kda_forward(r, ws, L, ki, ps, &xn, &a));
    else
      TRY(rn_mla_forward(r, ws, L, ki, ps, &xn, &a));
    rn_ws_release(ws, mk);
    if (reset) TRY(k3k_copy(be, &a, &P));
    sv = ares ? k3k_tensor_slice(&snaps, 0, 0, nb) : P;
    TRY(res_norm(r, fuse, reset ? NULL : &a, &P, ares ? &sv : NULL, &L->mlp_res_norm,
                 &L->mlp_res_proj, &mp, &h, &L->post_ln, &np, &xn));
    TRY(rn_ffn_forward(r, ws, L, &xn, &a));
    rn_ws_release(ws, mk);
    if (fuse)
      pend = &a;
    else
      TRY(k3k_add(be, &P, &a, &P));
    if (fire_cb && cb) {
      if (be->synchronize) TRY(be->synchronize(be));
      rc = cb(l, cb_ctx);
      if (rc) {
        rn_seterr(err, errlen, "runner: on_layer_done(%d) failed: %s", l, k3_strerror(rc));
        goto out;
      }
    }
  }
  /* head: final depth mix (K3), final norm, lm_head on the wanted rows only */
  const bool dev_head = nw > 0 && nw == T && ps->dev;
  if (pend && !dev_head) { /* the last FFN output, when the head does not take it */
    TRY(k3k_add(be, &P, pend, &P));
    pend = NULL;
  }
  if (dev_head) { /* device decode: one launch for add, mix and norm (every row) */
    k3k_tensor_t sv = ares ? k3k_tensor_slice(&snaps, 0, 0, nb) : P;
    k3k_tensor_t hn = rn_buf(ws, A, nw, H);
    *lg = rn_buf(ws, K3K_F32, nw, V);
    if ((rc = ws->rc)) goto out;
    TRY(res_norm(r, fuse, pend, &P, ares ? &sv : NULL, &r->out_res_norm, &r->out_res_proj, &mp,
                 &h, &r->final_norm, &np, &hn));
    TRY(k3k_gemm(be, &hn, &r->lm_head, lg));
  } else if (nw > 0) {
    const k3k_tensor_t *hf = &P;
    if (ares) {
      k3k_tensor_t sv = k3k_tensor_slice(&snaps, 0, 0, nb);
      TRY(k3k_attn_res_mix(be, &mp, &sv, &P, &r->out_res_norm, &r->out_res_proj, &h));
      hf = &h;
    }
    k3k_tensor_t hw = *hf, hn = rn_buf(ws, A, nw, H);
    *lg = rn_buf(ws, K3K_F32, nw, V);
    if (!ps->dev) {
      k3k_tensor_t rt = rn_i32(ws, rows, nw);
      hw = rn_buf(ws, A, nw, H);
      if ((rc = ws->rc)) goto out;
      TRY(k3k_get_rows(be, hf, &rt, &hw));
    }
    if ((rc = ws->rc)) goto out;
    TRY(k3k_rmsnorm(be, &np, &hw, &r->final_norm, &hn));
    TRY(k3k_gemm(be, &hn, &r->lm_head, lg));
  }
out:
  if (rc && err && !err[0]) rn_seterr(err, errlen, "runner: forward failed: %s", k3_strerror(rc));
  return rc;
}

int rn_forward(k3_runner_t *r, rn_pass_t *ps, float *const *row_dst, k3_layer_done_fn cb,
               void *cb_ctx, bool fire_cb, char *err, size_t errlen) {
  k3k_backend_t *be = r->be;
  const int64_t T = ps->n_tok, V = r->cfg.vocab_size;
  rn_ws_t *ws = rn_ws_begin(r);
  int32_t *slots = malloc((size_t)ps->n_seq * 4), *rows = malloc((size_t)(T > 0 ? T : 1) * 4);
  int rc = slots && rows ? 0 : K3_ENOMEM;
  int64_t nw = 0;
  for (int s = 0; s < ps->n_seq && !rc; s++) slots[s] = ps->seq[s]->slot < 0 ? 0 : ps->seq[s]->slot;
  for (int64_t t = 0; t < T && row_dst && !rc; t++)
    if (row_dst[t]) rows[nw++] = (int32_t)t;
  ps->dev = false;
  if (!rc) {
    ps->cu = rn_i32(ws, ps->off, ps->n_seq + 1);
    ps->slots = rn_i32(ws, slots, ps->n_seq);
    rc = ws->rc;
  }
  /* the runner built and validated every id of the pass (k3_runner_prefill/decode_step) */
  rn_trust(r, true);
  k3k_tensor_t lg = {0};
  if (!rc) rc = rn_forward_enqueue(r, ws, ps, rows, nw, cb, cb_ctx, fire_cb, &lg, err, errlen);
  for (int64_t i = 0; i < nw && !rc; i++)
    rc = be->copy_to_host(be, row_dst[rows[i]], (char *)lg.data + (size_t)(i * V) * 4,
                          (size_t)V * 4);
  if (!rc && be->synchronize) rc = be->synchronize(be);
  rn_trust(r, false);
  if (rc && err && !err[0]) rn_seterr(err, errlen, "runner: forward failed: %s", k3_strerror(rc));
  free(slots);
  free(rows);
  rn_ws_end(ws);
  return rc;
}

/* ---- public entry points ----------------------------------------------------------------- */

/* Checks one sequence can take `add` more tokens. */
static int check_seq(k3_runner_t *r, const k3_seq_t *s, int64_t add, char *err, size_t errlen,
                     int i) {
  if (!s || s->len < 0) {
    rn_seterr(err, errlen, "runner: item %d: no sequence or negative len", i);
    return K3_EINVAL;
  }
  if (r->n_kda > 0 && (s->slot < 0 || s->slot >= r->opts.num_slots || !r->slot_used[s->slot])) {
    rn_seterr(err, errlen, "runner: item %d: slot %d is not an allocated KDA slot", i, s->slot);
    return K3_EINVAL;
  }
  if (r->n_mla > 0) {
    int need = k3_runner_pages_for(r, s->len + add);
    if (s->n_pages < need || !s->pages) {
      rn_seterr(err, errlen, "runner: item %d: %d pages hold %lld tokens, %d needed for %lld", i,
                s->n_pages, (long long)s->len, need, (long long)(s->len + add));
      return K3_ECAPACITY;
    }
    for (int p = 0; p < need; p++)
      if (s->pages[p] < 0 || s->pages[p] >= r->opts.num_pages || !r->page_used[s->pages[p]]) {
        rn_seterr(err, errlen, "runner: item %d: page %d (id %d) is not allocated", i, p, s->pages[p]);
        return K3_EINVAL;
      }
  }
  return 0;
}

static int check_tokens(const k3_runner_t *r, const int32_t *tok, int64_t n, int i, char *err,
                        size_t errlen) {
  for (int64_t t = 0; t < n; t++)
    if (tok[t] < 0 || tok[t] >= r->cfg.vocab_size) {
      rn_seterr(err, errlen, "runner: item %d: token %lld = %d outside [0, %lld)", i, (long long)t,
                tok[t], (long long)r->cfg.vocab_size);
      return K3_EINVAL;
    }
  return 0;
}

static int check_distinct(k3_seq_t *const *seqs, int n, char *err, size_t errlen) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (seqs[i] == seqs[j] || (seqs[i]->slot >= 0 && seqs[i]->slot == seqs[j]->slot)) {
        rn_seterr(err, errlen, "runner: items %d and %d share a sequence or slot", j, i);
        return K3_EINVAL;
      }
  return 0;
}

/* A sequence starting from nothing gets the zero KDA state (its slot may be reused). */
static void zero_fresh_slot(k3_runner_t *r, const k3_seq_t *s) {
  if (s->len != 0 || r->n_kda == 0) return;
  for (int i = 0; i < r->n_kda; i++) {
    size_t nb = (size_t)r->kda_S[i].stride[0] * 4;
    r->be->memset(r->be, (char *)r->kda_S[i].data + (size_t)s->slot * nb, 0, nb);
    for (int j = 0; j < 3; j++) {
      size_t cb = (size_t)r->kda_conv[i][j].stride[0] * k3k_dtype_size(r->sdt);
      r->be->memset(r->be, (char *)r->kda_conv[i][j].data + (size_t)s->slot * cb, 0, cb);
    }
  }
}

int k3_runner_prefill(k3_runner_t *r, k3_prefill_item_t *items, int n, k3_layer_done_fn on_layer_done,
                      void *cb_ctx, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!items || n <= 0 || n > r->opts.max_batch_seqs) {
    rn_seterr(err, errlen, "runner: prefill of %d items (1..%d allowed)", n, r->opts.max_batch_seqs);
    return K3_EINVAL;
  }
  k3_seq_t **seqs = malloc((size_t)n * sizeof *seqs);
  if (!seqs) return K3_ENOMEM;
  int rc = 0;
  int64_t most = 0;
  for (int i = 0; i < n && !rc; i++) {
    seqs[i] = items[i].seq;
    if (items[i].n_tokens < 1 || !items[i].tokens) {
      rn_seterr(err, errlen, "runner: item %d: n_tokens %lld (>= 1 needed)", i, (long long)items[i].n_tokens);
      rc = K3_EINVAL;
    }
    if (!rc) rc = check_seq(r, items[i].seq, items[i].n_tokens, err, errlen, i);
    if (!rc) rc = check_tokens(r, items[i].tokens, items[i].n_tokens, i, err, errlen);
    if (!rc && items[i].n_tokens > most) most = items[i].n_tokens;
  }
  if (!rc) rc = check_distinct(seqs, n, err, errlen);
  if (rc) {
    free(seqs);
    return rc;
  }
  for (int i = 0; i < n; i++) zero_fresh_slot(r, items[i].seq);
  const int64_t C = r->opts.prefill_chunk_tokens, V = r->cfg.vocab_size;
  const int64_t rounds = (most + C - 1) / C;
  int64_t maxT = (int64_t)n * C;
  rn_pass_t ps = {0};
  ps.seq = malloc((size_t)n * sizeof *ps.seq);
  ps.off = malloc((size_t)(n + 1) * sizeof *ps.off);
  ps.pos0 = malloc((size_t)n * sizeof *ps.pos0);
  int32_t *tok = malloc((size_t)maxT * 4);
  float **dst = calloc((size_t)maxT, sizeof *dst);
  if (!ps.seq || !ps.off || !ps.pos0 || !tok || !dst) rc = K3_ENOMEM;
  for (int64_t k = 0; k < rounds && !rc; k++) {
    int ns = 0;
    int64_t t = 0;
    ps.off[0] = 0;
    for (int i = 0; i < n; i++) {
      const k3_prefill_item_t *it = &items[i];
      int64_t b = k * C, e = b + C < it->n_tokens ? b + C : it->n_tokens;
      if (e <= b) continue;
      ps.seq[ns] = it->seq;
      ps.pos0[ns] = it->seq->len;
      for (int64_t j = b; j < e; j++, t++) {
        tok[t] = it->tokens[j];
        dst[t] = NULL;
        if (it->logits && it->all_logits) dst[t] = it->logits + j * V;
        else if (it->logits && j == it->n_tokens - 1) dst[t] = it->logits;
      }
      ps.off[++ns] = (int32_t)t;
    }
    ps.n_seq = ns;
    ps.n_tok = t;
    ps.tok = tok;
    ps.decode = false;
    rc = rn_forward(r, &ps, dst, on_layer_done, cb_ctx, k == rounds - 1, err, errlen);
    for (int i = 0; i < ns && !rc; i++) ps.seq[i]->len += ps.off[i + 1] - ps.off[i];
  }
  free(ps.seq);
  free(ps.off);
  free(ps.pos0);
  free(tok);
  free(dst);
  free(seqs);
  return rc;
}

int k3_runner_decode_step(k3_runner_t *r, k3_decode_item_t *items, int n, char *err,
                          size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!items || n <= 0 || n > r->opts.max_batch_seqs) {
    rn_seterr(err, errlen, "runner: decode of %d items (1..%d allowed)", n, r->opts.max_batch_seqs);
    return K3_EINVAL;
  }
  rn_pass_t ps = {0};
  ps.seq = malloc((size_t)n * sizeof *ps.seq);
  ps.off = malloc((size_t)(n + 1) * sizeof *ps.off);
  ps.pos0 = malloc((size_t)n * sizeof *ps.pos0);
  int32_t *tok = malloc((size_t)n * 4);
  float **dst = calloc((size_t)n, sizeof *dst);
  int rc = (!ps.seq || !ps.off || !ps.pos0 || !tok || !dst) ? K3_ENOMEM : 0;
  for (int i = 0; i < n && !rc; i++) {
    rc = check_seq(r, items[i].seq, 1, err, errlen, i);
    if (!rc) rc = check_tokens(r, &items[i].token, 1, i, err, errlen);
    if (rc) break;
    ps.seq[i] = items[i].seq;
    ps.pos0[i] = items[i].seq->len;
    ps.off[i] = i;
    tok[i] = items[i].token;
    dst[i] = items[i].logits;
  }
  if (!rc) rc = check_distinct(ps.seq, n, err, errlen);
  if (!rc) {
    for (int i = 0; i < n; i++) zero_fresh_slot(r, items[i].seq);
    ps.off[n] = n;
    ps.n_seq = n;
    ps.n_tok = n;
    ps.tok = tok;
    ps.decode = true;
    /* Sampling inside the step (k3_decode_item_t.sample): on the device when every item asks
     * for it and none for logits (rn_gd_decode), else on the host from each row's logits. */
    bool all_sample = true, any_sample = false;
    for (int i = 0; i < n; i++) {
      bool sm = items[i].sample && items[i].sampled;
      all_sample &= sm && !items[i].logits;
      any_sample |= sm;
    }
    const char *ds = getenv("K3PD_DEVICE_SAMPLE");
    bool dev_sample = r->gd && all_sample && !(ds && !strcmp(ds, "0"));
    k3k_sample_cfg_t *cfgs = NULL;
    int32_t *ids = NULL;
    float *tmp = NULL;
    if (dev_sample) {
      cfgs = malloc((size_t)n * sizeof *cfgs);
      ids = malloc((size_t)n * sizeof *ids);
      if (!cfgs || !ids) rc = K3_ENOMEM;
      for (int i = 0; i < n && !rc; i++) cfgs[i] = *items[i].sample;
    } else if (any_sample) { /* rows sampled on the host need their logits */
      for (int i = 0; i < n && !rc; i++)
        if (items[i].sample && items[i].sampled && !dst[i]) {
          if (!tmp && !(tmp = malloc((size_t)n * (size_t)k3_runner_vocab(r) * sizeof(float)))) rc = K3_ENOMEM;
          if (tmp) dst[i] = tmp + (size_t)i * (size_t)k3_runner_vocab(r);
        }
    }
    if (!rc)
      rc = r->gd ? rn_gd_decode(r, &ps, dst, dev_sample ? cfgs : NULL, ids, err, errlen)
                 : rn_forward(r, &ps, dst, NULL, NULL, false, err, errlen);
    for (int i = 0; i < n && !rc && any_sample; i++) {
      if (!items[i].sample || !items[i].sampled) continue;
      if (dev_sample) {
        *items[i].sampled = ids[i];
      } else {
        rc = k3k_sample_row(dst[i], k3_runner_vocab(r), items[i].sample, items[i].sampled);
        if (rc) rn_seterr(err, errlen, "runner: sampling row %d failed: %s", i, k3_strerror(rc));
      }
    }
    free(cfgs);
    free(ids);
    free(tmp);
    for (int i = 0; i < n && !rc; i++) items[i].seq->len += 1;
  }
  free(ps.seq);
  free(ps.off);
  free(ps.pos0);
  free(tok);
  free(dst);
  return rc;
}
