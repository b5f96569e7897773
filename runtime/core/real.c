#define _GNU_SOURCE
#include "real.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime.h"

struct locus_real locus_real;

#define R(field, name) locus_real.field = (__typeof__(locus_real.field))dlsym(RTLD_NEXT, name)
/* glibc keeps an old pthread_cond_* ABI at a lower version; ask for the current one. */
#define RV(field, name, ver)                                                       \
  do {                                                                             \
    locus_real.field = (__typeof__(locus_real.field))dlvsym(RTLD_NEXT, name, ver); \
    if (!locus_real.field) R(field, name);                                         \
  } while (0)

void locus_real_resolve(void) {
  R(mutex_lock, "pthread_mutex_lock");
  R(mutex_trylock, "pthread_mutex_trylock");
  R(mutex_timedlock, "pthread_mutex_timedlock");
  R(mutex_unlock, "pthread_mutex_unlock");
  R(mutex_init, "pthread_mutex_init");
  R(mutex_destroy, "pthread_mutex_destroy");
  R(rw_rdlock, "pthread_rwlock_rdlock");
  R(rw_wrlock, "pthread_rwlock_wrlock");
  R(rw_tryrdlock, "pthread_rwlock_tryrdlock");
  R(rw_trywrlock, "pthread_rwlock_trywrlock");
  R(rw_timedrdlock, "pthread_rwlock_timedrdlock");
  R(rw_timedwrlock, "pthread_rwlock_timedwrlock");
  R(rw_unlock, "pthread_rwlock_unlock");
  R(rw_init, "pthread_rwlock_init");
  R(spin_lock, "pthread_spin_lock");
  R(spin_trylock, "pthread_spin_trylock");
  R(spin_unlock, "pthread_spin_unlock");
  RV(cond_wait, "pthread_cond_wait", "GLIBC_2.3.2");
  RV(cond_timedwait, "pthread_cond_timedwait", "GLIBC_2.3.2");
  RV(cond_signal, "pthread_cond_signal", "GLIBC_2.3.2");
  RV(cond_broadcast, "pthread_cond_broadcast", "GLIBC_2.3.2");
  R(barrier_wait, "pthread_barrier_wait");
  R(barrier_init, "pthread_barrier_init");
  R(sem_wait, "sem_wait");
  R(sem_trywait, "sem_trywait");
  R(sem_timedwait, "sem_timedwait");
  R(sem_post, "sem_post");
  R(create, "pthread_create");
  R(join, "pthread_join");
  R(exit_, "exit");
  R(_exit_, "_exit");
  R(_Exit_, "_Exit");
  R(execve, "execve");
  R(execvp, "execvp");
  R(execvpe, "execvpe");
  /* The OpenMP entry points are resolved at their first call (REAL): in a program without
   * an OpenMP runtime each failed lookup allocates its error message on the program's heap
   * (768 bytes before main), which moves every block the program allocates after it. */
}

/* A definition of `name` in the local scope of a loaded object: a library the program
 * loaded with dlopen(RTLD_LOCAL) (Python loads its extension modules so) brings its
 * dependencies in its own scope only, out of RTLD_NEXT's reach: an OpenMP extension's
 * libgomp. Its calls to GOMP_parallel still bind to the runtime's interposer, which must
 * then find libgomp's there. dlsym on each object's handle searches the object and its
 * dependencies; the runtime's own definitions are skipped. The objects' names are copied
 * first, then opened: dlopen inside dl_iterate_phdr's callback would take the loader's
 * load lock under its write lock, the reverse of a concurrent dlopen's order. */
#define NAMES_BYTES (64u << 10)
struct names {
  char *buf;
  size_t used;
};

static int name_cb(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  struct names *n = data;
  if (!info->dlpi_name || !info->dlpi_name[0]) return 0; /* the program: RTLD_NEXT's scope */
  size_t len = strlen(info->dlpi_name) + 1;
  if (n->used + len > NAMES_BYTES) return 1;
  memcpy(n->buf + n->used, info->dlpi_name, len);
  n->used += len;
  return 0;
}

static void *local_definition(const char *name) {
  Dl_info self;
  if (!dladdr((void *)local_definition, &self)) return NULL;
  /* (the runtime's own mapping: not one the program's mmap records would show) */
  struct names n = {
      locus_sys_mmap(NULL, NAMES_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
      0};
  if (n.buf == MAP_FAILED) return NULL;
  dl_iterate_phdr(name_cb, &n);
  void *found = NULL;
  for (size_t at = 0; at < n.used && !found; at += strlen(n.buf + at) + 1) {
    void *h = dlopen(n.buf + at, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    void *p = dlsym(h, name);
    Dl_info di;
    if (p && dladdr(p, &di) && di.dli_fbase != self.dli_fbase) found = p;
    dlclose(h);
  }
  locus_sys_munmap(n.buf, NAMES_BYTES);
  return found;
}

void *locus_real_need(void **slot, const char *name) {
  void *p = dlsym(RTLD_NEXT, name);
  if (!p) p = local_definition(name);
  if (!p) {
    locus_warn("an interposed function has no implementation to forward to; aborting:");
    locus_warn(name);
    abort();
  }
  *slot = p;
  return p;
}
