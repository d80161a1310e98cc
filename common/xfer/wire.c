/* The transfer protocol's active messages (wire.h): DONE, ACK, LAYER, SRC and the DATA header.
 *
 * What it is for: the only code that turns these messages into bytes and back. Every decoder
 * checks magic, version and type, and accepts exactly the length its counts imply; anything else
 * is K3_EPROTO (the caller counts and drops it).
 *
 * What it is not: the rules of the protocol (who sends what when: send.c, recv_verify.c). The
 * wire version (5) changes whenever the digest function or a layout changes, so a peer of
 * another version is rejected rather than misread. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/xfer_desc.h"
#include "wire.h"

#define DONE_HDR 64
#define ACK_LEN 40

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* DONE layout: magic u32 | version u16 | type u16 (1) | request_id u64 | epoch u64 |
 * fingerprint u64 | send_id u64 | first_token u32 | logprob f32 | n_digests u32 | addr_len u32 |
 * flags u32 | reserved u32 | addr bytes | digests u64[n]. */
uint8_t *xf_done_encode(const xf_done_t *d, const uint64_t *digests, size_t *len) {
  size_t n = DONE_HDR + d->addr_len + 8 * (size_t)d->n_digests;
  uint8_t *b = calloc(1, n);
  if (!b) return NULL;
  put32(b, XF_WIRE_MAGIC);
  put16(b + 4, XF_WIRE_VERSION);
  put16(b + 6, 1);
  put64(b + 8, d->request_id);
  put64(b + 16, d->epoch);
  put64(b + 24, d->fingerprint);
  put64(b + 32, d->send_id);
  put32(b + 40, d->first_token);
  memcpy(b + 44, &d->first_logprob, 4);
  put32(b + 48, d->n_digests);
  put32(b + 52, d->addr_len);
  put32(b + 56, d->flags);
  memcpy(b + DONE_HDR, d->addr, d->addr_len);
  for (uint32_t i = 0; i < d->n_digests; i++) put64(b + DONE_HDR + d->addr_len + 8 * (size_t)i, digests[i]);
  *len = n;
  return b;
}

int xf_done_decode(const uint8_t *b, size_t len, xf_done_t *d) {
  if (len < DONE_HDR || get32(b) != XF_WIRE_MAGIC || get16(b + 4) != XF_WIRE_VERSION ||
      get16(b + 6) != 1)
    return K3_EPROTO;
  d->request_id = get64(b + 8);
  d->epoch = get64(b + 16);
  d->fingerprint = get64(b + 24);
  d->send_id = get64(b + 32);
  d->first_token = get32(b + 40);
  memcpy(&d->first_logprob, b + 44, 4);
  d->n_digests = get32(b + 48);
  d->addr_len = get32(b + 52);
  d->flags = get32(b + 56);
  if (d->addr_len == 0 || d->addr_len > K3_XFER_MAX_ADDR_BYTES || d->n_digests == 0 ||
      d->n_digests > K3_XFER_MAX_REGIONS ||
      len != DONE_HDR + (size_t)d->addr_len + 8 * (size_t)d->n_digests)
    return K3_EPROTO;
  d->addr = b + DONE_HDR;
  d->digests = b + DONE_HDR + d->addr_len;
  return 0;
}

/* LAYER layout: magic u32 | version u16 | type u16 (3) | request_id u64 | epoch u64 |
 * fingerprint u64 | send_id u64 | layer u32 | n_digests u32 | flags u32 | n_layers u32 |
 * digests u64[n]. */
#define LAYER_HDR 56
uint8_t *xf_layer_encode(const xf_layer_t *m, const uint64_t *digests, size_t *len) {
  size_t n = LAYER_HDR + 8 * (size_t)m->n_digests;
  uint8_t *b = calloc(1, n);
  if (!b) return NULL;
  put32(b, XF_WIRE_MAGIC);
  put16(b + 4, XF_WIRE_VERSION);
  put16(b + 6, 3);
  put64(b + 8, m->request_id);
  put64(b + 16, m->epoch);
  put64(b + 24, m->fingerprint);
  put64(b + 32, m->send_id);
  put32(b + 40, m->layer);
  put32(b + 44, m->n_digests);
  put32(b + 48, m->flags);
  put32(b + 52, m->n_layers);
  for (uint32_t i = 0; i < m->n_digests; i++) put64(b + LAYER_HDR + 8 * (size_t)i, digests[i]);
  *len = n;
  return b;
}

int xf_layer_decode(const uint8_t *b, size_t len, xf_layer_t *m) {
  if (len < LAYER_HDR || get32(b) != XF_WIRE_MAGIC || get16(b + 4) != XF_WIRE_VERSION ||
      get16(b + 6) != 3)
    return K3_EPROTO;
  m->request_id = get64(b + 8);
  m->epoch = get64(b + 16);
  m->fingerprint = get64(b + 24);
  m->send_id = get64(b + 32);
  m->layer = get32(b + 40);
  m->n_digests = get32(b + 44);
  m->flags = get32(b + 48);
  m->n_layers = get32(b + 52);
  bool landed = (m->flags & XF_MSG_FLAG_LANDED) != 0;
  if ((landed ? m->n_digests != 0 : m->n_digests == 0) || m->n_digests > K3_XFER_MAX_REGIONS || m->n_layers == 0 ||
      m->n_layers > K3_XFER_MAX_REGIONS || m->layer > UINT32_MAX - m->n_layers ||
      len != LAYER_HDR + 8 * (size_t)m->n_digests)
    return K3_EPROTO;
  m->digests = b + LAYER_HDR;
  return 0;
}

/* DATA header: magic u32 | version u16 | type u16 (4) | request_id u64 | epoch u64 |
 * region u32 | reserved u32 | offset u64. */
void xf_data_encode(const xf_data_t *d, uint8_t b[XF_DATA_HDR]) {
  memset(b, 0, XF_DATA_HDR);
  put32(b, XF_WIRE_MAGIC);
  put16(b + 4, XF_WIRE_VERSION);
  put16(b + 6, 4);
  put64(b + 8, d->request_id);
  put64(b + 16, d->epoch);
  put32(b + 24, d->region);
  put64(b + 32, d->offset);
}

int xf_data_decode(const void *buf, size_t len, xf_data_t *d) {
  const uint8_t *b = buf;
  if (len != XF_DATA_HDR || get32(b) != XF_WIRE_MAGIC || get16(b + 4) != XF_WIRE_VERSION ||
      get16(b + 6) != 4)
    return K3_EPROTO;
  d->request_id = get64(b + 8);
  d->epoch = get64(b + 16);
  d->region = get32(b + 24);
  d->offset = get64(b + 32);
  return 0;
}

/* ACK layout: magic u32 | version u16 | type u16 (2) | request_id u64 | epoch u64 |
 * send_id u64 | status i32 | reserved u32. */
uint8_t *xf_ack_encode(const xf_ack_t *a, size_t *len) {
  uint8_t *b = calloc(1, ACK_LEN);
  if (!b) return NULL;
  put32(b, XF_WIRE_MAGIC);
  put16(b + 4, XF_WIRE_VERSION);
  put16(b + 6, 2);
  put64(b + 8, a->request_id);
  put64(b + 16, a->epoch);
  put64(b + 24, a->send_id);
  put32(b + 32, (uint32_t)a->status);
  *len = ACK_LEN;
  return b;
}

int xf_ack_decode(const uint8_t *b, size_t len, xf_ack_t *a) {
  if (len != ACK_LEN || get32(b) != XF_WIRE_MAGIC || get16(b + 4) != XF_WIRE_VERSION ||
      get16(b + 6) != 2)
    return K3_EPROTO;
  a->request_id = get64(b + 8);
  a->epoch = get64(b + 16);
  a->send_id = get64(b + 24);
  a->status = (int32_t)get32(b + 32);
  if (a->status > 0) return K3_EPROTO;
  return 0;
}

uint16_t xf_wire_type(const uint8_t *b, size_t len) {
  if (len < 8 || get32(b) != XF_WIRE_MAGIC || get16(b + 4) != XF_WIRE_VERSION) return 0;
  return get16(b + 6);
}

/* SRC layout: magic u32 | version u16 | type u16 (5) | send_id u64 | desc_len u32 |
 * reserved u32 | descriptor bytes [desc_len]. */
uint8_t *xf_src_encode(uint64_t send_id, const uint8_t *desc, uint32_t desc_len, size_t *len) {
  size_t n = XF_SRC_HDR + (size_t)desc_len;
  uint8_t *b = calloc(1, n);
  if (!b) return NULL;
  put32(b, XF_WIRE_MAGIC);
  put16(b + 4, XF_WIRE_VERSION);
  put16(b + 6, 5);
  put64(b + 8, send_id);
  put32(b + 16, desc_len);
  memcpy(b + XF_SRC_HDR, desc, desc_len);
  *len = n;
  return b;
}

int xf_src_decode(const uint8_t *b, size_t len, xf_src_t *m) {
  if (len < XF_SRC_HDR || get32(b) != XF_WIRE_MAGIC || get16(b + 4) != XF_WIRE_VERSION ||
      get16(b + 6) != 5 || get32(b + 20) != 0)
    return K3_EPROTO;
  m->send_id = get64(b + 8);
  m->desc_len = get32(b + 16);
  if (m->desc_len == 0 || len != XF_SRC_HDR + (size_t)m->desc_len) return K3_EPROTO;
  m->desc = b + XF_SRC_HDR;
  return 0;
}
