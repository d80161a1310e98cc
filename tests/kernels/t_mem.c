/* Host memory of the CPU backends (kernels/cpu/cpu_backend.c k3k_cpu_mem_alloc): every
 * allocation is 64-byte aligned and writable to its last byte; ones of 32 MiB or more are also
 * 2 MiB-aligned (they are advised MADV_HUGEPAGE; whether the kernel grants huge pages depends on
 * THP settings and fragmentation, so that part is reported, not asserted). free() takes both
 * kinds. Under ASan an overrun of either kind would be caught here. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

void t_mem(void) {
  static const size_t sizes[] = {0, 1, 63, 65, 4096, ((size_t)32 << 20) - 64, (size_t)32 << 20,
                                 ((size_t)33 << 20) + 5};
  for (const char *const *nm = (const char *const[]){"cpu", "cpu-fast", NULL}; *nm; nm++) {
    k3k_backend_t *be = k3k_backend_get(*nm);
    if (!be) continue;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      void *p = NULL;
      int rc = be->alloc(be, sizes[i], &p);
      check(rc == 0 && p, "%s alloc %zu: rc %d", *nm, sizes[i], rc);
      if (rc || !p) continue;
      check(((uintptr_t)p & 63) == 0, "%s alloc %zu: %p not 64-byte aligned", *nm, sizes[i], p);
      if (sizes[i] >= ((size_t)32 << 20))
        check(((uintptr_t)p & (((uintptr_t)2 << 20) - 1)) == 0,
              "%s alloc %zu: %p not 2 MiB aligned", *nm, sizes[i], p);
      if (sizes[i]) {
        memset(p, 0x5A, sizes[i]);
        check(((uint8_t *)p)[sizes[i] - 1] == 0x5A, "%s alloc %zu: last byte", *nm, sizes[i]);
      }
      be->free(be, p);
    }
  }
}
