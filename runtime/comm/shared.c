/* Memory this process maps MAP_SHARED, keyed as the other processes of the run see it.
 *
 * Threads of one process that share a cache line share its address; processes do not: each
 * maps a shared object (a file, a memfd, POSIX or SysV shared memory, anonymous memory
 * inherited at a fork) wherever its mmap put it. What names the line in every process is the
 * object (device and inode, as /proc/self/maps and stat() give them) and the offset in it.
 * The detector (detect.c) keys its board between processes by that.
 *
 * The table is filled from /proc/self/maps when the comm lens starts in the process, then
 * kept by the mmap and munmap interposers (intercept/alloc.c); a fork child inherits it with
 * the mappings. The signal handlers read it on every sample: a seqlock, whose writers (normal
 * context, signals blocked) take a spinlock among themselves; a reader that meets another
 * thread's write retries, then finds nothing for that sample. Sizes: SHARED_MAX mappings;
 * more are not tracked (their lines are then detected between the threads of each process
 * only). */
#define _GNU_SOURCE
#include "shared.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "../core/runtime.h"

/* 128 entries of 40 bytes: over 4 KiB, the table is a page of its own (runtime/layout), made
 * resident only in a process that maps shared memory. */
#define SHARED_MAX 128

struct shared_map {
  uint64_t lo, hi, off, ino;
  uint32_t dev;
};

int locus_shared_tracking;
static struct shared_map maps[SHARED_MAX];
static _Atomic uint32_t nmaps;
static _Atomic uint32_t seq;
static atomic_flag writing = ATOMIC_FLAG_INIT;

/* A writer blocks every signal while it holds the table (the raw system call: the runtime
 * interposes sigprocmask): a handler of the program that maps memory cannot then spin on the
 * lock its own thread holds, and the sampler's handler never meets its own thread's write. */
static void write_begin(uint64_t *saved) {
  int e = errno; /* the interposers' callers read errno as the real call left it */
  uint64_t all = ~0ull;
  syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, saved, sizeof all);
  while (atomic_flag_test_and_set_explicit(&writing, memory_order_acquire)) {
  }
  atomic_fetch_add_explicit(&seq, 1, memory_order_acq_rel);
  atomic_thread_fence(memory_order_release);
  errno = e;
}

static void write_end(const uint64_t *saved) {
  atomic_fetch_add_explicit(&seq, 1, memory_order_release);
  atomic_flag_clear_explicit(&writing, memory_order_release);
  int e = errno;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, saved, NULL, sizeof *saved);
  errno = e;
}

int locus_shared_count(void) { return (int)atomic_load_explicit(&nmaps, memory_order_relaxed); }

/* The readers' one loop: the newest entry `match` accepts (match fills its own output),
 * under the seqlock. 1 found, 0 not, -1 no consistent view (a write under way: perhaps the
 * one this signal handler interrupted; a handler does not wait for it). */
static int seq_find(int (*match)(const struct shared_map *, void *), void *arg) {
  for (int tries = 0; tries < 4; tries++) {
    uint32_t s = atomic_load_explicit(&seq, memory_order_acquire);
    if (s & 1) return -1;
    uint32_t n = atomic_load_explicit(&nmaps, memory_order_relaxed);
    int found = 0;
    for (uint32_t i = n < SHARED_MAX ? n : SHARED_MAX; i-- > 0 && !found;)
      found = match(&maps[i], arg);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&seq, memory_order_relaxed) == s) return found;
  }
  return -1;
}

struct find_arg {
  uint64_t addr;
  struct locus_shared_loc *out;
};

static int holds_addr(const struct shared_map *m, void *arg) {
  struct find_arg *f = arg;
  if (f->addr < m->lo || f->addr >= m->hi) return 0;
  f->out->ino = m->ino;
  f->out->dev = m->dev;
  f->out->off = m->off + (f->addr - m->lo);
  return 1;
}

int locus_shared_find(uint64_t addr, struct locus_shared_loc *out) {
  if (!atomic_load_explicit(&nmaps, memory_order_relaxed)) return -1;
  struct find_arg f = {.addr = addr, .out = out};
  return seq_find(holds_addr, &f) == 1 ? 0 : -1;
}

struct addr_arg {
  const struct locus_shared_loc *l;
  uint64_t addr;
};

static int maps_loc(const struct shared_map *m, void *arg) {
  struct addr_arg *a = arg;
  const struct locus_shared_loc *l = a->l;
  if (m->ino != l->ino || m->dev != l->dev || l->off < m->off || l->off - m->off >= m->hi - m->lo)
    return 0;
  a->addr = m->lo + (l->off - m->off);
  return 1;
}

int locus_shared_addr(const struct locus_shared_loc *l, uint64_t *addr) {
  if (!atomic_load_explicit(&nmaps, memory_order_relaxed)) return -1;
  struct addr_arg a = {.l = l};
  if (seq_find(maps_loc, &a) != 1) return -1;
  *addr = a.addr;
  return 0;
}

/* Drops the entries [lo, hi) overlaps; the writer's lock is held. */
static void remove_locked(uint64_t lo, uint64_t hi) {
  uint32_t n = atomic_load_explicit(&nmaps, memory_order_relaxed);
  for (uint32_t i = 0; i < n;)
    if (maps[i].lo < hi && lo < maps[i].hi) {
      maps[i] = maps[--n];
    } else {
      i++;
    }
  atomic_store_explicit(&nmaps, n, memory_order_relaxed);
}

void locus_shared_add(uint64_t lo, uint64_t len, uint32_t dev, uint64_t ino, uint64_t off) {
  if (!len || !ino) return;
  uint64_t saved;
  write_begin(&saved);
  remove_locked(lo, lo + len);
  uint32_t n = atomic_load_explicit(&nmaps, memory_order_relaxed);
  if (n < SHARED_MAX) {
    maps[n] = (struct shared_map){.lo = lo, .hi = lo + len, .off = off, .ino = ino, .dev = dev};
    atomic_store_explicit(&nmaps, n + 1, memory_order_relaxed);
  }
  write_end(&saved);
}

/* Whether [lo, hi) overlaps an entry (a reader's look: the writers' lock and its two
 * system calls are taken only when there is something to drop, not at every mmap and munmap
 * of a program that also maps shared memory). */
static int overlaps_range(const struct shared_map *m, void *arg) {
  const uint64_t *r = arg;
  return m->lo < r[1] && r[0] < m->hi;
}

static int overlaps(uint64_t lo, uint64_t hi) {
  uint64_t r[2] = {lo, hi};
  return seq_find(overlaps_range, r) != 0; /* (no consistent view: take the lock and look) */
}

void locus_shared_remove(uint64_t lo, uint64_t len) {
  if (!len || !atomic_load_explicit(&nmaps, memory_order_relaxed) || !overlaps(lo, lo + len))
    return;
  uint64_t saved;
  write_begin(&saved);
  remove_locked(lo, lo + len);
  write_end(&saved);
}

uint64_t locus_shared_detach(uint64_t lo) {
  if (!atomic_load_explicit(&nmaps, memory_order_relaxed)) return 0;
  uint64_t saved, len = 0;
  write_begin(&saved);
  uint32_t n = atomic_load_explicit(&nmaps, memory_order_relaxed);
  for (uint32_t i = 0; i < n; i++)
    if (maps[i].lo == lo) {
      len = maps[i].hi - lo;
      remove_locked(lo, maps[i].hi);
      break;
    }
  write_end(&saved);
  return len;
}

/* The run directory (canonical), whose files are the runtime's own: set by the scan. A
 * longer name is not kept (the readlink check below reads 256 bytes). */
static char skip_dir[256];
static size_t nskip_dir;

static int is_skipped(const char *p, size_t n) {
  if (!nskip_dir || n <= nskip_dir || p[nskip_dir] != '/') return 0;
  for (size_t i = 0; i < nskip_dir; i++)
    if (p[i] != skip_dir[i]) return 0;
  return 1;
}

static void scan_maps(uint64_t only);

static void mapped(uint64_t lo, uint64_t len, uint64_t off);

/* (errno as the program's mmap or shmat left it: the look-ups below may set it) */
void locus_shared_mapped(uint64_t lo, uint64_t len, uint64_t off) {
  int e = errno;
  mapped(lo, len, off);
  errno = e;
}

static void mapped(uint64_t lo, uint64_t len, uint64_t off) {
  len = (len + 4095) & ~4095ull; /* the mapping's pages (x86-64, the sampled backends' ISA) */
  char path[64] = "/proc/self/map_files/", *p = path + sizeof "/proc/self/map_files/" - 1;
  p = locus_put_hex(p, lo, 1);
  *p++ = '-';
  p = locus_put_hex(p, lo + len, 1);
  *p = 0;
  struct stat st;
  if (syscall(SYS_newfstatat, AT_FDCWD, path, &st, 0) != 0) {
    /* map_files needs CAP_SYS_ADMIN (a user's recording): the maps line that starts at lo
     * says the same (and its path, for the run's own files). */
    locus_shared_remove(lo, len); /* what was there before is gone in any case */
    scan_maps(lo);
    return;
  }
  /* The runtime's own record files are not the program's. (The path is read into a small
   * buffer, this may run on a thread's small stack: a run directory of a longer name is not
   * told apart, and its files are kept; no sample is on them.) */
  if (S_ISREG(st.st_mode) && nskip_dir && nskip_dir < 255) {
    char target[256];
    long n = (long)syscall(SYS_readlinkat, AT_FDCWD, path, target, sizeof target);
    if (n > 0 && is_skipped(target, (size_t)n)) {
      locus_shared_remove(lo, len);
      return;
    }
  }
  locus_shared_add(lo, len, (uint32_t)st.st_dev, (uint64_t)st.st_ino, off);
}

/* ---- /proc/self/maps ---- */
static const char *skip_spaces(const char *p, const char *end) {
  while (p < end && *p == ' ') p++;
  return p;
}

/* One maps line [p, end): "lo-hi perms off maj:min inode path"; only the mapping that
 * starts at `only` when not 0. */
static void scan_line(const char *p, const char *end, uint64_t only) {
  uint64_t lo, hi, off, maj, min, ino = 0;
  p = locus_hex(p, end, &lo);
  if (p >= end || *p != '-' || (only && lo != only)) return;
  p = locus_hex(p + 1, end, &hi);
  p = skip_spaces(p, end);
  if (end - p < 5 || p[3] != 's') return; /* perms: shared mappings only */
  p = skip_spaces(p + 4, end);
  p = skip_spaces(locus_hex(p, end, &off), end);
  p = locus_hex(p, end, &maj);
  if (p >= end || *p != ':') return;
  p = skip_spaces(locus_hex(p + 1, end, &min), end);
  for (; p < end && *p >= '0' && *p <= '9'; p++) ino = ino * 10 + (uint64_t)(*p - '0');
  p = skip_spaces(p, end);
  if (is_skipped(p, (size_t)(end - p))) return; /* the run's own record files */
  locus_shared_add(lo, hi - lo, (uint32_t)makedev((unsigned)maj, (unsigned)min), ino, off);
}

/* The shared mappings /proc/self/maps lists (only the one at `only` when not 0). */
static void scan_maps(uint64_t only) {
  int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[2048]; /* (a longer line, a path of over ~1.9 KiB, is not read) */
  size_t have = 0;
  int drop = 0; /* in a line longer than the buffer: skipped to its end */
  for (;;) {
    ssize_t r = read(fd, buf + have, sizeof buf - have);
    if (r <= 0) break;
    have += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < have; i++)
      if (buf[i] == '\n') {
        if (!drop) scan_line(buf + start, buf + i, only);
        drop = 0;
        start = i + 1;
      }
    if (start == 0 && have == sizeof buf) {
      drop = 1;
      have = 0;
      continue;
    }
    for (size_t i = start; i < have; i++) buf[i - start] = buf[i];
    have -= start;
  }
  close(fd);
}

int locus_shared_scan(const char *proc_dir) {
  /* The run directory, as the kernel names it: the process's directory without /procs/NAME.
   * (plain loops: libc's string functions would fault in pages of libc the program may not
   * use, 64 KiB at a time) */
  nskip_dir = 0;
  size_t n = 0;
  while (proc_dir && proc_dir[n] && n < sizeof skip_dir) n++;
  if (n && n < sizeof skip_dir && proc_dir[0] == '/') {
    for (int k = 0; k < 2; k++)
      while (n > 0 && proc_dir[--n] != '/') {
      }
    for (size_t i = 0; i < n; i++) skip_dir[i] = proc_dir[i];
    nskip_dir = n;
  }
  scan_maps(0);
  return locus_shared_count();
}
