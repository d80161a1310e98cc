/* Tensor view helpers of k3k.h: construction, slicing, sizes. Pure functions on the struct;
 * nothing here touches tensor memory. */
#include "k3k.h"

size_t k3k_dtype_size(k3k_dtype_t dt) {
  switch (dt) {
    case K3K_F32: return 4;
    case K3K_BF16: return 2;
    case K3K_U8: return 1;
    case K3K_I32: return 4;
    case K3K_PTR: return 8;
  }
  return 0;
}

const char *k3k_dtype_name(k3k_dtype_t dt) {
  switch (dt) {
    case K3K_F32: return "f32";
    case K3K_BF16: return "bf16";
    case K3K_U8: return "u8";
    case K3K_I32: return "i32";
    case K3K_PTR: return "ptr";
  }
  return "?";
}

k3k_tensor_t k3k_tensor_make(struct k3k_backend *be, k3k_dtype_t dt, void *data, int ndim,
                             const int64_t *shape) {
  k3k_tensor_t t = {.dtype = dt, .ndim = ndim, .data = data, .backend = be};
  /* A bad rank yields ndim 0, which every op's validation rejects with a message. */
  if (ndim < 1 || ndim > K3K_MAX_DIMS || !shape) {
    t.ndim = 0;
    return t;
  }
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t.shape[d] = shape[d];
    t.stride[d] = s;
    s *= shape[d] > 0 ? shape[d] : 1;
  }
  return t;
}

k3k_tensor_t k3k_tensor_1d(struct k3k_backend *be, k3k_dtype_t dt, void *data, int64_t n0) {
  int64_t s[1] = {n0};
  return k3k_tensor_make(be, dt, data, 1, s);
}

k3k_tensor_t k3k_tensor_2d(struct k3k_backend *be, k3k_dtype_t dt, void *data, int64_t n0,
                           int64_t n1) {
  int64_t s[2] = {n0, n1};
  return k3k_tensor_make(be, dt, data, 2, s);
}

k3k_tensor_t k3k_tensor_3d(struct k3k_backend *be, k3k_dtype_t dt, void *data, int64_t n0,
                           int64_t n1, int64_t n2) {
  int64_t s[3] = {n0, n1, n2};
  return k3k_tensor_make(be, dt, data, 3, s);
}

k3k_tensor_t k3k_tensor_slice(const k3k_tensor_t *t, int dim, int64_t start, int64_t len) {
  k3k_tensor_t v = *t;
  v.shape[dim] = len;
  if (v.data) v.data = (char *)v.data + (size_t)(start * t->stride[dim]) * k3k_dtype_size(t->dtype);
  return v;
}

int64_t k3k_tensor_numel(const k3k_tensor_t *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

bool k3k_tensor_is_contiguous(const k3k_tensor_t *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return false;
    s *= t->shape[d];
  }
  return true;
}

size_t k3k_tensor_span_bytes(const k3k_tensor_t *t) {
  if (k3k_tensor_numel(t) == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t->ndim; d++) last += (t->shape[d] - 1) * t->stride[d];
  return (size_t)(last + 1) * k3k_dtype_size(t->dtype);
}
