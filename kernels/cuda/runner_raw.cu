/* CUDA: the two unchecked copies the model runner's decode step needs (k3k_cuda_ops.h):
 * embedding row gather and MLA latent cache write, both of 2-byte (bf16) elements.
 *
 * What it is for: the GET_ROWS and MLA_CACHE_WRITE ops validate their ids on the device and read
 * a flag back (one stream synchronisation each), which a decode step captured in a CUDA graph
 * cannot contain. The runner builds these ids itself (tokens checked against the vocabulary,
 * cache rows from its own allocated pages) and calls these instead on its decode path.
 * What it is not: an op. No validation at all: a bad id reads or writes out of bounds. Callers
 * other than the runner use the ops.
 * Invariants: bytes written are exactly those of the ops on bf16 tensors (pure copies); nothing
 * synchronises or allocates, so both are capture-safe. */
#include "cuda_common.cuh"

/* One block row per token, 8 bf16 per thread-step when the rows are 16-byte aligned. */
__global__ void gather_u16_kernel(const uint16_t *table, int64_t ld_t, const int32_t *ids,
                                  int64_t d, uint16_t *y, int64_t ld_y, int vec) {
  int64_t t = blockIdx.y;
  const uint16_t *src = table + (int64_t)ids[t] * ld_t;
  uint16_t *dst = y + t * ld_y;
  if (vec) {
    const uint4 *s4 = (const uint4 *)src;
    uint4 *d4 = (uint4 *)dst;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < d / 8;
         j += (int64_t)gridDim.x * blockDim.x)
      d4[j] = s4[j];
  } else {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < d;
         j += (int64_t)gridDim.x * blockDim.x)
      dst[j] = src[j];
  }
}

__global__ void cache_write_u16_kernel(const uint16_t *cn, int64_t ld_cn, const uint16_t *kr,
                                       int64_t ld_kr, const int32_t *sm, int64_t c, int64_t dr,
                                       uint16_t *cache) {
  int64_t t = blockIdx.x;
  int32_t slot = sm[t];
  if (slot < 0) return;
  uint16_t *row = cache + (int64_t)slot * (c + dr);
  for (int64_t j = threadIdx.x; j < c + dr; j += blockDim.x)
    row[j] = j < c ? cn[t * ld_cn + j] : kr[t * ld_kr + (j - c)];
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int k3k_cu_gather_rows_u16(cudaStream_t st, const uint16_t *table, int64_t ld_table,
                           const int32_t *ids, int64_t n, int64_t d, uint16_t *y, int64_t ld_y) {
  if (n <= 0 || d <= 0) return 0;
  if (n > 65535) return K3_EINVAL;
  int vec = d % 8 == 0 && ld_table % 8 == 0 && ld_y % 8 == 0 && al16(table) && al16(y);
  unsigned gx = k3k_ceil_div((size_t)(vec ? d / 8 : d), 256);
  gather_u16_kernel<<<dim3(gx > 64 ? 64 : gx, (unsigned)n), 256, 0, st>>>(table, ld_table, ids, d,
                                                                         y, ld_y, vec);
  K3K_LAUNCHED("gather_rows_u16");
  return 0;
}

int k3k_cu_cache_write_u16(cudaStream_t st, const uint16_t *c_n, int64_t ld_cn, const uint16_t *k_rot,
                           int64_t ld_kr, const int32_t *slot_mapping, int64_t n, int64_t c,
                           int64_t dr, uint16_t *cache) {
  if (n <= 0) return 0;
  if (n > INT32_MAX) return K3_EINVAL;
  cache_write_u16_kernel<<<(unsigned)n, 128, 0, st>>>(c_n, ld_cn, k_rot, ld_kr, slot_mapping, c, dr,
                                                      cache);
  K3K_LAUNCHED("cache_write_u16");
  return 0;
}
