/* test_kernels harness (ggml test-backend-ops style): the one op-test program of k3k. Host
 * tensors with float64 expectations; a runner that uploads a case to every available backend,
 * poisons outputs, runs the op and downloads. "cpu" (the specification) is checked against the
 * float64 expectation; every other backend is judged against "cpu"'s output of the same case:
 * the other host backends ("cpu-fast") bit for bit, a device backend by the one tolerance model
 * (tolerance.c). The real-shape cases (`--real`, real*.c) judge every backend against the
 * reference backend (--ref) by the same model. */
#ifndef K3K_TEST_HARNESS_H
#define K3K_TEST_HARNESS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "k3k.h"
#include "k3pd/err.h"
#include "k3pd/util.h"

typedef struct {
  k3k_tensor_t t;  /* host view into buf */
  void *buf;       /* owned allocation covering the view */
  size_t bytes;
  double *want;    /* expected values in logical row-major order (numel), or NULL */
  double atol, rtol;
  bool out;        /* written by the op: poisoned before the run unless inout */
  bool inout;      /* initial contents matter (state, cache) */
  double tol;      /* device bound of this output (tolerance.c): 0 = by dtype, TOL_EXACT, or a
                    * looser relative Frobenius bound the case documents */
} tt_t;

/* The one tolerance model (tolerance.c, docs/kernels.md "One op test"). */
#define TOL_BF16 1e-2
#define TOL_F32 1e-4
#define TOL_EXACT (-1.0)
/* RMS of the finite elements of the non-output F32 ([1]) and BF16 ([0]) slots of a case, read
 * from bufs[i] (host copies laid out like s[i].buf; NULL entries skipped): the magnitude floor's
 * operand scale. */
void tol_in_rms(const tt_t *s, int n, void *const *bufs, double rms[2]);
/* The bound tol_judge applies to output s on a device backend. */
double tol_of(const tt_t *s);
/* Judges output slot i (s) of backend be_name: got vs ref, host copies of the slot's buffer.
 * exact: the host backends' identity; else the model. Records through check(); verbose prints
 * the figures of a passing case too. Returns true when it passed. */
bool tol_judge(const char *name, const char *be_name, bool exact, int i, const tt_t *s,
               const void *got, const void *ref, const double in_rms[2], bool verbose);

/* Coverage (coverage.c): cases per op that ran and were judged, on a device backend / any. */
void cov_note(k3k_op_t op, bool on_device, bool on_any);
/* Prints the per-op counts (when verbose) and FAILs naming every op of k3k_ops.def that no case
 * covered: on a device backend (device) or on any backend. */
void cov_check(bool device, bool verbose);

/* Counters and reporting. */
extern int g_pass, g_fail, g_skip; /* g_skip: device backend answered K3_ENOTSUP */
void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Deterministic RNG: uniform in [lo, hi). */
void rng_seed(uint64_t s);
double rng_uniform(double lo, double hi);
uint32_t rng_u32(void);

/* Allocates a host tensor; `pad` extra elements per row (innermost dim) make a strided view. */
tt_t tt_new(k3k_dtype_t dt, int ndim, const int64_t *shape, int64_t pad);
tt_t tt_2d(k3k_dtype_t dt, int64_t n0, int64_t n1, int64_t pad);
tt_t tt_1d(k3k_dtype_t dt, int64_t n0);
void tt_free(tt_t *x);
/* Fills every logical element with uniform random values in [lo, hi) (stored in the dtype). */
void tt_rand(tt_t *x, double lo, double hi);
/* Logical element i (row-major over shape) as double / set from double. */
double tt_get(const tt_t *x, int64_t i);
void tt_set(tt_t *x, int64_t i, double v);
int32_t tt_geti(const tt_t *x, int64_t i);
void tt_seti(tt_t *x, int64_t i, int32_t v);
int64_t tt_numel(const tt_t *x);
/* Marks x as an output expected to equal want (allocated here, numel entries). */
double *tt_expect(tt_t *x, double atol, double rtol);
/* Tolerance for a dtype: bf16 outputs get ~2 ulps relative. */
double tol_rel(k3k_dtype_t dt);

/* Runs op on every backend; checks rc == want_rc and, when 0: "cpu" and the other host backends
 * against every expected output, the other host backends bit for bit against "cpu", a device
 * backend by the tolerance model against "cpu" (on error: poisoned outputs untouched, in/out
 * slots unchanged, on every backend). Returns the number of backends it ran on. Output buffers
 * of the run on "cpu" are left in the host tensors (so cases can chain ops). */
int run_case(const char *name, k3k_op_t op, const void *params, tt_t *slots, int n, int want_rc);
/* Runs op once on the named backend directly on the host tensors (cpu backends only). */
int run_host(const char *backend, k3k_op_t op, const void *params, tt_t *slots, int n);

/* bf16 rounding in double land (through fp32, RNE). */
static inline double rbf(double v) { return (double)k3_round_bf16((float)v); }
static inline double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Test groups. */
void t_basic(void);
void t_route(void);
void t_seq(void);
void t_mla(void);
void t_mxfp4_fast(void);
void t_mx_bf16_bits(void);
void t_mem(void);
void t_fused(void);                        /* t_fused.c: the fused ops, tiny shapes */
void t_fused_real(void);                   /* the same at the real K3 shapes (--real) */
/* op_check.c: a case judged against a reference backend's output (the fused ops at every size,
 * every op at the real shapes). A PTR slot's matrices (uploaded per backend, the slot filled
 * with their addresses); chain: the outputs computed op by op on "cpu", or NULL. */
typedef struct {
  int slot, n;
  const tt_t *mats;
} ft_table_t;
/* Run settings of op_check.c, set by main.c: the reference backend ("cpu"; --ref), the
 * real-shape run (verbose figures), --require-device (a device refusing a case fails), and
 * whether host backends other than the reference run at all. */
extern const char *g_ref;
extern bool g_real, g_require_dev, g_host_others;
void fused_check(const char *name, k3k_op_t op, const void *params, tt_t *s, int n, void **chain,
                 const ft_table_t *tab);
/* The same for a call every backend must refuse with want_rc (!= 0), writing nothing. */
void op_check_err(const char *name, k3k_op_t op, const void *params, tt_t *s, int n, int want_rc);
/* One backend's run of a case (the one upload/poison/run/download of run_case and fused_check):
 * slots uploaded from orig (inputs, in/out; buf NULL: a NULL tensor), pure outputs poisoned
 * (all-ones bytes), tab's PTR slot (tab may be NULL) filled with its matrices' addresses on be,
 * MOE_ROUTED's NULL ws slot given k3k_workspace bytes. Once the op was called (*called, may be
 * NULL), every output goes to got[i] (malloc'd; the caller frees), whatever the op returned.
 * Returns the op's rc (or the synchronisation's), or K3_ENOMEM when the setup failed. */
int case_run(k3k_backend_t *be, k3k_op_t op, const void *params, const tt_t *s, int n,
             void **orig, void **got, const ft_table_t *tab, bool *called);
/* After a refused call: checks every byte of each pure output in got still the poison and
 * every in/out slot equal to orig. */
void case_untouched(const char *name, const char *be_name, const tt_t *s, int n, void **orig,
                    void **got);
void *dup_buf(const tt_t *s);
k3k_tensor_t view_in(const tt_t *s, void *buf);
void tt_free_all(tt_t *s, int n); /* tt_free of every slot with a buffer */
void t_fused_moe(void);                    /* t_fused_moe.c: MOE_ROUTED, tiny shapes */
void t_fused_moe_real(void);               /* MOE_ROUTED at real expert shapes (--real) */
/* --real (real.c): every op at the real K3 shapes; quick: T in {1, 65}, fewer big cases. */
extern bool g_quick;
extern const char *g_real_groups; /* --groups: NULL = all */
bool real_groups_valid(const char *list);
void t_real(void);
void t_gemm_direct(void);
int perf_main(int argc, char **argv);
int perf_mx_main(void);

#endif
