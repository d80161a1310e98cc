/* Private to k3_xfer: the four active messages of the transfer protocol and their codecs.
 *
 * What it is for: DONE (sender → receiver: the request's digests and first token), ACK
 * (receiver → sender: the verdict), LAYER (sender → receiver: one layer's digests, after that
 * layer's bytes are complete and visible) and the DATA header (sender → receiver: where a chunk
 * goes, by region and offset in the receiver's own descriptor). Layouts: docs/transfer.md
 * "Messages". Little-endian, fixed layout, versioned, decoded strictly: a decoder accepts
 * exactly one length for the counts it reads, or returns K3_EPROTO.
 *
 * What it is not: the protocol's rules (send.c, recv_verify.c). */
#ifndef K3PD_XFER_WIRE_H
#define K3PD_XFER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define XF_AM_DONE 17
#define XF_AM_ACK 18
#define XF_AM_LAYER 19
#define XF_AM_DATA 20 /* host path without mapping (tcp) and ucx-cuda: header + chunk */
#define XF_AM_SRC 21  /* cuda-pull: where the sender's bytes are (sender -> receiver) */
#define XF_WIRE_MAGIC 0x4e58334bu /* "K3XN" */
/* 5: SRC (the cuda-pull path) and the PULL flag; 4: a LAYER announces a run of consecutive layers (layers due together: one message, not one
 * per layer); 3: one layer per LAYER; digests are the K3 chunked XXH3 (k3pd/digest.h) since 3;
 * 2: streaming XXH3-64 per region. */
#define XF_WIRE_VERSION 5

#define XF_MSG_FLAG_AM_DATA 1u
/* LAYER without digests (n_digests 0): the layers' bytes are complete and visible (cuda-ipc:
 * the copy job finished); the receiver verifies them now and compares with DONE's digests. */
#define XF_MSG_FLAG_LANDED 2u
/* cuda-pull (LAYER, DONE): the bytes stay in the sender's exported pools (described by the
 * send's SRC message); the receiver copies them with its own job, hashing what it read, and
 * compares with the digests LAYER (or DONE) carries. */
#define XF_MSG_FLAG_PULL 4u
#define XF_LAYER_MSG_MAX 512 /* digests per LAYER (4 KiB + header: eager on every transport) */

typedef struct {
  uint64_t request_id, epoch, fingerprint, send_id;
  uint32_t first_token;
  float first_logprob;
  uint32_t flags; /* XF_MSG_FLAG_* */
  uint32_t n_digests;
  uint32_t addr_len;
  const uint8_t *addr;    /* points into the message */
  const uint8_t *digests; /* n_digests little-endian u64, points into the message */
} xf_done_t;

typedef struct {
  uint64_t request_id, epoch, send_id;
  int32_t status;
} xf_ack_t;

/* LAYER: the digests of the regions of layers layer .. layer + n_layers - 1, layer by layer,
 * each layer's regions in ascending region order, so the receiver verifies those layers while
 * later layers stream and DONE only has what is left. */
typedef struct {
  uint64_t request_id, epoch, fingerprint, send_id;
  uint32_t layer, n_digests;
  uint32_t n_layers;      /* >= 1 */
  uint32_t flags;         /* XF_MSG_FLAG_* */
  const uint8_t *digests; /* points into the message */
} xf_layer_t;

/* DATA header (the AM's user header; the chunk is the AM's data): the receiver places the
 * chunk by (region, offset) in its own descriptor, never by an address from the message. */
typedef struct {
  uint64_t request_id, epoch;
  uint32_t region;
  uint64_t offset;
} xf_data_t;
#define XF_DATA_HDR 40

/* SRC (cuda-pull, sent once per send, right before its first LAYER or DONE): the sender's sources as
 * a descriptor (xfer_desc.h v2, its own checksum): request id, epoch and fingerprint of the
 * receiver's reservation, the sender's exported device pools (size + mapping blob; base_addr is
 * informational), index lists and one region per receiver region (same kind, layer and length)
 * giving where that region's bytes sit in those pools. The receiver maps the pools and reads
 * only inside them (the descriptor's validation bounds every region by its pool's size). */
typedef struct {
  uint64_t send_id;
  uint32_t desc_len;
  const uint8_t *desc; /* points into the message */
} xf_src_t;
#define XF_SRC_HDR 24

/* The type field (1 DONE, 2 ACK, 3 LAYER, 4 DATA, 5 SRC) of a message of this wire version, or
 * 0 when buf is not one (short, magic or version). */
uint16_t xf_wire_type(const uint8_t *buf, size_t len);

/* DONE: header 64 bytes + addr + 8 * n_digests. Returns a malloc'd buffer or NULL. */
uint8_t *xf_done_encode(const xf_done_t *d, const uint64_t *digests, size_t *len);
int xf_done_decode(const uint8_t *buf, size_t len, xf_done_t *out); /* 0 or K3_EPROTO */
/* LAYER: header 56 bytes + 8 * n_digests. Returns a malloc'd buffer or NULL. */
uint8_t *xf_layer_encode(const xf_layer_t *m, const uint64_t *digests, size_t *len);
int xf_layer_decode(const uint8_t *buf, size_t len, xf_layer_t *out); /* 0 or K3_EPROTO */
uint8_t *xf_ack_encode(const xf_ack_t *a, size_t *len);               /* malloc'd or NULL */
int xf_ack_decode(const uint8_t *buf, size_t len, xf_ack_t *out);     /* 0 or K3_EPROTO */
/* SRC: header 24 bytes + the descriptor bytes. Returns a malloc'd buffer or NULL. */
uint8_t *xf_src_encode(uint64_t send_id, const uint8_t *desc, uint32_t desc_len, size_t *len);
int xf_src_decode(const uint8_t *buf, size_t len, xf_src_t *out); /* 0 or K3_EPROTO */
void xf_data_encode(const xf_data_t *d, uint8_t out[XF_DATA_HDR]);
int xf_data_decode(const void *buf, size_t len, xf_data_t *out);      /* 0 or K3_EPROTO */

#endif
