/* The development CA (k3pd/rpc_tls.h: k3_rpc_tls_dev, k3_rpc_tls_dev_issue).
 *
 * What it is for: local clusters (k3pd-cli up, scripts/demo.sh, the tests) run mutual TLS like
 * production without anyone making certificates. A private directory holds one CA (ca.crt,
 * ca.key: EC P-256, 10 years); each process issues itself a fresh leaf certificate for its
 * identity at start-up and keeps it in memory. The first process creates the CA under an
 * exclusive lock on DIR/ca.lock (bounded wait), so processes started together agree on one CA.
 *
 * What it is not: a production PKI. Anyone who can read DIR can mint identities, so DIR must be
 * private to the user: it is created 0700, and a DIR owned by another user or readable by others
 * is refused (the same rule as --share-weights and --ipc-dir). Production certificates come from
 * files (tls.c), e.g. Kubernetes Secrets (docs/operations.md "Security").
 *
 * Invariants: the CA files are written to a temporary name and renamed, key first, so a reader
 * holding the lock never sees a half-written CA; private keys are written 0600. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "k3pd/err.h"
#include "k3pd/util.h"
#include "tls_int.h"

#define LOCK_WAIT_MS 10000
#define CA_DAYS 3650
#define LEAF_DAYS 365

/* DIR exists (created 0700 when missing), is a real directory of ours, closed to others. */
static int check_dir(const char *dir, char *err, size_t errlen) {
  if (!dir || !*dir) {
    snprintf(err, errlen, "--tls-dev-dir: empty path");
    return K3_EINVAL;
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "--tls-dev-dir %s: cannot create it: %s", dir, strerror(errno));
    return K3_EIO;
  }
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "--tls-dev-dir %s: not a directory", dir);
    return K3_EINVAL;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    snprintf(err, errlen, "--tls-dev-dir %s: must belong to uid %u and be closed to others (mode 0700; it has "
             "uid %u, mode %03o): whoever can read it can join the cluster", dir, (unsigned)geteuid(),
             (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
    return K3_EINVAL;
  }
  return 0;
}

static int lock_dir(const char *dir, int *fd_out, char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/ca.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    snprintf(err, errlen, "--tls-dev-dir %s: cannot open ca.lock: %s", dir, strerror(errno));
    return K3_EIO;
  }
  uint64_t until = k3_now_ns() + (uint64_t)LOCK_WAIT_MS * 1000000u;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || k3_now_ns() > until) {
      snprintf(err, errlen, "--tls-dev-dir %s: ca.lock still held after %d ms", dir, LOCK_WAIT_MS);
      close(fd);
      return K3_ETIMEDOUT;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  *fd_out = fd;
  return 0;
}

/* Writes data to path through a temporary file + rename, created with `mode`. */
static int write_file_mode(const char *path, const char *data, mode_t mode) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return K3_EIO;
  size_t len = strlen(data), off = 0;
  while (off < len) {
    ssize_t n = write(fd, data + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      unlink(tmp);
      return K3_EIO;
    }
    off += (size_t)n;
  }
  if (fchmod(fd, mode) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    return K3_EIO;
  }
  return 0;
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
  X509_EXTENSION *ex = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
  if (!ex) return 0;
  int ok = X509_add_ext(x, ex, -1);
  X509_EXTENSION_free(ex);
  return ok;
}

/* A certificate for `key` named `cn` (with SANs `san` when not NULL), signed by issuer_key
 * (issuer NULL = self-signed CA). NULL on failure. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, const char *san, X509 *issuer, EVP_PKEY *issuer_key, int days) {
  X509 *x = X509_new();
  BIGNUM *bn = BN_new();
  unsigned char serial[16];
  int ok = x && bn && RAND_bytes(serial, sizeof serial) == 1;
  if (ok) {
    serial[0] &= 0x7f; /* positive */
    ok = BN_bin2bn(serial, sizeof serial, bn) && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) &&
         X509_set_version(x, 2) && X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
         X509_gmtime_adj(X509_getm_notAfter(x), (long)days * 86400) && X509_set_pubkey(x, key);
  }
  X509_NAME *name = ok ? X509_get_subject_name(x) : NULL;
  ok = ok && name &&
       X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"k3pd development", -1, -1, 0) &&
       X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0) &&
       X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
  if (ok && !issuer) {
    ok = add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
         add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") &&
         add_ext(x, x, NID_subject_key_identifier, "hash");
  } else if (ok) {
    ok = add_ext(x, issuer, NID_basic_constraints, "critical,CA:FALSE") &&
         add_ext(x, issuer, NID_key_usage, "critical,digitalSignature") &&
         add_ext(x, issuer, NID_ext_key_usage, "serverAuth,clientAuth") &&
         add_ext(x, issuer, NID_subject_key_identifier, "hash") &&
         add_ext(x, issuer, NID_authority_key_identifier, "keyid:always") &&
         (!san || add_ext(x, issuer, NID_subject_alt_name, san));
  }
  ok = ok && X509_sign(x, issuer_key, EVP_sha256()) > 0;
  BN_free(bn);
  ERR_clear_error();
  if (!ok) {
    X509_free(x);
    return NULL;
  }
  return x;
}

static int expired(X509 *x) { return X509_cmp_current_time(X509_get0_notAfter(x)) <= 0; }

/* Loads DIR's CA, creating it first when DIR has none. */
static int dev_ca(const char *dir, X509 **ca_out, EVP_PKEY **key_out, char *err, size_t errlen) {
  int rc = check_dir(dir, err, errlen);
  if (rc) return rc;
  int lfd;
  if ((rc = lock_dir(dir, &lfd, err, errlen))) return rc;
  char kpath[4096], cpath[4096];
  snprintf(kpath, sizeof kpath, "%s/ca.key", dir);
  snprintf(cpath, sizeof cpath, "%s/ca.crt", dir);
  char *kpem = NULL, *cpem = NULL;
  size_t len;
  X509 *ca = NULL;
  EVP_PKEY *key = NULL;
  if (k3_read_file(kpath, &kpem, &len) == 0 && k3_read_file(cpath, &cpem, &len) == 0) {
    key = tls_parse_key(kpem);
    ca = tls_parse_cert(cpem);
    if (!key || !ca || X509_check_private_key(ca, key) != 1 || expired(ca)) {
      snprintf(err, errlen, "--tls-dev-dir %s: ca.crt/ca.key are damaged or expired: remove the directory (every "
               "process using it must restart)", dir);
      rc = K3_EINVAL;
    }
  } else {
    char host[256] = "localhost", cn[400];
    gethostname(host, sizeof host - 1);
    snprintf(cn, sizeof cn, "k3pd development CA (%.64s, uid %u)", host, (unsigned)geteuid());
    key = EVP_EC_gen("P-256");
    ca = key ? make_cert(key, cn, NULL, NULL, key, CA_DAYS) : NULL;
    free(kpem);
    free(cpem);
    kpem = key ? tls_pem_key(key) : NULL;
    cpem = ca ? tls_pem_cert(ca) : NULL;
    if (!kpem || !cpem) {
      snprintf(err, errlen, "--tls-dev-dir %s: cannot make a CA (libcrypto)", dir);
      rc = K3_ENOMEM;
    } else if (write_file_mode(kpath, kpem, 0600) || write_file_mode(cpath, cpem, 0644)) {
      snprintf(err, errlen, "--tls-dev-dir %s: cannot write ca.key/ca.crt", dir);
      rc = K3_EIO;
    }
  }
  close(lfd); /* releases the lock */
  if (kpem) memset(kpem, 0, strlen(kpem));
  free(kpem);
  free(cpem);
  ERR_clear_error();
  if (rc) {
    X509_free(ca);
    EVP_PKEY_free(key);
    return rc;
  }
  *ca_out = ca;
  *key_out = key;
  return 0;
}

/* Issues a leaf for identity from DIR's CA: fills t (PEMs + names). */
static int dev_issue(const char *dir, const char *identity, struct k3_rpc_tls *t, char *err, size_t errlen) {
  if (!k3_rpc_tls_id_valid(identity)) {
    snprintf(err, errlen, "identity \"%.200s\": a certificate name needs 1..%d characters of [A-Za-z0-9._-], not "
             "starting or ending with '.' or '-'", identity ? identity : "", K3_RPC_TLS_ID_MAX);
    return K3_EINVAL;
  }
  X509 *ca = NULL, *leaf = NULL;
  EVP_PKEY *cakey = NULL, *key = NULL;
  int rc = dev_ca(dir, &ca, &cakey, err, errlen);
  if (rc) return rc;
  char san[512];
  snprintf(san, sizeof san, "DNS:%s,DNS:localhost,IP:127.0.0.1,IP:::1", identity);
  key = EVP_EC_gen("P-256");
  leaf = key ? make_cert(key, identity, san, ca, cakey, LEAF_DAYS) : NULL;
  t->cert_pem = leaf ? tls_pem_cert(leaf) : NULL;
  t->key_pem = key ? tls_pem_key(key) : NULL;
  t->ca_pem = tls_pem_cert(ca);
  rc = t->cert_pem && t->key_pem && t->ca_pem ? tls_fill_names(t, leaf) : K3_ENOMEM;
  if (rc) snprintf(err, errlen, "--tls-dev-dir %s: cannot issue a certificate for \"%s\"", dir, identity);
  X509_free(leaf);
  X509_free(ca);
  EVP_PKEY_free(key);
  EVP_PKEY_free(cakey);
  ERR_clear_error();
  return rc;
}

int k3_rpc_tls_dev(const char *dir, const char *identity, k3_rpc_tls_t **out, char *err, size_t errlen) {
  k3_rpc_tls_t *t = calloc(1, sizeof *t);
  if (!t) return K3_ENOMEM;
  int rc = dev_issue(dir, identity, t, err, errlen);
  if (rc) {
    k3_rpc_tls_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int k3_rpc_tls_dev_issue(const char *dir, const char *identity, const char *prefix, char *err, size_t errlen) {
  k3_rpc_tls_t *t;
  int rc = k3_rpc_tls_dev(dir, identity, &t, err, errlen);
  if (rc) return rc;
  char path[4096];
  snprintf(path, sizeof path, "%s.crt", prefix);
  rc = write_file_mode(path, t->cert_pem, 0644);
  if (!rc) {
    snprintf(path, sizeof path, "%s.key", prefix);
    rc = write_file_mode(path, t->key_pem, 0600);
  }
  if (rc) snprintf(err, errlen, "cannot write %s", path);
  k3_rpc_tls_free(t);
  return rc;
}
