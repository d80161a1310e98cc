/* Reservation descriptor for the state handoff (decode reserves, prefill pushes).
 *
 * What it is for: the decode worker describes, for one request, where in its registered
 * memory every transferable region of the sequence state must be written, so a prefill worker
 * can push it there. The descriptor travels as opaque bytes inside a protobuf `bytes` field;
 * k3_xfer_desc_encode/_decode are its only (de)serialisers.
 *
 * What it is not: it knows nothing about the model. The worker maps its state manifest onto
 * it: a pool is one registered memory block (host memory UCX allocated, or device memory such
 * as a runner's state arena) with a base address, a size, a memory type, an optional packed
 * rkey and an optional opaque "mapping blob" (how a same-host sender maps the pool: produced and
 * read by the workers' device hooks, never by k3_xfer); an index list names the pages or the
 * slot reserved for this request; a region is one manifest region (e.g. "MLA layer 3 latent"
 * or "KDA layer 7 S") = (pool, index list, offset, stride, bytes per page/slot, total bytes,
 * streaming layer). Address of region byte b:
 *   pool.base + off + idx[b / unit] * stride + b % unit
 * so a region can point straight into one layer's [num_pages, bytes] tensor inside an arena
 * (off = the tensor's place in the pool, stride = its row bytes) or into a page-major pool
 * (off = the region's place inside a page, stride = page bytes), and the descriptor stays
 * compact for any prompt length (addresses are never listed).
 *
 * Invariants (checked by k3_xfer_desc_validate, hence by decode, all in overflow-free
 * arithmetic): unit > 0; unit <= stride when the list has more than one entry (units never
 * overlap); len covers exactly the listed indices ((n-1)*unit < len <= n*unit); every byte a
 * region may touch lies inside its pool (off + max(idx)*stride + unit <= size_bytes); counts and
 * lengths are within the K3_XFER_MAX_* limits.
 *
 * Wire format v2 (little-endian, see docs/transfer.md): "K3XD" u16 version u16 flags, fixed
 * header fields, worker address, pools (with rkeys and blobs), index lists as (start,count)
 * runs, regions, then an xxhash64 of all preceding bytes. Decoding is strict: any truncation,
 * trailing byte, bad count, checksum mismatch or failed validation is K3_EPROTO naming the
 * field; nothing is allocated on error. */
#ifndef K3PD_XFER_DESC_H
#define K3PD_XFER_DESC_H

#include <stddef.h>
#include <stdint.h>

#define K3_XFER_DESC_VERSION 2
#define K3_XFER_MAX_POOLS 8
#define K3_XFER_MAX_LISTS 8
#define K3_XFER_MAX_REGIONS 4096
#define K3_XFER_MAX_INDICES (1u << 22) /* per list: 4M pages */
#define K3_XFER_MAX_ADDR_BYTES 8192    /* UCX worker address */
#define K3_XFER_MAX_RKEY_BYTES 8192    /* packed rkey */
#define K3_XFER_MAX_BLOB_BYTES 4096    /* a pool's mapping blob */

/* Descriptor flags (the v2 header's flags field; decoders reject bits they do not know, so a
 * descriptor with a flag an older sender does not understand is refused, never misread). */
#define K3_XFER_DESC_F_PULL 1u /* the receiver can pull (docs/transfer.md "Pull"): on the same
                                  host and GPU it maps a sender's exported device pool and copies
                                  + verifies with its own job; the sender may then choose the
                                  cuda-pull path */
#define K3_XFER_DESC_F_ALL K3_XFER_DESC_F_PULL

/* Region kinds: informational (per-kind bandwidth stats and logs); the manifest assigns them. */
typedef enum {
  K3_XFER_KIND_OTHER = 0,
  K3_XFER_KIND_MLA_KV = 1,   /* MLA latent pages (576 bf16 per token) */
  K3_XFER_KIND_KDA_S = 2,    /* KDA recurrent state, fp32 [H,V,K] */
  K3_XFER_KIND_KDA_CONV = 3, /* KDA conv q/k/v, bf16 [Pc,3] */
  K3_XFER_KIND_COUNT = 4
} k3_xfer_kind_t;

const char *k3_xfer_kind_name(uint32_t kind); /* static string, "other" for unknown values */

/* Memory type of a pool: decides which data paths can reach it (xfer.h, k3_xfer_path_t). */
typedef enum {
  K3_XFER_MEM_HOST = 0, /* host memory: the sender may map it (shm) or send to it */
  K3_XFER_MEM_CUDA = 1, /* device memory: never touched by host code on either side */
} k3_xfer_mem_t;
const char *k3_xfer_mem_name(uint32_t mem); /* "host", "cuda", "?" */

typedef struct {
  uint64_t base_addr;  /* receiver's virtual address of the pool's first byte */
  uint64_t size_bytes; /* > 0; base_addr + size_bytes does not overflow */
  uint32_t mem;        /* k3_xfer_mem_t */
  uint32_t rkey_len;   /* 0..K3_XFER_MAX_RKEY_BYTES; 0 = not registered with UCX */
  uint8_t *rkey;       /* packed rkey (ucp_rkey_pack), owned by the descriptor; NULL if len 0 */
  uint32_t blob_len;   /* 0..K3_XFER_MAX_BLOB_BYTES; 0 = no same-host mapping offered */
  uint8_t *blob;       /* opaque mapping blob (k3_xfer_dev_t map), owned; NULL if len 0 */
} k3_xfer_pool_desc_t;

typedef struct {
  uint32_t n;    /* 1..K3_XFER_MAX_INDICES */
  uint32_t *idx; /* slot/page indices in region byte order, owned by the descriptor */
} k3_xfer_index_list_t;

typedef struct {
  uint32_t kind;         /* k3_xfer_kind_t */
  uint32_t pool;         /* < n_pools */
  uint32_t list;         /* < n_lists */
  uint32_t layer;        /* streaming group: pushed when the sender is told layer is final */
  uint64_t offset_bytes; /* from the pool base to index 0's first byte */
  uint64_t stride_bytes; /* between consecutive indices; >= unit when the list has > 1 entry */
  uint64_t unit_bytes;   /* bytes of this region per index (page/slot), > 0 */
  uint64_t len_bytes;    /* total bytes written, (n-1)*unit < len <= n*unit */
} k3_xfer_region_t;

typedef struct {
  uint64_t request_id;
  uint64_t epoch;           /* fencing: DONE must carry the same epoch */
  int64_t lease_expiry_ms;  /* wall clock (k3_wall_ms); the sender must be done before it */
  uint64_t fingerprint;     /* state-manifest fingerprint of the receiver */
  uint32_t flags;           /* K3_XFER_DESC_F_* (validate rejects unknown bits) */
  uint32_t worker_addr_len; /* receiver's UCX worker address */
  uint8_t *worker_addr;     /* owned */
  uint32_t n_pools;
  k3_xfer_pool_desc_t pools[K3_XFER_MAX_POOLS];
  uint32_t n_lists;
  k3_xfer_index_list_t lists[K3_XFER_MAX_LISTS];
  uint32_t n_regions;
  k3_xfer_region_t *regions; /* owned, n_regions entries */
  uint32_t n_layers;         /* 1 + max(region.layer); derived, filled by validate/decode */
} k3_xfer_desc_t;

/* Checks the invariants above and fills desc->n_layers. Returns 0 or K3_EINVAL with a message
 * naming the field (e.g. "region 12: index 900 reaches byte 9437184 > pool 1 size 8388608")
 * in err. */
int k3_xfer_desc_validate(k3_xfer_desc_t *desc, char *err, size_t errlen);

/* Serialises a valid descriptor into a malloc'd buffer (*out, caller frees with free()).
 * Returns 0, K3_EINVAL (invalid descriptor) or K3_ENOMEM. */
int k3_xfer_desc_encode(const k3_xfer_desc_t *desc, uint8_t **out, size_t *out_len);

/* Parses bytes produced by k3_xfer_desc_encode. On success *out is a new descriptor (free with
 * k3_xfer_desc_free). Returns K3_EPROTO (message in err) for any malformed input, K3_ENOMEM. */
int k3_xfer_desc_decode(const uint8_t *buf, size_t len, k3_xfer_desc_t **out, char *err,
                        size_t errlen);

/* Deep copy (new descriptor, free with k3_xfer_desc_free). Returns 0 or K3_ENOMEM. */
int k3_xfer_desc_clone(const k3_xfer_desc_t *src, k3_xfer_desc_t **out);

/* Allocates an empty descriptor (all counts zero); free with k3_xfer_desc_free. NULL on OOM. */
k3_xfer_desc_t *k3_xfer_desc_new(void);
/* Frees the descriptor and everything it owns. NULL is a no-op. */
void k3_xfer_desc_free(k3_xfer_desc_t *desc);

/* Total bytes of all regions. */
uint64_t k3_xfer_desc_total_bytes(const k3_xfer_desc_t *desc);

/* Byte offset (from the pool base) of region byte `off` (= offset + idx[off / unit] * stride +
 * off % unit), and how many region bytes are contiguous from there (to the end of that unit or
 * of the region). The descriptor must be valid and off < len_bytes. */
void k3_xfer_region_locate(const k3_xfer_desc_t *desc, uint32_t region, uint64_t off,
                           uint64_t *pool_off, uint64_t *contig);

#endif
