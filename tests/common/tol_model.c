/* The relative Frobenius bound with its magnitude floor (see tol_model.h). */
#include "tol_model.h"

#include <stdio.h>

tol_verdict_t tol_model(const tol_sums_t *s, int64_t n, double ulp, double r_in, double tol) {
  tol_verdict_t v = {.floor = ulp * r_in, .r_in = r_in};
  const double fl2 = (double)n * v.floor * v.floor; /* the floor of ||ref||_F^2 */
  v.rel = s->den > 0 ? sqrt(s->num / s->den) : sqrt(s->num);
  v.rel_eff = s->den > 0 || fl2 > 0 ? sqrt(s->num / fmax(s->den, fl2)) : sqrt(s->num);
  v.ref_rms = sqrt(s->den / (double)n);
  v.floored = fl2 > s->den && s->num > 0; /* an exact match needs no floor */
  v.ok = s->nan_bad == 0 && v.rel_eff <= tol;
  return v;
}

void tol_print_floor(const tol_verdict_t *v) {
  printf("     (rel_fro against |ref| %.3e; |ref| rms %.3e below the floor %.3e = ulp x operand "
         "rms %.3e)\n", v->rel, v->ref_rms, v->floor, v->r_in);
}
