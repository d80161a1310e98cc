/* Measures this decode worker's own costs at start-up (localcost.h), when neither
 * --local-prefill-max-tokens nor --cost-profile is given.
 *
 * What it does: on the runner, before the engine thread starts (so nothing else uses it), one
 * untimed warm-up prefill (first-call costs), then prefills of 32 and 128 tokens (best of two
 * each: one pass each with chunks of 128 or more, 128 tokens take two with 64-token chunks, which
 * the fit accounts for) and a decode step of a full batch (--max-batch sequences, each at 128
 * tokens of context: the first one's KDA state copied into the others' slots, their pages
 * zeroed; best of three), the step the running streams take when the worker is busy.
 * The fit has the form of k3pd-bench --profile's:
 * pass fixed + per token from the two points; the context term is not probed (0: it would take
 * multi-chunk prefills; for suffixes of a few chunks it is a few per cent of the estimate, and a
 * --cost-profile supplies it). About 350 prompt tokens and three full-batch steps: 1-3 s on
 * the CPU backends with the tiny model, well under a second on a GPU.
 *
 * What it is not: a benchmark (k3pd-bench --profile is: it measures under load and fits many
 * points). The figure depends on the machine and its load at start-up by design; tests that
 * need a given path pin --local-prefill-max-tokens. The probe's page and slot go back to the
 * runner's pools, whose contents nobody reads before writing (a prefill from len 0 zeroes its
 * slot; pages are read only below a sequence's len). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dc.h"
#include "k3pd/err.h"
#include "k3pd/util.h"
#include "localcost.h"

static int probe_prefill(k3_runner_t *r, k3_seq_t *seq, const int32_t *tok, int64_t n, float *lg, double *ms,
                         char *err, size_t errlen) {
  seq->len = 0; /* from the zero state: the runner zeroes the slot */
  k3_prefill_item_t it = {.seq = seq, .tokens = tok, .n_tokens = n, .logits = lg};
  uint64_t t0 = k3_now_ns();
  int rc = k3_runner_prefill(r, &it, 1, NULL, NULL, err, errlen);
  *ms = (double)(k3_now_ns() - t0) / 1e6;
  return rc;
}

int dc_costs_measure(k3_runner_t *r, int num_pages, int page_tokens, int batch, dc_costs_t *out, char *err,
                     size_t errlen) {
  int64_t C = k3_runner_opts(r)->prefill_chunk_tokens;
  C = C <= 0 ? 256 : (C + 63) / 64 * 64;
  const int64_t L1 = 32, L2 = 128;
  int64_t passes2 = (L2 + C - 1) / C; /* 1, or 2 with 64-token chunks */
  if ((int64_t)num_pages * page_tokens < L2 + 4) {
    snprintf(err, errlen, "cost probe: the page pool (%d x %d tokens) holds less than %lld tokens", num_pages,
             page_tokens, (long long)L2 + 4);
    return K3_EINVAL;
  }
  int64_t V = k3_runner_vocab(r);
  int32_t *tok = malloc(sizeof *tok * (size_t)L2);
  float *lg = malloc(sizeof *lg * (size_t)V);
  int32_t *pages = malloc(sizeof *pages * (size_t)(num_pages));
  if (!tok || !lg || !pages) {
    free(tok);
    free(lg);
    free(pages);
    return K3_ENOMEM;
  }
  for (int64_t i = 0; i < L2; i++) tok[i] = (int32_t)((i * 7919 + 13) % (V > 1 ? V - 1 : 1));
  k3_seq_t seq = {.slot = -1, .pages = pages, .cap_pages = num_pages};
  int rc = k3_runner_seq_reserve(r, &seq, L2 + 4);
  if (rc) {
    snprintf(err, errlen, "cost probe: no page or slot for %lld tokens: %s", (long long)L2 + 4, k3_strerror(rc));
    goto out;
  }
  double t1 = 1e300, t2 = 1e300, ts = 1e300, ms = 0;
  rc = probe_prefill(r, &seq, tok, L1, lg, &ms, err, errlen); /* warm-up: first-call costs */
  for (int rep = 0; rep < 2 && !rc; rep++) {
    if (!(rc = probe_prefill(r, &seq, tok, L1, lg, &ms, err, errlen))) t1 = ms < t1 ? ms : t1;
    if (!rc && !(rc = probe_prefill(r, &seq, tok, L2, lg, &ms, err, errlen))) t2 = ms < t2 ? ms : t2;
  }
  /* the sequence now holds L2 tokens: the rest of the batch copies its state (as many as the
   * pools hold), then decode steps at that context */
  int cap = k3_runner_opts(r)->max_batch_seqs;
  if (batch > cap) batch = cap;
  if (batch < 1) batch = 1;
  int np = k3_runner_pages_for(r, L2 + 4);
  k3_seq_t *bs = calloc((size_t)batch, sizeof *bs);
  int32_t *bpages = calloc((size_t)batch * (size_t)np, sizeof *bpages);
  k3_decode_item_t *items = calloc((size_t)batch, sizeof *items);
  float *blg = malloc(sizeof *blg * (size_t)V * (size_t)batch);
  int nb = 0;
  if (!rc && (!bs || !bpages || !items || !blg)) rc = K3_ENOMEM;
  if (!rc) {
    bs[nb++] = seq;
    while (nb < batch) {
      k3_seq_t *q = &bs[nb];
      *q = (k3_seq_t){.slot = -1, .pages = bpages + (size_t)nb * (size_t)np, .cap_pages = np};
      if (k3_runner_seq_reserve(r, q, L2 + 4)) break; /* the pools are full: a smaller batch */
      if ((rc = k3_runner_slot_copy(r, q->slot, seq.slot)) != 0) {
        k3_runner_seq_release(r, q);
        snprintf(err, errlen, "cost probe: copying a KDA slot: %s", k3_strerror(rc));
        break;
      }
      q->len = L2;
      nb++;
    }
  }
  for (int rep = 0; rep < 3 && !rc; rep++) {
    for (int i = 0; i < nb; i++)
      items[i] = (k3_decode_item_t){.seq = &bs[i], .token = tok[rep + i % 8], .logits = blg + (size_t)i * (size_t)V};
    uint64_t t0 = k3_now_ns();
    rc = k3_runner_decode_step(r, items, nb, err, errlen);
    ms = (double)(k3_now_ns() - t0) / 1e6;
    ts = ms < ts ? ms : ts;
  }
  for (int i = 1; i < nb; i++) k3_runner_seq_release(r, &bs[i]);
  free(bs);
  free(bpages);
  free(items);
  free(blg);
  k3_runner_seq_release(r, &seq);
  if (rc) goto out;
  /* t1 = F + 32 a, t2 = passes2 x F + 128 a (F: per pass, a: per token) */
  dc_costs_t c = {.chunk_tokens = C};
  double a = (t2 - (double)passes2 * t1) / ((double)L2 - (double)passes2 * (double)L1);
  if (a > 0) {
    c.pass_per_token_ms = a;
    c.pass_fixed_ms = t1 - a * (double)L1 > 0 ? t1 - a * (double)L1 : 0;
  } else {
    c.pass_per_token_ms = t2 / (double)L2; /* noise hid the slope: charge it all per token */
  }
  c.step_fixed_ms = ts; /* the whole step of nb sequences (dc_local_max_derive asks for that batch) */
  c.step_batch = nb;
  snprintf(c.source, sizeof c.source,
           "measured at start-up: prefill %lld/%lld tokens in %.2f/%.2f ms, decode step of %d sequences %.2f ms",
           (long long)L1, (long long)L2, t1, t2, nb, ts);
  *out = c;
out:
  free(tok);
  free(lg);
  free(pages);
  return rc;
}
