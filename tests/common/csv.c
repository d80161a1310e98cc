/* Comma-separated name lists (see csv.h). */
#include "csv.h"

#include <string.h>

/* Length of the entry at s: up to the next comma or the end of the list. */
static size_t entry_len(const char *s) {
  const char *e = strchr(s, ',');
  return e ? (size_t)(e - s) : strlen(s);
}

bool csv_has(const char *list, const char *name) {
  const size_t n = strlen(name);
  for (const char *s = list; *s;) {
    const size_t l = entry_len(s);
    if (l == n && !strncmp(s, name, n)) return true;
    s += l + (s[l] == ','); /* the next entry, or the end */
  }
  return false;
}

const char *csv_unknown(const char *list, const char *const *known, size_t n, size_t *len) {
  for (const char *s = list; *s;) {
    const size_t l = entry_len(s);
    size_t i = 0;
    while (i < n && !(strlen(known[i]) == l && !strncmp(s, known[i], l))) i++;
    if (i == n) {
      if (len) *len = l;
      return s;
    }
    s += l + (s[l] == ',');
  }
  return NULL;
}
