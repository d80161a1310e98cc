/* k3pd-prefill internals shared by its files (not a public API).
 *
 * Threads: the loop thread owns the gRPC calls, the transfer sends and the job table; the
 * engine thread owns the runner (and so the local pages/slots a prompt is computed into).
 * Per job, the engine posts in order: STARTED (local page/slot ids known) → LAYER l for every
 * layer as its state becomes final (in the pass holding the prompt's last chunk) → FINISHED
 * (first token sampled) or FAILED. The loop starts the UCX send on STARTED, pushes each layer's
 * regions on LAYER (overlapping the remaining layers' compute), and on FINISHED flushes and
 * sends DONE. When the send completes the loop answers the Prefill RPC and posts FREE so the
 * engine returns the local pages/slot; a FREE for a prompt still computing (cancel, abort)
 * drops it, and the engine's FREE echo is then the last message for that job. */
#ifndef K3PD_PREFILL_PF_H
#define K3PD_PREFILL_PF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "k3_runner.h"
#include "k3k.h"
#include "k3pd/metrics.h"
#include "k3pd/metrics_k3pd.h"
#include "k3pd/msgq.h"
#include "k3pd/registrar.h"
#include "k3pd/rpc.h"
#include "k3pd/rpc_client.h"
#include "k3pd/spools.h"
#include "k3pd/xdev_hooks.h"
#include "k3pd/xfer.h"

typedef enum { PF_QUEUED = 0, PF_RUNNING, PF_SENDING, PF_DONE } pf_state_t;

typedef struct pf_job {
  struct pf_job *next;
  char id[129];
  uint64_t epoch;
  pf_state_t state;
  k3_rpc_call_t *call;       /* the Prefill RPC; NULL once answered */
  int32_t *tokens;           /* owned */
  uint32_t n_tokens;
  k3k_sample_cfg_t sample;
  k3_xfer_desc_t *desc;      /* owned */
  k3_xfer_send_t *send;      /* live send, or NULL */
  k3_xfer_src_t *srcs;       /* owned, desc->n_regions entries */
  uint32_t *src_idx;         /* owned: local page ids then the slot id */
  bool cancelled;            /* Abort or the caller went away */
  bool counted;              /* n_tokens counted in the worker's queued_tokens (until computed) */
  bool computing;            /* STARTED seen, no FINISHED/FAILED/FREE yet (counted in running) */
  uint64_t pass_seen;        /* engine passes started when it arrived (pf_worker_t.passes_*) */
  bool pass_in_progress;     /* a pass was running when it arrived */
  uint64_t passes;           /* engine passes its wait overlapped, its own last one included */
  bool engine_has;           /* the engine still holds local state for it (until FREE echo) */
  bool free_posted;          /* FREE sent to the engine (exactly once) */
  uint32_t layers_signalled;
  uint32_t first_token;
  float first_logprob;
  int status;                /* K3_E* of the outcome */
  char err[320];
  uint64_t t_arrive_ns, t_start_ns, t_computed_ns, t_done_ns;
  uint64_t bytes;
  /* Long-suffix resume (resume.c; docs/design.md "Long-suffix hits"). resume: the decode
   * reservation covers the state from this token on (only that part is pushed). prepared: made
   * by PrepareResume (local state reserved at once, a receive reservation over its first
   * `resume` tokens); the Prefill call joins it later. */
  uint32_t resume;
  bool prepared;
  bool retired;              /* a prepared job that will not be used: only waits to be freed */
  k3_rpc_call_t *prep_call;  /* the PrepareResume call until answered */
  uint32_t prep_lease_ms;
  uint64_t recv_handle;      /* its receive reservation (k3_xfer), unique on this worker */
  bool recv_live;            /* the transfer layer may still write the local state */
  bool recv_ready;           /* the decode worker's state arrived and was verified */
  int64_t prep_deadline_ms;  /* wall clock: retired if no Prefill joined by then */
  const k3_seq_t *seq;       /* the engine's local sequence, once reserved (valid until FREE) */
} pf_job_t;

typedef enum {
  PF_MSG_RUN = 1, PF_MSG_FREE, PF_MSG_STOP, PF_MSG_STARTED, PF_MSG_LAYER, PF_MSG_FINISHED, PF_MSG_FAILED,
  PF_MSG_RESERVE,  /* loop → engine: a prepared job's local state now (not runnable yet) */
  PF_MSG_RESERVED, /* engine → loop: reserved (seq set) */
  PF_MSG_RESUME    /* loop → engine: its state at job->resume arrived: continue from there (STARTED) */
} pf_msg_type_t;

typedef struct {
  k3_msg_t link;
  pf_job_t *job;   /* loop-owned; the engine only reads tokens/n_tokens/sample before STARTED */
  /* STARTED */
  k3_seq_t *seq;   /* engine-owned local sequence (valid until FREE) */
  /* LAYER */
  int layer;
  /* FINISHED / FAILED */
  uint64_t pass;   /* FINISHED: index of the pass that held the prompt's last chunk */
  uint32_t token;
  float logprob;
  int status;
  char err[300];
} pf_msg_t;

typedef struct pf_worker {
  uv_loop_t *loop;
  k3_rpc_server_t *srv;
  k3_rpc_client_t *cli;
  k3_registrar_t *reg;
  k3_xfer_ctx_t *xfer;
  k3_runner_t *runner;       /* engine thread's after pf_engine_start */
  const k3_manifest_t *manifest;
  uint64_t fingerprint;
  int64_t vocab;
  int max_batch;
  int64_t max_batch_tokens;
  uint32_t send_deadline_ms;
  k3_xfer_path_t path;        /* --xfer-path (AUTO: k3_xfer chooses per send) */
  k3_xhooks_t *hooks;         /* device digest/copy jobs and peer mappings (cuda), else NULL */
  /* receiving cached state (resume.c): the runner's state arena as a pool, and the receiver */
  k3_spools_t sp;
  bool sp_planned;
  k3_xfer_src_pool_t src_pool; /* sp as a cuda-pull source pool (sends borrow it) */
  k3_xfer_recv_t *recv;       /* NULL: this worker cannot receive (PrepareResume refused) */
  char recv_why[200];         /* why not */
  uint64_t next_recv_handle;
  pf_job_t *jobs;
  bool draining;
  k3_engine_t engine;         /* engine thread + its inbound queue */
  k3_inbox_t outbox;
  uint64_t queued_tokens;    /* prompt tokens of jobs whose prefill has not finished */
  _Atomic uint64_t passes_started, passes_done; /* engine forward passes (written by the engine) */
  uint32_t running;
  uint64_t n_ok, n_failed, bytes_sent;
  /* metrics (loop thread, and lock-free from the engine thread) */
  k3_metrics_t *mreg;
  k3_prefill_metrics_t m;
  k3_metrics_http_t *mhttp;
  int health; /* last readiness reported: -1 unknown, 0, 1 */
} pf_worker_t;

/* main.c: refresh gauges and readiness (loop thread). */
void pf_metrics_refresh(pf_worker_t *w);

int pf_engine_start(pf_worker_t *w);
void pf_engine_post(pf_worker_t *w, pf_msg_t *m);
void pf_engine_stop(pf_worker_t *w);

int pf_service_register(pf_worker_t *w);

/* resume.c: PrepareResume, the receiver's callbacks and prepared jobs' lifetime. */
int pf_resume_register(pf_worker_t *w);
void pf_on_xfer_ready(void *ud, const k3_xfer_ready_t *r);
void pf_on_xfer_release(void *ud, uint64_t request_id, void *owner);
/* The engine reserved (or failed to reserve) a prepared job's local state. */
void pf_resume_reserved(pf_worker_t *w, pf_job_t *j, const k3_seq_t *seq);
/* resume_tokens must be a multiple of this worker's page size: else the call is answered
 * INVALID_ARGUMENT naming the field and true is returned. */
bool pf_resume_tokens_bad(pf_worker_t *w, k3_rpc_call_t *call, uint32_t resume_tokens);
/* Test hook (k3_xfer_recv_opts_t.test_before_verify) behind K3PD_TEST_CORRUPT_RESUME. */
void pf_test_corrupt(void *ud, uint64_t request_id);
/* Retires prepared jobs whose Prefill did not come within their lease (timer). */
void pf_resume_expire(pf_worker_t *w);
/* A prepared job will not be used (fallback, abort, expiry): cancel its receive reservation;
 * its local state is freed once the transfer layer released it. */
void pf_resume_retire(pf_worker_t *w, pf_job_t *j);
/* service.c helpers resume.c shares */
pf_job_t *pf_job_find(pf_worker_t *w, const char *id, uint64_t epoch);
void pf_job_post_free(pf_worker_t *w, pf_job_t *j);
void pf_job_maybe_drop(pf_worker_t *w, pf_job_t *j);
void pf_on_engine_msg(k3_msg_t *m, void *ud);
void pf_fill_load(void *ud, K3pd__V1__WorkerLoad *load);

#endif
