/* Interposers of the numa lens. They forward, and only when the lens is on:
 *   - binding: sched_setaffinity, pthread_setaffinity_np, set_mempolicy, mbind, move_pages
 *     (libnuma's, or the raw system call when no library defines them) write a pinning-log
 *     record after a successful call;
 *   - first touch: mprotect and mremap of a tracked region end its tracking first (they
 *     would carry or override our protection); madvise keeps it in step (huge-page
 *     eligibility, pages dropped); read-like calls open the pages of their buffer first,
 *     since the kernel cannot fault a protected page in for them (EFAULT). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../core/real.h"
#include "../comm/allocs.h"
#include "../comm/shared.h"
#include "../numa/numa.h"

#define SITE ((uint64_t)(uintptr_t)__builtin_return_address(0))
#define FT_ON (LOCUS_UNLIKELY(atomic_load_explicit(&locus_ft_live, memory_order_relaxed)))

static uint64_t first_word(const unsigned long *mask, unsigned long maxnode) {
  if (!mask || maxnode == 0) return 0;
  uint64_t m = mask[0];
  if (maxnode < 64) m &= (1ull << maxnode) - 1;
  return m;
}

/* ---- binding ---- */

LOCUS_EXPORT int sched_setaffinity(pid_t pid, size_t size, const cpu_set_t *set) {
  static int (*next)(pid_t, size_t, const cpu_set_t *);
  int rc = NEXT(next, "sched_setaffinity") ? next(pid, size, set)
                                           : (int)syscall(SYS_sched_setaffinity, pid, size, set);
  if (rc == 0 && locus_numa.on) {
    uint32_t n = 0;
    uint64_t nodes = locus_numa_mask_nodes(set, size, &n);
    uint32_t tid = pid ? (uint32_t)pid : locus_me.tid;
    locus_numa_pin(LOCUS_NP_SCHED_SETAFFINITY, tid, nodes, n, 0xff, 0, 0, 0, SITE);
  }
  return rc;
}

LOCUS_EXPORT int pthread_setaffinity_np(pthread_t th, size_t size, const cpu_set_t *set) {
  static int (*next)(pthread_t, size_t, const cpu_set_t *);
  if (!NEXT(next, "pthread_setaffinity_np")) return ENOSYS;
  int rc = next(th, size, set);
  if (rc == 0 && locus_numa.on) {
    uint32_t n = 0;
    uint64_t nodes = locus_numa_mask_nodes(set, size, &n);
    uint32_t tid =
        pthread_equal(th, pthread_self()) ? locus_me.tid : locus_join_map_peek((unsigned long)th);
    locus_numa_pin(LOCUS_NP_PTHREAD_SETAFFINITY, tid, nodes, n, 0xff, 0, 0, 0, SITE);
  }
  return rc;
}

LOCUS_EXPORT long set_mempolicy(int mode, const unsigned long *mask, unsigned long maxnode) {
  static long (*next)(int, const unsigned long *, unsigned long);
  long rc = NEXT(next, "set_mempolicy") ? next(mode, mask, maxnode)
                                        : syscall(SYS_set_mempolicy, mode, mask, maxnode);
  if (rc == 0 && locus_numa.on) {
    uint32_t n = 0;
    uint64_t nodes = locus_numa_self_nodes(&n);
    locus_numa_pin(LOCUS_NP_SET_MEMPOLICY, locus_me.tid, nodes, n, (uint8_t)(mode & 0xff),
                   first_word(mask, maxnode), 0, 0, SITE);
  }
  return rc;
}

LOCUS_EXPORT long mbind(void *addr, unsigned long len, int mode, const unsigned long *mask,
                        unsigned long maxnode, unsigned flags) {
  static long (*next)(void *, unsigned long, int, const unsigned long *, unsigned long, unsigned);
  long rc = NEXT(next, "mbind") ? next(addr, len, mode, mask, maxnode, flags)
                                : syscall(SYS_mbind, addr, len, mode, mask, maxnode, flags);
  if (rc == 0 && locus_numa.on) {
    uint32_t n = 0;
    uint64_t nodes = locus_numa_self_nodes(&n);
    locus_numa_pin(LOCUS_NP_MBIND, locus_me.tid, nodes, n, (uint8_t)(mode & 0xff),
                   first_word(mask, maxnode), (uint64_t)(uintptr_t)addr, len, SITE);
  }
  return rc;
}

LOCUS_EXPORT long move_pages(int pid, unsigned long count, void **pages, const int *nodes,
                             int *status, int flags) {
  static long (*next)(int, unsigned long, void **, const int *, int *, int);
  long rc = NEXT(next, "move_pages")
                ? next(pid, count, pages, nodes, status, flags)
                : syscall(SYS_move_pages, pid, count, pages, nodes, status, flags);
  if (rc >= 0 && nodes && count && locus_numa.on) {
    uint64_t targets = 0;
    for (unsigned long i = 0; i < count; i++)
      if (nodes[i] >= 0 && nodes[i] < 64) targets |= 1ull << nodes[i];
    uint32_t n = 0;
    uint64_t allowed = locus_numa_self_nodes(&n);
    locus_numa_pin(LOCUS_NP_MOVE_PAGES, locus_me.tid, allowed, n, 0xff, targets,
                   (uint64_t)(uintptr_t)pages[0], count, SITE);
  }
  return rc;
}

/* ---- protection changes of tracked regions ---- */

LOCUS_EXPORT int mprotect(void *a, size_t n, int prot) {
  static int (*next)(void *, size_t, int);
  if (FT_ON) locus_ft_release(a, n);
  return NEXT(next, "mprotect") ? next(a, n, prot) : (int)syscall(SYS_mprotect, a, n, prot);
}

/* Locking memory populates it (in this thread): a protected page cannot be (ENOMEM). */
LOCUS_EXPORT int mlock(const void *a, size_t n) {
  static int (*next)(const void *, size_t);
  if (FT_ON) locus_ft_prepare((uintptr_t)a, n, SITE, 1);
  return NEXT(next, "mlock") ? next(a, n) : (int)syscall(SYS_mlock, a, n);
}

LOCUS_EXPORT int mlock2(const void *a, size_t n, unsigned flags) {
  static int (*next)(const void *, size_t, unsigned);
  if (FT_ON && !(flags & MLOCK_ONFAULT)) locus_ft_prepare((uintptr_t)a, n, SITE, 1);
  return NEXT(next, "mlock2") ? next(a, n, flags) : (int)syscall(SYS_mlock2, a, n, flags);
}

LOCUS_EXPORT int mlockall(int flags) {
  static int (*next)(int);
  if (locus_numa.on && !(flags & MCL_ONFAULT)) locus_ft_mlockall(flags, SITE);
  return NEXT(next, "mlockall") ? next(flags) : (int)syscall(SYS_mlockall, flags);
}

LOCUS_EXPORT int madvise(void *a, size_t n, int advice) {
  static int (*next)(void *, size_t, int);
  int rc = NEXT(next, "madvise") ? next(a, n, advice) : (int)syscall(SYS_madvise, a, n, advice);
  if (rc == 0 && locus_numa.on) {
    if (advice == MADV_DONTNEED || advice == MADV_REMOVE || advice == MADV_FREE)
      locus_numa_pages_changed();
    if (FT_ON) locus_ft_madvise(a, n, advice);
  }
  return rc;
}

LOCUS_EXPORT void *mremap(void *old, size_t old_n, size_t new_n, int flags, ...) {
  static void *(*next)(void *, size_t, size_t, int, ...);
  void *fixed = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    fixed = va_arg(ap, void *);
    va_end(ap);
  }
  if (FT_ON) {
    locus_ft_release(old, old_n);
    if (fixed) locus_ft_release(fixed, new_n);
  }
  /* Shared memory moved keeps its object and offset (comm/shared.c). */
  struct locus_shared_loc was;
  int shared = locus_shared_tracking && locus_shared_find((uint64_t)(uintptr_t)old, &was) == 0;
  void *rc;
  if (!NEXT(next, "mremap"))
    rc = (void *)syscall(SYS_mremap, old, old_n, new_n, flags, fixed);
  else
    rc = (flags & MREMAP_FIXED) ? next(old, old_n, new_n, flags, fixed)
                                : next(old, old_n, new_n, flags);
  if (locus_numa.on && rc != MAP_FAILED) locus_numa_pages_changed();
  if ((__atomic_load_n(&locus_alloc_state, __ATOMIC_ACQUIRE) & LOCUS_ALLOC_TRACKING) &&
      rc != MAP_FAILED)
    locus_allocs_record_remap(old, old_n, rc, new_n, SITE);
  if (locus_shared_tracking && rc != MAP_FAILED) {
    locus_shared_remove((uint64_t)(uintptr_t)old, old_n);
    locus_shared_remove((uint64_t)(uintptr_t)rc, new_n);
    if (shared)
      locus_shared_add((uint64_t)(uintptr_t)rc, (new_n + 4095) & ~(size_t)4095, was.dev, was.ino,
                       was.off);
  }
  return rc;
}

/* System V shared memory attached while the comm lens records: memory other processes of the
 * run may share (comm/shared.c), as a MAP_SHARED mmap. */
LOCUS_EXPORT void *shmat(int id, const void *addr, int flags) {
  static void *(*next)(int, const void *, int);
  void *rc =
      NEXT(next, "shmat") ? next(id, addr, flags) : (void *)syscall(SYS_shmat, id, addr, flags);
  struct shmid_ds ds;
  int tracking = __atomic_load_n(&locus_alloc_state, __ATOMIC_ACQUIRE) & LOCUS_ALLOC_TRACKING;
  int saved = errno;
  if ((locus_shared_tracking || tracking) && rc != (void *)-1 && shmctl(id, IPC_STAT, &ds) == 0) {
    if (locus_shared_tracking) locus_shared_mapped((uint64_t)(uintptr_t)rc, ds.shm_segsz, 0);
    if (tracking)
      locus_allocs_record_mapping(rc, ds.shm_segsz, SITE, -1, 0, LOCUS_ALF_SHARED | LOCUS_ALF_SYSV);
  }
  errno = saved;
  return rc;
}

LOCUS_EXPORT int shmdt(const void *addr) {
  static int (*next)(const void *);
  int rc = NEXT(next, "shmdt") ? next(addr) : (int)syscall(SYS_shmdt, addr);
  if (rc != 0) return rc;
  uint64_t len = locus_shared_tracking ? locus_shared_detach((uint64_t)(uintptr_t)addr) : 0;
  if (len && (__atomic_load_n(&locus_alloc_state, __ATOMIC_ACQUIRE) & LOCUS_ALLOC_TRACKING))
    locus_allocs_record(LOCUS_AL_MUNMAP, addr, len, SITE);
  return rc;
}

LOCUS_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
  static int (*next)(int, const sigset_t *, sigset_t *);
  sigset_t copy;
  set = locus_keep_unblocked(how, set, &copy);
  return NEXT(next, "sigprocmask") ? next(how, set, old)
                                   : (int)syscall(SYS_rt_sigprocmask, how, set, old, 8);
}

LOCUS_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old) {
  static int (*next)(int, const sigset_t *, sigset_t *);
  sigset_t copy;
  set = locus_keep_unblocked(how, set, &copy);
  return NEXT(next, "pthread_sigmask") ? next(how, set, old) : ENOSYS;
}

LOCUS_TLS struct locus_altstack locus_alt;

/* An alternate signal stack the kernel writes signal frames to: never kept protected.
 * While the runtime's own stack is installed (soft sampling), a smaller one the program
 * sets stays virtual: the program's handlers run on ours (the runtime's handlers overflowed
 * a 2-4 KiB one: SIGSEGV; 8 KiB ran), and it reads back what it set. One of 32 KiB or more
 * replaces ours for real. */
#define LOCUS_ALTSTACK_ENOUGH (32u << 10)
LOCUS_EXPORT int sigaltstack(const stack_t *ss, stack_t *old) {
  static int (*next)(const stack_t *, stack_t *);
  if (FT_ON && ss && !(ss->ss_flags & SS_DISABLE)) locus_ft_release(ss->ss_sp, ss->ss_size);
  struct locus_altstack *a = &locus_alt;
  stack_t cur;
  if (!a->sp || syscall(SYS_sigaltstack, NULL, &cur) != 0 || cur.ss_sp != a->sp) {
    a->sp = NULL; /* ours is gone (a raw syscall replaced it): nothing to keep */
    return NEXT(next, "sigaltstack") ? next(ss, old) : (int)syscall(SYS_sigaltstack, ss, old);
  }
  int on = cur.ss_flags & SS_ONSTACK;
  stack_t was = {.ss_sp = a->prog_sp, .ss_size = a->prog_size, .ss_flags = a->prog_flags};
  if (!(was.ss_flags & SS_DISABLE)) was.ss_flags |= on;
  if (ss) {
    if (on) {
      errno = EPERM;
      return -1;
    }
    if (ss->ss_flags & SS_DISABLE) {
      a->prog_sp = NULL;
      a->prog_size = 0;
      a->prog_flags = SS_DISABLE;
    } else if (ss->ss_size < 2048) { /* the kernel's MINSIGSTKSZ (glibc's may be larger) */
      errno = ENOMEM;
      return -1;
    } else if (ss->ss_size >= LOCUS_ALTSTACK_ENOUGH) {
      int r = NEXT(next, "sigaltstack") ? next(ss, NULL) : (int)syscall(SYS_sigaltstack, ss, NULL);
      if (r != 0) return r;
      munmap(a->sp, a->size); /* not on it (checked above) */
      a->sp = NULL;
    } else {
      a->prog_sp = ss->ss_sp;
      a->prog_size = ss->ss_size;
      a->prog_flags = ss->ss_flags;
    }
  }
  if (old) *old = was;
  return 0;
}

/* The I/O interposers' next functions: resolved at load (a program whose first write() is
 * in a signal handler must not meet dlsym there), else at first use. */
/* clang-format off */
#define IO_FUNCS(X) \
  X(read) X(pread) X(pread64) X(readv) X(preadv) X(recv) \
  X(recvfrom) X(recvmsg) X(fread) X(fread_unlocked) X(getrandom) X(getdents64) \
  X(preadv2) X(recvmmsg) X(epoll_wait) X(epoll_pwait) X(write) X(pwrite) \
  X(pwrite64) X(writev) X(pwritev) X(send) X(sendto) X(sendmsg) \
  X(fwrite) X(fwrite_unlocked)
/* clang-format on */
#define IO_DECL(f) static __typeof__(&f) real_##f;
#define IO_NEXT(f) (real_##f ? real_##f : (real_##f = (__typeof__(real_##f))dlsym(RTLD_NEXT, #f)))
#define IO_RESOLVE(f) (void)IO_NEXT(f);
#undef fread_unlocked
#undef fwrite_unlocked
IO_FUNCS(IO_DECL)
__attribute__((constructor(102))) static void resolve_io(void) { IO_FUNCS(IO_RESOLVE) }

/* ---- calls the kernel writes into: open the buffer's pages first (as written) ---- */

static void prepare_iov(const struct iovec *iov, int n, uint64_t site, int write) {
  for (int i = 0; i < n; i++)
    locus_ft_prepare((uintptr_t)iov[i].iov_base, iov[i].iov_len, site, write);
}

LOCUS_EXPORT ssize_t read(int fd, void *buf, size_t n) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(read) ? real_read(fd, buf, n) : syscall(SYS_read, fd, buf, n);
}

LOCUS_EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(pread) ? real_pread(fd, buf, n, off) : syscall(SYS_pread64, fd, buf, n, off);
}

LOCUS_EXPORT ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(pread64) ? real_pread64(fd, buf, n, off) : syscall(SYS_pread64, fd, buf, n, off);
}

LOCUS_EXPORT ssize_t readv(int fd, const struct iovec *iov, int n) {
  if (FT_ON) prepare_iov(iov, n, SITE, 1);
  return IO_NEXT(readv) ? real_readv(fd, iov, n) : syscall(SYS_readv, fd, iov, n);
}

LOCUS_EXPORT ssize_t preadv(int fd, const struct iovec *iov, int n, off_t off) {
  if (FT_ON) prepare_iov(iov, n, SITE, 1);
  return IO_NEXT(preadv) ? real_preadv(fd, iov, n, off) : syscall(SYS_preadv, fd, iov, n, off, 0);
}

LOCUS_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(recv) ? real_recv(fd, buf, n, flags)
                       : syscall(SYS_recvfrom, fd, buf, n, flags, NULL, NULL);
}

LOCUS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from,
                              socklen_t *len) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(recvfrom) ? real_recvfrom(fd, buf, n, flags, from, len)
                           : syscall(SYS_recvfrom, fd, buf, n, flags, from, len);
}

LOCUS_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
  if (FT_ON && msg) prepare_iov(msg->msg_iov, (int)msg->msg_iovlen, SITE, 1);
  return IO_NEXT(recvmsg) ? real_recvmsg(fd, msg, flags) : syscall(SYS_recvmsg, fd, msg, flags);
}

LOCUS_EXPORT size_t fread(void *buf, size_t size, size_t n, FILE *f) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, size * n, SITE, 1);
  return IO_NEXT(fread) ? real_fread(buf, size, n, f) : 0;
}

#undef fread_unlocked
LOCUS_EXPORT size_t fread_unlocked(void *buf, size_t size, size_t n, FILE *f) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, size * n, SITE, 1);
  return IO_NEXT(fread_unlocked) ? real_fread_unlocked(buf, size, n, f) : 0;
}

/* More calls the kernel writes into. */
LOCUS_EXPORT ssize_t getrandom(void *buf, size_t n, unsigned flags) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(getrandom) ? real_getrandom(buf, n, flags) : syscall(SYS_getrandom, buf, n, flags);
}

LOCUS_EXPORT ssize_t getdents64(int fd, void *buf, size_t n) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 1);
  return IO_NEXT(getdents64) ? real_getdents64(fd, buf, n) : syscall(SYS_getdents64, fd, buf, n);
}

LOCUS_EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags) {
  if (FT_ON) prepare_iov(iov, n, SITE, 1);
  return IO_NEXT(preadv2) ? real_preadv2(fd, iov, n, off, flags)
                          : syscall(SYS_preadv2, fd, iov, n, off, 0, flags);
}

LOCUS_EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *t) {
  if (FT_ON && v)
    for (unsigned i = 0; i < n; i++)
      prepare_iov(v[i].msg_hdr.msg_iov, (int)v[i].msg_hdr.msg_iovlen, SITE, 1);
  return IO_NEXT(recvmmsg) ? real_recvmmsg(fd, v, n, flags, t)
                           : (int)syscall(SYS_recvmmsg, fd, v, n, flags, t);
}

LOCUS_EXPORT int epoll_wait(int ep, struct epoll_event *ev, int n, int ms) {
  if (FT_ON && n > 0) locus_ft_prepare((uintptr_t)ev, (size_t)n * sizeof *ev, SITE, 1);
  return IO_NEXT(epoll_wait) ? real_epoll_wait(ep, ev, n, ms)
                             : (int)syscall(SYS_epoll_pwait, ep, ev, n, ms, NULL, 8);
}

LOCUS_EXPORT int epoll_pwait(int ep, struct epoll_event *ev, int n, int ms, const sigset_t *m) {
  if (FT_ON && n > 0) locus_ft_prepare((uintptr_t)ev, (size_t)n * sizeof *ev, SITE, 1);
  return IO_NEXT(epoll_pwait) ? real_epoll_pwait(ep, ev, n, ms, m)
                              : (int)syscall(SYS_epoll_pwait, ep, ev, n, ms, m, 8);
}

/* ---- calls the kernel reads from: pages never touched are read (the zero page) ---- */

LOCUS_EXPORT ssize_t write(int fd, const void *buf, size_t n) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 0);
  return IO_NEXT(write) ? real_write(fd, buf, n) : syscall(SYS_write, fd, buf, n);
}

LOCUS_EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 0);
  return IO_NEXT(pwrite) ? real_pwrite(fd, buf, n, off) : syscall(SYS_pwrite64, fd, buf, n, off);
}

LOCUS_EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 0);
  return IO_NEXT(pwrite64) ? real_pwrite64(fd, buf, n, off)
                           : syscall(SYS_pwrite64, fd, buf, n, off);
}

LOCUS_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n) {
  if (FT_ON) prepare_iov(iov, n, SITE, 0);
  return IO_NEXT(writev) ? real_writev(fd, iov, n) : syscall(SYS_writev, fd, iov, n);
}

LOCUS_EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off) {
  if (FT_ON) prepare_iov(iov, n, SITE, 0);
  return IO_NEXT(pwritev) ? real_pwritev(fd, iov, n, off)
                          : syscall(SYS_pwritev, fd, iov, n, off, 0);
}

LOCUS_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 0);
  return IO_NEXT(send) ? real_send(fd, buf, n, flags)
                       : syscall(SYS_sendto, fd, buf, n, flags, NULL, 0);
}

LOCUS_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *to,
                            socklen_t len) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, n, SITE, 0);
  return IO_NEXT(sendto) ? real_sendto(fd, buf, n, flags, to, len)
                         : syscall(SYS_sendto, fd, buf, n, flags, to, len);
}

LOCUS_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
  if (FT_ON && msg) prepare_iov(msg->msg_iov, (int)msg->msg_iovlen, SITE, 0);
  return IO_NEXT(sendmsg) ? real_sendmsg(fd, msg, flags) : syscall(SYS_sendmsg, fd, msg, flags);
}

LOCUS_EXPORT size_t fwrite(const void *buf, size_t size, size_t n, FILE *f) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, size * n, SITE, 0);
  return IO_NEXT(fwrite) ? real_fwrite(buf, size, n, f) : 0;
}

#undef fwrite_unlocked
LOCUS_EXPORT size_t fwrite_unlocked(const void *buf, size_t size, size_t n, FILE *f) {
  if (FT_ON) locus_ft_prepare((uintptr_t)buf, size * n, SITE, 0);
  return IO_NEXT(fwrite_unlocked) ? real_fwrite_unlocked(buf, size, n, f) : 0;
}
