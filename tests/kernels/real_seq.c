/* Real-shape cases of the sequence ops (test_kernels --real, real.c): CONV_PREFILL at K3's
 * 12288 q/k/v channels and the fast path's perf shape (4 sequences of 2048 tokens), ragged
 * batches at every width 2..8, F32 and BF16 states, zero starts, rows outside every sequence,
 * more tokens than grid rows, the generic kernel (C % 8 != 0), and the refused calls (slot out
 * of range, duplicate slot, cu_seqlens past T: nothing written); CONV_STEP at 12288 channels;
 * KDA_GATE in both forms; KDA_STEP at 96 heads; KDA_CHUNK with one and ragged sequences, F32
 * and BF16 activations, 96 heads ragged, and the wide-span case (gates down to -40: the
 * per-element diagonal path). Ported from k3k-gpu-check (gpu_parity.c, gpu_conv_cases).
 * Tolerances: the model's (tolerance.c); conv states hold copied raw inputs: exact. KDA_CHUNK's
 * output and F32 state: 1e-2, because the device feeds its tensor cores bf16 operands (q, k, v
 * times exp factors, the WY/UT intermediates and the state itself: 2^-9 relative each, fp32
 * accumulate), so unlike KDA_STEP (fp32 CUDA cores, 1e-4) its state carries bf16-operand error
 * (~1e-3 observed); an indexing or math error gives O(1). */
#include <stdlib.h>
#include <string.h>

#include "real.h"

#define TOL_KDA_CHUNK 1e-2

enum { CX, CW, CCU, CSL, CST, CY };

/* CONV_PREFILL of width W over T tokens: ragged (real_split_lens), `equal` > 0 sequences of
 * T/equal tokens, or -`equal` sequences covering rows [T/10, T - T/10) only (the rows outside
 * every sequence stay poisoned on every backend); state of dtype sdt in reversed slots. bad:
 * also the refused calls. */
static void conv_case_cu(int64_t T, int64_t C, int W, int read_state, k3k_dtype_t ydt,
                         k3k_dtype_t sdt, const int32_t *cu, int n, bool bad);

static void conv_case(int64_t T, int64_t C, int W, int read_state, k3k_dtype_t ydt,
                      k3k_dtype_t sdt, int equal, bool bad) {
  int32_t cu[8];
  int n;
  if (equal > 0) {
    n = equal;
    for (int i = 0; i <= n; i++) cu[i] = (int32_t)(T * i / n);
  } else if (equal < 0) {
    n = -equal;
    const int64_t lo = T / 10, hi = T - T / 10;
    for (int i = 0; i <= n; i++) cu[i] = (int32_t)(lo + (hi - lo) * i / n);
  } else {
    n = real_split_lens(T, cu, 8);
  }
  conv_case_cu(T, C, W, read_state, ydt, sdt, cu, n, bad);
}

/* Many short sequences (lengths cycling 0, 1, 2, 3, 5, 9, 17, 4): the fast path's token ranges
 * (~16 tokens at C = 2048) start inside the first W-1 tokens of many sequences, where the range
 * boundary moves back to the sequence start, and sequences shorter than W-1 keep part of their
 * old state. */
static void conv_short_case(int W, int read_state, k3k_dtype_t sdt) {
  static const int32_t lens[8] = {0, 1, 2, 3, 5, 9, 17, 4};
  enum { N = 160 };
  int32_t cu[N + 1];
  cu[0] = 3;
  for (int i = 0; i < N; i++) cu[i + 1] = cu[i] + lens[(i * 5 + W) % 8];
  conv_case_cu(cu[N] + 5, 2048, W, read_state, K3K_BF16, sdt, cu, N, false);
}

static void conv_case_cu(int64_t T, int64_t C, int W, int read_state, k3k_dtype_t ydt,
                         k3k_dtype_t sdt, const int32_t *cu, int n, bool bad) {
  const int64_t S = n + 2, sh[3] = {S, C, W - 1};
  tt_t s[6] = {tt_2d(K3K_BF16, T, C, 0), tt_2d(K3K_F32, C, W, 0), tt_1d(K3K_I32, n + 1),
               tt_1d(K3K_I32, n), tt_new(sdt, 3, sh, 0), tt_2d(ydt, T, C, 0)};
  tt_rand(&s[CX], -2, 2), tt_rand(&s[CW], -0.7, 0.7), tt_rand(&s[CST], -2, 2);
  real_inout(&s[CST], TOL_EXACT), real_out(&s[CY], 0);
  for (int i = 0; i <= n; i++) tt_seti(&s[CCU], i, cu[i]);
  for (int i = 0; i < n; i++) tt_seti(&s[CSL], i, (int32_t)(S - 1 - i)); /* reversed slots */
  const k3k_conv_params_t p = {n, read_state, 1};
  char name[160];
  snprintf(name, sizeof name, "conv_prefill T=%lld C=%lld W=%d seqs=%d read_state=%d ->%s state %s",
           (long long)T, (long long)C, W, n, read_state, k3k_dtype_name(ydt), k3k_dtype_name(sdt));
  fused_check(name, K3K_OP_CONV_PREFILL, &p, s, 6, NULL, NULL);
  if (bad && n >= 2) {
    char nm[200];
    const int32_t good1 = tt_geti(&s[CSL], 1), last = tt_geti(&s[CCU], n);
    tt_seti(&s[CSL], 1, (int32_t)S);
    snprintf(nm, sizeof nm, "%s slot out of range", name);
    op_check_err(nm, K3K_OP_CONV_PREFILL, &p, s, 6, K3_ERANGE);
    tt_seti(&s[CSL], 1, tt_geti(&s[CSL], 0));
    snprintf(nm, sizeof nm, "%s duplicate slot", name);
    op_check_err(nm, K3K_OP_CONV_PREFILL, &p, s, 6, K3_EINVAL);
    tt_seti(&s[CSL], 1, good1);
    tt_seti(&s[CCU], n, (int32_t)(T + 1));
    snprintf(nm, sizeof nm, "%s cu past T", name);
    op_check_err(nm, K3K_OP_CONV_PREFILL, &p, s, 6, K3_ERANGE);
    tt_seti(&s[CCU], n, last);
  }
  tt_free_all(s, 6);
}

static void conv_cases(void) {
  if (!g_quick) {
    conv_case(8192, 12288, 4, 1, K3K_BF16, K3K_BF16, 4, true); /* the perf shape */
    conv_case(8192, 12288, 4, 1, K3K_F32, K3K_F32, 0, false);
    conv_case(70000, 12, 4, 1, K3K_BF16, K3K_BF16, 0, false); /* more tokens than grid rows */
    conv_case(70000, 16, 4, 1, K3K_BF16, K3K_F32, 0, false);  /* and the 16-byte kernel */
  }
  for (int W = 2; W <= 8; W++) {
    if (!g_quick || W == 8)
      conv_case(1000, 2048, W, 1, K3K_BF16, W & 1 ? K3K_F32 : K3K_BF16, 0, W == 8);
    conv_case(65, 256, W, W & 1, K3K_F32, K3K_BF16, 0, false);
  }
  for (int W = 2; W <= 8; W += g_quick ? 6 : 1)
    conv_short_case(W, W != 5, W & 1 ? K3K_F32 : K3K_BF16);
  conv_case(3000, 512, 3, 0, K3K_BF16, K3K_F32, 3, false);
  conv_case(3000, 512, 4, 1, K3K_BF16, K3K_BF16, -3, false); /* rows outside sequences */
  conv_case(300, 12, 4, 1, K3K_F32, K3K_BF16, -2, false);    /* the same, generic kernel */
  for (int i = 0; i < g_real_nT; i++) {
    const int64_t T = g_real_T[i];
    conv_case(T, 12288, 4, 1, K3K_BF16, K3K_BF16, 0, false);
    conv_case(T, 256, 4, 0, K3K_F32, K3K_BF16, 0, false);
    conv_case(T, 12, 3, 1, K3K_F32, K3K_F32, 0, T > 1); /* generic kernel: C % 8 */
  }
}

static void conv_step_case(int64_t N, int64_t C) {
  const int64_t sh[3] = {N + 1, C, 3};
  tt_t s[5] = {tt_2d(K3K_BF16, N, C, 0), tt_2d(K3K_F32, C, 4, 0), tt_1d(K3K_I32, N),
               tt_new(K3K_BF16, 3, sh, 0), tt_2d(K3K_BF16, N, C, 0)};
  tt_rand(&s[0], -2, 2), tt_rand(&s[1], -0.7, 0.7), tt_rand(&s[3], -2, 2);
  for (int64_t i = 0; i < N; i++) tt_seti(&s[2], i, (int32_t)(N - i));
  real_inout(&s[3], TOL_EXACT), real_out(&s[4], 0);
  const k3k_conv_params_t p = {(int32_t)N, 1, 1};
  char name[96];
  snprintf(name, sizeof name, "conv_step N=%lld C=%lld", (long long)N, (long long)C);
  fused_check(name, K3K_OP_CONV_STEP, &p, s, 5, NULL, NULL);
  tt_free_all(s, 5);
}

static void gate_case(int64_t T, int64_t NH, k3k_gate_form_t form) {
  tt_t s[4] = {tt_2d(K3K_BF16, T, NH * 128, 0), tt_1d(K3K_F32, 128), tt_1d(K3K_F32, NH * 128),
               tt_2d(K3K_F32, T, NH * 128, 0)};
  tt_rand(&s[0], -3, 3), tt_rand(&s[1], -1, 1.5), tt_rand(&s[2], -1, 1), real_out(&s[3], 0);
  const k3k_kda_gate_params_t p = {form, 128, -5.0f};
  char name[96];
  snprintf(name, sizeof name, "kda_gate T=%lld NH=%lld %s", (long long)T, (long long)NH,
           form == K3K_GATE_LOWER_BOUND ? "lower-bound" : "softplus");
  fused_check(name, K3K_OP_KDA_GATE, &p, s, 4, NULL, NULL);
  tt_free_all(s, 4);
}

static void kda_step_case(int64_t N, int64_t NH, int read_state) {
  const int64_t S = N + 2, P = NH * 128, sh[4] = {S, NH, 128, 128};
  tt_t s[8] = {tt_2d(K3K_F32, N, P, 0), tt_2d(K3K_F32, N, P, 0), tt_2d(K3K_BF16, N, P, 0),
               tt_2d(K3K_F32, N, P, 0), tt_2d(K3K_F32, N, NH, 0), tt_1d(K3K_I32, N),
               tt_new(K3K_F32, 4, sh, 0), tt_2d(K3K_BF16, N, P, 0)};
  real_unit_heads(&s[0], N, NH), real_unit_heads(&s[1], N, NH);
  tt_rand(&s[2], -2, 2), tt_rand(&s[3], -5, 0), tt_rand(&s[4], 0, 1), tt_rand(&s[6], -0.5, 0.5);
  /* distinct slots: 7 is coprime with S unless S % 7 == 0 */
  for (int64_t i = 0; i < N; i++) tt_seti(&s[5], i, (int32_t)(S % 7 ? (i * 7 + 1) % S : i + 1));
  real_inout(&s[6], 0), real_out(&s[7], 0);
  const k3k_kda_params_t p = {(int32_t)N, (int32_t)NH, read_state, 0.0f, 0};
  char name[96];
  snprintf(name, sizeof name, "kda_step N=%lld NH=%lld read_state=%d", (long long)N,
           (long long)NH, read_state);
  fused_check(name, K3K_OP_KDA_STEP, &p, s, 8, NULL, NULL);
  tt_free_all(s, 8);
}

static void kda_chunk_case(int64_t T, int64_t NH, int read_state, k3k_dtype_t dt, double gmin,
                           bool one_seq) {
  int32_t cu[8];
  int n = one_seq ? 1 : real_split_lens(T, cu, 8);
  if (one_seq) cu[0] = 0, cu[1] = (int32_t)T;
  const int64_t S = n + 2, P = NH * 128, sh[4] = {S, NH, 128, 128};
  tt_t s[9] = {tt_2d(dt, T, P, 0),          tt_2d(dt, T, P, 0),     tt_2d(dt, T, P, 0),
               tt_2d(K3K_F32, T, P, 0),     tt_2d(K3K_F32, T, NH, 0), tt_1d(K3K_I32, n + 1),
               tt_1d(K3K_I32, n),           tt_new(K3K_F32, 4, sh, 0), tt_2d(dt, T, P, 0)};
  real_unit_heads(&s[0], T, NH), real_unit_heads(&s[1], T, NH);
  tt_rand(&s[2], -2, 2), tt_rand(&s[3], gmin, 0), tt_rand(&s[4], 0, 1), tt_rand(&s[7], -0.5, 0.5);
  for (int i = 0; i <= n; i++) tt_seti(&s[5], i, cu[i]);
  for (int i = 0; i < n; i++) tt_seti(&s[6], i, (int32_t)(S - 1 - i)); /* reversed slots */
  real_inout(&s[7], TOL_KDA_CHUNK), real_out(&s[8], TOL_KDA_CHUNK);
  const k3k_kda_params_t p = {n, (int32_t)NH, read_state, 0.0f, 0};
  char name[160];
  snprintf(name, sizeof name, "kda_chunk T=%lld NH=%lld seqs=%d read_state=%d %s gmin=%g",
           (long long)T, (long long)NH, n, read_state, k3k_dtype_name(dt), gmin);
  fused_check(name, K3K_OP_KDA_CHUNK, &p, s, 9, NULL, NULL);
  if (n >= 2) { /* refused ids: nothing written, the state pool as it was */
    char nm[200];
    const int32_t good1 = tt_geti(&s[6], 1);
    tt_seti(&s[6], 1, (int32_t)S);
    snprintf(nm, sizeof nm, "%s slot out of range", name);
    op_check_err(nm, K3K_OP_KDA_CHUNK, &p, s, 9, K3_ERANGE);
    tt_seti(&s[6], 1, tt_geti(&s[6], 0));
    snprintf(nm, sizeof nm, "%s duplicate slot", name);
    op_check_err(nm, K3K_OP_KDA_CHUNK, &p, s, 9, K3_EINVAL);
    tt_seti(&s[6], 1, good1);
  }
  tt_free_all(s, 9);
}

void real_seq(void) {
  rng_seed(3003);
  conv_cases();
  for (int i = 0; i < g_real_nT; i++) {
    const int64_t T = g_real_T[i];
    gate_case(T, 96, K3K_GATE_LOWER_BOUND);
    gate_case(T, 4, K3K_GATE_SOFTPLUS);
    kda_chunk_case(T, 4, 1, K3K_BF16, -5.0, true);
    kda_chunk_case(T, 4, 0, K3K_BF16, -5.0, true);
    kda_chunk_case(T, 2, i & 1, K3K_F32, -5.0, false);
  }
  static const int64_t kN[] = {1, 63, 64, 65};
  for (int i = 0; i < 4; i++) {
    if (g_quick && (i == 1 || i == 2)) continue;
    conv_step_case(kN[i], 12288);
    kda_step_case(kN[i], i == 0 ? 2 : 96, i != 1);
  }
  kda_chunk_case(65, 96, 1, K3K_BF16, -5.0, false);  /* real head count, ragged */
  kda_chunk_case(200, 2, 1, K3K_BF16, -40.0, false); /* wide gate spans: per-element diagonal */
}
