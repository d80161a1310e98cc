/* HOST:PORT helpers; see k3pd/netaddr.h. */
#include "k3pd/netaddr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <unistd.h>

#include "k3pd/err.h"

int k3_addr_split(const char *addr, const char *what, char *host, size_t hostcap, int *port, char *err,
                  size_t errlen) {
  const char *colon = strrchr(addr ? addr : "", ':');
  if (!addr || !colon) {
    snprintf(err, errlen, "%s: expected HOST:PORT, got \"%s\"", what, addr ? addr : "");
    return K3_EINVAL;
  }
  const char *h = addr;
  size_t hl = (size_t)(colon - addr);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl >= hostcap) {
    snprintf(err, errlen, "%s: host too long", what);
    return K3_EINVAL;
  }
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (end == colon + 1 || *end || p < 0 || p > 65535) {
    snprintf(err, errlen, "%s: bad port in \"%s\"", what, addr);
    return K3_EINVAL;
  }
  memcpy(host, h, hl);
  host[hl] = 0;
  *port = (int)p;
  return 0;
}

int k3_addr_advertise(const char *listen, int bound_port, const char *advertise, char *out, size_t cap) {
  if (advertise && *advertise) {
    if ((size_t)snprintf(out, cap, "%s", advertise) >= cap) return K3_EINVAL;
    return 0;
  }
  char host[256];
  int port;
  char err[128];
  int rc = k3_addr_split(listen, "listen", host, sizeof host, &port, err, sizeof err);
  if (rc) return rc;
  if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "::")) {
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
  }
  bool v6 = strchr(host, ':') != NULL;
  if ((size_t)snprintf(out, cap, v6 ? "[%s]:%d" : "%s:%d", host, bound_port) >= cap) return K3_EINVAL;
  return 0;
}
