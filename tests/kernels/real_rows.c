/* Real-shape cases of the row-wise ops (test_kernels --real, real.c): RMSNORM at K3's widths
 * (7168 residual, 1536 q_a, 512 kv_a) with and without the inner bf16 rounding, GATED_RMSNORM
 * and L2NORM over 96 heads of 128, GET_ROWS from the embedding (7168 wide) and more rows than a
 * grid dimension holds, the elementwise ops at 12288 channels, COPY, ATTN_RES_MIX in its
 * decode, batch and persistent forms, and SAMPLE at vocab 163840 (mixed configurations and the
 * all-greedy argmax with ties, NaN, -0 and -inf rows). Ported from k3k-gpu-check's parity
 * suite (gpu_parity.c) with the same shapes and value ranges.
 * Tolerances: the model's (tolerance.c); GET_ROWS and COPY are data movement: exact. */
#include <stdlib.h>
#include <string.h>

#include "real.h"

static void rmsnorm_case(int64_t T, int64_t D, k3k_dtype_t dt, int inner, float eps) {
  tt_t s[3] = {tt_2d(dt, T, D, 0), tt_1d(dt, D), tt_2d(dt, T, D, 0)};
  tt_rand(&s[0], -2, 2), tt_rand(&s[1], 0.5, 1.5), real_out(&s[2], 0);
  const k3k_rmsnorm_params_t p = {eps, inner};
  char name[128];
  snprintf(name, sizeof name, "rmsnorm T=%lld D=%lld %s inner=%d", (long long)T, (long long)D,
           k3k_dtype_name(dt), inner);
  fused_check(name, K3K_OP_RMSNORM, &p, s, 3, NULL, NULL);
  tt_free_all(s, 3);
}

static void gated_case(int64_t T, int64_t NH) {
  tt_t s[4] = {tt_2d(K3K_BF16, T, NH * 128, 0), tt_2d(K3K_BF16, T, NH * 128, 0),
               tt_1d(K3K_F32, 128), tt_2d(K3K_BF16, T, NH * 128, 0)};
  tt_rand(&s[0], -2, 2), tt_rand(&s[1], -4, 4), tt_rand(&s[2], 0.5, 1.5), real_out(&s[3], 0);
  const k3k_gated_rmsnorm_params_t p = {128, 1e-5f};
  char name[128];
  snprintf(name, sizeof name, "gated_rmsnorm T=%lld NH=%lld", (long long)T, (long long)NH);
  fused_check(name, K3K_OP_GATED_RMSNORM, &p, s, 4, NULL, NULL);
  tt_free_all(s, 4);
}

static void l2_case(int64_t T, int64_t NH) {
  tt_t s[2] = {tt_2d(K3K_BF16, T, NH * 128, 0), tt_2d(K3K_F32, T, NH * 128, 0)};
  tt_rand(&s[0], -2, 2), real_out(&s[1], 0);
  const k3k_l2norm_params_t p = {128, 1e-6f, 1.0f};
  char name[128];
  snprintf(name, sizeof name, "l2norm T=%lld NH=%lld ->f32", (long long)T, (long long)NH);
  fused_check(name, K3K_OP_L2NORM, &p, s, 2, NULL, NULL);
  tt_free_all(s, 2);
}

static void get_rows_case(int64_t T, int64_t V, int64_t D) {
  tt_t s[3] = {tt_2d(K3K_BF16, V, D, 0), tt_1d(K3K_I32, T), tt_2d(K3K_BF16, T, D, 0)};
  tt_rand(&s[0], -1, 1), real_out(&s[2], TOL_EXACT);
  for (int64_t i = 0; i < T; i++) tt_seti(&s[1], i, (int32_t)(rng_u32() % (uint32_t)V));
  char name[128];
  snprintf(name, sizeof name, "get_rows T=%lld V=%lld D=%lld", (long long)T, (long long)V,
           (long long)D);
  fused_check(name, K3K_OP_GET_ROWS, NULL, s, 3, NULL, NULL);
  tt_seti(&s[1], T / 2, (int32_t)V); /* an id past the table: refused, nothing written */
  strncat(name, " id out of range", sizeof name - strlen(name) - 1);
  op_check_err(name, K3K_OP_GET_ROWS, NULL, s, 3, K3_ERANGE);
  tt_free_all(s, 3);
}

/* ADD, SIGMOID (-> f32), SIGMOID_MUL (both forms), SITU, SILU_MUL over [R,C] bf16 in [-6,6). */
static void elementwise_case(int64_t R, int64_t C) {
  tt_t a = tt_2d(K3K_BF16, R, C, 0), b = tt_2d(K3K_BF16, R, C, 0);
  tt_rand(&a, -6, 6), tt_rand(&b, -6, 6);
  static const char *nm[] = {"add", "sigmoid->f32", "sigmoid_mul", "sigmoid_mul_bf16inner",
                             "situ", "silu_mul"};
  static const k3k_op_t ops[] = {K3K_OP_ADD, K3K_OP_SIGMOID, K3K_OP_SIGMOID_MUL,
                                 K3K_OP_SIGMOID_MUL, K3K_OP_SITU, K3K_OP_SILU_MUL};
  for (int k = 0; k < 6; k++) {
    tt_t s[3] = {a, b, tt_2d(k == 1 ? K3K_F32 : K3K_BF16, R, C, 0)};
    real_out(&s[2], 0);
    if (k == 1) s[1] = s[2];
    const k3k_sigmoid_mul_params_t sm = {k == 3};
    const k3k_situ_params_t su = {4.0f, 25.0f};
    const void *p = k == 2 || k == 3 ? (const void *)&sm : k == 4 ? (const void *)&su : NULL;
    char name[96];
    snprintf(name, sizeof name, "%s R=%lld C=%lld", nm[k], (long long)R, (long long)C);
    fused_check(name, ops[k], p, s, k == 1 ? 2 : 3, NULL, NULL);
    tt_free(&s[2]);
  }
  tt_free(&a), tt_free(&b);
}

/* COPY between the float dtypes (both directions, a row-strided source) and I32 bits. */
static void copy_case(int64_t T, int64_t D, k3k_dtype_t from, k3k_dtype_t to, int64_t pad) {
  tt_t s[2] = {tt_2d(from, T, D, pad), tt_2d(to, T, D, 0)};
  if (from == K3K_I32)
    for (int64_t i = 0; i < T * D; i++) tt_seti(&s[0], i, (int32_t)rng_u32());
  else
    tt_rand(&s[0], -3, 3);
  real_out(&s[1], TOL_EXACT);
  char name[96];
  snprintf(name, sizeof name, "copy T=%lld D=%lld %s->%s%s", (long long)T, (long long)D,
           k3k_dtype_name(from), k3k_dtype_name(to), pad ? " strided" : "");
  fused_check(name, K3K_OP_COPY, NULL, s, 2, NULL, NULL);
  tt_free_all(s, 2);
}

static void attn_res_case(int64_t nb, int64_t T, int64_t D) {
  const int64_t sh[3] = {nb, T, D};
  tt_t s[5] = {tt_new(K3K_BF16, 3, sh, 0), tt_2d(K3K_BF16, T, D, 0), tt_1d(K3K_BF16, D),
               tt_1d(K3K_BF16, D), tt_2d(K3K_BF16, T, D, 0)};
  tt_rand(&s[0], -2, 2), tt_rand(&s[1], -2, 2), tt_rand(&s[2], 0.5, 1.5);
  tt_rand(&s[3], -0.05, 0.05), real_out(&s[4], 0);
  const k3k_attn_res_params_t p = {1e-5f};
  char name[96];
  snprintf(name, sizeof name, "attn_res_mix nb=%lld T=%lld D=%lld", (long long)nb, (long long)T,
           (long long)D);
  fused_check(name, K3K_OP_ATTN_RES_MIX, &p, s, 5, NULL, NULL);
  tt_free_all(s, 5);
}

/* Six rows of greedy / temperature / top-k / top-p configurations (ids exact). */
static void sample_case(int64_t V) {
  enum { R = 6 };
  tt_t s[2] = {tt_2d(K3K_F32, R, V, 0), tt_1d(K3K_I32, R)};
  tt_rand(&s[0], -8, 8), real_out(&s[1], 0);
  static const k3k_sample_cfg_t cfg[R] = {{0.0f, 0, 1.0f, 1, 0},     {1.0f, 0, 1.0f, 7, 3},
                                          {0.7f, 40, 1.0f, 9, 1},    {1.0f, 0, 0.9f, 11, 5},
                                          {0.8f, 100, 0.95f, 13, 2}, {1.0f, 1, 1.0f, 17, 0}};
  const k3k_sample_params_t p = {R, cfg};
  char name[96];
  snprintf(name, sizeof name, "sample rows=%d V=%lld (greedy/temp/top-k/top-p)", R, (long long)V);
  fused_check(name, K3K_OP_SAMPLE, &p, s, 2, NULL, NULL);
  tt_free_all(s, 2);
}

/* All-greedy batches (the device-only argmax): ties (the lowest index wins), NaN (never wins),
 * -0 == +0, an all -inf row (id 0), BF16 logits (many exact ties at the maximum). */
static void greedy_case(int64_t N, int64_t V, k3k_dtype_t dt) {
  tt_t s[2] = {tt_2d(dt, N, V, 0), tt_1d(K3K_I32, N)};
  tt_rand(&s[0], -8, 8), real_out(&s[1], 0);
  if (N >= 5) {
    tt_set(&s[0], 1 * V + 90000, 50.0), tt_set(&s[0], 1 * V + 100, 50.0);
    tt_set(&s[0], 2 * V + 5, NAN), tt_set(&s[0], 2 * V + 7, NAN);
    tt_set(&s[0], 2 * V + V - 1, 60.0);
    for (int64_t i = 0; i < V; i++) tt_set(&s[0], 3 * V + i, -INFINITY), tt_set(&s[0], 4 * V + i, -1.0);
    tt_set(&s[0], 4 * V + 70000, 0.0), tt_set(&s[0], 4 * V + 60000, -0.0);
  }
  k3k_sample_cfg_t cfg[64];
  memset(cfg, 0, sizeof cfg);
  for (int i = 0; i < 64; i++) cfg[i].top_k = i % 3 == 1 ? 1 : 0; /* both greedy forms */
  const k3k_sample_params_t p = {(int32_t)N, cfg};
  char name[96];
  snprintf(name, sizeof name, "sample all-greedy rows=%lld V=%lld %s", (long long)N, (long long)V,
           k3k_dtype_name(dt));
  fused_check(name, K3K_OP_SAMPLE, &p, s, 2, NULL, NULL);
  tt_free_all(s, 2);
}

void real_rows(void) {
  rng_seed(3001);
  if (!g_quick) {
    /* more rows than a grid dimension holds (the 48B MoE gathers 64 x 136 tokens x top-8
     * rows): the 16-byte path (D % 8 == 0) and the generic kernel's row loop (D = 100) */
    get_rows_case(69632, 512, 2304);
    get_rows_case(70001, 64, 100);
  }
  for (int i = 0; i < g_real_nT; i++) {
    const int64_t T = g_real_T[i];
    rmsnorm_case(T, 7168, K3K_BF16, 1, 1e-5f);
    rmsnorm_case(T, 7168, K3K_BF16, 0, 1e-5f);
    rmsnorm_case(T, 1536, K3K_F32, 0, 1e-6f);
    rmsnorm_case(T, 512, K3K_BF16, 1, 1e-6f);
    gated_case(T, 96);
    l2_case(T, 96);
    get_rows_case(T, 4096, 7168);
    elementwise_case(T, 12288);
    copy_case(T, 7168, K3K_BF16, K3K_F32, 0);
    copy_case(T, 7168, K3K_F32, K3K_BF16, 5);
    attn_res_case(T == 1000 ? 8 : T == 63 ? 1 : T == 64 ? 2 : 0, T, 7168);
  }
  copy_case(65, 576, K3K_I32, K3K_I32, 3);
  /* ATTN_RES_MIX decode form (T <= SM count: 512 threads, 8 values per load batch) */
  attn_res_case(8, 1, 7168);
  attn_res_case(15, 3, 7168); /* 16 values: two batches */
  attn_res_case(3, 2, 2304);  /* 48B width: threads without a vector */
  attn_res_case(5, 140, 7168); /* T > SM count: the persistent form */
  sample_case(163840);
  greedy_case(64, 163840, K3K_F32);
  greedy_case(5, 163840, K3K_BF16);
  greedy_case(3, 1001, K3K_F32); /* one part per row, generic loads */
  greedy_case(3, 4100, K3K_F32); /* three float4 parts per row */
}
