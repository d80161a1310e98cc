/* The chunk table of a device digest job (k3k_xdev, kernels/cuda/xdev.cu): how a job's regions,
 * given as segments, are cut into the 4096-byte chunks of the K3 digest (k3pd/digest.h), in a
 * form a GPU warp can find its chunk in.
 *
 * What it is for: the host plans, the device reads. One warp hashes (and copies) one chunk; the
 * table must stay small for the common layouts (a 6 MiB KDA state is one segment: one entry,
 * not 1536) so that it travels as a kernel parameter, and must still describe any layout
 * (segments of 1 byte, chunks spread over many segments). So it has two kinds of entries:
 *   - a RUN: n consecutive chunks that lie inside one segment (chunk k of the run starts at
 *     src + 4096 k; all are 4096 bytes long but the last, `len` bytes);
 *   - a MULTI chunk: one chunk made of n >= 2 pieces of consecutive segments, listed as piece
 *     entries after the groups.
 * Groups are sorted by their first chunk id (chunk ids are global over the job: region r owns
 * ids region_chunk[r] .. region_chunk[r+1]-1), so a warp finds its group by searching `chunk`.
 * What it is not: the kernels (kernels/core/xxh3_warp.h, xxh3_half.h + kernels/cuda/xdev_kernels.cu)
 * or the job API.
 * Invariants: empty segments are skipped (never a piece); every chunk is 1..4096 bytes; a RUN's
 * VEC flag means src and dst (when set) are 16-byte aligned; a MULTI's VEC flag means every
 * piece's src/dst is 16-byte aligned and every piece but the last has a length that is a
 * multiple of 16, so no 16-byte unit of the chunk straddles two pieces.
 * Plain C (built into k3_kernels on every host): the CPU emulation test plans with it too. */
#ifndef K3K_XDEV_PLAN_H
#define K3K_XDEV_PLAN_H

#include <stdint.h>

#include "k3k_xdev.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3K_XENT_MULTI 1u  /* the group is one chunk of several pieces */
#define K3K_XENT_VEC 2u    /* 16-byte units can be loaded and stored whole */
#define K3K_XENT_DST 4u    /* some piece of the group is copied (dst set) */

/* One table entry (32 bytes; groups first, then pieces).
 *   RUN group:   src, dst (0: not copied) of its first chunk; chunk = first chunk id;
 *                n = chunks in the run; len = bytes of its LAST chunk (1..4096).
 *   MULTI group: src = table index of its first piece; dst unused; chunk = its chunk id;
 *                n = pieces (>= 2); len = bytes of the chunk.
 *   piece:       src, dst (0: not copied) of the piece; len = its bytes; chunk, n, flags 0. */
typedef struct {
  uint64_t src;
  uint64_t dst;
  uint32_t chunk;
  uint32_t n;
  uint32_t len;
  uint32_t flags;
} k3k_xent;

/* Jobs are limited to 2^31 chunks (8 TiB), so chunk ids and warp indices fit 32 bits. */
#define K3K_XPLAN_MAX_CHUNKS (1ull << 31)

typedef struct {
  uint64_t n_chunks; /* chunks over all regions */
  uint64_t n_groups; /* RUN and MULTI entries */
  uint64_t n_pieces; /* piece entries (after the groups) */
} k3k_xplan_size_t;

/* Pass 1: the sizes of the job's table. The arguments must have passed k3k_xdev_check. */
void k3k_xplan_measure(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                       k3k_xplan_size_t *sz);
/* Pass 2: writes the n_groups + n_pieces entries to ent and the n_regions + 1 first chunk ids
 * to region_chunk. sz is pass 1's answer for the same arguments. */
void k3k_xplan_fill(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions,
                    const k3k_xplan_size_t *sz, k3k_xent *ent, uint32_t *region_chunk);

/* Validates a job's arguments (k3k_xdev_submit's contract): first[0] == 0 and non-decreasing,
 * segs present when there are segments, every non-empty segment with a src, no address range
 * wrapping, dst never overlapping its own src, at most K3K_XPLAN_MAX_CHUNKS chunks in all.
 * Returns 0 or K3_EINVAL (logged at debug level only: the caller decides). */
int k3k_xdev_check(const k3k_xseg_t *segs, const uint32_t *first, uint32_t n_regions);

#ifdef __cplusplus
}
#endif

#endif
