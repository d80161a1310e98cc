/* A case judged against a reference backend's output of the same inputs (harness.h): the fused
 * ops at every size and every op at the real K3 shapes (`--real`).
 *
 * What it is for: fused_check runs the case on the reference backend (g_ref: "cpu", the
 * specification; `--real` defaults to "cpu-fast", which the tiny run proves bit-identical to
 * "cpu", because the single-threaded "cpu" is slow at real shapes), then on every other
 * available backend, and judges each output by the one tolerance model (tolerance.c): host
 * backends bit for bit, device backends by the relative Frobenius bound with its magnitude
 * floor. op_check_err is the same for a call every backend must refuse. case_run and
 * case_untouched (harness.h) serve run_case (harness.c) too.
 * What it is not: the float64 check of "cpu" against the math (run_case, harness.c) — a fused
 * case checks "cpu" against the chain of ops it means instead (chain).
 * Invariants: outputs are poisoned (all-ones bytes: NaN, -1) before each run; in/out tensors
 * (states, caches, P) start from the same bytes on every backend; a device backend answering
 * K3_ENOTSUP is a skip except with --require-device. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

const char *g_ref = "cpu";
bool g_real, g_require_dev, g_host_others = true;

/* Uploads the table's matrices to be (dev: tab->n allocations) and writes their addresses into
 * the PTR slot's buffer dst (be's memory). */
static int upload_table(k3k_backend_t *be, const ft_table_t *tab, void **dev, void *dst) {
  void **addr = calloc((size_t)tab->n, sizeof *addr);
  int rc = addr ? 0 : K3_ENOMEM;
  for (int j = 0; j < tab->n && !rc; j++) {
    const tt_t *m = &tab->mats[j];
    if (be->alloc(be, m->bytes, &dev[j])) {
      rc = K3_ENOMEM;
      break;
    }
    be->copy_from_host(be, dev[j], m->buf, m->bytes);
    addr[j] = (char *)dev[j] + ((char *)m->t.data - (char *)m->buf);
  }
  if (!rc) be->copy_from_host(be, dst, addr, (size_t)tab->n * sizeof *addr);
  free(addr);
  return rc;
}

/* One backend's run of a case (harness.h). */
int case_run(k3k_backend_t *be, k3k_op_t op, const void *params, const tt_t *s, int n,
             void **orig, void **got, const ft_table_t *tab, bool *called) {
  void *dev[K3K_MAX_ARGS] = {0}, **mdev = tab ? calloc((size_t)tab->n, sizeof *mdev) : NULL;
  k3k_tensor_t tv[K3K_MAX_ARGS];
  const k3k_tensor_t *tp[K3K_MAX_ARGS] = {0};
  int rc = tab && !mdev ? K3_ENOMEM : 0;
  for (int i = 0; i < n && !rc; i++) {
    tp[i] = NULL;
    if (!s[i].buf) continue;
    if (be->alloc(be, s[i].bytes, &dev[i])) {
      rc = K3_ENOMEM;
      break;
    }
    if (s[i].out && !s[i].inout) {
      void *tmp = malloc(s[i].bytes);
      memset(tmp, 0xFF, s[i].bytes);
      be->copy_from_host(be, dev[i], tmp, s[i].bytes);
      free(tmp);
    } else {
      be->copy_from_host(be, dev[i], orig[i], s[i].bytes);
    }
    tv[i] = s[i].t;
    tv[i].data = (char *)dev[i] + ((char *)s[i].t.data - (char *)s[i].buf);
    tv[i].backend = be;
    tp[i] = &tv[i];
    if (tab && i == tab->slot) rc = upload_table(be, tab, mdev, dev[i]);
  }
  const int ws = op == K3K_OP_MOE_ROUTED ? 7 : -1;
  if (!rc && ws >= 0 && !tp[ws]) {
    const size_t need = k3k_workspace(be, op, params, tp, n);
    if (need && be->alloc(be, need, &dev[ws])) rc = K3_ENOMEM;
    if (need && !rc) {
      tv[ws] = k3k_tensor_1d(be, K3K_U8, dev[ws], (int64_t)need);
      tp[ws] = &tv[ws];
    }
  }
  const bool ran = !rc;
  if (called) *called = ran;
  if (ran) {
    rc = k3k_run(be, op, params, tp, n);
    const int src = be->synchronize(be);
    if (!rc) rc = src;
  }
  for (int i = 0; i < n; i++) {
    if (!dev[i]) continue;
    if (ran && s[i].out && s[i].buf) {
      got[i] = malloc(s[i].bytes);
      be->copy_to_host(be, got[i], dev[i], s[i].bytes);
    }
    be->free(be, dev[i]);
  }
  for (int j = 0; tab && mdev && j < tab->n; j++)
    if (mdev[j]) be->free(be, mdev[j]);
  free(mdev);
  return rc;
}

/* After a refused call: every pure output still the poison, every in/out slot as it was. */
void case_untouched(const char *name, const char *be_name, const tt_t *s, int n, void **orig,
                    void **got) {
  for (int i = 0; i < n; i++) {
    if (!s[i].out || !s[i].buf || !got[i]) continue;
    bool same = true;
    if (s[i].inout) {
      same = !memcmp(got[i], orig[i], s[i].bytes);
    } else {
      const uint8_t *b = got[i];
      for (size_t k = 0; k < s[i].bytes && same; k++) same = b[k] == 0xFF;
    }
    check(same, "%s[%s] t[%d]: %s although the op failed", name, be_name, i,
          s[i].inout ? "changed" : "written");
  }
}

static void judge(const char *name, k3k_op_t op, const void *params, tt_t *s, int n,
                  void **chain, const ft_table_t *tab, int want_rc) {
  void *orig[K3K_MAX_ARGS] = {0}, *ref[K3K_MAX_ARGS] = {0};
  bool on_dev = false, on_any = false;
  for (int i = 0; i < n; i++)
    if (s[i].buf && (!s[i].out || s[i].inout)) orig[i] = dup_buf(&s[i]);
  double rms[2];
  tol_in_rms(s, n, orig, rms);
  k3k_backend_t *rb = k3k_backend_get(g_ref);
  int rc = rb ? case_run(rb, op, params, s, n, orig, ref, tab, NULL) : K3_ENOTSUP;
  check(rc == want_rc, "%s[%s]: rc %d (%s), want %d (%s)", name, g_ref, rc, k3_errname(rc),
        want_rc, k3_errname(want_rc));
  if (want_rc && rb) case_untouched(name, rb->name, s, n, orig, ref);
  for (int i = 0; i < n && !rc && chain; i++)
    if (s[i].out && chain[i]) tol_judge(name, "reference vs chain", true, i, &s[i], ref[i], chain[i], rms, false);
  on_any = !rc && !want_rc;
  for (const char *const *nm = k3k_backend_names(); *nm && rb && rc == want_rc; nm++) {
    k3k_backend_t *be = k3k_backend_get(*nm);
    if (!be || be == rb || (be->host_memory && !g_host_others)) continue;
    void *got[K3K_MAX_ARGS] = {0};
    const int brc = case_run(be, op, params, s, n, orig, got, tab, NULL);
    if (brc == K3_ENOTSUP && !be->host_memory && !g_require_dev && want_rc != K3_ENOTSUP) {
      g_skip++;
      printf("SKIP: %s[%s]: not supported\n", name, be->name);
    } else if (want_rc) {
      check(brc == want_rc, "%s[%s]: rc %d (%s), want %s", name, be->name, brc, k3_errname(brc),
            k3_errname(want_rc));
      case_untouched(name, be->name, s, n, orig, got);
    } else {
      check(brc == 0, "%s[%s]: rc %d (%s)", name, be->name, brc, k3_errname(brc));
      for (int i = 0; i < n && !brc; i++)
        if (s[i].out && s[i].buf)
          tol_judge(name, be->name, be->host_memory, i, &s[i], got[i], ref[i], rms,
                    g_real && !be->host_memory);
      if (!brc) on_dev |= !be->host_memory, on_any = true;
    }
    for (int i = 0; i < n; i++) free(got[i]);
  }
  if (!want_rc) cov_note(op, on_dev, on_any);
  for (int i = 0; i < n; i++) {
    free(orig[i]);
    free(ref[i]);
  }
}

void fused_check(const char *name, k3k_op_t op, const void *params, tt_t *s, int n,
                 void **chain, const ft_table_t *tab) {
  judge(name, op, params, s, n, chain, tab, 0);
}

void op_check_err(const char *name, k3k_op_t op, const void *params, tt_t *s, int n, int want_rc) {
  judge(name, op, params, s, n, NULL, NULL, want_rc);
}

/* A host copy of slot s's buffer after running `fn` on cpu over views into it is the chain
 * output; helpers to make the chain's intermediates. */
void *dup_buf(const tt_t *s) {
  void *p = malloc(s->bytes);
  memcpy(p, s->buf, s->bytes);
  return p;
}
k3k_tensor_t view_in(const tt_t *s, void *buf) {
  k3k_tensor_t t = s->t;
  t.data = (char *)buf + ((char *)s->t.data - (char *)s->buf);
  return t;
}
void tt_free_all(tt_t *s, int n) {
  for (int i = 0; i < n; i++)
    if (s[i].buf) tt_free(&s[i]);
}
