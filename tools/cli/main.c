/* k3pd-cli: dispatches `k3pd-cli SUBCOMMAND [flags]` to the subcommand tables of the
 * cli_*.c files (see cli.h). Owns nothing else: each subcommand parses its own flags. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const k3_cli_group_t groups[] = {
    {cli_tok_cmds, &cli_tok_ncmds},
    {cli_up_cmds, &cli_up_ncmds},
    {cli_generate_cmds, &cli_generate_ncmds},
    {cli_certs_cmds, &cli_certs_ncmds},
};

static void usage(FILE *fp) {
  fprintf(fp, "usage: k3pd-cli SUBCOMMAND [flags]   (k3pd-cli SUBCOMMAND --help for its flags)\n\n"
              "Debugging tools for k3pd. Subcommands:\n");
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (size_t i = 0; i < *groups[g].n; i++)
      fprintf(fp, "  %-12s %s\n", groups[g].cmds[i].name, groups[g].cmds[i].summary);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("k3pd-cli %s\n", K3PD_VERSION);
    return 0;
  }
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (size_t i = 0; i < *groups[g].n; i++)
      if (strcmp(argv[1], groups[g].cmds[i].name) == 0) return groups[g].cmds[i].run(argc - 1, argv + 1);
  fprintf(stderr, "k3pd-cli: unknown subcommand \"%s\"\n", argv[1]);
  usage(stderr);
  return 2;
}
