/* Private to the sender: send.c (API, path choice, layer fences, DONE/ACK), send_push.c (the
 * host data movement: direct copy, DATA messages, puts, staging) and send_dev.c (the device
 * paths' jobs). Not part of the public API.
 *
 * Per-layer life: LY_WAIT (not signalled) → LY_PUSHING (its regions are queued for the host
 * movers and/or its device job is due) → once every region was handed on, every put/DATA of the
 * layer completed and its device job (if any) completed: LY_FLUSHING (endpoint flush) →
 * LY_ANNOUNCED (LAYER sent with the layer's digests). DONE follows the last announcement and a
 * final flush. */
#ifndef K3PD_XFER_SEND_INT_H
#define K3PD_XFER_SEND_INT_H

#include "xfer_int.h"

enum { PH_PUSH, PH_FLUSH, PH_WAIT_ACK, PH_FIRED };

/* How the bytes move (k3_xfer_send_mode). */
typedef enum {
  XM_DIRECT, /* host: k3_digest_copy into the receiver's pool mapped with ucp_rkey_ptr */
  XM_AM,     /* host/staged: DATA messages; ucx-cuda: DATA rendezvous from device memory */
  XM_PUT,    /* host/staged: ucp_put_nbx (puts_only) */
  XM_JOB,    /* cuda-ipc: device jobs copy into the mapped pools */
  XM_PULL,   /* cuda-pull: the receiver copies from our exported pools (SRC); we only hash
                (or take the producer's digests) and announce */
} xf_mode_t;

typedef struct {
  k3_xfer_send_t *s;
  uint32_t kind, layer;
  bool busy;
  uint8_t *stage; /* staging buffer (staged path only) */
  uint8_t hdr[XF_DATA_HDR]; /* DATA header: must live until completion */
} xf_slot_t;

enum { LY_WAIT, LY_PUSHING, LY_FLUSHING, LY_ANNOUNCED };
/* Device job of a layer: none (host paths), due, running, completed. */
enum { XJ_NONE, XJ_DUE, XJ_OUT, XJ_DONE };
typedef struct {
  k3_xfer_send_t *s;
  uint32_t layer;
  uint32_t regions_left; /* regions of the layer not yet fully handed to the host movers */
  uint32_t puts_out;     /* its puts / DATA messages still in flight */
  uint8_t state;
  uint8_t job_state;     /* XJ_* */
  bool flush_out;        /* a flush request for it is outstanding */
  bool landed;           /* cuda-ipc: announced by a LANDED LAYER (its job seen complete) */
  void *job;             /* dev job while XJ_OUT, held by the first layer of its group */
  uint32_t group_n;      /* on a group's first layer: layers in its job (consecutive layers
                            signalled before the previous job was submitted share one job) */
  uint32_t group_head;   /* the first layer of the job this layer is in */
  uint32_t first_region, n_regions; /* its regions: order[first_region .. + n_regions) */
} xf_layer_st_t;

struct k3_xfer_send {
  k3_xfer_send_t *next;
  k3_xfer_ctx_t *ctx;
  const k3_xfer_desc_t *desc;   /* borrowed until the callback; never touched after it */
  const k3_xfer_src_t *srcs;    /* likewise */
  k3_xfer_send_opts_t opts;
  k3_xfer_stage_t stage;
  k3_xfer_dev_t dev;            /* copy of opts.dev (device sources) */
  bool staged, dev_src;
  k3_xfer_path_t path;
  xf_mode_t mode;
  k3_xfer_send_cb cb;
  void *ud;
  uint64_t send_id, deadline_ns;
  xf_ep_t *ep;
  xf_rkey_t *rkeys[K3_XFER_MAX_POOLS];
  /* Local address of each receiver pool's first byte: the host mapping (direct) or the device
   * mapping from dev.map (cuda-ipc). */
  uint8_t *dbase[K3_XFER_MAX_POOLS];
  xf_layer_st_t *layers;
  uint32_t *order;        /* region ids grouped by layer, ascending inside a layer */
  uint64_t *job_digests;  /* scratch for dev.poll: every region of the descriptor */
  uint32_t jobs_out;      /* device jobs not yet released: the struct lives while > 0 */
  uint32_t layer_flushes_out, layers_announced;
  uint8_t *layer_ready;
  uint32_t layers_signalled, n_layers;
  uint32_t *queue, q_len, q_pos; /* regions for the host movers, in push order */
  uint64_t cur_off;              /* next byte of region queue[q_pos] */
  k3_digest_t dg;                /* the host movers hash one region at a time */
  bool dg_ready;
  uint64_t *digest;              /* per region, as announced */
  xf_slot_t *slots;
  uint32_t inflight;
  int phase, status;
  bool finish_called, flush_pending, ep_failed;
  bool fallback; /* cuda-pull refused by the receiver (it cannot map our pools): switch to cuda-ipc
                    once no job of ours runs (send.c) */
  uint32_t first_token;
  float first_logprob;
  k3_xfer_send_result_t res;
  uint64_t kind_first[K3_XFER_KIND_COUNT], kind_last[K3_XFER_KIND_COUNT];
  uint8_t *src_desc; /* cuda-pull: the encoded source descriptor SRC carries (built at path choice) */
  size_t src_desc_len;
  bool src_sent;     /* SRC went out (with the first LAYER or DONE) */
};

static inline uint32_t xf_kind_of(const k3_xfer_region_t *rg) {
  return rg->kind < K3_XFER_KIND_COUNT ? rg->kind : K3_XFER_KIND_OTHER;
}

/* Address of source byte `off` of region source sr and the bytes contiguous from there, up to
 * max (units back to back with consecutive indices merge, as in xf_region_run). Pure
 * arithmetic: never dereferences (device sources). */
static inline uintptr_t xf_src_addr(const k3_xfer_src_t *sr, uint64_t off, uint64_t max, uint64_t *contig) {
  uintptr_t b = (uintptr_t)sr->base;
  if (!sr->idx) {
    *contig = max;
    return b + sr->offset_bytes + off;
  }
  uint64_t i = off / sr->unit_bytes, in = off % sr->unit_bytes, n = sr->unit_bytes - in;
  uintptr_t a = b + sr->offset_bytes + (uint64_t)sr->idx[i] * sr->stride_bytes + in;
  if (sr->stride_bytes == sr->unit_bytes)
    for (uint64_t j = i; n < max && j + 1 < sr->n_idx && sr->idx[j + 1] == sr->idx[j] + 1u; j++)
      n += sr->unit_bytes;
  *contig = n < max ? n : max;
  return a;
}

/* send_push.c: hands queued region bytes on (direct copy, DATA messages or puts) while there is
 * room; returns the number of chunks handed on and sets s->status on error. */
uint32_t xf_send_issue(k3_xfer_send_t *s);

/* send_dev.c */
/* Chooses the path and mode for a send whose opts/desc/srcs/ep/rkeys are set; maps device
 * pools (cuda-ipc) into s->dbase. Returns 0 or K3_ENOTSUP (reason logged). */
int xf_send_choose_path(k3_xfer_send_t *s);
/* Submits the device jobs of signalled layers (never after the deadline) and polls the running
 * ones; returns work done. Runs for fired sends too (only polling). */
uint64_t xf_send_dev_pump(k3_xfer_send_t *s, uint64_t now_ns);
/* Waits for and releases every running job (ctx close). */
void xf_send_dev_release_all(k3_xfer_send_t *s);

/* No job, no flush, no UCX data: the paths whose bytes device jobs move (cuda-ipc, cuda-pull). */
static inline bool xf_send_jobs_only(const k3_xfer_send_t *s) { return s->mode == XM_JOB || s->mode == XM_PULL; }

/* send.c: LAYER with the LANDED flag and no digests for layers l0 .. l0 + nl - 1 (cuda-ipc:
 * their job's writes are complete and visible; the digests travel in DONE). 0 or K3_E*. */
int xf_send_landed_msg(k3_xfer_send_t *s, uint32_t l0, uint32_t nl);

#endif
