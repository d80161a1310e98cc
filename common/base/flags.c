/* Table-driven flag parsing: defaults < K3PD_* environment < command line.
 * Errors always name the flag and say what was expected. */
#include "k3pd/flags.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "k3pd/err.h"

static int set_value(const k3_flag_t *f, const char *v, const char *origin, char *err, size_t errlen) {
  char *end = NULL;
  errno = 0;
  switch (f->type) {
    case K3_FLAG_STR:
      *(const char **)f->dst = v;
      return 0;
    case K3_FLAG_INT: {
      long x = strtol(v, &end, 10);
      if (errno || end == v || *end || x < INT_MIN || x > INT_MAX) break;
      *(int *)f->dst = (int)x;
      return 0;
    }
    case K3_FLAG_I64: {
      long long x = strtoll(v, &end, 10);
      if (errno || end == v) break;
      long long mul = 1;
      if (*end) {
        switch (toupper((unsigned char)*end)) {
          case 'K': mul = 1ll << 10; break;
          case 'M': mul = 1ll << 20; break;
          case 'G': mul = 1ll << 30; break;
          default: mul = 0;
        }
        if (!mul || end[1]) break;
        if (x > LLONG_MAX / mul || x < LLONG_MIN / mul) break;
      }
      *(int64_t *)f->dst = (int64_t)(x * mul);
      return 0;
    }
    case K3_FLAG_DOUBLE: {
      double x = strtod(v, &end);
      if (errno || end == v || *end || !isfinite(x)) break;
      *(double *)f->dst = x;
      return 0;
    }
    case K3_FLAG_BOOL:
      if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) {
        *(bool *)f->dst = true;
        return 0;
      }
      if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) {
        *(bool *)f->dst = false;
        return 0;
      }
      break;
  }
  static const char *what[] = {"a string", "an integer", "an integer (K/M/G suffix allowed)", "a number",
                               "true or false"};
  snprintf(err, errlen, "%s --%s: expected %s, got \"%s\"", origin, f->name, what[f->type], v);
  return K3_EINVAL;
}

static void env_name(const char *flag, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "K3PD_");
  for (const char *p = flag; *p && n + 1 < cap; p++) out[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
  out[n] = 0;
}

void k3_flags_usage(const k3_flags_info_t *info, const k3_flag_t *flags, size_t nflags, void *fpv) {
  FILE *fp = fpv;
  fprintf(fp, "usage: %s [FLAGS]%s%s\n", info->prog, info->positional ? " " : "",
          info->positional ? info->positional : "");
  if (info->summary) fprintf(fp, "\n%s\n", info->summary);
  fprintf(fp, "\nflags (each also settable as K3PD_<NAME>, e.g. --max-new-tokens → K3PD_MAX_NEW_TOKENS):\n");
  for (size_t i = 0; i < nflags; i++) {
    const k3_flag_t *f = &flags[i];
    char left[96];
    snprintf(left, sizeof left, "--%s%s%s", f->name, f->metavar ? " " : "", f->metavar ? f->metavar : "");
    char def[96] = "";
    switch (f->type) {
      case K3_FLAG_STR:
        if (*(const char **)f->dst) snprintf(def, sizeof def, " (default: %s)", *(const char **)f->dst);
        break;
      case K3_FLAG_INT: snprintf(def, sizeof def, " (default: %d)", *(int *)f->dst); break;
      case K3_FLAG_I64: snprintf(def, sizeof def, " (default: %lld)", (long long)*(int64_t *)f->dst); break;
      case K3_FLAG_DOUBLE: snprintf(def, sizeof def, " (default: %g)", *(double *)f->dst); break;
      case K3_FLAG_BOOL: break;
    }
    fprintf(fp, "  %-28s %s%s%s\n", left, f->help ? f->help : "", f->required ? " (required)" : def, "");
  }
  fprintf(fp, "  %-28s %s\n  %-28s %s\n", "--help", "print this help and exit", "--version",
          "print the version and exit");
}

int k3_flags_parse(const k3_flags_info_t *info, const k3_flag_t *flags, size_t nflags, int argc, char **argv,
                   int *first_positional, char *err, size_t errlen) {
  bool seen[256] = {0};
  if (nflags > 256) {
    snprintf(err, errlen, "too many flags");
    return K3_EINVAL;
  }
  /* 1. environment */
  for (size_t i = 0; i < nflags; i++) {
    char name[128];
    env_name(flags[i].name, name, sizeof name);
    const char *v = getenv(name);
    if (v && *v) {
      char origin[160];
      snprintf(origin, sizeof origin, "environment %s for", name);
      int rc = set_value(&flags[i], v, origin, err, errlen);
      if (rc) return rc;
      seen[i] = true;
    }
  }
  /* 2. command line */
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == 0) break; /* first positional */
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
    if ((nlen == 4 && !strncmp(name, "help", 4))) {
      k3_flags_usage(info, flags, nflags, stdout);
      return K3_FLAGS_EXIT;
    }
    if (nlen == 7 && !strncmp(name, "version", 7)) {
      printf("%s %s\n", info->prog, K3PD_VERSION);
      return K3_FLAGS_EXIT;
    }
    size_t k = 0;
    for (; k < nflags; k++)
      if (strlen(flags[k].name) == nlen && !strncmp(flags[k].name, name, nlen)) break;
    if (k == nflags) {
      snprintf(err, errlen, "unknown flag --%.*s (see --help)", (int)nlen, name);
      return K3_EINVAL;
    }
    const char *v;
    if (eq) {
      v = eq + 1;
    } else if (flags[k].type == K3_FLAG_BOOL) {
      v = "true";
    } else {
      if (i + 1 >= argc) {
        snprintf(err, errlen, "flag --%s needs a value (%s)", flags[k].name,
                 flags[k].metavar ? flags[k].metavar : "VALUE");
        return K3_EINVAL;
      }
      v = argv[++i];
    }
    int rc = set_value(&flags[k], v, "flag", err, errlen);
    if (rc) return rc;
    seen[k] = true;
  }
  if (i < argc && !info->positional) {
    snprintf(err, errlen, "unexpected argument \"%s\" (see --help)", argv[i]);
    return K3_EINVAL;
  }
  for (size_t k = 0; k < nflags; k++) {
    if (flags[k].required && !seen[k]) {
      char name[128];
      env_name(flags[k].name, name, sizeof name);
      snprintf(err, errlen, "missing required flag --%s (or %s)", flags[k].name, name);
      return K3_EINVAL;
    }
  }
  if (first_positional) *first_positional = i;
  return 0;
}

int k3_parse_int_list(const char *s, int32_t **out, size_t *n, char *err, size_t errlen) {
  size_t cap = 16, cnt = 0;
  int32_t *v = malloc(cap * sizeof *v);
  if (!v) return K3_ENOMEM;
  const char *p = s;
  while (*p) {
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (end == p || errno || x < INT32_MIN || x > INT32_MAX) {
      snprintf(err, errlen, "bad integer at position %zu in list \"%s\"", (size_t)(p - s), s);
      free(v);
      return K3_EINVAL;
    }
    if (cnt == cap) {
      cap *= 2;
      int32_t *nv = realloc(v, cap * sizeof *v);
      if (!nv) {
        free(v);
        return K3_ENOMEM;
      }
      v = nv;
    }
    v[cnt++] = (int32_t)x;
    p = end;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == ',') {
      p++;
      while (*p == ' ' || *p == '\t') p++;
      if (!*p) {
        snprintf(err, errlen, "trailing comma in list \"%s\"", s);
        free(v);
        return K3_EINVAL;
      }
    } else if (*p) {
      snprintf(err, errlen, "expected ',' at position %zu in list \"%s\"", (size_t)(p - s), s);
      free(v);
      return K3_EINVAL;
    }
  }
  *out = v;
  *n = cnt;
  return 0;
}
