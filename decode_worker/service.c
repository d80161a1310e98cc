/* k3pd-decode control plane: the k3pd.v1.Decode service, transfer-layer callbacks and the
 * engine's outbox, all on the loop thread. See dc.h for the request lifecycle. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dc.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_validate.h"
#include "k3pd/util.h"
#include "k3pd/v1/decode.pb-c.h"

/* ---- request table ---- */

static dc_req_t *find_id(dc_worker_t *w, const char *id) {
  for (dc_req_t *r = w->reqs; r; r = r->next)
    if (strcmp(r->id, id) == 0) return r;
  return NULL;
}

dc_req_t *dc_req_find(dc_worker_t *w, const char *id) { return find_id(w, id); }

static dc_req_t *find_handle(dc_worker_t *w, uint64_t h) {
  for (dc_req_t *r = w->reqs; r; r = r->next)
    if (r->handle == h) return r;
  return NULL;
}

static void unlink_req(dc_worker_t *w, dc_req_t *q) {
  for (dc_req_t **pp = &w->reqs; *pp; pp = &(*pp)->next) {
    if (*pp == q) {
      *pp = q->next;
      return;
    }
  }
}

/* Drops the request's page references (shared pages stay with their other holders), its slot,
 * and its pins on cache entries. */
static void give_back(dc_worker_t *w, dc_req_t *q) {
  dc_cache_req_done(w, q);
  for (int i = 0; i < q->n_pages; i++) dc_page_unref_req(w, q->pages[i]);
  q->n_pages = 0;
  if (q->slot >= 0) w->free_slots[w->n_free_slots++] = q->slot;
  q->slot = -1;
  dc_cache_enforce(w); /* pages it shared with entries are now held by the cache alone */
}

/* Frees the request once neither the transfer layer nor the engine can touch its memory and
 * no stream is attached. */
static void maybe_drop(dc_worker_t *w, dc_req_t *q) {
  if (q->xfer_live || q->engine_has || q->attach) return;
  give_back(w, q);
  unlink_req(w, q);
  free(q->pages);
  free(q->stop_ids);
  free(q->prompt);
  free(q->hashes);
  free(q);
}

static void finish_attach(dc_req_t *q, k3_rpc_code_t code, const char *msg) {
  if (!q->attach) return;
  k3_rpc_call_t *c = q->attach;
  q->attach = NULL;
  k3_rpc_call_finish(c, code, msg);
}

/* ---- Reserve ---- */

/* desc NULL: a reservation without a handoff (the whole prompt is computed here). */
static void reply_reservation(k3_rpc_call_t *call, dc_req_t *q, k3_xfer_desc_t *desc, uint32_t lease_ms) {
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = desc ? k3_xfer_desc_encode(desc, &buf, &len) : 0;
  if (rc) {
    k3_rpc_call_finishf(call, K3_RPC_INTERNAL, "encoding the reservation descriptor: %s", k3_strerror(rc));
    return;
  }
  K3pd__V1__Reservation res = K3PD__V1__RESERVATION__INIT;
  res.request_id = q->id;
  res.epoch = desc ? desc->epoch : q->epoch;
  res.lease_expires_unix_ms = desc ? desc->lease_expiry_ms : k3_wall_ms() + (int64_t)lease_ms;
  res.descriptor.data = buf;
  res.descriptor.len = len;
  res.n_pages = (uint32_t)q->n_pages;
  res.kda_slot = q->slot < 0 ? 0 : (uint32_t)q->slot;
  res.split = q->split;
  res.prefill_tokens = q->xfer_tokens;
  res.cached_tokens = q->cached;
  res.resume_tokens = q->resume;
  k3_rpc_call_reply(call, &res.base);
  free(buf);
}

static void on_reserve(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  dc_worker_t *w = user;
  const K3pd__V1__ReserveRequest *rq = (const K3pd__V1__ReserveRequest *)msg;
  char err[256];
  if (k3_rpc_validate_reserve_request(rq, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  if ((uint64_t)rq->n_prompt_tokens + rq->max_new_tokens > w->max_context) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT,
                        "n_prompt_tokens + max_new_tokens: %llu exceeds this worker's max context %u",
                        (unsigned long long)rq->n_prompt_tokens + rq->max_new_tokens, w->max_context);
    return;
  }
  dc_req_t *old = find_id(w, rq->request_id);
  if (old) {
    /* A repeated Reserve for a reservation still waiting for its state re-issues it with a new
     * epoch: the router's retry after a prefill worker failed. */
    if (old->state != DC_RESERVED || !old->xfer_live || old->n_prompt != rq->n_prompt_tokens ||
        old->max_new != rq->max_new_tokens) {
      k3_rpc_call_finish(call, K3_RPC_ALREADY_EXISTS, "request_id: already reserved and admitted on this worker");
      return;
    }
    k3_xfer_desc_t *desc = NULL;
    int rc = k3_xfer_recv_reissue(w->recv, old->handle, rq->lease_ms, &desc);
    if (rc) {
      k3_rpc_call_finishf(call, k3_rpc_code_from_err(rc), "re-issuing reservation: %s", k3_strerror(rc));
      return;
    }
    old->epoch = desc->epoch;
    K3_INFO("request %s: reservation re-issued, epoch %llu", old->id, (unsigned long long)old->epoch);
    reply_reservation(call, old, desc, rq->lease_ms);
    k3_xfer_desc_free(desc);
    return;
  }
  if (w->draining) {
    k3_rpc_call_finish(call, K3_RPC_UNAVAILABLE, "decode worker is draining");
    return;
  }
  int need_pages = w->manifest->mla_bytes_per_page
                       ? (int)(((uint64_t)rq->n_prompt_tokens + rq->max_new_tokens + (uint64_t)w->page_tokens - 1) /
                               (uint64_t)w->page_tokens)
                       : 0;
  bool use_cache = w->cache.on && rq->prefix_cache && rq->n_prompt_token_ids == rq->n_prompt_tokens;
  if (use_cache) {
    for (size_t i = 0; i < rq->n_prompt_token_ids; i++) {
      if (rq->prompt_token_ids[i] >= (uint32_t)k3_runner_config(w->runner)->vocab_size) {
        k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "prompt_token_ids[%zu]: %u is outside the vocabulary", i,
                            rq->prompt_token_ids[i]);
        return;
      }
    }
  }
  dc_req_t *q = calloc(1, sizeof *q);
  int32_t *pages = calloc((size_t)(need_pages > 0 ? need_pages : 1), sizeof *pages);
  k3_xfer_region_t *regs = calloc(w->manifest->n ? w->manifest->n : 1, sizeof *regs);
  uint32_t *prompt = use_cache ? malloc(rq->n_prompt_token_ids * sizeof *prompt) : NULL;
  if (!q || !pages || !regs || (use_cache && !prompt)) {
    free(q);
    free(pages);
    free(regs);
    free(prompt);
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "decode worker out of memory");
    return;
  }
  snprintf(q->id, sizeof q->id, "%s", rq->request_id);
  q->n_prompt = rq->n_prompt_tokens;
  q->max_new = rq->max_new_tokens;
  q->pages = pages;
  q->slot = -1;
  /* Pages and a slot (evicting cached prefixes first when short), and with the cache the plan
   * of who computes which part of the prompt. */
  int rc = dc_cache_plan(w, q, use_cache ? rq->prompt_token_ids : NULL, need_pages, rq->resume_ok);
  if (rc) {
    free(q);
    free(pages);
    free(regs);
    free(prompt);
    if (rc != K3_ECAPACITY) {
      k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "decode worker out of memory");
      return;
    }
    w->n_reserve_rejected++;
    k3_rpc_call_finishf(call, K3_RPC_RESOURCE_EXHAUSTED, "%s: need %d, free %d",
                        w->n_free_slots < 1 ? "kda_slots" : "kv_pages", w->n_free_slots < 1 ? 1 : need_pages,
                        w->n_free_slots < 1 ? 0 : w->n_free_pages);
    return;
  }
  q->handle = ++w->next_handle;
  q->t_reserved_ns = k3_now_ns();
  if (q->split) {
    memcpy(prompt, rq->prompt_token_ids, rq->n_prompt_token_ids * sizeof *prompt);
    q->prompt = prompt;
  } else {
    free(prompt);
  }
  k3_xfer_desc_t *desc = NULL;
  if (q->split && q->xfer_tokens == 0) {
    /* Computed here from a cached prefix: no handoff. Ready at once; the lease still bounds the
     * wait for Attach (dc_metrics_refresh). */
    q->epoch = ((uint64_t)k3_wall_ms() << 16) ^ ++w->next_local_epoch;
    q->state = DC_READY;
    q->t_ready_ns = q->t_reserved_ns;
    q->lease_ms = rq->lease_ms;
  } else {
    k3_xfer_layout_t lay;
    uint32_t slot_idx[1];
    dc_pools_layout(w, q, slot_idx, &lay, regs);
    rc = k3_xfer_recv_reserve(w->recv, &lay, q->handle, w->fingerprint, rq->lease_ms, q, &desc);
    if (rc) {
      free(regs);
      give_back(w, q);
      free(q->pages);
      free(q->prompt);
      free(q);
      k3_rpc_call_finishf(call, k3_rpc_code_from_err(rc), "reserving transfer memory: %s", k3_strerror(rc));
      return;
    }
    q->xfer_live = true;
    q->epoch = desc->epoch;
    q->state = DC_RESERVED;
  }
  free(regs);
  q->next = w->reqs;
  w->reqs = q;
  if (q->split)
    K3_INFO("request %s: reserved %d pages + slot %d, epoch %llu, lease %u ms; prompt %u: cached %u, prefill "
            "worker %u%s, here %u, %d checkpoint(s)",
            q->id, q->n_pages, q->slot, (unsigned long long)q->epoch, rq->lease_ms, q->n_prompt, q->cached,
            q->xfer_tokens, q->resume ? " resuming from the cached state (Export)" : "", q->n_prompt - q->start,
            (int)q->n_cand);
  else
    K3_INFO("request %s: reserved %d pages + slot %d, epoch %llu, lease %u ms", q->id, q->n_pages, q->slot,
            (unsigned long long)q->epoch, rq->lease_ms);
  reply_reservation(call, q, desc, rq->lease_ms);
  k3_xfer_desc_free(desc);
  k3_registrar_kick(w->reg);
}

/* ---- admission ---- */

static void admit(dc_worker_t *w, dc_req_t *q) {
  dc_msg_t *m = calloc(1, sizeof *m);
  int32_t *pages = calloc((size_t)(q->n_pages > 0 ? q->n_pages : 1), sizeof *pages);
  uint32_t *stops = calloc((size_t)(q->n_stop_ids > 0 ? q->n_stop_ids : 1), sizeof *stops);
  if (!m || !pages || !stops) {
    free(m);
    free(pages);
    free(stops);
    finish_attach(q, K3_RPC_RESOURCE_EXHAUSTED, "decode worker out of memory");
    if (q->xfer_live) k3_xfer_recv_release(w->recv, q->handle);
    return;
  }
  m->link.type = DC_MSG_ADMIT;
  m->handle = q->handle;
  m->split = q->split;
  m->copy_slot = -1;
  if (q->split) {
    m->prompt = malloc(q->n_prompt * sizeof *m->prompt);
    if (!m->prompt) {
      free(m);
      free(pages);
      free(stops);
      finish_attach(q, K3_RPC_RESOURCE_EXHAUSTED, "decode worker out of memory");
      if (q->xfer_live) k3_xfer_recv_release(w->recv, q->handle);
      return;
    }
    for (uint32_t i = 0; i < q->n_prompt; i++) m->prompt[i] = (int32_t)q->prompt[i];
    m->n_prompt = q->n_prompt;
    m->start = q->start;
    m->copy_slot = q->hit ? q->hit->slot : -1;
    dc_cache_admit(w, q);
    for (int i = 0; i < q->n_ck; i++) {
      m->ck_pos[m->n_ck] = q->ck[i]->len;
      m->ck_slot[m->n_ck++] = q->ck[i]->slot;
    }
  }
  memcpy(pages, q->pages, (size_t)q->n_pages * sizeof *pages);
  m->page_store = pages;
  m->seq.slot = q->slot;
  m->seq.len = q->split ? q->start : q->n_prompt;
  m->seq.pages = pages;
  m->seq.n_pages = q->n_pages;
  m->seq.cap_pages = q->n_pages;
  m->first_token = q->first_token;
  m->max_new = q->max_new;
  m->sample = q->sample;
  memcpy(stops, q->stop_ids, (size_t)q->n_stop_ids * sizeof *stops);
  m->stop_ids = stops;
  m->n_stop_ids = q->n_stop_ids;
  m->want_logprobs = q->want_logprobs;
  q->state = DC_RUNNING;
  q->engine_has = true;
  w->n_admitted++;
  w->n_running++;
  dc_engine_post(w, m);
}

void dc_on_xfer_ready(void *ud, const k3_xfer_ready_t *r) {
  dc_worker_t *w = ud;
  dc_req_t *q = find_handle(w, r->request_id);
  if (!q || q->state != DC_RESERVED) return;
  q->state = DC_READY;
  q->first_token = r->first_token;
  q->first_logprob = r->first_logprob;
  q->t_ready_ns = k3_now_ns();
  k3_histogram_observe(k3_metric_default(w->m.reservation_wait_seconds),
                       (double)(q->t_ready_ns - q->t_reserved_ns) / 1e9);
  K3_INFO("request %s: state verified (epoch %llu, first token %u, handoff %.2f ms after reserve)", q->id,
          (unsigned long long)r->epoch, r->first_token, (double)(q->t_ready_ns - q->t_reserved_ns) / 1e6);
  if (q->attach) admit(w, q);
}

void dc_on_xfer_release(void *ud, uint64_t request_id, void *owner) {
  dc_worker_t *w = ud;
  dc_req_t *q = owner;
  (void)request_id;
  q->xfer_live = false;
  if (q->state == DC_RESERVED || q->state == DC_READY) {
    /* Never admitted: lease expired or cancelled. */
    if (q->state == DC_RESERVED) w->n_leases_expired++;
    q->state = DC_FINISHED;
    finish_attach(q, K3_RPC_ABORTED, "reservation expired before the state arrived");
  }
  maybe_drop(w, q);
  k3_registrar_kick(w->reg);
}

/* ---- Attach ---- */

static void on_attach_cancel(k3_rpc_call_t *call, void *arg) {
  dc_worker_t *w = k3_rpc_call_get_user(call);
  dc_req_t *q = arg;
  (void)w;
  if (q->attach != call) return;
  q->attach = NULL;
  k3_rpc_call_finish(call, K3_RPC_CANCELLED, "cancelled");
  if (q->engine_has) {
    dc_msg_t *m = calloc(1, sizeof *m);
    if (m) {
      m->link.type = DC_MSG_CANCEL;
      m->handle = q->handle;
      dc_engine_post(w, m);
    }
  } else if (q->xfer_live) {
    k3_xfer_recv_cancel(w->recv, q->handle);
  }
}

static void on_attach(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  dc_worker_t *w = user;
  const K3pd__V1__AttachRequest *rq = (const K3pd__V1__AttachRequest *)msg;
  /* structure and ranges: the shared validator; then what only Attach needs */
  char err[256];
  k3_rpc_limits_t lim = {.vocab_size = w->vocab > 0 && w->vocab <= UINT32_MAX ? (uint32_t)w->vocab : 0};
  if (k3_rpc_validate_attach_request(rq, &lim, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  dc_req_t *q = find_id(w, rq->request_id);
  if (!q || q->state == DC_FINISHED) {
    k3_rpc_call_finishf(call, K3_RPC_NOT_FOUND, "request_id: no reservation \"%s\" on this worker",
                        rq->request_id ? rq->request_id : "");
    return;
  }
  if (rq->epoch != q->epoch) {
    k3_rpc_call_finishf(call, K3_RPC_FAILED_PRECONDITION, "epoch: %llu is stale (current %llu)",
                        (unsigned long long)rq->epoch, (unsigned long long)q->epoch);
    return;
  }
  if (q->attach) {
    k3_rpc_call_finish(call, K3_RPC_ALREADY_EXISTS, "request_id: a stream is already attached");
    return;
  }
  if (rq->stop->max_new_tokens > q->max_new) {
    k3_rpc_call_finishf(call, K3_RPC_INVALID_ARGUMENT, "stop.max_new_tokens: %u exceeds the reservation's %u",
                        rq->stop->max_new_tokens, q->max_new);
    return;
  }
  /* decode samples the stream prefill started: it needs prefill's seed */
  const K3pd__V1__SamplingParams *sp = rq->sampling;
  if (!sp || sp->seed_opt_case != K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT,
                       "sampling.seed: required on Attach (must equal the seed prefill used)");
    return;
  }
  memset(&q->sample, 0, sizeof q->sample);
  q->sample.temperature = sp->temperature_opt_case == K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE
                              ? sp->temperature : 1.0f;
  q->sample.top_p = sp->top_p_opt_case == K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P ? sp->top_p : 1.0f;
  q->sample.top_k = sp->top_k;
  q->sample.seed = sp->seed;
  size_t ns = rq->stop->n_stop_token_ids;
  uint32_t *stops = calloc(ns + 1, sizeof *stops);
  if (!stops) {
    k3_rpc_call_finish(call, K3_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < ns; i++) stops[i] = rq->stop->stop_token_ids[i];
  free(q->stop_ids);
  q->stop_ids = stops;
  q->n_stop_ids = (int)ns;
  q->want_logprobs = rq->return_logprobs;
  q->attach = call;
  k3_rpc_call_set_user(call, w);
  k3_rpc_call_set_cancel_cb(call, on_attach_cancel, q);
  if (q->state == DC_READY) admit(w, q);
}

/* ---- engine outbox ---- */

void dc_on_engine_msg(k3_msg_t *m, void *ud) {
  dc_worker_t *w = ud;
  dc_msg_t *o = (dc_msg_t *)m;
  dc_req_t *q = find_handle(w, o->handle);
  if (!q) {
    free(o);
    return;
  }
  if (m->type == DC_MSG_CKPT) {
    dc_cache_ckpt_done(w, q, o->ck_pos[0]);
  } else if (m->type == DC_MSG_TOKENS) {
    if (q->attach && (o->n_tokens || o->finish_reason)) {
      K3pd__V1__AttachResponse r = K3PD__V1__ATTACH_RESPONSE__INIT;
      K3pd__V1__TokenLogprob lp[8], *lpp[8];
      r.token_ids = o->tokens;
      r.n_token_ids = o->n_tokens;
      r.first_index = q->emitted;
      if (q->want_logprobs) {
        for (uint32_t i = 0; i < o->n_tokens; i++) {
          k3pd__v1__token_logprob__init(&lp[i]);
          lp[i].token_id = o->tokens[i];
          lp[i].logprob = (q->emitted == 0 && i == 0 && !q->split) ? q->first_logprob : o->logprobs[i];
          lpp[i] = &lp[i];
        }
        r.logprobs = lpp;
        r.n_logprobs = o->n_tokens;
      }
      if (q->emitted == 0 && o->n_tokens) q->t_first_ns = k3_now_ns();
      q->emitted += o->n_tokens;
      k3_counter_add(k3_metric_default(w->m.generated_tokens_total), (double)o->n_tokens);
      K3pd__V1__Timings tm = K3PD__V1__TIMINGS__INIT;
      if (o->finish_reason) {
        r.finish_reason = o->finish_reason;
        r.completion_tokens = q->emitted;
        q->finish_reason = o->finish_reason;
        tm.handoff_us = (q->t_ready_ns - q->t_reserved_ns) / 1000;
        tm.decode_us = (k3_now_ns() - (q->t_first_ns ? q->t_first_ns : k3_now_ns())) / 1000;
        r.timings = &tm;
      }
      k3_rpc_call_write(q->attach, &r.base);
      if (o->finish_reason == K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR) {
        K3_ERROR("request %s: %s", q->id, o->err);
        finish_attach(q, K3_RPC_INTERNAL, o->err);
      }
    }
  } else if (m->type == DC_MSG_DONE) {
    q->engine_has = false;
    q->state = DC_FINISHED;
    w->n_finished++;
    {
      const char *st = q->finish_reason == K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR ? K3PD_STATUS_INTERNAL
                       : (q->finish_reason == K3PD__V1__FINISH_REASON__FINISH_REASON_STOP ||
                          q->finish_reason == K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH)
                           ? K3PD_STATUS_OK
                           : K3PD_STATUS_CANCELLED;
      k3_metric_inc(w->m.requests_total, &st);
    }
    if (w->n_running) w->n_running--;
    K3_INFO("request %s: finished, %u tokens", q->id, q->emitted);
    finish_attach(q, K3_RPC_OK, NULL);
    if (q->xfer_live) k3_xfer_recv_release(w->recv, q->handle); /* on_release drops it */
    else maybe_drop(w, q);
    k3_registrar_kick(w->reg);
  }
  free(o);
}

/* ---- Release and Stats ---- */

static void on_release_rpc(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  dc_worker_t *w = user;
  const K3pd__V1__ReleaseRequest *rq = (const K3pd__V1__ReleaseRequest *)msg;
  K3pd__V1__ReleaseResponse resp = K3PD__V1__RELEASE_RESPONSE__INIT;
  char err[256];
  if (k3_rpc_validate_release_request(rq, err, sizeof err)) {
    k3_rpc_call_finish(call, K3_RPC_INVALID_ARGUMENT, err);
    return;
  }
  dc_req_t *q = find_id(w, rq->request_id);
  if (q && (rq->epoch == 0 || rq->epoch == q->epoch) && q->state != DC_FINISHED) {
    resp.released = true;
    K3_INFO("request %s: released by the router", q->id);
    if (q->engine_has) {
      dc_msg_t *m = calloc(1, sizeof *m);
      if (m) {
        m->link.type = DC_MSG_CANCEL;
        m->handle = q->handle;
        dc_engine_post(w, m);
      }
    } else {
      q->state = DC_FINISHED;
      finish_attach(q, K3_RPC_CANCELLED, "released by the router");
      if (q->xfer_live) k3_xfer_recv_cancel(w->recv, q->handle);
      else maybe_drop(w, q);
    }
  }
  k3_rpc_call_reply(call, &resp.base);
}

static uint32_t count_state(dc_worker_t *w, dc_state_t st) {
  uint32_t n = 0;
  for (dc_req_t *q = w->reqs; q; q = q->next) n += q->state == st;
  return n;
}

static void on_stats(k3_rpc_call_t *call, const ProtobufCMessage *msg, void *user) {
  dc_worker_t *w = user;
  (void)msg;
  K3pd__V1__StatsResponse r = K3PD__V1__STATS_RESPONSE__INIT;
  k3_xfer_stats_t xs;
  k3_xfer_ctx_stats(w->xfer, &xs);
  r.total_kv_pages = (uint32_t)w->num_pages;
  r.used_kv_pages = (uint32_t)(w->num_pages - w->n_free_pages) - w->cache.pages_cache_only;
  r.total_kda_slots = (uint32_t)w->num_slots;
  r.used_kda_slots = (uint32_t)(w->num_slots - w->n_free_slots) - w->cache.slots;
  r.cache_kv_pages = w->cache.pages_cache_only;
  r.cache_kda_slots = w->cache.slots;
  r.cache_entries = w->cache.n_entries;
  r.cache_hits = w->cache.hits;
  r.cache_misses = w->cache.misses;
  r.cache_hit_tokens = w->cache.hit_tokens;
  r.cache_evictions = w->cache.evictions;
  r.local_prefill_tokens = w->cache.local_tokens;
  r.reservations = count_state(w, DC_RESERVED) + count_state(w, DC_READY);
  r.running_seqs = w->n_running;
  r.leases_expired = xs.leases_expired;
  r.admitted = w->n_admitted;
  r.finished = w->n_finished;
  r.rejected_done = xs.done_rejected_unknown + xs.done_rejected_stale + xs.done_rejected_fingerprint +
                    xs.done_rejected_digest + xs.done_rejected_malformed;
  k3_rpc_call_reply(call, &r.base);
}

void dc_fill_load(void *ud, K3pd__V1__WorkerLoad *load) {
  dc_worker_t *w = ud;
  /* cached pages and slots count as free: Reserve evicts them when it needs them */
  load->used_kv_pages = (uint32_t)(w->num_pages - w->n_free_pages) - w->cache.pages_cache_only;
  load->used_kda_slots = (uint32_t)(w->num_slots - w->n_free_slots) - w->cache.slots;
  load->running_seqs = w->n_running;
  dc_cache_fill_load(w, load);
}

void dc_expire_local(dc_worker_t *w) {
  uint64_t now = k3_now_ns();
  for (dc_req_t *q = w->reqs, *next; q; q = next) {
    next = q->next;
    if (q->state != DC_READY || q->xfer_live || q->attach || q->engine_has) continue;
    if (now - q->t_reserved_ns < (uint64_t)q->lease_ms * 1000000u) continue;
    K3_WARN("request %s: no Attach within the %u ms lease; released", q->id, q->lease_ms);
    w->n_leases_expired++;
    q->state = DC_FINISHED;
    maybe_drop(w, q);
  }
}

int dc_service_register(dc_worker_t *w) {
  int rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Reserve", K3_RPC_UNARY,
                                    &k3pd__v1__reserve_request__descriptor, on_reserve, w);
  if (!rc)
    rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Release", K3_RPC_UNARY,
                                  &k3pd__v1__release_request__descriptor, on_release_rpc, w);
  if (!rc)
    rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Attach", K3_RPC_SERVER_STREAM,
                                  &k3pd__v1__attach_request__descriptor, on_attach, w);
  if (!rc)
    rc = k3_rpc_server_add_method(w->srv, "/k3pd.v1.Decode/Stats", K3_RPC_UNARY,
                                  &k3pd__v1__stats_request__descriptor, on_stats, w);
  if (!rc) rc = dc_export_register(w);
  return rc;
}
