/* The one tolerance model of test_kernels: how an output of a backend is judged against the
 * reference backend's output of the same case (the same inputs, bytes for bytes).
 *
 *   - "cpu" is the specification. It is checked against the math elsewhere (float64
 *     expectations in run_case; the op-by-op chain of a fused op in fused_check), never here.
 *   - A host backend other than the reference ("cpu-fast"): equal to the reference on every
 *     element (same value and sign, NaN where NaN). cpu-fast promises bit-identity with cpu.
 *   - A device backend, per output slot s of n elements:
 *       I32 outputs (indices, sampled ids) exact;
 *       F32/BF16: NaN where the reference has NaN and nowhere else, and
 *         ||got - ref||_F <= tol * max(||ref||_F, sqrt(n) * ulp * r_in)
 *       with tol = 1e-2 for BF16 outputs and 1e-4 for F32 outputs unless the case sets s->tol
 *       (TOL_EXACT: exact, for pure data movement; a looser bound only where the device's
 *       arithmetic is documented to differ, e.g. KDA_CHUNK's bf16 tensor-core operands);
 *       ulp the output dtype's spacing at 1.0 (BF16 2^-7, F32 2^-23) and r_in the RMS of the
 *       finite elements of the case's operands held in the output's dtype (inputs and in/out
 *       state as they were before the run; pure outputs do not count).
 * The bound's arithmetic is tests/common/tol_model.c, shared with the GPU internals programs.
 * Why these figures (derived in docs/kernels.md "One op test"): a BF16 output is one RNE
 * rounding on each side, and two fp32 values straddling a rounding boundary differ by one bf16
 * ulp (2^-8 relative) on a few elements, so the aggregate stays ~2e-3; fp32 outputs differ by
 * summation order (K <= 7168: ~sqrt(K)*2^-24, ~5e-6) and libm vs CUDA exp/sqrt ulps. An
 * indexing or math error gives O(1). The magnitude floor binds only when the output's RMS is
 * below one output-ulp of its operands' RMS (cancellation; a KDA token under gates near e^-5):
 * there each rounding of a term at the operands' magnitude moves the output by about its own
 * size, so its relative error measures rounding, not the kernel. Operands of another dtype do
 * not count: a f32 log-gate of -40 is no magnitude of a bf16 output.
 * What it is not: the per-element float64 check of run_case (harness.c), which checks "cpu". */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tol_model.h"

/* Slot s's tensor over another buffer with the same layout (a host copy of s->buf). */
static tt_t over(const tt_t *s, const void *buf) {
  tt_t v = *s;
  v.t.data = (char *)buf + ((char *)s->t.data - (char *)s->buf);
  return v;
}

void tol_in_rms(const tt_t *s, int n, void *const *bufs, double rms[2]) {
  double sq[2] = {0, 0};
  int64_t cnt[2] = {0, 0};
  for (int i = 0; i < n; i++) {
    if (!s[i].buf || (s[i].out && !s[i].inout) || !bufs[i]) continue;
    if (s[i].t.dtype != K3K_F32 && s[i].t.dtype != K3K_BF16) continue;
    const int c = s[i].t.dtype == K3K_BF16 ? 0 : 1;
    const tt_t v = over(&s[i], bufs[i]);
    const int64_t m = tt_numel(&v);
    for (int64_t e = 0; e < m; e++) {
      const double x = tt_get(&v, e);
      if (isfinite(x)) sq[c] += x * x, cnt[c]++;
    }
  }
  for (int c = 0; c < 2; c++) rms[c] = cnt[c] ? sqrt(sq[c] / (double)cnt[c]) : 0;
}

double tol_of(const tt_t *s) {
  if (s->tol != 0) return s->tol;
  return s->t.dtype == K3K_BF16 ? TOL_BF16 : TOL_F32;
}

bool tol_judge(const char *name, const char *be_name, bool exact, int i, const tt_t *s,
               const void *got, const void *ref, const double in_rms[2], bool verbose) {
  const tt_t g = over(s, got), r = over(s, ref);
  const int64_t n = tt_numel(s);
  const double tol = tol_of(s);
  if (exact || tol < 0 || s->t.dtype == K3K_I32 || s->t.dtype == K3K_U8) {
    int64_t diff = -1, ndiff = 0;
    for (int64_t e = 0; e < n; e++) {
      const double a = tt_get(&g, e), b = tt_get(&r, e);
      if (!((a == b && signbit(a) == signbit(b)) || (isnan(a) && isnan(b)))) {
        if (diff < 0) diff = e;
        ndiff++;
      }
    }
    check(diff < 0, "%s[%s] t[%d]: %lld of %lld elements differ from the reference, first %lld "
          "(%.9g vs %.9g)", name, be_name, i, (long long)ndiff, (long long)n, (long long)diff,
          diff >= 0 ? tt_get(&g, diff) : 0.0, diff >= 0 ? tt_get(&r, diff) : 0.0);
    if (verbose && !exact) printf("  %s[%s] t[%d]: exact (n=%lld)\n", name, be_name, i, (long long)n);
    return diff < 0;
  }
  tol_sums_t sum = {0};
  for (int64_t e = 0; e < n; e++) tol_sums_add(&sum, tt_get(&g, e), tt_get(&r, e));
  const double rin = in_rms ? in_rms[s->t.dtype == K3K_BF16 ? 0 : 1] : 0;
  const tol_verdict_t v =
      tol_model(&sum, n, s->t.dtype == K3K_BF16 ? TOL_ULP_BF16 : TOL_ULP_F32, rin, tol);
  check(v.ok, "%s[%s] t[%d]: rel_fro %.3e%s > tol %.0e or %lld NaN mismatches (max_abs %.3e)",
        name, be_name, i, v.rel_eff, v.floored ? " (against the magnitude floor)" : "", tol,
        (long long)sum.nan_bad, sum.maxabs);
  if (verbose)
    printf("  %s[%s] t[%d]: rel_fro %.3e%s (tol %.0e) max_abs %.3e n=%lld\n", name, be_name, i,
           v.rel_eff, v.floored ? " against the magnitude floor" : "", tol, sum.maxabs,
           (long long)n);
  if (verbose && v.floored) tol_print_floor(&v);
  return v.ok;
}
