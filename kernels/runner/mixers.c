/* The two token mixers of the stack, as sequences of k3k ops: KDA (spec §3; 48B §3) and MLA
 * (spec §4; 48B §4). Shapes: T packed rows, H hidden, P = NH*DK (KDA), c = kv_lora_rank,
 * Dr = rope dims, Dn/Dv = MLA head dims. Activation dtype `act` is F32 or BF16 (the bf16
 * rounding points); fp32 islands are F32 regardless of the mode.
 * Prefill and decode share the projections; they differ in the conv (prefill vs step), the KDA
 * core (chunked WY form vs recurrent step) and MLA attention (non-absorbed over the gathered
 * context latents vs absorbed over the pages). */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "runner_internal.h"

#define TRY(x)                   \
  do {                           \
    int rc_ = (x);               \
    if (rc_) return rc_;         \
  } while (0)

int rn_kda_forward(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, int ki, const rn_pass_t *ps,
                   const k3k_tensor_t *x, const k3k_tensor_t *out) {
  const k3_model_config_t *c = &r->cfg;
  k3k_backend_t *be = r->be;
  const int64_t T = ps->n_tok, P = c->kda_proj_dim, NH = c->kda_num_heads, DK = c->kda_head_dim;
  const k3k_dtype_t A = r->act;
  /* projections [T,P] (bf16 GEMM outputs in bf16 mode) */
  k3k_tensor_t lin[3] = {rn_buf(ws, A, T, P), rn_buf(ws, A, T, P), rn_buf(ws, A, T, P)};
  k3k_tensor_t fa = rn_buf(ws, A, T, DK), graw = rn_buf(ws, A, T, P);
  k3k_tensor_t braw = rn_buf(ws, A, T, NH), z = rn_buf(ws, A, T, P);
  k3k_tensor_t on = rn_buf(ws, A, T, P);
  if (ws->rc) return ws->rc;
  /* fused decode on the GPU: the small, latency-bound decay-gate and beta projections run on
   * the side stream beside the bandwidth-bound q/k/v/g projections (same results) */
  const bool side = ps->decode && r->kda_fused && rn_dev_side_ok(r, T);
  if (side) {
    const k3k_tensor_t *sx[3] = {x, &fa, x}, *sw[3] = {&L->fa, &L->fb, &L->b};
    const k3k_tensor_t *sy[3] = {&fa, &graw, &braw};
    TRY(rn_dev_side_gemms(r, 3, sx, sw, sy));
  }
  /* q/k/v (and the full-rank gate) read the same x: one launch on the GPU at decode sizes */
  const bool fr = c->use_full_rank_gate;
  const k3k_tensor_t *pw[4] = {&L->q, &L->k, &L->v, &L->g};
  const k3k_tensor_t *py[4] = {&lin[0], &lin[1], &lin[2], &z};
  const k3k_gemm_multi_params_t gm = {.n = fr ? 4 : 3};
  TRY(k3k_gemm_multi(be, &gm, x, pw, py));
  if (!side) {
    TRY(k3k_gemm(be, x, &L->fa, &fa));
    TRY(k3k_gemm(be, &fa, &L->fb, &graw));
    TRY(k3k_gemm(be, x, &L->b, &braw));
  }
  if (!fr) {
    k3k_tensor_t za = rn_buf(ws, A, T, DK);
    if (ws->rc) return ws->rc;
    TRY(k3k_gemm(be, x, &L->ga, &za));
    TRY(k3k_gemm(be, &za, &L->gb, &z));
  }
  if (ps->decode && r->kda_fused) { /* everything up to o_proj in one launch (kda_device.c) */
    if (side) TRY(rn_dev_side_wait(r, 1));
    TRY(rn_dev_kda_decode(r, L, ki, ps, lin, &graw, &braw, &z, &on));
    return k3k_gemm(be, &on, &L->o, out);
  }
  k3k_tensor_t conv[3] = {rn_buf(ws, A, T, P), rn_buf(ws, A, T, P), rn_buf(ws, A, T, P)};
  k3k_tensor_t qn = rn_buf(ws, K3K_F32, T, P), kn = rn_buf(ws, K3K_F32, T, P);
  k3k_tensor_t g = rn_buf(ws, K3K_F32, T, P), beta = rn_buf(ws, K3K_F32, T, NH);
  k3k_tensor_t o = rn_buf(ws, A, T, P);
  if (ws->rc) return ws->rc;
  /* causal short conv + SiLU per sequence, with the slot's conv state (§3.2) */
  k3k_conv_params_t cp = {.n_seqs = ps->n_seq, .read_state = 1, .activation = 1};
  for (int j = 0; j < 3; j++) {
    if (ps->decode)
      TRY(k3k_conv_step(be, &cp, &lin[j], &L->conv[j], &ps->slots, &r->kda_conv[ki][j], &conv[j]));
    else
      TRY(k3k_conv_prefill(be, &cp, &lin[j], &L->conv[j], &ps->cu, &ps->slots, &r->kda_conv[ki][j],
                           &conv[j]));
  }
  /* per-head L2 norm of q, k (fp32, §3.3; q's 128^-0.5 is applied inside the KDA op) */
  k3k_l2norm_params_t lp = {.head_dim = (int32_t)DK, .eps = (float)c->eps_kda_l2, .scale = 1.0f};
  TRY(k3k_l2norm(be, &lp, &conv[0], &qn));
  TRY(k3k_l2norm(be, &lp, &conv[1], &kn));
  /* decay gate and beta (fp32, §3.4/§3.5) */
  k3k_kda_gate_params_t gp = {
      .form = c->kda_gate == K3_KDA_GATE_LOWER_BOUND ? K3K_GATE_LOWER_BOUND : K3K_GATE_SOFTPLUS,
      .head_dim = (int32_t)DK,
      .lower_bound = (float)c->gate_lower_bound};
  TRY(k3k_kda_gate(be, &gp, &graw, &L->a_log, &L->dt_bias, &g));
  TRY(k3k_sigmoid(be, &braw, &beta));
  /* delta-rule core with the slot's S (V-first) */
  k3k_kda_params_t kp = {.n_seqs = ps->n_seq, .n_heads = (int32_t)NH, .read_state = 1};
  if (ps->decode)
    TRY(k3k_kda_step(be, &kp, &qn, &kn, &conv[2], &g, &beta, &ps->slots, &r->kda_S[ki], &o));
  else
    TRY(k3k_kda_chunk(be, &kp, &qn, &kn, &conv[2], &g, &beta, &ps->cu, &ps->slots, &r->kda_S[ki],
                      &o));
  /* gated o_norm (§3.7) and o_proj */
  k3k_gated_rmsnorm_params_t np = {.head_dim = (int32_t)DK, .eps = (float)c->eps_norm};
  TRY(k3k_gated_rmsnorm(be, &np, &o, &z, &L->o_norm, &on));
  return k3k_gemm(be, &on, &L->o, out);
}

/* Flattened cache row index (page * page_tokens + offset) of absolute position pos. */
int32_t rn_cache_slot(const k3_runner_t *r, const k3_seq_t *s, int64_t pos) {
  int pt = r->opts.page_tokens;
  return s->pages[pos / pt] * pt + (int32_t)(pos % pt);
}

int rn_mla_forward(k3_runner_t *r, rn_ws_t *ws, const rn_layer_t *L, int mi, const rn_pass_t *ps,
                   const k3k_tensor_t *x, const k3k_tensor_t *out) {
  const k3_model_config_t *c = &r->cfg;
  k3k_backend_t *be = r->be;
  const int64_t T = ps->n_tok, NH = c->num_heads, DN = c->qk_nope_head_dim;
  const int64_t DR = c->qk_rope_head_dim, DV = c->v_head_dim, CL = c->kv_lora_rank;
  const int64_t CD = c->mla_cache_dim, QD = NH * (DN + DR);
  const k3k_dtype_t A = r->act;
  k3k_rmsnorm_params_t lora_np = {.eps = (float)c->eps_mla_lora, .bf16_inner = r->bf16};
  k3k_tensor_t q = rn_buf(ws, A, T, QD), ckv = rn_buf(ws, A, T, CD);
  k3k_tensor_t craw = rn_buf(ws, A, T, CL), cn = rn_buf(ws, A, T, CL), krot = rn_buf(ws, A, T, DR);
  k3k_tensor_t o = rn_buf(ws, A, T, NH * DV);
  k3k_tensor_t gg = c->mla_use_output_gate ? rn_buf(ws, A, T, NH * DV) : o;
  if (ws->rc) return ws->rc;
  /* device decode: the output gate's projection (as many bytes as o_proj) runs on the side
   * stream beside the latency-bound q/kv/attention chain (same results) */
  const bool side = ps->dev && c->mla_use_output_gate && rn_dev_side_ok(r, T);
  if (side) {
    const k3k_tensor_t *sx[1] = {x}, *sw[1] = {&L->mg}, *sy[1] = {&gg};
    TRY(rn_dev_side_gemms(r, 1, sx, sw, sy));
  }
  /* q path (§4.1): q-LoRA with its own 1e-6 RMSNorm (K3) or a single q_proj (48B) */
  if (c->q_lora_rank > 0) {
    k3k_tensor_t qa = rn_buf(ws, A, T, c->q_lora_rank), qan = rn_buf(ws, A, T, c->q_lora_rank);
    if (ws->rc) return ws->rc;
    TRY(k3k_gemm(be, x, &L->qa, &qa));
    TRY(k3k_rmsnorm(be, &lora_np, &qa, &L->qa_ln, &qan));
    TRY(k3k_gemm(be, &qan, &L->qb, &q));
  } else {
    TRY(k3k_gemm(be, x, &L->qp, &q));
  }
  /* latent: ckv = [c | k_rot]; c_n = RMSNorm(c) (1e-6); cache row = [c_n | k_rot] */
  TRY(k3k_gemm(be, x, &L->kva, &ckv));
  k3k_tensor_t cv = k3k_tensor_slice(&ckv, 1, 0, CL), rv = k3k_tensor_slice(&ckv, 1, CL, DR);
  TRY(k3k_copy(be, &cv, &craw));
  TRY(k3k_copy(be, &rv, &krot));
  TRY(k3k_rmsnorm(be, &lora_np, &craw, &L->kva_ln, &cn));
  if (ps->dev) {
    /* device decode: cache rows, page tables and lengths were built on the host (graph.c) */
    TRY(rn_dev_cache_write(r, &cn, &krot, &ps->smap, &r->mla_cache[mi]));
  } else {
    int32_t *smap = malloc((size_t)T * sizeof *smap);
    if (!smap) return K3_ENOMEM;
    for (int s = 0; s < ps->n_seq; s++)
      for (int64_t t = ps->off[s]; t < ps->off[s + 1]; t++)
        smap[t] = rn_cache_slot(r, ps->seq[s], ps->pos0[s] + (t - ps->off[s]));
    k3k_tensor_t smap_t = rn_i32(ws, smap, T);
    free(smap);
    if (ws->rc) return ws->rc;
    TRY(k3k_mla_cache_write(be, &cn, &krot, &smap_t, &r->mla_cache[mi]));
  }

  k3k_mla_params_t mp = {.n_seqs = ps->n_seq, .n_heads = (int32_t)NH, .d_nope = (int32_t)DN,
                         .d_rope = (int32_t)DR, .d_v = (int32_t)DV, .kv_lora = (int32_t)CL};
  if (ps->dev) {
    mp.max_seqlen_q = 1;
    mp.max_seqlen_k = ps->max_k;
    TRY(k3k_mla_decode(be, &mp, &q, &L->kvb, &r->mla_cache[mi], &ps->pt, &ps->lens, &o));
  } else if (ps->decode) {
    /* absorbed decode over the pages (§4.3); the current token is already in the cache */
    int maxp = 1;
    for (int s = 0; s < ps->n_seq; s++) {
      int np = k3_runner_pages_for(r, ps->pos0[s] + 1);
      if (np > maxp) maxp = np;
    }
    int32_t *pt = calloc((size_t)ps->n_seq * (size_t)maxp, sizeof *pt);
    int32_t *lens = malloc((size_t)ps->n_seq * sizeof *lens);
    if (!pt || !lens) {
      free(pt);
      free(lens);
      return K3_ENOMEM;
    }
    for (int s = 0; s < ps->n_seq; s++) {
      int np = k3_runner_pages_for(r, ps->pos0[s] + 1);
      memcpy(pt + (size_t)s * maxp, ps->seq[s]->pages, (size_t)np * sizeof *pt);
      lens[s] = (int32_t)(ps->pos0[s] + 1);
      if (lens[s] > mp.max_seqlen_k) mp.max_seqlen_k = lens[s];
    }
    mp.max_seqlen_q = 1;
    k3k_tensor_t ptt = rn_i32(ws, pt, (int64_t)ps->n_seq * maxp);
    k3k_tensor_t lt = rn_i32(ws, lens, ps->n_seq);
    free(pt);
    free(lens);
    if (ws->rc) return ws->rc;
    ptt = k3k_tensor_2d(be, K3K_I32, ptt.data, ps->n_seq, maxp);
    TRY(k3k_mla_decode(be, &mp, &q, &L->kvb, &r->mla_cache[mi], &ptt, &lt, &o));
  } else {
    /* non-absorbed prefill over the whole context (prefix pages + this chunk): gather the
     * latents, up-project with kv_b_proj, bottom-right causal attention (§4.1) */
    int64_t nk = 0;
    for (int s = 0; s < ps->n_seq; s++) nk += ps->pos0[s] + (ps->off[s + 1] - ps->off[s]);
    int32_t *gmap = malloc((size_t)nk * sizeof *gmap), *cuk = malloc((size_t)(ps->n_seq + 1) * 4);
    if (!gmap || !cuk) {
      free(gmap);
      free(cuk);
      return K3_ENOMEM;
    }
    int64_t k = 0;
    cuk[0] = 0;
    for (int s = 0; s < ps->n_seq; s++) {
      int64_t lq = ps->off[s + 1] - ps->off[s], lk = ps->pos0[s] + lq;
      for (int64_t p = 0; p < lk; p++) gmap[k++] = rn_cache_slot(r, ps->seq[s], p);
      cuk[s + 1] = (int32_t)k;
      if (lq > mp.max_seqlen_q) mp.max_seqlen_q = (int32_t)lq;
      if (lk > mp.max_seqlen_k) mp.max_seqlen_k = (int32_t)lk;
    }
    k3k_tensor_t gm = rn_i32(ws, gmap, nk), cukt = rn_i32(ws, cuk, ps->n_seq + 1);
    free(gmap);
    free(cuk);
    k3k_tensor_t lat = rn_buf(ws, r->sdt, nk, CD), latc = rn_buf(ws, A, nk, CL);
    k3k_tensor_t latr = rn_buf(ws, A, nk, DR), kv = rn_buf(ws, A, nk, NH * (DN + DV));
    if (ws->rc) return ws->rc;
    TRY(k3k_mla_cache_gather(be, &r->mla_cache[mi], &gm, &lat));
    k3k_tensor_t lc = k3k_tensor_slice(&lat, 1, 0, CL), lr = k3k_tensor_slice(&lat, 1, CL, DR);
    TRY(k3k_copy(be, &lc, &latc));
    TRY(k3k_copy(be, &lr, &latr));
    TRY(k3k_gemm(be, &latc, &L->kvb, &kv));
    TRY(k3k_mla_prefill(be, &mp, &q, &kv, &latr, &ps->cu, &cukt, &o));
  }
  /* sigmoid output gate from the same normed x (K3, §4.1), then o_proj */
  if (c->mla_use_output_gate) {
    k3k_tensor_t og = rn_buf(ws, A, T, NH * DV);
    if (ws->rc) return ws->rc;
    k3k_sigmoid_mul_params_t sp = {.bf16_inner = r->bf16};
    if (side)
      TRY(rn_dev_side_wait(r, 1));
    else
      TRY(k3k_gemm(be, x, &L->mg, &gg));
    TRY(k3k_sigmoid_mul(be, &sp, &o, &gg, &og));
    return k3k_gemm(be, &og, &L->mo, out);
  }
  return k3k_gemm(be, &o, &L->mo, out);
}
