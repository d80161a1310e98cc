/* Reservation descriptor: validation, addressing and the v2 binary encoding.
 *
 * What it is for: the only code that turns a k3_xfer_desc_t into bytes and back. Decoding is
 * written for hostile input (it is fuzzed): every read is bounds-checked through a cursor,
 * every count is limited before anything is allocated, a checksum covers the whole message, and
 * the decoded descriptor is validated before it is returned. Nothing is returned on error.
 *
 * Index lists are encoded as (start, count) runs: a reservation of contiguous pages costs 8
 * bytes whatever the prompt length, and scattered pages still round-trip exactly. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/xfer_desc.h"
#include "xfer_int.h"

#define DESC_MAGIC 0x4458334bu /* "K3XD" little-endian */
#define REGION_WIRE_BYTES 48   /* 4 x u32 + 4 x u64 */

const char *k3_xfer_mem_name(uint32_t mem) {
  switch (mem) {
  case K3_XFER_MEM_HOST: return "host";
  case K3_XFER_MEM_CUDA: return "cuda";
  default: return "?";
  }
}

const char *k3_xfer_kind_name(uint32_t kind) {
  switch (kind) {
  case K3_XFER_KIND_MLA_KV: return "mla_kv";
  case K3_XFER_KIND_KDA_S: return "kda_s";
  case K3_XFER_KIND_KDA_CONV: return "kda_conv";
  default: return "other";
  }
}

k3_xfer_desc_t *k3_xfer_desc_new(void) { return calloc(1, sizeof(k3_xfer_desc_t)); }

void k3_xfer_desc_free(k3_xfer_desc_t *d) {
  if (!d) return;
  free(d->worker_addr);
  for (uint32_t i = 0; i < K3_XFER_MAX_POOLS; i++) free(d->pools[i].rkey), free(d->pools[i].blob);
  for (uint32_t i = 0; i < K3_XFER_MAX_LISTS; i++) free(d->lists[i].idx);
  free(d->regions);
  free(d);
}

int k3_xfer_desc_validate(k3_xfer_desc_t *d, char *err, size_t errlen) {
#define BAD(...)                                                                            \
  do {                                                                                      \
    if (err) k3_fmt(err, errlen, __VA_ARGS__);                                              \
    return K3_EINVAL;                                                                       \
  } while (0)
  if (!d) BAD("descriptor is NULL");
  if (d->flags & ~K3_XFER_DESC_F_ALL) BAD("flags 0x%x: unknown bits", d->flags);
  if (d->worker_addr_len == 0 || d->worker_addr_len > K3_XFER_MAX_ADDR_BYTES || !d->worker_addr)
    BAD("worker_addr_len %u out of range 1..%u", d->worker_addr_len, K3_XFER_MAX_ADDR_BYTES);
  if (d->n_pools == 0 || d->n_pools > K3_XFER_MAX_POOLS) BAD("n_pools %u out of range", d->n_pools);
  if (d->n_lists == 0 || d->n_lists > K3_XFER_MAX_LISTS) BAD("n_lists %u out of range", d->n_lists);
  if (d->n_regions == 0 || d->n_regions > K3_XFER_MAX_REGIONS || !d->regions)
    BAD("n_regions %u out of range 1..%u", d->n_regions, K3_XFER_MAX_REGIONS);
  for (uint32_t p = 0; p < d->n_pools; p++) {
    const k3_xfer_pool_desc_t *pl = &d->pools[p];
    if (pl->size_bytes == 0) BAD("pool %u: size_bytes is 0", p);
    if (pl->base_addr > UINT64_MAX - pl->size_bytes) BAD("pool %u: base + size_bytes overflows", p);
    if (pl->mem != K3_XFER_MEM_HOST && pl->mem != K3_XFER_MEM_CUDA) BAD("pool %u: mem %u unknown", p, pl->mem);
    if (pl->rkey_len > K3_XFER_MAX_RKEY_BYTES || (pl->rkey_len && !pl->rkey))
      BAD("pool %u: rkey_len %u out of range 0..%u", p, pl->rkey_len, K3_XFER_MAX_RKEY_BYTES);
    if (pl->blob_len > K3_XFER_MAX_BLOB_BYTES || (pl->blob_len && !pl->blob))
      BAD("pool %u: blob_len %u out of range 0..%u", p, pl->blob_len, K3_XFER_MAX_BLOB_BYTES);
  }
  uint32_t max_idx[K3_XFER_MAX_LISTS];
  for (uint32_t l = 0; l < d->n_lists; l++) {
    if (d->lists[l].n == 0 || d->lists[l].n > K3_XFER_MAX_INDICES || !d->lists[l].idx)
      BAD("list %u: n %u out of range 1..%u", l, d->lists[l].n, K3_XFER_MAX_INDICES);
    max_idx[l] = 0;
    for (uint32_t i = 0; i < d->lists[l].n; i++)
      if (d->lists[l].idx[i] > max_idx[l]) max_idx[l] = d->lists[l].idx[i];
  }
  uint32_t max_layer = 0;
  for (uint32_t r = 0; r < d->n_regions; r++) {
    const k3_xfer_region_t *rg = &d->regions[r];
    if (rg->pool >= d->n_pools) BAD("region %u: pool %u >= n_pools %u", r, rg->pool, d->n_pools);
    if (rg->list >= d->n_lists) BAD("region %u: list %u >= n_lists %u", r, rg->list, d->n_lists);
    const k3_xfer_pool_desc_t *pl = &d->pools[rg->pool];
    const k3_xfer_index_list_t *li = &d->lists[rg->list];
    if (rg->unit_bytes == 0) BAD("region %u: unit_bytes is 0", r);
    if (li->n > 1 && rg->unit_bytes > rg->stride_bytes)
      BAD("region %u: unit %llu > stride %llu (list %u has %u entries)", r,
          (unsigned long long)rg->unit_bytes, (unsigned long long)rg->stride_bytes, rg->list, li->n);
    /* len must cover exactly the listed indices: (n-1)*unit < len <= n*unit. Every product is
     * taken in 128 bits: unit, stride and off are attacker-chosen u64s. */
    unsigned __int128 cap = (unsigned __int128)li->n * rg->unit_bytes;
    unsigned __int128 low = (unsigned __int128)(li->n - 1) * rg->unit_bytes;
    if (rg->len_bytes == 0 || (unsigned __int128)rg->len_bytes > cap ||
        (unsigned __int128)rg->len_bytes <= low)
      BAD("region %u: len %llu does not match %u indices of %llu bytes", r,
          (unsigned long long)rg->len_bytes, li->n, (unsigned long long)rg->unit_bytes);
    unsigned __int128 end = (unsigned __int128)rg->offset_bytes +
                            (unsigned __int128)max_idx[rg->list] * rg->stride_bytes + rg->unit_bytes;
    if (end > pl->size_bytes)
      BAD("region %u: index %u reaches byte %llu%s > pool %u size %llu", r, max_idx[rg->list],
          end >> 64 ? 0xffffffffffffffffull : (unsigned long long)end, end >> 64 ? "+" : "",
          rg->pool, (unsigned long long)pl->size_bytes);
    if (rg->layer > 65535) BAD("region %u: layer %u > 65535", r, rg->layer);
    if (rg->layer > max_layer) max_layer = rg->layer;
  }
  d->n_layers = max_layer + 1;
  return 0;
#undef BAD
}

uint64_t k3_xfer_desc_total_bytes(const k3_xfer_desc_t *d) {
  uint64_t t = 0;
  for (uint32_t r = 0; r < d->n_regions; r++) t += d->regions[r].len_bytes;
  return t;
}

void k3_xfer_region_locate(const k3_xfer_desc_t *d, uint32_t region, uint64_t off,
                           uint64_t *pool_off, uint64_t *contig) {
  const k3_xfer_region_t *rg = &d->regions[region];
  const k3_xfer_index_list_t *li = &d->lists[rg->list];
  uint64_t i = off / rg->unit_bytes, in = off % rg->unit_bytes;
  *pool_off = rg->offset_bytes + (uint64_t)li->idx[i] * rg->stride_bytes + in;
  uint64_t left_in_unit = rg->unit_bytes - in, left = rg->len_bytes - off;
  *contig = left < left_in_unit ? left : left_in_unit;
}

uint64_t xf_region_run(const k3_xfer_desc_t *d, uint32_t region, uint64_t off, uint64_t max,
                       uint64_t *pool_off) {
  const k3_xfer_region_t *rg = &d->regions[region];
  uint64_t n;
  k3_xfer_region_locate(d, region, off, pool_off, &n);
  if (rg->stride_bytes == rg->unit_bytes) { /* units back to back: consecutive indices merge */
    const uint32_t *idx = d->lists[rg->list].idx;
    for (uint64_t i = off / rg->unit_bytes; n < max && off + n < rg->len_bytes && idx[i + 1] == idx[i] + 1u; i++) {
      uint64_t left = rg->len_bytes - (off + n);
      n += left < rg->unit_bytes ? left : rg->unit_bytes;
    }
  }
  return n < max ? n : max;
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct {
  uint8_t *p;
  size_t len, cap;
  int err;
} wbuf_t;

static void w_bytes(wbuf_t *w, const void *src, size_t n) {
  if (w->err) return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n) cap *= 2;
    uint8_t *np = realloc(w->p, cap);
    if (!np) {
      w->err = K3_ENOMEM;
      return;
    }
    w->p = np;
    w->cap = cap;
  }
  memcpy(w->p + w->len, src, n);
  w->len += n;
}
/* The project targets little-endian hosts (x86-64, aarch64); the wire is little-endian. */
static void w_u16(wbuf_t *w, uint16_t v) { w_bytes(w, &v, 2); }
static void w_u32(wbuf_t *w, uint32_t v) { w_bytes(w, &v, 4); }
static void w_u64(wbuf_t *w, uint64_t v) { w_bytes(w, &v, 8); }

static uint32_t count_runs(const k3_xfer_index_list_t *li) {
  uint32_t runs = 1;
  for (uint32_t i = 1; i < li->n; i++)
    if (li->idx[i] != li->idx[i - 1] + 1u) runs++;
  return runs;
}

int k3_xfer_desc_encode(const k3_xfer_desc_t *desc, uint8_t **out, size_t *out_len) {
  k3_xfer_desc_t tmp = *desc; /* validate fills n_layers; do not write into a const object */
  int rc = k3_xfer_desc_validate(&tmp, NULL, 0);
  if (rc) return rc;
  wbuf_t w = {0};
  w_u32(&w, DESC_MAGIC);
  w_u16(&w, K3_XFER_DESC_VERSION);
  w_u16(&w, (uint16_t)desc->flags); /* K3_XFER_DESC_F_*; decoders reject unknown bits */
  w_u64(&w, desc->request_id);
  w_u64(&w, desc->epoch);
  w_u64(&w, (uint64_t)desc->lease_expiry_ms);
  w_u64(&w, desc->fingerprint);
  w_u32(&w, desc->worker_addr_len);
  w_bytes(&w, desc->worker_addr, desc->worker_addr_len);
  w_u32(&w, desc->n_pools);
  for (uint32_t p = 0; p < desc->n_pools; p++) {
    const k3_xfer_pool_desc_t *pl = &desc->pools[p];
    w_u64(&w, pl->base_addr);
    w_u64(&w, pl->size_bytes);
    w_u32(&w, pl->mem);
    w_u32(&w, pl->rkey_len);
    if (pl->rkey_len) w_bytes(&w, pl->rkey, pl->rkey_len);
    w_u32(&w, pl->blob_len);
    if (pl->blob_len) w_bytes(&w, pl->blob, pl->blob_len);
  }
  w_u32(&w, desc->n_lists);
  for (uint32_t l = 0; l < desc->n_lists; l++) {
    const k3_xfer_index_list_t *li = &desc->lists[l];
    w_u32(&w, li->n);
    w_u32(&w, count_runs(li));
    uint32_t start = li->idx[0], cnt = 1;
    for (uint32_t i = 1; i <= li->n; i++) {
      if (i < li->n && li->idx[i] == li->idx[i - 1] + 1u) {
        cnt++;
        continue;
      }
      w_u32(&w, start);
      w_u32(&w, cnt);
      if (i < li->n) {
        start = li->idx[i];
        cnt = 1;
      }
    }
  }
  w_u32(&w, desc->n_regions);
  for (uint32_t r = 0; r < desc->n_regions; r++) {
    const k3_xfer_region_t *rg = &desc->regions[r];
    w_u32(&w, rg->kind);
    w_u32(&w, rg->pool);
    w_u32(&w, rg->list);
    w_u32(&w, rg->layer);
    w_u64(&w, rg->offset_bytes);
    w_u64(&w, rg->stride_bytes);
    w_u64(&w, rg->unit_bytes);
    w_u64(&w, rg->len_bytes);
  }
  if (!w.err) w_u64(&w, k3_hash64(w.p, w.len, 0));
  if (w.err) {
    free(w.p);
    return w.err;
  }
  *out = w.p;
  *out_len = w.len;
  return 0;
}

/* ---- decoding ---------------------------------------------------------------------------- */

typedef struct {
  const uint8_t *p;
  size_t len, pos;
  const char *fail; /* first failing field */
} rbuf_t;

static int r_bytes(rbuf_t *r, void *dst, size_t n, const char *field) {
  if (r->fail) return -1;
  if (n > r->len - r->pos) {
    r->fail = field;
    return -1;
  }
  memcpy(dst, r->p + r->pos, n);
  r->pos += n;
  return 0;
}
static uint16_t r_u16(rbuf_t *r, const char *f) {
  uint16_t v = 0;
  r_bytes(r, &v, 2, f);
  return v;
}
static uint32_t r_u32(rbuf_t *r, const char *f) {
  uint32_t v = 0;
  r_bytes(r, &v, 4, f);
  return v;
}
static uint64_t r_u64(rbuf_t *r, const char *f) {
  uint64_t v = 0;
  r_bytes(r, &v, 8, f);
  return v;
}
/* Reads a length-prefixed blob of min..max bytes (min 0 or 1) into a new allocation; a
 * zero-length blob gives NULL. */
static uint8_t *r_blob(rbuf_t *r, uint32_t *len, uint32_t min, uint32_t max, const char *f, int *oom) {
  *len = r_u32(r, f);
  if (r->fail) return NULL;
  if (*len < min || *len > max || *len > r->len - r->pos) {
    r->fail = f;
    return NULL;
  }
  if (*len == 0) return NULL;
  uint8_t *b = malloc(*len);
  if (!b) {
    *oom = 1;
    return NULL;
  }
  r_bytes(r, b, *len, f);
  return b;
}

int k3_xfer_desc_decode(const uint8_t *buf, size_t len, k3_xfer_desc_t **out, char *err,
                        size_t errlen) {
  if (!buf || len < 4 + 2 + 2 + 8) {
    if (err) k3_fmt(err, errlen, "descriptor: %zu bytes is too short", len);
    return K3_EPROTO;
  }
  uint64_t sum;
  memcpy(&sum, buf + len - 8, 8);
  if (sum != k3_hash64(buf, len - 8, 0)) {
    if (err) k3_fmt(err, errlen, "descriptor: checksum mismatch (corrupt or truncated)");
    return K3_EPROTO;
  }
  rbuf_t r = {.p = buf, .len = len - 8};
  k3_xfer_desc_t *d = k3_xfer_desc_new();
  if (!d) return K3_ENOMEM;
  int oom = 0;
  if (r_u32(&r, "magic") != DESC_MAGIC && !r.fail) r.fail = "magic";
  if (r_u16(&r, "version") != K3_XFER_DESC_VERSION && !r.fail) r.fail = "version";
  d->flags = r_u16(&r, "flags");
  if ((d->flags & ~K3_XFER_DESC_F_ALL) && !r.fail) r.fail = "flags";
  d->request_id = r_u64(&r, "request_id");
  d->epoch = r_u64(&r, "epoch");
  d->lease_expiry_ms = (int64_t)r_u64(&r, "lease_expiry_ms");
  d->fingerprint = r_u64(&r, "fingerprint");
  d->worker_addr = r_blob(&r, &d->worker_addr_len, 1, K3_XFER_MAX_ADDR_BYTES, "worker_addr", &oom);
  d->n_pools = r_u32(&r, "n_pools");
  if (!r.fail && (d->n_pools == 0 || d->n_pools > K3_XFER_MAX_POOLS)) r.fail = "n_pools";
  for (uint32_t p = 0; !r.fail && !oom && p < d->n_pools; p++) {
    k3_xfer_pool_desc_t *pl = &d->pools[p];
    pl->base_addr = r_u64(&r, "pool.base_addr");
    pl->size_bytes = r_u64(&r, "pool.size_bytes");
    pl->mem = r_u32(&r, "pool.mem");
    if (!r.fail && pl->mem != K3_XFER_MEM_HOST && pl->mem != K3_XFER_MEM_CUDA) r.fail = "pool.mem";
    pl->rkey = r_blob(&r, &pl->rkey_len, 0, K3_XFER_MAX_RKEY_BYTES, "pool.rkey", &oom);
    if (!oom) pl->blob = r_blob(&r, &pl->blob_len, 0, K3_XFER_MAX_BLOB_BYTES, "pool.blob", &oom);
  }
  d->n_lists = r_u32(&r, "n_lists");
  if (!r.fail && (d->n_lists == 0 || d->n_lists > K3_XFER_MAX_LISTS)) r.fail = "n_lists";
  for (uint32_t l = 0; !r.fail && !oom && l < d->n_lists; l++) {
    k3_xfer_index_list_t *li = &d->lists[l];
    li->n = r_u32(&r, "list.n");
    uint32_t runs = r_u32(&r, "list.runs");
    if (r.fail) break;
    /* Bound both counts before allocating: runs must fit in the remaining bytes. */
    if (li->n == 0 || li->n > K3_XFER_MAX_INDICES || runs == 0 || runs > li->n ||
        (uint64_t)runs * 8 > r.len - r.pos) {
      r.fail = "list.n/runs";
      break;
    }
    li->idx = malloc((size_t)li->n * sizeof(uint32_t));
    if (!li->idx) {
      oom = 1;
      break;
    }
    uint32_t filled = 0;
    for (uint32_t k = 0; k < runs && !r.fail; k++) {
      uint32_t start = r_u32(&r, "list.run.start"), cnt = r_u32(&r, "list.run.count");
      if (r.fail) break;
      if (cnt == 0 || cnt > li->n - filled || (uint64_t)start + cnt - 1 > UINT32_MAX) {
        r.fail = "list.run.count";
        break;
      }
      for (uint32_t i = 0; i < cnt; i++) li->idx[filled++] = start + i;
    }
    if (!r.fail && filled != li->n) r.fail = "list.runs (sum != n)";
  }
  d->n_regions = r_u32(&r, "n_regions");
  if (!r.fail && (d->n_regions == 0 || d->n_regions > K3_XFER_MAX_REGIONS ||
                  (uint64_t)d->n_regions * REGION_WIRE_BYTES > r.len - r.pos))
    r.fail = "n_regions";
  if (!r.fail && !oom) {
    d->regions = calloc(d->n_regions, sizeof(k3_xfer_region_t));
    if (!d->regions) oom = 1;
  }
  for (uint32_t i = 0; !r.fail && !oom && i < d->n_regions; i++) {
    k3_xfer_region_t *rg = &d->regions[i];
    rg->kind = r_u32(&r, "region.kind");
    rg->pool = r_u32(&r, "region.pool");
    rg->list = r_u32(&r, "region.list");
    rg->layer = r_u32(&r, "region.layer");
    rg->offset_bytes = r_u64(&r, "region.offset_bytes");
    rg->stride_bytes = r_u64(&r, "region.stride_bytes");
    rg->unit_bytes = r_u64(&r, "region.unit_bytes");
    rg->len_bytes = r_u64(&r, "region.len_bytes");
  }
  if (!r.fail && !oom && r.pos != r.len) r.fail = "trailing bytes";
  if (oom) {
    k3_xfer_desc_free(d);
    return K3_ENOMEM;
  }
  if (r.fail) {
    if (err) k3_fmt(err, errlen, "descriptor: bad or truncated field '%s' at byte %zu", r.fail, r.pos);
    k3_xfer_desc_free(d);
    return K3_EPROTO;
  }
  char verr[160];
  if (k3_xfer_desc_validate(d, verr, sizeof verr)) {
    if (err) k3_fmt(err, errlen, "descriptor: %s", verr);
    k3_xfer_desc_free(d);
    return K3_EPROTO;
  }
  *out = d;
  return 0;
}

int k3_xfer_desc_clone(const k3_xfer_desc_t *src, k3_xfer_desc_t **out) {
  k3_xfer_desc_t *d = k3_xfer_desc_new();
  if (!d) return K3_ENOMEM;
  *d = *src;
  d->worker_addr = NULL;
  d->regions = NULL;
  for (uint32_t i = 0; i < K3_XFER_MAX_POOLS; i++) d->pools[i].rkey = d->pools[i].blob = NULL;
  for (uint32_t i = 0; i < K3_XFER_MAX_LISTS; i++) d->lists[i].idx = NULL;
  int oom = 0;
  if (src->worker_addr_len) {
    d->worker_addr = malloc(src->worker_addr_len);
    if (d->worker_addr) memcpy(d->worker_addr, src->worker_addr, src->worker_addr_len);
    else oom = 1;
  }
  for (uint32_t p = 0; p < src->n_pools && !oom; p++) {
    const k3_xfer_pool_desc_t *sp = &src->pools[p];
    if (sp->rkey_len && !(d->pools[p].rkey = malloc(sp->rkey_len))) oom = 1;
    else if (sp->rkey_len) memcpy(d->pools[p].rkey, sp->rkey, sp->rkey_len);
    if (!oom && sp->blob_len && !(d->pools[p].blob = malloc(sp->blob_len))) oom = 1;
    else if (!oom && sp->blob_len) memcpy(d->pools[p].blob, sp->blob, sp->blob_len);
  }
  for (uint32_t l = 0; l < src->n_lists && !oom; l++) {
    d->lists[l].idx = malloc((size_t)(src->lists[l].n ? src->lists[l].n : 1) * sizeof(uint32_t));
    if (d->lists[l].idx) memcpy(d->lists[l].idx, src->lists[l].idx, (size_t)src->lists[l].n * 4);
    else oom = 1;
  }
  if (!oom && src->n_regions) {
    d->regions = malloc((size_t)src->n_regions * sizeof(k3_xfer_region_t));
    if (d->regions) memcpy(d->regions, src->regions, (size_t)src->n_regions * sizeof(k3_xfer_region_t));
    else oom = 1;
  }
  if (oom) {
    k3_xfer_desc_free(d);
    return K3_ENOMEM;
  }
  *out = d;
  return 0;
}
