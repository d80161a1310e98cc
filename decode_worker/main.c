/* k3pd-decode entry point: flags and wiring only (ARCHITECTURE.md §1). */
#include <stdio.h>

#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/log.h"

int main(int argc, char **argv) {
  const char *listen = "127.0.0.1:0";
  const char *log_level = "info";
  k3_flag_t flags[] = {
      {"listen", K3_FLAG_STR, &listen, "HOST:PORT", "gRPC listen address", false},
      {"log-level", K3_FLAG_STR, &log_level, "LEVEL", "error|warn|info|debug", false},
  };
  k3_flags_info_t info = {"k3pd-decode", "k3pd-decode: holds sequence state and runs continuous-batching decode steps, streaming tokens back.", NULL};
  char err[512];
  int rc = k3_flags_parse(&info, flags, sizeof flags / sizeof flags[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-decode: %s\n", err);
    return 2;
  }
  k3_log_set_component("k3pd-decode");
  fprintf(stderr, "k3pd-decode: serving is not built yet in this version (see issue: the cluster)\n");
  return 2;
}
