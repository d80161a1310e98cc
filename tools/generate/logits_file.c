/* Writer of the --logits-out file (format in logits_file.h). */
#include <string.h>

#include "k3pd/err.h"
#include "logits_file.h"

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int write_header(lf_t *lf) {
  unsigned char h[32];
  memcpy(h, "K3LOGITS", 8);
  put_u32(h + 8, 1);
  put_u32(h + 12, 32);
  put_u64(h + 16, lf->vocab);
  put_u64(h + 24, lf->rows);
  if (fseek(lf->fp, 0, SEEK_SET) || fwrite(h, 1, 32, lf->fp) != 32) return K3_EIO;
  return 0;
}

int lf_open(lf_t *lf, const char *path, uint64_t vocab) {
  memset(lf, 0, sizeof *lf);
  lf->fp = fopen(path, "wb");
  if (!lf->fp) return K3_EIO;
  lf->vocab = vocab;
  return write_header(lf);
}

int lf_write_rows(lf_t *lf, const float *rows, uint64_t n) {
  /* The host is little-endian (x86-64 / aarch64 Linux), so floats are written as they are. */
  if (fseek(lf->fp, 0, SEEK_END)) return K3_EIO;
  if (fwrite(rows, sizeof(float), (size_t)(n * lf->vocab), lf->fp) != (size_t)(n * lf->vocab))
    return K3_EIO;
  lf->rows += n;
  return 0;
}

int lf_close(lf_t *lf) {
  if (!lf->fp) return 0;
  int rc = write_header(lf);
  if (fclose(lf->fp) && !rc) rc = K3_EIO;
  lf->fp = NULL;
  return rc;
}
