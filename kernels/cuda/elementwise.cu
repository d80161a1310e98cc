/* CUDA: COPY, ADD, GET_ROWS (embedding / row gather), SIGMOID, SIGMOID_MUL (MLA output gate),
 * SITU, SILU_MUL.
 *
 * Also SITU and SILU_MUL (the FFN activations), which are the same shape of kernel.
 * What it is for: the elementwise ops of k3k.h on device tensors, any strides, F32/BF16 in and
 * out (runtime dtype; these ops are bandwidth-bound and the dtype branch is warp-uniform).
 * What it is not: fused into neighbours; the model runner may fuse later.
 * Numerics match kernels/cpu/elementwise.c: fp32 math, one rounding by the output dtype, the two
 * inner bf16 roundings of SIGMOID_MUL when bf16_inner. expf (not __expf) so sigmoid agrees with
 * the host libm to an ulp or two.
 * Fast paths: when every operand is BF16 (a SIGMOID/ADD/... output may be F32) with inner stride
 * 1, 8-element rows and 16-byte aligned rows, the 2-D ops move 8 elements per 16-byte load and
 * two rows per thread (same math, same rounding points: results identical to the generic path).
 * Other views keep the generic strided kernel. The fast kernel is launched with PDL (pdl.cuh:
 * it waits for the previous kernel before any access and lets the next one be scheduled). */
#include "cuda_common.cuh"
#include "pdl.cuh"

/* ---- COPY: rank <= 4 flattened to [a][b][c][d]; F32/BF16 convert, I32/U8 copy bits. ---- */
__global__ void copy_kernel(dv x, dv y, int64_t n1, int64_t n2, int64_t n3, int64_t n,
                            int bits_es) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t d = i % n3, c = (i / n3) % n2, b = (i / (n3 * n2)) % n1, a = i / (n3 * n2 * n1);
    int64_t ox = a * x.s[0] + b * x.s[1] + c * x.s[2] + d * x.s[3];
    int64_t oy = a * y.s[0] + b * y.s[1] + c * y.s[2] + d * y.s[3];
    if (bits_es == 4)
      ((int32_t *)y.p)[oy] = ((const int32_t *)x.p)[ox];
    else if (bits_es == 1)
      ((uint8_t *)y.p)[oy] = ((const uint8_t *)x.p)[ox];
    else
      dv_st(y, oy, dv_ld(x, ox));
  }
}

static unsigned grid_for(int64_t n) {
  int64_t g = (n + 255) / 256;
  return (unsigned)(g < 1 ? 1 : (g > 65535 * 8 ? 65535 * 8 : g));
}

int k3k_cuda_copy(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *x = t[0], *y = t[1];
  dv X = mkdv(x), Y = mkdv(y);
  int64_t sh[4] = {1, 1, 1, 1};
  int off = 4 - x->ndim;
  dv Xs = X, Ys = Y;
  for (int i = 0; i < 4; i++) Xs.s[i] = Ys.s[i] = 0;
  for (int d = 0; d < x->ndim; d++) {
    sh[off + d] = x->shape[d];
    Xs.s[off + d] = x->stride[d];
    Ys.s[off + d] = y->stride[d];
  }
  int64_t n = sh[0] * sh[1] * sh[2] * sh[3];
  if (n == 0) return 0;
  int bits = 0;
  if (x->dtype == y->dtype && (x->dtype == K3K_I32 || x->dtype == K3K_U8))
    bits = (int)k3k_dtype_size(x->dtype);
  copy_kernel<<<grid_for(n), 256, 0, cx->stream>>>(Xs, Ys, sh[1], sh[2], sh[3], n, bits);
  K3K_LAUNCHED("copy");
  return 0;
}

/* ---- 2-D elementwise: ADD, SIGMOID, SIGMOID_MUL ---- */
enum { EW_ADD = 0, EW_SIGMOID = 1, EW_SIGMUL = 2, EW_SIGMUL_BF16 = 3, EW_SILU_MUL = 4, EW_SITU = 5 };

/* 2-D grid (columns in x, rows in y, both grid-strided): no 64-bit division per element. */
__global__ void ew2_kernel(dv a, dv b, dv y, int64_t rows, int64_t cols, int kind, float p0,
                           float p1) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * blockDim.x) {
      float av = dv_ld(a, r * a.s[0] + c * a.s[1]), out;
      if (kind == EW_SIGMOID) {
        out = sigmoidf_acc(av);
      } else {
        float bv = dv_ld(b, r * b.s[0] + c * b.s[1]);
        if (kind == EW_ADD)
          out = av + bv;
        else if (kind == EW_SIGMUL)
          out = av * sigmoidf_acc(bv);
        else if (kind == EW_SILU_MUL)
          out = av * sigmoidf_acc(av) * bv;
        else if (kind == EW_SITU)
          out = p0 * tanhf(av / p0) * sigmoidf_acc(av) * (p1 * tanhf(bv / p1));
        else
          out = round_bf(round_bf(av) * round_bf(sigmoidf_acc(bv)));
      }
      dv_st(y, r * y.s[0] + c * y.s[1], out);
    }
}

static dim3 grid2(int64_t rows, int64_t cols) {
  int64_t gx = (cols + 255) / 256, gy = rows;
  return dim3((unsigned)(gx > 1024 ? 1024 : gx), (unsigned)(gy > 65535 ? 65535 : gy));
}

/* The same math on 8 elements at once (kind is a template constant here). */
template <int KIND>
__device__ __forceinline__ void ew_math8(const float a[8], const float b[8], float o[8], float p0,
                                         float p1) {
#pragma unroll
  for (int j = 0; j < 8; j++) {
    float av = a[j], bv = b[j];
    if (KIND == EW_SIGMOID)
      o[j] = sigmoidf_acc(av);
    else if (KIND == EW_ADD)
      o[j] = av + bv;
    else if (KIND == EW_SIGMUL)
      o[j] = av * sigmoidf_acc(bv);
    else if (KIND == EW_SILU_MUL)
      o[j] = av * sigmoidf_acc(av) * bv;
    else if (KIND == EW_SITU)
      o[j] = p0 * tanhf(av / p0) * sigmoidf_acc(av) * (p1 * tanhf(bv / p1));
    else
      o[j] = round_bf(round_bf(av) * round_bf(sigmoidf_acc(bv)));
  }
}

/* BF16 a (and b) rows, BF16 or F32 y rows; c8 = cols / 8; lds in elements. Each thread does one
 * 8-column group of two rows, issuing all loads before any math. */
template <int KIND, bool YF32>
__global__ void __launch_bounds__(256)
    ew2_vec_kernel(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, void *y,
                   int64_t ldy, int64_t rows, int64_t c8, float p0, float p1) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= c8) return;
  pdl_wait(); /* launched with PDL (pdl.cuh): a and b are the previous kernels' outputs */
  pdl_trigger();
  for (int64_t r0 = (int64_t)blockIdx.y * 2; r0 < rows; r0 += (int64_t)gridDim.y * 2) {
    int nr = r0 + 1 < rows ? 2 : 1;
    bf16x8 va[2], vb[2];
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (i < nr) {
        va[i] = ((const bf16x8 *)(a + (r0 + i) * lda))[c];
        if (KIND != EW_SIGMOID) vb[i] = ((const bf16x8 *)(b + (r0 + i) * ldb))[c];
      }
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (i < nr) {
        float fa[8], fb[8], o[8];
        unpack8(va[i], fa);
        if (KIND != EW_SIGMOID)
          unpack8(vb[i], fb);
        else
#pragma unroll
          for (int j = 0; j < 8; j++) fb[j] = 0.0f;
        ew_math8<KIND>(fa, fb, o, p0, p1);
        if (YF32) {
          float4 *yr = (float4 *)((float *)y + (r0 + i) * ldy) + 2 * c;
          yr[0] = make_float4(o[0], o[1], o[2], o[3]);
          yr[1] = make_float4(o[4], o[5], o[6], o[7]);
        } else {
          ((bf16x8 *)((uint16_t *)y + (r0 + i) * ldy))[c] = pack8(o);
        }
      }
  }
}

static bool al16p(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether a [R,C] operand can be read/written 8 elements (16 bytes) at a time. */
static bool vec_ok(const k3k_tensor_t *t) {
  return (t->stride[1] == 1 || t->shape[1] <= 1) && al16p(t->data) &&
         (t->stride[0] * (int64_t)k3k_dtype_size(t->dtype)) % 16 == 0;
}

template <int KIND>
static cudaError_t launch_vec(k3k_cuda_ctx *cx, const k3k_tensor_t *a, const k3k_tensor_t *b,
                             const k3k_tensor_t *y, float p0, float p1) {
  int64_t rows = a->shape[0], c8 = a->shape[1] / 8;
  int64_t gy = (rows + 1) / 2;
  dim3 grid(k3k_ceil_div(c8, 256), (unsigned)(gy > 65535 ? 65535 : gy));
  const uint16_t *pb = b ? (const uint16_t *)b->data : NULL;
  int64_t ldb = b ? b->stride[0] : 0;
  if (y->dtype == K3K_F32)
    return pdl_launch(ew2_vec_kernel<KIND, true>, grid, dim3(256), 0, cx->stream,
                      (const uint16_t *)a->data, a->stride[0], pb, ldb, y->data, y->stride[0],
                      rows, c8, p0, p1);
  return pdl_launch(ew2_vec_kernel<KIND, false>, grid, dim3(256), 0, cx->stream,
                    (const uint16_t *)a->data, a->stride[0], pb, ldb, y->data, y->stride[0], rows,
                    c8, p0, p1);
}

static int ew2(k3k_cuda_ctx *cx, const k3k_tensor_t *a, const k3k_tensor_t *b,
               const k3k_tensor_t *y, int kind, const char *name, float p0 = 0.f,
               float p1 = 0.f) {
  int64_t n = a->shape[0] * a->shape[1];
  if (n == 0) return 0;
  bool vec = a->dtype == K3K_BF16 && (!b || b->dtype == K3K_BF16) && a->shape[1] % 8 == 0 &&
             vec_ok(a) && (!b || vec_ok(b)) && vec_ok(y);
  if (vec) {
    cudaError_t e;
    switch (kind) {
      case EW_ADD: e = launch_vec<EW_ADD>(cx, a, b, y, p0, p1); break;
      case EW_SIGMOID: e = launch_vec<EW_SIGMOID>(cx, a, NULL, y, p0, p1); break;
      case EW_SIGMUL: e = launch_vec<EW_SIGMUL>(cx, a, b, y, p0, p1); break;
      case EW_SIGMUL_BF16: e = launch_vec<EW_SIGMUL_BF16>(cx, a, b, y, p0, p1); break;
      case EW_SILU_MUL: e = launch_vec<EW_SILU_MUL>(cx, a, b, y, p0, p1); break;
      default: e = launch_vec<EW_SITU>(cx, a, b, y, p0, p1); break;
    }
    if (e != cudaSuccess) {
      K3_ERROR("cuda: launch of %s failed: %s", name, cudaGetErrorString(e));
      return K3_EDEVICE;
    }
    K3K_LAUNCHED(name);
    return 0;
  }
  dv B = b ? mkdv(b) : mkdv(a);
  ew2_kernel<<<grid2(a->shape[0], a->shape[1]), 256, 0, cx->stream>>>(
      mkdv(a), B, mkdv(y), a->shape[0], a->shape[1], kind, p0, p1);
  K3K_LAUNCHED(name);
  return 0;
}

int k3k_cuda_add(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return ew2(cx, t[0], t[1], t[2], EW_ADD, "add");
}
int k3k_cuda_sigmoid(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return ew2(cx, t[0], NULL, t[1], EW_SIGMOID, "sigmoid");
}
int k3k_cuda_sigmoid_mul(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_sigmoid_mul_params_t *p = (const k3k_sigmoid_mul_params_t *)params;
  return ew2(cx, t[0], t[1], t[2], p->bf16_inner ? EW_SIGMUL_BF16 : EW_SIGMUL, "sigmoid_mul");
}

int k3k_cuda_silu_mul(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  return ew2(cx, t[0], t[1], t[2], EW_SILU_MUL, "silu_mul");
}
int k3k_cuda_situ(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_situ_params_t *p = (const k3k_situ_params_t *)params;
  /* The SiTU product is evaluated as (β·tanh(g/β)·sigmoid(g)) · (βl·tanh(u/βl)), as the CPU. */
  return ew2(cx, t[0], t[1], t[2], EW_SITU, "situ", p->beta, p->beta_lin);
}

/* ---- GET_ROWS: y[t] = table[ids[t]]. The ids are checked on the device before the gather
 * (k3k_cuda_check_ids, one synchronisation) and the op returns K3_ERANGE with y untouched; the
 * kernels still skip an out-of-range id rather than read outside the table. ---- */
__global__ void get_rows_kernel(dv table, dv ids, dv y, int64_t n, int64_t v, int64_t d) {
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) { /* n may exceed the grid's 65535 rows */
    int32_t id = dv_ldi(ids, r * ids.s[0]);
    if (id < 0 || id >= v) continue;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < d;
         j += (int64_t)gridDim.x * blockDim.x)
      dv_st(y, r * y.s[0] + j * y.s[1], dv_ld(table, id * table.s[0] + j * table.s[1]));
  }
}

/* Same-dtype contiguous BF16 rows: 16-byte copies (the embedding at H = 7168). The n x d8
 * chunks are one flat range (n * d8 < 2^31, 32-bit index math); each thread copies GR_UNROLL
 * chunks a block-stride apart, all loads issued before the stores. */
#define GR_UNROLL 4
__global__ void __launch_bounds__(256)
    get_rows_vec_kernel(const bf16x8 *table, int64_t ld_t8, const int32_t *ids, bf16x8 *y,
                        int64_t ld_y8, int64_t v, uint32_t d8, uint32_t total) {
  uint32_t base = blockIdx.x * (256u * GR_UNROLL) + threadIdx.x;
  bf16x8 buf[GR_UNROLL];
  int64_t dst[GR_UNROLL];
#pragma unroll
  for (int u = 0; u < GR_UNROLL; u++) {
    uint32_t i = base + u * 256u;
    dst[u] = -1;
    if (i < total) {
      uint32_t r = i / d8, j = i - r * d8;
      int32_t id = ids[r];
      if (id >= 0 && id < v) { /* checked before the launch; never read outside the table */
        buf[u] = table[id * ld_t8 + j];
        dst[u] = (int64_t)r * ld_y8 + j;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < GR_UNROLL; u++)
    if (dst[u] >= 0) y[dst[u]] = buf[u];
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int k3k_cuda_get_rows(k3k_cuda_ctx *cx, const void *params, const k3k_tensor_t *const *t) {
  const k3k_tensor_t *tab = t[0], *ids = t[1], *y = t[2];
  int64_t n = ids->shape[0], v = tab->shape[0], d = tab->shape[1];
  if (n == 0 || d == 0) return 0;
  /* Ids are checked before any row is written (k3k.h: on error nothing changed). */
  int rc = k3k_cuda_check_ids(cx, ids, n, v, 0, 0);
  if (rc) return rc;
  bool vec = tab->dtype == K3K_BF16 && y->dtype == K3K_BF16 && tab->stride[1] == 1 &&
             y->stride[1] == 1 && ids->stride[0] == 1 && d % 8 == 0 && tab->stride[0] % 8 == 0 &&
             y->stride[0] % 8 == 0 && aligned16(tab->data) && aligned16(y->data);
  if (vec && n * (d / 8) < ((int64_t)1 << 31)) {
    uint32_t total = (uint32_t)(n * (d / 8));
    get_rows_vec_kernel<<<k3k_ceil_div(total, 256 * GR_UNROLL), 256, 0, cx->stream>>>(
        (const bf16x8 *)tab->data, tab->stride[0] / 8, (const int32_t *)ids->data,
        (bf16x8 *)y->data, y->stride[0] / 8, v, (uint32_t)(d / 8), total);
  } else {
    unsigned gx = (unsigned)(d + 255) / 256;
    dim3 grid(gx > 64 ? 64 : gx, (unsigned)(n < 65535 ? n : 65535));
    get_rows_kernel<<<grid, 256, 0, cx->stream>>>(mkdv(tab), mkdv(ids), mkdv(y), n, v, d);
  }
  K3K_LAUNCHED("get_rows");
  return 0;
}

/* ---- test/benchmark helper: fill with hash-based uniform values in [lo, hi) ---- */
__global__ void fill_random_kernel(void *p, int64_t n, int dt, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    float u = lo + (hi - lo) * (float)((x >> 40) * (1.0 / 16777216.0));
    if (dt == K3K_F32)
      ((float *)p)[i] = u;
    else
      ((uint16_t *)p)[i] = f2bf(u);
  }
}

int k3k_cu_fill_random(cudaStream_t st, void *p, int64_t n, k3k_dtype_t dt, uint64_t seed,
                       float lo, float hi) {
  if (n == 0) return 0;
  fill_random_kernel<<<grid_for(n), 256, 0, st>>>(p, n, (int)dt, seed, lo, hi);
  K3K_LAUNCHED("fill_random");
  return 0;
}
