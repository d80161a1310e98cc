/* Segment layouts for the k3k_xdev tests: the host unit test, the warp emulation test (both
 * here) and the GPU program (tests/gpu/gpu_xdev.c) draw jobs from the same generators and
 * check them the same way.
 *
 * A layout places every segment in two arenas by offset: a source arena and a destination
 * arena in which every copied segment sits between guard bytes (a position-dependent pattern,
 * so a stray or shifted write shows). The expected destination arena is the pattern with the
 * sources copied in; the expected digests are k3_digest_bytes over each region's concatenated
 * stream (the definition, independent of the segment structure).
 * Ownership: xl_free releases what a layout allocated. */
#ifndef XDEV_LAYOUTS_H
#define XDEV_LAYOUTS_H

#include <stdbool.h>
#include <stdint.h>

#include "k3k_xdev.h"

#define XL_NO_DST UINT64_MAX

typedef struct {
  uint64_t src_off; /* in the source arena */
  uint64_t dst_off; /* in the destination arena, XL_NO_DST: not copied */
  uint64_t len;
} xl_seg;

typedef struct {
  xl_seg *segs;
  uint32_t n_segs, seg_cap;
  uint32_t *first; /* [n_regions + 1] */
  uint32_t n_regions, reg_cap;
  uint64_t src_bytes, dst_bytes; /* arena sizes the layout needs */
  char name[80];
} xl_layout;

uint64_t xl_rng(uint64_t *s);
void xl_init(xl_layout *L, const char *name);
void xl_free(xl_layout *L);
/* Starts a region; segments added next belong to it. */
void xl_region(xl_layout *L);
/* Appends a segment of len bytes: its source at a 16-byte boundary plus src_mis (0..15), its
 * destination (when copy) at a 16-byte boundary plus dst_mis, with at least 32 guard bytes on
 * either side (dst_bytes includes the guard after the last one). */
void xl_seg_add(xl_layout *L, uint64_t len, unsigned src_mis, bool copy, unsigned dst_mis);

/* A random layout: 1..5 regions mixing empty regions, regions of 1..3 bytes (some split into
 * 1-byte segments, with empty segments between), single segments of the edge lengths (240,
 * 241, 4095, 4096, 4097, ...), many short segments (chunks spanning several), page-sized
 * segments (2560, 18432), random lengths; aligned or not; some segments copied. */
void xl_random(xl_layout *L, uint64_t *rng, bool copy);
/* One region per call argument set: n_regions regions of n_pages segments of page_bytes. */
void xl_pages(xl_layout *L, uint32_t n_regions, uint32_t n_pages, uint64_t page_bytes, bool copy);
/* One 8K-token K3 sequence (~645 MiB): 69 KDA layers x (S 6,291,456 B + conv q, k, v 73,728 B
 * each, one region each) + 24 MLA layers of 8192 tokens x 1152 B in 128 pages of 64 tokens (one
 * region of 128 segments each). */
void xl_seq8k(xl_layout *L, bool copy);

/* Segments for a job over the given arenas (dst_base may be NULL when nothing is copied).
 * Returns a malloc'd array of n_segs (the caller frees it). */
k3k_xseg_t *xl_segs(const xl_layout *L, const void *src_base, void *dst_base);
/* The region digests by definition (k3_digest_bytes of each region's stream). */
void xl_reference(const xl_layout *L, const uint8_t *src, uint64_t *digests);
/* Fills an arena with random bytes / the guard pattern. */
void xl_fill_random(uint8_t *p, uint64_t n, uint64_t seed);
void xl_fill_guard(uint8_t *p, uint64_t n);
/* The destination arena as it must be after the job: the guard pattern with every copied
 * segment's source bytes in place. Returns the first differing offset, or UINT64_MAX. */
uint64_t xl_check_dst(const xl_layout *L, const uint8_t *src, const uint8_t *dst);
uint64_t xl_region_bytes(const xl_layout *L, uint32_t r);

#endif
