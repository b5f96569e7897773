/* The loaded objects, as the runtime classifies them. */
#define _GNU_SOURCE
#include <link.h>
#include <string.h>

#include "runtime.h"

int locus_system_object(const struct dl_phdr_info *info) {
  const char *n = info->dlpi_name;
  static const char *const dirs[] = {"/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/"};
  if (!n || !n[0]) return 0;     /* the program */
  if (!strchr(n, '/')) return 1; /* linux-vdso.so.1 */
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
    if (strncmp(n, dirs[i], strlen(dirs[i])) == 0) return 1;
  for (int i = 0; i < info->dlpi_phnum; i++) { /* liblocus.so, wherever it is */
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uint64_t lo = info->dlpi_addr + ph->p_vaddr, self = (uint64_t)(uintptr_t)&locus_system_object;
    if (ph->p_type == PT_LOAD && self >= lo && self < lo + ph->p_memsz) return 1;
  }
  return 0;
}
