/* Decode.Export: the cached state of a long-suffix hit, sent into a prefill worker's receive
 * reservation (docs/design.md "Long-suffix hits", docs/protocol.md "Long-suffix hits").
 *
 * At Reserve (cache.c) a hit whose suffix is too long to compute here pinned its entry in the
 * request (q->exp) and answered resume_tokens = p. The router then asks the prefill worker for a
 * receive reservation (PrepareResume) and passes its descriptor here: this file sends the
 * entry's MLA pages [0, p) and its KDA checkpoint slot from the runner's pools with k3_xfer —
 * the same path, digests, fencing (the prefill worker's epoch) and DONE/ACK as every handoff,
 * with the roles swapped — and answers when the prefill worker verified it (or the send failed).
 * An export holds a pin of its own on the entry until its send is over, so neither the
 * request's end nor eviction can free a slot or page being read.
 * Threads: the loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dc.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"

typedef struct {
  dc_worker_t *w;
  k3_rpc_call_t *call;      /* NULL once the caller went away */
  char id[129];
  dc_centry_t *e;           /* pinned by this export */
  uint32_t tokens;
  k3_xfer_desc_t *desc;
  k3_xfer_src_t *srcs;
  uint32_t *idx;            /* the entry's pages, then its slot */
  k3_xfer_send_t *send;
  uint64_t t0;
} dc_export_t;

static void export_free(dc_export_t *x) {
  if (x->e) dc_cache_unpin(x->w, x->e);
  k3_xfer_desc_free(x->desc);
  free(x->srcs);
  free(x->idx);
  free(x);
}

static void count(dc_worker_t *w, bool ok) {
  const char *o = ok ? "ok" : "failed";
  k3_metric_inc(w->m.cache_exports_total, &o);
}

static void on_export_cancel(k3_rpc_call_t *call, void *arg) {
  dc_export_t *x = arg;
  if (x->call != call) return;
  x->call = NULL;
  if (x->send) k3_xfer_send_cancel(x->send); /* its callback frees */
}

static void on_send_done(void *ud, const k3_xfer_send_result_t *res) {
  dc_export_t *x = ud;
  dc_worker_t *w = x->w;
  x->send = NULL;
  count(w, res->status == 0);
  double ms = (double)(k3_now_ns() - x->t0) / 1e6;
  if (res->status == 0) {
    K3_INFO("request %s: exported the cached state of %u tokens (%llu bytes, %s) in %.2f ms", x->id, x->tokens,
            (unsigned long long)res->bytes, k3_xfer_path_name(res->path), ms);
  } else {
    K3_WARN("request %s: export of the cached state failed after %.2f ms: %s", x->id, ms, k3_strerror(res->status));
  }
  if (x->call) {
    k3_rpc_call_t *c = x->call;
    x->call = NULL;
    if (res->status == 0) {
      K3pd__V1__ExportResponse r = K3PD__V1__EXPORT_RESPONSE__INIT;
      r.bytes_transferred = res->bytes;
      r.tokens = x->tokens;
      k3_rpc_call_reply(c, &r.base);
    } else {
      k3_rpc_call_finishf(c, k3_rpc_code_from_err(res->status), "sending the cached state: %s",
                          k3_strerror(res->status));
    }
  }
  export_free(x);
}

/* Sources: the entry's pages and slot in the runner's pools (every region, as the prefill
 * worker's sends address its own pools). */
static int build_srcs(dc_worker_t *w, dc_export_t *x) {
  const k3_manifest_t *m = w->manifest;
  const dc_centry_t *e = x->e;
  x->srcs = calloc(m->n ? m->n : 1, sizeof *x->srcs);
  x->idx = calloc((size_t)e->n_pages + 1, sizeof *x->idx);
  if (!x->srcs || !x->idx) return K3_ENOMEM;
  for (int i = 0; i < e->n_pages; i++) x->idx[i] = (uint32_t)e->pages[i];
  x->idx[e->n_pages] = (uint32_t)e->slot;
  for (size_t i = 0; i < m->n; i++) {
    void *base;
    size_t stride, cnt;
    int rc = k3_runner_pool_mem(w->runner, (int)i, &base, &stride, &cnt);
    if (rc) return rc;
    bool mla = m->regions[i].kind == K3_REGION_MLA_LATENT;
    x->srcs[i] = (k3_xfer_src_t){.base = base,
                                 .stride_bytes = stride,
                                 .idx = mla ? x->idx : x->idx + e->n_pages,
                                 .n_idx = mla ? (uint32_t)e->n_pages : 1,
                                 .unit_bytes = m->regions[i].bytes};
  }
  return 0;
}

static void on_export(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  dc_worker_t *w = user;
  const K3pd__V1__ExportRequest *rq = (const K3pd__V1__ExportRequest *)msg;
  char err[256];
  if (k3_rpc_validate_export_request(rq, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  dc_req_t *q = dc_req_find(w, rq->request_id);
  if (!q) {
    k3_rpc_call_finish(call, K3_RPC_FAILED_PRECONDITION, "request_id: no live reservation on this decode worker");
    return;
  }
  if (q->epoch != rq->epoch) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION, "epoch: %llu is not the reservation's live epoch",
                        (unsigned long long)rq->epoch);
    return;
  }
  if (!q->exp || q->state != DC_RESERVED) {
    k3_rpc_call_finish(call, K3_RPC_FAILED_PRECONDITION,
                       q->exp ? "request_id: the reservation already has its state"
                              : "request_id: the reservation planned no resume (resume_tokens 0)");
    return;
  }
  k3_xfer_desc_t *desc = NULL;
  if (k3_xfer_desc_decode(rq->descriptor.data, rq->descriptor.len, &desc, err, sizeof err)) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "descriptor: %s", err);
    return;
  }
  if (desc->fingerprint != w->fingerprint || desc->n_regions != w->manifest->n) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION,
                        "descriptor: model fingerprint %016llx (%u regions) differs from this worker's %016llx",
                        (unsigned long long)desc->fingerprint, desc->n_regions, (unsigned long long)w->fingerprint);
    k3_xfer_desc_free(desc);
    return;
  }
  dc_export_t *x = calloc(1, sizeof *x);
  if (!x) {
    k3_xfer_desc_free(desc);
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "decode worker out of memory");
    return;
  }
  x->w = w;
  x->call = call;
  x->desc = desc;
  x->e = q->exp;
  dc_cache_pin(w, x->e);
  x->tokens = q->exp->len;
  x->t0 = k3_now_ns();
  snprintf(x->id, sizeof x->id, "%s", q->id);
  int rc = build_srcs(w, x);
  int64_t left = k3_rpc_call_deadline_left_ms(call);
  k3_xfer_send_opts_t so = {.deadline_ms = left > 0 && left < 120000 ? (uint32_t)left : 120000};
  if (w->hooks) so.dev = k3_xhooks_dev(w->hooks); /* device pools: device jobs read them */
  if (w->hooks && k3_spools_src_pool(&w->sp, &w->src_pool)) { /* exported: the prefill worker may pull */
    so.src_pools = &w->src_pool; /* borrowed for the send: the worker's */
    so.n_src_pools = 1;
  }
  if (!rc) rc = k3_xfer_send_start(w->xfer, x->desc, x->srcs, &so, on_send_done, x, &x->send);
  if (rc) {
    count(w, false);
    k3_rpc_call_finishf(call, k3_rpc_code_from_err(rc), "starting the send of the cached state: %s",
                        k3_strerror(rc));
    export_free(x);
    return;
  }
  k3_rpc_call_set_cancel_cb(call, on_export_cancel, x);
  /* a finished state: every layer at once, then DONE (no first token: the prefill worker samples) */
  for (uint32_t l = 0; l < x->desc->n_layers && !rc; l++) rc = k3_xfer_send_layer_ready(x->send, l);
  if (!rc) rc = k3_xfer_send_finish(x->send, 0, 0.0f);
  if (rc && x->send) k3_xfer_send_cancel(x->send); /* the callback answers and frees */
}

int dc_export_register(dc_worker_t *w) {
  return k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Export", K3_RPC_UNARY,
                                  &k3pd__v1__export_request__descriptor, on_export, w);
}
