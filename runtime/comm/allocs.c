/* Allocation records of the comm and numa lenses: the logic behind intercept/alloc.c.
 *
 * Cost (bench/alloc.py): with the lenses off an interposed call is one load, one
 * predictable branch and a tail call into the real allocator. With one on, every malloc,
 * calloc, realloc, aligned allocation and free writes one record (a TSC read and a store
 * into a thread-local chunk of a mapped file, no lock, no system call except one chunk claim
 * per chunk: core/stream.c): a heap block a 32-byte struct locus_heap in heap.bin, a free a
 * 16-byte struct locus_free in frees.bin. Anonymous mmap and munmap, thread stacks and (with
 * --call-stack, whose unwinding costs microseconds) heap blocks with their stack id are
 * 64-byte struct locus_alloc records in allocs.bin. A program doing N allocations and N
 * frees writes 48*N bytes: 1e6 pairs are 48 MB; most of the cost per record is the kernel
 * providing page-cache pages for them. Every block is tracked, whatever its size, because
 * small objects are exactly where false sharing hides.
 *
 * Except the blocks no record can name. A block malloc'd and freed with no sample,
 * communication event or first touch in between that names one of its bytes holds no
 * address the report will look up. Its free looks for its record among the thread's last
 * HEAP_LOOKBACK heap records, still mapped: found, and named by nothing (locus_named), it is
 * dropped (its last word zeroed, the cursor moved back over the dropped records at its end)
 * and no free record is written. Named by nothing: no record at all since it was written
 * (one load), or, for a block of up to NAMED_SPAN 64-byte granules, none of them in the
 * table of recently named granules and the table having lost no entry since. A temporary
 * of a loop (openssl speed's digest contexts: 3.7 million blocks a second, 1.1 GB of
 * records in 6 s) then costs a record written and unwritten in the same cache line. Not
 * with the exact backend, whose every access is a record. LOCUS_HEAP_ALL=1 keeps every
 * block.
 *
 * File mappings are MMAP records too, flagged LOCUS_ALF_FILE with the file's offset, device
 * and inode (one fstat): a database's shared-memory index or a memory-mapped file that
 * threads share is an object named by its mmap call and its file. MUNMAP records may name
 * ranges that were never MMAP records (the reader matches them against MMAP records). */
#define _GNU_SOURCE
#include "allocs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../core/runtime.h"
#include "comm.h"

static struct locus_stream stream, heap_stream, free_stream;
static pid_t stream_pid; /* process that opened the streams; 0 = not open */
static atomic_flag open_lock = ATOMIC_FLAG_INIT;
static pthread_key_t end_key;
static int end_key_ok, atfork_done;

/* The recently named 64-byte granules: {granule, ticks of the last record naming it} by
 * hash, 8 KiB. `named_t`: ticks of the last record naming anything; `named_lost`: the
 * newest ticks an entry had when another granule took its slot (or a record named what
 * the table cannot hold). A block allocated after named_lost none of whose granules has
 * an entry newer than its allocation was named by no record. */
#define NAMED_SLOTS 512u
#define NAMED_SPAN 8u
static struct { uint64_t granule, t; } named_tab[NAMED_SLOTS];
static uint64_t named_t, named_lost;

static void max_store(uint64_t *at_, uint64_t t) {
  uint64_t was = __atomic_load_n(at_, __ATOMIC_RELAXED);
  while (was < t &&
         !__atomic_compare_exchange_n(at_, &was, t, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static uint32_t named_slot(uint64_t g) {
  return (uint32_t)((g * 0x9e3779b97f4a7c15ull) >> 32) % NAMED_SLOTS;
}

void locus_named_all(uint64_t t) {
  max_store(&named_t, t);
  max_store(&named_lost, t);
}

void locus_named(uint64_t t, uint64_t addr, uint64_t len) {
  max_store(&named_t, t);
  uint64_t g0 = addr >> 6, g1 = (addr + (len ? len : 1) - 1) >> 6;
  if (g1 - g0 >= NAMED_SPAN) {
    max_store(&named_lost, t);
    return;
  }
  for (uint64_t g = g0; g <= g1; g++) {
    uint32_t k = named_slot(g);
    uint64_t old = __atomic_load_n(&named_tab[k].granule, __ATOMIC_RELAXED);
    if (old != g) { /* the slot's granule loses its entry: blocks older than it keep theirs */
      max_store(&named_lost, __atomic_load_n(&named_tab[k].t, __ATOMIC_RELAXED));
      __atomic_store_n(&named_tab[k].granule, g, __ATOMIC_RELAXED);
    }
    max_store(&named_tab[k].t, t);
  }
}

/* Whether a record named a byte of the block [addr, addr + size) allocated at ticks t. */
static int was_named(uint64_t addr, uint64_t size, uint64_t t) {
  if (__atomic_load_n(&named_t, __ATOMIC_RELAXED) < t) return 0; /* nothing named since */
  uint64_t g0 = addr >> 6, g1 = (addr + (size ? size : 1) - 1) >> 6;
  if (g1 - g0 >= NAMED_SPAN || __atomic_load_n(&named_lost, __ATOMIC_RELAXED) >= t) return 1;
  for (uint64_t g = g0; g <= g1; g++) {
    uint32_t k = named_slot(g);
    if (__atomic_load_n(&named_tab[k].granule, __ATOMIC_RELAXED) == g &&
        __atomic_load_n(&named_tab[k].t, __ATOMIC_RELAXED) >= t)
      return 1;
  }
  return 0;
}

static int heap_all = -1; /* every block recorded (exact backend, LOCUS_HEAP_ALL=1); -1: unset */

static LOCUS_TLS struct {
  struct locus_cursor cur, heap, frees;
  int closed;     /* the thread ended: its cursors are gone, record nothing more */
  uint32_t young; /* blocks dropped (drop_young) not yet in the process's count */
} at;

/* The thread's dropped blocks into the process header's count. */
#define YOUNG_BATCH 4096u
static void young_flush(void) {
  if (at.young && locus_proc_hdr)
    __atomic_fetch_add(&locus_proc_hdr->heap_dropped, at.young, __ATOMIC_RELAXED);
  at.young = 0;
}

static void count(int rc) {
  if (rc == 0)
    locus_me.records++;
  else
    locus_me.dropped++;
}

/* The hot path's small records: a heap block without a call stack, a free. */
static void put_heap(const void *addr, size_t size, uint64_t site) {
  const uint64_t max = (1ull << LOCUS_HEAP_SIZE_BITS) - 1;
  struct locus_heap r = {locus_ticks(), (uint64_t)(uintptr_t)addr,
                         (size > max ? max : size) | (uint64_t)locus_me.tid << LOCUS_HEAP_SIZE_BITS,
                         site ? site : 1};
  count(locus_cursor_put(&heap_stream, &at.heap, &r, sizeof r));
}

/* A freed block's malloc record dropped, if it is among the thread's last HEAP_LOOKBACK heap
 * records in its current chunk and no record named one of its bytes since it was written
 * (was_named): 1, and its free is not recorded either; else 0. The newest record of addr
 * decides (an older one is an earlier block at that address; a block whose malloc went
 * unrecorded, freed here, may so drop an earlier unnamed block's record, whose free another
 * thread wrote: nothing named either, and a free without its malloc ends nothing). Records
 * before the thread's first in a spare page are an ended thread's, as final as ours. */
#define HEAP_LOOKBACK 8
static int drop_young(const void *addr) {
  struct locus_cursor *c = &at.heap;
  if (heap_all || !c->base) return 0;
  struct locus_heap *lo = (struct locus_heap *)(void *)c->base;
  struct locus_heap *end = (struct locus_heap *)(void *)c->pos, *r = end;
  for (int k = 0; k < HEAP_LOOKBACK && r > lo; k++) {
    r--;
    if (r->addr != (uint64_t)(uintptr_t)addr || !r->site) continue;
    if (was_named(r->addr, r->size_tid & ((1ull << LOCUS_HEAP_SIZE_BITS) - 1), r->t)) return 0;
    __atomic_store_n(&r->site, 0, __ATOMIC_RELAXED); /* reads as unused from here on */
    while (end > lo && !end[-1].site) end--;
    c->pos = (char *)end;
    locus_me.records--;
    if (++at.young >= YOUNG_BATCH) young_flush();
    return 1;
  }
  return 0;
}

static void put_free(const void *addr) {
  if (drop_young(addr)) return;
  struct locus_free r = {locus_ticks(), (uint64_t)(uintptr_t)addr};
  count(locus_cursor_put(&free_stream, &at.frees, &r, sizeof r));
}

static int put_rec(struct locus_alloc *rp, uint16_t kind, const void *addr, size_t size,
                   uint64_t site, uint32_t stack) {
  struct locus_alloc r = *rp;
  r.t = locus_ticks();
  r.addr = (uint64_t)(uintptr_t)addr;
  r.size = size;
  r.site = site;
  r.tid = locus_me.tid;
  r.stack = stack;
  r.kind = kind;
  int rc = locus_cursor_put(&stream, &at.cur, &r, sizeof r);
  count(rc);
  return rc;
}

static int put(uint16_t kind, const void *addr, size_t size, uint64_t site, uint32_t stack) {
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  return put_rec(&r, kind, addr, size, site, stack);
}

void locus_allocs_record(uint16_t kind, const void *addr, size_t size, uint64_t site) {
  struct locus_self *me = &locus_me;
  /* Unregistered threads are skipped rather than adopted here: a new thread frees its
   * start-up block before pthread_create's trampoline registers it. */
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  if (kind == LOCUS_AL_FREE && addr) {
    put_free(addr);
  } else if (kind == LOCUS_AL_MALLOC && addr && !locus_cfg.call_stack) {
    put_heap(addr, size, site);
  } else {
    uint32_t stack = locus_cfg.call_stack ? locus_stack_capture(site) : 0;
    put(kind, addr, size, site, stack);
  }
  me->guard--;
  errno = saved;
}

void locus_allocs_record_remap(const void *old, size_t old_n, const void *p, size_t n,
                               uint64_t site) {
  struct locus_self *me = &locus_me;
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  /* Moved: the old range ends (grown or shrunk in place, the new record ends it). */
  if (p != old) put(LOCUS_AL_MUNMAP, old, old_n, site, 0);
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  r.flags = LOCUS_ALF_REMAP;
  r.reserved[0] = (uint64_t)(uintptr_t)old;
  put_rec(&r, LOCUS_AL_MMAP, p, n, site, 0);
  me->guard--;
  errno = saved;
}

/* v in decimal at p (no NUL; stdio's formatting would fault in libc pages the program may
 * never use); returns the digits written. */
static int put_dec(char *p, uint64_t v) {
  char d[20];
  int n = 0, k = 0;
  do d[n++] = (char)('0' + v % 10);
  while ((v /= 10) != 0);
  while (n) p[k++] = d[--n];
  return k;
}

/* The path of a mapped file, as mapped_files.txt lines "INODE DEV PATH" (the maps at start
 * and exit miss a file mapped and unmapped in between: a database's -shm index). Once per
 * file of the last few, one readlink and one write. */
static void note_path(int fd, uint64_t ino, uint32_t dev) {
  static _Atomic uint64_t recent[16];
  static _Atomic uint32_t next;
  static int out = -1;
  static pid_t out_pid, recent_pid;
  /* This process (tracking is on only once its streams are open: no getpid per mapping). */
  pid_t pid = stream_pid;
  if (recent_pid != pid) { /* a fork child writes its own file: the parent's list is not it */
    for (int i = 0; i < 16; i++) atomic_store_explicit(&recent[i], 0, memory_order_relaxed);
    recent_pid = pid;
  }
  for (int i = 0; i < 16; i++)
    if (atomic_load_explicit(&recent[i], memory_order_relaxed) == (ino ^ ((uint64_t)dev << 40)))
      return;
  atomic_store_explicit(&recent[atomic_fetch_add(&next, 1) % 16], ino ^ ((uint64_t)dev << 40),
                        memory_order_relaxed);
  char link[64] = "/proc/self/fd/", line[4200];
  int n = put_dec(line, ino);
  line[n++] = ' ';
  n += put_dec(line + n, dev);
  line[n++] = ' ';
  link[14 + put_dec(link + 14, (uint64_t)(unsigned)fd)] = 0;
  long len = (long)syscall(SYS_readlinkat, AT_FDCWD, link, line + n, sizeof line - (size_t)n - 1);
  if (len <= 0) return;
  line[n + len] = '\n';
  if (out < 0 || out_pid != pid) {
    out = locus_fd_keep_high(openat(locus_proc_dirfd, "mapped_files.txt",
                                    O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
    out_pid = pid;
  }
  if (out >= 0) (void)!write(out, line, (size_t)(n + len + 1));
}

void locus_allocs_record_mapping(const void *addr, size_t size, uint64_t site, int fd, uint64_t off,
                                 uint16_t flags) {
  struct locus_self *me = &locus_me;
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  struct stat st;
  r.flags = (uint16_t)((fd >= 0 ? LOCUS_ALF_FILE : 0u) | flags);
  r.reserved[0] = fd >= 0 ? off : 0;
  if (fd >= 0 && syscall(SYS_fstat, fd, &st) == 0) {
    r.reserved[1] = (uint64_t)st.st_ino;
    r.dev = (uint32_t)st.st_dev;
    note_path(fd, r.reserved[1], r.dev);
  }
  uint32_t stack = locus_cfg.call_stack ? locus_stack_capture(site) : 0;
  put_rec(&r, LOCUS_AL_MMAP, addr, size, site, stack);
  me->guard--;
  errno = saved;
}

static void on_thread_end(void *arg) {
  (void)arg;
  locus_me.guard++;
  young_flush();
  locus_cursor_finish(&stream, &at.cur);
  locus_cursor_finish(&heap_stream, &at.heap);
  locus_cursor_finish(&free_stream, &at.frees);
  at.closed = 1;
  locus_me.guard--;
}

/* In a fork child the thread's cursor maps a chunk of the parent's file: stop recording
 * at once (this handler was registered before proc.c's, so it runs first), until the
 * child's own thread_init reopens allocs.bin in the child's directory. */
static void child_after_fork(void) {
  __atomic_fetch_and(&locus_alloc_state, ~LOCUS_ALLOC_TRACKING, __ATOMIC_RELEASE);
  locus_me.guard++;
  at.young = 0; /* the parent's to count */
  locus_cursor_close(&at.cur);
  locus_cursor_close(&at.heap);
  locus_cursor_close(&at.frees);
  locus_me.guard--;
  stream_pid = 0;
  locus_stream_reset_after_fork(&stream);
  locus_stream_reset_after_fork(&heap_stream);
  locus_stream_reset_after_fork(&free_stream);
  atomic_flag_clear(&open_lock);
}

static void open_stream(void) {
  pid_t pid = getpid();
  while (atomic_flag_test_and_set_explicit(&open_lock, memory_order_acquire)) {
  }
  if (stream_pid != pid) {
    if (locus_stream_open(&stream, locus_proc_dirfd, "allocs.bin") == 0 &&
        locus_stream_open(&heap_stream, locus_proc_dirfd, "heap.bin") == 0 &&
        locus_stream_open(&free_stream, locus_proc_dirfd, "frees.bin") == 0) {
      stream_pid = pid;
      if (heap_all < 0) {
        const char *all = getenv("LOCUS_HEAP_ALL");
        heap_all = locus_comm_cfg.backend == LOCUS_BK_EXACT || (all && *all == '1');
      }
      if (!end_key_ok) end_key_ok = pthread_key_create(&end_key, on_thread_end) == 0;
      if (!atfork_done) atfork_done = pthread_atfork(NULL, NULL, child_after_fork) == 0;
      __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_TRACKING, __ATOMIC_RELEASE);
    } else {
      locus_warn(
          "comm: cannot create allocs.bin, heap.bin or frees.bin; objects will not be named");
    }
  }
  atomic_flag_clear_explicit(&open_lock, memory_order_release);
}

/* The thread's stack as an object, so accesses to stack variables are named as such. */
static void put_stack_range(void) {
  uintptr_t lo, hi;
  if (locus_thread_stack(&lo, &hi) == 0) put(LOCUS_AL_STACK, (void *)lo, hi - lo, 0, 0);
}

void locus_allocs_proc_fini(void) { young_flush(); }

void locus_allocs_thread_init(void) {
  locus_me.guard++;
  if (stream_pid != getpid()) open_stream();
  if (stream_pid) {
    at.closed = 0;
    if (end_key_ok && locus_me.tid != (uint32_t)getpid()) pthread_setspecific(end_key, &at);
    put_stack_range();
  }
  locus_me.guard--;
}
