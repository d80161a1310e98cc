/* k3pd-xfer-bench: the transfer plan, a manifest laid out on the receiver's pools (bench.h).
 *
 * Layer order as in K3: every 4th layer is MLA (plus the last), the rest KDA. Paged layout: the
 * decode worker's receive area before issue 17 (page-major KV pool, slot-major KDA pool; a
 * region's off is its place inside a page/slot and its stride the page/slot bytes). Arena
 * layout: the runner's state arena (every layer's own tensor inside one allocation; a region's
 * off is its tensor's offset and its stride the tensor's row bytes), which is where the decode
 * worker receives zero-copy (docs/gpu-cluster.md §2). */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "k3pd/err.h"


static bool is_mla(const bench_manifest_t *m, uint32_t l, uint32_t n_layers, uint32_t kda, uint32_t mla) {
  return mla < m->n_mla && (l % 4 == 3 || m->n_kda == kda || l == n_layers - 1);
}

int bench_plan_build(bench_plan_t *p, bench_manifest_t m, bench_layout_t layout, uint32_t tokens, uint32_t seqs) {
  memset(p, 0, sizeof *p);
  if (seqs < 1) seqs = 1;
  p->seqs = seqs;
  p->m = m;
  p->layout = layout;
  p->tokens = tokens;
  p->n_pages = (tokens + BENCH_PAGE_TOK - 1) / BENCH_PAGE_TOK;
  p->n_slots = seqs + 1; /* slot 0 unused: the requests' slots (1..) make strides matter */
  const uint32_t rows = seqs * p->n_pages, nsl = p->n_slots;
  p->n_layers = m.n_kda + m.n_mla;
  p->rg = calloc(2 * (size_t)m.n_kda + m.n_mla, sizeof *p->rg);
  p->src_off = calloc(2 * (size_t)m.n_kda + m.n_mla, sizeof *p->src_off);
  if (!p->rg || !p->src_off) {
    bench_plan_free(p);
    return K3_ENOMEM;
  }
  uint64_t page_b = BENCH_PAGE_TOK * m.tok_bytes, kda_b = m.s_bytes + m.conv_bytes;
  uint64_t kv_stride = (uint64_t)m.n_mla * page_b, kda_stride = (uint64_t)m.n_kda * kda_b;
  uint64_t mla_len = (uint64_t)tokens * m.tok_bytes, arena = 0;
  uint32_t r = 0, kda = 0, mla = 0;
  for (uint32_t l = 0; l < p->n_layers; l++) {
    if (is_mla(&m, l, p->n_layers, kda, mla)) {
      k3_xfer_region_t g = {K3_XFER_KIND_MLA_KV, 0, 0, l, (uint64_t)mla * page_b, kv_stride, page_b, mla_len};
      if (layout == LAYOUT_ARENA) {
        g.offset_bytes = arena;
        g.stride_bytes = page_b;
        arena += (uint64_t)rows * page_b;
      }
      p->rg[r++] = g;
      mla++;
      continue;
    }
    uint64_t o = (uint64_t)kda * kda_b;
    k3_xfer_region_t s = {K3_XFER_KIND_KDA_S, 1, 1, l, o, kda_stride, m.s_bytes, m.s_bytes};
    k3_xfer_region_t c = {K3_XFER_KIND_KDA_CONV, 1, 1, l, o + m.s_bytes, kda_stride, m.conv_bytes, m.conv_bytes};
    if (layout == LAYOUT_ARENA) {
      s.pool = c.pool = 0;
      s.offset_bytes = arena;
      s.stride_bytes = m.s_bytes;
      arena += nsl * m.s_bytes;
      c.offset_bytes = arena;
      c.stride_bytes = m.conv_bytes;
      arena += nsl * m.conv_bytes;
    }
    p->rg[r++] = s;
    p->rg[r++] = c;
    kda++;
  }
  p->n_regions = r;
  if (layout == LAYOUT_ARENA) {
    p->n_pools = 1;
    p->pool_bytes[0] = arena;
  } else {
    p->n_pools = 2;
    p->pool_bytes[0] = (uint64_t)rows * kv_stride;
    p->pool_bytes[1] = nsl * kda_stride;
    if (!p->pool_bytes[0]) p->pool_bytes[0] = 64;
    if (!p->pool_bytes[1]) p->pool_bytes[1] = 64;
  }
  for (uint32_t i = 0; i < r; i++) {
    p->src_off[i] = p->total_bytes;
    p->total_bytes += p->rg[i].len_bytes;
  }
  return 0;
}

void bench_plan_seq(const bench_plan_t *p, uint32_t q, uint32_t *pages, uint32_t *slot) {
  q %= p->seqs;
  for (uint32_t i = 0; i < p->n_pages; i++) pages[i] = q * p->n_pages + i;
  *slot = q + 1;
}

void bench_plan_free(bench_plan_t *p) {
  free(p->rg);
  free(p->src_off);
  p->rg = NULL;
  p->src_off = NULL;
}
