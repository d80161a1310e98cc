/* Private to the sender (send.c: API, layers, fences, DONE/ACK; send_push.c: moving the
 * bytes). Not part of the public API. */
#ifndef K3PD_XFER_SEND_INT_H
#define K3PD_XFER_SEND_INT_H

#include "xfer_int.h"

enum { PH_PUSH, PH_FLUSH, PH_WAIT_ACK, PH_FIRED };

typedef struct {
  k3_xfer_send_t *s;
  uint32_t kind, layer;
  bool busy;
  uint8_t *stage; /* staging buffer (staged path only) */
  uint8_t hdr[XF_DATA_HDR]; /* DATA header (rendezvous path): must live until completion */
} xf_slot_t;

/* Per-layer progress: once every region of the layer has been handed to UCX and all its puts
 * completed, the endpoint is flushed and LAYER (the layer's digests) is sent, so the receiver
 * verifies it while later layers stream. */
enum { LY_WAIT, LY_PUSHING, LY_FLUSHING, LY_ANNOUNCED };
typedef struct {
  k3_xfer_send_t *s;
  uint32_t layer;
  uint32_t regions_left; /* regions of the layer not yet fully issued */
  uint32_t puts_out;     /* its puts still in flight */
  uint8_t state;
  bool flush_out;        /* a flush request for it is outstanding */
} xf_layer_st_t;

struct k3_xfer_send {
  k3_xfer_send_t *next;
  k3_xfer_ctx_t *ctx;
  const k3_xfer_desc_t *desc;
  const k3_xfer_src_t *srcs;
  k3_xfer_send_opts_t opts;
  k3_xfer_stage_t stage;
  bool staged;
  k3_xfer_send_cb cb;
  void *ud;
  uint64_t send_id, deadline_ns;
  xf_ep_t *ep;
  xf_rkey_t *rkeys[K3_XFER_MAX_POOLS];
  bool direct;                      /* writes through dbase (see k3_xfer_send_direct) */
  bool am_data;                     /* DATA active messages (rendezvous) instead of puts */
  uint8_t *dbase[K3_XFER_MAX_POOLS]; /* local mapping of each receiver pool's base_addr */
  xf_layer_st_t *layers;
  uint32_t layer_flushes_out, layers_announced;
  uint8_t *layer_ready;
  uint32_t layers_signalled, n_layers;
  uint32_t *queue, q_len, q_pos; /* regions in push order */
  uint64_t cur_off;              /* next byte of region queue[q_pos] */
  xf_hash_t **hash;
  uint64_t *digest;
  xf_slot_t *slots;
  uint32_t inflight;
  int phase, status;
  bool finish_called, flush_pending, ep_failed;
  uint32_t first_token;
  float first_logprob;
  k3_xfer_send_result_t res;
  uint64_t kind_first[K3_XFER_KIND_COUNT], kind_last[K3_XFER_KIND_COUNT];
};

static inline uint32_t xf_kind_of(const k3_xfer_region_t *rg) {
  return rg->kind < K3_XFER_KIND_COUNT ? rg->kind : K3_XFER_KIND_OTHER;
}

/* send_push.c: hands queued region bytes on (direct copy, DATA messages or puts) while there is
 * room; returns the number of chunks handed on and sets s->status on error. */
uint32_t xf_send_issue(k3_xfer_send_t *s);

#endif
