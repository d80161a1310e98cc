/* The op-by-op shadow of k3k-gpu-opdiff (contract in opdiff_shadow.h).
 * Invariant: the reference op runs on host copies taken BEFORE the device op runs, so in/out
 * arguments (state pools, in-place ADD) give both sides the same incoming values. */
#include "opdiff_shadow.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"

typedef int (*run_fn)(k3k_backend_t *, k3k_op_t, const void *, const k3k_tensor_t *const *, int);

typedef struct {
  const void *dev;
  size_t bytes;
  void *host;
} wcache_t;

static struct {
  k3k_backend_t *be, *ref;
  run_fn orig;
  uint64_t check, fix;
  bool print;
  char tag[64];
  int rc;
  int seq;  /* call number since the last reset */
  od_opstat_t st[K3K_OP_COUNT];
  wcache_t *wc;
  int n_wc, cap_wc;
} S;

/* Output slots of an op; *pool_idx = slot of the I32 index tensor addressing a state pool in
 * `pool` (-1 when the output is compared whole). */
static int out_slots(k3k_op_t op, int nt, int *outs, int *pool, int *pool_idx) {
  *pool = -1;
  *pool_idx = -1;
  switch (op) {
    case K3K_OP_CONV_PREFILL: *pool = 4; *pool_idx = 3; outs[0] = 5; return 1;
    case K3K_OP_CONV_STEP: *pool = 3; *pool_idx = 2; outs[0] = 4; return 1;
    case K3K_OP_KDA_CHUNK: *pool = 7; *pool_idx = 6; outs[0] = 8; return 1;
    case K3K_OP_KDA_STEP: *pool = 6; *pool_idx = 5; outs[0] = 7; return 1;
    case K3K_OP_MLA_CACHE_WRITE: *pool = 3; *pool_idx = 2; return 0;
    case K3K_OP_ROUTER: outs[0] = 2; outs[1] = 3; return 2;
    default: outs[0] = nt - 1; return 1;
  }
}

/* Arguments that are model weights (read-only for the runner's lifetime): cached by address. */
static bool is_weight(k3k_op_t op, int i, size_t bytes) {
  switch (op) {
    case K3K_OP_GEMM: return i == 1;
    case K3K_OP_MXFP4_GEMM: return i == 1 || i == 2;
    case K3K_OP_MLA_DECODE: return i == 1;
    case K3K_OP_GET_ROWS: return i == 0 && bytes >= ((size_t)64 << 20); /* embedding table */
    default: return false;
  }
}

static void *weight_host(const k3k_tensor_t *t, size_t bytes, int *rc) {
  for (int i = 0; i < S.n_wc; i++)
    if (S.wc[i].dev == t->data && S.wc[i].bytes == bytes) return S.wc[i].host;
  if (S.n_wc == S.cap_wc) {
    int nc = S.cap_wc ? 2 * S.cap_wc : 64;
    wcache_t *n = realloc(S.wc, (size_t)nc * sizeof *n);
    if (!n) {
      *rc = K3_ENOMEM;
      return NULL;
    }
    S.wc = n;
    S.cap_wc = nc;
  }
  void *h = malloc(bytes);
  if (!h) {
    *rc = K3_ENOMEM;
    return NULL;
  }
  if ((*rc = S.be->copy_to_host(S.be, h, t->data, bytes))) {
    free(h);
    return NULL;
  }
  S.wc[S.n_wc++] = (wcache_t){t->data, bytes, h};
  return h;
}

static double load(const k3k_tensor_t *t, int64_t off) {
  switch (t->dtype) {
    case K3K_F32: return ((const float *)t->data)[off];
    case K3K_BF16: return k3_bf16_to_f32(((const uint16_t *)t->data)[off]);
    case K3K_I32: return ((const int32_t *)t->data)[off];
    default: return ((const uint8_t *)t->data)[off];
  }
}

typedef struct {
  double num, den, max_abs;
  int64_t n_diff, n;
} acc_t;

static void acc_elem(acc_t *a, double x, double r) {
  double d = x - r;
  if (d != d) d = INFINITY;
  a->num += d * d;
  a->den += r * r;
  if (fabs(d) > a->max_abs) a->max_abs = fabs(d);
  a->n_diff += d != 0;
  a->n++;
}

/* Every element of view `dv` (device result, host copy) against `rv` (reference), both with
 * the same shape and strides (dims beyond ndim are 1). Rows of dim 0 restricted to `rows`
 * when not NULL. */
static void acc_view(acc_t *a, const k3k_tensor_t *dv, const k3k_tensor_t *rv, const int32_t *rows,
                     int64_t nrows) {
  int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  for (int d = 0; d < dv->ndim; d++) {
    sh[d] = dv->shape[d];
    st[d] = dv->stride[d];
  }
  int64_t n0 = rows ? nrows : sh[0];
  for (int64_t i0 = 0; i0 < n0; i0++) {
    int64_t r0 = rows ? rows[i0] : i0;
    if (r0 < 0 || r0 >= sh[0]) continue; /* negative slot = skipped token */
    for (int64_t i1 = 0; i1 < sh[1]; i1++)
      for (int64_t i2 = 0; i2 < sh[2]; i2++)
        for (int64_t i3 = 0; i3 < sh[3]; i3++) {
          int64_t o = r0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3];
          acc_elem(a, load(dv, o), load(rv, o));
        }
  }
}

/* A cache pool [P, page, D] addressed by flattened rows: viewed as [P*page, D]. */
static k3k_tensor_t flat_cache(const k3k_tensor_t *t) {
  k3k_tensor_t f = *t;
  if (t->ndim == 3) {
    f.ndim = 2;
    f.shape[0] = t->shape[0] * t->shape[1];
    f.shape[1] = t->shape[2];
    f.stride[0] = t->stride[1];
    f.stride[1] = t->stride[2];
  }
  return f;
}

static void shape_str(const k3k_tensor_t *t, char *b, size_t n) {
  size_t o = 0;
  b[0] = 0;
  for (int d = 0; d < t->ndim && o < n; d++)
    o += (size_t)snprintf(b + o, n - o, d ? "x%lld" : "%lld", (long long)t->shape[d]);
}

static const char *dt_name(k3k_dtype_t d) {
  return d == K3K_F32 ? "f32" : d == K3K_BF16 ? "bf16" : d == K3K_I32 ? "i32" : "u8";
}

static int shadow_run(k3k_backend_t *be, k3k_op_t op, const void *params,
                      const k3k_tensor_t *const *t, int nt) {
  /* The fused ops (k3k.h "Fusions") have optional (NULL) slots and several outputs (and
   * MOE_ROUTED a table of device addresses a host copy cannot follow); they run unshadowed (their parity is test_kernels --real's: the fused kernel against the chain). */
  if (be != S.be || op == K3K_OP_SAMPLE || op == K3K_OP_RES_MIX_NORM || op == K3K_OP_GEMM_MULTI ||
      op == K3K_OP_KDA_DECODE || op == K3K_OP_MOE_ROUTED || !((S.check | S.fix) & OD_MASK(op)))
    return S.orig(be, op, params, t, nt);
  int rc = be->synchronize ? be->synchronize(be) : 0;
  k3k_tensor_t ht[K3K_MAX_ARGS], dt[K3K_MAX_ARGS];
  const k3k_tensor_t *hp[K3K_MAX_ARGS];
  void *own[K3K_MAX_ARGS] = {0}, *got[K3K_MAX_ARGS] = {0};
  size_t span[K3K_MAX_ARGS] = {0};
  int outs[2] = {0, 0}, pool, pidx, no = out_slots(op, nt, outs, &pool, &pidx);
  /* 1. host copies of every argument as it is before the op */
  for (int i = 0; i < nt && !rc; i++) {
    ht[i] = *t[i];
    hp[i] = &ht[i];
    span[i] = k3k_tensor_span_bytes(t[i]);
    if (!span[i]) continue;
    if (is_weight(op, i, span[i])) {
      ht[i].data = weight_host(t[i], span[i], &rc);
    } else {
      own[i] = malloc(span[i]);
      ht[i].data = own[i];
      if (!own[i]) rc = K3_ENOMEM;
      if (!rc) rc = be->copy_to_host(be, own[i], t[i]->data, span[i]);
    }
    ht[i].backend = NULL;
  }
  /* 2. reference op on the copies, 3. device op */
  if (!rc) {
    rc = k3k_run(S.ref, op, params, hp, nt);
    if (rc) fprintf(stderr, "opdiff: reference %s failed: %s\n", k3k_op_name(op), k3_strerror(rc));
  }
  int drc = S.orig(be, op, params, t, nt);
  if (!drc && be->synchronize) drc = be->synchronize(be);
  if (drc || rc) goto out;
  /* 4. device outputs back, compared (and optionally replaced) */
  int cmp[3], nc = 0;
  for (int j = 0; j < no; j++) cmp[nc++] = outs[j];
  if (pool >= 0) cmp[nc++] = pool;
  acc_t a = {0};
  for (int j = 0; j < nc && !rc; j++) {
    int i = cmp[j];
    if (!span[i]) continue;
    got[i] = malloc(span[i]);
    if (!got[i]) {
      rc = K3_ENOMEM;
      break;
    }
    if ((rc = be->copy_to_host(be, got[i], t[i]->data, span[i]))) break;
    dt[i] = ht[i];
    dt[i].data = got[i];
    if (i == pool) {
      const int32_t *ids = ht[pidx].data;
      int64_t nid = k3k_tensor_numel(&ht[pidx]);
      /* the slots tensor may be longer than the batch: n_seqs entries are used */
      if (op == K3K_OP_KDA_CHUNK || op == K3K_OP_KDA_STEP)
        nid = ((const k3k_kda_params_t *)params)->n_seqs;
      else if (op == K3K_OP_CONV_PREFILL || op == K3K_OP_CONV_STEP)
        nid = ((const k3k_conv_params_t *)params)->n_seqs;
      k3k_tensor_t fd = op == K3K_OP_MLA_CACHE_WRITE ? flat_cache(&dt[i]) : dt[i];
      k3k_tensor_t fr = op == K3K_OP_MLA_CACHE_WRITE ? flat_cache(&ht[i]) : ht[i];
      acc_view(&a, &fd, &fr, ids, nid);
    } else {
      acc_view(&a, &dt[i], &ht[i], NULL, 0);
    }
    if (S.fix & OD_MASK(op)) rc = be->copy_from_host(be, t[i]->data, ht[i].data, span[i]);
  }
  if (!rc) {
    double rel = a.den > 0 ? sqrt(a.num / a.den) : sqrt(a.num);
    od_opstat_t *s = &S.st[op];
    s->calls++;
    s->sum_rel += rel;
    if (rel > s->max_rel || rel != rel) s->max_rel = rel != rel ? INFINITY : rel;
    if (a.max_abs > s->max_abs) s->max_abs = a.max_abs;
    s->n_diff += a.n_diff;
    s->n += a.n;
    if (S.print) {
      char in0[48], o[48];
      shape_str(t[0], in0, sizeof in0);
      const k3k_tensor_t *ot = no ? t[outs[0]] : t[pool];
      shape_str(ot, o, sizeof o);
      char w[48] = "";
      if (op == K3K_OP_GEMM || op == K3K_OP_MXFP4_GEMM) shape_str(t[1], w, sizeof w);
      printf("  OP %4d %-12s %-16s in %-14s w %-12s out %-16s %-4s rel %.3e maxabs %.3e "
             "diff %5.1f%%%s\n", S.seq, S.tag, k3k_op_name(op), in0, w, o, dt_name(ot->dtype), rel,
             a.max_abs, a.n ? 100.0 * (double)a.n_diff / (double)a.n : 0.0,
             (S.fix & OD_MASK(op)) ? " [fixed]" : "");
    }
  }
out:
  S.seq++;
  if (rc && !S.rc) S.rc = rc;
  for (int i = 0; i < nt; i++) {
    free(own[i]);
    free(got[i]);
  }
  return drc;
}

int od_shadow_install(k3k_backend_t *be, k3k_backend_t *ref, uint64_t check, uint64_t fix,
                      bool print) {
  if (S.be || !be || !ref) return K3_EINVAL;
  S.be = be;
  S.ref = ref;
  S.orig = be->run;
  be->run = shadow_run;
  od_shadow_set(check, fix, print);
  od_shadow_tag("");
  od_shadow_reset();
  return 0;
}

void od_shadow_set(uint64_t check, uint64_t fix, bool print) {
  S.check = check;
  S.fix = fix;
  S.print = print;
}

void od_shadow_tag(const char *tag) { snprintf(S.tag, sizeof S.tag, "%s", tag); }

void od_shadow_reset(void) {
  memset(S.st, 0, sizeof S.st);
  S.rc = 0;
  S.seq = 0;
}

int od_shadow_error(void) { return S.rc; }
const od_opstat_t *od_shadow_stats(void) { return S.st; }

void od_shadow_print_summary(const char *title) {
  printf("  summary %s:\n", title);
  for (int op = 0; op < K3K_OP_COUNT; op++) {
    const od_opstat_t *s = &S.st[op];
    if (!s->calls) continue;
    printf("    %-16s calls %4d  rel mean %.3e max %.3e  maxabs %.3e  elements differing %.2f%%\n",
           k3k_op_name((k3k_op_t)op), s->calls, s->sum_rel / s->calls, s->max_rel, s->max_abs,
           s->n ? 100.0 * (double)s->n_diff / (double)s->n : 0.0);
  }
  fflush(stdout);
}

void od_shadow_remove(void) {
  if (!S.be) return;
  S.be->run = S.orig;
  for (int i = 0; i < S.n_wc; i++) free(S.wc[i].host);
  free(S.wc);
  memset(&S, 0, sizeof S);
}
