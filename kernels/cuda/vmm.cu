/* k3k_vmm on CUDA: one device allocation made with the virtual memory management API
 * (cuMemCreate with POSIX file descriptor handles), mapped here read-write, exportable as a
 * file descriptor, importable read-only or read-write by other processes (k3k_xdev.h).
 *
 * What it is for: shared weights (one read-only copy for a prefill and a decode worker on one
 * GPU) and the decode worker's state arena (a same-GPU prefill writes into it).
 * What it is not: a tensor allocator (the runner carves tensors out of one allocation) or a
 * transport (the fd travels over k3pd/fdshare.h).
 *
 * Driver entry points: the binaries link only the static CUDA runtime (which loads libcuda
 * itself), so they start on machines without libcuda.so.1 (CI). The driver functions used here
 * are looked up once through cudaGetDriverEntryPointByVersion (12.0 ABI) and called through
 * pointers; a lookup failure is logged with the runtime's error text.
 * Lifetime: alloc/import = create or import a handle, reserve a VA range of the handle's size
 * (rounded up to the recommended granularity), map, set access; free = synchronise the device
 * (nothing may still read the range), unmap, free the range, release the handle, in that order.
 * The physical memory lives until every process that imported or created it released it.
 * Every driver call is checked and logged with cuGetErrorName / cuGetErrorString. */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_common.cuh"
extern "C" {
#include "k3k_xdev.h"
}

/* ---- driver entry points -------------------------------------------------------------- */

typedef CUresult (*fn_get_error_string)(CUresult, const char **);
typedef CUresult (*fn_get_error_name)(CUresult, const char **);
typedef CUresult (*fn_device_get)(CUdevice *, int);
typedef CUresult (*fn_device_get_attribute)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*fn_mem_get_allocation_granularity)(size_t *, const CUmemAllocationProp *,
                                                       CUmemAllocationGranularity_flags);
typedef CUresult (*fn_mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                  unsigned long long);
typedef CUresult (*fn_mem_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_mem_address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_mem_address_free)(CUdeviceptr, size_t);
typedef CUresult (*fn_mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*fn_mem_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*fn_mem_export)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                  unsigned long long);
typedef CUresult (*fn_mem_import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);

static struct {
  fn_get_error_string get_error_string;
  fn_get_error_name get_error_name;
  fn_device_get device_get;
  fn_device_get_attribute device_get_attribute;
  fn_mem_get_allocation_granularity granularity;
  fn_mem_create create;
  fn_mem_release release;
  fn_mem_address_reserve reserve;
  fn_mem_address_free address_free;
  fn_mem_map map;
  fn_mem_unmap unmap;
  fn_mem_set_access set_access;
  fn_mem_export export_handle;
  fn_mem_import import_handle;
  int rc; /* 0 once every pointer is set, else K3_ENOTSUP */
} g_drv;
static pthread_once_t g_drv_once = PTHREAD_ONCE_INIT;

static bool lookup(const char *sym, void **p) {
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(sym, p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*p) {
    K3_ERROR("cuda vmm: driver entry point %s not available: %s (query result %d)", sym,
             e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found", (int)q);
    (void)cudaGetLastError();
    *p = NULL;
    return false;
  }
  return true;
}

static void drv_load(void) {
  bool ok = true;
#define L(field, sym) ok = lookup(sym, (void **)&g_drv.field) && ok
  L(get_error_string, "cuGetErrorString");
  L(get_error_name, "cuGetErrorName");
  L(device_get, "cuDeviceGet");
  L(device_get_attribute, "cuDeviceGetAttribute");
  L(granularity, "cuMemGetAllocationGranularity");
  L(create, "cuMemCreate");
  L(release, "cuMemRelease");
  L(reserve, "cuMemAddressReserve");
  L(address_free, "cuMemAddressFree");
  L(map, "cuMemMap");
  L(unmap, "cuMemUnmap");
  L(set_access, "cuMemSetAccess");
  L(export_handle, "cuMemExportToShareableHandle");
  L(import_handle, "cuMemImportFromShareableHandle");
#undef L
  g_drv.rc = ok ? 0 : K3_ENOTSUP;
}

static int drv(void) {
  pthread_once(&g_drv_once, drv_load);
  return g_drv.rc;
}

/* Checks one driver call: on failure logs the call, the driver's error name and text. */
static bool cu_ok(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return true;
  const char *name = NULL, *text = NULL;
  if (g_drv.get_error_name) g_drv.get_error_name(r, &name);
  if (g_drv.get_error_string) g_drv.get_error_string(r, &text);
  K3_ERROR("cuda vmm: %s failed: %s (%s)", what, name ? name : "?", text ? text : "unknown error");
  return false;
}
#define CU_OK(call) cu_ok((call), #call)

static int cu_rc(CUresult r) {
  return r == CUDA_ERROR_OUT_OF_MEMORY ? K3_ENOMEM : r == CUDA_ERROR_INVALID_VALUE ? K3_EINVAL : K3_EDEVICE;
}

/* ---- the object ------------------------------------------------------------------------- */

struct k3k_vmm {
  CUmemGenericAllocationHandle h;
  CUdeviceptr ptr;
  size_t size;     /* mapped bytes (= the handle's size, a granularity multiple) */
  int device;
  bool mapped, reserved, have_handle;
};

/* The device of a cuda backend, made current; checks VMM + POSIX fd support. */
static int device_of(k3k_backend_t *be, int *ordinal, CUdevice *dev) {
  k3k_cuda_ctx *cx = be ? k3k_cuda_ctx_of(be) : NULL;
  if (!cx) {
    K3_ERROR("cuda vmm: backend %s is not cuda: shareable device memory needs the cuda backend",
             be ? be->name : "(null)");
    return K3_ENOTSUP;
  }
  int rc = drv();
  if (rc) return rc;
  K3K_CU(cudaSetDevice(cx->device));
  if (!CU_OK(g_drv.device_get(dev, cx->device))) return K3_EDEVICE;
  int vmm = 0, fd = 0;
  if (!CU_OK(g_drv.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, *dev)) ||
      !CU_OK(g_drv.device_get_attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, *dev)))
    return K3_EDEVICE;
  if (!vmm) {
    K3_ERROR("cuda vmm: device %d does not support virtual memory management "
             "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0): no shareable memory", cx->device);
    return K3_ENOTSUP;
  }
  if (!fd) {
    K3_ERROR("cuda vmm: device %d (driver) cannot export memory as POSIX file descriptors "
             "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 0): no shareable memory",
             cx->device);
    return K3_ENOTSUP;
  }
  *ordinal = cx->device;
  return 0;
}

static void prop_of(CUmemAllocationProp *p, CUdevice dev) {
  memset(p, 0, sizeof *p);
  p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->location.id = (int)dev;
  p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Releases whatever v holds (mapping, range, handle), in reverse order of acquisition. */
static void teardown(k3k_vmm_t *v) {
  if (v->mapped) {
    /* nothing queued may still touch the range */
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) K3_ERROR("cuda vmm: cudaDeviceSynchronize before unmap: %s", cudaGetErrorString(e));
    CU_OK(g_drv.unmap(v->ptr, v->size));
  }
  if (v->reserved) CU_OK(g_drv.address_free(v->ptr, v->size));
  if (v->have_handle) CU_OK(g_drv.release(v->h));
  v->mapped = v->reserved = v->have_handle = false;
}

/* Reserves a range for v->h (v->size bytes), maps it, sets access. On error v holds only h. */
static int map_handle(k3k_vmm_t *v, CUdevice dev, size_t gran, bool writable) {
  CUresult r = g_drv.reserve(&v->ptr, v->size, gran, 0, 0);
  if (!cu_ok(r, "cuMemAddressReserve")) return cu_rc(r);
  v->reserved = true;
  r = g_drv.map(v->ptr, v->size, 0, v->h, 0);
  if (!cu_ok(r, "cuMemMap")) return cu_rc(r);
  v->mapped = true;
  CUmemAccessDesc a;
  memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = (int)dev;
  a.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  r = g_drv.set_access(v->ptr, v->size, &a, 1);
  if (!cu_ok(r, "cuMemSetAccess")) return cu_rc(r);
  return 0;
}

static int granularity(CUdevice dev, size_t *gran) {
  CUmemAllocationProp p;
  prop_of(&p, dev);
  if (!CU_OK(g_drv.granularity(gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) || !*gran) return K3_EDEVICE;
  return 0;
}

extern "C" int k3k_vmm_alloc(k3k_backend_t *be, size_t bytes, k3k_vmm_t **out) {
  if (!out || !bytes) return K3_EINVAL;
  CUdevice dev;
  int ordinal, rc = device_of(be, &ordinal, &dev);
  size_t gran = 0;
  if (!rc) rc = granularity(dev, &gran);
  if (rc) return rc;
  k3k_vmm_t *v = (k3k_vmm_t *)calloc(1, sizeof *v);
  if (!v) return K3_ENOMEM;
  v->device = ordinal;
  v->size = (bytes + gran - 1) / gran * gran;
  CUmemAllocationProp p;
  prop_of(&p, dev);
  CUresult r = g_drv.create(&v->h, v->size, &p, 0);
  if (!cu_ok(r, "cuMemCreate")) {
    K3_ERROR("cuda vmm: cannot allocate %zu bytes of shareable memory on device %d", v->size, ordinal);
    free(v);
    return cu_rc(r);
  }
  v->have_handle = true;
  if ((rc = map_handle(v, dev, gran, true))) {
    teardown(v);
    free(v);
    return rc;
  }
  *out = v;
  return 0;
}

extern "C" int k3k_vmm_export(const k3k_vmm_t *v, int *fd) {
  if (!v || !fd) return K3_EINVAL;
  int f = -1;
  if (!CU_OK(g_drv.export_handle(&f, v->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) || f < 0) return K3_EDEVICE;
  *fd = f;
  return 0;
}

extern "C" int k3k_vmm_import(k3k_backend_t *be, int fd, size_t bytes, bool writable, k3k_vmm_t **out) {
  if (!out || fd < 0 || !bytes) return K3_EINVAL;
  CUdevice dev;
  int ordinal, rc = device_of(be, &ordinal, &dev);
  size_t gran = 0;
  if (!rc) rc = granularity(dev, &gran);
  if (rc) return rc;
  k3k_vmm_t *v = (k3k_vmm_t *)calloc(1, sizeof *v);
  if (!v) return K3_ENOMEM;
  v->device = ordinal;
  v->size = (bytes + gran - 1) / gran * gran;
  /* the driver takes the descriptor's value as the "handle" argument (it does not close it) */
  CUresult r = g_drv.import_handle(&v->h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (!cu_ok(r, "cuMemImportFromShareableHandle")) {
    free(v);
    return K3_EDEVICE;
  }
  v->have_handle = true;
  if ((rc = map_handle(v, dev, gran, writable))) {
    if (rc == K3_EINVAL)
      K3_ERROR("cuda vmm: cannot map %zu bytes of the imported allocation (larger than it?)", v->size);
    teardown(v);
    free(v);
    return rc;
  }
  *out = v;
  return 0;
}

extern "C" void *k3k_vmm_ptr(const k3k_vmm_t *v) { return v ? (void *)(uintptr_t)v->ptr : NULL; }
extern "C" size_t k3k_vmm_size(const k3k_vmm_t *v) { return v ? v->size : 0; }

extern "C" void k3k_vmm_free(k3k_vmm_t *v) {
  if (!v) return;
  cudaSetDevice(v->device);
  teardown(v);
  free(v);
}
