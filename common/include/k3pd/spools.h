/* A worker's runner state arena as one k3_xfer pool, so that peers move state straight into or
 * out of the pools the model reads (docs/gpu-cluster.md §2, docs/transfer.md).
 *
 * Used by the decode worker (it receives every handoff there) and by the prefill worker (it
 * receives a decode worker's cached prefix there for a long-suffix resume, docs/design.md
 * "Long-suffix hits"). Host backends: the arena is memory UCX allocated (a same-host peer maps
 * it). cuda: a CUDA VMM allocation exported on this process's fdshare socket under ipc_dir (the
 * descriptor carries the mapping blob: cuda-ipc), else plain device memory registered with UCX
 * when UCX lists CUDA (ucx-cuda).
 * What it is not: the page/slot allocator or the transfer protocol.
 * Threads: the loop thread (plan before the model loads, setup after, free at exit). */
#ifndef K3PD_SPOOLS_H
#define K3PD_SPOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3_load.h"
#include "k3_runner.h"
#include "k3pd/fdshare.h"
#include "k3pd/xfer.h"

typedef struct {
  k3_xfer_ctx_t *xfer;
  k3_xfer_pool_t *pool;      /* the arena, registered (NULL until setup) */
  bool device;               /* cuda arena */
  bool host;                 /* host arena allocated through UCX (the runner frees it) */
  char ipc_dir[256];         /* cuda: where the fdshare socket lives ("" = not exported) */
  k3_fdshare_t *fds;
  uint8_t blob[512];         /* cuda with an ipc dir: the arena's mapping blob (k3_xhooks_blob) */
  uint32_t blob_len;         /* 0: not exported */
  size_t n;                  /* manifest regions */
  uint64_t *roff, *rstride;  /* region i of page/slot id: pool base + roff[i] + id * rstride[i] */
} k3_spools_t;

/* Before the model loads: sets mo->state so the arena can be registered (host: allocated by
 * UCX; cuda: VMM when ipc_dir is set and not "none"). Returns 0, or K3_ENOTSUP on cuda when
 * neither an ipc_dir nor a CUDA-capable UCX is there (err says so; nothing changed). */
int k3_spools_plan(k3_spools_t *sp, k3_xfer_ctx_t *x, k3_load_opts_t *mo, const char *ipc_dir, char *err,
                   size_t errlen);
/* After the model loaded: the region placement, and on cuda the export (socket
 * "<ipc_dir>/<role>-<pid>-<id>.sock") and the registration. Returns 0 or K3_E* with err. */
int k3_spools_setup(k3_spools_t *sp, k3_runner_t *r, const char *role, char *err, size_t errlen);
/* The exported arena as a cuda-pull source pool (send opts src_pools): true when there is one
 * (cuda with an ipc dir), *out filled (borrowing sp's blob). */
bool k3_spools_src_pool(const k3_spools_t *sp, k3_xfer_src_pool_t *out);
/* Unregisters (a cuda arena; a host arena is freed by the runner) and stops the socket. */
void k3_spools_free(k3_spools_t *sp);

#endif
