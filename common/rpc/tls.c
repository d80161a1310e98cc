/* Cluster credentials from PEM files and the identity rules (k3pd/rpc_tls.h). Not here: the
 * development CA (devca.c) and the use of credentials by gRPC (server.c, client.c).
 *
 * Files are checked at start-up with libcrypto, so a wrong Secret fails the process with a
 * message naming the file (key does not match, not signed by the CA, expired) instead of every
 * handshake failing later with a generic transport error. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "tls_int.h"

/* ---- identity rules ---- */

int k3_rpc_tls_id_valid(const char *id) {
  size_t n = id ? strlen(id) : 0;
  if (n == 0 || n > K3_RPC_TLS_ID_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)id[i];
    if (!(isalnum(c) || c == '-' || c == '_' || c == '.')) return 0;
  }
  return id[0] != '.' && id[0] != '-' && id[n - 1] != '.' && id[n - 1] != '-';
}

int k3_rpc_tls_name_covers(const char *name, const char *id) {
  if (!name || !id || !*name || !*id) return 0;
  if (name[0] == '*' && name[1] == '.') {
    /* "*.suffix" covers "label.suffix" for exactly one non-empty label (no dot in it) */
    const char *dot = strchr(id, '.');
    if (!dot || dot == id || !dot[1]) return 0;
    return strcasecmp(dot + 1, name + 2) == 0;
  }
  return strcasecmp(name, id) == 0;
}

int k3_rpc_tls_covers(const k3_rpc_tls_t *t, const char *id) {
  for (size_t i = 0; i < t->n_names; i++)
    if (k3_rpc_tls_name_covers(t->names[i], id)) return 1;
  return 0;
}

int k3_rpc_tls_default_id(const k3_rpc_tls_t *t, const char *host, char *out, size_t cap) {
  if (t->n_names == 0) return K3_EINVAL;
  const char *n = t->names[0];
  int len;
  if (n[0] == '*' && n[1] == '.') {
    /* the host's first label only: a wildcard covers one label */
    size_t hl = host ? strcspn(host, ".") : 0;
    if (hl == 0) return K3_EINVAL;
    len = snprintf(out, cap, "%.*s%s", (int)hl, host, n + 1);
  } else {
    len = snprintf(out, cap, "%s", n);
  }
  if (len < 0 || (size_t)len >= cap || !k3_rpc_tls_id_valid(out) || !k3_rpc_tls_covers(t, out)) return K3_EINVAL;
  return 0;
}

/* ---- libcrypto helpers ---- */

static char *bio_text(BIO *b) {
  char *data;
  long n = BIO_get_mem_data(b, &data);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s) {
    memcpy(s, data, (size_t)n);
    s[n] = 0;
  }
  return s;
}

char *tls_pem_cert(X509 *x) {
  BIO *b = BIO_new(BIO_s_mem());
  char *s = b && PEM_write_bio_X509(b, x) ? bio_text(b) : NULL;
  BIO_free(b);
  return s;
}

char *tls_pem_key(EVP_PKEY *k) {
  BIO *b = BIO_new(BIO_s_mem());
  char *s = b && PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL) ? bio_text(b) : NULL;
  BIO_free(b);
  return s;
}

X509 *tls_parse_cert(const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  ERR_clear_error();
  return x;
}

EVP_PKEY *tls_parse_key(const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  ERR_clear_error();
  return k;
}

static int add_name(struct k3_rpc_tls *t, const char *s, size_t n) {
  if (t->n_names == K3_RPC_TLS_MAX_NAMES || n == 0 || memchr(s, 0, n)) return 0; /* skip odd ones */
  char *c = malloc(n + 1);
  if (!c) return K3_ENOMEM;
  memcpy(c, s, n);
  c[n] = 0;
  t->names[t->n_names++] = c;
  return 0;
}

int tls_fill_names(struct k3_rpc_tls *t, X509 *x) {
  GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
  int rc = 0;
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && !rc; i++) {
    const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_DNS) continue;
    rc = add_name(t, (const char *)ASN1_STRING_get0_data(g->d.dNSName), (size_t)ASN1_STRING_length(g->d.dNSName));
  }
  GENERAL_NAMES_free(sans);
  if (rc) return rc;
  if (t->n_names == 0) {
    X509_NAME *subj = X509_get_subject_name(x);
    int idx = subj ? X509_NAME_get_index_by_NID(subj, NID_commonName, -1) : -1;
    if (idx >= 0) {
      ASN1_STRING *cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, idx));
      rc = add_name(t, (const char *)ASN1_STRING_get0_data(cn), (size_t)ASN1_STRING_length(cn));
    }
  }
  if (rc) return rc;
  return t->n_names ? 0 : K3_EINVAL;
}

void k3_rpc_tls_free(k3_rpc_tls_t *t) {
  if (!t) return;
  free(t->cert_pem);
  if (t->key_pem) {
    memset(t->key_pem, 0, strlen(t->key_pem)); /* no copy of the key left in freed memory */
    free(t->key_pem);
  }
  free(t->ca_pem);
  for (size_t i = 0; i < t->n_names; i++) free(t->names[i]);
  free(t);
}

const char *k3_rpc_tls_cert_pem(const k3_rpc_tls_t *t) { return t->cert_pem; }
const char *k3_rpc_tls_key_pem(const k3_rpc_tls_t *t) { return t->key_pem; }
const char *k3_rpc_tls_ca_pem(const k3_rpc_tls_t *t) { return t->ca_pem; }

size_t k3_rpc_tls_names(const k3_rpc_tls_t *t, const char *const **names) {
  *names = (const char *const *)t->names;
  return t->n_names;
}

/* ---- credentials from files ---- */

static int read_pem(const char *path, const char *flag, char **out, char *err, size_t errlen) {
  size_t len;
  int rc = k3_read_file(path, out, &len);
  if (rc) {
    snprintf(err, errlen, "%s %s: %s", flag, path, rc == K3_ENOENT ? "no such file" : "cannot read it");
    return rc;
  }
  if (memchr(*out, 0, len)) {
    free(*out);
    *out = NULL;
    snprintf(err, errlen, "%s %s: not a PEM file (binary data)", flag, path);
    return K3_EINVAL;
  }
  return 0;
}

/* Verifies leaf (with the rest of its chain file as intermediates) against the CA bundle. */
static int verify_chain(X509 *leaf, const char *chain_pem, const char *ca_pem, char *why, size_t cap) {
  X509_STORE *store = X509_STORE_new();
  STACK_OF(X509) *inter = sk_X509_new_null();
  X509_STORE_CTX *ctx = X509_STORE_CTX_new();
  int ok = 0, n_ca = 0;
  if (!store || !inter || !ctx) goto out;
  BIO *b = BIO_new_mem_buf(ca_pem, -1);
  for (X509 *x; b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL;) {
    X509_STORE_add_cert(store, x);
    X509_free(x);
    n_ca++;
  }
  BIO_free(b);
  ERR_clear_error();
  if (n_ca == 0) {
    snprintf(why, cap, "no certificate in it");
    ok = -1;
    goto out;
  }
  b = BIO_new_mem_buf(chain_pem, -1);
  X509 *first = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL; /* the leaf itself */
  X509_free(first);
  for (X509 *x; b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL;) sk_X509_push(inter, x);
  BIO_free(b);
  ERR_clear_error();
  if (X509_STORE_CTX_init(ctx, store, leaf, inter) != 1) goto out;
  if (X509_verify_cert(ctx) == 1) {
    ok = 1;
  } else {
    snprintf(why, cap, "%s", X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
    ok = -1;
  }
out:
  X509_STORE_CTX_free(ctx);
  sk_X509_pop_free(inter, X509_free);
  X509_STORE_free(store);
  ERR_clear_error();
  return ok;
}

int k3_rpc_tls_load(const char *cert_file, const char *key_file, const char *ca_file, k3_rpc_tls_t **out,
                    char *err, size_t errlen) {
  if (!cert_file || !*cert_file || !key_file || !*key_file) {
    snprintf(err, errlen, "--tls-cert and --tls-key: both are required");
    return K3_EINVAL;
  }
  k3_rpc_tls_t *t = calloc(1, sizeof *t);
  if (!t) return K3_ENOMEM;
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  int rc = read_pem(cert_file, "--tls-cert", &t->cert_pem, err, errlen);
  if (!rc) rc = read_pem(key_file, "--tls-key", &t->key_pem, err, errlen);
  if (!rc && ca_file && *ca_file) rc = read_pem(ca_file, "--tls-ca", &t->ca_pem, err, errlen);
  if (rc) goto fail;
  rc = K3_EINVAL;
  if (!(leaf = tls_parse_cert(t->cert_pem))) {
    snprintf(err, errlen, "--tls-cert %s: no PEM certificate in it", cert_file);
    goto fail;
  }
  if (!(key = tls_parse_key(t->key_pem))) {
    snprintf(err, errlen, "--tls-key %s: no PEM private key in it (encrypted keys are not supported)", key_file);
    goto fail;
  }
  if (X509_check_private_key(leaf, key) != 1) {
    ERR_clear_error();
    snprintf(err, errlen, "--tls-key %s: does not match the certificate in --tls-cert %s", key_file, cert_file);
    goto fail;
  }
  if (t->ca_pem) {
    char why[160] = "";
    int v = verify_chain(leaf, t->cert_pem, t->ca_pem, why, sizeof why);
    if (v <= 0) {
      if (v == 0) {
        rc = K3_ENOMEM;
        snprintf(err, errlen, "--tls-ca %s: out of memory", ca_file);
      } else {
        snprintf(err, errlen, "--tls-cert %s: not valid under --tls-ca %s: %s", cert_file, ca_file, why);
      }
      goto fail;
    }
  }
  rc = tls_fill_names(t, leaf);
  if (rc) {
    if (rc == K3_EINVAL)
      snprintf(err, errlen, "--tls-cert %s: the certificate has no DNS subject alternative name and no common name",
               cert_file);
    goto fail;
  }
  X509_free(leaf);
  EVP_PKEY_free(key);
  *out = t;
  return 0;
fail:
  X509_free(leaf);
  EVP_PKEY_free(key);
  k3_rpc_tls_free(t);
  return rc;
}
