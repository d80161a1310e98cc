/* k3k-gpu-moe's cases for the dequant-once prefill path (kernels/cuda/moe_dq.h):
 *   - the expert-group dequantisation against the MXFP4_DEQUANT reference op, byte for byte
 *     (the bf16 value of an E2M1 code times its E8M0 scale is exact), at normal, large (> 128,
 *     two-multiply range of the W4A16 kernels) and tiny (bf16 subnormal) scales, one and two
 *     matrices per slot, experts in a scrambled order, outputs poisoned first;
 *   - the whole MoE block (route/plan → dequant-once gate/up + SiTU → down → combine) against
 *     the reference op chain, at row counts that are not multiples of the GEMM padding, with
 *     empty experts, more active experts than one dequantisation group, and one expert only.
 * What it is not: the perf comparison (gpu_moe_perf.c) or the grouped-kernel cases. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h"
#include "k3k.h"
#include "k3pd/err.h"

static k3k_cu_mx_set stacked_set(const gpair *pk, const gpair *sc, int64_t N) {
  k3k_cu_mx_set s;
  memset(&s, 0, sizeof s);
  s.packed_base = (const uint8_t *)pk->d.data;
  s.scale_base = (const uint8_t *)sc->d.data;
  s.ld_packed = pk->d.stride[0];
  s.ld_scale = sc->d.stride[0];
  s.estride_packed = N * s.ld_packed;
  s.estride_scale = N * s.ld_scale;
  return s;
}

/* n experts of E (stacked [E*N, K/2] codes and [E*N, K/32] scales, one or two sets) through
 * k3k_cu_mx_dequant_experts, compared byte for byte with MXFP4_DEQUANT on the reference. */
static void dequant_case(gctx *g, int32_t E, int32_t N, int32_t K, int n, int two, int slo,
                         int shi) {
  char what[160];
  snprintf(what, sizeof what, "moe_dq dequant %d of E=%d N=%d K=%d %s scales %d..%d", n, E, N, K,
           two ? "gate+up" : "one matrix", slo, shi);
  gpair pk[2], sc[2];
  memset(pk, 0, sizeof pk);
  memset(sc, 0, sizeof sc);
  int64_t sp[2] = {(int64_t)E * N, K / 2}, ss[2] = {(int64_t)E * N, K / 32};
  /* slots further apart than one slot's weights (as the path's 256-byte aligned slots can
   * be): a kernel that ignored the distance would leave the second slot's bytes poisoned */
  const int64_t rows = two ? 2 * (int64_t)N : N, ld_slot = rows * K + 64, elems = (int64_t)n * ld_slot;
  uint16_t *dev = NULL, *back = malloc((size_t)elems * 2), *ref = malloc((size_t)N * K * 2);
  int rc = back && ref ? 0 : K3_ENOMEM;
  for (int m = 0; m < 2 && !rc; m++)
    rc = gpair_new(g, &pk[m], K3K_U8, 2, sp) || gpair_new(g, &sc[m], K3K_U8, 2, ss) ||
         mx_rand(g, &pk[m], &sc[m], slo, shi);
  if (!rc) rc = g->cuda->alloc(g->cuda, (size_t)elems * 2, (void **)&dev);
  if (!rc) rc = g->cuda->memset(g->cuda, dev, 0xFF, (size_t)elems * 2);
  int32_t ids[K3K_CU_MOE_DQ_GROUP];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)(((E - 1 - 2 * (int64_t)i) % E + E) % E);
  k3k_cu_mx_set s0 = stacked_set(&pk[0], &sc[0], N), s1 = stacked_set(&pk[1], &sc[1], N);
  if (!rc) rc = k3k_cu_mx_dequant_experts(stream_of(g), &s0, two ? &s1 : NULL, ids, n, N, K, dev,
                                                 ld_slot);
  if (!rc) rc = g->cuda->synchronize(g->cuda);
  if (!rc) rc = g->cuda->copy_to_host(g->cuda, back, dev, (size_t)elems * 2);
  int64_t bad = -1;
  for (int i = 0; i < n && !rc && bad < 0; i++)
    for (int m = 0; m < (two ? 2 : 1) && !rc && bad < 0; m++) {
      k3k_tensor_t p = k3k_tensor_slice(&pk[m].h, 0, (int64_t)ids[i] * N, N);
      k3k_tensor_t s = k3k_tensor_slice(&sc[m].h, 0, (int64_t)ids[i] * N, N);
      k3k_tensor_t w = k3k_tensor_2d(g->ref, K3K_BF16, ref, N, K);
      rc = k3k_mxfp4_dequant(g->ref, &p, &s, &w);
      const uint16_t *got = back + (int64_t)i * ld_slot + (int64_t)m * N * K;
      for (int64_t j = 0; j < (int64_t)N * K && !rc && bad < 0; j++)
        if (got[j] != ref[j]) {
          bad = j;
          printf("  %s: slot %d (expert %d) matrix %d element %lld: got 0x%04x want 0x%04x\n",
                 what, i, ids[i], m, (long long)j, got[j], ref[j]);
        }
    }
  if (rc)
    g_record(g, false, "%s: %s", what, k3_strerror(rc));
  else
    g_record(g, bad < 0, "%s: %s", what, bad < 0 ? "bytes equal" : "differs");
  for (int m = 0; m < 2; m++) {
    if (pk[m].h.data) gpair_free(g, &pk[m]);
    if (sc[m].h.data) gpair_free(g, &sc[m]);
  }
  if (dev) g->cuda->free(g->cuda, dev);
  free(back);
  free(ref);
}

void gpu_moe_dq_parity(gctx *g) {
  dequant_case(g, 7, 64, 128, 2, 1, 118, 123);
  dequant_case(g, 5, 96, 3584, 2, 0, 100, 160); /* > 128: the W4A16 kernels' two-multiply range */
  dequant_case(g, 3, 32, 64, 2, 1, 0, 20);      /* tiny scales: bf16 subnormals, scale 0 */
  dequant_case(g, 2, 3072, 3584, 1, 1, 118, 123); /* one real gate/up expert */
  pipeline_case_path(g, 200, 3, 2, 1);  /* ~133 rows per expert, not multiples of 16 */
  pipeline_case_path(g, 300, 32, 8, 1); /* 32 experts: 16 dequantisation groups, ~75 rows each */
  pipeline_case_path(g, 37, 64, 4, 1);  /* 148 rows over 64 experts: empty experts, 1-5 rows */
  pipeline_case_path(g, 600, 2, 1, 1);  /* ~300 rows per expert */
  pipeline_case_path(g, 50, 1, 1, 1);   /* one expert: the last GEMM is not padded */
}
