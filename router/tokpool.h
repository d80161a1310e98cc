/* k3pd-router's tokenisation pool: text encoding and chat rendering off the loop thread.
 *
 * Why: tokenising is the one CPU-heavy thing the router does per request (a 32 MiB text is
 * ~0.3 s, and the 50 MB text blocked every other request for 5 s), and the loop thread
 * must stay free to relay tokens. A few threads take jobs from a locked queue; results come
 * back through a k3_inbox_t (uv_async_send, the only thing that crosses into the loop) and each
 * job's `done` runs on the loop thread.
 *
 * Ownership and lifetimes (a contract for the submitter):
 *  - the job struct and every input it points to (text, messages, the chat options' JSON) stay
 *    valid and untouched by the loop until `done` runs: a pool thread reads them meanwhile
 *    (jansson values are not safe to share with a thread that changes their reference counts);
 *  - `done` receives the job back and owns it again (and job->ids.ids: take it or free it);
 *  - submit never fails; done runs exactly once per job, with rc K3_ESHUTDOWN when the pool
 *    closed before or while the job ran.
 * Threads: submit and close on the loop thread; the tokenizer is immutable and thread-safe
 * (tokenizer.h). Every wait of a pool thread has a deadline. */
#ifndef K3PD_ROUTER_TOKPOOL_H
#define K3PD_ROUTER_TOKPOOL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "k3pd/chat.h"
#include "k3pd/msgq.h"
#include "k3pd/tokenizer.h"

typedef enum { RT_TOK_TEXT = 1, RT_TOK_CHAT = 2 } rt_tok_kind_t;

typedef struct rt_tokjob rt_tokjob_t;
typedef void (*rt_tok_done_fn)(rt_tokjob_t *job);

struct rt_tokjob {
  k3_msg_t link;            /* the pool's */
  rt_tok_kind_t kind;
  const char *text;         /* RT_TOK_TEXT: borrowed, len bytes */
  size_t len;
  const json_t *messages;   /* RT_TOK_CHAT: borrowed */
  k3_chat_opts_t chat;      /* RT_TOK_CHAT (its JSON borrowed); .max_ids is set from max_ids */
  size_t max_ids;           /* > 0: give up past this many ids (K3_ERANGE) */
  rt_tok_done_fn done;
  void *arg;                /* the submitter's */
  /* results (valid in done) */
  k3_tok_ids_t ids;
  int rc;
  char err[512];
  uint64_t wait_ns, work_ns; /* queued, then tokenising */
  uint64_t t_submit;
};

typedef struct rt_tokpool rt_tokpool_t;

/* Starts `threads` (1..64) threads on tok (which must outlive the pool). K3_EINVAL, K3_ENOMEM,
 * K3_EINTERNAL (thread creation); on error nothing is left running. */
int rt_tokpool_init(uv_loop_t *loop, const k3_tok_t *tok, int threads, rt_tokpool_t **out);
/* Queues a job (loop thread). */
void rt_tokpool_submit(rt_tokpool_t *p, rt_tokjob_t *job);
/* Jobs queued or running. */
size_t rt_tokpool_pending(const rt_tokpool_t *p);
/* Stops the threads (a job running finishes), answers every job left with K3_ESHUTDOWN, closes
 * the async handle and frees the pool once it is closed. Loop thread; p may be NULL. */
void rt_tokpool_close(rt_tokpool_t *p);

#endif
