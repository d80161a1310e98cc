/* The decode engine thread: continuous batching over the runner.
 *
 * Loop: take every queued message (admissions, cancellations), run one decode step for up to
 * max_batch running sequences (round-robin when more are running), sample each sequence's next
 * token with its own seed and step index (k3k_sample_row: a pure function of logits, params,
 * seed and step, so the tokens equal the monolithic generator's), and post the tokens to the
 * loop. A sequence finishes on a stop id or when it has produced max_new tokens (the first
 * token, sampled by prefill, counts). Idle: blocks on the queue with a 100 ms deadline.
 *
 * Only this thread touches the runner after dc_engine_start. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dc.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "k3pd/v1/common.pb-c.h"

typedef struct eseq {
  struct eseq *next;
  dc_msg_t *admit;     /* owns seq, pages, stop ids */
  uint32_t generated;  /* tokens produced so far (incl. the first) */
  uint32_t last_token;
  bool cancelled;
} eseq_t;

static bool is_stop(const dc_msg_t *a, uint32_t tok) {
  for (int i = 0; i < a->n_stop_ids; i++)
    if (a->stop_ids[i] == tok) return true;
  return false;
}

static dc_msg_t *new_out(uint64_t handle, int type) {
  dc_msg_t *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->link.type = type;
  o->handle = handle;
  return o;
}

static void post_out(dc_worker_t *w, dc_msg_t *o) {
  if (o) k3_inbox_post(&w->outbox, &o->link);
}

/* Frees an admission. Page and slot ids are the loop's (free lists and references, cache.c):
 * the runner has every id claimed (k3_runner_claim_all), so nothing goes back to it here. */
static void free_admit(dc_msg_t *a) {
  if (!a) return;
  free(a->page_store);
  free(a->stop_ids);
  free(a->prompt);
  free(a);
}

static void free_admit_r(k3_runner_t *r, dc_msg_t *a) {
  (void)r;
  free_admit(a);
}

/* Emits the first token (from prefill, or computed here for a split request) for a newly
 * admitted sequence; returns true if the sequence is already finished by it. */
static bool emit_first(dc_worker_t *w, eseq_t *s, float first_logprob) {
  dc_msg_t *a = s->admit;
  dc_msg_t *o = new_out(a->handle, DC_MSG_TOKENS);
  s->generated = 1;
  s->last_token = a->first_token;
  bool stop = is_stop(a, a->first_token);
  if (o) {
    o->n_tokens = 1;
    o->tokens[0] = a->first_token;
    o->logprobs[0] = first_logprob; /* NAN: filled by the loop from the reservation's DONE */
    if (stop) o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_STOP;
    else if (a->max_new <= 1) o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH;
  }
  post_out(w, o);
  return stop || a->max_new <= 1;
}

/* Admission: the runner adopts the reserved page and slot ids. In the zero-copy layouts the
 * state already sits in its pools (written there by the prefill worker, verified); in the staged
 * one it is copied in from the receive area first. */
static int import_state(dc_worker_t *w, dc_msg_t *a, uint8_t **buf, size_t *cap) {
  bool handed_off = !a->split || a->copy_slot < 0; /* a split request without a hit had a handoff */
  if (w->recv_mode != DC_RECV_STAGED || !handed_off || a->seq.len == 0) return 0;
  return dc_pools_import(w, &a->seq, buf, cap);
}

/* Starts a hit's sequence from the entry's KDA checkpoint (a copy into its own slot) and tells
 * the loop, which unpins the entry (ck_pos[0] 0). copy_slot becomes -1: done. */
static int copy_hit(dc_worker_t *w, dc_msg_t *a) {
  int rc = k3_runner_slot_copy(w->runner, a->seq.slot, a->copy_slot);
  if (rc) return rc;
  /* the unpin lets the loop evict the entry and hand its slot to a new reservation (which a
   * prefill worker may write at once): the copy must be over on the device first */
  k3k_backend_t *be = k3_runner_backend(w->runner);
  if (be->synchronize && (rc = be->synchronize(be)) != 0) return rc;
  a->copy_slot = -1;
  post_out(w, new_out(a->handle, DC_MSG_CKPT));
  return 0;
}

/* Split requests (prefix cache, cache.c), every one admitted in this turn of the loop at once:
 * each starts from its hit's KDA checkpoint when it has one (copied before), computes
 * prompt[start, n) in segments that end at the checkpoints to take (each a multiple of the
 * block: prefill(A) then prefill(B) == prefill(A|B) bit for bit there), copies the state into
 * each checkpoint's slot as it passes, and samples the first token (step 0, exactly as a prefill
 * worker does) from the last position's logits. The requests' segments run together, round by
 * round (the k-th segment of each in one runner call of at most maxb sequences), so several
 * conversations' turns arriving together cost about one pass, not one each. Results land in
 * each message (split_rc, split_lp, err, first_token). lg: maxb rows of vocab floats. */
static void run_splits(dc_worker_t *w, dc_msg_t **as, int n, int maxb, float *lg) {
  k3_runner_t *r = w->runner;
  /* CKPT messages wait until the device finished the checkpoint copies: once the loop marks an
   * entry ready, an Export may read its slot on another stream (export.c) */
  k3_msg_t *ck_head = NULL, **ck_tail = &ck_head;
  int64_t V = k3_runner_vocab(r);
  k3_prefill_item_t items[64];
  dc_msg_t *in[64];
  if (maxb > 64) maxb = 64;
  for (int i = 0; i < n; i++) {
    dc_msg_t *a = as[i];
    a->split_pos = a->start;
    a->split_k = 0;
    a->split_rc = 0;
    if (a->copy_slot >= 0 && (a->split_rc = copy_hit(w, a)) != 0)
      snprintf(a->err, sizeof a->err, "copying the cached KDA checkpoint: %s", k3_strerror(a->split_rc));
  }
  uint64_t t0 = k3_now_ns();
  for (;;) {
    /* the next segment of every request still computing, maxb at a time */
    int m = 0;
    for (int i = 0; i < n && m < maxb; i++) {
      dc_msg_t *a = as[i];
      if (a->split_rc || a->split_k > a->n_ck) continue;
      uint32_t end = a->split_k < a->n_ck ? a->ck_pos[a->split_k] : a->n_prompt;
      if (end <= a->split_pos) { /* nothing to compute before this checkpoint (it is at start) */
        a->split_end = end;
      } else {
        a->split_end = end;
        items[m] = (k3_prefill_item_t){.seq = &a->seq, .tokens = a->prompt + a->split_pos,
                                       .n_tokens = end - a->split_pos,
                                       .logits = end == a->n_prompt ? lg + (size_t)m * (size_t)V : NULL};
        in[m++] = a;
        continue;
      }
      /* an empty segment: take its checkpoint now */
      if (a->split_k < a->n_ck) {
        int rc = k3_runner_slot_copy(r, a->ck_slot[a->split_k], a->seq.slot);
        if (rc) {
          a->split_rc = rc;
          snprintf(a->err, sizeof a->err, "taking the KDA checkpoint at %u: %s", end, k3_strerror(rc));
        } else {
          dc_msg_t *o = new_out(a->handle, DC_MSG_CKPT);
          if (o) {
            o->ck_pos[0] = end;
            *ck_tail = &o->link;
            ck_tail = &o->link.next;
          }
        }
      }
      a->split_k++;
      i--; /* same request: its next segment */
    }
    if (m == 0) break;
    char err[256];
    int rc = k3_runner_prefill(r, items, m, NULL, NULL, err, sizeof err);
    for (int t = 0; t < m; t++) {
      dc_msg_t *a = in[t];
      if (rc) {
        a->split_rc = rc;
        snprintf(a->err, sizeof a->err, "%s", err);
        continue;
      }
      uint32_t end = a->split_end;
      a->split_pos = end;
      if (a->split_k < a->n_ck) {
        int crc = k3_runner_slot_copy(r, a->ck_slot[a->split_k], a->seq.slot);
        if (crc) {
          a->split_rc = crc;
          snprintf(a->err, sizeof a->err, "taking the KDA checkpoint at %u: %s", end, k3_strerror(crc));
          continue;
        }
        dc_msg_t *o = new_out(a->handle, DC_MSG_CKPT);
        if (o) {
          o->ck_pos[0] = end;
          *ck_tail = &o->link;
          ck_tail = &o->link.next;
        }
      }
      if (end == a->n_prompt) { /* the prompt's end (a checkpoint may sit there too): sample the
                                 * first token from its logits row */
        k3k_sample_cfg_t cfg = a->sample;
        cfg.step = 0;
        int32_t tok = 0;
        const float *row = items[t].logits;
        int src = k3k_sample_row(row, V, &cfg, &tok);
        if (src) {
          a->split_rc = src;
          snprintf(a->err, sizeof a->err, "sampling the first token: %s", k3_strerror(src));
          continue;
        }
        a->first_token = (uint32_t)tok;
        a->split_lp = a->want_logprobs ? (float)k3k_logprob_row(row, V, tok) : 0.0f;
      }
      a->split_k++;
    }
  }
  if (ck_head) {
    k3k_backend_t *be = k3_runner_backend(r);
    bool ok = !be->synchronize || be->synchronize(be) == 0; /* else: never ready, dropped at the end */
    for (k3_msg_t *c = ck_head, *next; c; c = next) {
      next = c->next;
      c->next = NULL;
      if (ok) post_out(w, (dc_msg_t *)c);
      else free(c);
    }
  }
  double secs = (double)(k3_now_ns() - t0) / 1e9;
  k3_histogram_observe(k3_metric_default(w->m.local_prefill_seconds), secs);
  K3_DEBUG("computed the prompt suffixes of %d split request(s) here in %.2f ms", n, secs * 1e3);
}

static void *engine_main(void *arg) {
  dc_worker_t *w = arg;
  eseq_t *run = NULL;
  int64_t V = k3_runner_vocab(w->runner);
  int maxb = w->max_batch;
  float *logits = malloc((size_t)maxb * (size_t)V * sizeof(float));
  k3_decode_item_t *items = calloc((size_t)maxb, sizeof *items);
  eseq_t **batch = calloc((size_t)maxb, sizeof *batch);
  k3k_sample_cfg_t *cfgs = calloc((size_t)maxb, sizeof *cfgs);
  int32_t *sampled = calloc((size_t)maxb, sizeof *sampled);
  if (!logits || !items || !batch || !cfgs || !sampled) {
    K3_ERROR("decode engine: out of memory for batch buffers");
    free(logits);
    free(items);
    free(batch);
    free(cfgs);
    free(sampled);
    return NULL;
  }
  bool stop = false;
  char err[256];
  uint8_t *ibuf = NULL;
  size_t icap = 0;
  /* Ids are the loop's to hand out (dc.h): the runner accepts any in-range id. */
  k3_runner_claim_all(w->runner);
  while (!stop) {
    k3_msg_t *m = k3_msgq_take_all(&w->engine.q);
    /* Hits first: copying a checkpoint is cheap and frees its pin before the suffixes below run
     * (each may take a while); a failure is reported when the request's turn comes. */
    int n_split = 0;
    for (k3_msg_t *h = m; h; h = h->next) {
      dc_msg_t *dm = (dc_msg_t *)h;
      if (h->type != DC_MSG_ADMIT || !dm->split) continue;
      if (dm->copy_slot >= 0) copy_hit(w, dm);
      n_split++;
    }
    /* Then every split request's suffix, together (the staged layout imports the handed-off
     * part first; a failed import is reported below). */
    if (n_split) {
      dc_msg_t **sp = calloc((size_t)n_split, sizeof *sp);
      int k = 0;
      for (k3_msg_t *h = m; h && sp; h = h->next) {
        dc_msg_t *dm = (dc_msg_t *)h;
        if (h->type != DC_MSG_ADMIT || !dm->split) continue;
        dm->import_rc = import_state(w, dm, &ibuf, &icap);
        dm->imported = true;
        if (!dm->import_rc) sp[k++] = dm;
      }
      if (sp) run_splits(w, sp, k, maxb, logits);
      else
        for (k3_msg_t *h = m; h; h = h->next)
          if (h->type == DC_MSG_ADMIT && ((dc_msg_t *)h)->split) ((dc_msg_t *)h)->split_rc = K3_ENOMEM;
      free(sp);
    }
    while (m) {
      k3_msg_t *next = m->next;
      dc_msg_t *dm = (dc_msg_t *)m;
      if (m->type == DC_MSG_ADMIT) {
        int src_import = 0;
        float split_lp = NAN;
        eseq_t *s = calloc(1, sizeof *s);
        if (!s) {
          dc_msg_t *o = new_out(dm->handle, DC_MSG_DONE);
          if (o) {
            o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR;
            snprintf(o->err, sizeof o->err, "decode engine out of memory");
          }
          post_out(w, o);
          free_admit(dm);
        } else if ((src_import = dm->imported ? dm->import_rc : import_state(w, dm, &ibuf, &icap)) != 0) {
          dc_msg_t *o = new_out(dm->handle, DC_MSG_TOKENS);
          if (o) {
            o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR;
            snprintf(o->err, sizeof o->err, "importing the handed-off state: %s", k3_strerror(src_import));
          }
          post_out(w, o);
          post_out(w, new_out(dm->handle, DC_MSG_DONE));
          free_admit(dm);
          free(s);
        } else if (dm->split && (src_import = dm->split_rc) != 0) {
          dc_msg_t *o = new_out(dm->handle, DC_MSG_TOKENS);
          if (o) {
            o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR;
            snprintf(o->err, sizeof o->err, "computing the prompt's suffix: %.280s", dm->err);
          }
          post_out(w, o);
          post_out(w, new_out(dm->handle, DC_MSG_DONE));
          free_admit(dm);
          free(s);
        } else {
          s->admit = dm;
          if (dm->split) split_lp = dm->split_lp;
          if (emit_first(w, s, dm->split ? split_lp : NAN)) {
            post_out(w, new_out(dm->handle, DC_MSG_DONE));
            free_admit_r(w->runner, dm);
            free(s);
          } else {
            s->next = run; /* order inside the batch does not change any result */
            run = s;
          }
        }
      } else if (m->type == DC_MSG_CANCEL) {
        for (eseq_t **pp = &run; *pp; pp = &(*pp)->next) {
          if ((*pp)->admit->handle == dm->handle) {
            eseq_t *s = *pp;
            *pp = s->next;
            dc_msg_t *o = new_out(s->admit->handle, DC_MSG_DONE);
            if (o) o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
            post_out(w, o);
            free_admit_r(w->runner, s->admit);
            free(s);
            break;
          }
        }
        free(dm);
      } else { /* DC_MSG_STOP */
        stop = true;
        free(dm);
      }
      m = next;
    }
    if (stop) break;
    if (!run) {
      k3_msgq_wait(&w->engine.q, 100);
      continue;
    }
    /* Build the batch: the first maxb sequences, then rotate them to the back so a long list
     * is served round-robin. */
    int n = 0;
    for (eseq_t *s = run; s && n < maxb; s = s->next) batch[n++] = s;
    /* Sampling inside the step (the runner samples on the device: greedy rows never copy their
     * logits out) unless a row wants its token's logprob, which needs the logits here. */
    bool want_lp = false;
    for (int i = 0; i < n; i++) want_lp |= batch[i]->admit->want_logprobs;
    for (int i = 0; i < n; i++) {
      dc_msg_t *a = batch[i]->admit;
      items[i].seq = &a->seq;
      items[i].token = (int32_t)batch[i]->last_token;
      items[i].logits = want_lp ? logits + (size_t)i * (size_t)V : NULL;
      cfgs[i] = a->sample;
      cfgs[i].step = batch[i]->generated;
      items[i].sample = want_lp ? NULL : &cfgs[i];
      items[i].sampled = want_lp ? NULL : &sampled[i];
    }
    uint64_t t0 = k3_now_ns();
    k3_runner_stats_t st0, st1;
    k3_runner_get_stats(w->runner, &st0);
    int rc = k3_runner_decode_step(w->runner, items, n, err, sizeof err);
    uint64_t step_ns = k3_now_ns() - t0;
    k3_histogram_observe(k3_metric_default(w->m.step_seconds), (double)step_ns / 1e9);
    k3_runner_get_stats(w->runner, &st1);
    const char *kind = st1.graph_replays > st0.graph_replays    ? "replayed"
                       : st1.graph_captures > st0.graph_captures ? "captured"
                                                                 : "eager";
    k3_metric_inc(w->m.steps_total, &kind);
    for (int i = 0; i < n; i++) {
      eseq_t *s = batch[i];
      dc_msg_t *a = s->admit;
      dc_msg_t *o = new_out(a->handle, DC_MSG_TOKENS);
      bool done = false;
      if (rc) {
        if (o) {
          o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR;
          snprintf(o->err, sizeof o->err, "decode step failed: %s", err);
        }
        done = true;
      } else {
        k3k_sample_cfg_t cfg = a->sample;
        cfg.step = s->generated;
        int32_t tok = 0;
        int src = want_lp ? k3k_sample_row(items[i].logits, V, &cfg, &tok) : (tok = sampled[i], 0);
        if (src) {
          if (o) {
            o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_ERROR;
            snprintf(o->err, sizeof o->err, "sampling failed: %s", k3_strerror(src));
          }
          done = true;
        } else {
          s->generated++;
          s->last_token = (uint32_t)tok;
          if (o) {
            o->n_tokens = 1;
            o->tokens[0] = (uint32_t)tok;
            o->logprobs[0] = a->want_logprobs ? (float)k3k_logprob_row(items[i].logits, V, tok) : 0.0f;
          }
          if (is_stop(a, (uint32_t)tok)) {
            done = true;
            if (o) o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_STOP;
          } else if (s->generated >= a->max_new) {
            done = true;
            if (o) o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_LENGTH;
          }
        }
      }
      post_out(w, o);
      if (done) {
        for (eseq_t **pp = &run; *pp; pp = &(*pp)->next) {
          if (*pp == s) {
            *pp = s->next;
            break;
          }
        }
        post_out(w, new_out(a->handle, DC_MSG_DONE));
        free_admit_r(w->runner, a);
        free(s);
        batch[i] = NULL;
      }
    }
    /* rotate: move the served (still running) prefix to the tail */
    if (run && n == maxb) {
      eseq_t *tail = run;
      while (tail->next) tail = tail->next;
      eseq_t *head = run;
      int moved = 0;
      while (head != tail && moved < n) {
        eseq_t *h = head;
        head = head->next;
        h->next = NULL;
        tail->next = h;
        tail = h;
        moved++;
      }
      run = head;
    }
  }
  while (run) { /* shutdown: report every running sequence as cancelled */
    eseq_t *s = run;
    run = s->next;
    dc_msg_t *o = new_out(s->admit->handle, DC_MSG_DONE);
    if (o) o->finish_reason = K3PD__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
    post_out(w, o);
    free_admit_r(w->runner, s->admit);
    free(s);
  }
  free(logits);
  free(items);
  free(batch);
  free(cfgs);
  free(sampled);
  free(ibuf);
  return NULL;
}

static void free_msg(k3_msg_t *m) { free_admit((dc_msg_t *)m); }

int dc_engine_start(dc_worker_t *w) { return k3_engine_start(&w->engine, engine_main, w); }

void dc_engine_post(dc_worker_t *w, dc_msg_t *m) { k3_engine_post(&w->engine, &m->link); }

void dc_engine_stop(dc_worker_t *w) {
  dc_msg_t *m = calloc(1, sizeof *m);
  if (m) m->link.type = DC_MSG_STOP;
  k3_engine_stop(&w->engine, m ? &m->link : NULL, free_msg);
}
