/* Internal contract between the two kernels of KDA_CHUNK (kda_chunk_intra.cu, kda_chunk.cu).
 *
 * What it is for: the chunk record layout in device scratch, the argument block both kernels
 * take, and the ldmatrix address helpers they share. The op runs in three launches:
 *   1. kc_table   (kda_chunk.cu)        chunk_first[N+1]: prefix sums of ceil(len/64);
 *   2. kc_intra   (kda_chunk_intra.cu)  one block per (chunk, head), fully parallel: the
 *      state-independent half of spec §3.8 (G, Akk, Aqk, (I+L)^-1, W, U, q e^G, k e^{Gl-G});
 *   3. kc_state   (kda_chunk.cu)        one block per (32 value columns, head, sequence) walks
 *      the sequence's chunks in order with its fp32 state slice in registers:
 *      Vn = U - W S, O = (q e^G) S + Aqk Vn, S <- e^{Gl} S + (k e^{Gl-G})^T Vn.
 * What it is not: a public header (kernels/cuda/ only).
 * Invariants: one record per (global chunk slot c, head h0 + y) at scratch + (c*hg + y)*KC_REC
 * (heads go in groups of hg so the scratch stays near 1 GiB for long prompts);
 * every matrix in a record is row-major bf16 (rows = chunk rows r), rows >= n (ragged last
 * chunk) are zero in W, U, q e^G, k e^{Gl-G} and Aqk, so the state pass needs no row masks
 * except for the output store. */
#ifndef K3K_KDA_CHUNK_CUH
#define K3K_KDA_CHUNK_CUH

#include "mma_sm80.cuh"

#define KC_C 64    /* chunk length */
#define KC_D 128   /* Dk = Dv */
/* Record: W [64][128], U [64][128], Qg = q*scale*e^G [64][128], Kl = k e^{Gl-G} [64][128],
 * Aqk [64][64] (bf16, lower incl. diagonal, zeros above), eGl = e^{G_last} [128] fp32. */
#define KC_REC_W 0
#define KC_REC_U 16384
#define KC_REC_Q 32768
#define KC_REC_K 49152
#define KC_REC_A 65536
#define KC_REC_E 73728
#define KC_REC 74240
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

/* ldmatrix lane addresses (element offsets (row, col) into a row-major tile), see the fragment
 * layouts in mma_sm80.cuh. mi = lane >> 3 selects which of the four 8x8 matrices a lane names.
 *  A [m][k] (non-trans):      m = m0 + (lane & 15), k = k0 + (lane >> 4) * 8
 *  A^T stored [k][m] (trans): k = k0 + (lane & 7) + (mi >> 1) * 8, m = m0 + (mi & 1) * 8
 *  B stored [n][k], two n-tiles (non-trans): n = n0 + (lane & 7) + (mi >> 1) * 8,
 *                                            k = k0 + (mi & 1) * 8   -> r0,r1 | r2,r3
 *  B stored [n][k], one n-tile, k0..k0+31:   n = n0 + (lane & 7), k = k0 + mi * 8
 *  B stored [k][n], two n-tiles (trans):     k = k0 + (lane & 7) + (mi & 1) * 8,
 *                                            n = n0 + (mi >> 1) * 8  -> r0,r1 | r2,r3 */

/* Byte offset of (row, col) in a row-major bf16 tile of `chunks` 16-byte chunks per row whose
 * chunk index is XOR-swizzled with the row (no padding, conflict-free ldmatrix). */
__device__ __forceinline__ unsigned kc_swz(int row, int col, int chunks) {
  return (unsigned)(row * chunks * 16 + ((((col >> 3) ^ (row & 7)) & (chunks - 1)) << 4) +
                    (col & 7) * 2);
}

int kc_intra_launch(const kc_args &a, int n_chunk_slots, cudaStream_t st);

#endif
