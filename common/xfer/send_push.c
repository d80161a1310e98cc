/* Sender data movement: hands the queued regions' bytes on, one chunk at a time.
 *
 * What it is for: the three data paths of a send (docs/transfer.md, "Data paths"). direct: the
 * receiver's pool is mapped here (ucp_rkey_ptr), so each chunk is hashed and copied in 64 KiB
 * blocks with streaming stores, synchronously, checking the deadline before every chunk. am:
 * DATA active messages the receiver places itself (tcp, where Debian UCX emulates puts). put:
 * ucp_put_nbx (puts_only). A chunk never crosses a page/slot boundary on either side, and the
 * digest covers exactly the bytes handed on.
 *
 * What it is not: the fencing (per-layer flush + LAYER, final flush + DONE: send.c). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "k3pd/util.h"
#include "send_int.h"

static void put_cb(void *req, ucs_status_t st, void *ud) {
  xf_slot_t *sl = ud;
  k3_xfer_send_t *s = sl->s;
  sl->busy = false;
  s->inflight--;
  s->layers[sl->layer].puts_out--;
  s->kind_last[sl->kind] = k3_now_ns();
  if (st != UCS_OK && !s->status) s->status = st == UCS_ERR_CANCELED ? K3_ECANCELED : K3_ETRANSPORT;
  s->ctx->drive_again = true;
  ucp_request_free(req);
}


static const void *src_ptr(const k3_xfer_src_t *sr, uint64_t off, uint64_t *contig) {
  const uint8_t *b = sr->base;
  if (!sr->idx) {
    *contig = UINT64_MAX;
    return b + sr->offset_bytes + off;
  }
  uint64_t i = off / sr->unit_bytes, in = off % sr->unit_bytes;
  *contig = sr->unit_bytes - in;
  return b + (uint64_t)sr->idx[i] * sr->stride_bytes + sr->offset_bytes + in;
}

/* ---- direct path: hash and copy in one pass ---------------------------------------------- */

/* Copies with streaming (non-temporal) stores: the destination is another process's memory
 * that this core will not read, so a normal store's read-for-ownership would double the DRAM
 * traffic; measured 7.0 → 8.4 GB/s for hash+copy on this VM (docs/transfer.md). Ends with a
 * store fence, so the bytes are globally visible before any later message announces them. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void copy_stream_avx2(uint8_t *dst, const uint8_t *src, size_t n) {
  size_t head = (32 - ((uintptr_t)dst & 31)) & 31;
  if (head > n) head = n;
  memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 128; n -= 128, dst += 128, src += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)src), b = _mm256_loadu_si256((const __m256i *)(src + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(src + 64)), e = _mm256_loadu_si256((const __m256i *)(src + 96));
    _mm256_stream_si256((__m256i *)dst, a);
    _mm256_stream_si256((__m256i *)(dst + 32), b);
    _mm256_stream_si256((__m256i *)(dst + 64), c);
    _mm256_stream_si256((__m256i *)(dst + 96), e);
  }
  memcpy(dst, src, n);
  _mm_sfence();
}
#endif

/* Hashes then copies in 64 KiB blocks, so the copy reads the block from L1/L2, not DRAM. */
static void hash_copy(xf_hash_t *h, uint8_t *dst, const uint8_t *src, uint64_t n) {
#if defined(__x86_64__)
  static int avx2 = -1;
  if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
  for (uint64_t off = 0; off < n;) {
    size_t b = n - off < (64u << 10) ? (size_t)(n - off) : (64u << 10);
    XXH3_64bits_update(h, src + off, b);
#if defined(__x86_64__)
    if (avx2) copy_stream_avx2(dst + off, src + off, b);
    else
#endif
      memcpy(dst + off, src + off, b);
    off += b;
  }
  atomic_thread_fence(memory_order_seq_cst); /* visible before LAYER/DONE is sent */
}

/* Writes up to DIRECT_BUDGET bytes per call (then lets the loop breathe). Returns blocks done. */
#define DIRECT_BUDGET (16u << 20)
static uint32_t issue_direct(k3_xfer_send_t *s) {
  const k3_xfer_desc_t *d = s->desc;
  uint32_t done = 0;
  uint64_t budget = DIRECT_BUDGET;
  while (!s->status && s->q_pos < s->q_len && budget > 0) {
    if (s->ep->closed || k3_now_ns() >= s->deadline_ns) break; /* pump_one fails the send */
    uint32_t r = s->queue[s->q_pos];
    const k3_xfer_region_t *rg = &d->regions[r];
    uint64_t pool_off, rcontig, lcontig = UINT64_MAX;
    k3_xfer_region_locate(d, r, s->cur_off, &pool_off, &rcontig);
    uint64_t n = s->opts.chunk_bytes < rcontig ? s->opts.chunk_bytes : rcontig;
    const uint8_t *ptr;
    if (s->staged) {
      int rc = s->stage.d2h(s->stage.ud, r, s->cur_off, s->slots[0].stage, n);
      if (rc) {
        K3_ERROR("xfer: request %llu: staging copy of region %u failed: %s",
                 (unsigned long long)d->request_id, r, k3_strerror(rc));
        s->status = K3_EDEVICE;
        break;
      }
      ptr = s->slots[0].stage;
    } else {
      ptr = src_ptr(&s->srcs[r], s->cur_off, &lcontig);
      if (lcontig < n) n = lcontig;
    }
    uint32_t kind = xf_kind_of(rg);
    uint64_t t0 = k3_now_ns();
    if (!s->kind_first[kind]) s->kind_first[kind] = t0;
    hash_copy(s->hash[r], s->dbase[rg->pool] + pool_off, ptr, n);
    s->kind_last[kind] = k3_now_ns();
    s->res.kind_bytes[kind] += n;
    s->res.bytes += n;
    budget = n < budget ? budget - n : 0;
    done++;
    s->cur_off += n;
    if (s->cur_off == rg->len_bytes) {
      s->digest[r] = XXH3_64bits_digest(s->hash[r]);
      s->layers[rg->layer].regions_left--;
      s->q_pos++;
      s->cur_off = 0;
    }
  }
  return done;
}

/* Issues puts while slots are free. Returns the number issued; sets s->status on error. */
uint32_t xf_send_issue(k3_xfer_send_t *s) {
  if (s->direct) return issue_direct(s);
  const k3_xfer_desc_t *d = s->desc;
  uint32_t issued = 0;
  while (!s->status && s->q_pos < s->q_len) {
    xf_slot_t *sl = NULL;
    for (uint32_t i = 0; i < s->opts.max_inflight; i++)
      if (!s->slots[i].busy) {
        sl = &s->slots[i];
        break;
      }
    if (!sl) break;
    uint32_t r = s->queue[s->q_pos];
    const k3_xfer_region_t *rg = &d->regions[r];
    uint64_t pool_off, rcontig, lcontig = UINT64_MAX;
    k3_xfer_region_locate(d, r, s->cur_off, &pool_off, &rcontig);
    uint64_t n = s->opts.chunk_bytes < rcontig ? s->opts.chunk_bytes : rcontig;
    const void *ptr;
    if (s->staged) {
      int rc = s->stage.d2h(s->stage.ud, r, s->cur_off, sl->stage, n);
      if (rc) {
        K3_ERROR("xfer: request %llu: staging copy of region %u failed: %s",
                 (unsigned long long)d->request_id, r, k3_strerror(rc));
        s->status = K3_EDEVICE;
        break;
      }
      ptr = sl->stage;
    } else {
      ptr = src_ptr(&s->srcs[r], s->cur_off, &lcontig);
      if (lcontig < n) n = lcontig;
    }
    XXH3_64bits_update(s->hash[r], ptr, n);
    uint32_t kind = xf_kind_of(rg);
    if (!s->kind_first[kind]) s->kind_first[kind] = k3_now_ns();
    s->res.kind_bytes[kind] += n;
    sl->kind = kind;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = put_cb,
                             .user_data = sl};
    sl->layer = rg->layer;
    ucs_status_ptr_t req;
    if (s->am_data) {
      xf_data_t h = {.request_id = d->request_id, .epoch = d->epoch, .region = r, .offset = s->cur_off};
      xf_data_encode(&h, sl->hdr);
      req = ucp_am_send_nbx(s->ep->ep, XF_AM_DATA, sl->hdr, XF_DATA_HDR, ptr, n, &p);
    } else {
      req = ucp_put_nbx(s->ep->ep, ptr, n, d->pools[rg->pool].base_addr + pool_off, s->rkeys[rg->pool]->h, &p);
    }
    if (UCS_PTR_IS_ERR(req)) {
      K3_WARN("xfer: request %llu: put failed: %s", (unsigned long long)d->request_id,
              xf_ucs_str(UCS_PTR_STATUS(req)));
      s->status = K3_ETRANSPORT;
      break;
    }
    if (req) {
      sl->busy = true;
      s->inflight++;
      s->layers[rg->layer].puts_out++;
    } else {
      s->kind_last[kind] = k3_now_ns();
    }
    s->res.bytes += n;
    issued++;
    s->cur_off += n;
    if (s->cur_off == rg->len_bytes) {
      s->digest[r] = XXH3_64bits_digest(s->hash[r]);
      s->layers[rg->layer].regions_left--;
      s->q_pos++;
      s->cur_off = 0;
    }
  }
  return issued;
}
