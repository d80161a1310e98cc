/* The prefill worker's side of a long-suffix resume (docs/design.md "Long-suffix hits",
 * docs/protocol.md): PrepareResume reserves local state for the whole prompt and opens a receive
 * reservation over its first resume_tokens tokens (MLA pages) and its KDA slot; the decode
 * worker's Export sends the cached state there over k3_xfer (digests, this worker's epoch,
 * DONE/ACK); the Prefill call with `resumed` then joins the prepared job and the engine
 * continues the prompt from resume_tokens (service.c, engine.c).
 *
 * A prepared job is "retired" when it will not be used (the router fell back to computing from
 * token 0, Abort, or no Prefill within its lease): its receive reservation is cancelled, and its
 * local pages and slot go back to the engine only when the transfer layer released it (after
 * quarantine for an unfinished one), so a late write never lands in reused memory.
 * Threads: the loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/prefill.pb-c.h"
#include "pf.h"

static pf_job_t *find_handle(pf_worker_t *w, uint64_t h) {
  for (pf_job_t *j = w->jobs; j; j = j->next)
    if (j->prepared && j->recv_handle == h) return j;
  return NULL;
}

static void answer_prep(pf_job_t *j, k3_rpc_code_t code, const char *msg) {
  if (!j->prep_call) return;
  k3_rpc_call_finish(j->prep_call, code, msg);
  j->prep_call = NULL;
}

void pf_resume_retire(pf_worker_t *w, pf_job_t *j) {
  if (j->retired) return;
  j->retired = true;
  j->cancelled = true;
  answer_prep(j, K3_RPC_CANCELLED, "prepared resume cancelled");
  if (j->recv_live) k3_xfer_recv_cancel(w->recv, j->recv_handle); /* on_release frees, maybe later */
  if (j->engine_has) pf_job_post_free(w, j);
  pf_job_maybe_drop(w, j);
}

void pf_on_xfer_ready(void *ud, const k3_xfer_ready_t *r) {
  pf_worker_t *w = ud;
  pf_job_t *j = find_handle(w, r->request_id);
  if (!j) return;
  j->recv_ready = true;
  K3_DEBUG("request %s: cached state of %u tokens received and verified", j->id, j->resume);
}

void pf_on_xfer_release(void *ud, uint64_t request_id, void *owner) {
  pf_worker_t *w = ud;
  (void)owner;
  pf_job_t *j = find_handle(w, request_id);
  if (!j) return;
  j->recv_live = false;
  if (j->retired) { /* its memory can be reused now */
    if (j->engine_has) pf_job_post_free(w, j);
    pf_job_maybe_drop(w, j);
  }
}

/* The receive layout: pages [0, resume / page_tokens) of the local sequence and its slot, each
 * region where the runner keeps it (same addressing as the decode worker's arena). */
static int reserve_recv(pf_worker_t *w, pf_job_t *j, const k3_seq_t *seq, k3_xfer_desc_t **desc) {
  const k3_manifest_t *m = w->manifest;
  uint32_t pt = (uint32_t)k3_runner_opts(w->runner)->page_tokens;
  uint32_t np = j->resume / pt;
  if (np > (uint32_t)seq->n_pages) return K3_EINVAL;
  k3_xfer_region_t *regs = calloc(m->n ? m->n : 1, sizeof *regs);
  uint32_t *pages = calloc(np ? np : 1, sizeof *pages);
  if (!regs || !pages) {
    free(regs);
    free(pages);
    return K3_ENOMEM;
  }
  for (uint32_t i = 0; i < np; i++) pages[i] = (uint32_t)seq->pages[i];
  uint32_t slot = (uint32_t)seq->slot;
  k3_xfer_layout_t lay = {.n_pools = 1, .n_lists = 2, .n_regions = (uint32_t)m->n, .regions = regs};
  lay.pools[0] = w->sp.pool;
  lay.lists[0] = (k3_xfer_index_list_t){.n = np, .idx = pages};
  lay.lists[1] = (k3_xfer_index_list_t){.n = 1, .idx = &slot};
  for (size_t i = 0; i < m->n; i++) {
    const k3_region_t *rg = &m->regions[i];
    bool mla = rg->kind == K3_REGION_MLA_LATENT;
    regs[i] = (k3_xfer_region_t){
        .kind = mla ? K3_XFER_KIND_MLA_KV : rg->kind == K3_REGION_KDA_STATE ? K3_XFER_KIND_KDA_S : K3_XFER_KIND_KDA_CONV,
        .pool = 0,
        .list = mla ? 0 : 1,
        .layer = (uint32_t)rg->layer,
        .offset_bytes = w->sp.roff[i],
        .stride_bytes = w->sp.rstride[i],
        .unit_bytes = rg->bytes,
        .len_bytes = mla ? (uint64_t)np * rg->bytes : rg->bytes};
  }
  j->recv_handle = ++w->next_recv_handle;
  int rc = k3_xfer_recv_reserve(w->recv, &lay, j->recv_handle, w->fingerprint, j->prep_lease_ms, j, desc);
  free(regs);
  free(pages);
  return rc;
}

void pf_resume_reserved(pf_worker_t *w, pf_job_t *j, const k3_seq_t *seq) {
  j->seq = seq;
  if (j->retired || !j->prep_call) { /* cancelled while the engine reserved */
    pf_resume_retire(w, j);
    return;
  }
  k3_xfer_desc_t *desc = NULL;
  int rc = reserve_recv(w, j, seq, &desc);
  if (rc) {
    char msg[160];
    snprintf(msg, sizeof msg, "opening the receive reservation: %s", k3_strerror(rc));
    answer_prep(j, k3_rpc_code_from_err(rc), msg);
    pf_resume_retire(w, j);
    return;
  }
  j->recv_live = true;
  uint8_t *buf = NULL;
  size_t len = 0;
  rc = k3_xfer_desc_encode(desc, &buf, &len);
  if (rc) {
    k3_xfer_desc_free(desc);
    answer_prep(j, K3_RPC_INTERNAL, "encoding the receive descriptor failed");
    pf_resume_retire(w, j);
    return;
  }
  K3pd__V1__PrepareResumeResponse r = K3PD__V1__PREPARE_RESUME_RESPONSE__INIT;
  r.descriptor.data = buf;
  r.descriptor.len = len;
  r.epoch = desc->epoch;
  K3_INFO("request %s: prepared a resume at %u of %u tokens (receive epoch %llu, lease %u ms)", j->id, j->resume,
          j->n_tokens, (unsigned long long)desc->epoch, j->prep_lease_ms);
  k3_rpc_call_t *c = j->prep_call;
  j->prep_call = NULL;
  k3_rpc_call_reply(c, &r.base);
  free(buf);
  k3_xfer_desc_free(desc);
}

/* K3PD_TEST_CORRUPT_RESUME=N (fault tests only, never in production): before the N-th receive
 * reservation's verification, flip one byte of the received KDA state (host arenas), so a test
 * sees the digest check refuse it, the decode worker's Export fail and the router fall back. */
void pf_test_corrupt(void *ud, uint64_t request_id) {
  static int n_seen;
  pf_worker_t *w = ud;
  const char *e = getenv("K3PD_TEST_CORRUPT_RESUME");
  pf_job_t *j = find_handle(w, request_id);
  if (!e || !j || !j->seq || w->sp.device || j->recv_handle == 0) return;
  if (j->recv_ready) return;
  static uint64_t last;
  if (last == request_id) return; /* once per reservation (it is verified per LAYER and at DONE) */
  last = request_id;
  if (++n_seen != atoi(e)) return;
  const k3_manifest_t *m = w->manifest;
  for (size_t i = 0; i < m->n; i++) {
    if (m->regions[i].kind == K3_REGION_MLA_LATENT) continue;
    uint8_t *p = (uint8_t *)k3_xfer_pool_base(w->sp.pool) + w->sp.roff[i] + (uint64_t)j->seq->slot * w->sp.rstride[i];
    p[0] ^= 0x5a;
    K3_WARN("request %s: TEST: corrupted the received KDA state (K3PD_TEST_CORRUPT_RESUME)", j->id);
    return;
  }
}

void pf_resume_expire(pf_worker_t *w) {
  int64_t now = k3_wall_ms();
  for (pf_job_t *j = w->jobs, *next; j; j = next) {
    next = j->next; /* retire may free j */
    if (j->prepared && !j->retired && !j->tokens && !j->prep_call && now > j->prep_deadline_ms) {
      K3_WARN("request %s: prepared resume unused for %u ms; freed", j->id, j->prep_lease_ms);
      pf_resume_retire(w, j);
    }
  }
}

bool pf_resume_tokens_bad(pf_worker_t *w, k3_rpc_call_t *call, uint32_t resume_tokens) {
  int pt = k3_runner_opts(w->runner)->page_tokens;
  if (resume_tokens % (uint32_t)pt == 0) return false;
  k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "resume_tokens: %u is not a multiple of this worker's page "
                      "size (%d tokens)", resume_tokens, pt);
  return true;
}

/* The loop-side worker for callbacks that only carry the job (one worker per process). */
static pf_worker_t *g_w;

static void on_prep_cancel(k3_rpc_call_t *call, void *arg) {
  pf_job_t *j = arg;
  if (j->prep_call != call) return;
  j->prep_call = NULL;
  pf_resume_retire(g_w, j);
}

static void on_prepare_resume(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  pf_worker_t *w = user;
  const K3pd__V1__PrepareResumeRequest *rq = (const K3pd__V1__PrepareResumeRequest *)msg;
  char err[256];
  if (k3_rpc_validate_prepare_resume_request(rq, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  if (w->draining) {
    k3_rpc_call_finish(call, K3_RPC_UNAVAILABLE, "prefill worker is draining");
    return;
  }
  if (!w->recv) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION, "this prefill worker cannot receive state: %s",
                        w->recv_why);
    return;
  }
  if (rq->fingerprint != w->fingerprint) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION, "fingerprint: %016llx differs from this worker's %016llx",
                        (unsigned long long)rq->fingerprint, (unsigned long long)w->fingerprint);
    return;
  }
  if (pf_resume_tokens_bad(w, call, rq->resume_tokens)) return;
  if (pf_job_find(w, rq->request_id, rq->epoch)) {
    k3_rpc_call_finish(call, K3_RPC_ALREADY_EXISTS, "request_id: this epoch already has a job on this worker");
    return;
  }
  pf_job_t *j = calloc(1, sizeof *j);
  pf_msg_t *m = calloc(1, sizeof *m);
  if (!j || !m) {
    free(j);
    free(m);
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "prefill worker out of memory");
    return;
  }
  snprintf(j->id, sizeof j->id, "%s", rq->request_id);
  j->epoch = rq->epoch;
  j->n_tokens = rq->n_tokens;
  j->resume = rq->resume_tokens;
  j->prepared = true;
  j->prep_call = call;
  j->prep_lease_ms = rq->lease_ms;
  j->prep_deadline_ms = k3_wall_ms() + (int64_t)rq->lease_ms;
  j->engine_has = true;
  j->t_arrive_ns = k3_now_ns();
  j->next = w->jobs;
  w->jobs = j;
  k3_rpc_call_set_cancel_cb(call, on_prep_cancel, j);
  m->link.type = PF_MSG_RESERVE;
  m->job = j;
  pf_engine_post(w, m);
}

int pf_resume_register(pf_worker_t *w) {
  g_w = w;
  return k3_rpc_server_add_method(w->srv, "/k3pd.v1.Prefill/PrepareResume", K3_RPC_UNARY,
                                  &k3pd__v1__prepare_resume_request__descriptor, on_prepare_resume, w);
}
