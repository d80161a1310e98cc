/* k3pd-cli: one binary, many debugging subcommands. Each cli_<area>.c file exports a table of
 * subcommands; main.c lists the tables and dispatches on argv[1]. Adding an area = one new
 * file (picked up by the CMake glob) + one line in main.c's group list. */
#ifndef K3PD_CLI_H
#define K3PD_CLI_H

#include <stddef.h>

typedef struct {
  const char *name;    /* subcommand, e.g. "tokenize" */
  const char *summary; /* one line for `k3pd-cli --help` */
  /* Runs with argv[0] = the subcommand name; returns the process exit status. */
  int (*run)(int argc, char **argv);
} k3_cli_cmd_t;

typedef struct {
  const k3_cli_cmd_t *cmds;
  const size_t *n;
} k3_cli_group_t;

/* cli_tok.c */
extern const k3_cli_cmd_t cli_tok_cmds[];
extern const size_t cli_tok_ncmds;

/* cli_generate.c, cli_up.c (cluster client and local cluster) */
extern const k3_cli_cmd_t cli_generate_cmds[];
extern const size_t cli_generate_ncmds;
extern const k3_cli_cmd_t cli_up_cmds[];
extern const size_t cli_up_ncmds;

/* cli_certs.c (development certificates) */
extern const k3_cli_cmd_t cli_certs_cmds[];
extern const size_t cli_certs_ncmds;

#endif
