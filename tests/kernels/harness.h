/* test_kernels harness (ggml test-backend-ops style): host tensors with float64 expectations,
 * a runner that uploads a case to every available backend, poisons outputs, runs the op,
 * downloads and compares against the expectation (tolerance per output) and — for the other
 * host backends ("cpu-fast") — requires bit-identity with "cpu". */
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
} tt_t;

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

/* Runs op on every backend; checks rc == want_rc and, when 0, every expected output. Returns
 * the number of backends it ran on. Output buffers of the LAST run on "cpu" are left in the
 * host tensors (so cases can chain ops). */
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
void t_fused_real(bool require_device);    /* the same at the real K3 shapes (--real) */
/* Shared by t_fused.c and t_fused_moe.c: a PTR slot's matrices (uploaded per backend, the slot
 * filled with their addresses), the one-tolerance-model check of a fused op (chain: the outputs
 * computed op by op on "cpu", or NULL), and buffer helpers. */
typedef struct {
  int slot, n;
  const tt_t *mats;
} ft_table_t;
extern bool g_require_dev;
void fused_check(const char *name, k3k_op_t op, const void *params, tt_t *s, int n, void **chain,
                 const ft_table_t *tab);
void *dup_buf(const tt_t *s);
k3k_tensor_t view_in(const tt_t *s, void *buf);
void t_fused_moe(void);                    /* t_fused_moe.c: MOE_ROUTED, tiny shapes */
void t_fused_moe_real(void);               /* MOE_ROUTED at real expert shapes (--real) */
void t_gemm_direct(void);
int perf_main(int argc, char **argv);
int perf_mx_main(void);

#endif
