/* The prefill worker's scheduling policy (pure: no threads, no runner, no clocks), used by the
 * engine thread (engine.c) and tested alone (tests/unit/prefill/test_pf_sched.c).
 *
 * Fair chunked prefill. A prompt is not run to completion in one forward pass any more: every
 * pass takes at most one chunk (the runner's prefill chunk C) of each chosen prompt, so a
 * prompt of L tokens needs ceil(L / C) passes and other prompts join the passes in between. A
 * pass holds at most `max_seqs` prompts and `budget` tokens (the first chosen chunk always
 * runs, even when it alone exceeds the budget). Splitting a prompt across calls is exact: the
 * runner guarantees prefill(A) then prefill(B) == prefill(A|B) for any split, and a sequence's
 * result never depends on the others in its pass, so the tokens do not change.
 *
 * Order: shortest remaining prompt first, with aging. A candidate's score is
 *     remaining_tokens - C * waited
 * where `waited` counts the consecutive passes in which it was runnable but not chosen (reset
 * to 0 whenever it runs). Lower scores go first; ties keep the candidates' given (arrival)
 * order. So a fresh short prompt is chosen for the very next pass (its time to first token is
 * at most the pass in progress plus its own pass), and a long prompt that keeps losing gains a
 * chunk per pass lost: after at most ceil(remaining / C) lost passes it outranks any newcomer,
 * which bounds starvation.
 *
 * Admission (which queued prompts get local pages and a KDA slot) uses the same score; a
 * prompt that needs more than one pass is admitted only while room for one more single-pass
 * prompt remains (pf_sched_headroom_ok), so short prompts never wait for long ones to free
 * their local state. */
#ifndef K3PD_PREFILL_SCHED_H
#define K3PD_PREFILL_SCHED_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
  int64_t remaining; /* prompt tokens not prefilled yet (> 0 for a runnable candidate) */
  uint32_t waited;   /* consecutive passes runnable but not chosen (updated by pf_sched_pick) */
  int64_t take;      /* out: tokens of this candidate in the pass (0 = not chosen) */
} pf_cand_t;

/* Lower runs first. */
int64_t pf_sched_score(int64_t remaining, uint32_t waited, int64_t chunk);

/* Chooses the next pass among n candidates (order = arrival order, for ties): sets take for
 * each, updates waited (0 for the chosen, +1 for the others), and returns the number chosen
 * (0 only when n == 0). chunk >= 1, budget >= 1, max_seqs >= 1. Scratch of n entries each:
 * `order` receives the candidate indices in score order, `score` their scores. */
int pf_sched_pick(pf_cand_t *c, int n, int64_t chunk, int64_t budget, int max_seqs, int *order, int64_t *score);

/* Sorts idx[0..n) by score (stable: equal scores keep their order). */
void pf_sched_sort(int *idx, int n, const int64_t *score);

/* Admission rule for a prompt of `tokens` tokens: true when it needs one pass only, when no
 * other prompt holds local state (`others` == 0: nothing could ever free room for it), or when
 * after taking its slot and pages at least one slot and `pages_one_chunk` pages stay free. */
bool pf_sched_headroom_ok(int64_t tokens, int64_t chunk, int others, int free_slots, int64_t free_pages,
                          int64_t pages_needed, int64_t pages_one_chunk);

#endif
