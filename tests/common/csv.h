/* Comma-separated name lists of the test programs' flags (test_kernels --groups, k3k-gpu-check
 * --cases and --only, k3k-gpu-opdiff --exps): "a,b,c", entries compared whole, nothing stripped. */
#ifndef K3K_TEST_CSV_H
#define K3K_TEST_CSV_H

#include <stdbool.h>
#include <stddef.h>

/* True when name is one of the entries of list. */
bool csv_has(const char *list, const char *name);
/* The first entry of list that is none of known[0..n) ("" in "a,,b" included; a trailing comma
 * ends the list), or NULL. *len (len may be NULL): its length, for a message ("%.*s"). */
const char *csv_unknown(const char *list, const char *const *known, size_t n, size_t *len);

#endif
