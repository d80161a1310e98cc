/* Private to common/rpc: the k3_rpc_tls_t layout and the libcrypto helpers shared by tls.c
 * (credentials from files, identity rules) and devca.c (the development CA). */
#ifndef K3PD_RPC_TLS_INT_H
#define K3PD_RPC_TLS_INT_H

#include <stddef.h>

#include <openssl/evp.h>
#include <openssl/x509.h>

#include "k3pd/rpc_tls.h"

struct k3_rpc_tls {
  char *cert_pem; /* owned: the leaf certificate (+ chain) */
  char *key_pem;  /* owned: its private key */
  char *ca_pem;   /* owned, NULL for a server-only credential: the CA that signs the peers */
  char *names[K3_RPC_TLS_MAX_NAMES]; /* owned: identity names of the leaf */
  size_t n_names;
};

/* Fills t->names from the certificate (DNS SANs, else the CN). Returns 0 or K3_EINVAL when the
 * certificate has neither, K3_ENOMEM. */
int tls_fill_names(struct k3_rpc_tls *t, X509 *leaf);
/* PEM text of a certificate or private key (malloc'd, NUL-terminated), NULL on OOM. */
char *tls_pem_cert(X509 *x);
char *tls_pem_key(EVP_PKEY *k);
/* Parses the first certificate / the private key of a PEM text; NULL when none parses. */
X509 *tls_parse_cert(const char *pem);
EVP_PKEY *tls_parse_key(const char *pem);

#endif
