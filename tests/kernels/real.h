/* Shared by the real-shape cases of test_kernels (`--real`, real*.c): the token counts, the
 * groups, and the input builders more than one group uses.
 * What it is not: a second harness; every case goes through fused_check / op_check_err
 * (op_check.c) and so the one tolerance model (tolerance.c). */
#ifndef K3K_TEST_REAL_H
#define K3K_TEST_REAL_H

#include "harness.h"

/* T in {1, 63, 64, 65, 1000} (around the 64-row tiles), or {1, 65} with --quick. */
extern const int64_t *g_real_T;
extern int g_real_nT;

void real_rows(void); /* real_rows.c: norms, GET_ROWS, elementwise, COPY, ATTN_RES_MIX, SAMPLE */
void real_gemm(void); /* real_gemm.c: GEMM (views), MXFP4_GEMM, MXFP4_DEQUANT */
void real_seq(void);  /* real_seq.c: CONV_PREFILL/STEP, KDA_GATE, KDA_STEP, KDA_CHUNK */
void real_mla(void);  /* real_mla.c: MLA cache ops, MLA_DECODE, MLA_PREFILL */
void real_moe(void);  /* real_moe.c: ROUTER, MOE_COMBINE */

/* Sequence lengths summing to T into cu[0..n] (ragged, with a zero-length sequence when
 * T > 1): 1, 63, 0, 64, then the rest. Returns n (< maxn). */
int real_split_lens(int64_t T, int32_t *cu, int maxn);
/* Fills rows x heads of 128 with random unit-norm heads (what L2NORM produces). */
void real_unit_heads(tt_t *x, int64_t rows, int64_t nh);
/* Marks s as a pure output with device bound tol (0: by dtype, TOL_EXACT). */
static inline void real_out(tt_t *s, double tol) {
  s->out = true;
  s->tol = tol;
}
/* Marks s as an in/out slot with device bound tol. */
static inline void real_inout(tt_t *s, double tol) {
  s->out = s->inout = true;
  s->tol = tol;
}

#endif
