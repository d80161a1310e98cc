/* Internal contract between the kernels of KDA_CHUNK (kda_chunk_intra.cu, kda_chunk_state_wg.cu,
 * kda_chunk.cu).
 *
 * What it is for: the chunk record layout in device scratch and the argument block the kernels
 * take. The op runs in three launches:
 *   1. kc_table   (kda_chunk.cu)        chunk_first[N+1]: prefix sums of ceil(len/64);
 *   2. kc_intra   (kda_chunk_intra.cu)  one block per (chunk, head), fully parallel: the
 *      state-independent half of spec §3.8 (G, Akk, Aqk, T = (I+L)^-1 diag(beta), e^G k,
 *      q e^G, k e^{Gl-G});
 *   3. kc_state_wg (kda_chunk_state_wg.cu) one block per (head, sequence) walks the sequence's
 *      chunks in order with the fp32 state in registers (wgmma accumulators):
 *      Vn = T (v - (e^G k) S), O = (q e^G) S + Aqk Vn, S <- e^{Gl} S + (k e^{Gl-G})^T Vn.
 * What it is not: a public header (kernels/cuda/ only).
 * Invariants: one record per (global chunk slot c, head h0 + y) at scratch + (c*hg + y)*KC_REC
 * (heads go in groups of hg so the scratch stays near 1 GiB for long prompts);
 * every matrix in a record has chunk rows r as rows, rows >= n (ragged last
 * chunk) are zero in e^G k, q e^G, k e^{Gl-G}, Aqk and T (beta = 0 there), so the state pass
 * masks only the rows of v it reads and the output store. */
#ifndef K3K_KDA_CHUNK_CUH
#define K3K_KDA_CHUNK_CUH

#include "mma_sm80.cuh"

#define KC_C 64    /* chunk length */
#define KC_D 128   /* Dk = Dv */
/* Record (66 KB, stored exactly as the state pass's shared-memory stage wants it, so a stage
 * is filled by one linear copy; bf16 matrices in the wgmma 128-byte-swizzled layout of kc_sw):
 *   KQ  [Kg; Qg]: rows 0..63 Kg = k e^G, rows 64..127 Qg = q*scale*e^G, 128 key channels
 *       (two 16 KB slabs of 64 channels; a K-major wgmma B operand);
 *   K   Kl = k e^{Gl-G}: rows r, 128 key channels (two 8 KB slabs; the MN-major B operand);
 *   A   Aqk [64][64], T = (I+L)^-1 diag(beta) [64][64] (lower incl. diagonal, zeros above);
 *   E   e^{G_last} [128] fp32, plain. */
#define KC_REC_KQ 0
#define KC_REC_K 32768
#define KC_REC_A 49152
#define KC_REC_T 57344
#define KC_REC_E 65536
#define KC_REC 66048

/* Byte offset of the 16-byte chunk c16 (channels 8c16..8c16+7) of row `row` in a bf16 operand
 * stored as slabs of 64 channels (`slab` bytes apart), 128-byte rows, chunk index XOR row % 8:
 * the wgmma 128-byte swizzle (mla_prefill_sm90.cuh states the descriptor side). */
__device__ __forceinline__ unsigned kc_sw(int row, int c16, int slab) {
  return (unsigned)((c16 >> 3) * slab + row * 128 + (((c16 & 7) ^ (row & 7)) << 4));
}
#define KC_SPAN 80.0f /* max G_n - G_s inside a 16-row block for the factorised diagonal */

typedef uint16_t kc_bf;

struct kc_args {
  dv q, k, v, g, beta, o;
  int vq, vk, vv, vg, vo;   /* 1: row-contiguous, 16-byte aligned (vector path) */
  const int32_t *cu;        /* cu_seqlens [N+1] (stride cu_s) */
  const int32_t *slots;     /* [N] (stride sl_s) */
  int64_t cu_s, sl_s;
  const int32_t *cfirst;    /* [N+1] first chunk slot of each sequence (kc_table) */
  unsigned char *rec;       /* records, KC_REC bytes each, [chunk slot][head] */
  float *state;             /* [S][NH][128][128] V-first */
  int64_t st_slot;          /* elements between slots */
  int n_seqs, n_heads;
  int h0, hg;               /* this launch covers heads h0 .. h0+hg-1 (= blockIdx.y + h0) */
  float scale;
  int read_state;
};

/* Last sequence index i with cfirst[i] <= c (i in [0, n]); i == n means c is past the end. */
__device__ __forceinline__ int kc_find_seq(const int32_t *cf, int n, int c) {
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (cf[mid] <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

int kc_intra_launch(const kc_args &a, int n_chunk_slots, cudaStream_t st);
/* The state pass on wgmma, one block per (head, sequence) (kda_chunk_state_wg.cu). */
int kc_state_wg_launch(const kc_args &a, cudaStream_t st);

#endif
