/* The --logits-out file of k3pd-generate: float32 logits of every position computed, row-major.
 *
 * Layout (all little-endian):
 *   offset 0   8 bytes  magic "K3LOGITS"
 *   offset 8   u32      version = 1
 *   offset 12  u32      header bytes = 32
 *   offset 16  u64      vocab (floats per row)
 *   offset 24  u64      rows
 *   offset 32  rows x vocab float32 (IEEE binary32), row-major
 * Row order: the prompt positions (only with --all-logits; else just the last prompt position),
 * then one row per decode step. Python: np.fromfile(f, "<f4", offset=32).reshape(rows, vocab).
 * The row count is patched into the header when the file is closed. */
#ifndef K3_GEN_LOGITS_FILE_H
#define K3_GEN_LOGITS_FILE_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
  FILE *fp;
  uint64_t vocab, rows;
} lf_t;

int lf_open(lf_t *lf, const char *path, uint64_t vocab);
int lf_write_rows(lf_t *lf, const float *rows, uint64_t n);
/* Patches the row count and closes; returns 0 or K3_EIO. */
int lf_close(lf_t *lf);

#endif
