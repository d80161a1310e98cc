/* Runner helpers of the GPU programs; see gpu_runner_util.h. */
#include "gpu_runner_util.h"

#include <stdio.h>
#include <string.h>

#include "k3pd/err.h"

void gseq_init(gseq_t *q) {
  memset(q, 0, sizeof *q);
  q->s.slot = -1;
  q->s.pages = q->pages;
  q->s.cap_pages = GSEQ_MAX_PAGES;
}

int grunner_new(const k3_weights_t *w, const char *be, int threads, int num_pages, const char *prog,
                k3_runner_t **r) {
  int rc = grunner_new_ex(w, be, threads, num_pages, 4, 4, 512, prog, r);
  /* k3k-gpu-opdiff's shadow copies every op's arguments to the host (a synchronisation), which
   * a graph capture cannot contain: keep these runners' decode steps eager */
  if (!rc) k3_runner_set_graphs(*r, false);
  return rc;
}

void grunner_opts(k3_runner_opts_t *o, const char *be, int threads, int num_pages, int num_slots, int max_batch,
                  int prefill_chunk) {
  k3_runner_opts_default(o);
  o->precision = K3_RUNNER_BF16;
  o->backend = be;
  o->threads = threads;
  o->page_tokens = 64;
  o->num_pages = num_pages;
  o->num_slots = num_slots;
  o->max_batch_seqs = max_batch;
  o->prefill_chunk_tokens = prefill_chunk;
}

int grunner_new_ex(const k3_weights_t *w, const char *be, int threads, int num_pages, int num_slots,
                   int max_batch, int prefill_chunk, const char *prog, k3_runner_t **r) {
  k3_runner_opts_t o;
  grunner_opts(&o, be, threads, num_pages, num_slots, max_batch, prefill_chunk);
  char err[512] = "";
  int rc = k3_runner_init(w, &o, r, err, sizeof err);
  if (rc) fprintf(stderr, "%s: %s runner: %s (%s)\n", prog, be, err, k3_strerror(rc));
  return rc;
}
