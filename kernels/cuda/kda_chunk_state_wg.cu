/* CUDA: the sequential state pass of KDA_CHUNK on Hopper warpgroup MMA (wgmma), one block per
 * (head, sequence).
 *
 * What it is for: the third launch of KDA_CHUNK (kda_chunk.cuh): carry the fp32 state of one
 * head through a sequence's chunk records and write the output. Two warpgroups; warpgroup wg
 * owns the 64 value rows v = 64wg..64wg+63 of the V-first state S[v][key], which lives in
 * registers as a wgmma m64n128 accumulator for the whole sequence (it never goes through shared
 * memory). Per chunk, in the transposed form (M = value rows, so S is the register A operand):
 *   DK  = S (e^G k)^T, DQ = S (q e^G)^T     two 64 x 64 products, DQ off the critical path
 *   YT  = v^T - DK                          -> bf16 register A operand
 *   VnT = YT T^T                            (Vn = T (v - e^G k S) = U - W S of spec §3.8)
 *   S   = S diag(e^{G_last}) + VnT (k e^{G_last-G}),  OT = DQ + VnT Aqk^T
 * [e^G k; q e^G], T and Aqk are K-major B operands, k e^{Gl-G} the MN-major ("transposed") B
 * operand, all in 128-byte swizzled shared memory (mla_prefill_sm90.cuh states the layout); v
 * is read element-wise from a padded tile; O goes out through a shared-memory tile (written by
 * stmatrix.trans) as 16-byte stores. The record of chunk c+1 (stored pre-swizzled by the intra
 * kernel, so it is a linear copy) and its v rows stream in by cp.async (all 256 threads; two
 * stages of 82 KB), issued right after chunk c's DK/DQ wgmma so the issue overlaps them. Measured (docs/perf-gpu.md): the loads alone take ~300 us at 8K x 96 heads, the
 * per-chunk wgmma/element-wise chain is what bounds the pass (one chain per value half: 96
 * heads give 96 blocks).
 * What it is not: the intra-chunk half (kda_chunk_intra.cu) or a general Dk/Dv kernel.
 * Numerics: S, v - e^G k S, Vn and the record operands enter the tensor cores as bf16, fp32
 * accumulation; S and the e^{G_last} scaling stay fp32. A v that is not bf16 row-contiguous
 * (the F32 test variant) is read element-wise from global memory in fp32.
 * Invariants: one block per (head h0 + blockIdx.x, sequence blockIdx.y); a sequence of length 0
 * returns before any access; the op entry (kda_chunk.cu) has checked slots and cu_seqlens. */
#include "kda_chunk.cuh"
#include "mla_prefill_sm90.cuh"

/* Stage layout (bytes from a 1024-aligned stage base): the record as stored (kda_chunk.cuh),
 * then the v rows of the chunk. Two stages, then the output tile. */
#define KW_WQ KC_REC_KQ /* [e^G k; q e^G]: 2 slabs (keys 0-63, 64-127) x 128 rows x 128 B */
#define KW_K KC_REC_K   /* k e^{Gl-G}: 2 slabs (keys 0-63, 64-127) x 64 rows (r) x 128 B */
#define KW_A KC_REC_A   /* Aqk: 64 rows (r) x 64 (s), one slab */
#define KW_T KC_REC_T   /* T: 64 rows (r) x 64 (s), one slab */
#define KW_E KC_REC_E   /* e^{G_last} fp32 [128] */
#define KW_V 66560      /* v bf16 [64][KW_VP] (rows >= n are not loaded: masked on use) */
#define KW_VP 136       /* v and output tile pitch (elements): 272 B, conflict-free */
#define KW_STAGE 83968  /* 82 KB, a multiple of 1024 */
#define KW_O (2 * KW_STAGE) /* output tile bf16 [64][KW_VP] */
#define KW_SMEM (KW_O + 64 * KW_VP * 2 + 1024) /* + alignment slack */

#define KW_D32_STR                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
/* d (64x64 f32) = (acc ? d : 0) + A·B; A 64x16 bf16 in registers, B 64(N)x16 K-major. */
__device__ __forceinline__ void kw_rs_n64(float d[32], const uint32_t a[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KW_D32_STR
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : K3K_D8(0), K3K_D8(8), K3K_D8(16), K3K_D8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* One chunk record (a linear copy: it is stored as the stage wants it) and, on the vector
 * path, the chunk's v rows (rows >= n are not loaded) -> one stage; all 256 threads, one
 * cp.async group. */
__device__ __forceinline__ void kw_load(unsigned char *st, const unsigned char *rec, const kc_args &a, bool vfast,
                                        int64_t cs, int n, int64_t vcol) {
  for (int i = threadIdx.x; i < KC_REC / 16; i += 256) cp_async16(st + i * 16, rec + i * 16, true);
  if (vfast)
    for (int i = threadIdx.x; i < n * 16; i += 256)
      cp_async16(st + KW_V + (i >> 4) * KW_VP * 2 + (i & 15) * 16,
                 (const uint16_t *)a.v.p + (cs + (i >> 4)) * a.v.s[0] + vcol + (i & 15) * 8, true);
  cp_async_commit();
}

/* Four 8x8 b16 matrices from mma fragments (lane 4g + t4 holds row g, columns 2t4..+1 of each)
 * to shared memory transposed: lanes 8m..8m+7 give the addresses of the 8 stored rows (= the
 * fragment's columns) of matrix m, 16 bytes each. */
__device__ __forceinline__ void kw_stsm_x4_trans(void *p, const uint32_t f[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)),
               "r"(f[0]), "r"(f[1]), "r"(f[2]), "r"(f[3])
               : "memory");
}

/* Named barrier of one warpgroup (ids 1, 2; 0 is __syncthreads). */
__device__ __forceinline__ void kw_wg_sync(int wg) {
  if (wg)
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
}

__global__ void __launch_bounds__(256, 1) kc_state_wg_kernel(kc_args a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char *sm = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int h = a.h0 + blockIdx.x, seq = blockIdx.y;
  const int start = a.cu[seq * a.cu_s], end = a.cu[(seq + 1) * a.cu_s];
  if (end <= start) return; /* length 0 keeps its state */
  const int c0 = a.cfirst[seq], c1 = a.cfirst[seq + 1];
  const int vr = 64 * wg + 16 * wq + g; /* this thread's value rows vr, vr + 8 */
  float *Sg = a.state + a.slots[seq * a.sl_s] * a.st_slot + (int64_t)h * KC_D * KC_D;
  const bool vfast = a.vv && a.v.dt == 1;
  const int64_t vcol = (int64_t)h * KC_D;
  kc_bf *Ot = (kc_bf *)(sm + KW_O);

  kw_load(sm, a.rec + ((size_t)c0 * a.hg + blockIdx.x) * KC_REC, a, vfast, start, min(KC_C, end - start), vcol);

  /* S[4j + 2hh + e] = state (v = vr + 8hh, key = 8j + 2t4 + e). */
  float S[64];
#pragma unroll
  for (int j = 0; j < 16; j++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float2 x = make_float2(0.0f, 0.0f);
      if (a.read_state) x = *(const float2 *)(Sg + (int64_t)(vr + 8 * hh) * KC_D + 8 * j + 2 * t4);
      S[4 * j + 2 * hh] = x.x, S[4 * j + 2 * hh + 1] = x.y;
    }

  for (int c = c0; c < c1; c++) {
    const int i = c - c0;
    unsigned char *st = sm + (i & 1) * KW_STAGE;
    const int cs = start + i * KC_C, n = min(KC_C, end - cs);
    /* Chunk c's copies (the only group in flight: issued during chunk c-1's DK product). */
    cp_async_wait<0>();
    fence_proxy_async(); /* this thread's copies are read next by wgmma (async proxy) */
    __syncthreads();     /* every thread's copies of chunk c landed */
    const uint32_t sb = smem_u32(st);

    /* S as the bf16 A operand: key step kk = accumulator column blocks 2kk, 2kk+1. */
    uint32_t sa[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
      sa[kk][0] = pack_bf2(S[8 * kk], S[8 * kk + 1]);
      sa[kk][1] = pack_bf2(S[8 * kk + 2], S[8 * kk + 3]);
      sa[kk][2] = pack_bf2(S[8 * kk + 4], S[8 * kk + 5]);
      sa[kk][3] = pack_bf2(S[8 * kk + 6], S[8 * kk + 7]);
    }
    /* DK (e^G k rows 0..63 of the B block) first, DQ (rows 64..127) second, so the wait below
     * covers DK only and DQ runs under the element-wise work. */
    float DK[32], DQ[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
      kw_rs_n64(DK, sa[kk], gmma_desc(sb + KW_WQ + (kk >> 2) * 16384 + (kk & 3) * 32, 16, 1024), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
      kw_rs_n64(DQ, sa[kk], gmma_desc(sb + KW_WQ + 8192 + (kk >> 2) * 16384 + (kk & 3) * 32, 16, 1024), kk > 0);
    wgmma_commit();
    /* Chunk c+1's record and v rows into the other stage (released by the barrier that ended
     * chunk c-1), issued while the tensor cores run DK and DQ. */
    if (c + 1 < c1)
      kw_load(sm + ((i + 1) & 1) * KW_STAGE, a.rec + ((size_t)(c + 1) * a.hg + blockIdx.x) * KC_REC, a, vfast,
              cs + KC_C, min(KC_C, end - cs - KC_C), vcol);
    wgmma_wait<1>();
#pragma unroll
    for (int q = 0; q < 32; q++) asm volatile("" : "+f"(DK[q])::"memory");

    /* YT (v, r = 8j + 2t4 + e) = v[r][v] - DK -> bf16 A fragments over r (rows past n: v = 0,
     * where DK = 0 too since e^G k is). */
    const kc_bf *Vt = (const kc_bf *)(st + KW_V);
    uint32_t yf[4][4];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int r = 8 * j + 2 * t4, v = vr + 8 * hh;
        float v0, v1;
        if (vfast) {
          v0 = r < n ? __uint_as_float((uint32_t)Vt[r * KW_VP + v] << 16) : 0.0f;
          v1 = r + 1 < n ? __uint_as_float((uint32_t)Vt[(r + 1) * KW_VP + v] << 16) : 0.0f;
        } else {
          v0 = r < n ? dv_ld(a.v, (cs + r) * a.v.s[0] + (vcol + v) * a.v.s[1]) : 0.0f;
          v1 = r + 1 < n ? dv_ld(a.v, (cs + r + 1) * a.v.s[0] + (vcol + v) * a.v.s[1]) : 0.0f;
        }
        yf[j >> 1][(j & 1) * 2 + hh] = pack_bf2(v0 - DK[4 * j + 2 * hh], v1 - DK[4 * j + 2 * hh + 1]);
      }
    /* VnT = YT T^T (T lower-triangular; rows past n are zero since beta is). The wait also
     * completes DQ. */
    float VT[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) kw_rs_n64(VT, yf[kk], gmma_desc(sb + KW_T + kk * 32, 16, 1024), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int q = 0; q < 32; q++) asm volatile("" : "+f"(VT[q]), "+f"(DQ[q])::"memory");
    uint32_t vf[4][4];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) vf[j >> 1][(j & 1) * 2 + hh] = pack_bf2(VT[4 * j + 2 * hh], VT[4 * j + 2 * hh + 1]);
    /* Decay S by e^{G_last} per key column before the rank-64 update. */
    const float *E = (const float *)(st + KW_E);
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const float2 e = *(const float2 *)(E + 8 * j + 2 * t4);
      S[4 * j] *= e.x, S[4 * j + 1] *= e.y, S[4 * j + 2] *= e.x, S[4 * j + 3] *= e.y;
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_rs_n128_tb(S, vf[kk], gmma_desc(sb + KW_K + kk * 2048, 8192, 1024));
#pragma unroll
    for (int kk = 0; kk < 4; kk++) kw_rs_n64(DQ, vf[kk], gmma_desc(sb + KW_A + kk * 32, 16, 1024), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence64(S);
#pragma unroll
    for (int q = 0; q < 32; q++) asm volatile("" : "+f"(DQ[q])::"memory");

    /* O (row r = 8j + 2t4 + e, value v) = DQ[4j + 2hh + e]; rows past n are not stored. */
    if (a.vo) { /* through the tile: 16-byte stores of this warpgroup's 64 values per row */
      /* The warp's 16 values x 64 rows as 16 8x8 blocks (row block j, value half hh), stored
       * transposed (Ot is [r][v]) by stmatrix: matrix m of instruction jp is (j = 2jp + (m >> 1),
       * hh = m & 1); lanes 8m..8m+7 address its rows r = 8j + (lane & 7). */
      const int mi = lane >> 3, jo = mi >> 1, ho = mi & 1;
#pragma unroll
      for (int jp = 0; jp < 4; jp++) {
        uint32_t f[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
          const int j = 2 * jp + (m >> 1), hh = m & 1;
          f[m] = pack_bf2(DQ[4 * j + 2 * hh], DQ[4 * j + 2 * hh + 1]);
        }
        kw_stsm_x4_trans(Ot + (8 * (2 * jp + jo) + (lane & 7)) * KW_VP + 64 * wg + 16 * wq + 8 * ho, f);
      }
      kw_wg_sync(wg);
      const int wt = tid & 127;
#pragma unroll
      for (int it = 0; it < 4; it++) {
        const int idx = it * 128 + wt, r = idx >> 3, ck = idx & 7;
        if (r < n)
          *(bf16x8 *)((uint16_t *)a.o.p + (int64_t)(cs + r) * a.o.s[0] + vcol + 64 * wg + ck * 8) =
              *(const bf16x8 *)(Ot + r * KW_VP + 64 * wg + ck * 8);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int r = 8 * j + 2 * t4 + e;
          if (r >= n) continue;
#pragma unroll
          for (int hh = 0; hh < 2; hh++)
            dv_st(a.o, (int64_t)(cs + r) * a.o.s[0] + (vcol + vr + 8 * hh) * a.o.s[1], DQ[4 * j + 2 * hh + e]);
        }
    }
    __syncthreads(); /* both warpgroups done with this stage and the output tile */
  }
#pragma unroll
  for (int j = 0; j < 16; j++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      *(float2 *)(Sg + (int64_t)(vr + 8 * hh) * KC_D + 8 * j + 2 * t4) = make_float2(S[4 * j + 2 * hh], S[4 * j + 2 * hh + 1]);
}

int kc_state_wg_launch(const kc_args &a, cudaStream_t st) {
  static bool attr_set = false; /* per process: the attribute belongs to the kernel */
  if (!attr_set) {
    K3K_CU(cudaFuncSetAttribute(kc_state_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, KW_SMEM));
    attr_set = true;
  }
  kc_state_wg_kernel<<<dim3((unsigned)a.hg, (unsigned)a.n_seqs), 256, KW_SMEM, st>>>(a);
  K3K_LAUNCHED("kda_chunk state (wgmma)");
  return 0;
}
