/* Record streams. Each thread claims chunks of a shared file and maps them MAP_SHARED:
 * a store into the chunk is in the page cache at once, so records survive SIGKILL and no
 * flush is ever needed on the hot path. File space is reserved with fallocate before it is
 * mapped, so a full disk drops records instead of raising SIGBUS inside the program. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime.h"

/* Chunks grow x4 from CHUNK_FIRST to CHUNK_MAX: a thread that writes few records keeps
 * few pages of them resident. A chunk filled within HOT_MS of its claim (an allocation-heavy
 * thread under the comm lens writes a record per malloc and per free) lets the next
 * grow up to CHUNK_HOT_MAX: each claim is an mmap, a munmap and a TLB flush, which at 16 KiB
 * per claim cost more than the records themselves (305 ns per malloc+free pair, 24 plain). */
#define CHUNK_FIRST 4096u
#define CHUNK_MAX (16u << 10)
#define CHUNK_HOT_MAX (1u << 20)
#define HOT_MS 10

/* The streams opened, for locus_streams_shed. */
#define MAX_STREAMS 32
static struct locus_stream *_Atomic opened[MAX_STREAMS];

int locus_stream_open(struct locus_stream *s, int dirfd, const char *name) {
  for (int k = 0; k < MAX_STREAMS; k++) {
    struct locus_stream *o = NULL;
    if (atomic_load(&opened[k]) == s || atomic_compare_exchange_strong(&opened[k], &o, s)) break;
  }
  s->fd = locus_fd_keep(openat(dirfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  atomic_store(&s->next, 0);
  atomic_store(&s->size, 0);
  atomic_flag_clear(&s->grow_lock);
  atomic_flag_clear(&s->reopen_lock);
  for (int i = 0; i < LOCUS_STREAM_SPARES; i++) atomic_store(&s->spare[i], 0), s->spare_map[i] = 0;
  s->name = name;
  struct stat st;
  s->dev = s->ino = 0;
  if (s->fd >= 0 && fstat(s->fd, &st) == 0) s->dev = st.st_dev, s->ino = st.st_ino;
  return s->fd < 0 ? -1 : 0;
}

/* The stream's file, closed behind our back, reopened by path (checking it is ours) by one
 * thread; the others drop their record. Out of line: its 4 KiB path buffer makes the
 * compiler probe (so make resident) a page of the stack (-fstack-clash-protection, Debian's
 * default), and locus_stream_fd runs at every claim, in signal handlers too, on their
 * alternate stacks. */
static __attribute__((noinline)) int reopen(struct locus_stream *s, int fd) {
  struct stat st;
  if (!locus_proc_path[0] || atomic_flag_test_and_set(&s->reopen_lock)) return -1;
  char path[4096 + 64];
  size_t n = strlen(locus_proc_path), k = strlen(s->name);
  int nfd = -1;
  if (n + k + 2 < sizeof path) {
    memcpy(path, locus_proc_path, n);
    path[n] = '/';
    memcpy(path + n + 1, s->name, k + 1);
    nfd = (int)syscall(SYS_open, path, O_RDWR | O_CLOEXEC);
  }
  if (nfd >= 0 &&
      (syscall(SYS_fstat, nfd, &st) != 0 || st.st_dev != s->dev || st.st_ino != s->ino)) {
    syscall(SYS_close, nfd);
    nfd = -1;
  }
  if (nfd >= 0) {
    locus_fd_forget(fd);
    s->fd = locus_fd_keep(nfd);
  }
  atomic_flag_clear(&s->reopen_lock);
  return nfd >= 0 ? s->fd : -1;
}

/* Whether fd is still the record file `name` of this process's directory: 1 yes, 0 no
 * (a number the program reused after closing ours behind our back: records written there
 * would corrupt its file), -1 unknown (closed, no /proc, a path too long for the buffer). Its
 * /proc/self/fd link names our path (locus_proc_path is the kernel's own name for the
 * directory). Not fstat: on a 9p share (the VM tier's run directories) each stat asks the
 * server for the size and can shrink the guest's view of a file being extended under a
 * MAP_SHARED chunk, which then raises SIGBUS (numa_pinning died of it in 3 runs of 8). A
 * buffer under a page: no stack probe (this runs in signal handlers, on their alternate
 * stacks). Async-signal-safe. */
int locus_fd_is_record(int fd, const char *name) {
  char link[32] = "/proc/self/fd/", got[1024];
  locus_fmt_u(link + strlen(link), (unsigned)fd);
  size_t pl = strlen(locus_proc_path), nl = strlen(name);
  if (!pl || pl + 1 + nl >= sizeof got) return -1;
  long len = syscall(SYS_readlink, link, got, sizeof got);
  if (len < 0) return -1; /* closed, or no /proc (a chroot): the caller's F_GETFD decides */
  return (size_t)len == pl + 1 + nl && !memcmp(got, locus_proc_path, pl) && got[pl] == '/' &&
         !memcmp(got + pl + 1, name, nl);
}

int locus_stream_fd(struct locus_stream *s) {
  int fd = s->fd;
  if (fd < 0) return -1;
  int ours = locus_fd_is_record(fd, s->name);
  if (ours > 0 || (ours < 0 && syscall(SYS_fcntl, fd, F_GETFD) >= 0)) return fd;
  /* Closed or reused behind our back: never touch that number again, never close it. */
  return reopen(s, fd);
}

/* [from, to) of fd allocated within RLIMIT_FSIZE: 0, -1 (past the limit, disk full), or 1
 * when the filesystem has no fallocate (the caller extends the file sparsely). */
static int allocate(int fd, uint64_t from, uint64_t to) {
  struct rlimit fl;
  if (getrlimit(RLIMIT_FSIZE, &fl) == 0 && fl.rlim_cur != RLIM_INFINITY && to > fl.rlim_cur)
    return -1;
  if (to <= from) return 0;
  if (syscall(SYS_fallocate, fd, 0, (off_t)from, (off_t)(to - from)) == 0) return 0;
  return errno == EOPNOTSUPP ? 1 : -1;
}

int locus_file_reserve(int fd, uint64_t from, uint64_t to) {
  int rc = allocate(fd, from, to);
  /* Filesystems without fallocate: extend sparsely. */
  return rc == 1 ? (syscall(SYS_ftruncate, fd, (off_t)to) == 0 ? 0 : -1) : rc;
}

/* Reserves [from, to) of the stream's file for one claim. Lock-free: every claim
 * fallocates its own range (the kernel serialises them on the file), so a thread that
 * starts no longer waits for another's system call. A lock here, spun on, took 71 % of
 * the CPU time of 20,000 short-lived threads started 64 at a time on 2 CPUs (7 s against
 * 1 s plain), its holder preempted inside fallocate. Only the ftruncate fallback takes a
 * lock, as concurrent ftruncates could shrink the file under another thread's chunk; it
 * yields while waiting. The raw system calls: glibc's fallocate is a cancellation point (a
 * thread with a cancel pending was cancelled here). Past RLIMIT_FSIZE the records stop
 * (growing the file would kill the program with SIGXFSZ). */
static int grow(struct locus_stream *s, int fd, uint64_t from, uint64_t to) {
  int rc = allocate(fd, from, to);
  if (rc != 1) return rc;
  while (atomic_flag_test_and_set_explicit(&s->grow_lock, memory_order_acquire))
    syscall(SYS_sched_yield);
  rc = 0;
  if (to > atomic_load(&s->size)) {
    rc = syscall(SYS_ftruncate, fd, (off_t)to) == 0 ? 0 : -1;
    if (rc == 0) atomic_store(&s->size, to);
  }
  atomic_flag_clear_explicit(&s->grow_lock, memory_order_release);
  return rc;
}

void *locus_stream_claim(struct locus_stream *s, size_t bytes) {
  uint64_t off;
  return locus_stream_claim_at(s, bytes, &off);
}

void *locus_stream_claim_at(struct locus_stream *s, size_t bytes, uint64_t *at) {
  if (s->fd < 0) return NULL;
  uint64_t c0 = locus_thread_cpu_ns();
  uint64_t off = atomic_fetch_add(&s->next, bytes);
  *at = off;
  int fd = locus_stream_fd(s); /* checked once per claim */
  if (fd < 0 || grow(s, fd, off, off + bytes) != 0) return NULL;
  void *p = locus_sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (long)off);
  if (locus_proc_hdr) {
    locus_proc_hdr->tsc1 = locus_ticks();
    locus_proc_hdr->ns1 = locus_mono_ns();
  }
  uint64_t c1 = locus_thread_cpu_ns();
  if (c0 && c1 > c0) locus_add_self_cpu_ns(c1 - c0);
  return p == MAP_FAILED ? NULL : p;
}

#define PAGE 4096u
#define DROP_HOT (64u << 10)
#define SPARE_LEN_BITS 20

/* A spare slot: 0 empty, SPARE_BUSY while one thread fills or empties it, else the range
 * ((offset / 16) << SPARE_LEN_BITS | bytes / 16), with its page's mapping in spare_map. */
#define SPARE_BUSY (~0ull)

int locus_stream_put_spare(struct locus_stream *s, uint64_t off, size_t len, void *page) {
  if (len < 16 || (off & 15) || (len & 15) || off / PAGE != (off + len - 1) / PAGE) return -1;
  uint64_t v = (off / 16) << SPARE_LEN_BITS | len / 16;
  for (int i = 0; i < LOCUS_STREAM_SPARES; i++) {
    uint64_t empty = 0;
    if (atomic_load_explicit(&s->spare[i], memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong(&s->spare[i], &empty, SPARE_BUSY)) {
      s->spare_map[i] = page;
      atomic_store_explicit(&s->spare[i], v, memory_order_release);
      return 0;
    }
  }
  return -1;
}

int locus_stream_take_spare(struct locus_stream *s, size_t min, size_t rec, char **map,
                            uint64_t *at, size_t *pos, size_t *len) {
  if (s->fd < 0) return -1;
  for (int i = 0; i < LOCUS_STREAM_SPARES; i++) {
    uint64_t v = atomic_load_explicit(&s->spare[i], memory_order_acquire);
    size_t n = (size_t)(v & ((1u << SPARE_LEN_BITS) - 1)) * 16;
    uint64_t off = (v >> SPARE_LEN_BITS) * 16, page = off / PAGE * PAGE;
    /* Readers see a file as an array of its records: a range must start on one. */
    if (!v || v == SPARE_BUSY || n < min || off % rec ||
        !atomic_compare_exchange_strong(&s->spare[i], &v, SPARE_BUSY))
      continue;
    void *p = s->spare_map[i];
    atomic_store_explicit(&s->spare[i], 0, memory_order_release);
    if (!p) {
      int fd = locus_stream_fd(s);
      p = fd < 0 ? MAP_FAILED
                 : locus_sys_mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (long)page);
      if (p == MAP_FAILED) return -1;
    }
    *map = p;
    *at = page;
    *pos = (size_t)(off - page);
    *len = n;
    return 0;
  }
  return -1;
}

/* The spare pages (ended threads' last record pages, kept mapped for the next threads'
 * first records) leave the program's resident memory: MADV_DONTNEED on a MAP_SHARED file
 * page only unmaps it, its records stay in the page cache and it maps again when a thread
 * takes it. A spare is held (SPARE_BUSY) meanwhile, so that no thread takes it and unmaps
 * its page under the madvise. */
void locus_streams_shed(void) {
  for (int k = 0; k < MAX_STREAMS; k++) {
    struct locus_stream *s = atomic_load(&opened[k]);
    if (!s) break;
    for (int i = 0; i < LOCUS_STREAM_SPARES; i++) {
      uint64_t v = atomic_load_explicit(&s->spare[i], memory_order_acquire);
      if (!v || v == SPARE_BUSY || !s->spare_map[i] ||
          !atomic_compare_exchange_strong(&s->spare[i], &v, SPARE_BUSY))
        continue;
      syscall(SYS_madvise, s->spare_map[i], PAGE, MADV_DONTNEED);
      atomic_store_explicit(&s->spare[i], v, memory_order_release);
    }
  }
}

void locus_stream_release(void *chunk, size_t bytes) {
  if (chunk) locus_sys_munmap(chunk, bytes);
}

void *locus_sys_mmap(void *addr, size_t n, int prot, int flags, int fd, long off) {
  return (void *)syscall(SYS_mmap, addr, n, prot, flags, fd, off); /* -1: MAP_FAILED */
}

int locus_sys_munmap(void *addr, size_t n) { return (int)syscall(SYS_munmap, addr, n); }

void locus_stream_reset_after_fork(struct locus_stream *s) {
  locus_fd_close(s->fd);
  s->fd = -1;
  atomic_flag_clear(&s->grow_lock);
  /* (the parent's spare pages stay mapped in the child, unused: they map its file) */
  for (int i = 0; i < LOCUS_STREAM_SPARES; i++) atomic_store(&s->spare[i], 0), s->spare_map[i] = 0;
}

void locus_stream_close(struct locus_stream *s) {
  locus_fd_close(s->fd);
  s->fd = -1;
}

/* The full pages behind the cursor leave the program's resident memory: MADV_DONTNEED on a
 * MAP_SHARED file page only unmaps it, its records stay in the page cache. A chunk held all
 * its written pages resident: up to 4 per stream and thread at 16 KiB (samples, events, heap
 * blocks, frees: 5 threads of sysbench, ~100 KiB of its peak RSS), up to 1 MiB for an
 * allocation-heavy thread's. A slow chunk drops each page as it fills, a hot one every
 * DROP_HOT bytes (a system call per 4 KiB of allocation records would cost more than they
 * do). Record sizes divide the page, so the cursor lands on those boundaries; chunks start
 * on a page. Called at a page boundary. */
static __attribute__((noinline)) void drop_behind(struct locus_cursor *c) {
  size_t step = c->chunk <= CHUNK_MAX ? PAGE : DROP_HOT;
  if (c->chunk > step && !((size_t)(c->pos - c->base) & (step - 1)) && c->pos < c->end)
    syscall(SYS_madvise, c->pos - step, step, MADV_DONTNEED);
}

int locus_cursor_put(struct locus_stream *s, struct locus_cursor *c, const void *rec,
                     size_t rec_size) {
  if (LOCUS_UNLIKELY(c->pos + rec_size > c->end)) {
    size_t pos, len;
    if (!c->chunk &&
        locus_stream_take_spare(s, rec_size, rec_size, &c->base, &c->off, &pos, &len) == 0) {
      /* A new thread's first records: after an ended thread's, in its last page. */
      c->t = locus_ticks();
      c->chunk = PAGE;
      c->pos = c->base + pos;
      c->end = c->pos + len;
      goto put;
    }
    uint64_t now = locus_ticks();
    int hot = c->chunk && now - c->t < (uint64_t)(HOT_MS * 1000 * locus_ticks_per_us);
    size_t next = c->chunk ? c->chunk * 4 : CHUNK_FIRST;
    if (next > (hot ? CHUNK_HOT_MAX : CHUNK_MAX)) next = hot ? CHUNK_HOT_MAX : CHUNK_MAX;
    c->t = now;
    locus_stream_release(c->base, c->chunk);
    c->base = locus_stream_claim_at(s, next, &c->off);
    if (!c->base) {
      c->pos = c->end = NULL;
      c->chunk = 0;
      return -1;
    }
    c->pos = c->base;
    c->end = c->base + next;
    c->chunk = next;
  }
put:
  /* The record's last bytes hold its kind: a record cut by SIGKILL reads as unused. */
  memcpy(c->pos, rec, rec_size - 8);
  atomic_signal_fence(memory_order_release);
  memcpy(c->pos + rec_size - 8, (const char *)rec + rec_size - 8, 8);
  c->pos += rec_size;
  if (LOCUS_UNLIKELY(!((uintptr_t)c->pos & (PAGE - 1)))) drop_behind(c);
  return 0;
}

void locus_cursor_close(struct locus_cursor *c) {
  locus_stream_release(c->base, c->chunk);
  memset(c, 0, sizeof *c);
}

void locus_cursor_finish(struct locus_stream *s, struct locus_cursor *c) {
  size_t used = c->base ? (size_t)(c->pos - c->base) : 0;
  size_t keep = (used + PAGE - 1) / PAGE * PAGE;
  uint64_t off = c->off + keep;
  size_t tail = c->base && keep < c->chunk ? c->chunk - keep : 0;
  /* The rest of the last page written goes to the next thread: a record file holds no
   * page per short-lived thread. A one-page chunk goes with its mapping (no munmap: each
   * one was a TLB shootdown on every CPU, 22 % of 20,000 short threads' time). */
  void *page = c->base && c->chunk == PAGE ? c->base : NULL;
  if (c->base && used < keep && locus_stream_put_spare(s, c->off + used, keep - used, page) == 0 &&
      page)
    c->base = NULL;
  locus_cursor_close(c);
  /* The tail reads as zeros (unused records) either way; a filesystem without hole
   * punching keeps it allocated. Never in a fork child: the chunk is the parent's. */
  if (tail) locus_stream_punch(s, off, tail);
}

void locus_stream_punch(struct locus_stream *s, uint64_t off, size_t len) {
  int fd = locus_stream_fd(s);
  if (fd >= 0)
    syscall(SYS_fallocate, fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
}
