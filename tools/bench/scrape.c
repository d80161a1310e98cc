/* k3pd-bench metrics scrape: one blocking HTTP/1.0 GET of a worker's /metrics (plain text
 * Prometheus format, docs/metrics.md) and sums of a metric's series, for --profile.
 *
 * Not a Prometheus client: no TLS (a worker run with --metrics-tls cannot be scraped here; the
 * profile then falls back to request timings), no label filtering (every series of a name is
 * summed), no exemplars. Every socket operation has a 5 s deadline. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bench.h"
#include "k3pd/err.h"

int bn_scrape(const char *addr, char **text, char *err, size_t errlen) {
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || !colon[1]) {
    snprintf(err, errlen, "metrics address \"%s\": want HOST:PORT", addr);
    return K3_EINVAL;
  }
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai) {
    snprintf(err, errlen, "metrics address \"%s\": cannot resolve", addr);
    return K3_EUNAVAIL;
  }
  int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(ai);
    snprintf(err, errlen, "metrics %s: socket: %s", addr, strerror(errno));
    return K3_EIO;
  }
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* also bounds connect() on Linux */
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc) {
    snprintf(err, errlen, "metrics %s: connect: %s", addr, strerror(errno));
    close(fd);
    return K3_EUNAVAIL;
  }
  char req[512];
  int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr);
  if (write(fd, req, (size_t)n) != n) {
    snprintf(err, errlen, "metrics %s: write: %s", addr, strerror(errno));
    close(fd);
    return K3_EIO;
  }
  size_t len = 0, cap = 65536;
  char *buf = malloc(cap + 1);
  if (!buf) {
    close(fd);
    return K3_ENOMEM;
  }
  for (;;) {
    if (len == cap) {
      char *nb = realloc(buf, cap * 2 + 1);
      if (!nb) {
        free(buf);
        close(fd);
        return K3_ENOMEM;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r == 0) break;
    if (r < 0) {
      snprintf(err, errlen, "metrics %s: read: %s", addr, strerror(errno));
      free(buf);
      close(fd);
      return errno == EAGAIN || errno == EWOULDBLOCK ? K3_ETIMEDOUT : K3_EIO;
    }
    len += (size_t)r;
  }
  close(fd);
  buf[len] = 0;
  if (strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 8, " 200", 4) != 0) {
    snprintf(err, errlen, "metrics %s: not an HTTP 200 answer (%.40s)", addr, buf);
    free(buf);
    return K3_EIO;
  }
  *text = buf;
  return 0;
}

double bn_metric_sum(const char *text, const char *name) {
  double sum = 0;
  size_t nl = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, name, nl) != 0 || (p[nl] != '{' && p[nl] != ' ')) continue;
    const char *v = p + nl;
    if (*v == '{') {
      v = strchr(v, '}');
      if (!v) break;
      v++;
    }
    sum += strtod(v, NULL);
  }
  return sum;
}
