/* The decode step on a "cuda" backend: metadata built once on the host, trusted ids, and CUDA
 * graph capture/replay per (batch size, context bucket) (k3_runner.h "CUDA decode").
 *
 * What it is for: k3_runner_decode_step calls rn_gd_decode instead of rn_forward when rn_gd_init
 * enabled it. One host block holds every id of the step (token ids, slots, cu_seqlens, MLA cache
 * rows, lengths, page tables), validated by the entry point (tokens in the vocabulary, slots and
 * pages allocated, distinct sequences) and uploaded with ONE copy into a fixed device buffer; the
 * backend's id checks are off for the pass (k3k_cuda_set_trusted_ids) and the two ops that check
 * by themselves (GET_ROWS, MLA_CACHE_WRITE) are replaced by the raw copies of runner_raw.cu, so
 * the whole step up to the logits is host-synchronisation-free and capturable.
 * Key: (n sequences, context bucket). The bucket (smallest page_tokens * 2^k >= the longest
 * sequence) fixes the page-table width and the MLA_DECODE max_seqlen_k hint for eager steps and
 * replays alike, so both launch the same kernels with the same arguments: bit-identical logits.
 * Life of a key: first step eager (if the workspace fit, the key becomes "warm"), second step
 * captured and launched, later steps replayed. A graph is dropped when the workspace arena or
 * the backend's scratch memory moved since its capture (ws.gen / ctx mem_gen). A capture that
 * fails (an op that synchronises or allocates) is abandoned, logged once, and the key stays
 * eager. At most RN_GRAPHS graphs, least recently used replaced.
 * What it is not: a scheduler or a batcher; no padding of batches (each batch size has its own
 * graphs). Prefill stays on rn_forward (its MLA prefill op reads sequence bounds on the host).
 * Invariants: the metadata buffer is rewritten only after the previous step finished (each step
 * ends with a synchronisation: its logits are copied to the host). */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "k3k_cuda.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "runner_internal.h"

#define RN_GRAPHS 16

enum { G_EMPTY = 0, G_WARM, G_READY, G_FAILED };

typedef struct {
  int n, ctxb, state;
  void *exec; /* the backend's graph handle (k3k_backend_graph) */
  uint64_t ws_gen, mem_gen, used;
  k3k_tensor_t lg; /* the captured step's logits buffer (workspace arena) */
} rn_gent_t;

struct rn_gd {
  int32_t *hmeta;   /* host staging of the metadata block, meta_ints */
  void *dmeta;      /* its fixed device copy */
  void *dids;       /* sampled ids of one step (device sampling), max_batch_seqs int32: a
                     * buffer of its own, never the workspace arena a replayed graph owns */
  size_t meta_ints;
  int maxp_cap;     /* widest page table: the whole page pool */
  float *hlog;      /* host staging of the logits of one step, max_batch_seqs x vocab */
  bool pinned;      /* hmeta and hlog are page-locked (cudaMallocHost): the per-step metadata
                     * upload and logits download run at DMA speed, not through the driver's
                     * staging copy (medium preset: 655 KB of logits per token) */
  rn_gent_t ent[RN_GRAPHS];
  uint64_t tick;
  bool warned;
};

/* Offsets (in int32) of the parts of one step's metadata block; each part 64-byte aligned. */
typedef struct {
  size_t ids, slots, cu, smap, lens, pt, total;
} meta_off_t;

static size_t a16(size_t x) { return (x + 15) & ~(size_t)15; }

static meta_off_t layout(int n, int maxp) {
  meta_off_t o;
  o.ids = 0;
  o.slots = a16((size_t)n);
  o.cu = o.slots + a16((size_t)n);
  o.smap = o.cu + a16((size_t)n + 1);
  o.lens = o.smap + a16((size_t)n);
  o.pt = o.lens + a16((size_t)n);
  o.total = o.pt + (size_t)n * (size_t)maxp;
  return o;
}

void rn_trust(k3_runner_t *r, bool on) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(r->be);
  if (cx) {
    k3k_cuda_set_trusted_ids(cx, on);
    /* every GEMM of a pass reads uploaded weights: the skinny GEMM may start streaming them
     * before the previous kernel ends (PDL, gemv.h) */
    k3k_cuda_gemv_const_weights(on);
  }
}

int rn_dev_gather(k3_runner_t *r, const k3k_tensor_t *table, const k3k_tensor_t *ids,
                  const k3k_tensor_t *y) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(r->be);
  return k3k_cu_gather_rows_u16(k3k_cuda_stream(cx), table->data, table->stride[0], ids->data,
                                ids->shape[0], table->shape[1], y->data, y->stride[0]);
}

int rn_dev_cache_write(k3_runner_t *r, const k3k_tensor_t *cn, const k3k_tensor_t *krot,
                       const k3k_tensor_t *smap, const k3k_tensor_t *cache) {
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(r->be);
  return k3k_cu_cache_write_u16(k3k_cuda_stream(cx), cn->data, cn->stride[0], krot->data,
                                krot->stride[0],
                                smap->data, smap->shape[0], cn->shape[1], krot->shape[1],
                                cache->data);
}

static void host_free(struct rn_gd *g) {
  if (g->pinned) {
    if (g->hmeta) cudaFreeHost(g->hmeta);
    if (g->hlog) cudaFreeHost(g->hlog);
  } else {
    free(g->hmeta);
    free(g->hlog);
  }
  g->hmeta = NULL;
  g->hlog = NULL;
}

int rn_gd_init(k3_runner_t *r, char *err, size_t errlen) {
  const k3_model_config_t *c = &r->cfg;
  if (!k3k_cuda_ctx_of(r->be) || !r->bf16 || r->embed.dtype != K3K_BF16) return 0;
  for (int l = 0; l < c->num_layers; l++)
    if (r->layers[l].moe && !r->layers[l].etab.data) {
      K3_INFO("runner: MoE experts on per-expert ops (host plan): decode steps not captured");
      return 0;
    }
  for (int i = 0; i < r->n_mla; i++)
    if (!k3k_tensor_is_contiguous(&r->mla_cache[i]) || r->mla_cache[i].dtype != K3K_BF16) return 0;
  struct rn_gd *g = calloc(1, sizeof *g);
  if (!g) return K3_ENOMEM;
  const int B = r->opts.max_batch_seqs;
  g->maxp_cap = r->opts.num_pages > 0 ? r->opts.num_pages : 1;
  g->meta_ints = 5 * ((size_t)B + 16) + (size_t)B * (size_t)g->maxp_cap + 16;
  const size_t lbytes = (size_t)B * (size_t)c->vocab_size * 4;
  void *hm = NULL, *hl = NULL;
  if (cudaMallocHost(&hm, g->meta_ints * 4) == cudaSuccess &&
      cudaMallocHost(&hl, lbytes) == cudaSuccess) {
    g->hmeta = hm, g->hlog = hl, g->pinned = true;
  } else { /* no page-locked memory: ordinary (slower) staging */
    (void)cudaGetLastError();
    if (hm) cudaFreeHost(hm);
    K3_WARN("runner: no page-locked host memory for the decode staging; using pageable memory");
    g->hmeta = malloc(g->meta_ints * 4);
    g->hlog = malloc(lbytes);
  }
  int rc = g->hmeta && g->hlog ? 0 : K3_ENOMEM;
  if (!rc) rc = r->be->alloc(r->be, g->meta_ints * 4, &g->dmeta);
  if (!rc) rc = r->be->alloc(r->be, (size_t)B * 4 + 64, &g->dids);
  if (rc) {
    rn_seterr(err, errlen, "runner: no memory for the decode metadata (%zu ids)", g->meta_ints);
    if (g->dmeta) r->be->free(r->be, g->dmeta);
    host_free(g);
    free(g);
    return rc;
  }
  r->gd = g;
  return 0;
}

void rn_gd_drop(k3_runner_t *r) {
  struct rn_gd *g = r->gd;
  if (!g) return;
  if (r->be->synchronize) (void)r->be->synchronize(r->be); /* a replay may still run */
  for (int i = 0; i < RN_GRAPHS; i++) {
    (void)k3k_backend_graph(r->be, K3K_GRAPH_FREE, &g->ent[i].exec);
    memset(&g->ent[i], 0, sizeof g->ent[i]);
  }
}

void rn_gd_free(k3_runner_t *r) {
  struct rn_gd *g = r->gd;
  if (!g) return;
  rn_gd_drop(r);
  if (g->dmeta) r->be->free(r->be, g->dmeta);
  if (g->dids) r->be->free(r->be, g->dids);
  host_free(g);
  free(g);
  r->gd = NULL;
}

static rn_gent_t *find(struct rn_gd *g, int n, int ctxb) {
  for (int i = 0; i < RN_GRAPHS; i++)
    if (g->ent[i].state != G_EMPTY && g->ent[i].n == n && g->ent[i].ctxb == ctxb) return &g->ent[i];
  return NULL;
}

/* An entry for a new key: an empty one, else the least recently used (its graph destroyed). */
static rn_gent_t *take(k3_runner_t *r, struct rn_gd *g, int n, int ctxb) {
  rn_gent_t *e = &g->ent[0];
  for (int i = 0; i < RN_GRAPHS; i++) {
    if (g->ent[i].state == G_EMPTY) {
      e = &g->ent[i];
      break;
    }
    if (g->ent[i].used < e->used) e = &g->ent[i];
  }
  (void)k3k_backend_graph(r->be, K3K_GRAPH_FREE, &e->exec);
  memset(e, 0, sizeof *e);
  e->n = n;
  e->ctxb = ctxb;
  return e;
}

/* Captures the step into e's graph and launches it. Returns 0 (launched; *lg set), 1 when the
 * capture was abandoned (nothing ran; the caller runs the step eagerly), or K3_EDEVICE. */
static int capture(k3_runner_t *r, rn_gent_t *e, rn_ws_t *ws, rn_pass_t *ps, k3k_tensor_t *lg,
                   char *err, size_t errlen) {
  struct rn_gd *g = r->gd;
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(r->be);
  const uint64_t mg = k3k_cuda_mem_gen(cx);
  const int brc = k3k_backend_graph(r->be, K3K_GRAPH_BEGIN, NULL);
  int rc = brc;
  if (!rc) rc = rn_forward_enqueue(r, ws, ps, NULL, ps->n_tok, NULL, NULL, false, lg, err, errlen);
  void *exec = NULL;
  const int erc = brc ? brc : k3k_backend_graph(r->be, K3K_GRAPH_END, &exec);
  const bool ok = !rc && !erc && exec && ws->extras_taken == 0 && k3k_cuda_mem_gen(cx) == mg;
  if (!ok) {
    (void)k3k_backend_graph(r->be, K3K_GRAPH_FREE, &exec);
    if (!g->warned)
      K3_WARN("runner: CUDA graph capture of the decode step (batch %d, context bucket %d) "
              "abandoned (pass: %s, capture: %s%s); that key runs eagerly", e->n, e->ctxb,
              k3_strerror(rc), k3_strerror(erc),
              ws->extras_taken || k3k_cuda_mem_gen(cx) != mg ? ", memory moved" : "");
    g->warned = true;
    e->state = G_FAILED;
    r->stats.capture_failures++;
    if (err && errlen) err[0] = 0;
    return 1;
  }
  e->exec = exec;
  e->state = G_READY;
  e->ws_gen = ws->gen;
  e->mem_gen = k3k_cuda_mem_gen(cx);
  e->lg = *lg;
  r->stats.graph_captures++;
  if ((rc = k3k_backend_graph(r->be, K3K_GRAPH_LAUNCH, &e->exec))) {
    rn_seterr(err, errlen, "runner: graph launch failed: %s", k3_strerror(rc));
    return rc;
  }
  return 0;
}

/* Host metadata of the step into g->hmeta, uploaded; ps->dev views set. Returns the key. */
static int build_meta(k3_runner_t *r, rn_pass_t *ps, int *ctxb_out) {
  struct rn_gd *g = r->gd;
  k3k_backend_t *be = r->be;
  const int n = ps->n_seq, pt = r->opts.page_tokens;
  int64_t maxlen = 1;
  for (int s = 0; s < n; s++)
    if (ps->pos0[s] + 1 > maxlen) maxlen = ps->pos0[s] + 1;
  int ctxb = 0, maxp = 1;
  if (r->n_mla > 0) {
    int64_t b = pt, cap = (int64_t)g->maxp_cap * pt;
    while (b < maxlen && b < cap) b *= 2;
    if (b > cap) b = cap; /* maxlen <= cap: check_seq found the pages in the pool */
    ctxb = (int)b;
    maxp = (int)((b + pt - 1) / pt);
  }
  meta_off_t o = layout(n, maxp);
  if (o.total > g->meta_ints) return K3_EINTERNAL;
  int32_t *h = g->hmeta;
  memset(h, 0, o.total * 4);
  for (int s = 0; s < n; s++) {
    const k3_seq_t *q = ps->seq[s];
    h[o.ids + s] = ps->tok[s];
    h[o.slots + s] = q->slot < 0 ? 0 : q->slot;
    h[o.cu + s] = s;
    h[o.lens + s] = (int32_t)(ps->pos0[s] + 1);
    if (r->n_mla > 0) {
      h[o.smap + s] = rn_cache_slot(r, q, ps->pos0[s]);
      int np = k3_runner_pages_for(r, ps->pos0[s] + 1);
      memcpy(h + o.pt + (size_t)s * maxp, q->pages, (size_t)np * 4); /* rest: page 0, unread */
    } else {
      h[o.smap + s] = -1;
    }
  }
  h[o.cu + n] = n;
  int rc = be->copy_from_host(be, g->dmeta, h, o.total * 4);
  if (rc) return rc;
  int32_t *d = g->dmeta;
  ps->ids = k3k_tensor_1d(be, K3K_I32, d + o.ids, n);
  ps->slots = k3k_tensor_1d(be, K3K_I32, d + o.slots, n);
  ps->cu = k3k_tensor_1d(be, K3K_I32, d + o.cu, n + 1);
  ps->smap = k3k_tensor_1d(be, K3K_I32, d + o.smap, n);
  ps->lens = k3k_tensor_1d(be, K3K_I32, d + o.lens, n);
  ps->pt = k3k_tensor_2d(be, K3K_I32, d + o.pt, n, maxp);
  ps->max_k = ctxb;
  ps->dev = true;
  *ctxb_out = ctxb;
  return 0;
}

int rn_gd_decode(k3_runner_t *r, rn_pass_t *ps, float *const *row_dst, const k3k_sample_cfg_t *sample_cfgs,
                 int32_t *sampled_ids, char *err, size_t errlen) {
  struct rn_gd *g = r->gd;
  k3k_backend_t *be = r->be;
  k3k_cuda_ctx *cx = k3k_cuda_ctx_of(be);
  const int n = ps->n_seq;
  const int64_t V = r->cfg.vocab_size;
  int ctxb = 0;
  int rc = build_meta(r, ps, &ctxb);
  if (rc) {
    rn_seterr(err, errlen, "runner: decode metadata upload failed: %s", k3_strerror(rc));
    return rc;
  }
  rn_trust(r, true);
  rn_ws_t *ws = rn_ws_begin(r);
  k3k_tensor_t lg = {0};
  rn_gent_t *e = find(g, n, ctxb);
  if (e && e->state == G_READY && (e->ws_gen != ws->gen || e->mem_gen != k3k_cuda_mem_gen(cx))) {
    (void)k3k_backend_graph(be, K3K_GRAPH_FREE, &e->exec); /* stale pointers: recapture */
    e->state = G_WARM;
    e = NULL;
  }
  bool ran = false;
  if (!r->graphs_off && e && e->state == G_READY) {
    lg = e->lg;
    if ((rc = k3k_backend_graph(be, K3K_GRAPH_LAUNCH, &e->exec)))
      rn_seterr(err, errlen, "runner: graph launch failed: %s", k3_strerror(rc));
    r->stats.graph_replays++;
    ran = true;
  } else if (!r->graphs_off && e && e->state == G_WARM) {
    rc = capture(r, e, ws, ps, &lg, err, errlen);
    if (rc == 1) { /* abandoned: nothing ran; start the pass again eagerly */
      rc = 0;
      rn_ws_end(ws);
      ws = rn_ws_begin(r);
    } else {
      ran = true;
    }
  }
  if (!ran && !rc) {
    rc = rn_forward_enqueue(r, ws, ps, NULL, n, NULL, NULL, false, &lg, err, errlen);
    r->stats.eager_steps++;
    if (!rc && !r->graphs_off && ws->extras_taken == 0 && ws->need <= ws->cap) {
      if (!e) e = find(g, n, ctxb);
      if (!e) e = take(r, g, n, ctxb);
      if (e->state == G_EMPTY) e->state = G_WARM;
    }
  }
  if (e) e->used = ++g->tick;
  if (!rc && sample_cfgs) {
    /* Sampled on the device: greedy rows are an argmax there, n ids come back (k3k.h SAMPLE:
     * the same pure function as k3k_sample_row). */
    k3k_tensor_t ids = k3k_tensor_1d(be, K3K_I32, g->dids, n);
    k3k_sample_params_t sp = {.n_rows = n, .rows = sample_cfgs};
    rc = k3k_sample(be, &sp, &lg, &ids);
    if (!rc) rc = be->copy_to_host(be, sampled_ids, ids.data, (size_t)n * 4);
    if (rc && err && !err[0]) rn_seterr(err, errlen, "runner: device sampling failed: %s", k3_strerror(rc));
  } else {
    if (!rc) rc = be->copy_to_host(be, g->hlog, lg.data, (size_t)n * (size_t)V * 4);
    for (int s = 0; s < n && !rc; s++)
      if (row_dst && row_dst[s]) memcpy(row_dst[s], g->hlog + (size_t)s * V, (size_t)V * 4);
  }
  if (!rc && be->synchronize) rc = be->synchronize(be);
  rn_trust(r, false);
  if (rc && err && !err[0]) rn_seterr(err, errlen, "runner: decode failed: %s", k3_strerror(rc));
  rn_ws_end(ws);
  return rc;
}
