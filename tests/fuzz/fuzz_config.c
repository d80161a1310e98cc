/* libFuzzer harness for the strict config parser (k3_model_config_parse); accepted configs are
 * also run through the tensor map and the state manifest when they are small enough to plan. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3pd/manifest.h"
#include "k3pd/model_config.h"
#include "k3pd/tmap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  k3_model_config_t c;
  char err[4096];
  if (k3_model_config_parse((const char *)data, size, &c, err, sizeof err) != 0) {
    if (!memchr(err, 0, sizeof err)) abort();
    return 0;
  }
  if (c.num_layers < 1 || c.num_layers > K3_MAX_LAYERS || c.num_kda + c.num_mla != c.num_layers) abort();
  k3_manifest_t m;
  if (k3_manifest_build(&c, 16, &m) == 0) k3_manifest_free(&m);
  if ((int64_t)c.num_experts * c.num_layers <= 20000) {
    k3_tmap_t t;
    if (k3_tmap_plan(&c, &t, err, sizeof err) == 0) k3_tmap_free(&t);
  }
  return 0;
}
