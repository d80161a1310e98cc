/* libFuzzer harness for the transfer protocol's wire messages as a receiver or sender gets them
 * from the network (common/xfer: wire.c, desc.c): the first byte chooses the decoder (DONE, LAYER,
 * ACK, DATA header, reservation descriptor as is, the descriptor with its trailing checksum
 * recomputed so mutations reach the field decoding behind it, or SRC: its header, then the
 * sender's source descriptor it carries), the rest is the message. Invariants checked on
 * what decodes: counts and pointers stay inside the buffer; a descriptor re-encodes to bytes that
 * decode to the same encoding again, and every region's first and last byte lie inside its pool
 * (the receiver writes there). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/xfer_desc.h"
#include "wire.h"

static void check_desc(const uint8_t *data, size_t size) {
  k3_xfer_desc_t *d = NULL;
  char err[256];
  err[0] = 1;
  int rc = k3_xfer_desc_decode(data, size, &d, err, sizeof err);
  if (rc) {
    if (d || !memchr(err, 0, sizeof err)) abort(); /* nothing allocated, the message terminated */
    return;
  }
  for (uint32_t r = 0; r < d->n_regions; r++) {
    const k3_xfer_region_t *g = &d->regions[r];
    if (g->pool >= d->n_pools || g->list >= d->n_lists || g->len_bytes == 0) abort();
    uint64_t at, contig;
    k3_xfer_region_locate(d, r, 0, &at, &contig);
    if (at >= d->pools[g->pool].size_bytes || contig == 0 || at + contig > d->pools[g->pool].size_bytes) abort();
    k3_xfer_region_locate(d, r, g->len_bytes - 1, &at, &contig);
    if (at >= d->pools[g->pool].size_bytes || contig != 1) abort();
  }
  (void)k3_xfer_desc_total_bytes(d);
  uint8_t *buf, *buf2;
  size_t len, len2;
  if (k3_xfer_desc_encode(d, &buf, &len)) abort(); /* a decoded descriptor is valid */
  k3_xfer_desc_t *e = NULL, *c = NULL;
  if (k3_xfer_desc_decode(buf, len, &e, err, sizeof err)) abort();
  if (k3_xfer_desc_encode(e, &buf2, &len2) || len2 != len || memcmp(buf, buf2, len)) abort();
  if (k3_xfer_desc_clone(e, &c) == 0) k3_xfer_desc_free(c);
  free(buf);
  free(buf2);
  k3_xfer_desc_free(e);
  k3_xfer_desc_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int which = data[0] % 7;
  data++;
  size--;
  switch (which) {
    case 0: {
      xf_done_t m;
      if (xf_done_decode(data, size, &m) == 0) {
        if (m.addr != data + 64 || m.digests != m.addr + m.addr_len ||
            m.digests + 8 * (size_t)m.n_digests != data + size)
          abort();
        size_t n;
        uint64_t *dg = malloc(8 * (size_t)m.n_digests);
        if (!dg) abort();
        memcpy(dg, m.digests, 8 * (size_t)m.n_digests);
        uint8_t *b = xf_done_encode(&m, dg, &n);
        xf_done_t m2;
        if (!b || n != size || xf_done_decode(b, n, &m2) || m2.epoch != m.epoch || m2.n_digests != m.n_digests) abort();
        free(b);
        free(dg);
      }
      break;
    }
    case 1: {
      xf_layer_t m;
      if (xf_layer_decode(data, size, &m) == 0) {
        if (m.digests + 8 * (size_t)m.n_digests != data + size) abort();
        /* a decoded LAYER (digests, or LANDED without) re-encodes to the same bytes */
        uint64_t *dg = malloc(8 * (size_t)m.n_digests + 8);
        if (!dg) abort();
        memcpy(dg, m.digests, 8 * (size_t)m.n_digests);
        size_t n;
        uint8_t *b = xf_layer_encode(&m, dg, &n);
        if (!b || n != size || memcmp(b, data, size)) abort();
        free(b);
        free(dg);
      }
      break;
    }
    case 2: {
      xf_ack_t a;
      if (xf_ack_decode(data, size, &a) == 0 && a.status > 0) abort();
      break;
    }
    case 3: {
      xf_data_t h;
      if (xf_data_decode(data, size, &h) == 0 && size != XF_DATA_HDR) abort();
      break;
    }
    case 4:
      check_desc(data, size);
      break;
    case 6: {
      xf_src_t m;
      if (xf_src_decode(data, size, &m) == 0) {
        if (m.desc != data + XF_SRC_HDR || m.desc + m.desc_len != data + size || m.desc_len == 0) abort();
        size_t n;
        uint8_t *b = xf_src_encode(m.send_id, m.desc, m.desc_len, &n);
        if (!b || n != size || memcmp(b, data, size)) abort(); /* re-encodes to the same bytes */
        free(b);
        check_desc(m.desc, m.desc_len); /* the receiver decodes the sources as a descriptor */
      }
      break;
    }
    default: {
      if (size < 16) break;
      uint8_t *b = malloc(size);
      if (!b) abort();
      memcpy(b, data, size);
      uint64_t sum = k3_hash64(b, size - 8, 0);
      memcpy(b + size - 8, &sum, 8);
      check_desc(b, size);
      free(b);
    }
  }
  return 0;
}
