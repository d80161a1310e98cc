/* k3_strerror / k3_errname generated from the K3_ERRNO_MAP table in err.h. */
#include "k3pd/err.h"

const char *k3_strerror(int err) {
  switch (err) {
    case 0: return "success";
#define K3_ERR_STR(name, val, msg) case -(val): return msg;
    K3_ERRNO_MAP(K3_ERR_STR)
#undef K3_ERR_STR
    default: return "unknown error";
  }
}

const char *k3_errname(int err) {
  switch (err) {
    case 0: return "K3_OK";
#define K3_ERR_NAME(name, val, msg) case -(val): return "K3_" #name;
    K3_ERRNO_MAP(K3_ERR_NAME)
#undef K3_ERR_NAME
    default: return "K3_E?";
  }
}
