/* `test_kernels --real`: every op of k3k_ops.def at the real K3 shapes (spec §1.5: hidden 7168,
 * 96 KDA heads of 128, q/k/v 12288 wide, MLA 96 heads with c = 512, vocab 163840, 896 experts
 * of 3584 -> 3072), each judged against the reference backend by the one tolerance model.
 *
 * What it is for: the device backend's parity at the shapes the model runs, on fresh random
 * inputs with T in {1, 63, 64, 65, 1000} around the 64-row tiles (the cases k3k-gpu-check's
 * parity suite held before, ported op by op), plus the coverage check: with --require-device
 * every op of the list must have run on a device backend; without, on any backend.
 * The reference is "cpu-fast" unless --ref says otherwise: "cpu" is the specification but
 * single-threaded, and the tiny run proves cpu-fast bit-identical to it on every op; on a host
 * without a device (`--real` on CI-like machines) "cpu" then runs as the other host backend
 * and must equal cpu-fast bit for bit at these shapes too. With --require-device the other
 * host backends are left out (device time is what that run is for).
 * What it is not: the CUDA backend's internals (forced kernel variants, fit rules, side
 * stream): k3k-gpu-check. --quick: T in {1, 65} and fewer of the big cases. --groups LIST
 * (fused, rows, gemm, seq, mla, moe): only those files' cases, for a short device call (no
 * coverage check then). */
#include <stdlib.h>
#include <string.h>

#include "csv.h"
#include "real.h"

bool g_quick;
static const int64_t k_full[] = {1, 63, 64, 65, 1000}, k_quick[] = {1, 65};
const int64_t *g_real_T = k_full;
int g_real_nT = 5;

int real_split_lens(int64_t T, int32_t *cu, int maxn) {
  static const int64_t pat[] = {1, 63, 0, 64, 65};
  int n = 0;
  int64_t pos = 0;
  cu[0] = 0;
  for (int i = 0; pos < T && n < maxn - 1; i++) {
    int64_t l = pat[i % 5];
    if (l > T - pos || i >= 4) l = T - pos;
    pos += l;
    cu[++n] = (int32_t)pos;
  }
  return n;
}

void real_unit_heads(tt_t *x, int64_t rows, int64_t nh) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h = 0; h < nh; h++) {
      double v[128], ss = 0;
      for (int d = 0; d < 128; d++) {
        v[d] = rng_uniform(-1, 1);
        ss += v[d] * v[d];
      }
      for (int d = 0; d < 128; d++) tt_set(x, (r * nh + h) * 128 + d, v[d] / sqrt(ss));
    }
}

const char *g_real_groups;

/* True when no --groups list was given or `name` is one of its entries. */
static bool want(const char *name) { return !g_real_groups || csv_has(g_real_groups, name); }

bool real_groups_valid(const char *list) {
  static const char *const known[] = {"fused", "rows", "gemm", "seq", "mla", "moe"};
  return !csv_unknown(list, known, sizeof known / sizeof known[0], NULL);
}

void t_real(void) {
  if (g_quick) g_real_T = k_quick, g_real_nT = 2;
  int dev = 0;
  printf("test_kernels --real%s: reference %s, backends:", g_quick ? " --quick" : "", g_ref);
  for (const char *const *nm = k3k_backend_names(); *nm; nm++) {
    k3k_backend_t *be = k3k_backend_get(*nm);
    dev += be && !be->host_memory;
    printf(" %s%s", *nm, !be ? " (unavailable)" : be->host_memory && !g_host_others && strcmp(*nm, g_ref) ? " (left out)" : "");
  }
  printf("\n");
  /* a GPU host without a usable device must not pass silently */
  if (g_require_dev) check(dev > 0, "--require-device: no device backend is available");
  if (want("fused")) t_fused_real();
  if (want("rows")) real_rows();
  if (want("gemm")) real_gemm();
  if (want("seq")) real_seq();
  if (want("mla")) real_mla();
  if (want("moe")) real_moe();
  if (!g_real_groups) cov_check(g_require_dev, true); /* a subset covers a subset of the ops */
}
