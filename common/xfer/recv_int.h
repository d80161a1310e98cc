/* Private to the receiver: recv.c (reservation table, leases, quarantine, release), recv_verify.c
 * (LAYER and DONE: digests over our own memory, on the host or by device jobs; verdicts and
 * ACKs) and recv_data.c (DATA placement). Not part of the public API.
 *
 * Lifetime of a reservation (resv_t): LIVE (reserved, lease running) → READY (DONE accepted,
 * on_ready ran) → released on k3_xfer_recv_release; or LIVE → QUAR (lease expired or
 * cancelled) → released after quarantine_ms, and only once no rendezvous receive and no device
 * verification job into its memory is running (both may still write or read it). A resv_t is
 * freed only by resv_release, so every pointer to it (device verification jobs) stays valid
 * while it counts in jobs_out. */
#ifndef K3PD_XFER_RECV_INT_H
#define K3PD_XFER_RECV_INT_H

#include "xfer_int.h"

enum { RS_LIVE, RS_READY, RS_QUAR };

typedef struct resv {
  struct resv *next;
  int state;
  uint64_t expiry_ns; /* lease end (LIVE) or quarantine end (QUAR) */
  void *owner;
  k3_xfer_desc_t *desc; /* our copy: the only addresses we ever hash or release */
  k3_xfer_pool_t *pools[K3_XFER_MAX_POOLS];
  uint8_t *known;     /* per region: our memory's digest of the current epoch is in vdigest */
  uint64_t *vdigest;  /* per region: that digest (checked against LAYER, or for DONE) */
  int verdict;        /* first failure of the current epoch (K3_EDIGEST/EPROTO/EDEVICE) or 0 */
  uint64_t serial;    /* unique per receiver: rendezvous records find the reservation by it */
  uint64_t *landed;   /* per region: bytes of the current epoch landed through DATA */
  uint32_t rx_pending; /* rendezvous receives into this memory still in flight (any epoch) */
  uint32_t jobs_out;   /* device verification jobs over this memory still running (any epoch) */
  bool any_dev;        /* some region lies in a K3_XFER_MEM_CUDA pool */
  /* Device regions announced by LAYERs of the current epoch, not yet submitted: every LAYER
   * handled in one drive goes out as ONE verification job (a job costs a launch and a round
   * trip whatever its size; a finished state's layers arrive together). n_regions capacity. */
  uint32_t *pend_reg;
  uint64_t *pend_want;
  uint32_t pend_n, pend_layers;
  /* cuda-pull (current epoch): the sender's sources (its SRC message, decoded and checked
   * against our regions) and each of its pools mapped here. While set, every verification job
   * of this reservation is a pull: it reads the sender's bytes, writes our memory at our own
   * addresses and hashes what it read. */
  k3_xfer_desc_t *src;
  uint8_t *sbase[K3_XFER_MAX_POOLS];
  /* The sender's pools did not map here: we answered its SRC with K3_ENOTSUP (it redoes the send
   * as cuda-ipc) and drop its PULL LAYERs and PULL DONE of this epoch. */
  bool src_refused;
} resv_t;

/* A device verification job: hashes some regions of one reservation (its own addresses). With
 * want set (a LAYER's digests) it verifies; without (DONE's remainder) it only records. */
typedef struct xf_vjob {
  struct xf_vjob *next;
  resv_t *v;
  uint64_t epoch;
  void *job;
  uint32_t n_layers; /* LAYERs this job verifies (0: DONE's remainder) */
  uint32_t n;
  uint32_t *regions; /* n region ids */
  uint64_t *want;    /* n announced digests (LAYER) or NULL */
  uint64_t *got;     /* n digests from poll */
  uint64_t pull_bytes; /* a pull job: bytes it copies (0: hash only) */
} xf_vjob_t;

struct k3_xfer_recv {
  k3_xfer_ctx_t *ctx;
  k3_xfer_recv_opts_t opts;
  k3_xfer_stage_t stage;
  k3_xfer_dev_t dev;
  bool staged, has_dev;
  bool can_pull; /* device hooks map a sender's pools, pull not switched off: offer cuda-pull */
  resv_t *list;
  xf_vjob_t *jobs; /* device verification jobs running */
  k3_digest_t dg;  /* host verification, one region at a time */
  uint64_t next_epoch, next_serial;
};

/* recv.c */
resv_t *xf_resv_find(k3_xfer_recv_t *r, uint64_t request_id); /* live or ready, not quarantined */
resv_t *xf_resv_find_serial(k3_xfer_recv_t *r, uint64_t serial);
static inline bool xf_region_dev(const resv_t *v, uint32_t reg) {
  return v->pools[v->desc->regions[reg].pool]->mem == K3_XFER_MEM_CUDA;
}
/* Calls fn on every contiguous extent of region `reg` in our own memory, with its address. */
int xf_for_extents(const resv_t *v, uint32_t reg, int (*fn)(void *, uint64_t, uintptr_t, uint64_t),
                   void *arg);

/* recv_verify.c */
/* Polls the running verification jobs; records digests/verdicts; returns work done. */
uint64_t xf_recv_jobs_pump(k3_xfer_recv_t *r);
/* Submits the reservation's pending LAYER verifications as one job (nothing when none). On a
 * refused job the regions stay unverified: DONE hashes what is left. */
void xf_recv_flush_pending(k3_xfer_recv_t *r, resv_t *v);
/* Waits for and frees every job (receiver free). */
void xf_recv_jobs_release_all(k3_xfer_recv_t *r);

#endif
