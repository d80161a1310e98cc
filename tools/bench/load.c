/* k3pd-bench load generator: drives /k3pd.v1.Generation/Generate streams on a private uv loop
 * through k3_rpc's client, closed loop (a fixed number in flight) or open loop (Poisson
 * arrivals), and records per-request timings.
 *
 * Not here: statistics (report.c) or workload generation (workload.c).
 *
 * Phases: warm-up (closed loop at --concurrency, indexes from WARM_BASE, nothing recorded)
 * → measured (indexes 0, 1, 2, ... so request i here is request i of the monolithic replay)
 * → drain (nothing new is sent; wait for the calls in flight) → client close → loop exits.
 * Every call carries a gRPC deadline, and a watchdog cancels everything if no message or
 * completion arrives for timeout + 5 s, so the loop always ends.
 *
 * Timing: t_start is taken just before the call starts (open loop: the actual send time, up to
 * one timer tick (~1 ms) after the scheduled arrival); TTFT = first chunk carrying a token −
 * t_start; inter-token samples: a chunk with k tokens arriving g after the previous one gives
 * k samples of g / k (chunks normally carry one token). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "bench.h"
#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/rpc_client.h"
#include "k3pd/util.h"
#include "k3pd/v1/generation.pb-c.h"

#define WARM_BASE (1ull << 40) /* warm-up request indexes: never collide with measured ones */

typedef enum { PH_WARMUP = 0, PH_MEASURE, PH_DRAIN, PH_CLOSED } phase_t;

typedef struct ctx ctx_t;

/* A chat conversation (w->chat_turns > 0): the history its next turn starts with. */
typedef struct {
  uint32_t *hist;
  size_t n_hist;
  uint32_t turn;   /* next turn to send */
  bool busy;       /* a turn is in flight */
} conv_t;

typedef struct inflight {
  struct inflight *next, *prev;
  ctx_t *c;
  bool measured;
  size_t slot;               /* index into run->res when measured */
  bn_result_t warm;          /* scratch record for warm-up requests */
  uint64_t t_prev;
  k3_rpc_ccall_t *call;
  long conv;                 /* chat: the conversation (-1 otherwise) */
} inflight_t;

struct ctx {
  uv_loop_t loop;
  uv_timer_t arrivals, watchdog;
  uv_signal_t sigint;
  k3_rpc_client_t *cli;
  const bn_workload_t *w;
  const bn_load_opts_t *o;
  bn_run_t *run;
  phase_t phase;
  uint64_t warm_sent, sent;  /* requests started per phase */
  size_t res_cap;
  inflight_t *live;          /* doubly linked list of calls in flight */
  int n_live;
  uint64_t next_arrival;     /* open loop: absolute ns of the next arrival */
  uint64_t last_progress;    /* ns of the last message or completion (watchdog) */
  uint64_t rng;              /* open loop inter-arrival RNG */
  int fatal;                 /* K3_E* that stopped the run, 0 if none */
  char run_tag[32];
  conv_t *conv;              /* chat: one per conversation (requests / chat_turns) */
  size_t n_conv;
};

static bn_result_t *rec(inflight_t *f) { return f->measured ? &f->c->run->res[f->slot] : &f->warm; }

static void maybe_finish(ctx_t *c);
static void pump(ctx_t *c);

static void on_msg(void *arg, const ProtobufCMessage *msg) {
  inflight_t *f = arg;
  ctx_t *c = f->c;
  const K3pd__V1__GenerateResponse *r = (const K3pd__V1__GenerateResponse *)msg;
  bn_result_t *x = rec(f);
  uint64_t now = k3_now_ns();
  c->last_progress = now;
  if (r->n_token_ids) {
    if (!x->t_first) {
      x->t_first = now;
    } else if (f->measured) {
      double gap_ms = (double)(now - f->t_prev) / 1e6 / (double)r->n_token_ids;
      for (size_t i = 0; i < r->n_token_ids; i++)
        if (bn_vec_push(&c->run->itl_ms, gap_ms)) c->fatal = K3_ENOMEM;
      if (gap_ms > x->gap_max_ms) x->gap_max_ms = gap_ms;
      if (x->gap1_ms == 0) x->gap1_ms = gap_ms;
    }
    f->t_prev = now;
    if (f->measured && c->o->keep_ids) {
      uint32_t *nv = realloc(x->ids, ((size_t)x->n_tokens + r->n_token_ids) * sizeof *nv);
      if (!nv) {
        c->fatal = K3_ENOMEM;
      } else {
        memcpy(nv + x->n_tokens, r->token_ids, r->n_token_ids * sizeof *nv);
        x->ids = nv;
      }
    }
    x->n_tokens += (uint32_t)r->n_token_ids;
  }
  if (r->finish_reason) {
    x->finish_reason = r->finish_reason;
    if (r->usage) {
      x->prompt_tokens = r->usage->prompt_tokens;
      x->cached_tokens = r->usage->cached_prompt_tokens;
    }
    if (r->timings) {
      x->have_timings = true;
      x->queue_us = r->timings->queue_us;
      x->prefill_us = r->timings->prefill_us;
      x->handoff_us = r->timings->handoff_us;
      x->first_token_us = r->timings->first_token_us;
      x->decode_us = r->timings->decode_us;
      x->total_us = r->timings->total_us;
    }
  }
}

static void on_done(void *arg, const k3_rpc_status_t *st) {
  inflight_t *f = arg;
  ctx_t *c = f->c;
  bn_result_t *x = rec(f);
  uint64_t now = k3_now_ns();
  c->last_progress = now;
  x->t_end = now;
  x->code = st->code;
  x->complete = st->code == K3_RPC_OK && x->finish_reason != 0;
  if (st->code != K3_RPC_OK && f->measured && c->o->timeout_ms)
    K3_DEBUG("request %llu: %s: %s", (unsigned long long)x->index, k3_rpc_code_name(st->code), st->details);
  if (f->measured && now > c->run->t_end) c->run->t_end = now;
  if (f->conv >= 0) { /* the conversation's next turn continues from this prompt + reply */
    conv_t *v = &c->conv[f->conv];
    v->busy = false;
    v->turn++;
    uint32_t *nh = x->complete ? realloc(v->hist, (x->n_prompt + x->n_tokens + 1) * sizeof *nh) : NULL;
    if (!nh) {
      if (x->complete) c->fatal = K3_ENOMEM;
      v->turn = c->w->chat_turns; /* a failed turn ends its conversation */
    } else {
      memcpy(nh, x->prompt, x->n_prompt * sizeof *nh);
      if (x->n_tokens) memcpy(nh + x->n_prompt, x->ids, x->n_tokens * sizeof *nh);
      v->hist = nh;
      v->n_hist = x->n_prompt + x->n_tokens;
    }
  }
  if (f->prev) f->prev->next = f->next;
  else c->live = f->next;
  if (f->next) f->next->prev = f->prev;
  c->n_live--;
  free(f->warm.ids);
  free(f);
  pump(c);
  maybe_finish(c);
}

/* Starts request `index` (conv >= 0: a chat turn, its prompt = the conversation's history + the
 * spec's ids); returns 0 or a negative K3_E* (then nothing is in flight for it). */
static int send_one(ctx_t *c, uint64_t index, bool measured, long conv) {
  bn_req_spec_t s;
  int rc = bn_spec_make(c->w, index, &s);
  if (rc) return rc;
  if (conv >= 0 && c->conv[conv].n_hist) {
    conv_t *v = &c->conv[conv];
    uint32_t *ids = malloc((v->n_hist + s.n_ids) * sizeof *ids);
    if (!ids) {
      bn_spec_free(&s);
      return K3_ENOMEM;
    }
    memcpy(ids, v->hist, v->n_hist * sizeof *ids);
    memcpy(ids + v->n_hist, s.ids, s.n_ids * sizeof *ids);
    free(s.ids);
    s.ids = ids;
    s.n_ids += v->n_hist;
  }
  inflight_t *f = calloc(1, sizeof *f);
  if (!f) {
    bn_spec_free(&s);
    return K3_ENOMEM;
  }
  f->c = c;
  f->measured = measured;
  f->conv = conv;
  if (measured) {
    bn_run_t *run = c->run;
    if (run->n_res == c->res_cap) {
      size_t cap = c->res_cap ? c->res_cap * 2 : 256;
      bn_result_t *nr = realloc(run->res, cap * sizeof *nr);
      if (!nr) {
        free(f);
        bn_spec_free(&s);
        return K3_ENOMEM;
      }
      run->res = nr;
      c->res_cap = cap;
    }
    f->slot = run->n_res++;
  }
  bn_result_t *x = rec(f);
  memset(x, 0, sizeof *x);
  x->index = index;
  x->code = -1;
  if (conv >= 0) { /* keep the prompt: the next turn and --ids-out need it */
    x->prompt = malloc((s.n_ids ? s.n_ids : 1) * sizeof *x->prompt);
    if (!x->prompt) {
      if (measured) c->run->n_res--;
      free(f);
      bn_spec_free(&s);
      return K3_ENOMEM;
    }
    memcpy(x->prompt, s.ids, s.n_ids * sizeof *x->prompt);
    x->n_prompt = s.n_ids;
  }

  K3pd__V1__GenerateRequest g = K3PD__V1__GENERATE_REQUEST__INIT;
  K3pd__V1__TokenIds ti = K3PD__V1__TOKEN_IDS__INIT;
  K3pd__V1__SamplingParams sp = K3PD__V1__SAMPLING_PARAMS__INIT;
  K3pd__V1__StopConditions stop = K3PD__V1__STOP_CONDITIONS__INIT;
  if (s.text) {
    g.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TEXT;
    g.text = (char *)s.text;
  } else {
    ti.ids = s.ids;
    ti.n_ids = s.n_ids;
    g.input_case = K3PD__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
    g.token_ids = &ti;
  }
  sp.temperature_opt_case = K3PD__V1__SAMPLING_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
  sp.temperature = (float)c->w->temperature;
  if (c->w->top_p < 1.0) {
    sp.top_p_opt_case = K3PD__V1__SAMPLING_PARAMS__TOP_P_OPT_TOP_P;
    sp.top_p = (float)c->w->top_p;
  }
  sp.top_k = c->w->top_k;
  sp.seed_opt_case = K3PD__V1__SAMPLING_PARAMS__SEED_OPT_SEED;
  sp.seed = s.seed;
  g.sampling = &sp;
  stop.max_new_tokens = s.max_new;
  stop.ignore_eos = c->w->ignore_eos;
  g.stop = &stop;
  char rid[64];
  snprintf(rid, sizeof rid, "%s-%s%llu", c->run_tag, measured ? "" : "w", (unsigned long long)(index & ~WARM_BASE));
  g.request_id = rid;
  k3_rpc_call_opts_t co = {.timeout_ms = c->o->timeout_ms, .request_id = rid};
  x->t_start = k3_now_ns();
  rc = k3_rpc_stream(c->cli, c->o->router, "/k3pd.v1.Generation/Generate", &g.base,
                     &k3pd__v1__generate_response__descriptor, &co, on_msg, on_done, f, &f->call);
  bn_spec_free(&s);
  if (rc) {
    x->t_end = x->t_start; /* recorded as a start failure (code -1) */
    free(f);
    return rc;
  }
  if (conv >= 0) c->conv[conv].busy = true;
  f->next = c->live;
  if (c->live) c->live->prev = f;
  c->live = f;
  c->n_live++;
  return 0;
}

static bool measured_left(ctx_t *c, uint64_t now) {
  if (c->o->duration_s > 0) return (double)(now - c->run->t_begin) < c->o->duration_s * 1e9;
  return c->sent < c->o->requests;
}

static void start_measuring(ctx_t *c) {
  c->phase = PH_MEASURE;
  c->run->t_begin = c->run->t_end = k3_now_ns();
  c->next_arrival = c->run->t_begin; /* open loop: the first arrival is at once */
}

static void on_arrival(uv_timer_t *t);

/* Sends what the current phase allows; moves warm-up → measured → drain. */
static void pump(ctx_t *c) {
  if (c->phase >= PH_DRAIN) return;
  if (c->fatal) {
    c->phase = PH_DRAIN;
    return;
  }
  if (c->phase == PH_WARMUP) {
    while (c->n_live < c->o->concurrency && c->warm_sent < c->o->warmup) {
      int rc = send_one(c, WARM_BASE + c->warm_sent, false, -1);
      c->warm_sent++;
      if (rc) {
        c->fatal = rc;
        c->phase = PH_DRAIN;
        return;
      }
    }
    if (c->warm_sent < c->o->warmup || c->n_live) return;
    start_measuring(c);
  }
  if (c->phase != PH_MEASURE) return;
  uint64_t now = k3_now_ns();
  if (c->o->rate > 0) {
    while (c->next_arrival <= now && measured_left(c, c->next_arrival)) {
      uint64_t idx = c->sent++;
      if (c->n_live >= c->o->max_inflight) {
        c->run->dropped++;
      } else {
        int rc = send_one(c, idx, true, -1);
        if (rc) { /* the client cannot send: stop (a started slot keeps code -1) */
          c->fatal = rc;
          c->phase = PH_DRAIN;
          uv_timer_stop(&c->arrivals);
          return;
        }
      }
      c->next_arrival += (uint64_t)(bn_arrival_gap_s(&c->rng, c->o->rate) * 1e9);
    }
    if (!measured_left(c, c->next_arrival)) {
      c->phase = PH_DRAIN;
      uv_timer_stop(&c->arrivals);
      return;
    }
    uint64_t wait_ms = c->next_arrival > now ? (c->next_arrival - now + 999999) / 1000000 : 0;
    uv_timer_start(&c->arrivals, on_arrival, wait_ms, 0);
    return;
  }
  if (c->n_conv) { /* chat: each conversation's next turn once its previous one finished */
    bool left = false;
    for (size_t k = 0; k < c->n_conv; k++) {
      conv_t *v = &c->conv[k];
      if (v->turn >= c->w->chat_turns) continue;
      left = true;
      if (v->busy || c->n_live >= c->o->concurrency) continue;
      int rc = send_one(c, (uint64_t)k * c->w->chat_turns + v->turn, true, (long)k);
      c->sent++;
      if (rc) {
        c->fatal = rc;
        c->phase = PH_DRAIN;
        return;
      }
    }
    if (!left) c->phase = PH_DRAIN;
    return;
  }
  while (c->n_live < c->o->concurrency && measured_left(c, now)) {
    uint64_t idx = c->sent++;
    int rc = send_one(c, idx, true, -1);
    if (rc) {
      c->fatal = rc;
      c->phase = PH_DRAIN;
      return;
    }
  }
  if (!measured_left(c, now)) c->phase = PH_DRAIN;
}

static void on_arrival(uv_timer_t *t) {
  ctx_t *c = t->data;
  pump(c);
  maybe_finish(c);
}

static void on_client_closed(void *arg) { (void)arg; }

/* Runs from a timer, never inside a k3_rpc callback: the client is not closed from its own
 * completion dispatch. */
static void close_all(uv_timer_t *t) {
  ctx_t *c = t->data;
  uv_timer_stop(&c->arrivals);
  uv_timer_stop(&c->watchdog);
  uv_close((uv_handle_t *)&c->arrivals, NULL);
  uv_close((uv_handle_t *)&c->watchdog, NULL);
  uv_close((uv_handle_t *)&c->sigint, NULL);
  k3_rpc_client_close(c->cli, on_client_closed, c);
  c->cli = NULL;
}

static void maybe_finish(ctx_t *c) {
  if (c->phase != PH_DRAIN || c->n_live) return;
  c->phase = PH_CLOSED;
  uv_timer_stop(&c->arrivals);
  uv_timer_start(&c->arrivals, close_all, 0, 0);
}

static void cancel_all(ctx_t *c, const char *why) {
  if (c->phase == PH_CLOSED) return;
  c->phase = PH_DRAIN;
  uv_timer_stop(&c->arrivals);
  if (c->n_live) K3_WARN("k3pd-bench: %s: cancelling %d requests in flight", why, c->n_live);
  for (inflight_t *f = c->live; f; f = f->next) k3_rpc_ccall_cancel(f->call);
  maybe_finish(c);
}

static void on_watchdog(uv_timer_t *t) {
  ctx_t *c = t->data;
  if (c->phase == PH_CLOSED) return;
  uint64_t quiet_ms = (k3_now_ns() - c->last_progress) / 1000000;
  if (c->n_live && quiet_ms > (uint64_t)c->o->timeout_ms + 5000) cancel_all(c, "no progress");
}

static void on_sigint(uv_signal_t *s, int signum) {
  (void)signum;
  cancel_all(s->data, "interrupted");
}

int bn_load_run(const bn_workload_t *w, const bn_load_opts_t *o, bn_run_t *run, char *err, size_t errlen) {
  memset(run, 0, sizeof *run);
  ctx_t *c = calloc(1, sizeof *c);
  if (!c) return K3_ENOMEM;
  c->w = w;
  c->o = o;
  c->run = run;
  c->rng = bn_arrival_rng(w->seed);
  if (w->chat_turns) { /* requests = conversations x turns (main.c checks) */
    c->n_conv = (size_t)(o->requests / w->chat_turns);
    c->conv = calloc(c->n_conv ? c->n_conv : 1, sizeof *c->conv);
    if (!c->conv) {
      free(c);
      return K3_ENOMEM;
    }
  }
  snprintf(c->run_tag, sizeof c->run_tag, "bench%d-%llx", (int)getpid(),
           (unsigned long long)(k3_wall_ms() & 0xffffff));
  int rc = uv_loop_init(&c->loop);
  if (rc) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    free(c->conv);
    free(c);
    return K3_EINTERNAL;
  }
  k3_rpc_client_opts_t copts = {.default_timeout_ms = o->timeout_ms};
  rc = k3_rpc_client_init(&c->loop, &copts, &c->cli);
  if (rc) {
    snprintf(err, errlen, "k3_rpc_client_init: %s", k3_strerror(rc));
    uv_loop_close(&c->loop);
    free(c->conv);
    free(c);
    return rc;
  }
  uv_timer_init(&c->loop, &c->arrivals);
  uv_timer_init(&c->loop, &c->watchdog);
  uv_signal_init(&c->loop, &c->sigint);
  c->arrivals.data = c->watchdog.data = c->sigint.data = c;
  uv_timer_start(&c->watchdog, on_watchdog, 1000, 1000);
  uv_signal_start(&c->sigint, on_sigint, SIGINT);
  c->last_progress = k3_now_ns();
  c->phase = o->warmup ? PH_WARMUP : PH_MEASURE;
  if (c->phase == PH_MEASURE) start_measuring(c);
  pump(c);
  maybe_finish(c);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&c->loop);
  if (rc) K3_WARN("k3pd-bench: uv_loop_close: %s", uv_strerror(rc));
  int fatal = c->fatal;
  for (size_t k = 0; k < c->n_conv; k++) free(c->conv[k].hist);
  free(c->conv);
  free(c);
  if (fatal) {
    snprintf(err, errlen, "load generation stopped: %s", k3_strerror(fatal));
    return fatal;
  }
  return 0;
}

void bn_run_free(bn_run_t *run) {
  for (size_t i = 0; i < run->n_res; i++) {
    free(run->res[i].ids);
    free(run->res[i].prompt);
  }
  free(run->res);
  free(run->itl_ms.v);
  memset(run, 0, sizeof *run);
}
