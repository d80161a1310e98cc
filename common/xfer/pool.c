/* Registered memory pools: host memory UCX allocates, or memory someone else allocated (host or
 * device) registered as it is.
 *
 * What it is for: the receiver's side of a descriptor's pools (xfer_desc.h): base, size, memory
 * type, packed rkey (when UCX registered it) and the opaque mapping blob the workers' device
 * hooks produce. Why UCX allocates host pools (k3_xfer_pool_alloc_host) instead of registering
 * malloc'd memory: with Debian's UCX 1.13 a put into malloc'd memory is emulated and completes
 * only when the target progresses (C-STACK.md P9), while UCX-allocated memory sits in a shared
 * segment that a same-host sender maps (ucp_rkey_ptr) and writes one-sidedly. Such a pool is
 * touched once at creation so its page faults are paid at start-up, not by the first transfer.
 *
 * What it is not: an allocator of device memory (the workers allocate it, e.g. a runner's state
 * arena, and register it here), or a slot/page allocator (the owner's). Nothing here reads or
 * writes a K3_XFER_MEM_CUDA pool's bytes.
 *
 * Invariants: memh != NULL iff rkey_len > 0 (UCX registered the pool); an alloc_host pool owns
 * its memory (freed by ucp_mem_unmap), a registered one never does. On error nothing is left. */
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/log.h"
#include "xfer_int.h"

static void pool_destroy(k3_xfer_pool_t *p) {
  if (p->rkey) ucp_rkey_buffer_release(p->rkey);
  if (p->memh) ucp_mem_unmap(p->ctx->ucp, p->memh);
  free(p->blob);
  free(p);
}

static k3_xfer_pool_t *pool_new(k3_xfer_ctx_t *ctx, k3_xfer_mem_t mem, const uint8_t *blob,
                                uint32_t blob_len) {
  k3_xfer_pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->ctx = ctx;
  p->mem = mem;
  if (blob_len) {
    if (!(p->blob = malloc(blob_len))) {
      free(p);
      return NULL;
    }
    memcpy(p->blob, blob, blob_len);
    p->blob_len = blob_len;
  }
  return p;
}

/* ucp_mem_map with the given params, then the rkey. On error the pool is untouched except that
 * memh/rkey stay NULL. */
static ucs_status_t map_and_pack(k3_xfer_pool_t *p, const ucp_mem_map_params_t *mp) {
  ucs_status_t st = ucp_mem_map(p->ctx->ucp, mp, &p->memh);
  if (st != UCS_OK) {
    p->memh = NULL;
    return st;
  }
  st = ucp_rkey_pack(p->ctx->ucp, p->memh, &p->rkey, &p->rkey_len);
  if (st != UCS_OK) {
    ucp_mem_unmap(p->ctx->ucp, p->memh);
    p->memh = NULL;
    p->rkey = NULL;
    p->rkey_len = 0;
  }
  return st;
}

int k3_xfer_pool_alloc_host(k3_xfer_ctx_t *ctx, uint64_t bytes, k3_xfer_pool_t **out) {
  if (!ctx || bytes == 0 || bytes > SIZE_MAX) {
    K3_ERROR("xfer: host pool of %llu bytes is invalid", (unsigned long long)bytes);
    return K3_EINVAL;
  }
  k3_xfer_pool_t *p = pool_new(ctx, K3_XFER_MEM_HOST, NULL, 0);
  if (!p) return K3_ENOMEM;
  ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                           UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                           UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                             .address = NULL,
                             .length = bytes,
                             .flags = UCP_MEM_MAP_ALLOCATE};
  ucs_status_t st = map_and_pack(p, &mp);
  if (st == UCS_OK) {
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    st = ucp_mem_query(p->memh, &ma);
    if (st == UCS_OK && ma.length < bytes) st = UCS_ERR_NO_MEMORY;
    p->base = ma.address;
  }
  if (st != UCS_OK) {
    K3_ERROR("xfer: allocating a %llu-byte host pool through UCX failed: %s",
             (unsigned long long)bytes, xf_ucs_str(st));
    pool_destroy(p);
    return st == UCS_ERR_NO_MEMORY ? K3_ENOMEM : K3_ETRANSPORT;
  }
  p->size = bytes;
  memset(p->base, 0, bytes); /* fault every page in now */
  *out = p;
  return 0;
}

int k3_xfer_pool_register(k3_xfer_ctx_t *ctx, void *base, uint64_t bytes, k3_xfer_mem_t mem,
                          const uint8_t *blob, uint32_t blob_len, k3_xfer_pool_t **out) {
  if (!ctx || !base || bytes == 0 || (uintptr_t)base > UINTPTR_MAX - bytes ||
      (mem != K3_XFER_MEM_HOST && mem != K3_XFER_MEM_CUDA) || blob_len > K3_XFER_MAX_BLOB_BYTES ||
      (blob_len && !blob)) {
    K3_ERROR("xfer: registering %llu bytes of %s memory (blob %u bytes): invalid arguments",
             (unsigned long long)bytes, k3_xfer_mem_name(mem), blob_len);
    return K3_EINVAL;
  }
  k3_xfer_pool_t *p = pool_new(ctx, mem, blob, blob_len);
  if (!p) return K3_ENOMEM;
  p->base = base;
  p->size = bytes;
  ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                           UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                             .address = base,
                             .length = bytes};
  bool with_ucx = mem == K3_XFER_MEM_HOST || ctx->cuda_capable;
  if (mem == K3_XFER_MEM_CUDA && with_ucx) {
    /* Tell UCX what it is: without the memory type it would probe the pointer. */
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  if (with_ucx) {
    ucs_status_t st = map_and_pack(p, &mp);
    if (st != UCS_OK && mem == K3_XFER_MEM_CUDA && blob_len) {
      /* Device memory UCX's cuda transports cannot export (e.g. a CUDA VMM allocation, which
       * cuIpcGetMemHandle refuses): the blob still lets a same-host sender map it (cuda-ipc);
       * only the ucx-cuda path is lost, and send_start says so if it is ever asked for. */
      K3_WARN("xfer: UCX cannot register this %llu-byte device pool (%s): it is reachable through its "
              "mapping blob only (cuda-ipc), not over ucx-cuda",
              (unsigned long long)bytes, xf_ucs_str(st));
    } else if (st != UCS_OK) {
      K3_ERROR("xfer: registering %llu bytes of %s memory with UCX failed: %s",
               (unsigned long long)bytes, k3_xfer_mem_name(mem), xf_ucs_str(st));
      pool_destroy(p);
      return st == UCS_ERR_NO_MEMORY ? K3_ENOMEM : K3_ETRANSPORT;
    }
  }
  K3_DEBUG("xfer: registered %llu bytes of %s memory (rkey %zu bytes, blob %u bytes)",
           (unsigned long long)bytes, k3_xfer_mem_name(mem), p->rkey_len, blob_len);
  *out = p;
  return 0;
}

void k3_xfer_pool_free(k3_xfer_pool_t *p) {
  if (p) pool_destroy(p);
}

void *k3_xfer_pool_base(const k3_xfer_pool_t *p) { return p->base; }
uint64_t k3_xfer_pool_size(const k3_xfer_pool_t *p) { return p->size; }
k3_xfer_mem_t k3_xfer_pool_mem(const k3_xfer_pool_t *p) { return p->mem; }
void k3_xfer_pool_rkey(const k3_xfer_pool_t *p, const uint8_t **rkey, size_t *len) {
  *rkey = p->rkey;
  *len = p->rkey_len;
}
void k3_xfer_pool_blob(const k3_xfer_pool_t *p, const uint8_t **blob, size_t *len) {
  *blob = p->blob;
  *len = p->blob_len;
}
