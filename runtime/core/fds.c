/* The runtime's own file descriptors (record files, the run directory, perf events, a copy
 * of the starting stderr for its warnings),
 * protected from the program. Daemons and shells close every descriptor they did not
 * open (close_range(3, ~0U), closefrom, a close() loop); the runtime's would then be
 * closed and their numbers reused by the program's next open(), and the runtime would
 * write its records into the program's files (fallocate + MAP_SHARED: a 6-byte file
 * became 1 MiB of records). So each of ours is moved above the program's usual range (a
 * quarter of RLIMIT_NOFILE from its top, F_DUPFD_CLOEXEC), remembered in a bitmap, and the
 * interposers of close, close_range, closefrom, dup2 and dup3 leave it alone. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime.h"

#define FD_BITS 65536
static _Atomic uint64_t owned[FD_BITS / 64];
static int fd_base = 3;
int locus_warn_fd = 2;

void locus_fds_init(void) {
  struct rlimit rl;
  long cur =
      getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : 1024;
  long b = cur - cur / 4;
  if (b > FD_BITS - 4096) b = FD_BITS - 4096;
  fd_base = b > 10 ? (int)b : 10;
  /* The runtime's warnings go to the stderr the program started with. */
  int e = (int)syscall(SYS_fcntl, 2, F_DUPFD_CLOEXEC, fd_base);
  if (e >= 0) {
    locus_warn_fd = e;
    if (e < FD_BITS) atomic_fetch_or(&owned[e / 64], 1ull << (e % 64));
  }
}

/* The program closed its stderr, or put another file there: the runtime's warnings go
 * where the program's now go, and the copy of the old one is closed. A daemon pointing 2
 * at /dev/null (daemon(), or by hand) kept the recorder's pipe open through our copy:
 * `locus record -- prog -d 2>&1 | cat` waited for the daemon to end. (glibc's freopen of
 * stderr replaces 2 inside libc, unseen.) */
void locus_follow_stderr(void) {
  int e = locus_warn_fd;
  if (e <= 2) return;
  if (syscall(SYS_dup3, 2, e, O_CLOEXEC) == e) return;
  /* 2 is closed: no more warnings. */
  locus_warn_fd = -1;
  locus_fd_forget(e);
  syscall(SYS_close, e);
}

/* Move fd to the runtime's range and protect it; strict: close it and fail (EMFILE) when
 * the range is full, rather than keep a number of the program's. */
static int keep(int fd, int strict) {
  if (fd >= 0 && fd < fd_base) {
    int hi = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, fd_base);
    if (hi >= 0 || strict) syscall(SYS_close, fd);
    if (hi < 0 && strict) {
      errno = EMFILE;
      return -1;
    }
    if (hi >= 0) fd = hi;
  }
  if (fd >= 0 && fd < FD_BITS)
    atomic_fetch_or_explicit(&owned[fd / 64], 1ull << (fd % 64), memory_order_release);
  return fd;
}

int locus_fd_keep(int fd) { return keep(fd, 0); }

int locus_fd_keep_high(int fd) { return keep(fd, 1); }

int locus_fd_owned(int fd) {
  return fd >= 0 && fd < FD_BITS &&
         ((atomic_load_explicit(&owned[fd / 64], memory_order_acquire) >> (fd % 64)) & 1);
}

void locus_fd_forget(int fd) {
  if (fd >= 0 && fd < FD_BITS)
    atomic_fetch_and_explicit(&owned[fd / 64], ~(1ull << (fd % 64)), memory_order_release);
}

void locus_fd_close(int fd) {
  /* Never a standard descriptor the runtime does not own: a stream never opened
   * (zero-initialised: --call-stack's off) has fd 0, and a forked child closed its stdin
   * (openssl speed -multi's workers then wrote their results to a dup() that became 0). */
  if (fd < 0 || (fd <= 2 && !locus_fd_owned(fd))) return;
  locus_fd_forget(fd);
  syscall(SYS_close, fd);
}

/* The next owned descriptor in [from, to], or -1. */
int locus_fd_next_owned(unsigned from, unsigned to) {
  if (to >= FD_BITS) to = FD_BITS - 1;
  for (unsigned w = from / 64; from <= to && w <= to / 64; w++) {
    uint64_t bits = atomic_load_explicit(&owned[w], memory_order_acquire);
    if (w == from / 64) bits &= ~0ull << (from % 64);
    if (bits) {
      unsigned fd = w * 64 + (unsigned)__builtin_ctzll(bits);
      return fd <= to ? (int)fd : -1;
    }
  }
  return -1;
}

void locus_fds_disable_perf(void) {
  static const char kind[] = "anon_inode:[perf_event]";
  char path[32] = "/proc/self/fd/", link[sizeof kind];
  for (int fd = locus_fd_next_owned(0, FD_BITS - 1); fd >= 0;
       fd = fd + 1 < FD_BITS ? locus_fd_next_owned((unsigned)fd + 1, FD_BITS - 1) : -1) {
    locus_fmt_u(path + 14, (unsigned)fd);
    long n = syscall(SYS_readlink, path, link, sizeof link);
    if (n == (long)sizeof kind - 1 && memcmp(link, kind, sizeof kind - 1) == 0)
      syscall(SYS_ioctl, fd, PERF_EVENT_IOC_DISABLE, 0);
  }
}
