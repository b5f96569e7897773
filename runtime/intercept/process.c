/* Interposers for thread and process life: creation and join (so threads are registered
 * and joins become waits the critical path can follow), exit and _exit (the status, and a
 * finished run when no exit handlers run), daemon (its parent's _exit), exec (the old
 * image's run is closed first). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../comm/allocs.h"
#include "../numa/numa.h"
#include "../core/real.h"
#include "../locks/locks.h"

#define SITE ((uint64_t)(uintptr_t)__builtin_return_address(0))

struct tramp {
  void *(*fn)(void *);
  void *arg;
  uint32_t parent;
  struct locus_thread *slot; /* reserved at creation: serials in creation order */
  void *stack;               /* the stack the program gave the thread, else NULL */
  size_t stack_size;         /* its size, else the size glibc gives it; 0 unknown */
};

/* Trampolines come from a small pool, not malloc: free() in the new thread set up a malloc
 * arena for it (glibc reserves 64 MiB of address space per arena), so a program whose
 * threads never allocate took 600 MB of virtual memory with 8 threads under locus, against
 * 11 MB without (RLIMIT_AS, as batch schedulers set it, failed). malloc beyond the pool. */
#define TRAMP_POOL 256
static struct tramp tramp_pool[TRAMP_POOL];
static _Atomic uint8_t tramp_busy[TRAMP_POOL];
static _Atomic uint32_t tramp_next;

static struct tramp *tramp_get(void) {
  for (int k = 0; k < TRAMP_POOL; k++) {
    uint32_t i = atomic_fetch_add_explicit(&tramp_next, 1, memory_order_relaxed) % TRAMP_POOL;
    uint8_t idle = 0;
    if (atomic_compare_exchange_strong(&tramp_busy[i], &idle, 1)) return &tramp_pool[i];
  }
  return malloc(sizeof(struct tramp));
}

static void tramp_put(struct tramp *p) {
  if (p >= tramp_pool && p < tramp_pool + TRAMP_POOL)
    atomic_store_explicit(&tramp_busy[p - tramp_pool], 0, memory_order_release);
  else
    free(p);
}

/* The new thread's stack [lo, hi), as pthread_getattr_np reports it but without its
 * malloc: glibc (x86-64, TLS above the thread pointer's struct pthread) puts the thread
 * descriptor at the top of the block it maps, so the block ends at the page above
 * pthread_self(), and the stack below it has the size the attributes asked. */
static void tramp_stack(const struct tramp *t) {
  if (t->stack && t->stack_size) {
    locus_me.stack_lo = (uintptr_t)t->stack;
    locus_me.stack_hi = (uintptr_t)t->stack + t->stack_size;
    return;
  }
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), self = (uintptr_t)pthread_self();
  uintptr_t here = (uintptr_t)__builtin_frame_address(0);
  uintptr_t hi = (self + page) & ~(page - 1);
  if (!t->stack_size || here >= hi || hi - here >= t->stack_size) return; /* not that layout */
  locus_me.stack_lo = hi - t->stack_size;
  locus_me.stack_hi = hi;
}

static void *trampoline(void *p) {
  struct tramp t = *(struct tramp *)p;
  tramp_put(p);
  tramp_stack(&t);
  locus_thread_start(t.parent, (uint64_t)(uintptr_t)t.fn, t.slot);
  locus_join_map_put((unsigned long)pthread_self(), locus_me.tid);
  return t.fn(t.arg);
}

/* The stack the program gave the thread itself, or NULL (glibc reports an unset address
 * as 0 - size). */
static void *own_stack(const pthread_attr_t *attr, size_t *size) {
  void *sa = NULL;
  *size = 0;
  if (!attr || pthread_attr_getstack(attr, &sa, size) != 0) return NULL;
  return sa && (uintptr_t)sa + *size != 0 ? sa : NULL;
}

/* liblocus's static TLS (~3 KiB) is carved out of every thread's stack, and its interposers
 * and record writers add frames to the program's deepest ones. A small stack size the
 * program chose (PTHREAD_STACK_MIN, 16 KiB, in thread pools) crashed at a depth that ran
 * without locus: such a size gets STACK_ROOM more, in a copy of the attributes (the
 * program's own may be shared by threads creating at the same time). */
#define STACK_ROOM (8u << 10)
#define STACK_SMALL (1u << 20)
static int with_room(const pthread_attr_t *attr, pthread_attr_t *mine) {
  size_t ss = 0, gs = 0;
  if (!attr || own_stack(attr, &ss) || pthread_attr_getstacksize(attr, &ss) != 0 ||
      ss >= STACK_SMALL || pthread_attr_init(mine) != 0)
    return 0;
  int v;
  struct sched_param sp;
  cpu_set_t cpus;
  sigset_t mask;
  int ok =
      pthread_attr_setstacksize(mine, ss + STACK_ROOM) == 0 &&
      pthread_attr_getdetachstate(attr, &v) == 0 && pthread_attr_setdetachstate(mine, v) == 0 &&
      pthread_attr_getguardsize(attr, &gs) == 0 && pthread_attr_setguardsize(mine, gs) == 0 &&
      pthread_attr_getinheritsched(attr, &v) == 0 && pthread_attr_setinheritsched(mine, v) == 0 &&
      pthread_attr_getschedpolicy(attr, &v) == 0 && pthread_attr_setschedpolicy(mine, v) == 0 &&
      pthread_attr_getschedparam(attr, &sp) == 0 && pthread_attr_setschedparam(mine, &sp) == 0 &&
      pthread_attr_getscope(attr, &v) == 0 && pthread_attr_setscope(mine, v) == 0 &&
      pthread_attr_getaffinity_np(attr, sizeof cpus, &cpus) == 0;
  /* An attribute without an affinity reads as all CPUs: set only a narrower one. */
  if (ok && CPU_COUNT(&cpus) < CPU_SETSIZE)
    ok = pthread_attr_setaffinity_np(mine, sizeof cpus, &cpus) == 0;
  int m = ok ? pthread_attr_getsigmask_np(attr, &mask) : -1;
  if (ok && m == 0) ok = pthread_attr_setsigmask_np(mine, &mask) == 0;
  if (!ok || (m != 0 && m != PTHREAD_ATTR_NO_SIGMASK_NP)) {
    pthread_attr_destroy(mine);
    return 0;
  }
  return 1;
}

LOCUS_EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                                void *arg) {
  LOCUS_CALLER_FRAMES(); /* (their locals may be what the new thread is given) */
  /* A stack the program allocated itself must be writable before the thread runs: the
   * kernel cannot deliver the first-touch fault on a stack it cannot write. */
  if (attr && atomic_load_explicit(&locus_ft_live, memory_order_relaxed)) {
    size_t ss = 0;
    void *sa = own_stack(attr, &ss);
    if (sa && ss) locus_ft_release(sa, ss);
  }
  struct locus_self *me = locus_enabled && !locus_me.guard ? locus_self_get() : NULL;
  struct tramp *t = me ? tramp_get() : NULL;
  pthread_attr_t mine;
  int roomy = with_room(attr, &mine);
  if (!t) {
    int r = REAL(create, "pthread_create")(th, roomy ? &mine : attr, fn, arg);
    if (roomy) pthread_attr_destroy(&mine);
    return r;
  }
  t->fn = fn;
  t->arg = arg;
  t->parent = me->tid;
  t->slot = locus_thread_reserve();
  t->stack = own_stack(attr, &t->stack_size);
  if (!t->stack) {
    pthread_attr_t dflt;
    const pthread_attr_t *a = roomy ? &mine : attr;
    if (!a && pthread_getattr_default_np(&dflt) == 0) a = &dflt;
    if (!a || pthread_attr_getstacksize(a, &t->stack_size) != 0) t->stack_size = 0;
    if (a == &dflt) pthread_attr_destroy(&dflt);
  }
  int r = REAL(create, "pthread_create")(th, roomy ? &mine : attr, trampoline, t);
  if (roomy) pthread_attr_destroy(&mine);
  if (r != 0 && t) tramp_put(t); /* its slot, if any, keeps tid 0: not a thread */
  return r;
}

/* A library about to be unloaded: the maps are kept first, so that its statics and code
 * (a plugin's shared counters) are named in the report, not bare addresses; once it is,
 * the soft sampler forgets its code (a library loaded next can take its addresses). */
LOCUS_EXPORT int dlclose(void *handle) {
  static int (*next)(void *);
  if (!locus_me.guard) locus_maps_before_unload();
  int r = NEXT(next, "dlclose") ? next(handle) : -1;
  if (!locus_me.guard) locus_soft_objects_changed();
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
  if (locus_exit_entered() && locus_proc_hdr) locus_proc_hdr->exit_status = status;
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

/* glibc's daemon() ends the parent with an internal _exit that no interposer sees: the
 * parent's records were left unfinished and every daemonising run read "incomplete"
 * (memcached -d). The same steps here (glibc misc/daemon.c), with the parent leaving
 * through the _exit above. */
LOCUS_EXPORT int daemon(int nochdir, int noclose) {
  switch (fork()) {
    case -1:
      return -1;
    case 0:
      break;
    default:
      _exit(0);
  }
  if (setsid() == -1) return -1;
  if (!nochdir) (void)!chdir("/");
  if (!noclose) {
    struct stat st;
    int fd = open("/dev/null", O_RDWR);
    if (fd == -1) return -1;
    if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
      close(fd);
      errno = ENODEV;
      return -1;
    }
    dup2(fd, STDIN_FILENO);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    if (fd > 2) close(fd);
  }
  return 0;
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
  if (option == PR_SET_SECCOMP && a2 == SECCOMP_MODE_STRICT)
    locus_seccomp_before(SECCOMP_SET_MODE_STRICT, NULL);
  if (option == PR_SET_SECCOMP && a2 == SECCOMP_MODE_FILTER)
    locus_seccomp_before(SECCOMP_SET_MODE_FILTER, (const void *)a3);
  long rc = syscall(SYS_prctl, option, a2, a3, a4, a5);
  if (option == PR_SET_TSC) locus_tsc_check();
  return (int)rc;
}

/* libc's syscall(), for seccomp(2) (glibc has no wrapper of its own: libseccomp and most
 * programs install their filters through this). The call itself is made here (a raw system
 * call, errno as glibc sets it): the runtime's own syscall() calls come through too, from
 * signal handlers, where looking the next definition up would not be safe. */
LOCUS_EXPORT long syscall(long nr, ...) {
  va_list ap;
  va_start(ap, nr);
  long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
  long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
  va_end(ap);
  if (LOCUS_UNLIKELY(nr == SYS_seccomp)) locus_seccomp_before(a1, (const void *)a3);
  register long r10 __asm__("r10") = a4, r8 __asm__("r8") = a5, r9 __asm__("r9") = a6;
  long rc;
  __asm__ volatile("syscall"
                   : "=a"(rc)
                   : "0"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  if ((unsigned long)rc > -4096ul) {
    errno = (int)-rc;
    return -1;
  }
  return rc;
}
