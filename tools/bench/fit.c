/* k3pd-bench least squares for the cost profile: normal equations solved by Gaussian
 * elimination with partial pivoting, and a simple active-set rule for non-negative
 * coefficients (a cost cannot be negative: a noisy negative slope is dropped, not kept).
 *
 * Not general numerics: k <= 6 columns and tens of rows, where the normal equations are fine. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "bench.h"
#include "k3pd/err.h"

/* Solves A x = r (m x m, row-major, overwritten); false when singular. */
static bool solve(double *A, double *r, int m, double *x) {
  for (int c = 0; c < m; c++) {
    int piv = c;
    for (int i = c + 1; i < m; i++)
      if (fabs(A[i * m + c]) > fabs(A[piv * m + c])) piv = i;
    if (fabs(A[piv * m + c]) < 1e-300) return false;
    if (piv != c) {
      for (int j = 0; j < m; j++) {
        double t = A[c * m + j];
        A[c * m + j] = A[piv * m + j];
        A[piv * m + j] = t;
      }
      double t = r[c];
      r[c] = r[piv];
      r[piv] = t;
    }
    for (int i = c + 1; i < m; i++) {
      double f = A[i * m + c] / A[c * m + c];
      for (int j = c; j < m; j++) A[i * m + j] -= f * A[c * m + j];
      r[i] -= f * r[c];
    }
  }
  for (int i = m - 1; i >= 0; i--) {
    double s = r[i];
    for (int j = i + 1; j < m; j++) s -= A[i * m + j] * x[j];
    x[i] = s / A[i * m + i];
  }
  return true;
}

int bn_fit_lsq(const double *X, const double *y, int n, int k, const bool *nonneg, double *b) {
  bool on[6];
  if (k < 1 || k > 6) return K3_EINVAL;
  for (int j = 0; j < k; j++) {
    on[j] = false;
    for (int i = 0; i < n; i++) on[j] |= X[i * k + j] != 0;
    b[j] = 0;
  }
  for (;;) {
    int idx[6], m = 0;
    for (int j = 0; j < k; j++)
      if (on[j]) idx[m++] = j;
    if (m == 0) return K3_EINVAL;
    double A[36], r[6], x[6];
    memset(A, 0, sizeof A);
    memset(r, 0, sizeof r);
    for (int i = 0; i < n; i++)
      for (int a = 0; a < m; a++) {
        r[a] += X[i * k + idx[a]] * y[i];
        for (int c = 0; c < m; c++) A[a * m + c] += X[i * k + idx[a]] * X[i * k + idx[c]];
      }
    if (!solve(A, r, m, x)) { /* collinear columns: drop the last one and retry */
      on[idx[m - 1]] = false;
      continue;
    }
    int worst = -1;
    for (int a = 0; a < m; a++)
      if (nonneg && nonneg[idx[a]] && x[a] < 0 && (worst < 0 || x[a] < x[worst])) worst = a;
    if (worst < 0) {
      for (int a = 0; a < m; a++) b[idx[a]] = x[a] + 0.0; /* -0.0 prints as "-0" */
      return 0;
    }
    on[idx[worst]] = false;
  }
}
