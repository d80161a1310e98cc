/* test_kernels harness implementation (see harness.h): tensors, RNG, counters, and run_case,
 * where float64 math checks "cpu" (and the other host backends), cpu-fast is bit-identical to
 * "cpu", and a device backend is judged against "cpu" by the one tolerance model
 * (tolerance.c). Each backend's run is op_check.c's case_run. */
#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int g_pass, g_fail, g_skip;

void check(bool ok, const char *fmt, ...) {
  if (ok) {
    g_pass++;
    return;
  }
  g_fail++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "FAIL: ");
  vfprintf(stdout, fmt, ap);
  fprintf(stdout, "\n");
  va_end(ap);
}

static uint64_t g_rng = 0x1234567887654321ull;
void rng_seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }
uint32_t rng_u32(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 16);
}
double rng_uniform(double lo, double hi) { return lo + (hi - lo) * (rng_u32() / 4294967296.0); }

tt_t tt_new(k3k_dtype_t dt, int ndim, const int64_t *shape, int64_t pad) {
  tt_t x = {0};
  x.t.dtype = dt;
  x.t.ndim = ndim;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    x.t.shape[d] = shape[d];
    x.t.stride[d] = s;
    s *= (shape[d] > 0 ? shape[d] : 1) + (d == ndim - 1 ? pad : 0);
  }
  x.bytes = (size_t)s * k3k_dtype_size(dt) + 64;
  x.buf = calloc(1, x.bytes);
  x.t.data = x.buf;
  return x;
}
tt_t tt_2d(k3k_dtype_t dt, int64_t n0, int64_t n1, int64_t pad) {
  int64_t s[2] = {n0, n1};
  return tt_new(dt, 2, s, pad);
}
tt_t tt_1d(k3k_dtype_t dt, int64_t n0) {
  int64_t s[1] = {n0};
  return tt_new(dt, 1, s, 0);
}
void tt_free(tt_t *x) {
  free(x->buf);
  free(x->want);
  memset(x, 0, sizeof *x);
}

int64_t tt_numel(const tt_t *x) { return k3k_tensor_numel(&x->t); }

static int64_t off_of(const k3k_tensor_t *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t n = t->shape[d] ? t->shape[d] : 1;
    off += (i % n) * t->stride[d];
    i /= n;
  }
  return off;
}

static double get_t(const k3k_tensor_t *t, int64_t i) {
  int64_t o = off_of(t, i);
  switch (t->dtype) {
    case K3K_F32: return ((const float *)t->data)[o];
    case K3K_BF16: return k3_bf16_to_f32(((const uint16_t *)t->data)[o]);
    case K3K_U8: return ((const uint8_t *)t->data)[o];
    case K3K_I32: return ((const int32_t *)t->data)[o];
    case K3K_PTR: break; /* addresses are not values */
  }
  return 0;
}
double tt_get(const tt_t *x, int64_t i) { return get_t(&x->t, i); }
void tt_set(tt_t *x, int64_t i, double v) {
  int64_t o = off_of(&x->t, i);
  switch (x->t.dtype) {
    case K3K_F32: ((float *)x->t.data)[o] = (float)v; break;
    case K3K_BF16: ((uint16_t *)x->t.data)[o] = k3_f32_to_bf16((float)v); break;
    case K3K_U8: ((uint8_t *)x->t.data)[o] = (uint8_t)v; break;
    case K3K_I32: ((int32_t *)x->t.data)[o] = (int32_t)v; break;
    case K3K_PTR: break;
  }
}
int32_t tt_geti(const tt_t *x, int64_t i) { return (int32_t)tt_get(x, i); }
void tt_seti(tt_t *x, int64_t i, int32_t v) { tt_set(x, i, v); }

void tt_rand(tt_t *x, double lo, double hi) {
  for (int64_t i = 0; i < tt_numel(x); i++) tt_set(x, i, rng_uniform(lo, hi));
}

double *tt_expect(tt_t *x, double atol, double rtol) {
  free(x->want);
  x->want = calloc((size_t)tt_numel(x) + 1, sizeof(double));
  x->atol = atol;
  x->rtol = rtol;
  x->out = true;
  return x->want;
}

double tol_rel(k3k_dtype_t dt) { return dt == K3K_BF16 ? 8e-3 : 2e-5; }

/* Bytes of one logical element at index i. */
static const void *elem_ptr(const k3k_tensor_t *t, int64_t i) {
  return (const char *)t->data + off_of(t, i) * (int64_t)k3k_dtype_size(t->dtype);
}

int run_host(const char *backend, k3k_op_t op, const void *params, tt_t *slots, int n) {
  const k3k_tensor_t *tp[K3K_MAX_ARGS];
  for (int i = 0; i < n; i++) tp[i] = &slots[i].t;
  return k3k_run(k3k_backend_get(backend), op, params, tp, n);
}

/* A host backend's output slot i (got: a host copy of its buffer) against the float64 math. */
static void check_want(const char *name, const char *be_name, int i, const tt_t *s, void *got) {
  const k3k_tensor_t gt = view_in(s, got);
  double maxerr = 0;
  int64_t bad = -1;
  for (int64_t e = 0; e < tt_numel(s); e++) {
    double err = fabs(get_t(&gt, e) - s->want[e]);
    if (!(err <= s->atol + s->rtol * fabs(s->want[e])) && bad < 0) bad = e;
    if (err > maxerr || isnan(err)) maxerr = isnan(err) ? INFINITY : err;
  }
  check(bad < 0, "%s[%s] t[%d]: element %lld got %.8g want %.8g (max abs err %.3g)", name,
        be_name, i, (long long)bad, bad >= 0 ? get_t(&gt, bad) : 0.0,
        bad >= 0 ? s->want[bad] : 0.0, maxerr);
}

/* The other host backends: output slot i byte for byte equal to "cpu"'s (host copies). */
static void check_bits(const char *name, const char *be_name, int i, const tt_t *s, void *got,
                       void *ref) {
  const k3k_tensor_t gt = view_in(s, got), rt = view_in(s, ref);
  int64_t diff = -1;
  for (int64_t e = 0; e < tt_numel(s) && diff < 0; e++)
    if (memcmp(elem_ptr(&gt, e), elem_ptr(&rt, e), k3k_dtype_size(s->t.dtype))) diff = e;
  check(diff < 0, "%s[%s] t[%d]: not bit-identical to cpu at element %lld (%.9g vs %.9g)", name,
        be_name, i, (long long)diff, diff >= 0 ? get_t(&gt, diff) : 0.0,
        diff >= 0 ? get_t(&rt, diff) : 0.0);
}

/* Every backend in k3k_backend_names() order ("cpu" first) through case_run (op_check.c). */
int run_case(const char *name, k3k_op_t op, const void *params, tt_t *slots, int n, int want_rc) {
  void *orig[K3K_MAX_ARGS] = {0}; /* inputs and in/out slots as given, for every backend */
  void *ref[K3K_MAX_ARGS] = {0};  /* "cpu" outputs: what the others match */
  for (int i = 0; i < n; i++)
    if (!slots[i].out || slots[i].inout) orig[i] = dup_buf(&slots[i]);
  double rms[2];
  tol_in_rms(slots, n, orig, rms);
  int ran = 0;
  bool on_dev = false, on_any = false;
  for (const char *const *nm = k3k_backend_names(); *nm; nm++) {
    k3k_backend_t *be = k3k_backend_get(*nm);
    if (!be) continue;
    ran++;
    void *got[K3K_MAX_ARGS] = {0};
    bool called;
    const int rc = case_run(be, op, params, slots, n, orig, got, NULL, &called);
    check(called, "%s[%s]: alloc", name, be->name);
    if (!called) continue;
    if (rc == K3_ENOTSUP && !be->host_memory && want_rc != K3_ENOTSUP && !g_require_dev) {
      /* A device backend that does not implement this op/shape (its `supports` said no) is a
       * skip, not a failure; the CPU backends must run everything. */
      g_skip++;
      printf("SKIP: %s[%s]: not supported\n", name, be->name);
      for (int i = 0; i < n; i++) free(got[i]);
      continue;
    }
    check(rc == want_rc, "%s[%s]: rc %d (%s), want %d", name, be->name, rc, k3_errname(rc),
          want_rc);
    const bool ok = rc == 0 && want_rc == 0;
    on_any |= ok;
    on_dev |= ok && !be->host_memory;
    if (want_rc != 0) case_untouched(name, be->name, slots, n, orig, got);
    for (int i = 0; i < n; i++) {
      const tt_t *s = &slots[i];
      if (!s->out) continue;
      if (ok && s->want && be->host_memory) check_want(name, be->name, i, s, got[i]);
      if (rc == 0 && !strcmp(be->name, "cpu")) {
        free(ref[i]);
        ref[i] = got[i];
        got[i] = NULL;
      } else if (ok && !ref[i]) {
        check(false, "%s[%s] t[%d]: no \"cpu\" output to judge against", name, be->name, i);
      } else if (ok && !be->host_memory) {
        /* a device backend: the one tolerance model against "cpu" (tolerance.c) */
        tol_judge(name, be->name, false, i, s, got[i], ref[i], rms, false);
      } else if (rc == 0 && be->host_memory) {
        check_bits(name, be->name, i, s, got[i], ref[i]);
      }
    }
    for (int i = 0; i < n; i++) free(got[i]);
  }
  if (want_rc == 0) cov_note(op, on_dev, on_any);
  for (int i = 0; i < n; i++) {
    /* Leave the reference result in the host tensor so cases can chain ops. */
    if (ref[i]) memcpy(slots[i].buf, ref[i], slots[i].bytes);
    free(ref[i]);
    free(orig[i]);
  }
  return ran;
}
