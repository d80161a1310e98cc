/* Unit tests for the safetensors reader and streaming writer: a round trip through the writer,
 * every malformed single-file case (built in memory) and every malformed sharded-directory case
 * (built on disk). Each error must name the file and the tensor. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k3pd/err.h"
#include "k3pd/safetensors.h"
#include "k3pd/util.h"

/* [8-byte length][header][data_len bytes of 0xAB]; hlen_override != 0 replaces the length. */
static uint8_t *image(const char *hdr, size_t data_len, uint64_t hlen_override, size_t *len) {
  size_t hl = strlen(hdr);
  *len = 8 + hl + data_len;
  uint8_t *b = malloc(*len);
  uint64_t L = hlen_override ? hlen_override : hl;
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(L >> (8 * i));
  memcpy(b + 8, hdr, hl);
  memset(b + 8 + hl, 0xAB, data_len);
  return b;
}

static int open_img(const char *hdr, size_t data_len, uint64_t hlen_override, char *err, size_t errlen) {
  size_t len;
  uint8_t *b = image(hdr, data_len, hlen_override, &len);
  k3_st_t *st = NULL;
  int rc = k3_st_open_mem(b, len, "f.safetensors", &st, err, errlen);
  if (!rc) k3_st_close(st);
  else ck_assert_ptr_null(st);
  free(b);
  return rc;
}

#define EXPECT_BAD(hdr, dlen, needle)                                                    \
  do {                                                                                   \
    char e_[1024];                                                                       \
    ck_assert_int_eq(open_img(hdr, dlen, 0, e_, sizeof e_), K3_EFORMAT);                 \
    ck_assert_msg(strstr(e_, needle) && strstr(e_, "f.safetensors"), "got: %s", e_);     \
  } while (0)

START_TEST(test_mem_ok) {
  const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]},"
                  "\"c\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[16,16]}}";
  size_t len;
  uint8_t *b = image(h, 16, 0, &len);
  k3_st_t *st;
  char err[256];
  ck_assert_int_eq(k3_st_open_mem(b, len, "mem", &st, err, sizeof err), 0);
  ck_assert_uint_eq(k3_st_count(st), 3);
  const k3_tensor_view_t *a = k3_st_find(st, "a");
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->dtype, K3_DT_BF16);
  ck_assert_int_eq(a->ndim, 2);
  ck_assert_int_eq(a->shape[1], 3);
  ck_assert_int_eq(a->strides[0], 3);
  ck_assert_int_eq(a->strides[1], 1);
  ck_assert_uint_eq(a->nbytes, 12);
  ck_assert_ptr_eq(a->data, b + 8 + strlen(h));
  const k3_tensor_view_t *s = k3_st_find(st, "b");
  ck_assert_int_eq(s->ndim, 0);
  ck_assert_int_eq(k3_tensor_numel(s), 1);
  ck_assert_str_eq(k3_st_metadata(st, "format"), "pt");
  ck_assert_ptr_null(k3_st_find(st, "zzz"));
  ck_assert_uint_eq(k3_st_total_bytes(st), 16);
  k3_st_close(st);
  free(b);
}
END_TEST

START_TEST(test_mem_malformed) {
  char e[512];
  /* truncated header: fewer than 8 bytes */
  k3_st_t *st = NULL;
  uint8_t four[4] = {1, 0, 0, 0};
  ck_assert_int_eq(k3_st_open_mem(four, 4, "f.safetensors", &st, e, sizeof e), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(e, "f.safetensors: truncated header"));
  /* header length beyond file */
  ck_assert_int_eq(open_img("{}", 0, 1000, e, sizeof e), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(e, "header length 1000 beyond file size 10"));
  ck_assert_int_eq(open_img("{}", 0, UINT64_MAX, e, sizeof e), K3_EFORMAT);
  /* header cut in the middle of the JSON */
  EXPECT_BAD("{\"a\":{\"dtype\":\"BF16\",", 0, "bad JSON");
  EXPECT_BAD("[1,2]", 0, "not an object");
  EXPECT_BAD("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'a': unsupported dtype 'Q4'");
  EXPECT_BAD("{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4, "tensor 'a': BF16 shape needs 6 bytes but data_offsets span 4");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3, "tensor 'a': data_offsets [0, 4] out of range");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 8, "tensor 'a': data_offsets [4, 0] out of range");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
             8, "overlaps");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
             8, "duplicate object key");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "tensor 'a': shape[0]");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "tensor 'a': 9 dims");
  EXPECT_BAD("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "tensor 'a'");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "tensor 'a': data_offsets must be");
  EXPECT_BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, "tensor 'a': unexpected key 'x'");
  EXPECT_BAD("{\"a\":7}", 0, "tensor 'a': header entry is not an object");
  EXPECT_BAD("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value 'k'");
}
END_TEST

static char g_dir[256];

static void mkdir_tmp(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/k3st.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

/* Writes a shard with the given tensors (U8 [n] each, value = index byte) through the writer. */
static void write_shard(const char *file, const char *const *names, const int *sizes, int n) {
  char path[512], err[256];
  snprintf(path, sizeof path, "%s/%s", g_dir, file);
  k3_st_decl_t d[8];
  for (int i = 0; i < n; i++) d[i] = (k3_st_decl_t){names[i], K3_DT_U8, 1, {sizes[i]}};
  k3_st_writer_t *w;
  ck_assert_int_eq(k3_st_writer_open(path, d, (size_t)n, NULL, 0, &w, err, sizeof err), 0);
  for (int i = 0; i < n; i++) {
    uint8_t buf[64];
    memset(buf, i + 1, sizeof buf);
    /* two chunks per tensor to exercise chunking */
    ck_assert_int_eq(k3_st_writer_write(w, buf, 1, err, sizeof err), 0);
    ck_assert_int_eq(k3_st_writer_write(w, buf, (size_t)sizes[i] - 1, err, sizeof err), 0);
  }
  ck_assert_int_eq(k3_st_writer_close(w, err, sizeof err), 0);
}

static void write_index(const char *json) {
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", g_dir);
  ck_assert_int_eq(k3_write_file(path, json, strlen(json)), 0);
}

static int open_dir(char *err, size_t errlen) {
  k3_st_t *st = NULL;
  int rc = k3_st_open(g_dir, &st, err, errlen);
  if (!rc) {
    ck_assert_uint_eq(k3_st_count(st), 3);
    const k3_tensor_view_t *v = k3_st_find(st, "y");
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(v->nbytes, 5);
    ck_assert_uint_eq(((const uint8_t *)v->data)[4], 2);
    ck_assert_ptr_nonnull(strstr(k3_st_file_of(st, "z"), "s2.safetensors"));
    ck_assert_str_eq(k3_st_metadata(st, "total_size"), "17");
    k3_st_close(st);
  }
  return rc;
}

static const char *const N1[] = {"x", "y"};
static const int S1[] = {4, 5};
static const char *const N2[] = {"z"};
static const int S2[] = {8};
#define GOOD_INDEX "{\"metadata\":{\"total_size\":17},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\",\"z\":\"s2.safetensors\"}}"

START_TEST(test_dir_ok_and_bad) {
  char err[1024];
  mkdir_tmp();
  write_shard("s1.safetensors", N1, S1, 2);
  write_shard("s2.safetensors", N2, S2, 1);
  write_index(GOOD_INDEX);
  ck_assert_msg(open_dir(err, sizeof err) == 0, "%s", err);

  /* tensor listed in index but missing from its shard */
  write_index("{\"metadata\":{\"total_size\":17},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\",\"z\":\"s2.safetensors\",\"q\":\"s2.safetensors\"}}");
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "tensor 'q' listed for shard s2.safetensors is missing from it"));
  /* tensor in a shard but not in the index */
  write_index("{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s2.safetensors\"}}");
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "tensor 'y' is not listed"));
  /* missing shard */
  write_index("{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\",\"z\":\"s3.safetensors\"}}");
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "missing shard"));
  ck_assert_ptr_nonnull(strstr(err, "s3.safetensors"));
  ck_assert_ptr_nonnull(strstr(err, "'z'"));
  /* path traversal in a shard name */
  write_index("{\"weight_map\":{\"x\":\"../s1.safetensors\"}}");
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "bad shard file name"));
  /* total_size mismatch */
  write_index("{\"metadata\":{\"total_size\":99},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\",\"z\":\"s2.safetensors\"}}");
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "total_size 99"));
  /* bad index JSON */
  write_index("{\"weight_map\":");
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "model.safetensors.index.json: bad JSON"));
  /* duplicate tensor across shards */
  static const char *const N3[] = {"x"};
  static const int S3[] = {8};
  write_shard("s2.safetensors", N3, S3, 1);
  write_index(GOOD_INDEX);
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "duplicate tensor 'x'"));
  /* truncated shard file on disk */
  write_shard("s2.safetensors", N2, S2, 1);
  char p[512];
  snprintf(p, sizeof p, "%s/s2.safetensors", g_dir);
  ck_assert_int_eq(truncate(p, 20), 0);
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "s2.safetensors: header length"));
  ck_assert_int_eq(truncate(p, 3), 0);
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "truncated header"));
  ck_assert_int_eq(truncate(p, 0), 0);
  ck_assert_int_eq(open_dir(err, sizeof err), K3_EFORMAT);
  /* empty directory */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  ck_assert_int_eq(system(cmd), 0);
  mkdir_tmp();
  ck_assert_int_eq(open_dir(err, sizeof err), K3_ENOENT);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_writer_errors) {
  char err[512], path[512];
  mkdir_tmp();
  snprintf(path, sizeof path, "%s/w.safetensors", g_dir);
  k3_st_decl_t d[2] = {{"a", K3_DT_F32, 2, {2, 2}}, {"a", K3_DT_F32, 1, {1}}};
  k3_st_writer_t *w = NULL;
  ck_assert_int_eq(k3_st_writer_open(path, d, 2, NULL, 0, &w, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "tensor 'a': declared twice"));
  d[1].dtype = K3_DT_INVALID;
  d[1].name = "b";
  ck_assert_int_eq(k3_st_writer_open(path, d, 2, NULL, 0, &w, err, sizeof err), K3_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "tensor 'b': bad declaration"));
  ck_assert_int_eq(k3_st_writer_open(path, d, 1, NULL, 0, &w, err, sizeof err), 0);
  float f[5] = {1, 2, 3, 4, 5};
  ck_assert_int_eq(k3_st_writer_write(w, f, 20, err, sizeof err), K3_EINVAL);
  ck_assert_int_eq(k3_st_writer_write(w, f, 8, err, sizeof err), 0);
  ck_assert_int_eq(k3_st_writer_close(w, err, sizeof err), K3_EINVAL); /* 8 of 16 bytes */
  ck_assert_int_eq(access(path, F_OK), -1);
  char tmp[520];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  ck_assert_int_eq(access(tmp, F_OK), -1);
  /* a complete file round-trips through the reader, header padded to 8 */
  ck_assert_int_eq(k3_st_writer_open(path, d, 1, (const char *const[]){"format", "pt"}, 1, &w, err, sizeof err), 0);
  ck_assert_int_eq(k3_st_writer_write(w, f, 16, err, sizeof err), 0);
  ck_assert_int_eq(k3_st_writer_close(w, err, sizeof err), 0);
  k3_st_t *st;
  ck_assert_int_eq(k3_st_open(path, &st, err, sizeof err), 0);
  const k3_tensor_view_t *v = k3_st_find(st, "a");
  ck_assert(((const float *)v->data)[3] == 4.0f);
  ck_assert_uint_eq(((uintptr_t)v->data) % 8, 0);
  ck_assert_str_eq(k3_st_metadata(st, "format"), "pt");
  k3_st_close(st);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_dtypes) {
  ck_assert_int_eq(k3_dtype_parse("BF16"), K3_DT_BF16);
  ck_assert_int_eq(k3_dtype_parse("I64"), K3_DT_I64);
  ck_assert_int_eq(k3_dtype_parse("bf16"), K3_DT_INVALID);
  ck_assert_uint_eq(k3_dtype_size(K3_DT_F16), 2);
  ck_assert_uint_eq(k3_dtype_size(K3_DT_I32), 4);
  ck_assert_uint_eq(k3_dtype_size(K3_DT_INVALID), 0);
  ck_assert_str_eq(k3_dtype_name(K3_DT_U8), "U8");
}
END_TEST

int main(void) {
  Suite *s = suite_create("ckpt_safetensors");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_mem_ok);
  tcase_add_test(tc, test_mem_malformed);
  tcase_add_test(tc, test_dir_ok_and_bad);
  tcase_add_test(tc, test_writer_errors);
  tcase_add_test(tc, test_dtypes);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
