/* HOST:PORT helpers for the binaries: splitting listen addresses and choosing the address a
 * worker advertises to the router. */
#ifndef K3PD_NETADDR_H
#define K3PD_NETADDR_H

#include <stddef.h>

/* Splits "host:port" / "[v6]:port" into host (without brackets) and port. Returns 0 or
 * K3_EINVAL (message naming `what` in err). */
int k3_addr_split(const char *addr, const char *what, char *host, size_t hostcap, int *port, char *err,
                  size_t errlen);
/* The address others should dial: `advertise` if non-empty; otherwise the listen host with the
 * bound port, where a wildcard host (0.0.0.0, ::, empty) becomes this machine's hostname. */
int k3_addr_advertise(const char *listen, int bound_port, const char *advertise, char *out, size_t cap);

#endif
