/* libFuzzer harness for the safetensors header parser (k3_st_open_mem): any input must either
 * be rejected with a message or give views that lie inside the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  k3_st_t *st = NULL;
  char err[512];
  if (k3_st_open_mem(data, size, "fuzz", &st, err, sizeof err) != 0) {
    if (!memchr(err, 0, sizeof err)) abort();
    return 0;
  }
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < k3_st_count(st); i++) {
    const k3_tensor_view_t *v = k3_st_at(st, i);
    const uint8_t *p = v->data;
    if (p < data || p + v->nbytes > data + size) abort();
    if (v->nbytes) sink ^= p[0] ^ p[v->nbytes - 1];
    if (k3_st_find(st, v->name) == NULL) abort();
  }
  (void)sink;
  k3_st_close(st);
  return 0;
}
