/* MLA absorbed decode attention: the launch arguments shared by the two attention kernels.
 *
 * What it is for: mla.cu (the op, the mma.sync kernel for any page size, the split merge) and
 * mla_decode_wg.cu (the Hopper kernel: TMA + wgmma, page sizes that are multiples of 8) take
 * the same argument block, so the op picks a kernel without converting anything.
 * What it is not: a public header (kernels/cuda/ only).
 * Invariants: q, kv 16-byte aligned; heads % 48 == 0 for the mma.sync kernel, heads % 8 == 0
 * for the Hopper one, whose q then needs 48 readable rows past the end; every page id a sequence uses was checked
 * to lie in the pool (k3k_cuda_check_pages) before either kernel runs. */
#ifndef K3K_MLA_DECODE_CUH
#define K3K_MLA_DECODE_CUH

#include "cuda_common.cuh"

typedef struct {
  int batch, heads;            /* % 48 == 0 (mma.sync kernel) or % 8 == 0 (Hopper kernel) */
  const uint16_t *q;           /* [B][NH][576] bf16: absorbed q_lat (512) | q_rot (64) */
  const uint16_t *kv;          /* page pool [pages][page_size][576] bf16, contiguous */
  int page_size;               /* tokens per page */
  int64_t pages;               /* pages in the pool */
  const int32_t *block_table;  /* [B][pt_stride] page ids */
  int64_t pt_stride;
  const int32_t *seq_lens;     /* [B * sl_stride] tokens cached */
  int64_t sl_stride;
  int max_len;                 /* upper bound of seq_lens (host side, picks the split count) */
  float scale;                 /* softmax scale, 192^-0.5 for K3 */
  uint16_t *out;               /* [B][NH][512] bf16 o_lat */
  float *work;                 /* split-KV scratch: [splits][B*NH][512] O, then [splits][B*NH] lse */
  int num_sms;
  int probe;                   /* benchmark variants (k3k_cuda_mla_probe); 0 in service */
} k3k_cu_mla_decode_args;

/* The Hopper kernel takes the shape: page_size % 8 == 0 (a page boundary never splits an
 * 8-row TMA box) and heads % 8 == 0 (a last group of fewer than 48 heads is padded: q must then
 * have 48 readable rows past batch*heads). */
bool mla_wg_ok(const k3k_cu_mla_decode_args *a);
/* Launches the Hopper kernel over grid (ceil(heads/48), splits, batch); with splits > 1 it writes
 * the split partials to a->work (normalised O and lse in log2 units) for mla_merge_kernel,
 * else o_lat straight to a->out. Returns 0 or K3_EDEVICE. */
int mla_wg_launch(cudaStream_t st, const k3k_cu_mla_decode_args *a, int splits, int chunk);

#endif
