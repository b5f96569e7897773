/* Interposers for thread and process life: creation and join (so threads are registered
 * and joins become waits the critical path can follow), exit and _exit (the status, and a
 * finished run when no exit handlers run), exec (the old image's run is closed first). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../numa/numa.h"
#include "../core/real.h"
#include "../locks/locks.h"

#define SITE ((uint64_t)(uintptr_t)__builtin_return_address(0))

struct tramp {
  void *(*fn)(void *);
  void *arg;
  uint32_t parent;
  struct locus_thread *slot; /* reserved at creation: serials in creation order */
};

static void *trampoline(void *p) {
  struct tramp t = *(struct tramp *)p;
  free(p);
  locus_thread_start(t.parent, (uint64_t)(uintptr_t)t.fn, t.slot);
  locus_join_map_put((unsigned long)pthread_self(), locus_me.tid);
  return t.fn(t.arg);
}

LOCUS_EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                                void *arg) {
  /* A stack the program allocated itself must be writable before the thread runs: the
   * kernel cannot deliver the first-touch fault on a stack it cannot write. */
  if (attr && atomic_load_explicit(&locus_ft_live, memory_order_relaxed)) {
    void *sa = NULL;
    size_t ss = 0;
    if (pthread_attr_getstack(attr, &sa, &ss) == 0 && sa && ss) locus_ft_release(sa, ss);
  }
  struct locus_self *me = locus_enabled && !locus_me.guard ? locus_self_get() : NULL;
  struct tramp *t = me ? malloc(sizeof *t) : NULL;
  if (!t) return REAL(create, "pthread_create")(th, attr, fn, arg);
  t->fn = fn;
  t->arg = arg;
  t->parent = me->tid;
  t->slot = locus_thread_reserve();
  int r = REAL(create, "pthread_create")(th, attr, trampoline, t);
  if (r != 0) free(t); /* its slot, if any, keeps tid 0: not a thread */
  return r;
}

LOCUS_EXPORT int pthread_join(pthread_t th, void **ret) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(join, "pthread_join")(th, ret);
  uint64_t t;
  locus_wait_begin(me, &t);
  int r = REAL(join, "pthread_join")(th, ret);
  uint32_t tid = r == 0 ? locus_join_map_take((unsigned long)th) : 0;
  locus_wait_end(me, LOCUS_LK_JOIN, NULL, tid, SITE, t, r != 0);
  return r;
}

LOCUS_EXPORT void exit(int status) {
  if (locus_proc_hdr) locus_proc_hdr->exit_status = status;
  REAL(exit_, "exit")(status);
}

LOCUS_EXPORT void _exit(int status) {
  locus_proc_finish(status, LOCUS_PROC_EXITED);
  REAL(_exit_, "_exit")(status);
}

LOCUS_EXPORT void _Exit(int status) {
  locus_proc_finish(status, LOCUS_PROC_EXITED);
  REAL(_Exit_, "_Exit")(status);
}

/* ---- exec ---- */
LOCUS_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
  locus_before_exec();
  int r = REAL(execve, "execve")(path, argv, envp);
  locus_after_failed_exec();
  return r;
}

LOCUS_EXPORT int execv(const char *path, char *const argv[]) {
  extern char **environ;
  return execve(path, argv, environ);
}

LOCUS_EXPORT int execvp(const char *file, char *const argv[]) {
  locus_before_exec();
  int r = REAL(execvp, "execvp")(file, argv);
  locus_after_failed_exec();
  return r;
}

LOCUS_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
  locus_before_exec();
  int r = REAL(execvpe, "execvpe")(file, argv, envp);
  locus_after_failed_exec();
  return r;
}

/* The variadic forms gather their arguments (on the stack, as glibc does) and call the
 * vector forms. */
static size_t count_args(const char *first, va_list ap) {
  size_t n = 1;
  if (first)
    while (va_arg(ap, char *)) n++;
  return n;
}

#define GATHER(first, argv)                                          \
  va_list ap, cp;                                                    \
  va_start(ap, first);                                               \
  va_copy(cp, ap);                                                   \
  size_t n_ = count_args(first, cp);                                 \
  va_end(cp);                                                        \
  char *argv[n_ + 1];                                                \
  argv[0] = (char *)(first);                                         \
  for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = va_arg(ap, char *); \
  argv[n_] = NULL

LOCUS_EXPORT int execl(const char *path, const char *arg, ...) {
  GATHER(arg, argv);
  va_end(ap);
  return execv(path, argv);
}

LOCUS_EXPORT int execlp(const char *file, const char *arg, ...) {
  GATHER(arg, argv);
  va_end(ap);
  return execvp(file, argv);
}

LOCUS_EXPORT int execle(const char *path, const char *arg, ...) {
  GATHER(arg, argv);
  char *const *envp = va_arg(ap, char *const *);
  va_end(ap);
  return execve(path, argv, envp);
}

/* prctl(PR_SET_TSC, PR_TSC_SIGSEGV) makes rdtsc fault in this thread: the runtime's clock
 * (locus_ticks, also in signal handlers) stops reading the TSC. */
LOCUS_EXPORT int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
  unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
  va_end(ap);
  /* Off before the call: a sample landing between the call and the check must not rdtsc. */
  if (option == PR_SET_TSC && a2 == PR_TSC_SIGSEGV) locus_tsc_off = 1;
  long rc = syscall(SYS_prctl, option, a2, a3, a4, a5);
  if (option == PR_SET_TSC) locus_tsc_check();
  return (int)rc;
}
