/* k3pd-prefill control plane: the k3pd.v1.Prefill service, the engine's outbox and the UCX
 * sends, all on the loop thread. See pf.h for the per-job message order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/prefill.pb-c.h"
#include "pf.h"

/* Jobs are keyed by (request id, epoch): a re-issued prefill (new epoch) may arrive while the
 * failed attempt of the same request is still being torn down here. */
static pf_job_t *find_job(pf_worker_t *w, const char *id, uint64_t epoch) {
  for (pf_job_t *j = w->jobs; j; j = j->next)
    if (!j->retired && strcmp(j->id, id) == 0 && j->epoch == epoch) return j;
  return NULL;
}

pf_job_t *pf_job_find(pf_worker_t *w, const char *id, uint64_t epoch) { return find_job(w, id, epoch); }

static void unlink_job(pf_worker_t *w, pf_job_t *j) {
  for (pf_job_t **pp = &w->jobs; *pp; pp = &(*pp)->next) {
    if (*pp == j) {
      *pp = j->next;
      return;
    }
  }
}

static void free_job(pf_job_t *j) {
  free(j->tokens);
  k3_xfer_desc_free(j->desc);
  free(j->srcs);
  free(j->src_idx);
  free(j);
}

/* Drops the job once the engine released its local state, the send is over and the RPC is
 * answered. */
static void maybe_drop(pf_worker_t *w, pf_job_t *j) {
  if (j->engine_has || j->send || j->call || j->prep_call || j->recv_live) return;
  unlink_job(w, j);
  free_job(j);
}

void pf_job_maybe_drop(pf_worker_t *w, pf_job_t *j) { maybe_drop(w, j); }

/* Exactly one FREE goes to the engine per job; the engine answers it exactly once. Not while a
 * receive reservation may still write the local state (pf_on_xfer_release posts it then). */
static void post_free(pf_worker_t *w, pf_job_t *j) {
  if (j->free_posted || j->recv_live) return;
  j->free_posted = true;
  if (!w->engine.running) { /* shutting down: the engine already released everything */
    j->engine_has = false;
    return;
  }
  pf_msg_t *m = calloc(1, sizeof *m);
  if (!m) return; /* the engine keeps the state until shutdown; logged by the caller's error */
  m->link.type = PF_MSG_FREE;
  m->job = j;
  pf_engine_post(w, m);
}

void pf_job_post_free(pf_worker_t *w, pf_job_t *j) { post_free(w, j); }

static void answer(pf_worker_t *w, pf_job_t *j) {
  if (!j->call) return;
  k3_rpc_call_t *c = j->call;
  j->call = NULL;
  uint64_t now = k3_now_ns();
  if (j->status == 0) {
    K3pd__V1__PrefillResponse r = K3PD__V1__PREFILL_RESPONSE__INIT;
    K3pd__V1__Timings tm = K3PD__V1__TIMINGS__INIT;
    r.first_token = j->first_token;
    r.first_logprob = j->first_logprob;
    tm.queue_us = j->t_start_ns > j->t_arrive_ns ? (j->t_start_ns - j->t_arrive_ns) / 1000 : 0;
    tm.prefill_us = j->t_computed_ns > j->t_start_ns ? (j->t_computed_ns - j->t_start_ns) / 1000 : 0;
    tm.handoff_us = j->t_done_ns > j->t_computed_ns ? (j->t_done_ns - j->t_computed_ns) / 1000 : 0;
    tm.total_us = (now - j->t_arrive_ns) / 1000;
    r.timings = &tm;
    r.bytes_transferred = j->bytes;
    r.seed = j->sample.seed;
    w->n_ok++;
    const char *st = K3PD_STATUS_OK;
    k3_metric_inc(w->m.requests_total, &st);
    K3_INFO("request %s: prefill %u tokens in %.2f ms (first token after %llu passes), handoff %llu bytes finished "
            "%.2f ms after compute", j->id, j->n_tokens, (double)tm.prefill_us / 1e3, (unsigned long long)j->passes,
            (unsigned long long)j->bytes, (double)tm.handoff_us / 1e3);
    k3_rpc_call_reply(c, &r.base);
  } else {
    w->n_failed++;
    {
      k3_rpc_code_t code = j->status == K3_ECANCELED ? K3_RPC_CANCELLED : k3_rpc_code_from_err(j->status);
      const char *st = code == K3_RPC_CANCELLED            ? K3PD_STATUS_CANCELLED
                       : code == K3_RPC_INVALID_ARGUMENT    ? K3PD_STATUS_INVALID_ARGUMENT
                       : code == K3_RPC_DEADLINE_EXCEEDED   ? K3PD_STATUS_DEADLINE_EXCEEDED
                       : code == K3_RPC_RESOURCE_EXHAUSTED  ? K3PD_STATUS_RESOURCE_EXHAUSTED
                       : code == K3_RPC_UNAVAILABLE         ? K3PD_STATUS_UNAVAILABLE
                                                            : K3PD_STATUS_INTERNAL;
      k3_metric_inc(w->m.requests_total, &st);
    }
    K3_WARN("request %s: prefill failed: %s (%s)", j->id, j->err, k3_strerror(j->status));
    k3_rpc_call_finish(c, j->status == K3_ECANCELED ? K3_RPC_CANCELLED : k3_rpc_code_from_err(j->status), j->err);
  }
}

static void fail(pf_worker_t *w, pf_job_t *j, int status, const char *msg) {
  if (j->status == 0) {
    j->status = status;
    snprintf(j->err, sizeof j->err, "%s", msg);
  }
  if (j->send) k3_xfer_send_cancel(j->send); /* its callback answers */
  else answer(w, j);
}

/* The transfer-path metric's label for a path (k3_xfer's names use '-'). */
static const char *path_label(k3_xfer_path_t p) {
  switch (p) {
  case K3_XFER_PATH_STAGED: return K3PD_PATH_STAGED;
  case K3_XFER_PATH_CUDA_IPC: return K3PD_PATH_CUDA_IPC;
  case K3_XFER_PATH_UCX_CUDA: return K3PD_PATH_UCX_CUDA;
  default: return K3PD_PATH_HOST;
  }
}

/* The loop-side worker for callbacks that only carry the job (one worker per process). */
static pf_worker_t *g_w;

/* The job left the queue: the engine gave it local state (STARTED). */
static void unqueue(pf_worker_t *w, pf_job_t *j) {
  (void)w;
  if (j->state == PF_QUEUED) j->state = PF_RUNNING;
}

/* The job's compute is over (finished, failed or dropped): its tokens leave the load report. */
static void compute_over(pf_worker_t *w, pf_job_t *j) {
  if (j->counted) {
    w->queued_tokens -= j->n_tokens;
    j->counted = false;
  }
  if (j->computing) {
    j->computing = false;
    if (w->running) w->running--;
  }
}

static void on_send_done_cb(void *ud, const k3_xfer_send_result_t *res) {
  pf_job_t *j = ud;
  j->send = NULL;
  j->t_done_ns = k3_now_ns();
  j->bytes = res->bytes;
  if (res->status && j->status == 0) {
    j->status = res->status;
    snprintf(j->err, sizeof j->err, "state transfer to the decode worker failed: %s", k3_strerror(res->status));
  }
  if (res->status == 0) k3_prefill_metrics_set_path(&g_w->m, path_label(res->path));
  if (j->status == 0) {
    g_w->bytes_sent += res->bytes;
    const char *mla = K3PD_REGION_MLA_PAGES, *kda = K3PD_REGION_KDA_STATE;
    uint64_t kda_b = res->kind_bytes[K3_XFER_KIND_KDA_S] + res->kind_bytes[K3_XFER_KIND_KDA_CONV];
    uint64_t kda_ns = res->kind_ns[K3_XFER_KIND_KDA_S] > res->kind_ns[K3_XFER_KIND_KDA_CONV]
                          ? res->kind_ns[K3_XFER_KIND_KDA_S]
                          : res->kind_ns[K3_XFER_KIND_KDA_CONV];
    k3_metric_add(g_w->m.handoff_bytes_total, &mla, (double)res->kind_bytes[K3_XFER_KIND_MLA_KV]);
    k3_metric_add(g_w->m.handoff_bytes_total, &kda, (double)kda_b);
    if (res->kind_bytes[K3_XFER_KIND_MLA_KV])
      k3_metric_observe(g_w->m.handoff_seconds, &mla, (double)res->kind_ns[K3_XFER_KIND_MLA_KV] / 1e9);
    if (kda_b) k3_metric_observe(g_w->m.handoff_seconds, &kda, (double)kda_ns / 1e9);
  } else if (res->status) {
    const char *reason = res->status == K3_ETIMEDOUT ? K3PD_HANDOFF_FAIL_TIMEOUT
                         : (res->status == K3_ESTALE || res->status == K3_ENOENT || res->status == K3_EDIGEST ||
                            res->status == K3_EFINGERPRINT)
                             ? K3PD_HANDOFF_FAIL_REJECTED
                             : K3PD_HANDOFF_FAIL_TRANSPORT;
    if (res->status != K3_ECANCELED) k3_metric_inc(g_w->m.handoff_failures_total, &reason);
  }
  j->state = PF_DONE;
  answer(g_w, j);
  if (j->engine_has) post_free(g_w, j);
  maybe_drop(g_w, j);
}

/* Staged path (device sources into a host receive area): region bytes from device memory. */
static int job_d2h(void *ud, uint32_t region, uint64_t off, void *dst, uint64_t len) {
  pf_job_t *j = ud;
  return k3_xhooks_d2h(k3_runner_backend(g_w->runner), &j->srcs[region], off, dst, len);
}

/* Builds the local sources of every descriptor region from the runner's pool memory. */
static int start_send(pf_worker_t *w, pf_job_t *j, const k3_seq_t *seq) {
  const k3_manifest_t *m = w->manifest;
  if (j->desc->n_regions != m->n) return K3_EINVAL;
  j->srcs = calloc(m->n ? m->n : 1, sizeof *j->srcs);
  j->src_idx = calloc((size_t)seq->n_pages + 1, sizeof *j->src_idx);
  if (!j->srcs || !j->src_idx) return K3_ENOMEM;
  for (int p = 0; p < seq->n_pages; p++) j->src_idx[p] = (uint32_t)seq->pages[p];
  j->src_idx[seq->n_pages] = (uint32_t)seq->slot;
  /* a long-suffix resume's reservation starts at token j->resume (a page boundary, checked at
   * Prefill): the decode worker holds the pages before it */
  uint32_t skip = j->resume / (uint32_t)k3_runner_opts(w->runner)->page_tokens;
  if (skip > (uint32_t)seq->n_pages) return K3_EINVAL;
  for (size_t i = 0; i < m->n; i++) {
    void *base;
    size_t stride, count;
    int rc = k3_runner_pool_mem(w->runner, (int)i, &base, &stride, &count);
    if (rc) return rc;
    k3_xfer_src_t *s = &j->srcs[i];
    s->base = base;
    s->stride_bytes = stride;
    s->offset_bytes = 0;
    s->unit_bytes = m->regions[i].bytes;
    if (m->regions[i].kind == K3_REGION_MLA_LATENT) {
      s->idx = j->src_idx + skip;
      s->n_idx = (uint32_t)seq->n_pages - skip;
    } else {
      s->idx = j->src_idx + seq->n_pages;
      s->n_idx = 1;
    }
  }
  int64_t left = k3_rpc_call_deadline_left_ms(j->call);
  uint32_t dl = w->send_deadline_ms;
  if (left > 0 && left < (int64_t)dl) dl = (uint32_t)left;
  k3_xfer_send_opts_t so = {.deadline_ms = dl, .path = w->path};
  k3_xfer_stage_t st = {.d2h = job_d2h, .ud = j};
  if (w->hooks) { /* the runner's pools are device memory */
    so.dev = k3_xhooks_dev(w->hooks);
    so.stage = &st;
    /* the exported arena (borrowed for the send: the worker's): a same-GPU decode worker can
     * pull (two HBM passes, docs/transfer.md) */
    if (w->sp_planned && k3_spools_src_pool(&w->sp, &w->src_pool)) {
      so.src_pools = &w->src_pool;
      so.n_src_pools = 1;
    }
  }
  return k3_xfer_send_start(w->xfer, j->desc, j->srcs, &so, on_send_done_cb, j, &j->send);
}

void pf_on_engine_msg(k3_msg_t *m, void *ud) {
  pf_worker_t *w = ud;
  pf_msg_t *o = (pf_msg_t *)m;
  pf_job_t *j = o->job;
  switch (m->type) {
    case PF_MSG_STARTED: {
      unqueue(w, j);
      j->engine_has = true;
      j->t_start_ns = k3_now_ns();
      j->computing = true;
      w->running++;
      if (j->cancelled) break;
      int rc = start_send(w, j, o->seq);
      if (rc) fail(w, j, rc, "starting the state transfer to the decode worker failed");
      break;
    }
    case PF_MSG_LAYER:
      if (j->send && !j->cancelled) {
        int rc = k3_xfer_send_layer_ready(j->send, (uint32_t)o->layer);
        if (rc == 0) j->layers_signalled++;
      }
      break;
    case PF_MSG_FINISHED: {
      j->t_computed_ns = k3_now_ns();
      compute_over(w, j);
      /* Passes this prompt's wait overlapped, its own included: the fairness figure
       * (docs/design.md, "Fair prefill"). */
      j->passes = o->pass + 1 - j->pass_seen + (j->pass_in_progress ? 1 : 0);
      k3_histogram_observe(k3_metric_default(w->m.first_token_passes), (double)j->passes);
      j->first_token = o->token;
      j->first_logprob = o->logprob;
      if (j->send && !j->cancelled) {
        j->state = PF_SENDING;
        int rc = k3_xfer_send_finish(j->send, o->token, o->logprob);
        if (rc) fail(w, j, rc, "finishing the state transfer failed");
      } else {
        if (!j->status) fail(w, j, K3_ECANCELED, "prefill aborted");
        if (j->engine_has) post_free(w, j);
      }
      break;
    }
    case PF_MSG_RESERVED:
      pf_resume_reserved(w, j, o->seq);
      break;
    case PF_MSG_FAILED:
      unqueue(w, j);
      compute_over(w, j);
      if (j->prep_call) { /* PrepareResume: no local state for it */
        k3_rpc_call_finish(j->prep_call, k3_rpc_code_from_err(o->status), o->err);
        j->prep_call = NULL;
        j->retired = true;
      }
      fail(w, j, o->status, o->err);
      if (j->engine_has) post_free(w, j);
      else maybe_drop(w, j);
      break;
    case PF_MSG_FREE: /* the engine released (or dropped) the job */
      unqueue(w, j);
      compute_over(w, j);
      j->engine_has = false;
      maybe_drop(w, j);
      break;
    default:
      break;
  }
  free(o);
}

static void on_prefill_cancel(k3_rpc_call_t *call, void *arg) {
  pf_job_t *j = arg;
  (void)call;
  if (j->call != call) return;
  j->cancelled = true;
  fail(g_w, j, K3_ECANCELED, "prefill cancelled by the caller");
  if (j->engine_has) post_free(g_w, j); /* drop it from the engine's queue or its passes */
}

/* Fills a job from its Prefill request (the loop owns it from here). */
static void fill_job(pf_job_t *j, const K3pd__V1__PrefillRequest *rq, int32_t *toks, k3_xfer_desc_t *desc,
                     k3_rpc_call_t *call) {
  snprintf(j->id, sizeof j->id, "%s", rq->request_id);
  j->epoch = rq->epoch;
  j->call = call;
  for (size_t i = 0; i < rq->n_token_ids; i++) toks[i] = (int32_t)rq->token_ids[i];
  j->tokens = toks;
  j->n_tokens = (uint32_t)rq->n_token_ids;
  j->desc = desc;
  j->resume = rq->resume_tokens;
  j->sample.temperature = 1.0f;
  j->sample.top_p = 1.0f;
  const K3pd__V1__SamplingParams *sp = rq->sampling;
  if (sp) {
    if (sp->temperature_opt_case == K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE)
      j->sample.temperature = sp->temperature;
    if (sp->top_p_opt_case == K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P) j->sample.top_p = sp->top_p;
    j->sample.top_k = sp->top_k;
    if (sp->seed_opt_case == K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED) j->sample.seed = sp->seed;
  }
  if (!sp || sp->seed_opt_case != K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED)
    j->sample.seed = k3_hash64(j->id, strlen(j->id), (uint64_t)k3_wall_ms());
  j->t_arrive_ns = k3_now_ns();
}

static void count_resume(pf_worker_t *w, bool received, uint32_t tokens) {
  const char *o = received ? "received" : "fallback";
  k3_metric_inc(w->m.resume_total, &o);
  if (received) k3_counter_add(k3_metric_default(w->m.resume_tokens_total), (double)tokens);
}

static void on_prefill(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  pf_worker_t *w = user;
  const K3pd__V1__PrefillRequest *rq = (const K3pd__V1__PrefillRequest *)msg;
  char err[256];
  k3_rpc_limits_t lim = {.vocab_size = w->vocab > 0 && w->vocab <= UINT32_MAX ? (uint32_t)w->vocab : 0};
  if (k3_rpc_validate_prefill_request(rq, &lim, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  if (w->draining) {
    k3_rpc_call_finish(call, K3_RPC_UNAVAILABLE, "prefill worker is draining");
    return;
  }
  if (pf_resume_tokens_bad(w, call, rq->resume_tokens)) return;
  /* A job of this (request, epoch) may exist only as a prepared resume nobody joined yet. */
  pf_job_t *pj = find_job(w, rq->request_id, rq->epoch);
  if (pj && !(pj->prepared && !pj->tokens)) {
    k3_rpc_call_finish(call, K3_RPC_ALREADY_EXISTS, "request_id: this epoch is already running on this prefill worker");
    return;
  }
  k3_xfer_desc_t *desc = NULL;
  int rc = k3_xfer_desc_decode(rq->reservation.data, rq->reservation.len, &desc, err, sizeof err);
  if (rc) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "reservation: %s", err);
    return;
  }
  if (desc->fingerprint != w->fingerprint) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION,
                        "reservation: decode fingerprint %016llx differs from this prefill worker's %016llx",
                        (unsigned long long)desc->fingerprint, (unsigned long long)w->fingerprint);
    k3_xfer_desc_free(desc);
    return;
  }
  if (rq->decode_ucx_address.len &&
      (rq->decode_ucx_address.len != desc->worker_addr_len ||
       memcmp(rq->decode_ucx_address.data, desc->worker_addr, desc->worker_addr_len))) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "decode_ucx_address: differs from the reservation's address");
    k3_xfer_desc_free(desc);
    return;
  }
  if (desc->epoch != rq->epoch) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, "epoch: does not match the reservation's epoch");
    k3_xfer_desc_free(desc);
    return;
  }
  /* Long-suffix resume: use the received state only when it is complete and verified for this
   * very prompt; anything else computes from token 0 (same pages pushed: exact either way). */
  if (pj && !(rq->resumed && pj->recv_ready && pj->seq && pj->n_tokens == rq->n_token_ids &&
              pj->resume == rq->resume_tokens)) {
    K3_WARN("request %s: prepared resume not used (%s); computing the prompt from token 0", pj->id,
            !rq->resumed ? "the router fell back" : !pj->recv_ready ? "the state did not arrive" : "prompt differs");
    pf_resume_retire(w, pj);
    pj = NULL;
    count_resume(w, false, 0);
  } else if (!pj && rq->resumed) {
    K3_WARN("request %s: resumed, but no prepared state here; computing the prompt from token 0", rq->request_id);
    count_resume(w, false, 0);
  }
  pf_job_t *j = pj ? pj : calloc(1, sizeof *j);
  int32_t *toks = malloc(rq->n_token_ids * sizeof *toks);
  pf_msg_t *m = calloc(1, sizeof *m);
  if (!j || !toks || !m) {
    if (!pj) free(j);
    free(toks);
    free(m);
    k3_xfer_desc_free(desc);
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "prefill worker out of memory");
    return;
  }
  fill_job(j, rq, toks, desc, call);
  j->state = PF_QUEUED;
  j->engine_has = true;
  if (!pj) {
    j->next = w->jobs;
    w->jobs = j;
  }
  w->queued_tokens += j->n_tokens;
  j->counted = true;
  /* done first: a pass that ends between the two loads then counts as in progress (one pass
   * more, never less) */
  uint64_t done = atomic_load(&w->passes_done);
  j->pass_seen = atomic_load(&w->passes_started);
  j->pass_in_progress = j->pass_seen > done;
  k3_rpc_call_set_cancel_cb(call, on_prefill_cancel, j);
  if (pj) {
    /* the received state is ours now: its reservation ends (no write can come any more) */
    k3_xfer_recv_release(w->recv, j->recv_handle);
    count_resume(w, true, j->resume);
    m->link.type = PF_MSG_RESUME;
    K3_INFO("request %s: resuming at %u of %u prompt tokens from the received state (epoch %llu)", j->id, j->resume,
            j->n_tokens, (unsigned long long)j->epoch);
  } else {
    m->link.type = PF_MSG_RUN;
    K3_INFO("request %s: queued %u prompt tokens (epoch %llu)", j->id, j->n_tokens, (unsigned long long)j->epoch);
  }
  m->job = j;
  pf_engine_post(w, m);
  k3_registrar_kick(w->reg);
}

static void on_abort(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  pf_worker_t *w = user;
  const K3pd__V1__AbortRequest *rq = (const K3pd__V1__AbortRequest *)msg;
  K3pd__V1__AbortResponse r = K3PD__V1__ABORT_RESPONSE__INIT;
  char err[256];
  if (k3_rpc_validate_abort_request(rq, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  for (pf_job_t *j = w->jobs; j; j = j->next) { /* every attempt of the request */
    if (strcmp(j->id, rq->request_id) != 0 || j->state == PF_DONE || j->cancelled || j->retired) continue;
    if (j->prepared && !j->tokens) { /* a prepared resume nobody joined */
      r.found = true;
      pf_resume_retire(w, j);
      continue;
    }
    r.found = true;
    K3_INFO("request %s: aborted (epoch %llu)", j->id, (unsigned long long)j->epoch);
    j->cancelled = true;
    fail(w, j, K3_ECANCELED, "prefill aborted");
    if (j->engine_has) post_free(w, j); /* queued or still computing: no more passes for it */
  }
  k3_rpc_call_reply(call, &r.base);
}

void pf_fill_load(void *ud, K3pd__V1__WorkerLoad *load) {
  pf_worker_t *w = ud;
  load->queued_prompt_tokens = w->queued_tokens;
  load->running_seqs = w->running;
  uint32_t q = 0;
  for (pf_job_t *j = w->jobs; j; j = j->next) q += j->state == PF_QUEUED && j->tokens; /* not prepared resumes */
  load->queued_requests = q;
}

int pf_service_register(pf_worker_t *w) {
  g_w = w;
  int rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Prefill/Prefill", K3_RPC_UNARY,
                                    &k3pd__v1__prefill_request__descriptor, on_prefill, w);
  if (!rc)
    rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Prefill/Abort", K3_RPC_UNARY,
                                  &k3pd__v1__abort_request__descriptor, on_abort, w);
  if (!rc) rc = pf_resume_register(w);
  return rc;
}
