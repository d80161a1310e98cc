/* The arithmetic of the one tolerance model (tests/kernels/tolerance.c, docs/kernels.md "One op
 * test"): NaN only where the reference has NaN, and ||got - ref||_F <= tol * max(||ref||_F,
 * sqrt(n) * ulp * r_in), ulp the output dtype's spacing at 1.0, r_in the RMS of the operands
 * held in that dtype. Shared by tol_judge (test_kernels) and gpair_check (tests/gpu) so the two
 * cannot drift apart. Not here: the choice of tol, the exact integer rule, measuring r_in. */
#ifndef K3K_TEST_TOL_MODEL_H
#define K3K_TEST_TOL_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define TOL_ULP_BF16 0x1p-7
#define TOL_ULP_F32 0x1p-23

typedef struct { /* sums over one output's elements; start from {0} */
  double num, den, maxabs; /* sum (got - ref)^2, sum ref^2, max |got - ref| where neither is NaN */
  int64_t nan_bad;         /* elements where exactly one of got, ref is NaN */
} tol_sums_t;

static inline void tol_sums_add(tol_sums_t *s, double got, double ref) {
  if (!isnan(got) != !isnan(ref)) s->nan_bad++;
  if (isnan(got) || isnan(ref)) return;
  const double e = got - ref;
  s->num += e * e;
  s->den += ref * ref;
  if (fabs(e) > s->maxabs) s->maxabs = fabs(e);
}

typedef struct {
  double rel;     /* ||got - ref||_F / ||ref||_F (the absolute norm when ref is all zero) */
  double rel_eff; /* ||got - ref||_F / max(||ref||_F, floor): what is held against tol */
  double ref_rms, floor, r_in; /* ||ref||_F / sqrt(n), ulp * r_in, r_in (tol_print_floor) */
  bool floored, ok; /* the floor decided rel_eff (outputs differ); no NaN mismatch, within tol */
} tol_verdict_t;

/* The verdict on the n elements summed in s (r_in 0: no floor). Pure. */
tol_verdict_t tol_model(const tol_sums_t *s, int64_t n, double ulp, double r_in, double tol);
/* Prints the floored figures of v on stdout as one indented line. */
void tol_print_floor(const tol_verdict_t *v);

#endif
