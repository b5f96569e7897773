/* Interposers that keep the program from closing or replacing the runtime's descriptors
 * (core/fds.c): close() of one is a no-op that succeeds, close_range() and closefrom()
 * close around them, dup2() and dup3() onto one fail with EBADF (as for a descriptor out
 * of range). When the program closes or replaces its stderr, the runtime's copy follows
 * (locus_follow_stderr). Everything else goes through untouched. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../core/real.h"
#include "../core/runtime.h"

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

LOCUS_EXPORT int close(int fd) {
  static int (*next)(int);
  if (LOCUS_UNLIKELY(locus_fd_owned(fd))) return 0;
  int rc = NEXT(next, "close") ? next(fd) : (int)syscall(SYS_close, fd);
  if (LOCUS_UNLIKELY(fd == 2) && rc == 0) locus_follow_stderr();
  return rc;
}

/* close_range on [first, last] minus the runtime's descriptors. */
static int close_around(unsigned first, unsigned last, int flags) {
  int rc = 0;
  while (first <= last) {
    int own = locus_fd_next_owned(first, last);
    unsigned to = own < 0 ? last : (unsigned)own - 1;
    if (own < 0 || (unsigned)own > first)
      if (syscall(SYS_close_range, first, to, flags) != 0) rc = -1;
    if (own < 0 || (unsigned)own == ~0u) break;
    first = (unsigned)own + 1;
  }
  return rc;
}

LOCUS_EXPORT int close_range(unsigned first, unsigned last, int flags) {
  if (first > last) {
    errno = EINVAL;
    return -1;
  }
  return close_around(first, last, flags);
}

LOCUS_EXPORT void closefrom(int lowfd) {
  static void (*next)(int);
  if (lowfd < 0) lowfd = 0;
  if (locus_fd_next_owned((unsigned)lowfd, ~0u) < 0 && NEXT(next, "closefrom")) {
    next(lowfd);
    return;
  }
  if (close_around((unsigned)lowfd, ~0u, 0) == 0) return;
  /* No close_range (Linux < 5.9): one by one, up to the limit. */
  long max = sysconf(_SC_OPEN_MAX);
  for (long fd = lowfd; fd < max; fd++) close((int)fd);
}

LOCUS_EXPORT int dup2(int oldfd, int newfd) {
  static int (*next)(int, int);
  if (LOCUS_UNLIKELY(locus_fd_owned(newfd))) {
    errno = EBADF;
    return -1;
  }
  int rc = NEXT(next, "dup2") ? next(oldfd, newfd) : (int)syscall(SYS_dup2, oldfd, newfd);
  if (LOCUS_UNLIKELY(newfd == 2) && rc == 2) locus_follow_stderr();
  return rc;
}

LOCUS_EXPORT int dup3(int oldfd, int newfd, int flags) {
  static int (*next)(int, int, int);
  if (LOCUS_UNLIKELY(locus_fd_owned(newfd))) {
    errno = EBADF;
    return -1;
  }
  int rc =
      NEXT(next, "dup3") ? next(oldfd, newfd, flags) : (int)syscall(SYS_dup3, oldfd, newfd, flags);
  if (LOCUS_UNLIKELY(newfd == 2) && rc == 2) locus_follow_stderr();
  return rc;
}
