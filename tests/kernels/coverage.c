/* Which ops the op test covered: per op of kernels/include/k3k_ops.def, the cases that ran and
 * were judged on a device backend and on any backend (run_case and op_check.c note them).
 *
 * What it is for: the op list is the one place an op is added; this check makes the op test
 * fail naming an op that gained no case — in the tiny run (CI) on the host backends, in
 * `--real --require-device` on the device backend at the real shapes.
 * What it is not: a measure of how well an op is tested; a case that ran counts once. Expected
 * error cases do not count (they judge no output). */
#include "harness.h"

/* The op list, generated from the X-macro list (not written out here). */
static const k3k_op_t k_ops[] = {
#define K3K_OP_X(ENUM, name, n_tensors) K3K_OP_##ENUM,
#include "k3k_ops.def"
#undef K3K_OP_X
};
#define N_OPS (int)(sizeof k_ops / sizeof k_ops[0])

static int g_dev[N_OPS], g_any[N_OPS];

void cov_note(k3k_op_t op, bool on_device, bool on_any) {
  if ((int)op < 0 || (int)op >= N_OPS) return;
  g_dev[op] += on_device;
  g_any[op] += on_any;
}

void cov_check(bool device, bool verbose) {
  if (verbose) {
    printf("coverage (cases per op: on a device backend / on any backend):\n");
    for (int i = 0; i < N_OPS; i++)
      printf("  %-18s %4d / %4d\n", k3k_op_name(k_ops[i]), g_dev[k_ops[i]], g_any[k_ops[i]]);
  }
  char missing[1024] = "";
  size_t off = 0;
  int n_missing = 0;
  for (int i = 0; i < N_OPS; i++) {
    const int c = device ? g_dev[k_ops[i]] : g_any[k_ops[i]];
    if (c > 0) continue;
    n_missing++;
    if (off < sizeof missing - 32)
      off += (size_t)snprintf(missing + off, sizeof missing - off, " %s", k3k_op_name(k_ops[i]));
  }
  check(n_missing == 0, "coverage: %d op(s) of k3k_ops.def without a case on %s:%s", n_missing,
        device ? "a device backend" : "any backend", missing);
}
