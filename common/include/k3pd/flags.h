/* Command-line flags with K3PD_* environment fallbacks.
 *
 * A binary declares a table of k3_flag_t; k3_flags_parse() fills the destinations from, in
 * increasing priority: the defaults already stored in the destinations, the environment
 * variable K3PD_<NAME> (name upper-cased, '-' → '_'), then "--name value" / "--name=value"
 * on the command line. Bool flags take no value ("--name"), or "--name=true|false|1|0".
 * --help prints usage to stdout; --version prints the version. Errors name the flag.
 *
 * Strings stored into K3_FLAG_STR destinations point into argv or the environment (never
 * freed by the caller). */
#ifndef K3PD_FLAGS_H
#define K3PD_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  K3_FLAG_STR,    /* const char ** */
  K3_FLAG_INT,    /* int * */
  K3_FLAG_I64,    /* int64_t * (accepts K/M/G suffixes, powers of 1024) */
  K3_FLAG_DOUBLE, /* double * */
  K3_FLAG_BOOL,   /* bool * */
} k3_flag_type_t;

typedef struct {
  const char *name;    /* long name without "--", e.g. "max-new-tokens" */
  k3_flag_type_t type;
  void *dst;           /* typed as above; holds the default on entry */
  const char *metavar; /* shown in --help, e.g. "N"; NULL for bools */
  const char *help;    /* one line */
  bool required;       /* error when neither env nor argv sets it */
} k3_flag_t;

typedef struct {
  const char *prog;     /* program name for usage */
  const char *summary;  /* one paragraph shown under the usage line */
  const char *positional; /* e.g. "COMMAND [ARGS...]" or NULL when none are accepted */
} k3_flags_info_t;

/* Result codes besides K3_* errors: */
#define K3_FLAGS_EXIT 1 /* --help or --version was printed; caller exits 0 */

/* Parses argv[1..argc-1]. On success returns 0 and, if first_positional is not NULL, the
 * index of the first non-flag argument (argc when none; "--" ends flag parsing). Positional
 * arguments are an error when info->positional is NULL. On error returns K3_EINVAL and writes
 * a message naming the flag into err (and nothing else is guaranteed about dst values). */
int k3_flags_parse(const k3_flags_info_t *info, const k3_flag_t *flags, size_t nflags, int argc,
                   char **argv, int *first_positional, char *err, size_t errlen);
void k3_flags_usage(const k3_flags_info_t *info, const k3_flag_t *flags, size_t nflags, void *fp);

/* Parses "1,2,3" (spaces allowed) into a malloc'd int32 array (caller frees *out). */
int k3_parse_int_list(const char *s, int32_t **out, size_t *n, char *err, size_t errlen);

#endif
