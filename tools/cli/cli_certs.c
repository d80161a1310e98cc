/* k3pd-cli certs: issues a certificate from the development CA (k3pd/rpc_tls.h), for tests and
 * local tools that talk to the cluster port or to a worker: `k3pd-cli certs --dir DIR --name NAME
 * --out PREFIX` writes PREFIX.crt and PREFIX.key (0600) for identity NAME, creating the CA in
 * DIR when it has none (DIR/ca.crt is the CA to trust). Not a production PKI: use your CA (or
 * cert-manager) for Kubernetes Secrets (docs/operations.md "Security"). */
#include <stdio.h>
#include <unistd.h>

#include "cli.h"
#include "k3pd/err.h"
#include "k3pd/flags.h"
#include "k3pd/rpc_tls.h"

static int cmd_certs(int argc, char **argv) {
  char dflt[64];
  snprintf(dflt, sizeof dflt, "/tmp/k3pd-tls-%u", (unsigned)geteuid());
  const char *dir = dflt, *name = NULL, *out = NULL;
  k3_flag_t f[] = {
      {"dir", K3_FLAG_STR, &dir, "DIR", "the development CA's directory (as --tls-dev-dir of the binaries)", false},
      {"name", K3_FLAG_STR, &name, "NAME", "the identity to issue (e.g. k3pd-router, decode-0)", true},
      {"out", K3_FLAG_STR, &out, "PREFIX", "write PREFIX.crt and PREFIX.key", true},
  };
  k3_flags_info_t info = {"k3pd-cli certs",
                          "Issues a certificate for NAME from the development CA in DIR (created when missing).",
                          NULL};
  char err[1024];
  int rc = k3_flags_parse(&info, f, sizeof f / sizeof f[0], argc, argv, NULL, err, sizeof err);
  if (rc == K3_FLAGS_EXIT) return 0;
  if (rc) {
    fprintf(stderr, "k3pd-cli certs: %s\n", err);
    return 2;
  }
  rc = k3_rpc_tls_dev_issue(dir, name, out, err, sizeof err);
  if (rc) {
    fprintf(stderr, "k3pd-cli certs: %s\n", err);
    return 1;
  }
  printf("%s.crt %s.key (CA: %s/ca.crt)\n", out, out, dir);
  return 0;
}

const k3_cli_cmd_t cli_certs_cmds[] = {
    {"certs", "issue a certificate from the development CA (tests, local tools)", cmd_certs},
};
const size_t cli_certs_ncmds = sizeof cli_certs_cmds / sizeof cli_certs_cmds[0];
