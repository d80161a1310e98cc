/* Descriptor codec (v2): round trip, strict rejection of truncated/corrupted bytes, validation
 * of the region addressing (pool.base + off + idx[b / unit] * stride + b % unit) in overflow-free
 * arithmetic, pools with memory types, optional rkeys and mapping blobs, the flags (PULL known,
 * other bits refused). Also the wire v5 messages that carry or depend on it: SRC (a descriptor of
 * the sender's sources) and the PULL flag of LAYER/DONE. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "k3pd/xfer_desc.h"
#include "wire.h"

static k3_xfer_desc_t *mk(void) {
  k3_xfer_desc_t *d = k3_xfer_desc_new();
  d->request_id = 0x1122334455667788ull;
  d->epoch = 42;
  d->lease_expiry_ms = 1700000000123;
  d->fingerprint = 0xfeedfacecafebeefull;
  d->worker_addr_len = 37;
  d->worker_addr = malloc(37);
  for (int i = 0; i < 37; i++) d->worker_addr[i] = (uint8_t)(i * 7);
  /* Pool 0: host, page-major (1000 pages of 2048 B), rkey, no blob. Pool 1: device, slot
   * pools of 40 slots x 8960 B, no rkey, a mapping blob. */
  d->n_pools = 2;
  for (int p = 0; p < 2; p++) {
    d->pools[p].base_addr = 0x7f0000000000ull + (uint64_t)p * 0x10000000ull;
    d->pools[p].size_bytes = p ? 40 * 8960 : 1000 * 2048;
    d->pools[p].mem = p ? K3_XFER_MEM_CUDA : K3_XFER_MEM_HOST;
  }
  d->pools[0].rkey_len = 12;
  d->pools[0].rkey = malloc(12);
  memset(d->pools[0].rkey, 0xA0, 12);
  d->pools[1].blob_len = 21;
  d->pools[1].blob = malloc(21);
  memcpy(d->pools[1].blob, "/proc/1234/fd/7 36000", 21);
  d->n_lists = 2;
  uint32_t pages[] = {5, 6, 7, 100, 3, 4, 999};
  d->lists[0].n = 7;
  d->lists[0].idx = malloc(sizeof pages);
  memcpy(d->lists[0].idx, pages, sizeof pages);
  d->lists[1].n = 1;
  d->lists[1].idx = malloc(4);
  d->lists[1].idx[0] = 39;
  d->n_regions = 3;
  d->regions = calloc(3, sizeof(k3_xfer_region_t));
  d->regions[0] = (k3_xfer_region_t){K3_XFER_KIND_MLA_KV, 0, 0, 2, 1024, 2048, 1024, 6 * 1024 + 64};
  d->regions[1] = (k3_xfer_region_t){K3_XFER_KIND_KDA_S, 1, 1, 0, 4480, 8960, 4096, 4096};
  d->regions[2] = (k3_xfer_region_t){K3_XFER_KIND_KDA_CONV, 1, 1, 1, 8576, 8960, 384, 384};
  return d;
}

START_TEST(test_roundtrip) {
  k3_xfer_desc_t *d = mk();
  char err[200] = "";
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), 0);
  ck_assert_uint_eq(d->n_layers, 3);
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), 0);
  k3_xfer_desc_t *e = NULL;
  ck_assert_int_eq(k3_xfer_desc_decode(buf, len, &e, err, sizeof err), 0);
  ck_assert_uint_eq(e->request_id, d->request_id);
  ck_assert_uint_eq(e->epoch, 42);
  ck_assert_int_eq(e->lease_expiry_ms, d->lease_expiry_ms);
  ck_assert_uint_eq(e->fingerprint, d->fingerprint);
  ck_assert_uint_eq(e->worker_addr_len, 37);
  ck_assert_mem_eq(e->worker_addr, d->worker_addr, 37);
  ck_assert_uint_eq(e->n_pools, 2);
  for (int p = 0; p < 2; p++) {
    ck_assert_uint_eq(e->pools[p].base_addr, d->pools[p].base_addr);
    ck_assert_uint_eq(e->pools[p].size_bytes, d->pools[p].size_bytes);
    ck_assert_uint_eq(e->pools[p].mem, d->pools[p].mem);
    ck_assert_uint_eq(e->pools[p].rkey_len, d->pools[p].rkey_len);
    if (d->pools[p].rkey_len) ck_assert_mem_eq(e->pools[p].rkey, d->pools[p].rkey, d->pools[p].rkey_len);
    ck_assert_uint_eq(e->pools[p].blob_len, d->pools[p].blob_len);
    if (d->pools[p].blob_len) ck_assert_mem_eq(e->pools[p].blob, d->pools[p].blob, d->pools[p].blob_len);
  }
  ck_assert_ptr_null(e->pools[0].blob);
  ck_assert_ptr_null(e->pools[1].rkey);
  ck_assert_uint_eq(e->lists[0].n, 7);
  ck_assert_mem_eq(e->lists[0].idx, d->lists[0].idx, 7 * 4);
  ck_assert_uint_eq(e->lists[1].idx[0], 39);
  ck_assert_mem_eq(e->regions, d->regions, 3 * sizeof(k3_xfer_region_t));
  ck_assert_uint_eq(e->n_layers, 3);
  ck_assert_uint_eq(k3_xfer_desc_total_bytes(e), 6 * 1024 + 64 + 4096 + 384);
  /* Addressing: byte 1024*3+5 of region 0 is in the 4th page (index 100). */
  uint64_t off, contig;
  k3_xfer_region_locate(e, 0, 3 * 1024 + 5, &off, &contig);
  ck_assert_uint_eq(off, 100ull * 2048 + 1024 + 5);
  ck_assert_uint_eq(contig, 1024 - 5);
  k3_xfer_region_locate(e, 0, 6 * 1024 + 10, &off, &contig);
  ck_assert_uint_eq(off, 999ull * 2048 + 1024 + 10);
  ck_assert_uint_eq(contig, 54);
  /* Clone is deep and equal. */
  k3_xfer_desc_t *c;
  ck_assert_int_eq(k3_xfer_desc_clone(e, &c), 0);
  ck_assert_ptr_ne(c->regions, e->regions);
  uint8_t *buf2;
  size_t len2;
  ck_assert_int_eq(k3_xfer_desc_encode(c, &buf2, &len2), 0);
  ck_assert_uint_eq(len2, len);
  ck_assert_mem_eq(buf2, buf, len);
  free(buf);
  free(buf2);
  k3_xfer_desc_free(c);
  k3_xfer_desc_free(e);
  k3_xfer_desc_free(d);
}
END_TEST

START_TEST(test_compact_runs) {
  /* 1M tokens of contiguous pages: the index list costs one run. */
  k3_xfer_desc_t *d = mk();
  free(d->lists[0].idx);
  d->lists[0].n = 16384;
  d->lists[0].idx = malloc(16384 * 4);
  for (uint32_t i = 0; i < 16384; i++) d->lists[0].idx[i] = 2000 + i;
  d->pools[0].size_bytes = 20000ull * 2048;
  d->regions[0].len_bytes = 16384ull * 1024;
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), 0);
  ck_assert_uint_lt(len, 400);
  k3_xfer_desc_t *e;
  ck_assert_int_eq(k3_xfer_desc_decode(buf, len, &e, NULL, 0), 0);
  ck_assert_uint_eq(e->lists[0].idx[16383], 2000 + 16383);
  free(buf);
  k3_xfer_desc_free(e);
  k3_xfer_desc_free(d);
}
END_TEST

START_TEST(test_truncated_and_corrupt) {
  k3_xfer_desc_t *d = mk();
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), 0);
  k3_xfer_desc_t *e = NULL;
  char err[200];
  for (size_t n = 0; n < len; n++) { /* every truncation */
    e = NULL;
    ck_assert_int_eq(k3_xfer_desc_decode(buf, n, &e, err, sizeof err), K3_EPROTO);
    ck_assert_ptr_null(e);
  }
  uint8_t *cp = malloc(len + 1);
  for (size_t i = 0; i < len; i++) { /* every single-byte corruption */
    memcpy(cp, buf, len);
    cp[i] ^= 0x5a;
    ck_assert_int_eq(k3_xfer_desc_decode(cp, len, &e, err, sizeof err), K3_EPROTO);
  }
  /* A trailing byte, even with a recomputed checksum, is rejected by the parser. */
  memcpy(cp, buf, len - 8);
  cp[len - 8] = 0;
  uint64_t h = k3_hash64(cp, len - 7, 0);
  memcpy(cp + len - 7, &h, 8);
  ck_assert_int_eq(k3_xfer_desc_decode(cp, len + 1, &e, err, sizeof err), K3_EPROTO);
  ck_assert_ptr_nonnull(strstr(err, "trailing"));
  /* A well-formed message whose region points outside its pool fails validation by name:
   * patch region 0's pool from 0 to 1 (index 999 reaches far beyond pool 1's 358,400 bytes). */
  memcpy(cp, buf, len);
  size_t regs = len - 8 - 3 * 48; /* regions are the last 3*48 bytes before the checksum */
  uint32_t one = 1;
  memcpy(cp + regs + 4, &one, 4);
  h = k3_hash64(cp, len - 8, 0);
  memcpy(cp + len - 8, &h, 8);
  ck_assert_int_eq(k3_xfer_desc_decode(cp, len, &e, err, sizeof err), K3_EPROTO);
  ck_assert_ptr_nonnull(strstr(err, "region 0"));
  free(cp);
  free(buf);
  k3_xfer_desc_free(d);
}
END_TEST

START_TEST(test_validate_errors) {
  char err[200];
  k3_xfer_desc_t *d = mk();
  d->regions[1].len_bytes = 4097; /* more than one slot's unit */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "region 1"));
  d->regions[1].len_bytes = 4096;
  d->regions[0].len_bytes = 5 * 1024; /* leaves the 7th page unused */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  d->regions[0].len_bytes = 6 * 1024 + 64;
  d->regions[0].stride_bytes = 1023; /* units of 7 pages would overlap */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "stride"));
  d->regions[0].stride_bytes = 2048;
  d->regions[2].stride_bytes = 0; /* one slot: any stride, even 0 */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), 0);
  d->regions[2].stride_bytes = 8960;
  d->regions[2].offset_bytes = 8960 - 383; /* slot 39's conv would end 1 byte past the pool */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "size"));
  d->regions[2].offset_bytes = 8576;
  d->lists[1].idx[0] = 40; /* slot 40 of a 40-slot pool */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "index 40"));
  d->lists[1].idx[0] = 39;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), 0);
  /* Overflow: off + idx*stride + unit computed in 128 bits, never wrapping into range. */
  d->regions[0].stride_bytes = 1ull << 62; /* 999 * 2^62 wraps 64 bits */
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  d->regions[0].stride_bytes = 2048;
  d->regions[1].offset_bytes = UINT64_MAX - 100;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  d->regions[1].offset_bytes = 4480;
  d->pools[1].base_addr = UINT64_MAX - 1000;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "pool 1"));
  d->pools[1].base_addr = 0x7f0010000000ull;
  d->pools[1].mem = 7;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "mem"));
  d->pools[1].mem = K3_XFER_MEM_CUDA;
  d->pools[1].blob_len = K3_XFER_MAX_BLOB_BYTES + 1;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "blob"));
  d->pools[1].blob_len = 21;
  d->pools[0].size_bytes = 0;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  d->pools[0].size_bytes = 1000 * 2048;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), 0);
  uint8_t *buf;
  size_t len;
  d->n_pools = 0;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), K3_EINVAL);
  d->n_pools = 2;
  k3_xfer_desc_free(d);
}
END_TEST

/* An arena: every layer's pool is its own [n, bytes] tensor at its own offset inside ONE
 * allocation; regions point straight into it (off = tensor offset, stride = row bytes). */
START_TEST(test_arena_layout) {
  k3_xfer_desc_t *d = mk();
  d->n_pools = 1;
  free(d->pools[1].blob);
  d->pools[1] = (k3_xfer_pool_desc_t){0};
  /* layer-2 MLA tensor: 1000 pages x 2048 B at 0; KDA S tensor: 40 x 4096 at 2,048,000; conv:
   * 40 x 384 at 2,211,840; arena 2,227,200 B. */
  d->pools[0].size_bytes = 2048000 + 40 * 4096 + 40 * 384;
  d->regions[0] = (k3_xfer_region_t){K3_XFER_KIND_MLA_KV, 0, 0, 2, 0, 2048, 2048, 6 * 2048 + 64};
  d->regions[1] = (k3_xfer_region_t){K3_XFER_KIND_KDA_S, 0, 1, 0, 2048000, 4096, 4096, 4096};
  d->regions[2] = (k3_xfer_region_t){K3_XFER_KIND_KDA_CONV, 0, 1, 1, 2048000 + 40 * 4096, 384, 384, 384};
  char err[200];
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), 0);
  uint64_t off, contig;
  k3_xfer_region_locate(d, 0, 3 * 2048 + 5, &off, &contig); /* 4th page = index 100 */
  ck_assert_uint_eq(off, 100ull * 2048 + 5);
  ck_assert_uint_eq(contig, 2048 - 5);
  k3_xfer_region_locate(d, 2, 10, &off, &contig); /* slot 39's conv row */
  ck_assert_uint_eq(off, 2048000 + 40 * 4096 + 39 * 384 + 10);
  ck_assert_uint_eq(contig, 374);
  /* The last conv row ends exactly at the arena's end; one byte less is refused. */
  d->pools[0].size_bytes--;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "region 2"));
  d->pools[0].size_bytes++;
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), 0);
  k3_xfer_desc_t *e;
  ck_assert_int_eq(k3_xfer_desc_decode(buf, len, &e, err, sizeof err), 0);
  ck_assert_mem_eq(e->regions, d->regions, 3 * sizeof(k3_xfer_region_t));
  free(buf);
  k3_xfer_desc_free(e);
  k3_xfer_desc_free(d);
}
END_TEST

/* Bytes a hostile peer might send: length fields beyond their limits are refused by name
 * before anything is allocated, even with a valid checksum. */
START_TEST(test_hostile_lengths) {
  k3_xfer_desc_t *d = mk();
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), 0);
  /* Pool 0 starts after magic..fingerprint (40 B), worker_addr (4 + 37) and n_pools (4):
   * base u64, size u64, mem u32, rkey_len u32 @ +20. */
  size_t pool0 = 40 + 4 + 37 + 4;
  struct {
    size_t at;
    uint32_t val;
    const char *field;
  } cases[] = {
      {pool0 + 16, 2, "pool.mem"},
      {pool0 + 20, K3_XFER_MAX_RKEY_BYTES + 1, "pool.rkey"},
      {pool0 + 20, 0xffffffffu, "pool.rkey"},
      {pool0 + 24 + 12, K3_XFER_MAX_BLOB_BYTES + 1, "pool.blob"}, /* pool 0's blob_len */
  };
  uint8_t *cp = malloc(len);
  char err[200];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    memcpy(cp, buf, len);
    memcpy(cp + cases[c].at, &cases[c].val, 4);
    uint64_t h = k3_hash64(cp, len - 8, 0);
    memcpy(cp + len - 8, &h, 8);
    k3_xfer_desc_t *e = NULL;
    ck_assert_int_eq(k3_xfer_desc_decode(cp, len, &e, err, sizeof err), K3_EPROTO);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(err, cases[c].field), "case %zu: '%s' does not name %s", c, err, cases[c].field);
  }
  free(cp);
  free(buf);
  k3_xfer_desc_free(d);
}
END_TEST

/* Flags: PULL round-trips; an unknown bit is refused by validate (encode) and by decode, even
 * with a valid checksum (what an older decoder does with a newer descriptor). */
START_TEST(test_flags) {
  k3_xfer_desc_t *d = mk();
  d->flags = K3_XFER_DESC_F_PULL;
  uint8_t *buf;
  size_t len;
  char err[200] = "";
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), 0);
  k3_xfer_desc_t *e = NULL;
  ck_assert_int_eq(k3_xfer_desc_decode(buf, len, &e, err, sizeof err), 0);
  ck_assert_uint_eq(e->flags, K3_XFER_DESC_F_PULL);
  k3_xfer_desc_t *c;
  ck_assert_int_eq(k3_xfer_desc_clone(e, &c), 0);
  ck_assert_uint_eq(c->flags, K3_XFER_DESC_F_PULL);
  k3_xfer_desc_free(c);
  k3_xfer_desc_free(e);
  buf[6] = 2; /* flags u16 at byte 6: an unknown bit */
  uint64_t h = k3_hash64(buf, len - 8, 0);
  memcpy(buf + len - 8, &h, 8);
  e = NULL;
  ck_assert_int_eq(k3_xfer_desc_decode(buf, len, &e, err, sizeof err), K3_EPROTO);
  ck_assert_ptr_null(e);
  ck_assert_msg(strstr(err, "flags") != NULL, "%s", err);
  free(buf);
  d->flags = 4;
  ck_assert_int_eq(k3_xfer_desc_validate(d, err, sizeof err), K3_EINVAL);
  ck_assert_msg(strstr(err, "flags") != NULL, "%s", err);
  ck_assert_int_eq(k3_xfer_desc_encode(d, &buf, &len), K3_EINVAL);
  k3_xfer_desc_free(d);
}
END_TEST

/* SRC: header + descriptor, strict lengths, the version checked; LAYER/DONE carry PULL. */
START_TEST(test_wire_src) {
  k3_xfer_desc_t *d = mk();
  uint8_t *enc;
  size_t n;
  ck_assert_int_eq(k3_xfer_desc_encode(d, &enc, &n), 0);
  size_t len;
  uint8_t *b = xf_src_encode(77, enc, (uint32_t)n, &len);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(len, XF_SRC_HDR + n);
  ck_assert_uint_eq(xf_wire_type(b, len), 5);
  xf_src_t m;
  ck_assert_int_eq(xf_src_decode(b, len, &m), 0);
  ck_assert_uint_eq(m.send_id, 77);
  ck_assert_uint_eq(m.desc_len, n);
  ck_assert_mem_eq(m.desc, enc, n);
  /* every truncation and one extra byte are refused */
  for (size_t k = 0; k < len; k++) ck_assert_int_eq(xf_src_decode(b, k, &m), K3_EPROTO);
  uint8_t *big = malloc(len + 1);
  memcpy(big, b, len);
  big[len] = 0;
  ck_assert_int_eq(xf_src_decode(big, len + 1, &m), K3_EPROTO);
  free(big);
  /* another version (4: a peer without cuda-pull), another type, a reserved word set */
  uint8_t *x = malloc(len);
  for (int f = 0; f < 3; f++) {
    memcpy(x, b, len);
    if (f == 0) x[4] = 4;
    if (f == 1) x[6] = 3;
    if (f == 2) x[20] = 1;
    ck_assert_int_eq(xf_src_decode(x, len, &m), K3_EPROTO);
  }
  x[4] = 4;
  ck_assert_uint_eq(xf_wire_type(x, len), 0);
  free(x);
  free(b);
  free(enc);
  /* LAYER with digests and PULL, DONE with PULL */
  uint64_t dg[2] = {11, 22};
  xf_layer_t l = {.request_id = 1, .epoch = 2, .fingerprint = 3, .send_id = 4, .layer = 5, .n_digests = 2,
                  .n_layers = 1, .flags = XF_MSG_FLAG_PULL};
  b = xf_layer_encode(&l, dg, &len);
  xf_layer_t l2;
  ck_assert_int_eq(xf_layer_decode(b, len, &l2), 0);
  ck_assert_uint_eq(l2.flags, XF_MSG_FLAG_PULL);
  ck_assert_uint_eq(xf_wire_type(b, len), 3);
  free(b);
  uint8_t addr[3] = {1, 2, 3};
  xf_done_t dn = {.request_id = 1, .epoch = 2, .n_digests = 2, .addr_len = 3, .addr = addr, .flags = XF_MSG_FLAG_PULL};
  b = xf_done_encode(&dn, dg, &len);
  xf_done_t dn2;
  ck_assert_int_eq(xf_done_decode(b, len, &dn2), 0);
  ck_assert_uint_eq(dn2.flags, XF_MSG_FLAG_PULL);
  free(b);
  k3_xfer_desc_free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("xfer_desc");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_roundtrip);
  tcase_add_test(tc, test_compact_runs);
  tcase_add_test(tc, test_truncated_and_corrupt);
  tcase_add_test(tc, test_validate_errors);
  tcase_add_test(tc, test_arena_layout);
  tcase_add_test(tc, test_hostile_lengths);
  tcase_add_test(tc, test_flags);
  tcase_add_test(tc, test_wire_src);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? 1 : 0;
}
